"""Memory per GPU of a training plan: model states (ZeRO) + stashed activations (Korthikanti et al.).

**Model states** (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20, §3.1 and Fig. 1). Mixed-precision Adam keeps, per parameter, 2 bytes of fp16/bf16 weights,
2 bytes of fp16/bf16 gradients and ``K = 12`` bytes of optimizer states (fp32 master weights, momentum and
variance): ``(2 + 2 + K)·Ψ``. Over a data-parallel group of ``N_d``: stage 1 shards the optimizer states
(``4Ψ + KΨ/N_d``), stage 2 also the gradients (``2Ψ + (2 + K)Ψ/N_d``), stage 3 also the weights
(``(4 + K)Ψ/N_d``); FSDP's FULL_SHARD is stage 3. Ψ here is the parameters *this rank* holds: its pipeline
stage's layers, ``1/tp`` of the tensor-parallel ones, ``1/ep`` of the experts (whose ZeRO group is the
expert-data-parallel group of ``dp/ep`` ranks). Fp32 training (``model.dtype == 4``) keeps 4 + 4 bytes and
``K = 8`` (momentum, variance); SGD with momentum has ``K = 8`` (master + momentum) in mixed precision, 4 in
fp32.

**Activations** (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
MLSys 2023, §4, Table 2). Per transformer layer and micro-batch of ``b`` sequences (``s`` tokens, hidden
``h``, ``a`` heads, 16-bit activations, with dropout): ``s·b·h·(34 + 5·a·s/h)`` bytes without parallelism;
with tensor parallelism ``t``: ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``, and with sequence parallelism
``s·b·h·(34/t + 5·a·s/(h·t))``; selective recomputation (of the core attention) drops the ``5·a·s/h`` term;
full recomputation stores only each layer's input, ``2·s·b·h`` (``/t`` with sequence parallelism).
:func:`korthikanti_activation_bytes` is that closed form. :func:`memory_per_rank` computes the same thing
layer by layer from the workload's ``activation_bytes`` (which follow the paper's counting, so a GPT built
with dropout reproduces the formula exactly, and FlashAttention, GQA, gated MLPs or CNNs need no new
formula): a split layer's stash is divided by ``t``; a replicated layer's — and a column-parallel linear's,
whose stash is its full, replicated input — only with sequence parallelism.

**Pipeline** (Korthikanti §4.2.3; Narayanan et al. SC'21 §2.2): with 1F1B, stage ``p`` of ``pp`` holds up
to ``pp − p`` micro-batches in flight (the first stage ``pp``: ``L`` layers' worth in total); GPipe holds all
``m`` micro-batches; the interleaved schedule with ``v`` model chunks per device holds
``2·(pp − p − 1) + (v − 1)·pp + 1`` chunk-micro-batches in flight (Megatron-LM's warm-up count + 1), i.e. the
first stage stores ``L·(1 + (pp − 1)/(pp·v))`` layers' worth — the paper's figure. Layers are cut into
``pp·v`` chunks of whole blocks (Megatron: ``L/(pp·v)`` transformer layers each); embedding and the layers
before the first block sit on the first chunk, the head and loss on the last.

**Context parallelism** (Megatron-Core ``--context-parallel-size``): a rank stores the activations of its
``s/cp`` tokens, so the caller passes the rank's share of the model
(:func:`~topotrain.workload.context_parallel.cp_local_model`) and every stash is ``1/cp`` of the whole
sequence's; the weights are replicated over the context-parallel group and ZeRO / the distributed optimizer
shards over the ``dp·cp`` ranks that hold them (Megatron-Core's data-parallel group with context parallel).
Ring attention's backward keeps its two send/receive buffers of K,V and dK,dV (Transformer Engine's
``p2p_comm_buffers``: ``4·kv`` bytes, :func:`~topotrain.workload.context_parallel.kv_chunk_bytes`) in
``transient_bytes``.

**Transient** buffers, in ``transient_bytes``: the one layer recomputed at a time during backward (full:
its whole stash; selective: its core attention), and with ZeRO-3 the all-gathered 16-bit weights of two
blocks (the one computing and the one prefetched, as FSDP's per-block wrapping does). Not modelled:
activation-gradient working buffers, the CUDA context (≈ 0.5–1 GiB).

**Measured.** :func:`block_activation_bytes` (one block's stash) is checked against the bytes torch saves for
the backward of a Megatron-style block (``benchmarks/activation_memory.py``, ``tests/test_memory_measured.py``,
docs/validation.md §9): 144 variants within 1%. Two things the measurement showed and the model now counts:
the unfused attention expands grouped K and V to every head before its GEMMs, so it stashes them full-width
(workload/transformer.py), and Megatron-Core's grouped QKV layout copies the queries when a rank holds
several key-value groups (:func:`_grouped_query_copy_bytes`).

**Framework terms** (what frameworks keep besides the tensors above):

* *Distributed optimizer shards*: Megatron-Core's distributed optimizer is ZeRO stage 1 here — the fp32 main
  parameters and Adam's two moments, ``12/d`` bytes per parameter over the ``d = dp·cp`` ranks — beside the
  16-bit parameters and the unsharded gradient buffer (Megatron-LM ``docs/source/api-guide/distrib_optimizer.md``:
  ``6 + 12/d`` bytes per parameter for bf16 parameters with fp32 gradients, ``4 + 16/d`` for fp16 with fp16
  gradients, whose fp32 main-gradient shard, ``4/d``, is not counted here).
* *Gradient buffer in the reduce dtype* (``grad_buffer_bytes``; the plan's ``grad_reduce_dtype: fp32``):
  Megatron-LM turns ``accumulate_allreduce_grads_in_fp32`` on for every bf16 run
  (``megatron/training/arguments.py``), so its contiguous gradient buffer (``DistributedDataParallelConfig
  .grad_reduce_in_fp32``) holds 4 bytes per parameter instead of 2; PyTorch FSDP's
  ``MixedPrecision(reduce_dtype=torch.float32)`` likewise. Memory only: the timing reduces 16-bit gradients
  (training/builder.py ``GRAD_BYTES``).
* *Allocator fragmentation* (``allocator_fragmentation``, an assumption, 0 by default): PyTorch's CUDA caching
  allocator reserves more than the tensors it hands out (its blocks are split and rounded; PyTorch's "CUDA
  memory management" notes, ``expandable_segments``). Measured on LLM training, the gap is several GB on an
  80 GB card: GMLake (Guo et al., ASPLOS 2024) saves 9.2 GB on average (up to 25 GB) of the caching
  allocator's fragmentation over eight LLMs on A100-80GB; STWeaver (Huang et al. 2025, arXiv 2507.16274)
  finds the default allocator wasting up to 43% with virtual pipelines and recomputation. It is a fraction
  of the allocated bytes (``allocator_bytes``), so a plan is checked on ``allocated·(1 + f)``; 0 checks the
  tensors alone, a lower bound on what a GPU must hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator

from topotrain.compute.fp8 import FP8_WEIGHT_COPY_BYTES, is_fp8_linear
from topotrain.hardware.gpus import GPUSpec, get_gpu
from topotrain.training.partition import chunk_of_layers
from topotrain.training.plan import RECOMPUTE, PipelineSchedule, Plan, Recompute
from topotrain.util.errors import ConfigError
from topotrain.util.fields import NonNegativeInt, PositiveInt
from topotrain.util.problems import config_dataclass, several
from topotrain.workload.context_parallel import kv_chunk_bytes
from topotrain.workload.layer import Layer, LayerKind, Model, TPSplit

Optimizer = Literal["adam", "adamw", "sgd"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
_GIB = 2.0**30


@config_dataclass("plan")
class MemoryPlan:
    """What decides memory per GPU: parallel degrees, ZeRO stage / FSDP, recomputation, sequence parallelism,
    micro-batch size and count, pipeline schedule (with ``virtual_stages`` chunks per device for
    ``interleaved``), and the optimizer (mixed precision when the model's dtype is 2 bytes).

    A frozen pydantic dataclass: a bad field raises ConfigErrors naming ``plan.<field>``."""

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: PositiveInt = 1
    ep: PositiveInt = 1
    #: context parallelism: the model passed is one rank's share; ZeRO shards over dp·cp
    cp: PositiveInt = 1
    zero_stage: Annotated[NonNegativeInt, Field(le=3)] = 0
    fsdp: Annotated[bool, Field(strict=True)] = False
    #: HSDP: weights, gradients and optimizer sharded within this many ranks (None: over all dp·cp ranks)
    shard_group: PositiveInt | None = None
    recompute: Recompute = "none"
    sequence_parallel: Annotated[bool, Field(strict=True)] = False
    sp_regather: Annotated[bool, Field(strict=True)] = True
    micro_batch: PositiveInt = 1
    num_micro_batches: PositiveInt = 1
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: PositiveInt = 1
    optimizer: Optimizer = "adam"
    #: bytes per element of the gradient buffer the gradients accumulate and are reduced in (None: the model's
    #: dtype; 4: fp32, as Megatron-LM/Core keep it for bf16 training, module docstring "Framework terms")
    grad_buffer_bytes: Literal[2, 4] | None = None
    #: the caching allocator's reserved bytes beyond the allocated ones, as a fraction of them (an assumption:
    #: module docstring "Framework terms")
    allocator_fragmentation: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    #: transformer blocks per chunk (an uneven pipeline partition, training/partition.py); None: the even cut
    partition: tuple[PositiveInt, ...] | None = None
    #: Transformer Engine's FP8 weight workspace (rowwise + columnwise) of the blocks' linear layers (compute/fp8.py)
    fp8_weight_copies: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def _cross_checks(self) -> MemoryPlan:
        found = []
        if self.cp == 1 and self.dp % self.ep:
            found.append(ConfigError("ep", f"ep={self.ep} does not divide dp={self.dp}", "choose ep | dp"))
        elif (self.dp * self.cp) % self.ep:
            found.append(ConfigError("ep", f"ep={self.ep} does not divide dp·cp = {self.dp * self.cp}",
                                     "choose ep | dp·cp"))
        if self.pipeline_schedule == "interleaved" and self.virtual_stages < 2:
            found.append(ConfigError("virtual_stages", "interleaved 1F1B needs virtual_stages ≥ 2",
                                     "set virtual_stages: 2 or use pipeline_schedule: 1f1b"))
        if self.pipeline_schedule != "interleaved" and self.virtual_stages != 1:
            found.append(ConfigError("virtual_stages", "virtual stages need pipeline_schedule: interleaved",
                                     "set pipeline_schedule: interleaved or virtual_stages: 1"))
        if found:
            raise several(found)
        return self

    @property
    def effective_zero_stage(self) -> int:
        """The ZeRO stage in effect (FSDP FULL_SHARD = 3)."""
        return 3 if self.fsdp else self.zero_stage

    @property
    def chunks(self) -> int:
        """Model chunks over the whole pipeline (``pp · virtual_stages``)."""
        return self.pp * self.virtual_stages


def memory_plan_from(plan: Plan, optimizer: Optimizer = "adam") -> MemoryPlan:
    """The :class:`MemoryPlan` of a (validated) training :class:`Plan`."""
    return MemoryPlan(
        tp=plan.tp,
        pp=plan.pp,
        dp=plan.dp,
        ep=plan.ep,
        cp=plan.cp,
        zero_stage=plan.zero_stage,
        fsdp=plan.fsdp or plan.framework in ("fsdp", "hsdp"),
        shard_group=plan.shard_group if plan.framework == "hsdp" else None,
        recompute=plan.recompute,
        sequence_parallel=plan.sequence_parallel,
        sp_regather=plan.sp_regather,
        micro_batch=plan.micro_batch_size,
        num_micro_batches=max(1, plan.num_micro_batches),
        pipeline_schedule=plan.pipeline_schedule,
        virtual_stages=plan.virtual_stages,
        optimizer=optimizer,
        grad_buffer_bytes=4 if plan.grad_reduce_dtype == "fp32" else None,
        allocator_fragmentation=plan.allocator_fragmentation,
        partition=plan.partition,
        fp8_weight_copies=plan.dtype == "fp8",
    )


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU of one pipeline stage (``stage``) — the busiest one from :func:`memory_per_rank`."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float = 0.0
    stage: int = 0
    #: what the caching allocator reserves beyond the allocated bytes (``allocator_fragmentation`` of them)
    allocator_bytes: float = 0.0

    @property
    def model_states_bytes(self) -> float:
        """Weights + gradients + optimizer states (what ZeRO's Figure 1 counts)."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def allocated_bytes(self) -> float:
        """The tensors' bytes at the peak (what ``torch.cuda.max_memory_allocated`` reports)."""
        return self.model_states_bytes + self.activations_bytes + self.transient_bytes

    @property
    def total_bytes(self) -> float:
        """Allocated bytes plus the allocator's reserve: what the GPU must hold."""
        return self.allocated_bytes + self.allocator_bytes

    def to_dict(self) -> dict[str, float]:
        return {
            "weights_bytes": self.weights_bytes,
            "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes,
            "transient_bytes": self.transient_bytes,
            "allocator_bytes": self.allocator_bytes,
            "total_bytes": self.total_bytes,
            "stage": float(self.stage),
        }


# ---- closed forms (the papers' formulas) ---------------------------------------------------------------
def zero_model_states_bytes(params: float, dp: int, stage: int, optimizer_multiplier: float = 12.0) -> float:
    """ZeRO (SC'20 §5) bytes of model states per GPU for ``params`` = Ψ, mixed-precision Adam ``K = 12``:
    stage 0 ``(4+K)Ψ``, 1 ``4Ψ + KΨ/N_d``, 2 ``2Ψ + (2+K)Ψ/N_d``, 3 ``(4+K)Ψ/N_d``."""
    if stage not in (0, 1, 2, 3):
        raise ConfigError("zero_stage", f"must be 0-3, got {stage!r}", "use 0, 1, 2 or 3")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ConfigError("dp", f"must be a positive integer, got {dp!r}", "give dp ≥ 1")
    k, p = float(optimizer_multiplier), float(params)
    w, g, o = 2.0 * p, 2.0 * p, k * p
    if stage >= 1:
        o /= dp
    if stage >= 2:
        g /= dp
    if stage >= 3:
        w /= dp
    return w + g + o


def korthikanti_activation_bytes(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    sp_regather: bool = True,
) -> float:
    """Activation bytes one transformer layer stores per micro-batch (Korthikanti et al. 2023, Table 2).
    With sequence parallelism their ``34/t`` assumes the backward re-gathers the inputs of the two
    column-parallel GEMMs (QKV, MLP up: ``2sbh`` each); without (``sp_regather=False``) each is stored
    gathered, ``4sbh·(1 − 1/t)`` more."""
    if recompute not in RECOMPUTE:
        raise ConfigError("recompute", f"unknown value {recompute!r}", f"use one of {', '.join(RECOMPUTE)}")
    s, b, h, a, t = float(seq_len), float(micro_batch), float(hidden), float(heads), float(tp)
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1.0)
    attn = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34.0 / t + attn + (0.0 if sp_regather else 4.0 * (1.0 - 1.0 / t)))
    return sbh * (10.0 + 24.0 / t + attn)


