"""One network interface driven by one engine: every model gives inside the engine the figure it gives alone,
concurrent collectives contend in the models that share links, blocking TP collectives are engine-timed."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from topotrain.collectives.registry import build_schedule
from topotrain.network import NetworkParams, get_model, model_names, run_concurrent
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.training.engine import Blocking, CommSpec, Engine, TaskGraph, isolated_keys

MiB = 2**20
#: the event-driven models (the packet reference runs a whole ns-3 simulation per call: tests of its own)
MODELS = ("analytical", "flow", "flow-async", "flow-eager")


def _shared_nic(servers: int = 4):  # type: ignore[no-untyped-def]
    return cluster_from_dict({"server": "pcie-shared-nic", "servers": servers,
                              "network": {"topology": "single-switch", "link": "eth-100g", "latency": "1us"}})


@functools.cache
def _probe() -> tuple[Any, Any, dict[str, float]]:
    """The probe of the redesign: a tree allreduce of 25 MiB on 4 shared-NIC servers, and each model's time
    of it alone."""
    c = _shared_nic()
    sched = build_schedule("allreduce", "tree", c.topology, c.topology.gpus, 25 * MiB)
    return c, sched, {n: get_model(n, c.network_params).time_schedule(sched, c.topology).time_s for n in MODELS}


def test_the_probe_tells_the_models_apart() -> None:
    assert set(MODELS) <= set(model_names())
    assert len(set(_probe()[2].values())) > 1  # so the equality below distinguishes the models


@pytest.mark.parametrize("name", MODELS)
def test_a_collective_inside_the_engine_takes_its_time_alone(name: str) -> None:
    """The probe, timed alone by the model and as the one communication task of an engine run, is the same
    number for every model (before, the engine timed it with barrier ``flow`` whatever the scenario named)."""
    c, sched, alone = _probe()
    g = TaskGraph()
    g.add("allreduce", "dp-comm", "dp", comm=CommSpec("ar", (sched,)))
    inside = Engine(c.topology, get_model(name, c.network_params)).run(g)
    assert inside == pytest.approx(alone[name], rel=1e-12)


@pytest.mark.parametrize("name", ["flow", "flow-async", "flow-eager"])
def test_two_collectives_on_shared_links_contend_in_the_engine(name: str) -> None:
    """Two allreduces over the same NICs on two streams take longer together than alone, and exactly what
    run_concurrent (the same interface, no engine) gives; the analytical model does not contend."""
    c = _shared_nic(2)
    model = get_model(name, c.network_params)
    gpus = c.topology.gpus
    a = build_schedule("allreduce", "ring", c.topology, gpus[0::2], 8 * MiB)
    b = build_schedule("allreduce", "ring", c.topology, gpus[1::2], 8 * MiB)
    g = TaskGraph()
    g.add("a", "dp-comm", "s0", comm=CommSpec("a", (a,)))
    g.add("b", "dp-comm", "s1", comm=CommSpec("b", (b,)))
    together = Engine(c.topology, model).run(g)
    solo = max(model.time_schedule(s, c.topology).time_s for s in (a, b))
    assert together > 1.2 * solo
    jobs = run_concurrent([(a, 0.0), (b, 0.0)], c.topology, model)
    assert together == pytest.approx(max(j.finish_s for j in jobs), rel=1e-12)
    ana = get_model("analytical", c.network_params)
    assert Engine(c.topology, ana).run(g) == pytest.approx(
        max(ana.time_schedule(s, c.topology).time_s for s in (a, b)), rel=1e-12)


def test_blocking_collective_alone_or_contending() -> None:
    """A blocking collective inside a compute task: alone (its links used by no other stream) it costs its
    time alone and shows as a slice at its offset; sharing the NIC with a data-parallel task on another
    stream, it runs in the network and both take longer."""
    c = _shared_nic(2)
    model = get_model("flow", c.network_params)
    gpus = c.topology.gpus
    inter = build_schedule("allreduce", "ring", c.topology, [gpus[0], gpus[8]], 4 * MiB)  # across servers
    dp = build_schedule("allreduce", "ring", c.topology, [gpus[1], gpus[9]], 16 * MiB)  # the same NICs
    t_alone = model.time_schedule(inter, c.topology).time_s
    spec = CommSpec("tp", (inter,))
    g = TaskGraph()
    g.add("F", "forward", "stage0/compute", duration_s=1e-3, blocking=(Blocking(spec, "tp L0", 4e-4),))
    Engine(c.topology, model).run(g)
    (task,) = g.tasks
    assert isolated_keys(g, c.topology) == {"tp"}
    assert task.end_s == pytest.approx(1e-3 + t_alone, rel=1e-12)
    assert task.blocking_s == pytest.approx(t_alone, rel=1e-12)
    assert task.blocking_slices() == [("tp L0", pytest.approx(4e-4), pytest.approx(4e-4 + t_alone, rel=1e-12))]
    g2 = TaskGraph()
    g2.add("F", "forward", "stage0/compute", duration_s=1e-3, blocking=(Blocking(spec, "tp L0", 0.0),))
    g2.add("dp", "dp-comm", "stage0/dp", comm=CommSpec("dp", (dp,)))
    assert "tp" not in isolated_keys(g2, c.topology)
    Engine(c.topology, model).run(g2)
    f, d = g2.tasks
    assert f.blocking_s > 1.2 * t_alone  # it shared the NIC with the data-parallel allreduce
    assert f.end_s == pytest.approx(1e-3 + f.blocking_s, rel=1e-12)
    assert d.end_s > model.time_schedule(dp, c.topology).time_s


def test_model_parameters_are_explicit() -> None:
    """The per-message overhead comes from the model's NetworkParams, never from the topology."""
    c = _shared_nic(2)
    sched = build_schedule("allreduce", "ring", c.topology, c.topology.gpus, 8 * 1024)
    times = [get_model("flow", NetworkParams(a)).time_schedule(sched, c.topology).time_s for a in (0.0, 1e-5)]
    steps = 2 * (len(c.topology.gpus) - 1)
    assert times[1] - times[0] == pytest.approx(steps * 1e-5, rel=1e-9)


