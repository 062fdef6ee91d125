"""The scenario schema: every bad input is one `error:` line per problem naming its field, exit code 2, no
traceback; `--set` and the Python API go through the same models; `schema` and `simulate --resolved`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.scenario.load import json_schema, load_scenario, scenario_from_dict
from topotrain.training.plan import Plan
from topotrain.training.simulate import simulate
from topotrain.util.errors import ConfigError, ConfigErrors, problems_of

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEFAULT = str(EXAMPLES / "resnet50-eflops.yaml")


def _errors(*args: str) -> list[str]:
    """Run the CLI; assert exit 2 and no traceback; return the error lines."""
    res = runner.invoke(app, list(args))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("error: ") for ln in lines), res.output
    return lines


@pytest.mark.parametrize(("override", "field", "words"), [
    ("compute=5", "compute", "must be a mapping"),
    ("plan=[tp, 2]", "plan", "must be a mapping"),
    ("plan.micro_batch=0", "plan.micro_batch", "must be ≥ 1 (got 0)"),
    ("plan.bucket=25", "plan.bucket", "25MiB"),
    ("plan.bucket=lots", "plan.bucket", "bytes"),
    ("plan.tp=2", "plan.tp", "no tensor-parallel layers"),
    ("plan.ep=2", "plan.ep", "no experts"),
    ("plan.dp=64", "plan", "dp·tp·pp"),
    ("plan.tpp=2", "plan.tpp", "did you mean 'tp'"),
    ("plan.zero_stage=4", "plan.zero_stage", "≤ 3"),
    ("plan.recompute=some", "plan.recompute", "unknown value"),
    ("plan.fsdp=maybe", "plan.fsdp", "true or false"),
    ("batch=1000", "plan.global_batch", "not divisible"),
    ("batch=-1", "batch", "≥ 1"),
    ("modle=resnet50", "modle", "did you mean 'model'"),
    ("model=resnet5000", "model", "unknown"),
    ("model=[1, 2]", "model", "must be text"),
    ("network=flw", "network", "flow-async"),
    ("cluster.servers=1000000", "cluster.servers", "65536"),
    ("cluster.servers=0", "cluster.servers", "≥ 1"),
    ("cluster.servers=4.5", "cluster.servers", "whole number"),
    ("cluster.network.latency=1", "cluster.network.latency", "seconds"),
    ("cluster.network.bandwidth=100", "cluster.network.bandwidth", "bits or bytes"),
    ("cluster.network.topology=hypercube", "cluster.network.topology", "bigraph"),
    ("cluster.message_overhead=2", "cluster.message_overhead", "2us"),
    ("cluster.server=nope", "cluster.server", "unknown server template"),
    ("cluster.gpu=tpu9", "cluster.gpu", "unknown GPU"),
    ("cluster.catalog=[1]", "cluster.catalog", "must be"),
    ("stragglers.gpus={s99/gpu0: 2}", "stragglers.gpus.s99/gpu0", "not a GPU"),
    ("stragglers.lognormal_sigma=-1", "stragglers.lognormal_sigma", "≥ 0"),
    ("degraded_links=[{a: x}]", "degraded_links[0].b", "is required"),
    ("degraded_links=[{a: s0/nic0, b: nowhere}]", "degraded_links[0]", "nowhere"),
])
def test_bad_override_is_one_line_naming_the_field(override: str, field: str, words: str) -> None:
    lines = _errors("simulate", DEFAULT, "--set", override)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {field}:"), lines
    assert words in lines[0], lines


def test_every_problem_at_once() -> None:
    lines = _errors("simulate", DEFAULT, "--resolved", "--set", "plan.micro_batch=0", "--set", "plan.tpp=2",
                    "--set", "cluster.servers=0", "--set", "network=flw", "--set", "compute=5")
    fields = sorted(ln.split(":")[1].strip() for ln in lines)
    assert fields == ["cluster.servers", "compute", "network", "plan.micro_batch", "plan.tpp"], lines


def test_bad_scenario_file(tmp_path: Path) -> None:
    doc = yaml.safe_load(Path(DEFAULT).read_text())
    doc["plan"] = ["tp", 2]
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    assert _errors("simulate", str(p))[0].startswith("error: plan: must be a mapping")
    p.write_text("- just\n- a list\n")
    assert "mapping" in _errors("simulate", str(p))[0]
    p.write_text("cluster: {server: eflops, servers: 2\n")
    assert "YAML" in _errors("simulate", str(p))[0]


def test_size_limit_before_building() -> None:
    # 8192 EFLOPS servers hold 65,536 GPUs: 8193 are refused from the template alone, before any build
    lines = _errors("simulate", DEFAULT, "--resolved", "--set", "cluster.servers=8193")
    assert "65536 GPUs" in lines[0] and lines[0].startswith("error: cluster.servers:")


def test_python_api_same_errors() -> None:
    doc = yaml.safe_load(Path(DEFAULT).read_text())
    doc["plan"]["micro_batch"] = 0
    doc["compute"] = 5
    with pytest.raises(ConfigErrors) as e:
        scenario_from_dict(doc)
    assert sorted(p.field for p in e.value.problems) == ["compute", "plan.micro_batch"]
    with pytest.raises(ConfigError, match="plan.tp"):
        Plan(tp=0)
    with pytest.raises(ConfigError, match="plan.micro_batch"):
        Plan(micro_batch=0)
    p = Plan(dp=4, global_batch=64)
    assert dataclasses.replace(p, dtype="bf16").dtype == "bf16"
    with pytest.raises(ConfigError, match="plan.ep"):
        dataclasses.replace(p, ep=3)
    with pytest.raises(ConfigError, match="cluster.servers"):
        cluster_from_dict({"server": "eflops", "servers": -1})


def test_plan_keeps_its_meaning() -> None:
    sc = load_scenario(DEFAULT)
    p = sc.plan
    assert (p.dp, p.tp, p.pp, p.ep, p.gpus) == (128, 1, 1, 1, 128)
    assert (p.global_batch, p.micro_batch_size, p.num_micro_batches, p.replica_batch) == (32768, 256, 1, 256)
    assert p.bucket_bytes == 25 * 2**20 and p.dtype == "fp16" and p.rank(1, 0, 0) == 1
    assert Plan(dp=2, pp=2, global_batch=8).micro_batch_size == 1  # pp > 1: one sample per micro-batch
    assert Plan(dp=2, global_batch=8).micro_batch_size == 4  # pp = 1: the whole replica batch
    assert sc.cluster.gpu_spec.name == "v100" and sc.cluster.catalog.gpu("v100") is sc.cluster.gpu_spec


def test_bucket_units() -> None:
    sc = load_scenario(DEFAULT, ["plan.bucket=64M"])  # nccl-tests: M = MiB
    assert sc.plan.bucket_bytes == 64 * 2**20
    assert load_scenario(DEFAULT, ["plan.bucket=1mib"]).plan.bucket_bytes == 2**20
    assert load_scenario(DEFAULT, ["plan.bucket=8MB"]).plan.bucket_bytes == 8_000_000
    d = yaml.safe_load(Path(DEFAULT).read_text())
    d["plan"] = {"micro_batch": 256, "bucket_bytes": 1024}  # the key's name states the unit
    assert scenario_from_dict(d).plan.bucket_bytes == 1024


def test_schema_command() -> None:
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.output)
    assert schema == json_schema()
    assert {"cluster", "model", "plan", "network"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_resolved_is_complete_and_loads_back(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", DEFAULT, "--resolved"])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(res.output)
    assert doc["plan"]["dp"] == 128 and doc["plan"]["dtype"] == "fp16" and doc["plan"]["bucket"] == "25MiB"
    assert doc["cluster"]["gpu"] == "v100" and doc["cluster"]["message_overhead"] == "2us"
    back = tmp_path / "resolved.yaml"
    back.write_text(res.output)
    a, b = load_scenario(DEFAULT), load_scenario(back)
    assert a.plan == b.plan and a.cluster.network_params == b.cluster.network_params
    js = runner.invoke(app, ["simulate", DEFAULT, "--resolved", "--json"])
    assert json.loads(js.output)["plan"] == doc["plan"]


GRAPH = """\
message_overhead: 5us
nodes:
  - {name: g0, kind: gpu}
  - {name: g1, kind: gpu}
  - {name: sw, kind: switch}
