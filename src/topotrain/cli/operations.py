"""``topotrain run-long``: time to train under failures, per recovery policy (:mod:`topotrain.operations`);
``topotrain failure-predict``: a "fails within H hours" classifier on GPU telemetry, judged on held-out
time; a verb module of :mod:`topotrain.cli`."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.operations.failures import DAY_S, HOUR_S
from topotrain.operations.predictor import Evaluation, evaluate
from topotrain.operations.spec import load_config, parse_count
from topotrain.operations.study import LongRun, choose_plan, plot_progress
from topotrain.operations.telemetry import read_telemetry, synthetic_telemetry, write_telemetry
from topotrain.report.draw import check_picture_path
from topotrain.scenario.load import load_scenario
from topotrain.util import jsonsafe, progress
from topotrain.util.atomic import atomic_write_text, check_output_path, protect_inputs
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_size, format_time, parse_time


def _days(s: float) -> str:
    if not math.isfinite(s):
        return "never"
    return f"{s / DAY_S:.2f} d" if s >= 2 * DAY_S else f"{s / HOUR_S:.2f} h"


def _spares(raw: str | None) -> tuple[int, ...]:
    if not raw:
        return ()
    try:
        out = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ConfigError("--tune", f"cannot read {raw[:40]!r}", "give spare counts, e.g. --tune 0,8,16,32") from None
    if not out or any(x < 0 or x > 65_536 for x in out):
        raise ConfigError("--tune", f"spare counts must be in [0, 65536], got {raw[:40]!r}", "e.g. --tune 0,8,16")
    return out


def print_study(study: LongRun, console: Console) -> None:
    """The study as tables: the job, its checkpoint, a failure inside an iteration, each policy, tuning."""
    r, ck = study.result, study.checkpoint
    console.print(f"{study.scenario}: {study.counts.gpus} GPUs in {study.counts.servers} servers, iteration "
                  f"{format_time(r.iteration_time_s)}, {r.samples_per_s:,.0f} samples/s ({r.tokens_per_s:,.0f} "
                  f"tokens/s); {study.iterations:,} iterations = {_days(study.work_s)} of computation without "
                  "failures")
    console.print(f"failures: one every {study.job_mtbf_s / HOUR_S:.2f} h ({DAY_S / study.job_mtbf_s:.1f} per day) "
                  "on this cluster")
    console.print(f"checkpoint ({ck.mode}, {'sharded' if ck.size.sharded else 'one replica writes'}): "
                  f"{format_size(ck.size.total_bytes)} by {ck.size.writers} writer{'s' if ck.size.writers > 1 else ''} "
                  f"({format_size(ck.size.per_writer_bytes)} the busiest), write {format_time(ck.write_s)}, "
                  f"stall {format_time(ck.stall_s)}, read {format_time(ck.read_s)}; interval: Young "
                  f"{format_time(study.young_s)}, Daly {format_time(study.daly_s)}, chosen "
                  f"{format_time(study.interval_s)}")
    d = study.degraded
    if d is not None:
        deg = (f"runs at {format_time(d.degraded_iteration_time_s)} per iteration with dp {d.dp_before} → "
               f"{d.dp_after} ({100 * d.relative_throughput:.1f}% of the samples/s)") if d.dp_after else \
            "cannot shrink (one replica): waits for a spare"
        console.print(f"a failed GPU ({d.failed_gpus[0]}, replica {list(d.replicas_lost)}, stage "
                      f"{list(d.stages_hit)}): the iteration in flight stalls to "
                      f"{format_time(d.stalled_iteration_s)}; elastic, the job {deg}")
    t = Table(title=f"time to train, {study.runs[0].samples} Monte-Carlo runs per policy")
    for col in ("policy", "spares", "expected", "p5", "p50", "p95", "effective time", "goodput", "lost work",
                "interruptions"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for run in study.runs:
        s = run.summary()
        elastic = " (elastic)" if run.policy.elastic and "elastic" not in run.policy.name else ""
        t.add_row(run.policy.name + elastic, str(run.policy.spares),
                  _days(s["time_to_train_s"]), _days(s["p5_time_to_train_s"]), _days(s["p50_time_to_train_s"]),
                  _days(s["p95_time_to_train_s"]), f"{100 * s['effective_training_time']:.1f}%",
                  f"{100 * s['goodput']:.1f}%", f"{s['lost_work_s'] / HOUR_S:.1f} h", f"{s['interruptions']:.1f}")
    console.print(t)
    if study.predicted:
        m = study.predicted[0].migration
        assert m is not None
        tp = Table(title=f"with proactive migration: recall {m.recall:.2f}, precision {m.precision:.2f}, "
                         f"migration {format_time(m.migration_s)}")
        for col in ("policy", "expected", "goodput", "without", "lost work", "migrations"):
            tp.add_column(col, justify="left" if col == "policy" else "right")
        for run, base in zip(study.predicted, study.runs, strict=True):
            s, b = run.summary(), base.summary()
            tp.add_row(run.policy.name, _days(s["time_to_train_s"]), f"{100 * s['goodput']:.1f}%",
                       f"{100 * b['goodput']:.1f}%", f"{s['lost_work_s'] / HOUR_S:.1f} h",
                       f"{s['predictor']['migrations']:.1f}")
        console.print(tp)
    if study.tuning is not None:
        tu = study.tuning
        tt = Table(title=f"interval and spares tuned for {tu.objective.replace('_', '-')} (Daly's interval "
                         f"{format_time(tu.daly_interval_s)})")
        for col in ("spares", "best interval", "expected time", "goodput", "GPU-hours", "chosen"):
            tt.add_column(col, justify="right")
        for p in tu.points:
            tt.add_row(str(p.spares), format_time(p.interval_s), _days(p.time_to_train_s), f"{100 * p.goodput:.1f}%",
                       f"{p.gpu_hours:,.0f}", "◀" if p == tu.best else "")
        console.print(tt)


@app.command("run-long")
@friendly
def run_long_cmd(scenario: Path = typer.Argument(..., help="scenario YAML"),
                 tokens: str | None = typer.Option(None, "--tokens", help="tokens to train, e.g. 15T"),
                 train_samples: str | None = typer.Option(None, "--train-samples",
                                                          help="samples to train instead, e.g. 1.2M"),
                 failures: Path | None = typer.Option(None, "--failures", help="failures YAML (default: the "
                                                      "Llama 3 rates; docs/operations.md)"),
                 samples: int | None = typer.Option(None, "--samples", min=1, max=10_000_000,
                                                    help="Monte-Carlo runs per policy (default: the file's)"),
                 seed: int | None = typer.Option(None, "--seed", min=0, help="seed (default: the file's)"),
                 set_: list[str] = typer.Option([], "--set", help="override a scenario field, e.g. "
                                                "--set network=analytical"),
                 workers: int = typer.Option(1, "--workers", min=1, max=256, help="processes for the runs"),
                 fail_gpu: str | None = typer.Option(None, "--fail-gpu", help="GPU whose failure inside an "
                                                     "iteration to report (default: the first)"),
                 tune_spares: str | None = typer.Option(None, "--tune", help="also tune the interval for "
                                                        "these spare counts, e.g. 0,8,16,32"),
                 objective: str = typer.Option("time", "--objective", help="tuning objective: time or "
                                               "gpu_hours"),
                 plans: list[str] = typer.Option([], "--plan", help="a plan to choose among, as --set "
                                                 "overrides separated by spaces, e.g. --plan 'plan.tp=8 plan.pp=4'; "
                                                 "give it twice or more: each is studied and the fastest to train "
                                                 "wins"),
                 plot: Path | None = typer.Option(None, "--png", help="plot progress over wall time here (the "
                                                  "format from the extension: .png, .svg or .pdf)"),
                 out: Path | None = typer.Option(None, "-o", "--out", help="write the results as JSON here"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Expected time to train N tokens under failures: checkpoints (Young/Daly), restart, hot spares and
    elastic shrink, Monte-Carlo over the failure model."""
    fmt = check_picture_path(plot, "--png") if plot is not None else ""
    if out is not None:
        check_output_path(out, field="--out", make_parents=True)
    if objective not in ("time", "gpu_hours"):
        raise ConfigError("--objective", f"unknown objective {objective!r}", "use time or gpu_hours")
    amount_tokens = parse_count(tokens, "--tokens") if tokens is not None else None
    amount_samples = parse_count(train_samples, "--train-samples") if train_samples is not None else None
    if amount_tokens is None and amount_samples is None:
        raise ConfigError("--tokens", "no training amount", "give --tokens 15T or --train-samples 1.2M")
    spares = _spares(tune_spares)
    if len(plans) == 1:
        raise ConfigError("--plan", "one plan leaves nothing to choose", "give --plan twice or more, or use --set")
    with protect_inputs([failures]):
        cfg = load_config(failures)
        variants = [(p, load_scenario(scenario, [*set_, *p.split()])) for p in plans] or \
            [("", load_scenario(scenario, list(set_)))]
        with progress.task("simulating the iteration") as prog:

            def step(name: str, i: int, total: int) -> None:
                prog.update(i, total=total, description=f"Monte-Carlo: {name}")

            choice = choose_plan(variants, cfg, tokens=amount_tokens, samples=amount_samples,
                                 mc_samples=samples, seed=seed, workers=workers, fail_gpu=fail_gpu,
                                 tune_spares=spares, objective="gpu_hours" if objective == "gpu_hours" else "time",
                                 progress=step)
        study = choice.studies[choice.best]
        doc = choice.to_dict() if plans else study.to_dict()
        if out is not None:
            atomic_write_text(out, jsonsafe.dumps(doc, indent=2) + "\n", make_parents=True, field="--out")
        if plot is not None:
            plot_progress(study, plot, fmt)
    if as_json:
        print(jsonsafe.dumps(doc))
        return
    if plans:
        t = Table(title="plans chosen with their interval and spares")
        for col in ("plan", "iteration", "checkpoint", "expected time to train", ""):
            t.add_column(col, justify="left" if col == "plan" else "right")
        for i, (label, st, ts) in enumerate(zip(choice.labels, choice.studies, choice.times_s, strict=True)):
            t.add_row(label, format_time(st.result.iteration_time_s), format_size(st.checkpoint.size.total_bytes),
                      _days(ts), "◀" if i == choice.best else "")
        console.print(t)
        console.print(f"the chosen plan, {choice.labels[choice.best]}:")
    print_study(study, console)
    for what, path in (("results", out), ("plot", plot)):
        if path is not None:
            console.print(f"{what} written to {path}")


