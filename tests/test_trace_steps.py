"""A trace with several profiled steps (tests/data/traces/mlp-w2-steps5: benchmarks/trace_record.py --models mlp
--worlds 2 --steps 5 --trim --gzip): which step the import takes (last, median, N), that only that step's
operators, collectives and ET nodes are used, and a step missing on one rank as one error line."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.traces.cluster import fit_host_cluster
from topotrain.traces.importer import (
    SYMMETRIC_OPS,
    choose_step,
    import_job,
    import_job_at,
    job_step_times,
    profiled_steps,
)
from topotrain.traces.model import job_to_dict
from topotrain.traces.readers import Event, KinetoSteps, parse_step
from topotrain.training.replay import replay
from topotrain.util.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data" / "traces"
STEPS = "mlp-w2-steps5"
#: Each rank's ProfilerStep#N span in µs, read by hand from the fixture's Kineto files (ts, dur):
#: rank 0: #1 10619.9, #2 13780.9, #3 12271.9, #4 15900.3, #5 11878.8
#: rank 1: #1 10494.5, #2 13644.6, #3 16257.7, #4 11862.6, #5 16503.7
#: The job step time is the slowest rank's: #1 10619.9, #2 13780.9, #3 16257.7, #4 15900.3, #5 16503.7 µs;
#: sorted 10619.9 (#1) < 13780.9 (#2) < 15900.3 (#4) < 16257.7 (#3) < 16503.7 (#5): the median is #4, the last #5.
JOB_STEP_US = {1: 10619.9, 2: 13780.9, 3: 16257.7, 4: 15900.3, 5: 16503.7}
#: The ranks' (start, end) in µs at steps 2, 4 and 5: the job's measured step runs from the earliest start to
#: the latest end (#2: 5824059540121.0 → 5824059556081.7; #4: ...568466.0 → ...584366.3; #5: ...582088.4 →
#: ...598592.1).
MEASURED_US = {2: 15960.7, 4: 15900.3, 5: 16503.7}
#: The MLP's parameters (Linear 64→256, 256→256, 256→10): DDP all-reduces each gradient once per step.
MLP_PARAMS = (64 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)


def _files(name: str = STEPS) -> list[Path]:
    return sorted((DATA / name).glob("rank*.json.gz"))


@cache
def _job(step: str | int) -> Any:
    return import_job(_files(), step=step)


def _edited(tmp_path: Path, edit: dict[int, set[int]]) -> list[Path]:
    """The fixture's files with the ``ProfilerStep#N`` spans ``edit[rank]`` removed from rank's Kineto file."""
    out = []
    for f in _files():
        rank = int(f.name[4])
        if "kineto" in f.name and rank in edit:
            doc = json.loads(gzip.decompress(f.read_bytes()))
            doc["traceEvents"] = [e for e in doc["traceEvents"] if not (
                str(e.get("name", "")).startswith("ProfilerStep#") and int(e["name"][13:]) in edit[rank])]
            p = tmp_path / f.name.removesuffix(".gz")
            p.write_text(json.dumps(doc))
            out.append(p)
        else:
            out.append(f)
    return out


def _content(job: Any) -> dict[str, Any]:
    """The job's JSON less where it came from (its name and each rank's source file)."""
    d = job_to_dict(job)
    d.pop("name", None)
    for r in d["ranks"]:
        r.pop("source", None)
    return d


def test_job_step_times_are_the_slowest_ranks() -> None:
    times = profiled_steps(_files())
    assert sorted(times) == [1, 2, 3, 4, 5]
    assert {n: round(t * 1e6, 1) for n, t in times.items()} == JOB_STEP_US


@pytest.mark.parametrize(("step", "number"), [("last", 5), ("median", 4), (2, 2), (1, 1)])
def test_the_step_chosen_is_imported(step: str | int, number: int) -> None:
    """last → #5, median → #4 (hand-checked above), N → #N; the job is that step: its measured span, and each
    rank's span at that number."""
    job = _job(step)
    if number in MEASURED_US:
        assert job.measured_step_s * 1e6 == pytest.approx(MEASURED_US[number], abs=0.05)
    assert max(r.step_s for r in job.ranks) * 1e6 == pytest.approx(JOB_STEP_US[number], abs=0.05)


