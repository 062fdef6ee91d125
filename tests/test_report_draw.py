"""Layered topology drawings: rows that show the design, every link drawn once, aggregation, formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from topotrain.report.draw import draw_topology, layout, switch_rows
from topotrain.scenario.cluster import load_cluster
from topotrain.util.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_bigraph_parts_and_every_link_once() -> None:
    topo = load_cluster(EXAMPLES / "eflops-bigraph.yaml").topology
    lay = layout(topo)
    assert not lay.aggregated
    labels = [label for label, _ in lay.rows]
    assert labels == ["servers", "BiGraph lower part", "BiGraph upper part"]
    assert sum(cnt for _, cnt in lay.edges.values()) == topo.num_links // 2
    ys = {label: y for label, y in lay.rows}
    upper = [d for d in lay.nodes.values() if d.y == ys["BiGraph upper part"]]
    lower = [d for d in lay.nodes.values() if d.y == ys["BiGraph lower part"]]
    assert len(upper) == len(lower) == 4
    between = [e for e in lay.edges if {e[0], e[1]} & {d.key for d in upper} and {e[0], e[1]} & {d.key for d in lower}]
    assert len(between) == 4 * 4  # complete bipartite between the two parts
    assert len(lay.boxes) == 16  # one box per server


def test_rail_tiers() -> None:
    topo = load_cluster(EXAMPLES / "dgx-a100-rail.yaml").topology
    assert [label for label, _ in layout(topo).rows] == ["servers", "rail switches", "spine"]


def test_partly_filled_fat_tree_tiers_from_the_builder(tmp_path: Path) -> None:
    """Issue 41 item 2: 32 DGX servers (256 NICs) on a k=12 fat-tree fill 8 of 12 pods; the drawing shows
    three tiers named by the builder (no empty pod whose edge switches a BFS called "tier 5 (core)")."""
    (tmp_path / "c.yaml").write_text(
        "cluster: {server: nvswitch-8, servers: 32, network: {topology: fat-tree, link: ib-hdr-200g}}\n")
    topo = load_cluster(tmp_path / "c.yaml").topology
    rows = switch_rows(topo)
    assert [label for label, _ in rows] == ["tier 3 (core)", "tier 2 (aggregation)", "tier 1 (edge)"]
    ft = topo.meta["fat_tree"]
    assert [len(m) for _, m in rows] == [len(ft["core"]), len(ft["aggregation"]), len(ft["edge"])]
    assert ft["pods"] == 8 and all(not n.startswith("sw/pod8/") for n in topo.nodes)


def test_large_cluster_aggregated_bandwidth_kept(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "cluster: {server: nvswitch-8, servers: 128, network: {topology: fat-tree, link: ib-hdr-200g}}\n")
    topo = load_cluster(tmp_path / "c.yaml").topology
    lay = layout(topo)
    assert lay.aggregated and len(lay.nodes) <= 4 * 48
    inside = {n for n, nd in topo.nodes.items() if nd.server is not None}
    # links from servers to the network: their summed bandwidth is drawn in full
    out_bw = sum(lk.bandwidth_bytes_per_s for lk in topo.links if lk.src in inside and lk.dst not in inside)
    drawn = sum(bw for (a, b), (bw, _) in lay.edges.items() if a.startswith("server-group") or
                b.startswith("server-group"))
    assert drawn == pytest.approx(out_bw)
    out = tmp_path / "big.png"
    draw_topology(topo, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_format_by_extension(tmp_path: Path) -> None:
    topo = load_cluster(EXAMPLES / "shared-nic-bigraph.yaml").topology
    draw_topology(topo, tmp_path / "t.svg")
    head = (tmp_path / "t.svg").read_text()[:400]
    assert "<svg" in head
    with pytest.raises(ConfigError, match=r"\.png"):
        draw_topology(topo, tmp_path / "t.gif")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.svg"]
