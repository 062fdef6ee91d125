"""plan.sync: ps | gossip — closed-form checks of the transfers and their times, Poseidon's rule, wait-free
backprop and staleness, and bad input (training/sync.py, training/sync_tasks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from topotrain.network.params import NetworkParams
from topotrain.network.registry import get_model
from topotrain.scenario.load import scenario_from_dict
from topotrain.topology.graph import Topology
from topotrain.training.simulate import simulate
from topotrain.training.sync import (
    GossipOptions,
    adpsgd_pairs,
    dpsgd_schedule,
    gossip_edges,
    ps_costs_values,
    ps_schedule,
    sfb_preferred,
    stale_period,
)
from topotrain.training.sync_tasks import bytes_sent_per_node
from topotrain.util.errors import ConfigError

BW = 5e9  # 40 Gb/s in bytes/s


def _star(workers: int, host: bool = True) -> Topology:
    t = Topology("star")
    t.add_node("sw", "switch")
    for i in range(workers):
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", "sw", BW, 1e-6)
    if host:
        t.add_node("ps0", "cpu")
        t.add_link("ps0", "sw", BW, 1e-6)
    return t.freeze()


def _graph(tmp_path: Path, n: int = 4) -> str:
    nodes = "".join(f"  - {{name: g{i}, kind: gpu}}\n" for i in range(n))
    links = "".join(f"  - {{a: g{i}, b: sw, bandwidth: 40Gbps, latency: 1us}}\n" for i in range(n))
    p = tmp_path / "g.yaml"
    p.write_text(f"nodes:\n{nodes}  - {{name: ps0, kind: cpu}}\n  - {{name: sw, kind: switch}}\n"
                 f"links:\n{links}  - {{a: ps0, b: sw, bandwidth: 40Gbps, latency: 1us}}\n")
    return str(p)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ps_push_to_one_shard_is_incast(n: int) -> None:
    """One dedicated shard, n workers pushing B bytes each over a star: the shard's link carries n·B, so the
    push takes n·B/bw (and the pull as long again)."""
    size = 64 * 2**20
    topo = _star(n)
    sched = ps_schedule([f"g{i}" for i in range(n)], ["ps0"], size)
    net = get_model("flow", NetworkParams(message_overhead_s=0.0))
    push_only = type(sched)(sched.op, sched.algorithm, sched.ranks, sched.size_bytes, sched.chunk_bytes,
                            sched.chunk_src, sched.chunk_dst, sched.phases[:1])
    t_push = net.time_schedule(push_only, topo).time_s
    assert t_push == pytest.approx(n * size / BW, rel=0.01)
    assert net.time_schedule(sched, topo).time_s == pytest.approx(2 * n * size / BW, rel=0.01)


def test_ps_colocated_shards_move_nothing_locally() -> None:
    workers = [f"g{i}" for i in range(4)]
    s = ps_schedule(workers, workers, 4000)
    # each worker pushes 3 slices of 1000 B and, as a shard, sends its slice to 3 workers
    assert s.bytes_sent_per_rank().tolist() == [6000] * 4


def test_gossip_ring_moves_two_models_per_worker(tmp_path: Path) -> None:
    """D-PSGD on a ring: every worker sends its whole model to both neighbours, 2·model bytes."""
    sc = scenario_from_dict({"cluster": {"graph": _graph(tmp_path), "gpu": "p100"}, "model": "resnet50",
                             "batch": 128, "comm": {"library": "ideal"}, "plan": {"sync": "gossip"}})
    r = simulate(sc)
    model_bytes = sc.model.param_count * 2
    sent = bytes_sent_per_node(r.tasks)
    assert sorted(sent) == ["g0", "g1", "g2", "g3"]
    assert all(v == pytest.approx(2 * model_bytes, rel=1e-6) for v in sent.values())


def test_gossip_graphs() -> None:
    assert gossip_edges(4, GossipOptions()) == [(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (2, 3), (3, 0), (3, 2)]
    exp = gossip_edges(8, GossipOptions(graph="exponential"))
    assert {b for a, b in exp if a == 0} == {1, 2, 4} and len(exp) == 24
    torus = gossip_edges(16, GossipOptions(graph="torus"))
    assert {b for a, b in torus if a == 5} == {1, 4, 6, 9}
    s = dpsgd_schedule([f"g{i}" for i in range(8)], exp, 1000)
    assert s.bytes_sent_per_rank().tolist() == [3000] * 8  # log2(8) out-neighbours
    pairs = adpsgd_pairs(8, gossip_edges(8, GossipOptions()), seed=3)
    assert [a for a, _ in pairs] == [0, 2, 4, 6] and all(b % 2 for _, b in pairs)
    assert pairs == adpsgd_pairs(8, gossip_edges(8, GossipOptions()), seed=3)  # seeded


def test_poseidon_rule() -> None:
    """Poseidon Table 1: VGG's 25088×4096 fc6 at batch 32 on 8 workers goes by SFB; a transformer's
    768×3072 layer with 1024 tokens × 8 samples per worker goes through the PS."""
    ps, sfb = ps_costs_values(25088, 4096, 32, 8, 8, colocated=True)
    assert ps == pytest.approx(2 * 25088 * 4096 * 14 / 8) and sfb == pytest.approx(2 * 32 * 7 * (25088 + 4096))
    assert sfb_preferred(25088, 4096, 32, 8, 8, colocated=True)
    assert not sfb_preferred(768, 3072, 1024 * 8, 8, 8, colocated=True)
    assert not sfb_preferred(25088, 4096, 32, 1, 1, colocated=True)


def _vgg(plan: dict[str, Any], servers: int = 16, classes: int = 1000) -> Any:
    cl = {"server": "single-gpu", "servers": servers, "gpu": "p100", "nic": "eth-40g",
          "network": {"topology": "single-switch", "link": "eth-40g"}}
    return simulate(scenario_from_dict({"cluster": cl, "model": {"name": "vgg16", "num_classes": classes},
                                        "batch": 32 * servers, "plan": {"dtype": "fp32", **plan}}))


def test_wait_free_and_sfb_beat_plain_ps() -> None:
    """Poseidon's ordering on VGG-16 with 22K classes over 40GbE (its VGG19-22K): plain PS, then wait-free
    backprop, then WFBP with SFB for the FC layers; Poseidon's traffic per node a fraction of the PS's."""
    plain = _vgg({"sync": "ps", "ps": {"wait_free": False, "sfb": False}}, classes=21841)
    wfbp = _vgg({"sync": "ps", "ps": {"sfb": False}}, classes=21841)
    poseidon = _vgg({"sync": "ps"}, classes=21841)
    assert poseidon.iteration_time_s <= wfbp.iteration_time_s < plain.iteration_time_s
    assert max(bytes_sent_per_node(poseidon.tasks).values()) < max(bytes_sent_per_node(wfbp.tasks).values()) / 3
    assert poseidon.iteration_time_s >= poseidon.breakdown.compute_s


def test_staleness_bounds() -> None:
    assert stale_period(10.0, 4.0, 3.0, 0) == 10.0
    assert stale_period(10.0, 4.0, 3.0, 1) == 5.0
    assert stale_period(10.0, 4.0, 3.0, 9) == 4.0
    sync = _vgg({"sync": "ps", "ps": {"wait_free": False, "sfb": False}})
    stale = _vgg({"sync": "ps", "ps": {"wait_free": False, "sfb": False, "staleness": 3}})
    assert sync.breakdown.compute_s <= stale.iteration_time_s < sync.iteration_time_s


@pytest.mark.parametrize(("plan", "field"), [
    ({"sync": "ps", "ps": {"placement": "dedicated"}}, "plan.ps.hosts"),
    ({"sync": "ps", "ps": {"placement": "dedicated", "hosts": []}}, "plan.ps.hosts"),
    ({"sync": "ps", "ps": {"placement": "dedicated", "hosts": ["nope"]}}, "plan.ps.hosts[0]"),
    ({"sync": "ps", "ps": {"placement": "dedicated", "hosts": ["g1"]}}, "plan.ps.hosts[0]"),
    ({"sync": "gossip", "gossip": {"graph": "edges", "edges": [[0, 1], [2, 3]]}}, "plan.gossip.edges"),
    ({"sync": "gossip", "gossip": {"graph": "torus", "torus": [3, 2]}}, "plan.gossip.torus"),
    ({"sync": "ps", "ps": {"shard": 2}}, "plan.ps.shard"),
    ({"sync": "gossip", "gossip": {"graph": "ring", "fanout": 2}}, "plan.gossip.fanout"),
    ({"gossip": {"graph": "ring"}}, "plan.gossip"),
    ({"sync": "gossip", "pp": 2}, "plan.sync"),
])
def test_bad_input_names_the_field(tmp_path: Path, plan: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        simulate(scenario_from_dict({"cluster": {"graph": _graph(tmp_path), "gpu": "p100"}, "model": "gpt2",
                                     "batch": 8, "plan": plan}))
    line = str(e.value)
    assert line.startswith(field + ":") and "\n" not in line


def test_dedicated_host_takes_the_incast(tmp_path: Path) -> None:
    r = simulate(scenario_from_dict({"cluster": {"graph": _graph(tmp_path), "gpu": "p100"}, "model": "resnet50",
                                     "batch": 128, "plan": {"sync": "ps", "ps": {"placement": "dedicated",
                                                                                 "hosts": ["ps0"]}}}))
    assert {r.link_utilization_top[0][0], r.link_utilization_top[0][1]} == {"sw", "ps0"}


def test_default_sync_is_allreduce() -> None:
    r = _vgg({}, servers=2)
    assert r.plan.sync == "allreduce" and any(t.name.startswith("allreduce grads") for t in r.tasks)
