"""Routing made cheaper without changing a route (issue 40, frontier speed): a domain's fringe read from its
members' side, the cost pass skipped on uniform domains, and the bounded NIC-to-NIC memo of
``route_many(keep=False)``. Each is compared with the path it replaces, every pair of the topology."""

from __future__ import annotations

import pytest

from test_routing_dmodk import NIC_BW
from test_routing_dmodk import fat_tree as dmodk_fat_tree
from topotrain.scenario.load import scenario_from_dict
from topotrain.topology import routing
from topotrain.topology.graph import Topology


def fat_tree(n: int, k: int, routing_mode: str, core_latency_s: float | None = None) -> tuple[Topology, list[str]]:
    """The D-mod-K tests' fat-tree (``n`` single-GPU servers, ties broken by ``routing_mode``, optionally one slower
    core switch) and its GPUs."""
    topo, _ = dmodk_fat_tree(n, k, routing_mode, core_latency_s)
    return topo, [f"s{i}/gpu" for i in range(n)]


def all_routes(topo: Topology, gpus: list[str]) -> dict[tuple[str, str], tuple[int, ...]]:
    return {(s, d): topo.route(s, d) for s in gpus for d in gpus if s != d}


@pytest.mark.parametrize("mode", ["d-mod-k", "ecmp", "ecmp-shared-seed"])
@pytest.mark.parametrize(("n", "k"), [(48, 8), (54, 6)])  # a partly filled k = 8 tree, a full k = 6 tree
def test_uniform_domains_skip_the_cost_pass_and_route_the_same(mode: str, n: int, k: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fat-tree of one link type the next hops are taken without the per-anchor cost pass; every pair's
    route is the one the cost pass gives (forced by declaring no domain uniform)."""
    topo, gpus = fat_tree(n, k, mode)
    fast = all_routes(topo, gpus)
    net = topo.router._domains[routing._NET]
    assert net.uniform and not net.cost  # the fast path ran: no anchor's costs were evaluated
    monkeypatch.setattr(routing, "uniform_links", lambda *a: False)
    topo2, _ = fat_tree(n, k, mode)
    slow = all_routes(topo2, gpus)
    assert topo2.router._domains[routing._NET].cost  # the cost pass ran
    assert fast == slow
    assert len(set(fast.values())) == len(fast)  # distinct, real routes


def test_a_fabric_with_one_slower_switch_is_not_uniform_and_avoids_it() -> None:
    """One core switch with slower links: the domain is not uniform, the cost pass runs and no shortest path
    that could avoid that core crosses it (the check can fail: hop counts alone would use it)."""
    topo, gpus = fat_tree(16, 4, "d-mod-k", core_latency_s=1e-3)
    routes = all_routes(topo, gpus)
    net = topo.router._domains[routing._NET]
    assert not net.uniform and net.cost
    core = sorted(n for n in topo.nodes if "core" in n)[0]
    assert not any(topo.links[i].dst == core for r in routes.values() for i in r)
    plain, _ = fat_tree(16, 4, "d-mod-k")
    assert any(plain.links[i].dst == core for r in all_routes(plain, gpus).values() for i in r)


def reference_rows(topo: Topology, dom: routing._Domain) -> list[tuple[list[str], list[int]]]:
    """Every indexed node's neighbours and links as the domain should hold them, read the slow way: a member's
    all, a fringe node's to members only, by scanning its whole adjacency (failed links are in neither)."""
    members = set(dom.names[:dom.n_members])
    rows = []
    for i, n in enumerate(dom.names):
        vs = [v for v in topo.adjacency[n] if i < dom.n_members or v in members]
        rows.append((vs, [topo.link_id(n, v) for v in vs]))
    return rows


def test_fringe_rows_read_from_the_members_side_are_the_scanned_ones() -> None:
    """Server domains on a rail-optimized network (each NIC on a rail switch of large radix: the fringe) and on
    a fat-tree with a failed link: every row of every domain equals the full scan."""
    spec = {"cluster": {"server": "nvswitch-8", "servers": 8,
                        "network": {"topology": "rail-optimized", "link": "ib-hdr-200g"}},
            "model": "gpt3-1.3b", "batch": 8, "plan": {"tp": 8}}
    rail = scenario_from_dict(spec).cluster.topology
    tree, gpus = fat_tree(48, 8, "d-mod-k")
    edge = next(v for v in tree.adjacency["s0/nic"] if v.startswith("sw/"))
    up = next(v for v in tree.adjacency[edge] if "agg" in v)
    failed = tree.with_degraded_links([(edge, up, 0.0)])
    assert failed.failed_links
    for topo, pairs in ((rail, [("s0/gpu0", "s5/gpu3"), ("s3/gpu7", "s1/gpu0")]),
                        (failed, [(gpus[0], gpus[-1]), (gpus[5], gpus[9])])):
        for s, d in pairs:
            topo.route(s, d)
        doms = topo.router._domains
        assert len(doms) >= 3 and any(dom.n_members < len(dom.names) for dom in doms.values())
        for dom in doms.values():
            got = [([dom.names[j] for j in dom.adj[i]], list(dom.lids[i])) for i in range(len(dom.names))]
            assert got == reference_rows(topo, dom)


def test_route_many_without_keeping_uses_a_bounded_memo_and_routes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """``route_many(keep=False)`` keeps NIC-to-NIC walks in a memo emptied past its bound: with a bound of 5,
    asked twice over, every route is ``route``'s."""
    monkeypatch.setattr(routing, "_MIDS_MAX", 5)
    topo, gpus = fat_tree(48, 8, "d-mod-k")
    pairs = [(s, d) for s in gpus[:12] for d in gpus if s != d]
    got = topo.router.route_many(pairs + pairs[::-1], keep=False)
    assert 0 < len(topo.router._mids) <= 5 and not topo.router._routes
    ref, _ = fat_tree(48, 8, "d-mod-k")
    assert got == [ref.route(s, d) for s, d in pairs + pairs[::-1]]


def test_route_many_without_keeping_is_links_of_every_pair() -> None:
    """The batch path of ``route_many(keep=False)`` (each end's NIC and walk looked up once) against ``_links``
    pair by pair on a fresh router: GPUs and NICs of different servers, a GPU and its own NIC, a node to
    itself, routes the router already keeps; and a server without a NIC fails as ``_links`` does."""
    from topotrain.util.errors import ConfigError

    topo, gpus = fat_tree(48, 8, "ecmp")
    ends = gpus[:10] + [f"s{i}/nic" for i in range(0, 48, 7)]
    pairs = [(s, d) for s in ends for d in ends] + [("s3/gpu", "s3/nic"), ("s3/nic", "s3/gpu")]
    topo.route("s1/gpu", "s2/gpu")  # kept: returned as kept
    got = topo.router.route_many(pairs, keep=False)
    ref, _ = fat_tree(48, 8, "ecmp")
    assert got == [ref.router._links(s, d, keep=False) for s, d in pairs]
    assert sum(len(r) > 4 for r in got) > 100

    lonely = Topology("t")
    gpu = lonely.add_node("a/gpu", "gpu", server="a")
    other = lonely.add_node("b/gpu", "gpu", server="b")
    nic = lonely.add_node("b/nic", "nic", server="b", bandwidth_bytes_per_s=NIC_BW)
    sw = lonely.add_node("sw", "switch")
    lonely.add_link(gpu, sw, NIC_BW)
    lonely.add_link(other, nic, NIC_BW)
    lonely.add_link(nic, sw, NIC_BW)
    lonely.validate()
    errors = []
    for call in (lambda: lonely.router.route_many([(gpu, other)], keep=False), lambda: lonely.route(gpu, other)):
        with pytest.raises(ConfigError) as err:
            call()
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "no NIC" in errors[0]