def test_engine_link_bytes_count_every_blocking_use() -> None:
    c = _shared_nic(2)
    model = get_model("analytical", c.network_params)
    gpus = c.topology.gpus
    inter = build_schedule("allreduce", "ring", c.topology, [gpus[0], gpus[8]], 4 * MiB)
    spec = CommSpec("tp", (inter,))
    g = TaskGraph()
    prev: list[int] = []
    for i in range(3):
        prev = [g.add(f"F{i}", "forward", "c", prev, 1e-3, blocking=(Blocking(spec, "tp", 0.0),))]
    eng = Engine(c.topology, model)
    eng.run(g)
    np.testing.assert_allclose(eng.link_bytes, 3 * model.time_schedule(inter, c.topology).link_bytes)


def test_blocking_at_the_end_of_a_task_never_submits_in_the_past() -> None:
    """A chain of compute tasks whose contended blocking collective comes last (offset = duration) and a
    successor whose collective comes first: the successor submits exactly when the predecessor ends, never
    an ulp before the network's clock (t + d − d is not always t in floating point)."""
    c = _shared_nic(2)
    model = get_model("flow", c.network_params)
    gpus = c.topology.gpus
    inter = build_schedule("allreduce", "ring", c.topology, [gpus[0], gpus[8]], 64 * 1024)
    dp = build_schedule("allreduce", "ring", c.topology, [gpus[1], gpus[9]], 256 * MiB)
    spec = CommSpec("tp", (inter,))
    g = TaskGraph()
    prev: list[int] = []
    for i, d in enumerate([0.1 + k * 0.0137 for k in range(40)]):
        prev = [g.add(f"F{i}", "forward", "stage0/compute", prev, d,
                      blocking=(Blocking(spec, "first", 0.0), Blocking(spec, "last", d)))]
    g.add("dp", "dp-comm", "stage0/dp", comm=CommSpec("dp", (dp,)))
    Engine(c.topology, model).run(g)
    for a, b in zip(g.tasks[:39], g.tasks[1:40], strict=True):
        assert b.start_s == a.end_s
        assert a.end_s == pytest.approx(a.start_s + a.duration_s + a.blocking_s, rel=1e-12)


