"""Memory per GPU against ZeRO's Figure 1 and Korthikanti et al.'s activation formulas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topotrain.training.memory import (
    MemoryBreakdown,
    MemoryPlan,
    check_fits,
    korthikanti_activation_bytes,
    memory_per_rank,
    memory_per_stage,
    memory_plan_from,
    zero_model_states_bytes,
)
from topotrain.training.plan import Plan
from topotrain.util.errors import ConfigError
from topotrain.workload.cnn import resnet50
from topotrain.workload.layer import Layer, LayerKind, Model
from topotrain.workload.transformer import transformer
from topotrain.workload.zoo import get_model

GB = 1e9
GIB = 2.0**30
S, H, A = 2048, 12288, 96  # GPT-3 175B (Brown et al. 2020): sequence, hidden, heads
SBH = S * H  # per sequence (b = 1)


@pytest.fixture(scope="module")
def psi() -> Model:
    """A 7.5B-parameter model with no activations: ZeRO's Figure 1 example."""
    return Model("psi-7.5b", (Layer("w", LayerKind.LINEAR, 0.0, 0.0, 0.0, 0.0, param_count=7_500_000_000),))


@pytest.fixture(scope="module")
def gpt3() -> Model:
    """GPT-3 175B as in Korthikanti et al. (with dropout, unfused attention)."""
    return transformer("gpt3-175b", layers=96, hidden=H, heads=A, seq_len=S, vocab=51200, dropout=True)


# ---- ZeRO ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("stage", "expect_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure1(psi: Model, stage: int, expect_gb: float) -> None:
    # Rajbhandari et al., SC'20, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12
    b = memory_per_rank(psi, MemoryPlan(dp=64, zero_stage=stage))
    assert b.model_states_bytes / GB == pytest.approx(expect_gb, abs=0.05)
    assert zero_model_states_bytes(7.5e9, 64, stage) / GB == pytest.approx(expect_gb, abs=0.05)
    assert b.activations_bytes == 0.0


def test_zero_fields_shard_in_order(psi: Model) -> None:
    plans = [MemoryPlan(dp=64, zero_stage=s) for s in range(4)]
    b0, b1, b2, b3 = (memory_per_rank(psi, p) for p in plans)
    assert (b0.weights_bytes, b0.gradients_bytes, b0.optimizer_bytes) == (15e9, 15e9, 90e9)
    assert b1.optimizer_bytes == pytest.approx(90e9 / 64) and b1.gradients_bytes == 15e9
    assert b2.gradients_bytes == pytest.approx(15e9 / 64) and b2.weights_bytes == 15e9
    assert b3.weights_bytes == pytest.approx(15e9 / 64)
    assert b3.transient_bytes == pytest.approx(15e9)  # the one FSDP unit all-gathered for compute
    fsdp = memory_per_rank(psi, MemoryPlan(dp=64, fsdp=True))
    assert fsdp == b3


def test_sgd_and_fp32_optimizer_bytes() -> None:
    lay = Layer("w", LayerKind.LINEAR, 0.0, 0.0, 0.0, 0.0, param_count=1000)
    mixed = Model("m", (lay,), dtype=2)
    fp32 = Model("f", (lay,), dtype=4)
    assert memory_per_rank(mixed, MemoryPlan(optimizer="sgd")).optimizer_bytes == 8000
    assert memory_per_rank(fp32, MemoryPlan(optimizer="sgd")).optimizer_bytes == 4000
    b = memory_per_rank(fp32, MemoryPlan())
    assert (b.weights_bytes, b.gradients_bytes, b.optimizer_bytes) == (4000, 4000, 8000)


def test_gpt3_model_states_with_tp_pp(gpt3: Model) -> None:
    # TP=8 × PP=8: each GPU holds ≈ Ψ/64 parameters, 16 bytes each without ZeRO
    stages = memory_per_stage(gpt3, MemoryPlan(tp=8, pp=8, dp=1))
    total_params = sum(s.weights_bytes for s in stages) / 2 * 8
    assert total_params == pytest.approx(gpt3.param_count, rel=0.01)  # + the tied head copy on the last stage
    for s in stages:
        assert s.model_states_bytes == pytest.approx(16 * gpt3.param_count / 64, rel=0.06)


