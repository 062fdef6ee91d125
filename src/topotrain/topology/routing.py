"""Routing: shortest paths (in hops) with deterministic ECMP, honouring which nodes may forward.

Rules, as a real cluster behaves:

* GPUs never forward traffic; NICs forward only when marked ``transit`` (e.g. a switchless torus).
* Traffic between two different servers leaves its server through the source GPU's NIC (the GPU's
  ``nic`` attribute, else its nearest NIC — as NCCL picks the NIC closest on the PCIe tree), crosses the
  network (nodes outside any server), and enters through the destination GPU's NIC. It never passes
  through a third server's PCIe fabric.
* Traffic inside a server stays on that server's fabric.
* A graph without server annotations (a user's own file) is one routing domain.

A route is chosen by a cost of the whole path, compared in order: fewest hops; then least total latency;
then the widest bottleneck (the narrowest link of the path: NVLink before PCIe inside a DGX-like server).
The three are computed per destination by dynamic programming over the shortest-hop DAG (latency-optimal
sub-paths of a latency-optimal path are latency-optimal, and the widest bottleneck among them composes as
max-min), so a route is the best path, not a greedy walk that takes a wide first hop into a narrow one.
Among paths still tied, the topology's ``meta["routing"]`` (:data:`ROUTING_MODES`) chooses, in the cluster
network (the ways inside a server keep the shared hash below in every mode):

* ``ecmp`` (the default of a topology; a scenario's default on Ethernet/RoCE, :func:`default_routing`): every
  switch hashes the flow with a seed of its own, as production ECMP switches do, so that successive tiers
  do not repeat each other's choice. The hash at switch ``u`` is the splitmix64 finalizer (Steele, Lea and
  Flood, "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014; the finalizer is Stafford's Mix13)
  of the pair's 64-bit key (BLAKE2b of source and destination) xor ``u``'s 64-bit seed (BLAKE2b of its
  name): flows of one pair always take one path, different pairs spread over the equal-cost paths and may
  collide, and a pair's choices at two switches are independent. On a full fat-tree all-pairs traffic then
  crosses every core switch (``tests/test_routing_hash.py``).
* ``ecmp-shared-seed``: the hash polarization of switches that share one hash function and seed (Cisco,
  "Hash polarization" in its CEF load-sharing notes; Juniper's "hash seed" guidance), kept to study it: a
  CRC-32 of (source, destination, hop), which is affine in its input, so one pair's choices at successive
  ties differ by a constant — on a full fat-tree with k/2 a power of two, only k/2 of the (k/2)² cores
  carry traffic. It was the ``ecmp`` of topotrain before issue 40.
* ``d-mod-k`` (a scenario's default where the cluster network's links are InfiniBand): the destination
  alone, as an InfiniBand subnet manager fills its switches' forwarding tables (one output port per
  destination at every switch; OpenSM's ``ftree`` and ``updn`` routing engines, OpenSM documentation,
  "Routing"): at the path's i-th tie among ``n_i`` next hops (sorted by name) it takes
  ``⌊d / (n_1·…·n_(i-1))⌋ mod n_i``, where ``d`` is the destination's index among the topology's nodes of
  its kind, counted leaf switch by leaf switch (:func:`destination_indices`) (D-mod-K, Zahavi, "D-Mod-K
  Routing Providing Non-Blocking Traffic for Shift Permutations on Real Life Fat Trees", CCIT report 776,
  Technion 2010). On a k-ary fat-tree whose endpoints fill the edge
  switches in order, the k/2 destinations of an edge switch then come down k/2 different links, and every
  shift permutation (``i → i + s``: a ring's steps) is free of contention.

Making a link faster never gives a pair a path with a narrower bottleneck or more latency
(tests/test_safety_routing.py).

How (none of it changes a route): each routing domain is indexed once in small integers (its members, plus
the non-members next to them, which never forward but may end a walk), with every node's links read once;
hop counts to a destination come from one breadth-first search per *anchor* (the destination, or the one
switch a stub destination hangs on: every NIC on a leaf switch shares its search), run with numpy on a large
domain and stored one byte per node (a list past 254 hops); the next hops and path costs toward an anchor
are evaluated on demand and cached per (anchor, node); the shared-seed hash is :func:`_stable_hash`, its
crc32 taken from the crc32 of the pair's common prefix (the same value); the per-switch hash is
:func:`switch_hash`, each switch's seed computed once. Between the NICs of a ring of routers the same routes come
in closed form (:mod:`topotrain.topology.ring_routes`: the shorter way round, the one tie broken by this
module's rule), without the per-router searches that cost seconds on a ring of a thousand routers.
A domain of one link type skips the path costs, and a path cache's pairs share each end's NIC and walk
(:mod:`topotrain.topology.route_batch`); a domain reads its fringe from its members' side.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import weakref
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from topotrain.util.errors import ConfigError

if TYPE_CHECKING:
    from topotrain.topology.graph import Topology

from topotrain.topology.elements import NodeKind
from topotrain.topology.ring_routes import RingRoutes
from topotrain.topology.route_batch import destination_indices, route_many_unkept, uniform_links

_NET = "__network__"
_ALL = "__all__"


#: How ties between best paths are broken (``Topology.meta["routing"]``; see the module docstring).
ROUTING_MODES = ("ecmp", "d-mod-k", "ecmp-shared-seed")


def routing_mode(meta: Mapping[str, object]) -> str:
    """The routing a topology's ``meta`` names (default ``ecmp``); ConfigError naming ``routing`` otherwise."""
    mode = meta.get("routing", "ecmp")
    if mode not in ROUTING_MODES:
        raise ConfigError("routing", f"unknown routing {mode!r}", f"use one of {', '.join(ROUTING_MODES)}")
    return str(mode)


