"""plan.framework: each framework's mechanisms (training/framework.py, read from its code) checked on tiny plans
against closed forms computed apart from the iteration (the collective API, the HBM pass formula)."""

from __future__ import annotations

from typing import Any

import pytest

from topotrain.api import time_collective
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.builder import OPTIMIZER_HBM_EFFICIENCY
from topotrain.training.engine import Task
from topotrain.training.framework import (
    DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS,
    HP_GRAD_UPDATE_BYTES,
    MCORE_MIN_BUCKET_ELEMENTS,
    tied_embedding_elements,
)
from topotrain.training.simulate import Result, simulate
from topotrain.util.errors import ConfigError
from topotrain.workload.zoo import get_model

ONE_SERVER = {"server": "nvswitch-8", "servers": 1}


def _scenario(plan: dict[str, Any], model: str = "gpt3-125m", batch: int = 8) -> dict[str, Any]:
    return {"cluster": ONE_SERVER, "model": model, "batch": batch, "network": "analytical",
            "plan": {"dp_algorithm": "ring", **plan}}


def _run(plan: dict[str, Any], **kw: Any) -> tuple[Result, Any]:
    sc = scenario_from_dict(_scenario(plan, **kw))
    return simulate(sc), sc


def _named(r: Result, prefix: str, stage: int | None = None) -> list[Task]:
    return [t for t in r.tasks if t.name.startswith(prefix) and (stage is None or t.stage == stage)]


def _pass_s(sc: Any, size_bytes: float) -> float:
    """One read-and-write HBM pass over ``size_bytes`` (the builder's memory-bound pass formula)."""
    return 2.0 * size_bytes / (sc.cluster.gpu_spec.hbm_bandwidth_bytes_per_s * OPTIMIZER_HBM_EFFICIENCY)


def _ranks(sc: Any, stage: int = 0) -> list[str]:
    plan, gpus = sc.plan, sc.cluster.topology.gpus
    return [gpus[plan.rank(d, 0, stage)] for d in range(plan.dp)]


@pytest.mark.parametrize("fw,passes,extra", [("deepspeed", 3, {}), ("megatron-lm-2021", 3, {}),
                                             ("megatron-lm-2021", 1, {"grad_reduce_dtype": "fp32"})])
def test_reduce_after_backward_adds_its_full_time(fw: str, passes: int, extra: dict[str, Any]) -> None:
    """DeepSpeed's ReduceGrads / Megatron-LM 2021's allreduce_gradients run after the last backward: the
    optimizer starts the collective's own time (timed alone by the collective API) plus the framework's
    copy passes over the bucket after the backward ends. Without a framework the reduce overlaps it."""
    r, sc = _run({"dp": 8, "micro_batch": 1, "framework": fw, **extra})
    (bwd,) = _named(r, "B0")
    (ar,) = _named(r, "allreduce grads")
    (opt,) = _named(r, "optimizer")
    size = ar.comm.schedules[0].size_bytes  # type: ignore[union-attr]
    params = sum(lay.param_count for lay in sc.model.layers)
    width = 4 if extra else 2  # one bucket: 125M < 5e8 elements, of bf16 (fp32: the contiguous buffer) gradients
    assert size == pytest.approx(params * width, rel=1e-6)
    t_ar = time_collective(sc.cluster, "allreduce", "ring", size, network="analytical", ranks=_ranks(sc)).time_s
    assert ar.end_s - ar.start_s == pytest.approx(t_ar, rel=1e-9)
    assert ar.start_s >= bwd.end_s
    assert opt.start_s - bwd.end_s == pytest.approx(t_ar + passes * _pass_s(sc, size), rel=1e-6)
    base, _ = _run({"dp": 8, "micro_batch": 1})
    assert min(t.start_s for t in _named(base, "allreduce grads")) < max(t.end_s for t in _named(base, "B0"))


def test_deepspeed_bucket_is_5e8_elements_and_mcore_buckets_follow_dp() -> None:
    """DeepSpeed's MEMORY_OPT_ALLREDUCE_SIZE, in fp32 gradients with grad_reduce_dtype fp32 (BF16_Optimizer);
    Megatron-Core's max(40M, 1M·dp) elements on the first pipeline stage, one bucket on the others."""
    r, sc = _run({"dp": 8, "micro_batch": 1, "framework": "deepspeed", "grad_reduce_dtype": "fp32"})
    params = sum(lay.param_count for lay in sc.model.layers)
    (ar,) = _named(r, "allreduce grads")
    assert ar.comm.schedules[0].size_bytes == pytest.approx(4 * params, rel=1e-6)  # type: ignore[union-attr]
    assert params < DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS
    r, _ = _run({"dp": 4, "pp": 2, "micro_batch": 1, "framework": "megatron-core"}, model="gpt3-1.3b", batch=16)
    first = [t.comm.schedules[0].size_bytes for t in _named(r, "allreduce grads", 0)]  # type: ignore[union-attr]
    last = _named(r, "allreduce grads", 1)
    assert len(last) == 1 and len(first) > 1
    assert all(b >= 2 * MCORE_MIN_BUCKET_ELEMENTS for b in first[:-1])
    assert all(b < 2 * MCORE_MIN_BUCKET_ELEMENTS + 2 * 2048 * 4 * 2048 * 2 for b in first[:-1])  # + one MLP GEMM
    r, _ = _run({"dp": 4, "pp": 2, "micro_batch": 1, "framework": "megatron-core", "overlap": False},
                model="gpt3-1.3b", batch=16)
    assert len(_named(r, "allreduce grads", 0)) == 1  # overlap_grad_reduce off: bucket_size None


