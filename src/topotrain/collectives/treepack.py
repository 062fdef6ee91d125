"""Fractional packing of spanning trees over a topology's routed rank pairs, and the allreduce lower bound.

**Packing.** A spanning tree ``T`` of the ranks, each tree edge ``{u, v}`` a routed pair, carries an
allreduce at rate ``x_T`` (bytes/s) when every directed link ``l`` on the routes ``u→v`` and ``v→u`` of
its edges has room: reduce sends each byte once child→parent, broadcast once parent→child, so
``Σ_T x_T · a_T[l] <= c_l`` where ``a_T[l]`` counts the tree's edges whose routes cross ``l``. Maximising
``R = Σ_T x_T`` is a linear program over exponentially many trees, solved by column generation (the
path/tree formulation of TACCL, Shah et al. NSDI 2023, and TE-CCL, Liu et al. SIGCOMM 2024, restricted to
trees as Blink does, Wang et al. MLSys 2020): the restricted master LP is solved with HiGHS (``highspy``),
its link duals ``y`` price every rank pair ``w(u, v) = Σ_{l ∈ route(u,v) ∪ route(v,u)} y_l``, and a minimum
spanning tree under ``w`` (Prim) is the column with the most negative reduced cost, added while
``w(MST) < 1``. LP duality certifies the answer at every iteration: ``y / w(MST)`` is dual feasible, so
``R* <= (y · c) / w(MST)`` — the packing stops when that bound is met (to ``tol``), or at the time budget,
keeping the best packing found (feasible at every step) and the certified gap.

**Lower bound** (:func:`allreduce_lower_bound_s`). Without in-network reduction, computing a sum at every
rank needs at least ``2(k − 1)`` one-way transfers of each element between ``k`` parts that each hold a
rank (reduction of ``k`` values, then distribution: Patarasuk & Yuan, JPDC 2009, whose per-node form is
``2(p−1)/p · S/B``). Given disjoint *regions* (vertex sets, each holding one part's ranks) every such
transfer leaves its source region, so ``T >= 2(k−1)·S / Σ_X C_out(X)`` (``C_out`` counting the links that
routes between ranks use: transfers follow the topology's routes); each region must also send and
receive ``S``: ``T >= S / C_out(X)``, ``S / C_in(X)``. The regions tried: every rank alone; every rank with the
nodes that all its routes leave through (its PCIe switch and NIC, up to the first node another rank's routes
share); every server (its GPUs, NICs and PCIe fabric); and — on a graph whose nodes are all ranks — the
exact minimum over all vertex partitions, which by Nash-Williams (1961) and Tutte (1961), in the fractional
matroid-base-packing form of Edmonds (1965/1973), equals the maximum fractional packing of spanning trees of
the graph with each edge's capacity the mean of its two directions (solved by the same column generation, its
dual bound taken). Tree-packing allreduce meets that bound on such graphs, up to pipeline fill and message overheads.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

#: ranks above which synthesis is refused: the complete rank graph has p(p−1)/2 routed pairs, and a tree schedule
#: on more ranks costs the flow models more than it gains over the two-level built-ins
MAX_SYNTH_RANKS = 64
#: column-generation stop: the certified packing bound met to this relative gap
PACKING_TOL = 1e-4
#: column-generation iterations at most (the deterministic stop: a packing's answer never depends on the clock)
MAX_ITERATIONS = 400
#: the default wall-clock guard of a packing: far above what MAX_ITERATIONS takes on the shipped examples (a
#: 64-GPU DGX-A100 rail cluster: 273 iterations, 5.4-8.7 s on a loaded 2-core machine), so that a result is
#: cut by the clock only on a pathological solve, where it is flagged ``budget_hit`` (and then depends on the
#: machine's speed). It was 10 s, which a loaded machine hit on that example: the answer moved between runs.
DEFAULT_TIME_BUDGET_S = 120.0


@dataclass(frozen=True, eq=False)
class TreePacking:
    """Spanning trees of ``ranks`` (indices) with their rates, best first.

    ``edges[t]``: the ``p − 1`` edges ``(u, v)`` of tree ``t`` (rank indices); ``rates_bytes_per_s[t]``:
    its share; ``total_bytes_per_s`` the packing's sum; ``bound_bytes_per_s`` the LP's certified upper
    bound on any packing of these routed pairs; ``optimal`` whether they meet to :data:`PACKING_TOL`;
    ``budget_hit`` whether the time budget stopped the search (the packing is then the best so far)."""

    ranks: tuple[str, ...]
    edges: tuple[np.ndarray, ...]
    rates_bytes_per_s: np.ndarray
    bound_bytes_per_s: float
    optimal: bool
    budget_hit: bool
    iterations: int
    solve_s: float

    @property
    def total_bytes_per_s(self) -> float:
        return float(self.rates_bytes_per_s.sum())

    @property
    def num_trees(self) -> int:
        return len(self.edges)


@dataclass(frozen=True, eq=False)
class _PairGraph:
    """Routable rank pairs ``(iu[k], ju[k])`` (iu < ju), each consuming resources ``res[ptr[k]:ptr[k+1]]``
    (one entry per use) of capacity ``cap`` (bytes/s)."""

    p: int
    iu: np.ndarray
    ju: np.ndarray
    ptr: np.ndarray
    res: np.ndarray
    cap: np.ndarray


def _routed_pairs(topo: Topology, ranks: Sequence[str]) -> _PairGraph:
    """Every rank pair with a route both ways, its resources the directed links of both routes."""
    p = len(ranks)
    iu: list[int] = []
    ju: list[int] = []
    ptr: list[int] = [0]
    res: list[int] = []
    router = topo.router
    for i in range(p):
        for j in range(i + 1, p):
            try:
                links = router.route(ranks[i], ranks[j]) + router.route(ranks[j], ranks[i])
            except ConfigError:
                continue  # no route (GPUs never forward): not a candidate edge
            iu.append(i)
            ju.append(j)
            res.extend(links)
            ptr.append(len(res))
    return _PairGraph(p, np.array(iu, dtype=np.int64), np.array(ju, dtype=np.int64),
                      np.array(ptr, dtype=np.int64), np.array(res, dtype=np.int64),
                      np.asarray(topo.capacity_bytes_per_s, dtype=np.float64))


def _direct_pairs(topo: Topology, ranks: Sequence[str]) -> _PairGraph:
    """The graph's own edges between ranks, each one resource of capacity the mean of its directions."""
    index = {r: i for i, r in enumerate(ranks)}
    iu, ju, cap = [], [], []
    for lk in topo.links[::2]:
        if lk.id in topo.failed_links or lk.src not in index or lk.dst not in index:
            continue
        back = topo.links[lk.id + 1]
        a, b = index[lk.src], index[lk.dst]
        iu.append(min(a, b))
        ju.append(max(a, b))
        cap.append(0.5 * (lk.bandwidth_bytes_per_s + back.bandwidth_bytes_per_s))
    n = len(iu)
    return _PairGraph(len(ranks), np.array(iu, dtype=np.int64), np.array(ju, dtype=np.int64),
                      np.arange(n + 1, dtype=np.int64), np.arange(n, dtype=np.int64), np.array(cap, dtype=np.float64))