def print_evaluation(ev: Evaluation, console: Console) -> None:
    """The predictor's measures on held-out time, beside the baselines."""
    sc = ev.scores
    console.print(f"{ev.source}: fails within {ev.horizon_s / HOUR_S:g} h; trained on "
                  f"{ev.train_samples:,} samples ({ev.train_failures} failures) before "
                  f"{ev.split_s / HOUR_S:.0f} h, tested after ({ev.test_failures} failures)")
    t = Table(title=f"held-out time, threshold {ev.threshold:.3f}")
    for col in ("per sample", "precision", "recall", "F1"):
        t.add_column(col, justify="left" if col == "per sample" else "right")
    for name, s in (("classifier", sc), ("rule: precursor XID or ECC in 24 h", ev.rule),
                    ("always 'fails'", ev.always_positive)):
        t.add_row(name, f"{s.precision:.3f}", f"{s.recall:.3f}", f"{s.f1:.3f}")
    console.print(t)
    console.print(f"average precision {ev.average_precision:.3f} (prevalence {ev.prevalence:.3f}), ROC AUC "
                  f"{ev.roc_auc:.3f}")
    lead = (f"median lead {ev.lead_time_median_s / HOUR_S:.1f} h, 10th percentile "
            f"{ev.lead_time_p10_s / HOUR_S:.1f} h") if math.isfinite(ev.lead_time_median_s) else "no lead"
    console.print(f"per event: {100 * ev.event_recall:.1f}% of failures alarmed ahead ({lead}); "
                  f"{100 * ev.alarm_precision:.1f}% of {ev.alarms} alarms right")
    console.print("top features (drop in average precision when shuffled): "
                  + ", ".join(f"{n} {v:.3f}" for n, v in ev.top_features))
    console.print(f"for run-long's failures file: predictor: {{recall: {ev.event_recall:.3f}, "
                  f"precision: {max(ev.alarm_precision, 1e-3):.3f}}}")