def test_hp_grad_update_every_micro_batch() -> None:
    """BF16_Optimizer adds each micro-batch's bf16 gradients into fp32 ones: 10 bytes per local parameter
    per backward, the first micro-batch included (autograd accumulation charges only the later ones)."""
    plan = {"dp": 8, "micro_batch": 1, "framework": "deepspeed"}
    r_bf16, sc = _run(plan, batch=16)
    r_fp32, _ = _run({**plan, "grad_reduce_dtype": "fp32"}, batch=16)
    params = sum(lay.param_count for lay in sc.model.layers)
    hbm = sc.cluster.gpu_spec.hbm_bandwidth_bytes_per_s * OPTIMIZER_HBM_EFFICIENCY
    for m, before in ((0, 0.0), (1, 3 * 2 * params / hbm)):  # micro-batch 1: autograd's 3·2 bytes per param
        (b16,) = _named(r_bf16, f"B{m}")
        (b32,) = _named(r_fp32, f"B{m}")
        assert (b32.end_s - b32.start_s) - (b16.end_s - b16.start_s) == pytest.approx(
            HP_GRAD_UPDATE_BYTES * params / hbm - before, rel=1e-6)


def test_deepspeed_zero1_allreduces_with_bf16_optimizer() -> None:
    """ZeRO-1 in DeepSpeed's pipeline engine: BF16_Optimizer (bf16, fp32 accumulation) allreduces, then
    all-gathers the updated shards; otherwise the partitions are reduced (a reduce-scatter)."""
    plan = {"dp": 8, "micro_batch": 1, "framework": "deepspeed", "zero_stage": 1}
    r, _ = _run({**plan, "grad_reduce_dtype": "fp32"})
    assert _named(r, "allreduce grads") and not _named(r, "reduce-scatter grads") and _named(r, "allgather params")
    r, _ = _run(plan)
    assert not _named(r, "allreduce grads") and _named(r, "reduce-scatter grads")


@pytest.mark.parametrize("fw", ["deepspeed", "megatron-core", "megatron-lm-2021"])
def test_tied_embedding_gradient_allreduce(fw: str) -> None:
    """The first and last pipeline stages allreduce the shared word embedding's gradient (vocab·h/tp
    elements per tensor rank), before the data-parallel reduce in DeepSpeed, after it in Megatron; the
    optimizers of both stages wait for it. Timed alone as a 2-rank ring allreduce."""
    r, sc = _run({"tp": 4, "pp": 2, "micro_batch": 1, "framework": fw})
    (tied,) = _named(r, "allreduce tied grads")
    model = sc.model
    size = model.vocab * model.hidden // 4 * 2
    scheds = tied.comm.schedules  # type: ignore[union-attr]
    assert len(scheds) == 4 and scheds[0].size_bytes == size
    gpus, plan = sc.cluster.topology.gpus, sc.plan
    pair = [gpus[plan.rank(0, 0, 0)], gpus[plan.rank(0, 0, 1)]]
    t = time_collective(sc.cluster, "allreduce", "ring", size, network="analytical", ranks=pair).time_s
    assert tied.end_s - tied.start_s == pytest.approx(t, rel=1e-9)
    for s in (0, 1):
        (opt,) = _named(r, "optimizer", s)
        assert opt.start_s >= tied.end_s
    base, _ = _run({"tp": 4, "pp": 2, "micro_batch": 1})
    assert not _named(base, "allreduce tied grads")
    assert tied_embedding_elements(get_model("llama2-7b")) == 0  # untied: nothing to allreduce
    assert tied_embedding_elements(model) == model.vocab * model.hidden


def test_deepspeed_pipeline_exchanges_never_overlap() -> None:
    """DeepSpeed's blocking send/recv instructions: activations and gradients between two stages run one at a
    time, in program order, so an activation waits for the gradient exchange before it (``RecvGrad`` then
    ``SendActivation`` in one step of ``TrainSchedule``); Megatron sends each activation when its forward ends."""
    plan = {"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1}
    for fw in ("deepspeed", "megatron-core"):
        r, _ = _run({**plan, "framework": fw}, model="gpt3-1.3b", batch=32)
        sends = [t for t in r.tasks if t.category == "pp-comm" and t.end_s > t.start_s]
        spans = sorted((t.start_s, t.end_s) for t in sends)
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(spans, spans[1:], strict=False)) or fw != "deepspeed"
        waits = [t.start_s - r.tasks[t.deps[0]].end_s for t in sends if t.name.startswith("send act")]
        if fw == "deepspeed":
            assert max(waits) > 0.0 and len({t.stream for t in sends}) == 1
        else:
            assert max(waits) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("plan,needle", [
    ({"framework": "megatron"}, "plan.framework: unknown value 'megatron' (did you mean 'megatron-core'? known: "
                                "megatron-core, megatron-lm-2021, deepspeed, fsdp, hsdp)"),
    ({"framework": "deepspeed", "zero_stage": 2}, "plan.framework: deepspeed models DeepSpeed's pipeline engine"),
    ({"framework": "megatron-core", "bucket": "10MiB"}, "plan.bucket: framework megatron-core sets its own"),
])
def test_bad_framework_is_one_line(plan: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_scenario(plan))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
