"""Routes between NICs on a ring of routers in closed form: the path :class:`~topotrain.topology.routing.Router`
would search, without the search.

On a ring of ``n`` routers (``n >= 3``, the ``ring`` network of :mod:`topotrain.topology.builders`), the
shortest-hop path from router ``i`` to router ``j`` goes the shorter way round: ``k = (j - i) mod n`` links
clockwise when ``k < n - k``, ``n - k`` links counter-clockwise when ``k > n - k``, and every node on it has a
single next hop (the hop count falls by one only that way). Only when ``k = n / 2`` (``n`` even) are there two
paths, tied on hops; with every ring link of one latency and one bandwidth (checked) they tie on latency and
bottleneck too (the router's path costs add the same numbers in the same order either way), so the route's
one tie is at the source router between its two ring neighbours sorted by name, broken by the topology's
routing mode exactly as :meth:`Router._search` breaks it (the caller's ``tie`` function). A NIC hangs on one
router (its only forwarding neighbour), so its routes start and end with its link to that router.

The router's search costs a breadth-first search and a path-cost pass per destination router (each up to
``n / 2`` levels) and a walk of up to ``n / 2`` hops per pair in Python; here a route is two slices of
precomputed link lists. ``tests/test_ring_routes.py`` checks every pair of small rings against the search,
in every routing mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from topotrain.topology.elements import NodeKind

if TYPE_CHECKING:
    from topotrain.topology.graph import Topology

#: ``tie(src, dst, switch, hop, count)``: which of ``count`` tied next hops (sorted by name) the route
#: ``src → dst`` takes at ``switch``, the ``hop``-th node of its walk (the router's tie rule).
TieRule = Callable[[str, str, str, int, int], int]


class RingRoutes:
    """Closed-form NIC-to-NIC routes of one frozen ring topology (:meth:`of` says whether it is one)."""

    __slots__ = ("n", "pos", "router_of", "nic_up", "nic_down", "cw2", "ccw2", "names", "tie")

    def __init__(self, topo: Topology, routers: list[str], nic_router: dict[str, str], tie: TieRule) -> None:
        n = self.n = len(routers)
        self.names = routers
        self.pos = {r: i for i, r in enumerate(routers)}
        self.router_of = nic_router
        self.nic_up = {nic: topo.link_id(nic, r) for nic, r in nic_router.items()}
        self.nic_down = {nic: topo.link_id(r, nic) for nic, r in nic_router.items()}
        cw = [topo.link_id(routers[i], routers[(i + 1) % n]) for i in range(n)]
        ccw = [topo.link_id(routers[i], routers[(i - 1) % n]) for i in range(n)]
        #: clockwise links, twice: the k links from router i are cw2[i:i + k]
        self.cw2 = cw + cw
        #: counter-clockwise links from router n-1 down to router 0, twice: the k links from router i are
        #: ccw2[n-1-i:n-1-i + k]
        rev = ccw[::-1]
        self.ccw2 = rev + rev
        self.tie = tie

    @classmethod
    def of(cls, topo: Topology, tie: TieRule) -> RingRoutes | None:
        """The closed form of ``topo``'s NIC-to-NIC routes if it is a ring of ``n >= 3`` routers with no failed
        link, every ring link of one latency and one bandwidth, every router forwarding, and every NIC a
        non-forwarding stub on one router (checked on the graph, not only the builder's record); else None."""
        ring = topo.meta.get("ring")
        nic_switch = topo.meta.get("nic_switch")
        if not isinstance(ring, dict) or not isinstance(nic_switch, dict) or topo.failed_links:
            return None
        routers = ring.get("switches")
        if not isinstance(routers, list) or len(routers) < 3 or len(set(routers)) != len(routers):
            return None
        nodes, adj = topo.nodes, topo.adjacency
        n = len(routers)
        pos = {r: i for i, r in enumerate(routers)}
        lat, cap = topo.latency_s, topo.capacity_bytes_per_s
        ring_ids: list[int] = []
        for i, r in enumerate(routers):
            nd = nodes.get(r)
            if nd is None or nd.kind is not NodeKind.SWITCH or not nd.transit or nd.server is not None:
                return None
            peers = {routers[(i - 1) % n], routers[(i + 1) % n]}
            for v in adj[r]:
                vd = nodes[v]
                if v in pos:
                    if v not in peers:
                        return None
                    ring_ids.append(topo.link_id(r, v))
                elif vd.kind is not NodeKind.NIC or nic_switch.get(v) != r:
                    return None  # anything else on a router (a switch, a host) may carry paths: search
        if len({float(lat[k]) for k in ring_ids}) != 1 or len({float(cap[k]) for k in ring_ids}) != 1:
            return None
        nic_router: dict[str, str] = {}
        for nic, r in nic_switch.items():
            nd = nodes.get(nic)
            if nd is None or nd.kind is not NodeKind.NIC or nd.transit or r not in pos:
                return None
            # in the network's domain (nodes of no server, and NICs) a NIC's only neighbour is its router
            if [v for v in adj[nic] if nodes[v].server is None or nodes[v].kind is NodeKind.NIC] != [r]:
                return None
            nic_router[nic] = r
        return cls(topo, list(routers), nic_router, tie)

    def walk(self, src: str, dst: str) -> tuple[int, ...] | None:
        """Directed links of the route ``src → dst`` between two NICs of the ring (None: not two of its
        NICs, the caller searches)."""
        rs, rd = self.router_of.get(src), self.router_of.get(dst)
        if rs is None or rd is None or src == dst:
            return None
        n, i, j = self.n, self.pos[rs], self.pos[rd]
        k = (j - i) % n
        if k == 0:
            return (self.nic_up[src], self.nic_down[dst])
        cw = 2 * k < n
        if 2 * k == n:  # two shortest paths, tied: the source router chooses between its neighbours by name
            left, right = self.names[(i - 1) % n], self.names[(i + 1) % n]
            first = sorted((left, right))
            cw = first[self.tie(src, dst, rs, 1, 2)] == right
        if cw:
            mid = self.cw2[i:i + k]
        else:
            start = n - 1 - i
            mid = self.ccw2[start:start + n - k]
        return (self.nic_up[src], *mid, self.nic_down[dst])