def default_routing(link_kind: str) -> str:
    """The routing a cluster network of ``link_kind`` links (a catalog link kind) really has: ``d-mod-k`` on
    InfiniBand (its subnet manager routes by destination: OpenSM; Zahavi 2010), ``ecmp`` (hashed, a seed per
    switch) on anything else (Ethernet/RoCE)."""
    return "d-mod-k" if link_kind == "infiniband" else "ecmp"


_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """The splitmix64 finalizer (Stafford's Mix13; Steele, Lea and Flood, OOPSLA 2014): a bijection of 64-bit
    integers whose every output bit depends on every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _key64(text: str) -> int:
    """A stable 64-bit key of ``text`` (BLAKE2b; Python's ``hash`` of a str changes from run to run)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def switch_hash(switch: str, src: str, dst: str) -> int:
    """The per-switch ECMP hash of the flow ``src → dst`` at ``switch`` (the ``ecmp`` mode; :meth:`Router._search`
    computes the same value with the keys cached): ``_mix64(key(src, dst) ^ key(switch))``."""
    return _mix64(_key64(f"{src}\x1f{dst}") ^ _key64(switch))

#: Relative tolerance of ties between path latencies and bandwidths (sums of floats differ in the last bits).
_REL_TOL = 1e-9
#: D-mod-K walk rests kept per domain before the memo starts over (about 200 bytes each)
_SUFFIX_MAX = 2_000_000

#: NIC-to-NIC walks :meth:`Router._mid` keeps before it starts over (about 250 bytes each: at most ~125 MB)
_MIDS_MAX = 500_000

#: Domains with at least this many indexed nodes run their breadth-first searches with numpy (a Python loop
#: is faster on a server's few dozen nodes; the hop counts are the same either way).
_NUMPY_BFS_MIN_NODES = 1024

#: Hop count of a node a search did not reach, in a one-byte row (every real count there is below it).
_FAR8 = 255


def _less(a: float, b: float) -> bool:
    """``a`` is less than ``b`` by more than rounding (1 ps or the relative tolerance, whichever is larger)."""
    if math.isinf(b):
        return a < b
    return a < b - max(1e-12, _REL_TOL * abs(b))


def _stable_hash(*parts: str) -> int:
    """The ECMP hash of ``(source, destination, str(hop))`` (:meth:`Router._search` computes the same value
    incrementally)."""
    return zlib.crc32("\x1f".join(parts).encode())


class _OutLinks:
    """Every node's links, in id order (a failed link is in no route): one list of link ids grouped by node."""

    __slots__ = ("index", "order", "start")

    def __init__(self, topo: Topology) -> None:
        self.index = {n: i for i, n in enumerate(topo.nodes)}
        index, links = self.index, topo.links
        src = np.fromiter((index[lk.src] for lk in links), dtype=np.int64, count=len(links))
        live = np.ones(len(links), dtype=bool)
        live[np.fromiter(topo.failed_links, dtype=np.int64, count=len(topo.failed_links))] = False
        order = np.argsort(src, kind="stable")  # grouped by source, in id order within a group
        start = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(np.bincount(src[live], minlength=len(index)), out=start[1:])
        self.order: list[int] = order[live[order]].tolist()
        self.start: list[int] = start.tolist()

    def of(self, node: str) -> list[int]:
        """``node``'s links, in id order."""
        i = self.index[node]
        return self.order[self.start[i]:self.start[i + 1]]


#: A link seen from its tail: (head's local id, latency, bandwidth, directed link id).
_Edge = tuple[int, float, float, int]


class _Domain:
    """One routing domain in local integer ids: its members first, in name order (so that sorting members by
    id sorts them by name), then the fringe (non-members adjacent to a member: they never forward inside
    the domain, but a walk may start or end at one, as at a NIC that a GPU's ``nic`` attribute names outside
    its server). Per anchor it caches the hop counts to it, the path costs and the next hops."""

    __slots__ = ("lat", "bw", "names", "local", "n_members", "adj", "lids", "edges", "fwd", "fwd_by_name",
                 "transit", "csr", "anchors", "dist", "cost", "next", "targets", "seeds", "suffix", "uniform")

    def __init__(self, topo: Topology, members: set[str], lat: list[float], bw: list[float],
                 out: _OutLinks) -> None:
        nodes = topo.nodes
        gadj = topo.adjacency
        links = topo.links
        names = sorted(members)
        m = self.n_members = len(names)
        local = {n: i for i, n in enumerate(names)}
        adj: list[tuple[int, ...]] = []
        lids: list[tuple[int, ...]] = []
        #: a fringe node's links to members, gathered from the members' side (a leaf switch's thousands of other
        #: neighbours are never read: a server's domain costs its own size, not its switches' radix)
        back: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            mine: Sequence[int]
            if i < m:
                vs = list(gadj[n])
                mine = out.of(n)
                # a node's links in id order are its neighbours in the graph's order (add_link adds both); checked
                if [links[k].dst for k in mine] != vs:
                    mine = [topo.link_id(n, v) for v in vs]
            else:  # the fringe: its links to members only, in id order, which is its neighbours' order in the
                # graph (each add_link appends one neighbour and one link of a higher id; a failed link leaves both)
                mine = sorted(back[n])
                vs = [links[k].dst for k in mine]
            row: list[int] = []
            for v in vs:
                j = local.get(v)
                if j is None:  # a member's neighbour outside the domain: the fringe, indexed after the members
                    j = local[v] = len(names)
                    names.append(v)
                    back[v] = []
                if j >= m and i < m:
                    back[v].append(topo.link_id(v, n))
                row.append(j)
            adj.append(tuple(row))
            lids.append(tuple(mine))
        # the topology is not kept: the router that holds this domain holds it (weakly, see Router.topo)
        #: latency and bandwidth of every directed link, by id
        self.lat, self.bw = lat, bw
        self.names = tuple(names)  # tuples of atomic values leave the garbage collector's lists (see Router)
        self.local = local
        #: every node's neighbours in the graph's order (a fringe node's: members only), and its links to them
        self.adj = tuple(adj)
        self.lids = tuple(lids)
        self.transit = tuple([nodes[n].transit for n in names])
        self.uniform = uniform_links(adj, lids, m, lat, bw)
        n_all = len(names)
        #: a node's links to its neighbours, as ``adj`` (built on first use, see :meth:`row`)
        self.edges: list[tuple[_Edge, ...] | None] = [None] * n_all
        #: the links that may carry a path on, to members that forward: in the graph's order, and by name
        self.fwd: list[tuple[_Edge, ...] | None] = [None] * n_all
        self.fwd_by_name: list[tuple[_Edge, ...] | None] = [None] * n_all
        self.csr: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        #: local destination -> (its anchor, the link anchor -> destination or -1)
        self.anchors: dict[int, tuple[int, int]] = {}
        #: anchor -> (hop count of every local node, the count of one not reached)
        self.dist: dict[int, tuple[Sequence[int], int]] = {}
        self.cost: dict[int, dict[int, tuple[float, float]]] = {}
        self.next: dict[int, dict[int, tuple[_Edge, ...]]] = {}
        #: destination name -> Router._target's answer
        self.targets: dict[str, tuple[int, int, int, Sequence[int], int]] = {}
        #: local id -> the node's 64-bit ECMP seed (:func:`switch_hash`), computed on first use
        self.seeds: dict[int, int] = {}
        #: D-mod-K walks: (destination's local id, node, the product of the ties so far) -> the links from that
        #: node on (the rest of a walk is a function of these three alone; see Router._search)
        self.suffix: dict[tuple[int, int, int], tuple[int, ...]] = {}

    def row(self, u: int) -> tuple[_Edge, ...]:
        """``u``'s links (see ``edges``), building its rows on first use."""
        row = self.edges[u]
        if row is None:
            lat, bw = self.lat, self.bw
            row = self.edges[u] = tuple([(v, lat[i], bw[i], i) for v, i in zip(self.adj[u], self.lids[u], strict=True)])
            m, transit = self.n_members, self.transit
            fwd = self.fwd[u] = tuple([e for e in row if e[0] < m and transit[e[0]]])
            self.fwd_by_name[u] = tuple(sorted(fwd)) if len(fwd) > 1 else fwd
        return row

    def anchor(self, d: int) -> tuple[int, int]:
        """``d``'s only forwarding neighbour in the domain if ``d`` is a stub (does not forward, one
        neighbour, e.g. a NIC on its leaf switch), else ``d``; and the link anchor → ``d`` (-1: none). Every
        path to a stub ends ``anchor → d``, so one search per switch serves all the NICs on it
        (d(v, d) = d(v, anchor) + 1 for v ≠ d)."""
        got = self.anchors.get(d)
        if got is None:
            got = (d, -1)
            if not self.transit[d]:
                near = [v for v in self.adj[d] if v < self.n_members]
                if len(near) == 1 and self.transit[near[0]]:
                    a = near[0]
                    got = (a, self.row(a)[self.adj[a].index(d)][3])
            self.anchors[d] = got
        return got

    def down(self, a: int, dist: Sequence[int], u: int, by_name: bool) -> list[_Edge]:
        """``u``'s links to the neighbours one hop nearer anchor ``a`` that may carry the path on (members
        that forward, or ``a`` itself), in the graph's order or by name."""
        want = dist[u] - 1
        if a < self.n_members and self.transit[a]:  # only forwarding members qualify
            row = (self.fwd_by_name if by_name else self.fwd)[u]
            if row is None:
                self.row(u)
                row = (self.fwd_by_name if by_name else self.fwd)[u]
                assert row is not None  # built by row()
            return [e for e in row if dist[e[0]] == want]
        transit = self.transit
        out = [e for e in self.row(u) if dist[e[0]] == want and (e[0] == a or transit[e[0]])]
        if by_name:
            names = self.names
            out.sort(key=lambda e: names[e[0]])
        return out

    def distances(self, a: int) -> tuple[Sequence[int], int]:
        """Hop count to ``a`` from every local node that reaches it through forwarding members (breadth-first
        search from ``a``, cached), and the count given to a node not reached."""
        got = self.dist.get(a)
        if got is None:
            if len(self.names) >= _NUMPY_BFS_MIN_NODES:
                arr = self._bfs_numpy(a)
                if int(arr.max()) < _FAR8:
                    arr[arr < 0] = _FAR8
                    got = (arr.astype(np.uint8).tobytes(), _FAR8)
                else:
                    got = (arr.tolist(), -1)
            else:
                got = self._bfs_python(a)
            self.dist[a] = got
        return got

    def _bfs_python(self, a: int) -> tuple[Sequence[int], int]:
        """The breadth-first search of a small domain, counted in bytes (in a list if a count reaches 255)."""
        adj, transit, m = self.adj, self.transit, self.n_members
        far = _FAR8
        dist: bytearray | list[int] = bytearray([far]) * len(self.names)
        dist[a] = 0
        frontier = [a]
        d = 0
        while frontier:
            d += 1
            if d == far:  # a chain of 255 hops: restart, counting in a list
                far = -1
                dist = [far] * len(self.names)
                dist[a] = 0
                frontier = [a]
                d = 1
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if dist[v] == far and v < m:
                        dist[v] = d
                        if transit[v]:
                            nxt.append(v)
            frontier = nxt
        return (bytes(dist) if far == _FAR8 else dist), far

    def _bfs_numpy(self, a: int) -> np.ndarray:
        if self.csr is None:
            n = len(self.adj)
            lengths = np.fromiter(map(len, self.adj), dtype=np.int64, count=n)
            flat = np.fromiter(itertools.chain.from_iterable(self.adj), dtype=np.int64, count=int(lengths.sum()))
            keep = flat < self.n_members  # a search only enters members
            indptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(np.repeat(np.arange(n), lengths)[keep], minlength=n), out=indptr[1:])
            self.csr = (indptr, flat[keep], np.array(self.transit, dtype=bool))
        indptr, indices, transit = self.csr
        dist = np.full(len(self.names), -1, dtype=np.int64)
        dist[a] = 0
        frontier = np.array([a], dtype=np.int64)
        d = 0
        while frontier.size:
            d += 1
            starts = indptr[frontier]
            counts = indptr[frontier + 1] - starts
            total = int(counts.sum())
            if total == 0:
                break
            ends = np.cumsum(counts)
            nb = indices[np.repeat(starts - (ends - counts), counts) + np.arange(total, dtype=np.int64)]
            nb = nb[dist[nb] < 0]
            dist[nb] = d
            frontier = np.flatnonzero((dist == d) & transit)
        return dist


