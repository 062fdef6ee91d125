"""D-mod-K routing (``routing: d-mod-k``): forwarding by destination alone, non-blocking shifts on fat-trees."""

from __future__ import annotations

from collections import Counter

import pytest

from topotrain.collectives.registry import build_schedule
from topotrain.network.registry import get_model
from topotrain.scenario.load import resolve, resolved, scenario_from_dict
from topotrain.topology.builders import build_fat_tree
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

NIC_BW = 12.5e9  # 100 Gb/s, the fabric's links too


def fat_tree(n: int, k: int, routing: str | None, core_latency_s: float | None = None) -> tuple[Topology, list[str]]:
    """``n`` single-GPU servers on a k-ary fat-tree (full when n = k³/4), ties broken by ``routing`` (None: the
    default), and their NICs; with ``core_latency_s`` the links of one core switch are slower to cross (a fabric
    that is not uniform)."""
    topo = Topology("t")
    groups = []
    for i in range(n):
        nic = topo.add_node(f"s{i}/nic", "nic", server=f"s{i}", bandwidth_bytes_per_s=NIC_BW)
        gpu = topo.add_node(f"s{i}/gpu", "gpu", server=f"s{i}", nic=nic)
        topo.add_link(gpu, nic, 4 * NIC_BW, 0.5e-6)
        groups.append([nic])
    build_fat_tree(topo, groups, link_bandwidth_bytes_per_s=NIC_BW, k=k)
    if core_latency_s is not None:
        core = sorted(n for n in topo.nodes if "core" in n)[0]
        for i, lk in enumerate(topo._links):
            if core in (lk.src, lk.dst):
                topo._links[i] = type(lk)(lk.id, lk.src, lk.dst, lk.bandwidth_bytes_per_s, core_latency_s, lk.kind)
    if routing is not None:
        topo.meta["routing"] = routing
    topo.validate()
    return topo, [g[0] for g in groups]


def out_links_by_destination(topo: Topology, nics: list[str]) -> dict[tuple[str, str], set[int]]:
    """(switch, destination) -> the links that switch forwards to the destination on, over all sources."""
    seen: dict[tuple[str, str], set[int]] = {}
    for d in nics:
        for s in nics:
            for lid in topo.route(s, d):
                link = topo.links[lid]
                if link.src.startswith("sw/"):
                    seen.setdefault((link.src, d), set()).add(lid)
    return seen


def worst_link_load_of_shifts(topo: Topology, nics: list[str], shifts: list[int] | None = None) -> list[int]:
    """For every shift s (``nic i → nic (i+s) mod n``; all of them by default), the most flows any directed
    link carries."""
    n = len(nics)
    return [max(Counter(lid for i in range(n) for lid in topo.route(nics[i], nics[(i + s) % n])).values())
            for s in (range(1, n) if shifts is None else shifts)]


def test_d_mod_k_forwards_by_destination_alone() -> None:
    """One output port per destination at every switch, whatever the source (a forwarding table)."""
    for n, k in ((16, 4), (54, 6), (40, 6)):
        topo, nics = fat_tree(n, k, "d-mod-k")
        assert all(len(out) == 1 for out in out_links_by_destination(topo, nics).values())
    hashed, nics_h = fat_tree(54, 6, None)  # per-pair hashing does not: the check can fail
    assert any(len(out) > 1 for out in out_links_by_destination(hashed, nics_h).values())


@pytest.mark.parametrize(("k", "shifts"), [(4, None), (6, None), (12, [1, 5, 6, 7, 36, 37, 100, 215, 431])])
def test_d_mod_k_shift_permutations_are_contention_free_on_a_full_fat_tree(k: int, shifts: list[int] | None) -> None:
    """Zahavi (2010): on a full k-ary fat-tree, D-mod-K routes every shift permutation without two flows on a
    link (all shifts; for k = 12, whose switch names sort out of numeric order, a sample); the per-pair hash
    puts two on one link for some shift."""
    n = k**3 // 4
    topo, nics = fat_tree(n, k, "d-mod-k")
    worst = worst_link_load_of_shifts(topo, nics, shifts)
    assert worst == [1] * len(worst)
    hashed, nics_h = fat_tree(n, k, None)
    assert max(worst_link_load_of_shifts(hashed, nics_h, shifts)) >= 2


def test_d_mod_k_ring_allreduce_runs_at_the_alpha_beta_time() -> None:
    """A ring over every 5th server (rank r on server 5r mod 54) steps by a shift of 5 each time: routed D-mod-K,
    no two flows ever share a link, so the flow model's time is the alpha-beta time of the same schedule (closed
    form, the analytical model, which prices each step at its most loaded link); hashed, flows collide (4 on a
    link) and the ring is slower in both."""
    times = {}
    for routing in ("d-mod-k", None):
        topo, _ = fat_tree(54, 6, routing)
        ranks = [topo.gpus[(5 * r) % 54] for r in range(54)]
        sched = build_schedule("allreduce", "ring", topo, ranks, 64 << 20)
        times[routing] = (get_model("flow").time_schedule(sched, topo).time_s,
                          get_model("analytical").time_schedule(sched, topo).time_s)
    flow, alpha_beta = times["d-mod-k"]
    assert flow == pytest.approx(alpha_beta, rel=1e-9)
    flow_hashed, alpha_beta_hashed = times[None]
    assert flow_hashed > 1.5 * flow and alpha_beta_hashed > 1.5 * alpha_beta  # both models see the collisions


