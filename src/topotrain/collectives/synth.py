"""Collectives synthesized for the topology at hand: allreduce, broadcast and reduce on packed spanning trees.

The trees and their rates come from :func:`~topotrain.collectives.treepack.pack_trees` (a fractional
spanning-tree packing over the routed rank pairs, Edmonds 1965/1973 and Nash-Williams 1961 in LP form, as
Blink packs trees, Wang et al. MLSys 2020); every tree is rooted at its centre (least height ``D_t``).
The buffer is cut into pieces — shares proportional to the trees' rates where every transfer crosses one
link, equal lanes elsewhere — each pipelined in ``C`` chunks (:mod:`~topotrain.collectives.synth_plan`
chooses them by a step-by-step bottleneck estimate, and says why lanes).

* **allreduce**: a node at depth ``d`` adds chunk ``c`` of its subtree into its parent in step
  ``c + D_t − d``; the root has it whole after step ``c + D_t − 1``, and a node at depth ``d`` receives it
  back in step ``c + D_t + d − 1``. Reduction and broadcast of different chunks overlap, each tree edge
  carrying one chunk per step in each direction: ``C + 2D − 1`` steps (``D`` the largest height), each
  moving ``S/(R·C)`` of time per link when the trees are packed at rate ``R``. So the time is at most about
  ``(C + 2D − 1)(α + S/(R·C))``, and ``S/R`` meets the graph's lower bound where the packing does
  (:func:`~topotrain.collectives.treepack.allreduce_lower_bound_s`). The step-aware LP of
  :mod:`~topotrain.collectives.synth_lp` may re-weigh the trees rooted anywhere (kept when it estimates faster).
* **broadcast / reduce**: the same trees re-rooted at the root, one direction only: ``C + D − 1`` steps
  (no optimality claim: Edmonds' arborescence packing would be the exact one).

**The best candidate.** The tree schedule is compared with the built-in ring (pipelined chain for
broadcast/reduce) and, for allreduce, halving-doubling and hierarchical on the same ranks, by a bottleneck-link
estimate (:func:`estimate_s`: per step the most loaded link's bytes over its capacity, plus latency and
overhead, on the routed paths); the least wins, a built-in on a tie (``meta["construction"]``, every
candidate's estimate in ``meta["estimates_s"]``) — so ``synth`` does what the ring does on a switched fabric
where the ring is already bandwidth-optimal.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from topotrain.collectives import halving_doubling, hierarchical, ring
from topotrain.collectives.paths import path_cache
from topotrain.collectives.ring import overhead_option, positive_int_option, root_option
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, phase_key, split_bytes
from topotrain.collectives.synth_lp import weigh
from topotrain.collectives.synth_plan import apportion, plan, tree_loads
from topotrain.collectives.treepack import DEFAULT_TIME_BUDGET_S, TreePacking, pack_trees
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

#: pipeline chunks per tree at most (the schedule has ``C + 2D − 1`` phases)
MAX_SYNTH_CHUNKS = 256
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


def _rerooted(p: int, edge_sets: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every tree of ``edge_sets`` rooted at every rank, duplicates dropped, in a fixed order."""
    out = []
    seen: set[bytes] = set()
    for e in edge_sets:
        for r in range(p):
            par, dep = rooted(p, e, r)
            if par.tobytes() not in seen:
                seen.add(par.tobytes())
                out.append((par, dep))
    return out


def _candidates(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int,
                options: dict[str, Any]) -> list[Schedule]:
    """The built-in schedules synth weighs its trees against: ring (pipelined chain for broadcast/reduce);
    for allreduce also halving-doubling and hierarchical. One that cannot be built on these ranks is left out."""
    out = []
    ring_opts = {k: v for k, v in options.items() if k in ("root", "message_overhead_s")}
    builders: list[tuple[Any, dict[str, Any]]] = [(ring.build, ring_opts)]
    if op is CollectiveOp.ALLREDUCE:
        builders += [(halving_doubling.build, {}), (hierarchical.build, {})]
    for fn, opts in builders:
        with contextlib.suppress(ConfigError):
            out.append(fn(op, topo, ranks, size_bytes, **opts))
    return out


