"""Ring collectives: allreduce, reduce-scatter, allgather, and pipelined-chain broadcast and reduce.

Ring reduce-scatter (Thakur, Rabenseifner & Gropp, IJHPCA 2005; Patarasuk & Yuan 2009): the buffer is cut
into p segments; in step s (0..p−2) the rank at ring position i sends segment (i − s − 1) mod p to
position i+1, which adds it to its copy. After p−1 steps position i holds segment i fully reduced. Ring
allgather: in step s position i sends segment (i − s) mod p to i+1 (a copy). Allreduce = both (2(p−1)
steps). Broadcast/reduce: a chain root → root+1 → … (reduce: the reverse), the buffer cut into C chunks
that flow down the chain one hop per step: C + p − 2 steps (Thakur et al. 2005, pipelined chain).

:func:`ring_phases` builds the steps of many rings at once (the rows of a 2-D array of rank indices), so
the two-level algorithms (:mod:`~topotrain.collectives.hierarchical`, :mod:`~topotrain.collectives.torus2d`)
reuse it. Every step is built with numpy, one array per phase, in O(p).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives import costmodel
from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


def ring_phases(groups: np.ndarray, seg_lo: np.ndarray, seg_hi: np.ndarray, *, reduce: bool) -> list[Phase]:
    """Steps of ``len(groups)`` concurrent rings (reduce-scatter if ``reduce`` else allgather).

    ``groups[g, i]`` is the rank index at position ``i`` of ring ``g``; segment ``j`` of ring ``g`` is the
    chunk range ``seg_lo[g, j]:seg_hi[g, j]``. Reduce-scatter leaves segment ``i`` reduced over the ring
    at position ``i``; allgather starts from position ``i`` holding segment ``i``.
    """
    groups = np.asarray(groups, dtype=np.int64)
    k, q = groups.shape
    if q < 2:
        return []
    lo_flat = np.broadcast_to(np.asarray(seg_lo, dtype=np.int64), (k, q)).ravel()
    hi_flat = np.broadcast_to(np.asarray(seg_hi, dtype=np.int64), (k, q)).ravel()
    src = groups.ravel()
    dst = np.roll(groups, -1, axis=1).ravel()
    pos = np.arange(q, dtype=np.int64)
    row_base = (np.arange(k, dtype=np.int64) * q)[:, None]
    off = 1 if reduce else 0
    red = np.full(k * q, reduce, dtype=bool)
    phases = []
    if k == 1:
        # one ring: step s reads the segments rotated by s + off, a slice of the doubled array — a view, so the
        # 2(p−1) steps of a p-rank ring hold O(p) chunk indices, not O(p²) (read-only: shared by every step)
        lo2, hi2 = np.concatenate([lo_flat, lo_flat]), np.concatenate([hi_flat, hi_flat])
        lo2.flags.writeable = hi2.flags.writeable = red.flags.writeable = False
        for s in range(q - 1):
            start = (-s - off) % q
            phases.append(Phase(src, dst, lo2[start:start + q], hi2[start:start + q], red))
        return phases
    if k * q * (q - 1) <= _EAGER_ENTRIES_MAX:
        for s in range(q - 1):
            flat = (row_base + (pos - s - off) % q).ravel()
            phases.append(Phase(src, dst, lo_flat.take(flat), hi_flat.take(flat), red))
        return phases
    # many long rings (the column stage of a two-level allreduce over thousands of servers): every step's chunk
    # indices as arrays would be k·q·(q−1) of them (17 GB at 8 × 8,192), so each step computes its own when
    # asked (the same values), and the schedule holds O(k·q)
    lo_flat.flags.writeable = hi_flat.flags.writeable = red.flags.writeable = False
    return [_RotatedPhase(src, dst, lo_flat, hi_flat, red, row_base, (-s - off) % q) for s in range(q - 1)]


#: Chunk-index entries up to which :func:`ring_phases` builds every step's arrays at once (8 bytes each, twice).
_EAGER_ENTRIES_MAX = 1 << 24


class _RotatedPhase(Phase):
    """A step of :func:`ring_phases` on many rings whose chunk indices are computed on access: ``chunk_lo`` is
    ``lo[row_base + (pos + shift) % q]``, what the eager branch stores (read-only, a new array per access)."""

    _lo: np.ndarray
    _hi: np.ndarray
    _rows: np.ndarray
    _shift: int

    def __init__(self, src: np.ndarray, dst: np.ndarray, lo_flat: np.ndarray, hi_flat: np.ndarray,
                 red: np.ndarray, row_base: np.ndarray, shift: int) -> None:
        for name, value in (("src", src), ("dst", dst), ("reduce", red), ("_lo", lo_flat), ("_hi", hi_flat),
                            ("_rows", row_base), ("_shift", shift)):
            object.__setattr__(self, name, value)

    def _flat(self) -> np.ndarray:
        q = self._lo.shape[0] // self._rows.shape[0]
        return (self._rows + (np.arange(q, dtype=np.int64) + self._shift) % q).ravel()

    @property
    def chunk_lo(self) -> np.ndarray:
        return self._lo.take(self._flat())

    @property
    def chunk_hi(self) -> np.ndarray:
        return self._hi.take(self._flat())


def estimate_alpha_beta(topo: Topology, ranks: Sequence[str], message_overhead_s: float) -> tuple[float, float]:
    """(alpha_s, beta_s_per_byte) to size pipelines: the per-message overhead plus the latency of the route
    ranks[0]→ranks[1], and 1/(slowest link capacity). A heuristic for default chunk counts only; timing
    is the network model's job."""
    alpha = float(message_overhead_s)
    if len(ranks) >= 2 and topo.num_links:
        with contextlib.suppress(ConfigError):
            alpha += topo.path_latency_s(topo.route(ranks[0], ranks[1]))
    beta = 1.0 / float(topo.capacity_bytes_per_s.min()) if topo.num_links else 0.0
    return alpha, beta


