"""Collective schedules: semantic verification, bytes on the wire, step counts and timing against the
closed forms of Thakur et al. 2005 / Mikami et al. 2018 / EFLOPS (reference/collectives.md, eflops.md).

Bytes: every algorithm here puts exactly its closed-form byte count on the wire, even for sizes that do
not divide by p (uneven splits only move bytes between chunks, never add any), so totals are compared
exactly. Times: each phase is timed by its largest chunk, so uneven splits add at most one byte per
transfer — far below the 1% band used.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topotrain.collectives import (
    ALGORITHMS,
    CollectiveOp,
    Phase,
    Schedule,
    ScheduleError,
    algorithms_for,
    build_schedule,
    check_schedule,
)
from topotrain.collectives import costmodel as cm
from topotrain.collectives.hdrm import bigraph_parts, hdrm_mapping, rank_switches
from topotrain.collectives.schedule import merge_schedules, split_bytes
from topotrain.network.analytical import AnalyticalModel
from topotrain.network.flow import FlowModel
from topotrain.network.params import NetworkParams
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

ALPHA_S = 2e-6
BW = 10e9  # bytes/s
BETA = 1.0 / BW

AR, RS, AG = CollectiveOp.ALLREDUCE, CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALLGATHER
BC, RD, A2A = CollectiveOp.BROADCAST, CollectiveOp.REDUCE, CollectiveOp.ALLTOALL


# ---- topologies built inline ------------------------------------------------------------------------
@cache
def star(p: int) -> Topology:
    """Non-blocking single switch: every GPU linked to it at BW, latency 0, per-message overhead α."""
    t = Topology(f"star{p}")
    t.add_node("sw", NodeKind.SWITCH)
    for i in range(p):
        t.add_node(f"g{i}", NodeKind.GPU)
        t.add_link(f"g{i}", "sw", BW)
    return t


def servers_topo(m: int, g: int, bw_in: float = 100e9, bw_net: float = 10e9) -> Topology:
    """m servers of g GPUs on an NVSwitch (bw_in), one NIC per GPU (bw_net) on one network switch."""
    t = Topology(f"srv{m}x{g}")
    t.add_node("net", NodeKind.SWITCH)
    for s in range(m):
        srv = f"s{s}"
        t.add_node(f"{srv}.nvs", NodeKind.NVSWITCH, server=srv)
        for i in range(g):
            gpu, nic = f"{srv}.g{i}", f"{srv}.nic{i}"
            t.add_node(nic, NodeKind.NIC, server=srv)
            t.add_node(gpu, NodeKind.GPU, server=srv, nic=nic)
            t.add_link(gpu, f"{srv}.nvs", bw_in)
            t.add_link(gpu, nic, bw_in)
            t.add_link(nic, "net", bw_net)
    return t


def bigraph(n_switches: int, m_per_switch: int, with_meta: bool = True, skip_link: bool = False,
            intra_part_link: bool = False) -> Topology:
    """BiGraph: N/2 upper and N/2 lower switches, complete bipartite; M GPUs attached to each switch."""
    h = n_switches // 2
    t = Topology(f"bigraph{n_switches}x{m_per_switch}")
    upper = [t.add_node(f"u{i}", NodeKind.SWITCH) for i in range(h)]
    lower = [t.add_node(f"l{i}", NodeKind.SWITCH) for i in range(h)]
    for a in upper:
        for b in lower:
            if not (skip_link and a == upper[0] and b == lower[-1]):
                t.add_link(a, b, BW)
    if intra_part_link:
        t.add_link(upper[0], upper[1], BW)
    for sw in upper + lower:
        for k in range(m_per_switch):
            gpu = t.add_node(f"{sw}.g{k}", NodeKind.GPU)
            t.add_link(gpu, sw, BW)
    if with_meta:
        t.meta["bigraph"] = {"upper": upper, "lower": lower}
    return t


def timed(s: Schedule, topo: Topology) -> float:
    return AnalyticalModel(NetworkParams(ALPHA_S)).time_schedule(s, topo).time_s


# ---- expectations from the closed forms ---------------------------------------------------------------
def expected_phases(alg: str, op: CollectiveOp, p: int, meta: dict[str, object]) -> int:
    lg = p.bit_length() - 1
    if alg == "ring":
        if op is AR:
            return 2 * (p - 1)
        if op in (RS, AG):
            return p - 1
        return int(meta["chunks"]) + p - 2  # type: ignore[call-overload]
    if alg in ("halving-doubling", "hdrm"):
        if op is AR:
            return 2 * lg + (0 if cm.is_power_of_two(p) else 2)
        return lg
    if alg == "tree":
        if op is AR:
            return 2 * (int(meta["chunks"]) + int(meta["depth"]) - 1)  # type: ignore[call-overload]
        return math.ceil(math.log2(p))
    return 1 if alg == "direct" else p - 1


def closed_form_s(alg: str, op: CollectiveOp, p: int, n: int, meta: dict[str, object]) -> float:
    a, b = ALPHA_S, BETA
    table = {
        ("ring", AR): lambda: cm.ring_allreduce_s(p, n, a, b),
        ("ring", RS): lambda: cm.ring_reduce_scatter_s(p, n, a, b),
        ("ring", AG): lambda: cm.ring_allgather_s(p, n, a, b),
        ("ring", BC): lambda: cm.ring_broadcast_s(p, n, a, b, chunks=int(meta["chunks"])),  # type: ignore
        ("ring", RD): lambda: cm.ring_reduce_s(p, n, a, b, chunks=int(meta["chunks"])),  # type: ignore
        ("halving-doubling", AR): lambda: cm.hd_allreduce_s(p, n, a, b),
        ("halving-doubling", RS): lambda: cm.hd_reduce_scatter_s(p, n, a, b),
        ("halving-doubling", AG): lambda: cm.hd_allgather_s(p, n, a, b),
        ("tree", AR): lambda: cm.double_tree_allreduce_s(p, n, a, b, chunks=int(meta["chunks"])),  # type: ignore
        ("tree", BC): lambda: cm.tree_broadcast_s(p, n, a, b),
        ("tree", RD): lambda: cm.tree_reduce_s(p, n, a, b),
        ("direct", A2A): lambda: cm.alltoall_direct_s(p, n, a, b),
        ("pairwise", A2A): lambda: cm.alltoall_pairwise_s(p, n, a, b),
    }
    return table[(alg, op)]()


STAR_CASES = [(alg, op) for alg in ("ring", "halving-doubling", "tree", "direct", "pairwise")
              for op in ALGORITHMS[alg].ops]
SIZES = [1000003, 3, 1 << 22]


@pytest.mark.parametrize(("alg", "op"), STAR_CASES, ids=[f"{a}-{o.value}" for a, o in STAR_CASES])
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 16])
def test_algorithms_on_single_switch(alg: str, op: CollectiveOp, p: int) -> None:
    topo = star(p)
    if alg == "halving-doubling" and op is not AR and not cm.is_power_of_two(p):
        with pytest.raises(ConfigError, match="use ring"):
            build_schedule(op, alg, topo, topo.gpus, 1000)
        return
    for n in SIZES:
        s = build_schedule(op, alg, topo, topo.gpus, n)
        check_schedule(s)
        assert s.total_bytes() == cm.wire_bytes(op, alg, p, n)
        assert len(s.phases) == expected_phases(alg, op, p, s.meta)
        want = closed_form_s(alg, op, p, n, s.meta)
        got = timed(s, topo)
        assert got == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("p", [4, 6, 7, 16, 21, 32, 40])
@pytest.mark.parametrize("chunks", [1, 3, 64])
def test_double_tree_matches_closed_form(p: int, chunks: int) -> None:
    topo = star(64)
    n = 1 << 24
    s = build_schedule(AR, "tree", topo, topo.gpus[:p], n, chunks=chunks)
    check_schedule(s)
    want = cm.double_tree_allreduce_s(p, n, ALPHA_S, BETA, chunks=chunks)
    assert timed(s, topo) == pytest.approx(want, rel=0.01)
    # pipelining pays: many chunks approach the bandwidth bound 2nβ
    if chunks == 64:
        assert want < 1.2 * 2 * n * BETA
    # every rank is interior in at most one of the two trees
    from topotrain.collectives.tree import double_trees
    (pa, _), (pb, _) = double_trees(p)
    interior_a = np.isin(np.arange(p), pa[pa >= 0])
    interior_b = np.isin(np.arange(p), pb[pb >= 0])
    assert not np.any(interior_a & interior_b)


def test_default_pipeline_chunks_near_optimum() -> None:
    p, n = 16, 1 << 26
    topo = star(p)
    s = build_schedule(BC, "ring", topo, topo.gpus, n)
    c = int(s.meta["chunks"])  # type: ignore[call-overload]
    c_star = math.sqrt((p - 2) * n * BETA / ALPHA_S)
    assert abs(c - c_star) <= 1
    best = cm.ring_broadcast_s(p, n, ALPHA_S, BETA)
    assert timed(s, topo) == pytest.approx(best, rel=0.01)
    # and the pipeline beats both extremes
    assert best < cm.ring_broadcast_s(p, n, ALPHA_S, BETA, chunks=1)
    assert best < cm.ring_broadcast_s(p, n, ALPHA_S, BETA, chunks=4 * c)
    # close to the bandwidth bound n·β for a big buffer
    assert best < 1.25 * n * BETA


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 64), n=st.integers(1, 10**7), op=st.sampled_from([AR, RS, AG]),
       alg=st.sampled_from(["ring", "halving-doubling"]))
def test_ring_and_hd_verify_random(p: int, n: int, op: CollectiveOp, alg: str) -> None:
    if alg == "halving-doubling" and op is not AR:
        p = 1 << (p.bit_length() - 1)
    topo = star(64)
    s = build_schedule(op, alg, topo, topo.gpus[:p], n)
    check_schedule(s)
    assert s.total_bytes() == cm.wire_bytes(op, alg, p, n)
    assert len(s.phases) == expected_phases(alg, op, p, s.meta)


def test_ring_builds_for_2048_ranks() -> None:
    """Correctness at scale; how fast it builds is benchmarks/schedule_build.py's figure."""
    topo = star(2048)
    s = build_schedule(AR, "ring", topo, topo.gpus, 1 << 30)
    assert len(s.phases) == 2 * 2047 and s.total_bytes() == 2 * 2047 * (1 << 30)