links:
  - {a: g0, b: sw, bandwidth: 100Gbps, latency: 1us}
  - {a: g1, b: sw, bandwidth: 100Gbps, latency: 1us}
"""


def test_graph_file_overhead_takes_effect(tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_text(GRAPH)
    c = cluster_from_dict({"graph": "g.yaml"}, base_dir=tmp_path)
    assert c.network_params.message_overhead_s == pytest.approx(5e-6)
    assert not hasattr(c.topology, "message_overhead_s")  # a network parameter, not the graph's
    same = cluster_from_dict({"graph": "g.yaml", "message_overhead": "5us"}, base_dir=tmp_path)
    assert same.network_params.message_overhead_s == c.network_params.message_overhead_s
    with pytest.raises(ConfigError, match="graph file") as e:
        cluster_from_dict({"graph": "g.yaml", "message_overhead": "1us"}, base_dir=tmp_path)
    assert e.value.field == "cluster.message_overhead"
    (tmp_path / "h.yaml").write_text(GRAPH.replace("message_overhead: 5us\n", ""))
    assert cluster_from_dict({"graph": "h.yaml"}, base_dir=tmp_path).network_params.message_overhead_s == 2e-6
    with pytest.raises(ConfigError, match="does not apply"):
        cluster_from_dict({"graph": "g.yaml", "servers": 2}, base_dir=tmp_path)


CATALOG_SCENARIO = """\
cluster:
  catalog:
    links: [{name: my-nic, kind: ethernet, bandwidth: 400Gbps, latency: 1us}]
    gpus:
      - {name: my-gpu, peak_flops: {bf16: 500TFLOPS, fp32: 50TFLOPS}, hbm_bandwidth: 3TB/s, memory: 96GiB}
  server: single-gpu
  servers: 4
  gpu: my-gpu
  nic: my-nic
  network: {topology: single-switch}
