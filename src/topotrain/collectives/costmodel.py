"""Closed-form costs of the collective algorithms (Hockney alpha-beta-gamma), used to check schedules.

A message of ``n`` bytes costs ``alpha + n·beta`` (``beta`` = 1/bandwidth, s/byte); reducing ``n`` bytes
adds ``n·gamma``. ``p`` ranks, ``n_bytes`` the buffer of :class:`~topotrain.collectives.CollectiveOp`
(per-rank buffer for allreduce/broadcast/reduce, full buffer for reduce-scatter/allgather, send buffer
for all-to-all). Sources: Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005 (ring, recursive halving/doubling, binomial tree, pairwise exchange);
Mikami et al., arXiv 1811.05233 (2D torus); NCCL documentation and nccl-tests doc/PERFORMANCE.md
(double binary tree, busbw factors). Pipelined chains: T(C) = (stages − 1 + C)(alpha + n·beta/C).

All functions are pure and cheap; they assume a non-blocking network (no two concurrent transfers share a
link), on which :class:`~topotrain.network.analytical.AnalyticalModel` reproduces them.
"""

from __future__ import annotations

import math

from topotrain.collectives.schedule import CollectiveOp, parse_op
from topotrain.util.errors import ConfigError

#: Assumed per-message software overhead (Hockney's alpha) when a scenario gives none: of the order NCCL/MPI
#: report for a small message on a local fabric (:mod:`topotrain.network.params` explains the term).
DEFAULT_MESSAGE_OVERHEAD_S = 2e-6
#: default cap on the number of pipeline chunks an algorithm picks by itself
MAX_PIPELINE_CHUNKS = 1024


def _log2_floor(p: int) -> int:
    return int(p).bit_length() - 1


def _log2_ceil(p: int) -> int:
    return (int(p) - 1).bit_length()


def is_power_of_two(p: int) -> bool:
    return p >= 1 and (p & (p - 1)) == 0


def optimal_pipeline_chunks(stages: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                            max_chunks: int = MAX_PIPELINE_CHUNKS) -> int:
    """Integer C minimising ``(stages − 1 + C)(alpha + n·beta/C)``; continuous optimum
    ``C* = sqrt((stages − 1)·n·beta/alpha)``, clamped to ``[1, min(max_chunks, n)]``."""
    hi = max(1, min(int(max_chunks), int(n_bytes)))
    if stages <= 1:
        return 1
    if alpha_s <= 0:
        return hi
    c_star = math.sqrt((stages - 1) * n_bytes * beta_s_per_byte / alpha_s)
    cands = {min(hi, max(1, math.floor(c_star))), min(hi, max(1, math.ceil(c_star)))}

    def cost(c: int) -> float:
        return (stages - 1 + c) * (alpha_s + n_bytes * beta_s_per_byte / c)

    return min(sorted(cands), key=cost)


# ---- ring ------------------------------------------------------------------------------------------
def ring_allreduce_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                     gamma_s_per_byte: float = 0.0) -> float:
    """Ring allreduce: 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ (Thakur et al. 2005)."""
    f = (p - 1) / p
    return 2 * (p - 1) * alpha_s + 2 * f * n_bytes * beta_s_per_byte + f * n_bytes * gamma_s_per_byte


def ring_reduce_scatter_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                          gamma_s_per_byte: float = 0.0) -> float:
    """Ring reduce-scatter of an n-byte (full) buffer: (p−1)α + (p−1)/p·n(β + γ)."""
    f = (p - 1) / p
    return (p - 1) * alpha_s + f * n_bytes * (beta_s_per_byte + gamma_s_per_byte)


