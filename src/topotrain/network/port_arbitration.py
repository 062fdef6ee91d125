"""Per-port arbitration: rates of flows where a link's capacity is shared among its input ports, not its flows.

Max-min fairness per flow (:mod:`topotrain.network.maxmin`) is what a switch with fair queueing does. A PCIe
switch does not queue per flow: its egress port arbitrates round robin over its *input ports* (PCI Express Base
Specification, "Port Arbitration": among the ingress ports that target one egress port, a hardware-fixed scheme
such as round robin, or weighted or time-based round robin where configured), and credit-based flow control
holds every packet it cannot send yet back in the port it came from. So a port's share of an egress link is
split among *its* input ports by the switch upstream, and so on back to the sources: flows that merged late
get more than flows that merged early (the *parking-lot* effect). On a chain of k PCIe switches where one
flow joins at each switch, the flow that joins last gets 1/2 of the last link, the one before 1/4, ..., the
first two 1/2^(k-1) each (``tests/test_port_arbitration.py``), where per-flow fairness gives each 1/k.

**The allocation.** At a port-arbitrated link ``l`` (``port_link[l]``) the flows crossing it form a tree, the
*port tree* of ``l``: the root's children are the links that feed ``l`` (each flow's previous link on its path:
its input port); below a child that is itself port-arbitrated, again the links that feed it, and so on back
along the paths; below a child that is not (an Ethernet or InfiniBand link, where a NIC or switch shares per
flow), and below the first link of a path (the source), the flows themselves. At a link that is not
port-arbitrated the tree is flat: every flow is a child of the root. At each node of the tree the node's
allocation is split max-min fairly among its children, each child demanding the sum of its flows' demands
(hierarchical max-min, or *water-filling* on the tree: a child gets ``min(demand, level)`` with the level that
uses the node's allocation). With every flow demanding without bound, this is exactly the round-robin share
above: 1/2 per input port, then 1/2 of that per input port upstream, and so on.

Over a network, a flow's rate is what its *bottleneck* link gives it: the allocation is the one where every
flow has a saturated link at which its rate is its tree share, with every other flow's rate as its demand
(the bottleneck definition of max-min fairness, Bertsekas & Gallager, *Data Networks*, §6.5.2, with the tree
share in place of the equal share). Where every tree is flat, it is max-min fairness per flow.

**How it is computed** (exactly where a bottleneck or the bounds below settle a flow: comparisons of water levels, no
iteration to a tolerance, nothing coalesced). Flows are frozen round by round, as in progressive filling. Each round
every link water-fills its tree, frozen flows demanding their rate and the others without bound; that gives each
unfrozen flow an *offer* at each of its links, and its smallest offer ``L_f`` is a lower bound of its rate (more
demand elsewhere never gives it more; water-filling is monotone). A link at which every unfrozen flow's offer is its
``L_f`` is a bottleneck for all of them: whatever the others get, each of those flows gets at least ``L_f`` everywhere
and at most its offer there; their rates are ``L_f``, and they freeze. In progressive filling (flat trees) the link
with the lowest level is always such a link, and the rounds are exactly progressive filling's. With port trees a round
can find none — typically where a port-arbitrated PCIe link would favour some flows but an Ethernet link downstream,
shared per flow, is tighter for all of them. Then bounds: every open flow has ``L_f`` below it, and above it the least
its links give it with the other open flows at *their* lower bounds (more demand elsewhere only gives it less); the
lower bounds rise again with the others at their upper bounds, and so on (at most :data:`BOUND_ROUNDS` times); a flow
whose bounds meet (to ``REL_EPS``) is settled and freezes. Where they do not meet (a cycle of preferences: A favours f
over g, B g over f), one step of progressive filling decides: the open flows rise together, each held between its
bounds, until a link fills, and that link's open flows freeze there. That step is a rule of thumb, counted in
``stats["fallback_steps"]``: its answer is feasible (a frozen flow's rate is a floor of every later water-filling, so
no link is ever over capacity) and every flow crosses a full link, and on a cycle of preferences it can give the
definition's answer (``tests/test_port_arbitration.py``), but not always: of the test's 60 random networks with half
the links per port, 3 needed it and miss the definition by 4.1%, 13.4% and 15.5% (:func:`definition_gap`), while the
57 others meet it to rounding. In the EFLOPS servers' collectives every allocation, with the step or without, meets
the definition (docs/validation.md §2).

Ties are those of :mod:`topotrain.network.maxmin` (a relative ``REL_EPS`` of the level); nothing is coalesced.
The work per round is the flows' path lengths (the port trees are as deep as the PCIe fabric), so this is for
server fabrics and clusters of a few thousand flows; ``arbitration: flow`` (the default) keeps the compiled
per-flow kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from topotrain.network.maxmin import REL_EPS
from topotrain.util.errors import ConfigError

#: at most this many rounds of bounds (lower, then upper) before a step of progressive filling decides
BOUND_ROUNDS = 16

#: the arbitration rules of the flow model: ``flow``, max-min per flow on every link; ``port``, per input port
#: on the links of :data:`PORT_ARBITRATED_KINDS` (per flow on the others)
ARBITRATIONS: tuple[str, ...] = ("flow", "port")
#: link kinds whose switches arbitrate per input port (PCIe: the specification's port arbitration). Ethernet and
#: InfiniBand switches and NICs schedule per queue pair / flow; NVLink/NVSwitch and socket links are not
#: documented as round robin per port in our sources, so they stay per flow.
PORT_ARBITRATED_KINDS: frozenset[str] = frozenset({"pcie"})


def check_arbitration(value: object, field: str = "network.arbitration") -> str:
    """``value`` if it names an arbitration rule, else a ConfigError naming ``field``."""
    if not isinstance(value, str) or value not in ARBITRATIONS:
        raise ConfigError(field, f"unknown arbitration {value!r}",
                          f"use one of {', '.join(ARBITRATIONS)} (port: PCIe links share per input port)")
    return value


def port_links(link_kinds: Sequence[str]) -> np.ndarray:
    """Per link id, whether it arbitrates per input port (its kind is in :data:`PORT_ARBITRATED_KINDS`)."""
    return np.fromiter((k in PORT_ARBITRATED_KINDS for k in link_kinds), dtype=bool, count=len(link_kinds))


class _Tree:
    """The port tree of one link: node 0 is the root; per node its child nodes and its leaf groups."""

    __slots__ = ("kids", "leaves", "index", "groups")

    def __init__(self) -> None:
        self.kids: list[list[int]] = [[]]
        self.leaves: list[list[int]] = [[]]
        self.index: dict[tuple[int, int], int] = {}  # (parent node, feeding link) -> node
        self.groups: list[int] = []  # groups crossing the link, in order

    def add(self, path: tuple[int, ...], i: int, g: int, port_link: np.ndarray) -> None:
        node = 0
        j = i
        while j > 0 and port_link[path[j]]:
            key = (node, path[j - 1])
            child = self.index.get(key)
            if child is None:
                child = self.index[key] = len(self.kids)
                self.kids.append([])
                self.leaves.append([])
                self.kids[node].append(child)
            node = child
            j -= 1
        self.leaves[node].append(g)
        self.groups.append(g)


def _level(lo: list[float], hi: list[float], w: list[float], alloc: float) -> float:
    """The water level ``x`` with ``sum(w_i * clamp(x, lo_i, hi_i)) == alloc`` (``inf`` when every child can have
    its ``hi``); ``sum(w_i * lo_i) <= alloc`` is the caller's. Exact up to one division: the segment of the
    piecewise-linear sum that holds ``alloc`` is found over the sorted breakpoints, then solved."""
    if sum(wi * hi_i for wi, hi_i in zip(w, hi, strict=True)) <= alloc:
        return float("inf")
    points = sorted(set(lo) | set(hi))
    prev = 0.0
    for x in points:  # the first breakpoint whose sum reaches alloc: the level lies in (prev, x]
        if x == float("inf"):
            break
        total = sum(wi * min(max(x, a), b) for wi, a, b in zip(w, lo, hi, strict=True))
        if total >= alloc:
            break
        prev = x
    # on (prev, x): children with hi <= prev give hi, with lo >= x give lo, the rest rise with slope w
    fixed = 0.0
    slope = 0.0
    for wi, a, b in zip(w, lo, hi, strict=True):
        if b <= prev:
            fixed += wi * b
        elif a > prev:
            fixed += wi * a
        else:
            slope += wi
    return (alloc - fixed) / slope


def _fill(tree: _Tree, cap: float, g_lo: np.ndarray, g_hi: np.ndarray, mult: np.ndarray, want: np.ndarray
          ) -> list[tuple[int, float]]:
    """(group, per-flow allocation) of every group on the link with ``want[g]``: its tree water-filled with
    ``cap``, a flow of group ``g`` demanding ``g_hi[g]`` (``inf``: without bound) with a floor ``g_lo[g]`` it keeps
    (a frozen flow's rate: it keeps it at every link; 0 otherwise)."""
    n = len(tree.kids)
    lo = [0.0] * n
    hi = [0.0] * n
    hot = [False] * n  # a wanted group below
    for node in range(n - 1, -1, -1):  # children are numbered after their parents
        s_lo = 0.0
        s_hi = 0.0
        h = False
        for g in tree.leaves[node]:
            s_lo += mult[g] * g_lo[g]
            s_hi += mult[g] * g_hi[g]
            h = h or bool(want[g])
        for c in tree.kids[node]:
            s_lo += lo[c]
            s_hi += hi[c]
            h = h or hot[c]
        lo[node] = s_lo
        hi[node] = s_hi
        hot[node] = h
    out: list[tuple[int, float]] = []
    stack = [(0, cap)]
    while stack:
        node, alloc = stack.pop()
        if not hot[node]:
            continue
        c_lo: list[float] = []
        c_hi: list[float] = []
        c_w: list[float] = []
        for g in tree.leaves[node]:
            c_lo.append(float(g_lo[g]))
            c_hi.append(float(g_hi[g]))
            c_w.append(float(mult[g]))
        for c in tree.kids[node]:
            c_lo.append(lo[c])
            c_hi.append(hi[c])
            c_w.append(1.0)
        x = _level(c_lo, c_hi, c_w, max(alloc, lo[node]))
        for g in tree.leaves[node]:
            if want[g]:
                out.append((g, min(max(x, float(g_lo[g])), float(g_hi[g]))))
        for c in tree.kids[node]:
            stack.append((c, min(max(x, lo[c]), hi[c])))
    return out


def _alone_bounds(trees: dict[int, _Tree], paths: Sequence[tuple[int, ...]], cap: np.ndarray, floor: np.ndarray,
                  others: np.ndarray, mult: np.ndarray, open_: np.ndarray) -> np.ndarray:
    """Per open group, the least over its links of what the link gives its flows wanting without bound while every
    other group demands ``others`` (over ``floor``)."""
    out = np.full(len(paths), np.inf)
    for g in np.flatnonzero(open_).tolist():
        hi = others.copy()
        hi[g] = np.inf
        want = np.zeros(len(paths), dtype=bool)
        want[g] = True
        for lk in paths[g]:
            for _g, x in _fill(trees[lk], float(cap[lk]), floor, hi, mult, want):
                out[g] = min(out[g], x)
    return out


def port_fair_rates(paths: Sequence[tuple[int, ...]], mult: np.ndarray, capacity_bytes_per_s: np.ndarray,
                    port_link: np.ndarray, stats: dict[str, int] | None = None) -> np.ndarray:
    """Per-flow rate (bytes/s) of each path group under per-port arbitration (module docstring).

    ``paths[g]`` is group ``g``'s links in path order, ``mult[g] > 0`` its number of identical flows,
    ``capacity_bytes_per_s`` and ``port_link`` (whether a link arbitrates per input port) are indexed by link id.
    A group with an empty path gets ``inf``. ``stats``, when given, gets ``rounds`` and ``fallback_steps`` added.
    """
    n = len(paths)
    mult_a = np.asarray(mult, dtype=np.float64)
    if mult_a.shape != (n,) or (n and not bool(np.all(mult_a > 0))):
        raise ConfigError("mult", "give one positive multiplicity per path", "pass the groups' flow counts")
    cap = np.asarray(capacity_bytes_per_s, dtype=np.float64)
    rate = np.full(n, np.inf)
    frozen = np.zeros(n, dtype=bool)
    trees: dict[int, _Tree] = {}
    for g, path in enumerate(paths):
        if not path:
            frozen[g] = True
            continue
        for i, lk in enumerate(path):
            t = trees.get(lk)
            if t is None:
                t = trees[lk] = _Tree()
            t.add(path, i, g, port_link)
    order = sorted(trees)
    rounds = fallback = bounded = 0
    while not bool(frozen.all()):
        rounds += 1
        floor = np.where(frozen, rate, 0.0)
        ceil = np.where(frozen, rate, np.inf)
        offers: list[tuple[int, list[tuple[int, float]]]] = []
        low = np.full(n, np.inf)
        for lk in order:
            tree = trees[lk]
            if all(frozen[g] for g in tree.groups):
                continue
            got = _fill(tree, float(cap[lk]), floor, ceil, mult_a, ~frozen)
            offers.append((lk, got))
            for g, x in got:
                if x < low[g]:
                    low[g] = x
        newly = [g for _lk, got in offers if all(x <= low[g] * (1.0 + REL_EPS) for g, x in got) for g, _x in got]
        if newly:
            for g in newly:
                rate[g] = low[g]
                frozen[g] = True
            continue
        # no link is every unfrozen flow's bottleneck: bounds. Every open flow gets at least ``low`` (its least
        # offer) and at most what its links give it with the others at their lower bounds; a flow whose bounds
        # meet is settled; else the lower bounds rise with the others at their upper bounds, and again
        open_ = ~frozen
        lower = np.where(open_, low, rate)
        settled = np.zeros(n, dtype=bool)
        for _ in range(BOUND_ROUNDS):
            upper = _alone_bounds(trees, paths, cap, floor, np.where(open_, lower, rate), mult_a, open_)
            settled = open_ & (upper <= lower * (1.0 + REL_EPS))
            if settled.any():
                break
            raised = np.maximum(lower, _alone_bounds(trees, paths, cap, floor, np.where(open_, upper, rate),
                                                     mult_a, open_))
            if np.array_equal(raised, lower):
                break
            lower = raised
        if settled.any():
            bounded += 1
            rate[settled] = lower[settled]
            frozen[settled] = True
            continue
        # one step of progressive filling within the bounds: the open flows rise together, each held between its
        # bounds, until a link fills; that link's open flows freeze there
        fallback += 1
        best = np.inf
        levels: list[tuple[int, float]] = []
        for lk, got in offers:
            tree = trees[lk]
            load = sum(mult_a[g] * rate[g] for g in tree.groups if frozen[g])
            ids = [g for g, _x in got]
            lo_l = [float(lower[g]) for g in ids]
            w_l = [float(mult_a[g]) for g in ids]
            floor_sum = sum(w * x for w, x in zip(w_l, lo_l, strict=True))
            level = _level(lo_l, [float(upper[g]) for g in ids], w_l, max(float(cap[lk]) - load, floor_sum))
            levels.append((lk, level))
            best = min(best, level)
        for lk, level in levels:
            if level <= best * (1.0 + REL_EPS):
                for g in trees[lk].groups:
                    if not frozen[g]:
                        rate[g] = min(max(best, float(lower[g])), float(upper[g]))
                        frozen[g] = True
    if stats is not None:
        stats["rounds"] = stats.get("rounds", 0) + rounds
        stats["fallback_steps"] = stats.get("fallback_steps", 0) + fallback
        stats["bound_steps"] = stats.get("bound_steps", 0) + bounded
    return rate


def definition_gap(paths: Sequence[tuple[int, ...]], mult: np.ndarray, capacity_bytes_per_s: np.ndarray,
                   port_link: np.ndarray, rate: np.ndarray) -> float:
    """How far ``rate`` (per flow of each group) is from the allocation's definition: the largest, over flows, of
    ``|s / r - 1|`` where ``r`` is the flow's rate and ``s`` the least, over its links, of what the link would give
    one flow of the group wanting without bound while every other flow (its group's others included) wants its
    rate. 0 (to rounding) means every flow gets what each link allows and exactly that at its bottleneck.

    Written apart from :func:`port_fair_rates`, to check it: each link's port tree is built again as nested dicts
    and water-filled by the textbook max-min split (children by increasing demand, each the smaller of its demand
    and an equal share of what is left). Quadratic in the flows: for tests and checks, not for simulation."""
    worst = 0.0
    for f, path in enumerate(paths):
        least = min(_share_of(path[i], f, paths, mult, rate, float(capacity_bytes_per_s[path[i]]), port_link)
                    for i in range(len(path))) if path else np.inf
        if path:
            worst = max(worst, abs(least / float(rate[f]) - 1.0))
    return worst


def _share_of(link: int, f: int, paths: Sequence[tuple[int, ...]], mult: np.ndarray, rate: np.ndarray,
              cap: float, port_link: np.ndarray) -> float:
    """What ``link`` gives one flow of group ``f`` wanting without bound, every other flow wanting its rate
    (:func:`definition_gap`)."""
    me = ("flow", f, 0)
    tree: dict[tuple[object, ...], object] = {}
    for g, p in enumerate(paths):
        if link not in p:
            continue
        node, j = tree, p.index(link)
        while j > 0 and port_link[p[j]]:
            node = node.setdefault(("port", p[j - 1]), {})  # type: ignore[assignment]
            j -= 1
        for k in range(int(mult[g])):
            node[("flow", g, k)] = np.inf if (g, k) == (f, 0) else float(rate[g])

    def demand(x: object) -> float:
        return sum(demand(v) for v in x.values()) if isinstance(x, dict) else float(x)  # type: ignore[arg-type]

    def holds(x: object) -> bool:
        return isinstance(x, dict) and any(k == me or holds(v) for k, v in x.items())

    def fill(node: dict[tuple[object, ...], object], alloc: float) -> float:
        kids = sorted(node.items(), key=lambda kv: demand(kv[1]))
        left = alloc
        for i, (key, sub) in enumerate(kids):
            give = min(demand(sub), left / (len(kids) - i))
            left -= give
            if key == me:
                return give
            if holds(sub):
                return fill(sub, give)  # type: ignore[arg-type]
        raise AssertionError("the flow is not on the link")

    return fill(tree, cap)
