"""The ``topotrain`` command: time collectives and training iterations on a described cluster.

With no sub-command it runs the main job on the built-in default scenario.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from topotrain.util import jsonsafe
from topotrain.util.errors import ConfigError, problems_of
from topotrain.util.units import format_size, format_time, parse_size

app = typer.Typer(no_args_is_help=False, help=__doc__, pretty_exceptions_enable=False, rich_markup_mode=None)
topo_app = typer.Typer(help="Inspect a cluster topology.", rich_markup_mode=None)
app.add_typer(topo_app, name="topo")

console = Console(width=None if sys.stdout.isatty() else 150)
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CLUSTER = "eflops-bigraph"
DEFAULT_SCENARIO = "resnet50-eflops"


#: Parameters of the commands that name files the command reads: no output of the run may replace them.
_INPUT_PARAMS = frozenset({"cluster", "scenario", "space", "best", "vs", "jobs"})
#: Parameters that name a file the command writes (checked before the work starts), and their options.
_OUTPUT_PARAMS = {"png": "--png", "trace": "--trace", "html_out": "--html"}
#: Longest error line the CLI prints (a 100 KB value typed by mistake must not give a 100 KB line).
ERROR_LINE_MAX_CHARS = 300


def _one_line(text: str, limit: int = ERROR_LINE_MAX_CHARS) -> str:
    """``text`` with control characters made visible, cut to ``limit`` characters (the cut marked)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else f"{text[:limit - 25]}… [{len(text) - limit + 25} more characters]"


def _friendly(fn: F) -> F:
    """Bad input → one line on stderr, exit code 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from topotrain.util.atomic import check_output_path, protect_inputs

        try:
            with protect_inputs(v for k, v in kwargs.items() if k in _INPUT_PARAMS and isinstance(v, Path)):
                for k, v in kwargs.items():  # refused outputs are refused before any work is done
                    if k in _OUTPUT_PARAMS and isinstance(v, Path):
                        check_output_path(v, field=_OUTPUT_PARAMS[k], make_parents=True)
                return fn(*args, **kwargs)
        except ConfigError as e:
            for problem in problems_of(e):
                print(f"error: {_one_line(ConfigError.__str__(problem))}", file=sys.stderr)
            raise typer.Exit(2) from None
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
            print(f"error: {_one_line(str(e.filename))}: {e.strerror}", file=sys.stderr)
            raise typer.Exit(2) from None
        except BrokenPipeError:
            raise
        except (typer.Exit, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug, not bad input: still one line (TOPOTRAIN_DEBUG=1 for the traceback)
            if os.environ.get("TOPOTRAIN_DEBUG"):
                raise
            import yaml

            if isinstance(e, yaml.YAMLError):  # a loader that let the parser's error through: still bad input
                mark = getattr(e, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                what = getattr(e, "problem", None) or str(e).splitlines()[0]
                print(f"error: malformed YAML{where}: {_one_line(str(what))} (fix the YAML syntax)",
                      file=sys.stderr)
                raise typer.Exit(2) from None
            print(f"error: internal error {type(e).__name__}: {_one_line(str(e))} (please report it; "
                  "TOPOTRAIN_DEBUG=1 shows the traceback)", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _cluster_path(path: Path | None) -> Path:
    from topotrain.scenario.cluster import example_path

    return path if path is not None else example_path(DEFAULT_CLUSTER)


def _parse_range(spec: str) -> list[int]:
    """``1MiB:1GiB`` → powers of two from 1 MiB to 1 GiB (``:x4`` for another factor)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError("sweep-sizes", f"cannot read {spec!r}", "write LOW:HIGH, e.g. 1MiB:1GiB")
    lo = int(parse_size(parts[0], "sweep-sizes"))
    hi = int(parse_size(parts[1], "sweep-sizes"))
    factor = 2
    if len(parts) == 3:
        try:
            factor = int(parts[2].lstrip("x"))
        except ValueError:
            raise ConfigError("sweep-sizes", f"bad factor {parts[2]!r}", "write e.g. 1MiB:1GiB:x4") from None
        if factor < 2:
            raise ConfigError("sweep-sizes", "factor must be >= 2", "write e.g. 1MiB:1GiB:x2")
    if hi < lo:
        raise ConfigError("sweep-sizes", f"{parts[1]} is below {parts[0]}", "write LOW:HIGH")
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


