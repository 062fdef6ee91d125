"""Properties of the flow model on random topologies and random traffic (hypothesis).

Random connected networks (a random tree of switches plus extra switch-to-switch links of random
capacity, GPUs as leaves) carry random transfers of random sizes starting at random times. At every
event no link carries more than its capacity and the rates are the max-min fair ones (recomputed from
scratch, flow by flow); bytes are conserved per link; every flow completes, never before its alpha-beta
time alone; the analytical model is a lower bound; the same input gives the same floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from topotrain.collectives.paths import PathCache
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.network import AnalyticalModel, FlowModel, FlowNetwork, max_min_rates, run_concurrent
from topotrain.network.params import NetworkParams
from topotrain.topology import Topology

GB = 1e9
CAPS = [1 * GB, 2.5 * GB, 10 * GB, 25 * GB]
LATS = [0.0, 5e-7, 2e-6]


@dataclass(frozen=True)
class Case:
    parents: tuple[int, ...]  # switch i+1 hangs below switch parents[i]
    extra: tuple[tuple[int, int, int, int], ...]  # (switch a, switch b, cap idx, lat idx)
    tree_links: tuple[tuple[int, int], ...]  # (cap idx, lat idx) of each tree link
    gpus: tuple[tuple[int, int, int], ...]  # (switch, cap idx, lat idx)
    flows: tuple[tuple[int, int, int, float], ...]  # (src gpu, dst gpu, bytes, start offset s)
    overhead_s: float
    zero_latency: bool

    def topology(self) -> Topology:
        t = Topology("random")
        n_sw = len(self.parents) + 1
        for i in range(n_sw):
            t.add_node(f"sw{i}", "switch")

        def lat(i: int) -> float:
            return 0.0 if self.zero_latency else LATS[i]

        for i, (p, (c, la)) in enumerate(zip(self.parents, self.tree_links, strict=True)):
            t.add_link(f"sw{p}", f"sw{i + 1}", CAPS[c], lat(la))
        seen = {(min(p, i + 1), max(p, i + 1)) for i, p in enumerate(self.parents)}
        for a, b, c, la in self.extra:
            key = (min(a, b), max(a, b))
            if a != b and key not in seen:
                seen.add(key)
                t.add_link(f"sw{a}", f"sw{b}", CAPS[c], lat(la))
        for g, (sw, c, la) in enumerate(self.gpus):
            t.add_node(f"g{g}", "gpu")
            t.add_link(f"g{g}", f"sw{sw}", CAPS[c], lat(la))
        return t


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_sw = draw(st.integers(1, 5))
    parents = tuple(draw(st.integers(0, i)) for i in range(n_sw - 1))
    idx = st.tuples(st.integers(0, len(CAPS) - 1), st.integers(0, len(LATS) - 1))
    tree_links = tuple(draw(idx) for _ in parents)
    extra = tuple(draw(st.lists(st.tuples(st.integers(0, n_sw - 1), st.integers(0, n_sw - 1),
                                          st.integers(0, len(CAPS) - 1), st.integers(0, len(LATS) - 1)),
                                max_size=4)))
    n_gpu = draw(st.integers(2, 7))
    gpus = tuple((draw(st.integers(0, n_sw - 1)), *draw(idx)) for _ in range(n_gpu))
    flow = st.tuples(st.integers(0, n_gpu - 1), st.integers(0, n_gpu - 1),
                     st.one_of(st.just(0), st.integers(1, 50_000_000)),
                     st.sampled_from([0.0, 0.0, 1e-5, 3e-4, 1e-3]))
    flows = tuple(draw(st.lists(flow, min_size=1, max_size=14)))
    return Case(parents, extra, tree_links, gpus, flows, draw(st.sampled_from([0.0, 2e-6])),
                draw(st.booleans()))


def check_rates(net: FlowNetwork, paths: dict[int, tuple[int, ...]], cap: np.ndarray) -> None:
    """Link loads within capacity; rates equal to max-min recomputed flow by flow (no grouping)."""
    load = net.link_rates()
    assert np.all(load <= cap * (1 + 1e-9))
    ids, rates = net.active_rates()
    if ids.size == 0:
        return
    ef = np.concatenate([np.full(len(paths[int(f)]), k) for k, f in enumerate(ids)])
    el = np.concatenate([np.array(paths[int(f)], dtype=np.int64) for f in ids])
    fresh = max_min_rates(ef, el, ids.size, cap)
    np.testing.assert_allclose(rates, fresh, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_flow_network_invariants(case: Case) -> None:
    topo = case.topology()
    cap = topo.capacity_bytes_per_s
    lat = topo.latency_s
    gpus = topo.gpus
    net = FlowNetwork(topo, overhead_s=case.overhead_s)
    if case.zero_latency:
        net._compact_min = 0  # exercise the compaction of idle path groups' entries at every chance
    order = sorted(range(len(case.flows)), key=lambda i: (case.flows[i][3], i))
    paths: dict[int, tuple[int, ...]] = {}
    start_of: dict[int, float] = {}
    completed: dict[int, float] = {}
    pos = 0
    while True:
        t_start = case.flows[order[pos]][3] if pos < len(order) else math.inf
        t_net = net.next_event_s()
        t = min(t_start, t_net)
        if t == math.inf:
            break
        for t_done, tag in net.advance(t):
            assert isinstance(tag, int) and tag not in completed and t_done <= t
            completed[tag] = t_done
        while pos < len(order) and case.flows[order[pos]][3] <= t:
            i = order[pos]
            s, d, n, t0 = case.flows[i]
            path = topo.route(gpus[s], gpus[d])
            fid = net.start(path, float(n), t0, i)
            paths[fid] = path
            start_of[i] = t0
            pos += 1
        check_rates(net, paths, cap)
    assert sorted(completed) == list(range(len(case.flows)))  # every flow completes, once
    # bytes conserved on every link
    expect = np.zeros(topo.num_links)
    for i, (s, d, n, _) in enumerate(case.flows):
        expect[list(topo.route(gpus[s], gpus[d]))] += n
        path = topo.route(gpus[s], gpus[d])
        # never faster than alone: alpha + latency + size / bottleneck capacity (a self-copy is free)
        if path:
            alone = case.overhead_s + float(lat[list(path)].sum()) + n / float(cap[list(path)].min())
            assert completed[i] - start_of[i] >= alone * (1 - 1e-12) - 1e-12 * completed[i]  # clock rounding
        else:
            assert completed[i] == start_of[i]
    np.testing.assert_allclose(net.link_bytes(), expect, rtol=1e-9, atol=1e-6)


def schedule_of(case: Case, topo: Topology) -> Schedule:
    """Flows in two phases (split by their start offset: 0 → phase 0, later → phase 1)."""
    flows = list(case.flows)
    groups = [[f for f in flows if f[3] == 0.0], [f for f in flows if f[3] != 0.0]]
    groups = [g for g in groups if g]
    phases = []
    c = 0
    for g in groups:
        lo = np.arange(c, c + len(g))
        phases.append(Phase.of([f[0] for f in g], [f[1] for f in g], lo, lo + 1, False))
        c += len(g)
    chunks = np.array([f[2] for g in groups for f in g], dtype=np.int64)
    m = len(chunks)
    return Schedule(CollectiveOp.ALLTOALL, "random", tuple(topo.gpus), int(chunks.sum()), chunks,
                    np.full(m, -1), np.full(m, -1), tuple(phases))


@settings(max_examples=60, deadline=None)
@given(cases())
def test_flow_model_bounds_and_determinism(case: Case) -> None:
    topo = case.topology()
    sched = schedule_of(case, topo)
    params = NetworkParams(case.overhead_s)
    flow = FlowModel(params).time_schedule(sched, topo)
    ana = AnalyticalModel(params).time_schedule(sched, topo)
    np.testing.assert_allclose(flow.link_bytes, ana.link_bytes, rtol=1e-12)
    cap = topo.capacity_bytes_per_s
    cache = PathCache(topo, sched.ranks)
    for k, phase in enumerate(sched.phases):
        pp = cache.resolve(sched, phase)
        if case.zero_latency:
            # every link must drain its bytes: the analytical time is a lower bound
            assert flow.phase_times_s[k] >= ana.phase_times_s[k] * (1 - 1e-12)
        # with latencies: the last byte over link l leaves no earlier than B_l / C_l, and then still
        # has the shortest latency among the transfers crossing l to go
        entry_t = pp.entry_transfer()
        link_bytes = np.bincount(pp.links, weights=pp.bytes[entry_t], minlength=topo.num_links)
        for lid in np.unique(pp.links):
            on = np.unique(entry_t[pp.links == lid])
            bound = link_bytes[lid] / cap[lid] + case.overhead_s + float(pp.latency_s[on].min())
            assert flow.phase_times_s[k] >= bound * (1 - 1e-12)
    # determinism: a fresh topology and model give identical floats
    again = FlowModel(params).time_schedule(schedule_of(case, case.topology()), case.topology())
    assert again.time_s == flow.time_s
    assert np.array_equal(again.phase_times_s, flow.phase_times_s)
    assert np.array_equal(again.link_bytes, flow.link_bytes)
    # one job alone on the shared-network driver is the memoized FlowModel answer
    (job,) = run_concurrent([(sched, 0.0)], topo, FlowModel(params))
    assert math.isclose(job.time_s, flow.time_s, rel_tol=1e-9, abs_tol=1e-15)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(1, 40), st.integers(1, 25), st.data())
def test_compiled_max_min_equals_numpy(num_flows: int, num_links: int, data: st.DataObject) -> None:
    """The compiled progressive filling and the numpy one give the same rates to 1e-12 (random paths,
    capacities and multiplicities)."""
    from topotrain.network.maxmin import _compiled, max_min_rates_numpy

    kernel_rates = max_min_rates  # the compiled kernel where numba is installed (a dependency)
    assert _compiled() is not None, "numba is a dependency: the compiled kernel must load"
    ef: list[int] = []
    el: list[int] = []
    for f in range(num_flows):
        links = data.draw(st.lists(st.integers(0, num_links - 1), min_size=1, max_size=5, unique=True))
        ef += [f] * len(links)
        el += links
    cap = np.array(data.draw(st.lists(st.sampled_from(CAPS), min_size=num_links, max_size=num_links)))
    w = np.array(data.draw(st.lists(st.integers(1, 8), min_size=num_flows, max_size=num_flows)), dtype=float)
    got = kernel_rates(np.array(ef), np.array(el), num_flows, cap, weight=w)
    want = max_min_rates_numpy(np.array(ef), np.array(el), num_flows, cap, weight=w)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _drive(topo: Topology, jobs: list[tuple[float, list[tuple[int, int, int]]]], overhead_s: float,
           by_job: bool) -> dict[int, float]:
    """Completion time of every job (its flows started together at its start time): with ``by_job`` from the
    network's own job accounting (rate changes stepped internally up to the next start), else from the
    per-flow completions (the latest of each job's flows)."""
    gpus = topo.gpus
    net = FlowNetwork(topo, overhead_s=overhead_s, jobs=by_job)
    owner: dict[int, int] = {}
    done: dict[int, float] = {}
    pos = 0
    while True:
        t_start = jobs[pos][0] if pos < len(jobs) else math.inf
        t = min(t_start, net.next_event_s(t_start) if by_job else net.next_event_s())
        if t == math.inf:
            break
        if by_job:
            for t_done, j in net.advance_jobs(t):
                assert j not in done and t_done <= t
                done[j] = t_done
        else:
            for t_done, fid in net.advance(t):
                j = owner[int(fid)]  # type: ignore[call-overload]
                done[j] = max(done.get(j, -math.inf), t_done)
        while pos < len(jobs) and jobs[pos][0] <= t:
            t0, flows = jobs[pos]
            paths = [topo.route(gpus[s], gpus[d]) for s, d, _ in flows]
            off = np.cumsum([0] + [len(p) for p in paths])
            links = np.array([lk for p in paths for lk in p], dtype=np.int64)
            sizes = np.array([n for _, _, n in flows], dtype=np.float64)
            if by_job:
                net.start_many(off, links, sizes, t0, job=pos)
            else:
                ids = net.start_many(off, links, sizes, t0)
                owner.update(dict.fromkeys(ids.tolist(), pos))
            pos += 1
    return done


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(1, 4))
def test_job_completions_equal_flow_completions(case: Case, per_job: int) -> None:
    """A job (flows started together) completes when its last flow does: the network's job accounting, which
    steps rate changes internally, gives the times of the per-flow completions (to rounding: it advances the
    fluid state at fewer instants)."""
    topo = case.topology()
    flows = sorted(case.flows, key=lambda f: f[3])
    jobs = [(flows[i][3], [(s, d, n) for s, d, n, _ in flows[i:i + per_job]]) for i in range(0, len(flows), per_job)]
    want = _drive(topo, jobs, case.overhead_s, by_job=False)
    got = _drive(topo, jobs, case.overhead_s, by_job=True)
    assert sorted(got) == sorted(want) == list(range(len(jobs)))
    for j, t in want.items():
        assert math.isclose(got[j], t, rel_tol=1e-12, abs_tol=1e-18), (j, got[j], t)


