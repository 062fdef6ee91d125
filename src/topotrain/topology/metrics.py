"""Summary figures of a topology (counts, diameter, bisection bandwidth); :func:`topotrain.report.draw.
draw_topology` draws it.

* Diameter: the largest number of links on a *routed* path (:meth:`Topology.route`) between two GPUs.
  Routes are shortest in hops, so a pair is measured in one direction only.
* Bisection bandwidth: the maximum flow, in one direction, from the first half of the GPUs in rank order
  (:attr:`Topology.gpus`) to the second half — equal, by max-flow/min-cut (Ford & Fulkerson 1956), to the
  minimum cut separating the two halves. It is the *rank-order* bisection: the true bisection
  bandwidth is the minimum over all balanced splits, so this is an upper bound of it (and equal to it
  for networks symmetric under the rank order, such as the builders' on full servers). Flow may split
  over any path, not only the routed ones, and may cross other servers' internal fabrics; it never
  passes through a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology

#: Diameter is exact up to this many GPUs; above, it is the maximum over a seeded sample of pairs.
EXACT_DIAMETER_MAX_GPUS = 256
#: Number of GPU pairs sampled above EXACT_DIAMETER_MAX_GPUS (about as many as the exact case's worst).
DIAMETER_SAMPLE_PAIRS = 32_768
#: Bisection max flow runs on integer capacities in units of 1/this byte/s (exact, order-independent sums).
BISECTION_QUANTA_PER_BYTE = 1024


@dataclass(frozen=True)
class TopologySummary:
    """Counts and figures of merit of one topology (see the module docstring for definitions).

    ``diameter_exact`` is False when ``diameter_hops`` is the maximum over a deterministic sample of
    ``diameter_pairs`` GPU pairs (more than EXACT_DIAMETER_MAX_GPUS GPUs), a lower bound of the diameter.
    ``total_link_capacity_bytes_per_s`` sums both directions of every link.
    """

    name: str
    network: str | None
    num_nodes: int
    nodes_by_kind: Mapping[str, int]
    num_physical_links: int
    num_gpus: int
    diameter_hops: int
    diameter_exact: bool
    diameter_pairs: int
    bisection_bandwidth_bytes_per_s: float
    total_link_capacity_bytes_per_s: float

    @property
    def num_switches(self) -> int:
        return int(self.nodes_by_kind.get(NodeKind.SWITCH.value, 0))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes_by_kind"] = dict(self.nodes_by_kind)
        return d


def summarize(topo: Topology, *, exact_max_gpus: int = EXACT_DIAMETER_MAX_GPUS,
              sample_pairs: int = DIAMETER_SAMPLE_PAIRS, seed: int = 0) -> TopologySummary:
    """Summary of ``topo``. Above ``exact_max_gpus`` GPUs the diameter is sampled (numpy generator
    seeded with ``seed``, so the same topology always gives the same figure)."""
    by_kind = {k.value: 0 for k in NodeKind}
    for nd in topo.nodes.values():
        by_kind[nd.kind.value] += 1
    diameter, exact, pairs = _diameter(topo, exact_max_gpus, sample_pairs, seed)
    net = topo.meta.get("network")
    return TopologySummary(
        name=topo.name,
        network=str(net) if net is not None else None,
        num_nodes=len(topo.nodes),
        nodes_by_kind={k: v for k, v in by_kind.items() if v},
        num_physical_links=topo.num_links // 2,
        num_gpus=len(topo.gpus),
        diameter_hops=diameter,
        diameter_exact=exact,
        diameter_pairs=pairs,
        bisection_bandwidth_bytes_per_s=bisection_bandwidth_bytes_per_s(topo),
        total_link_capacity_bytes_per_s=float(np.sum(topo.capacity_bytes_per_s)) if topo.num_links else 0.0,
    )


def _diameter(topo: Topology, exact_max_gpus: int, sample_pairs: int, seed: int) -> tuple[int, bool, int]:
    gpus = topo.gpus
    n = len(gpus)
    if n < 2:
        return 0, True, 0
    if n <= exact_max_gpus:
        pairs: list[tuple[int, int]] = [(i, j) for i in range(n) for j in range(i + 1, n)]
        exact = True
    else:
        rng = np.random.default_rng(seed)
        a = rng.integers(0, n, size=sample_pairs)
        b = rng.integers(0, n - 1, size=sample_pairs)
        b = b + (b >= a)
        pairs = sorted({(int(min(x, y)), int(max(x, y))) for x, y in zip(a, b, strict=True)})
        exact = False
    best = 0
    for i, j in pairs:
        best = max(best, len(topo.route(gpus[i], gpus[j])))
    return best, exact, len(pairs)


def bisection_bandwidth_bytes_per_s(topo: Topology) -> float:
    """Max flow (bytes/s) from the first half of the GPUs (rank order) to the second half.

    Every directed link is an arc of its capacity; a super source feeds the first half and the second
    half drains into a super sink, both without limit. Arcs into first-half GPUs and out of second-half
    GPUs are left out, so no flow passes through a GPU. 0 with fewer than two GPUs.

    The flow is computed in exact integer arithmetic on capacities quantized to 1/BISECTION_QUANTA_PER_BYTE
    byte/s: a float max flow sums partial flows in an order that follows set iteration (string hashes), so
    its last digits changed with PYTHONHASHSEED; integers sum the same in any order.
    """
    gpus = topo.gpus
    if len(gpus) < 2:
        return 0.0
    half = len(gpus) // 2
    first, second = set(gpus[:half]), set(gpus[half:])
    import networkx as nx  # its max flow, for this summary only (topotrain collective imports this module)

    g = nx.DiGraph()
    src, dst = ("__bisection_source__", 0), ("__bisection_sink__", 0)
    g.add_nodes_from(topo.nodes)
    for lk in topo.links:
        if lk.dst in first or lk.src in second:
            continue
        g.add_edge(lk.src, lk.dst, capacity=round(lk.bandwidth_bytes_per_s * BISECTION_QUANTA_PER_BYTE))
    for x in gpus[:half]:
        g.add_edge(src, x)
    for y in gpus[half:]:
        g.add_edge(y, dst)
    return int(nx.maximum_flow_value(g, src, dst, capacity="capacity")) / BISECTION_QUANTA_PER_BYTE
