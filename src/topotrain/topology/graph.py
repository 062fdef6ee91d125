"""The cluster as a graph: GPUs, PCIe switches, CPU sockets, NICs, NVSwitches and network switches.

Every physical link is full duplex: :meth:`Topology.add_link` creates one *directed* link each way, each
with its own capacity (bytes/s) and latency (s). Directed links are numbered ``0..num_links-1`` so that
network models can keep per-link state in numpy arrays (``capacity_bytes_per_s``, ``latency_s``).

Ranks of a collective are GPU nodes; :attr:`Topology.gpus` lists them in insertion order, which is the
default rank order. Routing lives in :mod:`topotrain.topology.routing`; the Topology caches its routes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import networkx as nx
import numpy as np

from topotrain.errors import ConfigError


class NodeKind(StrEnum):
    GPU = "gpu"
    PCIE = "pcie"
    CPU = "cpu"
    NIC = "nic"
    NVSWITCH = "nvswitch"
    SWITCH = "switch"


#: Kinds that forward traffic between their neighbours unless a node says otherwise.
_TRANSIT_BY_DEFAULT = {NodeKind.PCIE, NodeKind.CPU, NodeKind.NVSWITCH, NodeKind.SWITCH}


@dataclass(frozen=True)
class Node:
    """A vertex. ``server`` names the server a node sits in (None for the network between servers).

    ``transit``: whether traffic between *other* nodes may pass through it (GPUs never do; a NIC does
    only where the topology says so, e.g. a switchless torus whose hosts forward).
    """

    name: str
    kind: NodeKind
    server: str | None = None
    transit: bool = False
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Link:
    """One direction of a physical link."""

    id: int
    src: str
    dst: str
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str = ""


class Topology:
    """A mutable graph while it is built, read by everything else.

    Build with :meth:`add_node` / :meth:`add_link`; query with :attr:`gpus`, :meth:`route`,
    :attr:`capacity_bytes_per_s`, :attr:`latency_s`. ``message_overhead_s`` is the fixed software cost of
    one point-to-point message (the alpha of the alpha-beta model not explained by link latency).
    """

    def __init__(self, name: str = "topology", message_overhead_s: float = 2e-6) -> None:
        self.name = name
        self.message_overhead_s = message_overhead_s
        self.graph: nx.Graph = nx.Graph()
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        self._link_id: dict[tuple[str, str], int] = {}
        self._gpus: list[str] = []
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._router: Any = None
        self.meta: dict[str, Any] = {}
        self.failed_links: set[int] = set()

    # ---- building -------------------------------------------------------------------------------
    def add_node(self, name: str, kind: NodeKind | str, server: str | None = None,
                 transit: bool | None = None, **attrs: Any) -> str:
        if name in self.nodes:
            raise ConfigError("nodes", f"node {name!r} is defined twice", "give every node a unique name")
        try:
            k = NodeKind(kind)
        except ValueError:
            raise ConfigError("nodes", f"node {name!r} has unknown kind {kind!r}",
                              f"use one of {', '.join(k.value for k in NodeKind)}") from None
        if transit is None:
            transit = k in _TRANSIT_BY_DEFAULT
        if k is NodeKind.GPU:
            transit = False
            self._gpus.append(name)
        self.nodes[name] = Node(name, k, server, transit, dict(attrs))
        self.graph.add_node(name)
        self._invalidate()
        return name

    def add_link(self, a: str, b: str, bandwidth_bytes_per_s: float, latency_s: float = 0.0,
                 kind: str = "", bandwidth_b_to_a: float | None = None) -> tuple[int, int]:
        """Add a full-duplex link: directed ``a→b`` and ``b→a``. Returns the two directed link ids."""
        for n in (a, b):
            if n not in self.nodes:
                raise ConfigError("links", f"link {a}–{b} names unknown node {n!r}", "declare the node first")
        if a == b:
            raise ConfigError("links", f"link {a}–{b} joins a node to itself", "remove the self-loop")
        if (a, b) in self._link_id:
            raise ConfigError("links", f"link {a}–{b} is defined twice",
                              "merge parallel links into one with the summed bandwidth")
        bw_ba = bandwidth_bytes_per_s if bandwidth_b_to_a is None else bandwidth_b_to_a
        for bw in (bandwidth_bytes_per_s, bw_ba):
            if not bw > 0:
                raise ConfigError("links", f"link {a}–{b} has bandwidth {bw}", "give a positive bandwidth")
        if latency_s < 0:
            raise ConfigError("links", f"link {a}–{b} has negative latency {latency_s}", "give latency >= 0")
        ids = []
        for s, d, bw in ((a, b, bandwidth_bytes_per_s), (b, a, bw_ba)):
            lid = len(self.links)
            self.links.append(Link(lid, s, d, float(bw), float(latency_s), kind))
            self._link_id[(s, d)] = lid
            ids.append(lid)
        self.graph.add_edge(a, b, kind=kind)
        self._invalidate()
        return ids[0], ids[1]

    def degrade_link(self, a: str, b: str, factor: float) -> None:
        """Scale both directions of link a–b by ``factor`` (a bad cable); ``factor == 0`` fails the link:
        it is removed from routing, so traffic is rerouted over the remaining paths."""
        field = f"degraded_links[{a}–{b}]"
        if (a, b) not in self._link_id:
            raise ConfigError(field, "no such link", "name two directly linked nodes")
        if not 0.0 <= factor <= 1.0:
            raise ConfigError(field, f"factor must be in [0, 1], got {factor}",
                              "0 = failed, 0.5 = half speed")
        if factor == 0.0:
            self.graph.remove_edge(a, b)
            if not nx.is_connected(self.graph):
                self.graph.add_edge(a, b)
                raise ConfigError(field, "failing this link disconnects the cluster", "fail another link")
            self.failed_links.update({self._link_id[(a, b)], self._link_id[(b, a)]})
        else:
            for s, d in ((a, b), (b, a)):
                lid = self._link_id[(s, d)]
                old = self.links[lid]
                self.links[lid] = Link(lid, s, d, old.bandwidth_bytes_per_s * factor, old.latency_s, old.kind)
        self._invalidate()

    def _invalidate(self) -> None:
        self._arrays = None
        self._router = None

    # ---- queries --------------------------------------------------------------------------------
    @property
    def gpus(self) -> list[str]:
        """GPU node names in insertion order (the default rank order)."""
        return list(self._gpus)

    @property
    def num_links(self) -> int:
        return len(self.links)

    def link_id(self, src: str, dst: str) -> int:
        return self._link_id[(src, dst)]

    def nodes_of_kind(self, kind: NodeKind | str) -> list[str]:
        k = NodeKind(kind)
        return [n for n, node in self.nodes.items() if node.kind is k]

    def servers(self) -> dict[str, list[str]]:
        """Server name → its GPUs in rank order (GPUs with no server are left out)."""
        out: dict[str, list[str]] = {}
        for g in self._gpus:
            s = self.nodes[g].server
            if s is not None:
                out.setdefault(s, []).append(g)
        return out

    def _ensure_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            cap = np.array([lk.bandwidth_bytes_per_s for lk in self.links], dtype=np.float64)
            lat = np.array([lk.latency_s for lk in self.links], dtype=np.float64)
            self._arrays = (cap, lat)
        return self._arrays

    @property
    def capacity_bytes_per_s(self) -> np.ndarray:
        """Capacity of every directed link, indexed by link id."""
        return self._ensure_arrays()[0]

    @property
    def latency_s(self) -> np.ndarray:
        """Latency of every directed link, indexed by link id."""
        return self._ensure_arrays()[1]

    def validate(self) -> None:
        """Raise ConfigError unless the graph has GPUs and is connected."""
        if not self._gpus:
            raise ConfigError("nodes", f"topology {self.name!r} has no GPU node", "add nodes of kind gpu")
        if not nx.is_connected(self.graph):
            comps = sorted(nx.connected_components(self.graph), key=len, reverse=True)
            stray = sorted(comps[1])[:3]
            raise ConfigError("links", f"topology {self.name!r} is disconnected: {len(comps)} parts, "
                              f"e.g. {', '.join(stray)} cannot reach {sorted(comps[0])[0]}",
                              "add links joining the parts")

    # ---- routing --------------------------------------------------------------------------------
    @property
    def router(self) -> Any:
        if self._router is None:
            from topotrain.topology.routing import Router

            self._router = Router(self)
        return self._router

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        """Directed link ids of the (deterministic ECMP) path from node ``src`` to node ``dst``."""
        return self.router.route(src, dst)

    def path_latency_s(self, links: Iterable[int]) -> float:
        lat = self.latency_s
        return float(sum(lat[i] for i in links))

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, {len(self.nodes)} nodes, {len(self._gpus)} GPUs, "
                f"{self.num_links} directed links)")