def test_default_is_the_last_step() -> None:
    job, chosen = import_job_at(_files())
    assert (chosen.number, chosen.rule, sorted(chosen.times_s)) == (5, "last", [1, 2, 3, 4, 5])
    assert job_to_dict(job) == job_to_dict(_job("last")) == job_to_dict(_job(5))
    assert job_to_dict(_job("median")) == job_to_dict(_job(4)) != job_to_dict(_job(5))


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
def test_each_step_joins_its_own_et_nodes(step: int) -> None:
    """Every step of the one ET file per rank joins: the collectives' bytes come from the ET (the two DDP
    buckets carry every gradient once), each rank launches and waits for each collective once (the ET's data
    dependencies: DDP's copy of the reduced bucket into the gradients, inside the step), and the replay on the
    host fitted from that step is within 5% of its measured step."""
    job = _job(step)
    assert "timestamps" not in job.name
    assert sum(c.size_bytes for c in job.collectives) == 4 * MLP_PARAMS
    n = len(job.collectives)
    for r in job.ranks:
        assert sorted(c for o in r.ops for c, _ in o.launches) == list(range(n))
        assert sorted(c for o in r.ops for c in o.waits) == [c for c in range(n)
                                                             if job.collectives[c].op in SYMMETRIC_OPS]
        assert [c for o in r.ops if o.name != "(step end)" for c in o.waits]  # read by an operator of the step
    r = replay(job, fit_host_cluster(job))
    assert abs(r.error) < 0.05, (step, r.step_s, r.measured_step_s)


#: Each rank's span (µs) per step, as above.
RANK_STEP_US = ({1: 10619.9, 2: 13780.9, 3: 12271.9, 4: 15900.3, 5: 11878.8},
                {1: 10494.5, 2: 13644.6, 3: 16257.7, 4: 11862.6, 5: 16503.7})


def test_only_the_chosen_steps_events_are_read() -> None:
    """Each import holds one step's events: every rank's span is its span at that number, its operators and
    host gaps fit in it (the five steps' would not), and the same kinds of operator and the same collectives
    (op, bytes) make up every step."""
    jobs = [_job(n) for n in range(1, 6)]
    for n, job in enumerate(jobs, 1):
        for r in job.ranks:
            assert r.step_s * 1e6 == pytest.approx(RANK_STEP_US[r.rank][n], abs=0.05)
            assert r.op_s + r.host_gap_s <= r.step_s + 1e-5
    names = [{o.name for r in j.ranks for o in r.ops} for j in jobs]
    assert all(x == names[0] for x in names)
    assert all([(c.op, c.size_bytes) for c in j.collectives] == [(c.op, c.size_bytes) for c in jobs[0].collectives]
               for j in jobs)


def test_even_count_takes_the_lower_median(tmp_path: Path) -> None:
    """Without #5 on both ranks the steps are #1 10.6, #2 13.8, #4 15.9, #3 16.3 ms: the lower median is #2."""
    files = _edited(tmp_path, {0: {5}, 1: {5}})
    job = import_job(files, step="median")
    assert max(r.step_s for r in job.ranks) * 1e6 == pytest.approx(JOB_STEP_US[2], abs=0.05)
    assert _content(job) == _content(import_job(files, step=2)) == _content(_job(2))


def _steps(times_us: dict[int, float], rank: int = 0) -> KinetoSteps:
    steps = {n: Event(f"ProfilerStep#{n}", 1e5 * n, t, 1) for n, t in times_us.items()}
    return KinetoSteps(f"r{rank}.json", rank, 2, "gloo", {"0": (0, 1)}, tuple(steps.values()), steps, {})


def test_choose_step_rules() -> None:
    """The slowest rank's span decides; ties go to the lower step number; even counts to the lower median."""
    ranks = {0: _steps({1: 5.0, 2: 9.0, 3: 7.0}), 1: _steps({1: 8.0, 2: 1.0, 3: 7.5}, 1)}
    assert job_step_times(ranks) == pytest.approx({1: 8e-6, 2: 9e-6, 3: 7.5e-6})
    assert choose_step(ranks, "median") == 1 and choose_step(ranks, "last") == 3 and choose_step(ranks, 2) == 2
    assert choose_step({0: _steps({4: 3.0, 5: 3.0, 6: 3.0, 7: 3.0})}, "median") == 5  # ties by number
    assert choose_step({0: _steps({1: 1.0, 2: 4.0, 3: 2.0, 4: 3.0})}, "median") == 3  # lower of 2 and 3 ms
    assert choose_step({0: _steps({7: 1.0})}, "median") == 7