#: See :meth:`Router._target`.
_Target = tuple[int, int, int, Sequence[int], int]


def _alive(ref: weakref.ReferenceType[Topology]) -> Topology:
    topo = ref()
    if topo is None:
        raise ReferenceError("the topology of this router was freed")
    return topo


class Router:
    """Route cache over one frozen Topology: built once with it, never invalidated (the graph cannot change);
    ``routing`` breaks ties (:func:`routing_mode` of the topology's meta, checked when it freezes)."""

    def __init__(self, topo: Topology, routing: str = "ecmp") -> None:
        self._topo = weakref.ref(topo)
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._walks: dict[tuple[str, str, str], tuple[int, ...]] = {}
        #: NIC-to-NIC walks of route_many(keep=False), bounded (see _mid)
        self._mids: dict[tuple[str, str], tuple[int, ...]] = {}
        self._nic_of: dict[str, str | None] = {}
        self._domain_nodes: dict[str, set[str]] = {}
        self._domains: dict[str, _Domain] = {}
        self._out: _OutLinks | None = None
        #: latency and bandwidth of every directed link, by id
        self._link_lat: list[float] = []
        self._link_bw: list[float] = []
        #: the per-switch hash in the cluster network (the ``ecmp`` mode; ``ecmp-shared-seed``: the CRC everywhere)
        self._switch_seeded = routing == "ecmp"
        #: D-mod-K in the cluster network (the ``d-mod-k`` mode): every node's index among the nodes of its kind
        self._dest_index: dict[str, int] | None = None
        if routing == "d-mod-k":
            self._dest_index = destination_indices(topo)
        #: closed-form routes between the NICs of a ring of routers (ring_routes), looked for on first use
        self._ring: list[RingRoutes | None] = []

    @property
    def topo(self) -> Topology:
        """The topology this router routes. Held weakly: the topology holds its router, and a router (or a
        domain of it) that held the topology back would make a reference cycle, so that a dropped topology and
        its routes (tens of thousands of objects) waited for a full run of the cyclic garbage collector
        instead of being freed at once by reference counting."""
        return _alive(self._topo)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_topo": self.topo}  # pickled with its topology (pickle keeps the one object)

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, _topo=weakref.ref(state["_topo"]))

    # ---- domains --------------------------------------------------------------------------------
    def _members(self, domain: str) -> set[str]:
        if domain not in self._domain_nodes:
            nodes = self.topo.nodes
            if domain == _ALL:
                self._domain_nodes[_ALL] = set(nodes)
            elif domain == _NET:
                self._domain_nodes[_NET] = {n for n, nd in nodes.items()
                                            if nd.server is None or nd.kind is NodeKind.NIC}
            else:  # all servers' members in one pass over the nodes
                by_server: dict[str, set[str]] = {}
                for n, nd in nodes.items():
                    if nd.server is not None:
                        by_server.setdefault(nd.server, set()).add(n)
                for srv, members in by_server.items():
                    self._domain_nodes.setdefault(srv, members)
                self._domain_nodes.setdefault(domain, set())
        return self._domain_nodes[domain]

    def _domain(self, domain: str) -> _Domain:
        dom = self._domains.get(domain)
        if dom is None:
            if self._out is None:
                self._out = _OutLinks(self.topo)
                self._link_lat = self.topo.latency_s.tolist()
                self._link_bw = self.topo.capacity_bytes_per_s.tolist()
            dom = self._domains[domain] = _Domain(self.topo, self._members(domain), self._link_lat, self._link_bw,
                                                  self._out)
        return dom

    def _hops(self, domain: str, src: str, dst: str) -> int | None:
        """Hops from ``src`` to ``dst`` inside ``domain`` (None: unreachable)."""
        if src == dst:
            return 0
        dom = self._domain(domain)
        s, d = dom.local.get(src), dom.local.get(dst)
        if s is None or d is None:
            return None
        a = dom.anchor(d)[0]
        dist, far = dom.distances(a)
        h = dist[s]
        return None if h == far else h + (a != d)

    def _walk(self, domain: str, src: str, dst: str) -> tuple[int, ...]:
        """Directed links of the path ``src → dst`` inside ``domain`` (cached: a GPU's way to its NIC is
        shared by all its routes)."""
        key = (domain, src, dst)
        path = self._walks.get(key)
        if path is None:
            path = self._walks[key] = self._found(domain, src, dst)
        return path

    def _found(self, domain: str, src: str, dst: str) -> tuple[int, ...]:
        """:meth:`_walk` without its cache: the closed form on a ring of routers, else the search."""
        if domain == _NET:
            if not self._ring:
                self._ring.append(RingRoutes.of(self.topo, self._first_tie))
            ring = self._ring[0]
            if ring is not None:
                path = ring.walk(src, dst)
                if path is not None:
                    return path
        return self._search(domain, src, dst)

    def _first_tie(self, src: str, dst: str, switch: str, hop: int, count: int) -> int:
        """Which of ``count`` tied next hops (sorted by name) :meth:`_search` takes at ``switch`` in the cluster
        network, the ``hop``-th node of the walk ``src → dst`` and its first tie (D-mod-K's divisor is still
        1): the same rule as there."""
        if self._dest_index is not None:
            return self._dest_index[dst] % count
        if self._switch_seeded:
            return switch_hash(switch, src, dst) % count
        return zlib.crc32(str(hop).encode(), zlib.crc32(f"{src}\x1f{dst}\x1f".encode())) % count

    def _costs(self, dom: _Domain, a: int, at: int) -> dict[int, tuple[float, float]]:
        """(total latency, bottleneck bandwidth) of the best path to anchor ``a`` among the shortest-hop paths,
        least latency first, then widest bottleneck, of ``at`` and of every node below it on those paths
        (cached per anchor, filled on demand: only the part of the shortest-hop DAG that queries reach is
        ever evaluated — a node's value depends only on its next hops', so the order does not matter; the
        next hops are taken in the graph's order, as the tie rule below is not symmetric)."""
        cost = dom.cost.get(a)
        if cost is None:
            cost = dom.cost[a] = {a: (0.0, math.inf)}
        if at in cost:
            return cost
        dist = dom.distances(a)[0]
        down = dom.down
        inf = math.inf
        fwd = dom.fwd if a < dom.n_members and dom.transit[a] else None  # see _Domain.down
        # the DAG below ``at`` not evaluated yet, level by level (each a hop nearer ``a``)
        todo: dict[int, list[_Edge]] = {at: down(a, dist, at, False)}
        level = [at]
        while level:
            below = []
            for u in level:
                for e in todo[u]:
                    v = e[0]
                    if v not in cost and v not in todo:
                        row = fwd[v] if fwd is not None else None
                        if row is None:
                            todo[v] = down(a, dist, v, False)
                        else:  # _Domain.down's common case, inlined
                            want = dist[v] - 1
                            todo[v] = [x for x in row if dist[x[0]] == want]
                        below.append(v)
            level = below
        for u, hops in reversed(todo.items()):  # nearest ``a`` first: a node after its next hops
            best_lat, best_bw = inf, 0.0
            for v, lat_e, bw_e, _ in hops:
                lat_v, bw_v = cost[v]
                lat = lat_e + lat_v
                bw = bw_v if bw_v < bw_e else bw_e  # min(bw_e, bw_v)
                # _less(lat, best_lat) and _less(best_lat, lat), inlined: the same float operations, with
                # max(1e-12, t) as t if t > 1e-12 else 1e-12
                if best_lat == inf:
                    less = lat < best_lat
                else:
                    t = _REL_TOL * abs(best_lat)
                    less = lat < best_lat - (t if t > 1e-12 else 1e-12)
                if less:
                    best_lat, best_bw = lat, bw
                elif bw > best_bw:
                    if lat == inf:
                        more = best_lat < lat
                    else:
                        t = _REL_TOL * abs(lat)
                        more = best_lat < lat - (t if t > 1e-12 else 1e-12)
                    if not more:
                        best_bw = bw
            cost[u] = (best_lat, best_bw)
        return cost

    def _next_hops(self, dom: _Domain, a: int, u: int) -> tuple[_Edge, ...]:
        """Links from ``u`` on a best path to anchor ``a`` (fewest hops, least latency, widest bottleneck),
        sorted by the next node's name (cached)."""
        nxt = dom.next.get(a)
        if nxt is None:
            nxt = dom.next[a] = {}
        cands = nxt.get(u)
        if cands is None:
            c = dom.down(a, dom.distances(a)[0], u, True)
            if len(c) > 1 and not (dom.uniform and u < dom.n_members and a < dom.n_members):
                cost = self._costs(dom, a, u)
                lat_u, bw_u = cost[u]
                floor = bw_u * (1 - _REL_TOL)
                keep = []
                for e in c:
                    lat_v, bw_v = cost[e[0]]
                    lat = e[1] + lat_v
                    # not _less(lat_u, lat) and min(bandwidth, bw_v) >= floor, inlined (see _costs)
                    if lat == math.inf:
                        more = lat_u < lat
                    else:
                        t = _REL_TOL * abs(lat)
                        more = lat_u < lat - (t if t > 1e-12 else 1e-12)
                    if not more and (bw_v if bw_v < e[2] else e[2]) >= floor:
                        keep.append(e)
                c = keep
            cands = nxt[u] = tuple(c)
        return cands

    def _target(self, dom: _Domain, dst: str) -> _Target:
        """What every walk to ``dst`` in ``dom`` starts from (cached): ``dst``'s local id (-1: neither in the
        domain nor next to it), its anchor, the link anchor → ``dst``, the hop counts to the anchor and the
        count of a node not reached (atomic values only: nothing for the garbage collector to follow)."""
        d = dom.local.get(dst)
        if d is None:
            if dst not in self.topo.nodes:
                raise KeyError(dst)
            target: _Target = (-1, -1, -1, b"", 0)
        else:
            a, last = dom.anchor(d)
            dist, far = dom.distances(a)
            if a not in dom.next:
                dom.next[a] = {}
            target = (d, a, last, dist, far)
        dom.targets[dst] = target
        return target

    def _search(self, domain: str, src: str, dst: str) -> tuple[int, ...]:
        """Directed links of the best path ``src → dst`` inside ``domain`` (ties by the shared-seed hash, or in the
        cluster network by the per-switch hash or D-mod-K: see the module docstring)."""
        dom = self._domains.get(domain)
        if dom is None:
            dom = self._domain(domain)
        target = dom.targets.get(dst)
        if target is None:
            target = self._target(dom, dst)
        d, a, last, dist, far = target
        if src == dst:
            return ()
        s = dom.local.get(src)
        # a node neither in the domain nor next to it is reached by nothing there, nor is a fringe node
        # (unless it is the anchor, and then it is the destination)
        if s is None or d < 0 or dist[s] == far:
            raise ConfigError("topology", f"no path from {src} to {dst} in {self.topo.name!r}",
                              "connect them, or check which nodes may forward traffic")
        nxt = dom.next[a]
        # toward a forwarding member, a node with one forwarding member next to it goes there (it was reached
        # through it): no search, no cache entry (most walks start so, at a NIC on its leaf switch)
        fwd = dom.fwd if a < dom.n_members and dom.transit[a] else None
        links: list[int] = []
        u = s
        hop = 0
        seed = -1
        # D-mod-K (see the module docstring): the destination's index, and the product of the ties so far
        network = domain in (_NET, _ALL)
        dest = self._dest_index[dst] if self._dest_index is not None and network else -1
        div = 1
        # the per-switch hash (see the module docstring): the pair's key, and the seeds of the switches met
        per_switch = self._switch_seeded and network
        pair_key = -1
        seeds = dom.seeds
        memo = dom.suffix if dest >= 0 else None
        states: list[tuple[int, int, int]] = []  # (node, ties' product, links before it) met on a D-mod-K walk
        while u != a and u != d:
            if memo is not None:
                rest = memo.get((d, u, div))
                if rest is not None:
                    return self._remember(memo, d, states, links, rest)
                states.append((u, div, len(links)))
            cands = nxt.get(u)
            if cands is None:
                if fwd is not None:
                    one = fwd[u]
                    if one is None:
                        dom.row(u)
                        one = fwd[u]
                    cands = one if one is not None and len(one) == 1 else self._next_hops(dom, a, u)
                else:
                    cands = self._next_hops(dom, a, u)
            if len(cands) == 1:
                e = cands[0]
            elif dest >= 0:
                e = cands[(dest // div) % len(cands)]
                div *= len(cands)
            elif per_switch:
                if pair_key < 0:
                    pair_key = _key64(f"{src}\x1f{dst}")
                sw = seeds.get(u, -1)
                if sw < 0:
                    sw = seeds[u] = _key64(dom.names[u])
                e = cands[_mix64(pair_key ^ sw) % len(cands)]
            else:
                if seed < 0:  # _stable_hash(src, dst, str(hop)), the crc32 of the common prefix taken once
                    seed = zlib.crc32(f"{src}\x1f{dst}\x1f".encode())
                e = cands[zlib.crc32(str(hop).encode(), seed) % len(cands)]
            u = e[0]
            links.append(e[3])
            hop += 1
        if u != d:
            links.append(last)
        if memo is not None:
            return self._remember(memo, d, states, links, ())
        return tuple(links)

    @staticmethod
    def _remember(memo: dict[tuple[int, int, int], tuple[int, ...]], d: int, states: list[tuple[int, int, int]],
                  links: list[int], rest: tuple[int, ...]) -> tuple[int, ...]:
        """The walk ``links + rest``, its rest from every state met on the way kept in ``memo`` (emptied past a
        bound: memory stays bounded on the largest fabrics, answers do not change)."""
        full = tuple(links) + rest
        if len(memo) > _SUFFIX_MAX:
            memo.clear()
        for u, div, at in states:
            memo[(d, u, div)] = full[at:]
        return full


    # ---- NIC choice -----------------------------------------------------------------------------
    def nic_of(self, gpu: str) -> str | None:
        """The NIC a GPU's inter-server traffic uses: its ``nic`` attribute, else the nearest NIC."""
        if gpu in self._nic_of:
            return self._nic_of[gpu]
        node = self.topo.nodes[gpu]
        nic: str | None = node.attrs.get("nic")
        if nic is None and node.server is not None:
            members = self._members(node.server)
            nics = sorted(n for n in members if self.topo.nodes[n].kind is NodeKind.NIC)
            best: list[str] = []
            best_d = None
            for n in nics:
                d = self._hops(node.server, gpu, n)
                if d is None:
                    continue
                if best_d is None or d < best_d:
                    best, best_d = [n], d
                elif d == best_d:
                    best.append(n)
            if best:
                local = self.topo.servers().get(node.server, [gpu])
                idx = local.index(gpu) if gpu in local else 0
                nic = best[idx % len(best)]
        self._nic_of[gpu] = nic
        return nic

    # ---- routes ---------------------------------------------------------------------------------
    def _links(self, src: str, dst: str, keep: bool = True) -> tuple[int, ...]:
        """Directed links of the route ``src → dst`` (not cached here; ``keep=False``: nor its part between the
        NICs, a walk per pair that only the caller's own cache keeps)."""
        if src == dst:
            return ()
        nodes = self.topo.nodes
        s_node, d_node = nodes[src], nodes[dst]
        s_srv, d_srv = s_node.server, d_node.server
        if s_srv is not None and d_srv is not None and s_srv != d_srv:
            nic_s = src if s_node.kind is NodeKind.NIC else self.nic_of(src)
            nic_d = dst if d_node.kind is NodeKind.NIC else self.nic_of(dst)
            if nic_s is None or nic_d is None:
                missing = s_srv if nic_s is None else d_srv
                raise ConfigError("server", f"server {missing!r} has no NIC reachable from its GPUs",
                                  "give the server template at least one NIC")
            head = self._walk(s_srv, src, nic_s) if src != nic_s else ()
            mid = self._walk(_NET, nic_s, nic_d) if keep else self._mid(nic_s, nic_d)
            tail = self._walk(d_srv, nic_d, dst) if dst != nic_d else ()
            return head + mid + tail
        if s_srv is not None and s_srv == d_srv:
            return self._walk(s_srv, src, dst)
        return self._walk(_ALL, src, dst)

    def _mid(self, nic_s: str, nic_d: str) -> tuple[int, ...]:
        """The walk ``nic_s → nic_d`` in the cluster network for :meth:`route_many` with ``keep=False``: from the
        walks kept, else from a bounded memo of its own (emptied past :data:`_MIDS_MAX`: the rank tuples of one
        job ask for the same NIC pairs again and again — a data-parallel ring, then the same pairs among a
        pipeline's or the whole job's ranks — and each is walked once while the memo holds it; the memory stays
        bounded, the routes are the same)."""
        key = (nic_s, nic_d)
        path = self._mids.get(key)
        if path is None:
            path = self._walks.get((_NET, nic_s, nic_d)) or self._found(_NET, nic_s, nic_d)
            if len(self._mids) >= _MIDS_MAX:
                self._mids.clear()
            self._mids[key] = path
        return path

    def node_path(self, src: str, dst: str) -> list[str]:
        """Nodes of the route ``src → dst``, both ends included."""
        links = self.topo.links
        return [src, *(links[i].dst for i in self.route(src, dst))]

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        """Directed link ids of the route ``src → dst`` (cached)."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self._links(src, dst)
        return r

    def route_many(self, pairs: Iterable[tuple[str, str]], keep: bool = True) -> list[tuple[int, ...]]:
        """:meth:`route` of every ``(src, dst)`` of ``pairs``, in order. ``keep=False``: routes not met before are
        not cached here (the same routes: for a caller that keeps them itself, as
        :class:`~topotrain.collectives.paths.PathCache` does, in a fraction of the memory)."""
        if not keep:
            return route_many_unkept(self, pairs)
        routes = self._routes
        out = []
        for key in pairs:
            r = routes.get(key)
            if r is None:
                r = self._links(*key, keep=keep)
                if keep:
                    routes[key] = r
            out.append(r)
        return out
