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
from collections.abc import Mapping
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


def plot_front(path: Path, rows: list[Row], front: list[Row]) -> None:
    """PNG: every feasible point (iteration time vs capex) and the Pareto front, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.status == "ok"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r.best["iteration_time_s"] * 1e3 for r in ok], [r.best["capex_usd"] / 1e6 for r in ok],
               s=10, color="0.7", label=f"feasible points ({len(ok)})")
    ax.plot([r.best["iteration_time_s"] * 1e3 for r in front], [r.best["capex_usd"] / 1e6 for r in front],
            "o-", color="C3", label=f"Pareto front ({len(front)})")
    for r in front[:6]:
        ax.annotate(describe(r), (r.best["iteration_time_s"] * 1e3, r.best["capex_usd"] / 1e6), fontsize=6,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("iteration time (ms)")
    ax.set_ylabel("capex (million USD)")
    ax.set_title("topotrain search: time vs cost")
    ax.legend(fontsize=8)
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