# ---- activations: Korthikanti et al. ---------------------------------------------------------------------
@pytest.mark.parametrize(("tp", "sp", "recompute", "coeff"), [
    (1, False, "none", 34 + 5 * A * S / H),                 # 114 → 2.87 GB per layer
    (8, False, "none", 10 + 24 / 8 + 5 * A * S / (H * 8)),  # 23
    (8, True, "none", 34 / 8 + 5 * A * S / (H * 8)),        # 14.25
    (8, False, "selective", 10 + 24 / 8),                    # 13
    (8, True, "selective", 34 / 8),                          # 4.25
    (8, False, "full", 2.0),
    (8, True, "full", 2.0 / 8),
])
def test_korthikanti_per_layer(gpt3: Model, tp: int, sp: bool, recompute: str, coeff: float) -> None:
    closed = korthikanti_activation_bytes(S, 1, H, A, tp=tp, sequence_parallel=sp, recompute=recompute)
    assert closed == pytest.approx(SBH * coeff)
    # layer by layer: a middle stage of PP=8 holds 12 layers × (8 − 1) micro-batches in flight (1F1B)
    plan = MemoryPlan(tp=tp, pp=8, sequence_parallel=sp, recompute=recompute, micro_batch=1, num_micro_batches=64)
    mid = memory_per_stage(gpt3, plan)[1]
    assert mid.activations_bytes == pytest.approx(12 * 7 * closed, rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_sp_without_regather_stores_gathered_inputs(gpt3: Model, recompute: str) -> None:
    """Sequence parallelism without the backward re-gather keeps the QKV and MLP-up inputs gathered: each
    2sbh instead of 2sbh/t, so 4sbh·(1 − 1/t) more per layer, closed form and layer by layer alike."""
    kw = {"tp": 8, "sequence_parallel": True, "recompute": recompute}
    on = korthikanti_activation_bytes(S, 1, H, A, **kw)  # type: ignore[arg-type]
    off = korthikanti_activation_bytes(S, 1, H, A, sp_regather=False, **kw)  # type: ignore[arg-type]
    assert off - on == pytest.approx(4 * SBH * (1 - 1 / 8))
    plan = MemoryPlan(tp=8, pp=8, sequence_parallel=True, sp_regather=False, recompute=recompute, micro_batch=1,
                      num_micro_batches=64)
    assert memory_per_stage(gpt3, plan)[1].activations_bytes == pytest.approx(12 * 7 * off, rel=1e-9)


def test_korthikanti_gpt3_numbers() -> None:
    # §4: GPT-3 per layer, b = 1: 2.87 GB unparallelized; with t = 8 + SP + selective recompute 0.107 GB
    assert korthikanti_activation_bytes(S, 1, H, A) / GB == pytest.approx(2.869, abs=0.001)
    assert korthikanti_activation_bytes(S, 1, H, A, tp=8, sequence_parallel=True,
                                        recompute="selective") / GB == pytest.approx(0.107, abs=0.001)
    assert korthikanti_activation_bytes(S, 4, H, A) == pytest.approx(4 * korthikanti_activation_bytes(S, 1, H, A))


def test_pipeline_schedules_first_stage(gpt3: Model) -> None:
    base = MemoryPlan(tp=8, pp=8, sequence_parallel=True, recompute="selective", micro_batch=1, num_micro_batches=64)
    per_layer = korthikanti_activation_bytes(S, 1, H, A, tp=8, sequence_parallel=True, recompute="selective")
    first = memory_per_stage(gpt3, base)[0]
    blocks_only = first.activations_bytes - 8 * _non_block_stash(gpt3, base)
    assert blocks_only == pytest.approx(96 * per_layer)  # 1F1B: L layers' worth on the first stage
    gpipe = memory_per_stage(gpt3, replace(base, pipeline_schedule="gpipe"))[1]
    assert gpipe.activations_bytes == pytest.approx(12 * 64 * per_layer)  # all micro-batches
    inter = replace(base, pipeline_schedule="interleaved", virtual_stages=3)
    first_i = memory_per_stage(gpt3, inter)[0]
    blocks_only = first_i.activations_bytes - _non_block_stash(gpt3, inter) * (8 * 3 + 8 - 1) / 3
    assert blocks_only == pytest.approx(96 * per_layer * (1 + 7 / (8 * 3)))  # Korthikanti §4.2.3
    last = memory_per_stage(gpt3, base)[7]
    assert last.activations_bytes < first.activations_bytes / 4  # one micro-batch in flight


def _non_block_stash(model: Model, plan: MemoryPlan) -> float:
    """Per-micro-batch stash of the embedding layers on the first stage (replicated: /tp only with SP)."""
    t = plan.tp if plan.sequence_parallel else 1
    first_block = next(i for i, lay in enumerate(model.layers) if lay.block >= 0)
    return sum(lay.activation_bytes for lay in model.layers[:first_block]) / t * plan.micro_batch


def test_full_recompute_transient_is_one_layer(gpt3: Model) -> None:
    plan = MemoryPlan(tp=8, pp=8, recompute="full", micro_batch=2, num_micro_batches=16)
    mid = memory_per_stage(gpt3, plan)[1]
    one_layer = korthikanti_activation_bytes(S, 2, H, A, tp=8)
    assert mid.transient_bytes == pytest.approx(one_layer)
    assert mid.activations_bytes == pytest.approx(12 * 7 * 2 * SBH * 2)


def test_flash_attention_needs_no_selective_recompute() -> None:
    m = transformer("flash", layers=4, hidden=1024, heads=16, seq_len=2048, vocab=1000, flash_attention=True)
    none = memory_per_rank(m, MemoryPlan(recompute="none", micro_batch=2))
    sel = memory_per_rank(m, MemoryPlan(recompute="selective", micro_batch=2))
    assert sel.activations_bytes == none.activations_bytes
    # without dropout, unfused: the block stores s·h·(32 + 2·a·s/h) (workload docstring, Korthikanti §4.1)
    u = transformer("unfused", layers=4, hidden=1024, heads=16, seq_len=2048, vocab=1000)
    blocks = [lay for lay in u.layers if lay.block == 0]
    assert sum(lay.activation_bytes for lay in blocks) == pytest.approx(2048 * 1024 * (32 + 2 * 16 * 2048 / 1024))


def test_cnn_activations_scale_with_micro_batch() -> None:
    m = resnet50()
    b64 = memory_per_rank(m, MemoryPlan(micro_batch=64, optimizer="sgd"))
    b256 = memory_per_rank(m, MemoryPlan(micro_batch=256, optimizer="sgd"))
    assert b256.activations_bytes == pytest.approx(4 * b64.activations_bytes)
    assert b64.activations_bytes == pytest.approx(64 * m.activation_bytes_per_sample)
    # NVIDIA trains ResNet-50 at batch 256 on V100-16GB with AMP: it fits; 512 does not
    check_fits(b256, "v100-16gb")
    with pytest.raises(ConfigError, match="v100-16gb has 16 GiB"):
        check_fits(memory_per_rank(m, MemoryPlan(micro_batch=512, optimizer="sgd")), "v100-16gb")


# ---- checks, plans, errors -------------------------------------------------------------------------------
def test_check_fits_message() -> None:
    b = MemoryBreakdown(weights_bytes=92.1 * GIB, gradients_bytes=0.0, optimizer_bytes=0.0, activations_bytes=0.0)
    with pytest.raises(ConfigError) as e:
        check_fits(b, "a100-80gb")
    assert str(e.value) == ("plan: needs 92.1 GiB per GPU but a100-80gb has 80 GiB "
                            "(use more tensor/pipeline parallelism, ZeRO, or recomputation)")
    assert e.value.field == "plan"
    check_fits(MemoryBreakdown(79 * GIB, 0.0, 0.0, 0.0), "a100-80gb")
    with pytest.raises(ConfigError, match="headroom|needs"):
        check_fits(MemoryBreakdown(79 * GIB, 0.0, 0.0, 0.0), "a100-80gb", headroom_bytes=2 * GIB)


def test_memory_plan_from_plan(gpt3: Model) -> None:
    plan = Plan(dp=4, tp=8, pp=4, global_batch=256, micro_batch=2, pipeline_schedule="interleaved",
                virtual_stages=2, zero_stage=1, recompute="selective", sequence_parallel=True).validate(128)
    mp = memory_plan_from(plan)
    assert (mp.tp, mp.pp, mp.dp, mp.micro_batch, mp.num_micro_batches, mp.virtual_stages) == (8, 4, 4, 2, 32, 2)
    assert memory_per_rank(gpt3, plan) == memory_per_rank(gpt3, mp)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"zero_stage": 4}, "zero_stage"),
    ({"recompute": "some"}, "recompute"),
    ({"pipeline_schedule": "zigzag"}, "pipeline_schedule"),
    ({"dp": 4, "ep": 3}, "ep"),
    ({"pipeline_schedule": "interleaved"}, "virtual_stages"),
    ({"virtual_stages": 2}, "virtual_stages"),
    ({"tp": 0}, "plan.tp"),
    ({"optimizer": "lamb"}, "optimizer"),
])
def test_memory_plan_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        MemoryPlan(**kwargs)  # type: ignore[arg-type]


