"""Collectives synthesized for the topology at hand: allreduce, broadcast and reduce on packed spanning trees.

The trees and their rates come from :func:`~topotrain.collectives.treepack.pack_trees` (a fractional
spanning-tree packing over the routed rank pairs, Edmonds 1965/1973 and Nash-Williams 1961 in LP form, as
Blink packs trees, Wang et al. MLSys 2020). Each tree carries a share of the buffer proportional to its
rate, cut into ``C`` pipeline chunks; every tree is rooted at its centre (least height ``D_t``).

* **allreduce**: a node at depth ``d`` adds chunk ``c`` of its subtree into its parent in step
  ``c + D_t − d``; the root has it whole after step ``c + D_t − 1``, and a node at depth ``d`` receives it
  back in step ``c + D_t + d − 1``. Reduction and broadcast of different chunks overlap, each tree edge
  carrying one chunk per step in each direction: ``C + 2D − 1`` steps (``D`` the largest height), each
  moving ``S/(R·C)`` of time per link when the trees are packed at rate ``R``. So the time is about
  ``(C + 2D − 1)(α + S/(R·C))``, and ``S/R`` meets the graph's lower bound where the packing does
  (:func:`~topotrain.collectives.treepack.allreduce_lower_bound_s`).
* **broadcast / reduce**: the same trees re-rooted at the root, one direction only: ``C + D − 1`` steps;
  their rates are the packing's scaled to the directed links they load (no optimality claim: Edmonds'
  arborescence packing would be the exact one).

The number of trees used (the best ``k``) and ``C`` minimise that estimate, ``α`` being the per-message
overhead plus the longest route's latency. **Fallback**: the schedule is compared with the built-in ring
(pipelined chain for broadcast/reduce) on the same ranks by a bottleneck-link estimate (per step the most
loaded link's bytes over its capacity, plus latency and overhead, on the routed paths), and the ring's
phases are emitted (``meta["construction"] == "ring"``) when the trees are not estimated faster — so
``synth`` does what the ring does on a switched fabric where the ring is already bandwidth-optimal.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives import ring
from topotrain.collectives.paths import path_cache
from topotrain.collectives.ring import overhead_option, positive_int_option, root_option
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, phase_key, split_bytes
from topotrain.collectives.treepack import DEFAULT_TIME_BUDGET_S, TreePacking, pack_trees
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

#: pipeline chunks per tree at most (the schedule has ``C + 2D − 1`` phases)
MAX_SYNTH_CHUNKS = 256
#: trees used at most (the packing's best first)
MAX_SYNTH_TREES = 64
#: transfers a tree schedule holds at most (a bound on its size for the network models: large groups get fewer
#: trees or chunks)
MAX_SYNTH_TRANSFERS = 400_000


def _adjacency(p: int, edges: np.ndarray) -> list[list[int]]:
    adj: list[list[int]] = [[] for _ in range(p)]
    for a, b in edges.tolist():
        adj[a].append(b)
        adj[b].append(a)
    return adj


def _bfs(adj: list[list[int]], root: int) -> tuple[np.ndarray, np.ndarray]:
    """(parent, depth) of every node of the tree ``adj`` hung from ``root`` (root's parent −1)."""
    p = len(adj)
    parent = np.full(p, -1, dtype=np.int64)
    depth = np.full(p, -1, dtype=np.int64)
    depth[root] = 0
    queue = deque([root])
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if depth[v] < 0:
                depth[v] = depth[u] + 1
                parent[v] = u
                queue.append(v)
    return parent, depth


def rooted(p: int, edges: np.ndarray, root: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(parent, depth) of the tree ``edges`` rooted at ``root``, or at its centre (the middle of a longest
    path: least height) when ``root`` is None."""
    adj = _adjacency(p, edges)
    if root is None:
        _, d0 = _bfs(adj, 0)
        far = int(np.argmax(d0))
        par, d1 = _bfs(adj, far)
        end = int(np.argmax(d1))
        path = [end]
        while path[-1] != far:
            path.append(int(par[path[-1]]))
        root = path[len(path) // 2]
    return _bfs(adj, root)


def _choose(rates: np.ndarray, heights: np.ndarray, size_bytes: int, alpha_s: float, fill: int,
            chunks: int | None, p: int) -> tuple[int, int]:
    """(trees k, chunks C) minimising ``(C + fill·D_k − 1)(α + S/(R_k·C))`` over the best-first prefixes,
    with ``k·fill·(p − 1)·C`` transfers at most :data:`MAX_SYNTH_TRANSFERS` (unless ``chunks`` is given)."""
    best: tuple[float, int, int] | None = None
    for k in range(1, min(len(rates), MAX_SYNTH_TREES) + 1):
        r = float(rates[:k].sum())
        steps0 = fill * int(heights[:k].max()) - 1
        if chunks is not None:
            cands = [chunks]
        else:
            c_opt = math.sqrt(max(steps0, 1) * size_bytes / (r * alpha_s)) if alpha_s > 0 else MAX_SYNTH_CHUNKS
            cands = sorted({max(1, min(MAX_SYNTH_CHUNKS, int(c))) for c in (math.floor(c_opt), math.ceil(c_opt))})
        share_min = size_bytes * float(rates[k - 1]) / r
        if k > 1 and share_min < 2:  # every tree's share at least two bytes (a share is rounded down)
            break
        cap_c = max(1, MAX_SYNTH_TRANSFERS // (k * fill * max(p - 1, 1)))
        for c in cands:
            c = max(1, min(c, int(share_min), cap_c if chunks is None else c))  # every chunk at least one byte
            t = (c + steps0) * (alpha_s + size_bytes / (r * c))
            if best is None or t < best[0] - 1e-15:
                best = (t, k, c)
    assert best is not None
    return best[1], best[2]


def _shares(size_bytes: int, rates: np.ndarray) -> np.ndarray:
    """``size_bytes`` split in proportion to ``rates`` (largest remainders; every share at least 1 byte)."""
    if size_bytes < len(rates):
        raise ValueError(f"synth: {size_bytes} bytes cannot be shared by {len(rates)} trees")
    raw = size_bytes * rates / rates.sum()
    out = np.maximum(np.floor(raw).astype(np.int64), 1)
    rest = int(size_bytes - out.sum())
    order = np.argsort(-(raw - np.floor(raw)), kind="stable")
    for j in order.tolist():  # the bytes left (fewer than the trees) to the largest remainders
        if rest == 0:
            break
        if rest > 0:
            out[j] += 1
            rest -= 1
    big = np.argsort(-out, kind="stable")
    i = 0
    while rest < 0:  # only when flooring to 1 byte overshot: the largest shares give back
        j = int(big[i % len(big)])
        if out[j] > 1:
            out[j] -= 1
            rest += 1
        i += 1
    return out


def _tree_phases(op: CollectiveOp, trees: list[tuple[np.ndarray, np.ndarray]], chunks: int) -> list[Phase]:
    """The pipelined steps of the module docstring; chunk ``t·C + c`` is chunk ``c`` of tree ``t``."""
    per = []
    for t, (parent, depth) in enumerate(trees):
        nodes = np.flatnonzero(parent >= 0)
        per.append((t * chunks, nodes, parent[nodes], depth[nodes], int(depth.max())))
    up = op is not CollectiveOp.BROADCAST
    down = op is not CollectiveOp.REDUCE
    n_steps = max(chunks + (2 if up and down else 1) * h - 1 for *_, h in per)
    phases: list[Phase] = []
    for s in range(n_steps):
        src, dst, lo, red = [], [], [], []
        for base, nodes, par, dep, h in per:
            if up:  # node at depth d sends chunk c = s − h + d to its parent
                c = s - h + dep
                live = (c >= 0) & (c < chunks)
                src.append(nodes[live])
                dst.append(par[live])
                lo.append(c[live] + base)
                red.append(np.ones(int(live.sum()), dtype=bool))
            # broadcast: node at depth d receives chunk c = s − (h + d − 1) (allreduce) or s − (d − 1)
            c = s - (h if up else 0) - dep + 1
            live = (c >= 0) & (c < chunks) if down else np.zeros(nodes.shape[0], dtype=bool)
            src.append(par[live])
            dst.append(nodes[live])
            lo.append(c[live] + base)
            red.append(np.zeros(int(live.sum()), dtype=bool))
        lo_a = np.concatenate(lo)
        phases.append(Phase.of(np.concatenate(src), np.concatenate(dst), lo_a, lo_a + 1, np.concatenate(red)))
    return phases


def estimate_s(schedule: Schedule, topo: Topology, alpha_s: float) -> float:
    """Bottleneck-link estimate of ``schedule`` alone on ``topo``: per phase, the most loaded directed link's
    bytes over its capacity, plus the longest route's latency and ``alpha_s``; phases added (identical
    phases priced once). Only chooses between constructions; the network models time schedules."""
    cache = path_cache(topo, schedule.ranks)
    cap = topo.capacity_bytes_per_s
    seen: dict[bytes, float] = {}
    total = 0.0
    for ph in schedule.phases:
        if len(ph) == 0:
            continue
        key = phase_key(schedule, ph)
        t = seen.get(key)
        if t is None:
            paths = cache.resolve(schedule, ph)
            load = paths.link_bytes(cap.shape[0])
            t = seen[key] = float((load / cap).max()) + float(paths.latency_s.max()) + alpha_s
        total += t
    return total


def _longest_latency_s(topo: Topology, ranks: Sequence[str], trees: list[tuple[np.ndarray, np.ndarray]]) -> float:
    lat = 0.0
    for parent, _ in trees:
        for v in np.flatnonzero(parent >= 0).tolist():
            lat = max(lat, topo.path_latency_s(topo.route(ranks[int(parent[v])], ranks[v])))
    return lat


def _directed_rates(topo: Topology, ranks: Sequence[str], trees: list[tuple[np.ndarray, np.ndarray]],
                    rates: np.ndarray, up: bool) -> np.ndarray:
    """``rates`` scaled so that the trees, each edge used in one direction (child→parent if ``up``), fill
    their most loaded directed link exactly."""
    cap = topo.capacity_bytes_per_s
    load = np.zeros(cap.shape[0])
    for (parent, _), x in zip(trees, rates.tolist(), strict=True):
        for v in np.flatnonzero(parent >= 0).tolist():
            a, b = (v, int(parent[v])) if up else (int(parent[v]), v)
            load[list(topo.route(ranks[a], ranks[b]))] += x
    return rates / float((load / cap).max())


def _ring_fallback(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
                   options: dict[str, Any]) -> Schedule | None:
    ring_opts = {k: v for k, v in options.items() if k in ("root", "message_overhead_s")}
    try:
        return ring.build(op, topo, ranks, size_bytes, **ring_opts)
    except ConfigError:
        return None


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int, **options: Any) -> Schedule:
    """Synthesized allreduce, broadcast or reduce over ``ranks`` (module docstring).

    Options: ``chunks`` (pipeline chunks per tree; default the estimate's optimum, at most
    :data:`MAX_SYNTH_CHUNKS`), ``root`` (broadcast/reduce: an index into ranks, default 0),
    ``time_budget_s`` (the packing's wall-clock guard, default
    :data:`~topotrain.collectives.treepack.DEFAULT_TIME_BUDGET_S`: past it the best packing found is used,
    ``meta["budget_hit"]`` is True and ``meta["optimal"]`` False; the search itself stops deterministically at
    the certified optimum or after :data:`~topotrain.collectives.treepack.MAX_ITERATIONS` rounds),
    ``message_overhead_s``. ``meta`` records the
    construction (``trees`` or ``ring``), the trees used, their rate and the packing's certified bound.
    """
    if op not in (CollectiveOp.ALLREDUCE, CollectiveOp.BROADCAST, CollectiveOp.REDUCE):
        raise ConfigError("collective.algorithm", f"algorithm 'synth' does not do {op.value}",
                          "synth does allreduce, broadcast and reduce")
    p = len(ranks)
    alpha = overhead_option(options)
    chunks_opt = positive_int_option(options, "chunks", "synth", 1) if "chunks" in options else None
    root = root_option(options, p, "synth") if op is not CollectiveOp.ALLREDUCE else None
    packing: TreePacking = pack_trees(topo, ranks, options.get("time_budget_s", DEFAULT_TIME_BUDGET_S))
    trees = [rooted(p, e, root) for e in packing.edges]
    rates = packing.rates_bytes_per_s
    if op is not CollectiveOp.ALLREDUCE:
        rates = _directed_rates(topo, ranks, trees, rates, up=op is CollectiveOp.REDUCE)
    heights = np.array([int(d.max()) for _, d in trees], dtype=np.int64)
    alpha_s = alpha + _longest_latency_s(topo, ranks, trees)
    fill = 2 if op is CollectiveOp.ALLREDUCE else 1
    k, c = _choose(rates, heights, int(size_bytes), alpha_s, fill, chunks_opt, p)
    used, used_rates = trees[:k], rates[:k]
    shares = _shares(int(size_bytes), used_rates)
    chunk_bytes = np.concatenate([split_bytes(int(sh), c) for sh in shares.tolist()])
    n = chunk_bytes.shape[0]
    every = np.full(n, -1, dtype=np.int64)
    at_root = np.full(n, -1 if root is None else root, dtype=np.int64)
    chunk_src = at_root if op is CollectiveOp.BROADCAST else every
    chunk_dst = at_root if op is CollectiveOp.REDUCE else every.copy()
    meta: dict[str, object] = {
        "construction": "trees", "trees": k, "chunks": c, "heights": heights[:k].tolist(),
        "rate_bytes_per_s": float(used_rates.sum()), "packing_bytes_per_s": packing.total_bytes_per_s,
        "bound_bytes_per_s": packing.bound_bytes_per_s, "optimal": packing.optimal,
        "budget_hit": packing.budget_hit, "iterations": packing.iterations}
    if root is not None:
        meta["root"] = root
    sched = Schedule(op, "synth", tuple(ranks), int(size_bytes), chunk_bytes, chunk_src, chunk_dst,
                     tuple(_tree_phases(op, used, c)), meta)
    fallback = _ring_fallback(op, topo, ranks, int(size_bytes), options)
    if fallback is not None:
        t_trees = estimate_s(sched, topo, alpha)
        t_ring = math.inf
        with contextlib.suppress(ConfigError):
            t_ring = estimate_s(fallback, topo, alpha)
        if t_ring <= t_trees:
            meta = {**meta, "construction": "ring", "trees_estimate_s": t_trees, "ring_estimate_s": t_ring,
                    **fallback.meta}
            return Schedule(op, "synth", fallback.ranks, fallback.size_bytes, fallback.chunk_bytes,
                            fallback.chunk_src, fallback.chunk_dst, fallback.phases, meta)
    return sched
