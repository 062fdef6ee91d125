"""One compiled rate recomputation of the flow network: live entries, the changed component, the refill.

:meth:`topotrain.network.flow_rates.FlowRates._recompute` runs, at every rate-change event, the same few steps:
select the incidence entries of the path groups that still carry flows, find the connected component of the
groups that changed (max-min fairness decomposes over components of the flow-link graph), refill the rates of
that component by progressive filling (only the groups at or above the lowest departed rate when flows only
left), and find the time to the next departure. In numpy each step is a handful of array passes plus their
call overhead; at thousands of events per iteration the call overhead dominates. This module compiles all of
it into one numba kernel: one call per event, the same arithmetic in the same order (the sums of a link's
load run in entry order as ``numpy.bincount``'s do, the filling is :func:`topotrain.network.maxmin._filling`),
so its rates equal the numpy path's; a test checks a congested run both ways to 1e-12.

The compiled path also costs each event its changed component, not the network: the numpy path filters every
live entry and searches the component in passes over all of them, while the kernel keeps each link's entries
threaded on a list and each group's entries contiguous, searches breadth-first from the changed groups, and
counts live entries incrementally (only changed groups can change liveness). The component it finds, and the
order of its entries, are the numpy path's. The search walks only links whose list holds another entry than the
one that reached them (a path's private links, its GPU's NIC and PCIe lanes, lead to no other group), and a
component refilled whole is first looked up in the table of compositions
(:mod:`topotrain.network.flow_compositions`) from its groups as found, before its entries are gathered and sorted.
The departure loop also starts a ring's next phases itself, at the completions where FlowSim would start them
(:mod:`topotrain.network.flow_chain`); the passes over the active flows are in :mod:`topotrain.network.flow_passes`.

``TOPOTRAIN_KERNEL=numpy`` (or no numba) keeps the numpy path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from topotrain.network.flow_compositions import _composition_find, _composition_store
from topotrain.network.flow_passes import _depart, _flush, _rates, _rates_flush
from topotrain.network.maxmin import REL_EPS, _filling, compile_helpers

#: Rates of groups within this relative distance below the lowest departed rate are refilled too.
REDO_REL_EPS = 1e-6
#: Components of at least this many incidence entries, refilled whole, look their composition up first
COMPOSITION_MIN_ENTRIES = 64


def _max_min(ef: np.ndarray, el: np.ndarray, w_e: np.ndarray, cap: np.ndarray, f_map: np.ndarray,
             l_map: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled by numba
    """(groups, their max-min rates) of the entries ``(ef, el)``, as ``maxmin.max_min_rates`` computes them:
    compact ids in the order of first appearance (no sort: tight links freeze in the order of their link ids,
    and nothing else depends on the compact order), then progressive filling. ``f_map`` (-1 per group) and
    ``l_map`` (-1 per link) are scratch arrays, left as they were found: the work is proportional to the
    entries, not to the topology's links or groups."""
    n_e = ef.shape[0]
    if n_e == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    f_used = np.empty(n_e, dtype=np.int64)
    l_used = np.empty(n_e, dtype=np.int64)
    ef_c = np.empty(n_e, dtype=np.int64)
    el_c = np.empty(n_e, dtype=np.int64)
    nf = 0
    nl = 0
    for e in range(n_e):
        f = ef[e]
        if f_map[f] < 0:
            f_map[f] = nf
            f_used[nf] = f
            nf += 1
        ef_c[e] = f_map[f]
        lk = el[e]
        if l_map[lk] < 0:
            l_map[lk] = nl
            l_used[nl] = lk
            nl += 1
        el_c[e] = l_map[lk]
    f_used = f_used[:nf]
    l_used = l_used[:nl]
    cap_c = np.empty(nl)
    for i in range(nl):
        cap_c[i] = cap[l_used[i]]
    r = _fill(ef_c, el_c, w_e, cap_c, nf, nl, REL_EPS, l_used)
    for i in range(nf):
        f_map[f_used[i]] = -1
    for i in range(nl):
        l_map[l_used[i]] = -1
    return f_used, r


