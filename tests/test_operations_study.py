"""The run-long study on a small simulated scenario: a failure inside an iteration, the elastic speed table
from the simulator, the failures file's errors, and the ``run-long`` command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.operations.degraded import (
    coordinates,
    degraded_iteration,
    elastic_rates,
    replicas_per_server,
    shrunk,
)
from topotrain.operations.spec import config_from_dict, parse_count
from topotrain.operations.study import choose_plan, expected_time_to_train_s, plot_progress, run_long
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.plan import Plan
from topotrain.training.simulate import Scenario, simulate
from topotrain.util.errors import ConfigError

SMALL: dict[str, Any] = {
    "cluster": {"server": "nvswitch-8", "servers": 2, "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
    "model": "gpt2-small", "batch": {"global": 32, "micro": 2}, "plan": {"tp": 2}, "network": "analytical"}


@pytest.fixture(scope="module")
def small() -> Scenario:
    return scenario_from_dict(SMALL, name="small")


def test_coordinates_invert_the_rank_order() -> None:
    for placement in ("tp-first", "dp-first"):
        plan = Plan(dp=4, tp=2, pp=3, global_batch=12, placement=placement)
        for d in range(4):
            for t in range(2):
                for p in range(3):
                    assert coordinates(plan, plan.rank(d, t, p)) == (d, t, p)


def test_a_failed_gpu_stalls_the_iteration_then_the_job_runs_one_replica_short(small: Scenario) -> None:
    base = simulate(small)
    d = degraded_iteration(small, ["s1/gpu3"], detect_s=300.0, restart_s=600.0, base=base)
    assert (d.dp_before, d.dp_after, d.stages_hit) == (8, 7, (0,))
    assert d.replicas_lost == (coordinates(small.plan, 11)[0],)
    assert d.stalled_iteration_s == pytest.approx(base.iteration_time_s + 900.0)
    # the same per-replica batch on 7 replicas, at the iteration time the simulator gives them
    assert d.degraded_iteration_time_s == pytest.approx(simulate(shrunk(small, 7)).iteration_time_s)
    assert d.relative_throughput == pytest.approx(7 / 8 * base.iteration_time_s / d.degraded_iteration_time_s)
    assert 0.7 < d.relative_throughput < 7 / 8 + 0.01
    with pytest.raises(ConfigError, match="--fail-gpu"):
        degraded_iteration(small, ["nope"], 1.0, 1.0, base=base)


def test_a_pipeline_without_replicas_has_nothing_to_shrink_to() -> None:
    sc = scenario_from_dict({**SMALL, "plan": {"tp": 8, "pp": 2}}, name="pp")
    d = degraded_iteration(sc, ["s1/gpu0"], 60.0, 60.0)
    assert (d.dp_after, d.stages_hit, d.degraded_samples_per_s) == (0, (1,), 0.0)
    assert d.degraded_iteration_time_s == float("inf")


def test_elastic_rates_come_from_the_simulator(small: Scenario) -> None:
    base = simulate(small)
    assert replicas_per_server(small) == 4  # tp=2 on 8-GPU servers
    rates = elastic_rates(small, base, servers_max=2, points=(1,))
    assert rates[0] == 1.0 and rates[1] == pytest.approx(4 * simulate(small).samples_per_s / 8 /
                                                         base.samples_per_s, rel=0.15)
    assert rates[-1] == 0.0 and len(rates) == 3  # both servers gone: nothing runs


def test_parse_count_reads_decimal_suffixes() -> None:
    assert parse_count("15T", "--tokens") == 15e12
    assert parse_count("1.5M", "--tokens") == 1.5e6
    assert parse_count(300, "--tokens") == 300.0
    for bad in ("15TB", "-1", "0", True):
        with pytest.raises(ConfigError, match="--tokens"):
            parse_count(bad, "--tokens")  # type: ignore[arg-type]


@pytest.mark.parametrize(("doc", "field"), [
    ({"classes": {"new": {"scope": "gpu"}}}, "classes.new.mtbf"),
    ({"classes": {"faulty-gpu": {"shape": 0}}}, "classes.faulty-gpu.shape"),
    ({"checkpoint": {"storage": {"write": "2TB"}}}, "checkpoint.storage.write"),
    ({"checkpoint": {"interval": "dali"}}, "checkpoint.interval"),
    ({"drop": ["zz"]}, "drop[0]"),
    ({"policies": {"a": {"spares": -1}}}, "policies.a.spares"),
    ({"sampels": 3}, "sampels"),
    ({"detection": 5}, "detection"),
])
def test_a_bad_failures_file_is_one_line_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(doc)
    assert str(e.value).startswith(field + ":") and "\n" not in str(e.value)


def test_the_failures_file_overrides_and_adds_classes() -> None:
    cfg = config_from_dict({"classes": {"faulty-gpu": {"distribution": "weibull", "shape": 0.7},
                                        "leaf": {"scope": "switch", "takes": "switch", "mtbf": "100000h"}},
                            "drop": ["ssd"], "scale": 2, "checkpoint": {"interval": "30min", "mode": "sync"},
                            "policies": {"hot": {"spares": 4}}, "replace": None})
    names = [c.name for c in cfg.model.classes]
    assert "ssd" not in names and names[-1] == "leaf" and cfg.model.replace_s is None
    gpu = cfg.model.classes[0]
    assert (gpu.distribution, gpu.shape, gpu.category) == ("weibull", 0.7, "GPU")
    assert gpu.mtbf_s == pytest.approx(config_from_dict({}).model.classes[0].mtbf_s / 2)
    assert (cfg.interval, cfg.mode, cfg.policies[0].spares) == (1800.0, "sync", 4)  # type: ignore[index]


def test_run_long_study_and_its_plot(small: Scenario, tmp_path: Path) -> None:
    cfg = config_from_dict({"scale": 2000, "samples": 60})
    study = run_long(small, cfg, tokens=5e9, seed=1)
    assert [r.policy.name for r in study.runs] == ["restart", "spares", "elastic"]
    by = {r.policy.name: r.summary() for r in study.runs}
    assert by["spares"]["time_to_train_s"] <= by["restart"]["time_to_train_s"]
    assert study.interval_s % study.result.iteration_time_s == pytest.approx(0.0, abs=1e-9) or \
        study.interval_s / study.result.iteration_time_s == pytest.approx(round(study.interval_s /
                                                                                study.result.iteration_time_s))
    doc = study.to_dict()
    assert json.loads(json.dumps(doc))["policies"][0]["failures_by_class"]["faulty-gpu"] >= 0
    plot_progress(study, tmp_path / "p.png", "png")
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_the_run_long_command(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(json.dumps(SMALL))
    fail = tmp_path / "f.yaml"
    fail.write_text("scale: 1000\nsamples: 40\npolicies: {restart: {}, hot: {spares: 1}}\n")
    runner = CliRunner()
    ok = runner.invoke(app, ["run-long", str(sc), "--tokens", "2B", "--failures", str(fail), "--json",
                             "--tune", "0,1", "--out", str(tmp_path / "r.json")])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert [p["policy"] for p in doc["policies"]] == ["restart", "hot"] and doc["tuning"]["best"]["spares"] in (0, 1)
    assert json.loads((tmp_path / "r.json").read_text())["iterations"] == doc["iterations"]
    bad = runner.invoke(app, ["run-long", str(sc), "--tokens", "2 billion"])
    assert bad.exit_code == 2 and bad.output.strip().startswith("error: --tokens:")
    fail.write_text("detection: 5\n")
    bad = runner.invoke(app, ["run-long", str(sc), "--tokens", "2B", "--failures", str(fail)])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "detection:" in bad.output


def test_the_plan_is_chosen_with_its_interval_and_spares(tmp_path: Path) -> None:
    """Two plans of one job (tp 2 and tp 8 on the same 16 GPUs): each is studied whole with the same failure
    draws, and the choice is the one whose tuned (spares, interval) trains soonest — the same answer run_long
    gives each plan alone. The command prints both and names the choice."""
    cfg = config_from_dict({"scale": 2000, "samples": 60})
    plans = [("plan.tp=2", scenario_from_dict(SMALL, name="tp2")),
             ("plan.tp=8", scenario_from_dict({**SMALL, "plan": {"tp": 8}}, name="tp8"))]
    choice = choose_plan(plans, cfg, tokens=5e9, seed=1, tune_spares=(0, 2))
    alone = [expected_time_to_train_s(run_long(sc, cfg, tokens=5e9, seed=1, tune_spares=(0, 2))) for _, sc in plans]
    assert choice.times_s == tuple(alone)
    assert choice.best == alone.index(min(alone))
    assert choice.studies[0].result.iteration_time_s != choice.studies[1].result.iteration_time_s
    with pytest.raises(ConfigError, match="--plan"):
        choose_plan([], cfg, tokens=5e9)
    sc = tmp_path / "s.yaml"
    sc.write_text(json.dumps(SMALL))
    fail = tmp_path / "f.yaml"
    fail.write_text("scale: 2000\nsamples: 40\n")
    res = CliRunner().invoke(app, ["run-long", str(sc), "--tokens", "5B", "--failures", str(fail), "--json",
                                   "--plan", "plan.tp=2", "--plan", "plan.tp=8"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [p["plan"] for p in doc["plans"]] == ["plan.tp=2", "plan.tp=8"]
    times = [p["expected_time_to_train_s"] for p in doc["plans"]]
    assert doc["best"] == doc["plans"][times.index(min(times))]["plan"]
    one = CliRunner().invoke(app, ["run-long", str(sc), "--tokens", "5B", "--plan", "plan.tp=2"])
    assert one.exit_code == 2 and "--plan" in one.output
