"""Hierarchical (two-level) allreduce: intra-server ring reduce-scatter, g parallel inter-server
allreduces on 1/g shards, intra-server ring allgather.

The scheme of Horovod's hierarchical allreduce and of NCCL's rings across NIC-per-GPU servers (one
inter-server allreduce per local GPU index, "rail"); cost 2(g−1)α_in + 2(g−1)/g·nβ_in + 2(m−1)α_net +
2(m−1)/m·(n/g)·β_net with ring between servers
(:func:`~topotrain.collectives.costmodel.hierarchical_allreduce_s`). The same three stages on an X×Y
grid are the 2D-torus allreduce of Mikami et al. 2018 (:mod:`~topotrain.collectives.torus2d`), so both use
:func:`two_level_allreduce`.

Reduce-scatter and allgather (the ZeRO/FSDP collectives) take the same two levels without the middle
allreduce: reduce-scatter = intra-server ring reduce-scatter, then X parallel inter-server ring
reduce-scatters (one per local index, "rail"); allgather = the reverse. Only ``(Y−1)/(X·Y)·n`` per GPU
crosses the network instead of the flat ring's ``(p−1)/p·n`` on one NIC per server, NCCL's behaviour
with one NIC per GPU. Chunk ``r`` belongs to rank ``r`` (the torch layout), so the intra-server step
moves, per ring step, one chunk per server (``Y`` transfers per GPU pair):
:func:`two_level_scatter_gather`.

Chunk layout of the allreduce: X·q chunks, q = Y for a ring between servers (q = 2^⌊log2 Y⌋ for halving-doubling);
local index x owns the shard of chunks x·q .. (x+1)·q, and the inter-server step splits that shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives.halving_doubling import core_size, hd_allreduce_phases
from topotrain.collectives.ring import ring_phases
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

INTER_ALGORITHMS = ("ring", "halving-doubling")


def server_grid(topo: Topology, ranks: Sequence[str], algorithm: str) -> tuple[np.ndarray, list[str]]:
    """(grid, servers): ``grid[y, x]`` = index in ``ranks`` of the x-th rank (in rank order) of the y-th
    server (servers in order of first appearance). ConfigError unless every server has as many ranks."""
    by_server: dict[str, list[int]] = {}
    for i, name in enumerate(ranks):
        srv = topo.nodes[name].server
        if srv is None:
            raise ConfigError("collective.ranks", f"{algorithm} groups ranks by server, but GPU {name!r} is "
                              "in no server", "give every GPU a server, or use ring or halving-doubling")
        by_server.setdefault(srv, []).append(i)
    counts = {s: len(v) for s, v in by_server.items()}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{s}: {c}" for s, c in list(counts.items())[:4])
        raise ConfigError("collective.ranks", f"{algorithm} needs as many ranks in every server, got {shown}",
                          "use the same number of GPUs from each server, or use ring")
    servers = list(by_server)
    return np.array([by_server[s] for s in servers], dtype=np.int64), servers


def inter_option(options: dict[str, Any]) -> str:
    inter = options.get("inter", "ring")
    if inter == "hd":
        inter = "halving-doubling"
    if inter not in INTER_ALGORITHMS:
        raise ConfigError("collective.options.inter", f"unknown inter-server algorithm {inter!r}",
                          f"use one of {', '.join(INTER_ALGORITHMS)}")
    return str(inter)


def two_level_allreduce(grid: np.ndarray, inter: str = "ring") -> tuple[int, list[Phase]]:
    """(number of chunks, phases) of the three-stage allreduce on ``grid`` (Y rows × X columns of rank
    indices): ring reduce-scatter along each row, allreduce of column x on shard x (``inter``: ring or
    halving-doubling), ring allgather along each row."""
    y_len, x_len = grid.shape
    q = y_len if inter == "ring" else core_size(y_len)
    x = np.arange(x_len, dtype=np.int64)
    seg_lo, seg_hi = x * q, (x + 1) * q
    phases = ring_phases(grid, seg_lo, seg_hi, reduce=True)
    cols = grid.T  # column x: the ranks holding shard x after the row reduce-scatter
    if y_len > 1:
        if inter == "ring":
            lo = x[:, None] * q + np.arange(y_len, dtype=np.int64)[None, :]
            phases += ring_phases(cols, lo, lo + 1, reduce=True)
            phases += ring_phases(cols, lo, lo + 1, reduce=False)
        else:
            phases += hd_allreduce_phases(cols, x * q)
    phases += ring_phases(grid, seg_lo, seg_hi, reduce=False)
    return x_len * q, phases


def two_level_scatter_gather(grid: np.ndarray, op: CollectiveOp) -> list[Phase]:
    """Phases of the two-level reduce-scatter (or allgather) on ``grid`` (Y servers × X local ranks); chunk
    ``grid[y, x]`` ends at (starts from) rank ``grid[y, x]``. Reduce-scatter: ring along each server row in
    which local position ``j``'s segment is the chunks ``grid[:, j]`` (one piece per server), then ring
    along each column ``x`` over the chunks ``grid[:, x]``. Allgather runs the two stages backwards."""
    y_len, x_len = grid.shape
    reduce = op is CollectiveOp.REDUCE_SCATTER

    def row_stage() -> list[Phase]:
        per_piece = [ring_phases(grid, np.broadcast_to(grid[yp], grid.shape), np.broadcast_to(grid[yp] + 1,
                                 grid.shape), reduce=reduce) for yp in range(y_len)]
        merged = []
        for k in range(len(per_piece[0])):
            parts = [pp[k] for pp in per_piece]
            merged.append(Phase(*(np.concatenate([getattr(ph, f) for ph in parts])
                                  for f in ("src", "dst", "chunk_lo", "chunk_hi", "reduce"))))
        return merged

    cols = grid.T  # column x, positions = servers; position y's segment is chunk grid[y, x]
    col_stage = ring_phases(cols, cols, cols + 1, reduce=reduce) if y_len > 1 else []
    return row_stage() + col_stage if reduce else col_stage + row_stage()


def grid_schedule(algorithm: str, ranks: Sequence[str], size_bytes: int, grid: np.ndarray, inter: str,
                  meta: dict[str, object]) -> Schedule:
    n_chunks, phases = two_level_allreduce(grid, inter)
    every = np.full(n_chunks, -1, dtype=np.int64)
    return Schedule(CollectiveOp.ALLREDUCE, algorithm, tuple(ranks), int(size_bytes),
                    split_bytes(size_bytes, n_chunks), every, every.copy(), tuple(phases), meta)


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
          **options: Any) -> Schedule:
    """Hierarchical allreduce over the servers of ``ranks`` (``topo.nodes[r].server``; equal counts per
    server). Option ``inter``: ``"ring"`` (default) or ``"halving-doubling"`` between servers."""
    if op not in (CollectiveOp.ALLREDUCE, CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALLGATHER):
        raise ConfigError("collective.algorithm", f"algorithm 'hierarchical' does not do {op.value}",
                          "use ring")
    inter = inter_option(options)
    grid, servers = server_grid(topo, ranks, "hierarchical")
    meta: dict[str, object] = {"gpus_per_server": int(grid.shape[1]), "servers": len(servers), "inter": inter}
    if op is CollectiveOp.ALLREDUCE:
        return grid_schedule("hierarchical", ranks, size_bytes, grid, inter, meta)
    if inter != "ring":
        raise ConfigError("collective.options.inter", f"hierarchical {op.value} runs rings between servers",
                          "leave inter unset (ring)")
    p = len(ranks)
    idx = np.arange(p, dtype=np.int64)
    none = np.full(p, -1, dtype=np.int64)
    src, dst = (none, idx) if op is CollectiveOp.REDUCE_SCATTER else (idx, none.copy())
    return Schedule(op, "hierarchical", tuple(ranks), int(size_bytes), split_bytes(size_bytes, p), src, dst,
                    tuple(two_level_scatter_gather(grid, op)), meta)
