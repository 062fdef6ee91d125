"""Failures, checkpoints and the long-run Monte-Carlo against closed forms: Young/Daly (their published
examples and Daly's expected run time), exponential renewal theory (half a cycle plus the restart lost per
failure), the elementary renewal theorem for Weibull lifetimes, and the Llama 3 table the defaults come from."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from topotrain.operations.checkpoint import (
    StorageTier,
    checkpoint_cost,
    checkpoint_size,
    daly_expected_time_s,
    daly_interval_s,
    lost_per_failure_s,
    young_interval_s,
)
from topotrain.operations.failures import (
    DAY_S,
    HOUR_S,
    LLAMA3_DAYS,
    LLAMA3_TABLE5,
    LLAMA3_UNEXPECTED,
    ComponentCounts,
    FailureClass,
    FailureModel,
    draw_failures,
    llama3_counts,
    llama3_model,
)
from topotrain.operations.longrun import Policy, RunSpec, run_policy
from topotrain.operations.tuning import tune
from topotrain.training.plan import Plan
from topotrain.util.errors import ConfigError
from topotrain.workload.zoo import get_model

ONE = ComponentCounts(gpus=8, servers=1, nics=8, switches=0, links=0, gpus_per_server=8)


def _software(mtbf_s: float, detect_s: float = 60.0, restart_s: float = 240.0) -> FailureModel:
    """Interruptions that take nothing (a restart suffices), one class per job: Daly's model."""
    return FailureModel((FailureClass("sw", mtbf_s=mtbf_s, scope="job", takes="none", repair_s=0.0),),
                        detect_s=detect_s, restart_s=restart_s, replace_s=None)


def _spec(work_s: float, interval_s: float, stall_s: float, lag_s: float = 0.0, **kw: object) -> RunSpec:
    return RunSpec(work_s=work_s, interval_s=interval_s, stall_s=stall_s, persist_lag_s=lag_s, detect_s=60.0,
                   restart_s=240.0, gpus=8, gpus_per_server=8, **kw)  # type: ignore[arg-type]


# ---- Young and Daly --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("mtbf_min", "expected_min", "tol_min"), [(24 * 60, 117, 0.5), (6 * 60, 57, 0.5),
                                                                    (15, 9.1, 0.05)])
def test_daly_interval_matches_his_published_examples(mtbf_min: float, expected_min: float, tol_min: float) -> None:
    # Daly 2006, Figs. 3-5: delta = 5 min, M = 24 h / 6 h / 15 min -> tau_opt = 117 / 57 / 9.1 min
    assert abs(daly_interval_s(300.0, mtbf_min * 60.0) / 60.0 - expected_min) <= tol_min


def test_young_is_daly_to_first_order_and_daly_caps_at_the_mtbf() -> None:
    assert young_interval_s(300.0, 86_400.0) == pytest.approx(math.sqrt(2 * 300 * 86_400))
    assert daly_interval_s(1.0, 1e9) == pytest.approx(young_interval_s(1.0, 1e9), rel=1e-4)
    assert daly_interval_s(500.0, 200.0) == 200.0  # delta >= 2M: checkpoint once per MTBF
    with pytest.raises(ConfigError, match="checkpoint"):
        young_interval_s(0.0, 100.0)


# ---- the Monte-Carlo against exponential renewal theory --------------------------------------------------
def test_lost_work_per_failure_is_half_the_cycle_plus_the_restart() -> None:
    tau, delta, mtbf = 360.0, 30.0, 36_000.0  # lambda * cycle ~ 1%: where the first-order form holds
    runs = run_policy(_spec(500 * tau, tau, delta), Policy("restart"), _software(mtbf), ONE, 2000, seed=1)
    got = runs.summary()["overhead_per_failure_s"]
    assert got == pytest.approx(lost_per_failure_s(tau, delta, 300.0), rel=0.02)
    assert runs.summary()["failures"] == pytest.approx(runs.finish_s.mean() / mtbf, rel=0.02)


