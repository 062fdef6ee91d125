"""Training over weeks: a Monte-Carlo of checkpoint/restart under failures, vectorized over runs.

A run must finish ``work_s`` seconds of computation at full speed. It computes in cycles of
``interval_s`` then a checkpoint that stalls it ``stall_s`` and becomes durable ``persist_lag_s`` later (an
asynchronous one persists in the background). A failure while it computes loses the work since the last
durable checkpoint; every failure costs detection and a restart (``detect_s + restart_s``, the checkpoint
read included; a failure during a restart starts it over, as in Daly 2006). A failure that takes servers
(:mod:`topotrain.operations.failures`) leaves them missing for their ``away_s`` (swapped from the free pool
or repaired). The :class:`Policy` decides what a missing server means: without spares the job waits for it
(``restart``); ``spares`` hot spare servers stand in at once; ``elastic`` runs on with fewer data-parallel
replicas at the relative speed ``rate_by_missing[m]`` (from the simulator: :mod:`.degraded`) and scales
back up, through a checkpoint and a restart, when a server returns.

**Vectorized.** The failures of every run are drawn at once (:func:`~.failures.draw_failures`); each
failure that takes servers adds a return event; events of all runs are sorted into one row per run. The
state machine then steps through event *columns*: the k-th event of every run at once, numpy over runs, so
the cost is the number of events per run times a few array operations, not the iterations trained. A run's
progress between two events is closed-form (whole cycles committed, the rest lost).

**Reproducible.** Runs are drawn in chunks of :data:`CHUNK` with seeds spawned from the seed
(``numpy.random.SeedSequence``), so the answer for a seed is the same bit for bit whatever the number of
worker processes; policies and intervals compared with one seed see the same failures (common random
numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topotrain.operations.checkpoint import daly_expected_time_s
from topotrain.operations.failures import ComponentCounts, FailureModel, Failures, draw_failures
from topotrain.util.errors import ConfigError

#: Runs drawn per chunk (each chunk its own spawned seed).
CHUNK = 250
#: The horizon of drawn failures doubles until every run finished inside it, up to this many times the
#: run's work; runs still unfinished then count as never finishing (``inf``).
MAX_HORIZON_WORKS = 20.0


@dataclass(frozen=True)
class Policy:
    """What the job does about missing servers: ``spares`` hot spares, then wait (or shrink if ``elastic``)."""

    name: str
    spares: int = 0
    elastic: bool = False

    def __post_init__(self) -> None:
        if self.spares < 0:
            raise ConfigError(f"policies.{self.name}.spares", f"must be ≥ 0, got {self.spares}", "give 0 or more")


@dataclass(frozen=True)
class Migration:
    """Proactive migration driven by a failure predictor (:mod:`.predictor`).

    Each failure of a predictable class (``classes``; None: the GPU hardware classes, scope ``gpu`` taking
    a server, what GPU telemetry can see) is foreseen with probability ``recall``, independently; a
    foreseen failure is migrated just before it strikes (the predictor's lead time is taken to exceed the
    migration): the work done so far is committed (drain), the job stalls ``migration_s`` instead of
    detection + restart and loses nothing; the failing server still leaves as the failure would take it
    (the policy's spares, pool or wait apply). False alarms come at ``recall · (1 − precision) / precision``
    per foreseeable failure (a Poisson process over the run); each costs one migration and takes no server
    (the suspect is swapped for a pool server within the migration and tested aside). Assumed, not
    measured: what ``migration_s`` is (drain + restart from a fresh checkpoint by default, :mod:`.study`)."""

    recall: float
    precision: float
    migration_s: float
    classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.recall <= 1.0:
            raise ConfigError("predictor.recall", f"must be in [0, 1], got {self.recall!r}", "e.g. 0.6")
        if not 0.0 < self.precision <= 1.0:
            raise ConfigError("predictor.precision", f"must be in (0, 1], got {self.precision!r}", "e.g. 0.5")
        if not (self.migration_s >= 0 and math.isfinite(self.migration_s)):
            raise ConfigError("predictor.migration", f"must be a duration ≥ 0, got {self.migration_s!r} s",
                              "e.g. 5min")

    def predictable(self, model: FailureModel) -> np.ndarray:
        """Which classes of ``model`` the predictor sees (bool per class)."""
        if self.classes is None:
            return np.array([c.scope == "gpu" and c.takes != "none" for c in model.classes])
        names = [c.name for c in model.classes]
        unknown = [n for n in self.classes if n not in names]
        if unknown:
            raise ConfigError("predictor.classes", f"unknown class {unknown[0]!r}", f"known: {', '.join(names)}")
        return np.array([n in self.classes for n in names])


@dataclass(frozen=True)
class RunSpec:
    """One long run: its work and checkpoint cycle (seconds), restart costs, GPUs, and, elastic, its speed
    with ``m`` servers missing beyond the spares (``rate_by_missing[m]``; beyond the table it cannot run)."""

    work_s: float
    interval_s: float
    stall_s: float
    persist_lag_s: float
    detect_s: float
    restart_s: float
    gpus: int
    gpus_per_server: int
    rate_by_missing: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        for f in ("work_s", "interval_s"):
            v = getattr(self, f)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f, f"must be a positive time, got {v!r} s", "give a positive duration")
        for f in ("stall_s", "persist_lag_s", "detect_s", "restart_s"):
            v = getattr(self, f)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f, f"must be a time ≥ 0, got {v!r} s", "give a duration ≥ 0")

    @property
    def cycle_s(self) -> float:
        """Wall time of one checkpoint cycle (an asynchronous checkpoint must persist before the next)."""
        return max(self.interval_s + self.stall_s, self.persist_lag_s)


@dataclass(frozen=True)
class Runs:
    """Per-run outcomes of a Monte-Carlo (arrays over runs) and each run's committed work over time."""

    policy: Policy
    spec: RunSpec
    finish_s: np.ndarray
    lost_s: np.ndarray
    interruptions: np.ndarray
    failures: np.ndarray
    #: failures per class before the run finished (runs × classes)
    by_class: np.ndarray
    #: (time, committed work) after every event, per run (padded with the finish)
    trace_t: np.ndarray = field(repr=False)
    trace_w: np.ndarray = field(repr=False)
    #: proactive migrations per run (foreseen failures and false alarms), when a predictor drives them
    migrations: np.ndarray | None = None
    migration: Migration | None = None

    @property
    def samples(self) -> int:
        return int(self.finish_s.size)

    def reserved_gpus(self) -> int:
        return self.spec.gpus + self.policy.spares * self.spec.gpus_per_server

    def summary(self) -> dict[str, Any]:
        """Expected time to train, goodput, lost work and percentiles (times in seconds)."""
        f = self.finish_s
        ok = np.isfinite(f)
        w = self.spec.work_s
        n_fail = self.failures.sum()
        stats: dict[str, Any] = {
            "policy": self.policy.name, "spares": self.policy.spares, "elastic": self.policy.elastic,
            "samples": self.samples, "finished": int(ok.sum()),
            "time_to_train_s": float(f.mean()) if ok.all() else math.inf,
            "time_to_train_std_s": float(f.std()) if ok.all() else math.inf,
            "effective_training_time": float(np.mean(np.where(ok, w / f, 0.0))),
            "goodput": float(np.mean(np.where(ok, w * self.spec.gpus / (f * self.reserved_gpus()), 0.0))),
            "lost_work_s": float(self.lost_s.mean()),
            "interruptions": float(self.interruptions.mean()),
            "failures": float(self.failures.mean()),
            "overhead_per_failure_s": (float((f[ok] - self.failure_free_s()).sum() / n_fail)
                                       if n_fail and ok.all() else math.nan),
            "reserved_gpus": self.reserved_gpus(),
        }
        for q in (5, 50, 95, 99):
            stats[f"p{q}_time_to_train_s"] = float(np.percentile(f, q, method="nearest"))  # inf-safe
        if self.migration is not None and self.migrations is not None:
            m = self.migration
            stats["predictor"] = {"recall": m.recall, "precision": m.precision, "migration_s": m.migration_s,
                                  "migrations": float(self.migrations.mean())}
        return stats

    def failure_free_s(self) -> float:
        """The run's time with no failure: its work, a checkpoint after every interval, the last durable."""
        s = self.spec
        n = math.ceil(s.work_s / s.interval_s - 1e-9)
        return (n - 1) * s.cycle_s + (s.work_s - (n - 1) * s.interval_s) + s.stall_s + s.persist_lag_s

    def progress(self, grid_s: np.ndarray) -> np.ndarray:
        """Committed fraction of the work of every run at the times of ``grid_s`` (runs × grid)."""
        out = np.empty((self.samples, grid_s.size))
        for i in range(self.samples):
            t, w = self.trace_t[i], self.trace_w[i]
            keep = np.isfinite(t) & (t <= self.finish_s[i])
            end = ([self.finish_s[i]], [self.spec.work_s]) if np.isfinite(self.finish_s[i]) else ([], [])
            out[i] = np.interp(grid_s, np.concatenate(([0.0], t[keep], end[0])),
                               np.concatenate(([0.0], w[keep], end[1])))
        return out / self.spec.work_s


@dataclass(frozen=True)
class _Events:
    t: np.ndarray
    kind: np.ndarray  # 0 failure, 1 return, 2 foreseen failure (migrated), 3 false alarm, -1 padding
    missing: np.ndarray  # servers missing after the event


def _events(f: Failures, foreseen: np.ndarray | None = None,
            alarms: tuple[np.ndarray, np.ndarray] | None = None) -> _Events:
    """Failures and the returns of the servers they take, sorted per run, with the servers missing after each;
    with a predictor, ``foreseen`` failures (kind 2: migrated) and false ``alarms`` (run, time; kind 3)."""
    valid = f.cls >= 0
    rows, _ = np.nonzero(valid)
    ret = valid & (f.servers > 0)
    rrows, _ = np.nonzero(ret)
    run = np.concatenate((rows, rrows))
    t = np.concatenate((f.time_s[valid], f.time_s[ret] + f.away_s[ret]))
    k0 = np.zeros(rows.size, np.int64) if foreseen is None else np.where(foreseen[valid], 2, 0).astype(np.int64)
    kind = np.concatenate((k0, np.ones(rrows.size, np.int64)))
    delta = np.concatenate((f.servers[valid], -f.servers[ret]))
    if alarms is not None and alarms[0].size:
        run = np.concatenate((run, alarms[0]))
        t = np.concatenate((t, alarms[1]))
        kind = np.concatenate((kind, np.full(alarms[0].size, 3, np.int64)))
        delta = np.concatenate((delta, np.zeros(alarms[0].size, delta.dtype)))
    order = np.lexsort((kind, t, run))
    run, t, kind, delta = run[order], t[order], kind[order], delta[order]
    samples = f.samples
    per = np.bincount(run, minlength=samples)
    starts = np.cumsum(per) - per
    col = np.arange(run.size) - np.repeat(starts, per)
    cum = np.cumsum(delta)
    before = np.repeat(np.concatenate(([0], cum))[starts], per)  # cumulative sum before each run's first event
    width = max(1, int(per.max()) if per.size else 1)
    T = np.full((samples, width), np.inf)
    K = np.full((samples, width), -1, np.int64)
    M = np.zeros((samples, width), np.int64)
    T[run, col], K[run, col], M[run, col] = t, kind, cum - before
    return _Events(T, K, M)


def _finish_time(spec: RunSpec, start: np.ndarray, done_w: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """When a run computing from ``start`` at ``rate`` with ``done_w`` committed finishes (last checkpoint
    durable), if nothing interrupts it."""
    per = spec.interval_s * rate
    need = np.maximum(spec.work_s - done_w, 0.0)
    m = np.maximum(np.ceil(need / per - 1e-12), 1.0)
    return start + (m - 1) * spec.cycle_s + (need - (m - 1) * per) / rate + spec.stall_s + spec.persist_lag_s


def simulate_runs(spec: RunSpec, policy: Policy, failures: Failures, *, migration: Migration | None = None,
                  foreseen: np.ndarray | None = None, alarms: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, ...]:
    """The state machine over event columns (module docstring): per run its finish time (``inf``: still
    waiting at the end of the drawn failures), lost compute, interruptions, its (time, work) trace and its
    proactive migrations (``foreseen`` failures and false ``alarms``, :class:`Migration`)."""
    ev = _events(failures, foreseen, alarms)
    mig_s = migration.migration_s if migration is not None else 0.0
    migrations = np.zeros(ev.t.shape[0], np.int64)
    S, E = ev.t.shape
    W, tau, c, lag = spec.work_s, spec.interval_s, spec.cycle_s, spec.persist_lag_s
    table = np.asarray(spec.rate_by_missing if policy.elastic else (1.0,), dtype=float)
    run_start = np.zeros(S)
    pending = np.zeros(S)
    rate = np.full(S, table[0])
    done_w = np.zeros(S)
    finish = np.full(S, np.nan)
    lost = np.zeros(S)
    interrupts = np.zeros(S, np.int64)
    waiting = np.zeros(S, bool)
    trace_t = np.empty((S, E))
    trace_w = np.empty((S, E))
    if table[0] <= 0:
        raise ConfigError("elastic", "the job cannot run with all its servers", "check the rate table")
    for j in range(E):
        t, kind, missing = ev.t[:, j], ev.kind[:, j], ev.missing[:, j]
        live = (kind >= 0) & np.isnan(finish)
        up = live & ~waiting & (t > run_start)
        with np.errstate(invalid="ignore"):
            t_fin = _finish_time(spec, run_start, done_w, rate)
        fin = up & (t_fin <= t)
        finish[fin] = t_fin[fin]
        done_w[fin] = W
        live &= ~fin
        up &= ~fin
        el = np.where(up, t - run_start, 0.0)
        n = np.floor(el / c)
        n = np.maximum(np.where(el - n * c < lag, n - 1, n), 0.0)  # the last one is durable only once persisted
        since = el - n * c
        per = tau * rate
        gap = np.maximum(missing - policy.spares, 0)
        r_new = table[np.minimum(gap, table.size - 1)] if policy.elastic else np.where(gap == 0, 1.0, 0.0)
        if policy.elastic:
            r_new = np.where(gap < table.size, r_new, 0.0)
        can = r_new > 0
        fore = kind == 2
        fail = live & ((kind == 0) | fore)
        fu = fail & up
        f0 = fu & ~fore
        done_w[f0] += n[f0] * per[f0]
        lost[f0] += since[f0]
        interrupts[fu] += 1
        ready = t + spec.detect_s + spec.restart_s
        if migration is not None:  # a migration drains: every computed step is committed, nothing lost
            alarm = live & (kind == 3) & up
            drain = fore & up | alarm
            n_all = np.floor(el / c)
            drained = (n_all * tau + np.minimum(el - n_all * c, tau)) * rate
            done_w[drain] = np.minimum(W, done_w[drain] + drained[drain])
            interrupts[alarm] += 1
            migrations[live & fore | alarm] += 1
            ready = np.where(fore | alarm, t + mig_s, ready)
            run_start[alarm] = ready[alarm]
        go = fail & can
        run_start[go], rate[go] = ready[go], r_new[go]
        stop = fail & ~can
        pending[stop] = np.where(waiting[stop], np.maximum(pending[stop], ready[stop]), ready[stop])
        run_start[stop] = np.inf
        waiting[fail] = stop[fail]
        back = live & (kind == 1)
        res = back & waiting & can
        run_start[res] = np.maximum(pending[res], t[res] + spec.restart_s)
        rate[res] = r_new[res]
        waiting[res] = False
        if policy.elastic:
            grow = back & ~res & ~waiting & (r_new > rate)
            gu = grow & up
            partial = np.minimum(since, tau) * rate
            done_w[gu] = np.minimum(W, done_w[gu] + n[gu] * per[gu] + partial[gu])
            run_start[gu] = t[gu] + spec.stall_s + lag + spec.restart_s
            rate[grow] = r_new[grow]
        trace_t[:, j] = np.where(np.isnan(finish), np.where(kind >= 0, t, np.inf), finish)
        trace_w[:, j] = done_w
    rest = np.isnan(finish)
    with np.errstate(invalid="ignore"):
        t_fin = _finish_time(spec, run_start, done_w, rate)
    finish[rest] = np.where(waiting[rest], np.inf, t_fin[rest])
    return finish, lost, interrupts, trace_t, trace_w, migrations


def _foresee(migration: Migration, model: FailureModel, counts: ComponentCounts, f: Failures,
             seed: np.random.SeedSequence) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Which failures the predictor foresees (each with probability ``recall``) and its false alarms (run,
    time), drawn from a stream of their own (the failures drawn are those of the run without a predictor)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, 0x5EE)))
    seen = migration.predictable(model)
    valid = f.cls >= 0
    foreseen = valid & seen[np.where(valid, f.cls, 0)] & (rng.random(f.cls.shape) < migration.recall)
    rate = float(model.rates_per_s(counts)[seen].sum()) * migration.recall * (1.0 - migration.precision) \
        / migration.precision
    k = rng.poisson(rate * f.horizon_s, size=f.samples)
    run = np.repeat(np.arange(f.samples), k)
    return foreseen, (run, rng.random(run.size) * f.horizon_s)


