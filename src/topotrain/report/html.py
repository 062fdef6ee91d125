"""One self-contained HTML report of a simulated iteration: it opens offline, with nothing beside it.

Sections: summary, breakdown bar, per-stage timeline (every stream of every stage, blocking TP/EP
collectives included), memory per stage (:func:`topotrain.training.memory.memory_per_stage`), the busiest
links drawn on the topology (the layered layout of :mod:`topotrain.report.draw`), a table of the
collectives the engine ran, and the scenario as resolved (every default filled in).

The charts are plotly figures; plotly.js is embedded once, inline, so the file needs no network. Every
number on the page is read off the :class:`~topotrain.training.simulate.Result`; nothing is recomputed
here except sums and groupings of it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topotrain.report.draw import KIND_COLOURS, layout
from topotrain.training.bands import describe as describe_band
from topotrain.training.memory import memory_per_stage
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_size, format_time

if TYPE_CHECKING:
    from topotrain.training.engine import Task
    from topotrain.training.simulate import Result, Scenario

#: Timeline bars beyond this many are left out (the page says how many); the trace has them all.
TIMELINE_MAX_BARS = 20_000

_CATEGORY_COLOURS = {"forward": "#1f77b4", "backward": "#76b900", "optimizer": "#8c564b", "dp-comm": "#ff7f0e",
                     "pp-comm": "#9467bd", "tp-comm": "#d62728"}
_BREAKDOWN = (("compute_s", "compute", "#76b900"), ("tp_comm_s", "TP/EP comm (blocking)", "#d62728"),
              ("exposed_comm_s", "exposed DP/PP comm", "#ff7f0e"), ("bubble_s", "pipeline bubble / idle", "#bbbbbb"))


@dataclass(frozen=True)
class CollectiveRow:
    """The collectives of one key (same op, algorithm, ranks and size), summed over the iteration."""

    kind: str
    op: str
    algorithm: str
    ranks: int
    groups: int
    size_bytes: int
    calls: int
    total_s: float

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0


def collective_rows(tasks: Iterable[Task]) -> list[CollectiveRow]:
    """Communication tasks and blocking collectives grouped by their key, busiest first."""
    acc: dict[str, list[Any]] = {}

    def add(kind: str, spec: Any, dur: float) -> None:
        if not spec.schedules:
            return
        s0 = spec.schedules[0]
        row = acc.setdefault(spec.key, [kind, str(getattr(s0.op, "value", s0.op)), s0.algorithm, s0.num_ranks,
                                        len(spec.schedules), int(s0.size_bytes), 0, 0.0])
        row[6] += 1
        row[7] += dur

    for t in tasks:
        if t.comm is not None and t.end_s >= t.start_s:
            add(t.category, t.comm, t.end_s - t.start_s)
        if t.blocking:
            by_label: dict[str, Any] = {}
            for b in t.blocking:
                by_label.setdefault(b.label, b.comm)
            for label, a, b_s in t.blocking_slices():
                if label in by_label:
                    add("tp-comm", by_label[label], b_s - a)
    rows = [CollectiveRow(*v) for v in acc.values()]
    return sorted(rows, key=lambda r: -r.total_s)


def _band(d: dict[str, Any]) -> str:
    """`` ± 6.9% (80% band, 16 validation rows of transformer/dense/multi-node)`` (or a borrowed band, saying
    so: :func:`topotrain.training.bands.describe`) or nothing without a band."""
    b = d.get("error_band")
    return f" ± {describe_band(b)}" if b else ""


def _fig_html(fig: Any, div_id: str) -> str:
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True}))


def breakdown_figure(result: Result) -> Any:
    import plotly.graph_objects as go

    b = result.breakdown.to_dict()
    fig = go.Figure()
    for key, label, colour in _BREAKDOWN:
        v = b[key]
        fig.add_trace(go.Bar(y=["iteration"], x=[v * 1e3], name=label, orientation="h", marker_color=colour,
                             hovertemplate=f"{label}: {format_time(v)}<extra></extra>"))
    fig.update_layout(barmode="stack", height=220, margin={"l": 80, "r": 20, "t": 40, "b": 40},
                      title=f"where the iteration's {format_time(result.iteration_time_s)} go (critical stage)",
                      xaxis_title="ms", legend={"orientation": "h", "y": -0.5})
    return fig


def _track(t: Task) -> str:
    kind = t.stream.split("/", 1)[1] if t.stream.startswith("stage") else t.stream
    return f"stage {t.stage} · {kind}"


def timeline_figure(result: Result, max_bars: int | None = None) -> tuple[Any, int]:
    """Gantt chart: one row per stage and stream (at most ``max_bars`` bars, default
    :data:`TIMELINE_MAX_BARS`); returns the figure and the number of bars left out."""
    import plotly.graph_objects as go

    if max_bars is None:
        max_bars = TIMELINE_MAX_BARS

    bars: dict[str, list[tuple[str, float, float, str]]] = {}
    rows: list[str] = []
    n = 0
    dropped = 0
    for t in sorted(result.tasks, key=lambda t: (t.stage, t.start_s)):
        if not t.end_s >= t.start_s:
            continue
        items = [(_track(t), t.start_s, t.end_s, t.name)]
        items += [(f"stage {t.stage} · tp/ep blocking", a, b, label) for label, a, b in t.blocking_slices()]
        for i, (row, a, b, label) in enumerate(items):
            if n >= max_bars:
                dropped += 1
                continue
            n += 1
            if row not in rows:
                rows.append(row)
            bars.setdefault(t.category if i == 0 else "tp-comm", []).append((row, a, b, label))
    fig = go.Figure()
    for cat, items in bars.items():
        fig.add_trace(go.Bar(
            y=[r for r, _, _, _ in items], x=[(b - a) * 1e3 for _, a, b, _ in items],
            base=[a * 1e3 for _, a, _, _ in items], orientation="h", name=cat,
            marker_color=_CATEGORY_COLOURS.get(cat, "#7f7f7f"), text=[lb for *_, lb in items],
            hovertemplate="%{text}<br>start %{base:.3f} ms, %{x:.3f} ms<extra>" + cat + "</extra>",
            textposition="none"))
    order = sorted(rows, key=lambda r: (int(r.split()[1]), r))
    fig.update_layout(barmode="overlay", height=max(260, 34 * len(rows) + 120),
                      margin={"l": 220, "r": 20, "t": 40, "b": 40}, title="timeline per stage and stream",
                      xaxis_title="ms", yaxis={"categoryorder": "array", "categoryarray": list(reversed(order))})
    return fig, dropped


def memory_figure(sc: Scenario) -> Any:
    import plotly.graph_objects as go


    stages = memory_per_stage(sc.model, sc.plan)
    fig = go.Figure()
    for key, label in (("weights_bytes", "weights"), ("gradients_bytes", "gradients"),
                       ("optimizer_bytes", "optimizer states"), ("activations_bytes", "activations"),
                       ("transient_bytes", "transient")):
        ys = [getattr(m, key) / 2**30 for m in stages]
        fig.add_trace(go.Bar(x=[f"stage {m.stage}" for m in stages], y=ys, name=label))
    cap = sc.cluster.gpu_spec.memory_bytes / 2**30
    fig.add_hline(y=cap, line_dash="dash", line_color="#d62728",
                  annotation_text=f"{sc.cluster.gpu_spec.name}: {cap:.0f} GiB")
    fig.update_layout(barmode="stack", height=340, title="memory per GPU, by pipeline stage",
                      yaxis_title="GiB", margin={"l": 60, "r": 20, "t": 40, "b": 40})
    return fig


#: the utilization colour scale, 0 → 100 % busy (ColorBrewer YlOrRd: pale at idle, dark red when saturated)
UTILIZATION_SCALE = ((0.0, "#ffffb2"), (0.25, "#fecc5c"), (0.5, "#fd8d3c"), (0.75, "#f03b20"), (1.0, "#bd0026"))
#: label every drawn node up to this many; above it only the busiest links' ends
LABEL_ALL_MAX_NODES = 40


def utilization_colour(u: float) -> str:
    """The colour of a link ``u`` busy (a fraction, clipped to [0, 1]) on :data:`UTILIZATION_SCALE`: the
    scale is the utilization's own range, 0–100 %, not the busiest link's, so a link 4.7 % busy is pale
    and only a saturated one is red."""
    x = min(1.0, max(0.0, float(u))) if u == u else 0.0
    for (x0, c0), (x1, c1) in zip(UTILIZATION_SCALE, UTILIZATION_SCALE[1:], strict=False):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            rgb = [round(int(c0[i:i + 2], 16) + f * (int(c1[i:i + 2], 16) - int(c0[i:i + 2], 16)))
                   for i in (1, 3, 5)]
            return "#" + "".join(f"{v:02x}" for v in rgb)
    return UTILIZATION_SCALE[-1][1]


def links_figure(sc: Scenario, result: Result) -> Any:
    """The topology in the layered layout, nodes labelled, its busiest links coloured by utilization on a
    0–100 % scale (:func:`utilization_colour`, with its colour bar) and widened with it."""
    import plotly.graph_objects as go

    topo = sc.cluster.topology
    lay = layout(topo)
    owner = {m: d.key for d in lay.nodes.values() for m in d.members}
    ex: list[float | None] = []
    ey: list[float | None] = []
    for a, b in lay.edges:
        na, nb = lay.nodes[a], lay.nodes[b]
        ex += [na.x, nb.x, None]
        ey += [na.y, nb.y, None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#cccccc", "width": 1}, hoverinfo="skip",
                             name="links"))
    busy_ends = {owner[x] for a, b, _ in result.link_utilization_top for x in (a, b)}
    label_all = len(lay.nodes) <= LABEL_ALL_MAX_NODES
    for kind, colour in KIND_COLOURS.items():
        ds = [d for d in lay.nodes.values() if d.kind is kind]
        if ds:
            names = [d.label if len(d.members) > 1 else d.key for d in ds]
            fig.add_trace(go.Scatter(x=[d.x for d in ds], y=[d.y for d in ds], mode="markers+text",
                                     name=kind.value, marker={"color": colour, "size": 7, "line": {"width": 0.5}},
                                     text=[n if label_all or d.key in busy_ends else "" for n, d in zip(names, ds,
                                                                                                     strict=True)],
                                     textposition="top center", textfont={"size": 9}, customdata=names,
                                     hovertemplate="%{customdata}<extra></extra>"))
    for i, (src, dst, u) in enumerate(result.link_utilization_top):
        na, nb = lay.nodes[owner[src]], lay.nodes[owner[dst]]
        fig.add_trace(go.Scatter(x=[na.x, nb.x], y=[na.y, nb.y], mode="lines+markers",
                                 line={"color": utilization_colour(u), "width": 3 + 6 * min(1.0, u)},
                                 marker={"color": utilization_colour(u)},
                                 name=f"#{i + 1} {src}→{dst} {100 * u:.1f}%",
                                 hovertemplate=f"{src}→{dst}: {100 * u:.1f}% busy<extra></extra>"))
    # the colour bar: an invisible marker carrying the 0–100 % scale
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                             marker={"colorscale": [[x, c] for x, c in UTILIZATION_SCALE], "cmin": 0, "cmax": 100,
                                     "color": [0], "showscale": True,
                                     "colorbar": {"title": {"text": "busy %"}, "thickness": 12}}))
    fig.update_layout(height=460, title="busiest links (utilization over the iteration, 0–100 % colour scale)" +
                      (" — servers aggregated" if lay.aggregated else ""),
                      xaxis={"visible": False}, yaxis={"visible": False},
                      margin={"l": 20, "r": 20, "t": 40, "b": 20})
    return fig


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td{' class=r' if i in right else ''}>{html.escape(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
td.r{text-align:right;font-variant-numeric:tabular-nums}pre{background:#f6f6f6;padding:10px;font-size:12px;
overflow:auto}#js-errors{color:#b00}.note{color:#666;font-size:13px}"""

