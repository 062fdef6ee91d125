"""Training-iteration simulation: engine semantics, pipeline bubbles, overlap, contention, validation bands,
bad input. Published figures: docs/sources.md (NVIDIA DeepLearningExamples, Megatron-LM SC'21 Table 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.network import NetworkModel, NetworkParams, get_model
from topotrain.scenario.load import scenario_from_dict
from topotrain.topology.graph import Topology
from topotrain.training.engine import CommSpec, Engine, TaskGraph
from topotrain.training.simulate import Result, simulate
from topotrain.util.errors import ConfigError
from topotrain.validate import published as published_rows

DGX = {"server": "nvswitch-8", "servers": 1}


def _sim(**kw: Any) -> Result:
    return simulate(scenario_from_dict(kw))


# ---- engine -------------------------------------------------------------------------------------------
def _two_gpu_link() -> Topology:
    t = Topology("pair")
    for n in ("a", "b", "c", "d"):
        t.add_node(n, "gpu")
    t.add_node("s1", "switch")
    t.add_node("s2", "switch")
    for n in ("a", "b"):
        t.add_link(n, "s1", 100e9)
    for n in ("c", "d"):
        t.add_link(n, "s2", 100e9)
    t.add_link("s1", "s2", 10e9)
    return t


def _net(name: str) -> NetworkModel:
    """A network model without per-message overhead (the engine tests count bandwidth only)."""
    return get_model(name, NetworkParams(0.0))


def _p2p(src: str, dst: str, size: int) -> Schedule:
    return Schedule(CollectiveOp.BROADCAST, "p2p", (src, dst), size, np.array([size]), np.array([0]),
                    np.array([-1]), (Phase.of([0], [1], [0], [1], False),))


def test_streams_serialize_and_overlap() -> None:
    g = TaskGraph()
    a = g.add("a", "forward", "s0", duration_s=1.0)
    g.add("b", "forward", "s0", duration_s=2.0)  # same stream: after a
    c = g.add("c", "forward", "s1", duration_s=0.5)  # other stream: in parallel
    g.add("d", "forward", "s1", deps=[a, c], duration_s=1.0)
    eng = Engine(_two_gpu_link(), _net("analytical"))
    assert eng.run(g) == pytest.approx(3.0)
    assert [t.start_s for t in g.tasks] == pytest.approx([0.0, 1.0, 0.0, 1.0])


def test_concurrent_collectives_contend_in_flow_only() -> None:
    """Two 1 GB transfers over one 10 GB/s link, on two streams: flow shares the link (0.2 s), the analytical
    model times each alone (0.1 s)."""
    size = 10**9
    out = {}
    for net in ("flow", "analytical"):
        g = TaskGraph()
        g.add("x", "dp-comm", "s0", comm=CommSpec("x", (_p2p("a", "c", size),)))
        g.add("y", "dp-comm", "s1", comm=CommSpec("y", (_p2p("b", "d", size),)))
        out[net] = Engine(_two_gpu_link(), _net(net)).run(g)
    assert out["flow"] == pytest.approx(2 * size / 10e9, rel=1e-6)
    assert out["analytical"] == pytest.approx(size / 10e9, rel=1e-6)


def test_deadlock_is_reported() -> None:
    g = TaskGraph()
    g.add("a", "forward", "s0", deps=[1], duration_s=1.0)
    g.add("b", "forward", "s0", deps=[0], duration_s=1.0)
    with pytest.raises(RuntimeError, match="deadlock"):
        Engine(_two_gpu_link(), _net("analytical")).run(g)


# ---- pipeline -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule,virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_pipeline_bubble_matches_closed_form(schedule: str, virtual: int) -> None:
    """Bubble fraction of GPipe/1F1B is (p−1)/(m+p−1); interleaving divides it by v (Narayanan et al. SC'21)."""
    p, m = 8, 16
    r = _sim(cluster=DGX, model={"type": "transformer", "layers": 32, "hidden": 2048, "heads": 16,
                                 "seq_len": 1024, "vocab": 8192},
             batch=m, plan={"pp": p, "micro_batch": 1, "pipeline_schedule": schedule, "virtual_stages": virtual},
             network="analytical")
    ideal = (p - 1) / virtual / (m + (p - 1) / virtual)
    frac = r.breakdown.bubble_s / r.iteration_time_s
    assert frac == pytest.approx(ideal, abs=0.08)


def test_overlap_hides_gradient_allreduce() -> None:
    base = {"cluster": {"server": "pcie-shared-nic", "servers": 4,
                        "network": {"topology": "single-switch", "link": "eth-100g"}},
            "model": "resnet50", "batch": 32 * 64, "plan": {"micro_batch": 64, "dp_algorithm": "ring"}}
    on = simulate(scenario_from_dict(base))
    base["plan"] = {**base["plan"], "overlap": False}
    off = simulate(scenario_from_dict(base))
    assert on.iteration_time_s < off.iteration_time_s
    assert on.breakdown.overlapped_comm_s > 0
    assert off.breakdown.exposed_comm_s > on.breakdown.exposed_comm_s
    for r in (on, off):
        b = r.breakdown
        assert b.compute_s + b.tp_comm_s + b.exposed_comm_s + b.bubble_s == pytest.approx(r.iteration_time_s, rel=1e-6)


def test_straggler_gates_synchronous_training() -> None:
    kw = {"cluster": DGX, "model": "resnet50", "batch": 8 * 128, "plan": {"micro_batch": 128}}
    fast = simulate(scenario_from_dict(kw))
    slow = simulate(scenario_from_dict({**kw, "stragglers": {"gpus": {"s0/gpu3": 1.5}}}))
    assert slow.iteration_time_s / fast.iteration_time_s == pytest.approx(1.5, rel=0.05)
    seeded = [simulate(scenario_from_dict({**kw, "stragglers": {"lognormal_sigma": 0.1, "seed": 7}}))
              .iteration_time_s for _ in range(2)]
    assert seeded[0] == seeded[1] > fast.iteration_time_s


def test_failed_link_is_rerouted() -> None:
    cl = {"server": "eflops", "servers": 4, "network": {"topology": "bigraph", "switches": 4, "radix": 8,
                                                        "link": "eth-100g"}}
    kw = {"cluster": cl, "model": "resnet50", "batch": 32 * 64, "plan": {"micro_batch": 64, "overlap": False}}
    ok = simulate(scenario_from_dict(kw))
    bad = simulate(scenario_from_dict({**kw, "degraded_links": [{"a": "sw/upper0", "b": "sw/lower0", "factor": 0}]}))
    assert bad.iteration_time_s >= ok.iteration_time_s * (1 - 1e-9)


def test_tensor_parallel_and_zero3_cost_communication() -> None:
    model = "gpt3-1.3b"
    plain = _sim(cluster=DGX, model=model, batch=16, plan={"micro_batch": 2}, network="analytical")
    tp = _sim(cluster=DGX, model=model, batch=16, plan={"tp": 8, "micro_batch": 2}, network="analytical")
    z3 = _sim(cluster=DGX, model=model, batch=16, plan={"micro_batch": 2, "zero_stage": 3}, network="analytical")
    assert tp.breakdown.tp_comm_s > 0 and plain.breakdown.tp_comm_s == 0
    assert z3.peak_memory_bytes < plain.peak_memory_bytes
    assert tp.peak_memory_bytes < plain.peak_memory_bytes


def test_overlapped_tp_s_closed_form() -> None:
    from topotrain.training.engine import overlapped_exposure

    def overlapped_tp_s(c: float, a: float, b: float, chunks: int) -> float:
        return overlapped_exposure(c, (a, b, chunks))

    # halves of 1 s each: one hidden behind a 3 s GEMM (exposed 1/tp of it), one behind 0.25 s (0.75 left)
    assert overlapped_tp_s(2.0, 3.0, 0.25, 4) == pytest.approx(0.25 + 0.75)
    assert overlapped_tp_s(2.0, 0.0, 0.0, 8) == pytest.approx(2.0)  # nothing to hide behind
    assert overlapped_tp_s(2.0, 10.0, 10.0, 2) == pytest.approx(1.0)  # never less than one chunk per half


def test_sequence_parallel_and_tp_comm_overlap() -> None:
    """Sequence parallelism splits the replicated element-wise work and turns each TP allreduce into a
    reduce-scatter and an all-gather (forward: the same time as the allreduce on a ring, equal volume);
    the backward re-gathers the column-parallel inputs and hides them, and the input-gradient
    reduce-scatters, behind the data/weight-gradient GEMMs. TP comm overlap hides part of the forward
    collectives behind their GEMMs, never all of it, and needs sequence parallelism."""
    kw: dict[str, Any] = {"cluster": DGX, "model": "gpt3-2.7b", "batch": 8, "network": "analytical"}
    base = {"tp": 8, "micro_batch": 2}
    tp = _sim(**kw, plan=base)
    sp = _sim(**kw, plan={**base, "sequence_parallel": True})
    ov = _sim(**kw, plan={**base, "sequence_parallel": True, "tp_comm_overlap": True})
    assert sp.breakdown.compute_s < tp.breakdown.compute_s

    def first(r: Result, kind: str) -> Any:
        return next(t for t in r.tasks if t.category == kind and t.blocking)

    f_tp, f_sp = first(tp, "forward"), first(sp, "forward")
    ops_tp = [b.comm.schedules[0].op for b in f_tp.blocking]
    ops_sp = [b.comm.schedules[0].op for b in f_sp.blocking]
    assert set(ops_tp) == {CollectiveOp.ALLREDUCE}
    # one RS and one AG per activation allreduce; the vocab-parallel loss's scalar allreduces stay
    loss = ops_sp.count(CollectiveOp.ALLREDUCE)
    assert ops_sp.count(CollectiveOp.REDUCE_SCATTER) == ops_sp.count(CollectiveOp.ALLGATHER) == len(ops_tp) - loss > 0
    assert f_sp.blocking_s == pytest.approx(f_tp.blocking_s, rel=1e-6)
    b_sp = first(sp, "backward")
    labels = [b.label for b in b_sp.blocking]
    assert sum("allgather input" in x for x in labels) == sum("reduce-scatter" in x for x in labels) > 0
    assert 0 < b_sp.blocking_s < first(tp, "backward").blocking_s
    assert 0 < sp.breakdown.tp_comm_s < tp.breakdown.tp_comm_s
    assert 0 < ov.breakdown.tp_comm_s < 0.8 * sp.breakdown.tp_comm_s
    assert ov.iteration_time_s < sp.iteration_time_s < tp.iteration_time_s
    assert sp.to_dict()["plan"]["sequence_parallel"] is True and tp.to_dict()["plan"]["sequence_parallel"] is False
    keep = _sim(**kw, plan={**base, "sequence_parallel": True, "sp_regather": False})  # stores gathered inputs
    assert not any("allgather input" in b.label for b in first(keep, "backward").blocking)
    assert keep.peak_memory_bytes > sp.peak_memory_bytes and keep.iteration_time_s <= sp.iteration_time_s
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        _sim(**kw, plan={**base, "tp_comm_overlap": True})


def test_zero1_param_gather_overlaps_forward() -> None:
    """ZeRO-1 across servers: the parameter all-gather after the optimizer is exposed; overlapped with the
    next forward (Megatron-Core --overlap-param-gather) most of it hides. Needs ZeRO-1/2."""
    kw: dict[str, Any] = {"cluster": {"server": "dgx-h100", "servers": 4,
                                      "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}},
                          "model": "gpt3-1.3b", "batch": 64, "network": "analytical"}
    z1 = _sim(**kw, plan={"micro_batch": 2, "zero_stage": 1})
    ov = _sim(**kw, plan={"micro_batch": 2, "zero_stage": 1, "overlap_param_gather": True})
    assert ov.breakdown.exposed_comm_s < 0.5 * z1.breakdown.exposed_comm_s
    assert ov.iteration_time_s < z1.iteration_time_s
    with pytest.raises(ConfigError, match="overlap_param_gather"):
        _sim(**kw, plan={"micro_batch": 2, "overlap_param_gather": True})


# ---- validation bands (published figures; docs/validation.md has the full table) ---------------------
def _validation() -> Any:
    """The published rows, their subsets and scenario builders (what benchmarks/validation.py reports)."""
    return published_rows


def test_resnet50_single_gpu_throughput_v100() -> None:
    """NVIDIA DeepLearningExamples, ResNet-50 v1.5 PyTorch AMP, DGX-1 V100 16GB: 1200 img/s per GPU."""
    r = _sim(cluster={"server": "single-gpu", "servers": 1, "gpu": "v100-16gb"}, model="resnet50", batch=256,
             network="analytical")
    assert r.samples_per_s == pytest.approx(1200, rel=0.15)


@pytest.mark.parametrize("name,tp,pp,gpus,batch,published", [
    ("megatron-1.7b", 1, 1, 32, 512, 137), ("megatron-7.5b", 4, 1, 128, 512, 142)])
def test_megatron_throughput(name: str, tp: int, pp: int, gpus: int, batch: int, published: float) -> None:
    """Narayanan et al. SC'21 Table 1 (achieved TFLOP/s per GPU, A100, full recomputation), at the micro-batch
    Megatron-LM's script ran (16: ``examples/sc21/run_table_1.sh``, ``SC21_RUN``)."""
    r = _sim(cluster={"server": "nvswitch-8", "servers": gpus // 8,
                      "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
             model=name, batch=batch, plan={"tp": tp, "pp": pp, "micro_batch": 16, "recompute": "full"},
             network="analytical")
    assert r.tflops_per_gpu == pytest.approx(published, rel=0.15)


def test_megatron_core_h100_throughput() -> None:
    """Megatron-Core r0.8.0 on H100 (Megatron-LM README): 16B, TP4, 192 GPUs, 489.1 TFLOP/s per GPU. One of
    the rows Hopper's GEMM ceiling is fitted on (benchmarks/calibrate.py), so the band checks that the
    fit, the overlap options and the hierarchical ZeRO collectives stay where they were calibrated."""
    r = simulate(scenario_from_dict({**_validation().megatron_core_scenario(48, 6144, 32, 4, 1, 192, 192),
                                     "network": "analytical"}))
    assert r.tflops_per_gpu == pytest.approx(489.1, rel=0.15)


@pytest.mark.parametrize("label", ["TF1 20.06 DGX A100 40GB", "TF1 20.06 DGX-1 V100 32GB",
                                   "PyTorch 21.11 DGX A100 80GB", "PyTorch 21.11 DGX-1 V100 32GB"])
def test_bert_sequence_length_scaling(label: str) -> None:
    """BERT-large seq 512 over seq 128 throughput on 8 GPUs (DeepLearningExamples READMEs, same code and
    machine): TF1 (full-length records) 0.199 on DGX A100 40GB, 0.177 on DGX-1 V100 32GB; PyTorch 21.11
    (phase 2 through LDDL's 64-token length bins, topotrain.training.length_binning) 0.361 and 0.336.
    Nothing is fitted on these ratios; they check how attention and the per-token GEMMs scale with the
    sequence, and the padded lengths of the binned loader."""
    v = _validation()
    _, cluster, mb512, mb128, published, binning = next(r for r in v.BERT_SEQ_RATIOS if r[0] == label)
    assert v.bert_seq_ratio(cluster, mb512, mb128, binning=binning) == pytest.approx(published, rel=0.12)


# ---- bad input and CLI --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,needle", [
    ({"plan": {"dp": 3, "tp": 2}}, "product"),
    ({"batch": 10, "plan": {"micro_batch": 4}}, "divisible"),
    ({"model": "gpt3-175b", "batch": 8}, "needs"),
    ({"model": "resnet5000"}, "unknown model"),
    ({"plan": {"pipeline_schedule": "zigzag"}}, "pipeline_schedule"),
])
def test_bad_plans(kw: dict[str, Any], needle: str) -> None:
    d = {"cluster": DGX, "model": "resnet50", "batch": 64, **kw}
    with pytest.raises(ConfigError, match=needle):
        simulate(scenario_from_dict(d))


def test_cli_simulate_json_trace_and_overrides(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("cluster: {server: nvswitch-8, servers: 1}\nmodel: gpt3-1.3b\nbatch: 16\n"
                  "plan: {micro_batch: 2}\nnetwork: analytical\n")
    trace = tmp_path / "trace.json"
    res = CliRunner().invoke(app, ["simulate", str(sc), "--json", "--set", "plan.tp=2", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    for key in ("iteration_time_s", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu", "breakdown",
                "peak_memory_bytes"):
        assert key in d
    assert d["plan"]["tp"] == 2 and d["tokens_per_s"] == pytest.approx(d["samples_per_s"] * 2048)
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]  # complete events; metadata (M) and flows (s/f) aside
    assert spans and all(e["dur"] >= 0 for e in spans)
    bad = CliRunner().invoke(app, ["simulate", str(sc), "--set", "plan.tp=3"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "error:" in bad.output


def test_cli_scale_png(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("cluster: {server: eflops, servers: 1, network: {topology: single-switch, link: eth-100g}}\n"
                  "model: resnet50\nbatch: 512\nplan: {micro_batch: 64}\nnetwork: analytical\n")
    res = CliRunner().invoke(app, ["scale", str(sc), "--gpus", "8:32", "--json", "--png", str(tmp_path / "s.png")])
    assert res.exit_code == 0, res.output
    pts = json.loads(res.output)
    assert [p["gpus"] for p in pts] == [8, 16, 32]
    assert all(0 < p["efficiency"] <= 1.0 + 1e-9 for p in pts)
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_link_utilization_reported_and_bounded() -> None:
    cl = {"server": "eflops", "servers": 2, "network": {"topology": "single-switch", "link": "eth-100g"}}
    r = _sim(cluster=cl, model="resnet50", batch=16 * 64, plan={"micro_batch": 64})
    assert r.link_utilization_top, "a multi-server data-parallel run must load some link"
    assert all(0 < u <= 1.0 + 1e-9 for _, _, u in r.link_utilization_top)


def test_cli_profile_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["profile", "alexnet", "--method", "standin", "--batch", "1", "--repeats", "1",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "cpu" in res.output and json.loads(out.read_text())


def test_deterministic_bit_for_bit() -> None:
    kw = {"cluster": {"server": "eflops", "servers": 4, "network": {"topology": "bigraph", "switches": 4,
                                                                    "radix": 8, "link": "eth-100g"}},
          "model": "resnet50", "batch": 32 * 32, "plan": {"micro_batch": 32},
          "stragglers": {"lognormal_sigma": 0.05, "seed": 3}}
    a, b = (simulate(scenario_from_dict(kw)).to_dict() for _ in range(2))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_pipeline_sends_block_the_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-LM's 1F1B waits for each batched send/recv before the next compute: on every stage a
    compute task starts only after the send its previous compute issued has finished, so the transfer is
    exposed (iteration slower than with sends hidden on their own stream)."""
    from topotrain.training import builder

    kw: dict[str, Any] = {"cluster": {"server": "nvswitch-8", "servers": 2,
                                      "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
                          "model": "gpt3-1.3b", "batch": 64, "network": "analytical",
                          "plan": {"tp": 8, "pp": 2, "micro_batch": 1}}
    r = _sim(**kw)
    for stage in (0, 1):
        seq = [t for t in r.tasks if t.stage == stage and (t.stream.endswith("/compute") or t.category == "pp-comm")]
        seq.sort(key=lambda t: t.id)
        last_send_end = 0.0
        for t in seq:
            if t.category == "pp-comm":
                last_send_end = t.end_s
            else:
                assert t.start_s >= last_send_end - 1e-12
    sends = [t for t in r.tasks if t.category == "pp-comm" and t.end_s > t.start_s]
    assert sends
    monkeypatch.setattr(builder, "BLOCKING_P2P", False)
    hidden = _sim(**kw)
    assert hidden.iteration_time_s < r.iteration_time_s


def test_calibration_and_validation_subsets_are_declared_and_disjoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every published row is in exactly one declared subset; calibrate.py refuses to fit on a row of the
    validation subset (issue 17, calibration discipline)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    v = _validation()
    cal, val = v.calibration_cases(), v.validation_cases()
    names = [c.name for c in v.cases()]
    assert len(names) == len(set(names)) == len(cal) + len(val)
    assert {c.name for c in cal} == set(v.CALIBRATION_SUBSET) and not {c.name for c in cal} & {c.name for c in val}
    import importlib

    calibrate = importlib.import_module("calibrate")
    with pytest.raises(SystemExit, match="refusing"):
        calibrate.fit(val[:1], "conv_max_efficiency", 0.4, 0.9)
    undeclared = v.RatioCase("not declared", v.SKU_CLOCK_RATIO.numerator, v.SKU_CLOCK_RATIO.denominator, 1.2, "")
    with pytest.raises(SystemExit, match="refusing"):
        calibrate.fit_ratio(undeclared, "tensor_clock_fraction", 0.5, 1.0)


def test_sku_clock_ratio_is_the_fitted_calibration_ratio() -> None:
    """The DGX-1 V100's sustained tensor clock (0.80, hardware/gpus.py) reproduces the ratio it is fitted on:
    NVIDIA's PyTorch BERT 19.07, per-GPU throughput of a DGX-2H over a DGX-1 V100 32GB, 211.2 / 171.52 =
    1.231; at the boost clock the model gives 1.04 (the rated peaks' 1.05, less the DGX-2H's all-reduce)."""
    v = _validation()
    rc = v.SKU_CLOCK_RATIO
    assert rc.published == pytest.approx(3379.2 / 16 / 171.52)
    assert rc in v.CALIBRATION_RATIOS
    assert v.ratio_predicted(rc) == pytest.approx(rc.published, rel=0.01)
    assert v.ratio_predicted(rc, {"tensor_clock_fraction": 1.0}) == pytest.approx(1.04, abs=0.01)


def test_host_input_clock_and_rate() -> None:
    """The DataLoader workers' clock falls from the boost clock towards the base clock as the server's cores
    fill (one busy core per worker and per training process); their rate is workers × rate × clock."""
    from topotrain.training.host_input import HostInput

    h = HostInput(workers_per_gpu=8, cpu_cores=40, cpu_base_ghz=2.2, cpu_boost_ghz=3.6,
                  samples_per_s_per_worker_ghz=50.0)
    assert h.clock_ghz(1) == pytest.approx(3.6 - 1.4 * 9 / 40)
    assert h.clock_ghz(8) == pytest.approx(2.2)  # 72 busy processes on 40 cores: base clock
    assert h.samples_per_s_per_gpu(8) == pytest.approx(8 * 50.0 * 2.2)
    assert h.samples_per_s_per_gpu(1) > h.samples_per_s_per_gpu(4) > h.samples_per_s_per_gpu(8)
    with pytest.raises(ConfigError, match="cpu_boost_ghz"):
        HostInput(workers_per_gpu=8, cpu_cores=40, cpu_base_ghz=3.0, cpu_boost_ghz=2.0)


def test_host_input_bounds_the_iteration_only_when_slower() -> None:
    """A loader slower than the GPU sets the iteration time (batch / loader rate, the gap reported as
    ``input_stall_s``); a faster one changes nothing."""
    base = {"cluster": {"server": "single-gpu", "servers": 1, "gpu": "v100-16gb"}, "model": "resnet50",
            "batch": 256}
    gpu_only = simulate(scenario_from_dict(base))
    slow_in = {"workers_per_gpu": 2, "cpu_cores": 40, "cpu_base_ghz": 2.0, "cpu_boost_ghz": 2.0,
               "samples_per_s_per_worker_ghz": 100.0}  # 400 img/s, under the V100's ~1,150
    slow = simulate(scenario_from_dict({**base, "plan": {"host_input": slow_in}}))
    assert slow.samples_per_s == pytest.approx(400.0, rel=1e-9)
    assert slow.breakdown.input_stall_s == pytest.approx(slow.iteration_time_s - gpu_only.iteration_time_s)
    fast = simulate(scenario_from_dict({**base, "plan": {"host_input": {**slow_in, "workers_per_gpu": 16}}}))
    assert fast.iteration_time_s == gpu_only.iteration_time_s and fast.breakdown.input_stall_s == 0.0


def test_resnet50_scaling_inside_a_server_follows_the_host_input() -> None:
    """NVIDIA's published 1 → 8 GPU ResNet-50 AMP scaling inside a DGX A100 (16,621 / 2,470 = 6.73x) and a
    DGX-1 (8,322 / 1,200 = 6.94x), PyTorch 21.03 with CPU DataLoader workers: the model's ratio within
    ±8% (without the host input pipeline it predicts ~8x, +19% and +15%)."""
    v = _validation()
    by = {c.name: c for c in v.cases()}

    def rate(name: str) -> float:
        return simulate(scenario_from_dict(by[name].scenario)).samples_per_s

    for one, eight, published in (("ResNet-50 1xA100-80GB AMP b256", "ResNet-50 8xA100 DGX A100 b256", 16621 / 2470),
                                  ("ResNet-50 1xV100 AMP b256", "ResNet-50 8xV100 DGX-1 b256", 8322 / 1200)):
        assert rate(eight) / rate(one) == pytest.approx(published, rel=0.08)


def test_sc21_rows_follow_megatrons_own_table_1_script() -> None:
    """The SC'21 rows run as ``examples/sc21/run_table_1.sh`` ran them: its micro-batches, PyTorch DDP
    (overlapped) or Megatron's local DDP (after the backward), and its virtual pipeline stages."""
    from topotrain.validate.published import SC21_RUN, cases, megatron_virtual_stages

    assert [megatron_virtual_stages(layers, pp, n) for layers, pp, n in
            ((24, 1, None), (60, 4, 5), (80, 8, 5), (96, 16, 3), (105, 35, 1), (128, 64, None))] == [1, 3, 2, 2, 3, 1]
    rows = [c for c in cases() if c.name.startswith("Megatron ") and "TP" in c.name]
    assert len(rows) == len(SC21_RUN) == 10
    by_name = {c.name: c.scenario["plan"] for c in rows}
    assert by_name["Megatron 1.7B TP1 PP1 32 GPUs"]["micro_batch"] == 16
    assert by_name["Megatron 1.7B TP1 PP1 32 GPUs"]["overlap"] is True
    assert by_name["Megatron 1008.0B TP8 PP64 3072 GPUs"]["pipeline_schedule"] == "1f1b"
    assert by_name["Megatron 76.1B TP8 PP4 1024 GPUs"]["virtual_stages"] == 3
    assert by_name["Megatron 39.1B TP8 PP2 512 GPUs"]["overlap"] is False


def test_pytorch_bert_rows_step_once_per_accumulation() -> None:
    """The PyTorch BERT 21.11 rows are one optimizer step of the run: micro-batch × the README's accumulation
    steps per GPU (A100 256 × 32 and 32 × 128, DGX-1 V100 64 × 64), so the all-reduce and the optimizer are
    charged once per 32-128 micro-batches, not after every one."""
    from topotrain.validate.published import PYTORCH_BERT_ACCUMULATION, cases

    rows = {c.name: c.scenario for c in cases() if c.name in PYTORCH_BERT_ACCUMULATION}
    assert len(rows) == 4
    for name, sc in rows.items():
        micro, steps = PYTORCH_BERT_ACCUMULATION[name]
        gpus = 1 if name.startswith("BERT-large s128 1x") else 8
        assert sc["plan"]["micro_batch"] == micro and sc["batch"] == gpus * micro * steps, name
    one = simulate(scenario_from_dict({**rows["BERT-large s128 1xA100 b256"], "network": "analytical"}))
    opt = [t for t in one.tasks if t.category == "optimizer"]
    assert len(opt) == 1  # one LAMB/Adam step for 32 micro-batches


def test_llm_foundry_rows_follow_the_benchmark_sweep() -> None:
    """The LLM Foundry rows run the code the benchmark ran: ``sweep.py`` of commit 5e85bd62d gives 1b, 3b, 7b
    and 70b ``--attn_impl flash`` (flash-attn's unpadding around varlen attention) and 13b, 30b ``triton``;
    the A100 rows (``submit_benchmarks.py`` default ``triton``) no unpadding; Composer evaluates MPT's two
    training metrics on every row; the yamls set no ALiBi (learned positions)."""
    from topotrain.validate.published import FOUNDRY_TRITON_H100, cases

    rows = {c.name: c.scenario["model"] for c in cases() if c.name.startswith("LLM Foundry")}
    assert len(rows) == 10
    for name, model in rows.items():
        flash_h100 = "H100" in name and not any(f"{m} " in name for m in FOUNDRY_TRITON_H100)
        assert model.get("attention_unpad", False) is flash_h100, name
        assert model["logit_metrics"] == 2 and model.get("position", "learned") == "learned"
    assert sorted(n for n, m in rows.items() if m.get("attention_unpad")) == [
        f"LLM Foundry mpt-{s} 128xH100 FSDP" for s in ("1b", "3b", "70b", "7b")]


def test_gradient_accumulation_pass_per_micro_batch_after_the_first() -> None:
    """Autograd accumulates each micro-batch's gradients after the first into ``.grad`` in place: read both,
    write one, 3 x 2 bytes per parameter, at the optimizer's HBM efficiency. On one GPU (no communication)
    four micro-batches cost three such passes more than with Megatron's gradient-accumulation fusion; one
    micro-batch, FSDP and ZeRO-2 charge none."""
    from topotrain.hardware.gpus import get_gpu
    from topotrain.training.builder import OPTIMIZER_HBM_EFFICIENCY
    from topotrain.workload.zoo import get_model as get_workload

    kw: dict[str, Any] = {"cluster": {"server": "single-gpu", "servers": 1, "gpu": "a100-80gb"},
                          "model": "bert-large", "batch": 4 * 16, "network": "analytical"}
    plain = _sim(**kw, plan={"micro_batch": 16})
    fused = _sim(**kw, plan={"micro_batch": 16, "grad_accumulation_fusion": True})
    params = get_workload("bert-large").param_count
    one_pass = params * 6 / (get_gpu("a100-80gb").hbm_bandwidth_bytes_per_s * OPTIMIZER_HBM_EFFICIENCY)
    assert plain.iteration_time_s - fused.iteration_time_s == pytest.approx(3 * one_pass, rel=1e-6)
    single = {**kw, "batch": 16}
    assert _sim(**single, plan={"micro_batch": 16}).iteration_time_s == pytest.approx(
        _sim(**single, plan={"micro_batch": 16, "grad_accumulation_fusion": True}).iteration_time_s, rel=1e-12)
    eight = {**kw, "cluster": {"server": "nvswitch-8", "servers": 1}, "batch": 8 * 4 * 16}
    for sharded in ({"fsdp": True}, {"zero_stage": 2}):
        a = _sim(**eight, plan={"micro_batch": 16, **sharded})
        b = _sim(**eight, plan={"micro_batch": 16, "grad_accumulation_fusion": True, **sharded})
        assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-12)