def _scenario(link: str = "ib-hdr-200g", **network: str) -> dict[str, object]:
    return {"cluster": {"server": "nvswitch-8", "servers": 4,
                        "network": {"topology": "fat-tree", "link": link, **network}},
            "model": "gpt3-175b", "batch": 8, "plan": {"tp": 8, "pp": 4}}


def test_routing_is_checked_and_the_default_is_the_fabrics_own() -> None:
    """InfiniBand links: d-mod-k by default (the subnet manager's); Ethernet: the per-switch hash; either can be
    named, and ``--resolved`` shows the one used."""
    def cluster(link: str = "ib-hdr-200g", **network: str) -> Topology:
        return scenario_from_dict(_scenario(link, **network)).cluster.topology

    default, hashed, dmodk = cluster(), cluster(routing="ECMP"), cluster(routing="d_mod_k")
    assert default.meta["routing"] == "d-mod-k" and "routing" not in hashed.meta
    pairs = [(a, b) for a in default.gpus[::5] for b in default.gpus[::3] if a != b]
    assert [default.route(a, b) for a, b in pairs] == [dmodk.route(a, b) for a, b in pairs]
    assert [default.route(a, b) for a, b in pairs] != [hashed.route(a, b) for a, b in pairs]
    ethernet = cluster("eth-100g")
    assert "routing" not in ethernet.meta  # ecmp, the topology's default
    assert cluster("eth-100g", routing="ecmp-shared-seed").meta["routing"] == "ecmp-shared-seed"
    # no network link named: the NICs' ports say (nvswitch-8's are HDR InfiniBand; --set cluster.nic=eth-100g)
    no_link = _scenario()
    del no_link["cluster"]["network"]["link"]  # type: ignore[index]
    assert scenario_from_dict(no_link).cluster.topology.meta["routing"] == "d-mod-k"
    no_link["cluster"]["nic"] = "eth-100g"  # type: ignore[index]
    assert "routing" not in scenario_from_dict(no_link).cluster.topology.meta
    for link, want in (("ib-hdr-200g", "d-mod-k"), ("eth-100g", "ecmp")):
        assert resolved(resolve(_scenario(link)))["cluster"]["network"]["routing"] == want
    assert resolved(resolve(_scenario(routing="ecmp-shared-seed")))["cluster"]["network"]["routing"] == \
        "ecmp-shared-seed"
    with pytest.raises(ConfigError) as err:
        cluster(routing="dmodk")
    assert err.value.field == "cluster.network.routing" and "d-mod-k" in str(err.value)
    with pytest.raises(ConfigError) as err:  # a graph file's meta names it too
        fat_tree(16, 4, "minhop")
    assert err.value.field == "routing"
    topo = Topology("t")  # refused before anything is frozen: the meta can still be put right
    topo.add_node("g", "gpu")
    topo.meta["routing"] = "minhop"
    with pytest.raises(ConfigError):
        topo.freeze()
    assert not topo.frozen
    topo.meta["routing"] = "d-mod-k"
    assert topo.freeze().frozen


def test_d_mod_k_counts_destinations_leaf_by_leaf_on_a_rail_optimized_network() -> None:
    """A rail-optimized network puts a server's NICs on different rail switches (the leaves). D-mod-K numbers
    destinations leaf by leaf (OpenSM's fat-tree engine, Zahavi's numbering), so the 8 flows of a ring's step
    between servers (GPU 7 of server k → GPU 0 of server k+1, rail 7 → rail 0) come down 8 different spines:
    numbered server by server, every destination would be 0 mod 8 and all 8 flows would share one spine."""
    spec = {"cluster": {"server": "nvswitch-8", "servers": 8,
                        "network": {"topology": "rail-optimized", "link": "ib-hdr-200g"}},
            "model": "gpt3-1.3b", "batch": 8, "plan": {"tp": 8}}
    topo = scenario_from_dict(spec).cluster.topology
    assert topo.meta["routing"] == "d-mod-k"
    spines = []
    for k in range(8):
        path = [topo.links[i].dst for i in topo.route(f"s{k}/gpu7", f"s{(k + 1) % 8}/gpu0")]
        spines += [n for n in path if n.startswith("sw/") and "rail" not in n]
    assert len(spines) == 8 and len(set(spines)) == 8, spines


def test_d_mod_k_walk_memo_changes_no_route() -> None:
    """The D-mod-K walks' memo (the rest of a walk from a node, per destination and ties' product) returns the
    routes a walk without it finds, in any order of queries: 48 servers on a partly filled k = 8 fat-tree, every
    pair, asked forward and backward on fresh routers and on one whose memo keeps nothing."""
    from topotrain.topology import routing

    class Forgetful(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: object, value: object) -> None:
            pass

    pairs = None
    answers = []
    for order, forget in ((1, False), (-1, False), (1, True)):
        topo, nics = fat_tree(48, 8, "d-mod-k")
        router = topo.router
        if forget:
            for dom in router._domains.values():
                dom.suffix = Forgetful()
            orig = routing._Domain.__init__

            def init(self: routing._Domain, *a: object, orig: object = orig, **k: object) -> None:
                orig(self, *a, **k)  # type: ignore[operator]
                self.suffix = Forgetful()

            routing._Domain.__init__ = init  # type: ignore[method-assign]
        try:
            pairs = [(s, d) for s in nics for d in nics if s != d][::order]
            answers.append({p: topo.route(*p) for p in pairs})
            if not forget:  # the memo was used
                assert sum(len(dom.suffix) for dom in router._domains.values()) > len(nics)
        finally:
            if forget:
                routing._Domain.__init__ = orig  # type: ignore[method-assign]
    assert answers[0] == answers[1] == answers[2]
    assert len(set(answers[0].values())) > len(nics)  # real, distinct routes
