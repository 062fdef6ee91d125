"""The host's α and B fitted by least squares constrained to α ≥ 0 and 1/B ≥ 0 (traces/cluster.py
``_fit_alpha_beta``): against a brute-force search of the same objective where the unconstrained solution is
not physical (the spans of a 4-process FSDP2 recording on 2 cores fall with size), and unchanged where it is."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.traces.cluster import UNBOUNDED_BANDWIDTH_BYTES_PER_S, _fit_alpha_beta, fit_host_cluster
from topotrain.traces.model import RankTrace, TraceCollective, TraceJob, TraceOp
from topotrain.traces.whatif import ring_time_s


def _objective(rows: list[tuple[int, float, float]], alpha: float, inv_bw: float) -> float:
    return sum(((s * alpha + w * inv_bw) / t - 1.0) ** 2 for s, w, t in rows)


def _brute(rows: list[tuple[int, float, float]]) -> float:
    """The smallest objective over a fine grid of α ≥ 0, 1/B ≥ 0 (an independent search)."""
    best = np.inf
    for alpha in np.linspace(0, 2e-3, 401):
        for inv in np.linspace(0, 2e-7, 401):
            best = min(best, _objective(rows, float(alpha), float(inv)))
    return float(best)


def test_constrained_fit_where_the_unconstrained_one_is_not_physical() -> None:
    # spans that fall with size (the scheduler, not the bytes, sets them): unconstrained 1/B < 0
    rows = [(3, 3 * 5_000 / 4, 5.9e-3), (3, 3 * 58_000 / 4, 5.8e-3), (6, 6 * 230_000 / 4, 2.9e-3),
            (3, 3 * 230_000 / 4, 4.1e-3)]
    a = np.array([[s / t, w / t] for s, w, t in rows])
    (_, inv), *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    assert inv < 0  # what the fit before fell back from
    fitted = _fit_alpha_beta(rows)
    assert fitted is not None
    alpha, bw = fitted
    inv_fit = 0.0 if bw == UNBOUNDED_BANDWIDTH_BYTES_PER_S else 1.0 / bw
    assert alpha >= 0 and inv_fit >= 0
    assert _objective(rows, alpha, inv_fit) <= _brute(rows) + 1e-9
    # a physical solution is kept as it is
    rows2 = [(2, 2 * s / 2, 2 * 50e-6 + 2 * s / 2 / 1e8) for s in (10_000, 100_000, 1_000_000)]
    assert _fit_alpha_beta(rows2) == pytest.approx((50e-6, 1e8), rel=1e-6)


def test_fit_host_cluster_keeps_the_sizes_that_do_not_move_the_span() -> None:
    # an FSDP2-like job at 4 ranks whose spans do not grow with the bytes: the fit before fell back to α 20 µs
    # and the median bandwidth, making the 230 KB allreduce ~12x its span; now α carries the spans
    spans = [(5_000, "allgather", 5.9e-3), (58_000, "allgather", 5.8e-3), (230_000, "allgather", 4.1e-3),
             (230_000, "allreduce", 2.9e-3)]
    colls = tuple(TraceCollective(op, size, "0", (0, 1, 2, 3), (t,) * 4, t) for size, op, t in spans)
    ops = (TraceOp("a", 0.001, 0.0, (), tuple((k, 0.0) for k in range(4))), TraceOp("b", 0.001, 0.0, (0, 1, 2, 3)))
    job = TraceJob(4, "gloo", tuple(RankTrace(r, 0.0, 0.03, ops, f"r{r}") for r in range(4)), colls, 0.03, "t")
    host = fit_host_cluster(job)
    assert max(ring_time_s(c, host) / c.measured_net_s for c in colls) < 3