def test_root_option_moves_the_root() -> None:
    topo = star(5)
    for alg in ("ring", "tree"):
        for op in (BC, RD):
            s = build_schedule(op, alg, topo, topo.gpus, 999, root=3)
            check_schedule(s)
            col = s.chunk_src if op is BC else s.chunk_dst
            assert set(col.tolist()) == {3}


# ---- the verifier catches broken schedules -------------------------------------------------------------
def _ring(p: int = 4, n: int = 4000) -> Schedule:
    return build_schedule(AR, "ring", star(p), star(p).gpus, n)


def _with_phases(s: Schedule, phases: list[Phase]) -> Schedule:
    return Schedule(s.op, s.algorithm, s.ranks, s.size_bytes, s.chunk_bytes, s.chunk_src, s.chunk_dst,
                    tuple(phases), {})


def test_verifier_rejects_broken_schedules() -> None:
    s = _ring()
    with pytest.raises(ScheduleError, match="misses ranks"):
        check_schedule(_with_phases(s, list(s.phases[:-1])))  # allgather one step short
    ph = s.phases[0]
    def again(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, a[:1]])

    dup = Phase.of(again(ph.src), again(ph.dst), again(ph.chunk_lo), again(ph.chunk_hi), True)
    with pytest.raises(ScheduleError, match="double counting"):
        check_schedule(_with_phases(s, [dup, *s.phases[1:]]))
    swapped = [s.phases[1], s.phases[0], *s.phases[2:]]  # reduce order changed: a rank re-adds its own data
    with pytest.raises(ScheduleError):
        check_schedule(_with_phases(s, swapped))
    with pytest.raises(ScheduleError, match="itself"):
        check_schedule(_with_phases(s, [Phase.of([0], [0], [0], [1], True)]))
    with pytest.raises(ScheduleError, match="chunk range"):
        check_schedule(_with_phases(s, [Phase.of([0], [1], [2], [9], True)]))
    bc = build_schedule(BC, "tree", star(4), star(4).gpus, 100)
    with pytest.raises(ScheduleError, match="does not hold"):
        check_schedule(_with_phases(bc, [Phase.of([1], [2], [0], [1], False), *bc.phases]))
    two_copies = Phase.of([0, 1], [2, 2], [0, 0], [1, 1], False)
    with pytest.raises(ScheduleError, match="several"):
        check_schedule(_with_phases(s, [two_copies]))


