"""The training framework is part of the plan: the mechanisms that differ between the frameworks that run
the same parallel plan, each read from the framework's own code (docs/frameworks.md has the table).

``plan.framework`` names one of :data:`FRAMEWORKS`; unset (None), the plan's own fields decide everything
as before (PyTorch DDP's 25 MiB buckets overlapped with the last backward, ``plan.bucket``/``plan.overlap``).
A framework fixes, from its code, no constant fitted to a measurement:

* **when the data-parallel gradients are reduced** (:attr:`Framework.reduce_after_backward`): DeepSpeed's
  pipeline engine runs its ``ReduceGrads`` instruction after the last micro-batch's backward
  (``deepspeed/runtime/pipe/schedule.py: TrainSchedule.steps`` appends ``ReduceTiedGrads``, ``ReduceGrads``,
  ``OptimizerStep`` to the last step; ``pipe/engine.py: _exec_reduce_grads``), and so does Megatron-LM 2021's
  local DDP (``megatron/training.py: train_step`` calls ``allreduce_gradients`` after
  ``forward_backward_func``); Megatron-Core overlaps them with the backward only with
  ``overlap_grad_reduce`` (``DistributedDataParallelConfig``, default False), which ``plan.overlap`` states;
* **the bucket size** (:meth:`Framework.bucket_elements`): DeepSpeed ``MEMORY_OPT_ALLREDUCE_SIZE`` =
  500,000,000 elements (``runtime/engine.py``, ``allreduce_gradients(bucket_size=...)``); Megatron-Core
  ``max(40,000,000, 1,000,000 · dp)`` elements, and one bucket (all gradients) without
  ``overlap_grad_reduce`` or on every pipeline stage but the first
  (``core/distributed/distributed_data_parallel.py: DistributedDataParallel.__init__``); Megatron-LM 2021
  one allreduce of the whole contiguous gradient buffer (``megatron/model/distributed.py:
  DistributedDataParallel.allreduce_gradients``);
* **the tied-embedding gradient allreduce** between the first and last pipeline stages
  (:attr:`Framework.tied_grads_before_dp`): DeepSpeed ``ReduceTiedGrads`` before ``ReduceGrads``
  (``pipe/engine.py: _exec_reduce_tied_grads``); Megatron-Core after the data-parallel sync
  (``core/distributed/finalize_model_grads.py: finalize_model_grads`` → ``_allreduce_word_embedding_grads``),
  Megatron-LM 2021 likewise after it (``train_step``, "backward-embedding-all-reduce");
* **the copies around each bucket** (:attr:`Framework.bucket_copy_passes`): DeepSpeed flattens each bucket
  into a new tensor, allreduces it, scales it by 1/dp and copies it back into the gradients
  (``runtime/engine.py: allreduce_no_retain`` → ``allreduce_and_copy`` → ``allreduce_bucket``: ``flatten``,
  ``all_reduce``, ``mul_``, ``copy_``), three read-and-write passes over the bucket on the compute stream;
  Megatron-LM 2021 without contiguous buffers (the SC'21 scripts' fp16 runs: ``--use-contiguous-buffers-in-ddp``
  was opt-in at de7dc40f88) does the same (``megatron/model/distributed.py: allreduce_gradients``:
  ``_flatten_dense_tensors``, ``coalesced /= dp``, ``all_reduce``, ``buf.copy_``); with its contiguous fp32
  buffer (``--accumulate-allreduce-grads-in-fp32``, i.e. ``plan.grad_reduce_dtype: fp32``) it reduces the buffer
  in place after one scaling pass (``buffer_.data /= dp``), as Megatron-Core scales ``bucket.grad_data`` by
  ``gradient_scaling_factor`` before the collective;
* **the pipeline exchanges** (:attr:`Framework.p2p_serialized`): DeepSpeed's schedule issues
  ``SendGrad``/``RecvActivation`` and ``RecvGrad``/``SendActivation`` as separate blocking instructions
  (``pipe/p2p.py: send``/``recv`` call ``dist.send``/``dist.recv``, or ``dist.broadcast`` in a two-rank
  group before torch 1.8), so the two directions between adjacent stages never overlap; Megatron batches
  each send with the opposite receive (``p2p_communication._communicate`` with ``batch_isend_irecv``);
* **the reduce op of ZeRO-1** (:attr:`Framework.zero1_allreduce`): DeepSpeed runs ``BF16_Optimizer`` for a
  bf16 model with fp32 gradient accumulation at ZeRO-1 (``runtime/engine.py: _do_optimizer_sanity_check``;
  here ``dtype: bf16`` with ``grad_reduce_dtype: fp32``), whose pipeline reduce allreduces the gradients
  (``_bf16_reduce_grads`` → ``buffered_allreduce_fallback``); each rank then updates its shard and
  all-gathers. Otherwise ZeRO-1 reduces partitions as a reduce-scatter does, as Megatron-Core's distributed
  optimizer does;
* **the fp32 gradient accumulation** (:attr:`Framework.hp_grad_update`): DeepSpeed's ``BF16_Optimizer`` adds
  every micro-batch's bf16 gradients into its fp32 gradients after the backward (same condition)
  (``runtime/bf16_optimizer.py: _update_hp_grad``: ``hp_grad.add_(lp.grad.to(fp32))``, read 2 + 4 bytes,
  write 4 per parameter), where Megatron's fused weight-gradient GEMM or autograd accumulates instead.

* **PyTorch FSDP / HSDP** (``fsdp``, ``hsdp``; :attr:`Framework.fsdp_units`): one FSDP unit per transformer
  block, each all-gathered before its forward and again before its backward (FULL_SHARD), the next block's
  gather prefetched before the current block's backward (``BACKWARD_PRE``), at most two gathers in flight
  (``limit_all_gathers``), HSDP's reduce-scatter within ``plan.shard_group`` ranks then all-reduce across the
  replicas: :mod:`topotrain.training.fsdp`, read from PyTorch 2.13.0.
Commits read: DeepSpeed 38327e07f6cd39b63418f60cedd1651b0be3e7c3 (2025-02-21); Megatron-LM (Core)
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22); Megatron-LM 2021 de7dc40f883ceed06344051c3c7ebd57da59cc53
(2021-08-10, the SC'21 scripts' commit; 3d718bfc31, 2021-08-31, made contiguous buffers the default).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from topotrain.training.engine import TaskGraph
    from topotrain.workload.layer import Model

FrameworkName = Literal["megatron-core", "megatron-lm-2021", "deepspeed", "fsdp", "hsdp"]
FRAMEWORKS: tuple[str, ...] = get_args(FrameworkName)

#: DeepSpeed ``runtime/engine.py: MEMORY_OPT_ALLREDUCE_SIZE`` (elements per allreduce bucket).
DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
#: Megatron-Core ``DistributedDataParallel.__init__``: ``max(40000000, 1000000 * dp_group.size())``.
MCORE_MIN_BUCKET_ELEMENTS = 40_000_000
MCORE_BUCKET_ELEMENTS_PER_DP_RANK = 1_000_000
#: bytes one BF16_Optimizer hp-gradient update moves per parameter: read the bf16 gradient (2) and the fp32
#: one (4), write the fp32 one (4)
HP_GRAD_UPDATE_BYTES = 10.0


@dataclass(frozen=True)
class Framework:
    """The mechanisms a framework fixes (module docstring; each from the code cited there)."""

    name: str
    #: the gradients are reduced after the last micro-batch's backward, whatever ``plan.overlap`` says
    reduce_after_backward: bool
    #: ``"fixed"``: :attr:`bucket_fixed_elements`; ``"mcore"``: Megatron-Core's rule; ``"whole"``: one bucket
    bucket_rule: Literal["fixed", "mcore", "whole"]
    bucket_fixed_elements: int = 0
    #: the tied-embedding gradient allreduce runs before (True) or after (False) the data-parallel reduce
    tied_grads_before_dp: bool = False
    #: read-and-write passes over each bucket besides the collective (flatten, scale, copy back), and with
    #: the gradients in a contiguous fp32 buffer (``plan.grad_reduce_dtype: fp32``)
    bucket_copy_passes: int = 1
    bucket_copy_passes_fp32: int = 1
    #: the two directions of a pipeline stage pair share one stream (serial blocking send/recv)
    p2p_serialized: bool = False
    #: ZeRO-1 allreduces the gradients (each rank then updates its shard) instead of reduce-scattering them
    zero1_allreduce: bool = False
    #: every micro-batch's gradients are added into fp32 gradients by a separate pass (fp32 accumulation)
    hp_grad_update: bool = False
    #: PyTorch FSDP's unit-level schedule (:mod:`topotrain.training.fsdp`) replaces the chunk-level one
    fsdp_units: bool = False

    def bucket_elements(self, dp: int, stage: int, overlap: bool) -> int | None:
        """Elements per gradient bucket on pipeline stage ``stage`` (None: one bucket of all gradients)."""
        if self.bucket_rule == "fixed":
            return self.bucket_fixed_elements
        if self.bucket_rule == "mcore":
            if not overlap or stage > 0:
                return None
            return max(MCORE_MIN_BUCKET_ELEMENTS, MCORE_BUCKET_ELEMENTS_PER_DP_RANK * dp)
        return None


_TABLE: dict[str, Framework] = {
    "deepspeed": Framework("deepspeed", reduce_after_backward=True, bucket_rule="fixed",
                           bucket_fixed_elements=DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS, tied_grads_before_dp=True,
                           bucket_copy_passes=3, bucket_copy_passes_fp32=3, p2p_serialized=True, zero1_allreduce=True,
                           hp_grad_update=True),
    "megatron-core": Framework("megatron-core", reduce_after_backward=False, bucket_rule="mcore"),
    "megatron-lm-2021": Framework("megatron-lm-2021", reduce_after_backward=True, bucket_rule="whole",
                                  bucket_copy_passes=3),
    "fsdp": Framework("fsdp", reduce_after_backward=False, bucket_rule="whole", bucket_copy_passes=0,
                      fsdp_units=True),
    "hsdp": Framework("hsdp", reduce_after_backward=False, bucket_rule="whole", bucket_copy_passes=0,
                      fsdp_units=True),
}


def framework(name: str | None) -> Framework | None:
    """The :class:`Framework` named ``name`` (None: none, the plan's fields decide)."""
    return None if name is None else _TABLE[name]


def reduce_element_bytes(fw: Framework | None, grad_reduce_dtype: str, default: int) -> int:
    """Bytes per gradient element that the data-parallel reduce moves: 4 where a framework reduces fp32
    gradients (``plan.grad_reduce_dtype: fp32``: Megatron's ``main_grad`` buffers,
    ``accumulate_allreduce_grads_in_fp32``; DeepSpeed's ``BF16_Optimizer`` fp32 gradients), else ``default``
    (the model dtype); without a framework always ``default``, as before."""
    if fw is not None and grad_reduce_dtype == "fp32":
        return 4
    return default


def bucket_cap_bytes(fw: Framework | None, plan_bucket_bytes: int, dp: int, stage: int, overlap: bool,
                     element_bytes: int) -> float:
    """The gradient bucket's size in bytes on pipeline stage ``stage`` (infinite: one bucket)."""
    if fw is None:
        return float(plan_bucket_bytes)
    elements = fw.bucket_elements(dp, stage, overlap)
    return math.inf if elements is None else float(elements * element_bytes)


def tied_embedding_elements(model: Model) -> int:
    """Elements of the word-embedding matrix that the output layer shares (0: untied, or no such layer):
    the first and last pipeline stages each hold a copy and allreduce its gradient."""
    if not model.vocab or not model.hidden:
        return 0
    full = model.vocab * model.hidden
    for lay in model.layers:
        if lay.name in ("lm_head", "mlm.decoder") and lay.param_count < full:
            return full
    return 0


def reduce_between_copies(graph: TaskGraph, fw: Framework | None, stage: int, deps: list[int],
                          reduce: Callable[[list[int]], int], pass_s: float, stream: str,
                          fp32_buffer: bool = False) -> tuple[int, float]:
    """A gradient bucket's reduce (``reduce(deps)`` adds it) between the framework's copy passes over the
    bucket (:attr:`Framework.bucket_copy_passes`, or ``bucket_copy_passes_fp32`` with ``fp32_buffer``, each
    ``pass_s``, on ``stream``): the flatten/scale pass before, the rest (``copy_`` back; DeepSpeed's ``mul_``)
    after. Returns (last task, seconds of the passes)."""
    passes = 0 if fw is None else fw.bucket_copy_passes_fp32 if fp32_buffer else fw.bucket_copy_passes
    if passes == 0:
        return reduce(deps), 0.0
    pre = graph.add("flatten/scale grads", "optimizer", stream, deps, pass_s, stage=stage)
    tid = reduce([pre])
    if passes > 1:
        tid = graph.add("scale/copy back grads", "optimizer", stream, [tid], pass_s * (passes - 1), stage=stage)
    return tid, pass_s * passes
