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


def test_a_regime_with_too_few_rows_borrows_says_so_and_widens() -> None:
    rows = ([Residual(f"m{i}", DENSE_MULTI, 0.01 * i) for i in range(10)]
            + [Residual(f"s{i}", Regime("transformer", "dense", "single-node"), 0.2) for i in range(6)])
    own = band_from(DENSE_MULTI, rows)
    assert not own.borrowed and (own.used, own.rows) == (str(DENSE_MULTI), 10)
    # no MoE row: the nearest regime with a band (dense multi-node) at twice the log width, unless the
    # single-node MoE band (itself borrowed from dense single-node, x2) is wider: many nodes are no surer
    moe = band_from(Regime("transformer", "moe", "multi-node"), rows)
    assert moe.borrowed and moe.factor == pytest.approx(math.exp(bands.BORROW_WIDEN * 0.2))
    assert "transformer/moe/single-node band" in moe.used
    single_moe = band_from(Regime("transformer", "moe", "single-node"), rows)
    assert single_moe.borrowed and single_moe.used.startswith("transformer/dense/single-node")
    # a borrowed band covers the regime's own few rows, even where the donors' is narrower
    few = rows + [Residual("c0", Regime("cnn", "dense", "multi-node"), 0.9)]
    cnn = band_from(Regime("cnn", "dense", "multi-node"), few)
    assert cnn.borrowed and cnn.factor >= math.exp(0.9) and "own 1 row" in cnn.used
    # the rows a regime uses do not depend on the level, so the band only widens with it
    widths = [band_from(Regime("cnn", "dense", "single-node"), rows, lv).factor for lv in (0.5, 0.8, 0.9)]
    assert widths == sorted(widths) and widths[-1] == math.inf
    # no regime with a band of its own: all rows pooled, widened
    tiny = [Residual(f"t{i}", DENSE_MULTI, 0.1) for i in range(3)] + [Residual("u", Regime("cnn", "dense",
                                                                                           "single-node"), 0.1)]
    pooled = band_from(DENSE_MULTI, tiny, 0.5)
    assert pooled.borrowed and pooled.rows == 4 and pooled.factor == pytest.approx(math.exp(0.2))


def test_cnn_multi_node_band_is_borrowed_and_no_narrower_than_one_node(tmp_path: Path) -> None:
    """Issue 41 item 1: ResNet-50 on 16 servers had a band from transformer rows only, narrower than on
    one server. No multi-node CNN row exists: the band says it is borrowed and is no narrower."""
    res = CliRunner().invoke(app, ["scale", "examples/resnet50-eflops.yaml", "--gpus", "8:128", "--json",
                                   "--set", "network=analytical"])
    assert res.exit_code == 0, res.output
    points = {p["servers"]: p for p in json.loads(res.output)}
    width = {s: p["iteration_time_s_high"] / p["iteration_time_s"] for s, p in points.items()}
    assert width[16] >= width[1] - 1e-12 and width[16] > 1.0
    assert "borrowed" in points[16]["band"] and "cnn/dense/multi-node" in points[16]["band"]
    shipped = bands.band(Regime("cnn", "dense", "multi-node"))
    one = bands.band(Regime("cnn", "dense", "single-node"))
    assert shipped is not None and one is not None and shipped.borrowed and shipped.factor >= one.factor
    # every rendering says so: the CLI table, the HTML report's line
    sim = CliRunner().invoke(app, ["simulate", "examples/resnet50-eflops.yaml", "--set", "network=analytical"])
    assert sim.exit_code == 0 and "borrowed" in sim.output, sim.output


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
    """Leave-one-out cross-validation over the validation subset: where the held-out row's regime keeps a
    band of its own, the band built without that row covers it at the nominal level within 10 points
    (issue 17's target); borrowed bands are widened on purpose and must cover at least the level."""
    rows = list(bands.load_residuals())
    assert len(rows) >= 20
    own = [r for i, r in enumerate(rows) if not band_from(r.regime, rows[:i] + rows[i + 1:]).borrowed]
    lent = [r for r in rows if r not in own]
    assert len(own) >= 15 and lent
    assert abs(cross_validated_coverage(rows, level) - level) <= 0.15
    hits = [abs(r.log_error) <= math.log(band_from(r.regime, [x for x in rows if x is not r], level).factor)
            for r in rows]
    own_cov = sum(h for h, r in zip(hits, rows, strict=True) if r in own) / len(own)
    lent_cov = sum(h for h, r in zip(hits, rows, strict=True) if r in lent) / len(lent)
    assert abs(own_cov - level) <= 0.10 and lent_cov >= level


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
    assert moe.error_band.borrowed and moe.error_band.used != moe.error_band.regime  # no MoE row: says so


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
    assert "80% band, 16 validation rows" in _band(r.to_dict()) and _band({"error_band": None}) == ""


def test_a_mixed_fleet_band_is_borrowed_and_no_narrower_than_the_uniform_one() -> None:
    """No published run used several GPU types: a mixed-cluster prediction borrows, widened, from the uniform
    regime of the same model and scale, and says so."""
    uniform = bands.band(bands.regime_of("token", 1, 4))
    mixed = bands.band(bands.regime_of("token", 1, 4, mixed=True))
    assert uniform is not None and mixed is not None
    assert mixed.borrowed and not uniform.borrowed and mixed.regime.endswith("/mixed")
    assert math.log(mixed.factor) >= bands.BORROW_WIDEN * math.log(uniform.factor) - 1e-12  # rule 1 (+ rule 3)
    assert str(bands.regime_of("token", 1, 4)) == "transformer/dense/multi-node"  # uniform strings unchanged