def build(op: CollectiveOp, topo: Topology, ranks: Sequence[str], size_bytes: int, **options: Any) -> Schedule:
    """Synthesized allreduce, broadcast or reduce over ``ranks`` (module docstring).

    Options: ``chunks`` (pipeline chunks per tree; default the estimate's optimum, at most
    :data:`MAX_SYNTH_CHUNKS`), ``root`` (broadcast/reduce: an index into ranks, default 0),
    ``time_budget_s`` (the packing's wall-clock guard, default
    :data:`~topotrain.collectives.treepack.DEFAULT_TIME_BUDGET_S`: past it the best packing found is used,
    ``meta["budget_hit"]`` is True and ``meta["optimal"]`` False; the search itself stops deterministically at
    the certified optimum or after :data:`~topotrain.collectives.treepack.MAX_ITERATIONS` rounds),
    ``message_overhead_s``. ``meta`` records the
    construction (``trees`` or the built-in chosen), the trees, lanes and chunks used, their rate and the
    packing's certified bound.
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
    fill = 2 if op is CollectiveOp.ALLREDUCE else 1
    loads = tree_loads(topo, ranks, trees, up=op is not CollectiveOp.BROADCAST, down=op is not CollectiveOp.REDUCE)
    rates = packing.rates_bytes_per_s
    pl = plan(loads, rates, int(size_bytes), alpha, fill * max(p - 1, 1), MAX_SYNTH_TRANSFERS, MAX_SYNTH_CHUNKS,
              chunks_opt, exact=loads.single_link)
    weighed = None
    if op is CollectiveOp.ALLREDUCE and chunks_opt is None and p > 2:
        # the step-aware LP over the packing's trees rooted anywhere (synth_lp.py); kept if it plans faster
        pool = _rerooted(p, packing.edges)
        weighed = weigh(topo, ranks, pool, int(size_bytes), alpha, MAX_SYNTH_CHUNKS,
                        float(options.get("time_budget_s", DEFAULT_TIME_BUDGET_S)), pl.chunks)
        if weighed is not None:
            loads_w = tree_loads(topo, ranks, weighed.trees, up=True, down=True)
            pl_w = plan(loads_w, weighed.fractions, int(size_bytes), alpha, fill * max(p - 1, 1),
                        MAX_SYNTH_TRANSFERS, MAX_SYNTH_CHUNKS, None, exact=loads_w.single_link)
            if pl_w.estimate_s < pl.estimate_s * (1.0 - 1e-9):
                trees, rates, loads, pl = weighed.trees, weighed.fractions, loads_w, pl_w
            else:
                weighed = None
    c = pl.chunks
    used_trees = np.flatnonzero(pl.lanes > 0)
    lanes = [trees[t] for t in used_trees.tolist() for _ in range(int(pl.lanes[t]))]
    if pl.exact:  # shares proportional to the rates: every link's transfers are its own, fair sharing loses nothing
        shares = apportion(int(size_bytes), rates[used_trees])
    else:
        shares = split_bytes(int(size_bytes), len(lanes))
    chunk_bytes = np.concatenate([split_bytes(sh, c) for sh in shares.tolist()])
    n = chunk_bytes.shape[0]
    every = np.full(n, -1, dtype=np.int64)
    at_root = np.full(n, -1 if root is None else root, dtype=np.int64)
    chunk_src = at_root if op is CollectiveOp.BROADCAST else every
    chunk_dst = at_root if op is CollectiveOp.REDUCE else every.copy()
    heights = [int(trees[t][1].max()) for t in used_trees.tolist()]
    meta: dict[str, object] = {
        "construction": "trees", "trees": int(used_trees.shape[0]), "lanes": pl.num_lanes,
        "lanes_per_tree": pl.lanes[used_trees].tolist(), "equal_lanes": not pl.exact, "chunks": c, "heights": heights,
        "rate_bytes_per_s": pl.rate_bytes_per_s, "plan_estimate_s": pl.estimate_s,
        "packing_bytes_per_s": packing.total_bytes_per_s, "bound_bytes_per_s": packing.bound_bytes_per_s,
        "optimal": packing.optimal, "budget_hit": packing.budget_hit or (weighed is not None and weighed.budget_hit),
        "iterations": packing.iterations, "rooting": "centre" if weighed is None else "step LP"}
    if root is not None:
        meta["root"] = root
    sched = Schedule(op, "synth", tuple(ranks), int(size_bytes), chunk_bytes, chunk_src, chunk_dst,
                     tuple(_tree_phases(op, lanes, c)), meta)
    # the best of the trees and the built-ins by the same estimate (a built-in wins ties: fewer phases)
    estimates: dict[str, float] = {}
    best: tuple[float, Schedule] | None = None
    for cand in _candidates(op, topo, ranks, int(size_bytes), options):
        with contextlib.suppress(ConfigError):
            t = estimates[cand.algorithm] = estimate_s(cand, topo, alpha)
            if best is None or t < best[0]:
                best = (t, cand)
    t_trees = estimates["trees"] = estimate_s(sched, topo, alpha)
    if best is not None and best[0] <= t_trees:
        chosen = best[1]
        meta = {**meta, "construction": chosen.algorithm, "estimates_s": estimates, **chosen.meta}
        return Schedule(op, "synth", chosen.ranks, chosen.size_bytes, chosen.chunk_bytes, chosen.chunk_src,
                        chosen.chunk_dst, chosen.phases, meta)
    sched.meta["estimates_s"] = estimates
    return sched
