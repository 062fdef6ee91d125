"""Flow-level network model: max-min fair sharing checked against hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, phase_key, split_bytes
from topotrain.network import (
    AnalyticalModel,
    FlowModel,
    FlowNetwork,
    get_model,
    max_min_rates,
    run_concurrent,
)
from topotrain.network.params import NetworkParams
from topotrain.network.registry import model_names
from topotrain.topology import Topology
from topotrain.util.errors import ConfigError

GB = 1e9


# ---- builders ---------------------------------------------------------------------------------------
def flow(alpha_s: float = 2e-6) -> FlowModel:
    """The flow model with per-message overhead ``alpha_s``."""
    return FlowModel(NetworkParams(alpha_s))


def ana(alpha_s: float = 2e-6) -> AnalyticalModel:
    return AnalyticalModel(NetworkParams(alpha_s))


def star(p: int, bw: float = 25 * GB, lat: float = 1e-6) -> Topology:
    """p GPUs on one non-blocking switch."""
    t = Topology("star")
    t.add_node("sw", "switch")
    for i in range(p):
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", "sw", bw, lat)
    return t


def ring_allreduce(ranks: tuple[str, ...], size_bytes: int, whole: bool = False) -> Schedule:
    """Ring allreduce (Thakur et al. 2005): p−1 reduce-scatter steps, then p−1 allgather steps (``whole``: chunks
    in whole bytes, a byte apart where ``p`` does not divide the size, as a hand-written schedule may have them)."""
    p = len(ranks)
    i = np.arange(p)
    phases = []
    for k in range(p - 1):
        c = (i - k) % p
        phases.append(Phase.of(i, (i + 1) % p, c, c + 1, True))
    for k in range(p - 1):
        c = (i + 1 - k) % p
        phases.append(Phase.of(i, (i + 1) % p, c, c + 1, False))
    base, extra = divmod(size_bytes, p)
    chunks = np.array([base + 1] * extra + [base] * (p - extra)) if whole else split_bytes(size_bytes, p)
    return Schedule(CollectiveOp.ALLREDUCE, "ring", ranks, size_bytes, chunks, np.full(p, -1), np.full(p, -1),
                    tuple(phases))


def transfers(ranks: tuple[str, ...], phases: list[list[tuple[int, int, int]]]) -> Schedule:
    """A schedule of explicit (src, dst, bytes) transfers, each its own chunk."""
    sizes = [b for ph in phases for _, _, b in ph]
    built = []
    c = 0
    for ph in phases:
        lo = np.arange(c, c + len(ph))
        built.append(Phase.of([s for s, _, _ in ph], [d for _, d, _ in ph], lo, lo + 1, False))
        c += len(ph)
    chunks = np.array(sizes, dtype=np.int64)
    return Schedule(CollectiveOp.ALLTOALL, "explicit", ranks, int(chunks.sum()), chunks,
                    np.full(len(sizes), -1), np.full(len(sizes), -1), tuple(built))


def dumbbell(k: int, access_bw: float, middle_bw: float, lat: float) -> Topology:
    t = Topology("dumbbell")
    t.add_node("L", "switch")
    t.add_node("R", "switch")
    t.add_link("L", "R", middle_bw, lat)
    for i in range(k):
        t.add_node(f"s{i}", "gpu")
        t.add_link(f"s{i}", "L", access_bw, lat)
    for i in range(k):
        t.add_node(f"r{i}", "gpu")
        t.add_link(f"r{i}", "R", access_bw, lat)
    return t


# ---- max-min, the pure function ---------------------------------------------------------------------
def test_max_min_textbook_two_links() -> None:
    """Bertsekas & Gallager §6.5: flow 0 crosses both links (capacities 1 and 2), flows 1 and 2 one each.
    Link 0 saturates first at 1/2 (flows 0, 1); flow 2 then takes the rest of link 1: 2 − 1/2 = 3/2."""
    rates = max_min_rates(np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1]), 3, np.array([1.0, 2.0]))
    np.testing.assert_allclose(rates, [0.5, 0.5, 1.5], rtol=1e-12)


def test_max_min_four_sessions() -> None:
    """A long session 0 over three unit links, sessions 1, 2, 3 on one link each: every link carries two
    sessions, so all get 1/2. With link 2 of capacity 3, session 3 takes what session 0 leaves: 2.5."""
    ef = np.array([0, 0, 0, 1, 2, 3])
    el = np.array([0, 1, 2, 0, 1, 2])
    np.testing.assert_allclose(max_min_rates(ef, el, 4, np.ones(3)), [0.5] * 4, rtol=1e-12)
    np.testing.assert_allclose(max_min_rates(ef, el, 4, np.array([1.0, 1.0, 3.0])), [0.5, 0.5, 0.5, 2.5],
                               rtol=1e-12)


def test_max_min_weights_and_unlinked_flows() -> None:
    """Weight 3 stands for three identical flows: with one more flow on a unit link, each gets 1/4."""
    rates = max_min_rates(np.array([0, 1]), np.array([0, 0]), 3, np.array([1.0]),
                          weight=np.array([3.0, 1, 1]))
    np.testing.assert_allclose(rates[:2], [0.25, 0.25], rtol=1e-12)
    assert rates[2] == np.inf  # no links: nothing limits it
    with pytest.raises(ConfigError, match="weight"):
        max_min_rates(np.array([0]), np.array([0]), 1, np.array([1.0]), weight=np.array([0.0]))


# ---- FlowModel on schedules -------------------------------------------------------------------------
def test_ring_allreduce_matches_closed_form() -> None:
    """Non-blocking switch: each ring step is alpha + 2 hops of latency + (n/p)/B, 2(p−1) steps."""
    p, bw, lat, alpha, n = 8, 25 * GB, 1e-6, 2e-6, 64 * 2**20
    topo = star(p, bw, lat)
    sched = ring_allreduce(tuple(topo.gpus), n)
    res = flow(alpha).time_schedule(sched, topo)
    expected = 2 * (p - 1) * (alpha + 2 * lat + n / (p * bw))
    assert res.time_s == pytest.approx(expected, rel=1e-9)
    assert res.time_s == pytest.approx(ana(alpha).time_schedule(sched, topo).time_s, rel=1e-12)
    # every GPU uplink carries 2(p−1) chunks of n/p bytes
    up = [topo.link_id(g, "sw") for g in topo.gpus]
    np.testing.assert_allclose(res.link_bytes[up], 2 * (p - 1) * n / p)


def test_dumbbell_thin_middle() -> None:
    """4 senders → 4 receivers across one middle link of 10 GB/s (access 25 GB/s): each gets 2.5 GB/s."""
    k, s_bytes, lat, alpha = 4, 10_000_000, 1e-6, 2e-6
    topo = dumbbell(k, 25 * GB, 10 * GB, lat)
    ranks = tuple(topo.gpus)  # s0..s3, r0..r3
    sched = transfers(ranks, [[(i, k + i, s_bytes) for i in range(k)]])
    res = flow(alpha).time_schedule(sched, topo)
    assert res.time_s == pytest.approx(alpha + 3 * lat + k * s_bytes / (10 * GB), rel=1e-12)
    # a fat middle link: the 25 GB/s access links limit instead, no sharing
    fat = dumbbell(k, 25 * GB, 200 * GB, lat)
    res_fat = flow(alpha).time_schedule(sched, fat)
    assert res_fat.time_s == pytest.approx(alpha + 3 * lat + s_bytes / (25 * GB), rel=1e-12)
    for t in (topo, fat):
        assert flow(alpha).time_schedule(sched, t).time_s == pytest.approx(
            ana(alpha).time_schedule(sched, t).time_s, rel=1e-12)


def test_incast() -> None:
    """k senders into one receiver share its downlink: the last byte arrives at k·S/B."""
    k, s_bytes, bw = 5, 4_000_000, 10 * GB
    topo = star(k + 1, bw, 0.0)
    sched = transfers(tuple(topo.gpus), [[(i, k, s_bytes) for i in range(k)]])
    assert flow(0.0).time_schedule(sched, topo).time_s == pytest.approx(k * s_bytes / bw, rel=1e-12)


def test_flow_slower_than_analytical_when_bottlenecks_move() -> None:
    """Link A carries p and q, each also sharing a link (B, C) with two short flows of S/10.

    Until the short flows end (t = 0.3·S/B) p and q get B/3, so link A idles a third of the time; then
    they share A at B/2 for their last 0.9·S: 0.3 + 1.8 = 2.1·S/B. The analytical bound is 2·S/B (A's
    bytes over its capacity).
    """
    bw, fat, s_bytes = 10 * GB, 1000 * GB, 10_000_000
    t = Topology("moving")
    for sw in ("s0", "s1", "s2", "s3"):
        t.add_node(sw, "switch")
    t.add_link("s0", "s1", bw)  # A
    t.add_link("s1", "s2", bw)  # B
    t.add_link("s1", "s3", bw)  # C
    attach = {"P": "s0", "Q": "s0", "b1": "s1", "b2": "s1", "c1": "s1", "c2": "s1",
              "RP": "s2", "Rb1": "s2", "Rb2": "s2", "RQ": "s3", "Rc1": "s3", "Rc2": "s3"}
    for g, sw in attach.items():
        t.add_node(g, "gpu")
        t.add_link(g, sw, fat)
    idx = {g: i for i, g in enumerate(t.gpus)}
    short = s_bytes // 10
    pairs = [("P", "RP", s_bytes), ("Q", "RQ", s_bytes), ("b1", "Rb1", short), ("b2", "Rb2", short),
             ("c1", "Rc1", short), ("c2", "Rc2", short)]
    sched = transfers(tuple(t.gpus), [[(idx[a], idx[b], n) for a, b, n in pairs]])
    fl = flow(0.0).time_schedule(sched, t).time_s
    analytical = ana(0.0).time_schedule(sched, t).time_s
    assert fl == pytest.approx(2.1 * s_bytes / bw, rel=1e-9)  # access links (fat, unshared) never bind
    assert analytical == pytest.approx(2.0 * s_bytes / bw, rel=1e-12)
    assert fl > analytical * 1.04


def test_transfers_to_oneself_are_free() -> None:
    topo = star(3)
    only_self = transfers(tuple(topo.gpus), [[(0, 0, 10**6), (1, 1, 10**6)]])
    assert FlowModel().time_schedule(only_self, topo).time_s == 0.0
    mixed = transfers(tuple(topo.gpus), [[(0, 0, 10**9), (1, 2, 10**6)]])
    assert FlowModel().time_schedule(mixed, topo).time_s == pytest.approx(
        FlowModel().params.message_overhead_s + 2e-6 + 10**6 / (25 * GB), rel=1e-12)


def test_memoized_phases_equal_fresh_simulation() -> None:
    """Ring phases share one traffic signature (even chunks, or the library's equal fractional ones), or (whole
    chunks differing by a byte) one set of pairs whose network is reused: either way each phase time equals a
    fresh simulation of that phase alone."""
    topo = star(6, lat=5e-7)
    for size, whole in ((6 * 1_000_000, False), (6 * 1_000_000 + 5, False), (6 * 1_000_000 + 5, True)):
        sched = ring_allreduce(tuple(topo.gpus), size, whole)
        res = FlowModel().time_schedule(sched, topo)
        for k, phase in enumerate(sched.phases):
            alone = Schedule(sched.op, "one", sched.ranks, sched.size_bytes, sched.chunk_bytes,
                             sched.chunk_src, sched.chunk_dst, (phase,))
            assert res.phase_times_s[k] == FlowModel().time_schedule(alone, topo).time_s
        keys = {phase_key(sched, ph) for ph in sched.phases}
        assert (len(keys) == 1) == (not whole or size % 6 == 0)  # whole uneven chunks: rotated sizes


# ---- FlowNetwork, event by event --------------------------------------------------------------------
def two_gpus(bw: float, lat: float) -> Topology:
    t = Topology("pair")
    t.add_node("a", "gpu")
    t.add_node("b", "gpu")
    t.add_link("a", "b", bw, lat)
    return t


def test_two_flows_share_a_link() -> None:
    bw, lat, alpha, s_bytes = 10 * GB, 3e-6, 2e-6, 1e7
    topo = two_gpus(bw, lat)
    net = FlowNetwork(topo, overhead_s=alpha)
    path = topo.route("a", "b")
    f0 = net.start(path, s_bytes, 0.0, "x")
    f1 = net.start(path, s_bytes, 0.0, "y")
    assert net.flow_rate(f0) == pytest.approx(bw / 2) and net.flow_rate(f1) == pytest.approx(bw / 2)
    np.testing.assert_allclose(net.link_rates(), [bw, 0.0])
    done = net.run()
    expected = 2 * s_bytes / bw + lat + alpha
    assert [tag for _, tag in done] == ["x", "y"]
    assert [t for t, _ in done] == pytest.approx([expected, expected], rel=1e-12)
    np.testing.assert_allclose(net.link_bytes(), [2 * s_bytes, 0.0])


def test_late_arrival_piecewise() -> None:
    """A (S bytes) starts at 0; B (S bytes) at S/(2B), when A is half done. They share until A ends at
    1.5·S/B; B then has S/2 left at full speed: done at 2·S/B."""
    bw, s_bytes = 10 * GB, 1e7
    topo = two_gpus(bw, 0.0)
    path = topo.route("a", "b")
    net = FlowNetwork(topo, overhead_s=0.0)
    net.start(path, s_bytes, 0.0, "A")
    t_b = s_bytes / (2 * bw)
    assert net.next_event_s() == pytest.approx(s_bytes / bw)
    assert net.advance(t_b) == []
    fb = net.start(path, s_bytes, t_b, "B")
    assert net.flow_rate(fb) == pytest.approx(bw / 2)
    assert net.next_event_s() == pytest.approx(1.5 * s_bytes / bw, rel=1e-12)
    (t_a, tag_a), = net.advance(net.next_event_s())
    assert tag_a == "A" and t_a == pytest.approx(1.5 * s_bytes / bw, rel=1e-12)
    assert net.flow_rate(fb) == pytest.approx(bw)
    (t_bb, tag_b), = net.run()
    assert tag_b == "B" and t_bb == pytest.approx(2 * s_bytes / bw, rel=1e-12)


def test_unequal_sizes_short_flow_leaves() -> None:
    """S and 3S share a link: both at B/2 until S is done (2·S/B), then 3S runs alone: done at 4·S/B."""
    bw, s_bytes, lat, alpha = 10 * GB, 1e7, 1e-6, 1e-6
    topo = two_gpus(bw, lat)
    path = topo.route("a", "b")
    net = FlowNetwork(topo, overhead_s=alpha)
    net.start(path, s_bytes, 0.0, "short")
    net.start(path, 3 * s_bytes, 0.0, "long")
    done = dict((tag, t) for t, tag in net.run())
    assert done["short"] == pytest.approx(2 * s_bytes / bw + lat + alpha, rel=1e-12)
    assert done["long"] == pytest.approx(4 * s_bytes / bw + lat + alpha, rel=1e-12)


def test_three_flows_two_links_in_network() -> None:
    """The textbook case on a real chain: link X (B) carries f0, f1; link Y (2B) carries f0, f2.
    Rates B/2, B/2, 3B/2; f2 (S bytes) leaves at 2S/(3B), f0, f1 still at B/2 (X binds): done at 2S/B."""
    bw, s_bytes = 10 * GB, 1e7
    t = Topology("chain")
    for n in ("u", "v", "w"):
        t.add_node(n, "switch")
    x, _ = t.add_link("u", "v", bw)
    y, _ = t.add_link("v", "w", 2 * bw)
    net = FlowNetwork(t, overhead_s=0.0)
    f0 = net.start((x, y), s_bytes, 0.0, 0)
    f1 = net.start((x,), s_bytes, 0.0, 1)
    f2 = net.start((y,), s_bytes, 0.0, 2)
    rates = [net.flow_rate(f) for f in (f0, f1, f2)]
    np.testing.assert_allclose(rates, [bw / 2, bw / 2, 1.5 * bw], rtol=1e-12)
    done = net.run()
    assert done[0][1] == 2 and done[0][0] == pytest.approx(2 * s_bytes / (3 * bw), rel=1e-12)
    assert {tag for _, tag in done[1:]} == {0, 1}
    for t_done, _ in done[1:]:
        assert t_done == pytest.approx(2 * s_bytes / bw, rel=1e-12)


def test_many_identical_flows_group_into_one() -> None:
    """1000 flows on one path price like one flow of weight 1000: each gets B/1000."""
    bw = 10 * GB
    topo = two_gpus(bw, 0.0)
    net = FlowNetwork(topo, overhead_s=0.0)
    path = np.array(topo.route("a", "b"))
    n = 1000
    net.start_many(np.arange(n + 1) * path.size, np.tile(path, n), np.full(n, 1e6), 0.0)
    ids, rates = net.active_rates()
    assert ids.size == n
    np.testing.assert_allclose(rates, bw / n, rtol=1e-12)
    done = net.run()
    assert len(done) == n
    np.testing.assert_allclose([t for t, _ in done], n * 1e6 / bw, rtol=1e-12)


def test_network_input_errors() -> None:
    topo = two_gpus(GB, 0.0)
    net = FlowNetwork(topo, overhead_s=0.0)
    net.advance(1.0)
    with pytest.raises(ConfigError, match="to_s"):
        net.advance(0.5)
    with pytest.raises(ConfigError, match="now_s"):
        net.start((0,), 1.0, 0.5)
    with pytest.raises(ConfigError, match="links"):
        net.start((7,), 1.0, 1.0)
    with pytest.raises(ConfigError, match="size"):
        net.start((0,), -1.0, 1.0)


# ---- several collectives on one network -------------------------------------------------------------
def test_run_concurrent_contention_and_isolation() -> None:
    bw, lat, alpha, s_bytes = 10 * GB, 1e-6, 2e-6, 10_000_000
    topo = star(4, bw, lat)
    ranks = tuple(topo.gpus)
    solo_t = alpha + 2 * lat + s_bytes / bw
    a = transfers(ranks, [[(0, 1, s_bytes)]])
    b = transfers(ranks, [[(2, 1, s_bytes)]])  # also into g1: shares g1's downlink with a
    c = transfers(ranks, [[(2, 3, s_bytes)]])  # disjoint from a
    ja, jb = run_concurrent([(a, 0.0), (b, 0.0)], topo, FlowModel())
    assert ja.finish_s == pytest.approx(alpha + 2 * lat + 2 * s_bytes / bw, rel=1e-12)
    assert jb.finish_s == pytest.approx(ja.finish_s, rel=1e-12)
    ja, jc = run_concurrent([(a, 0.0), (c, 0.0)], topo, FlowModel())
    assert ja.time_s == pytest.approx(solo_t, rel=1e-12) and jc.time_s == pytest.approx(solo_t, rel=1e-12)
    late = solo_t + 1e-3  # b starts after a has finished: no contention
    ja, jb = run_concurrent([(a, 0.0), (b, late)], topo, FlowModel())
    assert jb.start_s == late and jb.time_s == pytest.approx(solo_t, rel=1e-9)


def test_run_concurrent_two_rings_overlap() -> None:
    """Two ring allreduces on disjoint halves of a switch take their solo time; one alone equals
    FlowModel's memoized answer; a job of 2 phases reports both phase ends."""
    topo = star(8, 25 * GB, 1e-6)
    g = topo.gpus
    r1 = ring_allreduce(tuple(g[:4]), 4 * 2**20)
    r2 = ring_allreduce(tuple(g[4:]), 4 * 2**20)
    solo = FlowModel().time_schedule(r1, topo).time_s
    j1, j2 = run_concurrent([(r1, 0.0), (r2, 1e-5)], topo, FlowModel())
    assert j1.time_s == pytest.approx(solo, rel=1e-9) and j2.time_s == pytest.approx(solo, rel=1e-9)
    assert j2.finish_s == pytest.approx(1e-5 + solo, rel=1e-9)
    np.testing.assert_allclose(np.diff(np.concatenate([[0.0], j1.phase_finish_s])),
                               FlowModel().time_schedule(r1, topo).phase_times_s, rtol=1e-9)
    # the same two rings on the same four GPUs contend: twice the bandwidth term
    k1, k2 = run_concurrent([(r1, 0.0), (r1, 0.0)], topo, FlowModel())
    assert k1.time_s > 1.5 * solo and k2.finish_s == pytest.approx(k1.finish_s, rel=1e-12)


