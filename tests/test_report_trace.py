"""The Chrome/Perfetto trace: schema (Trace Event Format), every stream of every stage, flows, counters.

Perfetto's Python trace processor needs its native binary fetched at run time, which this machine cannot
do, so the trace is checked against the format's rules here instead.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from topotrain.report.trace import utilization_steps, write_trace
from topotrain.report.trace import write_trace as reexported
from topotrain.scenario.load import load_scenario
from topotrain.training.simulate import simulate

TP_PP = """
cluster:
  server: nvswitch-8
  servers: 2
  network: {topology: rail-optimized, link: ib-hdr-200g, latency: 1us}
model: {name: gpt3-1.3b, layers: 4}
batch: {global: 16, micro: 2}
plan: {tp: 4, pp: 2}
network: flow
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, dict[str, Any]]:
    d = tmp_path_factory.mktemp("trace")
    (d / "s.yaml").write_text(TP_PP)
    sc = load_scenario(d / "s.yaml")
    r = simulate(sc)
    write_trace(r, d / "t.json", sc.cluster.topology)
    return sc, r, json.loads((d / "t.json").read_text())


def test_reexport_is_the_report_trace() -> None:
    assert reexported is write_trace


def test_schema_integer_ids_and_names(traced: tuple[Any, Any, dict[str, Any]]) -> None:
    _, r, doc = traced
    ev = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms"
    for e in ev:
        assert e["ph"] in {"X", "M", "s", "f", "C"}
        assert isinstance(e["pid"], int)
        if e["ph"] != "C" and e["name"] not in ("process_name", "process_sort_index", "process_labels"):
            assert isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in ev if e["ph"] in ("X", "s", "f")}
    assert used <= set(threads), "every track has a thread_name"
    assert {pid for pid, _ in used} | {e["pid"] for e in ev if e["ph"] == "C"} <= set(procs)
    # one process per stage; its 8 symmetric ranks (dp=2 x tp=4) are folded and the name says so
    assert sum("stage" in n for n in procs.values()) == r.plan.pp == 2
    assert all("8 symmetric ranks folded" in n for n in procs.values() if n.startswith("stage"))


def test_every_stream_and_every_blocking_collective(traced: tuple[Any, Any, dict[str, Any]]) -> None:
    _, r, doc = traced
    ev = doc["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "stage 0 → 1, forward activations", "stage 1 → 0, backward gradients"} <= names
    assert any(n.startswith("tp/ep") for n in names) and any(n.startswith("dp") for n in names)
    tp = [e for e in ev if e["ph"] == "X" and e["cat"] == "tp-comm"]
    expect = sum(len(t.blocking_slices()) for t in r.tasks)
    assert expect > 0 and len(tp) == expect
    # each blocking slice lies inside the compute task that ran it
    xs = {(e["pid"], e["name"]): e for e in ev if e["ph"] == "X" and e["cat"] != "tp-comm"}
    for e in tp[:50]:
        host = xs[(e["pid"], e["args"]["in"])]
        assert host["ts"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= host["ts"] + host["dur"] + 1e-6
    assert Counter(e["cat"] for e in ev if e["ph"] == "X")["pp-comm"] == sum(
        t.category == "pp-comm" for t in r.tasks)


def test_flows_join_sends_to_the_next_stage(traced: tuple[Any, Any, dict[str, Any]]) -> None:
    _, r, doc = traced
    ev = doc["traceEvents"]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    assert len(starts) == sum(t.category == "pp-comm" for t in r.tasks)  # every send has one waiting task
    for i, s in starts.items():
        f = ends[i]
        assert f["pid"] != s["pid"] and f["ts"] >= s["ts"]
        # the arrow ends on a slice that starts at the flow's end (binding point: enclosing slice)
        assert any(e["ph"] == "X" and e["pid"] == f["pid"] and e["tid"] == f["tid"] and e["ts"] == f["ts"]
                   for e in ev)


def test_counters_integrate_to_the_engines_link_bytes(traced: tuple[Any, Any, dict[str, Any]]) -> None:
    """Each counter spreads a collective's routed bytes over its span; over the iteration the track's
    mean must equal the utilization the engine measured from its network simulator."""
    _, r, doc = traced
    ev = doc["traceEvents"]
    tracks: dict[str, list[dict[str, Any]]] = {}
    for e in ev:
        if e["ph"] == "C":
            tracks.setdefault(e["name"], []).append(e)
    assert tracks
    top = {f"{a}→{b}": u for a, b, u in r.link_utilization_top}
    for name, cs in tracks.items():
        cs.sort(key=lambda e: e["ts"])
        values = [c["args"]["utilization %"] for c in cs]
        assert all(0 <= v <= 100.0 + 1e-6 for v in values)
        area = sum((cs[i + 1]["ts"] - cs[i]["ts"]) * values[i] for i in range(len(cs) - 1)) / 100 / 1e6
        assert area / r.iteration_time_s == pytest.approx(top[name], rel=1e-3)


def test_utilization_steps_closed_form() -> None:
    # 1 GB over [0, 1] s and 1 GB over [0.5, 1.5] s on a 2 GB/s link: 50 %, 100 %, 50 %, 0
    steps = utilization_steps([(0.0, 1.0, 1e9), (0.5, 1.5, 1e9)], 2e9)
    assert steps == [(0.0, 0.5), (0.5, 1.0), (1.0, 0.5), (1.5, 0.0)]


def test_cli_trace_has_counters(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from topotrain.cli import app

    (tmp_path / "s.yaml").write_text(TP_PP)
    res = CliRunner().invoke(app, ["simulate", str(tmp_path / "s.yaml"), "--trace", str(tmp_path / "t.json"),
                                   "--network", "analytical"])
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e["ph"] == "C" for e in ev)


def test_every_communication_event_says_what_it_moved(traced: tuple[Any, Any, dict[str, Any]]) -> None:
    """Issue 41 item 13: bytes and algorithm in every communication event's args."""
    _, r, doc = traced
    comm = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"].endswith("comm")]
    assert comm and {e["cat"] for e in comm} >= {"tp-comm", "pp-comm", "dp-comm"}
    for e in comm:
        assert {"bytes", "algorithm", "op", "wire_bytes"} <= set(e["args"]), e
        assert isinstance(e["args"]["bytes"], int) and e["args"]["algorithm"]
    sends = [e for e in comm if e["cat"] == "pp-comm" and e["args"]["bytes"] > 0]
    assert sends and all(e["args"]["wire_bytes"] >= e["args"]["bytes"] for e in sends)
    dp = [t for t in r.tasks if t.category == "dp-comm" and t.comm is not None and t.comm.schedules]
    by_task = {e["args"]["task"]: e for e in comm if e["cat"] == "dp-comm"}
    t = dp[0]
    assert by_task[t.id]["args"]["bytes"] == sum(s.size_bytes for s in t.comm.schedules)
    assert by_task[t.id]["args"]["algorithm"] == "+".join(sorted({s.algorithm for s in t.comm.schedules}))
