"""Issue 36, part 3 and `simulate` of a recorded step: the kernels an operator holds (FLOPs from the
Execution Trace's tensors, against closed forms), their re-timing on a GPU by the roofline, the data-parallel
resize against a real recording at the new size, the core-sharing what-if of gloo's collectives, and
`topotrain simulate` on a workload and on a scenario whose workload: names one (the shipped fixtures)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.compute.roofline import layer_time_s, params_for_gpu
from topotrain.hardware.gpus import get_gpu
from topotrain.traces.cluster import HostCluster, fit_host_cluster
from topotrain.traces.gpu import kernel_time_s, on_gpu
from topotrain.traces.importer import import_job
from topotrain.traces.model import Kernel, TraceJob, TraceOp, job_from_dict, job_to_dict, save_job
from topotrain.traces.readers import EtNode
from topotrain.traces.whatif import demand_share_scale, on_shared_host, resize, shared_host
from topotrain.traces.work import classify
from topotrain.training.replay import replay
from topotrain.training.replay_result import replay_band
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind

DATA = Path(__file__).resolve().parent / "data" / "traces"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "gpt-w2-on-h100.yaml"
H100 = get_gpu("h100-sxm")


@cache
def _job(name: str) -> TraceJob:
    return import_job(sorted((DATA / name).glob("rank*.json.gz")))


def _node(name: str, ins: tuple[int, ...], outs: tuple[int, ...], in_shapes: tuple = (), out_shapes: tuple = (),
          elem: int = 4) -> EtNode:
    return EtNode(1, name, 0, 1, frozenset(), frozenset(), (), ins, outs, in_shapes, out_shapes, elem)


# ---- kernels: FLOPs from the tensors ----

def test_gemm_from_element_counts_alone() -> None:
    """A trimmed ET has no shapes: a single GEMM's three element counts give M, N, K exactly."""
    k = classify(_node("aten::addmm", (384, 512 * 128, 128 * 384), (512 * 384,)), 1e-3)
    assert k is not None and k.kind == "linear" and k.dims == (1, 512, 384, 128)
    assert k.flops == 2 * 512 * 384 * 128
    assert k.bytes == 4 * (384 + 512 * 128 + 128 * 384 + 512 * 384)
    # counts no single GEMM has (a batched one): not guessed
    assert classify(_node("aten::mm", (6, 10), (7,)), 1e-3) is None
    assert classify(_node("aten::bmm", (8 * 64 * 32, 8 * 32 * 64), (8 * 64 * 64,)), 1e-3) is None


def test_shapes_give_batched_gemm_conv_and_attention() -> None:
    bmm = classify(_node("aten::bmm", (2048, 2048), (4096,), ((8, 16, 16), (8, 16, 32)), ((8, 16, 32),)), 1e-3)
    assert bmm is not None and bmm.kind == "matmul" and bmm.dims == (8, 16, 32, 16)
    assert bmm.flops == 2 * 8 * 16 * 32 * 16
    lin = classify(_node("aten::linear", (64 * 8 * 128, 384 * 128, 384), (64 * 8 * 384,),
                         ((64, 8, 128), (384, 128), (384,))), 1e-3)
    assert lin is not None and lin.dims == (1, 512, 384, 128)
    # conv 3x3, 16 -> 32 channels, batch 4 at 8x8: implicit GEMM M = 4*8*8, N = 32, K = 16*9
    conv = classify(_node("aten::convolution", (4 * 16 * 64, 32 * 16 * 9), (4 * 32 * 64,),
                          ((4, 16, 8, 8), (32, 16, 3, 3)), ((4, 32, 8, 8),)), 1e-3)
    assert conv is not None and conv.kind == "conv" and conv.dims == (1, 256, 32, 144)
    assert conv.flops == 2 * 256 * 32 * 144
    bwd = classify(_node("aten::convolution_backward", (4 * 32 * 64, 4 * 16 * 64, 32 * 16 * 9),
                         (4 * 16 * 64, 32 * 16 * 9), ((4, 32, 8, 8), (4, 16, 8, 8), (32, 16, 3, 3))), 1e-3)
    assert bwd is not None and bwd.flops == 2 * conv.flops and bwd.backward  # input and weight gradients
    q = (8, 4, 64, 32)
    att = classify(_node("aten::_scaled_dot_product_flash_attention_for_cpu", (65536,) * 3, (65536, 2048),
                         (q, q, q)), 1e-3)
    assert att is not None and att.kind == "attention" and att.flops == 4 * 32 * 64 * 64 * 32
    back = classify(_node("aten::_scaled_dot_product_flash_attention_for_cpu_backward", (65536,) * 6, (65536,) * 3,
                          (q, q, q, q, q, (8, 4, 64))), 1e-3)
    assert back is not None and back.backward and back.flops == 2.5 * att.flops
    # element-wise: one FLOP per output element, every tensor's bytes
    launch = classify(_node("c10d::allreduce_", (1000,), (1000,)), 1e-3)
    assert launch is not None and launch.kind == "launch" and launch.flops == 0
    add = classify(_node("aten::add_", (1000, 1000), (1000,)), 1e-3)
    assert add is not None and add.kind == "elementwise" and add.flops == 1000 and add.bytes == 4 * 3000
    assert classify(_node("aten::some_custom_op", (10,), (10,)), 1e-3) is None