# ---- registry ---------------------------------------------------------------------------------------
def test_registry() -> None:
    assert model_names()[:4] == ["analytical", "flow", "flow-async", "flow-eager"]  # then the packet reference
    assert get_model("flow-eager").name == "flow-eager"
    assert isinstance(get_model("flow"), FlowModel) and get_model("flow").name == "flow"
    assert isinstance(get_model("analytical"), AnalyticalModel)
    with pytest.raises(ConfigError, match="analytical, flow, flow-async, flow-eager"):
        get_model("packet-ish")


# ---- with the real collective algorithms (optional: skipped where the registry is absent) ------------
def oversubscribed(servers: int, per_server: int) -> Topology:
    """Servers of GPUs on a leaf switch each, leaves joined by one spine over links of half the leaf's
    total: a 2:1 oversubscribed two-tier network without latency (so the analytical time is a bound)."""
    t = Topology("two-tier")
    t.add_node("spine", "switch")
    for s in range(servers):
        t.add_node(f"leaf{s}", "switch")
        t.add_link(f"leaf{s}", "spine", per_server * 10 * GB / 2)
        for g in range(per_server):
            t.add_node(f"s{s}g{g}", "gpu")
            t.add_link(f"s{s}g{g}", f"leaf{s}", 10 * GB)
    return t


