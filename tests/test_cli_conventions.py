"""The CLI as its users expect it: help in words (-h, no Python type names, choices listed), one error line
for usage errors, `--set` that switches a network, `topotrain list`, the schema's name enums, nccl-tests'
columns, units in what a person reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.collectives import costmodel
from topotrain.scenario.load import apply_overrides, json_schema
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_time, parse_time, time_value

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PYTHON_TYPES = re.compile(r"<(str|int|float|bool|path|list\[[^>]*\]|dict[^>]*|tuple[^>]*)>|\blist\[str\]|NoneType")


def _run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out.extend(_commands(sub, (*path, name)))
    return out


def test_every_help_reads_without_python_type_names() -> None:
    root = typer.main.get_command(app)
    paths = _commands(root)
    assert len(paths) > 15 and ("list",) in paths and ("topo", "show") in paths
    for path in paths:
        for flag in ("--help", "-h"):
            code, out = _run(*path, flag)
            assert code == 0, (path, out)
            assert not PYTHON_TYPES.search(out), (path, PYTHON_TYPES.search(out), out)
            assert "``" not in out, (path, out)


def test_choices_are_listed() -> None:
    _, out = _run("collective", "--help")
    assert "[analytical|flow|flow-async|flow-eager|packet]" in out
    assert "[nccl|ideal]" in out and "ring|" in out
    _, out = _run("simulate", "-h")
    assert "[analytical|flow|flow-async|flow-eager]" in out and "FIELD=VALUE" in out


def _main(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; sys.argv = ['topotrain', *sys.argv[1:]]\nfrom topotrain.cli import main\nmain()"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_usage_errors_are_one_error_line() -> None:
    for args in (("simulate", "--set"), ("explain",), ("collective", "--op"), ("list", "gpu")):
        res = _main(*args)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, res.stderr)
        assert "Usage:" not in res.stderr and "Traceback" not in res.stderr


BIGRAPH = {"cluster": {"server": "eflops", "servers": 4,
                       "network": {"topology": "bigraph", "switches": 2, "radix": 16, "link": "eth-100g"}}}


def test_set_switches_the_network_topology() -> None:
    doc = apply_overrides(json.loads(json.dumps(BIGRAPH)), ["cluster.network.topology=fat-tree"])
    assert doc["cluster"]["network"] == {"topology": "fat-tree", "link": "eth-100g"}
    # the builder's parameter set on the same command line stays, whatever the order
    doc = apply_overrides(json.loads(json.dumps(BIGRAPH)),
                          ["cluster.network.switches=4", "cluster.network.topology=leaf-spine"])
    assert doc["cluster"]["network"]["switches"] == 4 and "radix" not in doc["cluster"]["network"]
    # a mapping replaces the whole field; ~ and an empty value delete
    doc = apply_overrides(json.loads(json.dumps(BIGRAPH)),
                          ["cluster.network={topology: fat-tree, link: ib-hdr-200g}", "~cluster.servers"])
    assert doc["cluster"] == {"server": "eflops", "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}}
    doc = apply_overrides(json.loads(json.dumps(BIGRAPH)), ["cluster.network.radix="])
    assert "radix" not in doc["cluster"]["network"]
    with pytest.raises(ConfigError) as e:
        apply_overrides(json.loads(json.dumps(BIGRAPH)), ["~cluster.nope"])
    assert "nothing to delete" in e.value.message


def test_simulate_with_a_switched_network(tmp_path: Path) -> None:
    code, out = _run("simulate", str(ROOT / "examples" / "resnet50-eflops.yaml"), "--resolved",
                     "--set", "cluster.network.topology=fat-tree")
    assert code == 0, out
    assert "topology: fat-tree" in out and "switches" not in out
    assert "message_overhead: 2us" in out  # units a person reads, and the file loads back


def test_list_names_and_filter() -> None:
    code, out = _run("list")
    assert code == 0 and re.search(r"^models: .*resnet50", out, re.M) and re.search(r"^topologies: .*fat-tree", out,
                                                                                     re.M)
    code, out = _run("list", "gpus", "h1")
    assert code == 0 and out.split() == ["h100"]
    code, out = _run("list", "algorithms", "--json")
    assert "ring" in json.loads(out)


def test_schema_names_as_enums() -> None:
    text = json.dumps(json_schema())
    for name in ("resnet50", "v100", "dgx-h100", "ib-ndr-400g", "fat-tree"):
        assert f'"{name}"' in text
    gpu = json_schema()["$defs"]["ClusterSpec"]["properties"]["gpu"]
    assert any("enum" in b for a in gpu["anyOf"] for b in a.get("anyOf", []))  # enum beside free text


def test_value_errors_say_did_you_mean_and_keep_the_list() -> None:
    res = _main("simulate", "--set", "model=resnt50")
    line = res.stderr.strip()
    assert "did you mean 'resnet50'?" in line and line.rstrip(")").endswith("megatron-1t"), line
    res = _main("collective", "--algo", "rng")
    assert "did you mean 'ring'?" in res.stderr


SINGLE = """
cluster:
  server: single-gpu
  servers: 8
  message_overhead: 0us
  network: {topology: single-switch, link: eth-100g, latency: 0us}
"""


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce-scatter", "broadcast", "all-to-all"])
def test_collective_table_has_nccl_tests_columns(tmp_path: Path, op: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(SINGLE)
    code, out = _run("collective", str(path), "--op", op, "--size", "64MiB")
    assert code == 0, out
    header = [ln for ln in out.splitlines() if ln.startswith("#") and "size" in ln][0].split()
    assert header[1:11] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                            "algorithm"]
    assert "out-of-place only" in out
    row = [ln for ln in out.splitlines() if not ln.startswith("#")][0].split()
    size, count, root = int(row[0]), int(row[1]), int(row[4])
    time_us, algbw, busbw = float(row[5]), float(row[6]), float(row[7])
    assert size == 64 * 2**20 and row[8] == "N/A"
    assert count == (size // 4 // 8 if op in ("allgather", "reduce-scatter", "all-to-all") else size // 4)
    assert root == (0 if op == "broadcast" else -1)
    # nccl-tests' closed forms: algbw = size / time, busbw = algbw x factor (allreduce 2(p-1)/p, ...)
    assert algbw == pytest.approx(size / (time_us * 1e-6) / 1e9, rel=0.01)
    factor = {"allreduce": 2 * 7 / 8, "allgather": 7 / 8, "reduce-scatter": 7 / 8, "all-to-all": 7 / 8,
              "broadcast": 1.0}[op]
    assert factor == costmodel.bus_factor(op, 8)
    assert busbw == pytest.approx(algbw * factor, rel=0.01, abs=0.011)
    assert row[10] in ("LL", "LL128", "Simple") and 0 < float(row[11]) <= 1  # protocol, wire efficiency
    assert max(len(ln) for ln in out.splitlines()) <= 150


def test_units_a_person_reads() -> None:
    assert time_value(2e-6) == "2us" and parse_time(time_value(2e-6), "x") == pytest.approx(2e-6)
    assert time_value(0.0015) == "1.5ms" and time_value(3.0) == "3s" and time_value(0) == "0s"
    assert format_time(2.776e-17) == "< 1 ps" and format_time(0) == "0 s"
    code, out = _run("topo", "show", str(ROOT / "examples" / "eflops-bigraph.yaml"))
    assert code == 0, out
    assert "bisection bandwidth" in out and "GB/s" in out and "_bytes_per_s" not in out
    assert "400000000000" not in out
