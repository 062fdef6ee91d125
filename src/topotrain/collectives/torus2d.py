"""2D-torus allreduce (Mikami et al., "Massively distributed SGD: ImageNet/ResNet-50 training in a flash",
arXiv 1811.05233): the ranks form an X×Y grid; ring reduce-scatter along X (horizontal), ring allreduce
along Y (vertical) on the n/X shards, ring allgather along X.
2(X−1)α + 2(X−1)/X·nβ + 2(Y−1)α + 2(Y−1)/(XY)·nβ
(:func:`~topotrain.collectives.costmodel.torus2d_allreduce_s`).

Grid: by default X = GPUs per server and Y = servers (row y = the ranks of the y-th server, as in
:func:`~topotrain.collectives.hierarchical.server_grid`); with option ``dims=(X, Y)``, X·Y = p, rank
index ``y·X + x`` sits at column x of row y.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives.hierarchical import grid_schedule, server_grid
from topotrain.collectives.schedule import CollectiveOp, Schedule
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
          **options: Any) -> Schedule:
    """2D-torus allreduce; option ``dims=(X, Y)`` (default: GPUs per server × servers)."""
    if op is not CollectiveOp.ALLREDUCE:
        raise ConfigError("collective.algorithm", f"algorithm 'torus2d' does not do {op.value}", "use ring")
    p = len(ranks)
    dims = options.get("dims")
    if dims is None:
        grid, _ = server_grid(topo, ranks, "torus2d")
    else:
        ok = (isinstance(dims, Sequence) and len(dims) == 2
              and all(isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 1 for d in dims))
        if not ok or int(dims[0]) * int(dims[1]) != p:
            raise ConfigError("collective.options.dims", f"torus2d dims must be two positive integers (X, Y) "
                              f"with X·Y = {p} ranks, got {dims!r}", f"give e.g. dims=(8, {max(1, p // 8)})")
        grid = np.arange(p, dtype=np.int64).reshape(int(dims[1]), int(dims[0]))
    x_len, y_len = int(grid.shape[1]), int(grid.shape[0])
    return grid_schedule("torus2d", ranks, size_bytes, grid, "ring", {"dims": (x_len, y_len)})
