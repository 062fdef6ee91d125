"""How a packing of trees is cut into equal lanes and pipeline chunks: the plan of a synthesized schedule.

**Lanes.** A packing gives tree ``t`` a rate ``x_t``. Carrying a share proportional to ``x_t`` on each tree
puts transfers of unequal sizes in one step, and a fair-sharing network (max-min, as the ``flow`` model and
TCP/RDMA congestion control share a link) gives them equal rates, so the smaller ones finish first and the
step outlasts its most loaded link's bytes over capacity (measured: a BiGraph packing with one tree at twice
the others' rate took 1.19x its estimate; the same packing with that tree split in two took 1.00x). So the
buffer is cut into ``N`` equal *lanes*; tree ``t`` carries ``n_t`` of them, ``n`` the largest-remainder
apportionment of ``N`` in proportion to ``x`` (Hamilton's method). Every transfer of a step then has the same
size. The lanes' rate is ``R_N = N / max_l Σ_t n_t a_t[l] / c_l`` (``a_t[l]``: how many of tree ``t``'s
transfers per step cross directed link ``l``, ``c_l`` its capacity): ``R_N`` tends to the packing's rate as
``N`` grows; the rounding costs some of it at small ``N``.

**Steps.** Tree ``t`` (height ``h_t``) moves chunk ``c`` of a lane over the edge above a node at depth
``d`` in step ``c + o``, ``o = h_t − d`` on the way up (reduce) and ``o = h_t + d − 1`` on the way down
(allreduce's broadcast; ``d − 1`` for a broadcast alone): a transfer group of *offset* ``o`` is busy in steps
``o … o + C − 1``. With ``W_o[l]`` the lanes of offset-``o`` groups crossing ``l`` over ``c_l``, step ``s``
loads link ``l`` with ``(S / (N·C))·Σ_{s−C < o <= s} W_o[l]`` and lasts ``α + (S / (N·C))·max_l`` of the sum
(a bottleneck estimate, as :func:`~topotrain.collectives.synth.estimate_s`; ``α`` the per-message overhead and
the longest route's latency). Summed over the ``C + m`` steps (``m`` the largest offset) for ``C > m``:

    ``T(C) = (C + m)·α + S·M_{0,m}/N + (S/(N·C))·(F − m·M_{0,m})``,

``M_{i,j} = max_l Σ_{i<=o<=j} W_o[l]``, ``F = Σ_{j<m} M_{0,j} + Σ_{i>=1} M_{i,m}`` (the fill and drain steps):
the α-β trade-off of a pipeline (Hockney's model; the pipelined-tree optimum of Johnsson & Ho, IEEE TC 1989,
is this form with ``F = 2m·M``-like fill). Its optimum ``C* = sqrt(S(F − m·M)/(N·α))`` when ``F > m·M``; where
the fill steps are light (a step that only reduces loads each link one way: about half) the best ``C`` is
small. ``C <= m`` is summed step by step. :func:`plan` picks the ``(N, C)`` of least ``T`` over ``N`` in
:data:`LANE_COUNTS` and every admissible ``C`` (ties to the smaller ``N``, then ``C``): deterministic, well under
a second. Where every transfer crosses one link, fair sharing loses nothing (a link's transfers are its own and
it stays busy until they end), so shares proportional to the rates are used instead (``exact``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topotrain.topology.graph import Topology

#: lanes at most (each lane is one transfer per tree edge per step)
MAX_LANES = 512
#: the lane counts tried: every one to 64, then a sparser grid (a packing of many trees of uneven rates loses
#: rate to rounding at a few lanes: 21% on the 64-GPU rail example's 48 trees at 64 lanes)
LANE_COUNTS = (*range(1, 65), 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, MAX_LANES)


@dataclass(frozen=True)
class TreeLoads:
    """Per tree, the transfers of one lane as (offset, directed link, lanes / capacity) entries, and its
    longest route's latency. ``num_offsets`` is ``m + 1``; ``links`` the directed links used (ids)."""

    tree: np.ndarray
    offset: np.ndarray
    col: np.ndarray
    weight: np.ndarray
    links: np.ndarray
    latency_s: np.ndarray
    num_offsets: np.ndarray
    #: every transfer crosses one link (a graph of GPUs: routes between neighbours)
    single_link: bool


def tree_loads(topo: Topology, ranks: Sequence[str], trees: Sequence[tuple[np.ndarray, np.ndarray]],
               up: bool, down: bool) -> TreeLoads:
    """The step offsets of the module docstring for every edge of every tree (``(parent, depth)`` arrays),
    each entry weighted ``1 / c_l``; ``up``/``down``: the directions the collective moves."""
    cap = topo.capacity_bytes_per_s
    t_l: list[int] = []
    o_l: list[int] = []
    k_l: list[int] = []
    single = True
    lat = np.zeros(len(trees))
    top = np.zeros(len(trees), dtype=np.int64)
    for t, (parent, depth) in enumerate(trees):
        h = int(depth.max())
        for v in np.flatnonzero(parent >= 0).tolist():
            u, d = int(parent[v]), int(depth[v])
            moves = []
            if up:
                moves.append((h - d, topo.route(ranks[v], ranks[u])))
            if down:
                moves.append(((h if up else 0) + d - 1, topo.route(ranks[u], ranks[v])))
            for o, route in moves:
                lat[t] = max(lat[t], topo.path_latency_s(route))
                single &= len(route) == 1
                top[t] = max(top[t], o + 1)
                t_l.extend([t] * len(route))
                o_l.extend([o] * len(route))
                k_l.extend(route)
    links, col = np.unique(np.array(k_l, dtype=np.int64), return_inverse=True)
    return TreeLoads(np.array(t_l, dtype=np.int64), np.array(o_l, dtype=np.int64), col.astype(np.int64),
                     1.0 / cap[links][col], links, lat, top, single)


