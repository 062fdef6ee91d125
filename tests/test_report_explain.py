"""``topotrain explain``'s verdict (issue 41 item 4): a difference inside the predictions' error band is
said to be within the band, not ranked as a win."""

from __future__ import annotations

from typing import Any

from topotrain.report.explain import verdict


def _result(t_s: float, plus_minus: float | None, exposed_s: float = 0.0) -> dict[str, Any]:
    band = None if plus_minus is None else {"level": 0.8, "plus_minus": plus_minus, "regime": "x",
                                            "from_regime": "x", "from_rows": 16, "borrowed": False}
    return {"iteration_time_s": t_s, "error_band": band,
            "breakdown": {"compute_s": t_s - exposed_s, "tp_comm_s": 0.0, "exposed_comm_s": exposed_s,
                          "bubble_s": 0.0}}


def test_small_difference_is_within_the_band() -> None:
    v = verdict("best", _result(1.000, 0.069), "runner-up", _result(1.004, 0.069, exposed_s=0.004))
    assert v.within_band and v.faster == "best" and abs(v.difference - 0.004) < 1e-12
    assert "within the band" in v.text() and "±6.9%" in v.text() and v.cause == "exposed_comm_s"


def test_large_difference_is_ranked_and_the_wider_band_decides() -> None:
    v = verdict("a", _result(1.30, 0.069, exposed_s=0.3), "b", _result(1.00, 0.069))
    assert not v.within_band and v.faster == "b" and "30.0% faster than a" in v.text()
    assert "beyond the ±6.9%" in v.text()
    # the wider of the two bands (a borrowed ±31.8%) covers the same 30% difference
    w = verdict("a", _result(1.30, 0.318, exposed_s=0.3), "b", _result(1.00, 0.069))
    assert w.within_band and w.band is not None and abs(w.band - 0.318) < 1e-12
    # no band: ranked plainly
    n = verdict("a", _result(1.004, None), "b", _result(1.0, None))
    assert not n.within_band and n.band is None and "faster than a" in n.text()
    assert verdict("a", _result(1.0, 0.1), "b", _result(1.0, 0.1)).text() == "the two iterations take the same time"
