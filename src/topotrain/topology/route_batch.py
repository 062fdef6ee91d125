"""Routing made cheaper, the routes unchanged (issue 40, frontier speed): many pairs at a time
(:func:`route_many_unkept`, what every path cache asks for), the test that lets a domain skip its cost pass
(:func:`uniform_links`), and D-mod-K's numbering of the destinations (:func:`destination_indices`). Helpers of
:class:`topotrain.topology.routing.Router`, kept apart from its rules."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from topotrain.topology.elements import NodeKind

if TYPE_CHECKING:
    from topotrain.topology.graph import Topology
    from topotrain.topology.routing import Router


def uniform_links(adj: Sequence[Sequence[int]], lids: Sequence[Sequence[int]], m: int, lat: Sequence[float],
                   bw: Sequence[float]) -> bool:
    """Whether every link between two of a domain's ``m`` members has one latency and one bandwidth (a fat-tree
    or rail network of one link type). Then every shortest-hop path between two members has the same total
    latency, bit for bit (the path costs add a link's latency to the rest's, ``l + (l + (… + 0.0))``, the same
    sum for every path of ``h`` hops) and the same bottleneck, so :meth:`Router._next_hops` keeps every
    shortest-hop next hop without evaluating the costs: the same next hops, without the per-anchor pass."""
    ids = [k for row, mine in zip(adj[:m], lids[:m], strict=True) for j, k in zip(row, mine, strict=True) if j < m]
    if not ids:
        return True
    lat0, bw0 = lat[ids[0]], bw[ids[0]]
    return math.isfinite(lat0) and bw0 > 0 and all(lat[k] == lat0 and bw[k] == bw0 for k in ids)


def route_many_unkept(router: Router, pairs: Iterable[tuple[str, str]]) -> list[tuple[int, ...]]:
    """``router.route_many(pairs, keep=False)``: ``router._links`` of every pair, with what depends on one end
    alone (its server and NIC, its walk to or from that NIC) looked up once per end and call, not once per pair:
    the same steps in the same order (both NICs, then the walk to the first, the middle, the walk from the
    second), so the same routes, memos and errors; a pair it does not cover (one server, an end outside any
    server or without a NIC) goes through ``_links`` itself."""
    routes = router._routes
    nodes = router.topo.nodes
    ends: dict[str, tuple[str, str] | None] = {}
    heads: dict[str, tuple[int, ...]] = {}
    tails: dict[str, tuple[int, ...]] = {}
    out = []
    for src, dst in pairs:
        r = routes.get((src, dst))
        if r is None:
            e_s = ends[src] if src in ends else _end(router, nodes[src], src, ends)
            e_d = ends[dst] if dst in ends else _end(router, nodes[dst], dst, ends)
            if e_s is None or e_d is None or e_s[0] == e_d[0]:
                r = router._links(src, dst, keep=False)
            else:  # two servers, a NIC on each: _links's first case
                head = heads.get(src)
                if head is None:
                    head = heads[src] = router._walk(e_s[0], src, e_s[1]) if src != e_s[1] else ()
                mid = router._mid(e_s[1], e_d[1])
                tail = tails.get(dst)
                if tail is None:
                    tail = tails[dst] = router._walk(e_d[0], e_d[1], dst) if dst != e_d[1] else ()
                r = head + mid + tail
        out.append(r)
    return out


def _end(router: Router, node: object, name: str, ends: dict[str, tuple[str, str] | None]) -> tuple[str, str] | None:
    """(server, NIC) of an endpoint in a server with a NIC it reaches (itself if it is a NIC, else
    ``router.nic_of``), kept in ``ends``; None for one outside any server or without a NIC."""
    got: tuple[str, str] | None = None
    server = getattr(node, "server", None)
    if server is not None:
        nic = name if getattr(node, "kind", None) is NodeKind.NIC else router.nic_of(name)
        if nic is not None:
            got = (server, nic)
    ends[name] = got
    return got


def destination_indices(topo: Topology) -> dict[str, int]:
    """D-mod-K's ``d`` of every node: its index among the topology's nodes of its kind, taken leaf switch by leaf
    switch — the NICs a builder attached to a switch (``meta["nic_switch"]``) in the order of those switches,
    each switch's NICs in the topology's order (its ports), every other node in the topology's order. This is
    how OpenSM's fat-tree engine walks the destinations (osm_ucast_ftree.c: leaf switch by leaf switch, port by
    port) and the numbering Zahavi's non-blocking proof assumes (the k/2 hosts of a leaf are consecutive): on
    a fat-tree whose servers have one NIC the topology's order already is it, on a rail-optimized network
    (a server's NICs on different rail switches) it is not."""
    pos = {n: i for i, n in enumerate(topo.nodes)}
    attached = topo.meta.get("nic_switch")
    leaf: Mapping[str, str] = attached if isinstance(attached, Mapping) else {}

    def where(n: str) -> tuple[int, int]:
        sw = leaf.get(n)
        return (pos[sw] if sw in pos else pos[n], pos[n])

    kinds: dict[NodeKind, int] = {}
    index: dict[str, int] = {}
    nodes = topo.nodes
    for n in sorted(nodes, key=where):
        kind = nodes[n].kind
        index[n] = kinds.get(kind, 0)
        kinds[kind] = index[n] + 1
    return index
