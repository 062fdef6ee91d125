"""The co-design search: space, costs, pruning, optimizers, resume, and the command line."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.search.cost import cluster_cost, price_catalog, run_cost, switch_price
from topotrain.search.evaluate import Task, evaluate
from topotrain.search.executors import InlineExecutor, PoolExecutor
from topotrain.search.results import pareto, ranked, rows_of
from topotrain.search.run import load_records, run_search
from topotrain.search.space import grid, grid_size, point_key, space_from_dict
from topotrain.util.errors import ConfigError

runner = CliRunner()

NET = {"topology": "bigraph", "switches": 4, "radix": 16, "link": "eth-100g"}


def small_space(**search: Any) -> dict[str, Any]:
    """6 points, 2 of them invalid (an unknown collective): 2-server ResNet-50 runs, a few milliseconds each
    with the analytical model."""
    return {
        "cluster": [{"server": "eflops", "servers": 2, "network": NET},
                    {"server": "pcie-shared-nic", "servers": 2, "network": NET}],
        "model": "resnet50",
        "batch": {"global": 1024, "micro": 64},
        "plan": {"dp_algorithm": ["ring", "hdrm", "no-such-algo"], "bucket": "100MiB"},
        "search": {"screen_network": "analytical", "confirm_network": "flow", "confirm_top": 1, **search},
    }


# ---- space -------------------------------------------------------------------------------------------------
def test_grid_follows_conditional_dimensions_without_duplicates() -> None:
    doc = {"cluster": [{"server": "eflops", "servers": {"log2": [2, 8]}}, {"server": "x", "servers": [1, 2]}],
           "model": "m", "plan": {"bucket": {"from": 8, "to": 32, "step": 8, "unit": "MiB"}},
           "degraded_links": [{"a": "p", "b": "q"}]}
    pts = list(grid(doc))
    assert len(pts) == (3 + 2) * 4 == grid_size(doc)
    assert len({point_key(p) for _, p in pts}) == len(pts)
    assert {p["cluster"]["servers"] for _, p in pts if p["cluster"]["server"] == "eflops"} == {2, 4, 8}
    assert {p["plan"]["bucket"] for _, p in pts} == {"8MiB", "16MiB", "24MiB", "32MiB"}
    # a list-typed schema field is a value, not a dimension
    assert all(p["degraded_links"] == [{"a": "p", "b": "q"}] for _, p in pts)
    # a dimension under one alternative is named by it, and absent from the other's choices
    assert all("cluster[1].servers" not in ch for ch, p in pts if p["cluster"]["server"] == "eflops")


@pytest.mark.parametrize(("spec", "field"), [
    ({"log2": [8, 4]}, "servers.log2"), ({"from": 4, "to": 2}, "servers"), ({"choice": []}, "servers.choice"),
    ({"from": 1, "to": 4, "step": 0}, "servers"),
])
def test_bad_range_is_one_error_naming_its_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        space_from_dict({"cluster": {"server": "eflops", "servers": spec}, "model": "resnet50"})
    assert e.value.field == f"cluster.{field}"


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError) as e:
        space_from_dict({**small_space(), "search": {"optimiser": "tpe"}})
    assert e.value.field == "search.optimiser" and "optimizer" in e.value.fix
    with pytest.raises(ConfigError) as e:
        space_from_dict({**small_space(), "search": {"objectives": ["speed"]}})
    assert e.value.field == "search.objectives[0]"


# ---- cost --------------------------------------------------------------------------------------------------
def test_capex_counts_the_parts_of_the_topology() -> None:
    prices = price_catalog()
    eflops = cluster_from_dict({"server": "eflops", "servers": 4, "network": NET})
    shared = cluster_from_dict({"server": "pcie-shared-nic", "servers": 4, "network": NET})
    a, b = cluster_cost(eflops, "eflops", prices), cluster_cost(shared, "pcie-shared-nic", prices)
    nic = prices["nics"][0]["price_usd"]
    # EFLOPS: a NIC per PCIe switch (4 per server) against one shared NIC: 3 more NICs, 3 more DACs per server
    assert a.parts_usd["nics"] - b.parts_usd["nics"] == pytest.approx(4 * 3 * nic)
    assert a.parts_usd["gpus"] == b.parts_usd["gpus"] == 32 * prices["gpus"]["v100"]["price_usd"]
    assert a.capex_usd == pytest.approx(sum(a.parts_usd.values()))
    # power: GPUs at their datasheet TDP
    assert a.parts_w["gpus"] == pytest.approx(32 * 300.0)
    # a year of use costs the amortized capex plus energy
    rc = run_cost(a, prices)
    year = 365.25 * 86400
    assert rc.capex_usd_per_s * year * prices["amortization_years"] == pytest.approx(a.capex_usd)
    e = prices["energy"]
    assert rc.energy_usd_per_s * 3600 == pytest.approx(a.power_w / 1000 * e["pue"] * e["usd_per_kwh"])


def test_switch_price_picks_the_cheapest_fitting_and_chassis_beyond() -> None:
    entries = [{"radix": 32, "gbps": 100, "price_usd": 10, "power_w": 1},
               {"radix": 64, "gbps": 100, "price_usd": 25, "power_w": 2}]
    assert switch_price(20, 100, entries) == (10, 1)
    assert switch_price(40, 100, entries) == (25, 2)
    assert switch_price(130, 100, entries) == (3 * 25, 3 * 2)


def test_price_overrides_replace_entries_and_bad_ones_are_named() -> None:
    p = price_catalog({"gpus": {"v100": {"price_usd": 1, "date": "2030-01"}}, "energy": {"usd_per_kwh": 0.5}})
    assert p["gpus"]["v100"]["price_usd"] == 1 and p["energy"]["usd_per_kwh"] == 0.5
    assert p["energy"]["pue"] == price_catalog()["energy"]["pue"]
    with pytest.raises(ConfigError) as e:
        price_catalog({"gpus": {"v100": {"cost": 3}}})
    assert e.value.field == "costs.gpus.v100"
    # every default says where its figure comes from and when
    for section in ("gpus", "servers"):
        assert all(v.get("source") and v.get("date") for v in price_catalog()[section].values())
    for section in ("nics", "switches", "cables"):
        assert all(v.get("source") and v.get("date") for v in price_catalog()[section])


# ---- evaluation ----------------------------------------------------------------------------------------------
def _task(point: dict[str, Any], **kw: Any) -> Task:
    return Task(point_key(point), 0, "screen", point, "analytical", price_catalog(), **kw)


def test_evaluate_reports_invalid_points_with_their_field_and_never_raises() -> None:
    pt = {"cluster": {"server": "eflops", "servers": 2, "network": {**NET, "radix": "many"}}, "model": "resnet50"}
    rec = evaluate(_task(pt))
    assert rec["status"] == "invalid" and rec["field"].startswith("cluster.network")
    rec = evaluate(_task({"cluster": {"server": "no-such-server"}, "model": "resnet50"}))
    assert rec["status"] == "invalid" and rec["field"] == "cluster.server"


def test_memory_infeasible_point_is_pruned_before_it_is_built() -> None:
    pt = {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "gpt3-175b",
          "batch": {"global": 16, "micro": 1}}
    rec = evaluate(_task(pt))
    assert rec["status"] == "infeasible" and rec["field"] == "memory"
    assert "capex_usd" not in rec["metrics"]  # stopped before the cluster was built and costed


def test_constraints_gpus_budget_power() -> None:
    pt = {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "resnet50",
          "batch": {"global": 512, "micro": 32}}
    assert evaluate(_task(pt, gpus=32))["field"] == "gpus"
    ok = evaluate(_task(pt))
    assert ok["status"] == "ok"
    m = ok["metrics"]
    # the error band of the prediction travels with the point (CNN: its regime's band)
    assert m["iteration_time_s_low"] < m["iteration_time_s"] < m["iteration_time_s_high"]
    assert m["error_band"]["regime"].startswith("cnn")
    assert evaluate(_task(pt, budget_usd=m["capex_usd"] * 0.99))["field"] == "budget_usd"
    assert evaluate(_task(pt, budget_usd=m["capex_usd"] * 1.01))["status"] == "ok"
    assert evaluate(_task(pt, max_power_kw=m["power_kw"] * 0.99))["field"] == "max_power_kw"
    # objectives follow from the timed iteration and the costs
    assert m["tokens_per_s"] == pytest.approx(512 / m["iteration_time_s"])  # images: a sample is a token
    assert m["tokens_per_s_per_kw"] == pytest.approx(m["tokens_per_s"] / m["power_kw"])
    rc = run_cost(cluster_cost(cluster_from_dict(pt["cluster"]), "eflops", price_catalog()), price_catalog())
    assert m["usd_per_1m_tokens"] == pytest.approx(rc.usd_per_s * 1e6 / m["tokens_per_s"])
    t = evaluate(_task(pt, train_samples=1.28e6 * 90))["metrics"]["time_to_train_s"]
    assert t == pytest.approx(1.28e6 * 90 / m["samples_per_s"])


# ---- search ----------------------------------------------------------------------------------------------
def _metrics_by_key(out: Path) -> dict[tuple[str, str], Any]:
    return {(r["key"], r["stage"]): (r["status"], r["field"], r["metrics"]) for r in load_records(out)}


def test_grid_search_ranks_screens_confirms_and_is_identical_on_a_pool(tmp_path: Path) -> None:
    space = space_from_dict(small_space())
    o = run_search(space, tmp_path / "a", InlineExecutor())
    assert o.points == 6 and o.confirmed == 1 and o.evaluated == 7
    rows = rows_of(load_records(tmp_path / "a"))
    bad = [r for r in rows if r.status != "ok"]
    assert len(bad) == 2 and all(r.point["plan"]["dp_algorithm"] == "no-such-algo" for r in bad)
    order = ranked(rows, "iteration_time_s")
    assert order[0].confirm is not None and order[0].confirm["network"] == "flow"
    screen_best = min(r.screen["iteration_time_s"] for r in rows if r.status == "ok")
    assert order[0].screen["iteration_time_s"] == screen_best
    front = pareto(rows)
    assert front and all(not (o2.best["iteration_time_s"] < f.best["iteration_time_s"]
                              and o2.best["capex_usd"] < f.best["capex_usd"]) for f in front for o2 in order)
    pool = PoolExecutor(2)
    try:
        run_search(space, tmp_path / "b", pool)
    finally:
        pool.close()
    assert _metrics_by_key(tmp_path / "a") == _metrics_by_key(tmp_path / "b")


def test_an_existing_search_needs_resume_and_the_same_space(tmp_path: Path) -> None:
    space = space_from_dict(small_space(confirm_top=0))
    run_search(space, tmp_path, InlineExecutor())
    with pytest.raises(ConfigError) as e:
        run_search(space, tmp_path, InlineExecutor())
    assert "--resume" in e.value.fix
    o = run_search(space, tmp_path, InlineExecutor(), resume=True)
    assert o.evaluated == 0 and o.reused == 6
    other = copy.deepcopy(small_space(confirm_top=0))
    other["batch"]["micro"] = 32
    with pytest.raises(ConfigError) as e:
        run_search(space_from_dict(other), tmp_path, InlineExecutor(), resume=True)
    assert e.value.field == "--resume"


def _tpe_space() -> dict[str, Any]:
    d = small_space(optimizer="tpe", trials=6, batch=3, seed=7, confirm_top=0)
    d["plan"] = {"dp_algorithm": ["ring", "hdrm"], "bucket": {"from": 8, "to": 96, "step": 8, "unit": "MiB"}}
    return d


def test_tpe_is_seeded_and_resumes_to_the_same_trials(tmp_path: Path) -> None:
    full = run_search(space_from_dict(_tpe_space()), tmp_path / "full", InlineExecutor())
    assert full.points >= 2
    # a search stopped after 4 trials, then resumed to 10, asks the same points as one run straight through
    part = copy.deepcopy(_tpe_space())
    part["search"]["trials"] = 3
    import optuna

    run_search(space_from_dict(part), tmp_path / "res", InlineExecutor())
    again = run_search(space_from_dict(_tpe_space()), tmp_path / "res", InlineExecutor(), resume=True)
    assert again.reused >= 1
    params = [optuna.load_study(study_name="search", storage=f"sqlite:///{d / 'optuna.sqlite'}").trials
              for d in (tmp_path / "full", tmp_path / "res")]
    assert [t.params for t in params[0]] == [t.params for t in params[1]]
    assert len({json.dumps(t.params, sort_keys=True) for t in params[0]}) > 1  # it did explore
    assert _metrics_by_key(tmp_path / "full") == _metrics_by_key(tmp_path / "res")


def test_nsga2_runs_two_objectives(tmp_path: Path) -> None:
    d = _tpe_space()
    d["search"].update(optimizer="nsga2", trials=4, batch=2)
    o = run_search(space_from_dict(d), tmp_path, InlineExecutor())
    import optuna

    st = optuna.load_study(study_name="search", storage=f"sqlite:///{tmp_path / 'optuna.sqlite'}")
    assert len(st.directions) == 2 and len(st.trials) == 4 and o.points >= 1


# ---- command line --------------------------------------------------------------------------------------------
def test_cli_search_and_explain(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(small_space()))
    out = tmp_path / "out"
    r = runner.invoke(app, ["search", str(space), "--out", str(out), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "Pareto front" in r.output and "2 point(s) invalid: plan.dp_algorithm: unknown algorithm" in r.output
    for f in ("points.csv", "pareto.csv", "pareto.png", "best.yaml", "runner-up.yaml", "results.sqlite"):
        assert (out / f).exists(), f
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    lines = (out / "points.csv").read_text().splitlines()
    assert len(lines) == 1 + 6 and lines[1].startswith("1,")
    r = runner.invoke(app, ["search", str(space), "--out", str(out), "--workers", "1"])
    assert r.exit_code == 2 and "--resume" in r.output
    r = runner.invoke(app, ["search", str(space), "--out", str(out), "--workers", "1", "--resume", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["evaluated"] == 0 and doc["reused"] == 7
    r = runner.invoke(app, ["explain", str(out / "best.yaml"), "--vs", str(out / "runner-up.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    ex = json.loads(r.output)
    assert ex["total_difference_s"] == pytest.approx(ex["vs"]["iteration_time_s"] - ex["best"]["iteration_time_s"])
    assert ex["total_difference_s"] >= 0
    rel = ex["total_difference_s"] / ex["best"]["iteration_time_s"]
    assert ex["verdict"]["within_band"] == (rel <= ex["verdict"]["band_plus_minus"])
    r = runner.invoke(app, ["explain", str(out / "best.yaml"), "--vs", str(out / "runner-up.yaml")])
    assert r.exit_code == 0 and "busiest links" in r.output and "exposed comm" in r.output


def test_cli_bad_space_is_one_error_line(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({**small_space(), "search": {"trials": -1}}))
    r = runner.invoke(app, ["search", str(space), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and r.output.strip().startswith("error: search.trials")
    assert len(r.output.strip().splitlines()) == 1


def test_example_space_is_valid_and_sized() -> None:
    path = Path(__file__).parent.parent / "examples" / "search-eflops.yaml"
    space = space_from_dict(yaml.safe_load(path.read_text()))
    assert grid_size(space.doc) == 72
    assert space.settings.constraints.gpus == 512
    gpt = Path(__file__).parent.parent / "examples" / "search-eflops-gpt.yaml"
    assert grid_size(space_from_dict(yaml.safe_load(gpt.read_text())).doc) == 36


def test_an_unexpected_exception_in_a_point_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    import topotrain.search.evaluate as ev

    def boom(sc: Any) -> Any:
        raise ZeroDivisionError("inside the model")

    monkeypatch.setattr(ev, "simulate", boom)
    pt = {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "resnet50",
          "batch": {"global": 512, "micro": 32}}
    rec = evaluate(_task(pt))
    assert rec["status"] == "error" and rec["reason"] == "ZeroDivisionError: inside the model"


def test_alternate_ends_where_no_cluster_move_and_no_plan_move_improves(tmp_path: Path) -> None:
    d = small_space(confirm_top=0)
    d["cluster"] = [{"server": s, "servers": 2, "network": NET} for s in ("eflops", "pcie-shared-nic")]
    d["plan"] = {"dp_algorithm": ["ring", "hdrm"], "bucket": ["4MiB", "25MiB", "100MiB"]}
    run_search(space_from_dict(d), tmp_path / "grid", InlineExecutor())
    d["search"]["optimizer"] = "alternate"
    o = run_search(space_from_dict(d), tmp_path / "alt", InlineExecutor())
    assert o.points < 12  # 2 clusters, then 6 plans (one shared): 7 points, not the 12 of the grid
    everything = rows_of(load_records(tmp_path / "grid"))
    best = ranked(rows_of(load_records(tmp_path / "alt")), "iteration_time_s")[0]
    t = best.screen["iteration_time_s"]
    def plan_of(ch: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in ch.items() if not k.startswith("cluster")}

    same_plan = [r for r in everything if plan_of(dict(r.choices)) == plan_of(dict(best.choices))]
    same_cluster = [r for r in everything if r.choices["cluster"] == best.choices["cluster"]]
    assert len(same_plan) == 2 and len(same_cluster) == 6
    assert all(r.screen["iteration_time_s"] >= t for r in same_plan + same_cluster if r.status == "ok")
    again = run_search(space_from_dict(d), tmp_path / "alt", InlineExecutor(), resume=True)
    assert again.evaluated == 0 and again.points == o.points


def test_memoized_clusters_give_the_records_of_fresh_ones(tmp_path: Path) -> None:
    """A worker keeps the clusters it built: the same spec is built once, its records equal those of a fresh
    build, and a catalog file edited between points is read again (never served stale)."""
    import topotrain.scenario.memo as ev

    pt = {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "resnet50",
          "batch": {"global": 512, "micro": 32}, "plan": {"dp_algorithm": "ring"}}
    ev._CLUSTERS.clear()
    first = evaluate(_task(pt))
    assert len(ev._CLUSTERS) == 1
    again = evaluate(_task({**pt, "plan": {"dp_algorithm": "hdrm"}}))
    assert len(ev._CLUSTERS) == 1  # the same cluster: built once
    ev._CLUSTERS.clear()
    assert evaluate(_task(pt)) == first
    ev._CLUSTERS.clear()
    assert evaluate(_task({**pt, "plan": {"dp_algorithm": "hdrm"}})) == again
    # a catalog file: its stamp is part of the key
    cat = tmp_path / "catalog.yaml"
    cat.write_text("links:\n  - {name: my-eth, kind: ethernet, bandwidth: 100Gbps, latency: 0.5us}\n")
    with_file = {**pt, "cluster": {**pt["cluster"], "catalog": "catalog.yaml",
                                   "network": {**NET, "link": "my-eth"}}}
    t1 = evaluate(_task(with_file, base_dir=str(tmp_path)))["metrics"]["iteration_time_s"]
    cat.write_text("links:\n  - {name: my-eth, kind: ethernet, bandwidth: 10Gbps, latency: 0.5us}\n")
    os.utime(cat, ns=(1, 1))  # a different stamp even within the file system's time resolution
    t2 = evaluate(_task(with_file, base_dir=str(tmp_path)))["metrics"]["iteration_time_s"]
    assert t2 > 1.5 * t1


def test_cluster_memo_is_bounded_by_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import topotrain.scenario.memo as ev

    monkeypatch.setattr(ev, "CLUSTER_MEMO_GPUS", 20)  # two 16-GPU clusters do not fit together
    ev._CLUSTERS.clear()
    for server in ("eflops", "pcie-shared-nic"):
        assert evaluate(_task({"cluster": {"server": server, "servers": 2, "network": NET}, "model": "resnet50",
                               "batch": {"global": 512, "micro": 32}}))["status"] == "ok"
    assert len(ev._CLUSTERS) == 1  # only the newest kept
    ev._CLUSTERS.clear()
