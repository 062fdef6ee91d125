"""Step-aware weights of rooted trees: the packing's trees re-rooted, weighed by an LP over the pipeline's steps.

The packing (:mod:`~topotrain.collectives.treepack`) maximises the steady-state rate and is blind to where
a tree is rooted and how its pipeline fills and drains. Those set the rest of the time
(:mod:`~topotrain.collectives.synth_plan`): with ``q_T`` the fraction of the buffer on rooted tree ``T`` and
``C > m`` chunks,

    ``T(C) = (C + m)·α + (S/C)·[(C − m)·τ_{0,m} + Σ_{j<m} τ_{0,j} + Σ_{i>=1} τ_{i,m}]``,
    ``τ_{i,j} >= Σ_T q_T Σ_{i<=o<=j} A_T^o[l] / c_l``  for every directed link ``l``,  ``Σ_T q_T = 1``,

which is linear in ``(q, τ)`` for a fixed ``C`` and height cap ``H`` (``m = 2H − 1``): a time-expanded LP over
a fixed pool of columns, the steps of a pipeline instead of TACCL's/TE-CCL's time-expanded graph (Shah et
al. NSDI 2023; Liu et al. SIGCOMM 2024). The pool: every packing tree rooted at every rank (a path rooted at
its end fills in more steps than rooted at its middle, but spreads the fill over the other direction of the
links). :func:`weigh` solves it with HiGHS for a few ``H`` (the pool's least height up to three above), each
from ``C = c_start`` (the centre-rooted plan's) to the fixed point of ``C ← sqrt((F − m·M)·S/α)`` (the optimum
of ``T`` given the solution's fill; a few solves, warm-started as only the objective changes with ``C``); the
least ``T`` wins. The LP's optimum at a given ``C`` is at most the centre-rooted packing's (a feasible point of
it when ``H`` is at least the packing's height), and the builder keeps whichever plan estimates faster. Sizes are
bounded (:data:`MAX_POOL`, :data:`MAX_ROWS`); the solve is deterministic (the simplex; no clock unless the time
budget, a guard, is hit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topotrain.collectives.synth_plan import tree_loads
from topotrain.topology.graph import Topology

#: rooted trees in the pool at most (else no LP: the centre-rooted packing is used)
MAX_POOL = 1024
#: link-window rows at most
MAX_ROWS = 20_000
#: height caps tried above the pool's least height
EXTRA_HEIGHTS = 3
#: LP solves per height cap at most (``C`` iterated to its fixed point)
MAX_SOLVES = 4


@dataclass(frozen=True)
class Weights:
    """Rooted trees (``(parent, depth)``) and their fractions of the buffer (best first, all > 0), the LP's
    estimate (seconds) and its ``C``; ``budget_hit`` when the time guard stopped a solve."""

    trees: list[tuple[np.ndarray, np.ndarray]]
    fractions: np.ndarray
    estimate_s: float
    chunks: int
    budget_hit: bool


def weigh(topo: Topology, ranks: Sequence[str], trees: list[tuple[np.ndarray, np.ndarray]], size_bytes: int,
          alpha_s: float, max_chunks: int, time_budget_s: float, c_start: int = 1) -> Weights | None:
    """The LP of the module docstring over ``trees`` (allreduce). None when the pool is too large or no
    solve ended optimal."""
    try:
        import highspy  # the LP solver, loaded only when trees are weighed
    except ImportError:
        return None
    if not trees or len(trees) > MAX_POOL:
        return None
    heights = np.array([int(d.max()) for _, d in trees])
    loads = tree_loads(topo, ranks, trees, up=True, down=True)
    n_links = loads.links.shape[0]
    size = float(size_bytes)
    alpha_s = alpha_s + float(loads.latency_s.max())  # as the plan charges a step: overhead and latency
    best: Weights | None = None
    hit = False
    h_lo = int(heights.min())
    for cap_h in range(h_lo, min(int(heights.max()), h_lo + EXTRA_HEIGHTS) + 1):
        sel = np.flatnonzero(heights <= cap_h)
        m = 2 * cap_h - 1
        if (2 * m + 1) * n_links > MAX_ROWS:
            break
        keep = np.isin(loads.tree, sel)
        col_of = np.full(len(trees), -1, dtype=np.int64)
        col_of[sel] = np.arange(sel.shape[0])
        a = np.zeros((sel.shape[0], m + 1, n_links))
        np.add.at(a, (col_of[loads.tree[keep]], loads.offset[keep], loads.col[keep]), loads.weight[keep] * size)
        pre = np.cumsum(a, axis=1)
        suf = np.cumsum(a[:, ::-1], axis=1)[:, ::-1]
        windows = np.concatenate([pre[:, :m], pre[:, m:m + 1], suf[:, 1:]], axis=1)  # (trees, 2m+1, links)
        n_t, n_w = sel.shape[0], 2 * m + 1
        mat = windows.transpose(1, 2, 0).reshape(n_w * n_links, n_t)  # rows: (window, link)
        rows, cols = np.nonzero(mat)
        live = np.unique(rows)
        if live.shape[0] == 0:
            continue
        h = getattr(getattr(highspy, "_core", None), "_Highs", highspy.Highs)()
        h.setOptionValue("output_flag", False)
        inf = highspy.kHighsInf
        n_var = n_t + n_w
        h.addVars(n_var, np.zeros(n_var), np.full(n_var, inf))
        h.addRow(1.0, 1.0, n_t, np.arange(n_t, dtype=np.int32), np.ones(n_t))
        # row r = (window w, link l): Σ_T mat[r, T] q_T − τ_w <= 0 (the rows that load some link)
        r_of = np.full(n_w * n_links, -1, dtype=np.int64)
        r_of[live] = np.arange(live.shape[0])
        r_all = np.concatenate([r_of[rows], np.arange(live.shape[0])])
        c_all = np.concatenate([cols, n_t + live // n_links])
        v_all = np.concatenate([mat[rows, cols], np.full(live.shape[0], -1.0)])
        order = np.lexsort((c_all, r_all))
        starts = np.zeros(live.shape[0], dtype=np.int32)
        starts[1:] = np.cumsum(np.bincount(r_all, minlength=live.shape[0]))[:-1]
        h.addRows(live.shape[0], np.full(live.shape[0], -inf), np.zeros(live.shape[0]), order.shape[0], starts,
                  c_all[order].astype(np.int32), v_all[order])
        c_max = max(m + 1, max_chunks)
        c = min(c_max, max(m + 1, c_start))
        tried: set[int] = set()
        while c not in tried and len(tried) < MAX_SOLVES:  # C ← argmin of T given the fill: a fixed point
            tried.add(c)
            cnt = np.ones(n_w)
            cnt[m] = c - m
            h.changeColsCost(n_w, np.arange(n_t, n_var, dtype=np.int32), cnt / c)
            h.setOptionValue("time_limit", float(h.getRunTime() + time_budget_s))
            h.run()
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                hit = True
                break
            sol = np.asarray(h.getSolution().col_value, dtype=np.float64)
            q, tau = np.maximum(sol[:n_t], 0.0), sol[n_t:]
            t = float(h.getInfo().objective_function_value) + (c + m) * alpha_s
            if best is None or t < best.estimate_s * (1.0 - 1e-12):
                nz = np.flatnonzero(q > 1e-9 * q.max())
                order_q = nz[np.argsort(-q[nz], kind="stable")]
                best = Weights([trees[int(sel[i])] for i in order_q], q[order_q] / q[order_q].sum(), t, c, False)
            fill = max(0.0, float(tau.sum() - tau[m]) - m * float(tau[m]))  # seconds, as T(C)'s (F − m·M)·S
            c = min(c_max, max(m + 1, round(math.sqrt(fill / alpha_s)) if alpha_s > 0 else c_max))
    if best is None:
        return None
    return Weights(best.trees, best.fractions, best.estimate_s, best.chunks, hit)
