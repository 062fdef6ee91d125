"""Job placement on a shared cluster: policies, contention on the flow model, accounting, command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.placement.jobs import Job, jobs_from_rows
from topotrain.placement.policies import FreeState, first_fit, shape_of, topology_aware
from topotrain.placement.scheduler import compare, run_policy
from topotrain.placement.timing import Timer
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.util.errors import ConfigError

CLUSTER = {"server": "eflops", "servers": 4, "network": {"topology": "leaf-spine", "leaves": 2,
                                                        "oversubscription": 8, "link": "eth-100g"}}


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    return cluster_from_dict(CLUSTER)


def test_topology_aware_keeps_a_job_under_one_leaf_where_first_fit_straddles(cluster) -> None:  # type: ignore[no-untyped-def]
    shape = shape_of(cluster.topology)
    assert len(set(shape.group_of.values())) == 2  # two leaves, two servers each
    # servers 0 and 2 half taken: 8 GPUs free under each leaf, but first-fit takes the first free ones
    taken = {g for s in ("s0", "s1") for g in shape.servers[s][:4]}
    st = FreeState(shape)
    st.take(sorted(taken))
    ff = first_fit(st, 8)
    ta = topology_aware(st, 8)
    assert ff is not None and ta is not None
    leaves = {name: {shape.group_of[shape.server_of[g]] for g in gpus} for name, gpus in (("ff", ff), ("ta", ta))}
    assert len(leaves["ta"]) == 1
    assert len(leaves["ff"]) >= len(leaves["ta"])


def test_a_lone_job_takes_iterations_times_compute_plus_allreduce(cluster) -> None:  # type: ignore[no-untyped-def]
    job = Job("a", 1.5, "resnet50", 16, 10, 32)
    r = run_policy(cluster, [job], "packed")
    t = Timer(cluster)
    comp, grad = t.compute(job.model, job.batch)
    comm = t.comm([(r.jobs[0].gpus, grad)])[0]
    assert comm > 0 and comp > 0
    assert r.jobs[0].start_s == 1.5 and r.jobs[0].queue_s == 0
    assert r.jobs[0].finish_s == pytest.approx(1.5 + 10 * (comp + comm), rel=1e-9)
    assert r.gpu_utilization == pytest.approx(16 / 32)


def test_jobs_whose_rings_share_uplinks_slow_each_other(cluster) -> None:  # type: ignore[no-untyped-def]
    t = Timer(cluster)
    shape = shape_of(cluster.topology)
    # two 16-GPU jobs, each spread over both leaves: their rings share the oversubscribed uplinks
    a = shape.servers["s0"] + shape.servers["s2"]
    b = shape.servers["s1"] + shape.servers["s3"]
    grad = t.compute("resnet50", 32)[1]
    alone = t.comm([(tuple(a), grad)])[0]
    together = t.comm([(tuple(a), grad), (tuple(b), grad)])
    assert together[0] > 1.2 * alone
    # and a queue where that happens: topology-aware is not worse on mean JCT than first-fit
    jobs = [Job(f"j{i}", 0.01 * i, "resnet50", n, 20) for i, n in enumerate([4, 8, 12, 8, 4])]
    ff, ta = compare(cluster, jobs, ["first-fit", "topology-aware"])
    assert ta.mean_jct_s <= ff.mean_jct_s * (1 + 1e-9)
    assert all(j.finish_s > j.start_s >= j.job.arrival_s for r in (ff, ta) for j in r.jobs)


def test_bad_traces_name_the_row() -> None:
    with pytest.raises(ConfigError) as e:
        jobs_from_rows([{"gpus": 4, "iterations": 10}, {"gpus": 4}])
    assert e.value.field == "jobs[1].iterations"
    with pytest.raises(ConfigError) as e:
        jobs_from_rows([{"gpus": 4, "iterations": 10, "priority": 1}])
    assert e.value.field == "jobs[0].priority"


def test_cli_place(tmp_path: Path) -> None:
    cl = tmp_path / "cluster.yaml"
    cl.write_text(yaml.safe_dump({"cluster": CLUSTER}))
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("arrival,model,gpus,iterations\n0,resnet50,8,5\n0.1,resnet50,16,5\n0.2,resnet50,40,5\n")
    r = CliRunner().invoke(app, ["place", str(cl), str(jobs), "--policy", "first-fit", "--json"])
    assert r.exit_code == 2 and "jobs[2].gpus" in r.output
    jobs.write_text("arrival,model,gpus,iterations\n0,resnet50,8,5\n0.1,resnet50,16,5\n")
    r = CliRunner().invoke(app, ["place", str(cl), str(jobs), "--policy", "first-fit", "--policy", "search",
                                 "--json", "--png", str(tmp_path / "jct.png")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [d["policy"] for d in doc] == ["first-fit", "search"] and len(doc[0]["jobs"]) == 2
    assert (tmp_path / "jct.png").read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(app, ["place", str(cl), str(jobs), "--policy", "random"])
    assert r.exit_code == 2 and "error: --policy" in r.output