def test_an_asynchronous_checkpoint_counts_once_persisted() -> None:
    tau, stall, lag, mtbf = 600.0, 5.0, 120.0, 60_000.0
    runs = run_policy(_spec(400 * tau, tau, stall, lag), Policy("restart"), _software(mtbf), ONE, 2000, seed=2)
    # the durable state trails the computation by the persist time: it adds to the half cycle lost
    assert runs.summary()["overhead_per_failure_s"] == pytest.approx(0.5 * (tau + stall) + lag + 300.0, rel=0.02)


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_mean_time_to_train_is_dalys_expected_time(factor: float) -> None:
    delta, mtbf = 30.0, 36_000.0
    tau = daly_interval_s(delta, mtbf) * factor
    work = 200 * daly_interval_s(delta, mtbf)
    runs = run_policy(_spec(work, tau, delta), Policy("restart"), _software(mtbf), ONE, 1000, seed=3)
    assert runs.summary()["time_to_train_s"] == pytest.approx(daly_expected_time_s(work, tau, delta, 300.0, mtbf),
                                                              rel=0.01)


def test_dalys_interval_minimizes_the_simulated_time_to_train() -> None:
    delta, mtbf = 30.0, 36_000.0
    daly = daly_interval_s(delta, mtbf)
    work = 200 * daly
    times = {}
    for f in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0):
        runs = run_policy(_spec(work, f * daly, delta), Policy("restart"), _software(mtbf), ONE, 1000, seed=4,
                          horizon_s=4 * work)  # one horizon: every interval sees the same failures
        times[f] = runs.summary()["time_to_train_s"]
    assert min(times, key=lambda f: times[f]) == 1.0, times


def test_a_seed_gives_the_same_runs_bit_for_bit_with_any_number_of_workers() -> None:
    spec = _spec(50_000.0, 900.0, 10.0, rate_by_missing=(1.0, 0.5))
    model = llama3_model().scaled(50.0)
    counts = ComponentCounts(gpus=64, servers=8, nics=64, switches=1, links=16, gpus_per_server=8)
    a = run_policy(spec, Policy("elastic", elastic=True), model, counts, 600, seed=5)
    b = run_policy(spec, Policy("elastic", elastic=True), model, counts, 600, seed=5, workers=2)
    c = run_policy(spec, Policy("elastic", elastic=True), model, counts, 600, seed=6)
    assert a.finish_s.tobytes() == b.finish_s.tobytes() and a.lost_s.tobytes() == b.lost_s.tobytes()
    assert a.finish_s.tobytes() != c.finish_s.tobytes()


# ---- what failures take ----------------------------------------------------------------------------------
def _switch(away_s: float = 36_000.0, mtbf_s: float = 2e6) -> tuple[RunSpec, FailureModel, ComponentCounts]:
    """A leaf switch (4 servers) failing once per ``mtbf_s``; rare enough that two seldom overlap."""
    model = FailureModel((FailureClass("leaf", mtbf_s=mtbf_s, scope="job", takes="switch", repair_s=away_s),),
                         detect_s=60.0, restart_s=240.0, replace_s=None)
    counts = ComponentCounts(gpus=64, servers=8, nics=64, switches=2, links=8, gpus_per_server=8,
                             servers_per_switch=4)
    return _spec(2e7, 1800.0, 20.0), model, counts


def test_a_switch_failure_takes_its_servers_and_spares_stand_in() -> None:
    spec, model, counts = _switch()
    enough = run_policy(spec, Policy("spares", spares=8), model, counts, 1000, seed=7).summary()
    short = run_policy(spec, Policy("spares", spares=3), model, counts, 1000, seed=7).summary()
    half_cycle = 0.5 * spec.cycle_s
    assert enough["overhead_per_failure_s"] == pytest.approx(half_cycle + 300.0, rel=0.03)
    # one spare short: every failure waits for the four servers to come back, then restarts
    assert short["overhead_per_failure_s"] == pytest.approx(half_cycle + 36_000.0 + 240.0, rel=0.03)
    assert enough["goodput"] < enough["effective_training_time"]  # the spares are paid for


def test_elastic_runs_slower_until_the_server_returns_then_scales_up() -> None:
    spec, model, counts = _switch()
    model = dataclasses.replace(model, classes=(dataclasses.replace(model.classes[0], takes="server"),))
    spec = dataclasses.replace(spec, rate_by_missing=(1.0, 0.5, 0.5))
    s = run_policy(spec, Policy("elastic", elastic=True), model, counts, 1000, seed=8).summary()
    # half speed for the 10 h away, then a checkpoint and a restart to grow back
    want = 0.5 * spec.cycle_s + 300.0 + 0.5 * 36_000.0 + spec.stall_s + 240.0
    assert s["overhead_per_failure_s"] == pytest.approx(want, rel=0.03)


