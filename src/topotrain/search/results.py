"""A search's answer: the ranked points, the Pareto front of time vs cost, CSV and PNG files.

Ranking: the confirmed points (timed again with the confirming network model) come first, ordered by
their confirmed value of the first objective, then every other feasible point by its screened value; ties
are broken by the point's place in the search, so the ranking is deterministic. The Pareto front (Deb,
*Multi-Objective Optimization Using Evolutionary Algorithms*, 2001: a point no other point beats on
both objectives) is over iteration time and capex, each point at its best-known time (confirmed if it
was confirmed).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from topotrain.search.space import MINIMIZE
from topotrain.util.atomic import atomic_write, atomic_write_text


@dataclass(frozen=True)
class Row:
    """One point with its screened and (where run) confirmed metrics."""

    seq: int
    key: str
    status: str
    field: str
    reason: str
    choices: Mapping[str, Any]
    point: Mapping[str, Any]
    screen: Mapping[str, Any]
    confirm: Mapping[str, Any] | None

    @property
    def best(self) -> Mapping[str, Any]:
        """Metrics at the most faithful network model this point was timed with."""
        if self.confirm is not None and self.confirm.get("iteration_time_s") is not None:
            return self.confirm
        return self.screen


def rows_of(records: list[dict[str, Any]]) -> list[Row]:
    """Screen and confirm records joined by point, in search order."""
    screen = {r["key"]: r for r in records if r["stage"] == "screen"}
    confirm = {r["key"]: r for r in records if r["stage"] == "confirm"}
    out = []
    for k, r in screen.items():
        c = confirm.get(k)
        status, fld, reason = r["status"], r["field"], r["reason"]
        if c is not None and c["status"] != "ok":
            status, fld, reason = c["status"], c["field"], c["reason"]
        out.append(Row(r["seq"], k, status, fld, reason, r["choices"], r["point"], r["metrics"],
                       c["metrics"] if c is not None and c["status"] == "ok" else None))
    out.sort(key=lambda x: x.seq)
    return out


def _val(m: Mapping[str, Any], objective: str) -> float:
    v = m.get(objective)
    if v is None:
        return math.inf
    return float(v) if MINIMIZE[objective] else -float(v)


def ranked(rows: list[Row], objective: str) -> list[Row]:
    """Feasible points, best first (confirmed ones first, by their confirmed value)."""
    ok = [r for r in rows if r.status == "ok"]
    return sorted(ok, key=lambda r: (r.confirm is None, _val(r.best, objective), r.seq))


def pareto(rows: list[Row], x: str = "iteration_time_s", y: str = "capex_usd") -> list[Row]:
    """The points no other point beats on both ``x`` and ``y`` (both as the objectives' sense), by x."""
    ok = [r for r in rows if r.status == "ok"]
    ok.sort(key=lambda r: (_val(r.best, x), _val(r.best, y), r.seq))
    front: list[Row] = []
    best_y = math.inf
    for r in ok:
        vy = _val(r.best, y)
        if vy < best_y:
            front.append(r)
            best_y = vy
    return front


def describe(r: Row) -> str:
    """The point in a few words: its cluster, collective and plan."""
    p = r.point
    cl = p.get("cluster", {}) if isinstance(p.get("cluster"), Mapping) else {}
    srv = cl.get("server")
    srv = srv.get("name", "custom") if isinstance(srv, Mapping) else srv
    net = cl.get("network", {}) if isinstance(cl.get("network"), Mapping) else {}
    plan = p.get("plan", {}) if isinstance(p.get("plan"), Mapping) else {}
    parts = [f"{cl.get('servers', 1)}x {srv}", str(net.get("topology", cl.get("graph", "")))]
    groups = cl.get("groups")
    if isinstance(groups, list):  # a mixed fleet: how many of each server (and its GPU where overridden)
        def one(g: Any) -> str:
            g = g if isinstance(g, Mapping) else {}
            s = g.get("server")
            s = s.get("name", "custom") if isinstance(s, Mapping) else s
            return f"{g.get('servers', 1)}x {s}" + (f"({g['gpu']})" if g.get("gpu") else "")
        parts[0] = "+".join(one(g) for g in groups)
    algo = (r.best.get("plan") or {}).get("dp_algorithm") or plan.get("dp_algorithm")
    if algo:
        parts.append(str(algo))
    b = p.get("batch")
    batch: Mapping[str, Any] = b if isinstance(b, Mapping) else {}
    for k, v in (("tp", plan.get("tp")), ("cp", plan.get("cp")), ("pp", plan.get("pp")),
                 ("micro", plan.get("micro_batch", batch.get("micro"))),
                 ("bucket", plan.get("bucket"))):
        if v is not None:
            parts.append(f"{k}={v}")
    return " ".join(x for x in parts if x)


_COLUMNS = ("rank", "seq", "key", "status", "field", "reason", "description", "gpus", "network_confirmed",
            "iteration_time_s_screen", "iteration_time_s_confirm", "iteration_time_s_low",
            "iteration_time_s_high", "time_to_train_s", "capex_usd", "power_kw",
            "usd_per_1m_tokens", "tokens_per_s_per_kw", "mfu", "compute_s", "exposed_comm_s", "bubble_s", "choices")


def _csv_row(r: Row, rank: int | None) -> dict[str, Any]:
    b = r.best
    bd = b.get("breakdown", {})
    import json

    return {"rank": rank if rank is not None else "", "seq": r.seq, "key": r.key, "status": r.status,
            "field": r.field, "reason": r.reason, "description": describe(r), "gpus": r.screen.get("gpus", ""),
            "network_confirmed": r.confirm.get("network", "") if r.confirm else "",
            "iteration_time_s_screen": r.screen.get("iteration_time_s", ""),
            "iteration_time_s_confirm": r.confirm.get("iteration_time_s", "") if r.confirm else "",
            "iteration_time_s_low": b.get("iteration_time_s_low", ""),
            "iteration_time_s_high": b.get("iteration_time_s_high", ""),
            "time_to_train_s": b.get("time_to_train_s", ""), "capex_usd": b.get("capex_usd", ""),
            "power_kw": b.get("power_kw", ""), "usd_per_1m_tokens": b.get("usd_per_1m_tokens", ""),
            "tokens_per_s_per_kw": b.get("tokens_per_s_per_kw", ""), "mfu": b.get("mfu", ""),
            "compute_s": bd.get("compute_s", ""), "exposed_comm_s": bd.get("exposed_comm_s", ""),
            "bubble_s": bd.get("bubble_s", ""), "choices": json.dumps(dict(r.choices), sort_keys=True)}


def write_csv(path: Path, rows: list[Row], order: list[Row]) -> None:
    """Every point (ranked ones first, then the rest in search order), written atomically."""
    ranks = {r.key: i + 1 for i, r in enumerate(order)}
    rest = [r for r in rows if r.key not in ranks]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(_COLUMNS))
    w.writeheader()
    for r in [*order, *rest]:
        w.writerow(_csv_row(r, ranks.get(r.key)))
    atomic_write_text(path, buf.getvalue(), make_parents=True)