def test_a_step_missing_on_a_rank_is_one_error(tmp_path: Path) -> None:
    """#3 missing on rank 1: median (which needs every step) and --step 3 name rank 1's file and the step;
    last and another step still import."""
    files = _edited(tmp_path, {1: {3}})
    for step in ("median", 3):
        with pytest.raises(ConfigError) as e:
            import_job(files, step=step)
        text = str(e.value)
        assert "\n" not in text and "rank1.kineto.json: ProfilerStep#3" in text and "missing on rank 1" in text
        assert "1, 2, 4, 5" in text
    assert _content(import_job(files)) == _content(_job(5))
    assert _content(import_job(files, step=4)) == _content(_job(4))
    with pytest.raises(ConfigError, match=r"rank0.kineto.json.gz: ProfilerStep#9.*missing on rank 0.*1-5"):
        import_job(_files(), step=9)
    files = _edited(tmp_path, {0: {5}})  # the last step only on rank 1
    with pytest.raises(ConfigError, match=r"rank0.kineto.json: ProfilerStep#5.*missing on rank 0.*1-4"):
        import_job(files)


@pytest.mark.parametrize("name", ["gpt-fsdp-w2", "gpt-shapes-w2", "gpt-w2", "gpt-w2-reordered", "gpt-w4",
                                  "resnet-fsdp-w2", "resnet-shapes-w2", "resnet-w2"])
def test_one_step_fixtures_import_alike_by_every_choice(name: str) -> None:
    """The one-step fixtures hold ProfilerStep#1 only: last (the default) and median give the same job (and
    the default import is byte for byte main's before the step choice: checked when it was built)."""
    files = _files(name)
    assert sorted(profiled_steps([f for f in files if "kineto" in f.name])) == [1]
    assert job_to_dict(import_job(files, step="median")) == job_to_dict(import_job(files))


def test_parse_step() -> None:
    assert (parse_step("last"), parse_step("Median"), parse_step("3"), parse_step(0)) == ("last", "median", 3, 0)
    for bad in ("first", "-1", "", "2.5", True, -2):
        with pytest.raises(ConfigError, match="--step"):
            parse_step(bad)  # type: ignore[arg-type]