def apportion(n: int, rates: np.ndarray) -> np.ndarray:
    """``n`` lanes in proportion to ``rates`` (largest remainders, ties to the earlier tree; some may get 0)."""
    raw = n * rates / rates.sum()
    out = np.floor(raw).astype(np.int64)
    rest = n - int(out.sum())
    order = np.argsort(-(raw - out), kind="stable")
    out[order[:rest]] += 1
    return out


@dataclass(frozen=True)
class Plan:
    """How the buffer is shared: ``lanes[t]`` equal lanes on tree ``t`` (``exact`` False), or, ``exact``, one
    share per tree proportional to its packing rate (``lanes[t]`` 1 for the trees used, 0 for the others);
    chunks per lane (share), the rate (bytes/s of the buffer) and the estimated time (seconds) of the module
    docstring."""

    lanes: np.ndarray
    chunks: int
    rate_bytes_per_s: float
    estimate_s: float
    exact: bool

    @property
    def num_lanes(self) -> int:
        return int(self.lanes.sum())


def _window_max(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(``M_{0,j}`` for every j, ``M_{i,m}`` for every i, ``M_{0,m}``) of the offset loads ``w`` (offsets × links)."""
    pre = np.cumsum(w, axis=0)
    suf = np.cumsum(w[::-1], axis=0)[::-1]
    return pre.max(axis=1), suf.max(axis=1), float(pre[-1].max())


def steps_time_s(w: np.ndarray, c: int, size: float, alpha_s: float) -> float:
    """``T(C)`` summed step by step: ``w`` the offset loads (offsets × links, per byte of the buffer), steps
    ``s = 0 … C + m − 1`` each ``α + (size/C)·max_l Σ_{s−C < o <= s} w_o[l]`` (any ``C``; :func:`plan` uses it
    for ``C <= m`` and the closed form above that)."""
    m = w.shape[0] - 1
    pre = np.vstack([np.zeros((1, w.shape[1])), np.cumsum(w, axis=0)])
    s = np.arange(c + m)
    lo = np.maximum(0, s - c + 1)
    hi = np.minimum(s, m)
    pairs, count = np.unique(np.stack([lo, hi], axis=1), axis=0, return_counts=True)
    peak = (pre[pairs[:, 1] + 1] - pre[pairs[:, 0]]).max(axis=1)
    return float((c + m) * alpha_s + size / c * float(peak @ count))


def _weights(rates: np.ndarray, exact: bool) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Candidate shares: (lanes per tree, fraction of the buffer per tree, the smallest piece's fraction)."""
    out = []
    if exact:  # the best-first prefixes, shares proportional to the rates
        ks = sorted({*range(1, min(64, rates.shape[0]) + 1), rates.shape[0]})  # and every tree
        for k in ks:
            q = np.zeros(rates.shape[0])
            q[:k] = rates[:k] / rates[:k].sum()
            out.append(((q > 0).astype(np.int64), q, 0))
    else:
        for n in LANE_COUNTS:
            lanes = apportion(n, rates)
            out.append((lanes, lanes / n, n))
    return out


def plan(loads: TreeLoads, rates: np.ndarray, size_bytes: int, alpha_s: float, transfers_per_lane_chunk: int,
         max_transfers: int, max_chunks: int, chunks: int | None = None, exact: bool = False) -> Plan:
    """The shares and ``C`` of least estimated time (module docstring); ``chunks`` fixes ``C``; ``exact``: shares
    proportional to the rates (one per tree, best-first prefixes) instead of equal lanes. A schedule holds
    ``lanes·C·transfers_per_lane_chunk`` transfers, at most ``max_transfers``; every chunk is at least a byte."""
    size = float(size_bytes)
    n_links = loads.links.shape[0]
    best: Plan | None = None
    for lanes, q, n in _weights(rates, exact):
        used = lanes > 0
        pieces = int(lanes.sum())
        smallest = size_bytes // n if n else int(min(np.floor(q[used] * size)))
        if smallest < 1:
            break
        m = int(loads.num_offsets[used].max()) - 1
        a = alpha_s + float(loads.latency_s[used].max())
        w = np.bincount(loads.offset * n_links + loads.col, weights=q[loads.tree] * loads.weight,
                        minlength=(int(loads.num_offsets.max())) * n_links)
        w = w.reshape(-1, n_links)[:m + 1]
        first, last, full = _window_max(w)
        c_top = max(1, min(max_chunks, smallest, max_transfers // max(1, pieces * transfers_per_lane_chunk)))
        fill = max(0.0, float(first[:m].sum() + last[1:].sum()) - m * full)  # >= 0: subadditivity of max
        if chunks is not None:
            cands = [min(chunks, smallest)]
        else:
            cands = list(range(1, min(m, c_top) + 1))
            if c_top > m:
                c_opt = math.sqrt(size * fill / a) if fill > 0 and a > 0 else m + 1
                cands += sorted({min(c_top, max(m + 1, int(v))) for v in (math.floor(c_opt), math.ceil(c_opt))})
        for c in cands:
            t = (c + m) * a + size * full + size / c * fill if c > m else steps_time_s(w, c, size, a)
            if best is None or t < best.estimate_s * (1.0 - 1e-12):
                best = Plan(lanes, c, 1.0 / full, t, exact)
    assert best is not None
    return best
