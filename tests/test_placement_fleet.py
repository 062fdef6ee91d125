"""``place`` on mixed fleets and production traces: the policies on tiny fleets checked by hand, the openb
trace reader on the shipped sample, the timing's decomposition and memo, determinism and scale."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.placement.fleet import fleet_from_dict
from topotrain.placement.jobs import Job, jobs_from_rows
from topotrain.placement.policies import shape_of
from topotrain.placement.scheduler import compare, run_policy
from topotrain.placement.timing import Timer, max_min_rates
from topotrain.placement.trace import OPENB_SAMPLE, read_openb, resample, trace_jobs, window
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.util.errors import ConfigError

NET = {"topology": "single-switch", "link": "eth-100g"}
TWO_TYPES = {"name": "two", "groups": [
    {"name": "v100", "types": ["V100M32"], "cluster": {"server": "eflops", "servers": 1, "network": NET}},
    {"name": "a100", "types": ["A100"], "cluster": {"server": "nvswitch-8", "servers": 1, "network": NET}}]}
LEAF_SPINE = {"server": "eflops", "servers": 4, "network": {"topology": "leaf-spine", "leaves": 2,
                                                            "oversubscription": 8, "link": "eth-100g"}}
runner = CliRunner()


@pytest.fixture(scope="module")
def fleet():  # type: ignore[no-untyped-def]
    return fleet_from_dict(TWO_TYPES)


def test_first_fit_takes_the_first_group_and_its_first_free_gpus(fleet) -> None:  # type: ignore[no-untyped-def]
    jobs = [Job("a", 0.0, "resnet50", 3, 10), Job("b", 0.0, "resnet50", 2, 10)]
    r = run_policy(fleet, jobs, "first-fit")
    v100 = shape_of(fleet.groups[0].cluster.topology).gpus
    assert [j.group for j in r.jobs] == ["v100", "v100"]
    assert r.jobs[0].gpus == v100[:3] and r.jobs[1].gpus == v100[3:5]


def test_heterogeneity_aware_puts_a_job_on_the_faster_type_while_it_is_free(fleet) -> None:  # type: ignore[no-untyped-def]
    t_v, t_a = (Timer(g.cluster).compute("resnet50", 32)[0] for g in fleet.groups)
    assert t_a < t_v  # the A100's roofline is faster than the V100's
    jobs = [Job("a", 0.0, "resnet50", 8, 100), Job("b", 0.0, "resnet50", 4, 100),
            Job("c", 0.0, "resnet50", 1, 100, gpu_type=("V100M32",))]
    r = run_policy(fleet, jobs, "heterogeneity-aware")
    assert [j.group for j in r.jobs] == ["a100", "v100", "v100"]  # a takes every A100; b waits for none
    assert r.jobs[1].start_s == 0.0
    # one GPU, alone: its time is iterations × the A100's compute (no allreduce)
    (alone,) = run_policy(fleet, [Job("x", 0.0, "resnet50", 1, 100)], "heterogeneity-aware").jobs
    assert alone.group == "a100" and alone.finish_s == pytest.approx(100 * t_a, rel=1e-12)


def test_a_job_asking_for_a_type_waits_for_it_first_come_first_served(fleet) -> None:  # type: ignore[no-untyped-def]
    jobs = [Job("a", 0.0, "resnet50", 8, 50, gpu_type=("A100",)), Job("b", 1e-3, "resnet50", 8, 50, gpu_type=("A100",)),
            Job("c", 2e-3, "resnet50", 1, 50)]
    r = run_policy(fleet, jobs, "first-fit")
    assert [j.group for j in r.jobs] == ["a100", "a100", "v100"]
    assert r.jobs[1].start_s == r.jobs[0].finish_s  # b waits for a's GPUs ...
    assert r.jobs[2].start_s == r.jobs[1].start_s  # ... and c waits behind b (the queue's head)
    with pytest.raises(ConfigError) as e:
        run_policy(fleet, [Job("d", 0.0, "resnet50", 1, 5, gpu_type=("H100",))], "first-fit")
    assert e.value.field == "jobs[0].gpu_type"


def test_search_weighs_the_slower_type(fleet) -> None:  # type: ignore[no-untyped-def]
    (r,) = compare(fleet, [Job("x", 0.0, "resnet50", 2, 10)], ["search"])
    assert r.jobs[0].group == "a100"


def test_components_time_as_everything_together_and_shapes_as_their_placements() -> None:
    cluster = cluster_from_dict(LEAF_SPINE)
    shape = shape_of(cluster.topology)
    t, fresh = Timer(cluster), Timer(cluster)
    grad = t.compute("resnet50", 32)[1]
    a = (shape.servers["s0"][:4], grad)  # inside s0 and inside s1: no common link
    b = (shape.servers["s1"][:4], grad)
    assert not t.links(*a) & t.links(*b)
    together = t.comm([a, b])
    assert together == pytest.approx([t.alone(a), t.alone(b)], rel=1e-12)
    # s1's placement has the shape of s0's: one timing serves both, and it is the one a fresh timer makes
    assert t.shape_key([a]) == t.shape_key([b])
    assert fresh.alone(b) == t.alone(b)


def test_steady_contention_is_exact_alone_and_pessimistic_when_rings_share_uplinks() -> None:
    cluster = cluster_from_dict(LEAF_SPINE)
    shape = shape_of(cluster.topology)
    flow, steady = Timer(cluster), Timer(cluster, contention="steady")
    grad = flow.compute("resnet50", 32)[1]
    a = (shape.servers["s0"] + shape.servers["s2"], grad)
    b = (shape.servers["s1"] + shape.servers["s3"], grad)
    assert steady.alone(a) == flow.alone(a)
    f, s = flow.comm([a, b]), steady.comm([a, b])
    assert all(y >= x * (1 - 1e-9) for x, y in zip(f, s, strict=True))
    assert s[0] > 1.2 * steady.alone(a)


def test_max_min_rates_by_hand() -> None:
    # links of 10 and 4 bytes/s; flow 0 on link 0, flow 1 on both, flow 2 on link 1: link 1 fills first at 2
    # each, then flow 0 takes the rest of link 0 (8)
    rates = max_min_rates(np.array([0, 1, 3, 4]), np.array([0, 0, 1, 1]), np.array([10.0, 4.0]))
    assert rates.tolist() == pytest.approx([8.0, 2.0, 2.0])


def test_the_shipped_trace_reads_and_maps(fleet) -> None:  # type: ignore[no-untyped-def]
    read = read_openb(OPENB_SAMPLE)
    assert (read.rows, read.no_gpu, read.no_run_time, len(read.tasks)) == (8152, 1088, 861, 6203)
    week = window(read.tasks, 142, 7)
    assert all(142 * 86400 <= t.created_s < 149 * 86400 for t in week)
    jobs, relaxed = trace_jobs(week[:200], fleet)
    assert jobs[0].arrival_s == 0.0 and all(j.iterations >= 1 for j in jobs)
    assert {j.model for j in jobs if j.gpus == 1} == {"resnet50"}
    # a task keeps its recorded run time on its reference type: iterations x the iteration time alone
    t = week[0]
    timer = Timer(fleet.groups[fleet.allowed(jobs[0].gpu_type)[0]].cluster)
    if t.gpus == 1:
        assert jobs[0].iterations == max(1, round(t.run_s / timer.compute("resnet50", 32)[0]))


def test_resampling_is_seeded() -> None:
    read = read_openb(OPENB_SAMPLE)
    a, b, c = resample(read.tasks, 500, 7, 3), resample(read.tasks, 500, 7, 3), resample(read.tasks, 500, 7, 4)
    assert a == b and a != c
    assert max(t.created_s for t in a) < 7 * 86400


HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
          "scheduled_time\n")


@pytest.mark.parametrize(("row", "field"), [
    ("p,1,1,two,1000,,LS,Running,0,10,0", "[0].num_gpu"),
    ("p,1,1,1,1000,,LS,Running,0,10,20", "[0].deletion_time"),
    ("p,1,1,1,1000,,LS,Running,5,10,0", "[0].scheduled_time"),
    ("p,1,1,1,1500,,LS,Running,0,10,0", "[0].gpu_milli"),
    ("p,1,1,1,1000,V100 M32,LS,Running,0,10,0", "[0].gpu_spec"),
    ("p,1,1,1,1000,,LS,Running,nan,10,0", "[0].creation_time"),
])
def test_bad_trace_rows_are_one_error_naming_the_field(tmp_path: Path, row: str, field: str) -> None:
    f = tmp_path / "t.csv"
    f.write_text(HEADER + row + "\n")
    with pytest.raises(ConfigError) as e:
        read_openb(f)
    assert e.value.field == "t.csv" + field
    cl = tmp_path / "c.yaml"
    cl.write_text(yaml.safe_dump({"fleet": TWO_TYPES}))
    r = runner.invoke(app, ["place", str(cl), str(f), "--format", "openb"])
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: t.csv{field}")


def test_bad_fleets_name_the_field() -> None:
    bad = {"groups": [TWO_TYPES["groups"][0], TWO_TYPES["groups"][0]]}
    with pytest.raises(ConfigError) as e:
        fleet_from_dict(bad)
    assert e.value.field == "fleet.groups[1].name"
    with pytest.raises(ConfigError) as e:
        fleet_from_dict({"groups": [{**TWO_TYPES["groups"][0], "speed": 2}]})
    assert e.value.field == "fleet.groups[0].speed"
    with pytest.raises(ConfigError) as e:
        jobs_from_rows([{"gpus": 1, "iterations": 3, "gpu_type": "V100;rm"}])
    assert e.value.field == "jobs[0].gpu_type"


def test_cli_place_on_a_fleet_with_a_trace(tmp_path: Path) -> None:
    cl = tmp_path / "fleet.yaml"
    cl.write_text(yaml.safe_dump({"fleet": TWO_TYPES}))
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "p0,1,1,1,500,,LS,Running,0,600,0\np1,1,1,2,1000,A100,LS,Running,10,900,30\n"
                     "p2,1,1,0,0,,LS,Running,10,900,30\np3,1,1,1,1000,T4,LS,Pending,20,900,\n")
    out = tmp_path / "p.png"
    r = runner.invoke(app, ["place", str(cl), str(trace), "--format", "openb", "--json", "--png", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [d["policy"] for d in doc] == ["first-fit", "packed", "topology-aware", "heterogeneity-aware", "search"]
    assert [g["name"] for g in doc[0]["groups"]] == ["v100", "a100"] and len(doc[0]["jobs"]) == 2
    assert doc[0]["jobs"][1]["group"] == "a100" and out.read_bytes()[:4] == b"\x89PNG"
    r = runner.invoke(app, ["place", str(cl), str(trace), "--days", "3"])
    assert r.exit_code == 2 and "error: --days" in r.output


def test_deterministic_and_ten_thousand_jobs_in_seconds() -> None:
    cluster = cluster_from_dict({"server": "eflops", "servers": 16, "network": {
        "topology": "leaf-spine", "leaves": 4, "oversubscription": 4, "link": "eth-100g"}})
    rng = np.random.default_rng(5)
    gaps = rng.exponential(0.05, 10_000)
    sizes = rng.choice([1, 1, 1, 2, 4, 8], 10_000)  # up to a server: the shape of production traces
    jobs = [Job(f"j{i}", float(t), "resnet50", int(n), int(k), 32)
            for i, (t, n, k) in enumerate(zip(np.cumsum(gaps), sizes, rng.integers(5, 50, 10_000), strict=True))]
    t0 = time.perf_counter()
    r = run_policy(cluster, jobs, "topology-aware")
    wall = time.perf_counter() - t0
    assert wall < 60, f"10,000 jobs took {wall:.1f} s"
    assert len(r.jobs) == 10_000 and all(j.finish_s > j.start_s >= j.job.arrival_s for j in r.jobs)
    again = run_policy(cluster, jobs[:2000], "topology-aware")
    assert again == run_policy(cluster, jobs[:2000], "topology-aware")


def test_a_mixed_cluster_is_refused_as_one_group_pointing_to_a_fleet(tmp_path: Path) -> None:
    """A group's jobs are timed at one GPU type before placement: a cluster of several types (cluster.groups)
    as one group would time a job on the slower type too fast, so it is refused with the way to write it."""
    mixed = {"groups": [{"server": "dgx-a100", "servers": 1}, {"server": "dgx-h100", "servers": 1}],
             "network": {"topology": "single-switch", "link": "ib-hdr-200g"}}
    scenario = tmp_path / "mixed.yaml"
    scenario.write_text(yaml.safe_dump({"cluster": mixed}))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump([{"arrival": 0, "model": "resnet50", "gpus": 8, "iterations": 10}]))
    r = CliRunner().invoke(app, ["place", str(scenario), str(jobs)])
    assert r.exit_code == 2 and "cluster.groups: place times each fleet group at one GPU type" in r.output
    with pytest.raises(ConfigError) as e:
        fleet_from_dict({"groups": [{"name": "both", "cluster": mixed}]})
    assert e.value.field == "fleet.groups[0].cluster.groups"