def test_cli_step(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "job.workload.json"
    res = runner.invoke(app, ["trace", "import", *map(str, _files()), "-o", str(out), "--step", "median"])
    assert res.exit_code == 0, res.output
    assert "ProfilerStep#4 (the median by job step time; 5 profiled steps, job step times 10.6–16.5 ms)" in \
        " ".join(res.output.split())
    assert json.loads(out.read_text()) == json.loads(json.dumps(job_to_dict(_job(4))))
    res = runner.invoke(app, ["trace", "import", *map(str, _files()), "-o", str(out), "--step", "mean"])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--step" in res.output
    res = runner.invoke(app, ["trace", "import", *map(str, _files()), "-o", str(out), "--step", "8"])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "ProfilerStep#8" in res.output
    res = runner.invoke(app, ["trace", "replay", *map(str, _files()), "--step", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["measured_step_s"] * 1e6 == pytest.approx(MEASURED_US[2], abs=0.05)
    res = runner.invoke(app, ["trace", "replay", str(out), "--step", "2"])  # a workload holds one step already
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--step" in res.output
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"workload: {{trace: {DATA / STEPS}, step: median}}\n")
    res = runner.invoke(app, ["simulate", str(scenario), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["trace"]["measured_step_s"] * 1e6 == pytest.approx(MEASURED_US[4], abs=0.05)
    res = runner.invoke(app, ["simulate", str(scenario), "--set", "workload.step=first"])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "workload.step" in res.output


def _rank0_edited(tmp_path: Path, edit: Any) -> list[Path]:
    """The fixture's files with rank 0's Kineto events changed by ``edit`` (given the doc's complete events)."""
    out = []
    for f in _files():
        if f.name == "rank0.kineto.json.gz":
            doc = json.loads(gzip.decompress(f.read_bytes()))
            edit([e for e in doc["traceEvents"] if e.get("ph") == "X"], doc)
            f = tmp_path / f.name.removesuffix(".gz")
            f.write_text(json.dumps(doc))
        out.append(f)
    return out


def _step_end(events: list[dict[str, Any]], n: int) -> float:
    return next(e["ts"] + e["dur"] for e in events if e["name"] == f"ProfilerStep#{n}")


#: Rank 0's gloo span of step #3's second bucket (record-function id 729; its launch, id 728, is inside #3):
#: it starts at ts 5824059565392.2 µs and ends 2.48 ms before #3's end (5824059568410.2).
LATE_RF = 729


def test_a_backend_span_ending_after_its_step_belongs_to_that_step(tmp_path: Path) -> None:
    """Issue 36: a DDP bucket's gloo span may close ~100 µs after ``ProfilerStep#N`` (the main thread resumes
    from the bucket's future before gloo's record function closes). Rank 0's span of #3's second bucket moved
    to end 115 µs after #3 (and so after #4's start, 55.8 µs after #3's end): #3 imports with that collective,
    its measured span is the moved one, its network time is the spans' overlap, and every step time, op and
    gap stays inside the ProfilerStep spans; #4 does not take the span (it started before #4)."""
    spans: dict[int, tuple[float, float]] = {}

    def late(events: list[dict[str, Any]], _doc: Any) -> None:
        e = next(e for e in events if e["args"].get("Record function id") == LATE_RF)
        e["dur"] = _step_end(events, 3) + 115.0 - e["ts"]
        spans[0] = (e["ts"], e["ts"] + e["dur"])

    files = _rank0_edited(tmp_path, late)
    k1 = json.loads(gzip.decompress((DATA / STEPS / "rank1.kineto.json.gz").read_bytes()))
    peer = [e for e in k1["traceEvents"] if e.get("ph") == "X" and e["name"] == "gloo:all_reduce"
            and _step_end(k1["traceEvents"], 2) < e["ts"] < _step_end(k1["traceEvents"], 3)]
    assert len(peer) == 2
    spans[1] = (peer[1]["ts"], peer[1]["ts"] + peer[1]["dur"])
    job, before = import_job(files, step=3), _job(3)
    assert [(c.op, c.size_bytes) for c in job.collectives] == [(c.op, c.size_bytes) for c in before.collectives]
    c = job.collectives[1]
    assert c.measured_s[0] * 1e6 == pytest.approx(spans[0][1] - spans[0][0], abs=1e-3)
    assert c.measured_s[0] > before.collectives[1].measured_s[0] + 2e-3
    assert c.measured_net_s * 1e6 == pytest.approx(min(spans[0][1], spans[1][1]) - max(spans[0][0], spans[1][0]),
                                                   abs=1e-3)
    assert job.measured_step_s == before.measured_step_s
    for r, r0 in zip(job.ranks, before.ranks, strict=True):
        assert (r.step_s, r.start_s) == (r0.step_s, r0.start_s)
        assert r.op_s + r.host_gap_s <= r.step_s + 1e-9
        assert sorted(x for o in r.ops for x, _ in o.launches) == [0, 1]
        assert sorted(x for o in r.ops for x in o.waits) == [0, 1]
    assert job.ranks[1] == before.ranks[1]
    assert _content(import_job(files, step=4)) == _content(_job(4))


def test_a_launch_or_span_missing_in_a_step_is_still_one_error(tmp_path: Path) -> None:
    """A real mismatch stays an error naming the file: #3's second gloo span removed (its launch has no span),
    or #3's second launch removed (its span has no launch)."""
    for name, counts in (("gloo:all_reduce", "launched 2 collectives and its backend ran 1"),
                         ("c10d::allreduce_", "launched 1 collectives and its backend ran 2")):
        def drop(events: list[dict[str, Any]], doc: Any, name: str = name) -> None:
            rf = LATE_RF if name.startswith("gloo") else LATE_RF - 1
            doc["traceEvents"].remove(next(e for e in events if e["name"] == name
                                           and e["args"].get("Record function id") == rf))

        files = _rank0_edited(tmp_path, drop)
        with pytest.raises(ConfigError) as e:
            import_job(files, step=3)
        text = str(e.value)
        assert "\n" not in text and "rank0.kineto.json: " in text and f"rank 0 {counts}" in text, text
        assert _content(import_job(files, step=4)) == _content(_job(4))