# ---- layer → chunk → device ----------------------------------------------------------------------------
def _chunk_of_layers(model: Model, chunks: int, partition: tuple[int, ...] | None = None) -> list[int]:
    """Chunk index of every layer: the one partition the timing uses too (:mod:`topotrain.training.partition`)."""
    return chunk_of_layers(model, chunks, partition)


def _stash_split(layer: Layer) -> str:
    """``"tp"``: the stash is split over the TP group; ``"seq"``: replicated unless sequence parallelism."""
    if layer.tp_split == TPSplit.ROW:
        return "tp"
    if layer.tp_split == TPSplit.COLUMN:
        # a column-parallel GEMM stashes its input, which every TP rank holds in full
        return "seq" if layer.kind in (LayerKind.LINEAR, LayerKind.MOE_ROUTER) else "tp"
    return "seq"


def _divisor(layer: Layer, plan: MemoryPlan) -> float:
    if _stash_split(layer) == "tp":
        return float(plan.tp)
    if plan.sequence_parallel:
        # without the backward re-gather a column-parallel GEMM keeps its gathered (full) input
        gathered = not plan.sp_regather and layer.tp_split == TPSplit.COLUMN and layer.kind == LayerKind.LINEAR
        return 1.0 if gathered else float(plan.tp)
    return 1.0


