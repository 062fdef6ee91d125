"""``topotrain search`` and ``explain``: the co-design search and why its winner wins."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.scenario.cluster import read_yaml
from topotrain.scenario.load import load_scenario
from topotrain.search.executors import available_cpus, make_executor
from topotrain.search.results import describe, pareto, plot_front, ranked, rows_of, write_csv, write_point
from topotrain.search.run import load_records, parallel_points, run_search
from topotrain.search.space import settings_from, space_from_dict
from topotrain.training.simulate import simulate
from topotrain.util import jsonsafe
from topotrain.util.errors import ConfigError
from topotrain.util.outdir import check_out_dir, claim_out_dir, release_out_dir
from topotrain.util.units import format_size, format_time


def _money(x: float) -> str:
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x:,.0f}"


def _search(space_file: Path, out: Path | None, workers: int | None, dask_scheduler: str | None,
            dask_local: int | None, resume: bool, optimizer: str | None, trials: int | None, seed: int | None,
            top: int, as_json: bool, force: bool, console: Console) -> None:
    data = read_yaml(space_file)
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
    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TextColumn("eta"),
                    TimeRemainingColumn(), console=console, transient=True, disable=as_json)
    ids: dict[str, Any] = {}

    def progress(stage: str, done: int, total: int, best: float | None) -> None:
        if stage not in ids:
            ids[stage] = prog.add_task(f"{stage} ({s.screen_network if stage == 'screen' else s.confirm_network})",
                                       total=total, best="-")
        b = "-" if best is None else (format_time(best) if s.objectives[0].endswith("_s") else f"{best:,.4g}")
        prog.update(ids[stage], completed=done, total=total, best=b)

    made: list[Path] = []
    try:
        made = claim_out_dir(out_dir, "search")
        with prog:
            outcome = run_search(space, out_dir, executor, resume=resume, base_dir=space_file.parent,
                                 progress=progress)
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
    for col in ("#", "point", "iteration", "confirmed", "band", "capex USD", "kW", "USD/1M tok", "tok/s/kW",
                "MFU"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for i, r in enumerate(order[:top]):
        b = r.best
        band = b.get("error_band")
        t.add_row(str(i + 1), describe(r), format_time(r.screen["iteration_time_s"]),
                  format_time(r.confirm["iteration_time_s"]) if r.confirm else "",
                  f"±{band['plus_minus'] * 100:.0f}%" if band and band["plus_minus"] < float("inf") else "",
                  _money(b["capex_usd"]),
                  f"{b['power_kw']:,.0f}", f"{b['usd_per_1m_tokens']:.4g}", f"{b['tokens_per_s_per_kw']:,.0f}",
                  f"{100 * b['mfu']:.1f}%")
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


def _explain(best: Path, vs: Path, network: str | None, as_json: bool, console: Console) -> None:
    overrides = [f"network={network}"] if network else []
    a = simulate(load_scenario(best, overrides))
    b = simulate(load_scenario(vs, overrides))
    keys = ("compute_s", "tp_comm_s", "exposed_comm_s", "bubble_s")
    da, db = a.breakdown.to_dict(), b.breakdown.to_dict()
    diff = {k: db[k] - da[k] for k in keys}
    total = b.iteration_time_s - a.iteration_time_s
    if as_json:
        print(jsonsafe.dumps({"best": a.to_dict(), "vs": b.to_dict(), "difference_s": diff,
                              "total_difference_s": total}))
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
    t.add_row("bucket, micro-batch", f"{format_size(a.plan.bucket_bytes)}, {a.plan.micro_batch_size}",
              f"{format_size(b.plan.bucket_bytes)}, {b.plan.micro_batch_size}", "")
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
    if math.isclose(total, 0.0, abs_tol=1e-12):
        console.print("the two iterations take the same time")
        return
    winner, loser = (best.stem, vs.stem) if total > 0 else (vs.stem, best.stem)
    main = max(keys, key=lambda k: abs(diff[k]))
    console.print(f"{winner} is {abs(total) / min(a.iteration_time_s, b.iteration_time_s) * 100:.1f}% faster than "
                  f"{loser}; most of the difference ({abs(diff[main]) * 1e3:.3f} of {abs(total) * 1e3:.3f} ms) is "
                  f"{main.removesuffix('_s').replace('_', ' ')}")


@app.command("search")
@friendly
def search_cmd(space: Path = typer.Argument(..., help="space YAML (a scenario whose fields may hold several "
                                            "values; see docs/search.md)"),
               out: Path | None = typer.Option(None, "--out", help="results folder (default search-STEM)"),
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
def explain_cmd(best: Path = typer.Argument(..., help="scenario YAML of the winner (e.g. best.yaml)"),
                vs: Path = typer.Option(..., "--vs", help="scenario YAML to compare with"),
                network: str | None = typer.Option(None, "--network", help="override both network models"),
                as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Why one scenario beats another: breakdown beside breakdown, busiest links."""
    _explain(best, vs, network, as_json, console)
