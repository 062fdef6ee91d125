"""Provisional schedules of the flow model: a schedule submitted onto idle links runs as timed alone until a
transfer of another schedule needs one of its links, then joins the network in the state it has reached. The
answers must be those of running every schedule phase by phase in the network (``provisional=False``)."""

from __future__ import annotations

import math
import random

import numpy as np
from tests.test_flow import ring_allreduce, transfers

from topotrain.collectives.schedule import Schedule
from topotrain.network import FlowModel
from topotrain.network.flow import FlowSim
from topotrain.network.params import NetworkParams
from topotrain.topology import Topology

GB = 1e9


def mixed_star(p: int) -> Topology:
    """p GPUs on one switch, links of unequal speed and latency, so that the transfers of one phase send their
    last bytes at different instants (a materialized phase has some done and some still sending)."""
    t = Topology("mixed-star")
    t.add_node("sw", "switch")
    for i in range(p):
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", "sw", (5 + 7 * (i % 3)) * GB, (1 + i % 4) * 1e-6)
    return t


Outcome = tuple[dict[str, float], dict[str, np.ndarray], np.ndarray, int]


def run_subs(sim: FlowSim, subs: list[tuple[float, Schedule, str, str]]) -> tuple[dict[str, float],
                                                                           dict[str, np.ndarray], np.ndarray]:
    """Submit ``(at_s, schedule, key, tag)`` in time order to an open simulator and run it to the end:
    (completion per tag, phase ends per tag, link bytes)."""
    done: dict[str, float] = {}
    for at_s, sched, key, tag in subs:
        for t, tg in sim.advance(at_s):
            done[str(tg)] = t
        sim.submit(sched, at_s, tag, key)
    while (t := sim.next_event_s()) < math.inf:
        for t_done, tg in sim.advance(t):
            done[str(tg)] = t_done
    phases = {tag: sim.timing(tag).phase_finish_s for _, _, _, tag in subs}
    return done, phases, sim.link_bytes()


def drive(model: FlowModel, topo: Topology, subs: list[tuple[float, Schedule, str, str]]) -> Outcome:
    """Submit ``(at_s, schedule, key, tag)`` in time order; (completion per tag, phase ends per tag, link
    bytes, provisional jobs materialized)."""
    sim = model.open(topo)
    done, phases, link_bytes = run_subs(sim, subs)
    return done, phases, link_bytes, getattr(sim, "materialized", 0)


def workload(seed: int, topo: Topology, n: int) -> list[tuple[float, Schedule, str, str]]:
    """Seeded submissions: rings on random GPU groups and single transfers of random sizes, at random times."""
    rng = random.Random(seed)
    gpus = [f"g{i}" for i in range(topo.num_gpus if hasattr(topo, "num_gpus") else 8)]
    subs = []
    t = 0.0
    for j in range(n):
        t += rng.choice([0.0, rng.uniform(0, 2e-4)])
        if rng.random() < 0.5:
            ranks = tuple(rng.sample(gpus, rng.choice([2, 3, 4])))
            size = rng.choice([1 << 16, 1 << 20, 3 << 20])
            subs.append((t, ring_allreduce(ranks, size), f"ring{ranks}{size}", f"j{j}"))
        else:
            a, b = rng.sample(range(len(gpus)), 2)
            c = rng.choice([x for x in range(len(gpus)) if x not in (a, b)])
            sched = transfers(tuple(gpus), [[(a, b, rng.choice([1 << 18, 1 << 21])), (c, b, 1 << 19)]])
            subs.append((t, sched, f"p2p{a}-{b}-{c}-{sched.size_bytes}", f"j{j}"))
    return subs


def test_provisional_matches_phase_by_phase() -> None:
    """Seeded mixes of rings and transfers on unequal links: every completion, phase end and link byte count
    within 1e-9 of the phase-by-phase answer, with provisional jobs joining the network mid-phase."""
    topo = mixed_star(8)
    params = NetworkParams(2e-6)
    materialized = 0
    for seed in range(6):
        subs = workload(seed, topo, 40)
        got, got_phases, got_bytes, mat = drive(FlowModel(params), topo, subs)
        want, want_phases, want_bytes, _ = drive(FlowModel(params, provisional=False), topo, subs)
        materialized += mat
        assert got.keys() == want.keys() == {tag for *_, tag in subs}
        for tag, t in want.items():
            assert math.isclose(got[tag], t, rel_tol=1e-9), (seed, tag, got[tag], t)
            np.testing.assert_allclose(got_phases[tag], want_phases[tag], rtol=1e-9)
        np.testing.assert_allclose(got_bytes, want_bytes, rtol=1e-9)
    assert materialized >= 5  # the mechanism was exercised, not only jobs alone from start to end


