"""What-if on a recorded step: FSDP2 (tests/data/traces/resnet-fsdp-w2: a small ResNet under FSDP2/gloo on 2 CPU
processes, benchmarks/trace_record.py --trim --gzip): each unit's parameter shapes read from the trace, the
collectives re-padded for another group size as FSDP2 pads them (checked against torch's own chunking and
against the 4-process recording of the same job), processor sharing with the host's other users, and
``explain`` / ``search`` given a trace workload."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest
import torch
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.traces.importer import import_job
from topotrain.traces.model import TraceCollective, TraceJob, job_from_dict, job_to_dict, save_job
from topotrain.traces.whatif import (
    core_share_scale,
    fsdp_padded_numel,
    fsdp_resized_bytes,
    group_share_scale,
    group_share_slowdown,
    resize,
)
from topotrain.util.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data" / "traces"


@cache
def _job(et: bool = True) -> TraceJob:
    files = sorted((DATA / "resnet-fsdp-w2").glob("rank*.json.gz"))
    return import_job([f for f in files if et or "kineto" in f.name])


def _torch_padded(shape: tuple[int, ...], world: int) -> int:
    """FSDP2's all-gather output for one parameter, from torch itself: every rank's shard padded to the
    first chunk of ``torch.chunk`` on dim 0 (FSDPParam._init_sharded_param)."""
    chunks = torch.chunk(torch.empty(shape), world, dim=0)
    return chunks[0].numel() * world


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8, 16])
def test_padding_is_fsdp2s_chunking(world: int) -> None:
    shapes = ((16, 3, 3, 3), (16,), (10, 64), (10,), (1, 7), (3,), (512, 128))
    assert fsdp_padded_numel(shapes, world) == sum(_torch_padded(s, world) for s in shapes)


def test_every_fsdp_collective_knows_its_units_shapes() -> None:
    """The root unit (stem conv, stem norm, fc) and the three stages: each all-gather and reduce-scatter has
    its unit's unsharded shapes, and they give the recorded bytes at 2 ranks."""
    for job in (_job(), _job(et=False)):  # the ET's shapes, or Kineto's Input Dims without an ET
        assert len(job.collectives) == 11
        for c in job.collectives:
            assert c.param_shapes, c
            assert fsdp_padded_numel(c.param_shapes, 2) * 4 == c.size_bytes
        root = job.collectives[0]
        assert root.param_shapes == ((16, 3, 3, 3), (16,), (16,), (10, 64), (10,))
        assert job.collectives == _job().collectives


def test_resize_gives_the_bytes_the_4_process_recording_has() -> None:
    """resnet-fsdp at 2 ranks resized to 4 has exactly the (op, bytes) sequence the 4-process recording of
    the same job launched: the root unit 4,456 → 4,976 B (fc's 10 rows padded to 12), the others unchanged."""
    recorded = json.loads((DATA / "resnet-fsdp-w4.collectives.json").read_text())["collectives"]
    r = resize(_job(), 4)
    assert [[c.op, c.size_bytes] for c in r.collectives] == recorded
    assert (_job().collectives[0].size_bytes, r.collectives[0].size_bytes) == (4456, 4976)
    assert [c.size_bytes for c in resize(r, 2).collectives] == [c.size_bytes for c in _job().collectives]
    stem = ((16, 3, 3, 3), (16,), (16,), (10, 64), (10,))
    assert resize(_job(), 3).collectives[0].size_bytes == 4 * sum(_torch_padded(s, 3) for s in stem)


def test_other_collectives_keep_their_bytes() -> None:
    c = TraceCollective("allreduce", 4096, "0", (0, 1), (), 0.0)
    assert fsdp_resized_bytes(c, 7) == 4096


def test_shapes_survive_the_workload_json_and_bad_ones_are_named() -> None:
    d = job_to_dict(_job())
    assert job_from_dict(json.loads(json.dumps(d))).collectives == _job().collectives
    d["collectives"][0]["param_shapes"] = [[16, "x"]]
    with pytest.raises(ConfigError, match=r"collectives\[0\]\.param_shapes"):
        job_from_dict(d)


