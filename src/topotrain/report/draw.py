"""Layered drawings of a cluster topology that show its design (PNG, SVG or PDF by the file's extension).

Rows, top to bottom: the network's switch tiers (as the builder placed them: a leaf, edge or rail switch is
tier 1, a spine or aggregation switch tier 2, a fat-tree's core tier 3; hops from the servers for a
topology read from a file; BiGraph's two parts, ``meta["bigraph"]["upper"/"lower"]``, each get their own
row, so its complete bipartite wiring is visible), then the servers. A server is a box holding its own
nodes in sub-rows (NICs on top, then CPUs, PCIe switches / NVSwitches, GPUs at the bottom). Every link is
drawn once, its colour (log scale, colour bar in GB/s) and width by its bandwidth in one direction.

Large clusters are drawn *aggregated* instead of refused: above ``detail_max_nodes`` nodes a server is one
node, above ``max_per_row`` servers (or switches of one row) consecutive ones are merged into one group
node; the links between two drawn nodes are summed into one edge, labelled with the link count. The
title says when the picture is aggregated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError

#: Formats matplotlib writes that a drawing may be saved as (by the path's extension).
FORMATS = ("png", "svg", "pdf")
#: A topology of more nodes is drawn with one node per server.
DETAIL_MAX_NODES = 400
#: A row of more servers or switches is drawn as this many groups of consecutive ones.
MAX_PER_ROW = 48

KIND_COLOURS = {
    NodeKind.GPU: "#76b900",
    NodeKind.PCIE: "#8c8c8c",
    NodeKind.CPU: "#1f77b4",
    NodeKind.NIC: "#ff7f0e",
    NodeKind.NVSWITCH: "#9467bd",
    NodeKind.SWITCH: "#d62728",
}
#: Sub-rows inside a server box, top to bottom.
_SERVER_ROWS = (NodeKind.NIC, NodeKind.SWITCH, NodeKind.CPU, NodeKind.PCIE, NodeKind.NVSWITCH, NodeKind.GPU)


def natural_key(name: str) -> list[Any]:
    """``s10/gpu2`` sorts after ``s2/gpu10``: digits compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


@dataclass
class Drawn:
    """One node of the picture: a topology node, a whole server, or a group of servers/switches."""

    key: str
    label: str
    kind: NodeKind
    members: list[str] = field(default_factory=list)
    x: float = 0.0
    y: float = 0.0


@dataclass
class Layout:
    """Where everything goes: drawn nodes, summed edges ``(a, b) → (bytes/s, links)``, row labels,
    server boxes ``(label, x0, y0, x1, y1)``."""

    nodes: dict[str, Drawn]
    edges: dict[tuple[str, str], tuple[float, int]]
    rows: list[tuple[str, float]]
    boxes: list[tuple[str, float, float, float, float]]
    aggregated: bool
    width: float


def _groups(names: list[str], max_per_row: int) -> list[list[str]]:
    if len(names) <= max_per_row:
        return [[n] for n in names]
    size = math.ceil(len(names) / max_per_row)
    return [names[i:i + size] for i in range(0, len(names), size)]


def _span_label(names: list[str], strip: str = "") -> str:
    a, b = names[0].removeprefix(strip), names[-1].removeprefix(strip)
    return a if len(names) == 1 else f"{a}…{b} ({len(names)})"


