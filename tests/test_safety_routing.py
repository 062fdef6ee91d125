"""Monotonic where physics is (issue 19, part 4): making one link faster never makes a collective slower by
more than rounding, in any network model — on random switch graphs (hypothesis) and on the case the old
widest-next-hop routing got wrong. Routes are the best whole paths (fewest hops, least latency, widest
bottleneck), so a faster link never hands a pair a narrower or slower path."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import CollectiveOp
from topotrain.network.registry import get_model
from topotrain.topology import Topology

GB = 1e9
CAPS = [2.5 * GB, 10 * GB, 25 * GB]
LATS = [5e-7, 2e-6]
MODELS = ("analytical", "flow", "flow-async", "flow-eager")
#: "More than rounding": event-driven models add and subtract times, so allow a few parts per billion.
REL_TOL = 1e-9


@dataclass(frozen=True)
class Graph:
    parents: tuple[int, ...]  # switch i+1 hangs below switch parents[i]
    extra: tuple[tuple[int, int], ...]  # extra switch-to-switch links
    caps: tuple[int, ...]  # capacity index of each switch link (tree links first, then extra)
    lats: tuple[int, ...]
    gpus: tuple[int, ...]  # the switch each GPU hangs on

    def links(self) -> list[tuple[str, str]]:
        out = [(f"sw{p}", f"sw{i + 1}") for i, p in enumerate(self.parents)]
        seen = {frozenset(e) for e in out}
        for a, b in self.extra:
            e = (f"sw{a}", f"sw{b}")
            if a != b and frozenset(e) not in seen:
                seen.add(frozenset(e))
                out.append(e)
        return out

    def topology(self, faster: int | None = None, factor: float = 4.0) -> Topology:
        t = Topology("random")
        for i in range(len(self.parents) + 1):
            t.add_node(f"sw{i}", "switch")
        for i, (a, b) in enumerate(self.links()):
            bw = CAPS[self.caps[i % len(self.caps)]] * (factor if i == faster else 1.0)
            t.add_link(a, b, bw, LATS[self.lats[i % len(self.lats)]])
        for g, sw in enumerate(self.gpus):
            t.add_node(f"g{g}", "gpu")
            t.add_link(f"g{g}", f"sw{sw}", 25 * GB, 5e-7)
        return t


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    n_sw = draw(st.integers(2, 6))
    parents = tuple(draw(st.integers(0, i)) for i in range(n_sw - 1))
    extra = tuple(draw(st.lists(st.tuples(st.integers(0, n_sw - 1), st.integers(0, n_sw - 1)), max_size=5)))
    n_links = n_sw - 1 + len(extra)
    caps = tuple(draw(st.lists(st.integers(0, len(CAPS) - 1), min_size=n_links, max_size=n_links)))
    lats = tuple(draw(st.lists(st.integers(0, len(LATS) - 1), min_size=n_links, max_size=n_links)))
    gpus = tuple(draw(st.lists(st.integers(0, n_sw - 1), min_size=3, max_size=7)))
    return Graph(parents, extra, caps, lats, gpus)


def _times(topo: Topology, op: CollectiveOp, algo: str) -> dict[str, float]:
    sched = build_schedule(op, algo, topo, topo.gpus, 64 * 2**20)
    return {m: get_model(m).time_schedule(sched, topo).time_s for m in MODELS}


def _path_costs(topo: Topology) -> dict[tuple[str, str], tuple[int, float, float]]:
    out = {}
    for a in topo.gpus:
        for b in topo.gpus:
            if a != b:
                r = topo.route(a, b)
                out[(a, b)] = (len(r), sum(topo.links[i].latency_s for i in r),
                               min(topo.links[i].bandwidth_bytes_per_s for i in r))
    return out


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.integers(0, 20), st.sampled_from([(CollectiveOp.ALLREDUCE, "ring"),
                                                      (CollectiveOp.ALLGATHER, "ring")]))
def test_a_faster_link_never_slows_a_ring(g: Graph, which: int, op_algo: tuple[CollectiveOp, str]) -> None:
    faster = which % len(g.links())
    base, fast = g.topology(), g.topology(faster)
    # every pair's route: same hops and latency, a bottleneck at least as wide
    before, after = _path_costs(base), _path_costs(fast)
    for pair, (hops, lat, bw) in before.items():
        h2, l2, b2 = after[pair]
        assert h2 == hops and l2 <= lat * (1 + REL_TOL) and b2 >= bw * (1 - REL_TOL), (pair, before[pair], after[pair])
    t0, t1 = _times(base, *op_algo), _times(fast, *op_algo)
    for m in MODELS:
        assert t1[m] <= t0[m] * (1 + REL_TOL), (m, t0[m], t1[m])


def test_wide_first_hop_into_a_narrow_one_is_not_taken() -> None:
    """Two 2-hop ways from sw0 to sw3: via sw1 (25 GB/s then 2.5 GB/s) or via sw2 (10 then 10). The old
    greedy routing took the wide first hop; the best path is the 10/10 one, and speeding up sw0–sw1 ×4
    (which made the old routing prefer it) leaves it."""
    def topo(first_hop_bw: float) -> Topology:
        t = Topology("diamond")
        for i in range(4):
            t.add_node(f"sw{i}", "switch")
        t.add_link("sw0", "sw1", first_hop_bw, 1e-6)
        t.add_link("sw1", "sw3", 2.5 * GB, 1e-6)
        t.add_link("sw0", "sw2", 10 * GB, 1e-6)
        t.add_link("sw2", "sw3", 10 * GB, 1e-6)
        for g, sw in enumerate(("sw0", "sw0", "sw0", "sw3", "sw3", "sw3")):
            t.add_node(f"g{g}", "gpu")
            t.add_link(f"g{g}", sw, 25 * GB, 5e-7)
        return t

    slow, fast = topo(10 * GB), topo(40 * GB)
    for t in (slow, fast):
        assert [t.links[i].dst for i in t.route("g0", "g3")] == ["sw0", "sw2", "sw3", "g3"]
    t0, t1 = _times(slow, CollectiveOp.ALLREDUCE, "ring"), _times(fast, CollectiveOp.ALLREDUCE, "ring")
    for m in MODELS:
        assert t1[m] <= t0[m] * (1 + REL_TOL), (m, t0[m], t1[m])
