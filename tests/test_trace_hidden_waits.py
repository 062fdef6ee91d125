"""Waits left inside operators (FSDP2 on CPU launches each all-gather and reduce-scatter and waits for it
inside one hook): the import finds them on the FSDP fixtures and none on the DDP ones, they survive the
workload JSON and Chakra, and the what-if on the recording host makes them waits for their collectives in
the replay (and changes nothing else)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from topotrain.traces.chakra import export_chakra, import_chakra
from topotrain.traces.cluster import fit_host_cluster
from topotrain.traces.importer import import_job
from topotrain.traces.model import TraceJob, job_from_dict, job_to_dict
from topotrain.traces.readers import backend_span_op
from topotrain.traces.whatif import on_shared_host, resize, ring_time_s, shared_host
from topotrain.util.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data" / "traces"


@cache
def _job(name: str) -> TraceJob:
    return import_job(sorted((DATA / name).glob("rank*.json.gz")))


@pytest.mark.parametrize("name", ["gpt-fsdp-w2", "resnet-fsdp-w2"])
def test_fsdp_waits_inside_hooks_are_found(name: str) -> None:
    job = _job(name)
    found = [(o, k, t) for rt in job.ranks for o in rt.ops for k, t in o.hidden_waits]
    assert len(found) >= 8
    for o, k, t in found:
        assert 0 < t <= o.duration_s  # part of the operator's measured span
        assert k in [x for x, _ in o.launches]  # a collective the operator launched itself
        assert job.collectives[k].op in ("allgather", "reduce-scatter")


@pytest.mark.parametrize("name", ["gpt-w2", "resnet-w2", "gpt-w4"])
def test_ddp_has_none(name: str) -> None:
    assert not any(o.hidden_waits for rt in _job(name).ranks for o in rt.ops)


def test_on_shared_host_makes_them_waits_and_nothing_else() -> None:
    """At 4 ranks on 2 cores each operator holding a wait is cut after its launch: its work after the cut
    waits for the collective, which the replay starts once every rank launched it; the rest as recorded."""
    job = _job("resnet-fsdp-w2")
    host = fit_host_cluster(job)
    plain = resize(job, 4)
    big, shared, scale = on_shared_host(job, 4, host, 2)
    assert shared == shared_host(host, 2.0) and scale > 2.0  # gloo's CPU adds to the operators' 2 per core
    inside = {k for rt in job.ranks for o in rt.ops for k, _ in o.hidden_waits}
    assert [replace(c, wake_wait_s=0.0) for c in big.collectives] == list(plain.collectives)
    # a collective waited for inside its hook leaves the cores to gloo (waits 0); the others (all-gathers #3,
    # #4, #7 prefetched, reduce-scatter #9) wait for a core at each hop, half the 1.4 ms slice of 2 cores:
    # 3 hops for an all-gather on 4 ranks, 6 for a reduce-scatter (gloo runs it as an allreduce)
    assert sorted(inside) == [0, 1, 2, 5, 6, 8, 10]
    assert [c.wake_wait_s for c in big.collectives] == pytest.approx(
        [0, 0, 0, 2.1e-3, 2.1e-3, 0, 0, 2.1e-3, 0, 4.2e-3, 0], rel=1e-12, abs=0)
    for rp, rb in zip(plain.ranks, big.ranks, strict=True):
        got = list(rb.ops)
        for a in rp.ops:
            if not a.hidden_waits:
                assert got.pop(0) == a
                continue
            first, second = got.pop(0), got.pop(0)
            work = a.duration_s - sum(t for _, t in a.hidden_waits)
            assert (first.name, first.host_gap_s, first.waits) == (a.name, a.host_gap_s, a.waits)
            assert not first.hidden_waits
            assert first.duration_s + second.duration_s == pytest.approx(work, rel=1e-12)
            assert set(second.waits) == {k for k, _ in a.hidden_waits} and second.host_gap_s == 0.0
            moved = sorted(first.launches + tuple((k, t + first.duration_s) for k, t in second.launches))
            assert [k for k, _ in moved] == [k for k, _ in sorted(a.launches)]
            assert [t for _, t in moved] == pytest.approx([t for _, t in sorted(a.launches)], rel=1e-12)
        assert not got
    # the first unit's all-gather by hand: 3 ring steps of (2α + 4,976 B / (4 · B/2)) on the shared host; a
    # reduce-scatter ran as gloo's allreduce (its backend span says so): twice the ring steps
    k0 = 3 * (2 * host.message_overhead_s + 4976 / (4 * host.bandwidth_bytes_per_s / 2))
    assert ring_time_s(big.collectives[0], shared) == pytest.approx(k0, rel=1e-12)
    rs = next(c for c in big.collectives if c.op == "reduce-scatter")
    assert rs.backend_op == "allreduce" and rs.ran_as == "allreduce"
    assert ring_time_s(rs, shared) == pytest.approx(
        6 * (2 * host.message_overhead_s + rs.size_bytes / (4 * host.bandwidth_bytes_per_s / 2)), rel=1e-12)
    assert on_shared_host(job, 2, host, 2) == (job, host, 1.0)  # the recorded size: an own-host replay


def test_they_survive_json_and_chakra(tmp_path: Path) -> None:
    job = _job("gpt-fsdp-w2")
    assert job_from_dict(json.loads(json.dumps(job_to_dict(job)))).ranks == job.ranks
    back = import_chakra(export_chakra(job, tmp_path / "fsdp"))
    assert [o.hidden_waits for o in back.ranks[1].ops] == [o.hidden_waits for o in job.ranks[1].ops]


def test_the_op_the_backend_ran_is_read_and_kept(tmp_path: Path) -> None:
    """gloo runs FSDP2's reduce-scatters as allreduces (their backend spans are ``gloo:all_reduce``): the import
    records it, the fit and the host's replay time them as such, and it survives the workload JSON and
    Chakra; the all-gathers ran as themselves."""
    job = _job("gpt-fsdp-w2")
    ran = {(c.op, c.backend_op) for c in job.collectives}
    assert ran == {("allgather", ""), ("reduce-scatter", "allreduce")}
    assert job_from_dict(json.loads(json.dumps(job_to_dict(job)))).collectives == job.collectives
    back = import_chakra(export_chakra(job, tmp_path / "fsdp"))
    assert [c.backend_op for c in back.collectives] == [c.backend_op for c in job.collectives]
    assert not any(c.backend_op for c in _job("gpt-w2").collectives)  # DDP's allreduces ran as allreduces


@pytest.mark.parametrize(("span", "op"), [
    ("gloo:all_reduce", "allreduce"), ("gloo:all_gather", "allgather"), ("gloo:broadcast", "broadcast"),
    ("nccl:_reduce_scatter_base", "reduce-scatter"), ("nccl:all_gather_into_tensor_coalesced", "allgather"),
    ("nccl:all_to_all", "all-to-all"), ("gloo:send", ""), ("gloo:barrier", ""), ("no colon", "")])
def test_backend_span_names(span: str, op: str) -> None:
    assert backend_span_op(span) == op


def test_bad_backend_op_is_named() -> None:
    d = job_to_dict(_job("gpt-fsdp-w2"))
    d["collectives"][0]["backend_op"] = "gather"
    with pytest.raises(ConfigError, match=r"collectives\[0\]\.backend_op: must be one of allreduce"):
        job_from_dict(d)


def test_bad_hidden_waits_are_named() -> None:
    d = job_to_dict(_job("gpt-fsdp-w2"))
    op = next(o for o in d["ranks"][0]["ops"] if o.get("hidden_waits"))
    op["hidden_waits"] = [[99, 0.001]]
    with pytest.raises(ConfigError, match=r"hidden_waits: names collective 99, and the job has 8"):
        job_from_dict(d)
    op["hidden_waits"] = [[0, -1.0]]
    with pytest.raises(ConfigError, match=r"hidden_waits: has -1.0 seconds"):
        job_from_dict(d)