def _chunk(args: tuple[RunSpec, Policy, FailureModel, ComponentCounts, int, float, np.random.SeedSequence,
                        Migration | None]) -> tuple[np.ndarray, ...]:
    spec, policy, model, counts, n, horizon, seed, migration = args
    rng = np.random.default_rng(seed)
    f = draw_failures(model, counts, n, horizon, rng)
    foreseen, alarms = _foresee(migration, model, counts, f, seed) if migration is not None else (None, None)
    finish, lost, interrupts, tt, tw, mig = simulate_runs(spec, policy, f, migration=migration,
                                                           foreseen=foreseen, alarms=alarms)
    by_class = f.counts_by_class(len(model.classes), np.where(np.isfinite(finish), finish, horizon))
    return finish, lost, interrupts, by_class.sum(axis=1), by_class, tt, tw, mig


def default_horizon_s(spec: RunSpec, model: FailureModel, counts: ComponentCounts) -> float:
    """Twice Daly's expected time of the run plus a day: the first window of drawn failures."""
    m = model.job_mtbf_s(counts)
    if not math.isfinite(m):
        return 2.0 * spec.work_s + 86_400.0
    r = spec.detect_s + spec.restart_s
    x = min(daly_expected_time_s(spec.work_s, spec.interval_s, spec.stall_s + spec.persist_lag_s, r, m),
            1e3 * spec.work_s)
    return 2.0 * x + 86_400.0