def _run_staggered(topo: Topology, jobs: list[tuple[Schedule, float]], compact_min: int | None = None,
                   each_event: Callable[[FlowNetwork], None] | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """(per job: start, finish, phase finishes; link bytes) of ``(schedule, start)`` jobs sharing one ``flow``
    simulator, driven as ``run_concurrent`` drives it (keeping the simulator for its link bytes)."""
    sim = FlowModel().open(topo)
    if compact_min is not None:
        sim.net._compact_min = compact_min
    for k, (s, t0) in enumerate(jobs):
        while (t := sim.next_event_s(t0)) <= t0:
            sim.advance(t)
        sim.submit(s, t0, k)
    while (t := sim.next_event_s(math.inf)) < math.inf:
        sim.advance(t)
        if each_event is not None:
            each_event(sim.net)
    timings = [sim.timing(k) for k in range(len(jobs))]
    return [np.r_[j.start_s, j.finish_s, j.phase_finish_s] for j in timings], sim.link_bytes()


def test_compiled_event_step_equals_numpy(monkeypatch: object) -> None:
    """The compiled rate recomputation, event step and multi-event loop (``network/flow_kernel.py``) give the
    phase times and link bytes of the numpy path to 1e-12 on contended traffic: three collectives started at
    different times on a 4:1 leaf-spine, sharing its uplinks."""
    import pytest

    from topotrain.collectives.registry import build_schedule
    from topotrain.network import flow_rates
    from topotrain.network.flow_kernel import compiled_recompute, compiled_step
    from topotrain.scenario.cluster import cluster_from_dict

    assert compiled_recompute() is not None and compiled_step() is not None, "numba is a dependency"
    monkeypatch.setenv("TOPOTRAIN_KERNEL", "numba")  # type: ignore[attr-defined]  # compiled from the first event
    c = cluster_from_dict({"server": "nvswitch-8", "servers": 8, "network": {
        "topology": "leaf-spine", "oversubscription": 4, "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    jobs = [(build_schedule("allreduce", a, c.topology, g[i::3], 2**24 + 4096 * i), 3e-5 * i)
            for i, a in enumerate(("ring", "tree", "halving-doubling"))]

    def run() -> tuple[list[np.ndarray], np.ndarray]:
        return _run_staggered(c.topology, jobs)

    compiled_times, compiled_bytes = run()
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(flow_rates, "choose", lambda: None)
        numpy_times, numpy_bytes = run()
    finally:
        mp.undo()
    for a, b in zip(compiled_times, numpy_times, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(compiled_bytes, numpy_bytes, rtol=1e-12)
    assert float(compiled_times[0][1]) > float(jobs[0][0].size_bytes) / 25e9  # contended: slower than a link


def test_alone_rates_memo_is_exact() -> None:
    """A prepared batch that starts alone in its component reuses the rates computed the first time it did
    (``PreparedBatch.memo``): the same computation on the same inputs, so phase times and link bytes equal a run
    that refills every time, bit for bit (a ring whose phases repeat, beside a contending tree)."""
    import pytest

    from topotrain.collectives.registry import build_schedule
    from topotrain.network.flow_network import FlowNetwork
    from topotrain.scenario.cluster import cluster_from_dict

    c = cluster_from_dict({"server": "nvswitch-8", "servers": 8, "network": {
        "topology": "leaf-spine", "oversubscription": 2, "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    jobs = [(build_schedule("allreduce", "ring", c.topology, g[::2], 2**22), 0.0),
            (build_schedule("allreduce", "tree", c.topology, g[1::2], 2**21), 4e-4)]

    def run() -> tuple[list[np.ndarray], np.ndarray]:
        return _run_staggered(c.topology, jobs)

    used: list[int] = []
    original = FlowNetwork._kernel_inputs  # what every compiled recomputation takes its memo from

    def counting(self: FlowNetwork, touched: list[np.ndarray], num_groups: int) -> Any:
        arrival = self._arrival
        used.append(int(arrival is not None and bool(arrival.memo)))
        return original(self, touched, num_groups)

    def forgetting(self: FlowNetwork, touched: list[np.ndarray], num_groups: int) -> Any:
        self._arrival = None
        return original(self, touched, num_groups)

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(FlowNetwork, "_kernel_inputs", counting)
        with_memo = run()
        mp.setattr(FlowNetwork, "_kernel_inputs", forgetting)
        without = run()
    finally:
        mp.undo()
    assert sum(used) > 5, "the ring's repeated phases should find their rates memoized"
    for a, b in zip(with_memo[0], without[0], strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(with_memo[1], without[1])



def _two_rings(size_b: int) -> tuple[Topology, list[tuple[Schedule, float]]]:
    """Two ring allreduces over 8 servers on a 2:1 leaf-spine, started together, each ring's every hop to the next
    server (the even GPUs, and all of them): their phases share NICs and repeat, so the same component (the two
    rings' current phases) is refilled whole again and again."""
    from topotrain.collectives.registry import build_schedule
    from topotrain.scenario.cluster import cluster_from_dict

    c = cluster_from_dict({"server": "nvswitch-8", "servers": 8, "network": {
        "topology": "leaf-spine", "oversubscription": 2, "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    even = [g[8 * s + i] for i in (0, 2, 4, 6) for s in range(8)]
    every = [g[8 * s + i] for i in range(8) for s in range(8)]
    return c.topology, [(build_schedule("allreduce", "ring", c.topology, even, 2**22), 0.0),
                        (build_schedule("allreduce", "ring", c.topology, every, size_b), 0.0)]


def _staggered_with_table(topo: Topology, jobs: list[tuple[Schedule, float]], slots: int, pairs: int,
                          max_pairs: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, int]:
    """``_run_staggered`` with the composition table of ``slots`` slots and ``pairs`` pairs, growing to
    ``max_pairs`` (0 slots: no table); also (the table's state, its slots at the end)."""
    import pytest

    from topotrain.network import flow_network, flow_rates

    nets: list[FlowNetwork] = []
    original = flow_network.FlowNetwork.reset

    def keep(self: FlowNetwork) -> None:
        if self not in nets:
            nets.append(self)
        original(self)

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(flow_rates, "_CM_SLOTS", slots)
        mp.setattr(flow_rates, "_CM_PAIRS", pairs)
        mp.setattr(flow_rates, "_CM_MAX_PAIRS", max_pairs)
        mp.setattr(flow_network.FlowNetwork, "reset", keep)
        times, link_bytes = _run_staggered(topo, jobs)
    finally:
        mp.undo()
    shared = [n for n in nets if n._jobs][0]  # the simulator's network (time_alone opens its own ones)
    return times, link_bytes, shared._cm_state.copy(), int(shared._cm_keys.shape[0])


def test_composition_table_is_exact() -> None:
    """A component refilled whole takes the rates of an earlier filling of the same composition (the same live
    path groups with the same flow counts: max-min rates are a function of them and the capacities alone), so
    the phase times and link bytes equal a run without the table (to rounding: the two fillings may sum their
    loads in another order), and the table answers the rings' repeated phases."""
    topo, jobs = _two_rings(2**23)
    with_table = _staggered_with_table(topo, jobs, 1024, 1 << 14, 1 << 20)
    without = _staggered_with_table(topo, jobs, 0, 0, 0)
    assert with_table[2][3] > 5, "the rings' repeated phases should be answered by the table"
    assert without[2][3] == 0 and without[2][1] == 0
    for a, b in zip(with_table[0], without[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(with_table[1], without[1], rtol=1e-12)


def test_composition_table_grows_and_stops_at_its_bound() -> None:
    """The table starts tiny here and grows (slots placed again) as compositions are stored; at its bound it
    stores no more and the later ones are filled each time: the answers are those of a run without it."""
    topo, jobs = _two_rings(3 * 2**22)
    without = _staggered_with_table(topo, jobs, 0, 0, 0)
    grown = _staggered_with_table(topo, jobs, 2, 4, 1 << 20)
    bounded = _staggered_with_table(topo, jobs, 2, 4, 8)
    assert grown[3] > 2 and grown[2][1] >= 2 and grown[2][3] > 0  # it grew, stored, and answered
    assert bounded[2][0] <= 8 and bounded[2][3] < grown[2][3]  # full: fewer answered
    for run in (grown, bounded):
        for a, b in zip(run[0], without[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        np.testing.assert_allclose(run[1], without[1], rtol=1e-12)



def test_composition_lookup_compares_pairs_not_hashes() -> None:
    """The table answers a composition only when its stored (group, flows) pairs are the component's: an entry
    under the same hash with other pairs (a collision) is passed over, and a component with other flow counts
    is a miss."""
    from topotrain.network import flow_kernel as fk

    assert fk.compiled_recompute() is not None, "numba is a dependency"
    find, store = fk._cf, fk._cs
    keys = np.zeros(16, dtype=np.uint64)
    where = np.zeros(32, dtype=np.int64)
    gm = np.zeros(64, dtype=np.int64)
    rates = np.zeros(32)
    state = np.zeros(4, dtype=np.int64)
    gs = np.array([7, 3, 9], dtype=np.int64)  # the component's live groups, in the order found
    mult = np.zeros(16, dtype=np.int64)
    mult[[3, 7, 9]] = (2, 1, 1)
    in_c = np.zeros(16, dtype=np.bool_)
    in_c[[3, 7, 9, 12]] = True  # 12: an idle group of the component (no flows)
    group_rate = np.zeros(16)
    h, slot, off = find(gs, mult, in_c, keys, where, gm)
    assert off == -1
    assert find(gs[::-1].copy(), mult, in_c, keys, where, gm)[0] == h  # the order of the groups does not matter
    # a collision: another composition stored under this very hash, in this very slot
    keys[slot] = h
    where[2 * slot:2 * slot + 2] = (0, 3)
    gm[:6] = (3, 2, 7, 1, 8, 1)  # group 8, not 9
    state[:2] = (3, 1)
    h2, slot2, off = find(gs, mult, in_c, keys, where, gm)
    assert h2 == h and off == -1 and slot2 != slot  # passed over, probed on
    group_rate[[3, 7, 9]] = (1.5, 2.5, 3.5)
    store(gs, h2, slot2, mult, group_rate, keys, where, gm, rates, state)
    assert state.tolist() == [6, 2, 0, 0]
    assert find(np.array([9, 7, 3], dtype=np.int64), mult, in_c, keys, where, gm)[2] == 3  # a hit, in any order
    assert gm[6:12].tolist() == [7, 1, 3, 2, 9, 1] and rates[3:6].tolist() == [2.5, 1.5, 3.5]
    mult[3] = 1  # other flow counts: another composition
    assert find(gs, mult, in_c, keys, where, gm)[2] == -1
    mult[3] = 2
    in_c[9] = False  # the same groups and counts, but group 9 outside the component: a miss
    assert find(gs, mult, in_c, keys, where, gm)[2] == -1


def test_component_search_marks_only_links_shared_with_another_entry() -> None:
    """``_mark_links`` marks a link for the breadth-first walk unless its list holds the marking entry alone: a
    private link leads to no other group. Here link 5 and link 9 carry one entry each, link 7 two (entry 2 at
    its head, entry 1 after it): from either of these, link 7 is marked, and only it."""
    from topotrain.network import flow_kernel as fk

    assert fk.compiled_recompute() is not None, "numba is a dependency"
    el = np.array([5, 7, 7, 9], dtype=np.int64)
    head = np.full(12, -1, dtype=np.int64)
    nxt = np.full(4, -1, dtype=np.int64)
    fk._lp(el, 0, 4, head, nxt)
    assert (head[7], nxt[2], nxt[1], head[5], nxt[0]) == (2, 1, -1, 0, -1)
    for first, n in ((0, 4), (1, 1), (2, 1), (0, 1), (3, 1)):
        l_mask = np.zeros(12, dtype=np.bool_)
        l_set = np.zeros(4, dtype=np.int64)
        n_l = fk._ml(first, n, el, l_mask, l_set, 0, head, nxt)
        shared = first <= 2 < first + n or first <= 1 < first + n
        assert l_set[:n_l].tolist() == ([7] if shared else []), (first, n)
        assert np.flatnonzero(l_mask).tolist() == ([7] if shared else [])


def _check_entry_structures(net: FlowNetwork) -> None:
    """The compiled kernels' bookkeeping matches what it stands for: each live group's entries contiguous from
    its position, the live-entry count, and every link's list holding exactly the entries on that link."""
    n = net._ent_n
    eg, el = net._ent_gid[:n], net._ent_link[:n]
    live = net._mult[eg] > 0
    assert net._n_live == int(np.count_nonzero(live))
    for g in np.unique(eg[live]).tolist():
        p, ln = int(net._g_pos[g]), int(net._g_len[g])
        assert np.array_equal(eg[p:p + ln], np.full(ln, g))
        assert np.array_equal(el[p:p + ln], net._g_flat[net._g_start[g]:net._g_start[g] + ln])
    for lk in np.unique(el).tolist():
        on_list, e = [], int(net._head[lk])
        while e >= 0:
            on_list.append(e)
            e = int(net._nxt[e])
        assert sorted(on_list) == np.flatnonzero(el == lk).tolist()


def test_component_search_over_link_lists_equals_numpy() -> None:
    """The compiled path's link lists, contiguous group entries and incremental live count (frequent compactions
    forced) give the numpy path's phase times and link bytes to 1e-12, and stay consistent at every event:
    staggered collectives on a 2:1 leaf-spine, sharing its uplinks."""
    import pytest

    from topotrain.collectives.registry import build_schedule
    from topotrain.network import flow_rates
    from topotrain.scenario.cluster import cluster_from_dict

    c = cluster_from_dict({"server": "nvswitch-8", "servers": 8, "network": {
        "topology": "leaf-spine", "oversubscription": 2, "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    jobs = [(build_schedule("allreduce", a, c.topology, g[i::4], 2**22 + 8192 * i), 2e-5 * i)
            for i, a in enumerate(("ring", "halving-doubling", "tree", "ring"))]

    checked: list[int] = []

    def check(net: FlowNetwork) -> None:
        if net._k_lists is not None:
            net._ensure_rates()  # a deferred rate computation (FlowNetwork.defer_rates) made: counts up to date
            _check_entry_structures(net)
            checked.append(net._ent_n)

    def run(each: Callable[[FlowNetwork], None] | None) -> tuple[list[np.ndarray], np.ndarray]:
        return _run_staggered(c.topology, jobs, compact_min=8, each_event=each)  # compact often

    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("TOPOTRAIN_KERNEL", "numba")  # compiled from the first event
        compiled = run(check)
        assert len(checked) > 10
        mp.setattr(flow_rates, "choose", lambda: None)
        numpy_path = run(None)
    finally:
        mp.undo()
    for a, b in zip(compiled[0], numpy_path[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(compiled[1], numpy_path[1], rtol=1e-12)
