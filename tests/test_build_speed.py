"""The shortcuts that make a training iteration cheap to build and run give what the plain ways give, bit for
bit: merged schedules, the per-link byte tally, pipeline sends on the wire, memoized bottleneck kinds."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.collectives.protocol import on_the_wire
from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import Phase, Schedule, merge_schedules
from topotrain.network.base import LinkBytesTally
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.training.p2p import _p2p, _p2p_schedules
from topotrain.util.errors import ConfigError


def _merge_one_by_one(schedules: list[Schedule]) -> Schedule:
    """merge_schedules as it was written first: offsets added schedule by schedule, phase by phase."""
    ranks: list[str] = []
    chunk_bytes, chunk_src, chunk_dst, rank_off, chunk_off = [], [], [], [], []
    r0 = c0 = 0
    for s in schedules:
        rank_off.append(r0)
        chunk_off.append(c0)
        ranks.extend(s.ranks)
        chunk_bytes.append(s.chunk_bytes)
        chunk_src.append(np.where(s.chunk_src >= 0, s.chunk_src + r0, -1))
        chunk_dst.append(np.where(s.chunk_dst >= 0, s.chunk_dst + r0, -1))
        r0 += s.num_ranks
        c0 += s.num_chunks
    phases = []
    for k in range(max(len(s.phases) for s in schedules)):
        parts = [(s.phases[k], ro, co) for s, ro, co in zip(schedules, rank_off, chunk_off, strict=True)
                 if k < len(s.phases)]
        phases.append(Phase(np.concatenate([p.src + ro for p, ro, _ in parts]),
                            np.concatenate([p.dst + ro for p, ro, _ in parts]),
                            np.concatenate([p.chunk_lo + co for p, _, co in parts]),
                            np.concatenate([p.chunk_hi + co for p, _, co in parts]),
                            np.concatenate([p.reduce for p, _, _ in parts])))
    first = schedules[0]
    return Schedule(first.op, first.algorithm, tuple(ranks), max(s.size_bytes for s in schedules),
                    np.concatenate(chunk_bytes), np.concatenate(chunk_src), np.concatenate(chunk_dst),
                    tuple(phases), {"merged": len(schedules)})


def _same_arrays(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def test_merged_schedules_equal_the_one_by_one_merge() -> None:
    c = cluster_from_dict({"server": "single-gpu", "servers": 16, "network": {"topology": "single-switch"}})
    gpus = c.topology.gpus
    schedules = [build_schedule("allreduce", "ring", c.topology, gpus[:4], 1 << 20),
                 build_schedule("allreduce", "halving-doubling", c.topology, gpus[4:12], 3 << 20),
                 build_schedule("allgather", "ring", c.topology, gpus[12:15], 12345),
                 _p2p(gpus[15], gpus[0], 777)]
    for group in (schedules, schedules[::-1], schedules[3:] * 5, schedules[:2]):
        got, want = merge_schedules(group), _merge_one_by_one(group)
        assert got.ranks == want.ranks and got.size_bytes == want.size_bytes and got.meta == want.meta
        for name in ("chunk_bytes", "chunk_src", "chunk_dst"):
            assert _same_arrays(getattr(got, name), getattr(want, name))
        assert len(got.phases) == len(want.phases)
        for pg, pw in zip(got.phases, want.phases, strict=True):
            for name in ("src", "dst", "chunk_lo", "chunk_hi", "reduce"):
                assert _same_arrays(getattr(pg, name), getattr(pw, name))


@pytest.mark.parametrize("seed", range(6))
def test_link_bytes_tally_equals_adding_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 50
    arrays = {f"k{i}": np.floor(rng.uniform(0, 1e12, n)) for i in range(5)}
    arrays["big"] = np.full(n, 2.0**52 + 1.0)  # sums past 2**53: the tally adds again in order
    arrays["frac"] = rng.uniform(0, 1e9, n)  # not whole: from here on, one by one
    keys = [str(k) for k in rng.choice(list(arrays)[:5], 40)]
    if seed % 3 == 1:
        keys += ["big"] * 3 + keys[:5]
    if seed % 3 == 2:
        keys += ["frac", *keys[:7], "frac"]
    tally = LinkBytesTally(n)
    plain = np.zeros(n)
    for k in keys:
        tally.add(arrays[k], k)
        plain += arrays[k]
    assert tally.total().tobytes() == plain.tobytes()
    tally.add(arrays["k0"] + 0.5, None)  # no key: one by one as well
    plain += arrays["k0"] + 0.5
    assert tally.total().tobytes() == plain.tobytes()


def test_pipeline_sends_on_the_wire_equal_one_schedule_each() -> None:
    c = cluster_from_dict({"server": "nvswitch-8", "servers": 4,
                           "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    pairs = [(g[0], g[9]), (g[1], g[2]), (g[3], g[31]), (g[8], g[16]), (g[4], g[5])]
    for size in (1000, 10**8):
        got = _p2p_schedules(c.topology, pairs, size)
        for (a, b), s in zip(pairs, got, strict=True):
            want = on_the_wire(_p2p(a, b, size), c.topology)
            assert s.ranks == want.ranks == (a, b) and s.meta == want.meta
            assert _same_arrays(s.chunk_bytes, want.chunk_bytes)


def _same_schedule(a: Schedule, b: Schedule) -> bool:
    arrays = ("chunk_bytes", "chunk_src", "chunk_dst")
    phase_arrays = ("src", "dst", "chunk_lo", "chunk_hi", "reduce")
    return (a.op == b.op and a.algorithm == b.algorithm and a.ranks == b.ranks and a.size_bytes == b.size_bytes
            and a.meta == b.meta and all(_same_arrays(getattr(a, n), getattr(b, n)) for n in arrays)
            and len(a.phases) == len(b.phases)
            and all(_same_arrays(getattr(pa, n), getattr(pb, n))
                    for pa, pb in zip(a.phases, b.phases, strict=True) for n in phase_arrays))


def test_labels_only_algorithms_build_relabelled_schedules() -> None:
    from topotrain.collectives.registry import ALGORITHMS, relabelled

    c = cluster_from_dict({"server": "nvswitch-8", "servers": 4,
                           "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    flagged = [info for info in ALGORITHMS.values() if info.labels_only]
    assert {info.name for info in flagged} >= {"ring", "halving-doubling", "pairwise"}
    for info in flagged:
        for op in info.labels_only:
            for p in (2, 6, 8):
                a, b = g[:p], [g[31 - 3 * i] for i in range(p)]
                try:
                    first = build_schedule(op, info.name, c.topology, a, 3 << 20)
                except ConfigError:
                    continue
                assert _same_schedule(relabelled(first, b), build_schedule(op, info.name, c.topology, b, 3 << 20))


def _bigraph_parts_by_networkx(topo: Topology) -> tuple[list[str], list[str]] | str:
    """HDRM's BiGraph parts as first written, on networkx's bipartite tests (the error's message otherwise)."""
    import networkx as nx

    switches = topo.nodes_of_kind(NodeKind.SWITCH)
    sub = topo.graph.subgraph(switches)
    if len(switches) < 2 or not nx.is_bipartite(sub):
        return "do not form a bipartite graph"
    if not nx.is_connected(sub):
        return "are not connected to each other"
    color = nx.bipartite.color(sub)
    first = color[switches[0]]
    upper = [s for s in switches if color[s] == first]
    lower = [s for s in switches if color[s] != first]
    for u in upper:
        for v in lower:
            if not sub.has_edge(u, v):
                return f"switch {u!r} has no link to switch {v!r}"
    return upper, lower


@pytest.mark.parametrize("network", [
    {"topology": "bigraph"}, {"topology": "fat-tree"}, {"topology": "leaf-spine"}, {"topology": "single-switch"},
    {"topology": "torus", "dims": [4, 4]}, {"topology": "torus", "dims": [3, 3]}, {"topology": "ring"},
    {"topology": "dragonfly"}, {"topology": "rail-optimized"}])
def test_bigraph_parts_as_networkx_finds_them(network: dict[str, object]) -> None:
    from topotrain.collectives.hdrm import _bigraph_parts

    c = cluster_from_dict({"server": "single-gpu", "servers": 16, "network": {"link": "eth-100g", **network}})
    want = _bigraph_parts_by_networkx(c.topology)
    try:
        got: tuple[list[str], list[str]] | str = _bigraph_parts(c.topology)
    except ConfigError as e:
        got = e.message
    if isinstance(want, str):
        assert isinstance(got, str) and want in got
    else:
        assert got == want


@pytest.mark.parametrize("algo, size", [("ring", 2**20), ("ring", 1000003), ("halving-doubling", 3 * 2**20 + 5),
                                        ("tree", 2**20)])
def test_phase_signatures_tell_phases_apart_as_phase_key(algo: str, size: int) -> None:
    """time_phases' cheaper signatures (pair arrays told apart once, uniform sizes by count and value) are equal
    for two phases exactly when their phase_key bytes are."""
    from topotrain.collectives.schedule import phase_key
    from topotrain.network.base import _PhaseSignatures

    c = cluster_from_dict({"server": "nvswitch-8", "servers": 2, "network": {"topology": "leaf-spine",
                                                                             "link": "ib-hdr-200g"}})
    sched = build_schedule("allreduce", algo, c.topology, c.topology.gpus, size)
    sig = _PhaseSignatures()
    keys = [phase_key(sched, ph) for ph in sched.phases]
    sigs = [sig.of(sched, ph) for ph in sched.phases]
    for i in range(len(keys)):
        for j in range(len(keys)):
            assert (keys[i] == keys[j]) == (sigs[i] == sigs[j]), (i, j)
    assert len(set(sigs)) < len(sigs) or algo != "ring"  # a ring's phases repeat