@pytest.mark.parametrize("name", ["flow", "flow-async", "flow-eager"])
def test_a_network_collective_after_a_fixed_one_waits_for_its_time(name: str) -> None:
    """A compute task whose first blocking collective is timed alone (``isolated=True``: charged its alone
    time) and whose second runs in the network: the second starts when the first has been charged, and the
    network's events before then (the phases of a data-parallel ring on another stream) are handled first
    (it was submitted at that later time at once, and the flow model then met a phase completion in its
    past: a traceback on Megatron-Core's validation rows). Both collectives' times equal run_concurrent's
    (no engine) for the same start times."""
    c = _shared_nic(2)
    model = get_model(name, c.network_params)
    gpus = c.topology.gpus
    fixed = build_schedule("allreduce", "ring", c.topology, [gpus[0], gpus[1]], 8 * MiB)
    inter = build_schedule("allreduce", "ring", c.topology, [gpus[0], gpus[8]], 1 * MiB)
    dp = build_schedule("allreduce", "ring", c.topology, gpus[1::2], 16 * MiB)
    charged = model.time_schedule(fixed, c.topology).time_s
    g = TaskGraph()
    g.add("F", "forward", "c", duration_s=1e-3,
          blocking=(Blocking(CommSpec("fixed", (fixed,), isolated=True), "fixed", 0.0),
                    Blocking(CommSpec("net", (inter,), isolated=False), "net", 0.0)))
    g.add("dp", "dp-comm", "dp", comm=CommSpec("dp", (dp,)))
    Engine(c.topology, model).run(g)
    task, dp_task = g.tasks
    (_, f0, f1), (_, n0, n1) = task.slices
    assert (f0, f1) == (0.0, charged) and n0 == charged
    jobs = run_concurrent([(dp, 0.0), (inter, charged)], c.topology, model)
    assert dp_task.end_s == pytest.approx(jobs[0].finish_s, rel=1e-12)
    assert n1 == pytest.approx(jobs[1].finish_s, rel=1e-12)
    assert len(dp.phases) > 2 and jobs[0].start_s < charged < jobs[0].finish_s  # the ring runs across it
    if name == "flow":  # phases of the ring end inside the fixed collective's time: the case that failed
        assert jobs[0].phase_finish_s[0] < charged


def test_shared_path_cache_answers_as_a_fresh_one() -> None:
    """The per-topology path cache is shared by every schedule: what was asked before changes no answer."""
    from topotrain.collectives.paths import PathCache, path_cache
    from topotrain.collectives.schedule import CollectiveOp

    topo = cluster_from_dict({"server": "eflops", "servers": 4,
                              "network": {"topology": "fat-tree", "link": "eth-100g"}}).topology
    ranks = topo.gpus
    shared = path_cache(topo, tuple(ranks))
    assert path_cache(topo, tuple(ranks)) is shared
    for algorithm in ("halving-doubling", "ring", "tree"):
        s = build_schedule(CollectiveOp.ALLREDUCE, algorithm, topo, ranks, 2**22)
        fresh = PathCache(topo, s.ranks)
        for ph in s.phases[:: max(1, len(s.phases) // 5)]:
            a, b = shared.resolve(s, ph), fresh.resolve(s, ph)
            for x, y in zip((a.offsets, a.links, a.latency_s, a.bytes), (b.offsets, b.links, b.latency_s, b.bytes),
                            strict=True):
                assert np.array_equal(x, y)