@topo_app.command("show")
@_friendly
def topo_show(cluster: Path | None = typer.Argument(None, help="cluster/scenario YAML (default: built-in example)"),
              png: Path | None = typer.Option(None, "--png", help="draw the topology here (.png, .svg or .pdf: "
                                              "layered, large clusters aggregated)"),
              as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Summary of a cluster's topology: nodes, links, diameter, bisection bandwidth."""
    from topotrain.report.draw import check_picture_path, draw_topology
    from topotrain.scenario.cluster import load_cluster
    from topotrain.topology.metrics import summarize

    if png is not None:
        check_picture_path(png)
    c = load_cluster(_cluster_path(cluster))
    s = summarize(c.topology)
    d = s.to_dict() if hasattr(s, "to_dict") else dict(vars(s))
    d = {"cluster": c.name, "network": c.network, "gpu": c.gpu, "servers": c.servers, **d}
    if as_json:
        print(jsonsafe.dumps(d, default=str))
    else:
        t = Table(title=f"topology {c.name}")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in d.items():
            t.add_row(str(k), str(v))
        console.print(t)
    if png is not None:
        draw_topology(c.topology, png)
        if not as_json:
            console.print(f"wrote {png}")


@app.command("collective")
@_friendly
def collective(cluster: Path | None = typer.Argument(None, help="cluster/scenario YAML (default: built-in example)"),
               op: str = typer.Option("allreduce", "--op", help="allreduce, reduce-scatter, allgather, broadcast, "
                                      "reduce or all-to-all (torch/nccl-tests spellings too: all_reduce, alltoall)"),
               algo: str = typer.Option("auto", "--algo", help="ring, halving-doubling, tree, hierarchical, "
                                        "torus2d, hdrm, direct, pairwise, or auto"),
               size: str = typer.Option("256MiB", "--size", help="per-rank buffer, as nccl-tests"),
               network: str = typer.Option("flow", "--network", help="flow, flow-async, flow-eager or analytical; "
                                           "packet: ns-3 TCP, for validation (pip install ns3)"),
               sweep_sizes: str | None = typer.Option(None, "--sweep-sizes", help="LOW:HIGH, e.g. 1MiB:1GiB"),
               as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Time one collective (or a sweep of sizes) with NCCL's algbw/busbw."""
    from rich.progress import Progress

    from topotrain.api import time_collective
    from topotrain.collectives.schedule import parse_op
    from topotrain.scenario.cluster import load_cluster

    cop = parse_op(op, "--op")
    sizes = _parse_range(sweep_sizes) if sweep_sizes else [int(parse_size(size, "size"))]
    c = load_cluster(_cluster_path(cluster))
    reports = []
    with Progress(console=Console(stderr=True), transient=True, disable=as_json or len(sizes) < 2) as prog:
        task = prog.add_task(f"timing {cop.value}", total=len(sizes))
        for s in sizes:
            reports.append(time_collective(c, cop, algo, s, network))
            prog.advance(task)
    if as_json:
        objs = [r.to_dict() for r in reports]
        print(jsonsafe.dumps(objs[0] if len(objs) == 1 else objs))
        return
    print(nccl_tests_table(reports, f"{cop.value} on {c.name}: {reports[0].ranks} ranks, {network} network"))


def nccl_tests_table(reports: list[Any], title: str) -> str:
    """Rows as nccl-tests prints them (size in bytes, element count and type, time in µs, algbw and busbw in
    GB/s), then the algorithm and busiest link, and the closing "Avg bus bandwidth" line."""
    reduce_ops = {"allreduce", "reduce-scatter", "reduce"}
    head = (f"#\n# {title}\n#\n"
            f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>7} {'busbw':>7}"
            f"  {'algorithm':<22} busiest link (utilization)\n"
            f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}")
    lines = [head]
    for r in reports:
        name = r.algorithm + (" (auto)" if r.chosen_automatically else "")
        link = f"{r.busiest_link[0]}→{r.busiest_link[1]} ({100 * r.busiest_link_utilization:.0f}%)"
        lines.append(f"  {r.size_bytes:>12d} {r.size_bytes // 4:>12d} {'float':>6} "
                     f"{'sum' if r.op in reduce_ops else 'none':>6} {r.time_s * 1e6:>10.1f} "
                     f"{r.algbw_gb_per_s:>7.2f} {r.busbw_gb_per_s:>7.2f}  {name:<22} {link}")
    avg = sum(r.busbw_gb_per_s for r in reports) / len(reports)
    lines.append(f"# Avg bus bandwidth    : {avg:.3f}")
    return "\n".join(lines)


def _scenario_path(path: Path | None) -> Path:
    from topotrain.scenario.cluster import example_path

    return path if path is not None else example_path(DEFAULT_SCENARIO)


def _band_text(band: dict[str, Any]) -> str:
    """``17.4% (80% band, 16 validation rows of transformer/dense/multi-node)``; unbounded where the rows
    cannot back the level."""
    pm = band["plus_minus"]
    width = "unbounded" if pm is None or pm == float("inf") else f"{100 * pm:.1f}%"
    return f"{width} ({100 * band['level']:.0f}% band, {band['from_rows']} validation rows of {band['from_regime']})"


def _print_result(r: Any) -> None:
    from topotrain.util.units import format_bandwidth  # noqa: F401

    d = r.to_dict()
    p = d["plan"]
    t = Table(title=f"{d['model']} on {d['gpus']} x {d['gpu']} — dp={p['dp']} tp={p['tp']} pp={p['pp']}"
                    f"{' ep=' + str(p['ep']) if p['ep'] > 1 else ''}{' cp=' + str(p['cp']) if p['cp'] > 1 else ''}, "
                    f"{d['network']} network")
    t.add_column("metric")
    t.add_column("value", justify="right")
    band = d.get("error_band")
    t.add_row("iteration time", format_time(d["iteration_time_s"]) + (
        "" if band is None else f"  ± {_band_text(band)}"))
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
@_friendly
def simulate_cmd(scenario: Path | None = typer.Argument(None, help="scenario YAML (default: built-in example)"),
                 set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set plan.tp=8"),
                 network: str | None = typer.Option(None, "--network",
                                                     help="analytical, flow, flow-async or flow-eager"),
                 as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
                 trace: Path | None = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace"),
                 html_out: Path | None = typer.Option(None, "--html", help="write a self-contained HTML report"),
                 resolved: bool = typer.Option(False, "--resolved", help="print the scenario with every default "
                                               "filled in (YAML; JSON with --json) and exit without simulating"),
                 ) -> None:
    """Predict one training iteration: time, throughput, MFU, breakdown, memory."""
    from topotrain.report.trace import write_trace
    from topotrain.scenario.load import load_scenario
    from topotrain.training.simulate import simulate

    overrides = list(set_) + ([f"network={network}"] if network else [])
    if html_out is not None:
        from topotrain.report.html import check_report_path

        check_report_path(html_out)
    if resolved:
        from topotrain.scenario.load import dumps_resolved, load_resolved

        print(dumps_resolved(load_resolved(_scenario_path(scenario), overrides), as_json), end="" if not as_json
              else "\n")
        return
    sc = load_scenario(_scenario_path(scenario), overrides)
    r = simulate(sc)
    if trace is not None:
        write_trace(r, trace, sc.cluster.topology)
    if html_out is not None:
        _write_html(html_out, sc, r, _scenario_path(scenario), overrides)
    if as_json:
        print(jsonsafe.dumps(r.to_dict()))
    else:
        _print_result(r)
        if trace is not None:
            console.print(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")
        if html_out is not None:
            console.print(f"report written to {html_out}")


def _write_html(path: Path, sc: Any, r: Any, scenario: Path, overrides: list[str]) -> None:
    from topotrain.report.html import write_report
    from topotrain.scenario.load import dumps_resolved, load_resolved

    write_report(path, sc, r, dumps_resolved(load_resolved(scenario, overrides)))


@app.command("report")
@_friendly
def report_cmd(scenario: Path | None = typer.Argument(None, help="scenario YAML (default: built-in example)"),
               out: Path = typer.Option(Path("report.html"), "--out", "-o", help="the HTML file to write"),
               set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set plan.tp=8"),
               network: str | None = typer.Option(None, "--network",
                                                  help="analytical, flow, flow-async or flow-eager")) -> None:
    """Simulate one iteration and write one self-contained HTML report (charts work offline)."""
    from topotrain.report.html import check_report_path
    from topotrain.scenario.load import load_scenario
    from topotrain.training.simulate import simulate

    check_report_path(out, "--out")
    overrides = list(set_) + ([f"network={network}"] if network else [])
    path = _scenario_path(scenario)
    with console.status("simulating"):
        sc = load_scenario(path, overrides)
        r = simulate(sc)
    _write_html(out, sc, r, path, overrides)
    console.print(f"report written to {out} ({format_time(r.iteration_time_s)} per iteration)")


@app.command("schema")
@_friendly
def schema_cmd() -> None:
    """Print the JSON Schema of a scenario file (point your editor's YAML language server at it)."""
    from topotrain.scenario.load import json_schema

    print(jsonsafe.dumps(json_schema(), indent=2))


@app.command("scale")
@_friendly
def scale_cmd(scenario: Path | None = typer.Argument(None, help="scenario YAML (default: built-in example)"),
              gpus: str = typer.Option("8:1024", "--gpus", help="LOW:HIGH GPU counts (powers of two)"),
              set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set plan.tp=8"),
              png: Path | None = typer.Option(None, "--png", help="plot throughput and efficiency here (.png, "
                                              ".svg or .pdf)"),
              as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Weak scaling: throughput and efficiency against ideal linear scaling over GPU counts."""
    from rich.progress import Progress

    from topotrain.search.scaling import plot_scaling, scaling_curve

    parts = gpus.split(":")
    if len(parts) != 2 or not all(x.isdigit() for x in parts) or int(parts[0]) < 1 or int(parts[1]) < int(parts[0]):
        raise ConfigError("--gpus", f"cannot read {gpus!r}", "write LOW:HIGH, e.g. 8:1024")
    if png is not None:
        from topotrain.report.draw import check_picture_path

        check_picture_path(png)
    with Progress(console=Console(stderr=True), transient=True, disable=as_json) as prog:
        task = prog.add_task("simulating", total=None)
        points = scaling_curve(_scenario_path(scenario), int(parts[0]), int(parts[1]), list(set_),
                               progress=lambda i, n: prog.update(task, completed=i, total=n))
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
        if any(p.network != "as in the file" for p in points):
            console.print("network: the file's size parameters are kept at its own size and dropped at the "
                          "others, where the builder sizes the network for the endpoints (sizes shown above)")
    if png is not None:
        name = _scenario_path(scenario).stem
        plot_scaling(points, png, title=f"weak scaling of {name} (per-GPU batch fixed)")
        if not as_json:
            console.print(f"plot written to {png}")


@app.command("profile")
@_friendly
def profile_cmd(model: str = typer.Argument("resnet50", help="built-in model name"),
                batch: int = typer.Option(32, "--batch", help="micro-batch to measure"),
                out: Path = typer.Option(Path("profile.json"), "--out", help="profile table (JSON or CSV)"),
                device: str = typer.Option("auto", "--device", help="auto, cuda or cpu"),
                repeats: int = typer.Option(5, "--repeats"),
                check: bool = typer.Option(False, "--check",
                                           help="print the roofline's prediction beside the measurement, per "
                                                "layer kind (a GPU table only)")) -> None:
    """Measure per-layer times with torch on the local GPU (CPU otherwise, clearly labeled)."""
    from topotrain.compute.profile import measure_profile, save_profile
    from topotrain.workload.zoo import get_model

    if batch < 1:
        raise ConfigError("--batch", f"must be >= 1, got {batch}", "give e.g. --batch 32")
    if out.suffix.lower() not in (".json", ".csv"):  # checked before minutes of measuring, not after
        raise ConfigError("--out", f"unknown profile extension {out.suffix!r}", "use a .json or .csv file")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise ConfigError("--out", f"directory {out.parent} does not exist", "create it first or choose another path")
    net = get_model(model)
    with console.status(f"measuring {len(net.layers)} layers of {model} at batch {batch} ({repeats} repeats)"):
        table = measure_profile(net, batch, device, repeats=repeats)
    save_profile(table, out)
    total = sum(e.fwd_s + e.bwd_s for e in table.entries.values())
    console.print(f"measured {len(table.entries)} layers of {model} at batch {batch} on {table.device} "
                  f"({table.gpu}): {format_time(total)} per iteration; wrote {out}")
    if check:
        if table.measured_on_cpu:
            console.print("no roofline check: the table was measured on the CPU (the roofline describes a GPU)")
        else:
            from topotrain.compute.check import format_check, roofline_check

            console.print(format_check(roofline_check(table, net)), markup=False, highlight=False)


testbed_app = typer.Typer(rich_markup_mode=None, help="Emulated cluster from network namespaces (root only).")
app.add_typer(testbed_app, name="testbed")


def _testbed_preflight(scale: float) -> None:
    """One clear error unless namespaces can be made here and ``scale`` is in (0, 1]."""
    from topotrain.testbed.netns import netns_available

    ok, why = netns_available()
    if not ok:
        raise ConfigError("testbed", f"network namespaces are not available: {why}", "run as root with iproute2")
    if not 0 < scale <= 1:
        raise ConfigError("--scale", f"must be in (0, 1], got {scale}", "e.g. --scale 0.002")


@testbed_app.command("compare")
@_friendly
def testbed_compare(cluster: Path | None = typer.Argument(None, help="small cluster YAML (default: built-in cases)"),
                    cases: str = typer.Option("", "--cases", help="built-in cases, comma-separated"),
                    algo: str = typer.Option("", "--algo", help="e.g. ring,halving-doubling,hdrm (default: the "
                                             "case's own list; with a cluster file: ring,halving-doubling)"),
                    sizes: str = typer.Option("1MiB,4MiB", "--sizes", help="comma-separated sizes"),
                    scale: float = typer.Option(1 / 500, "--scale", help="bandwidth scale (1/500: 100G→200M)"),
                    repeats: int = typer.Option(3, "--repeats"),
                    png: Path | None = typer.Option(None, "--png", help="plot measured vs predicted")) -> None:
    """Run collectives for real over shaped veth links and compare with the flow and analytical models."""
    from topotrain.testbed.compare import CASES, plot, run_case, summarize

    _testbed_preflight(scale)
    algos = [a.strip() for a in algo.split(",") if a.strip()]
    if cluster is not None and not algos:
        algos = ["ring", "halving-doubling"]
    size_list = [int(parse_size(x, "--sizes")) for x in sizes.split(",") if x.strip()]
    console.print(f"links shaped to bandwidth x {scale:g} (100 Gb/s → {100e3 * scale:.4g} Mb/s)")
    jobs = []
    if cluster is not None:
        from topotrain.scenario.cluster import load_cluster

        c = load_cluster(cluster)
        jobs.append((c.name, c.topology, algos, size_list))
    else:
        names = [x for x in cases.split(",") if x] or list(CASES)
        for n in names:
            if n not in CASES:
                raise ConfigError("--cases", f"unknown case {n!r}", f"known: {', '.join(CASES)}")
            jobs.append((n, CASES[n].build(), algos or list(CASES[n].algorithms), size_list))
    results = []
    for name, topo, algs, szs in jobs:
        results += run_case(topo, algs, szs, scale, repeats, name=name)
    t = Table(title="testbed: measured vs predicted")
    for col in ("case", "algorithm", "size", "measured", "flow", "analytical", "flow-eager", "error (flow)",
                "error (eager)"):
        t.add_column(col, justify="left" if col in ("case", "algorithm") else "right")
    for r in results:
        t.add_row(r.case, r.algorithm, format_size(r.size_bytes), format_time(r.measured_s),
                  format_time(r.flow_s) if r.flow_s == r.flow_s else "-",
                  format_time(r.analytical_s) if r.analytical_s == r.analytical_s else "-",
                  format_time(r.eager_s) if r.eager_s == r.eager_s else "-",
                  f"{100 * r.error:+.0f}%" if r.error == r.error else "-",
                  f"{100 * r.eager_error:+.0f}%" if r.eager_error == r.eager_error else "-")
    console.print(t)
    summ = summarize(results)
    if summ.get("n"):
        console.print(f"|error| flow: median {100 * summ['flow_median']:.0f}%, worst {100 * summ['flow_worst']:.0f}%")
        if "eager_median" in summ:
            console.print(f"|error| flow-eager: median {100 * summ['eager_median']:.0f}%, "
                          f"worst {100 * summ['eager_worst']:.0f}%")
    if png is not None:
        plot(results, png)
        console.print(f"plot written to {png}")


@testbed_app.command("ddp")
@_friendly
def testbed_ddp(cluster: Path | None = typer.Argument(None, help="small cluster YAML (default: --case)"),
                case: str = typer.Option("bigraph", "--case", help="built-in case when no cluster file is given"),
                algo: str = typer.Option("hdrm,ring", "--algo", help="our allreduce algorithms for the DDP hook"),
                steps: int = typer.Option(5, "--steps", help="timed training steps per algorithm"),
                width: int = typer.Option(256, "--width", help="hidden width of the MLP"),
                scale: float = typer.Option(1 / 500, "--scale", help="bandwidth scale (1/500: 100G→200M)"),
                gloo: bool = typer.Option(True, "--gloo/--no-gloo", help="also train with DDP's own allreduce"),
                ) -> None:
    """Train a small MLP with DDP on the emulated cluster, gradients averaged by our comm hook, and compare
    each step with compute + predicted bucket allreduces."""
    from topotrain.testbed.compare import CASES, run_ddp

    _testbed_preflight(scale)
    algos = [a.strip() for a in algo.split(",") if a.strip()]
    if cluster is not None:
        from topotrain.scenario.cluster import load_cluster

        c = load_cluster(cluster)
        name, topo = c.name, c.topology
    else:
        if case not in CASES:
            raise ConfigError("--case", f"unknown case {case!r}", f"known: {', '.join(CASES)}")
        name, topo = case, CASES[case].build()
    console.print(f"links shaped to bandwidth x {scale:g} (100 Gb/s → {100e3 * scale:.4g} Mb/s)")
    results = run_ddp(topo, algos, steps, scale, name=name, gloo=gloo, width=width)
    t = Table(title=f"testbed DDP on {name}: seconds per training step")
    for col in ("algorithm", "measured", "compute", "gradient", "flow", "flow-eager", "error (eager)",
                "loss first → last", "replicas equal"):
        t.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in results:
        t.add_row(r.algorithm, format_time(r.step_s), format_time(r.compute_s),
                  format_size(sum(r.bucket_bytes)) if r.bucket_bytes else "-",
                  format_time(r.flow_s) if r.flow_s == r.flow_s else "-",
                  format_time(r.eager_s) if r.eager_s == r.eager_s else "-",
                  f"{100 * r.eager_error:+.0f}%" if r.eager_s == r.eager_s else "-",
                  f"{r.loss_first:.4f} → {r.loss_last:.4f}", "yes" if r.replicas_equal else "NO")
    console.print(t)


@testbed_app.command("clean")
@_friendly
def testbed_clean(force: bool = typer.Option(False, "--force", help="also remove runs whose process is alive")
                  ) -> None:
    """Remove the namespaces, veths, processes and temporary directories that testbed runs left behind
    (runs whose process is gone; --force for live ones too)."""
    from topotrain.testbed.netns import clean, live_runs

    live = {} if force else live_runs()
    left = clean(force=force)
    console.print(f"removed {len(left)} leftover(s)" + (f": {', '.join(left)}" if left else ""))
    if live:
        runs = ", ".join(f"{t} (pid {p})" if p else t for t, p in live.items())
        console.print(f"left {len(live)} live run(s) alone: {runs} (--force removes them too)")


def _register_search() -> None:
    from topotrain.cli.search import register

    register(app, _friendly, console)


_register_search()


def _register_validate() -> None:
    from topotrain.cli.validate import register

    register(app, _friendly, console)


_register_validate()


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("topotrain")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        print(f"topotrain {v}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context,
          _show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                             help="print the version and exit")) -> None:
    """Run the main job on the built-in default scenario when no sub-command is given."""
    if ctx.invoked_subcommand is None:
        console.print("topotrain: simulating the built-in default scenario (ResNet-50 data-parallel on 16 EFLOPS "
                      "servers, BiGraph). See `topotrain --help` for more.")
        simulate_cmd(None, [], None, False, None, None, False)


def main() -> None:
    """The console entry point. A reader that closes stdout early (``... --json | head -c1``) ends the run
    quietly; numpy's floating-point warnings never reach stderr (non-finite results are handled)."""
    import warnings

    import numpy as np

    np.seterr(all="ignore")
    warnings.filterwarnings("ignore", module=r"numpy(\.|$)")  # e.g. "Mean of empty slice": results say it
    try:
        app()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # Python would flush stdout again at exit and fail
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)  # 128 + SIGPIPE, as a shell tool killed by the pipe
