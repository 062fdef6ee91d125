"""The packet-level (ns-3) network model behind the NetworkSim interface, its limits and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.network import packet_ns3
from topotrain.network.base import run_sim
from topotrain.network.packet_ns3 import (
    MAX_PACKET_GPUS,
    PacketConfig,
    PacketModel,
    check_packet_size,
    ns3_available,
    simulate_packet,
)
from topotrain.network.params import NetworkParams
from topotrain.network.registry import get_model, model_names
from topotrain.network.switching import NS3_TCP_JUMBO
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.util.errors import ConfigError
from topotrain.validate.matrix import PARAMS, TOPOLOGIES, _p2p, flow_on_fabric_s, traffic_schedule

needs_ns3 = pytest.mark.skipif(not ns3_available(), reason="ns-3 absent (pip install ns3)")


def test_packet_is_an_optional_registered_model() -> None:
    assert "packet" in model_names()


def test_missing_ns3_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packet_ns3, "ns3_available", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install ns3") as e:
        get_model("packet")
    assert e.value.field == "network"


def test_refuses_clusters_beyond_its_size() -> None:
    n = MAX_PACKET_GPUS + 8
    topo = cluster_from_dict({"server": "single-gpu", "servers": n,
                              "network": {"topology": "single-switch", "link": "eth-100g"}}).topology
    with pytest.raises(ConfigError, match=rf"at most {MAX_PACKET_GPUS} GPUs, this cluster has {n}"):
        check_packet_size(topo)


@needs_ns3
def test_two_flows_share_the_dumbbell_bottleneck_as_tcp() -> None:
    """Two 16 MiB flows across the dumbbell's one 100 Gb/s path, submitted at 0 and at 0.5 ms through the
    NetworkSim interface (both submitted, then run: one ns-3 run): every byte crosses the bottleneck, so the
    last one ends no earlier than 32 MiB / 12.5 GB/s after the first start (the fluid answer, 2.68 ms) and,
    TCP filling the link, at most 5% later; the first flow, alone for 0.5 ms, ends first."""
    topo = cluster_from_dict(TOPOLOGIES["dumbbell"][0]).topology
    g = topo.gpus
    size = 16 << 20
    a = _p2p(g, [0], [4], size, "one-flow")
    b = _p2p(g, [1], [5], size, "one-flow")
    params = NetworkParams(0.0)
    model = get_model("packet", params)
    assert isinstance(model, PacketModel) and model.contends
    sim = model.open(topo)
    sim.submit(a, 0.0, "a")
    sim.submit(b, 5e-4, "b")
    done = run_sim(sim)
    assert [tag for _, tag in done] == ["a", "b"]
    ta, tb = sim.timing("a"), sim.timing("b")
    cap = float(np.min(topo.capacity_bytes_per_s[list(topo.route(g[0], g[4]))]))
    fluid = 2 * size / cap
    last = max(ta.finish_s, tb.finish_s)
    assert fluid <= last <= 1.05 * fluid
    assert ta.finish_s < tb.finish_s
    assert tb.start_s == 5e-4 and ta.phase_finish_s.shape == (1,)


@needs_ns3
def test_lossless_mode_is_the_packet_pipeline_and_tcp_loses_packets() -> None:
    """On the dumbbell: one 64 KiB flow (65,536 bytes, one more than the 65,535-byte window of an unscaled
    SYN; connections carry a byte in the warm-up so no phase waits for the scaled window) and an incast of
    seven 1 MiB flows. The lossless mode equals flow on ns-3's fabric (framing + store-and-forward) within
    1% and drops nothing; TCP with 100-packet ports drops packets at the incast's port and the drop counter
    (the traffic-control layer's, where a full port drops) sees them."""
    from topotrain.network.flow import FlowModel

    topo = cluster_from_dict(TOPOLOGIES["dumbbell"][0]).topology
    one = _p2p(topo.gpus, [0], [len(topo.gpus) - 1], 1 << 16, "one-flow")
    incast = traffic_schedule("incast", topo, 1 << 20)
    jobs = [(topo, [(one, 0.0)]), (topo, [(incast, 0.0)])]
    lossless = simulate_packet(jobs, PARAMS, PacketConfig.lossless())
    tcp = simulate_packet(jobs[1:], PARAMS, PacketConfig())
    flow = FlowModel(PARAMS)
    for sched, run in zip((one, incast), lossless, strict=True):
        want = flow_on_fabric_s(flow, sched, topo, NS3_TCP_JUMBO)
        assert run.results[0].time_s == pytest.approx(want, rel=0.01)
        assert run.drops == 0
    assert tcp[0].drops > 0
