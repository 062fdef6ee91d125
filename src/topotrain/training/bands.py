"""Error bands on predictions: split-conformal intervals from the residuals of the validation subset.

Every prediction carries an interval ``[t / f, t · f]`` around its iteration time ``t``: ``f = exp(q)``
where ``q`` is the conformal quantile of the absolute log errors ``|ln(predicted / published)|`` of the
published rows that no constant was fitted on (:mod:`topotrain.validate.published`, the *validation
subset*), in the prediction's *regime*. Split conformal prediction (Vovk et al. 2005; Lei et al., JASA
2018): with ``n`` exchangeable calibration scores, the ``k = ⌈(n+1)·level⌉``-th smallest bounds a new
score with probability ≥ ``level``; with ``k > n`` the interval is unbounded, and we refuse to print a
band narrower than the data can back.

Regimes are (family, expert structure, scale, fleet): ``cnn``/``transformer`` × ``dense``/``moe`` ×
``single-node``/``multi-node`` × ``uniform``/``mixed`` GPU types (Mondrian conformal prediction: one band per
category, Vovk et al. 2005 §4.5). A band comes from the rows of the prediction's own regime when that regime has at
least :func:`min_rows` of them (the fewest that give a finite band at the level, plus one). Otherwise the band is
*borrowed*, says so, and is widened by this rule (:func:`band_from`):

1. the *donors* are the regimes with a band of their own (``min_rows`` rows) nearest to the prediction's
   in the regime grid (fewest of family, experts, scale, fleet differing); the borrowed log half-width is
   :data:`BORROW_WIDEN` times the widest donor's (errors do not transfer between regimes: a band from
   other rows is at best a guess at the scale of the error, so it is given twice the room);
2. it also covers every row the prediction's own regime does have (too few for a quantile, but each one
   is a measured error the band must not exclude);
3. a multi-node band is never narrower than the band of the same family and experts on one node (itself
   by this rule): many servers add the network and pipelines to every single-node mechanism, and remove
   none, so they cannot make a prediction surer.

No regime with a band of its own (a small calibration set): the rows of all regimes, pooled, as donor.
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


#: the factor on a donor band's log half-width for a borrowed band (rule 1 of the module docstring)
BORROW_WIDEN = 2.0


@dataclass(frozen=True)
class Regime:
    """Where a prediction sits: model family, expert structure, scale."""

    family: str  # "cnn" | "transformer"
    experts: str  # "dense" | "moe"
    scale: str  # "single-node" | "multi-node"
    fleet: str = "uniform"  # "uniform" | "mixed" (several GPU types: no published row yet, so always borrowed)

    def __str__(self) -> str:
        return f"{self.family}/{self.experts}/{self.scale}" + ("/mixed" if self.fleet == "mixed" else "")

    def distance(self, other: Regime) -> int:
        """How many of family, experts, scale and fleet differ."""
        return sum(a != b for a, b in zip((self.family, self.experts, self.scale, self.fleet),
                                          (other.family, other.experts, other.scale, other.fleet), strict=True))


def regime_of(sample_kind: str, experts: int, servers: int, mixed: bool = False) -> Regime:
    """The regime of a model (``sample_kind`` ``"image"`` → CNN) with ``experts`` on ``servers`` servers, on a
    cluster of one GPU type or (``mixed``) several."""
    return Regime("cnn" if sample_kind == "image" else "transformer", "moe" if experts > 1 else "dense",
                  "single-node" if servers <= 1 else "multi-node", "mixed" if mixed else "uniform")


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
    ``level`` (for exchangeable rows), from ``rows`` validation rows. ``regime`` is the prediction's own;
    ``used`` names the rows: the regime itself, or, for a ``borrowed`` band, the donor regimes and the
    widening (the module docstring's rule)."""

    level: float
    factor: float
    regime: str
    used: str
    rows: int
    borrowed: bool = False

    @property
    def plus_minus(self) -> float:
        """Half-width as a fraction (``factor − 1``: +x% up, about −x% down)."""
        return self.factor - 1.0

    def interval(self, value: float) -> tuple[float, float]:
        return value / self.factor, value * self.factor

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "plus_minus": self.plus_minus, "regime": self.regime,
                "from_regime": self.used, "from_rows": self.rows, "borrowed": self.borrowed}


def describe(band: dict[str, Any]) -> str:
    """``17.4% (80% band, 16 validation rows of transformer/dense/multi-node)``, or for a borrowed band
    ``31.9% (80% band BORROWED: too few cnn/dense/multi-node rows; from ...)``; ``unbounded`` where the
    rows cannot back the level. ``band`` is :meth:`Band.to_dict`'s record."""
    pm = band["plus_minus"]
    width = "unbounded" if pm is None or pm == float("inf") else f"{100 * pm:.1f}%"
    level = f"{100 * band['level']:.0f}% band"
    if band.get("borrowed"):
        return (f"{width} ({level} borrowed: too few {band['regime']} rows; {band['from_rows']} validation rows "
                f"of {band['from_regime']})")
    return f"{width} ({level}, {band['from_rows']} validation rows of {band['from_regime']})"


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


def _scores(residuals: list[Residual], regime: Regime) -> list[float]:
    return [abs(r.log_error) for r in residuals if r.regime == regime]


def band_from(regime: Regime, residuals: list[Residual], level: float = DEFAULT_LEVEL,
              rows_needed: int | None = None) -> Band:
    """The band of a prediction in ``regime`` from ``residuals``: its own regime's rows where there are
    ``rows_needed`` of them (default :func:`min_rows` at :data:`DEFAULT_LEVEL`, whatever ``level``: the rows
    a regime uses do not depend on the level, so a higher level never gives a narrower band; where those
    rows are too few for ``level``, the band is unbounded), else borrowed by the module docstring's rule."""
    need = min_rows(DEFAULT_LEVEL) if rows_needed is None else rows_needed
    own = _scores(residuals, regime)
    if len(own) >= need:
        return Band(level, math.exp(conformal_quantile(own, level)), str(regime), str(regime), len(own))
    regimes = sorted({r.regime for r in residuals}, key=str)
    donors = [g for g in regimes if len(_scores(residuals, g)) >= need]
    if donors:  # rule 1: the nearest regimes with bands of their own
        nearest = min(regime.distance(g) for g in donors)
        donors = [g for g in donors if regime.distance(g) == nearest]
        q = BORROW_WIDEN * max(conformal_quantile(_scores(residuals, g), level) for g in donors)
        rows = sum(len(_scores(residuals, g)) for g in donors)
        used = [f"{', '.join(map(str, donors))} (x{BORROW_WIDEN:g} on the log width)"]
    else:  # a small calibration set: all rows pooled
        q = BORROW_WIDEN * conformal_quantile([abs(r.log_error) for r in residuals], level)
        rows, used = len(residuals), [f"all regimes (x{BORROW_WIDEN:g} on the log width)"]
    if own and max(own) > q:  # rule 2: the regime's own few rows lie inside
        q = max(own)
        used.append(f"its own {len(own)} row(s)")
    if regime.scale == "multi-node":  # rule 3: many nodes are no surer than one
        one = band_from(Regime(regime.family, regime.experts, "single-node", regime.fleet), residuals, level,
                        rows_needed)
        if one.factor > math.exp(q):
            q, rows = math.log(one.factor), one.rows
            used = [f"{one.used}, as the {one.regime} band (many nodes are no surer than one)"]
    return Band(level, math.exp(q), str(regime), "; ".join(used), rows, borrowed=True)


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
