"""The packet-fabric terms (framing, store-and-forward pipeline) against hand-computed closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.network.flow import FlowModel
from topotrain.network.params import NetworkParams
from topotrain.network.switching import (
    CUT_THROUGH,
    NS3_TCP_JUMBO,
    PacketFabric,
    framed_bytes,
    framed_schedule,
    store_forward_s,
)
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.util.errors import ConfigError
from topotrain.validate.matrix import TOPOLOGIES, _p2p, traffic_schedule


def _dumbbell():  # type: ignore[no-untyped-def]
    return cluster_from_dict(TOPOLOGIES["dumbbell"][0]).topology


def test_framed_bytes_closed_form() -> None:
    f = PacketFabric(payload_bytes=1000, header_bytes=50)
    assert framed_bytes(np.array([0, 1, 1000, 1001, 5000]), f).tolist() == [0, 51, 1050, 1101, 5250]


def test_cut_through_changes_nothing() -> None:
    topo = _dumbbell()
    sched = traffic_schedule("halving-doubling", topo, 1 << 20)
    assert framed_schedule(sched, CUT_THROUGH) is sched
    assert store_forward_s(sched, topo, CUT_THROUGH) == 0.0


def test_framed_schedule_frames_each_transfer_once() -> None:
    """Halving-doubling transfers span many chunks: framing is per transfer (one message), so the framed
    schedule moves sum(b + ceil(b / payload) * header) and flow's time on it grows by no more than that."""
    topo = _dumbbell()
    sched = traffic_schedule("halving-doubling", topo, 1 << 20)
    framed = framed_schedule(sched, NS3_TCP_JUMBO)
    assert len(framed.phases) == len(sched.phases)
    want = sum(int(framed_bytes(sched.transfer_bytes(ph), NS3_TCP_JUMBO).sum()) for ph in sched.phases)
    assert framed.total_bytes() == want
    for a, b in zip(sched.phases, framed.phases, strict=True):
        assert a.src.tolist() == b.src.tolist() and a.dst.tolist() == b.dst.tolist()
    m = FlowModel(NetworkParams(0.0))
    t, tf = m.time_schedule(sched, topo).time_s, m.time_schedule(framed, topo).time_s
    assert t < tf <= t * framed.total_bytes() / sched.total_bytes() + 1e-12


def test_one_flow_pays_every_hop_but_the_bottleneck() -> None:
    """One transfer alone: sum_l pkt/C_l - pkt/min C_l with pkt = min(b, payload) + header."""
    topo = _dumbbell()
    g = topo.gpus
    route = list(topo.route(g[0], g[-1]))
    cap = topo.capacity_bytes_per_s[route]
    for size in (4096, 1 << 20):
        sched = _p2p(g, [0], [len(g) - 1], size, "one-flow")
        pkt = min(size, NS3_TCP_JUMBO.payload_bytes) + NS3_TCP_JUMBO.header_bytes
        want = float(np.sum(pkt / cap) - pkt / cap.min())
        assert store_forward_s(sched, topo, NS3_TCP_JUMBO) == pytest.approx(want, rel=1e-12)


def test_an_incast_pays_the_nearest_fill_and_keeps_its_port_busy() -> None:
    """Every sender of the dumbbell's incast shares the receiver's port: it is busy from the nearest
    sender's first packet (the GPU-PCIe-NIC-leaf hops of a host on the same leaf: serialization + latency)
    to the last packet's drain (port, NIC-PCIe-GPU), where flow charges the farthest sender's whole path
    latency after the last byte: the term is fill + drain + latency(near path) - latency(far path)."""
    topo = _dumbbell()
    g = topo.gpus
    sched = traffic_schedule("incast", topo, 1 << 20)
    pkt = NS3_TCP_JUMBO.payload_bytes + NS3_TCP_JUMBO.header_bytes
    near = list(topo.route(g[1], g[0]))  # GPU, PCIe, NIC, leaf -> the receiver's NIC, PCIe, GPU
    far = list(topo.route(g[-1], g[0]))  # through the spine
    cap, lat = topo.capacity_bytes_per_s, topo.latency_s
    port = next(i for i, lk in enumerate(near) if topo.links[lk].src.startswith("sw/"))
    fill = sum(pkt / cap[lk] for lk in near[:port])
    drain = sum(pkt / cap[lk] for lk in near[port + 1:])
    want = fill + drain + float(lat[near].sum() - lat[far].sum())
    assert store_forward_s(sched, topo, NS3_TCP_JUMBO) == pytest.approx(want, rel=1e-12)
    assert want < fill + drain


def test_a_phase_adds_the_term_of_the_group_that_ends_last() -> None:
    """The torus ring's phase: two transfers share one router link (twice the work) and pay their group's
    term; the others, alone on their paths, finish earlier, so their (larger) fill + drain is not added."""
    topo = cluster_from_dict(TOPOLOGIES["torus-2d"][0]).topology
    sched = traffic_schedule("ring", topo, 1 << 20)
    one_phase = store_forward_s(sched, topo, NS3_TCP_JUMBO) / len(sched.phases)
    pkt = NS3_TCP_JUMBO.payload_bytes + NS3_TCP_JUMBO.header_bytes
    g = topo.gpus
    alone = list(topo.route(g[0], g[1]))
    cap = topo.capacity_bytes_per_s[alone]
    assert one_phase < float(np.sum(pkt / cap) - pkt / cap.min())
    assert one_phase > 0


@pytest.mark.parametrize("kw,field", [({"payload_bytes": 0}, "fabric.payload_bytes"),
                                      ({"header_bytes": -1}, "fabric.header_bytes"),
                                      ({"payload_bytes": 1.5}, "fabric.payload_bytes")])
def test_bad_fabric_names_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        PacketFabric(**kw)  # type: ignore[arg-type]
    assert e.value.field == field
