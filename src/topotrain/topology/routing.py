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
Among paths still tied the choice is a stable hash of (source, destination, hop) — deterministic ECMP (flows
of one pair always take one path; different pairs spread over the equal-cost paths). Making a link faster
never gives a pair a path with a narrower bottleneck or more latency (tests/test_safety_routing.py).
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from typing import TYPE_CHECKING

from topotrain.errors import ConfigError

if TYPE_CHECKING:
    from topotrain.topology.graph import Topology

from topotrain.topology.graph import NodeKind

_NET = "__network__"
_ALL = "__all__"


#: Relative tolerance of ties between path latencies and bandwidths (sums of floats differ in the last bits).
_REL_TOL = 1e-9


def _less(a: float, b: float) -> bool:
    """``a`` is less than ``b`` by more than rounding (1 ps or the relative tolerance, whichever is larger)."""
    if math.isinf(b):
        return a < b
    return a < b - max(1e-12, _REL_TOL * abs(b))


def _stable_hash(*parts: str) -> int:
    return zlib.crc32("\x1f".join(parts).encode())


class Router:
    """Route cache over one frozen Topology: built once with it, never invalidated (the graph cannot change)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._dist: dict[tuple[str, str], dict[str, int]] = {}
        self._anchors: dict[tuple[str, str], str] = {}
        self._walks: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._next: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._cost: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
        self._nic_of: dict[str, str | None] = {}
        self._domain_nodes: dict[str, set[str]] = {}

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

    def _distances(self, domain: str, dst: str) -> dict[str, int]:
        """Hop count to ``dst`` from every node of ``domain`` that reaches it through forwarding nodes
        (breadth-first search from ``dst``, cached)."""
        key = (domain, dst)
        dist = self._dist.get(key)
        if dist is None:
            members = self._members(domain)
            nodes = self.topo.nodes
            adj = self.topo.graph.adj
            dist = {dst: 0}
            q = deque([dst])
            while q:
                u = q.popleft()
                du = dist[u] + 1
                for v in adj[u]:
                    if v in dist or v not in members:
                        continue
                    dist[v] = du
                    if nodes[v].transit:
                        q.append(v)
            self._dist[key] = dist
        return dist

    def _anchor(self, domain: str, dst: str) -> str:
        """``dst``'s only forwarding neighbour in ``domain`` if ``dst`` is a stub (does not forward, one
        neighbour, e.g. a NIC on its leaf switch), else ``dst``. Every path to a stub ends ``anchor → dst``,
        so one search per switch serves all the NICs on it (d(v, dst) = d(v, anchor) + 1 for v ≠ dst)."""
        key = (domain, dst)
        a = self._anchors.get(key)
        if a is None:
            a = dst
            if not self.topo.nodes[dst].transit:
                members = self._members(domain)
                near = [v for v in self.topo.graph.adj[dst] if v in members]
                if len(near) == 1 and self.topo.nodes[near[0]].transit:
                    a = near[0]
            self._anchors[key] = a
        return a

    def _hops(self, domain: str, src: str, dst: str) -> int | None:
        """Hops from ``src`` to ``dst`` inside ``domain`` (None: unreachable)."""
        if src == dst:
            return 0
        anchor = self._anchor(domain, dst)
        d = self._distances(domain, anchor).get(src)
        return None if d is None else d + (anchor != dst)

    def _walk(self, domain: str, src: str, dst: str) -> tuple[str, ...]:
        """Node path ``src → dst`` inside ``domain`` (cached: a GPU's way to its NIC is shared by all its
        routes)."""
        key = (domain, src, dst)
        path = self._walks.get(key)
        if path is None:
            path = self._walks[key] = tuple(self._search(domain, src, dst))
        return path

    def _costs(self, domain: str, anchor: str, at: str) -> dict[str, tuple[float, float]]:
        """(total latency, bottleneck bandwidth) of the best path to ``anchor`` among the shortest-hop paths,
        least latency first, then widest bottleneck, of ``at`` and of every node below it on those paths
        (cached per anchor, filled on demand: only the part of the shortest-hop DAG that queries reach is
        ever evaluated — a node's value depends only on its next hops', so the order does not matter)."""
        key = (domain, anchor)
        cost = self._cost.get(key)
        if cost is None:
            cost = self._cost[key] = {anchor: (0.0, math.inf)}
        if at in cost:
            return cost
        dist = self._distances(domain, anchor)
        nodes = self.topo.nodes
        adj = self.topo.graph.adj
        links, lid = self.topo.links, self.topo.link_id

        def hops(u: str) -> list[str]:
            du = dist[u]
            return [v for v in adj[u] if dist.get(v) == du - 1 and (v == anchor or nodes[v].transit)]

        stack: list[tuple[str, bool]] = [(at, False)]
        while stack:
            u, ready = stack.pop()
            if u in cost:
                continue
            if not ready:
                stack.append((u, True))
                stack.extend((v, False) for v in hops(u) if v not in cost)
                continue
            best_lat, best_bw = math.inf, 0.0
            for v in hops(u):
                lk = links[lid(u, v)]
                lat_v, bw_v = cost[v]
                lat, bw = lk.latency_s + lat_v, min(lk.bandwidth_bytes_per_s, bw_v)
                if _less(lat, best_lat):
                    best_lat, best_bw = lat, bw
                elif not _less(best_lat, lat) and bw > best_bw:
                    best_bw = bw
            cost[u] = (best_lat, best_bw)
        return cost

    def _next_hops(self, domain: str, anchor: str, u: str) -> tuple[str, ...]:
        """Next hops from ``u`` on a best path to ``anchor`` (fewest hops, least latency, widest
        bottleneck), sorted (cached)."""
        key = (domain, anchor, u)
        cands = self._next.get(key)
        if cands is None:
            dist = self._distances(domain, anchor)
            nodes = self.topo.nodes
            want = dist[u] - 1
            c = sorted(v for v in self.topo.graph.adj[u] if dist.get(v) == want and (v == anchor or nodes[v].transit))
            if len(c) > 1:
                cost = self._costs(domain, anchor, u)
                links, lid = self.topo.links, self.topo.link_id
                lat_u, bw_u = cost[u]
                keep = []
                for v in c:
                    lk = links[lid(u, v)]
                    lat_v, bw_v = cost[v]
                    if (not _less(lat_u, lk.latency_s + lat_v)
                            and min(lk.bandwidth_bytes_per_s, bw_v) >= bw_u * (1 - _REL_TOL)):
                        keep.append(v)
                c = keep
            cands = self._next[key] = tuple(c)
        return cands

    def _search(self, domain: str, src: str, dst: str) -> list[str]:
        anchor = self._anchor(domain, dst)
        if src not in self._distances(domain, anchor) and src != dst:
            raise ConfigError("topology", f"no path from {src} to {dst} in {self.topo.name!r}",
                              "connect them, or check which nodes may forward traffic")
        path = [src]
        u = src
        hop = 0
        while u != anchor and u != dst:
            cands = self._next_hops(domain, anchor, u)
            u = cands[0] if len(cands) == 1 else cands[_stable_hash(src, dst, str(hop)) % len(cands)]
            path.append(u)
            hop += 1
        if u != dst:
            path.append(dst)
        return path

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
    def node_path(self, src: str, dst: str) -> list[str]:
        if src == dst:
            return [src]
        nodes = self.topo.nodes
        s_srv, d_srv = nodes[src].server, nodes[dst].server
        if s_srv is not None and d_srv is not None and s_srv != d_srv:
            nic_s = src if nodes[src].kind is NodeKind.NIC else self.nic_of(src)
            nic_d = dst if nodes[dst].kind is NodeKind.NIC else self.nic_of(dst)
            if nic_s is None or nic_d is None:
                missing = s_srv if nic_s is None else d_srv
                raise ConfigError("server", f"server {missing!r} has no NIC reachable from its GPUs",
                                  "give the server template at least one NIC")
            head = self._walk(s_srv, src, nic_s) if src != nic_s else (src,)
            mid = self._walk(_NET, nic_s, nic_d)
            tail = self._walk(d_srv, nic_d, dst) if dst != nic_d else (dst,)
            return [*head[:-1], *mid, *tail[1:]]
        if s_srv is not None and s_srv == d_srv:
            return list(self._walk(s_srv, src, dst))
        return list(self._walk(_ALL, src, dst))

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            path = self.node_path(src, dst)
            lid = self.topo.link_id
            r = tuple(lid(a, b) for a, b in zip(path, path[1:], strict=False))
            self._routes[key] = r
        return r