def _core_attention_bytes(model: Model, layers: list[Layer]) -> list[float]:
    """Per layer of one block, the stash bytes that selective recomputation drops: the core attention
    (softmax, its dropout, the probabilities the context GEMM keeps) between the scores and context GEMMs,
    and with grouped-query attention the full-width copies of K and V the unfused GEMMs stash: the
    checkpointed core attention keeps only its inputs q, k, v (Megatron-Core checkpoints
    ``DotProductAttention``, whose ``repeat_interleave`` expands the groups inside it)."""
    drop = [0.0] * len(layers)
    matmuls = [i for i, lay in enumerate(layers) if lay.kind == LayerKind.MATMUL]
    if len(matmuls) < 2:
        return drop  # fused (FlashAttention) or no attention: nothing quadratic is stored
    i0, i1 = matmuls[0], matmuls[1]
    for i in range(i0 + 1, i1):
        if layers[i].kind in (LayerKind.SOFTMAX, LayerKind.DROPOUT):
            drop[i] = layers[i].activation_bytes
    scores, ctx = layers[i0], layers[i1]
    # the scores GEMM stashes q and the expanded k (equal sizes); the context GEMM the expanded v
    kv_share = 1.0
    if model.hidden and model.heads:
        kv_share = float(model.kv_heads or model.heads) / float(model.heads)
    width = scores.activation_bytes / 2.0
    drop[i0] = width * (1.0 - kv_share)
    drop[i1] = ctx.activation_bytes - min(ctx.activation_bytes, width * kv_share)
    return drop