def test_provisional_alone_is_the_alone_time() -> None:
    """One ring alone: it never joins the network, and ends at its alone time."""
    topo = mixed_star(4)
    model = FlowModel(NetworkParams(2e-6))
    ring = ring_allreduce(("g0", "g1", "g2", "g3"), 1 << 20)
    done, _, _, mat = drive(model, topo, [(0.5, ring, "r", "a")])
    assert mat == 0
    assert math.isclose(done["a"], 0.5 + model.time_alone(ring, topo).time_s, rel_tol=1e-12)


def test_provisional_joins_mid_phase() -> None:
    """A transfer that starts halfway through a ring's first phase on one of its links: the ring joins the
    network and both end where phase-by-phase simulation puts them."""
    topo = mixed_star(4)
    params = NetworkParams(2e-6)
    ring = ring_allreduce(("g0", "g1", "g2", "g3"), 4 << 20)
    first = FlowModel(params).time_alone(ring, topo).phase_times_s[0]
    p2p = transfers(("g0", "g1", "g2", "g3"), [[(2, 1, 1 << 20)]])
    subs = [(0.0, ring, "ring", "ring"), (0.5 * first, p2p, "p2p", "p2p")]
    got, _, _, mat = drive(FlowModel(params), topo, subs)
    want, _, _, _ = drive(FlowModel(params, provisional=False), topo, subs)
    assert mat == 1
    for tag in ("ring", "p2p"):
        assert math.isclose(got[tag], want[tag], rel_tol=1e-12)


def long_latency_star() -> Topology:
    """Four GPUs on a switch; g0's link has 1 ms of latency, the others 1 µs: a transfer from g0 completes
    long after its last byte has left."""
    t = Topology("latency-star")
    t.add_node("sw", "switch")
    for i in range(4):
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", "sw", 10 * GB, 1e-3 if i == 0 else 1e-6)
    return t


def test_provisional_joins_with_transfers_in_flight() -> None:
    """Two-phase schedule: phase 1 sends g0→g1 (tiny, 1 ms in flight) and g2→g3 (1 MB, about 100 µs);
    phase 2 sends g1→g2. A transfer onto g3's link arrives (a) while g2→g3 sends and g0→g1 is in flight (the
    phase then ends at g0→g1's completion, after g2→g3's in the network), (b) when both have sent their last
    bytes but g0→g1 is still in flight, (c) during phase 2. Each as phase by phase."""
    topo = long_latency_star()
    params = NetworkParams(2e-6)
    gpus = ("g0", "g1", "g2", "g3")
    sched = transfers(gpus, [[(0, 1, 1000), (2, 3, 1 << 20)], [(1, 2, 1 << 20)]])
    phase1 = FlowModel(params).time_alone(sched, topo).phase_times_s[0]
    for at_s in (50e-6, 500e-6, phase1 + 30e-6):
        other = transfers(gpus, [[(1, 3, 1 << 16)], [(1, 2, 1 << 16)]])
        subs = [(0.0, sched, "s", "s"), (at_s, other, "o", "o")]
        got, got_phases, got_bytes, mat = drive(FlowModel(params), topo, subs)
        want, want_phases, want_bytes, _ = drive(FlowModel(params, provisional=False), topo, subs)
        assert mat == 1, at_s
        for tag in ("s", "o"):
            assert math.isclose(got[tag], want[tag], rel_tol=1e-12), (at_s, tag)
            np.testing.assert_allclose(got_phases[tag], want_phases[tag], rtol=1e-12)
        np.testing.assert_allclose(got_bytes, want_bytes, rtol=1e-12)


def test_provisional_matches_phase_by_phase_under_port_arbitration() -> None:
    """The same check with PCIe links shared per input port (the rates a provisional job re-runs alone with
    are the network's rule too)."""
    topo = Topology("pcie-star")
    topo.add_node("sw", "switch")
    for i in range(8):
        topo.add_node(f"g{i}", "gpu")
        topo.add_link(f"g{i}", "sw", (5 + 7 * (i % 3)) * GB, (1 + i % 4) * 1e-6, kind="pcie")
    params = NetworkParams(2e-6, arbitration="port")
    for seed in range(3):
        subs = workload(seed, topo, 25)
        got, got_phases, got_bytes, _ = drive(FlowModel(params), topo, subs)
        want, want_phases, want_bytes, _ = drive(FlowModel(params, provisional=False), topo, subs)
        for tag, t in want.items():
            assert math.isclose(got[tag], t, rel_tol=1e-9), (seed, tag, got[tag], t)
        np.testing.assert_allclose(got_bytes, want_bytes, rtol=1e-9)
