"""HDRM: halving-doubling with a topology-aware rank mapping on BiGraph (EFLOPS, Dong et al., HPCA 2020,
DOI 10.1109/HPCA47549.2020.00056).

BiGraph splits the switches into two parts (upper, lower) with a link from every switch of one part to
every switch of the other and none inside a part: cross-part traffic crosses one inter-switch link,
same-part traffic two. HDRM runs recursive halving-doubling on *logical* ranks and picks which physical
rank plays each logical rank so that, in every step, partners sit on switches of different parts and the
busiest directed inter-switch link carries as few concurrent transfers as possible.

The mapping used here (written from that description, see reference/eflops.md; not the paper's exact
table, which is not public): every halving-doubling partner differs from its rank in exactly one bit, so

* logical rank l goes to the **upper part iff popcount(l) is even** — partners are always in different
  parts;
* with H upper switches (a power of two) write l = j·2H + 2i + e (group j, pair i < H, e ∈ {0, 1}); the
  upper rank of pair i of group j goes to upper switch ``i XOR (j mod H)``, the lower one to lower switch
  ``i`` (slot j of that switch). At a step of distance 2^s < 2H the upper switch a sends, for each group
  j, to lower switch ``a XOR (j mod H) XOR δ`` (δ fixed by the step): distinct switches for distinct
  j mod H; for distance ≥ 2H it sends to lower switch ``a XOR (j mod H)`` of the partner group — again
  distinct. Lower → upper is symmetric. With M ranks per switch the busiest directed link therefore
  carries ⌈M/H⌉ transfers (1 when M ≤ H), the lower bound (an upper switch sends M transfers over H
  links).

Physically, the ranks of each part are listed slot by slot across its switches (slot 0 of every switch,
then slot 1, …) and list position j·H + a is the rank in slot j of switch a. When switches hold unequal
numbers of ranks, or the number of switches in use is not a power of two, H is the largest power of two
not above either part's switch count: partners still always cross parts, and the link load is balanced
as far as that list allows (no bound is promised then).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from topotrain.collectives.costmodel import is_power_of_two
from topotrain.collectives.halving_doubling import hd_schedule
from topotrain.collectives.schedule import CollectiveOp, Schedule
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

_FIX = "use halving-doubling or ring"


class _PartsError(NamedTuple):
    """Why a topology has no BiGraph parts (a :class:`ConfigError`'s fields, kept without its traceback)."""

    field: str
    message: str
    fix: str


_PARTS_CACHE: weakref.WeakKeyDictionary[Topology, object] = weakref.WeakKeyDictionary()


def bigraph_parts(topo: Topology) -> tuple[list[str], list[str]]:
    """The BiGraph parts of ``topo``, computed once per topology (which is frozen, so they hold)."""
    hit = _PARTS_CACHE.get(topo.freeze())
    if hit is None:
        try:
            hit = _bigraph_parts(topo)
        except ConfigError as e:
            # the error's words only: the exception's traceback holds frames that hold ``topo``, and a value
            # of the weak-keyed cache that holds its key keeps the topology alive for good
            hit = _PartsError(e.field, e.message, e.fix)
        _PARTS_CACHE[topo] = hit
    if isinstance(hit, _PartsError):
        raise ConfigError(hit.field, hit.message, hit.fix)
    parts: tuple[list[str], list[str]] = hit  # type: ignore[assignment]
    return list(parts[0]), list(parts[1])


def _switch_links(topo: Topology, switches: list[str]) -> dict[str, set[str]]:
    """Every switch's neighbours that are switches (the switch subgraph, read once from the graph)."""
    is_switch = set(switches)
    gadj = topo.adjacency
    return {s: {v for v in gadj[s] if v in is_switch} for s in switches}


def _colour_components(adj: dict[str, set[str]], switches: list[str]) -> list[dict[str, int]] | None:
    """A 0/1 colouring of every connected component of the switch graph with no edge inside a colour, the
    component of ``switches[0]`` first; None when some component has an odd cycle (not bipartite). A
    connected bipartite graph has one such colouring, up to swapping the colours."""
    components: list[dict[str, int]] = []
    coloured: set[str] = set()
    for start in switches:
        if start in coloured:
            continue
        colour = {start: 0}
        queue = [start]
        while queue:
            v = queue.pop()
            for w in adj[v]:
                c = colour.get(w)
                if c is None:
                    colour[w] = 1 - colour[v]
                    queue.append(w)
                elif c == colour[v]:
                    return None
        coloured.update(colour)
        components.append(colour)
    return components


def _bigraph_parts(topo: Topology) -> tuple[list[str], list[str]]:
    """(upper, lower) switch lists of a BiGraph-like network (ConfigError otherwise).

    The parts are the two colour classes of the switch subgraph, which must be a complete bipartite
    graph. ``topo.meta["bigraph"] = {"upper": [...], "lower": [...]}`` orients and orders them when
    present; otherwise the part of the first switch (in insertion order) is the upper one.
    """
    switches = topo.nodes_of_kind(NodeKind.SWITCH)
    adj = _switch_links(topo, switches)
    components = _colour_components(adj, switches) if len(switches) >= 2 else None
    if components is None:
        raise ConfigError("cluster.network", "HDRM needs a BiGraph-like network: the switches do not form a "
                          "bipartite graph", _FIX)
    if len(components) > 1:
        raise ConfigError("cluster.network", "HDRM needs a BiGraph-like network: the switches are not "
                          "connected to each other", _FIX)
    color = components[0]
    first = color[switches[0]]
    upper = [s for s in switches if color[s] == first]
    lower = [s for s in switches if color[s] != first]
    for u in upper:
        for v in lower:
            if v not in adj[u]:
                raise ConfigError("cluster.network", f"HDRM needs a BiGraph-like network: switch {u!r} has "
                                  f"no link to switch {v!r} of the other part", _FIX)
    given = topo.meta.get("bigraph")
    if given:
        up, lo = list(given.get("upper", [])), list(given.get("lower", []))
        if {frozenset(up), frozenset(lo)} != {frozenset(upper), frozenset(lower)}:
            raise ConfigError("topology.meta.bigraph", "the declared upper/lower parts are not the two parts "
                              "of the switch graph", "list each switch once, in the part it belongs to")
        upper, lower = up, lo
    return upper, lower


def rank_switches(topo: Topology, ranks: Sequence[str]) -> list[str]:
    """The network switch of each rank: a switch the GPU links to, else the one its NIC links to."""
    out = []
    for g in ranks:
        node = g
        sw = [n for n in topo.adjacency[g] if topo.nodes[n].kind is NodeKind.SWITCH]
        if not sw:
            nic = topo.router.nic_of(g)
            if nic is not None:
                node = nic
                sw = [n for n in topo.adjacency[nic] if topo.nodes[n].kind is NodeKind.SWITCH]
        if len(sw) != 1:
            what = (f"{len(sw)} network switches ({', '.join(sorted(sw)[:3])})" if sw
                    else "no network switch")
            raise ConfigError("collective.ranks", f"HDRM needs each rank on one switch; {node!r} (for GPU "
                              f"{g!r}) links to {what}", _FIX)
        out.append(sw[0])
    return out


def _slot_list(switches: Sequence[str], of_rank: Sequence[str]) -> tuple[np.ndarray, int]:
    """Rank indices of a part listed slot by slot across its switches, and the switches in use."""
    per: dict[str, list[int]] = {s: [] for s in switches}
    for i, s in enumerate(of_rank):
        if s in per:
            per[s].append(i)
    used = [per[s] for s in switches if per[s]]
    slots = max((len(x) for x in used), default=0)
    out = [lst[slot] for slot in range(slots) for lst in used if slot < len(lst)]
    return np.array(out, dtype=np.int64), len(used)


def hdrm_mapping(topo: Topology, ranks: Sequence[str]) -> np.ndarray:
    """``order[l]`` = index in ``ranks`` of the rank that plays logical rank ``l`` (see module docstring)."""
    p = len(ranks)
    if not is_power_of_two(p):
        raise ConfigError("collective.ranks", f"HDRM needs a power-of-two number of ranks, got {p}",
                          "use 2^k ranks, or halving-doubling or ring")
    upper, lower = bigraph_parts(topo)
    of_rank = rank_switches(topo, ranks)
    up_list, n_up = _slot_list(upper, of_rank)
    lo_list, n_lo = _slot_list(lower, of_rank)
    if len(up_list) != p // 2 or len(lo_list) != p // 2:
        raise ConfigError("collective.ranks", f"HDRM needs half of the ranks on each part of BiGraph, got "
                          f"{len(up_list)} on the upper and {len(lo_list)} on the lower part",
                          "place the ranks evenly over both parts, or use halving-doubling")
    h = 1 << (min(n_up, n_lo).bit_length() - 1)
    logical = np.arange(p, dtype=np.int64)
    is_upper = (np.bitwise_count(logical.astype(np.uint64)) % 2) == 0
    j = logical // (2 * h)
    i = (logical % (2 * h)) // 2
    pos = j * h + np.where(is_upper, i ^ (j % h), i)
    return np.where(is_upper, up_list[pos], lo_list[pos]).astype(np.int64)


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
          **options: Any) -> Schedule:
    """HDRM allreduce, reduce-scatter or allgather (p = 2^k). For reduce-scatter chunk c ends at
    ``ranks[meta["mapping"][c]]`` (allgather: starts there), as logical rank c plays that rank."""
    p = len(ranks)
    order = hdrm_mapping(topo, ranks) if p > 1 else np.zeros(p, dtype=np.int64)
    return hd_schedule(op, ranks, size_bytes, "hdrm", order=order, meta={"mapping": order.tolist()})