model: resnet50
batch: 64
"""


def test_catalog_is_a_value(tmp_path: Path) -> None:
    from topotrain.hardware import GPUS, LINKS

    p = tmp_path / "s.yaml"
    p.write_text(CATALOG_SCENARIO)
    sc = load_scenario(p)
    assert sc.cluster.gpu == "my-gpu" and sc.cluster.gpu_spec.memory_bytes == 96 * 2**30
    assert sc.plan.dtype == "bf16"  # the custom GPU has bf16
    assert "my-gpu" not in GPUS and "my-nic" not in LINKS  # nothing global changed
    nic = sc.cluster.topology.nodes["s0/nic0"]
    assert nic.attrs["bandwidth_bytes_per_s"] == 50e9
    r = simulate(sc)  # the catalog GPU times the compute, not a built-in one
    assert r.gpu == "my-gpu" and r.iteration_time_s > 0
    p.write_text(CATALOG_SCENARIO.replace("hbm_bandwidth: 3TB/s", "hbm_bandwidth: 3"))
    lines = _errors("simulate", str(p))
    assert lines[0].startswith("error: cluster.catalog.gpus[0].hbm_bandwidth:") and "bits or bytes" in lines[0]


def test_problems_of_a_single_error() -> None:
    e = ConfigError("a", "b")
    assert problems_of(e) == [e]
    many = ConfigErrors([ConfigError("x", "y", "z"), e])
    assert str(many) == "x: y (z)\na: b" and many.field == "x"
