"""``run-long``: a scenario trained for N tokens (or samples) over days, under failures, per policy.

One simulated iteration gives the job's speed; the training amount gives its work (whole iterations);
the cluster gives the component counts the failure rates apply to; the model and plan give the checkpoint
(:mod:`.checkpoint`); the failures file gives the rates, recovery times, storage and policies
(:mod:`.spec`). Each policy is then a Monte-Carlo over the same failures (:mod:`.longrun`), elastic ones
with the shrunk job's speed from the simulator (:mod:`.degraded`), and optionally the interval and spares
are tuned together (:mod:`.tuning`). :func:`plot_progress` draws the committed work over wall time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.operations.checkpoint import (
    CheckpointCost,
    checkpoint_cost,
    checkpoint_size,
    daly_interval_s,
    young_interval_s,
)
from topotrain.operations.degraded import DegradedIteration, degraded_iteration, elastic_rates
from topotrain.operations.failures import DAY_S, ComponentCounts, component_counts
from topotrain.operations.longrun import Runs, RunSpec, default_horizon_s, run_policy
from topotrain.operations.spec import OperationsConfig, default_policies
from topotrain.operations.tuning import Objective, Tuning, tune
from topotrain.training.simulate import Result, Scenario, simulate
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError


@dataclass(frozen=True)
class LongRun:
    """Everything ``run-long`` found."""

    scenario: str
    result: Result = field(repr=False)
    iterations: int
    work_s: float
    counts: ComponentCounts
    job_mtbf_s: float
    checkpoint: CheckpointCost
    young_s: float
    daly_s: float
    interval_s: float
    spec: RunSpec
    degraded: DegradedIteration | None
    runs: tuple[Runs, ...] = field(repr=False)
    tuning: Tuning | None = None
    class_names: tuple[str, ...] = ()
    #: the same policies with proactive migration (the failures file's ``predictor``), same failures
    predicted: tuple[Runs, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        ck = self.checkpoint
        return {
            "scenario": self.scenario, "gpus": self.counts.gpus, "servers": self.counts.servers,
            "iteration_time_s": self.result.iteration_time_s, "tokens_per_s": self.result.tokens_per_s,
            "samples_per_s": self.result.samples_per_s, "iterations": self.iterations, "work_s": self.work_s,
            "job_mtbf_s": self.job_mtbf_s, "failures_per_day": DAY_S / self.job_mtbf_s,
            "checkpoint": {"mode": ck.mode, "total_bytes": ck.size.total_bytes,
                           "per_writer_bytes": ck.size.per_writer_bytes, "writers": ck.size.writers,
                           "sharded": ck.size.sharded, "write_s": ck.write_s, "stall_s": ck.stall_s,
                           "persist_lag_s": ck.persist_lag_s, "read_s": ck.read_s},
            "young_interval_s": self.young_s, "daly_interval_s": self.daly_s, "interval_s": self.interval_s,
            "degraded": self.degraded.to_dict() if self.degraded else None,
            "policies": [dict(r.summary(), failures_by_class=dict(zip(self.class_names,
                                                                       r.by_class.mean(axis=0).tolist(),
                                                                       strict=True)))
                         for r in self.runs],
            "with_predictor": [dict(r.summary(), without_goodput=b.summary()["goodput"])
                               for r, b in zip(self.predicted, self.runs, strict=False)],
            "tuning": None if self.tuning is None else {
                "objective": self.tuning.objective, "daly_interval_s": self.tuning.daly_interval_s,
                "points": [dataclasses.asdict(p) for p in self.tuning.points],
                "best": dataclasses.asdict(self.tuning.best)},
        }


def work_of(result: Result, tokens: float | None, samples: float | None) -> tuple[int, float]:
    """(iterations, seconds of computation) to train ``tokens`` or ``samples`` at the simulated speed."""
    if (tokens is None) == (samples is None):
        raise ConfigError("--tokens", "give the training amount once", "use --tokens 15T or --train-samples 1.2M")
    per_iter = (result.tokens_per_s if tokens is not None else result.samples_per_s) * result.iteration_time_s
    if not per_iter > 0:
        raise ConfigError("--tokens", f"{result.model} trains no tokens per iteration",
                          "give --train-samples instead")
    amount = float(tokens if tokens is not None else samples)  # type: ignore[arg-type]
    iters = max(1, math.ceil(amount / per_iter - 1e-9))
    return iters, iters * result.iteration_time_s


def chosen_interval(choice: str | float, young_s: float, daly_s: float, iteration_s: float) -> float:
    """The interval the runs use: Young's, Daly's or a duration, in whole iterations (at least one)."""
    raw = young_s if choice == "young" else daly_s if choice == "daly" else float(choice)
    if not math.isfinite(raw):
        raw = 1e9
    return max(1, round(raw / iteration_s)) * iteration_s


def run_long(sc: Scenario, cfg: OperationsConfig, *, tokens: float | None = None, samples: float | None = None,
             mc_samples: int | None = None, seed: int | None = None, workers: int = 1, fail_gpu: str | None = None,
             tune_spares: tuple[int, ...] = (), objective: Objective = "time",
             progress: Callable[[str, int, int], None] | None = None,
             run: Callable[[Scenario], Result] = simulate) -> LongRun:
    """The whole study (module docstring)."""
    result = run(sc)
    cache = {sc.plan.dp: result}

    def sim(shrunk: Scenario) -> Result:  # shrunk scenarios differ from sc by their dp alone
        if shrunk.plan.dp not in cache:
            cache[shrunk.plan.dp] = run(shrunk)
        return cache[shrunk.plan.dp]

    iters, work = work_of(result, tokens, samples)
    counts = component_counts(sc.cluster)
    model = cfg.model
    mtbf = model.job_mtbf_s(counts)
    ck = checkpoint_cost(checkpoint_size(sc.model, sc.plan), cfg.storage, cfg.mode)
    young = young_interval_s(ck.stall_s, mtbf) if math.isfinite(mtbf) else math.inf
    daly = daly_interval_s(ck.stall_s, mtbf) if math.isfinite(mtbf) else math.inf
    interval = min(chosen_interval(cfg.interval, young, daly, result.iteration_time_s), work)
    policies = cfg.policies if cfg.policies is not None else default_policies(counts.servers)
    n = cfg.samples if mc_samples is None else mc_samples
    s = cfg.seed if seed is None else seed
    rates: tuple[float, ...] = (1.0,)
    if any(p.elastic for p in policies):
        rates = elastic_rates(sc, result, counts.servers, run=sim)
    spec = RunSpec(work, interval, ck.stall_s, ck.persist_lag_s, model.detect_s, model.restart_s + ck.read_s,
                   counts.gpus, counts.gpus_per_server, rates)
    degraded = None
    gpus = sc.cluster.topology.gpus
    if sc.plan.dp > 1 or fail_gpu is not None:
        degraded = degraded_iteration(sc, [fail_gpu or gpus[0]], model.detect_s, spec.restart_s, result, sim)
    horizon = default_horizon_s(spec, model, counts)
    runs = []
    for p in policies:
        def step(i: int, total: int, name: str = p.name) -> None:
            if progress:
                progress(name, i, total)

        runs.append(run_policy(spec, p, model, counts, n, s, horizon_s=horizon, workers=workers, progress=step))
    predicted = []
    if cfg.predictor is not None:  # drain: a synchronous checkpoint, then a restart that reads it back
        mig = cfg.predictor.migration(ck.write_s + spec.restart_s)
        for p in policies:
            def step2(i: int, total: int, name: str = p.name) -> None:
                if progress:
                    progress(f"{name} + predictor", i, total)

            predicted.append(run_policy(spec, p, model, counts, n, s, horizon_s=horizon, workers=workers,
                                        progress=step2, migration=mig))
    tuning = None
    if tune_spares:
        tuning = tune(spec, model, counts, tune_spares, n, s, objective=objective,
                      progress=lambda i, t: progress("tuning", i, t) if progress else None)
    return LongRun(sc.name, result, iters, work, counts, mtbf, ck, young, daly, interval, spec, degraded,
                   tuple(runs), tuning, tuple(c.name for c in model.classes), tuple(predicted))


def expected_time_to_train_s(study: LongRun) -> float:
    """The study's answer to "how long": the tuned (spares, interval)'s expected time when it was tuned, else
    the fastest policy's."""
    if study.tuning is not None:
        return study.tuning.best.time_to_train_s
    return min(r.summary()["time_to_train_s"] for r in study.runs)