# ---- hierarchical and 2D torus on servers ----------------------------------------------------------------
@pytest.mark.parametrize(("m", "g"), [(2, 4), (4, 2), (3, 2), (2, 1), (1, 4)])
@pytest.mark.parametrize("inter", ["ring", "halving-doubling"])
def test_hierarchical_on_servers(m: int, g: int, inter: str) -> None:
    bw_in, bw_net = 100e9, 10e9
    topo = servers_topo(m, g, bw_in, bw_net)
    p = m * g
    for n in (1000003, 5, 1 << 24):
        s = build_schedule(AR, "hierarchical", topo, topo.gpus, n, inter=inter)
        check_schedule(s)
        assert s.total_bytes() == cm.wire_bytes(AR, "hierarchical", p, n, g=g, m=m, inter=inter)
        inter_steps = 2 * (m - 1) if inter == "ring" else expected_phases("halving-doubling", AR, m, {})
        assert len(s.phases) == 2 * (g - 1) + (inter_steps if m > 1 else 0)
        want = cm.hierarchical_allreduce_s(g, m, n, ALPHA_S, 1 / bw_in, ALPHA_S, 1 / bw_net, inter=inter)
        assert timed(s, topo) == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize(("m", "g"), [(2, 4), (4, 2), (3, 2), (2, 1), (1, 4), (3, 3)])
