"""A provisional schedule joining the flow network reads its phase's state alone at the join from the phase's
alone run, recorded once (network/flow_join.py: AloneTrace), instead of re-running the phase in a network of its
own. The two must give the same bits: the flows still sending, their bytes left, the latest completion so far, at
any instant (at a departure, a float either side of one, between, after the last), and whole simulations must
agree exactly with the re-run path."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from tests.test_flow import transfers
from tests.test_flow_provisional import mixed_star, run_subs, workload

from topotrain.network import FlowModel
from topotrain.network.flow import FlowSim
from topotrain.network.flow_join import alone_state_rerun, record_alone
from topotrain.network.params import NetworkParams
from topotrain.topology import Topology

OVERHEAD_S = 2e-6


def phase(topo: Topology, rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR paths and sizes of ``n`` seeded transfers between distinct GPUs of ``topo`` (unequal links: they share
    destinations and leave one by one; some sizes equal, so that several leave at one instant)."""
    gpus = [f"g{i}" for i in range(8)]
    paths, sizes = [], []
    for _ in range(n):
        a, b = rng.sample(gpus, 2)
        paths.append(np.asarray(topo.route(a, b), dtype=np.int64))
        sizes.append(float(rng.choice([1 << 16, 1 << 20, 3 << 20, rng.randrange(1, 5 << 20)])))
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([p.shape[0] for p in paths], out=off[1:])
    return off, np.concatenate(paths), np.array(sizes)


def instants(times_s: np.ndarray, rng: random.Random) -> list[float]:
    """Every record's instant, the floats either side of it, midpoints, seeded draws, and past the last."""
    out: list[float] = []
    for t in times_s.tolist():
        out += [t, float(np.nextafter(t, np.inf)), float(np.nextafter(t, -np.inf))]
    out += [(a + b) / 2 for a, b in zip(times_s[:-1].tolist(), times_s[1:].tolist(), strict=True)]
    last = float(times_s[-1])
    out += [rng.uniform(0.0, last) for _ in range(12)] + [last * 1.5, last + 1.0]
    return [t for t in out if t > 0.0]


@pytest.mark.parametrize("kernel", ["python", "numba", "numpy"])
def test_trace_matches_rerun_bit_for_bit(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded phases on unequal links, each kernel path (interpreted, compiled, numpy): at every instant tried, the
    trace's answer is the re-run's, the same bits (ids in the same order, bytes left, floor)."""
    monkeypatch.setenv("TOPOTRAIN_KERNEL", kernel)
    topo = mixed_star(8)
    rng = random.Random(7)
    departures = 0
    for _ in range(10):
        off, links, sizes = phase(topo, rng, rng.choice([2, 5, 9, 16]))
        trace = record_alone(topo, OVERHEAD_S, "flow", off, links, sizes)
        assert trace is not None
        departures += trace.times_s.shape[0] - 1
        for tau in instants(trace.times_s, rng):
            got = trace.at(tau)
            want = alone_state_rerun(topo, OVERHEAD_S, "flow", off, links, sizes, tau)
            assert got[0].tolist() == want[0].tolist(), tau
            assert got[1].tobytes() == want[1].tobytes(), tau
            assert got[2] == want[2] or (math.isinf(got[2]) and math.isinf(want[2])), tau
    assert departures > 40  # flows left at many instants, not all at one


def test_trace_too_large_is_not_recorded() -> None:
    """A phase whose trace would hold more than ``max_values`` values is not recorded (it is re-run at each join)."""
    topo = mixed_star(8)
    off, links, sizes = phase(topo, random.Random(3), 16)
    assert record_alone(topo, OVERHEAD_S, "flow", off, links, sizes, max_values=16) is None
    assert record_alone(topo, OVERHEAD_S, "flow", off, links, sizes) is not None


def drive(topo: Topology, subs: list, join_traces: bool) -> tuple[dict[str, float], dict[str, bytes], bytes, FlowSim]:
    """The submissions run in one FlowSim, joins read from traces or re-run: (completion per tag, phase ends per
    tag as bytes, link bytes as bytes, the simulator)."""
    sim = FlowModel(NetworkParams(OVERHEAD_S)).open(topo)
    sim.join_traces = join_traces
    done, phases, link_bytes = run_subs(sim, subs)
    return done, {tag: ends.tobytes() for tag, ends in phases.items()}, link_bytes.tobytes(), sim


def rounds(seed: int, topo: Topology, n: int) -> list:
    """Seeded rounds, each on an idle network: one of four two-phase schedules (transfers of unequal sizes into
    shared destinations: they leave one by one), submitted again and again under its key, and at a random instant
    of its alone run a transfer into one of its destinations (it joins the network there, mid-phase mostly)."""
    rng = random.Random(seed)
    gpus = tuple(f"g{i}" for i in range(8))
    model = FlowModel(NetworkParams(OVERHEAD_S))
    shapes = [transfers(gpus, [[(0, 1, 3 << 20), (2, 1, 1 << 20), (3, 4, 2 << 20)],
                               [(1, 5, 1 << 20), (6, 5, 5 << 19)]]),
              transfers(gpus, [[(4, 7, 1 << 21), (5, 7, 1 << 19), (6, 7, 3 << 19)], [(7, 0, 1 << 20)]]),
              transfers(gpus, [[(0, 2, 1 << 20), (1, 2, 1 << 20), (3, 2, 3 << 20), (4, 5, 1 << 18)],
                               [(2, 6, 1 << 20), (3, 6, 1 << 19)]]),
              # the first one's sizes on other pairs: the same phases but for their paths
              transfers(gpus, [[(4, 5, 3 << 20), (6, 5, 1 << 20), (7, 0, 2 << 20)],
                               [(5, 1, 1 << 20), (2, 1, 5 << 19)]])]
    into = [(1, 5), (7, 0), (2, 6), (5, 1)]
    alone = [model.time_alone(s, topo).time_s for s in shapes]
    subs = []
    t = 0.0
    for j in range(n):
        k = rng.randrange(len(shapes))
        subs.append((t, shapes[k], f"shape{k}", f"s{j}"))
        dst = rng.choice(into[k])
        src = rng.choice([g for g in range(8) if g != dst])
        at = t + rng.uniform(0.0, 1.05) * alone[k]
        subs.append((at, transfers(gpus, [[(src, dst, 1 << 19)]]), f"x{src}-{dst}", f"x{j}"))
        t = at + 4 * max(alone)
    return subs


def test_joins_from_traces_equal_reruns() -> None:
    """Seeded rounds whose provisional schedules join mid-phase, and the mixes of test_flow_provisional: every
    completion, phase end and link byte count is the same float with joins read from traces as with the phase
    re-run at each join."""
    topo = mixed_star(8)
    joins = traced = 0
    for seed in range(8):
        subs = rounds(seed, topo, 30) if seed < 4 else workload(seed, topo, 40)
        got_done, got_phases, got_bytes, sim = drive(topo, subs, True)
        want_done, want_phases, want_bytes, _ = drive(topo, subs, False)
        assert got_done == want_done
        assert got_phases == want_phases
        assert got_bytes == want_bytes
        joins += sim.materialized
        traced += sum(t is not None for t in sim._traces.values())
    assert joins > 80 and traced > 0  # joins happened, and were read from traces
