"""The failure predictor (issue 39 part 5): the telemetry layout and its SYNTHETIC generator, features that
see only the past, a classifier judged on held-out time against trivial baselines, proactive migration in
the long run (recall 0 is the run without a predictor, bit for bit; a perfect predictor leaves only the
migration's cost), and the censored Weibull fit used on the Titan GPU lifetimes."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.operations.failures import ComponentCounts, FailureClass, FailureModel, llama3_counts, llama3_model
from topotrain.operations.lifetime import fit_weibull, read_lifetimes
from topotrain.operations.longrun import Migration, Policy, RunSpec, run_policy
from topotrain.operations.predictor import Evaluation, evaluate, features
from topotrain.operations.spec import config_from_dict
from topotrain.operations.telemetry import (
    COLUMNS,
    SyntheticAssumptions,
    Telemetry,
    read_telemetry,
    synthetic_telemetry,
    to_csv,
    write_telemetry,
)
from topotrain.util.errors import ConfigError

H = 24 * 3600.0
ONE = ComponentCounts(gpus=8, servers=1, nics=8, switches=0, links=0, gpus_per_server=8)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with threadpool_limits(1):  # the machine is shared; results do not depend on it
        yield


@pytest.fixture(scope="module")
def tel() -> Telemetry:
    return synthetic_telemetry(32, 40, seed=1)


@pytest.fixture(scope="module")
def ev(tel: Telemetry) -> Evaluation:
    return evaluate(tel, H, seed=0)


# ---- telemetry --------------------------------------------------------------------------------------------
def test_the_generator_is_seeded_and_fails_at_its_assumed_rate(tel: Telemetry) -> None:
    again = synthetic_telemetry(32, 40, seed=1)
    for f in dataclasses.fields(Telemetry):
        a, b = getattr(tel, f.name), getattr(again, f.name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
    other = synthetic_telemetry(32, 40, seed=2)
    assert not np.array_equal(other.gpu_temp_c[:100], tel.gpu_temp_c[:100])
    # 32 slots, 40 days, mean 720 h between failures plus 24 h repairs: ~41 failures (Poisson sd ~6.4)
    expected = 32 * 40 * 24 / (720 + 24)
    assert abs(tel.failures() - expected) < 3.5 * math.sqrt(expected)
    assert "synthetic" in tel.source


def test_synthetic_precursors_are_there_and_can_be_switched_off(tel: Telemetry) -> None:
    f = features(tel, H)
    sbe = f.X[:, f.names.index("sbe_24h")]
    assert sbe[f.y == 1].mean() > 5 * sbe[f.y == 0].mean()
    quiet = synthetic_telemetry(32, 40, seed=1, assume=SyntheticAssumptions(precursor_fraction=0.0))
    fq = features(quiet, H)
    sq = fq.X[:, fq.names.index("sbe_24h")]
    assert sq[fq.y == 1].mean() < 2 * sq[fq.y == 0].mean() + 0.5


def test_csv_round_trip(tmp_path: Path) -> None:
    small = synthetic_telemetry(4, 5, seed=3)
    path = tmp_path / "t.csv"
    write_telemetry(small, path)
    back = read_telemetry(path)
    assert back.gpus == small.gpus and np.array_equal(back.failed, small.failed)
    assert np.array_equal(back.ecc_sbe_total, small.ecc_sbe_total)
    assert np.allclose(back.gpu_temp_c, small.gpu_temp_c, atol=1e-3)
    assert not list(tmp_path.glob(".t.csv.tmp-*"))


@pytest.mark.parametrize(("edit", "where"), [
    (lambda r: r.__setitem__(2, "hot"), "row 3, column gpu_temp_c"),
    (lambda r: r.__setitem__(2, "nan"), "row 3, column gpu_temp_c"),
    (lambda r: r.__setitem__(11, "2"), "row 3, column failed"),
    (lambda r: r.__setitem__(8, "-1"), "row 3, column ecc_sbe_total"),
])
def test_a_bad_value_is_one_line_naming_file_row_and_column(tmp_path: Path, edit: object, where: str) -> None:
    lines = to_csv(synthetic_telemetry(2, 1, seed=0)).splitlines()
    row = lines[2].split(",")
    edit(row)  # type: ignore[operator]
    lines[2] = ",".join(row)
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as e:
        read_telemetry(path)
    assert where in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_column_or_a_duplicate_sample_is_refused(tmp_path: Path) -> None:
    text = to_csv(synthetic_telemetry(1, 1, seed=0))
    path = tmp_path / "t.csv"
    path.write_text(text.replace(",xid,", ",xid_code,", 1))
    with pytest.raises(ConfigError, match="missing column xid"):
        read_telemetry(path)
    lines = text.splitlines()
    path.write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(ConfigError, match="two samples at time_s 0"):
        read_telemetry(path)
    assert COLUMNS[:2] == ("time_s", "gpu")


# ---- features and the classifier --------------------------------------------------------------------------
def test_features_see_only_the_past(tel: Telemetry) -> None:
    cut = 20 * 86_400.0
    later = tel.time_s > cut
    noisy = dataclasses.replace(tel, gpu_temp_c=np.where(later, tel.gpu_temp_c + 30, tel.gpu_temp_c),
                                ecc_sbe_total=np.where(later, tel.ecc_sbe_total + 1000, tel.ecc_sbe_total),
                                xid=np.where(later, 63, tel.xid))
    a, b = features(tel, H), features(noisy, H)
    early = tel.time_s <= cut
    assert np.array_equal(a.X[early], b.X[early])
    assert not np.array_equal(a.X[later], b.X[later])


def test_labels_are_a_failure_of_the_same_board_within_the_horizon(tel: Telemetry) -> None:
    f = features(tel, H)
    pos = f.y == 1
    assert np.all(f.fail_s[pos] - f.time_s[pos] <= H) and np.all(f.fail_s[pos] > f.time_s[pos])
    neg = f.y == 0
    assert np.all(f.fail_s[neg] - f.time_s[neg] > H)
    assert np.all(f.y[f.is_failure] == -1)
    end = f.time_s.max()
    censored = (f.fail_s == np.inf) & (end - f.time_s < H)
    assert np.all(f.y[censored] == -1)


def test_the_classifier_beats_trivial_baselines_on_held_out_time(ev: Evaluation, tel: Telemetry) -> None:
    s = ev.scores
    assert ev.split_s > 0.6 * tel.time_s.max()
    assert s.f1 > 3 * ev.always_positive.f1 and s.f1 > 2 * ev.rule.f1
    assert ev.average_precision > 5 * ev.prevalence and ev.roc_auc > 0.75
    assert 0.4 < s.precision <= 1 and 0.3 < s.recall <= 1
    # per event: the synthetic precursors (12-72 h ahead for 75% of failures) are what it can catch
    assert 0.4 <= ev.event_recall <= 0.95 and ev.alarm_precision > 0.3
    assert 6 * 3600 < ev.lead_time_median_s <= H
    assert ev.top_features[0][0].startswith(("sbe", "xid", "temp", "clock"))


def test_training_never_looks_into_the_test_period(tel: Telemetry, ev: Evaluation) -> None:
    f = features(tel, H)
    assert ev.train_samples == int(((f.y >= 0) & (f.time_s + H <= ev.split_s)).sum())
    # rewriting everything after the split leaves the trained model, hence the threshold, unchanged
    later = tel.time_s >= ev.split_s
    shuffled = dataclasses.replace(tel, ecc_sbe_total=np.where(later, 0, tel.ecc_sbe_total))
    other = evaluate(shuffled, H, seed=0)
    assert other.threshold == ev.threshold and other.train_samples == ev.train_samples


def test_evaluation_is_deterministic_and_refuses_a_record_without_failures(tel: Telemetry, ev: Evaluation) -> None:
    assert evaluate(tel, H, seed=0) == ev
    none = dataclasses.replace(tel, failed=np.zeros_like(tel.failed))
    with pytest.raises(ConfigError, match="no labelled failure sample"):
        evaluate(none, H)
    with pytest.raises(ConfigError, match="--test-fraction"):
        evaluate(tel, H, test_fraction=0.95)
    with pytest.raises(ConfigError, match="--horizon"):
        features(tel, -1.0)


# ---- proactive migration in the long run ------------------------------------------------------------------
def _software(mtbf_s: float) -> FailureModel:
    return FailureModel((FailureClass("sw", mtbf_s=mtbf_s, scope="job", takes="none", repair_s=0.0),),
                        detect_s=60.0, restart_s=240.0, replace_s=None)


def test_recall_zero_is_the_run_without_a_predictor_bit_for_bit() -> None:
    spec = RunSpec(20 * 86_400.0, 3600.0, 5.0, 10.0, 300.0, 600.0, llama3_counts().gpus, 8)
    model, counts = llama3_model(), llama3_counts()
    for policy in (Policy("restart"), Policy("spares", spares=8), Policy("elastic", elastic=True)):
        spec_p = dataclasses.replace(spec, rate_by_missing=(1.0, 0.99, 0.98)) if policy.elastic else spec
        a = run_policy(spec_p, policy, model, counts, 300, seed=4)
        b = run_policy(spec_p, policy, model, counts, 300, seed=4, migration=Migration(0.0, 0.3, 900.0))
        assert np.array_equal(a.finish_s, b.finish_s) and np.array_equal(a.lost_s, b.lost_s)
        assert np.array_equal(a.interruptions, b.interruptions) and b.migrations is not None
        assert b.migrations.sum() == 0


def test_a_perfect_predictor_leaves_only_the_migration_cost() -> None:
    # every failure foreseen, no false alarm, no checkpoint stall: time = work + failures x migration
    work, m = 30 * 86_400.0, 120.0
    spec = RunSpec(work, 3600.0, 0.0, 0.0, 60.0, 240.0, 8, 8)
    base = run_policy(spec, Policy("restart"), _software(86_400.0), ONE, 1000, seed=5)
    r = run_policy(spec, Policy("restart"), _software(86_400.0), ONE, 1000, seed=5,
                   migration=Migration(1.0, 1.0, m, classes=("sw",)))
    s = r.summary()
    assert r.lost_s.max() == 0.0 and base.lost_s.mean() > 1000
    assert s["overhead_per_failure_s"] == pytest.approx(m, rel=0.01)  # (failures during a migration: < m)
    assert s["time_to_train_s"] == pytest.approx(work + s["failures"] * m, rel=2e-4)
    assert s["predictor"]["migrations"] == pytest.approx(s["failures"], rel=0.02)
    assert s["goodput"] > base.summary()["goodput"]


def test_false_alarms_come_at_the_rate_precision_implies_and_cost_a_migration_each() -> None:
    work = 30 * 86_400.0
    spec = RunSpec(work, 3600.0, 0.0, 0.0, 60.0, 240.0, 8, 8)
    r = run_policy(spec, Policy("restart"), _software(86_400.0), ONE, 1000, seed=6,
                   migration=Migration(1.0, 0.25, 120.0, classes=("sw",)))
    s = r.summary()
    assert r.lost_s.max() == 0.0
    # 3 false alarms per foreseen failure: 4 migrations per failure
    assert s["predictor"]["migrations"] == pytest.approx(4 * s["failures"], rel=0.03)
    assert s["time_to_train_s"] == pytest.approx(work + s["predictor"]["migrations"] * 120.0, rel=5e-4)


def test_migration_is_deterministic_across_workers_and_validated() -> None:
    spec = RunSpec(10 * 86_400.0, 1800.0, 2.0, 0.0, 300.0, 600.0, 16_384, 8)
    mig = Migration(0.6, 0.5, 600.0)
    a = run_policy(spec, Policy("spares", spares=8), llama3_model(), llama3_counts(), 500, 7, migration=mig)
    b = run_policy(spec, Policy("spares", spares=8), llama3_model(), llama3_counts(), 500, 7, migration=mig,
                   workers=2)
    assert np.array_equal(a.finish_s, b.finish_s) and a.migrations is not None and b.migrations is not None
    assert np.array_equal(a.migrations, b.migrations)
    for bad in (dict(recall=1.5, precision=0.5, migration_s=1.0), dict(recall=0.5, precision=0.0, migration_s=1.0),
                dict(recall=0.5, precision=0.5, migration_s=-1.0)):
        with pytest.raises(ConfigError):
            Migration(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown class 'gpu'"):
        Migration(0.5, 0.5, 1.0, classes=("gpu",)).predictable(llama3_model())


def test_the_failures_file_takes_a_predictor() -> None:
    cfg = config_from_dict({"predictor": {"recall": 0.6, "precision": 0.5, "migration": "5min"}})
    assert cfg.predictor is not None and cfg.predictor.migration(999.0).migration_s == 300.0
    assert config_from_dict({"predictor": {"recall": 0.6, "precision": 0.5}}).predictor.migration(  # type: ignore[union-attr]
        999.0).migration_s == 999.0
    with pytest.raises(ConfigError, match="predictor.precision"):
        config_from_dict({"predictor": {"recall": 0.6, "precision": 0}})
    with pytest.raises(ConfigError, match="unknown class"):
        config_from_dict({"predictor": {"recall": 0.6, "precision": 0.5, "classes": ["nope"]}})


# ---- the CLI ----------------------------------------------------------------------------------------------
def test_failure_predict_on_synthetic_and_on_a_file(tmp_path: Path) -> None:
    runner = CliRunner()
    csv_path, out = tmp_path / "tel.csv", tmp_path / "ev.json"
    r = runner.invoke(app, ["failure-predict", "--synthetic", "24,30", "--seed", "2", "--write-telemetry",
                            str(csv_path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "held-out time" in r.output and "predictor: {recall:" in r.output
    doc = json.loads(out.read_text())
    r2 = runner.invoke(app, ["failure-predict", str(csv_path), "--seed", "2", "--json"])
    assert r2.exit_code == 0, r2.output
    again = json.loads(r2.output)
    assert again["scores"] == doc["scores"] and again["threshold"] == doc["threshold"]
    bad = runner.invoke(app, ["failure-predict"])
    assert bad.exit_code == 2 and "give a telemetry CSV" in bad.output
    lines = csv_path.read_text().splitlines()
    lines[5] = lines[5].replace(lines[5].split(",")[4], "x", 1)
    csv_path.write_text("\n".join(lines) + "\n")
    r3 = runner.invoke(app, ["failure-predict", str(csv_path)])
    assert r3.exit_code == 2 and "row 6, column power_w" in r3.output


# ---- lifetimes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "scale"), [(0.7, 3.0), (1.0, 10.0), (2.6, 7.0)])
def test_the_censored_weibull_fit_recovers_the_law(shape: float, scale: float) -> None:
    rng = np.random.default_rng(11)
    t = scale * rng.weibull(shape, 20_000)
    c = rng.uniform(0.5, 1.5, t.size) * scale  # censoring at random ages
    f = fit_weibull(np.minimum(t, c), t < c)
    assert f.shape == pytest.approx(shape, rel=0.04) and f.scale_s == pytest.approx(scale, rel=0.04)
    assert f.mean_s == pytest.approx(scale * math.gamma(1 + 1 / shape), rel=0.05)


def test_lifetimes_read_the_titan_layout_and_refuse_bad_rows(tmp_path: Path) -> None:
    p = tmp_path / "life.csv"
    p.write_text("SN,time,dead,batch\na,100,TRUE,old\nb,200,FALSE,old\nc,300,TRUE,new\nd,50,TRUE,old\n")
    life = read_lifetimes(p)
    assert life.failed.tolist() == [True, False, True, True] and life.group[2] == "new"
    assert life.fit("old").failures == 2
    p.write_text("SN,time,dead\na,100,maybe\n")
    with pytest.raises(ConfigError, match="row 2, column dead"):
        read_lifetimes(p)
    with pytest.raises(ConfigError, match="too few"):
        fit_weibull(np.array([1.0, 2.0]), np.array([True, False]))


def test_run_long_reports_goodput_with_and_without_the_predictor(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("cluster: {server: nvswitch-8, servers: 2, network: {topology: fat-tree, link: ib-hdr-200g}}\n"
                  "model: gpt2-small\nbatch: {global: 32, micro: 2}\nplan: {tp: 2}\nnetwork: analytical\n")
    fail = tmp_path / "f.yaml"
    fail.write_text("scale: 1000\nsamples: 40\npolicies: {hot: {spares: 1}}\n"
                    "predictor: {recall: 0.0, precision: 0.5, migration: 2min}\n")
    runner = CliRunner()
    r = runner.invoke(app, ["run-long", str(sc), "--tokens", "2B", "--failures", str(fail), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (base,), (pred,) = doc["policies"], doc["with_predictor"]
    assert pred["goodput"] == base["goodput"] == pred["without_goodput"]  # recall 0: the same runs
    assert pred["predictor"]["migration_s"] == 120.0
    fail.write_text(fail.read_text().replace("recall: 0.0", "recall: 0.9").replace("0.5", "1.0"))
    r = runner.invoke(app, ["run-long", str(sc), "--tokens", "2B", "--failures", str(fail)])
    assert r.exit_code == 0 and "with proactive migration" in r.output
