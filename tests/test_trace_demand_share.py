"""The what-if on shared cores (traces/whatif.py ``demand_share_scale``, ``on_shared_host``): hand-computed
cases of the CPU the ranks demand (their busy time plus their gloo collectives' CPU at the new size), the
recorded size left alone, and the gpt fixture's 2-process trace against its 4-process partner."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from topotrain.traces.cluster import HostCluster, fit_host_cluster
from topotrain.traces.importer import import_job
from topotrain.traces.model import RankTrace, TraceCollective, TraceJob, TraceOp
from topotrain.traces.whatif import (
    busy_s,
    collectives_cpu_s,
    core_share_scale,
    demand_share_scale,
    on_shared_host,
    resize,
    waits_outside,
)
from topotrain.training.replay import replay

DATA = Path(__file__).resolve().parent / "data" / "traces"
HOST = HostCluster(bandwidth_bytes_per_s=1e8, message_overhead_s=1e-4)


def _toy() -> TraceJob:
    """Two ranks, one 1 MB allreduce launched 10 ms into operator b and waited for 10 ms inside it."""
    ar = TraceCollective("allreduce", 1_000_000, "0", (0, 1), (0.012, 0.012), 0.0102)

    def ops(first_s: float) -> tuple[TraceOp, ...]:
        return (TraceOp("a", first_s, 0.01), TraceOp("b", 0.04, 0.0, (), ((0, 0.01),), (), ((0, 0.01),)))
    ranks = (RankTrace(0, 0.0, 0.12, ops(0.05), "r0"), RankTrace(1, 0.0, 0.12, ops(0.07), "r1"))
    return TraceJob(2, "gloo", ranks, (ar,), 0.12, "toy")


def test_busy_time_leaves_out_the_waits_inside_operators() -> None:
    job = _toy()
    assert [busy_s(r) for r in job.ranks] == pytest.approx([0.09, 0.11])  # 0.05 + 0.01 + 0.04 − 0.01


def test_demand_share_by_hand() -> None:
    job = _toy()
    # the ring at 4 ranks: 2 · 3 steps · (α + S/(4B)) = 6 · (1e-4 + 2.5e-3) = 15.6 ms per rank
    assert collectives_cpu_s(resize(job, 4).collectives, HOST) == pytest.approx(0.0156)
    # b = 0.10 s: 4 ranks on 2 cores demand 4 · (0.10 + 0.0156) / 2 per rank's 0.10 s of work
    assert demand_share_scale(job, 4, HOST, 2) == pytest.approx(2.312)
    assert demand_share_scale(job, 2, HOST, 2) == 1.0  # the recorded size, a core per rank
    assert demand_share_scale(job, 8, HOST, 0) == 1.0  # no shared cores
    assert demand_share_scale(job, 2, HOST, 4) == demand_share_scale(job, 4, HOST, 4) == 1.0  # a core each
    # 8 ranks: 2 · 7 · (1e-4 + 1.25e-3) = 18.9 ms; 8 · 0.1189 / (2 · 0.1)
    assert demand_share_scale(job, 8, HOST, 2) == pytest.approx(4.756)
    # from a recording that shared its cores (4 ranks on 2): the ratio of the two stretches
    four = resize(job, 4)
    assert demand_share_scale(four, 8, HOST, 2) == pytest.approx(4.756 / 2.312)


def test_waits_inside_operators_made_waits_by_hand() -> None:
    job = _toy()
    big = resize(job, 4)
    ops = waits_outside(big.ranks[0].ops)
    assert ops[0] == big.ranks[0].ops[0]  # no wait inside: as recorded
    # b: 30 ms of work, the allreduce launched 10 ms in: cut there; the 20 ms after it wait for the allreduce
    assert len(ops) == 3
    assert (ops[1].duration_s, ops[1].host_gap_s, ops[1].launches, ops[1].waits, ops[1].hidden_waits) == (
        0.01, 0.0, ((0, 0.01),), (), ())
    assert ops[2].duration_s == pytest.approx(0.02)
    assert (ops[2].host_gap_s, ops[2].launches, ops[2].waits, ops[2].hidden_waits) == (0.0, (), (0,), ())
    # a collective launched after the wait moves to the second operator, at its offset less the cut
    two = TraceOp("c", 0.05, 0.002, (), ((0, 0.01), (1, 0.03)), (), ((0, 0.015),))
    first, second = waits_outside((two,))
    assert (first.duration_s, first.host_gap_s, first.launches) == (0.01, 0.002, ((0, 0.01),))
    assert second.duration_s == pytest.approx(0.025) and second.waits == (0,)
    (k, t), = second.launches
    assert k == 1 and t == pytest.approx(0.02)


def test_on_shared_host_by_hand() -> None:
    job = _toy()
    big, shared, scale = on_shared_host(job, 4, HOST, 2)
    assert scale == pytest.approx(2.312)
    assert shared.bandwidth_bytes_per_s == pytest.approx(5e7) and shared.message_overhead_s == pytest.approx(2e-4)
    assert [o.duration_s for o in big.ranks[3].ops] == pytest.approx([0.07, 0.01, 0.02])  # rank 1's ops, cut
    assert big.ranks[3].ops[2].waits == (0,)
    # the allreduce starts once the last rank (1 or 3: 10 ms gap, 70 ms, 10 ms, ×2.312) launched it, runs the
    # ring on the shared host, 6 · (2e-4 + 1e6 / (4 · 5e7)) = 31.2 ms, and the 20 ms after the wait follow
    step = replay(big, shared, scale).step_s
    assert step == pytest.approx(0.09 * 2.312 + 6 * (2e-4 + 1e6 / (4 * 5e7)) + 0.02 * 2.312, rel=1e-9)
    assert on_shared_host(job, 2, HOST, 2) == (job, HOST, 1.0)


@cache
def _fixture(name: str) -> TraceJob:
    return import_job(sorted((DATA / name).glob("rank*.json.gz")))


def test_gpt_fixture_at_4_ranks_is_at_least_the_cpu_bound() -> None:
    """gpt-w2 → 4 ranks on 2 cores: the replay is at least the ranks' CPU demand over the cores, 4 · (b + g₄)
    / 2, and longer than processor sharing of the operators alone (×2), which leaves gloo's CPU out."""
    small, recorded = _fixture("gpt-w2"), _fixture("gpt-w4")
    host = fit_host_cluster(small)
    big, shared, scale = on_shared_host(small, 4, host, 2)
    b = sum(busy_s(r) for r in small.ranks) / 2
    g4 = collectives_cpu_s(big.collectives, host)
    assert g4 > 0 and scale == pytest.approx(4 * (b + g4) / (2 * b))
    step = replay(big, shared, scale).step_s
    assert step >= 4 * (b + g4) / 2 * (1 - 1e-9)
    assert step > replay(resize(small, 4), shared, core_share_scale(2, 4, 2)).step_s
    assert [(c.op, c.size_bytes) for c in big.collectives] == [(c.op, c.size_bytes) for c in recorded.collectives]
