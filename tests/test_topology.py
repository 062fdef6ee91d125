"""Network builders, graph files and summary metrics, checked against closed forms."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from topotrain.report.draw import draw_topology
from topotrain.topology.builders import (
    FABRIC_LINK_KIND,
    NETWORKS,
    NetworkBuilder,
    build_bigraph,
    build_dragonfly,
    build_fat_tree,
    build_leaf_spine,
    build_network,
    build_rail_optimized,
    build_ring,
    build_torus,
)
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import FrozenTopologyError, Topology
from topotrain.topology.io import load_graph, load_graph_file, save_graph
from topotrain.topology.metrics import summarize
from topotrain.topology.routing import switch_hash
from topotrain.util.errors import ConfigError

NIC_BW = 12.5e9  # 100 Gb/s
GPU_NIC_BW = 32e9


def make_servers(topo: Topology, n: int, nics: int = 1, nic_bw: float = NIC_BW) -> list[list[str]]:
    """n servers; one GPU per NIC. With several NICs, GPUs and NICs hang off one PCIe switch."""
    groups = []
    for i in range(n):
        s = f"s{i}"
        grp = []
        pcie = topo.add_node(f"{s}/pcie", "pcie", server=s) if nics > 1 else None
        for r in range(nics):
            nic = topo.add_node(f"{s}/nic{r}", "nic", server=s, bandwidth_bytes_per_s=nic_bw, rail=r)
            gpu = topo.add_node(f"{s}/gpu{r}", "gpu", server=s, nic=nic)
            if pcie is None:
                topo.add_link(gpu, nic, GPU_NIC_BW, 0.5e-6)
            else:
                topo.add_link(gpu, pcie, GPU_NIC_BW, 0.5e-6)
                topo.add_link(nic, pcie, GPU_NIC_BW, 0.5e-6)
            grp.append(nic)
        groups.append(grp)
    return groups


def cluster(builder: NetworkBuilder, n: int, nics: int = 1, **params: Any) -> tuple[Topology, list[str]]:
    topo = Topology("t")
    groups = make_servers(topo, n, nics)
    builder(topo, groups, link_bandwidth_bytes_per_s=NIC_BW, **params)
    topo.validate()
    return topo, [nic for g in groups for nic in g]


def switches(topo: Topology) -> list[str]:
    return topo.nodes_of_kind(NodeKind.SWITCH)


def fabric_links(topo: Topology) -> int:
    return sum(1 for lk in topo.links if lk.kind == FABRIC_LINK_KIND) // 2


def inter_switch_hops(topo: Topology, route: tuple[int, ...]) -> int:
    return sum(1 for i in route if topo.links[i].kind == FABRIC_LINK_KIND)


# ---- fat-tree --------------------------------------------------------------------------------------
def test_fat_tree_counts_match_al_fares_formulas() -> None:
    topo, nics = cluster(build_fat_tree, 16, k=4)
    assert len(switches(topo)) == 5 * 4**2 // 4 == 20
    assert len(nics) == 4**3 // 4 == 16
    assert fabric_links(topo) == 4**3 // 2  # k³/4 edge–agg + k³/4 agg–core
    assert {topo.nodes[s].attrs["tier"] for s in switches(topo)} == {1, 2, 3}
    assert all(topo.nodes[s].attrs["tier"] == 3 for s in topo.meta["fat_tree"]["core"])


def test_partly_filled_fat_tree_is_built_as_bought() -> None:
    """Issue 41 item 2: only the pods that hold endpoints (their k/2 aggregation switches, the edge switches
    that hold endpoints) and, for two or more pods, the (k/2)² cores."""
    one_pod, _ = cluster(build_fat_tree, 4, k=8)  # 4 endpoints: one edge switch of one pod, no core
    ft = one_pod.meta["fat_tree"]
    assert (ft["pods"], len(ft["edge"]), len(ft["aggregation"]), len(ft["core"])) == (1, 1, 4, 0)
    assert fabric_links(one_pod) == 4
    derived, _ = cluster(build_fat_tree, 17)  # 17 > 16 = k³/4 for k=4 → k=6: 2 of 6 pods (9 endpoints each)
    ft = derived.meta["fat_tree"]
    assert ft["k"] == 6 and (ft["pods"], len(ft["edge"]), len(ft["aggregation"]), len(ft["core"])) == (2, 6, 6, 9)
    assert len(switches(derived)) == 21 < ft["full_tree_switches"] == 45
    assert fabric_links(derived) == 6 * 3 + 6 * 3  # edge–agg inside the pods, agg–core


@pytest.mark.parametrize("routing", ["ecmp", "d-mod-k"])
def test_partly_filled_fat_tree_routes_as_the_whole_tree(routing: str) -> None:
    """The switches left out lie on no shortest path: every route between the endpoints is the whole tree's."""
    built = []
    for n in (17, 54):
        t = Topology("t")
        groups = make_servers(t, n)
        build_fat_tree(t, groups, link_bandwidth_bytes_per_s=NIC_BW, k=6)
        t.meta["routing"] = routing
        t.validate()
        built.append(t)
    part, whole = built
    nics = [f"s{i}/nic0" for i in range(17)]
    for a in nics:
        for b in nics:
            if a != b:
                hops = [(part.links[i].src, part.links[i].dst) for i in part.route(a, b)]
                assert hops == [(whole.links[i].src, whole.links[i].dst) for i in whole.route(a, b)]


