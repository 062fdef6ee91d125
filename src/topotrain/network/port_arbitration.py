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

**How it is computed** (exactly: the arithmetic of the water levels, no iteration to a tolerance). Flows are
frozen round by round, as in progressive filling. Each round every link water-fills its tree, frozen flows
demanding their rate and the others without bound; that gives each unfrozen flow an *offer* at each of its
links, and its smallest offer ``L_f`` is a lower bound of its rate (more demand elsewhere never gives it
more; water-filling is monotone). A link at which every unfrozen flow's offer is its ``L_f`` is a bottleneck
for all of them: whatever the others get, each of those flows gets at least ``L_f`` everywhere and at most its
offer there; their rates are ``L_f``, and they freeze. In progressive filling (flat trees) the link with the
lowest level is always such a link, and the rounds are exactly progressive filling's. With port trees a round
can find none — typically where a port-arbitrated PCIe link would favour some flows but an Ethernet link
downstream, shared per flow, is tighter for all of them, so the PCIe link never fills. Then one step of
progressive filling decides: the unfrozen flows rise together from zero until a link fills, and that link's
unfrozen flows freeze at that level (a frozen flow keeps its rate at every link: its demand is a floor of the
water-filling, so no link is ever over capacity). Those steps are counted (``stats["fallback_steps"]``); in the
example above they give the answer the bottleneck definition gives (the PCIe link does not fill).

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


def _offers(tree: _Tree, cap: float, rate: np.ndarray, frozen: np.ndarray, mult: np.ndarray
            ) -> list[tuple[int, float]]:
    """(group, per-flow offer) of every unfrozen group on the link: its tree water-filled with ``cap``, frozen
    flows demanding their rate (a floor as well: they keep it), the others without bound."""
    n = len(tree.kids)
    lo = [0.0] * n
    hi = [0.0] * n
    for node in range(n - 1, -1, -1):  # children are numbered after their parents
        s_lo = 0.0
        s_hi = 0.0
        for g in tree.leaves[node]:
            if frozen[g]:
                s_lo += mult[g] * rate[g]
                s_hi += mult[g] * rate[g]
            else:
                s_hi = float("inf")
        for c in tree.kids[node]:
            s_lo += lo[c]
            s_hi += hi[c]
        lo[node] = s_lo
        hi[node] = s_hi
    out: list[tuple[int, float]] = []
    stack = [(0, cap)]
    while stack:
        node, alloc = stack.pop()
        if hi[node] != float("inf"):
            continue  # every flow below is frozen: each gets its rate
        c_lo: list[float] = []
        c_hi: list[float] = []
        c_w: list[float] = []
        for g in tree.leaves[node]:
            r = float(rate[g]) if frozen[g] else 0.0
            c_lo.append(r)
            c_hi.append(r if frozen[g] else float("inf"))
            c_w.append(float(mult[g]))
        for c in tree.kids[node]:
            c_lo.append(lo[c])
            c_hi.append(hi[c])
            c_w.append(1.0)
        x = _level(c_lo, c_hi, c_w, max(alloc, lo[node]))
        for g in tree.leaves[node]:
            if not frozen[g]:
                out.append((g, x))
        for c in tree.kids[node]:
            stack.append((c, min(max(x, lo[c]), hi[c])))
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
    rounds = fallback = 0
    while not bool(frozen.all()):
        rounds += 1
        offers: list[tuple[int, list[tuple[int, float]]]] = []
        low = np.full(n, np.inf)
        for lk in order:
            tree = trees[lk]
            if all(frozen[g] for g in tree.groups):
                continue
            got = _offers(tree, float(cap[lk]), rate, frozen, mult_a)
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
        # no link is every unfrozen flow's bottleneck: one step of progressive filling
        fallback += 1
        best = np.inf
        levels: list[tuple[int, float]] = []
        for lk, _got in offers:
            tree = trees[lk]
            load = sum(mult_a[g] * rate[g] for g in tree.groups if frozen[g])
            count = sum(mult_a[g] for g in tree.groups if not frozen[g])
            level = max(float(cap[lk]) - load, 0.0) / count
            levels.append((lk, level))
            best = min(best, level)
        for lk, level in levels:
            if level <= best * (1.0 + REL_EPS):
                for g in trees[lk].groups:
                    if not frozen[g]:
                        rate[g] = best
                        frozen[g] = True
    if stats is not None:
        stats["rounds"] = stats.get("rounds", 0) + rounds
        stats["fallback_steps"] = stats.get("fallback_steps", 0) + fallback
    return rate
