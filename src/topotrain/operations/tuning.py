"""The checkpoint interval and the hot spares chosen together for the expected time to train.

For each spare count of a small grid, the interval is searched on a log scale: a grid of
:data:`GRID_POINTS` intervals from Daly's ÷ 4 to × 4, then a golden-section search between the best grid
point's neighbours (:data:`GOLDEN_STEPS` steps). Every evaluation is the Monte-Carlo of
:mod:`topotrain.operations.longrun` with one seed and one horizon, so all of them see the same failures
(common random numbers): differences between intervals are differences of the policy, not of the draw.
The objective is the expected time to train (``time``), or the expected GPU-hours reserved, spares
included (``gpu_hours``), which charges each spare for the whole run. More spares never slow a run down,
so for ``time`` the chosen spare count is the smallest whose time is within :data:`TIME_TOLERANCE` of the
best one's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from topotrain.operations.checkpoint import daly_interval_s
from topotrain.operations.failures import ComponentCounts, FailureModel
from topotrain.operations.longrun import Policy, RunSpec, default_horizon_s, run_policy
from topotrain.util.errors import ConfigError

Objective = Literal["time", "gpu_hours"]
GRID_POINTS = 9
GOLDEN_STEPS = 8
#: Spares that shorten the expected time by less than this fraction are not worth their GPUs.
TIME_TOLERANCE = 1e-3
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class TunedPoint:
    """The best interval for one spare count, and what it gives."""

    spares: int
    interval_s: float
    time_to_train_s: float
    goodput: float
    gpu_hours: float
    evaluations: int


@dataclass(frozen=True)
class Tuning:
    """Every spare count's best interval, and the chosen (spares, interval)."""

    objective: Objective
    points: tuple[TunedPoint, ...]
    best: TunedPoint
    daly_interval_s: float


def _score(p: TunedPoint, objective: Objective) -> float:
    return p.time_to_train_s if objective == "time" else p.gpu_hours


def tune(spec: RunSpec, model: FailureModel, counts: ComponentCounts, spares: Sequence[int], samples: int,
         seed: int, *, elastic: bool = False, objective: Objective = "time",
         progress: Callable[[int, int], None] | None = None) -> Tuning:
    """The interval and spares that minimize ``objective`` (module docstring)."""
    if objective not in ("time", "gpu_hours"):
        raise ConfigError("--objective", f"unknown objective {objective!r}", "use time or gpu_hours")
    if not spares:
        raise ConfigError("--spares", "no spare count to try", "give e.g. 0,8,16,32")
    mtbf = model.job_mtbf_s(counts)
    daly = daly_interval_s(max(spec.stall_s, 1e-3), mtbf) if math.isfinite(mtbf) else spec.work_s
    horizon = 2.0 * default_horizon_s(dataclasses.replace(spec, interval_s=daly), model, counts)
    total = len(spares) * (GRID_POINTS + GOLDEN_STEPS + 1)
    done = 0
    out = []
    for s in spares:
        policy = Policy(f"spares={s}", spares=int(s), elastic=elastic)
        seen: dict[float, TunedPoint] = {}

        def evaluate(log_tau: float, policy: Policy = policy, seen: dict[float, TunedPoint] = seen) -> float:
            nonlocal done
            tau = float(min(max(math.exp(log_tau), 1e-3), spec.work_s))
            if tau not in seen:
                runs = run_policy(dataclasses.replace(spec, interval_s=tau), policy, model, counts, samples, seed,
                                  horizon_s=horizon)
                st = runs.summary()
                seen[tau] = TunedPoint(policy.spares, tau, st["time_to_train_s"], st["goodput"],
                                       st["time_to_train_s"] * runs.reserved_gpus() / 3600.0, 1)
            done += 1
            if progress:
                progress(min(done, total), total)
            return _score(seen[tau], objective)

        grid = np.linspace(math.log(daly / 4.0), math.log(daly * 4.0), GRID_POINTS)
        vals = [evaluate(float(x)) for x in grid]
        i = int(np.argmin(vals))
        lo, hi = grid[max(0, i - 1)], grid[min(GRID_POINTS - 1, i + 1)]
        a, b = hi - _PHI * (hi - lo), lo + _PHI * (hi - lo)
        fa, fb = evaluate(float(a)), evaluate(float(b))
        for _ in range(GOLDEN_STEPS - 2):
            if fa <= fb:
                hi, b, fb = b, a, fa
                a = hi - _PHI * (hi - lo)
                fa = evaluate(float(a))
            else:
                lo, a, fa = a, b, fb
                b = lo + _PHI * (hi - lo)
                fb = evaluate(float(b))
        best = min(seen.values(), key=lambda p: (_score(p, objective), p.interval_s))
        out.append(dataclasses.replace(best, evaluations=len(seen)))
    best_score = min(_score(p, objective) for p in out)
    if objective == "time":
        chosen = min((p for p in out if p.time_to_train_s <= best_score * (1 + TIME_TOLERANCE)),
                     key=lambda p: (p.spares, p.time_to_train_s))
    else:
        chosen = min(out, key=lambda p: (_score(p, objective), p.spares))
    return Tuning(objective, tuple(out), chosen, daly)