def _pad(parts: list[np.ndarray], fill: float) -> np.ndarray:
    width = max(p.shape[1] for p in parts)
    return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=fill) for p in parts])


def run_policy(spec: RunSpec, policy: Policy, model: FailureModel, counts: ComponentCounts, samples: int,
               seed: int, *, horizon_s: float | None = None, workers: int = 1,
               progress: Callable[[int, int], None] | None = None, migration: Migration | None = None) -> Runs:
    """``samples`` runs of ``spec`` under ``policy`` with failures of ``model`` on ``counts`` (seeded); with
    ``migration``, a failure predictor migrates the job ahead of the failures it foresees."""
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= 10_000_000:
        raise ConfigError("samples", f"must be a whole number in [1, 10^7], got {samples!r}", "e.g. --samples 1000")
    horizon = default_horizon_s(spec, model, counts) if horizon_s is None else float(horizon_s)
    sizes = [min(CHUNK, samples - i) for i in range(0, samples, CHUNK)]
    while True:
        seeds = np.random.SeedSequence(seed).spawn(len(sizes))
        jobs = [(spec, policy, model, counts, n, horizon, s, migration) for n, s in zip(sizes, seeds, strict=True)]
        outs: list[tuple[np.ndarray, ...]] = []
        if workers > 1 and len(jobs) > 1:
            with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
                for out in pool.map(_chunk, jobs):
                    outs.append(out)
                    if progress:
                        progress(len(outs), len(jobs))
        else:
            for job in jobs:
                outs.append(_chunk(job))
                if progress:
                    progress(len(outs), len(jobs))
        finish = np.concatenate([o[0] for o in outs])
        beyond = np.isfinite(finish) & (finish > horizon) | ~np.isfinite(finish)
        if not beyond.any() or horizon >= MAX_HORIZON_WORKS * spec.work_s:
            break
        horizon = min(2.0 * horizon, MAX_HORIZON_WORKS * spec.work_s)
    finish = np.where(finish > horizon, np.inf, finish)  # runs that did not finish inside the last horizon
    return Runs(policy, spec, finish, np.concatenate([o[1] for o in outs]), np.concatenate([o[2] for o in outs]),
                np.concatenate([o[3] for o in outs]), np.concatenate([o[4] for o in outs]),
                _pad([o[5] for o in outs], np.inf), _pad([o[6] for o in outs], np.nan),
                np.concatenate([o[7] for o in outs]) if migration is not None else None, migration)
