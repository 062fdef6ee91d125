"""Tree collectives: NCCL-style double binary tree allreduce; binomial-tree broadcast and reduce.

Double binary tree (Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast, reduction
and scan", Parallel Computing 2009; used by NCCL since 2.4): tree A is the in-order binary tree on labels
1..p (label x with t trailing zero bits sits at height t; its parent is the one of x ± 2^t with exactly
t+1 trailing zeros, skipping ancestors beyond p; the root is 2^⌊log2 p⌋), rank r having label r+1, so
odd labels — even ranks — are the leaves. Tree B is the same tree shifted by one rank (rank r plays
position (r−1) mod p), so each rank is interior in at most one tree (for odd p rank 0 is a leaf in both).
Tree A reduces then broadcasts the first half of the buffer, tree B the second, each in ``chunks``
pipelined chunks: a node at depth d sends chunk c up in step c + D − d (D = ⌊log2 p⌋) and, in the
broadcast stage, receives it in step c + d − 1. 2(C + D − 1) steps; each rank's link carries at most two
chunks per step, so the time is at most 2(C + D − 1)(α + nβ/C)
(:func:`~topotrain.collectives.costmodel.double_tree_allreduce_s`). Unlike NCCL, which overlaps the
reduce and the broadcast of different chunks, the two stages here are separated by a barrier.

Binomial tree (Thakur et al., IJHPCA 2005): with v = (rank − root) mod p, broadcast step s has every
v < 2^s send the whole buffer to v + 2^s; reduce is the mirror image (v ≡ 2^s mod 2^(s+1) sends to
v − 2^s). ⌈log2 p⌉ steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives import costmodel
from topotrain.collectives.ring import estimate_alpha_beta, overhead_option, positive_int_option, root_option
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


def inorder_tree(p: int) -> tuple[np.ndarray, np.ndarray]:
    """(parent, depth) of positions 0..p−1 of the in-order binary tree (position i has label i+1);
    the root has parent −1 and depth 0."""
    labels = np.arange(1, p + 1, dtype=np.int64)
    root = 1 << (p.bit_length() - 1)

    def perfect_parent(x: np.ndarray) -> np.ndarray:
        low = x & -x
        up = x + low
        return np.where((up & (2 * low)) != 0, up, x - low)

    parent = np.where(labels == root, 0, perfect_parent(labels))
    while True:
        over = parent > p
        if not over.any():
            break
        parent[over] = perfect_parent(parent[over])
    parent_pos = parent - 1  # root -> -1
    depth = np.zeros(p, dtype=np.int64)
    cur = parent_pos.copy()
    while (cur >= 0).any():
        live = cur >= 0
        depth[live] += 1
        cur[live] = parent_pos[cur[live]]
    return parent_pos, depth


def double_trees(p: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(parent rank, depth) per rank] of tree A and tree B (B = A shifted by one rank)."""
    parent_a, depth_a = inorder_tree(p)
    r = np.arange(p, dtype=np.int64)
    pos_b = (r - 1) % p  # rank r plays position pos_b[r] of tree B; position q is played by rank (q+1)%p
    par_pos = parent_a[pos_b]
    parent_b = np.where(par_pos >= 0, (par_pos + 1) % p, -1)
    return [(parent_a, depth_a), (parent_b, depth_a[pos_b])]


def _double_tree_allreduce(p: int, chunks: int) -> list[Phase]:
    d_max = costmodel.double_tree_depth(p)
    trees = []
    for k, (parent, depth) in enumerate(double_trees(p)):
        child = np.flatnonzero(parent >= 0)
        order = child[np.argsort(depth[child], kind="stable")]  # non-root ranks by depth
        trees.append((k, order, parent[order], depth[order]))
    phases: list[Phase] = []
    for stage in ("reduce", "broadcast"):
        up = stage == "reduce"
        for t in range(chunks + d_max - 1):
            srcs, dsts, los = [], [], []
            for k, order, par, dep in trees:
                # reduce: c = t − (D − depth); broadcast: c = t − (depth − 1); live iff 0 <= c < chunks
                lo_d, hi_d = (d_max - t, d_max - t + chunks - 1) if up else (t + 2 - chunks, t + 1)
                a, b = np.searchsorted(dep, lo_d, "left"), np.searchsorted(dep, hi_d, "right")
                d = dep[a:b]
                c = t - (d_max - d) if up else t - (d - 1)
                srcs.append(order[a:b] if up else par[a:b])
                dsts.append(par[a:b] if up else order[a:b])
                los.append(c + k * chunks)
            lo = np.concatenate(los)
            phases.append(Phase.of(np.concatenate(srcs), np.concatenate(dsts), lo, lo + 1, up))
    return phases


def _binomial(op: CollectiveOp, p: int, root: int) -> list[Phase]:
    v = np.arange(p, dtype=np.int64)
    phases = []
    steps = (p - 1).bit_length()
    for s in range(steps):
        d = 1 << s
        if op is CollectiveOp.BROADCAST:
            sv = v[(v < d) & (v + d < p)]
            a, b = sv, sv + d
        else:
            sv = v[(v % (2 * d)) == d]
            a, b = sv, sv - d
        phases.append(Phase.of((a + root) % p, (b + root) % p, np.zeros_like(a), np.ones_like(a),
                               op is CollectiveOp.REDUCE))
    return phases


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
          **options: Any) -> Schedule:
    """Double binary tree allreduce (option ``chunks`` per tree, default the optimum of
    :func:`~topotrain.collectives.costmodel.double_tree_allreduce_s` for α, β estimated from ``topo``);
    binomial broadcast and reduce (option ``root``, an index into ranks, default 0)."""
    p = len(ranks)
    if op is CollectiveOp.ALLREDUCE:
        if "chunks" in options:
            chunks = positive_int_option(options, "chunks", "tree", 1)
        else:
            alpha, beta = estimate_alpha_beta(topo, ranks, overhead_option(options))
            chunks = costmodel.default_tree_chunks(p, size_bytes, alpha, beta)
        phases = _double_tree_allreduce(p, chunks) if p > 1 else []
        n_chunks = 2 * chunks
        chunk_src = np.full(n_chunks, -1, dtype=np.int64)
        chunk_dst = np.full(n_chunks, -1, dtype=np.int64)
        meta: dict[str, object] = {"chunks": chunks, "depth": costmodel.double_tree_depth(p)}
        chunk_bytes = split_bytes(size_bytes, n_chunks)
    elif op in (CollectiveOp.BROADCAST, CollectiveOp.REDUCE):
        root = root_option(options, p, "tree")
        phases = _binomial(op, p, root) if p > 1 else []
        chunk_bytes = split_bytes(size_bytes, 1)
        bcast = op is CollectiveOp.BROADCAST
        chunk_src = np.array([root if bcast else -1], dtype=np.int64)
        chunk_dst = np.array([-1 if bcast else root], dtype=np.int64)
        meta = {"root": root}
    else:
        raise ConfigError("collective.algorithm", f"algorithm 'tree' does not do {op.value}",
                          "use ring or halving-doubling")
    return Schedule(op, "tree", tuple(ranks), int(size_bytes), chunk_bytes, chunk_src, chunk_dst,
                    tuple(phases), meta)
