"""Fuzz the scenario edge: mutated example scenarios (keys dropped or renamed, wrong types, negative, zero
and huge numbers, lists for mappings, strings for numbers, broken units), as files and as ``--set``
overrides, through ``topotrain simulate --resolved`` in-process; hostile YAML text (alias bombs, recursive
aliases, duplicate keys, deep nesting, unknown tags, absurd magnitudes, 20 KB values); and the small
custom-graph cluster mutated through ``topo show --json`` and ``collective --json``. Every run must exit 0
or 2 — never a traceback, never the internal-error exit 1 — with strict JSON (no Infinity/NaN) on exit 0
and only short ``error:`` lines on exit 2. benchmarks/fuzz.py runs 10,000 such cases under time and
memory caps."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from topotrain.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def _scenarios() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        if not isinstance(doc, dict) or "cluster" not in doc:
            continue
        doc.setdefault("model", "resnet50")
        doc.setdefault("batch", 256)
        out.append((p.name, doc))
    return out


SCENARIOS = _scenarios()
VALUES: list[Any] = [None, 0, -1, 1, 3, 10**12, 2**63, 1.5, -0.5, float("nan"), "abc", "1", "", [], [1, 2],
                     ["tp", 2], {}, {"x": 1}, True, "100Gbps", "100", "1us", "1", "25MiB", "25", "-1MiB",
                     "1e400", "eflops", "gpt3-1.3b", "flow-async", "bigraph"]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: dict[str, Any], path: tuple[Any, ...], op: str, value: Any) -> None:
    parent: Any = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "drop":
        del parent[key]
    elif op == "rename" and isinstance(parent, dict):
        parent[f"{key}s" if len(str(key)) < 4 else str(key)[:-1]] = parent.pop(key)
    else:
        parent[key] = copy.deepcopy(value)


mutation = st.tuples(st.integers(0, 10_000), st.sampled_from(["drop", "rename", "set", "set", "set"]),
                     st.sampled_from(VALUES))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.integers(0, len(SCENARIOS) - 1), mutations=st.lists(mutation, min_size=1, max_size=3),
       as_override=st.booleans())
def test_mutated_scenarios_exit_0_or_2(tmp_path_factory: Any, which: int, mutations: list[tuple[int, str, Any]],
                                       as_override: bool) -> None:
    name, base = SCENARIOS[which]
    doc = copy.deepcopy(base)
    overrides: list[str] = []
    for index, op, value in mutations:
        paths = _paths(doc)
        if not paths:
            break
        path = paths[index % len(paths)]
        if as_override and op == "set" and all(isinstance(k, str) for k in path):
            overrides += ["--set", f"{'.'.join(path)}={yaml.safe_dump(value, default_flow_style=True).strip()}"]
            if overrides[-1].endswith("..."):
                overrides[-1] = overrides[-1][: -len("...")].rstrip()
        else:
            _mutate(doc, path, op, value)
    folder = tmp_path_factory.mktemp("fuzz")
    for extra in EXAMPLES.glob("*topology*.yaml"):
        shutil.copy(extra, folder / extra.name)  # graph files the scenarios name
    scenario = folder / name
    scenario.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["simulate", str(scenario), "--resolved", *overrides])
    assert res.exit_code in (0, 2), (res.exit_code, res.output, doc, overrides)
    assert "Traceback" not in res.output and "internal error" not in res.output, (res.output, doc, overrides)
    if res.exit_code == 2:
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert lines and all(ln.startswith("error: ") for ln in lines), res.output


# ---- hostile YAML text and JSON output (issue 19) --------------------------------------------------------
_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
HOSTILE = [_BOMB, "x: &a [*a]\n", "x: &a {b: *a}\n", "x: " + "[" * 3000 + "]" * 3000 + "\n", "x: {\n",
           "x: !!python/object/apply:os.system [echo hi]\n", "x: !!binary aGVsbG8=\n", "\x00\x01",
           "cluster: null\n", "model: resnet50\n", "--- 1\n", "? [a, b]\n: 1\n", "x: *undefined\n",
           "batch: .inf\n", "batch: .nan\n", "plan: {bucket: 1e21B}\n", "cluster: {servers: 18446744073709551616}\n",
           "network: " + "x" * 20_000 + "\n", "degraded_links: [{a: \x1b[31m, b: é}]\n"]
SAFE_VALUES = [0, -1, 1, 2, 3, 1.5, -0.5, float("nan"), float("inf"), "abc", "", [], [2, 2], {}, True, "100Gbps",
               "-1Gbps", "1e-300B/s", "1us", "25MiB", "1e21B", "x" * 5000]


def _strict_json(text: str) -> Any:
    def bad(c: str) -> Any:
        raise AssertionError(f"non-JSON constant {c} in output")

    return json.loads(text, parse_constant=bad)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.integers(0, len(SCENARIOS) - 1), tail=st.sampled_from(HOSTILE), at_start=st.booleans())
def test_hostile_yaml_is_refused_in_one_line(tmp_path_factory: Any, which: int, tail: str, at_start: bool) -> None:
    name, base = SCENARIOS[which]
    body = yaml.safe_dump(base)
    folder = tmp_path_factory.mktemp("hostile")
    for extra in EXAMPLES.glob("*topology*.yaml"):
        shutil.copy(extra, folder / extra.name)
    scenario = folder / name
    scenario.write_text(tail + body if at_start else body + tail, encoding="utf-8")
    res = runner.invoke(app, ["simulate", str(scenario), "--resolved", "--json"])
    assert res.exit_code in (0, 2), (res.exit_code, res.output[-2000:])
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output[-2000:]
    if res.exit_code == 0:
        _strict_json(res.stdout)
    else:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert lines and all(ln.startswith("error: ") and len(ln) <= 320 for ln in lines), res.stderr[-2000:]


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(index=st.integers(0, 10_000), value=st.sampled_from(SAFE_VALUES),
       command=st.sampled_from([["topo", "show", "{S}", "--json"],
                                ["collective", "{S}", "--json", "--network", "analytical", "--size", "1MiB"]]))
def test_built_clusters_print_strict_json_or_refuse(tmp_path_factory: Any, index: int, value: Any,
                                                    command: list[str]) -> None:
    """The custom-graph example (small: building it is fast) with one cluster field mutated, through the
    commands that build it: exit 0 with strict JSON, or one error line per problem."""
    doc = next(copy.deepcopy(d) for n, d in SCENARIOS if n == "custom-graph.yaml")
    paths = [p for p in _paths(doc) if p and p[0] == "cluster"]
    _mutate(doc, paths[index % len(paths)], "set", value)
    folder = tmp_path_factory.mktemp("built")
    for extra in EXAMPLES.glob("*topology*.yaml"):
        shutil.copy(extra, folder / extra.name)
    scenario = folder / "s.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, [a.replace("{S}", str(scenario)) for a in command])
    assert res.exit_code in (0, 2), (res.exit_code, res.output[-2000:], doc)
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output[-2000:]
    if res.exit_code == 0:
        _strict_json(res.stdout)