def overhead_option(options: dict[str, Any]) -> float:
    """The ``message_overhead_s`` option (seconds >= 0; default :data:`DEFAULT_MESSAGE_OVERHEAD_S`)."""
    v = options.get("message_overhead_s", DEFAULT_MESSAGE_OVERHEAD_S)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
        raise ConfigError("collective.options.message_overhead_s", f"must be seconds >= 0, got {v!r}",
                          "give e.g. 2e-6")
    return float(v)


def positive_int_option(options: dict[str, Any], name: str, algorithm: str, default: int) -> int:
    """Read an integer option >= 1 (``ConfigError`` naming it otherwise)."""
    v = options.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or int(v) < 1:
        raise ConfigError(f"collective.options.{name}",
                          f"{algorithm}: {name} must be an integer >= 1, got {v!r}", f"give e.g. {name}=8")
    return int(v)


def root_option(options: dict[str, Any], p: int, algorithm: str) -> int:
    """The ``root`` option: an index into ``ranks`` (default 0)."""
    v = options.get("root", 0)
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= int(v) < p:
        raise ConfigError("collective.options.root",
                          f"{algorithm}: root must be a rank index in [0, {p}), got {v!r}",
                          "give the index of the root in ranks")
    return int(v)


def _chain(op: CollectiveOp, p: int, root: int, chunks: int) -> list[Phase]:
    """Pipelined chain: ``chain[0] = root``; broadcast flows down the chain, reduce flows up to the root."""
    chain = (root + np.arange(p, dtype=np.int64)) % p
    hops = np.arange(p - 1, dtype=np.int64)  # hop h: chain[h] -> chain[h+1] (broadcast)
    if op is CollectiveOp.BROADCAST:
        hop_src, hop_dst, red = chain[hops], chain[hops + 1], False
    else:  # reduce: hop h carries chain[p-1-h] -> chain[p-2-h]
        hop_src, hop_dst, red = chain[p - 1 - hops], chain[p - 2 - hops], True
    phases = []
    for t in range(chunks + p - 2):
        c = t - hops
        live = (c >= 0) & (c < chunks)
        cl = c[live]
        phases.append(Phase.of(hop_src[live], hop_dst[live], cl, cl + 1, red))
    return phases


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
          **options: Any) -> Schedule:
    """Ring schedule for allreduce, reduce-scatter, allgather, broadcast or reduce over ``ranks`` in order.

    Options: ``root`` (broadcast/reduce, index into ranks, default 0); ``chunks`` (broadcast/reduce:
    pipeline chunks, default the integer optimum of (p−2+C)(α + nβ/C) for α, β estimated from ``topo``
    by :func:`estimate_alpha_beta`, at most :data:`~topotrain.collectives.costmodel.MAX_PIPELINE_CHUNKS`);
    ``message_overhead_s`` (the alpha of that estimate; :func:`~topotrain.collectives.registry.build_schedule`
    passes the network parameters' value).
    """
    p = len(ranks)
    meta: dict[str, object] = {}
    if op in (CollectiveOp.ALLREDUCE, CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALLGATHER):
        chunk_bytes = split_bytes(size_bytes, p)
        idx = np.arange(p, dtype=np.int64)
        groups = idx[None, :]
        phases: list[Phase] = []
        if op is not CollectiveOp.ALLGATHER:
            phases += ring_phases(groups, idx, idx + 1, reduce=True)
        if op is not CollectiveOp.REDUCE_SCATTER:
            phases += ring_phases(groups, idx, idx + 1, reduce=False)
        chunk_src = idx.copy() if op is CollectiveOp.ALLGATHER else np.full(p, -1, dtype=np.int64)
        chunk_dst = idx.copy() if op is CollectiveOp.REDUCE_SCATTER else np.full(p, -1, dtype=np.int64)
    elif op in (CollectiveOp.BROADCAST, CollectiveOp.REDUCE):
        root = root_option(options, p, "ring")
        if "chunks" in options:
            chunks = positive_int_option(options, "chunks", "ring", 1)
        else:
            alpha, beta = estimate_alpha_beta(topo, ranks, overhead_option(options))
            chunks = costmodel.optimal_pipeline_chunks(p - 1, size_bytes, alpha, beta)
        phases = _chain(op, p, root, chunks) if p > 1 else []
        chunk_bytes = split_bytes(size_bytes, chunks)
        if op is CollectiveOp.BROADCAST:
            chunk_src, chunk_dst = np.full(chunks, root, dtype=np.int64), np.full(chunks, -1, dtype=np.int64)
        else:
            chunk_src, chunk_dst = np.full(chunks, -1, dtype=np.int64), np.full(chunks, root, dtype=np.int64)
        meta = {"root": root, "chunks": chunks}
    else:
        raise ConfigError("collective.algorithm", f"algorithm 'ring' does not do {op.value}",
                          "use direct or pairwise for all-to-all")
    return Schedule(op, "ring", tuple(ranks), int(size_bytes), chunk_bytes, chunk_src, chunk_dst,
                    tuple(phases), meta)
