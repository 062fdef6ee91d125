"""Recursive halving-doubling (Rabenseifner's algorithm; Thakur, Rabenseifner & Gropp, IJHPCA 2005).

For p = 2^k ranks and p chunks: recursive-halving reduce-scatter — in step s (0..k−1) rank i exchanges
with rank i XOR p/2^(s+1), sending the half of its current block that does not contain chunk i and
reducing the half it keeps; after k steps rank i holds chunk i reduced. Then recursive-doubling
allgather — in step s rank i sends its block of 2^s chunks to rank i XOR 2^s. Allreduce = both (2k
steps, 2(p−1)/p·n bytes per rank).

For p not a power of two (allreduce only) the fold of Thakur et al.: with p' = 2^⌊log2 p⌋ and r = p − p',
the r extra ranks (positions p'..p−1 here) first send their whole buffer to positions 0..r−1, which reduce
it; the p' core ranks run halving-doubling; then positions 0..r−1 send the result back. 2⌊log2 p⌋ + 2
steps, matching :func:`~topotrain.collectives.costmodel.hd_allreduce_s`.

The builders work on many groups at once (rows of a 2-D array of rank indices, each with its own chunk
offset), so :mod:`~topotrain.collectives.hierarchical` and :mod:`~topotrain.collectives.hdrm` reuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from topotrain.collectives.costmodel import is_power_of_two
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


def core_size(q: int) -> int:
    """2^⌊log2 q⌋: the ranks (and chunks per group) of the power-of-two core."""
    return 1 << (int(q).bit_length() - 1)


def hd_core_phases(groups: np.ndarray, base: np.ndarray, *, reduce_scatter: bool = True,
                   allgather: bool = True) -> list[Phase]:
    """Recursive halving (reduce-scatter) and/or doubling (allgather) on groups of P = 2^k positions.

    ``groups[g, i]``: rank index of position ``i`` of group ``g``; group ``g`` works on chunks
    ``base[g] .. base[g] + P``; position ``i`` ends the reduce-scatter holding chunk ``base[g] + i``.
    """
    groups = np.asarray(groups, dtype=np.int64)
    k_groups, q = groups.shape
    if q < 2:
        return []
    base = np.broadcast_to(np.asarray(base, dtype=np.int64), (k_groups,))[:, None]
    pos = np.arange(q, dtype=np.int64)
    src = groups.ravel()
    phases = []
    if reduce_scatter:
        block = q
        while block > 1:
            half = block // 2
            start = (pos // block) * block
            keep_upper = (pos & half) != 0
            lo = np.where(keep_upper, start, start + half)
            dst = groups[:, pos ^ half].ravel()
            phases.append(Phase.of(src, dst, (base + lo).ravel(), (base + lo + half).ravel(), True))
            block = half
    if allgather:
        d = 1
        while d < q:
            lo = (pos // d) * d
            dst = groups[:, pos ^ d].ravel()
            phases.append(Phase.of(src, dst, (base + lo).ravel(), (base + lo + d).ravel(), False))
            d *= 2
    return phases


def hd_allreduce_phases(groups: np.ndarray, base: np.ndarray) -> list[Phase]:
    """Allreduce on groups of any size q; each group needs :func:`core_size` (q) chunks from ``base``."""
    groups = np.asarray(groups, dtype=np.int64)
    k_groups, q = groups.shape
    core = core_size(q)
    if core == q:
        return hd_core_phases(groups, base)
    base = np.broadcast_to(np.asarray(base, dtype=np.int64), (k_groups,))
    extra = groups[:, core:]
    partner = groups[:, : q - core]
    lo = np.repeat(base, q - core)
    hi = lo + core
    fold_in = Phase.of(extra.ravel(), partner.ravel(), lo, hi, True)
    fold_out = Phase.of(partner.ravel(), extra.ravel(), lo, hi, False)
    return [fold_in, *hd_core_phases(groups[:, :core], base), fold_out]


@lru_cache(maxsize=256)
def _identity_phases(op: CollectiveOp, p: int) -> tuple[Phase, ...]:
    """The phases of ``op`` with logical rank l played by rank l: they depend on p only, so every group of a
    plan shares one (read-only) copy; another rank order only relabels their sources and destinations."""
    groups = np.arange(p, dtype=np.int64)[None, :]
    zero = np.zeros(1, dtype=np.int64)
    if op is CollectiveOp.ALLREDUCE:
        phases = hd_allreduce_phases(groups, zero)
    else:
        rs = op is CollectiveOp.REDUCE_SCATTER
        phases = hd_core_phases(groups, zero, reduce_scatter=rs, allgather=not rs)
    for ph in phases:
        for a in (ph.src, ph.dst, ph.chunk_lo, ph.chunk_hi, ph.reduce):
            a.flags.writeable = False
    return tuple(phases)


def hd_schedule(op: CollectiveOp, ranks: Sequence[str], size_bytes: int, algorithm: str,
                order: np.ndarray | None = None, meta: dict[str, object] | None = None) -> Schedule:
    """Halving-doubling schedule; ``order[l]`` is the index in ``ranks`` that plays logical rank ``l``
    (identity if None). For reduce-scatter, chunk ``c`` ends at ``ranks[order[c]]``; for allgather it
    starts there."""
    p = len(ranks)
    order = np.arange(p, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    if op is CollectiveOp.ALLREDUCE:
        core = core_size(p) if p > 1 else 1
        chunk_bytes = split_bytes(size_bytes, core)
        chunk_src = np.full(core, -1, dtype=np.int64)
        chunk_dst = np.full(core, -1, dtype=np.int64)
    elif op in (CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALLGATHER):
        if not is_power_of_two(p):
            raise ConfigError("collective.ranks", f"{algorithm} {op.value} needs a power-of-two number of "
                              f"ranks, got {p}", "use ring for other rank counts")
        rs = op is CollectiveOp.REDUCE_SCATTER
        chunk_bytes = split_bytes(size_bytes, p)
        chunk_src = np.full(p, -1, dtype=np.int64) if rs else order.copy()
        chunk_dst = order.copy() if rs else np.full(p, -1, dtype=np.int64)
    else:
        raise ConfigError("collective.algorithm", f"algorithm {algorithm!r} does not do {op.value}",
                          "use ring or tree")
    phases = _identity_phases(op, p) if p > 1 else ()
    if not np.array_equal(order, np.arange(p)):  # logical rank l is played by order[l]
        phases = tuple(Phase(order[ph.src], order[ph.dst], ph.chunk_lo, ph.chunk_hi, ph.reduce) for ph in phases)
    return Schedule(op, algorithm, tuple(ranks), int(size_bytes), chunk_bytes, chunk_src, chunk_dst,
                    phases, dict(meta or {}))


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
          **options: Any) -> Schedule:
    """Halving-doubling allreduce (any p, folding the extra ranks), reduce-scatter and allgather (p = 2^k)
    over ``ranks`` in order. No options."""
    p = len(ranks)
    meta: dict[str, object] = {}
    if op is CollectiveOp.ALLREDUCE and p > 1 and not is_power_of_two(p):
        meta["core_ranks"] = core_size(p)
    return hd_schedule(op, ranks, size_bytes, "halving-doubling", meta=meta)