def switch_rows(topo: Topology) -> list[tuple[str, list[str]]]:
    """Rows of network nodes (outside servers), top row first: BiGraph's parts, else the tiers the builder
    gave its switches (``tier``/``role`` node attributes), else (a topology from a file) tiers by hops from
    the servers (nodes no server reaches are the last row)."""
    net = [n for n, nd in topo.nodes.items() if nd.server is None]
    if not net:
        return []
    big = topo.meta.get("bigraph")
    if isinstance(big, dict) and "upper" in big and "lower" in big:
        upper, lower = list(big["upper"]), list(big["lower"])
        rest = sorted(set(net) - set(upper) - set(lower), key=natural_key)
        rows = [("BiGraph upper part", upper), ("BiGraph lower part", lower)]
        return ([("other", rest)] if rest else []) + rows
    if all("tier" in topo.nodes[n].attrs for n in net):  # the builder's own tiers (topology/builders.py)
        roles = {1: "rail switches", 2: "spine"} if topo.meta.get("network") == "rail-optimized" else {}
        tiers = sorted({int(topo.nodes[n].attrs["tier"]) for n in net}, reverse=True)
        rows = []
        for t in tiers:
            members = sorted((n for n in net if topo.nodes[n].attrs["tier"] == t), key=natural_key)
            role = roles.get(t) or str(topo.nodes[members[0]].attrs.get("role", ""))
            rows.append((roles.get(t) or (f"tier {t} ({role})" if role else f"tier {t}"), members))
        return rows
    tier: dict[str, int] = {}
    frontier = [n for n in net if any(topo.nodes[m].server is not None for m in topo.graph.neighbors(n))]
    for n in frontier:
        tier[n] = 1
    while frontier:
        nxt = []
        for n in frontier:
            for m in topo.graph.neighbors(n):
                if topo.nodes[m].server is None and m not in tier:
                    tier[m] = tier[n] + 1
                    nxt.append(m)
        frontier = nxt
    top = max(tier.values(), default=0)
    for n in net:
        tier.setdefault(n, top + 1)
    name = str(topo.meta.get("network", ""))
    labels = {1: "rail switches" if name == "rail-optimized" else "tier 1 (leaf)"}
    if top >= 2:
        labels[top] = "spine" if name in ("rail-optimized", "leaf-spine") and top == 2 else f"tier {top} (core)"
    out = []
    for t in sorted(set(tier.values()), reverse=True):
        members = sorted((n for n in net if tier[n] == t), key=natural_key)
        out.append((labels.get(t, f"tier {t}"), members))
    return out


def layout(topo: Topology, detail_max_nodes: int = DETAIL_MAX_NODES, max_per_row: int = MAX_PER_ROW) -> Layout:
    """Positions of :func:`draw_topology`'s picture (pure: a function of the topology and the limits)."""
    servers: dict[str, list[str]] = {}
    for n, nd in topo.nodes.items():
        if nd.server is not None:
            servers.setdefault(nd.server, []).append(n)
    server_names = sorted(servers, key=natural_key)
    aggregated = len(topo.nodes) > detail_max_nodes or len(server_names) > max_per_row
    owner: dict[str, str] = {}
    nodes: dict[str, Drawn] = {}
    rows: list[tuple[str, float]] = []
    boxes: list[tuple[str, float, float, float, float]] = []
    srows = switch_rows(topo)
    widest = max([1, *(len(_groups(m, max_per_row)) for _, m in srows)])
    y = 0.0
    if aggregated:
        sgroups = _groups(server_names, max_per_row)
        width = float(max(widest, len(sgroups)))
        for i, grp in enumerate(sgroups):
            key = f"server-group:{i}"
            members = [n for s in grp for n in servers[s]]
            nodes[key] = Drawn(key, _span_label(grp), NodeKind.GPU, members,
                               (i + 0.5) * width / len(sgroups), y)
            for n in members:
                owner[n] = key
        rows.append(("servers" + (" (grouped)" if len(sgroups) < len(server_names) else ""), y))
        y += 1.6
    else:
        cols = max(1, max(sum(1 for n in servers[s] if topo.nodes[n].kind is k) for s in server_names
                          for k in _SERVER_ROWS) if server_names else 1)
        box_w = max(1.0, 0.55 * cols)
        width = float(max(widest, len(server_names) * (box_w + 0.4)))
        sub = [k for k in _SERVER_ROWS if any(topo.nodes[n].kind is k for s in server_names for n in servers[s])]
        depth = 0.7 * max(1, len(sub) - 1)
        for i, s in enumerate(server_names):
            cx = (i + 0.5) * width / max(1, len(server_names))
            x0, x1 = cx - box_w / 2, cx + box_w / 2
            boxes.append((s, x0 - 0.15, y - 0.35, x1 + 0.15, y + depth + 0.35))
            for j, k in enumerate(reversed(sub)):
                names = sorted((n for n in servers[s] if topo.nodes[n].kind is k), key=natural_key)
                for m, n in enumerate(names):
                    nodes[n] = Drawn(n, n.split("/")[-1], k, [n], x0 + (m + 0.5) * box_w / len(names),
                                     y + 0.7 * j)
                    owner[n] = n
        rows.append(("servers", y + depth / 2))
        y += depth + 1.8
    for label, members in reversed(srows):
        grps = _groups(members, max_per_row)
        for i, grp in enumerate(grps):
            key = grp[0] if len(grp) == 1 else f"switch-group:{label}:{i}"
            kind = topo.nodes[grp[0]].kind
            nodes[key] = Drawn(key, _span_label(grp, "sw/"), kind, grp, (i + 0.5) * width / len(grps), y)
            for n in grp:
                owner[n] = key
        rows.append((label + (" (grouped)" if len(grps) < len(members) else ""), y))
        y += 1.6
    for n in topo.nodes:  # nodes in no server and no row cannot exist, but never drop a link silently
        if n not in owner:
            owner[n] = n
            nodes[n] = Drawn(n, n, topo.nodes[n].kind, [n], width / 2, y)
    edges: dict[tuple[str, str], tuple[float, int]] = {}
    for lk in topo.links:
        ea, eb = owner[lk.src], owner[lk.dst]
        if ea == eb or lk.src > lk.dst:  # one direction of each physical link; inside a group: not drawn
            continue
        pair = (ea, eb) if ea < eb else (eb, ea)
        bw, cnt = edges.get(pair, (0.0, 0))
        edges[pair] = (bw + lk.bandwidth_bytes_per_s, cnt + 1)
    return Layout(nodes, edges, rows, boxes, aggregated, width)


