"""Mixed clusters (issue 37): the groups schema, timing at each GPU's speed, balanced plans against exhaustive
enumeration, and bad input as one line naming the field."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from topotrain import api
from topotrain.cli import app
from topotrain.scenario.cluster import load_cluster
from topotrain.scenario.load import scenario_from_dict
from topotrain.search.cost import price_catalog
from topotrain.search.evaluate import Task, evaluate
from topotrain.search.space import grid, grid_size, point_key
from topotrain.training.balance import balanced, partition_minmax, shares_minmax
from topotrain.training.memory import memory_per_stage
from topotrain.training.simulate import simulate
from topotrain.util.errors import ConfigError

runner = CliRunner()
MODEL = {"type": "transformer", "layers": 8, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 8192}


def _run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def _singles(*groups: tuple[str, int, str]) -> dict[str, Any]:
    """A cluster of single-GPU servers: (GPU, servers, NIC) per group, on one switch."""
    return {"groups": [{"server": "single-gpu", "servers": n, "gpu": g, "nic": nic} for g, n, nic in groups],
            "message_overhead": "0us", "network": {"topology": "single-switch", "link": "eth-400g",
                                                   "latency": "0us"}}


def _scenario(cluster: dict[str, Any], plan: dict[str, Any], batch: Any = None) -> Any:
    doc: dict[str, Any] = {"cluster": cluster, "model": MODEL, "plan": plan, "network": "flow"}
    if batch is not None:
        doc["batch"] = batch
    return scenario_from_dict(doc)


def test_one_group_gives_the_same_json_as_the_plain_cluster(tmp_path: Path) -> None:
    plain = ("cluster:\n  server: nvswitch-8\n  servers: 2\n  nic: ib-edr-100g\n"
             "  network: {topology: fat-tree, link: ib-hdr-200g}\n")
    grouped = ("cluster:\n  groups: [{server: nvswitch-8, servers: 2, nic: ib-edr-100g}]\n"
               "  network: {topology: fat-tree, link: ib-hdr-200g}\n")
    rest = ("model: {name: gpt3-125m, seq_len: 1024}\nbatch: {global: 32, micro: 2}\n"
            "plan: {tp: 2, pp: 2, zero_stage: 1}\nstragglers: {gpus: {s1/gpu3: 1.3}}\n")
    outs = []
    for sub, cluster in (("a", plain), ("b", grouped)):
        (tmp_path / sub).mkdir()
        p = tmp_path / sub / "job.yaml"
        p.write_text(cluster + rest)
        code, out = _run("simulate", str(p), "--json")
        assert code == 0, out
        outs.append(out)
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["gpu"] == "a100-80gb"


def test_mixed_cluster_verbs_and_per_group_nics(tmp_path: Path) -> None:
    p = tmp_path / "mixed.yaml"
    p.write_text("cluster:\n  groups:\n    - {server: single-gpu, servers: 2, gpu: v100, nic: eth-100g}\n"
                 "    - {server: single-gpu, servers: 2, gpu: a100, nic: eth-400g}\n"
                 "  message_overhead: 0us\n  network: {topology: single-switch, link: eth-400g, latency: 0us}\n"
                 "model: {type: transformer, layers: 8, hidden: 512, heads: 8, seq_len: 512, vocab: 8192}\n"
                 "batch: {global: 8, micro: 1}\nplan: {pp: 2}\n")
    code, out = _run("simulate", str(p), "--json")
    assert code == 0, out
    assert json.loads(out)["gpu"] == "v100+a100-80gb"
    code, out = _run("topo", "show", str(p), "--json")
    assert code == 0, out
    assert json.loads(out)["gpus_by_type"] == {"v100": 2, "a100-80gb": 2}
    code, out = _run("collective", str(p), "--algo", "ring", "--size", "64MiB", "--json")
    assert code == 0, out
    code, out = _run("report", str(p), "--out", str(tmp_path / "rep.html"))
    assert code == 0, out
    cluster = load_cluster(p)
    assert cluster.mixed and cluster.rank_gpus == ("v100", "v100", "a100-80gb", "a100-80gb")
    topo = cluster.topology
    caps = {lk.src: lk.bandwidth_bytes_per_s for lk in topo.links if lk.src.endswith("nic0")}
    assert caps["s0/nic0"] == pytest.approx(100e9 / 8) and caps["s3/nic0"] == pytest.approx(400e9 / 8)


def test_a_ring_across_groups_runs_at_the_slow_nic() -> None:
    def ring(*groups: tuple[str, int, str]) -> float:
        sc = _scenario(_singles(*groups), {})
        return float(api.time_collective(sc.cluster, "allreduce", "ring", 256 * 2**20).time_s)

    # 25 and 100 Gb/s NICs (a single-gpu server's PCIe 3 x16 would cap a faster one)
    mixed = ring(("v100", 2, "eth-25g"), ("a100", 2, "eth-100g"))
    slow = ring(("v100", 4, "eth-25g"))
    fast = ring(("a100", 4, "eth-100g"))
    assert mixed == pytest.approx(slow, rel=1e-9) and fast < mixed / 3


def test_each_stage_computes_at_its_own_gpu() -> None:
    plan = {"pp": 2, "order": "tp-dp-pp"}
    v100 = simulate(_scenario(_singles(("v100", 2, "eth-400g")), plan, {"global": 8, "micro": 1}))
    a100 = simulate(_scenario(_singles(("a100", 2, "eth-400g")), plan, {"global": 8, "micro": 1}))
    mixed = simulate(_scenario(_singles(("v100", 1, "eth-400g"), ("a100", 1, "eth-400g")), plan,
                               {"global": 8, "micro": 1}))
    # the pipeline runs at its slow stage: a V100 stage paces it, an all-A100 pipeline is faster
    assert a100.iteration_time_s < mixed.iteration_time_s <= v100.iteration_time_s * 1.001
    # data parallel: the synchronous gradient reduction waits for the V100 replica
    dp = {"order": "tp-pp-dp"}
    mixed_dp = simulate(_scenario(_singles(("v100", 1, "eth-400g"), ("a100", 1, "eth-400g")), dp, 16))
    v100_dp = simulate(_scenario(_singles(("v100", 2, "eth-400g")), dp, 16))
    assert mixed_dp.iteration_time_s == pytest.approx(v100_dp.iteration_time_s, rel=1e-6)


def test_stragglers_compose_with_gpu_types() -> None:
    cluster = _singles(("v100", 1, "eth-400g"), ("a100", 1, "eth-400g"))
    doc = {"cluster": cluster, "model": MODEL, "plan": {"order": "tp-pp-dp", "dp_shares": [4, 12]},
           "batch": {"global": 16, "micro": 1}}
    base = simulate(scenario_from_dict(doc)).iteration_time_s
    slowed = simulate(scenario_from_dict({**doc, "stragglers": {"gpus": {"s1/gpu0": 2.0}}})).iteration_time_s
    assert slowed > base * 1.3  # the A100 holds 3/4 of the batch: slowing it paces the step


def test_partition_dp_is_exact_against_enumeration() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        blocks, chunks, kinds = int(rng.integers(3, 9)), int(rng.integers(2, 4)), int(rng.integers(1, 3))
        if blocks < chunks:
            continue
        costs = [[rng.uniform(0.1, 2.0, blocks) for _ in range(chunks)] for _ in range(kinds)]
        weights = list(rng.uniform(1, 3, kinds))
        sizes, value = partition_minmax(costs, weights, chunks)
        brute = float("inf")
        for cuts in itertools.combinations(range(1, blocks), chunks - 1):
            bounds = (0, *cuts, blocks)
            worst = max(w * float(costs[k][c][bounds[c]:bounds[c + 1]].sum())
                        for c in range(chunks) for k, w in enumerate(weights))
            brute = min(brute, worst)
        assert value == pytest.approx(brute, rel=1e-12) and sum(sizes) == blocks and min(sizes) >= 1


def test_shares_are_exact_against_enumeration() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        n, total, fill = int(rng.integers(2, 4)), int(rng.integers(4, 13)), int(rng.integers(0, 3))
        stage = list(rng.uniform(0.5, 3.0, n))
        got = shares_minmax(stage, total, fill)
        best = min(max((m + fill) * s for m, s in zip(ms, stage, strict=True))
                   for ms in itertools.product(range(1, total + 1), repeat=n) if sum(ms) == total)
        assert sum(got) == total
        assert max((m + fill) * s for m, s in zip(got, stage, strict=True)) == pytest.approx(best, rel=1e-12)


def test_planner_within_two_percent_of_every_plan_simulated() -> None:
    """Replica 0 runs on a V100 and an A100, replica 1 on an A100 and an H100: every partition of the 8 blocks
    into 2 stages times every split of the 8 micro-batches over the 2 replicas, simulated."""
    cluster = _singles(("v100", 1, "eth-400g"), ("a100", 2, "eth-400g"), ("h100", 1, "eth-400g"))
    plan = {"pp": 2, "order": "tp-pp-dp"}
    batch = {"global": 8, "micro": 1}
    times = {}
    for first in range(1, 8):
        for share in range(1, 8):
            p = {**plan, "partition": [first, 8 - first], "dp_shares": [share, 8 - share]}
            times[(first, share)] = simulate(_scenario(cluster, p, batch)).iteration_time_s
    best = min(times.values())
    uniform = simulate(_scenario(cluster, plan, batch)).iteration_time_s
    chosen = simulate(_scenario(cluster, {**plan, "balance": "speed"}, batch))
    assert chosen.plan.partition is not None and chosen.plan.dp_shares is not None
    assert chosen.iteration_time_s <= best * 1.02
    assert uniform > best * 1.2  # the space is worth balancing: the even plan is far from the best


def test_uneven_partition_moves_memory_too() -> None:
    sc = _scenario(_singles(("v100", 1, "eth-400g"), ("a100", 1, "eth-400g")),
                   {"pp": 2, "partition": [2, 6]}, {"global": 8, "micro": 1})
    stages = memory_per_stage(sc.model, sc.plan)
    assert stages[1].weights_bytes > 2 * stages[0].weights_bytes
    assert balanced(sc).plan.partition is not None


@pytest.mark.parametrize(("cluster", "plan", "field"), [
    ("groups: [{server: single-gpu, servers: 1, gpu: v100}, {server: single-gpu, servers: 1, gpu: a100}]",
     "{tp: 2}", "plan.tp"),
    ("groups: [{server: single-gpu, servers: 1, gpu: v100}, {server: single-gpu, servers: 1, gpu: b900}]",
     "{}", "cluster.groups[1].gpu"),
    ("groups: [{server: single-gpu, servers: 1}]\n  server: single-gpu", "{}", "cluster.server"),
    ("groups: [{server: single-gpu, servers: 2}]", "{dp_shares: [1, 2]}", "plan.dp_shares"),
    ("groups: [{server: single-gpu, servers: 2}]", "{pp: 2, partition: [3, 3]}", "plan.partition"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path: Path, cluster: str, plan: str, field: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(f"cluster:\n  {cluster}\n  network: {{topology: single-switch, link: eth-100g}}\n"
                 f"model: {{type: transformer, layers: 8, hidden: 512, heads: 8, seq_len: 512, vocab: 8192}}\n"
                 f"batch: 8\nplan: {plan}\n")
    code, out = _run("simulate", str(p))
    assert code == 2, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in out, out


def test_tp_across_gpu_types_is_refused_by_the_api() -> None:
    with pytest.raises(ConfigError) as e:
        simulate(_scenario(_singles(("v100", 1, "eth-400g"), ("a100", 1, "eth-400g")), {"tp": 2}))
    assert e.value.field == "plan.tp" and "v100" in e.value.message


def test_resolved_groups_load_as_they_are(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "mixed-a100-h100.yaml"
    code, resolved = _run("simulate", str(example), "--resolved")
    assert code == 0, resolved
    again = tmp_path / "mixed-a100-h100.yaml"
    again.write_text(resolved)
    outs = [_run("simulate", str(p), "--json") for p in (example, again)]
    assert outs[0][0] == outs[1][0] == 0
    first, second = json.loads(outs[0][1]), json.loads(outs[1][1])
    assert first["iteration_time_s"] == second["iteration_time_s"] and first["plan"]["partition"] == [12, 20]


# ---- search over mixed fleets ---------------------------------------------------------------------------------
FLEET = {"cluster": {"groups": [{"server": "single-gpu", "servers": [0, 1, 2], "gpu": "v100"},
                                {"server": "single-gpu", "servers": [0, 1, 2], "gpu": "h100"}],
                     "network": {"topology": "single-switch", "link": "eth-100g"}},
         "model": MODEL, "batch": {"global": 8, "micro": 1}, "plan": {"balance": "speed"}}


def test_a_space_chooses_how_many_of_each_server_type() -> None:
    points = list(grid(FLEET))
    assert len(points) == 9 == grid_size(FLEET)
    fleets = sorted(tuple((g["gpu"], g["servers"]) for g in p["cluster"]["groups"]) for _, p in points)
    assert (("v100", 2), ("h100", 1)) in fleets and (("h100", 2),) in fleets and (("v100", 1),) in fleets
    assert {"cluster.groups[0].servers", "cluster.groups[1].servers"} <= set(points[0][0])
    # each point is priced by its own GPU types and timed with a balanced plan
    prices = price_catalog()
    by_fleet = {}
    for _, p in points:
        rec = evaluate(Task(point_key(p), 0, "screen", p, "analytical", prices))
        by_fleet[tuple((g["gpu"], g["servers"]) for g in p["cluster"]["groups"])] = rec
    one_each = by_fleet[(("v100", 1), ("h100", 1))]
    assert one_each["status"] == "ok" and one_each["metrics"]["gpu"] == "v100+h100"
    gpu_usd = one_each["metrics"]["capex_parts_usd"]["gpus"]
    assert gpu_usd == prices["gpus"]["v100"]["price_usd"] + prices["gpus"]["h100"]["price_usd"]
    nothing = by_fleet[(("v100", 0),)]  # nothing bought: the schema names the field
    assert nothing["status"] == "invalid" and nothing["field"] == "cluster.groups[0].servers"
    # adding an H100 to a V100 helps, and more than adding a second V100
    t = {k: r["metrics"]["iteration_time_s"] for k, r in by_fleet.items() if r["status"] == "ok"}
    assert t[(("v100", 1), ("h100", 1))] < t[(("v100", 2),)] < t[(("v100", 1),)]