def robust_limits(values: list[float], must_include: Sequence[float] = (),
                  quantiles: tuple[float, float] = (0.02, 0.98), margin: float = 0.06) -> tuple[float, float]:
    """Axis limits that a few outliers cannot squash the rest into: the ``quantiles`` of the finite
    ``values`` (the order statistics just inside them, never interpolated toward an outlier), widened to
    hold ``must_include`` (the Pareto front), plus ``margin`` of the span on each side; ``(0, 1)`` without
    a finite value."""
    vals = sorted(v for v in values if math.isfinite(v))
    keep = [v for v in must_include if math.isfinite(v)]
    if not vals and not keep:
        return 0.0, 1.0

    n = len(vals)
    inner_lo = vals[min(n - 1, math.ceil(quantiles[0] * (n - 1)))] if vals else keep[0]
    inner_hi = vals[max(0, math.floor(quantiles[1] * (n - 1)))] if vals else keep[0]

    lo, hi = min([inner_lo, *keep]), max([inner_hi, *keep])
    pad = (hi - lo) * margin if hi > lo else (abs(hi) * 0.06 or 1.0)  # one value: still a span
    return lo - pad, hi + pad


def _band_err_ms(r: Row) -> tuple[float, float]:
    """(below, above) of a point's error band in ms (0 where it has none or it is unbounded)."""
    b = r.best
    t, lo, hi = b.get("iteration_time_s"), b.get("iteration_time_s_low"), b.get("iteration_time_s_high")
    if t is None or lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return 0.0, 0.0
    return (t - lo) * 1e3, (hi - t) * 1e3


def plot_front(path: Path, rows: list[Row], front: list[Row]) -> None:
    """PNG: every feasible point (iteration time vs capex), screened-only points apart from the points the
    flow model confirmed (these with their error bands as horizontal error bars), the Pareto front, and axis
    limits from the points' 2–98 % range holding the whole front (:func:`robust_limits`; the points beyond
    them are counted in the legend). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.status == "ok"]
    confirmed = [r for r in ok if r.best is r.confirm]
    screened = [r for r in ok if r.best is not r.confirm]

    def xy(rs: list[Row]) -> tuple[list[float], list[float]]:
        return [r.best["iteration_time_s"] * 1e3 for r in rs], [r.best["capex_usd"] / 1e6 for r in rs]

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    sx, sy = xy(screened)
    ax.scatter(sx, sy, s=9, color="0.7", marker=".", label=f"screened only ({len(screened)})")
    if confirmed:
        cx, cy = xy(confirmed)
        err = [_band_err_ms(r) for r in confirmed]
        ax.errorbar(cx, cy, xerr=[[e[0] for e in err], [e[1] for e in err]], fmt="s", ms=4, color="C0",
                    ecolor="C0", elinewidth=0.8, alpha=0.8, capsize=2,
                    label=f"confirmed ({len(confirmed)}), bar = error band")
    fx, fy = xy(front)
    ax.plot(fx, fy, "o-", color="C3", mfc="none", label=f"Pareto front ({len(front)})")
    for r in front[:6]:
        ax.annotate(describe(r), (r.best["iteration_time_s"] * 1e3, r.best["capex_usd"] / 1e6), fontsize=6,
                    xytext=(4, 4), textcoords="offset points")
    ax_x, ax_y = xy(ok)
    xlim, ylim = robust_limits(ax_x, fx), robust_limits(ax_y, fy)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    beyond = sum(1 for x, y in zip(ax_x, ax_y, strict=True)
                 if not (xlim[0] <= x <= xlim[1] and ylim[0] <= y <= ylim[1]))
    if beyond:
        ax.plot([], [], " ", label=f"{beyond} point(s) beyond the axes")
    ax.set_xlabel("iteration time (ms)")
    ax.set_ylabel("capex (million USD)")
    ax.set_title("topotrain search: time vs cost")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, lambda fh: fh.write(buf.getvalue()), make_parents=True)


def write_point(path: Path, r: Row, network: str | None) -> None:
    """A point as a scenario file (``topotrain simulate`` / ``explain`` load it as it is)."""
    doc = dict(r.point)
    if network is not None:
        doc["network"] = network
    head = f"# topotrain search point {r.key} (seq {r.seq}): {describe(r)}\n"
    atomic_write_text(path, head + yaml.safe_dump(doc, sort_keys=False), make_parents=True)