@dataclass(frozen=True)
class PlanChoice:
    """Several plans of one job, each studied whole (its own iteration time, checkpoint bytes, Young/Daly
    interval and, when asked, tuned spares and interval), and the one with the least expected time to train."""

    labels: tuple[str, ...]
    studies: tuple[LongRun, ...]
    best: int

    @property
    def times_s(self) -> tuple[float, ...]:
        return tuple(expected_time_to_train_s(s) for s in self.studies)

    def to_dict(self) -> dict[str, Any]:
        return {"plans": [{"plan": label, "expected_time_to_train_s": t, **st.to_dict()}
                          for label, t, st in zip(self.labels, self.times_s, self.studies, strict=True)],
                "best": self.labels[self.best]}


def choose_plan(variants: Sequence[tuple[str, Scenario]], cfg: OperationsConfig, **options: Any) -> PlanChoice:
    """The plans ``variants`` (label, scenario) of one job chosen together with their checkpoint interval and
    spares: :func:`run_long` on each with the same failures file, seed and ``options`` (so every plan meets
    the same failure draws: common random numbers), the best the least :func:`expected_time_to_train_s`. A
    plan with a faster iteration but a bigger checkpoint or more GPUs exposed to failures can lose."""
    if not variants:
        raise ConfigError("--plan", "no plan to choose from", "give --plan at least once")
    studies = tuple(run_long(sc, cfg, **options) for _, sc in variants)
    times = [expected_time_to_train_s(st) for st in studies]
    return PlanChoice(tuple(label for label, _ in variants), studies, min(range(len(times)), key=times.__getitem__))