def ring_allgather_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Ring allgather of an n-byte (full) buffer: (p−1)α + (p−1)/p·nβ."""
    return (p - 1) * alpha_s + (p - 1) / p * n_bytes * beta_s_per_byte


def ring_broadcast_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                     chunks: int | None = None) -> float:
    """Pipelined chain broadcast over p−1 hops in C chunks: (p−2+C)(α + nβ/C); C optimal if None."""
    if p <= 1:
        return 0.0
    c = optimal_pipeline_chunks(p - 1, n_bytes, alpha_s, beta_s_per_byte) if chunks is None else chunks
    return (p - 2 + c) * (alpha_s + n_bytes * beta_s_per_byte / c)


def ring_reduce_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                  gamma_s_per_byte: float = 0.0, chunks: int | None = None) -> float:
    """Pipelined chain reduce: (p−2+C)(α + n(β+γ)/C); C optimal (for β+γ) if None."""
    if p <= 1:
        return 0.0
    b = beta_s_per_byte + gamma_s_per_byte
    c = optimal_pipeline_chunks(p - 1, n_bytes, alpha_s, b) if chunks is None else chunks
    return (p - 2 + c) * (alpha_s + n_bytes * b / c)


# ---- halving-doubling ------------------------------------------------------------------------------
def hd_allreduce_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                   gamma_s_per_byte: float = 0.0) -> float:
    """Rabenseifner's allreduce (Thakur et al. 2005). p = 2^k: 2·log2(p)·α + 2(p−1)/p·nβ + (p−1)/p·nγ.
    Otherwise (p' = 2^⌊log2 p⌋, the extra ranks fold into the core first and get the result back last):
    (2⌊log2 p⌋+2)α + (2(p'−1)/p' + 2)nβ + ((p'−1)/p' + 1)nγ."""
    k = _log2_floor(p)
    q = 1 << k
    f = (q - 1) / q
    t = 2 * k * alpha_s + 2 * f * n_bytes * beta_s_per_byte + f * n_bytes * gamma_s_per_byte
    if q != p:
        t += 2 * alpha_s + 2 * n_bytes * beta_s_per_byte + n_bytes * gamma_s_per_byte
    return t


def hd_reduce_scatter_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                        gamma_s_per_byte: float = 0.0) -> float:
    """Recursive halving reduce-scatter, p = 2^k: log2(p)·α + (p−1)/p·n(β + γ)."""
    return _log2_floor(p) * alpha_s + (p - 1) / p * n_bytes * (beta_s_per_byte + gamma_s_per_byte)


def hd_allgather_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Recursive doubling allgather, p = 2^k: log2(p)·α + (p−1)/p·nβ."""
    return _log2_floor(p) * alpha_s + (p - 1) / p * n_bytes * beta_s_per_byte


#: HDRM is halving-doubling whose rank mapping makes BiGraph non-blocking for it (EFLOPS, HPCA 2020)
hdrm_allreduce_s = hd_allreduce_s


# ---- trees -----------------------------------------------------------------------------------------
def tree_broadcast_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Binomial-tree broadcast: ⌈log2 p⌉(α + nβ)."""
    return _log2_ceil(p) * (alpha_s + n_bytes * beta_s_per_byte)


def tree_reduce_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                  gamma_s_per_byte: float = 0.0) -> float:
    """Binomial-tree reduce: ⌈log2 p⌉(α + nβ + nγ)."""
    return _log2_ceil(p) * (alpha_s + n_bytes * (beta_s_per_byte + gamma_s_per_byte))


def double_tree_depth(p: int) -> int:
    """Depth (edges root→deepest leaf) of each of the two in-order binary trees: ⌊log2 p⌋."""
    return _log2_floor(p) if p > 1 else 0


def double_tree_allreduce_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                            gamma_s_per_byte: float = 0.0, chunks: int | None = None) -> float:
    """Double binary tree allreduce (NCCL; Sanders, Speck & Träff 2009) as built by
    :mod:`~topotrain.collectives.tree`: each tree reduces then broadcasts half the data in C pipelined
    chunks over depth D = ⌊log2 p⌋, 2(C + D − 1) steps. Every rank is interior in at most one tree, so a
    rank's link carries at most k = 2 chunks of n/(2C) per step (k = 1 for p = 2, one edge each way):
    2(C + D − 1)(α + k·nβ/(2C)) + (C + D − 1)·k·nγ/(2C). For p = 2^k ≥ 4 the roots have a single child,
    so the last reduce step and the first broadcast step move one chunk per link: nβ/C + nγ/(2C) less.
    """
    if p <= 1:
        return 0.0
    d = double_tree_depth(p)
    c = default_tree_chunks(p, n_bytes, alpha_s, beta_s_per_byte) if chunks is None else chunks
    steps = c + d - 1
    chunk = n_bytes / (2 * c)
    per_link = (1 if p == 2 else 2) * chunk
    t = 2 * steps * (alpha_s + per_link * beta_s_per_byte) + steps * per_link * gamma_s_per_byte
    if p >= 4 and is_power_of_two(p):
        t -= 2 * chunk * beta_s_per_byte + chunk * gamma_s_per_byte
    return t


def default_tree_chunks(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> int:
    """Chunks minimising :func:`double_tree_allreduce_s` (the pipeline has D = ⌊log2 p⌋ stages)."""
    return optimal_pipeline_chunks(double_tree_depth(p), n_bytes, alpha_s, beta_s_per_byte)


# ---- two-level -------------------------------------------------------------------------------------
def torus2d_allreduce_s(x: int, y: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float,
                        gamma_s_per_byte: float = 0.0) -> float:
    """2D-torus allreduce on X×Y (Mikami et al. 2018): reduce-scatter along X, allreduce along Y on the
    n/X shards, allgather along X: 2(X−1)α + 2(X−1)/X·nβ + 2(Y−1)α + 2(Y−1)/(XY)·nβ (+ γ terms)."""
    t = ring_allreduce_s(x, n_bytes, alpha_s, beta_s_per_byte, 0.0) if x > 1 else 0.0
    t += (x - 1) / x * n_bytes * gamma_s_per_byte
    if y > 1:
        t += ring_allreduce_s(y, n_bytes / x, alpha_s, beta_s_per_byte, gamma_s_per_byte)
    return t


def hierarchical_allreduce_s(g: int, m: int, n_bytes: float, alpha_in_s: float, beta_in_s_per_byte: float,
                             alpha_net_s: float, beta_net_s_per_byte: float, gamma_s_per_byte: float = 0.0,
                             inter: str = "ring") -> float:
    """Hierarchical allreduce, g GPUs per server, m servers: intra-server ring reduce-scatter and
    allgather, g parallel inter-server allreduces of n/g (ring or halving-doubling):
    2(g−1)α_in + 2(g−1)/g·nβ_in + 2(m−1)α_net + 2(m−1)/m·(n/g)·β_net for ``inter="ring"``."""
    t = 2 * (g - 1) * alpha_in_s + 2 * (g - 1) / g * n_bytes * beta_in_s_per_byte
    t += (g - 1) / g * n_bytes * gamma_s_per_byte
    if m > 1:
        shard = n_bytes / g
        if inter == "ring":
            t += ring_allreduce_s(m, shard, alpha_net_s, beta_net_s_per_byte, gamma_s_per_byte)
        elif inter in ("halving-doubling", "hd"):
            t += hd_allreduce_s(m, shard, alpha_net_s, beta_net_s_per_byte, gamma_s_per_byte)
        else:
            raise ConfigError("inter", f"unknown inter-server algorithm {inter!r}",
                              "use ring or halving-doubling")
    return t


def hierarchical_scatter_s(g: int, m: int, n_bytes: float, alpha_in_s: float, beta_in_s_per_byte: float,
                           alpha_net_s: float, beta_net_s_per_byte: float) -> float:
    """Hierarchical reduce-scatter or allgather of an ``n``-byte buffer, g GPUs per server, m servers:
    an intra-server ring over n and g parallel inter-server rings over n/g:
    (g−1)α_in + (g−1)/g·nβ_in + (m−1)α_net + (m−1)/m·(n/g)·β_net."""
    t = (g - 1) * alpha_in_s + (g - 1) / g * n_bytes * beta_in_s_per_byte if g > 1 else 0.0
    if m > 1:
        t += (m - 1) * alpha_net_s + (m - 1) / m * n_bytes / g * beta_net_s_per_byte
    return t


# ---- all-to-all ------------------------------------------------------------------------------------
def alltoall_direct_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """All p−1 messages of n/p at once, limited by each rank's own link: α + (p−1)/p·nβ."""
    return alpha_s + (p - 1) / p * n_bytes * beta_s_per_byte if p > 1 else 0.0


def alltoall_pairwise_s(p: int, n_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Pairwise exchange (Thakur et al. 2005): (p−1)(α + nβ/p)."""
    return (p - 1) * (alpha_s + n_bytes / p * beta_s_per_byte)


# ---- bytes on the wire and NCCL bus bandwidth ------------------------------------------------------
def _op(op: CollectiveOp | str) -> CollectiveOp:
    return parse_op(op, "op")


def wire_bytes(op: CollectiveOp | str, algorithm: str, p: int, n_bytes: int | float,
               **shape: int | str) -> int | float:
    """Total bytes all transfers of ``algorithm`` put on the wire (sum over transfers, not per link).

    ring/torus2d/hierarchical allreduce 2(p−1)n; reduce-scatter, allgather, broadcast, reduce and
    all-to-all (p−1)n; halving-doubling allreduce 2(p'−1)n + 2(p−p')n (p' = 2^⌊log2 p⌋); double tree
    2(p−1)n. ``shape`` (hierarchical only): ``g``, ``m`` and ``inter``; with ``inter="halving-doubling"``
    and m not a power of two, the fold adds 2(m−m')·n/g per local index (m' = 2^⌊log2 m⌋).
    """
    o = _op(op)
    alg = "halving-doubling" if algorithm == "hd" else algorithm
    if p <= 1:
        return 0
    n = n_bytes
    if o is CollectiveOp.ALLREDUCE:
        if alg in ("halving-doubling", "hdrm"):
            q = 1 << _log2_floor(p)
            return 2 * (q - 1) * n + 2 * (p - q) * n
        if alg == "hierarchical" and shape.get("inter") in ("halving-doubling", "hd"):
            g, m = int(shape["g"]), int(shape["m"])
            mq = 1 << _log2_floor(m)
            return 2 * m * (g - 1) * n + 2 * (mq - 1) * n + 2 * (m - mq) * n
        if alg in ("ring", "tree", "torus2d", "hierarchical"):
            return 2 * (p - 1) * n
    elif o in (CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALLGATHER, CollectiveOp.BROADCAST,
               CollectiveOp.REDUCE, CollectiveOp.ALLTOALL):
        return (p - 1) * n
    raise ConfigError("algorithm", f"no wire-bytes formula for {algorithm!r} {o.value}",
                      "see topotrain.collectives.registry.ALGORITHMS")


def bus_factor(op: CollectiveOp | str, p: int) -> float:
    """nccl-tests busbw = algbw × factor: allreduce 2(p−1)/p; reduce-scatter, allgather, all-to-all
    (p−1)/p; broadcast, reduce 1."""
    o = _op(op)
    if o is CollectiveOp.ALLREDUCE:
        return 2 * (p - 1) / p
    if o in (CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALLGATHER, CollectiveOp.ALLTOALL):
        return (p - 1) / p
    return 1.0
