"""Training under failures (issue 39's targets). Every figure is measured here, one per line.

(a) Lost work per failure: the Monte-Carlo against the closed form (half a checkpoint cycle + the restart),
    exponential failures with ``λ·(τ+δ) = 1%`` (where the first-order form holds).
(b) Daly's interval against a sweep of intervals: simulated mean time to train at ¼…4 × Daly's interval,
    beside Daly's expected time, and which interval the simulation finds fastest.
(c) The Llama 3 snapshot (Dubey et al. 2024, §3.3.4: 419 unexpected interruptions in 54 days on 16,384
    H100s, >90% effective training time) from the failure rates alone: simulated interruptions per cause in
    54 days, the GPU share, and the effective training time of a 54-day run with the default (assumed)
    detection and restart times and the 405B checkpoint on a 2 TB/s store, per policy; the detection +
    restart time that would give 90%.
(d) Speed: a 30-day run on 16,384 GPUs, 1,000 Monte-Carlo runs per policy (target: under 60 s).
(e) Interval and spares tuned together for the Llama 3 run (grid + golden section over the interval).
(f) A failure inside an iteration of Llama 3 405B on 16,384 simulated H100s (analytical network): the
    iteration the elastic job runs at, one replica short.
(g) The failure predictor on SYNTHETIC telemetry (64 GPUs, 60 days, fails within 24 h, last 30% of the time
    held out): precision / recall / F1 beside the baselines, event recall, alarm precision, lead time; then
    the Llama 3 run's goodput with proactive migration at that recall and precision, at other precisions,
    and with a perfect predictor, for a drain + restart migration and an assumed 2-minute live migration.
(h) The Titan GPU lifetimes (olcf/TitanGPULife's gc_summary_loc.csv, given with ``--titan PATH``; not
    shipped: no licence): a right-censored Weibull fit per batch against the Llama 3 defaults' GPU rate.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/goodput.py [--skip a,b,c,d,e,f,g,h] [--titan PATH]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from topotrain.operations.checkpoint import (
    StorageTier,
    checkpoint_cost,
    checkpoint_size,
    daly_expected_time_s,
    daly_interval_s,
    lost_per_failure_s,
)
from topotrain.operations.degraded import degraded_iteration
from topotrain.operations.failures import (
    DAY_S,
    LLAMA3_DAYS,
    LLAMA3_TABLE5,
    ComponentCounts,
    FailureClass,
    FailureModel,
    draw_failures,
    llama3_counts,
    llama3_model,
)
from topotrain.operations.lifetime import YEAR_S, read_lifetimes
from topotrain.operations.longrun import Migration, Policy, RunSpec, run_policy
from topotrain.operations.predictor import evaluate
from topotrain.operations.telemetry import synthetic_telemetry
from topotrain.operations.tuning import tune
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.plan import Plan
from topotrain.training.simulate import simulate
from topotrain.workload.zoo import model_from_dict

#: Llama 3 405B (Dubey et al. 2024: 126 layers, model dimension 16,384, FFN 53,248, 128 heads, 8 KV heads,
#: vocabulary 128,256) and its 16K-GPU configuration (TP 8, CP 1, PP 16, 16M tokens per batch: DP 128 of
#: 2,048 sequences of 8,192); docs/sources.md §9.
LLAMA405B: dict[str, Any] = {"type": "transformer", "name": "llama3-405b", "layers": 126, "hidden": 16384,
                             "heads": 128, "kv_heads": 8, "ffn_hidden": 53248, "seq_len": 8192, "vocab": 128256,
                             "norm": "rmsnorm", "position": "rotary", "gated_mlp": True, "tie_embeddings": False,
                             "bias": False, "flash_attention": True}
PLAN405B: dict[str, Any] = {"tp": 8, "pp": 16, "recompute": "selective", "sequence_parallel": True,
                            "zero_stage": 1, "pipeline_schedule": "interleaved", "virtual_stages": 2}
#: Tectonic's sustained throughput (Dubey et al. 2024, §3.3.1: 2 TB/s sustained, 7 TB/s peak; secondary)
TECTONIC = StorageTier("tectonic", write_bytes_per_s=2e12, read_bytes_per_s=2e12)
ONE = ComponentCounts(gpus=8, servers=1, nics=8, switches=0, links=0, gpus_per_server=8)


def _software(mtbf_s: float) -> FailureModel:
    return FailureModel((FailureClass("sw", mtbf_s=mtbf_s, scope="job", takes="none", repair_s=0.0),),
                        detect_s=60.0, restart_s=240.0, replace_s=None)


def part_a() -> None:
    tau, delta, mtbf = 600.0, 30.0, 63_000.0
    spec = RunSpec(400 * tau, tau, delta, 0.0, 60.0, 240.0, 8, 8)
    runs = run_policy(spec, Policy("restart"), _software(mtbf), ONE, 4000, seed=1)
    got, want = runs.summary()["overhead_per_failure_s"], lost_per_failure_s(tau, delta, 300.0)
    print("(a) lost work per failure, exponential failures, lambda*(tau+delta) = 1%, 4,000 runs")
    print(f"    simulated lost time per failure: {got:.1f} s")
    print(f"    closed form (tau+delta)/2 + restart: {want:.1f} s")
    print(f"    simulated / closed form: {got / want:.4f} (target: within 2%)")


def part_b() -> None:
    delta, mtbf = 60.0, 10 * 3600.0
    daly = daly_interval_s(delta, mtbf)
    work = 150 * daly
    print(f"\n(b) interval sweep, M = 10 h, delta = 60 s, restart 300 s, Daly's interval {daly:.0f} s, 1,000 runs each")
    times = {}
    for f in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0):
        spec = RunSpec(work, f * daly, delta, 0.0, 60.0, 240.0, 8, 8)
        t = run_policy(spec, Policy("restart"), _software(mtbf), ONE, 1000, seed=2, horizon_s=4 * work)
        times[f] = t.summary()["time_to_train_s"]
        closed = daly_expected_time_s(work, f * daly, delta, 300.0, mtbf)
        print(f"    {f:>4} x Daly: simulated {times[f] / 3600:.2f} h, Daly's expected {closed / 3600:.2f} h "
              f"({100 * (times[f] / closed - 1):+.2f}%)")
    print(f"    fastest simulated interval: {min(times, key=lambda k: times[k])} x Daly's")


def llama_checkpoint() -> Any:
    model = model_from_dict(LLAMA405B)
    plan = Plan(dp=128, tp=8, pp=16, global_batch=2048, micro_batch=1, zero_stage=1, recompute="selective",
                sequence_parallel=True, pipeline_schedule="interleaved", virtual_stages=2)
    return checkpoint_cost(checkpoint_size(model, plan), TECTONIC, "async")


def _ett_for_restart(restart_s: float, stall_s: float, mtbf_s: float) -> float:
    tau = daly_interval_s(stall_s, mtbf_s)
    return 1.0 / (daly_expected_time_s(1.0, tau, stall_s, restart_s, mtbf_s) / 1.0)


def part_c() -> None:
    model, counts = llama3_model(), llama3_counts()
    mtbf = model.job_mtbf_s(counts)
    f = draw_failures(model, counts, 1000, LLAMA3_DAYS * DAY_S, np.random.default_rng(3))
    got = f.counts_by_class(len(model.classes)).mean(axis=0)
    print("\n(c) Llama 3 405B, 54 days on 16,384 GPUs, from the per-component rates (1,000 runs); paper in ()")
    print(f"    mean time between interruptions: {mtbf / 3600:.2f} h (paper: 419 in 54 days, one per "
          f"{54 * 24 / 419:.2f} h)")
    for (name, _, n, _, _), g in zip(LLAMA3_TABLE5, got, strict=True):
        print(f"    interruptions by {name}: {g:.1f} ({n})")
    gpu = sum(g for (_, cat, _, _, _), g in zip(LLAMA3_TABLE5, got, strict=True) if cat == "GPU")
    print(f"    interruptions in total: {got.sum():.1f} (419)")
    print(f"    GPU share: {100 * gpu / got.sum():.1f}% (counts 268/419 = 64.0%; the paper's 58.7% sums its "
          "printed percentages, with Faulty GPU at 30.1% for 148/419 = 35.3%)")
    ck = llama_checkpoint()
    print(f"    405B checkpoint: {ck.size.total_bytes / 1e12:.2f} TB, {ck.size.per_writer_bytes / 1e9:.2f} GB per GPU, "
          f"write {ck.write_s:.1f} s at 2 TB/s, async stall {ck.stall_s:.3f} s, read {ck.read_s:.1f} s")
    restart = model.restart_s + ck.read_s
    tau = daly_interval_s(ck.stall_s, mtbf)
    rates = tuple(1.0 - m / 128 for m in range(128))  # a server is one of 128 replicas (TP 8 within it)
    work = 0.85 * LLAMA3_DAYS * DAY_S
    spec = RunSpec(work, tau, ck.stall_s, ck.persist_lag_s, model.detect_s, restart, counts.gpus, 8, rates)
    print(f"    assumed: detection {model.detect_s / 60:.0f} min, restart {model.restart_s / 60:.0f} min + read, "
          f"cold replacement {model.replace_s / 3600:.0f} h; Daly's interval {tau:.0f} s")
    for pol in (Policy("restart (cold replacement)"), Policy("hot spares (32 servers)", spares=32),
                Policy("elastic", elastic=True)):
        s = run_policy(spec, pol, model, counts, 1000, seed=4).summary()
        print(f"    effective training time, {pol.name}: {100 * s['effective_training_time']:.1f}% over "
              f"{s['time_to_train_s'] / DAY_S:.1f} days (paper: > 90%)")
    lo, hi = 0.0, 3600.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _ett_for_restart(mid, ck.stall_s + ck.persist_lag_s, mtbf) > 0.9 else (lo, mid)
    print(f"    detection + restart for 90% effective training time (Daly, hot spares): {lo / 60:.1f} min")


def part_d() -> float:
    model, counts = llama3_model(), llama3_counts()
    ck = llama_checkpoint()
    tau = daly_interval_s(ck.stall_s, model.job_mtbf_s(counts))
    rates = tuple(1.0 - m / 128 for m in range(128))
    spec = RunSpec(27 * DAY_S, tau, ck.stall_s, ck.persist_lag_s, model.detect_s, model.restart_s + ck.read_s,
                   counts.gpus, 8, rates)
    print("\n(d) a 30-day run on 16,384 GPUs, 1,000 Monte-Carlo runs per policy")
    total = 0.0
    for pol in (Policy("restart"), Policy("spares", spares=32), Policy("elastic", elastic=True)):
        t0 = time.perf_counter()
        s = run_policy(spec, pol, model, counts, 1000, seed=5).summary()
        wall = time.perf_counter() - t0
        total += wall
        print(f"    {pol.name}: {wall:.2f} s wall ({s['failures']:.0f} failures per run, expected "
              f"{s['time_to_train_s'] / DAY_S:.1f} days)")
    print(f"    slowest policy: under 60 s is the target; all three together: {total:.2f} s")
    return total


def part_e() -> None:
    model, counts = llama3_model(), llama3_counts()
    ck = llama_checkpoint()
    spec = RunSpec(27 * DAY_S, 600.0, ck.stall_s, ck.persist_lag_s, model.detect_s, model.restart_s + ck.read_s,
                   counts.gpus, 8)
    t0 = time.perf_counter()
    tu = tune(spec, model, counts, (0, 4, 16, 64), 200, seed=6)
    print(f"\n(e) interval and spares tuned for expected time (200 runs per evaluation, "
          f"{time.perf_counter() - t0:.1f} s)")
    for p in tu.points:
        print(f"    {p.spares} spares: best interval {p.interval_s:.0f} s (Daly {tu.daly_interval_s:.0f} s), "
              f"{p.time_to_train_s / DAY_S:.2f} days, goodput {100 * p.goodput:.1f}%")
    print(f"    chosen: {tu.best.spares} spares, interval {tu.best.interval_s:.0f} s")


def part_f() -> None:
    t0 = time.perf_counter()
    sc = scenario_from_dict({"cluster": {"server": "dgx-h100", "servers": 2048,
                                         "network": {"topology": "fat-tree", "link": "ib-ndr-400g"}},
                             "model": LLAMA405B, "batch": {"global": 2048, "micro": 1}, "plan": PLAN405B,
                             "network": "analytical"}, name="llama3-405b-16k")
    base = simulate(sc)
    model = llama3_model()
    d = degraded_iteration(sc, [sc.cluster.topology.gpus[0]], model.detect_s, model.restart_s, base=base)
    print(f"\n(f) a failed GPU in Llama 3 405B on 16,384 H100s (analytical network; {time.perf_counter() - t0:.0f} s)")
    print(f"    iteration: {base.iteration_time_s:.3f} s, {base.tokens_per_s:,.0f} tokens/s")
    print(f"    the iteration in flight stalls to {d.stalled_iteration_s:.0f} s (detection + restart)")
    print(f"    elastic, dp {d.dp_before} -> {d.dp_after}: {d.degraded_iteration_time_s:.3f} s per iteration, "
          f"{d.degraded_tokens_per_s:,.0f} tokens/s ({100 * d.relative_throughput:.2f}% of the whole job)")


def part_g() -> None:
    t0 = time.perf_counter()
    tel = synthetic_telemetry(64, 60, seed=0)
    ev = evaluate(tel, 24 * 3600.0, seed=0)
    print(f"\n(g) failure predictor on SYNTHETIC telemetry: 64 GPUs, 60 days hourly, {tel.failures()} failures; "
          f"fails within 24 h; trained before day {ev.split_s / DAY_S:.0f}, tested after "
          f"({time.perf_counter() - t0:.0f} s)")
    for name, sc in (("classifier", ev.scores), ("rule (precursor XID or ECC in 24 h)", ev.rule),
                     ("always 'fails'", ev.always_positive)):
        print(f"    {name}: precision {sc.precision:.3f}, recall {sc.recall:.3f}, F1 {sc.f1:.3f}")
    print(f"    average precision {ev.average_precision:.3f} (prevalence {ev.prevalence:.3f}), "
          f"ROC AUC {ev.roc_auc:.3f}, threshold {ev.threshold:.3f}")
    print(f"    per event: {100 * ev.event_recall:.1f}% of {ev.test_failures} test failures alarmed ahead, median "
          f"lead {ev.lead_time_median_s / 3600:.1f} h (10th percentile {ev.lead_time_p10_s / 3600:.1f} h); "
          f"{100 * ev.alarm_precision:.1f}% of {ev.alarms} alarms right")
    print(f"    top features: {', '.join(f'{n} {v:.3f}' for n, v in ev.top_features)}")
    model, counts = llama3_model(), llama3_counts()
    ck = llama_checkpoint()
    mtbf = model.job_mtbf_s(counts)
    tau = daly_interval_s(ck.stall_s, mtbf)
    restart = model.restart_s + ck.read_s
    spec = RunSpec(0.85 * LLAMA3_DAYS * DAY_S, tau, ck.stall_s, ck.persist_lag_s, model.detect_s, restart,
                   counts.gpus, 8)
    drain = ck.write_s + restart
    print(f"    Llama 3 run (as (c)), 1,000 runs; the predictor sees the GPU hardware classes (64% of "
          f"interruptions); drain + restart {drain / 60:.1f} min (assumed: sync checkpoint + restart + read), "
          "live migration 2 min (assumed)")
    r, p = ev.event_recall, ev.alarm_precision
    for pol in (Policy("hot spares (32 servers)", spares=32), Policy("restart (cold replacement)")):
        base = run_policy(spec, pol, model, counts, 1000, seed=4).summary()
        print(f"    {pol.name}: without a predictor goodput {100 * base['goodput']:.2f}%, lost work "
              f"{base['lost_work_s'] / 3600:.1f} h")
        for label, mig in ((f"synthetic r={r:.2f} p={p:.2f}, drain", Migration(r, p, drain)),
                           (f"synthetic r={r:.2f} p={p:.2f}, live", Migration(r, p, 120.0)),
                           (f"r={r:.2f} p=0.90, drain", Migration(r, 0.9, drain)),
                           ("perfect, drain", Migration(1.0, 1.0, drain)),
                           ("perfect, live", Migration(1.0, 1.0, 120.0))):
            s = run_policy(spec, pol, model, counts, 1000, seed=4, migration=mig).summary()
            print(f"      {label}: goodput {100 * s['goodput']:.2f}% ({100 * (s['goodput'] - base['goodput']):+.2f} "
                  f"points), lost work {s['lost_work_s'] / 3600:.1f} h, migrations {s['predictor']['migrations']:.0f}")


def part_h(path: str) -> None:
    if not path:
        print("\n(h) Titan GPU lifetimes: skipped (give --titan PATH to olcf/TitanGPULife's data/gc_summary_loc.csv)")
        return
    life = read_lifetimes(path)
    llama_gpu = sum(n for _, cat, n, _, _ in LLAMA3_TABLE5 if cat == "GPU")
    llama_mtbf_y = LLAMA3_DAYS * DAY_S * 16_384 / llama_gpu / YEAR_S
    span = LLAMA3_DAYS * DAY_S
    print(f"\n(h) Titan GPU lifetimes ({path}): right-censored Weibull fits (dead = DBE or off the bus)")
    print(f"    Llama 3 defaults, GPU classes: {llama_gpu} in 54 days on 16,384 GPUs = one per {llama_mtbf_y:.2f} "
          f"GPU-years, exponential ({llama_gpu / 16_384:.4f} per GPU in 54 days)")
    for group in (None, "old", "new"):
        f = life.fit(group)
        lam, k = f.scale_s, f.shape
        ages = " ".join(f"{a}y {((a * YEAR_S + span) / lam) ** k - (a * YEAR_S / lam) ** k:.4f}"
                        for a in (1, 2, 3, 4, 5))
        print(f"    {group or 'all'}: {f.units} GPUs, {f.failures} failures, {f.exposure_s / YEAR_S:,.0f} GPU-years; "
              f"shape {k:.3f}, scale {lam / YEAR_S:.2f} y, mean {f.mean_s / YEAR_S:.2f} y; exponential MTBF "
              f"{f.exponential_mtbf_s / YEAR_S:.2f} y")
        print(f"      failures per GPU in 54 days at age: {ages}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", default="", help="comma-separated parts to skip (a,b,c,d,e,f,g,h)")
    ap.add_argument("--titan", default="", help="olcf/TitanGPULife data/gc_summary_loc.csv for part (h)")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    parts = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e, "f": part_f, "g": part_g,
             "h": lambda: part_h(args.titan)}
    for name, fn in parts.items():
        if name not in skip:
            fn()


if __name__ == "__main__":
    main()