# ---- failure draws against renewal theory ----------------------------------------------------------------
def test_exponential_classes_are_poisson_in_the_component_count() -> None:
    model = FailureModel((FailureClass("g", mtbf_s=1000 * HOUR_S, scope="gpu"),))
    f = draw_failures(model, ONE, 4000, 500 * HOUR_S, np.random.default_rng(0))
    n = (f.cls >= 0).sum(axis=1)
    assert n.mean() == pytest.approx(8 * 500 / 1000, rel=0.02)
    assert n.var() == pytest.approx(n.mean(), rel=0.1)  # Poisson: variance = mean
    assert np.array_equal(np.sort(f.time_s, axis=1), f.time_s)  # each run's failures in time order


def test_weibull_renewals_follow_the_elementary_renewal_theorem() -> None:
    k, mean, repair = 2.0, 100.0, 25.0
    cls = FailureClass("w", mtbf_s=mean, scope="job", distribution="weibull", shape=k, repair_s=repair)
    model = FailureModel((cls,), replace_s=None)
    horizon = 200 * (mean + repair)
    f = draw_failures(model, ONE, 2000, horizon, np.random.default_rng(1))
    # renewal cycles of mean lifetime + repair; m(t) = t/mu + (cv^2 - 1)/2 + o(1) for the lifetime's cv
    cv2 = math.gamma(1 + 2 / k) / math.gamma(1 + 1 / k) ** 2 - 1
    mu, var = mean + repair, cv2 * mean**2
    want = horizon / mu + (var / mu**2 - 1) / 2
    assert (f.cls >= 0).sum(axis=1).mean() == pytest.approx(want, rel=0.01)


def test_weibull_first_failures_follow_the_law() -> None:
    # k < 1: infant mortality; repairs outlast the horizon, so only first failures fall inside it
    cls = FailureClass("w", mtbf_s=5e6, scope="gpu", distribution="weibull", shape=0.7, repair_s=1e7)
    counts = ComponentCounts(gpus=20_000, servers=2500, nics=0, switches=0, links=0, gpus_per_server=8)
    f = draw_failures(FailureModel((cls,), replace_s=None), counts, 500, 30 * DAY_S, np.random.default_rng(2))
    p = 1 - math.exp(-((30 * DAY_S / cls.weibull_scale_s) ** 0.7))
    assert (f.cls >= 0).sum(axis=1).mean() == pytest.approx(20_000 * p, rel=0.01)


# ---- the Llama 3 table -----------------------------------------------------------------------------------
def test_the_defaults_give_back_the_llama3_table() -> None:
    model, counts = llama3_model(), llama3_counts()
    expected = model.rates_per_s(counts) * LLAMA3_DAYS * DAY_S
    assert expected == pytest.approx([row[2] for row in LLAMA3_TABLE5])
    assert LLAMA3_DAYS * DAY_S / model.job_mtbf_s(counts) == pytest.approx(LLAMA3_UNEXPECTED)
    f = draw_failures(model, counts, 400, LLAMA3_DAYS * DAY_S, np.random.default_rng(3))
    got = f.counts_by_class(len(model.classes)).mean(axis=0)
    for (name, _, n, _, _), g in zip(LLAMA3_TABLE5, got, strict=True):
        assert abs(g - n) <= 4 * math.sqrt(n / 400) + 0.05, name


def test_a_month_on_16k_gpus_with_1000_runs_takes_under_a_minute() -> None:
    model, counts = llama3_model(), llama3_counts()
    stall = 20.0
    spec = RunSpec(work_s=27 * DAY_S, interval_s=daly_interval_s(stall, model.job_mtbf_s(counts)), stall_s=stall,
                   persist_lag_s=60.0, detect_s=model.detect_s, restart_s=model.restart_s, gpus=counts.gpus,
                   gpus_per_server=8, rate_by_missing=tuple(1 - m / 2048 for m in range(2048)))
    t0 = time.perf_counter()
    runs = run_policy(spec, Policy("elastic", spares=16, elastic=True), model, counts, 1000, seed=9)
    assert time.perf_counter() - t0 < 60.0
    assert 28 * DAY_S < runs.summary()["time_to_train_s"] < 40 * DAY_S