@pytest.mark.parametrize("op", ["allreduce", "reduce-scatter", "allgather", "broadcast", "all-to-all"])
def test_real_algorithms_flow_at_least_analytical(op: str) -> None:
    registry = pytest.importorskip("topotrain.collectives.registry")
    topo = oversubscribed(4, 4)
    size = 16 * 2**20
    for algorithm in registry.algorithms_for(op):
        try:
            sched = registry.build_schedule(op, algorithm, topo, topo.gpus, size)
        except ConfigError:
            continue  # e.g. an algorithm that needs a shape this topology lacks
        fl = flow(1e-6).time_schedule(sched, topo)
        an = ana(1e-6).time_schedule(sched, topo)
        assert np.all(fl.phase_times_s >= an.phase_times_s * (1 - 1e-12)), algorithm
        np.testing.assert_allclose(fl.link_bytes, an.link_bytes, rtol=1e-12)
        (job,) = run_concurrent([(sched, 0.0)], topo, flow(1e-6))
        assert job.time_s == pytest.approx(fl.time_s, rel=1e-9), algorithm


def test_real_ring_on_a_switch_matches_closed_form() -> None:
    registry = pytest.importorskip("topotrain.collectives.registry")
    p, bw, lat, alpha, n = 8, 25 * GB, 1e-6, 2e-6, 64 * 2**20
    topo = star(p, bw, lat)
    sched = registry.build_schedule("allreduce", "ring", topo, topo.gpus, n)
    expected = 2 * (p - 1) * (alpha + 2 * lat + n / (p * bw))
    assert flow(alpha).time_schedule(sched, topo).time_s == pytest.approx(expected, rel=1e-2)