@pytest.mark.parametrize("op", [RS, AG])
def test_hierarchical_reduce_scatter_allgather(m: int, g: int, op: CollectiveOp) -> None:
    bw_in, bw_net = 100e9, 10e9
    topo = servers_topo(m, g, bw_in, bw_net)
    p = m * g
    for n in (1000003, 5, 1 << 24):
        s = build_schedule(op, "hierarchical", topo, topo.gpus, n)
        check_schedule(s)  # chunk r ends at (starts from) rank r: the torch layout
        assert s.total_bytes() == cm.wire_bytes(op, "ring", p, n)
        assert len(s.phases) == (g - 1) + (m - 1)
        want = cm.hierarchical_scatter_s(g, m, n, ALPHA_S, 1 / bw_in, ALPHA_S, 1 / bw_net)
        assert timed(s, topo) == pytest.approx(want, rel=0.01)
    if m > 1 and g > 1:  # only 1/g of the data crosses the network: faster than the flat ring
        n = 1 << 24
        assert timed(build_schedule(op, "hierarchical", topo, topo.gpus, n), topo) < 0.5 * timed(
            build_schedule(op, "ring", topo, topo.gpus, n), topo)
    with pytest.raises(ConfigError, match="inter"):
        build_schedule(op, "hierarchical", topo, topo.gpus, 100, inter="halving-doubling")


def test_hierarchical_beats_flat_ring_across_servers() -> None:
    topo = servers_topo(2, 4)
    n = 1 << 26
    hier = timed(build_schedule(AR, "hierarchical", topo, topo.gpus, n), topo)
    # the flat ring in GPU order crosses the network on 2 of its 8 hops, every step
    flat = timed(build_schedule(AR, "ring", topo, topo.gpus, n), topo)
    assert hier < flat