def plot_progress(study: LongRun, path: str | Path, fmt: str) -> None:
    """Committed fraction of the training over wall time per policy (mean, 5–95% band), written atomically."""
    import matplotlib  # heavy, only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ends = [r.finish_s[np.isfinite(r.finish_s)] for r in study.runs]
    t_max = max([float(np.percentile(e, 99)) for e in ends if e.size] + [study.work_s])
    grid = np.linspace(0.0, 1.05 * t_max, 300)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(grid / DAY_S, np.minimum(grid / study.work_s, 1.0) * 100, "k--", lw=1, label="no failures, no checkpoints")
    for r in study.runs:
        prog = r.progress(grid) * 100
        mean = prog.mean(axis=0)
        lo, hi = np.percentile(prog, 5, axis=0), np.percentile(prog, 95, axis=0)
        st = r.summary()
        days = st["time_to_train_s"] / DAY_S
        label = f"{r.policy.name}: {days:.1f} days, goodput {100 * st['goodput']:.1f}%" if math.isfinite(days) \
            else f"{r.policy.name}: does not finish"
        line, = ax.plot(grid / DAY_S, mean, lw=2, label=label)
        ax.fill_between(grid / DAY_S, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("wall time (days)")
    ax.set_ylabel("training committed (%)")
    ax.set_ylim(0, 102)
    ax.set_xlim(0, grid[-1] / DAY_S)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{study.scenario}: {study.counts.gpus} GPUs, {study.runs[0].samples} Monte-Carlo runs per policy "
                 "(mean, 5-95%)", fontsize=9)
    fig.tight_layout()
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=100), field="--png", make_parents=True)
    finally:
        plt.close(fig)