def test_too_many_pipeline_stages() -> None:
    m = transformer("small", layers=2, hidden=64, heads=4, seq_len=16, vocab=100)
    with pytest.raises(ConfigError, match="too few"):
        memory_per_rank(m, MemoryPlan(pp=4))


# ---- framework terms ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("zero", "per_param"), [(0, 18.0), (1, 6.0 + 12.0 / 64)])
def test_megatron_fp32_grad_buffer_table(psi: Model, zero: int, per_param: float) -> None:
    """Megatron-LM's distributed-optimizer table (docs/source/api-guide/distrib_optimizer.md), bf16 parameters
    with fp32 gradients: 18 bytes per parameter without the distributed optimizer, 6 + 12/d with it."""
    b = memory_per_rank(psi, MemoryPlan(dp=64, zero_stage=zero, grad_buffer_bytes=4))
    assert b.model_states_bytes == pytest.approx(per_param * 7.5e9)
    assert b.gradients_bytes == pytest.approx(4 * 7.5e9)


def test_allocator_fragmentation_is_a_share_of_allocated(gpt3: Model) -> None:
    plan = MemoryPlan(tp=8, pp=8, sequence_parallel=True, recompute="selective", num_micro_batches=8)
    base = memory_per_rank(gpt3, plan)
    frag = memory_per_rank(gpt3, replace(plan, allocator_fragmentation=0.1))
    assert base.allocator_bytes == 0.0 and base.total_bytes == base.allocated_bytes
    assert frag.allocated_bytes == base.allocated_bytes
    assert frag.total_bytes == pytest.approx(1.1 * base.allocated_bytes)
    with pytest.raises(ConfigError):
        MemoryPlan(allocator_fragmentation=1.0)