def test_torus2d_default_and_dims() -> None:
    topo = servers_topo(2, 4)
    n = 1 << 24
    s = build_schedule(AR, "torus2d", topo, topo.gpus, n)
    check_schedule(s)
    assert s.meta["dims"] == (4, 2)
    assert len(s.phases) == 2 * 3 + 2 * 1
    assert timed(s, topo) == pytest.approx(
        cm.hierarchical_allreduce_s(4, 2, n, ALPHA_S, 1 / 100e9, ALPHA_S, 1 / 10e9), rel=0.01)
    sw = star(12)
    for dims in [(3, 4), (4, 3), (2, 6), (12, 1), (1, 12)]:
        s = build_schedule(AR, "torus2d", sw, sw.gpus, 1000003, dims=dims)
        check_schedule(s)
        x, y = dims
        assert len(s.phases) == 2 * (x - 1) + 2 * (y - 1)
        assert s.total_bytes() == cm.wire_bytes(AR, "torus2d", 12, 1000003)
        assert timed(s, sw) == pytest.approx(cm.torus2d_allreduce_s(x, y, 1000003, ALPHA_S, BETA), rel=0.01)
    with pytest.raises(ConfigError, match="dims"):
        build_schedule(AR, "torus2d", sw, sw.gpus, 100, dims=(5, 2))


def test_two_level_config_errors() -> None:
    topo = servers_topo(2, 4)
    uneven = topo.gpus[:7]
    with pytest.raises(ConfigError, match="as many ranks in every server"):
        build_schedule(AR, "hierarchical", topo, uneven, 100)
    with pytest.raises(ConfigError, match="inter"):
        build_schedule(AR, "hierarchical", topo, topo.gpus, 100, inter="tree")
    with pytest.raises(ConfigError, match="no server"):
        build_schedule(AR, "hierarchical", star(4), star(4).gpus, 100)
    with pytest.raises(ConfigError, match="no server"):
        build_schedule(AR, "torus2d", star(4), star(4).gpus, 100)


# ---- HDRM on BiGraph --------------------------------------------------------------------------------------
def switch_link_loads(s: Schedule, topo: Topology) -> list[int]:
    """Max number of transfers on any directed switch→switch link, per phase."""
    sw = {n for n, nd in topo.nodes.items() if nd.kind is NodeKind.SWITCH}
    out = []
    for ph in s.phases:
        count: dict[int, int] = {}
        for a, b in zip(ph.src.tolist(), ph.dst.tolist(), strict=True):
            for lid in topo.route(s.ranks[a], s.ranks[b]):
                lk = topo.links[lid]
                if lk.src in sw and lk.dst in sw:
                    count[lid] = count.get(lid, 0) + 1
        out.append(max(count.values(), default=0))
    return out


