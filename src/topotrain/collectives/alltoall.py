"""All-to-all: ``direct`` (every message at once) and ``pairwise`` exchange (Thakur et al., IJHPCA 2005).

Chunk space: p·p chunks; chunk i·p + j is the block rank i sends to rank j (``split_bytes(size, p)[j]``
bytes, so every rank's send buffer sums to ``size_bytes``), ``chunk_src = i``, ``chunk_dst = j``. The
diagonal chunks i·p + i stay put.

* direct: one phase of all p(p−1) transfers; α + (p−1)/p·nβ on a non-blocking network.
* pairwise: p−1 phases; in phase k (1..p−1) rank r sends to r XOR k when p is a power of two, else to
  (r + k) mod p (and receives from (r − k) mod p). (p−1)(α + nβ/p).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives.costmodel import is_power_of_two
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


def _chunks(p: int, size_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    idx = np.arange(p * p, dtype=np.int64)
    return np.tile(split_bytes(size_bytes, p), p), idx // p, idx % p


def _schedule(algorithm: str, ranks: Sequence[str], size_bytes: int, phases: list[Phase]) -> Schedule:
    chunk_bytes, chunk_src, chunk_dst = _chunks(len(ranks), size_bytes)
    return Schedule(CollectiveOp.ALLTOALL, algorithm, tuple(ranks), int(size_bytes), chunk_bytes, chunk_src,
                    chunk_dst, tuple(phases), {})


def _check(op: CollectiveOp, algorithm: str) -> None:
    if op is not CollectiveOp.ALLTOALL:
        raise ConfigError("collective.algorithm", f"algorithm {algorithm!r} does not do {op.value}; "
                          "it does all-to-all", "use ring, halving-doubling or tree")


def build_direct(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
                 **options: Any) -> Schedule:
    """All p(p−1) messages in one phase."""
    _check(op, "direct")
    p = len(ranks)
    phases = []
    if p > 1:
        i, j = np.divmod(np.arange(p * p, dtype=np.int64), p)
        off = i != j
        i, j = i[off], j[off]
        c = i * p + j
        phases.append(Phase.of(i, j, c, c + 1, False))
    return _schedule("direct", ranks, size_bytes, phases)


def build_pairwise(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
                   **options: Any) -> Schedule:
    """p−1 phases of one message per rank (XOR partners for p = 2^k, else shifts)."""
    _check(op, "pairwise")
    p = len(ranks)
    r = np.arange(p, dtype=np.int64)
    xor = is_power_of_two(p)
    phases = []
    for k in range(1, p):
        dst = r ^ k if xor else (r + k) % p
        c = r * p + dst
        phases.append(Phase.of(r, dst, c, c + 1, False))
    return _schedule("pairwise", ranks, size_bytes, phases)
