"""``topotrain search`` and ``explain``: the co-design search and why its winner wins."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.cli.traces import is_trace_workload, simulate_trace
from topotrain.report.explain import verdict
from topotrain.scenario.cluster import read_yaml
from topotrain.scenario.load import load_scenario
from topotrain.search.executors import available_cpus, make_executor
from topotrain.search.results import describe, pareto, plot_front, ranked, rows_of, write_csv, write_point
from topotrain.search.run import load_records, parallel_points, run_search
from topotrain.search.space import settings_from, space_from_dict
from topotrain.training.simulate import Result, simulate
from topotrain.util import jsonsafe, progress
from topotrain.util.errors import ConfigError
from topotrain.util.outdir import check_out_dir, claim_out_dir, release_out_dir
from topotrain.util.units import format_size, format_time


def _money(x: float) -> str:
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x:,.0f}"


def _search(space_file: Path, out: Path | None, workers: int | None, dask_scheduler: str | None,
            dask_local: int | None, resume: bool, optimizer: str | None, trials: int | None, seed: int | None,
            top: int, as_json: bool, force: bool, console: Console) -> None:
    data = read_yaml(space_file)
    _refuse_trace_space(space_file, data)
    space = space_from_dict(data, space_file.stem)
    s = space.settings
    if optimizer is not None:
        s = replace(s, optimizer=settings_from({"optimizer": optimizer}).optimizer)
    if trials is not None:
        s = replace(s, trials=settings_from({"trials": trials}).trials)
    if seed is not None:
        s = replace(s, seed=settings_from({"seed": seed}).seed)
    space = replace(space, settings=s)
    out_dir = out if out is not None else Path(f"search-{space_file.stem}")
    check_out_dir(out_dir, force=force)  # refused before anything is started or written
    if resume is False and (out_dir / "results.sqlite").exists():
        raise ConfigError("--out", f"{out_dir / 'results.sqlite'} holds a search already",
                          "pass --resume to continue it, or choose another --out")
    executor = make_executor(workers, dask_scheduler, dask_local,
                             points=parallel_points(space, available_cpus()))
    tasks: dict[str, progress.Task] = {}
    stack = ExitStack()  # the stages' progress lines, closed when the search ends

    def on_progress(stage: str, done: int, total: int, best: float | None) -> None:
        if stage not in tasks:
            tasks[stage] = stack.enter_context(progress.task(stage, total=total))
        b = "-" if best is None else (format_time(best) if s.objectives[0].endswith("_s") else f"{best:,.4g}")
        net = s.screen_network if stage == "screen" else s.confirm_network
        tasks[stage].update(done, total=total, description=f"{stage} ({net}), best {b}")

    made: list[Path] = []
    try:
        made = claim_out_dir(out_dir, "search")
        with stack:
            outcome = run_search(space, out_dir, executor, resume=resume, base_dir=space_file.parent,
                                 progress=on_progress)
    except BaseException:
        if not (out_dir / "results.sqlite").exists():  # refused or failed before storing anything
            release_out_dir(made)
        raise
    finally:
        executor.close()
    rows = rows_of(load_records(out_dir))
    obj = s.objectives[0]
    order = ranked(rows, obj)
    front = pareto(rows)
    written = ["points.csv", "pareto.csv"]
    write_csv(out_dir / "points.csv", rows, order)
    write_csv(out_dir / "pareto.csv", front, front)
    if front:
        plot_front(out_dir / "pareto.png", rows, front)
        written.append("pareto.png")
    for i, name in enumerate(("best.yaml", "runner-up.yaml")):
        if len(order) > i:
            write_point(out_dir / name, order[i], s.confirm_network or s.screen_network)
            written.append(name)
        else:  # a resume (or --force) must not leave a file of another run beside this one's answer
            (out_dir / name).unlink(missing_ok=True)
    if not front:
        (out_dir / "pareto.png").unlink(missing_ok=True)
    bad = Counter((r.status, r.field, r.reason) for r in rows if r.status != "ok")
    if as_json:
        print(jsonsafe.dumps({"out": str(out_dir), "files": written, "points": outcome.points,
                              "evaluated": outcome.evaluated,
                          "reused": outcome.reused, "confirmed": outcome.confirmed,
                          "ranked": [{"key": r.key, "seq": r.seq, "description": describe(r),
                                      **{k: r.best.get(k) for k in ("iteration_time_s", "iteration_time_s_low",
                                                                     "iteration_time_s_high", "capex_usd",
                                                                     "usd_per_1m_tokens", "tokens_per_s_per_kw",
                                                                     "time_to_train_s", "network")}}
                                     for r in order[:top]],
                          "pareto": [r.key for r in front],
                          "not_ok": [{"status": st, "field": f, "reason": why, "points": n}
                                     for (st, f, why), n in sorted(bad.items())]}))
        return
    t = Table(title=f"{space.name}: {len(order)} feasible of {len(rows)} points (ranked by {obj})")
    units = {_work_unit(r.best) for r in order[:top]}
    unit = units.pop() if len(units) == 1 else ""  # mixed models: each cell says its own unit
    for col in ("#", "point", "iteration", "confirmed", "band", "capex USD", "kW",
                f"USD/1M {unit or 'units'}", f"{unit or 'units'}/s/kW", "MFU"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for i, r in enumerate(order[:top]):
        b = r.best
        band = b.get("error_band")
        t.add_row(str(i + 1), describe(r), format_time(r.screen["iteration_time_s"]),
                  format_time(r.confirm["iteration_time_s"]) if r.confirm else "",
                  (f"±{band['plus_minus'] * 100:.0f}%" + ("*" if band.get("borrowed") else ""))
                  if band and band["plus_minus"] < float("inf") else "",
                  _money(b["capex_usd"]),
                  f"{b['power_kw']:,.0f}", f"{b['usd_per_1m_tokens']:.4g}{'' if unit else ' ' + _work_unit(b)}",
                  f"{b['tokens_per_s_per_kw']:,.0f}{'' if unit else ' ' + _work_unit(b)}",
                  f"{100 * b['mfu']:.1f}%")
    if any((r.best.get("error_band") or {}).get("borrowed") for r in order[:top]):
        t.caption = "band*: borrowed from other regimes' validation rows (too few of its own), widened"
    console.print(t)
    f = Table(title="Pareto front: iteration time vs capex")
    for col in ("point", "iteration", "capex USD"):
        f.add_column(col, justify="left" if col == "point" else "right")
    for r in front:
        f.add_row(describe(r), format_time(r.best["iteration_time_s"]), _money(r.best["capex_usd"]))
    console.print(f)
    for (st, fld, why), n in sorted(bad.items()):
        console.print(f"{n} point(s) {st}: {fld}: {why}")
    if not order:
        console.print("no feasible point: nothing to rank, no pareto.png, best.yaml or runner-up.yaml")
    console.print(f"evaluated {outcome.evaluated}, reused {outcome.reused} stored, confirmed {outcome.confirmed} "
                  f"with {s.confirm_network}; wrote {out_dir}/" + ", ".join(written))


def _result(path: Path, overrides: list[str]) -> Result:
    """``simulate``'s result for ``path``: a model's scenario, or a recorded step (a trace workload, or a
    scenario whose ``workload:`` names one), replayed as ``simulate`` replays it (cli/traces.py)."""
    if is_trace_workload(path):
        return simulate_trace(path, overrides).result
    return simulate(load_scenario(path, overrides))


def _refuse_trace_space(space_file: Path, data: Any) -> None:
    """A search over a recorded step is refused (one line): the trace fixes the model, batch and plan that a
    search's axes vary, and what a trace can vary (cluster, network, collective algorithm, DP degree) is one
    ``simulate`` per value, or ``explain`` for two."""
    wl = data.get("workload") if isinstance(data, dict) else None
    if isinstance(data, dict) and (wl is not None or is_trace_workload(space_file)):
        raise ConfigError(f"{space_file}: workload", "names a recorded step: `search` varies a model's plan "
                          "(parallelism, micro-batch, ZeRO, recompute), which a trace fixes",
                          f"simulate each what-if: `topotrain simulate {space_file} --set workload.world=N` (or "
                          "cluster/network/plan.dp_algorithm), and `topotrain explain A.yaml --vs B.yaml` to "
                          "compare two")


def _explain(best: Path, vs: Path, network: str | None, as_json: bool, console: Console) -> None:
    overrides = [f"network={network}"] if network else []
    a = _result(best, overrides)
    b = _result(vs, overrides)
    keys = ("compute_s", "tp_comm_s", "exposed_comm_s", "bubble_s")
    da, db = a.breakdown.to_dict(), b.breakdown.to_dict()
    diff = {k: db[k] - da[k] for k in keys}
    total = b.iteration_time_s - a.iteration_time_s
    if as_json:
        print(jsonsafe.dumps({"best": a.to_dict(), "vs": b.to_dict(), "difference_s": diff,
                              "total_difference_s": total,
                              "verdict": verdict(best.stem, a.to_dict(), vs.stem, b.to_dict()).to_dict()}))
        return
    t = Table(title=f"{best.name} vs {vs.name} ({a.network})")
    t.add_column("")
    t.add_column(best.stem, justify="right")
    t.add_column(vs.stem, justify="right")
    t.add_column("difference", justify="right")
    t.add_row("iteration", format_time(a.iteration_time_s), format_time(b.iteration_time_s), f"{total * 1e3:+.3f} ms")
    for k in keys:
        t.add_row(k.removesuffix("_s").replace("_", " "), format_time(da[k]), format_time(db[k]),
                  f"{diff[k] * 1e3:+.3f} ms")
    t.add_row("overlapped comm", format_time(da["overlapped_comm_s"]), format_time(db["overlapped_comm_s"]),
              f"{(db['overlapped_comm_s'] - da['overlapped_comm_s']) * 1e3:+.3f} ms")
    t.add_row("GPUs", f"{a.gpus} x {a.gpu}", f"{b.gpus} x {b.gpu}", "")
    t.add_row("plan", f"dp{a.plan.dp} tp{a.plan.tp} pp{a.plan.pp} {a.plan.dp_algorithm}",
              f"dp{b.plan.dp} tp{b.plan.tp} pp{b.plan.pp} {b.plan.dp_algorithm}", "")
    recorded = "as recorded (trace)"  # a trace's buckets and micro-batches are the recorded job's
    ba = recorded if is_trace_workload(best) else f"{format_size(a.plan.bucket_bytes)}, {a.plan.micro_batch_size}"
    bb = recorded if is_trace_workload(vs) else f"{format_size(b.plan.bucket_bytes)}, {b.plan.micro_batch_size}"
    t.add_row("bucket, micro-batch", ba, bb, "")
    t.add_row("MFU", f"{100 * a.mfu:.1f}%", f"{100 * b.mfu:.1f}%", "")
    console.print(t)
    lt = Table(title="busiest links (bytes carried / (capacity x iteration))")
    lt.add_column(best.stem)
    lt.add_column("util", justify="right")
    lt.add_column(vs.stem)
    lt.add_column("util", justify="right")
    la, lb = a.link_utilization_top, b.link_utilization_top
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else None
        y = lb[i] if i < len(lb) else None
        lt.add_row(f"{x[0]}→{x[1]}" if x else "", f"{100 * x[2]:.3g}%" if x else "",
                   f"{y[0]}→{y[1]}" if y else "", f"{100 * y[2]:.3g}%" if y else "")
    console.print(lt)
    console.print(verdict(best.stem, a.to_dict(), vs.stem, b.to_dict()).text())


def _work_unit(metrics: Mapping[str, Any]) -> str:
    """What the model of a point processes: ``tok`` for a sequence model, ``samples`` where a sample is one
    unit of work (images of a CNN: its tokens per second are its samples per second)."""
    return "samples" if metrics.get("tokens_per_s") == metrics.get("samples_per_s") else "tok"

@app.command("search")
@friendly
def search_cmd(space: Path = typer.Argument(..., help="space YAML (a scenario whose fields may hold several "
                                            "values; see docs/search.md)"),
               out: Path | None = typer.Option(None, "-o", "--out", help="results folder (default search-STEM)"),
               workers: int | None = typer.Option(None, "--workers", help="local processes (default: cores)"),
               dask_scheduler: str | None = typer.Option(None, "--dask-scheduler",
                                                         help="run on a Dask cluster, tcp://HOST:PORT"),
               dask_local: int | None = typer.Option(None, "--dask-local", help="run on a local Dask cluster "
                                                     "of N worker processes"),
               resume: bool = typer.Option(False, "--resume", help="continue the search stored in --out"),
               optimizer: str | None = typer.Option(None, "--optimizer", help="grid, tpe or nsga2"),
               trials: int | None = typer.Option(None, "--trials", help="points to try (tpe, nsga2)"),
               seed: int | None = typer.Option(None, "--seed", help="random seed (tpe, nsga2)"),
               top: int = typer.Option(10, "--top", help="rows of the ranked table"),
               as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
               force: bool = typer.Option(False, "--force", help="write into an --out folder that holds files "
                                          "topotrain did not write")) -> None:
    """Search a design space: ranked table, Pareto front of time vs cost, CSV and PNG."""
    if not space.exists():
        raise ConfigError("space", f"{space} does not exist", "give a space YAML, e.g. examples/search-eflops.yaml")
    _search(space, out, workers, dask_scheduler, dask_local, resume, optimizer, trials, seed, top, as_json,
            force, console)


@app.command("explain")
@friendly
def explain_cmd(best: Path = typer.Argument(..., help="scenario YAML of the winner (e.g. best.yaml), or a "
                                            "recorded step (a trace workload, as `simulate` takes it)"),
                vs: Path = typer.Option(..., "--vs", help="scenario YAML (or trace workload) to compare with"),
                network: str | None = typer.Option(None, "--network", help="override both network models"),
                as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Why one scenario beats another: breakdown beside breakdown, busiest links."""
    _explain(best, vs, network, as_json, console)