# Page errors are written into the page (a headless browser's DOM dump shows them; so does the reader).
_ERRORS_JS = """window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));
var el=document.getElementById('js-errors');if(el){el.textContent='page error: '+window.__errors.join('; ');}});"""


def report_html(sc: Scenario, result: Result, resolved_text: str) -> str:
    """The report page as one string (plotly.js inline)."""
    from plotly.offline import get_plotlyjs

    d = result.to_dict()
    p = d["plan"]
    summary = [
        ["model", d["model"]], ["GPUs", f"{d['gpus']} × {d['gpu']}"],
        ["plan", f"dp={p['dp']} tp={p['tp']} pp={p['pp']}" + (f" ep={p['ep']}" if p["ep"] > 1 else "") +
         (f" cp={p['cp']}" if p["cp"] > 1 else "") +
         f", micro-batch {p['micro_batch']} × {p['micro_batches']}, {p['pipeline_schedule']}, ZeRO {p['zero_stage']}"],
        ["network model", d["network"]], ["iteration time", format_time(d["iteration_time_s"]) + _band(d)],
        ["throughput", f"{d['samples_per_s']:,.1f} samples/s" + (
            f" ({d['tokens_per_s']:,.0f} tokens/s)" if d["tokens_per_s"] != d["samples_per_s"] else "")],
        ["model TFLOP/s per GPU", f"{d['tflops_per_gpu']:.1f}"], ["MFU", f"{100 * d['mfu']:.1f}%"],
        ["peak memory per GPU", format_size(d["peak_memory_bytes"])], ["tasks simulated", str(d["tasks"])],
    ]
    b = d["breakdown"]
    for key, label, _ in _BREAKDOWN:
        share = b[key] / d["iteration_time_s"] if d["iteration_time_s"] else 0.0
        summary.append([f"  {label}", f"{format_time(b[key])} ({100 * share:.1f}%)"])
    summary.append(["  comm hidden under compute", format_time(b["overlapped_comm_s"])])
    timeline, dropped = timeline_figure(result)
    coll = collective_rows(result.tasks)
    coll_rows = [[r.kind, r.op, r.algorithm, f"{r.ranks}" + (f" × {r.groups} groups" if r.groups > 1 else ""),
                  format_size(r.size_bytes), str(r.calls), format_time(r.total_s), format_time(r.mean_s)]
                 for r in coll]
    links = [[f"{a}→{b}", f"{100 * u:.1f}%"] for a, b, u in result.link_utilization_top]
    data = json.dumps(d).replace("</", "<\\/")
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>topotrain report: {html.escape(result.scenario)}</title><style>{_CSS}</style>",
        f"<script>{_ERRORS_JS}</script><script>{get_plotlyjs()}</script></head><body>",
        f"<h1>topotrain: {html.escape(result.scenario)}</h1><div id=js-errors></div>",
        "<h2>Summary</h2>", _table(["metric", "value"], summary, {1}),
        "<h2>Breakdown</h2>", _fig_html(breakdown_figure(result), "breakdown"),
        "<h2>Timeline</h2>", _fig_html(timeline, "timeline"),
        "<p class=note>One representative rank per stage: the ranks of a stage are symmetric and run the same "
        "tasks." + (f" {dropped} bars past the first {TIMELINE_MAX_BARS} are left out (the Perfetto trace, "
                    "<code>simulate --trace</code>, has them all)." if dropped else "") + "</p>",
        "<h2>Memory per stage</h2>", _fig_html(memory_figure(sc), "memory"),
        "<h2>Busiest links</h2>", _fig_html(links_figure(sc, result), "links"),
        _table(["link", "utilization"], links, {1}),
        "<h2>Collectives</h2>",
        _table(["kind", "op", "algorithm", "ranks", "size", "calls", "total time", "mean time"], coll_rows,
               {3, 4, 5, 6, 7}),
        "<h2>Scenario (resolved)</h2>", f"<pre>{html.escape(resolved_text)}</pre>",
        f"<script type=application/json id=result-data>{data}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(path: str | Path, sc: Scenario, result: Result, resolved_text: str) -> None:
    """Write :func:`report_html` to ``path`` atomically."""
    atomic_write_text(path, report_html(sc, result, resolved_text), make_parents=True)


def check_report_path(path: str | Path, field: str = "--html") -> None:
    """ConfigError unless ``path`` ends in .html/.htm (checked before any work)."""
    if Path(path).suffix.lower() not in (".html", ".htm"):
        raise ConfigError(field, f"{Path(path).name!r} is not an .html file", "name the report e.g. report.html")