def _mst(p: int, iu: np.ndarray, ju: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """(pair indices of a minimum spanning tree, its weight) — Prim on the dense matrix, O(p²). ConfigError
    when the pairs do not connect the ranks."""
    big = np.inf
    mat = np.full((p, p), big)
    idx = np.full((p, p), -1, dtype=np.int64)
    k = np.arange(iu.shape[0], dtype=np.int64)
    mat[iu, ju] = w
    mat[ju, iu] = w
    idx[iu, ju] = k
    idx[ju, iu] = k
    in_tree = np.zeros(p, dtype=bool)
    in_tree[0] = True
    best = mat[0].copy()
    via = np.zeros(p, dtype=np.int64)
    chosen = np.empty(p - 1, dtype=np.int64)
    total = 0.0
    for n in range(p - 1):
        cand = np.where(in_tree, big, best)
        v = int(np.argmin(cand))
        if not np.isfinite(cand[v]):
            raise ConfigError("collective.ranks", "synth: the ranks are not connected by routable links "
                              f"(rank {v} cannot be reached)", "give ranks of one connected part of the graph")
        chosen[n] = idx[via[v], v]
        total += float(cand[v])
        in_tree[v] = True
        better = mat[v] < best
        best = np.where(better, mat[v], best)
        via = np.where(better, v, via)
    return chosen, total


def _pack(g: _PairGraph, budget_s: float) -> tuple[list[np.ndarray], np.ndarray, float, bool, bool, int, float]:
    """Column generation (module docstring): (trees as pair-index arrays, rates, certified bound, optimal,
    budget hit, iterations, seconds), rates and bound in bytes/s."""
    try:
        import highspy  # the LP solver, loaded only when a packing is solved
    except ImportError:
        raise ConfigError("collective.algorithm", "synth needs the HiGHS solver (highspy)",
                          "pip install highspy") from None

    t0 = time.perf_counter()
    n_pairs = g.iu.shape[0]
    pair_of_entry = np.repeat(np.arange(n_pairs, dtype=np.int64), np.diff(g.ptr))
    used = np.unique(g.res)
    row_of = np.full(g.cap.shape[0], -1, dtype=np.int64)
    row_of[used] = np.arange(used.shape[0])
    scale = float(g.cap[used].max())
    cap = g.cap[used] / scale
    entry_row = row_of[g.res]

    def load(tree: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.concatenate([entry_row[g.ptr[k]:g.ptr[k + 1]] for k in tree.tolist()])
        r, cnt = np.unique(rows, return_counts=True)
        return r.astype(np.int32), cnt.astype(np.float64)

    # the core class: the Python wrapper's logging callback prints a banner on stdout at construction
    h = getattr(getattr(highspy, "_core", None), "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    m = used.shape[0]
    h.addRows(m, np.full(m, -highspy.kHighsInf), cap, 0, np.zeros(m, dtype=np.int32), np.zeros(0, dtype=np.int32),
              np.zeros(0))
    # seed: the tree of least inverse capacity (widest links, fewest hops)
    seed, _ = _mst(g.p, g.iu, g.ju, np.bincount(pair_of_entry, weights=1.0 / cap[entry_row], minlength=n_pairs))
    trees = [seed]
    seen = {seed.tobytes()}
    r0, v0 = load(seed)
    h.addCol(-1.0, 0.0, highspy.kHighsInf, r0.shape[0], r0, v0)
    bound, obj, it, budget_hit, optimal = float("inf"), 0.0, 0, False, False
    x = np.zeros(1)
    while True:
        left = budget_s - (time.perf_counter() - t0)
        if left <= 0:
            budget_hit = True
            break
        h.setOptionValue("time_limit", float(h.getRunTime() + left))  # HiGHS' clock runs over every run
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            budget_hit = True
            break
        sol = h.getSolution()
        x = np.maximum(np.asarray(sol.col_value, dtype=np.float64), 0.0)
        obj = float(x.sum())
        y = np.maximum(-np.asarray(sol.row_dual, dtype=np.float64), 0.0)
        w = np.bincount(pair_of_entry, weights=y[entry_row], minlength=n_pairs)
        tree, wmin = _mst(g.p, g.iu, g.ju, w)
        it += 1
        if wmin > 0:
            bound = min(bound, float(y @ cap) / wmin)
        if wmin >= 1.0 - 1e-9 or obj >= bound * (1.0 - PACKING_TOL) or tree.tobytes() in seen:
            optimal = obj >= bound * (1.0 - PACKING_TOL) or wmin >= 1.0 - 1e-9
            break
        if it >= MAX_ITERATIONS:
            break
        seen.add(tree.tobytes())
        trees.append(tree)
        rr, vv = load(tree)
        h.addCol(-1.0, 0.0, highspy.kHighsInf, rr.shape[0], rr, vv)
    if obj <= 0.0:  # not even the seed LP solved in time: the seed alone, at its largest feasible rate
        r0, v0 = load(seed)
        trees, x = [seed], np.array([float(np.min(cap[r0] / v0))])
    if not np.isfinite(bound):
        bound = float(x.sum()) if optimal else float("inf")
    keep = np.flatnonzero(x[:len(trees)] > 0)
    order = keep[np.argsort(-x[keep], kind="stable")]
    return ([trees[k] for k in order.tolist()], x[order] * scale, bound * scale, optimal, budget_hit, it,
            time.perf_counter() - t0)


def _check_budget(budget_s: object) -> float:
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not 0 < budget_s < float("inf"):
        raise ConfigError("collective.options.time_budget_s", f"synth: must be seconds > 0, got {budget_s!r}",
                          "give e.g. 10")
    return float(budget_s)


_CACHE: weakref.WeakKeyDictionary[Topology, dict[tuple[object, ...], TreePacking]] = weakref.WeakKeyDictionary()


def pack_trees(topo: Topology, ranks: Sequence[str], time_budget_s: float = DEFAULT_TIME_BUDGET_S) -> TreePacking:
    """The fractional spanning-tree packing of ``ranks`` on ``topo`` (module docstring), memoized per
    topology, ranks and budget. ConfigError when the ranks are too many (:data:`MAX_SYNTH_RANKS`) or not
    connected by routable pairs."""
    budget = _check_budget(time_budget_s)
    ranks = tuple(ranks)
    p = len(ranks)
    if p > MAX_SYNTH_RANKS:
        raise ConfigError("collective.ranks", f"synth: {p} ranks, at most {MAX_SYNTH_RANKS} are synthesized",
                          "use ring, hierarchical or halving-doubling for larger groups")
    per = _CACHE.setdefault(topo, {})
    key = (ranks, budget)
    hit = per.get(key)
    if hit is not None:
        return hit
    g = _routed_pairs(topo, ranks)
    trees, rates, bound, optimal, budget_hit, it, secs = _pack(g, budget)
    edges = tuple(np.stack([g.iu[t], g.ju[t]], axis=1) for t in trees)
    out = TreePacking(ranks, edges, rates, bound, optimal, budget_hit, it, secs)
    per[key] = out
    return out


# ---- lower bound ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LowerBound:
    """An allreduce time bound (seconds) and the regions that give it (``"ranks"``, ``"servers"``,
    ``"private"``: every rank with the nodes all its routes leave through, ``"partition"``: the exact
Nash-Williams partition bound of an all-rank graph)."""

    time_s: float
    regions: str
    rate_bytes_per_s: float


def _routed_links(topo: Topology, ranks: tuple[str, ...]) -> set[int]:
    """The directed links of every route between two ranks (transfers follow the topology's routes)."""
    used: set[int] = set()
    for a in ranks:
        for b in ranks:
            if a != b:
                with contextlib.suppress(ConfigError):
                    used.update(topo.route(a, b))
    return used


def _region_bounds(topo: Topology, regions: list[set[str]], size_bytes: float, used: set[int]) -> float:
    k = len(regions)
    if k < 2:
        return 0.0
    where: dict[str, int] = {n: i for i, reg in enumerate(regions) for n in reg}
    out = np.zeros(k)
    into = np.zeros(k)
    for lk in topo.links:
        if lk.id in topo.failed_links or lk.id not in used:
            continue
        a, b = where.get(lk.src, -1), where.get(lk.dst, -2)
        if a == b:
            continue
        if a >= 0:
            out[a] += lk.bandwidth_bytes_per_s
        if b >= 0:
            into[b] += lk.bandwidth_bytes_per_s
    agg = 2.0 * (k - 1) * size_bytes / min(out.sum(), into.sum())
    return float(max(agg, size_bytes / out.min(), size_bytes / into.min()))


def _private_regions(topo: Topology, ranks: tuple[str, ...]) -> list[set[str]]:
    """Each rank with the nodes every route from it to another rank leaves through (the common prefix of
    its routes: its PCIe switch and NIC), a node claimed by two ranks left to neither."""
    links = topo.links
    prefix: list[list[str]] = []
    for a in ranks:
        common: list[str] | None = None
        for b in ranks:
            if b == a:
                continue
            try:
                nodes = [a, *(links[i].dst for i in topo.route(a, b))][:-1]
            except ConfigError:
                continue
            if common is None:
                common = nodes
            else:
                same = 0
                while same < min(len(common), len(nodes)) and common[same] == nodes[same]:
                    same += 1
                common = common[:same]
        prefix.append(common or [a])
    count: dict[str, int] = {}
    for pre in prefix:
        for n in pre:
            count[n] = count.get(n, 0) + 1
    regions = []
    for pre in prefix:
        reg: set[str] = set()
        for n in pre:  # contiguous from the rank, up to the first shared node
            if count[n] > 1 or (n not in ranks and topo.nodes[n].kind is NodeKind.GPU):
                break
            reg.add(n)
        regions.append(reg)
    return regions


def allreduce_lower_bound_s(topo: Topology, ranks: Sequence[str], size_bytes: float,
                            time_budget_s: float = DEFAULT_TIME_BUDGET_S) -> LowerBound:
    """The largest of the region bounds of the module docstring for an allreduce of ``size_bytes`` per rank
    (no latency term: a bandwidth bound)."""
    ranks = tuple(ranks)
    s = float(size_bytes)
    if len(ranks) < 2:
        return LowerBound(0.0, "ranks", float("inf"))
    used = _routed_links(topo, ranks)
    best = LowerBound(_region_bounds(topo, [{r} for r in ranks], s, used), "ranks", 0.0)
    t = _region_bounds(topo, _private_regions(topo, ranks), s, used)
    if t > best.time_s:
        best = LowerBound(t, "private", 0.0)
    by_server: dict[str, set[str]] = {}
    alone: list[set[str]] = []
    for r in ranks:
        srv = topo.nodes[r].server
        if srv is None:
            alone.append({r})
        else:
            by_server.setdefault(srv, set())
    for n, node in topo.nodes.items():
        if node.server in by_server:
            by_server[node.server].add(n)
    if by_server:
        t = _region_bounds(topo, list(by_server.values()) + alone, s, used)
        if t > best.time_s:
            best = LowerBound(t, "servers", 0.0)
    all_ranks = len(ranks) == len(topo.nodes) and all(nd.kind is NodeKind.GPU for nd in topo.nodes.values())
    if all_ranks:
        g = _direct_pairs(topo, ranks)
        _, _, bound, _, _, _, _ = _pack(g, _check_budget(time_budget_s))
        if np.isfinite(bound) and s / bound > best.time_s:
            best = LowerBound(s / bound, "partition", 0.0)
    return LowerBound(best.time_s, best.regions, s / best.time_s if best.time_s > 0 else float("inf"))


# ---- latency-aware bound ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LatencyBound:
    """:func:`allreduce_latency_bound_s`: the bound (seconds), the phases it charges, the hop diameter of the
    ranks' routed pairs, and the per-phase floor ``α + λ_min`` (seconds)."""

    time_s: float
    phases: int
    diameter: int
    per_phase_s: float


def allreduce_latency_bound_s(topo: Topology, ranks: Sequence[str], size_bytes: float, alpha_s: float,
                              bandwidth: LowerBound | None = None) -> LatencyBound:
    """A latency-aware allreduce bound for schedules of synchronous phases (the ``analytical`` and ``flow``
    models' barrier phases), the bandwidth bound ``T_bw`` (:func:`allreduce_lower_bound_s`) with its latency
    term stated separately:

        ``T >= P·(α + λ_min) + T_bw``,  ``P = max(2, D)``,

    ``α`` the per-message overhead, ``λ_min`` the least route latency between two ranks (a phase ends no
    earlier than ``α + λ`` after its last byte leaves, and no earlier than its most loaded link's bytes over
    capacity; the bandwidth terms of the phases add up to at least ``T_bw``, whose cut arguments hold phase by
    phase), ``D`` the hop diameter of the ranks' routed pairs (an input reaches a rank ``d`` routed hops
    away no earlier than phase ``d``: the dependency argument behind the ``⌈log2 p⌉α`` term of Chan et al.,
    CCPE 2007, for a one-port network; here every rank may send to all its routed peers at once). Only a
    one-phase schedule escapes ``P >= 2``: every rank then receives the other ``p − 1`` whole buffers, so it
    counts ``α + λ_min + max_r (p−1)·S / C_in(r)``; the smaller of the two is the bound. It is a floor, not
    the pipelining trade-off: a pipelined tree pays ``α`` per step and its fill (collectives/synth_plan.py)."""
    ranks = tuple(ranks)
    p = len(ranks)
    s = float(size_bytes)
    if p < 2:
        return LatencyBound(0.0, 0, 0, 0.0)
    bw = bandwidth if bandwidth is not None else allreduce_lower_bound_s(topo, ranks, s)
    index = {r: i for i, r in enumerate(ranks)}
    adj: list[list[int]] = [[] for _ in range(p)]
    lat_min = float("inf")
    c_in = np.zeros(p)
    for a in ranks:
        for b in ranks:
            if a == b:
                continue
            try:
                route = topo.route(a, b)
            except ConfigError:
                continue
            adj[index[a]].append(index[b])
            lat_min = min(lat_min, topo.path_latency_s(route))
    used = _routed_links(topo, ranks)
    for lk in topo.links:
        if lk.id in used and lk.id not in topo.failed_links and lk.dst in index:
            c_in[index[lk.dst]] += lk.bandwidth_bytes_per_s
    diam = 0
    for src in range(p):
        dist = np.full(p, -1, dtype=np.int64)
        dist[src] = 0
        frontier = [src]
        while frontier:
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if dist[v] < 0:
                        dist[v] = dist[u] + 1
                        nxt.append(v)
            frontier = nxt
        if (dist < 0).any():
            return LatencyBound(float("inf"), 0, -1, alpha_s + lat_min)
        diam = max(diam, int(dist.max()))
    per = alpha_s + (0.0 if lat_min == float("inf") else lat_min)
    phases = max(2, diam)
    t = phases * per + bw.time_s
    if diam == 1:
        one = per + (p - 1) * s / float(c_in.min()) if c_in.min() > 0 else float("inf")
        if one < t:
            return LatencyBound(one, 1, diam, per)
    return LatencyBound(t, phases, diam, per)
