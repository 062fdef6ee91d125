"""The plan of a synthesized schedule (collectives/synth_plan.py) and the latency-aware bound (treepack.py).

* apportionment: Hamilton's method against its defining properties and exact integer rates;
* the step estimate: the closed form ``T(C)`` and the step-by-step sum against a brute-force loop over steps on
  random offset loads;
* equal lanes on the BiGraph example: every transfer of a step the same size, and the flow model's time within
  2% of the bandwidth bound (shares proportional to the rates took 1.21x there: fair sharing of unequal flows);
* synth keeps the candidate (trees or a built-in) of least estimate;
* the latency-aware bound: closed forms on a ring and a complete graph, and no schedule below it.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import topotrain as tt
from test_synth import graph  # the same GPU graphs as the synth tests
from topotrain.collectives import build_schedule, check_schedule
from topotrain.collectives.synth import estimate_s
from topotrain.collectives.synth_plan import MAX_LANES, TreeLoads, apportion, plan, steps_time_s
from topotrain.collectives.treepack import allreduce_latency_bound_s, allreduce_lower_bound_s
from topotrain.network.params import NetworkParams
from topotrain.network.registry import get_model
from topotrain.topology.graph import Topology

B = 25e9
ALPHA = NetworkParams().message_overhead_s
FLOW = get_model("flow", NetworkParams())
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("seed", range(5))
def test_apportion_is_hamiltons_method(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.1, 3.0, size=int(rng.integers(1, 12)))
    for n in (1, 5, 17, 64):
        out = apportion(n, rates)
        quota = n * rates / rates.sum()
        assert out.sum() == n and (out >= 0).all()
        assert (np.abs(out - quota) < 1.0).all()  # quota rule: floor or ceil of each quota
        # the extra seats go to the largest remainders
        extra = out - np.floor(quota)
        rem = quota - np.floor(quota)
        if 0 < extra.sum() < len(rates):
            assert rem[extra == 1].min() >= rem[extra == 0].max() - 1e-12
    ints = np.array([3, 1, 2, 2])
    assert apportion(8, ints.astype(float)).tolist() == ints.tolist()


def brute_steps(w: np.ndarray, c: int, size: float, alpha: float) -> float:
    """Step by step: step s loads link l with (size/C)·Σ_{o: s−C < o <= s} w[o, l]."""
    m = w.shape[0] - 1
    total = 0.0
    for s in range(c + m):
        load = np.zeros(w.shape[1])
        for o in range(m + 1):
            if o <= s < o + c:
                load += w[o]
        total += alpha + size / c * load.max()
    return total


@pytest.mark.parametrize("seed", range(4))
def test_step_estimate_against_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, n_links = int(rng.integers(1, 5)), int(rng.integers(2, 7))
    w = rng.uniform(0, 1e-9, size=(m + 1, n_links)) * (rng.random((m + 1, n_links)) < 0.7)
    w[:, 0] += 1e-12  # every offset loads a link
    for c in (1, 2, m, m + 1, m + 7, 40):
        assert steps_time_s(w, c, 1e8, 3e-6) == pytest.approx(brute_steps(w, c, 1e8, 3e-6), rel=1e-12)
    # plan() with C fixed: its closed form (C > m) and its step sum (C <= m) against the brute force, on a
    # TreeLoads of random trees, equal lanes apportioned as plan() does
    k = 3
    entries = [(int(rng.integers(k)), int(rng.integers(m + 1)), int(rng.integers(n_links))) for _ in range(30)]
    entries += [(t, 0, 0) for t in range(k)] + [(0, m, 1)]
    tree, off, col = (np.array(x, dtype=np.int64) for x in zip(*entries, strict=True))
    cap = rng.uniform(1e10, 5e10, size=n_links)
    loads = TreeLoads(tree, off, col, 1.0 / cap[col], np.arange(n_links), np.zeros(k),
                      np.array([int(off[tree == t].max()) + 1 for t in range(k)]), False)
    rates = rng.uniform(1.0, 2.0, size=k)
    size = 10**8
    for c in (1, m, m + 3, 50):
        pl = plan(loads, rates, size, 3e-6, 1, 10**9, 256, chunks=c)
        lanes = pl.lanes
        ww = np.zeros((m + 1, n_links))
        np.add.at(ww, (off, col), lanes[tree] / lanes.sum() / cap[col])
        mm = int(loads.num_offsets[lanes > 0].max()) - 1
        assert pl.estimate_s == pytest.approx(brute_steps(ww[:mm + 1], c, size, 3e-6), rel=1e-9)
        assert pl.num_lanes <= MAX_LANES


def bigraph_ranks() -> tuple[Topology, list[str]]:
    topo = tt.load_cluster(EXAMPLES / "eflops-bigraph.yaml").topology
    return topo, [gs[0] for gs in topo.servers().values()]


def test_equal_lanes_meet_the_bound_on_the_bigraph() -> None:
    topo, ranks = bigraph_ranks()
    size = 2**30
    s = build_schedule("allreduce", "synth", topo, ranks, size)
    check_schedule(s)
    assert s.meta["construction"] == "trees" and s.meta["equal_lanes"]
    assert s.meta["lanes"] >= s.meta["trees"]
    for ph in s.phases:
        b = s.transfer_bytes(ph)
        assert b.max() - b.min() <= 1  # every transfer of a step the same size (to a byte)
    lb = allreduce_lower_bound_s(topo, ranks, size).time_s
    t = FLOW.time_schedule(s, topo).time_s
    assert lb <= t <= 1.02 * lb
    assert t == pytest.approx(s.meta["plan_estimate_s"], rel=1e-3)  # what it planned with is what max-min gives


def test_synth_keeps_the_candidate_of_least_estimate() -> None:
    topo, ranks = bigraph_ranks()
    for size in (2**20, 2**26):
        s = build_schedule("allreduce", "synth", topo, ranks, size)
        est = s.meta["estimates_s"]
        assert set(est) >= {"ring", "halving-doubling", "trees"}
        assert s.meta["construction"] == min(est, key=lambda k: (est[k], k != s.meta["construction"]))
        assert estimate_s(s, topo, ALPHA) == pytest.approx(min(est.values()), rel=1e-9)
    # on a ring of GPUs the trees (both directions of every link) beat every built-in
    ring = graph("ring6", 6, [(i, (i + 1) % 6, B) for i in range(6)])
    s = build_schedule("allreduce", "synth", ring, ring.gpus, 2**26)
    assert s.meta["construction"] == "trees" and not s.meta["equal_lanes"]  # one link per transfer: exact shares


@pytest.mark.parametrize("p", [5, 8])
def test_latency_bound_on_a_ring(p: int) -> None:
    topo = graph(f"ring{p}", p, [(i, (i + 1) % p, B) for i in range(p)])
    size = 2**24
    lb = allreduce_latency_bound_s(topo, topo.gpus, size, ALPHA)
    assert lb.diameter == p // 2 and lb.phases == max(2, p // 2)
    assert lb.per_phase_s == pytest.approx(ALPHA + 1e-6)
    closed = max(2, p // 2) * (ALPHA + 1e-6) + 2 * (p - 1) / p * size / (2 * B)
    assert lb.time_s == pytest.approx(closed, rel=1e-12)
    for alg in ("ring", "synth"):  # GPUs do not forward: halving-doubling has no route on a ring
        t = FLOW.time_schedule(build_schedule("allreduce", alg, topo, topo.gpus, size), topo).time_s
        assert t >= lb.time_s * (1 - 1e-9)


def test_latency_bound_on_a_complete_graph() -> None:
    p = 4
    topo = graph("k4", p, [(i, j, B) for i in range(p) for j in range(i + 1, p)])
    per = ALPHA + 1e-6
    big = allreduce_latency_bound_s(topo, topo.gpus, 2**26, ALPHA)
    assert big.diameter == 1 and big.phases == 2
    assert big.time_s == pytest.approx(2 * per + 2 * 2**26 / (p * B), rel=1e-12)
    tiny = allreduce_latency_bound_s(topo, topo.gpus, 8, ALPHA)  # one full exchange: α + λ + (p−1)·S/((p−1)B)
    assert tiny.phases == 1 and tiny.time_s == pytest.approx(per + 8 / B, rel=1e-12)
    rng = random.Random(0)
    for size in (8, 4096, 2**26):
        lb = allreduce_latency_bound_s(topo, topo.gpus, size, ALPHA).time_s
        order = rng.sample(topo.gpus, p)
        for alg in ("ring", "synth", "halving-doubling", "tree"):
            t = FLOW.time_schedule(build_schedule("allreduce", alg, topo, order, size), topo).time_s
            assert t >= lb * (1 - 1e-9)


@pytest.mark.parametrize("p", [6, 8])
def test_step_lp_on_a_ring_is_the_bound_plus_one_step_per_hop(p: int) -> None:
    """On a ring of GPUs the step LP (synth_lp.py) weighs the paths (the ring less one edge) rooted at every rank
    so that the reduce-only and broadcast-only steps load every link as much as a steady step: with one chunk the
    allreduce takes the bandwidth bound plus ``2H = p`` steps of ``α + λ`` (``H = p/2`` the paths' height from
    their middle), where the centre-rooted pipeline pays for its fill."""
    topo = graph(f"ring{p}", p, [(i, (i + 1) % p, B) for i in range(p)])
    size = 2**26
    s = build_schedule("allreduce", "synth", topo, topo.gpus, size)
    check_schedule(s)
    assert s.meta["rooting"] == "step LP" and s.meta["chunks"] == 1
    lb = allreduce_lower_bound_s(topo, topo.gpus, size).time_s
    t = FLOW.time_schedule(s, topo).time_s
    assert t == pytest.approx(lb + p * (ALPHA + 1e-6), rel=1e-6)  # to the bytes rounded into shares
    assert t >= allreduce_latency_bound_s(topo, topo.gpus, size, ALPHA).time_s
