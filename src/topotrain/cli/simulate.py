"""``topotrain simulate``, ``report``, ``scale`` and ``schema``: one training iteration predicted (table,
JSON, trace, HTML report), weak scaling over GPU counts, and the scenario file's JSON Schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from topotrain.api import load_scenario, simulate
from topotrain.cli.common import DEFAULT_SCENARIO, SET_HELP, app, choices, console, friendly
from topotrain.cli.traces import is_trace_workload, refuse_trace, simulate_trace_cmd
from topotrain.report.draw import check_picture_path
from topotrain.report.html import check_report_path, write_report
from topotrain.report.trace import write_trace
from topotrain.scenario.cluster import example_path
from topotrain.scenario.load import dumps_resolved, json_schema, load_resolved
from topotrain.search.scaling import plot_scaling, scaling_curve
from topotrain.training.bands import describe as describe_band
from topotrain.util import jsonsafe, progress
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_size, format_time

#: The network models a scenario may name (``network:``; packet is for ``collective`` and validation).
SCENARIO_NETWORKS = ("analytical", "flow", "flow-async", "flow-eager")


def scenario_path(path: Path | None) -> Path:
    """``path``, or the built-in example scenario when none is given."""
    return path if path is not None else example_path(DEFAULT_SCENARIO)


def _print_result(r: Any) -> None:
    d = r.to_dict()
    p = d["plan"]
    t = Table(title=f"{d['model']} on {d['gpus']} x {d['gpu']} — dp={p['dp']} tp={p['tp']} pp={p['pp']}"
                    f"{' ep=' + str(p['ep']) if p['ep'] > 1 else ''}{' cp=' + str(p['cp']) if p['cp'] > 1 else ''}, "
                    f"{d['network']} network")
    t.add_column("metric")
    t.add_column("value", justify="right")
    band = d.get("error_band")
    t.add_row("communication", f"{d['comm']['library']} library, {d['routing']} routing")
    t.add_row("iteration time", format_time(d["iteration_time_s"]) + (
        "" if band is None else f"  ± {describe_band(band)}"))
    t.add_row("throughput", f"{d['samples_per_s']:,.1f} samples/s" + (
        f"  ({d['tokens_per_s']:,.0f} tokens/s)" if d["tokens_per_s"] != d["samples_per_s"] else ""))
    t.add_row("model TFLOP/s per GPU", f"{d['tflops_per_gpu']:.1f}")
    t.add_row("MFU", f"{100 * d['mfu']:.1f}%")
    b = d["breakdown"]
    blocking = "tensor/expert/context-parallel comm (blocking)" if p["cp"] > 1 else \
        "tensor/expert-parallel comm (blocking)"
    for key, label in (("compute_s", "compute"), ("tp_comm_s", blocking),
                       ("exposed_comm_s", "exposed DP/PP comm"), ("bubble_s", "pipeline bubble / idle"),
                       ("overlapped_comm_s", "comm hidden under compute"),
                       ("input_stall_s", "waiting for the host input pipeline")):
        if key == "input_stall_s" and not b.get(key):
            continue
        share = b[key] / d["iteration_time_s"] if d["iteration_time_s"] else 0.0
        t.add_row(f"  {label}", f"{format_time(b[key])}  ({100 * share:.1f}%)")
    t.add_row("peak memory per GPU", format_size(d["peak_memory_bytes"]))
    t.add_row("tasks simulated", str(d["tasks"]))
    for i, lk in enumerate(d["busiest_links"][:3]):
        t.add_row("busiest links" if i == 0 else "", f"{lk['src']}→{lk['dst']}  {100 * lk['utilization']:.1f}%")
    console.print(t)


@app.command("simulate")
@friendly
def simulate_cmd(scenario: Path | None = typer.Argument(None, help="scenario YAML (default: built-in example)"),
                 set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="FIELD=VALUE"),
                 network: str | None = typer.Option(None, "--network", help="the network model (default: the "
                                                     "scenario's)", **choices(SCENARIO_NETWORKS)),
                 as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
                 trace: Path | None = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace"),
                 html_out: Path | None = typer.Option(None, "--html", help="write a self-contained HTML report"),
                 resolved: bool = typer.Option(False, "--resolved", help="print the scenario with every default "
                                               "filled in (YAML; JSON with --json) and exit without simulating"),
                 ) -> None:
    """Predict one training iteration: time, throughput, MFU, breakdown, memory. SCENARIO may also be a
    recorded step (a workload from `trace import`, or a scenario whose workload: names one; docs/traces.md)."""
    overrides = list(set_) + ([f"network={network}"] if network else [])
    if scenario is not None and is_trace_workload(scenario):  # a recorded step, replayed (cli/traces.py)
        simulate_trace_cmd(scenario, overrides, as_json, trace, html_out, resolved)
        return
    if html_out is not None:
        check_report_path(html_out)
    if resolved:
        print(dumps_resolved(load_resolved(scenario_path(scenario), overrides), as_json), end="" if not as_json
              else "\n")
        return
    sc = load_scenario(scenario_path(scenario), overrides)
    r = simulate(sc)
    if trace is not None:
        write_trace(r, trace, sc.cluster.topology)
    if html_out is not None:
        _write_html(html_out, sc, r, scenario_path(scenario), overrides)
    if as_json:
        print(jsonsafe.dumps(r.to_dict()))
    else:
        _print_result(r)
        if trace is not None:
            console.print(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")
        if html_out is not None:
            console.print(f"report written to {html_out}")


def _write_html(path: Path, sc: Any, r: Any, scenario: Path, overrides: list[str]) -> None:
    write_report(path, sc, r, dumps_resolved(load_resolved(scenario, overrides)))


@app.command("report")
@friendly
def report_cmd(scenario: Path | None = typer.Argument(None, help="scenario YAML (default: built-in example)"),
               out: Path = typer.Option(Path("report.html"), "-o", "--out", help="the HTML file to write"),
               set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="FIELD=VALUE"),
               network: str | None = typer.Option(None, "--network", help="the network model (default: the "
                                                  "scenario's)", **choices(SCENARIO_NETWORKS))) -> None:
    """Simulate one iteration and write one self-contained HTML report (charts work offline)."""
    refuse_trace(scenario, "report")
    check_report_path(out, "--out")
    overrides = list(set_) + ([f"network={network}"] if network else [])
    path = scenario_path(scenario)
    with console.status("simulating"):
        sc = load_scenario(path, overrides)
        r = simulate(sc)
    _write_html(out, sc, r, path, overrides)
    console.print(f"report written to {out} ({format_time(r.iteration_time_s)} per iteration)")


@app.command("schema")
@friendly
def schema_cmd() -> None:
    """Print the JSON Schema of a scenario file (point your editor's YAML language server at it)."""
    print(jsonsafe.dumps(json_schema(), indent=2))


@app.command("scale")
@friendly
def scale_cmd(scenario: Path | None = typer.Argument(None, help="scenario YAML (default: built-in example)"),
              gpus: str = typer.Option("8:1024", "--gpus", help="LOW:HIGH GPU counts (powers of two)"),
              set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="FIELD=VALUE"),
              png: Path | None = typer.Option(None, "-o", "--out", "--png", help="plot throughput and efficiency "
                                              "here, the format from the extension: .png, .svg or .pdf"),
              as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Weak scaling: throughput and efficiency against ideal linear scaling over GPU counts."""
    refuse_trace(scenario, "scale")
    parts = gpus.split(":")
    if len(parts) != 2 or not all(x.isdigit() for x in parts) or int(parts[0]) < 1 or int(parts[1]) < int(parts[0]):
        raise ConfigError("--gpus", f"cannot read {gpus!r}", "write LOW:HIGH, e.g. 8:1024")
    if png is not None:
        check_picture_path(png)
    with progress.task("scaling points") as prog:
        points = scaling_curve(scenario_path(scenario), int(parts[0]), int(parts[1]), list(set_),
                               progress=lambda i, n: prog.update(i, total=n))
    if as_json:
        print(jsonsafe.dumps([p.to_dict() for p in points]))
    else:
        t = Table(title="weak scaling (per-GPU batch fixed)")
        for col in ("GPUs", "servers", "iteration", "samples/s", "ideal samples/s", "efficiency", "MFU", "network"):
            t.add_column(col, justify="left" if col == "network" else "right")
        for p in points:
            pm = p.iteration_time_s_high / p.iteration_time_s - 1.0 if p.iteration_time_s else 0.0
            t.add_row(str(p.gpus), str(p.servers), format_time(p.iteration_time_s) + (
                      f" ± {100 * pm:.0f}%" if 0 < pm < float("inf") else ""), f"{p.samples_per_s:,.0f}",
                      f"{p.ideal_samples_per_s:,.0f}", f"{100 * p.efficiency:.1f}%", f"{100 * p.mfu:.1f}%",
                      p.network)
        console.print(t)
        for text in dict.fromkeys(p.band.partition(" ")[2] for p in points if p.band):
            console.print(f"band at {', '.join(str(p.gpus) for p in points if p.band.partition(' ')[2] == text)} "
                          f"GPUs: {text}")
        if any(p.network != "as in the file" for p in points):
            console.print("network: the file's size parameters are kept at its own size and dropped at the "
                          "others, where the builder sizes the network for the endpoints (sizes shown above)")
    if png is not None:
        name = scenario_path(scenario).stem
        plot_scaling(points, png, title=f"weak scaling of {name} (per-GPU batch fixed)")
        if not as_json:
            console.print(f"plot written to {png}")