def test_gpt_fixture_gemm_flops_match_the_model() -> None:
    """The GPT fixture (trimmed ET: no shapes): the GEMM kernels of one rank's step do 3 × the forward
    GEMM FLOPs of benchmarks/trace_record.py's TinyGPT (forward, input gradient, weight gradient), in closed
    form: 512 tokens through 2 blocks (qkv 128→384, out 128→128, MLP 128→512→128) and the 128→512 head."""
    tokens, d, vocab = 8 * 64, 128, 512
    fwd = 2 * tokens * (2 * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + d * vocab)
    for rank in _job("gpt-w2").ranks:
        gemm = sum(k.flops for o in rank.ops for k in o.kernels if k.kind == "linear")
        assert gemm == 3 * fwd


def test_conv_and_attention_flops_of_real_traces_with_shapes() -> None:
    """Fixtures recorded with ET shapes (benchmarks/trace_record.py --trim now keeps them): the TinyResNet's
    convolutions do their forward implicit-GEMM FLOPs, twice that backward (input and weight gradients) but
    once for the stem (its input needs no gradient); the TinyGPT's fused attention 4·B·H·S²·D forward and 2.5
    times that backward, its GEMMs 3 × the forward closed form, as from element counts."""
    def conv(m: int, n: int, k: int) -> int:
        return 2 * m * n * k
    stem = conv(8 * 32 * 32, 16, 3 * 9)
    fwd = (stem + 2 * conv(8192, 16, 144) + conv(2048, 32, 144) + conv(2048, 32, 288) + conv(2048, 32, 16)
           + conv(512, 64, 288) + conv(512, 64, 576) + conv(512, 64, 32))
    resnet = _job("resnet-shapes-w2")
    for rank in resnet.ranks:
        ks = [k for o in rank.ops for k in o.kernels if k.kind == "conv"]
        assert len(ks) == 18 and sum(k.flops for k in ks) == 3 * fwd - stem
    gpt = _job("gpt-shapes-w2")
    tokens, d, vocab = 8 * 64, 128, 512
    for rank in gpt.ranks:
        att = [k for o in rank.ops for k in o.kernels if k.kind == "attention"]
        assert sum(k.flops for k in att) == 2 * (1 + 2.5) * 4 * (8 * 4) * 64 * 64 * 32  # 2 blocks, B·H = 32
        gemm = sum(k.flops for o in rank.ops for k in o.kernels if k.kind == "linear")
        assert gemm == 3 * 2 * tokens * (2 * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + d * vocab)
    _, rep = on_gpu(resnet, H100)
    assert rep.rescaled_fraction > 0.5 and "conv" in rep.to_dict()["kinds"]


def test_kernels_round_trip_through_the_workload_json(tmp_path: Path) -> None:
    job = _job("gpt-w2")
    assert sum(len(o.kernels) for o in job.ranks[0].ops) > 100
    back = job_from_dict(json.loads(json.dumps(job_to_dict(job))))
    assert back == job
    d = job_to_dict(job)
    d["ranks"][0]["ops"][1]["kernels"][0] = ["linear", "aten::mm", -1.0, 1.0, 1.0, [], 4, False]
    with pytest.raises(ConfigError) as e:
        job_from_dict(d)
    assert "ranks[0].ops[1].kernels[0]" in e.value.field


# ---- re-timing on a GPU ----

