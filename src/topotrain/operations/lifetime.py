"""GPU lifetimes: a right-censored Weibull fit, and a reader of the Titan GPU life study's per-GPU table.

:func:`fit_weibull` is the maximum-likelihood Weibull law of lifetimes of which some ended in a failure and
the rest are censored (still alive when observation stopped): for a shape ``k`` the scale's estimate is
closed-form, ``λᵏ = Σ tᵢᵏ / r`` over all units with ``r`` failures, and ``k`` solves the profile likelihood's
equation ``Σ tᵢᵏ ln tᵢ / Σ tᵢᵏ − 1/k − (1/r) Σ_failed ln tᵢ = 0`` (increasing in ``k``: bisection; Lawless,
*Statistical Models and Methods for Lifetime Data*, 2003, §5.2).

:func:`read_lifetimes` reads ``gc_summary_loc.csv`` of olcf/TitanGPULife (Ostrouchov et al., "GPU Lifetimes
on Titan Supercomputer: Survival Analysis and Reliability", SC'20; docs/sources.md §12): one row per GPU
(serial ``SN``), ``time`` its seconds in service, ``dead`` (``TRUE``: failed by a double-bit error or off
the bus), ``batch`` (``old`` boards of 2012, ``new`` replacements of 2016–17). Any CSV with ``time``
(seconds) and ``dead`` columns reads the same.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topotrain.util.errors import ConfigError

YEAR_S = 365.25 * 86_400.0


@dataclass(frozen=True)
class WeibullFit:
    """A fitted Weibull law (``shape`` k, ``scale_s`` λ) and the data behind it."""

    shape: float
    scale_s: float
    units: int
    failures: int
    exposure_s: float

    @property
    def mean_s(self) -> float:
        """The law's mean, ``λ Γ(1 + 1/k)`` (what a :class:`~.failures.FailureClass` calls ``mtbf``)."""
        return self.scale_s * math.gamma(1.0 + 1.0 / self.shape)

    @property
    def exponential_mtbf_s(self) -> float:
        """The exponential law's estimate: exposure / failures."""
        return self.exposure_s / self.failures


def fit_weibull(durations_s: np.ndarray, failed: np.ndarray) -> WeibullFit:
    """Maximum-likelihood Weibull of right-censored lifetimes (module docstring)."""
    t = np.asarray(durations_s, dtype=float)
    d = np.asarray(failed, dtype=bool)
    if t.shape != d.shape or t.size == 0:
        raise ConfigError("lifetimes", "durations and failure flags must be non-empty and of one length")
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ConfigError("lifetimes", "every duration must be positive and finite", "drop zero-length rows")
    r = int(d.sum())
    if r < 2:
        raise ConfigError("lifetimes", f"{r} failure(s): too few to fit a Weibull law", "give at least 2")
    x = t / t.max()  # scaled: powers stay in [0, 1]
    lx = np.log(x)
    mean_log_failed = float(lx[d].mean())

    def g(k: float) -> float:
        w = x**k
        return float((w * lx).sum() / w.sum()) - 1.0 / k - mean_log_failed

    lo, hi = 0.02, 50.0
    if g(lo) > 0 or g(hi) < 0:
        raise ConfigError("lifetimes", "no Weibull shape in [0.02, 50] fits", "check the data")
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
    k = math.sqrt(lo * hi)
    scale = float(((x**k).sum() / r) ** (1.0 / k)) * float(t.max())
    return WeibullFit(k, scale, int(t.size), r, float(t.sum()))


@dataclass(frozen=True)
class Lifetimes:
    """Per-unit time in service (seconds), failed or censored, and a group label (Titan's ``batch``)."""

    time_s: np.ndarray
    failed: np.ndarray
    group: tuple[str, ...]

    def fit(self, group: str | None = None) -> WeibullFit:
        keep = np.ones(self.time_s.size, bool) if group is None else np.array([g == group for g in self.group])
        pos = keep & (self.time_s > 0)
        return fit_weibull(self.time_s[pos], self.failed[pos])


def read_lifetimes(path: str | Path) -> Lifetimes:
    """A lifetime table (``time`` seconds, ``dead`` TRUE/FALSE, optional ``batch``); errors name the row."""
    p = Path(path)
    times, dead, group = [], [], []
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        for need in ("time", "dead"):
            if need not in cols:
                raise ConfigError(f"{p}", f"missing column {need}", "the header needs time (seconds) and dead")
        for n, row in enumerate(reader, start=2):
            try:
                tv = float(row["time"])
            except (TypeError, ValueError):
                raise ConfigError(f"{p}:row {n}, column time", f"not a number: {str(row['time'])[:40]!r}",
                                  "seconds in service") from None
            dv = str(row["dead"]).strip().upper()
            if dv not in ("TRUE", "FALSE", "1", "0"):
                raise ConfigError(f"{p}:row {n}, column dead", f"not a truth value: {dv[:40]!r}",
                                  "TRUE/FALSE or 1/0")
            if not (math.isfinite(tv) and tv >= 0):
                raise ConfigError(f"{p}:row {n}, column time", f"must be ≥ 0, got {tv!r}", "seconds in service")
            times.append(tv)
            dead.append(dv in ("TRUE", "1"))
            group.append(str(row.get("batch") or ""))
    if not times:
        raise ConfigError(f"{p}", "no rows", "the file has a header only")
    return Lifetimes(np.asarray(times), np.asarray(dead), tuple(group))
