"""The verdict of ``topotrain explain``: which of two predictions is faster, and whether the difference
means anything next to their error bands (:mod:`topotrain.training.bands`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BREAKDOWN_KEYS = ("compute_s", "tp_comm_s", "exposed_comm_s", "bubble_s")


@dataclass(frozen=True)
class Verdict:
    """``faster`` beats ``slower`` by ``difference`` (a fraction of the faster's time); ``within_band`` when
    that is no more than the wider band's half-width ``band`` (the intervals ``[t/f, t·f]`` of the two
    predictions then hold each other's value: the model cannot rank them). ``cause`` is the breakdown
    entry that moved most."""

    faster: str
    slower: str
    difference: float
    band: float | None
    within_band: bool
    cause: str
    cause_s: float
    total_s: float

    def text(self) -> str:
        if self.total_s == 0.0:
            return "the two iterations take the same time"
        what = self.cause.removesuffix("_s").replace("_", " ")
        detail = (f"most of the difference ({self.cause_s * 1e3:.3f} of {self.total_s * 1e3:.3f} ms) is {what}")
        if self.within_band:
            assert self.band is not None
            return (f"{self.faster} and {self.slower} are within the band: {self.faster} is "
                    f"{100 * self.difference:.1f}% faster, inside the predictions' ±{100 * self.band:.1f}% "
                    f"error band, so this ranking is not backed by the model's accuracy; {detail}")
        band = "" if self.band is None else f" (beyond the ±{100 * self.band:.1f}% error band)"
        return f"{self.faster} is {100 * self.difference:.1f}% faster than {self.slower}{band}; {detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"faster": self.faster, "slower": self.slower, "difference": self.difference,
                "band_plus_minus": self.band, "within_band": self.within_band, "cause": self.cause}


def _factor(d: Mapping[str, Any]) -> float | None:
    b = d.get("error_band")
    return None if not b else 1.0 + float(b["plus_minus"])


def verdict(name_a: str, a: Mapping[str, Any], name_b: str, b: Mapping[str, Any]) -> Verdict:
    """The verdict on two results' :meth:`~topotrain.training.simulate.Result.to_dict` records."""
    ta, tb = float(a["iteration_time_s"]), float(b["iteration_time_s"])
    da, db = a["breakdown"], b["breakdown"]
    diff = {k: float(db[k]) - float(da[k]) for k in BREAKDOWN_KEYS}
    cause = max(BREAKDOWN_KEYS, key=lambda k: abs(diff[k]))
    faster, slower = (name_a, name_b) if ta <= tb else (name_b, name_a)
    lo, hi = min(ta, tb), max(ta, tb)
    factors = [f for f in (_factor(a), _factor(b)) if f is not None]
    factor = max(factors) if factors else None
    ratio = hi / lo if lo > 0 else float("inf")
    within = factor is not None and ratio <= factor
    return Verdict(faster, slower, ratio - 1.0, None if factor is None else factor - 1.0, within, cause,
                   abs(diff[cause]), hi - lo)
