"""gloo's wait for a core at more ranks than cores (traces/sched.py, ``whatif.with_wake_waits``): the kernel's
default slice and gloo's hop counts by hand, the wait in the replay, in the workload JSON, and in the what-if
on the DDP fixture."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from topotrain.traces.cluster import HostCluster, fit_host_cluster
from topotrain.traces.importer import import_job
from topotrain.traces.model import RankTrace, TraceCollective, TraceJob, TraceOp, job_from_dict, job_to_dict
from topotrain.traces.sched import base_slice_s, gloo_hops, wake_wait_s
from topotrain.traces.whatif import on_shared_host
from topotrain.training.replay import replay
from topotrain.util.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data" / "traces"
HOST = HostCluster(bandwidth_bytes_per_s=1e8, message_overhead_s=1e-4)


def test_base_slice_follows_the_kernel_rule() -> None:
    # 0.70 ms × (1 + ilog2(min(ncpus, 8)))
    assert [base_slice_s(c) for c in (1, 2, 3, 4, 7, 8, 64)] == pytest.approx(
        [0.7e-3, 1.4e-3, 1.4e-3, 2.1e-3, 2.1e-3, 2.8e-3, 2.8e-3], rel=1e-12)
    with pytest.raises(ValueError, match="cores"):
        base_slice_s(0)


def test_gloo_hops() -> None:
    assert [gloo_hops(op, 4) for op in ("allreduce", "reduce-scatter", "allgather", "broadcast")] == [6, 6, 3, 3]
    assert gloo_hops("allreduce", 8) == 14 and gloo_hops("allreduce", 1) == 0


def test_wake_wait_by_hand() -> None:
    # 6 hops × 1.4 ms / 2 on 2 busy cores; 14 hops × 2.1 ms / 2 for 8 ranks on 4
    assert wake_wait_s("allreduce", 4, 2, True) == pytest.approx(4.2e-3, rel=1e-12)
    assert wake_wait_s("allreduce", 8, 4, True) == pytest.approx(14.7e-3, rel=1e-12)
    assert wake_wait_s("allreduce", 2, 2, True) == 0.0  # a core per rank
    assert wake_wait_s("allreduce", 4, 2, False) == 0.0  # the main threads sleep: the cores are free
    assert wake_wait_s("allreduce", 4, 0, True) == 0.0  # no shared cores


def _toy(wait_s: float) -> TraceJob:
    """Two ranks: operator a launches a 1 MB allreduce at its end, operator b needs it."""
    ar = TraceCollective("allreduce", 1_000_000, "0", (0, 1), (0.011, 0.011), 0.0102, (), wait_s)
    ops = (TraceOp("a", 0.01, 0.0, (), ((0, 0.01),)), TraceOp("b", 0.005, 0.0, (0,)))
    ranks = tuple(RankTrace(r, 0.0, 0.03, ops, f"r{r}") for r in (0, 1))
    return TraceJob(2, "gloo", ranks, (ar,), 0.03, "toy")


def test_the_replay_adds_the_wait_before_the_collective() -> None:
    base, waited = replay(_toy(0.0), HOST), replay(_toy(0.005), HOST)
    assert waited.step_s - base.step_s == pytest.approx(0.005, rel=1e-9)  # b waits for the allreduce
    assert replay(_toy(0.005), HOST, 2.0).step_s - replay(_toy(0.0), HOST, 2.0).step_s == pytest.approx(0.005)


def test_the_wait_survives_json_and_a_recorded_job_has_none(tmp_path: Path) -> None:
    d = job_to_dict(_toy(0.004))
    assert d["collectives"][0]["wake_wait_s"] == 0.004
    assert job_from_dict(json.loads(json.dumps(d))) == _toy(0.004)
    assert "wake_wait_s" not in job_to_dict(_toy(0.0))["collectives"][0]
    d["collectives"][0]["wake_wait_s"] = -1
    with pytest.raises(ConfigError, match=r"collectives\[0\]\.wake_wait_s"):
        job_from_dict(d)


def test_on_shared_host_gives_every_ddp_bucket_its_wait() -> None:
    job = import_job(sorted((DATA / "gpt-w2").glob("rank*.json.gz")))
    host = fit_host_cluster(job)
    big, _, _ = on_shared_host(job, 4, host, 2)
    assert [c.wake_wait_s for c in big.collectives] == pytest.approx(
        [gloo_hops(c.op, 4) * 0.7e-3 for c in big.collectives], rel=1e-12)
    assert all(c.wake_wait_s > 0 for c in big.collectives)
    assert on_shared_host(job, 2, host, 2)[0] is job  # the recorded size: an own-host replay, unchanged
    assert all(c.wake_wait_s == 0 for c in on_shared_host(job, 4, host, 4)[0].collectives)  # a core each
    assert all(c.wake_wait_s == 0 for c in on_shared_host(job, 4, host, 0)[0].collectives)  # none shared
    # the wait makes the what-if's step longer than the same job without it
    without = replace(big, collectives=tuple(replace(c, wake_wait_s=0.0) for c in big.collectives))
    _, shared, scale = on_shared_host(job, 4, host, 2)
    assert replay(big, shared, scale).step_s > replay(without, shared, scale).step_s
