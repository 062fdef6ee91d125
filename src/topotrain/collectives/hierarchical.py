"""Hierarchical (two-level) allreduce: intra-server ring reduce-scatter, g parallel inter-server
allreduces on 1/g shards, intra-server ring allgather.

The scheme of Horovod's hierarchical allreduce and of NCCL's rings across NIC-per-GPU servers (one
inter-server allreduce per local GPU index, "rail"); cost 2(g−1)α_in + 2(g−1)/g·nβ_in + 2(m−1)α_net +
2(m−1)/m·(n/g)·β_net with ring between servers
(:func:`~topotrain.collectives.costmodel.hierarchical_allreduce_s`). The same three stages on an X×Y
grid are the 2D-torus allreduce of Mikami et al. 2018 (:mod:`~topotrain.collectives.torus2d`), so both use
:func:`two_level_allreduce`.

Chunk layout: X·q chunks, q = Y for a ring between servers (q = 2^⌊log2 Y⌋ for halving-doubling);
local index x owns the shard of chunks x·q .. (x+1)·q, and the inter-server step splits that shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives.halving_doubling import core_size, hd_allreduce_phases
from topotrain.collectives.ring import ring_phases
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.errors import ConfigError
from topotrain.topology.graph import Topology

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
    if op is not CollectiveOp.ALLREDUCE:
        raise ConfigError("collective.algorithm", f"algorithm 'hierarchical' does not do {op.value}",
                          "use ring")
    inter = inter_option(options)
    grid, servers = server_grid(topo, ranks, "hierarchical")
    meta: dict[str, object] = {"gpus_per_server": int(grid.shape[1]), "servers": len(servers), "inter": inter}
    return grid_schedule("hierarchical", ranks, size_bytes, grid, inter, meta)
