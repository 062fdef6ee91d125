"""``topotrain place``: a queue of jobs (a job file, or a production trace) on a shared cluster or a mixed
fleet, under several placement policies, side by side."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.placement.fleet import Fleet, load_fleet
from topotrain.placement.jobs import Job, load_jobs
from topotrain.placement.scheduler import POLICIES, PolicyResult, compare
from topotrain.placement.summary import overall, per_group
from topotrain.placement.timing import CONTENTION, Timer
from topotrain.placement.trace import read_openb, resample, trace_jobs, window
from topotrain.report.draw import check_picture_path
from topotrain.util import jsonsafe
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_time

FORMATS = ("jobs", "openb")


def trace_for(fleet: Fleet, jobs_file: Path, fmt: str, from_day: float, days: float | None,
              resample_n: int | None, seed: int, algorithm: str) -> tuple[list[Job], str]:
    """The jobs of ``jobs_file`` read as ``fmt`` (and what was done to get them, in words)."""
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}", "use " + " or ".join(FORMATS))
    if fmt == "jobs":
        for opt, given in (("--from-day", from_day != 0.0), ("--days", days is not None),
                           ("--resample", resample_n is not None)):
            if given:
                raise ConfigError(opt, "applies to a trace (--format openb) only", f"drop {opt}")
        return load_jobs(jobs_file), ""
    read = read_openb(jobs_file)
    if resample_n is not None:
        tasks = resample(read.tasks, resample_n, 7.0 if days is None else days, seed)
        how = f"{resample_n:,} tasks resampled (seed {seed}) from the trace's {len(read.tasks):,} GPU tasks"
    else:
        tasks = window(read.tasks, from_day, days)
        how = f"{len(tasks):,} GPU tasks of days {from_day:g}–{'end' if days is None else f'{from_day + days:g}'}"
    jobs, relaxed = trace_jobs(tasks, fleet, [Timer(g.cluster, algorithm) for g in fleet.groups], algorithm)
    how += (f" ({read.rows:,} rows: {read.no_gpu:,} without GPU and {read.no_run_time:,} that never ran left out, "
            f"{read.shared_gpu:,} GPU-sharing tasks given a whole GPU; {relaxed:,} tasks' GPU types not in the "
            "fleet, run on any group)")
    return jobs, how


def as_dict(r: PolicyResult) -> dict[str, Any]:
    o = overall(r)
    return {"policy": r.policy, "mean_jct_s": r.mean_jct_s, "p95_jct_s": o.p95_jct_s, "mean_queue_s": r.mean_queue_s,
            "gpu_utilization": r.gpu_utilization, "window_utilization": o.window_utilization,
            "makespan_s": r.makespan_s,
            "groups": [{"name": n, "gpu": gpu, "gpus": g, "jobs": f.jobs, "mean_jct_s": f.mean_jct_s,
                        "p95_jct_s": f.p95_jct_s, "mean_queue_s": f.mean_queue_s, "utilization": f.utilization,
                        "window_utilization": f.window_utilization} for n, gpu, g, f in per_group(r)],
            "jobs": [{"name": j.job.name, "arrival_s": j.job.arrival_s, "start_s": j.start_s, "finish_s": j.finish_s,
                      "jct_s": j.jct_s, "servers": j.servers, "switches": j.switches, "group": j.group}
                     for j in r.jobs]}


def tables(results: list[PolicyResult], title: str) -> list[Table]:
    """The side-by-side table of the policies and, for a fleet of several groups, the table per GPU type."""
    t = Table(title=title)
    for col in ("policy", "mean JCT", "p95 JCT", "mean queueing", "GPU utilization", "in window", "makespan",
                "mean switches/job"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    base = results[0].mean_jct_s
    for r in results:
        o = overall(r)
        sw = sum(j.switches for j in r.jobs) / len(r.jobs)
        t.add_row(r.policy, f"{format_time(r.mean_jct_s)} ({(r.mean_jct_s / base - 1) * 100:+.1f}%)",
                  format_time(o.p95_jct_s), format_time(r.mean_queue_s), f"{100 * r.gpu_utilization:.1f}%",
                  f"{100 * o.window_utilization:.1f}%", format_time(r.makespan_s), f"{sw:.2f}")
    out = [t]
    if len(results[0].groups) > 1:
        g = Table(title="per GPU type (group): jobs that ran there")
        for col in ("policy", "group", "GPU", "GPUs", "jobs", "mean JCT", "mean queueing", "utilization in window"):
            g.add_column(col, justify="left" if col in ("policy", "group", "GPU") else "right")
        for r in results:
            for name, gpu, n, f in per_group(r):
                g.add_row(r.policy, name, gpu, str(n), f"{f.jobs:,}", format_time(f.mean_jct_s),
                          format_time(f.mean_queue_s), f"{100 * f.window_utilization:.1f}%")
        out.append(g)
    return out


def plot(results: list[PolicyResult], png: Path) -> None:
    """JCT distributions and utilization per GPU type, one picture (format from the extension) written
    atomically."""
    import matplotlib  # deferred: matplotlib is heavy and only --png needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g[0] for g in results[0].groups]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for k, r in enumerate(results):
        jct = sorted(j.jct_s for j in r.jobs)
        ax.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], drawstyle="steps-post",
                label=f"{r.policy} (mean {format_time(r.mean_jct_s)})", color=f"C{k}")
    ax.set_xscale("log" if min(results[0].jobs, key=lambda j: j.jct_s).jct_s > 0 else "linear")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("job completion times by placement policy")
    ax.legend(fontsize=8)
    width = 0.8 / len(results)
    for k, r in enumerate(results):
        util = [100 * f.window_utilization for _, _, _, f in per_group(r)]
        bx.bar([x + k * width for x in range(len(groups))], util, width, label=r.policy, color=f"C{k}")
    bx.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], groups)
    bx.set_ylabel("GPU utilization while jobs arrive (%)")
    bx.set_title("utilization per GPU type")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=check_picture_path(png), dpi=120)
    plt.close(fig)
    atomic_write(png, lambda fh: fh.write(buf.getvalue()), make_parents=True)


def _place(cluster_file: Path, jobs_file: Path, policies: list[str], algorithm: str, contention: str, fmt: str,
           from_day: float, days: float | None, resample_n: int | None, seed: int, png: Path | None,
           as_json: bool, console: Console) -> None:
    chosen = list(POLICIES) if not policies or policies == ["all"] else policies
    for p in chosen:
        if p not in POLICIES:
            raise ConfigError("--policy", f"unknown policy {p!r}", "use " + ", ".join(POLICIES) + " or all")
    if contention not in CONTENTION:
        raise ConfigError("--contention", f"unknown contention model {contention!r}", "use flow or steady")
    fleet = load_fleet(cluster_file)
    jobs, how = trace_for(fleet, jobs_file, fmt, from_day, days, resample_n, seed, algorithm)
    results = compare(fleet, jobs, chosen, algorithm, contention)
    if as_json:
        print(jsonsafe.dumps([as_dict(r) for r in results]))
    else:
        where = fleet.name if len(fleet.groups) > 1 else fleet.groups[0].cluster.name
        kinds = ", ".join(f"{g.name}: {g.num_gpus} {g.gpu}" for g in fleet.groups) if len(fleet.groups) > 1 else ""
        title = (f"{len(jobs):,} jobs on {where} ({fleet.num_gpus} GPUs{'; ' + kinds if kinds else ''}), "
                 f"{algorithm} allreduces contending on the flow model ({contention})")
        if how:
            console.print(how)
        for t in tables(results, title):
            console.print(t)
    if png is not None:
        plot(results, png)
        if not as_json:
            console.print(f"plot written to {png}")


@app.command("place")
@friendly
def place_cmd(cluster: Path = typer.Argument(..., help="fleet YAML (fleet: groups of servers), or a scenario or "
                                             "cluster YAML (its cluster: section)"),
              jobs: Path = typer.Argument(..., help="job trace: YAML list (or jobs:) or CSV with a header of "
                                          "arrival, model, gpus, iterations[, batch, name, gpu_type]; or with "
                                          "--format openb an Alibaba PAI openb pod list"),
              policy: list[str] = typer.Option([], "--policy", help="first-fit, packed, topology-aware, "
                                               "heterogeneity-aware, search, or all (repeat the option; "
                                               "default all)"),
              algorithm: str = typer.Option("ring", "--algorithm", help="the jobs' allreduce algorithm"),
              contention: str = typer.Option("flow", "--contention", help="flow (exact: the flow model) or steady "
                                             "(fast: max-min rates held; see docs/search.md)"),
              fmt: str = typer.Option("jobs", "--format", help="jobs (a job file) or openb (a production trace)"),
              from_day: float = typer.Option(0.0, "--from-day", help="openb: first day of the window"),
              days: float | None = typer.Option(None, "--days", help="openb: days of the window (with "
                                                "--resample: the days the tasks arrive over, default 7)"),
              resample_n: int | None = typer.Option(None, "--resample", help="openb: draw this many tasks from "
                                                    "the trace's mix, arriving uniformly over --days"),
              seed: int = typer.Option(0, "--seed", help="seed of --resample"),
              png: Path | None = typer.Option(None, "-o", "--out", "--png", help="plot the JCT distributions "
                                              "and the utilization per GPU type here, the format from the "
                                              "extension: .png, .svg or .pdf"),
              as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Place jobs on a shared cluster or mixed fleet: JCT, queueing, utilization per policy and GPU type."""
    if png is not None:
        check_picture_path(png)  # the format from the extension, refused before any work
    _place(cluster, jobs, list(policy), algorithm, contention, fmt, from_day, days, resample_n, seed, png,
           as_json, console)
