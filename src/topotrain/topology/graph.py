"""The cluster as a graph: GPUs, PCIe switches, CPU sockets, NICs, NVSwitches and network switches.

Every physical link is full duplex: :meth:`Topology.add_link` creates one *directed* link each way, each
with its own capacity (bytes/s) and latency (s). Directed links are numbered ``0..num_links-1`` so that
network models can keep per-link state in numpy arrays (``capacity_bytes_per_s``, ``latency_s``).

A Topology is built, then frozen: builders and loaders add nodes and links, then :meth:`Topology.freeze`
(called by :meth:`Topology.validate`, and by the first query that derives data from the graph) fixes it
for good. Everything derived from it (the capacity and latency arrays, the router and its route cache) is
computed once and never invalidated, so a cached route can never describe another graph. A change of the
hardware (a degraded or failed link) is a new topology: :meth:`Topology.with_degraded_links`.

Ranks of a collective are GPU nodes; :attr:`Topology.gpus` lists them in insertion order, which is the
default rank order. Routing lives in :mod:`topotrain.topology.routing`; the Topology caches its routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import numpy as np

from topotrain.topology.elements import TRANSIT_BY_DEFAULT, Link, Node, NodeKind
from topotrain.topology.routing import Router, routing_mode
from topotrain.util.errors import ConfigError

if TYPE_CHECKING:
    import networkx as nx

_K = TypeVar("_K")
_V = TypeVar("_V")


class FrozenTopologyError(TypeError):
    """A frozen :class:`Topology` (or its nodes, links or meta) was asked to change.

    A programming error, not a user's bad input: build a new topology instead (for degraded or failed links,
    :meth:`Topology.with_degraded_links`).
    """


def _refuse(what: str) -> NoReturn:
    raise FrozenTopologyError(f"{what} of a frozen topology cannot change: build a new topology "
                              "(Topology.with_degraded_links for degraded or failed links)")


class _FrozenDict(dict[_K, _V]):
    """A dict that refuses every change: the nodes, node attributes and meta of a frozen topology.

    A dict subclass (not a mapping proxy) so that readers keep the dict API and a writer gets an error that
    says what to do instead.
    """

    __slots__ = ("_what",)

    def __init__(self, items: Any = (), what: str = "a mapping") -> None:
        super().__init__(items)
        self._what = what

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenDict, (dict(self), self._what))

    def __setitem__(self, *args: Any) -> NoReturn:
        _refuse(self._what)

    def __delitem__(self, *args: Any) -> NoReturn:
        _refuse(self._what)

    def __ior__(self, *args: Any) -> NoReturn:  # type: ignore[misc]
        _refuse(self._what)

    def clear(self) -> NoReturn:
        _refuse(self._what)

    def pop(self, *args: Any) -> NoReturn:
        _refuse(self._what)

    def popitem(self) -> NoReturn:
        _refuse(self._what)

    def setdefault(self, *args: Any) -> NoReturn:
        _refuse(self._what)

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self._what)


class Topology:
    """A graph that is built, then frozen, and read by everything else.

    Build with :meth:`add_node` / :meth:`add_link` (and ``meta`` entries), then :meth:`freeze` (or
    :meth:`validate`, which freezes a valid graph). Query with :attr:`gpus`, :meth:`route`,
    :attr:`capacity_bytes_per_s`, :attr:`latency_s`; the first such query freezes the topology too, since
    what it returns is computed once. Once frozen, any change raises :class:`FrozenTopologyError`.
    Software costs (the per-message overhead, shared CPU cores) are not the graph's: they are the network
    models' :class:`~topotrain.network.params.NetworkParams`.
    """

    links: Sequence[Link]
    failed_links: Set[int]

    def __init__(self, name: str = "topology") -> None:
        self._frozen = False
        self.name = name
        #: every node's neighbours in the order their links were added, each with the link's ``{"kind": ...}``
        #: (the adjacency of a networkx graph built the same way; :attr:`graph` builds that graph on demand)
        self._adj: dict[str, dict[str, dict[str, str]]] = {}
        self._nx: list[nx.Graph] = []
        self.nodes: dict[str, Node] = {}
        self._links: list[Link] = []
        self.links = self._links
        self._link_id: dict[tuple[str, str], int] = {}
        self._gpus: list[str] = []
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._router: Router | None = None
        self.meta: dict[str, Any] = {}
        self._failed: set[int] = set()
        self.failed_links = self._failed

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            _refuse(f"attribute {name!r}")
        object.__setattr__(self, name, value)

    # ---- building -------------------------------------------------------------------------------
    def _building(self, what: str) -> None:
        if self._frozen:
            _refuse(what)

    def add_node(self, name: str, kind: NodeKind | str, server: str | None = None,
                 transit: bool | None = None, **attrs: Any) -> str:
        self._building(f"the nodes (add_node {name!r})")
        if name in self.nodes:
            raise ConfigError("nodes", f"node {name!r} is defined twice", "give every node a unique name")
        try:
            k = NodeKind(kind)
        except ValueError:
            raise ConfigError("nodes", f"node {name!r} has unknown kind {kind!r}",
                              f"use one of {', '.join(k.value for k in NodeKind)}") from None
        if transit is None:
            transit = k in TRANSIT_BY_DEFAULT
        if k is NodeKind.GPU:
            transit = False
            self._gpus.append(name)
        self.nodes[name] = Node(name, k, server, transit, dict(attrs))
        self._adj[name] = {}
        return name

    def add_link(self, a: str, b: str, bandwidth_bytes_per_s: float, latency_s: float = 0.0,
                 kind: str = "", bandwidth_b_to_a: float | None = None) -> tuple[int, int]:
        """Add a full-duplex link: directed ``a→b`` and ``b→a``. Returns the two directed link ids."""
        self._building(f"the links (add_link {a}–{b})")
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
            lid = len(self._links)
            self._links.append(Link(lid, s, d, float(bw), float(latency_s), kind))
            self._link_id[(s, d)] = lid
            ids.append(lid)
        data = {"kind": kind}
        self._adj[a][b] = data
        self._adj[b][a] = data
        return ids[0], ids[1]

    def freeze(self) -> Topology:
        """End the build: from now on nothing changes, so arrays and routes are computed once. Idempotent;
        returns ``self`` so that a builder can end with ``return topo.freeze()``."""
        if self._frozen:
            return self
        routing = routing_mode(self.meta)  # a bad routing is refused before anything is frozen
        nodes = {n: Node(nd.name, nd.kind, nd.server, nd.transit,
                         _FrozenDict(nd.attrs, f"the attributes of node {n!r}"))
                 for n, nd in self.nodes.items()}
        self.nodes = _FrozenDict(nodes, "the nodes")
        self.links = tuple(self._links)
        self.failed_links = frozenset(self._failed)
        self.meta = _FrozenDict(self.meta, "the meta")
        cap = np.array([lk.bandwidth_bytes_per_s for lk in self._links], dtype=np.float64)
        lat = np.array([lk.latency_s for lk in self._links], dtype=np.float64)
        cap.flags.writeable = False
        lat.flags.writeable = False
        self._arrays = (cap, lat)
        self._router = Router(self, routing)
        self._frozen = True
        return self

    @property
    def frozen(self) -> bool:
        """Whether the build is over (see :meth:`freeze`)."""
        return self._frozen

    # ---- degraded and failed links --------------------------------------------------------------
    def with_degraded_links(self, changes: Iterable[tuple[str, str, float]]) -> Topology:
        """A new, frozen topology in which each link ``a–b`` of ``changes`` has both directions scaled by
        ``factor`` (a bad cable); ``factor == 0`` fails the link: it leaves routing, so traffic is rerouted
        over the remaining paths. Changes apply in order (two factors on one link multiply). ``self`` is
        left as it is; a failure that would disconnect the cluster raises ConfigError."""
        t = Topology(self.name)
        t.nodes = {n: Node(nd.name, nd.kind, nd.server, nd.transit, dict(nd.attrs)) for n, nd in self.nodes.items()}
        t._adj = self._thawed_adjacency()
        t._links = list(self._links)
        t.links = t._links
        t._link_id = dict(self._link_id)
        t._gpus = list(self._gpus)
        t.meta = dict(self.meta)
        t._failed = set(self.failed_links)
        t.failed_links = t._failed
        for a, b, factor in changes:
            t._degrade(a, b, factor)
        return t.freeze()

    def _thawed_adjacency(self) -> dict[str, dict[str, dict[str, str]]]:
        """A mutable copy of the adjacency built in the order the original was (nodes, then one edge per
        ``add_link``, links ``2k`` and ``2k+1`` being its two directions, failed links left out), so every
        node's neighbours are listed in the same order as in the original: anything that walks them sees the
        same graph."""
        adj: dict[str, dict[str, dict[str, str]]] = {n: {} for n in self.nodes}
        for lk in self._links[::2]:
            if lk.id not in self.failed_links:
                data = {"kind": lk.kind}
                adj[lk.src][lk.dst] = data
                adj[lk.dst][lk.src] = data
        return adj

    def _components(self) -> list[list[str]]:
        """The connected parts of the graph, each in breadth-first order, in the order of their first node
        (as networkx's ``connected_components`` lists them)."""
        adj = self._adj
        seen: set[str] = set()
        parts = []
        for n in adj:
            if n in seen:
                continue
            seen.add(n)
            part = [n]
            for u in part:  # grows while it is walked: a breadth-first search
                for v in adj[u]:
                    if v not in seen:
                        seen.add(v)
                        part.append(v)
            parts.append(part)
        return parts

    def _degrade(self, a: str, b: str, factor: float) -> None:
        field = f"degraded_links[{a}–{b}]"
        if (a, b) not in self._link_id:
            raise ConfigError(field, "no such link", "name two directly linked nodes")
        if not 0.0 <= factor <= 1.0:
            raise ConfigError(field, f"factor must be in [0, 1], got {factor}",
                              "0 = failed, 0.5 = half speed")
        if factor == 0.0:
            if self._link_id[(a, b)] in self._failed:
                raise ConfigError(field, "this link is failed twice", "name each failed link once")
            data = self._adj[a].pop(b)
            del self._adj[b][a]
            if len(self._components()) > 1:
                self._adj[a][b] = self._adj[b][a] = data
                raise ConfigError(field, "failing this link disconnects the cluster", "fail another link")
            self._failed.update({self._link_id[(a, b)], self._link_id[(b, a)]})
        else:
            for s, d in ((a, b), (b, a)):
                lid = self._link_id[(s, d)]
                old = self._links[lid]
                self._links[lid] = Link(lid, s, d, old.bandwidth_bytes_per_s * factor, old.latency_s, old.kind)

    # ---- queries --------------------------------------------------------------------------------
    @property
    def adjacency(self) -> dict[str, dict[str, dict[str, str]]]:
        """Every node's neighbours, in the order their links were added (failed links left out), each with
        ``{"kind": ...}`` of the link: read it, never change it (what networkx's ``Graph.adj`` holds)."""
        return self._adj

    @property
    def graph(self) -> nx.Graph:
        """The topology as a frozen networkx graph (nodes and physical links, each link's ``kind``; every node's
        neighbours in the order of :attr:`adjacency`), built on first use: networkx is imported only by what
        needs its algorithms (metrics, drawing), not by routing or the network models. Freezes the topology."""
        self.freeze()
        if not self._nx:
            import networkx as nx  # a second of start-up that routing and simulation do not need

            g = nx.Graph()
            g.add_nodes_from(self.nodes)
            g.add_edges_from((lk.src, lk.dst, {"kind": lk.kind}) for lk in self._links[::2]
                             if lk.id not in self.failed_links)  # in the order of add_link, as adjacency
            self._nx.append(nx.freeze(g))
        return self._nx[0]

    @property
    def gpus(self) -> list[str]:
        """GPU node names in insertion order (the default rank order)."""
        return list(self._gpus)

    @property
    def num_links(self) -> int:
        return len(self._links)

    def link_id(self, src: str, dst: str) -> int:
        return self._link_id[(src, dst)]

    def link_kinds(self) -> list[str]:
        """The kind of every directed link (``pcie``, ``ethernet``, ...; "" where none was given), by link id."""
        return [lk.kind for lk in self._links]

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

    @property
    def capacity_bytes_per_s(self) -> np.ndarray:
        """Capacity of every directed link, indexed by link id (read-only; freezes the topology)."""
        arrays = self.freeze()._arrays
        assert arrays is not None  # set by freeze
        return arrays[0]

    @property
    def latency_s(self) -> np.ndarray:
        """Latency of every directed link, indexed by link id (read-only; freezes the topology)."""
        arrays = self.freeze()._arrays
        assert arrays is not None  # set by freeze
        return arrays[1]

    def validate(self) -> None:
        """Raise ConfigError unless the graph has GPUs and is connected; a valid topology is then frozen."""
        if not self._gpus:
            raise ConfigError("nodes", f"topology {self.name!r} has no GPU node", "add nodes of kind gpu")
        parts = self._components()
        if len(parts) > 1:
            comps = sorted(parts, key=len, reverse=True)
            stray = sorted(comps[1])[:3]
            raise ConfigError("links", f"topology {self.name!r} is disconnected: {len(comps)} parts, "
                              f"e.g. {', '.join(stray)} cannot reach {sorted(comps[0])[0]}",
                              "add links joining the parts")
        self.freeze()

    # ---- routing --------------------------------------------------------------------------------
    @property
    def router(self) -> Router:
        """The route cache of this topology (one for its lifetime; freezes the topology)."""
        router = self.freeze()._router
        assert router is not None  # set by freeze
        return router

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        """Directed link ids of the (deterministic ECMP) path from node ``src`` to node ``dst``."""
        return self.router.route(src, dst)

    def path_latency_s(self, links: Iterable[int]) -> float:
        lat = self.latency_s
        return float(sum(lat[i] for i in links))

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, {len(self.nodes)} nodes, {len(self._gpus)} GPUs, "
                f"{self.num_links} directed links)")
