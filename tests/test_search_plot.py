"""The search's Pareto plot (issue 41 item 13): robust axis limits, screened vs confirmed points apart,
error bands as error bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import pytest

from topotrain.search.results import Row, plot_front, robust_limits

matplotlib.use("Agg")


def test_robust_limits_ignore_outliers_but_hold_the_front() -> None:
    vals = [float(v) for v in range(1, 101)] + [1e6]  # one runaway point
    lo, hi = robust_limits(vals, margin=0.0)
    assert lo == 3.0 and hi == 99.0  # the order statistics inside 2–98 %, not 1e6
    lo, hi = robust_limits(vals, must_include=[0.5, 250.0], margin=0.0)
    assert (lo, hi) == (0.5, 250.0)  # the front is always inside
    lo, hi = robust_limits([5.0, 5.0])
    assert lo < 5.0 < hi  # one value: still a span
    assert robust_limits([float("inf"), float("nan")]) == (0.0, 1.0)


def _row(i: int, t_s: float, usd: float, confirmed: bool) -> Row:
    m: dict[str, Any] = {"iteration_time_s": t_s, "capex_usd": usd, "iteration_time_s_low": t_s / 1.07,
                         "iteration_time_s_high": t_s * 1.07}
    return Row(i, f"k{i}", "ok", "", "", {"x": i}, {}, {**m, "network": "analytical"},
               {**m, "network": "flow"} if confirmed else None)


def test_plot_marks_confirmed_points_with_bands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    rows = [_row(i, 0.1 + 0.001 * i, 1e6 * (2 - 0.01 * i), confirmed=i < 5) for i in range(40)]
    rows.append(_row(99, 50.0, 9e6, confirmed=False))  # an outlier far off
    seen: dict[str, Any] = {}
    real_close = plt.close

    def keep(fig: Any = None) -> None:
        seen["fig"] = fig
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    plot_front(tmp_path / "p.png", rows, rows[:5])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    ax = seen["fig"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(lb.startswith("screened only (36)") for lb in labels)
    assert any(lb.startswith("confirmed (5)") and "error band" in lb for lb in labels)
    assert "1 point(s) beyond the axes" in labels
    assert ax.get_xlim()[1] < 1000  # the 50 s outlier does not stretch the time axis
