"""The table of component compositions the compiled rate recomputation looks its rates up in.

Max-min rates are a function of the live path groups (their paths, fixed per group), their flow counts and the
capacities alone, so a component made of the same groups with the same counts as one filled before can take that
filling's rates (:func:`topotrain.network.flow_kernel._refresh`). Its key is a hash of the (group, flows) pairs
that does not depend on their order, so a component is looked up from its groups as its search found them,
before its entries are gathered and sorted into entry order (which only a filling needs); a hit compares the
stored pairs with the component's, not only the hash. Both functions are compiled by numba with the kernels that
call them (:func:`topotrain.network.flow_kernel.compiled_recompute`).
"""

from __future__ import annotations

import numpy as np


def _composition_find(gs: np.ndarray, mult: np.ndarray, in_c: np.ndarray, cm_keys: np.ndarray, cm_where: np.ndarray,
                      cm_gm: np.ndarray) -> tuple[np.uint64, int, int]:  # pragma: no cover - compiled by numba
    """(its composition's hash, the slot it has or would take, the offset of its stored rates or -1) of a whole
    component: its live groups ``gs`` (distinct, in any order) with their flow counts ``mult``; ``in_c`` is True
    for the groups of the component (and may be for its idle ones, whose count is 0).

    The hash is a sum of one mixed 64-bit word per (group, flows) pair, so it does not depend on the order of
    the groups: the component need not be gathered, nor its groups sorted, to be looked up.

    The table: ``cm_keys`` a power-of-two array of 64-bit hashes (0: an empty slot; open addressing); for a used
    slot ``i``, ``cm_where[2i]`` and ``cm_where[2i+1]`` the offset and the count of its groups in ``cm_gm``
    ((group, flows) pairs) and ``cm_r`` (their rates). A hit compares the stored pairs, not only the hash: as
    many pairs as the component has live groups, each a group of the component with that many flows (distinct
    groups: so the same set)."""
    n_g = gs.shape[0]
    h = np.uint64(0)
    for g in gs:  # splitmix64's finaliser of each pair, summed modulo 2**64
        x = np.uint64(g) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(mult[g]) * np.uint64(0xC2B2AE3D27D4EB4F)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h += x ^ (x >> np.uint64(31))
    if h == np.uint64(0):
        h = np.uint64(1)
    mask = cm_keys.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while cm_keys[i] != np.uint64(0):
        if cm_keys[i] == h and cm_where[2 * i + 1] == n_g:
            off = cm_where[2 * i]
            same = True
            for j in range(n_g):
                g = cm_gm[2 * (off + j)]
                if not in_c[g] or cm_gm[2 * (off + j) + 1] != mult[g]:
                    same = False
                    break
            if same:
                return h, int(i), int(off)
        i = (i + 1) & mask
    return h, int(i), -1


def _composition_store(gs: np.ndarray, h: np.uint64, slot: int, mult: np.ndarray, group_rate: np.ndarray,
                       cm_keys: np.ndarray, cm_where: np.ndarray, cm_gm: np.ndarray, cm_r: np.ndarray,
                       cm_state: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """Store the rates of the groups ``gs`` (distinct) under the composition hash ``h`` in the empty ``slot``
    :func:`_composition_find` gave; ``cm_state`` = (pairs stored, slots used, the pairs needed when they did not
    fit (the caller grows the arrays: a later filling of it is stored), ...)."""
    n_g = gs.shape[0]
    off = cm_state[0]
    if off + n_g > cm_r.shape[0] or 2 * (cm_state[1] + 1) > cm_keys.shape[0]:
        cm_state[2] = off + n_g
        return
    for j in range(n_g):
        g = gs[j]
        cm_gm[2 * (off + j)] = g
        cm_gm[2 * (off + j) + 1] = mult[g]
        cm_r[off + j] = group_rate[g]
    cm_keys[slot] = h
    cm_where[2 * slot] = off
    cm_where[2 * slot + 1] = n_g
    cm_state[0] = off + n_g
    cm_state[1] += 1