def test_kernel_time_is_the_roofline_of_its_layer() -> None:
    k = Kernel("linear", "aten::mm", 1e-3, 2.0 * 512 * 384 * 128, 4.0 * (512 * 128 + 128 * 384 + 512 * 384),
               (1, 512, 384, 128), 4)
    layer = Layer("mm", LayerKind.LINEAR, k.flops, k.flops, k.bytes, k.bytes, gemm_shape=(512, 384, 128))
    assert kernel_time_s(k, H100) == layer_time_s(layer, H100, 1, phase="fwd", dtype="fp32")
    assert kernel_time_s(Kernel("launch", "c10d::allreduce_", 5e-3, 0.0, 0.0), H100) == \
        params_for_gpu(H100).kernel_launch_overhead_s
    big = Kernel("elementwise", "aten::add_", 1e-3, 1e8, 1.2e9, (), 4)
    assert kernel_time_s(big, H100) >= 1.2e9 / H100.hbm_bandwidth_bytes_per_s  # memory-bound


def test_on_gpu_keeps_what_it_does_not_know_and_reports_the_shares() -> None:
    job = _job("gpt-w2")
    gpu_job, rep = on_gpu(job, H100)
    for old_rank, new_rank in zip(job.ranks, gpu_job.ranks, strict=True):
        for old, new in zip(old_rank.ops, new_rank.ops, strict=True):
            if not old.kernels:
                assert new == old  # unrecognized: measured time kept
                continue
            covered = min(old.duration_s, sum(k.measured_s for k in old.kernels))
            want = sum(kernel_time_s(k, H100) for k in old.kernels) + old.duration_s - covered
            assert new.duration_s == pytest.approx(want, rel=1e-12)
            ratio = new.duration_s / old.duration_s
            assert [at for _, at in new.launches] == pytest.approx([at * ratio for _, at in old.launches])
            assert new.host_gap_s == old.host_gap_s
    total = sum(r.op_s + r.host_gap_s for r in job.ranks)
    assert rep.measured_s == pytest.approx(total, rel=1e-9)
    d = rep.to_dict()
    shares = sum(v["fraction_of_measured"] for v in d["kinds"].values()) + d["kept"]["fraction_of_measured"]
    assert shares == pytest.approx(1.0)
    assert 0.4 < rep.rescaled_fraction < 0.7 and {"linear", "elementwise", "norm"} <= set(d["kinds"])
    assert sum(r.op_s for r in gpu_job.ranks) < 0.6 * sum(r.op_s for r in job.ranks)
    bare = TraceJob(1, "gloo", (job.ranks[0].__class__(0, 0.0, 1.0, (TraceOp("x", 1.0),), ""),), (), 1.0)
    with pytest.raises(ConfigError, match="no operator the compute model knows"):
        on_gpu(bare, H100)


# ---- data-parallel what-if ----

def test_ddp_resize_gives_the_buckets_a_real_4_process_run_has() -> None:
    """DDP buckets do not depend on the world size: gpt-w2 resized to 4 ranks has exactly the collectives
    (op, bytes, group) the 4-process recording of the same job has."""
    small, big = _job("gpt-w2"), _job("gpt-w4")
    r = resize(small, 4)
    assert [(c.op, c.size_bytes, c.ranks) for c in r.collectives] == \
        [(c.op, c.size_bytes, c.ranks) for c in big.collectives]


def test_fsdp_resize_keeps_the_full_unit_size_over_a_bigger_group() -> None:
    """FSDP's all-gather (output) and reduce-scatter (input) are the whole unit in nccl-tests' convention:
    resized, each keeps its bytes and spans the new group (each rank's shard is S/n in the ring)."""
    job = _job("gpt-fsdp-w2")
    r = resize(job, 4)
    assert {c.op for c in r.collectives} == {"allgather", "reduce-scatter"}
    assert [c.size_bytes for c in r.collectives] == [c.size_bytes for c in job.collectives]
    assert all(c.ranks == (0, 1, 2, 3) for c in r.collectives)


def test_shared_cores_slow_gloo_collectives_as_the_operators() -> None:
    host = HostCluster("h", 2e8, 1e-6, 2e-5)
    s = shared_host(host, 2.0)
    assert (s.bandwidth_bytes_per_s, s.message_overhead_s, s.latency_s) == (1e8, 4e-5, 1e-6)
    assert shared_host(host, 1.0) is host


# ---- simulate ----

def _simulate(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["simulate", *args])
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wl") / "gpt-w2.workload.json"
    save_job(_job("gpt-w2"), path)
    return path