def test_a_chunk_cat_that_does_not_match_the_bytes_is_not_used(tmp_path: Path) -> None:
    """Shapes that do not give the recorded bytes (a copy-in the import mismatched) are dropped, not used."""
    src = DATA / "resnet-fsdp-w2"
    for f in sorted(src.glob("rank*.kineto.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            if e["name"] == "fsdp::chunk_cat":
                e["args"]["Input Dims"][0] = [[1, 1]] * len(e["args"]["Input Dims"][0])
        (tmp_path / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    job = import_job(sorted(tmp_path.glob("*.json.gz")))
    assert not any(c.param_shapes for c in job.collectives)
    assert [c.size_bytes for c in resize(job, 4).collectives] == [c.size_bytes for c in job.collectives]


# ---- explain and search with a trace workload ----

def test_explain_takes_trace_workloads(tmp_path: Path) -> None:
    """`explain` compares two recorded steps as `simulate` replays them: here the job on its host at 2
    ranks and its what-if at 4 ranks (operators at measured times)."""
    wl = save_job(_job(), tmp_path / "fsdp.workload.json")
    (tmp_path / "w4.yaml").write_text(f"workload:\n  trace: {wl.name}\n  world: 4\n  compute: measured\n")
    runner = CliRunner()
    one = runner.invoke(app, ["simulate", str(wl), "--json"])
    res = runner.invoke(app, ["explain", str(wl), "--vs", str(tmp_path / "w4.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["best"]["iteration_time_s"] == json.loads(one.output)["iteration_time_s"]
    assert out["vs"]["plan"]["dp"] == 4 and out["best"]["plan"]["dp"] == 2
    assert out["total_difference_s"] == out["vs"]["iteration_time_s"] - out["best"]["iteration_time_s"]
    table = runner.invoke(app, ["explain", str(wl), "--vs", str(tmp_path / "w4.yaml")])
    assert table.exit_code == 0 and "as recorded (trace)" in table.output


def test_search_over_a_trace_is_refused_in_one_line(tmp_path: Path) -> None:
    wl = save_job(_job(), tmp_path / "fsdp.workload.json")
    space = tmp_path / "space.yaml"
    space.write_text(f"workload:\n  trace: {wl.name}\n  world: [2, 4]\n")
    res = CliRunner().invoke(app, ["search", str(space), "-o", str(tmp_path / "out")])
    assert res.exit_code != 0
    assert "names a recorded step" in res.output and "Traceback" not in res.output
    assert "topotrain simulate" in res.output
    assert not (tmp_path / "out").exists()


# ---- processor sharing with other users on the host ----

def test_core_sharing_counts_the_other_users_threads() -> None:
    """2 → 4 single-threaded processes on 2 cores: 2× on an idle host; with 10 other runnable threads
    (12 → 14 threads on 2 cores) 14/12; the old rule when nothing else runs; never faster than the cores."""
    assert core_share_scale(2, 4, 2) == 2.0
    assert core_share_scale(2, 4, 2, 1, 0.0, 0.0) == 2.0
    assert core_share_scale(2, 4, 2, 1, 10.0, 10.0) == pytest.approx(14 / 12)
    assert core_share_scale(2, 4, 2, 1, 10.0, 0.0) == pytest.approx(2 / 6)  # the other users left
    assert core_share_scale(1, 2, 8, 1, 2.0, 2.0) == 1.0  # fewer threads than cores
    assert core_share_scale(2, 4, 0, 1, 10.0, 10.0) == 1.0


def test_cpu_shared_between_scheduling_groups_max_min_fair() -> None:
    """Autogroups: 2 cores shared fairly between groups, then between a group's threads. Alone, a job of 4
    threads runs each at 1/2 speed; beside two single-thread groups, 3 groups share 2 cores (2/3 each), so
    4 threads run at 1/6; a group that wants less than its share (1 thread beside a 4-thread job on 4
    cores) leaves the rest to the others (4 threads get 3 cores)."""
    assert group_share_slowdown(2, [], 2) == 1.0
    assert group_share_slowdown(4, [], 2) == 2.0
    assert group_share_slowdown(4, [1, 1], 2) == pytest.approx(6.0)
    assert group_share_slowdown(4, [1], 4) == pytest.approx(4 / 3)
    assert group_share_slowdown(1, [8, 8], 0) == 1.0
    # the what-if's ratio: from 2 to 4 threads with the same other groups, ×2 once the job is short of cores
    same = [[1, 1], [3], [1, 2, 5]]
    assert group_share_scale(2, 4, 2, same, same) == pytest.approx(2.0)
    assert group_share_scale(2, 4, 2, [[]], [[1, 1]]) == pytest.approx(6.0)  # the host got busier
    assert group_share_scale(2, 4, 2, [], []) == pytest.approx(2.0)


@pytest.fixture(scope="module")
def trace_record() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
        import trace_record

        yield trace_record


def test_job_error_interval_is_a_seeded_percentile_bootstrap_over_the_repeats(trace_record: ModuleType) -> None:
    """benchmarks/trace_record.py's job-level what-if error over repeats, median(pred) / median(meas) − 1,
    with a 90% percentile bootstrap interval (pairs resampled together): deterministic, the point estimate
    inside it, zero width for one repeat, and exact when every repeat has the same ratio."""
    from statistics import median

    pairs = [(0.110, 0.100), (0.150, 0.120), (0.090, 0.105), (0.200, 0.140), (0.120, 0.125), (0.100, 0.095)]
    err, lo, hi = trace_record.job_error_interval(pairs)
    assert (err, lo, hi) == trace_record.job_error_interval(pairs)  # seeded: bit for bit
    assert err == pytest.approx(median(p for p, _ in pairs) / median(m for _, m in pairs) - 1, abs=1e-15)
    assert lo <= err <= hi and lo < hi
    assert trace_record.job_error_interval([(0.13, 0.10)]) == pytest.approx((0.3, 0.3, 0.3), abs=1e-15)
    # every repeat predicted ×1.25 of its measurement (values exact in binary): the error is 0.25, no spread
    same = [(m * 1.25, m) for m in (0.5, 2.0, 8.0, 0.25, 4.0)]
    assert trace_record.job_error_interval(same) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError, match="no \\(predicted, measured\\) pairs"):
        trace_record.job_error_interval([])


def test_summary_prints_each_jobs_interval_and_the_count_within_10_percent(
        trace_record: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary's last line: each main-rule job's error with its interval, and how many are within 10%;
    the comparison rules (keys with "(") keep their lines without an interval."""
    whatifs = [{("gpt", 4): (0.105 * s, 0.100 * s), ("resnet", 4): (0.150, 0.100 * s),
                ("gpt (without the wait for a core)", 4): (0.08, 0.100)} for s in (1.0, 1.1, 0.9)]
    trace_record.summarize(whatifs)
    lines = capsys.readouterr().out.splitlines()
    assert sum("90% bootstrap interval" in line for line in lines) == 2
    assert "bootstrap" not in next(line for line in lines if "without the wait" in line)
    assert lines[-1] == ("what-if per job (median over repeats): gpt w2 → w4 +5.0% [+5.0%, +5.0%], "
                         "resnet w2 → w4 +50.0% [+36.4%, +66.7%]; 1 of 2 jobs within 10% "
                         "(1 of 2 with the whole 90% interval within ±10%)")