def test_fat_tree_paths() -> None:
    topo, nics = cluster(build_fat_tree, 16, k=4)
    assert len(topo.route(nics[0], nics[1])) == 2  # same edge switch
    assert len(topo.route(nics[0], nics[2])) == 4  # same pod: edge-agg-edge
    for a, b in [(0, 4), (1, 15), (5, 10)]:  # different pods: edge-agg-core-agg-edge
        assert len(topo.route(nics[a], nics[b])) == 6
    assert len(topo.route("s0/gpu0", "s15/gpu0")) == 8


# ---- BiGraph ---------------------------------------------------------------------------------------
def test_bigraph_counts_and_paths() -> None:
    topo, nics = cluster(build_bigraph, 8, nics=4, switches=8)
    meta = topo.meta["bigraph"]
    upper, lower = set(meta["upper"]), set(meta["lower"])
    assert len(upper) == len(lower) == 4 and len(switches(topo)) == 8
    assert fabric_links(topo) == (8 // 2) ** 2
    assert meta["links_per_switch_pair"] == 1
    on = topo.meta["nic_switch"]
    per_switch = {sw: sum(1 for n in nics if on[n] == sw) for sw in upper | lower}
    assert set(per_switch.values()) == {4}  # M = 4 endpoints on every switch
    for srv in range(8):  # every server reaches both parts
        parts = {on[f"s{srv}/nic{r}"] in upper for r in range(4)}
        assert parts == {True, False}
    seen = set()
    for a, b in itertools.permutations(nics, 2):
        if topo.nodes[a].server == topo.nodes[b].server:
            continue  # stays on the server's own fabric
        r = topo.route(a, b)
        sa, sb = on[a], on[b]
        if sa == sb:
            kind, want = "same switch", 0
        elif (sa in upper) != (sb in upper):
            kind, want = "cross part", 1
        else:
            kind, want = "same part", 2
        seen.add(kind)
        assert inter_switch_hops(topo, r) == want, (a, b)
        assert len(r) == want + 2
    assert seen == {"same switch", "cross part", "same part"}


def test_bigraph_sizing_by_radix() -> None:
    topo, _ = cluster(build_bigraph, 8, nics=4, radix=8)  # k²/2 = 32 endpoints need k = 8 switches
    assert len(switches(topo)) == 8 and fabric_links(topo) == 8**2 // 4
    # default radix 32: 64 endpoints fit 4 switches of 16 down ports; 16 up ports bundle 8 per peer
    topo, _ = cluster(build_bigraph, 16, nics=4)
    assert len(switches(topo)) == 4
    assert topo.meta["bigraph"]["links_per_switch_pair"] == 8
    u, lo = topo.meta["bigraph"]["upper"][0], topo.meta["bigraph"]["lower"][0]
    assert topo.capacity_bytes_per_s[topo.link_id(u, lo)] == pytest.approx(8 * NIC_BW)
    with pytest.raises(ConfigError, match="switches"):
        cluster(build_bigraph, 8, nics=4, switches=4)  # 32 endpoints > 4·4/2
    with pytest.raises(ConfigError, match="even"):
        cluster(build_bigraph, 2, switches=5)
    with pytest.raises(ConfigError, match="radix"):
        cluster(build_bigraph, 40, radix=8)  # 40 > 8²/2


# ---- leaf-spine ------------------------------------------------------------------------------------
def test_leaf_spine_oversubscription_capacity() -> None:
    topo, nics = cluster(build_leaf_spine, 16, endpoints_per_leaf=4, oversubscription="2:1")
    meta = topo.meta["leaf_spine"]
    assert len(meta["leaves"]) == 4 and len(meta["spines"]) == 2  # spines = ceil(4 / 2)
    for leaf in meta["leaves"]:
        up = sum(topo.capacity_bytes_per_s[topo.link_id(leaf, sp)] for sp in meta["spines"])
        down = sum(topo.capacity_bytes_per_s[topo.link_id(n, leaf)] for n in nics
                   if topo.meta["nic_switch"][n] == leaf)
        assert up == pytest.approx(down / 2) == pytest.approx(2 * NIC_BW)
    s = summarize(topo)  # first half of GPUs = leaves 0 and 1: their uplinks are the cut
    assert s.bisection_bandwidth_bytes_per_s == pytest.approx(2 * 2 * NIC_BW)
    full, _ = cluster(build_leaf_spine, 16, endpoints_per_leaf=4)
    assert summarize(full).bisection_bandwidth_bytes_per_s == pytest.approx(8 * NIC_BW)


def test_leaf_spine_ecmp_is_deterministic_and_spreads() -> None:
    def spine_of_routes() -> dict[tuple[str, str], str]:
        topo, nics = cluster(build_leaf_spine, 16, endpoints_per_leaf=4, spines=4)
        on = topo.meta["nic_switch"]
        out = {}
        for a, b in itertools.permutations(nics, 2):
            if on[a] == on[b]:
                continue
            r = topo.route(a, b)
            spines = [topo.links[i].dst for i in r if topo.links[i].dst.startswith("sw/spine")]
            assert len(spines) == 1 and len(r) == 4
            out[(a, b)] = spines[0]
        return out

    first, second = spine_of_routes(), spine_of_routes()
    assert first == second
    counts = {sp: list(first.values()).count(sp) for sp in set(first.values())}
    assert len(counts) == 4
    assert min(counts.values()) > 0.15 * len(first)  # no spine starved (ideal share 0.25)
    # the documented rule: among the equal spines (sorted by name) the pair takes the one the per-switch hash
    # of the source's leaf picks (topotrain.topology.routing.switch_hash)
    spines = sorted(set(first.values()))
    topo, _ = cluster(build_leaf_spine, 16, endpoints_per_leaf=4, spines=4)
    for (a, b), spine in first.items():
        leaf = topo.meta["nic_switch"][a]
        assert spine == spines[switch_hash(leaf, a, b) % len(spines)], (a, b)


# ---- rail-optimized --------------------------------------------------------------------------------
def test_rail_optimized_same_rail_one_switch() -> None:
    topo, _ = cluster(build_rail_optimized, 4, nics=4)
    meta = topo.meta["rail_optimized"]
    assert meta["rails"] == 4 and meta["blocks"] == 1 and len(meta["spines"]) == 4
    for a, b in itertools.combinations(range(4), 2):
        r = topo.route(f"s{a}/nic1", f"s{b}/nic1")
        assert len(r) == 2 and topo.links[r[0]].dst == "sw/block0/rail1"
        assert len(topo.route(f"s{a}/nic0", f"s{b}/nic2")) == 4  # rail switch–spine–rail switch
    two, _ = cluster(build_rail_optimized, 4, nics=4, servers_per_block=2)
    assert two.meta["rail_optimized"]["blocks"] == 2 and len(switches(two)) == 8 + 2
    assert len(two.route("s0/nic3", "s1/nic3")) == 2
    assert len(two.route("s0/nic3", "s2/nic3")) == 4


# ---- torus and ring --------------------------------------------------------------------------------
def test_torus_hops_are_wrapped_manhattan_distance() -> None:
    dims = [4, 4]
    topo, nics = cluster(build_torus, 16, dims=dims)
    where = topo.meta["torus"]["vertex_of_nic"]
    assert fabric_links(topo) == 16 * 2
    for a, b in itertools.combinations(nics, 2):
        ca, cb = where[a], where[b]
        dist = sum(min(abs(x - y), n - abs(x - y)) for x, y, n in zip(ca, cb, dims, strict=True))
        assert len(topo.route(a, b)) == dist + 2


def test_torus_dim_of_two_and_3d_counts() -> None:
    topo, _ = cluster(build_torus, 6, dims=[2, 3])
    assert fabric_links(topo) == 3 + 6  # size-2 dimension: one (double) link per pair
    assert topo.capacity_bytes_per_s[topo.link_id("sw/router0.0", "sw/router1.0")] == 2 * NIC_BW
    assert topo.capacity_bytes_per_s[topo.link_id("sw/router0.0", "sw/router0.1")] == NIC_BW
    cube, _ = cluster(build_torus, 54, dims=[3, 3, 3])
    assert fabric_links(cube) == 27 * 3 and cube.meta["torus"]["servers_per_vertex"] == 2
    derived, _ = cluster(build_torus, 12)
    assert derived.meta["torus"]["dims"] == [3, 4]


def test_ring_hops() -> None:
    topo, nics = cluster(build_ring, 6)
    assert fabric_links(topo) == 6 and topo.meta["torus"]["dims"] == [6]
    for i, j in itertools.combinations(range(6), 2):
        assert len(topo.route(nics[i], nics[j])) == 2 + min(j - i, 6 - (j - i))


# ---- dragonfly -------------------------------------------------------------------------------------
def test_dragonfly_counts_and_diameter() -> None:
    topo, nics = cluster(build_dragonfly, 36, nics=2, groups=9, routers_per_group=4,
                         global_links_per_router=2, endpoints_per_router=2)
    assert len(switches(topo)) == 9 * 4
    assert fabric_links(topo) == 9 * (4 * 3 // 2) + 9 * 8 // 2  # intra-group cliques + one per group pair
    group_of = {sw: sw.split("/")[1] for sw in switches(topo)}
    for sw in switches(topo):  # every router: a−1 local and h global neighbours
        nbrs = [n for n in topo.graph.adj[sw] if n in group_of]
        assert sum(group_of[n] != group_of[sw] for n in nbrs) == 2
        assert sum(group_of[n] == group_of[sw] for n in nbrs) == 3
    worst = max(inter_switch_hops(topo, topo.route(a, b)) for a, b in itertools.combinations(nics, 2))
    assert worst == 3  # local–global–local


def test_dragonfly_defaults_and_small_group_counts() -> None:
    topo, _ = cluster(build_dragonfly, 36, nics=2)  # 72 endpoints: p = 2 is the smallest balanced fit
    meta = topo.meta["dragonfly"]
    assert (meta["endpoints_per_router"], meta["routers_per_group"], meta["global_links_per_router"],
            meta["groups"]) == (2, 4, 2, 9)
    small, _ = cluster(build_dragonfly, 20, nics=2, endpoints_per_router=2)  # 40 endpoints → 5 groups
    assert small.meta["dragonfly"]["groups"] == 5 and small.meta["dragonfly"]["links_per_group_pair"] == 2
    routers = small.meta["dragonfly"]["routers"]
    for i, j in itertools.combinations(range(5), 2):  # every pair of groups directly linked
        cap = sum(small.capacity_bytes_per_s[small.link_id(x, y)] for x in routers[i] for y in routers[j]
                  if small.graph.has_edge(x, y))
        assert cap == pytest.approx(2 * NIC_BW)
    with pytest.raises(ConfigError, match="groups"):
        cluster(build_dragonfly, 20, groups=20, routers_per_group=2, global_links_per_router=1)


# ---- build_network validation ----------------------------------------------------------------------
def test_build_network_params_and_errors() -> None:
    topo = Topology("t")
    groups = make_servers(topo, 4)
    build_network(topo, "fat_tree", groups, {"link_bandwidth": "200Gbps", "link_latency": "2us"})
    assert topo.meta["network"] == "fat-tree" and topo.meta["network_params"]["k"] == 4  # k³/4 >= 4
    fab = [lk for lk in topo.links if lk.kind == FABRIC_LINK_KIND]
    assert all(lk.bandwidth_bytes_per_s == 25e9 and lk.latency_s == pytest.approx(2e-6) for lk in fab)

    def err(name: str, params: dict[str, Any], n: int = 16) -> ConfigError:
        t = Topology("t")
        with pytest.raises(ConfigError) as info:
            build_network(t, name, make_servers(t, n), {"link_bandwidth_bytes_per_s": NIC_BW, **params})
        return info.value

    assert err("fat-tree", {"radix": 4}).field == "cluster.network.radix"
    assert err("fat-tree", {"k": 3}).field == "cluster.network.k"
    e = err("fat-tree", {"k": 4}, n=20)
    assert e.field == "cluster.network.k" and "k to >= 6" in str(e)
    assert err("torus", {"dims": [16]}).field == "cluster.network.dims"
    assert err("torus", {"dims": [4, 1]}).field == "cluster.network.dims[1]"
    e = err("torus", {"dims": [2, 2], "servers_per_vertex": 2})
    assert e.field == "cluster.network.servers_per_vertex"
    assert err("leaf-spine", {"leaves": 2, "endpoints_per_leaf": 4}).field == "cluster.network.leaves"
    assert err("leaf-spine", {"oversubscription": 0}).field == "cluster.network.oversubscription"
    assert "unknown network" in str(err("hypercube", {}))
    assert "given twice" in str(err("single-switch", {"link_bandwidth": "100Gbps"}))
    t = Topology("t")
    with pytest.raises(ConfigError, match="cannot read bandwidth") as info:
        build_network(t, "ring", make_servers(t, 2), {"link_bandwidth": "fast"}, field="net")
    assert info.value.field == "net.link_bandwidth"
    assert set(NETWORKS) == {"single-switch", "bigraph", "fat-tree", "leaf-spine", "rail-optimized", "torus",
                             "ring", "dragonfly"}


# ---- metrics ---------------------------------------------------------------------------------------
def test_single_switch_summary() -> None:
    topo = Topology("one")
    groups = make_servers(topo, 8)
    build_network(topo, "single-switch", groups, {})
    s = summarize(topo)
    assert s.nodes_by_kind == {"gpu": 8, "nic": 8, "switch": 1} and s.num_switches == 1
    assert s.num_gpus == 8 and s.num_physical_links == 16
    assert s.diameter_hops == 4 and s.diameter_exact and s.diameter_pairs == 28  # gpu-nic-sw-nic-gpu
    assert s.bisection_bandwidth_bytes_per_s == pytest.approx(4 * 12.5e9)
    assert s.total_link_capacity_bytes_per_s == pytest.approx(2 * 8 * (GPU_NIC_BW + NIC_BW))
    assert s.to_dict()["network"] == "single-switch"


def test_sampled_diameter_is_deterministic() -> None:
    topo, _ = cluster(build_fat_tree, 16, k=4)
    exact = summarize(topo)
    sampled = summarize(topo, exact_max_gpus=4, sample_pairs=500)
    assert exact.diameter_hops == 8 and exact.diameter_exact
    assert not sampled.diameter_exact and sampled.diameter_pairs <= 120
    assert sampled.diameter_hops == 8 and summarize(topo, exact_max_gpus=4, sample_pairs=500) == sampled


def test_draw_topology(tmp_path: Path) -> None:
    topo, _ = cluster(build_bigraph, 4, nics=2, switches=4)
    out = tmp_path / "t.png"
    draw_topology(topo, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]
    draw_topology(topo, tmp_path / "t.svg")  # the format follows the extension
    assert b"<svg" in (tmp_path / "t.svg").read_bytes()[:400]


# ---- io --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".graphml"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    topo = Topology("t")
    build_bigraph(topo, make_servers(topo, 4, 2), link_bandwidth_bytes_per_s=NIC_BW, switches=4)
    topo.add_node("sw/extra", "switch", transit=False, colour="red")
    topo.add_link("sw/extra", "sw/upper0", 1e9, 0.0, "odd", bandwidth_b_to_a=2e9)
    topo.validate()
    path = tmp_path / f"c{suffix}"
    save_graph(topo, path, message_overhead_s=3e-6)
    back, overhead = load_graph_file(path)
    assert back.gpus == topo.gpus and back.name == topo.name and overhead == 3e-6
    assert [(n.name, n.kind, n.server, n.transit, n.attrs) for n in back.nodes.values()] == [
        (n.name, n.kind, n.server, n.transit, n.attrs) for n in topo.nodes.values()]
    assert back.links == topo.links
    assert back.meta["bigraph"]["upper"] == topo.meta["bigraph"]["upper"]
    assert [len(back.route(a, b)) for a, b in itertools.combinations(back.gpus, 2)] == [
        len(topo.route(a, b)) for a, b in itertools.combinations(topo.gpus, 2)]


def test_user_graphml_with_unit_strings(tmp_path: Path) -> None:
    path = tmp_path / "u.graphml"
    path.write_text("""<?xml version="1.0" encoding="UTF-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <key id="k" for="node" attr.name="kind" attr.type="string"/>
  <key id="bw" for="edge" attr.name="bandwidth" attr.type="string"/>
  <key id="lat" for="edge" attr.name="latency" attr.type="string"/>
  <graph edgedefault="directed">
    <node id="g0"><data key="k">gpu</data></node>
    <node id="sw"><data key="k">switch</data></node>
    <node id="g1"><data key="k">gpu</data></node>
    <edge source="g0" target="sw"><data key="bw">100Gbps</data><data key="lat">1us</data></edge>
    <edge source="sw" target="g0"><data key="bw">50Gbps</data><data key="lat">1us</data></edge>
    <edge source="sw" target="g1"><data key="bw">25000000000</data></edge>
  </graph>
</graphml>
""")
    topo = load_graph(path)
    assert topo.gpus == ["g0", "g1"] and topo.num_links == 4
    assert topo.capacity_bytes_per_s[topo.link_id("g0", "sw")] == 12.5e9
    assert topo.capacity_bytes_per_s[topo.link_id("sw", "g0")] == 6.25e9
    assert topo.latency_s[topo.link_id("g0", "sw")] == pytest.approx(1e-6)
    assert topo.capacity_bytes_per_s[topo.link_id("g1", "sw")] == 25e9
    assert len(topo.route("g0", "g1")) == 2


YAML_OK = """nodes:
  - {name: g0, kind: gpu}
  - {name: g1, kind: gpu}
  - {name: sw, kind: switch}
links:
  - {a: g0, b: sw, bandwidth: 100Gbps, latency: 1us}
  - {a: g1, b: sw, bandwidth: 25GB/s}
"""


def test_yaml_load_and_errors(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    ok.write_text(YAML_OK)
    topo = load_graph(ok)
    assert topo.name == "ok" and summarize(topo).bisection_bandwidth_bytes_per_s == pytest.approx(12.5e9)

    def err(text: str, name: str = "bad.yaml") -> ConfigError:
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_graph(p)
        return info.value

    e = err(YAML_OK + "  - {a: g2, b: sw, bandwidth: 1Gbps}\n  - {a: g0, b: g1}\n")
    assert e.field == "links[2]" and "g2" in str(e)
    e = err(YAML_OK.replace("25GB/s", "lots"))
    assert e.field == "links[1].bandwidth" and "bad.yaml" in str(e)
    e = err(YAML_OK.replace("kind: switch", "kind: router"))
    assert e.field == "nodes[2].kind"
    e = err("nodes:\n  - {name: g0, kind: gpu}\n  - {name: g1, kind: gpu\nlinks: []\n")
    assert "malformed YAML" in str(e) and "line 4" in str(e)
    e = err(YAML_OK + "  - {a: g0, b: g1, bandwidth: 1Gbps, colour: red}\n")
    assert e.field == "links[2].colour"
    disconnected = YAML_OK.replace("  - {a: g1, b: sw, bandwidth: 25GB/s}\n", "")
    e = err(disconnected)
    assert e.field == "links" and "disconnected" in str(e)
    e = err("<graphml><graph><node id='a'>", name="x.graphml")
    assert "malformed XML" in str(e)
    with pytest.raises(ConfigError, match="does not exist"):
        load_graph(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="file type"):
        load_graph(ok.with_suffix(".json"))
    assert not hasattr(topo, "message_overhead_s")  # a network parameter, never the graph's


# ---- frozen topology, degraded and failed links ----------------------------------------------------------
def _diamond(skip: tuple[str, str] | None = None, slow: tuple[str, str] | None = None) -> Topology:
    """Two GPUs on switches a and b joined over c and over d (two equal-hop paths), built from scratch:
    ``skip`` leaves a link out, ``slow`` gives one half its bandwidth (what a failed or degraded link is)."""
    t = Topology("diamond")
    for s in "abcd":
        t.add_node(s, NodeKind.SWITCH)
    t.add_node("g0", NodeKind.GPU)
    t.add_node("g1", NodeKind.GPU)
    for x, y, bw in (("g0", "a", 8e9), ("g1", "b", 8e9), ("a", "c", 4e9), ("c", "b", 4e9), ("a", "d", 4e9),
                     ("d", "b", 4e9)):
        if (x, y) != skip:
            t.add_link(x, y, bw / 2 if (x, y) == slow else bw, 1e-6)
    return t.freeze()


def test_a_frozen_topology_refuses_every_change() -> None:
    topo, _ = cluster(build_bigraph, 4, nics=2, switches=4)
    assert topo.frozen  # validate() freezes
    changes = [
        lambda: topo.add_node("x", "switch"),
        lambda: topo.add_link("sw/upper0", "sw/upper1", 1e9),
        lambda: topo.meta.update(network="other"),
        lambda: topo.meta.__setitem__("shared_cpu_cores", 2),
        lambda: topo.nodes.pop("s0/gpu0"),
        lambda: topo.nodes["s0/gpu0"].attrs.__setitem__("nic", "s1/nic0"),
        lambda: setattr(topo, "name", "renamed"),
        lambda: setattr(topo, "links", []),
    ]
    for change in changes:
        with pytest.raises(FrozenTopologyError, match="frozen topology"):
            change()
    with pytest.raises(nx.NetworkXError, match="[Ff]rozen"):
        topo.graph.remove_edge("sw/upper0", "sw/lower0")
    with pytest.raises(ValueError, match="read-only"):
        topo.capacity_bytes_per_s[0] = 1.0
    with pytest.raises(AttributeError):
        topo.links.append(topo.links[0])  # type: ignore[attr-defined]
    with pytest.raises(FrozenTopologyError):
        topo.message_overhead_s = 5e-6  # type: ignore[attr-defined]  # a network parameter: NetworkParams


def test_first_query_freezes_and_derived_data_is_computed_once() -> None:
    t = Topology("open")
    t.add_node("sw", NodeKind.SWITCH)
    for i in range(3):
        t.add_node(f"g{i}", NodeKind.GPU)
        t.add_link(f"g{i}", "sw", 1e9)
    t.meta["note"] = "set while building"
    assert not t.frozen
    r = t.route("g0", "g2")
    assert t.frozen and t.route("g0", "g2") is r  # the route cache answers with the same object
    assert t.router is t.router and t.capacity_bytes_per_s is t.capacity_bytes_per_s
    assert t.freeze() is t  # idempotent
    with pytest.raises(FrozenTopologyError):
        t.add_node("g3", NodeKind.GPU)


def test_frozen_topology_pickles_and_stays_frozen() -> None:
    topo, _ = cluster(build_bigraph, 4, nics=2, switches=4)
    back = pickle.loads(pickle.dumps(topo))
    assert back.frozen and back.links == topo.links and dict(back.meta) == dict(topo.meta)
    assert back.route("s0/gpu0", "s3/gpu1") == topo.route("s0/gpu0", "s3/gpu1")
    with pytest.raises(FrozenTopologyError):
        back.meta["x"] = 1


def test_degraded_links_give_a_new_topology_and_leave_the_original_as_it_was() -> None:
    topo, _ = cluster(build_bigraph, 4, nics=2, switches=4)
    pairs = list(itertools.permutations(topo.gpus, 2))
    routes = {p: topo.route(*p) for p in pairs}
    cap = topo.capacity_bytes_per_s.copy()
    up, lo = "sw/upper0", "sw/lower0"
    failed = topo.with_degraded_links([(up, lo, 0.0), ("sw/upper1", "sw/lower1", 0.5)])
    assert failed is not topo and failed.frozen and failed.name == topo.name
    # the original: same routes, capacities, edges and no failed links
    assert {p: topo.route(*p) for p in pairs} == routes and (topo.capacity_bytes_per_s == cap).all()
    assert topo.graph.has_edge(up, lo) and not topo.failed_links
    # the new one: the failed link carries nothing, the degraded one has half its capacity
    dead = {failed.link_id(up, lo), failed.link_id(lo, up)}
    assert failed.failed_links == dead and not failed.graph.has_edge(up, lo)
    assert all(not dead & set(failed.route(*p)) for p in pairs)
    assert any(dead & set(routes[p]) for p in pairs)  # some route did use it
    half = failed.link_id("sw/upper1", "sw/lower1")
    assert failed.capacity_bytes_per_s[half] == cap[half] * 0.5
    # changes apply in order: two factors on one link multiply; a failed link stays out of routing
    twice = failed.with_degraded_links([("sw/upper1", "sw/lower1", 0.5)])
    assert twice.capacity_bytes_per_s[half] == cap[half] * 0.25 and twice.failed_links == dead
    assert {p: twice.route(*p) for p in pairs} == {p: failed.route(*p) for p in pairs}


def test_degraded_links_route_and_time_as_a_topology_built_that_way() -> None:
    """Failing a–c reroutes over d and degrading a–d halves it: the same routes and times as a topology
    built from scratch without a–c and with a–d at half speed."""
    from topotrain.collectives import build_schedule
    from topotrain.network.flow import FlowModel

    base = _diamond()
    got = base.with_degraded_links([("a", "c", 0.0), ("a", "d", 0.5)])
    want = _diamond(skip=("a", "c"), slow=("a", "d"))
    for s, d in itertools.permutations(["g0", "g1", "a", "b", "c", "d"], 2):
        assert got.router.node_path(s, d) == want.router.node_path(s, d), (s, d)
    assert got.router.node_path("g0", "g1") == ["g0", "a", "d", "b", "g1"]
    for topo in (base, got, want):
        assert topo.graph.number_of_edges() == (6 if topo is base else 5)
    sched = build_schedule("allreduce", "ring", want, want.gpus, 2**20)
    assert FlowModel().time_schedule(sched, got).time_s == FlowModel().time_schedule(sched, want).time_s
    assert FlowModel().time_schedule(sched, got).time_s > FlowModel().time_schedule(sched, base).time_s


def test_degraded_link_errors() -> None:
    t = _diamond()
    with pytest.raises(ConfigError, match=r"degraded_links\[a–b\]: no such link"):
        t.with_degraded_links([("a", "b", 0.5)])
    with pytest.raises(ConfigError, match=r"factor must be in \[0, 1\], got 1.5"):
        t.with_degraded_links([("a", "c", 1.5)])
    with pytest.raises(ConfigError, match="disconnects the cluster"):
        t.with_degraded_links([("g0", "a", 0.0)])
    with pytest.raises(ConfigError, match="disconnects the cluster"):
        t.with_degraded_links([("a", "c", 0.0), ("a", "d", 0.0)])
    with pytest.raises(ConfigError, match="failed twice"):
        t.with_degraded_links([("a", "c", 0.0), ("c", "a", 0.0)])
    assert not t.failed_links and t.graph.number_of_edges() == 6


def _long_ring(n_switches: int = 300) -> Topology:
    """A ring of switches with a few chords and GPUs hanging on some of them: shortest paths of more than
    255 hops at times, ECMP ties where the ring's two ways around are equal."""
    t = Topology("long-ring")
    for i in range(n_switches):
        t.add_node(f"sw{i:03d}", NodeKind.SWITCH)
    for i in range(n_switches):
        t.add_link(f"sw{i:03d}", f"sw{(i + 1) % n_switches:03d}", 1e9 * (1 + i % 3), 1e-6)
    t.add_link("sw000", "sw150", 1e9, 1e-6)
    for g, sw in enumerate((0, 1, 75, 140, 151, 225, 299)):
        t.add_node(f"g{g}", NodeKind.GPU)
        t.add_link(f"g{g}", f"sw{sw:03d}", 4e9, 5e-7)
    long_arm = f"sw{n_switches - 1:03d}"
    for i in range(600):  # a chain of 600 switches: some hop counts beyond one byte
        t.add_node(f"c{i:03d}", NodeKind.SWITCH)
        t.add_link(f"c{i:03d}", f"c{i - 1:03d}" if i else long_arm, 1e9, 1e-6)
    t.add_node("gfar", NodeKind.GPU)
    t.add_link("gfar", "c599", 4e9, 5e-7)
    return t.freeze()


def test_routes_do_not_depend_on_how_hop_counts_are_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router counts hops by a Python search on small domains and a numpy one on large ones, in bytes or
    (past 254 hops) in a list: every way gives the same routes, and route_many gives route's."""
    from topotrain.topology import routing

    pairs = list(itertools.permutations(_long_ring().gpus, 2))
    got = []
    for threshold in (0, 10**9):  # numpy everywhere, Python everywhere
        monkeypatch.setattr(routing, "_NUMPY_BFS_MIN_NODES", threshold)
        topo = _long_ring()
        got.append({p: topo.route(*p) for p in pairs})
        assert topo.router.route_many(pairs) == [got[-1][p] for p in pairs]
    assert got[0] == got[1]
    assert len(got[0][("g0", "gfar")]) == 1 + 1 + 600 + 1  # g0 → sw000 → sw299 → c000..c599 → gfar
    assert len(got[0][("g2", "gfar")]) > 255 + 2


@pytest.mark.parametrize(("builder", "params", "field"), [
    (build_fat_tree, {"k": 100_000}, "fat-tree.k"),
    (build_torus, {"dims": [1000, 1000, 1000]}, "torus.dims"),
    (build_ring, {"routers": 10**9}, "ring.routers"),
    (build_dragonfly, {"groups": 100_000}, "dragonfly.groups"),
    (build_leaf_spine, {"spines": 10**9}, "leaf-spine.spines"),
    (build_bigraph, {"switches": 10**6, "radix": 10**6}, "bigraph.switches"),
])
def test_builder_refuses_a_network_beyond_the_size_limit_before_building(builder: NetworkBuilder,
                                                                         params: dict[str, Any],
                                                                         field: str) -> None:
    topo = Topology("t")
    groups = make_servers(topo, 4, 1)
    with pytest.raises(ConfigError, match="beyond the limit of 262,144 switches") as e:
        builder(topo, groups, link_bandwidth_bytes_per_s=NIC_BW, **params)
    assert e.value.field == field and not switches(topo)  # refused before a switch was built
    fresh, _ = cluster(builder, 4, nics=1)  # the default sizes of the same servers build
    assert switches(fresh)