def _grouped_query_copy_bytes(model: Model, layers: list[Layer], plan: MemoryPlan) -> float:
    """Bytes per sample a rank keeps besides the layers' stashes in one block: Megatron-Core's fused QKV output
    is laid out ``[s, b, ng, (np/ng + 2)·hn]`` (the queries of each key-value group, then its key and value), and
    with grouped queries (``np/ng > 1``) and more than one group on a rank, ``query.reshape(s, b, np, hn)``
    cannot be a view: it copies the queries, and the attention saves that copy while its saved K and V — views
    of the QKV output — keep the whole output alive: one query tensor more (``dtype·s·h/t``) than the layers
    count. That happens where K and V are saved as views: the fused attention (FlashAttention saves q, k, v),
    and the unfused one under selective recomputation (the checkpoint's inputs); the unfused attention without
    recomputation saves its own copies of all three, and full recomputation keeps only the block input.
    Measured in ``benchmarks/activation_memory.py`` (the ``gpt-gqa`` and ``llama`` variants at tp 1)."""
    heads, kv = int(model.heads or 0), int(model.kv_heads or model.heads or 0)
    if plan.recompute == "full" or not kv or heads == kv or kv // min(kv, plan.tp) <= 1:
        return 0.0
    fused = [lay for lay in layers if lay.kind == LayerKind.ATTENTION]
    if fused:
        return fused[0].output_bytes / plan.tp  # its output is as large as the queries
    matmuls = [lay for lay in layers if lay.kind == LayerKind.MATMUL]
    if plan.recompute == "selective" and len(matmuls) >= 2:
        return matmuls[1].output_bytes / plan.tp  # the context GEMM's output: as large as the queries
    return 0.0


