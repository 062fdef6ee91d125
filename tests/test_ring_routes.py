"""Closed-form routes on a ring of routers (topology/ring_routes.py) equal the router's search, pair by pair."""

from __future__ import annotations

import itertools

import pytest

from topotrain.scenario.cluster import cluster_from_dict
from topotrain.topology import routing
from topotrain.topology.graph import Topology
from topotrain.topology.ring_routes import RingRoutes
from topotrain.topology.routing import Router


def ring(routers: int, servers: int, server: str, routing: str, link: str = "eth-100g") -> Topology:
    return cluster_from_dict({"server": server, "servers": servers, "network": {
        "topology": "ring", "routers": routers, "link": link, "latency": "1us", "routing": routing}}).topology


@pytest.mark.parametrize("routing", ["ecmp", "d-mod-k", "ecmp-shared-seed"])
@pytest.mark.parametrize(("routers", "servers", "server"), [
    (3, 3, "single-gpu"), (4, 4, "single-gpu"), (6, 12, "single-gpu"), (7, 7, "single-gpu"), (8, 8, "single-gpu"),
    (4, 4, "nvswitch-8")])
def test_closed_form_equals_the_search(routing: str, routers: int, servers: int, server: str) -> None:
    topo = ring(routers, servers, server, routing)
    searched = Router(topo, routing)
    searched._ring.append(None)  # the search everywhere
    assert topo.router._ring == [] or topo.router._ring[0] is not None
    gpus = topo.gpus
    pairs = list(itertools.permutations(gpus, 2))
    assert topo.router.route_many(pairs) == searched.route_many(pairs)
    assert isinstance(topo.router._ring[0], RingRoutes)  # the closed form answered


def test_a_ring_it_cannot_answer_is_searched() -> None:
    """Unequal ring links (one degraded), a failed link, or two routers: the router searches."""
    topo = ring(6, 6, "single-gpu", "ecmp")
    slow = topo.with_degraded_links([("sw/router0", "sw/router1", 0.5)])
    failed = topo.with_degraded_links([("sw/router0", "sw/router1", 0.0)])
    two = ring(2, 2, "single-gpu", "ecmp")
    for t in (slow, failed, two):
        assert RingRoutes.of(t, t.router._first_tie) is None
    assert RingRoutes.of(topo, topo.router._first_tie) is not None
    gpus = slow.gpus
    pairs = list(itertools.permutations(gpus, 2))
    searched = Router(slow, "ecmp")
    searched._ring.append(None)
    assert slow.router.route_many(pairs) == searched.route_many(pairs)


def test_routes_not_kept_by_the_router_take_the_closed_form_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``route_many(keep=False)`` (the path cache of every schedule) answers a ring in closed form, as ``route``
    does: on a 1,024-router ring the search took 20 of a collective's 24 s when it did not."""
    topo = ring(8, 8, "single-gpu", "ecmp")
    pairs = list(itertools.permutations(topo.gpus, 2))
    want = Router(topo, "ecmp").route_many(pairs)
    search = Router._search

    def no_network_search(self: Router, domain: str, src: str, dst: str) -> tuple[int, ...]:
        if domain == routing._NET:  # a GPU's way to its NIC inside its server is still searched
            raise AssertionError("searched a ring the closed form answers")
        return search(self, domain, src, dst)

    monkeypatch.setattr(Router, "_search", no_network_search)
    assert Router(topo, "ecmp").route_many(pairs, keep=False) == want
