"""Error bands (issue 17 ★): split-conformal intervals from the validation subset's residuals, their
cross-validated coverage, the shipped residuals' freshness, and the band on every result."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.scenario.load import scenario_from_dict
from topotrain.training import bands
from topotrain.training.bands import Regime, Residual, band_from, conformal_quantile, cross_validated_coverage
from topotrain.training.simulate import simulate
from topotrain.validate import published

DENSE_MULTI = Regime("transformer", "dense", "multi-node")
TWO_DGX = {"server": "nvswitch-8", "servers": 2, "network": {"topology": "single-switch", "link": "ib-hdr-200g"}}


def test_conformal_quantile_is_the_finite_sample_rank() -> None:
    scores = [0.5, 0.1, 0.4, 0.2, 0.3]
    assert conformal_quantile(scores, 0.5) == 0.3  # ⌈6·0.5⌉ = 3rd smallest
    assert conformal_quantile(scores, 0.8) == 0.5  # ⌈6·0.8⌉ = 5th
    assert conformal_quantile(scores, 0.9) == math.inf  # ⌈6·0.9⌉ = 6 > 5: the rows cannot back it
    assert bands.min_rows(0.8) == 5 and bands.min_rows(0.5) == 2
    with pytest.raises(ValueError):
        conformal_quantile(scores, 1.0)


@pytest.mark.parametrize("level", [0.5, 0.8, 0.9])
def test_split_conformal_covers_new_draws_at_its_level(level: float) -> None:
    """The method itself: on exchangeable residuals (seeded log-normal errors) the band built from 15 rows
    covers a fresh row with probability ⌈16·level⌉/16 on average over many draws."""
    rng = random.Random(7)
    hits, trials = 0, 4000
    for _ in range(trials):
        rows = [Residual(f"r{i}", DENSE_MULTI, rng.gauss(0.02, 0.08)) for i in range(15)]
        b = band_from(DENSE_MULTI, rows, level)
        hits += abs(rng.gauss(0.02, 0.08)) <= math.log(b.factor)
    expected = math.ceil(16 * level) / 16
    assert hits / trials == pytest.approx(expected, abs=0.025)


def test_regimes_borrow_rows_at_the_same_scale_first() -> None:
    rows = ([Residual(f"m{i}", DENSE_MULTI, 0.01 * i) for i in range(10)]
            + [Residual(f"s{i}", Regime("cnn", "dense", "single-node"), 0.2) for i in range(6)])
    moe = band_from(Regime("transformer", "moe", "multi-node"), rows)
    assert (moe.used, moe.rows) == ("*/*/multi-node", 10)  # no MoE row: says so, borrows multi-node rows
    bert = band_from(Regime("transformer", "dense", "single-node"), rows)
    assert (bert.used, bert.rows) == ("*/dense/single-node", 6) and bert.factor == pytest.approx(math.exp(0.2))
    # the rows a regime uses do not depend on the level, so the band only widens with it
    widths = [band_from(Regime("cnn", "dense", "single-node"), rows, lv).factor for lv in (0.5, 0.8, 0.9)]
    assert widths == sorted(widths) and widths[-1] == math.inf


def test_shipped_residuals_are_the_validation_subset() -> None:
    doc = json.loads(bands.RESIDUALS_PATH.read_text())
    names = [r["case"] for r in doc["rows"]]
    assert sorted(names) == sorted(c.name for c in published.validation_cases())
    assert not set(names) & set(published.CALIBRATION_SUBSET)
    for r in doc["rows"]:
        assert r["log_error"] == pytest.approx(math.log(r["predicted"] / r["published"]), rel=1e-12)


@pytest.mark.parametrize("case", ["ResNet-50 8xA100 DGX A100 b256", "BERT-large s128 8xV100-32GB b64",
                                  "Megatron 1.7B TP1 PP1 32 GPUs"])
def test_shipped_residuals_match_the_model_today(case: str) -> None:
    """A model change that moves a validation row must regenerate the residuals the bands use
    (``topotrain validate --published --write-residuals``)."""
    row = next(r for r in json.loads(bands.RESIDUALS_PATH.read_text())["rows"] if r["case"] == case)
    fresh = published.run("analytical", only=lambda c: c.name == case)[0]
    assert fresh.predicted == pytest.approx(row["predicted"], rel=1e-9), \
        "stale residuals: run `topotrain validate --published --write-residuals`"


@pytest.mark.parametrize("level", [0.5, 0.8, 0.9])
def test_band_coverage_on_held_out_validation_rows(level: float) -> None:
    """Leave-one-out cross-validation over the validation subset: the band built without a row covers
    that row's published figure at the nominal level within 10 points (issue 17's target)."""
    rows = list(bands.load_residuals())
    assert len(rows) >= 20
    assert abs(cross_validated_coverage(rows, level) - level) <= 0.10


def test_every_result_carries_its_band() -> None:
    r = simulate(scenario_from_dict({"cluster": TWO_DGX, "model": "gpt3-1.3b",
                                     "batch": 32, "plan": {"micro_batch": 2}, "network": "analytical"}))
    b = r.error_band
    assert b is not None and b.regime == "transformer/dense/multi-node" and b.level == bands.DEFAULT_LEVEL
    assert r.iteration_time_s_low < r.iteration_time_s < r.iteration_time_s_high
    assert r.iteration_time_s_high / r.iteration_time_s == pytest.approx(b.factor)
    d = r.to_dict()
    assert d["iteration_time_s_low"] == r.iteration_time_s_low and d["error_band"]["from_rows"] == b.rows
    moe = simulate(scenario_from_dict({"cluster": TWO_DGX,
                                       "model": {"type": "transformer", "name": "tiny-moe", "layers": 2,
                                                 "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 1000,
                                                 "experts": 4, "top_k": 2},
                                       "batch": 16, "plan": {"micro_batch": 1}, "network": "analytical"}))
    assert moe.error_band is not None and moe.error_band.regime == "transformer/moe/multi-node"
    assert moe.error_band.used != moe.error_band.regime  # no MoE row backs it, and it says so


def test_cli_prints_band_and_published_quick(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["simulate", "--network", "analytical"])
    assert res.exit_code == 0, res.output
    assert "80% band" in res.output and "validation rows" in res.output
    res = CliRunner().invoke(app, ["validate", "--published", "--quick", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    summ = json.loads(res.output)
    assert summ["validation subset (no constant fitted on it)"]["cases"] == 7  # the single-server validation rows
    assert (tmp_path / "published_analytical.csv").exists()
    bad = CliRunner().invoke(app, ["validate", "--published", "--quick", "--write-residuals"])
    assert bad.exit_code == 2 and "error:" in bad.output and bad.output.count("\n") == 1


def test_scale_points_and_html_report_carry_the_band(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["scale", "--gpus", "8:16", "--json", "--set", "network=analytical"])
    assert res.exit_code == 0, res.output
    for p in json.loads(res.output):
        assert p["iteration_time_s_low"] < p["iteration_time_s"] < p["iteration_time_s_high"]
    from topotrain.report.html import _band

    r = simulate(scenario_from_dict({"cluster": TWO_DGX, "model": "gpt3-1.3b", "batch": 32,
                                     "plan": {"micro_batch": 2}, "network": "analytical"}))
    assert "80% band from" in _band(r.to_dict()) and _band({"error_band": None}) == ""