def _layer_stash(layer: Layer, drop: float, plan: MemoryPlan) -> float:
    """Bytes per sample one rank keeps of ``layer``'s stash, less ``drop`` (what selective recomputation drops)."""
    return layer.activation_bytes / _divisor(layer, plan) - drop / _divisor(layer, plan)


def _block_input_bytes(model: Model, first: int, plan: MemoryPlan) -> float:
    """Bytes per sample of the input of the block whose first layer is ``first`` (what full recomputation
    keeps: the previous layer's output, ``1/t`` of it with sequence parallelism)."""
    prev = model.layers[first - 1] if first > 0 else None
    inp = prev.output_bytes if prev is not None else 0.0
    return inp / (plan.tp if plan.sequence_parallel else 1)


def block_activation_bytes(model: Model, plan: MemoryPlan, block: int = 0) -> float:
    """Bytes one rank keeps for the backward of transformer block ``block`` per micro-batch (``micro_batch``
    samples): what :func:`memory_per_stage` counts for it, without the pipeline's in-flight factor and the
    transient of recomputation. ``tests/test_memory_measured.py`` checks it against the bytes torch saves."""
    idxs = [i for i, lay in enumerate(model.layers) if lay.block == block]
    if not idxs:
        raise ConfigError("block", f"the model has no block {block}", "give the index of a transformer block")
    mb = float(plan.micro_batch)
    if plan.recompute == "full":
        return _block_input_bytes(model, idxs[0], plan) * mb
    layers = [model.layers[i] for i in idxs]
    drop = _core_attention_bytes(model, layers) if plan.recompute == "selective" else [0.0] * len(layers)
    stash = sum(_layer_stash(lay, d, plan) for lay, d in zip(layers, drop, strict=True))
    return (stash + _grouped_query_copy_bytes(model, layers, plan)) * mb