def test_simulate_a_workload_is_its_replay(workload: Path) -> None:
    code, out = _simulate(str(workload), "--json")
    assert code == 0, out
    d = json.loads(out)
    r = replay(_job("gpt-w2"), fit_host_cluster(_job("gpt-w2")))
    assert d["iteration_time_s"] == pytest.approx(r.step_s, rel=1e-12)
    b = d["breakdown"]
    assert b["compute_s"] + b["exposed_comm_s"] + b["bubble_s"] == pytest.approx(d["iteration_time_s"], rel=1e-9)
    assert d["error_band"]["regime"] == "trace-replay/recording-host" and d["error_band"]["from_rows"] >= 20
    assert d["trace"]["measured_step_s"] == pytest.approx(_job("gpt-w2").measured_step_s)
    assert d["gpus"] == 2 and d["plan"]["dp"] == 2 and d["samples_per_s"] is None  # the trace has no batch
    perfetto = workload.with_name("replay.trace.json")
    code, out = _simulate(str(workload), "--trace", str(perfetto))
    assert code == 0 and "recorded step" in out and "trace-replay/recording-host" in out
    events = json.loads(perfetto.read_text())["traceEvents"]
    assert sum(e.get("ph") == "X" for e in events) >= len(r.tasks) // 2
    code, out = _simulate(str(workload), "--json", "--set", "workload.world=4", "--set", "workload.cores=2")
    d4 = json.loads(out)
    job, host = _job("gpt-w2"), fit_host_cluster(_job("gpt-w2"))
    # the operators share the 2 cores with gloo's collectives: more than processor sharing's ×2
    assert d4["gpus"] == 4 and d4["trace"]["compute_scale"] == pytest.approx(demand_share_scale(job, 4, host, 2))
    assert d4["trace"]["compute_scale"] > 2.0
    assert d4["iteration_time_s"] == pytest.approx(replay(*on_shared_host(job, 4, host, 2)).step_s, rel=1e-12)
    assert d4["error_band"]["regime"] == "trace-replay/what-if-world"


def test_simulate_a_scenario_with_a_trace_workload() -> None:
    code, out = _simulate(str(EXAMPLE), "--json", "--set", "network=analytical")
    assert code == 0, out
    d = json.loads(out)
    assert d["gpus"] == 8 and d["gpu"] == "h100" and d["comm"]["library"] == "nccl"
    assert d["error_band"]["plus_minus"] is None or d["error_band"]["plus_minus"] == float("inf")
    rs = d["trace"]["rescale"]
    assert 0.4 < rs["rescaled_fraction"] < 0.7 and rs["gpu"] == "h100"
    assert d["samples_per_s"] == pytest.approx(64 / d["iteration_time_s"])
    assert 0 < d["mfu"] < 1
    # the same with the operators as measured is slower (CPU operators on the GPU cluster)
    code, out = _simulate(str(EXAMPLE), "--json", "--set", "network=analytical", "--set", "workload.compute=measured")
    assert code == 0 and json.loads(out)["iteration_time_s"] > d["iteration_time_s"]


@pytest.mark.parametrize(("sets", "field", "says"), [
    (["workload.world=4"], "workload.world", "workload.world: 8"),
    (["~workload.world"], "cluster", "--set workload.world=8"),
    (["batch=64"], "batch", "not used with a trace workload"),
    (["plan.tp=2"], "plan.tp", "only plan.dp_algorithm"),
    (["workload.compute=fast"], "workload.compute", "gpu"),
    (["workload.trace=nowhere.workload.json"], "workload.trace", "does not exist"),
    (["workload.cores=2"], "workload.cores", "remove it"),
])
def test_simulate_trace_mismatches_are_one_line(sets: list[str], field: str, says: str) -> None:
    args = [x for s in sets for x in ("--set", s)]
    code, out = _simulate(str(EXAMPLE), *args)
    assert code == 2, out
    assert f"error: {field}" in out and says in out
    assert "Traceback" not in out


def test_simulate_a_chakra_file_takes_its_whole_job() -> None:
    chakra = EXAMPLE.parent.parent / "chakra" / "gpt-w2.1.et"
    code, out = _simulate(str(chakra), "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["gpus"] == 2 and d["trace"]["measured_step_s"] == pytest.approx(_job("gpt-w2").measured_step_s)


def test_simulate_trace_refuses_what_needs_a_model(workload: Path) -> None:
    code, out = _simulate(str(workload), "--html", str(workload.with_suffix(".html")))
    assert code == 2 and "--html" in out
    for verb in ("report", "scale"):
        res = CliRunner().invoke(app, [verb, str(EXAMPLE)])
        assert res.exit_code == 2 and "is a recorded step" in res.output and "topotrain simulate" in res.output
    code, out = _simulate(str(workload), "--set", "workload.compute=gpu")
    assert code == 2 and "needs a GPU" in out


def test_band_of_each_replay_kind() -> None:
    assert replay_band("host").factor < 1.1  # 80% of the recorded replays within a few %
    assert replay_band("elsewhere").factor == float("inf")
