"""Error bands on predictions: split-conformal intervals from the residuals of the validation subset.

Every prediction carries an interval ``[t / f, t · f]`` around its iteration time ``t``: ``f = exp(q)``
where ``q`` is the conformal quantile of the absolute log errors ``|ln(predicted / published)|`` of the
published rows that no constant was fitted on (:mod:`topotrain.validate.published`, the *validation
subset*), in the prediction's *regime*. Split conformal prediction (Vovk et al. 2005; Lei et al., JASA
2018): with ``n`` exchangeable calibration scores, the ``k = ⌈(n+1)·level⌉``-th smallest bounds a new
score with probability ≥ ``level``; with ``k > n`` the interval is unbounded, and we refuse to print a
band narrower than the data can back.

Regimes are (family, expert structure, scale): ``cnn``/``transformer`` × ``dense``/``moe`` ×
``single-node``/``multi-node`` (Mondrian conformal prediction: one band per category, Vovk et al. 2005
§4.5). A regime with fewer rows than :func:`min_rows` (the fewest that give a finite band at the level,
plus one) borrows the rows of the nearest coarser regime: family dropped first, then expert structure,
keeping the scale to the last, because scale decides which mechanisms are in play (one server: kernel
launches, the host input pipeline, NVLink; many: the network, pipeline bubbles) and so which errors are
comparable. The band says which rows it used: an MoE prediction states that no MoE run backs its band.

The residuals live in ``residuals.json`` beside this module, written by
``topotrain validate --published --write-residuals`` (analytical network, the validation rows' own
settings) and checked against fresh simulations by the tests, so a model change that moves any
prediction also asks for the residuals to be regenerated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

#: nominal coverage of the band every result carries
DEFAULT_LEVEL = 0.8
RESIDUALS_PATH = Path(__file__).with_name("residuals.json")


@dataclass(frozen=True)
class Regime:
    """Where a prediction sits: model family, expert structure, scale."""

    family: str  # "cnn" | "transformer"
    experts: str  # "dense" | "moe"
    scale: str  # "single-node" | "multi-node"

    def __str__(self) -> str:
        return f"{self.family}/{self.experts}/{self.scale}"

    def coarser(self) -> list[tuple[str, dict[str, str]]]:
        """The regimes to try, finest first: (label, the fields that must match)."""
        return [(str(self), {"family": self.family, "experts": self.experts, "scale": self.scale}),
                (f"*/{self.experts}/{self.scale}", {"experts": self.experts, "scale": self.scale}),
                (f"*/*/{self.scale}", {"scale": self.scale}),
                ("all", {})]


def regime_of(sample_kind: str, experts: int, servers: int) -> Regime:
    """The regime of a model (``sample_kind`` ``"image"`` → CNN) with ``experts`` on ``servers`` servers."""
    return Regime("cnn" if sample_kind == "image" else "transformer", "moe" if experts > 1 else "dense",
                  "single-node" if servers <= 1 else "multi-node")


@dataclass(frozen=True)
class Residual:
    """One validation row's log error ``ln(predicted / published)`` of its throughput metric (the same,
    with the sign flipped, as the log error of its iteration time)."""

    case: str
    regime: Regime
    log_error: float


@dataclass(frozen=True)
class Band:
    """A multiplicative interval: the true value lies in ``[t / factor, t · factor]`` with probability
    ``level`` (for exchangeable rows), from ``rows`` validation rows of regime ``used`` (``regime`` is the
    prediction's own)."""

    level: float
    factor: float
    regime: str
    used: str
    rows: int

    @property
    def plus_minus(self) -> float:
        """Half-width as a fraction (``factor − 1``: +x% up, about −x% down)."""
        return self.factor - 1.0

    def interval(self, value: float) -> tuple[float, float]:
        return value / self.factor, value * self.factor

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "plus_minus": self.plus_minus, "regime": self.regime,
                "from_regime": self.used, "from_rows": self.rows}


def conformal_quantile(scores: list[float], level: float) -> float:
    """The ``⌈(n+1)·level⌉``-th smallest of ``scores`` (``inf`` when that exceeds ``n``)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n = len(scores)
    k = math.ceil((n + 1) * level)
    return math.inf if k > n else sorted(scores)[k - 1]


def min_rows(level: float) -> int:
    """Fewest rows for a band of a regime's own: the smallest ``n`` with ``⌈(n+1)·level⌉ ≤ n`` (a finite
    quantile) plus one, so that one row more or less cannot make the band unbounded (5 at 80%)."""
    n = 1
    while math.ceil((n + 1) * level) > n:
        n += 1
    return n + 1


def band_from(regime: Regime, residuals: list[Residual], level: float = DEFAULT_LEVEL,
              rows_needed: int | None = None) -> Band:
    """The band of a prediction in ``regime`` from ``residuals``: the finest regime (:meth:`Regime.coarser`)
    with ``rows_needed`` rows (default :func:`min_rows` at :data:`DEFAULT_LEVEL`, whatever ``level``: the
    rows a regime uses do not depend on the level, so a higher level never gives a narrower band; where
    those rows are too few for ``level``, the band is unbounded), else all rows."""
    need = min_rows(DEFAULT_LEVEL) if rows_needed is None else rows_needed
    for label, match in regime.coarser():
        scores = [abs(r.log_error) for r in residuals
                  if all(getattr(r.regime, k) == v for k, v in match.items())]
        if len(scores) >= need or label == "all":
            return Band(level, math.exp(conformal_quantile(scores, level)), str(regime), label, len(scores))
    raise AssertionError("unreachable: the 'all' regime always returns")


@lru_cache(maxsize=4)
def load_residuals(path: Path = RESIDUALS_PATH) -> tuple[Residual, ...]:
    """The validation subset's residuals as shipped (empty when the file is missing)."""
    if not path.exists():
        return ()
    doc = json.loads(path.read_text())
    return tuple(Residual(r["case"], Regime(**r["regime"]), float(r["log_error"])) for r in doc["rows"])


def band(regime: Regime, level: float = DEFAULT_LEVEL) -> Band | None:
    """The shipped band for ``regime`` (``None`` without residuals)."""
    rows = load_residuals()
    return band_from(regime, list(rows), level) if rows else None


def cross_validated_coverage(residuals: list[Residual], level: float = DEFAULT_LEVEL,
                             rows_needed: int | None = None) -> float:
    """Leave-one-out coverage: the fraction of rows whose own error lies inside the band built from the
    other rows (in the held-out row's regime, with the same fallback as every prediction)."""
    hits = 0
    for i, held in enumerate(residuals):
        rest = residuals[:i] + residuals[i + 1:]
        b = band_from(held.regime, rest, level, rows_needed)
        hits += abs(held.log_error) <= math.log(b.factor)
    return hits / len(residuals)