def _in_flight(plan: MemoryPlan, stage: int) -> float:
    """Micro-batches' worth of a device's activations alive at the peak (in units of the whole device)."""
    m, p, v = plan.num_micro_batches, plan.pp, plan.virtual_stages
    if p == 1:
        return 1.0
    if plan.pipeline_schedule == "gpipe":
        return float(m)
    if plan.pipeline_schedule == "1f1b":
        return float(min(p - stage, m))
    chunk_mbs = min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
    return chunk_mbs / v


def _optimizer_k(model: Model, optimizer: str) -> tuple[float, float, float]:
    """Bytes per parameter of (weights, gradients, optimizer states)."""
    d = float(model.dtype)
    mixed = model.dtype < 4
    if optimizer in ("adam", "adamw"):
        return d, d, (12.0 if mixed else 8.0)
    return d, d, (8.0 if mixed else 4.0)


def _local_params(layer: Layer, plan: MemoryPlan) -> float:
    p = float(layer.param_count)
    if layer.tp_split in (TPSplit.COLUMN, TPSplit.ROW):
        p /= plan.tp
    if layer.expert:
        p /= plan.ep
    return p


def memory_per_stage(model: Model, plan: MemoryPlan | Plan) -> list[MemoryBreakdown]:
    """A :class:`MemoryBreakdown` for each pipeline stage (one rank of it; all ranks of a stage are alike)."""
    if isinstance(plan, Plan):
        plan = memory_plan_from(plan)
    if not isinstance(plan, MemoryPlan):
        raise ConfigError(
            "plan", f"expected a MemoryPlan or Plan, got {type(plan).__name__}", "build a MemoryPlan"
        )
    chunk_of = _chunk_of_layers(model, plan.chunks, plan.partition)
    device_of = [c % plan.pp for c in chunk_of]
    embed_devices = {device_of[i] for i, lay in enumerate(model.layers) if lay.kind == LayerKind.EMBEDDING}
    wb, gb, kb = _optimizer_k(model, plan.optimizer)
    if plan.grad_buffer_bytes is not None:
        gb = float(plan.grad_buffer_bytes)
    zero = plan.effective_zero_stage
    shard = plan.shard_group or plan.dp * plan.cp  # the ranks that share the same weights' shards
    edp = plan.dp * plan.cp // plan.ep  # Megatron-Core's expert data-parallel size (training/rank_order.py)

    # per-block bookkeeping (one micro-batch, per sample → × micro_batch later)
    layers = list(model.layers)
    by_block: dict[int, list[int]] = {}
    for i, lay in enumerate(layers):
        if lay.block >= 0:
            by_block.setdefault(lay.block, []).append(i)
    drop = [0.0] * len(layers)
    if plan.recompute == "selective":
        for idxs in by_block.values():
            for i, d in zip(idxs, _core_attention_bytes(model, [layers[i] for i in idxs]), strict=True):
                drop[i] = d
    block_input = {blk: _block_input_bytes(model, idxs[0], plan) for blk, idxs in by_block.items()}

    out: list[MemoryBreakdown] = []
    mb = float(plan.micro_batch)
    for stage in range(plan.pp):
        idx = [i for i in range(len(layers)) if device_of[i] == stage]
        dense = expert = 0.0
        for i in idx:
            lay = layers[i]
            p = _local_params(lay, plan)
            if lay.param_count == 0 and lay.param_bytes > 0 and stage not in embed_devices:
                # a weight tied to an embedding on another stage: Megatron keeps a copy here too
                p = (
                    lay.param_bytes
                    / model.dtype
                    / (plan.tp if lay.tp_split in (TPSplit.COLUMN, TPSplit.ROW) else 1)
                )
            if lay.expert:
                expert += p
            else:
                dense += p
        w = wb * (dense / (shard if zero >= 3 else 1) + expert / (edp if zero >= 3 else 1))
        if plan.fp8_weight_copies:  # TE's FP8 weight workspace, of the whole (gathered) local weights
            w += FP8_WEIGHT_COPY_BYTES * sum(_local_params(layers[i], plan) for i in idx if is_fp8_linear(layers[i]))
        g = gb * (dense / (shard if zero >= 2 else 1) + expert / (edp if zero >= 2 else 1))
        o = kb * (dense / (shard if zero >= 1 else 1) + expert / (edp if zero >= 1 else 1))

        stash = 0.0
        transient = 0.0
        stage_blocks = sorted({layers[i].block for i in idx if layers[i].block >= 0})
        for i in idx:
            if layers[i].block >= 0 and plan.recompute == "full":
                continue  # counted per block below
            stash += _layer_stash(layers[i], drop[i], plan)
        if plan.recompute == "full":
            stash += sum(block_input[b] for b in stage_blocks)
        else:
            stash += sum(_grouped_query_copy_bytes(model, [layers[i] for i in by_block[b]], plan)
                         for b in stage_blocks)
        per_block_full = [
            sum(layers[i].activation_bytes / _divisor(layers[i], plan) for i in by_block[b])
            for b in stage_blocks
        ]
        if plan.recompute == "full" and per_block_full:
            transient += max(per_block_full) * mb
        elif plan.recompute == "selective" and stage_blocks:
            transient += (
                max(sum(drop[i] / _divisor(layers[i], plan) for i in by_block[b]) for b in stage_blocks) * mb
            )
        if plan.cp > 1 and stage_blocks:
            transient += 4.0 * kv_chunk_bytes(model, plan.cp, plan.tp) * mb
        if zero >= 3:
            units = [sum(_local_params(layers[i], plan) for i in by_block[b]) for b in stage_blocks]
            units += [_local_params(layers[i], plan) for i in idx if layers[i].block < 0]
            units = sorted((u for u in units if u > 0), reverse=True)[:2]
            transient += wb * sum(units)
        acts = stash * mb * _in_flight(plan, stage)
        frag = plan.allocator_fragmentation * (w + g + o + acts + transient)
        out.append(MemoryBreakdown(w, g, o, acts, transient, stage, frag))
    return out


def memory_per_rank(model: Model, plan: MemoryPlan | Plan) -> MemoryBreakdown:
    """Bytes per GPU on the pipeline stage that needs the most (usually the first, under 1F1B)."""
    stages = memory_per_stage(model, plan)
    return max(stages, key=lambda m: (m.total_bytes, -m.stage))


def check_fits(
    breakdown: MemoryBreakdown, gpu: GPUSpec | str, field: str = "plan", headroom_bytes: float = 0.0
) -> None:
    """ConfigError when ``breakdown`` (plus ``headroom_bytes``) exceeds the GPU's memory."""
    g = get_gpu(gpu)
    need = breakdown.total_bytes + float(headroom_bytes)
    if need > g.memory_bytes or not math.isfinite(need):
        raise ConfigError(
            field,
            f"needs {need / _GIB:.1f} GiB per GPU but {g.name} has {g.memory_bytes / _GIB:.0f} GiB",
            "use more tensor/pipeline parallelism, ZeRO, or recomputation",
        )


def memory_report(breakdown: MemoryBreakdown) -> dict[str, Any]:
    """The breakdown in GiB, for printing."""
    return {k: (v / _GIB if k != "stage" else int(v)) for k, v in breakdown.to_dict().items()}