def _format_of(path: str | Path, field: str = "--out") -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in FORMATS:
        raise ConfigError(field, f"cannot draw into {Path(path).name!r}: unknown picture type {ext!r}",
                          f"end the file name with {', '.join('.' + f for f in FORMATS)}")
    return ext


def check_picture_path(path: str | Path, field: str = "--out") -> str:
    """The format of ``path`` (from its extension), or a ConfigError naming ``field`` before any work is done."""
    return _format_of(path, field)


def draw_topology(topo: Topology, path: str | Path, *, title: str | None = None,
                  detail_max_nodes: int = DETAIL_MAX_NODES, max_per_row: int = MAX_PER_ROW) -> Layout:
    """Draw ``topo`` (see the module docstring) into ``path`` — PNG, SVG or PDF by its extension — with
    matplotlib's non-interactive canvas, atomically. Returns the layout it drew."""
    fmt = _format_of(path)
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    lay = layout(topo, detail_max_nodes, max_per_row)
    height = max(y for _, y in lay.rows) + 1.0 if lay.rows else 1.0
    fig_w = min(30.0, max(9.0, 0.24 * lay.width + 3.0))
    fig_h = min(24.0, max(4.5, 1.1 * height + 1.5))
    fig = Figure(figsize=(fig_w, fig_h), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, x0, y0, x1, y1 in lay.boxes:
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.02", fc="#f4f4f4",
                                    ec="#666666", lw=0.8, zorder=0))
        if len(lay.boxes) <= 32:
            ax.text((x0 + x1) / 2, y0 - 0.1, label, ha="center", va="top", fontsize=7, color="#333333")
    bws = [bw for bw, _ in lay.edges.values()]
    norm = mpl.colors.LogNorm(vmin=min(bws) / 1e9, vmax=max(max(bws), min(bws) * 1.0001) / 1e9) if bws else None
    cmap = mpl.colormaps["viridis"]
    if bws and norm is not None:
        segs, colours, widths = [], [], []
        lo, hi = math.log(min(bws)), math.log(max(bws))
        for (a, b), (bw, _) in sorted(lay.edges.items(), key=lambda kv: kv[1][0]):
            na, nb = lay.nodes[a], lay.nodes[b]
            segs.append(((na.x, na.y), (nb.x, nb.y)))
            colours.append(cmap(norm(bw / 1e9)))
            widths.append(0.5 + 2.5 * ((math.log(bw) - lo) / (hi - lo) if hi > lo else 0.5))
        ax.add_collection(LineCollection(segs, colors=colours, linewidths=widths, alpha=0.75, zorder=1))
        sm = mpl.cm.ScalarMappable(norm=norm, cmap=cmap)
        bar = fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.005, label="link bandwidth, one direction (GB/s)")
        ticks = sorted({round(bw / 1e9, 6) for bw in bws})
        if len(ticks) > 8:
            ticks = ticks[:: math.ceil(len(ticks) / 8)] + [ticks[-1]]
        bar.set_ticks(ticks, labels=[f"{t:.4g}" for t in ticks])
        bar.minorticks_off()
    by_kind: dict[NodeKind, list[Drawn]] = {}
    for d in lay.nodes.values():
        by_kind.setdefault(d.kind, []).append(d)
    groups_drawn = lay.aggregated
    for kind, ds in by_kind.items():
        big = [len(d.members) > 1 for d in ds]
        sizes = [160.0 if g else (30.0 if kind is NodeKind.GPU else 55.0) for g in big]
        marker = "s" if kind in (NodeKind.SWITCH, NodeKind.NVSWITCH, NodeKind.PCIE) else "o"
        count = sum(len(d.members) for d in ds) if not groups_drawn or kind is not NodeKind.GPU else sum(
            sum(1 for m in d.members if topo.nodes[m].kind is NodeKind.GPU) for d in ds)
        name = "server (all its nodes)" if groups_drawn and kind is NodeKind.GPU else kind.value
        ax.scatter([d.x for d in ds], [d.y for d in ds], s=sizes, c=KIND_COLOURS[kind], marker=marker,
                   edgecolors="black", linewidths=0.4, zorder=2,
                   label=f"{name} ({count} {'GPUs' if name.startswith('server') else 'nodes'})")
    row_counts: dict[float, int] = {}
    for d in lay.nodes.values():
        row_counts[d.y] = row_counts.get(d.y, 0) + 1
    for d in lay.nodes.values():
        label_it = len(d.members) > 1 or (d.kind is NodeKind.SWITCH and topo.nodes[d.key].server is None
                                          if d.key in topo.nodes else False)
        if label_it and row_counts[d.y] <= 40:
            ax.text(d.x, d.y + 0.22, d.label.removeprefix("sw/"), ha="center", va="bottom", fontsize=6.5,
                    rotation=30 if row_counts[d.y] > 16 else 0)
    margin = max(4.0, 0.12 * lay.width)
    for label, y in lay.rows:
        ax.text(-margin, y, label, ha="left", va="center", fontsize=8, fontweight="bold")
    net = topo.meta.get("network")
    head = title or f"{topo.name}: {len(topo.gpus)} GPUs, {len(topo.servers())} servers" + (
        f", {net} network" if net else "") + f", {topo.num_links // 2} links"
    if lay.aggregated:
        head += "\n(aggregated: one node per server" + (" group" if any(
            len(d.members) > 1 and d.key.startswith("server-group") and
            len({topo.nodes[m].server for m in d.members}) > 1 for d in lay.nodes.values()) else "") + \
            "; parallel links summed, their count in the edge's bandwidth)"
    ax.set_title(head, fontsize=10, pad=22)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7, frameon=False, ncol=6)
    ax.set_xlim(-margin, lay.width + 0.3)
    ax.set_ylim(-1.0, height)
    ax.set_axis_off()
    fig.subplots_adjust(left=0.01, right=0.94, top=0.85, bottom=0.03)

    def write(fh: IO[bytes]) -> None:
        fig.savefig(fh, format=fmt)

    atomic_write(path, write, make_parents=True)
    return lay


def edge_bandwidths(lay: Layout) -> Iterable[float]:
    """Drawn edges' bandwidths (bytes/s), for tests and legends."""
    return (bw for bw, _ in lay.edges.values())