@app.command("failure-predict")
@friendly
def failure_predict_cmd(telemetry: Path | None = typer.Argument(None, help="telemetry CSV (docs/operations.md "
                                                                "§6); omit with --synthetic"),
                        synthetic: str | None = typer.Option(None, "--synthetic", help="SYNTHETIC telemetry "
                                                             "instead: GPUS,DAYS, e.g. 64,60"),
                        horizon: str = typer.Option("24h", "--horizon", help="predict a failure this far ahead"),
                        test_fraction: float = typer.Option(0.3, "--test-fraction",
                                                            help="the last share of the record's time held out"),
                        seed: int = typer.Option(0, "--seed", min=0, help="seed (generator and classifier)"),
                        write_telemetry_to: Path | None = typer.Option(None, "--write-telemetry",
                                                                       help="write the telemetry CSV here"),
                        out: Path | None = typer.Option(None, "-o", "--out", help="write the results as JSON here"),
                        as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Train and judge a "fails within H hours" classifier on GPU telemetry, split by time."""
    if (telemetry is None) == (synthetic is None):
        raise ConfigError("TELEMETRY", "give a telemetry CSV or --synthetic GPUS,DAYS (one of them)",
                          "e.g. topotrain failure-predict --synthetic 64,60")
    for path, name in ((write_telemetry_to, "--write-telemetry"), (out, "--out")):
        if path is not None:
            check_output_path(path, field=name, make_parents=True)
    h = parse_time(horizon, "--horizon", allow_zero=False)
    with protect_inputs([telemetry]):
        if synthetic is not None:
            try:
                g, d = synthetic.split(",")
                n_gpus, n_days = int(g), float(d)
            except ValueError:
                raise ConfigError("--synthetic", f"cannot read {synthetic[:40]!r}", "give GPUS,DAYS, e.g. 64,60") \
                    from None
            tel = synthetic_telemetry(n_gpus, n_days, seed=seed)
        else:
            assert telemetry is not None
            tel = read_telemetry(telemetry)
        ev = evaluate(tel, h, test_fraction=test_fraction, seed=seed)
        doc = ev.to_dict()
        if write_telemetry_to is not None:  # after the evaluation: a refused run writes nothing
            write_telemetry(tel, write_telemetry_to)
        if out is not None:
            atomic_write_text(out, jsonsafe.dumps(doc, indent=2) + "\n", make_parents=True, field="--out")
    if as_json:
        print(jsonsafe.dumps(doc))
        return
    print_evaluation(ev, console)
