"""``topotrain testbed compare``, ``ddp`` and ``clean``: collectives and DDP training run for real over an
emulated cluster of network namespaces and shaped veth links (root only), beside the models' predictions.

torch is imported by :mod:`topotrain.testbed` when a run starts, so importing this module does not import it.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.scenario.cluster import load_cluster
from topotrain.testbed.compare import CASES, plot, run_case, run_ddp, summarize
from topotrain.testbed.netns import clean, live_runs, netns_available
from topotrain.util import progress
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_size, format_time, parse_size

testbed_app = typer.Typer(rich_markup_mode=None, help="Emulated cluster from network namespaces (root only).")
app.add_typer(testbed_app, name="testbed")


def _testbed_preflight(scale: float) -> None:
    """One clear error unless namespaces can be made here and ``scale`` is in (0, 1]."""
    ok, why = netns_available()
    if not ok:
        raise ConfigError("testbed", f"network namespaces are not available: {why}", "run as root with iproute2")
    if not 0 < scale <= 1:
        raise ConfigError("--scale", f"must be in (0, 1], got {scale}", "e.g. --scale 0.002")


@testbed_app.command("compare")
@friendly
def testbed_compare(cluster: Path | None = typer.Argument(None, help="small cluster YAML (default: built-in cases)"),
                    cases: str = typer.Option("", "--cases", help="built-in cases, comma-separated"),
                    algo: str = typer.Option("", "--algo", help="e.g. ring,halving-doubling,hdrm (default: the "
                                             "case's own list; with a cluster file: ring,halving-doubling)"),
                    sizes: str = typer.Option("1MiB,4MiB", "--sizes", help="comma-separated sizes"),
                    scale: float = typer.Option(1 / 500, "--scale", help="bandwidth scale (1/500: 100G→200M)"),
                    repeats: int = typer.Option(3, "--repeats"),
                    png: Path | None = typer.Option(None, "-o", "--out", "--png",
                                                    help="plot measured vs predicted here, the format from the "
                                                    "extension")) -> None:
    """Run collectives for real over shaped veth links and compare with the flow and analytical models."""
    _testbed_preflight(scale)
    algos = [a.strip() for a in algo.split(",") if a.strip()]
    if cluster is not None and not algos:
        algos = ["ring", "halving-doubling"]
    size_list = [int(parse_size(x, "--sizes")) for x in sizes.split(",") if x.strip()]
    console.print(f"links shaped to bandwidth x {scale:g} (100 Gb/s → {100e3 * scale:.4g} Mb/s)")
    jobs = []
    if cluster is not None:
        c = load_cluster(cluster)
        jobs.append((c.name, c.topology, algos, size_list))
    else:
        names = [x for x in cases.split(",") if x] or list(CASES)
        for n in names:
            if n not in CASES:
                raise ConfigError("--cases", f"unknown case {n!r}", f"known: {', '.join(CASES)}")
            jobs.append((n, CASES[n].build(), algos or list(CASES[n].algorithms), size_list))
    results = []
    with progress.task("testbed cases", total=len(jobs)) as bar:
        for name, topo, algs, szs in jobs:
            results += run_case(topo, algs, szs, scale, repeats, name=name)
            bar.advance()
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
@friendly
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
    _testbed_preflight(scale)
    algos = [a.strip() for a in algo.split(",") if a.strip()]
    if cluster is not None:
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
@friendly
def testbed_clean(force: bool = typer.Option(False, "--force", help="also remove runs whose process is alive")
                  ) -> None:
    """Remove the namespaces, veths, processes and temporary directories that testbed runs left behind
    (runs whose process is gone; --force for live ones too)."""
    live = {} if force else live_runs()
    left = clean(force=force)
    console.print(f"removed {len(left)} leftover(s)" + (f": {', '.join(left)}" if left else ""))
    if live:
        runs = ", ".join(f"{t} (pid {p})" if p else t for t, p in live.items())
        console.print(f"left {len(live)} live run(s) alone: {runs} (--force removes them too)")