# ---- checkpoints -----------------------------------------------------------------------------------------
def test_checkpoint_bytes_are_weights_and_adam_states_however_sharded() -> None:
    model = get_model("gpt3-1.3b")
    params = sum(layer.param_count for layer in model.layers)
    sizes = {z: checkpoint_size(model, Plan(dp=8, tp=2, global_batch=64, zero_stage=z)) for z in (0, 1, 3)}
    for z, s in sizes.items():
        assert s.total_bytes == pytest.approx((2 + 12) * params, rel=1e-6), z  # bf16 weights + fp32 master, m, v
    assert (sizes[0].writers, sizes[1].writers) == (2, 16)  # one replica vs every rank
    assert sizes[0].per_writer_bytes == pytest.approx(sizes[0].total_bytes / 2, rel=0.01)  # + replicated norms
    assert sizes[3].per_writer_bytes == pytest.approx(sizes[3].total_bytes / 16, rel=0.01)
    assert sizes[0].restore_bytes == pytest.approx(8 * sizes[0].total_bytes, rel=0.01)  # every replica reads


def test_sync_checkpoints_stall_for_the_write_async_ones_for_the_copy() -> None:
    size = checkpoint_size(get_model("gpt3-1.3b"), Plan(dp=8, global_batch=64, zero_stage=1))
    tier = StorageTier(write_bytes_per_s=1e11, read_bytes_per_s=2e11, per_writer_bytes_per_s=1e12,
                       snapshot_bytes_per_s=2e10)
    sync, asy = checkpoint_cost(size, tier, "sync"), checkpoint_cost(size, tier, "async")
    assert sync.stall_s == sync.write_s == pytest.approx(size.total_bytes / 1e11)
    assert asy.stall_s == pytest.approx(size.per_writer_bytes / 2e10) and asy.persist_lag_s == asy.write_s
    assert asy.stall_s < sync.stall_s
    with pytest.raises(ConfigError, match="checkpoint.storage.write"):
        StorageTier(write_bytes_per_s=0.0)


# ---- tuning ----------------------------------------------------------------------------------------------
def test_tuning_finds_dalys_interval_and_prefers_spares_that_avoid_waiting() -> None:
    spec, model, counts = _switch(away_s=12 * HOUR_S, mtbf_s=2e5)
    spec = dataclasses.replace(spec, work_s=4e6)
    daly = daly_interval_s(spec.stall_s, model.job_mtbf_s(counts))
    tuned = tune(dataclasses.replace(spec, interval_s=daly), model, counts, (0, 4), 300, seed=10)
    by = {p.spares: p for p in tuned.points}
    assert by[4].time_to_train_s < by[0].time_to_train_s and tuned.best.spares == 4
    assert tuned.daly_interval_s == pytest.approx(daly)
    assert by[4].interval_s == pytest.approx(daly, rel=0.35)
    assert tune(spec, model, counts, (0, 4), 300, seed=10, objective="gpu_hours").best.spares in (0, 4)


def test_allowed_dp_follows_ep_dividing_dp_times_cp() -> None:
    """A shrunk plan keeps ep | dp·cp (the check of plan.ep): with cp = 2 and ep = 4, dp may drop to any even
    degree; with cp = 1, to a multiple of 4; with cp = 4, to any degree."""
    from types import SimpleNamespace

    from topotrain.operations.degraded import allowed_dp

    def plan(ep: int, cp: int) -> object:
        return SimpleNamespace(ep=ep, cp=cp)

    assert [allowed_dp(plan(4, 1), d) for d in (8, 7, 5, 3)] == [8, 4, 4, 0]  # type: ignore[arg-type]
    assert [allowed_dp(plan(4, 2), d) for d in (8, 7, 5, 3, 1)] == [8, 6, 4, 2, 0]  # type: ignore[arg-type]
    assert [allowed_dp(plan(4, 4), d) for d in (7, 3, 1)] == [7, 3, 1]  # type: ignore[arg-type]
