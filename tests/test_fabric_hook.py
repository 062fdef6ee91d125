"""The packet-fabric hook (issue 16): ``NetworkParams.fabric`` carried by the barrier models (flow, analytical)
themselves, the same figure alone and inside the shared network, nothing changed on a cut-through fabric."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from topotrain.collectives.registry import build_schedule
from topotrain.network import NetworkParams, get_model, run_concurrent
from topotrain.network.packet_ns3 import PacketModel
from topotrain.network.switching import (
    CUT_THROUGH,
    NS3_TCP_JUMBO,
    PacketFabric,
    framed_schedule,
    store_forward_phase_s,
    store_forward_phases_s,
    store_forward_s,
)
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.training.engine import CommSpec, Engine, TaskGraph
from topotrain.util.errors import ConfigError
from topotrain.validate.matrix import PARAMS, build_cases

MiB = 2**20

#: times (float.hex) given by the tree before the hook (commit 1a60920), on the default (cut-through) params; the
#: tree, halving-doubling and pair rows re-taken when an uneven buffer became equal fractional chunks (issue 40)
HEAD_HEX: dict[tuple[str, str], object] = {
    ('ring', 'analytical') : '0x1.712cd296c749bp-10' ,
    ('ring', 'flow') : '0x1.712cd296c749bp-10' ,
    ('ring', 'flow-async') : '0x1.712cd296c7493p-10' ,
    ('ring', 'flow-eager') : '0x1.712cd296c748dp-10' ,
    ('tree', 'analytical') : '0x1.7662599ea2eabp-8' ,
    ('tree', 'flow') : '0x1.7662599ea2eabp-8' ,
    ('tree', 'flow-async') : '0x1.69f2e06fb5172p-8' ,
    ('tree', 'flow-eager') : '0x1.6ce7c56492657p-8' ,
    ('halving-doubling', 'analytical') : '0x1.d087ba9fa7beap-16' ,
    ('halving-doubling', 'flow') : '0x1.d087ba9fa7beap-16' ,
    ('halving-doubling', 'flow-async') : '0x1.d087ba9fa7be4p-16' ,
    ('halving-doubling', 'flow-eager') : '0x1.d087ba9fa7be0p-16' ,
    ('pair', 'analytical') : ['0x1.46369d2c6a7bep-10', '0x1.cc38a39b90fdfp-10'] ,
    ('pair', 'flow') : ['0x1.50230a1c70820p-9', '0x1.40e98ec2448c9p-9'] ,
    ('pair', 'flow-async') : ['0x1.508f98c1d8952p-9', '0x1.3fa3d31001023p-9'] ,
}


def _cluster(servers: int = 2):  # type: ignore[no-untyped-def]
    return cluster_from_dict({"server": "pcie-shared-nic", "servers": servers,
                              "network": {"topology": "single-switch", "link": "eth-100g", "latency": "1us"}})


def _old_store_forward_s(schedule, topo, fabric) -> float:  # type: ignore[no-untyped-def]
    """The whole-schedule function as it was before the per-phase split (reference)."""
    if not fabric.store_and_forward:
        return 0.0
    cap, lat, total = topo.capacity_bytes_per_s, topo.latency_s, 0.0
    for ph in schedule.phases:
        sizes = schedule.transfer_bytes(ph)
        routes: list[tuple[list[int], int]] = []
        load = np.zeros(topo.num_links)
        for s, d, b in zip(ph.src.tolist(), ph.dst.tolist(), sizes.tolist(), strict=True):
            route = topo.route(schedule.ranks[s], schedule.ranks[d])
            if not route or b <= 0:
                continue
            links = list(route)
            load[links] += b
            routes.append((links, int(b)))
        groups: dict[int, list[tuple[float, float, float]]] = {}
        for links, b in routes:
            pkt = min(b, fabric.payload_bytes) + fabric.header_bytes
            ser = pkt / cap[links]
            lt = lat[links]
            k = int(np.argmax(load[links] / cap[links]))
            groups.setdefault(links[k], []).append((float(ser[:k].sum() + lt[:k].sum()),
                                                    float(ser[k + 1:].sum() + lt[k:].sum()), float(lt.sum())))
        fluid = packet = 0.0
        for b, members in groups.items():
            last = max(members)
            work = float(load[b] / cap[b])
            fluid = max(fluid, work + max(m[2] for m in members))
            packet = max(packet, work + min(m[0] for m in members) + last[1])
        total += packet - fluid
    return total


def test_the_per_phase_terms_sum_to_the_whole_schedules_term() -> None:
    cases = build_cases(quick=True)[0]
    assert cases
    for c in cases:
        s = c.schedule
        per = [store_forward_phase_s(s, ph, c.topo, NS3_TCP_JUMBO) for ph in s.phases]
        assert store_forward_s(s, c.topo, NS3_TCP_JUMBO) == _old_store_forward_s(s, c.topo, NS3_TCP_JUMBO)
        assert sum(per) == pytest.approx(_old_store_forward_s(s, c.topo, NS3_TCP_JUMBO), rel=1e-12, abs=1e-18)
        assert np.array_equal(store_forward_phases_s(s, c.topo, NS3_TCP_JUMBO), np.array(per))
        assert store_forward_s(s, c.topo, CUT_THROUGH) == 0.0


def test_the_hook_gives_what_the_wrapper_gave() -> None:
    """flow opened on ns-3's fabric == the framed schedule's time + the store-and-forward term (what the
    validation matrix's ``flow+pkt`` computed before the hook), on every quick case and a few more."""
    cases = build_cases(quick=True)[0] + build_cases(["fat-tree-k4", "single-switch"], ["ring", "tree"],
                                                     [64 * 2**10, MiB])[0]
    for name in ("flow", "analytical"):
        plain = get_model(name, PARAMS)
        hooked = get_model(name, replace(PARAMS, fabric=NS3_TCP_JUMBO))
        for c in cases:
            want = (plain.time_schedule(framed_schedule(c.schedule, NS3_TCP_JUMBO), c.topo).time_s
                    + store_forward_s(c.schedule, c.topo, NS3_TCP_JUMBO))
            assert hooked.time_schedule(c.schedule, c.topo).time_s == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("name", ["flow", "analytical"])
@pytest.mark.parametrize("alg", ["ring", "tree", "halving-doubling"])
def test_alone_equals_inside_on_a_store_and_forward_fabric(name: str, alg: str) -> None:
    """Timed alone, submitted to the shared network (one job, not alone), and as the one communication task
    of an engine run: the same time and phase finishes, and more than on the cut-through fabric."""
    c = _cluster(2)
    sched = build_schedule("allreduce", alg, c.topology, c.topology.gpus, 3 * MiB + 5)
    assert (store_forward_phases_s(sched, c.topology, NS3_TCP_JUMBO) >= 0).all()  # (a negative term waits 0)
    params = replace(c.network_params, fabric=NS3_TCP_JUMBO)
    model = get_model(name, params)
    alone = model.time_schedule(sched, c.topology)
    assert alone.time_s > get_model(name, c.network_params).time_schedule(sched, c.topology).time_s
    (job,) = run_concurrent([(sched, 2e-3)], c.topology, model)
    assert job.time_s == pytest.approx(alone.time_s, rel=1e-12)
    np.testing.assert_allclose(job.phase_finish_s - 2e-3, np.cumsum(alone.phase_times_s), rtol=1e-12)
    g = TaskGraph()
    g.add("allreduce", "dp-comm", "dp", comm=CommSpec("ar", (sched,)))
    assert Engine(c.topology, model).run(g) == pytest.approx(alone.time_s, rel=1e-12)


def test_two_jobs_on_a_store_and_forward_fabric_contend_and_finish() -> None:
    c = _cluster(2)
    gpus = c.topology.gpus
    a = build_schedule("allreduce", "ring", c.topology, gpus[0::2], 8 * MiB)
    b = build_schedule("allreduce", "tree", c.topology, gpus[1::2], 8 * MiB)
    model = get_model("flow", replace(c.network_params, fabric=NS3_TCP_JUMBO))
    jobs = run_concurrent([(a, 0.0), (b, 1e-4)], c.topology, model)
    cut = run_concurrent([(a, 0.0), (b, 1e-4)], c.topology, get_model("flow", c.network_params))
    for j, k in zip(jobs, cut, strict=True):
        assert j.finish_s > k.finish_s
        assert np.all(np.diff(j.phase_finish_s) >= 0)


def test_cut_through_is_bit_identical_to_before_the_hook() -> None:
    c = _cluster(2)
    gpus = c.topology.gpus
    equivalent = PacketFabric(payload_bytes=1500)  # no header, cut through: both terms zero
    for (what, name), want in HEAD_HEX.items():
        for params in (c.network_params, replace(c.network_params, fabric=CUT_THROUGH),
                       replace(c.network_params, fabric=equivalent)):
            model = get_model(name, params)
            if what == "pair":
                a = build_schedule("allreduce", "ring", c.topology, gpus[0::2], 8 * MiB)
                b = build_schedule("allreduce", "tree", c.topology, gpus[1::2], 8 * MiB)
                got = [j.finish_s.hex() for j in run_concurrent([(a, 0.0), (b, 1e-4)], c.topology, model)]
            else:
                size = {"ring": 8 * MiB, "tree": 25 * MiB, "halving-doubling": 3 * 2**10 + 7}[what]
                s = build_schedule("allreduce", what, c.topology, gpus, size)
                got = model.time_schedule(s, c.topology).time_s.hex()
            assert got == want, (what, name, params.fabric)


@pytest.mark.parametrize("name", ["flow-async", "flow-eager"])
def test_models_without_the_terms_refuse_a_packet_fabric(name: str) -> None:
    for fabric in (NS3_TCP_JUMBO, PacketFabric(header_bytes=54), PacketFabric(store_and_forward=True)):
        with pytest.raises(ConfigError) as e:
            get_model(name, NetworkParams(fabric=fabric))
        assert e.value.field == "network.fabric" and "network: flow" in str(e.value)
        assert "\n" not in str(e.value)
    get_model(name, NetworkParams(fabric=PacketFabric(payload_bytes=1500)))  # cut-through: accepted
    with pytest.raises(ConfigError, match="network.fabric"):
        PacketModel(NetworkParams(fabric=NS3_TCP_JUMBO))


def test_params_stay_a_hashable_value() -> None:
    p = NetworkParams(fabric=NS3_TCP_JUMBO)
    assert hash(p) == hash(NetworkParams(fabric=replace(NS3_TCP_JUMBO)))
    assert p != NetworkParams()
    assert NetworkParams() == NetworkParams(fabric=CUT_THROUGH)
    with pytest.raises(ConfigError, match="network.fabric"):
        NetworkParams(fabric="store-and-forward")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fabric.store_and_forward"):
        PacketFabric(store_and_forward=1)  # type: ignore[arg-type]


def test_a_scenario_declares_its_fabric() -> None:
    """``cluster.fabric`` reaches the cluster's NetworkParams; a fabric a model does not carry, or bytes that
    are not whole, are one ``error:`` line each."""
    from topotrain.scenario.load import scenario_from_dict

    base = {"cluster": {"server": "pcie-shared-nic", "servers": 2,
                        "network": {"topology": "single-switch", "link": "eth-100g", "latency": "1us"}},
            "model": "resnet50", "batch": 64}
    sc = scenario_from_dict(base)
    assert sc.cluster.network_params.fabric == CUT_THROUGH
    declared = {**base, "cluster": {**base["cluster"],
                                    "fabric": {"switching": "store-and-forward", "payload": "8948B", "header": "54B"}}}
    sc = scenario_from_dict(declared)
    assert sc.cluster.network_params.fabric == NS3_TCP_JUMBO
    with pytest.raises(ConfigError) as e:
        scenario_from_dict({**declared, "network": "flow-async"})
    assert "cluster.fabric" in str(e.value) and "network: flow" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"cluster\.fabric\.header: must be a whole number"):
        scenario_from_dict({**base, "cluster": {**base["cluster"], "fabric": {"header": "1.5B"}}})