def test_framework_terms_from_the_plan() -> None:
    p = Plan(dp=8, grad_reduce_dtype="fp32", allocator_fragmentation=0.05)
    mp = memory_plan_from(p)
    assert (mp.grad_buffer_bytes, mp.allocator_fragmentation) == (4, 0.05)
    assert memory_plan_from(Plan(dp=8)).grad_buffer_bytes is None


def test_llama3_405b_8k_run_fits_80gb() -> None:
    """Llama 3 405B's 8K pre-training ran on 80 GB H100s with TP 8, PP 16, micro-batch 1 and (as read) no
    activation recompute (Meta 2024, Table 4). As published at 16,384 GPUs (DP 128, 16 sequences per DP group:
    16 micro-batches = pp, so every schedule holds 16 on the first stage) it fits, with gradients sharded
    (Meta's FSDP) or 16-bit. At 8,192 GPUs (DP 64: 32 micro-batches) Megatron's interleaved schedule keeps 47
    chunk-micro-batches on the first stage (23.5 micro-batches' worth) and would not fit, while a schedule that
    keeps at most pp in flight (1F1B) does: the reading of the schedule, not the stash, separates the 100 GiB
    from a fit (docs/validation.md §9)."""
    m = get_model("llama3-405b")
    h100 = 80 * GIB
    common = {"tp": 8, "pp": 16, "sequence_parallel": True, "micro_batch": 1, "pipeline_schedule": "interleaved",
              "virtual_stages": 2}
    meta = memory_per_rank(m, MemoryPlan(dp=128, num_micro_batches=16, zero_stage=2, grad_buffer_bytes=4, **common))
    assert meta.total_bytes < 0.9 * h100  # ≥ 10% left for the allocator, the CUDA context, NCCL
    assert memory_per_rank(m, MemoryPlan(dp=128, num_micro_batches=16, zero_stage=1, **common)).total_bytes < h100
    at_8k = memory_per_rank(m, MemoryPlan(dp=64, num_micro_batches=32, zero_stage=2, grad_buffer_bytes=4, **common))
    assert at_8k.total_bytes > h100
    one_f_one_b = {**common, "pipeline_schedule": "1f1b", "virtual_stages": 1}
    assert memory_per_rank(m, MemoryPlan(dp=64, num_micro_batches=32, zero_stage=2, grad_buffer_bytes=4,
                                         **one_f_one_b)).total_bytes < 0.9 * h100
