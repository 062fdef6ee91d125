"""PyTorch FSDP and HSDP as their code runs them: ``framework: fsdp | hsdp`` (:mod:`topotrain.training.framework`).

Read from PyTorch 2.13.0 (``torch/distributed/fsdp``, BSD-3-Clause; docs/sources.md §17), with the defaults of
``FullyShardedDataParallel.__init__``: ``sharding_strategy`` FULL_SHARD (HSDP: HYBRID_SHARD),
``backward_prefetch=BackwardPrefetch.BACKWARD_PRE``, ``forward_prefetch=False``, ``limit_all_gathers=True``,
and one FSDP unit per transformer block (``auto_wrap_policy`` on the block class, as torchtitan, Hugging Face
Accelerate and LLM Foundry wrap) under a root unit that holds the rest (embeddings, final norm, head).

* **Forward**: each unit's parameters are all-gathered before its forward (``_runtime_utils._pre_forward_unshard``
  → ``_unshard``) on the unshard stream, and freed after it (``_post_forward_reshard``) — except the root's,
  which stay gathered for the backward ("Do not free the root's parameters in the post-forward for FULL_SHARD").
* **The rate limiter** (``limit_all_gathers``; ``_limiter_utils._FreeEventQueue``,
  ``_max_num_inflight_all_gathers = 2``): every free enqueues an event; an unshard with two events queued waits
  for the oldest. In the forward the all-gather of block ``u`` therefore waits for the forward of block
  ``u − 2``; in the backward the prefetch issued before block ``u``'s backward waits for the backward of block
  ``u + 2``. With the CPU ahead of the GPU (the host is not modelled here) these are the all-gathers' only
  waits besides their stream, so ``forward_prefetch`` (which only issues the next all-gather earlier on the
  CPU) changes nothing in this model.
* **Backward** (``_pre_backward_hook``): each unit is all-gathered again (FULL_SHARD reshards after forward);
  with BACKWARD_PRE the hook of block ``u`` prefetches the next block in backward order (``_prefetch_handle``
  with ``HandleTrainingState.BACKWARD_PRE``) before ``u``'s gradients are computed, so that all-gather is issued
  before ``u``'s reduce-scatter (``_post_backward_hook`` → ``_reduce_grad``: ``reduce_scatter_single`` on the
  process group). One process group (one NCCL communicator) runs the all-gathers and reduce-scatters in the
  order they are issued: here one stream in that order.
* **HSDP** (HYBRID_SHARD; ``_init_utils._init_intra_and_inter_node_groups``): parameters are sharded within a
  group of ``plan.shard_group`` consecutive ranks (PyTorch's default is the node's GPUs,
  ``dist.new_subgroups(num_devices_per_node)``) and replicated across the groups; the all-gathers and
  reduce-scatters run within each shard group, and after each reduce-scatter its shard is all-reduced over the
  ranks holding the same shard (``dist.all_reduce(new_sharded_grad, group=state._inter_node_pg)`` on the
  separate ``_all_reduce_stream``).
* **Gradient accumulation**: the gradients are reduced in the last micro-batch's backward (the others run under
  ``no_sync()``), as ``fsdp: true`` has always assumed; parameters are gathered in every micro-batch.
* **Optimizer**: each rank updates its shard (``1/dp`` of the parameters, ``1/shard_group`` with HSDP) after all
  reductions.

Parameters are gathered and gradients reduced at the model dtype (FSDP ``MixedPrecision(param_dtype=bf16,
reduce_dtype=bf16)``). The unit-level graph runs without tensor, pipeline, context or expert parallelism
(``plan.fsdp`` models FSDP under those, at pipeline-chunk granularity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from topotrain.collectives.schedule import CollectiveOp
from topotrain.training.chunk_cost import ChunkCost
from topotrain.training.engine import CommSpec, TaskGraph

if TYPE_CHECKING:
    from topotrain.training.builder import IterationBuilder

#: ``_limiter_utils._FreeEventQueue._max_num_inflight_all_gathers``
MAX_INFLIGHT_ALL_GATHERS = 2


def _segments(builder: IterationBuilder) -> list[tuple[str, list[int]]]:
    """The forward order of compute segments and their FSDP units: ``("root", layers before the first block)``,
    one ``("b<i>", block layers)`` per block, ``("root", the layers after the last block)``."""
    model = builder.model
    pre = [i for i, lay in enumerate(model.layers) if lay.block < 0 and i < _first_block(builder)]
    post = [i for i, lay in enumerate(model.layers) if lay.block < 0 and i > _first_block(builder)]
    blocks: dict[int, list[int]] = {}
    for i, lay in enumerate(model.layers):
        if lay.block >= 0:
            blocks.setdefault(lay.block, []).append(i)
    return [("root", pre)] + [(f"b{b}", idx) for b, idx in sorted(blocks.items())] + [("root", post)]


def _first_block(builder: IterationBuilder) -> int:
    return next((i for i, lay in enumerate(builder.model.layers) if lay.block >= 0), len(builder.model.layers))


def shard_groups(dp: int, shard: int) -> tuple[list[list[int]], list[list[int]]]:
    """HSDP's groups over data-parallel ranks ``0..dp-1``: the shard groups (``shard`` consecutive ranks, as
    ``dist.new_subgroups`` cuts them) and the replica groups (the ranks holding the same shard)."""
    return ([list(range(k, k + shard)) for k in range(0, dp, shard)],
            [list(range(j, dp, shard)) for j in range(shard)])


def build_fsdp(builder: IterationBuilder, cost: ChunkCost, hybrid: bool, param_bytes: int) -> tuple[TaskGraph, float]:
    """The task graph of one iteration of ``builder``'s plan as FSDP (or HSDP with ``hybrid``) runs it (module
    docstring), with the plan's one pipeline chunk ``cost``, parameters gathered at ``param_bytes`` per element;
    and the compute seconds it holds."""
    plan, model = builder.plan, builder.model
    fwd_l, bwd_l = builder.layer_times(plan.micro_batch_size, 1)
    segs = _segments(builder)
    f_sum, b_sum = float(np.sum(fwd_l)) or 1.0, float(np.sum(bwd_l)) or 1.0
    blk_f = float(sum(fwd_l[i] for _, idx in segs for i in idx if model.layers[i].block >= 0)) or 1.0
    seg_f = [cost.fwd_s * float(sum(fwd_l[i] for i in idx)) / f_sum for _, idx in segs]
    seg_b = [(cost.bwd_s + cost.grad_accum_s) * float(sum(bwd_l[i] for i in idx)) / b_sum
             + cost.recompute_s * float(sum(fwd_l[i] for i in idx if model.layers[i].block >= 0)) / blk_f
             for _, idx in segs]
    params: dict[str, float] = {}
    for unit, idx in segs:
        params[unit] = params.get(unit, 0.0) + float(sum(model.layers[i].param_count for i in idx))
    shard = plan.shard_group if hybrid and plan.shard_group else plan.dp
    dp_ranks = builder.dp_group(0, 0)
    if hybrid:
        inner, outer = shard_groups(plan.dp, shard)
        groups = [[dp_ranks[r] for r in g] for g in inner]
        replicas = [[dp_ranks[r] for r in g] for g in outer]
    else:
        groups, replicas = [dp_ranks], []
    graph = TaskGraph()
    comp, comm, ar_stream = "stage0/compute", "stage0/dp", "stage0/dp-allreduce"
    specs: dict[tuple[CollectiveOp, int, int], CommSpec] = {}

    def collective(op: CollectiveOp, size: int, on: list[list[str]], name: str, deps: list[int], stream: str) -> int:
        spec = specs.get((op, size, len(on[0])))
        if spec is None:
            scheds = tuple(builder._schedule(op, plan.dp_algorithm, g, size) for g in on)
            spec = specs[(op, size, len(on[0]))] = CommSpec(f"fsdp:{op}:{size}:{len(on[0])}", scheds)
        return graph.add(name, "dp-comm", stream, deps, comm=spec)

    def gather(unit: str, label: str, deps: list[int]) -> int:
        return collective(CollectiveOp.ALLGATHER, int(params[unit] * param_bytes), groups, f"allgather {unit} {label}",
                          deps, comm)

    blocks = [k for k, (unit, _) in enumerate(segs) if unit != "root"]
    reductions: list[int] = []
    compute_s = 0.0
    prev: list[int] = []
    m_last = plan.num_micro_batches - 1
    for m in range(plan.num_micro_batches):
        # forward: the root's gather (after the previous backward, whose last frees the limiter's queue holds),
        # then each block's after the forward two blocks back (the rate limiter)
        f_task: dict[int, int] = {}
        root_ag = gather("root", f"F{m}", prev)
        for k, (unit, _) in enumerate(segs):
            deps = list(prev)
            if unit == "root" and k == 0:
                deps.append(root_ag)
            elif unit != "root":
                j = blocks.index(k)
                waits = [f_task[blocks[j - MAX_INFLIGHT_ALL_GATHERS]]] if j >= MAX_INFLIGHT_ALL_GATHERS else []
                deps.append(gather(unit, f"F{m}", waits))
            f_task[k] = graph.add(f"F{m}.{unit}", "forward", comp, deps, seg_f[k])
            compute_s += seg_f[k]
            prev = [f_task[k]]
        # backward in reverse order; BACKWARD_PRE: before block u's backward, prefetch the next block's gather
        b_task: dict[int, int] = {}
        order = list(reversed(range(len(segs))))
        pending: dict[int, int] = {}
        if blocks:  # the root's pre-backward hook prefetches the last block
            j = len(blocks) - 1
            waits = [f_task[blocks[j - MAX_INFLIGHT_ALL_GATHERS]]] if j >= MAX_INFLIGHT_ALL_GATHERS else []
            pending[blocks[j]] = gather(segs[blocks[j]][0], f"B{m}", waits)
        for k in order:
            unit = segs[k][0]
            deps = list(prev)
            if unit != "root":
                deps.append(pending.pop(k))
                j = blocks.index(k)
                if j > 0:  # prefetch block j-1, after the backward of block j+2 has freed its parameters
                    nxt = blocks[j - 1]
                    later = j + MAX_INFLIGHT_ALL_GATHERS
                    waits = [b_task[blocks[later]]] if later < len(blocks) else []
                    pending[nxt] = gather(segs[nxt][0], f"B{m}", waits)
            b_task[k] = graph.add(f"B{m}.{unit}", "backward", comp, deps, seg_b[k])
            compute_s += seg_b[k]
            prev = [b_task[k]]
            if m == m_last and (unit != "root" or k == 0):  # the root's gradients are ready after the embedding
                size = int(params[unit] * builder.grad_bytes)
                rs = collective(CollectiveOp.REDUCE_SCATTER, size, groups, f"reduce-scatter {unit}", [b_task[k]],
                                comm)
                if replicas and len(replicas[0]) > 1:
                    rs = collective(CollectiveOp.ALLREDUCE, size // shard, replicas, f"allreduce {unit} shard", [rs],
                                    ar_stream)
                reductions.append(rs)
    total_params = sum(params.values())
    opt_s = builder._optimizer_s(total_params / shard, 0) * builder.slowdown[0]
    graph.add("optimizer", "optimizer", comp, reductions + prev, opt_s)
    return graph, compute_s + opt_s