def _link_push(ent_link: np.ndarray, lo: int, hi: int, head: np.ndarray,
               nxt: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """Thread entries ``lo .. hi-1`` onto their links' lists (``head`` per link, -1 for none; ``nxt`` per
    entry): the link-to-entries adjacency the component search walks."""
    for e in range(lo, hi):
        lk = ent_link[e]
        nxt[e] = head[lk]
        head[lk] = e


def grown(a: np.ndarray, need: int) -> np.ndarray:
    """``a``, or a copy zero-padded to ``max(need, 2·len, 16)`` when it is shorter than ``need`` (the growth
    of every per-flow and per-group array of ``flow_network.FlowNetwork``, in Python and in the kernels alike)."""
    if need <= a.shape[0]:
        return a
    out = np.zeros(max(need, 2 * a.shape[0], 16), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def _activate(gids: np.ndarray, distinct_sorted: bool, in_ent: np.ndarray, g_len: np.ndarray, g_start: np.ndarray,
              g_flat: np.ndarray, ent_gid: np.ndarray, ent_link: np.ndarray, nxt: np.ndarray, ent_n: int,
              g_pos: np.ndarray, head: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:  # pragma: no cover - compiled by numba
    """``FlowNetwork._activate_entries`` in one pass: append the entries of the groups among ``gids`` that
    have none, in ascending group order (``distinct_sorted``: ``gids`` are distinct and ascending already),
    each group's links in path order, threaded onto their links' lists. Returns the entry and list arrays
    (grown when needed) and the new entry count."""
    cand = np.empty(gids.shape[0], dtype=np.int64)
    n_new = 0
    for g in gids:
        if not in_ent[g]:
            cand[n_new] = g
            n_new += 1
    if n_new == 0:
        return ent_gid, ent_link, nxt, ent_n
    cand = cand[:n_new]
    if not distinct_sorted:
        cand = np.sort(cand)
    total = 0
    prev = -1
    for g in cand:
        if g != prev:
            total += g_len[g]
        prev = int(g)
    need = ent_n + total
    ent_gid = _gw(ent_gid, need)
    ent_link = _gw(ent_link, need)
    nxt = _gw(nxt, need)
    e = ent_n
    prev = -1
    for g in cand:
        if g == prev:
            continue
        prev = int(g)
        g_pos[g] = e
        s = g_start[g]
        for i in range(g_len[g]):
            lk = g_flat[s + i]
            ent_gid[e] = g
            ent_link[e] = lk
            nxt[e] = head[lk]
            head[lk] = e
            e += 1
        in_ent[g] = True
    return ent_gid, ent_link, nxt, need


def _start(gids: np.ndarray, sorted_gids: np.ndarray, tail_b: np.ndarray, size: np.ndarray, first: int, job: int,
           rem: np.ndarray, gid: np.ndarray, tail: np.ndarray, flow_job: np.ndarray, mult: np.ndarray,
           act: np.ndarray, in_ent: np.ndarray, g_len: np.ndarray, g_start: np.ndarray, g_flat: np.ndarray,
           ent_gid: np.ndarray, ent_link: np.ndarray, nxt: np.ndarray, ent_n: int, g_pos: np.ndarray,
           head: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray, np.ndarray, int]:  # pragma: no cover - compiled by numba
    """The array work of ``FlowNetwork.start_prepared`` with ``jobs=True`` in one pass: flows ``first ..`` get
    their group, latency tail, size and job (arrays grown by :func:`grown`), their groups one more
    flow each, the groups' entries (:func:`_activate`, over ``sorted_gids`` when the batch's groups are distinct,
    else over ``gids``), and the active list the new flows at its end. Returns the arrays (grown ones are new)
    and the entry count."""
    n = gids.shape[0]
    end = first + n
    rem = _gw(rem, end)
    gid = _gw(gid, end)
    tail = _gw(tail, end)
    flow_job = _gw(flow_job, end)
    for i in range(n):
        f = first + i
        g = gids[i]
        tail[f] = tail_b[i]
        rem[f] = size[i]
        gid[f] = g
        flow_job[f] = job
        mult[g] += 1
    distinct = sorted_gids.shape[0] > 0
    ent_gid, ent_link, nxt, ent_n = _ac(sorted_gids if distinct else gids, distinct, in_ent, g_len, g_start, g_flat,
                                        ent_gid, ent_link, nxt, ent_n, g_pos, head)
    n_act = act.shape[0]
    new_act = np.empty(n_act + n, dtype=np.int64)
    new_act[:n_act] = act
    for i in range(n):
        new_act[n_act + i] = first + i
    return rem, gid, tail, flow_job, new_act, ent_gid, ent_link, nxt, ent_n


def _mark_links(first: int, n: int, el_all: np.ndarray, l_mask: np.ndarray, l_set: np.ndarray, n_l: int,
                head: np.ndarray, nxt: np.ndarray) -> int:  # pragma: no cover - compiled by numba
    """Mark the links of entries ``first .. first+n-1`` not yet marked in ``l_mask``, appending them to
    ``l_set`` (``n_l`` of them so far); returns the new count. A link whose list holds this entry alone
    (``head``/``nxt``) leads to no other group: it is left unmarked, its list not walked."""
    for e in range(first, first + n):
        lk = el_all[e]
        if not l_mask[lk] and (head[lk] != e or nxt[e] >= 0):
            l_mask[lk] = True
            l_set[n_l] = lk
            n_l += 1
    return n_l


def _compact(ent_gid: np.ndarray, ent_link: np.ndarray, ent_n: int, mult: np.ndarray, in_ent: np.ndarray,
             head: np.ndarray, nxt: np.ndarray, g_pos: np.ndarray) -> int:  # pragma: no cover - numba
    """Keep only the entries of groups that carry flows, in entry order (what ``FlowNetwork._compact_entries``
    keeps); the idle groups lose ``in_ent``, the kept ones get their new first position in ``g_pos``, and the
    link lists are threaded again. Returns the new entry count."""
    for e in range(ent_n):
        head[ent_link[e]] = -1
    k = 0
    prev = -1
    for e in range(ent_n):
        g = ent_gid[e]
        if mult[g] > 0:
            if g != prev:
                g_pos[g] = k
            ent_gid[k] = g
            ent_link[k] = ent_link[e]
            k += 1
        else:
            in_ent[g] = False
        prev = g
    _lp(ent_link, 0, k, head, nxt)
    return k


def _composition_take(gs: np.ndarray, mult: np.ndarray, in_c: np.ndarray, cm_keys: np.ndarray,
                      cm_where: np.ndarray, cm_gm: np.ndarray, cm_r: np.ndarray, cm_state: np.ndarray,
                      group_rate: np.ndarray) -> tuple[np.uint64, int, bool]:  # pragma: no cover - numba
    """A whole component's composition looked up (:func:`_composition_find`) and, on a hit, its stored rates
    given to its groups (``cm_state[3]`` counts the hits): (its hash, its slot, whether it was found)."""
    h, slot, off = _cf(gs, mult, in_c, cm_keys, cm_where, cm_gm)
    if off < 0:
        return h, slot, False
    for j in range(gs.shape[0]):
        group_rate[cm_gm[2 * (off + j)]] = cm_r[off + j]
    cm_state[3] += 1
    return h, slot, True


def _recompute(eg_all: np.ndarray, el_all: np.ndarray, mult: np.ndarray, group_rate: np.ndarray, cap: np.ndarray,
               touched: np.ndarray, has_touched: bool, full: bool, thr: float, act: np.ndarray, gid: np.ndarray,
               rem: np.ndarray, scratch: np.ndarray, l_map: np.ndarray, g_mask: np.ndarray, l_mask: np.ndarray,
               load: np.ndarray, resid: np.ndarray, memo_gids: np.ndarray, memo_rates: np.ndarray,
               in_ent: np.ndarray, g_pos: np.ndarray, g_len: np.ndarray, g_live: np.ndarray, head: np.ndarray,
               nxt: np.ndarray, n_live: int, cm_keys: np.ndarray, cm_where: np.ndarray, cm_gm: np.ndarray,
               cm_r: np.ndarray, cm_state: np.ndarray
               ) -> tuple[int, np.ndarray, float, np.ndarray]:  # pragma: no cover - compiled by numba
    """(entries of the groups that carry flows, rates of the active flows, time to the next departure, memo
    rates): :func:`_refresh` (the groups' rates, updated in ``group_rate``), then the active flows' rates and the
    time to the next departure (:func:`_rates`)."""
    n_live, memo_out = _rf(eg_all, el_all, mult, group_rate, cap, touched, has_touched, full, thr, act, scratch,
                           l_map, g_mask, l_mask, load, resid, memo_gids, memo_rates, in_ent, g_pos, g_len, g_live,
                           head, nxt, n_live, cm_keys, cm_where, cm_gm, cm_r, cm_state)
    act_rate, next_dt = _ar(act, gid, group_rate, rem)
    return n_live, act_rate, next_dt, memo_out




def _refresh(eg_all: np.ndarray, el_all: np.ndarray, mult: np.ndarray, group_rate: np.ndarray, cap: np.ndarray,
             touched: np.ndarray, has_touched: bool, full: bool, thr: float, act: np.ndarray, scratch: np.ndarray,
             l_map: np.ndarray, g_mask: np.ndarray, l_mask: np.ndarray, load: np.ndarray, resid: np.ndarray,
             memo_gids: np.ndarray, memo_rates: np.ndarray, in_ent: np.ndarray, g_pos: np.ndarray, g_len: np.ndarray,
             g_live: np.ndarray, head: np.ndarray, nxt: np.ndarray, n_live: int, cm_keys: np.ndarray,
             cm_where: np.ndarray, cm_gm: np.ndarray, cm_r: np.ndarray, cm_state: np.ndarray
             ) -> tuple[int, np.ndarray]:  # pragma: no cover - compiled by numba
    """(entries of the groups that carry flows, memo rates); the groups' rates are updated in ``group_rate``
    (``act``: the active flows, only their number is read). The steps and their order are those of
    ``FlowNetwork._recompute`` / ``_component`` / ``_refill``, and every step costs the changed component, not
    the network:

    * the entries ``(eg_all, el_all)`` of a group are contiguous from ``g_pos[g]`` (``g_len[g]`` of them, for
      the groups ``in_ent``); ``head``/``nxt`` thread every entry onto its link's list (:func:`_link_push`);
    * ``g_live`` is each group's liveness (it carries flows) at the last computation, and ``n_live`` the
      number of live entries then: only the changed groups (``touched``) can have changed it;
    * the component of the changed groups is found breadth-first over the link lists (the same fixpoint as
      the numpy path's passes: the live groups joined to the changed ones through shared links), and its
      entries are taken group by group in entry order, the order the numpy path filters them in.

    Scratch arrays, each left as found: ``scratch`` -1 per group, ``l_map`` -1 per link, ``g_mask`` False per
    group, ``l_mask`` False per link, ``load`` 0 per link, ``resid`` anything per link. Idle groups' rates are
    zeroed where they went idle (the groups ``touched``).

    ``memo_gids`` (ascending, distinct; empty for none) are the groups of one batch of arrivals that are the
    only change since the last computation: when their component is exactly themselves, one flow each, their
    rates depend on nothing else, and are the ``memo_rates`` given (the same computation on the same inputs
    made before), or are computed and returned as the last output (empty otherwise).

    A component of at least ``COMPOSITION_MIN_ENTRIES`` entries refilled whole (arrivals beside other traffic, or
    a partial refill that rounding spoiled) looks its rates up by its *composition* first: max-min rates are a
    function of the live groups (their paths, fixed per group), their flow counts and the capacities alone, so a
    component made of the same groups with the same counts as one filled before gets that filling's rates, and
    one filled now is stored (:func:`_composition_find`, :func:`_composition_store`; a component refilled whole
    in any case, after arrivals, is looked up from its groups as found, before its entries are gathered and
    sorted into entry order: a hit never needs them; :mod:`topotrain.network.flow_compositions`; ``cm_*`` the
    table, ``cm_state`` its fill, the room a store lacked, and the lookups it answered).

    Links whose list holds only the entry that reaches them lead to no other group and are not walked
    (:func:`_mark_links`): a path's private links (a GPU's NIC, PCIe lanes) make most of a component's links."""
    memo_out = np.zeros(0)
    for g in touched:  # liveness follows the changed groups
        live = mult[g] > 0
        if live != g_live[g]:
            g_live[g] = live
            if live:
                n_live += g_len[g]
            else:
                n_live -= g_len[g]
    if act.shape[0] == 0:
        group_rate[:] = 0.0
        return n_live, memo_out
    alone = False
    ok = False
    n_cg = 0
    keyed = False  # a whole component of enough entries: its composition looked up, and stored once computed
    looked = False
    h = np.uint64(0)
    slot = -1
    live_g = np.zeros(0, dtype=np.int64)
    n_g = 0
    n_l = 0
    g_set = live_g
    l_set = live_g
    ceg = live_g
    cel = live_g
    if has_touched:
        # the component of the changed groups: seeds, then breadth-first over the links' lists
        n_ent = eg_all.shape[0]
        g_set = np.empty(touched.shape[0] + n_ent, dtype=np.int64)
        l_set = np.empty(n_ent, dtype=np.int64)
        for g in touched:
            if not g_mask[g]:
                g_mask[g] = True
                g_set[n_g] = g
                n_g += 1
        for i in range(n_g):  # the links of all the seeds' entries (live or not)
            g = g_set[i]
            if in_ent[g]:
                n_l = _ml(g_pos[g], g_len[g], el_all, l_mask, l_set, n_l, head, nxt)
        q = 0
        while q < n_l:
            e = head[l_set[q]]
            q += 1
            while e >= 0:
                g = eg_all[e]
                if mult[g] > 0 and not g_mask[g]:
                    g_mask[g] = True
                    g_set[n_g] = g
                    n_g += 1
                    n_l = _ml(g_pos[g], g_len[g], el_all, l_mask, l_set, n_l, head, nxt)
                e = nxt[e]
        # its live groups (in the order found), then, unless the composition table answers first, their entries
        # in entry order
        n_cg = 0
        n_c = 0
        live_g = np.empty(n_g, dtype=np.int64)
        for i in range(n_g):
            g = g_set[i]
            if mult[g] > 0:
                live_g[n_cg] = g
                n_c += g_len[g]
                n_cg += 1
        live_g = live_g[:n_cg]
        alone = full and memo_gids.shape[0] > 0 and n_g == memo_gids.shape[0]
        if alone:
            for g in memo_gids:
                if not g_mask[g] or mult[g] != 1:
                    alone = False
                    break
        keyed = not alone and n_c >= COMPOSITION_MIN_ENTRIES and cm_keys.shape[0] > 0
        if keyed and full:  # refilled whole in any case: the table first, before gathering the entries
            looked = True
            h, slot, ok = _ct(live_g, mult, g_mask, cm_keys, cm_where, cm_gm, cm_r, cm_state, group_rate)
        if not ok:
            pos_c = np.empty(n_cg, dtype=np.int64)
            for i in range(n_cg):
                pos_c[i] = g_pos[live_g[i]]
            pos_c = np.sort(pos_c)
            ceg = np.empty(n_c, dtype=np.int64)
            cel = np.empty(n_c, dtype=np.int64)
            k = 0
            for i in range(n_cg):
                p = pos_c[i]
                g = eg_all[p]
                for e in range(p, p + g_len[g]):
                    ceg[k] = g
                    cel[k] = el_all[e]
                    k += 1
    else:  # every live entry, in entry order
        n_c = 0
        ceg = np.empty(eg_all.shape[0], dtype=np.int64)
        cel = np.empty(eg_all.shape[0], dtype=np.int64)
        for e in range(eg_all.shape[0]):
            if mult[eg_all[e]] > 0:
                ceg[n_c] = eg_all[e]
                cel[n_c] = el_all[e]
                n_c += 1
        ceg = ceg[:n_c]
        cel = cel[:n_c]
    # refill the component
    if not full and not ok:
        bound = thr * (1.0 - REDO_REL_EPS)
        n_redo = 0
        for e in range(n_c):
            if group_rate[ceg[e]] >= bound:
                n_redo += 1
        if n_redo < n_c:
            fixed_ok = True
            reg = np.empty(n_redo, dtype=np.int64)
            rel = np.empty(n_redo, dtype=np.int64)
            rw = np.empty(n_redo)
            k = 0
            for e in range(n_c):
                g = ceg[e]
                if group_rate[g] >= bound:
                    reg[k] = g
                    rel[k] = cel[e]
                    rw[k] = float(mult[g])
                    k += 1
                else:
                    load[cel[e]] += group_rate[g] * float(mult[g])
                    if not group_rate[g] > 0:
                        fixed_ok = False
            for i in range(n_redo):  # capacity the fixed flows leave, on the links the refill uses
                lk = rel[i]
                d = cap[lk] - load[lk]
                resid[lk] = d if d > 0.0 else 0.0
            for e in range(n_c):
                load[cel[e]] = 0.0
            groups, part = _mm(reg, rel, rw, resid, scratch, l_map)
            ok = fixed_ok
            for i in range(groups.shape[0]):
                if not part[i] > 0:  # rounding left a refilled flow nothing: do it all again
                    ok = False
            if ok:
                for i in range(groups.shape[0]):
                    group_rate[groups[i]] = part[i]
    if alone and memo_rates.shape[0] == memo_gids.shape[0]:
        for i in range(memo_gids.shape[0]):
            group_rate[memo_gids[i]] = memo_rates[i]
        ok = True
    keyed = keyed and not ok
    if keyed and not looked:  # a partial refill that rounding spoiled: refilled whole, the table first
        h, slot, ok = _ct(live_g, mult, g_mask, cm_keys, cm_where, cm_gm, cm_r, cm_state, group_rate)
        keyed = not ok  # found: nothing to store
    if not ok:
        w_e = np.empty(n_c)
        for e in range(n_c):
            w_e[e] = float(mult[ceg[e]])
        groups, part = _mm(ceg, cel, w_e, cap, scratch, l_map)
        for i in range(groups.shape[0]):
            group_rate[groups[i]] = part[i]
        if alone:
            memo_out = np.empty(memo_gids.shape[0])
            for i in range(memo_gids.shape[0]):
                memo_out[i] = group_rate[memo_gids[i]]
    if keyed:  # looked up and missed: stored once computed
        _cs(live_g, h, slot, mult, group_rate, cm_keys, cm_where, cm_gm, cm_r, cm_state)
    for i in range(n_g):  # leave the masks as found
        g_mask[g_set[i]] = False
    for i in range(n_l):
        l_mask[l_set[i]] = False
    for g in touched:
        if mult[g] == 0:
            group_rate[g] = 0.0
    return n_live, memo_out


class EntryKernels(NamedTuple):
    """The compiled kernels that keep a network's incidence entries, their link lists and group positions."""

    compact: Callable[..., int]  #: :func:`_compact`
    activate: Callable[..., tuple[Any, ...]]  #: :func:`_activate`
    start: Callable[..., tuple[Any, ...]]  #: :func:`_start`


# the functions the kernels call: the Python ones, replaced by their compiled versions before compiling
_fill: Any = _filling
_lp: Any = _link_push
_ml: Any = _mark_links
_gw: Any = grown
_ac: Any = _activate
_mm: Any = _max_min
_KERNEL: list[Any] = []
_STEP: list[Any] = []
_STEPS: list[Any] = []
_PARTIAL: list[Any] = []
_LISTS: list[EntryKernels] = []


def compiled_recompute() -> Callable[..., tuple[int, np.ndarray, float, np.ndarray]] | None:
    """:func:`_recompute` compiled by numba (once, cached on disk), or None without numba or with
    ``TOPOTRAIN_KERNEL=numpy`` (read at each call: the memo holds only what numba gave)."""
    if os.environ.get("TOPOTRAIN_KERNEL", "") == "numpy":
        return None
    if not _KERNEL:
        kernel = None
        try:
            import numba

            # the functions the kernels call are bound to their compiled versions before the kernels
            # are compiled (numba binds a kernel's globals when it compiles it)
            global _fill, _mm, _fl, _rc, _st, _lp, _cp, _ml, _gw, _ac, _cf, _cs, _ct, _rf, _ar, _dp, _rfl, _sk
            global _pa
            compile_helpers()
            jit = numba.njit(cache=True, nogil=True)
            _ml = jit(_mark_links)
            _fill = jit(_filling)
            _mm = jit(_max_min)
            _lp = jit(_link_push)
            _cp = jit(_compact)
            _gw = jit(grown)
            _ac = jit(_activate)
            _sk = jit(_start)
            _LISTS.append(EntryKernels(_cp, _ac, _sk))
            _cf = jit(_composition_find)
            _cs = jit(_composition_store)
            _ct = jit(_composition_take)
            _rf = jit(_refresh)
            _ar = jit(_rates)
            _dp = jit(_depart)
            _rfl = jit(_rates_flush)
            kernel = jit(_recompute)
            _fl = jit(_flush)
            _STEP.append(jit(_step))
            _rc, _st = kernel, _STEP[0]
            _pa = jit(_partial)
            _PARTIAL.append(_pa)
            _STEPS.append(jit(_steps))
        except ImportError:
            kernel = None
        _KERNEL.append(kernel)
    return _KERNEL[0]  # type: ignore[no-any-return, unused-ignore]




#: what the step kernels call: :func:`_flush`, replaced by its compiled version before they are compiled
_fl: Any = _flush


def _step(dt: float, act: np.ndarray, act_rate: np.ndarray, rem: np.ndarray, gid: np.ndarray, mult: np.ndarray,
          group_bytes: np.ndarray, acc: np.ndarray, done_rel_eps: float
          ) -> tuple[np.ndarray, np.ndarray, float]:  # pragma: no cover - compiled by numba
    """Progress the active flows by ``dt`` (as ``FlowNetwork._step_event``): (flows that sent their last byte,
    the flows still sending, the lowest rate among the first), by :func:`_depart`; the bytes it summed per group
    in ``acc`` (zeros, left so) are then added to ``group_bytes`` (:func:`_flush`)."""
    done, left, low = _dp(dt, act, act_rate, rem, gid, mult, acc, done_rel_eps)
    _fl(act, gid, acc, group_bytes)
    return done, left, low






def _steps(lim: float, now: float, next_dt: float, act: np.ndarray, act_rate: np.ndarray, rem: np.ndarray,
           gid: np.ndarray, mult: np.ndarray, group_bytes: np.ndarray, acc: np.ndarray, tail: np.ndarray,
           flow_job: np.ndarray, job_pending: np.ndarray, job_end: np.ndarray, job_last: np.ndarray,
           ent_gid: np.ndarray, ent_link: np.ndarray, ent_n: int, in_ent: np.ndarray, num_groups: int,
           group_rate: np.ndarray, cap: np.ndarray, compact_min: int, scratch: np.ndarray, l_map: np.ndarray,
           g_mask: np.ndarray, l_mask: np.ndarray, load: np.ndarray, resid: np.ndarray, g_pos: np.ndarray,
           g_len: np.ndarray, g_live: np.ndarray, head: np.ndarray, nxt: np.ndarray, n_live: int,
           done_rel_eps: float, stop_at_jobs: bool, pre: bool, touched_in: np.ndarray, has_touched: bool,
           full: bool, thr: float, memo_gids: np.ndarray, memo_rates: np.ndarray, cm_keys: np.ndarray,
           cm_where: np.ndarray, cm_gm: np.ndarray, cm_r: np.ndarray, cm_state: np.ndarray, chain_on: bool,
           slot_of: np.ndarray, cs: np.ndarray, cb: np.ndarray, pg: np.ndarray, pf: np.ndarray, num_flows: int,
           g_start: np.ndarray, g_flat: np.ndarray
           ) -> tuple[Any, ...]:  # pragma: no cover - compiled by numba
    """Every departure event of a ``jobs=True`` network while ``now + next_dt <= lim`` (with ``stop_at_jobs``,
    ``lim`` shrinks to the completion of any job that completes on the way), each as
    ``FlowNetwork._step_event`` runs it: progress by :func:`_step`, count the departed flows to their jobs as
    ``_settle_jobs`` does, recompute the rates by :func:`_recompute` (departures only) and compact the entries as
    ``_compact_entries`` does — the same arithmetic in the same order, without a return to Python per event.
    With ``pre``, the rates are first recomputed after arrivals as ``FlowNetwork._recompute`` does (changed
    groups ``touched_in``, ``has_touched``, ``full``, ``thr`` and the memo as it passes them to
    :func:`_recompute`, then the same compaction), and the loop starts from the ``next_dt`` found: one call for
    what would be two. With ``chain_on``, where a job completes before the limit given and every job completing
    then has a chained phase (``slot_of``, ``cs``, ``cb``, ``pg``, ``pf``: :mod:`topotrain.network.flow_chain`),
    those phases start here as FlowSim would start them (flows ``num_flows ..``; ``g_start``/``g_flat`` give
    the groups' links) and the loop goes on.
    Returns (now, next_dt, act, act_rate, live entry count, entry count, flows completed, latest completion,
    per completed job its completion time, last flow and id, in completion order, the memo rates of the
    recomputation with ``pre``, the per-flow and entry arrays (grown ones are new), the flow count, and the time
    and job of each chained phase started)."""
    n_completed = 0
    last_completion = -np.inf
    out_n = 0
    out_end = np.empty(16)
    out_last = np.empty(16, dtype=np.int64)
    out_job = np.empty(16, dtype=np.int64)
    mult_v = mult[:num_groups]
    rate_v = group_rate[:num_groups]
    no_memo_g = np.zeros(0, dtype=np.int64)
    no_memo_r = np.zeros(0)
    memo_out = np.zeros(0)
    if pre:
        n_live, act_rate, next_dt, memo_out = _rc(ent_gid[:ent_n], ent_link[:ent_n], mult_v, rate_v, cap, touched_in,
                                                  has_touched, full, thr, act, gid, rem, scratch, l_map, g_mask,
                                                  l_mask, load, resid, memo_gids, memo_rates, in_ent, g_pos, g_len,
                                                  g_live, head, nxt, n_live, cm_keys, cm_where, cm_gm, cm_r,
                                                  cm_state)
        if n_live < ent_n and ent_n - n_live > max(n_live, compact_min):
            ent_n = _cp(ent_gid, ent_link, ent_n, mult, in_ent, head, nxt, g_pos)
    lim0 = lim
    log_n = 0
    log_t = np.empty(16)
    log_j = np.empty(16, dtype=np.int64)
    while True:
        while act.shape[0] > 0 and now + next_dt <= lim:
            dt = next_dt
            fids, act, low = _dp(dt, act, act_rate, rem, gid, mult, acc, done_rel_eps)
            now = now + dt
            n_done = fids.shape[0]
            n_completed += n_done
            touched = np.empty(n_done, dtype=np.int64)
            for i in range(n_done):
                f = fids[i]
                touched[i] = gid[f]
                t = now + tail[f]
                if t > last_completion:
                    last_completion = t
                j = flow_job[f]
                job_pending[j] -= 1
                if t > job_end[j] or (t == job_end[j] and f > job_last[j]):
                    job_end[j] = t
                    job_last[j] = f
                if job_pending[j] == 0:
                    if out_n == out_end.shape[0]:
                        grown_end = np.empty(2 * out_n)
                        grown_last = np.empty(2 * out_n, dtype=np.int64)
                        grown_job = np.empty(2 * out_n, dtype=np.int64)
                        grown_end[:out_n] = out_end
                        grown_last[:out_n] = out_last
                        grown_job[:out_n] = out_job
                        out_end, out_last, out_job = grown_end, grown_last, grown_job
                    out_end[out_n] = job_end[j]
                    out_last[out_n] = job_last[j]
                    out_job[out_n] = j
                    out_n += 1
                    if stop_at_jobs and job_end[j] < lim:
                        lim = job_end[j]
            n_live, _ = _rf(ent_gid[:ent_n], ent_link[:ent_n], mult_v, rate_v, cap, touched, True, False, low, act,
                            scratch, l_map, g_mask, l_mask, load, resid, no_memo_g, no_memo_r, in_ent, g_pos, g_len,
                            g_live, head, nxt, n_live, cm_keys, cm_where, cm_gm, cm_r, cm_state)
            act_rate, next_dt = _rfl(act, fids, gid, rate_v, rem, acc, group_bytes)
            if n_live < ent_n and ent_n - n_live > max(n_live, compact_min):
                ent_n = _cp(ent_gid, ent_link, ent_n, mult, in_ent, head, nxt, g_pos)
        if not chain_on or not lim < lim0 or cm_state[2] != 0:
            break
        # a job completes at t_at, before anything outside the network happens: when every job completing then
        # has its next phase registered (flow_chain), start those phases here, as FlowSim would at t_at
        t_at = lim
        k = 0
        order = np.empty(out_n, dtype=np.int64)
        for i in range(out_n):
            if out_end[i] == t_at:
                j = out_job[i]
                s = slot_of[j] if j < slot_of.shape[0] else -1
                if s < 0 or cs[s, 1] >= cs[s, 2]:
                    k = -1
                    break
                q = k  # in the job heap's order: (time, last flow, job)
                while q > 0 and (out_last[order[q - 1]] > out_last[i]
                                 or (out_last[order[q - 1]] == out_last[i] and out_job[order[q - 1]] > j)):
                    order[q] = order[q - 1]
                    q -= 1
                order[q] = i
                k += 1
        if k <= 0:
            break
        if act.shape[0] > 0 and t_at > now:  # FlowNetwork._advance_fluid's last stretch
            next_dt = _pa(t_at - now, act, act_rate, rem, gid, group_bytes, acc)
        now = max(now, t_at)
        n_ch = 0
        for q in range(k):
            n_ch += cb[cs[slot_of[out_job[order[q]]], 0], 1]
        changed = np.empty(n_ch, dtype=np.int64)
        n_ch = 0
        b = 0
        for q in range(k):  # FlowNetwork.start_prepared of each, in that order
            j = out_job[order[q]]
            s = slot_of[j]
            b, pos = cs[s, 0], cs[s, 1]
            g_off, n, s_off, ns, t_off = cb[b, 0], cb[b, 1], cb[b, 2], cb[b, 3], cb[b, 4]
            if job_pending[j] == 0:  # FlowNetwork._job_counts
                job_end[j] = -np.inf
                job_last[j] = -1
            job_pending[j] += n
            z_off = cs[s, 3] + pos * n
            rem, gid, tail, flow_job, act, ent_gid, ent_link, nxt, ent_n = _sk(
                pg[g_off:g_off + n], pg[s_off:s_off + ns], pf[t_off:t_off + n], pf[z_off:z_off + n], num_flows, j,
                rem, gid, tail, flow_job, mult, act, in_ent, g_len, g_start, g_flat, ent_gid, ent_link, nxt, ent_n,
                g_pos, head)
            num_flows += n
            cs[s, 1] = pos + 1
            changed[n_ch:n_ch + n] = pg[g_off:g_off + n]
            n_ch += n
            if log_n == log_t.shape[0]:
                log_t = np.concatenate((log_t, np.empty(log_n)))
                log_j = np.concatenate((log_j, np.empty(log_n, dtype=np.int64)))
            log_t[log_n] = t_at
            log_j[log_n] = j
            log_n += 1
        # the rates after the arrivals (FlowNetwork._kernel_inputs' memo: one batch alone), then the compaction
        memo_g = no_memo_g
        memo_r = no_memo_r
        if k == 1 and cb[b, 3] > 0:
            memo_g = pg[cb[b, 2]:cb[b, 2] + cb[b, 3]]
            if cb[b, 6]:
                memo_r = pf[cb[b, 5]:cb[b, 5] + cb[b, 3]]
        n_live, act_rate, next_dt, memo_o = _rc(ent_gid[:ent_n], ent_link[:ent_n], mult_v, rate_v, cap, changed,
                                                True, True, np.inf, act, gid, rem, scratch, l_map, g_mask, l_mask,
                                                load, resid, memo_g, memo_r, in_ent, g_pos, g_len, g_live, head, nxt,
                                                n_live, cm_keys, cm_where, cm_gm, cm_r, cm_state)
        if memo_o.shape[0] and k == 1 and cb[b, 3] > 0 and not cb[b, 6]:
            pf[cb[b, 5]:cb[b, 5] + cb[b, 3]] = memo_o
            cb[b, 6] = 1
        if n_live < ent_n and ent_n - n_live > max(n_live, compact_min):
            ent_n = _cp(ent_gid, ent_link, ent_n, mult, in_ent, head, nxt, g_pos)
        # the jobs still to report, and the limit the next call would have: the given one, or an earlier completion
        lim = lim0
        kept = 0
        for i in range(out_n):
            if out_end[i] != t_at:
                out_end[kept] = out_end[i]
                out_last[kept] = out_last[i]
                out_job[kept] = out_job[i]
                kept += 1
                if stop_at_jobs and out_end[i] < lim:
                    lim = out_end[i]
        out_n = kept
    return (now, next_dt, act, act_rate, n_live, ent_n, n_completed, last_completion, out_end[:out_n],
            out_last[:out_n], out_job[:out_n], memo_out, rem, gid, tail, flow_job, ent_gid, ent_link, nxt, num_flows,
            log_t[:log_n], log_j[:log_n])


_rc: Any = _recompute
_rf: Any = _refresh
_ar: Any = _rates
_dp: Any = _depart
_rfl: Any = _rates_flush
_cf: Any = _composition_find
_cs: Any = _composition_store
_ct: Any = _composition_take
_st: Any = _step
_cp: Any = _compact
_sk: Any = _start


def _partial(dt: float, act: np.ndarray, act_rate: np.ndarray, rem: np.ndarray, gid: np.ndarray,
             group_bytes: np.ndarray, acc: np.ndarray) -> float:  # pragma: no cover - compiled by numba
    """Progress the active flows by ``dt``, before any of them sends its last byte (as
    ``FlowNetwork._advance_fluid``'s last stretch: ``moved = min(rate·dt, rem)``, bytes summed per group in
    ``acc`` — zeros, left so — in the order ``numpy.bincount`` sums them, then added); returns the time to the
    next departure."""
    n = act.shape[0]
    next_dt = np.inf
    for i in range(n):
        f = act[i]
        r = rem[f]
        moved = act_rate[i] * dt
        if r < moved:
            moved = r
        rem[f] = r - moved
        acc[gid[f]] += moved
    _fl(act, gid, acc, group_bytes)
    for i in range(n):
        t = rem[act[i]] / act_rate[i]
        if t < next_dt:
            next_dt = t
    return next_dt


#: what the departure loop calls to progress the flows to a phase's start: :func:`_partial`, compiled before it is
_pa: Any = _partial


def compiled_partial() -> Callable[..., float] | None:
    """:func:`_partial` compiled (with :func:`compiled_recompute`), or None when that is None."""
    return _PARTIAL[0] if compiled_recompute() is not None else None


def compiled_steps() -> Callable[..., tuple[Any, ...]] | None:
    """:func:`_steps` compiled (with :func:`compiled_recompute`), or None when that is None."""
    return _STEPS[0] if compiled_recompute() is not None else None


def compiled_step() -> Callable[..., tuple[np.ndarray, np.ndarray, float]] | None:
    """:func:`_step` compiled (with :func:`compiled_recompute`), or None when that is None."""
    return _STEP[0] if compiled_recompute() is not None else None


def compiled_lists() -> EntryKernels | None:
    """The kernels that keep the entries and their link lists, compiled (with :func:`compiled_recompute`), or
    None when that is None."""
    return _LISTS[0] if compiled_recompute() is not None else None