@pytest.mark.parametrize(("n_sw", "m"), [(4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8)])
def test_hdrm_partners_cross_parts_and_links_balance(n_sw: int, m: int) -> None:
    topo = bigraph(n_sw, m)
    ranks = topo.gpus
    p = len(ranks)
    upper, _ = bigraph_parts(topo)
    of_rank = rank_switches(topo, ranks)
    part = np.array([sw in upper for sw in of_rank])
    n = 1 << 22
    s = build_schedule(AR, "hdrm", topo, ranks, n)
    check_schedule(s)
    assert len(s.phases) == 2 * int(math.log2(p))
    assert sorted(s.meta["mapping"]) == list(range(p))  # type: ignore[call-overload]
    for ph in s.phases:
        assert np.all(part[ph.src] != part[ph.dst])
    bound = math.ceil(m / (n_sw // 2))
    assert max(switch_link_loads(s, topo)) == bound
    ident = build_schedule(AR, "halving-doubling", topo, ranks, n)
    if m >= 2:  # identity: the step between the two parts puts all M ranks of a switch on one link
        assert max(switch_link_loads(ident, topo)) >= m > bound
        assert timed(s, topo) < timed(ident, topo)
    t_hdrm = timed(s, topo)
    if bound == 1:  # congestion-free: the closed form of halving-doubling on a non-blocking network
        assert t_hdrm == pytest.approx(cm.hdrm_allreduce_s(p, n, ALPHA_S, BETA), rel=0.01)


def test_hdrm_reduce_scatter_allgather_and_orientation() -> None:
    topo = bigraph(8, 4, with_meta=False)
    for op in (RS, AG):
        s = build_schedule(op, "hdrm", topo, topo.gpus, 1000003)
        check_schedule(s)
        assert s.total_bytes() == cm.wire_bytes(op, "hdrm", 32, 1000003)
        assert max(switch_link_loads(s, topo)) == 1
    upper, lower = bigraph_parts(topo)
    assert upper == ["u0", "u1", "u2", "u3"] and lower == ["l0", "l1", "l2", "l3"]
    # a subset of ranks, spread over both parts: still cross-part in every step
    ranks = [g for g in topo.gpus if g.endswith((".g0", ".g1"))]
    order = hdrm_mapping(topo, ranks)
    assert sorted(order.tolist()) == list(range(16))


def test_hdrm_config_errors() -> None:
    with pytest.raises(ConfigError, match="bipartite"):
        build_schedule(AR, "hdrm", star(4), star(4).gpus, 100)
    t = bigraph(4, 2, intra_part_link=True)
    with pytest.raises(ConfigError, match="bipartite"):
        build_schedule(AR, "hdrm", t, t.gpus, 100)
    t = bigraph(4, 2, skip_link=True)
    with pytest.raises(ConfigError, match="no link"):
        build_schedule(AR, "hdrm", t, t.gpus, 100)
    t = bigraph(4, 2)
    with pytest.raises(ConfigError, match="power-of-two"):
        build_schedule(AR, "hdrm", t, t.gpus[:6], 100)
    with pytest.raises(ConfigError, match="half of the ranks"):
        build_schedule(AR, "hdrm", t, t.gpus[:4], 100)  # all on the upper part
    t = bigraph(4, 2, with_meta=False)
    t.meta["bigraph"] = {"upper": ["u0", "l0"], "lower": ["u1", "l1"]}
    with pytest.raises(ConfigError, match="bigraph"):
        build_schedule(AR, "hdrm", t, t.gpus, 100)


# ---- registry ---------------------------------------------------------------------------------------------
def test_registry_names_and_lookup() -> None:
    assert list(ALGORITHMS) == ["ring", "halving-doubling", "tree", "hierarchical", "torus2d", "hdrm",
                                "synth", "direct", "pairwise"]
    assert algorithms_for("all-to-all") == ["direct", "pairwise"]
    # synth last among allreduce algorithms: auto keeps the first of equal times
    assert algorithms_for(AR) == ["ring", "halving-doubling", "tree", "hierarchical", "torus2d", "hdrm", "synth"]
    assert "tree" in algorithms_for("broadcast") and "hdrm" not in algorithms_for("broadcast")
    topo = star(4)
    s = build_schedule("allreduce", "hd", topo, topo.gpus, 1024)
    assert s.algorithm == "halving-doubling"


def test_registry_config_errors() -> None:
    topo = star(4)
    gpus = topo.gpus
    with pytest.raises(ConfigError, match="unknown collective 'allsum'"):
        build_schedule("allsum", "ring", topo, gpus, 100)
    with pytest.raises(ConfigError, match="ring, halving-doubling, tree"):
        build_schedule(AR, "magic", topo, gpus, 100)
    with pytest.raises(ConfigError, match="algorithm 'direct' does not do allreduce; it does all-to-all"):
        build_schedule(AR, "direct", topo, gpus, 100)
    with pytest.raises(ConfigError, match="does not do broadcast"):
        build_schedule(BC, "hdrm", topo, gpus, 100)
    for bad in (0, -5, 1.5):
        with pytest.raises(ConfigError, match="size"):
            build_schedule(AR, "ring", topo, gpus, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no ranks"):
        build_schedule(AR, "ring", topo, [], 100)
    with pytest.raises(ConfigError, match="listed twice"):
        build_schedule(AR, "ring", topo, [gpus[0], gpus[1], gpus[0]], 100)
    with pytest.raises(ConfigError, match="not a GPU"):
        build_schedule(AR, "ring", topo, [gpus[0], "sw"], 100)
    with pytest.raises(ConfigError, match="not in the topology"):
        build_schedule(AR, "ring", topo, [gpus[0], "nope"], 100)
    with pytest.raises(ConfigError, match="no option 'chunk'"):
        build_schedule(BC, "ring", topo, gpus, 100, chunk=4)
    with pytest.raises(ConfigError, match="chunks"):
        build_schedule(BC, "ring", topo, gpus, 100, chunks=0)
    with pytest.raises(ConfigError, match="root"):
        build_schedule(BC, "tree", topo, gpus, 100, root=4)


@pytest.mark.parametrize("alg", list(ALGORITHMS))
def test_one_rank_is_an_empty_valid_schedule(alg: str) -> None:
    topo = star(2)
    for op in ALGORITHMS[alg].ops:
        s = build_schedule(op, alg, topo, topo.gpus[:1], 4096)
        assert s.phases == () and s.total_bytes() == 0
        check_schedule(s)


# ---- cost model --------------------------------------------------------------------------------------------
def test_costmodel_identities() -> None:
    p, n = 16, 1e8
    # HD and ring move the same bytes per rank; HD needs fewer steps
    assert cm.hd_allreduce_s(p, n, 0.0, BETA) == pytest.approx(cm.ring_allreduce_s(p, n, 0.0, BETA))
    assert cm.hd_allreduce_s(p, n, ALPHA_S, BETA) < cm.ring_allreduce_s(p, n, ALPHA_S, BETA)
    # the fold: 2 extra steps of the whole buffer
    assert cm.hd_allreduce_s(12, n, ALPHA_S, BETA) == pytest.approx(
        cm.hd_allreduce_s(8, n, ALPHA_S, BETA) + 2 * (ALPHA_S + n * BETA))
    # torus with Y = 1 is a ring; hierarchical with one NIC speed is the torus
    assert cm.torus2d_allreduce_s(8, 1, n, ALPHA_S, BETA) == pytest.approx(
        cm.ring_allreduce_s(8, n, ALPHA_S, BETA))
    assert cm.hierarchical_allreduce_s(4, 8, n, ALPHA_S, BETA, ALPHA_S, BETA) == pytest.approx(
        cm.torus2d_allreduce_s(4, 8, n, ALPHA_S, BETA))
    assert cm.bus_factor(AR, 8) == pytest.approx(1.75)
    assert cm.bus_factor("all-to-all", 8) == pytest.approx(0.875)
    assert cm.bus_factor(BC, 8) == 1.0
    assert cm.wire_bytes(AR, "ring", 8, 100) == 1400
    assert cm.wire_bytes(AG, "ring", 8, 100) == 700
    assert cm.wire_bytes(AR, "hd", 6, 100) == 2 * 3 * 100 + 2 * 2 * 100
    # busbw of the best allreduce equals the link speed
    t = cm.ring_allreduce_s(8, n, 0.0, BETA)
    assert n / t * cm.bus_factor(AR, 8) == pytest.approx(BW)
    with pytest.raises(ConfigError, match="op"):
        cm.bus_factor("allsum", 4)


@pytest.mark.parametrize(("alg", "p"), [("ring", 3), ("ring", 9), ("halving-doubling", 8), ("halving-doubling", 9)])
def test_uneven_buffer_splits_into_equal_steps(alg: str, p: int) -> None:
    """A buffer that ``p`` does not divide is cut into equal fractional chunks, not integers a byte apart: every
    transfer of a step carries the same bytes to the bit (also across the groups of a merged schedule), so the
    step-wise closed form (Thakur et al. 2005) holds to rounding, on the analytical and the flow model alike."""
    n = 9 * 8 * 1_000_003 + 5  # divisible by neither 8 nor 9
    assert split_bytes(9 * 1000, 9).dtype == np.int64 and split_bytes(9 * 1000, 9).tolist() == [1000] * 9
    parts = split_bytes(n, p)
    assert parts.dtype == np.float64 and len(set(parts.tolist())) == 1
    assert float(parts.sum()) == pytest.approx(n, rel=1e-15)
    topo = star(4 * p)
    groups = [build_schedule(AR, alg, topo, topo.gpus[g * p:(g + 1) * p], n) for g in range(4)]
    check_schedule(groups[0])
    for s in (groups[0], merge_schedules(groups)):
        for ph in s.phases:
            assert len(set(s.transfer_bytes(ph).tolist())) == 1
    s = groups[0]
    want = (cm.ring_allreduce_s if alg == "ring" else cm.hd_allreduce_s)(p, n, ALPHA_S, BETA)
    assert timed(s, topo) == pytest.approx(want, rel=1e-12)
    assert FlowModel(NetworkParams(ALPHA_S)).time_schedule(s, topo).time_s == pytest.approx(want, rel=1e-12)
    assert s.total_bytes() == cm.wire_bytes(AR, alg, p, n)
