"""Build the task graph of one training iteration from (model, plan, cluster).

Symmetry keeps the graph small: all data-parallel replicas run the same program, and so do the tensor-
parallel ranks of a pipeline stage, so the graph holds one compute stream per pipeline *device* (stage)
while every communication task carries the concrete collectives of *all* the GPUs it stands for — the
data-parallel allreduces of every tensor rank, the pipeline sends of every replica — so that, in the
flow model, they share the real links and contend.

What each task means (Megatron-LM / PyTorch DDP semantics):

* ``F[m,c]`` / ``B[m,c]``: forward / backward of micro-batch ``m`` through model chunk ``c`` on its device;
  tensor-parallel (and expert-parallel) collectives are blocking inside these tasks, as in Megatron-LM:
  each is a :class:`~topotrain.training.engine.Blocking` collective of the task, after the layer that
  issues it, on its real groups, timed by the engine with the scenario's network model (so it contends
  with data-parallel traffic where they share links, and shows in the trace).
* sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022): every tensor-parallel allreduce becomes a reduce-scatter after the row-parallel GEMM and
  an all-gather before the next column-parallel one (and mirrored in backward), each its own blocking
  collective; the backward re-gathers each column-parallel layer's input before its weight-gradient GEMM.
  ``tp_comm_overlap`` (Megatron-Core ``--tp-comm-overlap``, Transformer Engine userbuffers; Wang et al.,
  "Overlap Communication with Dependent Computation via Decomposition", ASPLOS 2023) pipelines each
  reduce-scatter / all-gather with its GEMM in ``tp`` chunks, exposing ``max(c / tp, c - t_gemm)``.
* context parallelism (Megatron-Core; :mod:`topotrain.training.context_parallel`): every attention layer's
  forward and backward exchange K,V (and dK,dV) around the context-parallel ring, beside the attention
  steps (``Blocking.beside_s``); the layers' costs are those of one rank's ``s/cp`` tokens
  (:func:`~topotrain.workload.context_parallel.cp_local_model`, applied by the caller), and the gradients
  are reduced over the ``dp·cp`` ranks that hold the same weights (Megatron-Core's data-parallel group with
  context parallel).
* ``send``: the pipeline point-to-point of activations (forward) or their gradients (backward), on a
  per-direction stream (Narayanan et al., SC'21 §4.1, with scatter/gather: ``1/tp`` of the tensor per
  tensor rank). Megatron-LM's schedules batch each send with the next receive and wait for both, so the
  sender's next compute waits for its send (``BLOCKING_P2P``): the transfer is exposed on both stages,
  as in the real schedule, not hidden.
* gradient buckets (Li et al., "PyTorch Distributed", VLDB 2020): parameters in reverse layer order are
  grouped into buckets of ``bucket_bytes``; the last micro-batch's backward is split at bucket
  boundaries, and each bucket's allreduce (ZeRO-1/2: reduce-scatter) starts on the data-parallel stream
  as soon as its gradients exist — wait-free backpropagation (Zhang et al., Poseidon, ATC 2017). With
  ``overlap: false`` every bucket waits for the whole backward.
* ZeRO-3 / FSDP (Rajbhandari et al. SC'20): parameters are all-gathered before each chunk's forward and
  backward (prefetched one task ahead) and gradients reduce-scattered.
* ``overlap_param_gather`` (ZeRO-1/2): the parameter all-gathers run per bucket under the first forward
  (Megatron-Core's distributed optimizer with ``--overlap-param-gather``) instead of after the optimizer.
* gradient accumulation: with several micro-batches per iteration, PyTorch's autograd adds each
  micro-batch's gradients after the first into the accumulated ``.grad`` in place (``AccumulateGrad``: read
  both, write one, ``3 · GRAD_BYTES`` per local parameter), under DDP's ``no_sync`` and on the last
  micro-batch alike; a memory-bound pass charged to each such backward. Not with
  ``grad_accumulation_fusion`` (the weight-gradient GEMM accumulates into the buffer, Megatron's
  ``--gradient-accumulation-fusion``), nor with ZeRO-2/3 or FSDP (their gradients are sharded; not modelled).
* ``optimizer``: mixed-precision Adam, memory-bound: 28 bytes moved per local parameter (read fp32
  master, m, v and the gradient; write master, m, v and the bf16 copy), then ZeRO-1/2 all-gather.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import numpy as np

from topotrain.collectives.protocol import NCCL, CommLibrary, bottleneck_kind, moving_pairs, on_the_wire
from topotrain.collectives.registry import algorithms_for, build_schedule, get_algorithm, relabelled
from topotrain.collectives.ring_shift import ring_shift
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.hardware.gpus import GPUSpec
from topotrain.network.base import NetworkModel, fastest
from topotrain.topology.graph import Topology
from topotrain.training.chunk_cost import BuiltIteration, ChunkCost, _hidden_by, _local_params
from topotrain.training.context_parallel import backward_ring, forward_ring, spread_beside
from topotrain.training.engine import Blocking, CommSpec, TaskGraph
from topotrain.training.framework import (
    HP_GRAD_UPDATE_BYTES,
    bucket_cap_bytes,
    framework,
    reduce_between_copies,
    reduce_element_bytes,
    tied_embedding_elements,
)
from topotrain.training.fsdp import build_fsdp
from topotrain.training.p2p import _p2p_schedules
from topotrain.training.partition import chunk_ranges
from topotrain.training.plan import Plan
from topotrain.training.rank_order import expert_groups_contiguous, expert_rank_groups
from topotrain.training.sync_tasks import add_sync_tasks
from topotrain.util.errors import ConfigError
from topotrain.util.gc_pause import collector_paused
from topotrain.workload.context_parallel import kv_chunk_bytes
from topotrain.workload.layer import LayerKind, Model, TPSplit

ADAM_BYTES_PER_PARAM = 28.0
OPTIMIZER_HBM_EFFICIENCY = 0.85
GRAD_BYTES = 2  # gradients reduced in the model dtype (bf16/fp16), as PyTorch DDP with AMP does
#: Pipeline sends block the sender's next compute, as Megatron-LM's 1F1B / interleaved schedules wait for
#: their batched send/recv pairs (``p2p_communication.send_forward_recv_backward`` and its kin).
BLOCKING_P2P = True
#: Pieces of a collective hidden behind an *independent* GEMM (an asynchronous collective): as many as
#: makes the first-piece cost of :func:`~topotrain.training.engine.overlapped_exposure` vanish.
_ASYNC_CHUNKS = 2**20


@contextlib.contextmanager
def _algorithm_field(field: str) -> Iterator[None]:
    """Within the block, an algorithm refused for the collective the plan needs (``collective.algorithm``, e.g.
    ZeRO's reduce-scatter with ``dp_algorithm: tree``) is reported as the plan's ``field`` that chose it; no
    change without a ``field``."""
    try:
        yield
    except ConfigError as e:
        if not field or e.field != "collective.algorithm":
            raise
        raise ConfigError(field, e.message, e.fix) from None


class IterationBuilder:
    """Builds the task graph; ``layer_times(batch, tp) -> (fwd_s, bwd_s)`` arrays per layer. The network
    model only chooses ``auto`` algorithms (with the scenario's model, as ``collective --algo auto`` does);
    the engine times every collective."""

    def __init__(self, model: Model, plan: Plan, gpus: Sequence[str], topo: Topology, network: NetworkModel,
                 gpu: GPUSpec, layer_times: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
                 stage_slowdown: Sequence[float] | None = None, library: CommLibrary = NCCL,
                 stage_gpus: Sequence[GPUSpec] | None = None,
                 stage_layer_times: Sequence[Callable[[int, int], tuple[np.ndarray, np.ndarray]]] | None = None,
                 replicas: Sequence[int] | None = None) -> None:
        self.model = model
        self.library = library  # puts every collective on the wire (collectives/protocol.py)
        self.plan = plan
        self.gpus = list(gpus)
        self.topo = topo
        self.network = network
        self.gpu = gpu
        self._alpha_s = network.params.message_overhead_s  # sizes the schedules' default pipeline chunks
        self.layer_times = layer_times
        self.devices = plan.pp
        self.fw = framework(plan.framework)  # the framework's own mechanisms (training/framework.py)
        self.grad_bytes = reduce_element_bytes(self.fw, plan.grad_reduce_dtype, GRAD_BYTES)
        self.slowdown = list(stage_slowdown) if stage_slowdown is not None else [1.0] * plan.pp
        #: a mixed cluster (training/mixed.py): each stage's GPU and layer times; None: ``gpu``, ``layer_times``
        self.stage_gpus = list(stage_gpus) if stage_gpus is not None else None
        self.stage_layer_times = list(stage_layer_times) if stage_layer_times is not None else None
        #: the replicas whose tensor/context groups and pipeline sends the graph carries (a mixed cluster's class);
        #: the data-parallel collectives always span every replica
        self.replicas = list(replicas) if replicas is not None else list(range(plan.dp))
        self._sched_memo: dict[tuple[object, ...], Schedule] = {}
        self._auto_choice: dict[tuple[object, ...], str] = {}
        self._p2p_specs: dict[str, CommSpec] = {}
        self._group_specs: dict[str, CommSpec] = {}
        self._dp_memo: dict[tuple[CollectiveOp, int, int], tuple[Schedule, ...]] = {}
        self._kinds: dict[tuple[tuple[str, ...], bytes], str] = {}
        self._pairs: dict[int, tuple[tuple[Phase, ...], bytes]] = {}
        self._templates: dict[tuple[CollectiveOp, str, int, int], Schedule] = {}
        self._wire_templates: dict[tuple[tuple[CollectiveOp, str, int, int], str], Schedule] = {}
        self._ep_by_stage: list[list[list[int]]] | None = None

    # ---- groups ---------------------------------------------------------------------------------
    def tp_group(self, d: int, p: int, c: int = 0) -> list[str]:
        return [self.gpus[self.plan.rank(d, t, p, c)] for t in range(self.plan.tp)]

    def dp_group(self, t: int, p: int) -> list[str]:
        """The ranks that reduce gradients together: data × context parallel (Megatron-Core's data-parallel
        group with context parallel), in rank order."""
        plan = self.plan
        if plan.cp == 1:
            return [self.gpus[plan.rank(d, t, p)] for d in range(plan.dp)]
        return [self.gpus[r] for r in sorted(plan.rank(d, t, p, c) for d in range(plan.dp) for c in range(plan.cp))]

    def cp_group(self, d: int, t: int, p: int) -> list[str]:
        """A context-parallel group, in ring order (its context indices)."""
        return [self.gpus[self.plan.rank(d, t, p, c)] for c in range(self.plan.cp)]

    def ep_group(self, d0: int, t: int, p: int) -> list[str]:
        plan, ep = self.plan, self.plan.ep
        if expert_groups_contiguous(plan.rank_order):
            base = (d0 // ep) * ep
            return [self.gpus[plan.rank(base + k, t, p)] for k in range(ep)]
        edp = plan.dp // ep  # ep after dp in the order: expert ranks dp/ep apart
        return [self.gpus[plan.rank(d0 % edp + k * edp, t, p)] for k in range(ep)]

    def _schedule(self, op: CollectiveOp, algorithm: str, ranks: list[str], size_bytes: int) -> Schedule:
        key = (op, algorithm, tuple(ranks), size_bytes)
        s = self._sched_memo.get(key)
        if s is None:
            if algorithm == "auto":
                s = self._auto(op, ranks, size_bytes)
            else:
                s = self._build(op, algorithm, ranks, size_bytes)
            self._sched_memo[key] = s
        return s

    def _build(self, op: CollectiveOp, algorithm: str, ranks: list[str], size_bytes: int) -> Schedule:
        """``algorithm``'s schedule of ``op`` on ``ranks``, on the wire. One that uses its ranks only as labels
        (``op`` in ``AlgorithmInfo.labels_only``) is built and put on the wire once per (op, rank count, size,
        bottleneck kind) and relabelled for every other group (the builder's groups are distinct GPUs of the
        topology, as :func:`build_schedule` checks of the first)."""
        info = get_algorithm(algorithm)
        if op not in info.labels_only:
            return self._on_the_wire(build_schedule(op, algorithm, self.topo, ranks, size_bytes,
                                                    message_overhead_s=self._alpha_s))
        key = (op, info.name, len(ranks), size_bytes)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = build_schedule(op, algorithm, self.topo, ranks, size_bytes,
                                                             message_overhead_s=self._alpha_s)
        kind = self._kind(relabelled(template, ranks))
        wire = self._wire_templates.get((key, kind))
        if wire is None:
            wire = self._wire_templates[(key, kind)] = on_the_wire(template, self.topo, kind, self.library)
        return relabelled(wire, ranks)

    def _on_the_wire(self, schedule: Schedule) -> Schedule:
        """:func:`on_the_wire` of ``schedule``, its bottleneck link's kind found once per (ranks, rank pairs):
        the kind depends on nothing else (:func:`moving_pairs`), so a group's buckets of every size share it."""
        return on_the_wire(schedule, self.topo, self._kind(schedule), self.library)

    def _kind(self, schedule: Schedule) -> str:
        """:func:`bottleneck_kind` of ``schedule``, found once per (ranks, rank pairs)."""
        key = (schedule.ranks, self._pairs_key(schedule.phases, schedule))
        kind = self._kinds.get(key)
        if kind is None:
            kind = self._kinds[key] = bottleneck_kind(schedule, self.topo)
        return kind

    def _pairs_key(self, phases: tuple[Phase, ...], schedule: Schedule) -> bytes:
        """:func:`moving_pairs` of ``schedule`` (whose phases are ``phases``) as bytes, found once per phases
        tuple: the groups of a plan often share one (halving-doubling's phases are cached per rank count)."""
        hit = self._pairs.get(id(phases))
        if hit is None or hit[0] is not phases:
            src, dst = moving_pairs(schedule)
            hit = self._pairs[id(phases)] = (phases, src.tobytes() + b"|" + dst.tobytes())
        return hit[1]

    def _dp_schedules(self, op: CollectiveOp, s: int, size_bytes: int) -> tuple[Schedule, ...]:
        """``op`` of ``size_bytes`` on the data-parallel group of every tensor rank of stage ``s`` (built once
        per (op, stage, size))."""
        key = (op, s, size_bytes)
        scheds = self._dp_memo.get(key)
        if scheds is None:
            with _algorithm_field("plan.dp_algorithm"):
                scheds = self._dp_memo[key] = tuple(
                    self._schedule(op, self.plan.dp_algorithm, self.dp_group(t, s), size_bytes)
                    for t in range(self.plan.tp))
        return scheds

    def _auto(self, op: CollectiveOp, ranks: list[str], size_bytes: int) -> Schedule:
        """The fastest applicable algorithm, by the scenario's network model (the same rule as
        ``collective --algo auto``). The choice is made once per group size and power-of-two size class, on
        the first group that asks: the data-parallel groups of a plan are translates of each other (same
        servers' roles, other GPUs), so they pick alike."""
        size_class = max(0, int(size_bytes).bit_length() - 1)
        key = ("auto", op, len(ranks), size_class)
        chosen = self._auto_choice.get(key)
        if chosen is not None:
            try:
                return self._build(op, chosen, ranks, size_bytes)
            except ConfigError:
                pass  # this group cannot run the shared choice: choose for it alone
        names = algorithms_for(op, auto=True)
        best = fastest(self.network, self.topo, [partial(self._build, op, n, ranks, size_bytes) for n in names],
                       getattr(self.network, "floor_s", None))  # skips those that cannot win (a long ring)
        if best is not None:
            self._auto_choice[key] = best.algorithm
        if best is None:
            raise ConfigError("plan.dp_algorithm", f"no algorithm can run {op.value} on {len(ranks)} ranks",
                              "set plan.dp_algorithm explicitly")
        return best

    def _group_spec(self, kind: str, op: CollectiveOp, algorithm: str, size_bytes: int, p: int) -> CommSpec | None:
        """The blocking TP/EP collective of stage ``p`` on all its groups at once (all replicas run it
        together), or None when there is none (degree 1, nothing to send)."""
        if size_bytes <= 0 or (self.plan.tp if kind == "tp" else self.plan.ep) == 1:
            return None
        key = f"{kind}:{op}:{algorithm}:{p}:{size_bytes}"
        spec = self._group_specs.get(key)
        if spec is None:
            with _algorithm_field("plan.tp_algorithm" if kind == "tp" else ""):
                scheds = tuple(self._schedule(op, algorithm, g, size_bytes) for g in self._groups(kind, p))
            spec = self._group_specs[key] = CommSpec(key, scheds)
        return spec

    def _groups(self, kind: str, p: int) -> list[list[str]]:
        """The tensor-parallel (``kind == "tp"``) or expert-parallel groups of stage ``p``."""
        plan = self.plan
        if kind == "tp":
            return [self.tp_group(d, p, c) for d in self.replicas for c in range(plan.cp)]
        if plan.cp > 1:  # expert groups drawn from the dp·cp ranks, as Megatron-Core's expert generator draws them
            return [[self.gpus[r] for r in g] for g in self._expert_groups()[p]]
        if expert_groups_contiguous(plan.rank_order):
            starts = range(0, plan.dp, plan.ep)
        else:
            starts = range(plan.dp // plan.ep)
        return [self.ep_group(d, t, p) for d in starts for t in range(plan.tp)]

    def _expert_groups(self) -> list[list[list[int]]]:
        """Megatron-Core's expert-parallel groups (:func:`expert_rank_groups`) by pipeline stage, global ranks."""
        plan = self.plan
        if self._ep_by_stage is None:
            stage = {plan.rank(d, t, p, c): p for p in range(plan.pp) for d in range(plan.dp)
                     for t in range(plan.tp) for c in range(plan.cp)}
            self._ep_by_stage = [[] for _ in range(plan.pp)]
            for g in expert_rank_groups(plan.rank_order, plan.tp, plan.cp, plan.ep, plan.dp, plan.pp):
                self._ep_by_stage[stage[g[0]]].append(g)
        return self._ep_by_stage

    def _cp_ring(self, p: int, step_bytes: tuple[int, ...], direction: int) -> CommSpec | None:
        """Ring attention's exchange of ``step_bytes`` per step on every context-parallel group of stage
        ``p`` at once (all replicas and tensor ranks run it together), or None with nothing to send."""
        plan = self.plan
        if plan.cp == 1 or max(step_bytes) <= 0:
            return None
        key = f"cp:{p}:{direction}:{','.join(map(str, step_bytes))}"
        spec = self._group_specs.get(key)
        if spec is None:
            scheds = tuple(self._on_the_wire(ring_shift(self.cp_group(d, t, p), step_bytes, direction))
                           for d in self.replicas for t in range(plan.tp))
            spec = self._group_specs[key] = CommSpec(key, scheds)
        return spec

    # ---- costs ----------------------------------------------------------------------------------
    def chunk_costs(self) -> list[ChunkCost]:
        plan, model = self.plan, self.model
        mb = plan.micro_batch_size
        sources = self.stage_layer_times or [self.layer_times]
        times = []
        for source in sources:
            fwd, bwd = source(mb, plan.tp)
            if plan.sequence_parallel and plan.tp > 1:
                # sequence parallelism (Korthikanti et al. 2022): the norms, dropouts and residual adds inside the
                # blocks that tensor parallelism replicates work on 1/tp of the sequence instead
                seq = np.array([lay.block >= 0 and lay.tp_split == TPSplit.REPLICATED for lay in model.layers])
                fwd = np.where(seq, fwd / plan.tp, fwd)
                bwd = np.where(seq, bwd / plan.tp, bwd)
            times.append((fwd, bwd))
        n_chunks = plan.pp * plan.virtual_stages
        ranges = chunk_ranges(model, n_chunks, plan.partition)
        out = []
        for g, (lo, hi) in enumerate(ranges):
            device = g % plan.pp
            fwd, bwd = times[device if self.stage_layer_times else 0]
            s = self.slowdown[device]
            layers = list(range(lo, hi))
            f = float(fwd[lo:hi].sum())
            b = float(bwd[lo:hi].sum())
            recomputed: list[int] = []
            if plan.recompute == "full":
                recomputed = [i for i in layers if model.layers[i].block >= 0]
            elif plan.recompute == "selective":
                recomputed = [i for i in layers if model.layers[i].kind in
                              (LayerKind.MATMUL, LayerKind.SOFTMAX, LayerKind.ATTENTION, LayerKind.DROPOUT)
                              and model.layers[i].block >= 0]
            rec = float(sum(fwd[i] for i in recomputed))
            fwd_blk = self._forward_blocking(layers, fwd, s, device)
            # backward: the recomputed forward first (full recomputation redoes its TP/SP/EP collectives), then
            # the layers in reverse order
            bwd_blk: list[Blocking] = []
            if plan.recompute == "full" or (plan.recompute == "selective" and plan.cp > 1):
                rec_set = set(recomputed)
                bwd_blk += [Blocking(b.comm, f"{b.label} (recompute)", b.offset_s, b.overlap, b.beside_s)
                            for b in self._forward_blocking(layers, fwd, s, device, only=rec_set)]
            bwd_blk += self._backward_blocking(layers, bwd, s, device, rec * s)
            # gradient buckets in reverse layer order
            fractions: list[float] = []
            sizes: list[int] = []
            acc_bytes = 0.0
            acc_time = 0.0
            cap = bucket_cap_bytes(self.fw, plan.bucket_bytes, plan.dp, device, plan.overlap, self.grad_bytes)
            for i in reversed(layers):
                acc_bytes += _local_params(model.layers[i], plan.tp, plan.ep) * self.grad_bytes
                acc_time += float(bwd[i])
                if acc_bytes >= (cap if plan.sync != "ps" else 1):  # PS: one layer each
                    sizes.append(int(acc_bytes))
                    fractions.append(acc_time / b if b > 0 else 0.0)
                    acc_bytes = acc_time = 0.0
            if acc_bytes > 0 or acc_time > 0:
                if acc_bytes > 0:
                    sizes.append(int(acc_bytes))
                    fractions.append(acc_time / b if b > 0 else 0.0)
                elif fractions:
                    fractions[-1] += acc_time / b if b > 0 else 0.0
            last = model.layers[hi - 1]
            out_bytes = last.output_bytes * mb / (plan.tp if plan.tp > 1 else 1)
            params_local = sum(_local_params(model.layers[i], plan.tp, plan.ep) for i in layers)
            accum = self._grad_accum_s(params_local, device) * s
            out.append(ChunkCost(tuple(layers), f * s, b * s, rec * s, tuple(fwd_blk), tuple(bwd_blk), out_bytes,
                                 tuple(fractions), tuple(sizes), params_local, accum))
        return out

    def _gpu_of(self, device: int) -> GPUSpec:
        """The GPU that runs pipeline stage ``device``."""
        return self.stage_gpus[device] if self.stage_gpus is not None else self.gpu

    def _grad_accum_s(self, params_local: float, device: int = 0) -> float:
        """One autograd accumulation pass over ``params_local`` gradients (read the accumulated and the new
        gradient, write the sum), or 0 where the plan accumulates otherwise or runs one micro-batch."""
        plan = self.plan
        if self._hp_grad_update():
            return params_local * HP_GRAD_UPDATE_BYTES / (self._gpu_of(device).hbm_bandwidth_bytes_per_s
                                                          * OPTIMIZER_HBM_EFFICIENCY)
        if (plan.num_micro_batches == 1 or plan.grad_accumulation_fusion or plan.fsdp
                or plan.zero_stage >= 2):
            return 0.0
        return params_local * 3 * GRAD_BYTES / (self._gpu_of(device).hbm_bandwidth_bytes_per_s
                                                * OPTIMIZER_HBM_EFFICIENCY)

    def _hp_grad_update(self) -> bool:
        """Every micro-batch's gradients are added into fp32 ones (DeepSpeed's BF16_Optimizer; framework.py)."""
        return (self.fw is not None and self.fw.hp_grad_update and self.plan.grad_reduce_dtype == "fp32"
                and self.plan.dtype == "bf16")

    # ---- blocking TP / SP / EP / CP collectives -------------------------------------------------------
    def _sp(self) -> bool:
        return self.plan.sequence_parallel and self.plan.tp > 1

    def _cp_kv_bytes(self) -> int:
        """Bytes of one micro-batch's K,V chunk that a ring-attention step sends (0 without context
        parallelism)."""
        plan = self.plan
        if plan.cp == 1:
            return 0
        return int(kv_chunk_bytes(self.model, plan.cp, plan.tp) * plan.micro_batch_size)

    def _ring_of(self, device: int) -> Callable[[tuple[int, ...], int], CommSpec | None]:
        return lambda steps, direction: self._cp_ring(device, steps, direction)

    def _forward_blocking(self, layers: list[int], fwd: np.ndarray, slow: float, device: int,
                          only: set[int] | None = None) -> list[Blocking]:
        """Blocking collectives of the forward of ``layers`` (``only``: the recomputed ones, whose compute
        alone advances the offsets), each at the compute offset where Megatron-LM issues it.

        Tensor parallelism (Shoeybi et al. 2019): the allreduce of a row-parallel layer's output (``g``).
        Sequence parallelism (Korthikanti et al. 2022, §4.2.2): ``g`` is a reduce-scatter after the
        row-parallel layer and ``f`` an all-gather before the column-parallel one, of the same full
        ``s·b·h`` tensor; with ``tp_comm_overlap`` each is pipelined with its GEMM in ``tp`` chunks
        (:func:`_hidden_by`). The expert-parallel all-to-all follows its expert layer."""
        plan, model = self.plan, self.model
        mb, sp, alg = plan.micro_batch_size, self._sp(), plan.tp_algorithm
        chunks = plan.tp if plan.tp_comm_overlap else 0
        cp_kv, ring = self._cp_kv_bytes(), self._ring_of(device)
        out: list[Blocking] = []
        done_s = 0.0
        for i in layers:
            lay = model.layers[i]
            run = only is None or i in only
            t_i = float(fwd[i]) * slow
            sp_i = sp and lay.kind != LayerKind.LOSS  # the vocab-parallel loss's scalars stay allreduces
            if sp_i and lay.tp_allreduce_bytes_bwd and run:  # f: all-gather the sequence-sharded input
                spec = self._group_spec("tp", CollectiveOp.ALLGATHER, alg, int(lay.tp_allreduce_bytes_bwd * mb),
                                        device)
                if spec is not None:
                    out.append(Blocking(spec, f"tp allgather L{i}", done_s, _hidden_by(t_i, chunks)))
            if cp_kv and run and lay.kind == LayerKind.ATTENTION and lay.block >= 0:
                out += forward_ring(ring, cp_kv, plan.cp, t_i, done_s, f"L{i}")
            if run:
                done_s += t_i
            if lay.tp_allreduce_bytes_fwd and run:
                size = int(lay.tp_allreduce_bytes_fwd * mb)
                if sp_i:  # g: reduce-scatter the output along the sequence
                    spec = self._group_spec("tp", CollectiveOp.REDUCE_SCATTER, alg, size, device)
                    if spec is not None:
                        out.append(Blocking(spec, f"tp reduce-scatter L{i}", done_s, _hidden_by(t_i, chunks)))
                else:
                    spec = self._group_spec("tp", CollectiveOp.ALLREDUCE, alg, size, device)
                    if spec is not None:
                        out.append(Blocking(spec, f"tp allreduce L{i}", done_s))
            if lay.alltoall_bytes_fwd and run:
                spec = self._group_spec("ep", CollectiveOp.ALLTOALL, "pairwise", int(lay.alltoall_bytes_fwd * mb),
                                        device)
                if spec is not None:
                    out.append(Blocking(spec, f"ep alltoall L{i}", done_s))
        return out

    def _backward_blocking(self, layers: list[int], bwd: np.ndarray, slow: float, device: int,
                           start_s: float) -> list[Blocking]:
        """Blocking collectives of the backward of ``layers`` (in reverse order, after ``start_s`` of
        recomputation), as Megatron-LM's tensor-parallel layers issue them
        (``LinearWithGradAccumulationAndAsyncCommunication``; a GEMM's backward is a data-gradient and a
        weight-gradient GEMM of equal FLOPs, each half of the layer's backward time):

        * tensor parallelism: the allreduce of a column-parallel layer's input gradient (``f``'s backward),
          blocking after the layer's backward;
        * sequence parallelism: a row-parallel layer's output gradient is all-gathered before its backward
          (``g``'s backward; with ``tp_comm_overlap`` pipelined with its data-gradient GEMM); a
          column-parallel layer re-gathers its sequence-sharded input (``plan.sp_regather``, on by default
          as in Megatron-LM, instead of storing the gathered one) while its data-gradient GEMM runs, then
          reduce-scatters the input gradient while its weight-gradient GEMM runs — both asynchronous,
          hidden up to their GEMM's length (``exposed = max(0, c - t_gemm)``);
        * the expert-parallel all-to-all of the gradients after its expert layer."""
        plan, model = self.plan, self.model
        mb, sp_plan, alg = plan.micro_batch_size, self._sp(), plan.tp_algorithm
        chunks = plan.tp if plan.tp_comm_overlap else 0
        cp_kv, ring = self._cp_kv_bytes(), self._ring_of(device)
        out: list[Blocking] = []
        done_s = start_s
        for i in reversed(layers):
            lay = model.layers[i]
            t_i = float(bwd[i]) * slow
            if cp_kv and lay.kind == LayerKind.ATTENTION and lay.block >= 0:
                out += backward_ring(ring, cp_kv, plan.cp, t_i, done_s, f"L{i}")
            sp = sp_plan and lay.kind != LayerKind.LOSS
            if sp and lay.tp_allreduce_bytes_fwd:  # g's backward: all-gather the output gradient
                spec = self._group_spec("tp", CollectiveOp.ALLGATHER, alg, int(lay.tp_allreduce_bytes_fwd * mb),
                                        device)
                if spec is not None:
                    out.append(Blocking(spec, f"tp allgather L{i} (bwd)", done_s, _hidden_by(t_i / 2, chunks)))
            if sp and lay.tp_allreduce_bytes_bwd:
                size = int(lay.tp_allreduce_bytes_bwd * mb)
                if plan.sp_regather:  # the memory model stores the sharded input then (training/memory.py)
                    spec = self._group_spec("tp", CollectiveOp.ALLGATHER, alg, size, device)
                    if spec is not None:
                        out.append(Blocking(spec, f"tp allgather input L{i} (bwd)", done_s,
                                            _hidden_by(t_i / 2, _ASYNC_CHUNKS)))
                spec = self._group_spec("tp", CollectiveOp.REDUCE_SCATTER, alg, size, device)
                if spec is not None:
                    out.append(Blocking(spec, f"tp reduce-scatter L{i} (bwd)", done_s + t_i / 2,
                                        _hidden_by(t_i / 2, _ASYNC_CHUNKS)))
            done_s += t_i
            if not sp and lay.tp_allreduce_bytes_bwd:
                spec = self._group_spec("tp", CollectiveOp.ALLREDUCE, alg, int(lay.tp_allreduce_bytes_bwd * mb),
                                        device)
                if spec is not None:
                    out.append(Blocking(spec, f"tp allreduce L{i} (bwd)", done_s))
            if lay.alltoall_bytes_fwd:
                spec = self._group_spec("ep", CollectiveOp.ALLTOALL, "pairwise", int(lay.alltoall_bytes_fwd * mb),
                                        device)
                if spec is not None:
                    out.append(Blocking(spec, f"ep alltoall L{i} (bwd)", done_s))
        return out

    # ---- pipeline order -------------------------------------------------------------------------
    def device_order(self, s: int) -> list[tuple[str, int, int]]:
        """(kind 'F'|'B', micro-batch, chunk index on this device) in execution order (Megatron-LM)."""
        plan = self.plan
        m_count, pp, v = plan.num_micro_batches, plan.pp, plan.virtual_stages
        if plan.pipeline_schedule == "gpipe":
            return [("F", m, 0) for m in range(m_count)] + [("B", m, 0) for m in range(m_count)]
        units = m_count * v

        def unit(k: int, forward: bool) -> tuple[int, int]:
            group, within = divmod(k, pp * v)
            chunk = within // pp
            micro = group * pp + within % pp
            return micro, (chunk if forward else v - 1 - chunk)

        if v == 1:
            warm = min(pp - s - 1, units)
        else:
            warm = min((pp - s - 1) * 2 + (v - 1) * pp, units)
        order: list[tuple[str, int, int]] = []
        for k in range(warm):
            order.append(("F", *unit(k, True)))
        for i in range(units - warm):
            order.append(("F", *unit(warm + i, True)))
            order.append(("B", *unit(i, False)))
        for i in range(units - warm, units):
            order.append(("B", *unit(i, False)))
        return order

    # ---- graph ----------------------------------------------------------------------------------
    @collector_paused()
    def build(self) -> BuiltIteration:
        plan = self.plan
        costs = self.chunk_costs()
        if self.fw is not None and self.fw.fsdp_units:  # PyTorch FSDP/HSDP's own unit-level graph
            graph, compute_s = build_fsdp(self, costs[0], self.fw.name == "hsdp", GRAD_BYTES)
            return BuiltIteration(graph, self.devices, costs, [compute_s])
        g_total = len(costs)
        graph = TaskGraph()
        f_task: dict[tuple[int, int], int] = {}
        b_task: dict[tuple[int, int], int] = {}
        b_parts_last: dict[int, list[int]] = {}
        send_f: dict[tuple[int, int], int] = {}
        send_b: dict[tuple[int, int], int] = {}
        orders = [self.device_order(s) for s in range(self.devices)]
        compute_by_dev = [0.0] * self.devices
        m_last = plan.num_micro_batches - 1
        zero3 = plan.zero_stage == 3 or plan.fsdp
        dp_stream = [f"stage{s}/dp" for s in range(self.devices)]
        prev_compute: list[list[int]] = [[] for _ in range(self.devices)]
        zero12 = plan.zero_stage in (1, 2) and not plan.fsdp and plan.dp_cp > 1
        gather_in_forward = zero12 and plan.overlap_param_gather
        # Megatron-LM's schedules post each send with the next receive (send_forward_recv_backward, ...) and
        # wait for both before the next compute: the sender's next compute waits for its send
        blocking_p2p = BLOCKING_P2P
        last_send: list[list[int]] = [[] for _ in range(self.devices)]

        def gather_params(s: int, g: int, label: str) -> int:
            """ZeRO-3: all-gather chunk g's parameters (prefetched: waits for the task two back)."""
            size = int(costs[g].params_local * GRAD_BYTES)
            scheds = self._dp_schedules(CollectiveOp.ALLGATHER, s, size)
            prev = prev_compute[s][-2:-1]
            return graph.add(f"allgather params {label}", "dp-comm", dp_stream[s], prev,
                             comm=CommSpec(f"ag:{s}:{size}", scheds), stage=s)

        # Iterate devices in lock-step over their orders so that dependencies exist before use.
        cursor = [0] * self.devices
        pending = sum(len(o) for o in orders)
        while pending:
            progressed = False
            for s in range(self.devices):
                while cursor[s] < len(orders[s]):
                    kind, m, c = orders[s][cursor[s]]
                    g = c * plan.pp + s
                    cost = costs[g]
                    deps: list[int] = []
                    if kind == "F":
                        if g > 0:
                            if (m, g) not in send_f:
                                break
                            deps.append(send_f[(m, g)])
                        deps += prev_compute[s][-1:] + last_send[s]
                        if zero3 and plan.dp_cp > 1:
                            deps.append(gather_params(s, g, f"F{m}.{g}"))
                        if m == 0 and gather_in_forward and cost.bucket_bytes:
                            tid = self._forward_with_param_gather(graph, s, g, cost, deps, dp_stream[s])
                        else:
                            tid = graph.add(f"F{m}.{g}", "forward", f"stage{s}/compute", deps, cost.fwd_s, stage=s,
                                            blocking=cost.fwd_blocking)
                        compute_by_dev[s] += cost.fwd_s
                        f_task[(m, g)] = tid
                        prev_compute[s].append(tid)
                        if g + 1 < g_total:
                            dst = (g + 1) % plan.pp
                            send_f[(m, g + 1)] = self._send(graph, s, dst, cost.out_bytes, tid, f"act{m}.{g}", "f")
                            last_send[s] = [send_f[(m, g + 1)]] if blocking_p2p else []
                    else:
                        if g + 1 < g_total:
                            if (m, g) not in send_b:
                                break
                            deps.append(send_b[(m, g)])
                        deps.append(f_task[(m, g)])
                        deps += prev_compute[s][-1:] + last_send[s]
                        if zero3 and plan.dp_cp > 1:
                            deps.append(gather_params(s, g, f"B{m}.{g}"))
                        # the first micro-batch's gradients are kept (but added into fp32 ones with _hp_grad_update)
                        accum = cost.grad_accum_s if m > 0 or self._hp_grad_update() else 0.0
                        dur = cost.bwd_s + cost.recompute_s + accum
                        compute_by_dev[s] += dur
                        if m == m_last and cost.bucket_bytes and plan.dp_cp > 1:
                            # split the last backward at bucket boundaries (gradients ready in reverse order);
                            # the recomputation and the blocking collectives go with the first part
                            parts: list[int] = []
                            fracs = cost.bucket_bwd_fraction
                            durs = [(cost.bwd_s + accum) * f + (cost.recompute_s if k == 0 else 0.0)
                                    for k, f in enumerate(fracs)]
                            starts = [cost.recompute_s * (k > 0) + cost.bwd_s * sum(fracs[:k])
                                      for k in range(len(fracs))]
                            blocks = spread_beside(cost.bwd_blocking, starts, durs)
                            for k, d_k in enumerate(durs):
                                parts.append(graph.add(f"B{m}.{g}.bucket{k}", "backward", f"stage{s}/compute",
                                                       deps if k == 0 else [parts[-1]], d_k, stage=s,
                                                       blocking=blocks[k]))
                            tid = parts[-1]
                            b_parts_last[g] = parts
                        else:
                            tid = graph.add(f"B{m}.{g}", "backward", f"stage{s}/compute", deps, dur, stage=s,
                                            blocking=cost.bwd_blocking)
                        b_task[(m, g)] = tid
                        prev_compute[s].append(tid)
                        if g > 0:
                            src_dev, dst = s, (g - 1) % plan.pp
                            out = costs[g - 1].out_bytes
                            send_b[(m, g - 1)] = self._send(graph, src_dev, dst, out, tid, f"grad{m}.{g}", "b")
                            last_send[s] = [send_b[(m, g - 1)]] if blocking_p2p else []
                    cursor[s] += 1
                    pending -= 1
                    progressed = True
            if not progressed:
                raise ConfigError("plan", "pipeline schedule deadlocks for this plan",
                                  "use pipeline_schedule: 1f1b or gpipe")

        # gradient synchronisation and optimizer, per device; a framework's mechanisms (training/framework.py):
        # reduce after the backward, copies around each bucket, ZeRO-1's allreduce, the tied-gradient allreduce
        fw = self.fw
        after_bwd = fw is not None and fw.reduce_after_backward
        ends = [prev_compute[s][-1:] + last_send[s] for s in range(self.devices)]
        tied_ends = ends[0] + ends[-1] if self.devices > 1 else []
        tied = self._tied_allreduce(graph, tied_ends) if fw is not None and fw.tied_grads_before_dp else None
        syncs: list[list[int]] = []
        for s in range(self.devices):
            sync: list[int] = []
            pre = [tied] if tied is not None and s in (0, plan.pp - 1) else []
            if plan.sync != "allreduce":  # a parameter server or gossip (training/sync_tasks.py)
                mine = [costs[c * plan.pp + s] for c in range(plan.virtual_stages)]
                chunks = [(cost.layers, cost.bucket_bytes,
                           b_parts_last.get(c * plan.pp + s, [b_task[(m_last, c * plan.pp + s)]]))
                          for c, cost in enumerate(mine)]
                sync = add_sync_tasks(graph, plan, self.model, self.topo, self.dp_group(0, s), chunks, GRAD_BYTES,
                                      self._on_the_wire, s)
            for c in range(plan.virtual_stages if plan.sync == "allreduce" else 0):
                g = c * plan.pp + s
                cost = costs[g]
                if plan.dp_cp == 1:
                    continue
                parts = b_parts_last.get(g, [b_task[(m_last, g)]] * max(1, len(cost.bucket_bytes)))
                for k, size in enumerate(cost.bucket_bytes):
                    after = parts[k] if plan.overlap and not after_bwd else parts[-1]
                    allreduce = plan.zero_stage == 0 or (plan.zero_stage == 1 and self._hp_grad_update()
                                                         and fw is not None and fw.zero1_allreduce)
                    op = CollectiveOp.ALLREDUCE if allreduce and not plan.fsdp else CollectiveOp.REDUCE_SCATTER
                    reduce = self._reducer(graph, op, s, size, f"{op.value} grads {g}.{k}", dp_stream[s])
                    stream = f"stage{s}/compute" if after_bwd else dp_stream[s]
                    tid, pass_s = reduce_between_copies(graph, fw, s, [after] + pre, reduce,
                                                        self._pass_s(size, s) * self.slowdown[s], stream,
                                                        plan.grad_reduce_dtype == "fp32")
                    compute_by_dev[s] += pass_s if after_bwd else 0.0
                    sync.append(tid)
            syncs.append(sync)
        if fw is not None and not fw.tied_grads_before_dp:
            tied = self._tied_allreduce(graph, tied_ends + syncs[0] + syncs[-1])
        for s in range(self.devices):
            params_local = sum(costs[c * plan.pp + s].params_local for c in range(plan.virtual_stages))
            shard = plan.dp_cp if plan.zero_stage >= 1 or plan.fsdp else 1
            opt_s = self._optimizer_s(params_local / shard, s) * self.slowdown[s]
            tied_dep = [tied] if tied is not None and s in (0, plan.pp - 1) else []
            opt = graph.add("optimizer", "optimizer", f"stage{s}/compute", syncs[s] + ends[s] + tied_dep, opt_s,
                            stage=s)
            compute_by_dev[s] += opt_s
            if zero12 and not gather_in_forward:
                size = int(params_local * GRAD_BYTES)
                scheds = self._dp_schedules(CollectiveOp.ALLGATHER, s, size)
                graph.add("allgather params", "dp-comm", dp_stream[s], [opt],
                          comm=CommSpec(f"ag-opt:{s}:{size}", scheds), stage=s)
        return BuiltIteration(graph, self.devices, costs, compute_by_dev)

    def _forward_with_param_gather(self, graph: TaskGraph, s: int, g: int, cost: ChunkCost, deps: list[int],
                                   stream: str) -> int:
        """The first forward of chunk ``g`` split at the gradient buckets (in forward order), part ``k``
        waiting for the all-gather of bucket ``k``'s updated parameters — Megatron-Core's
        ``--overlap-param-gather`` with the distributed optimizer: in steady state the all-gathers after
        the previous optimizer step run under this iteration's forward. Each part takes the bucket's share
        of the backward time as its share of the forward (both are proportional to the layers' FLOPs)."""
        parts: list[int] = []
        order = list(range(len(cost.bucket_bytes)))[::-1]  # buckets were made in reverse layer order
        durs = [cost.fwd_s * cost.bucket_bwd_fraction[k] for k in order]
        blocks = spread_beside(cost.fwd_blocking, [sum(durs[:n]) for n in range(len(durs))], durs)
        for n, k in enumerate(order):
            size = cost.bucket_bytes[k]
            scheds = self._dp_schedules(CollectiveOp.ALLGATHER, s, size)
            ag = graph.add(f"allgather params {g}.{k}", "dp-comm", stream, [],
                           comm=CommSpec(f"ag-fwd:{s}:{size}", scheds), stage=s)
            d_k = cost.fwd_s * cost.bucket_bwd_fraction[k]
            part_deps = (deps if n == 0 else [parts[-1]]) + [ag]
            parts.append(graph.add(f"F0.{g}.bucket{k}", "forward", f"stage{s}/compute", part_deps, d_k, stage=s,
                                   blocking=blocks[n]))
        return parts[-1]

    def _reducer(self, graph: TaskGraph, op: CollectiveOp, s: int, size: int, name: str,
                 stream: str) -> Callable[[list[int]], int]:
        """Adds ``op`` of ``size`` bytes on stage ``s``'s data-parallel groups after the given tasks."""
        scheds = self._dp_schedules(op, s, size)
        return lambda deps: graph.add(name, "dp-comm", stream, deps, comm=CommSpec(f"{op}:{s}:{size}", scheds),
                                      stage=s)

    def _pass_s(self, size_bytes: float, device: int = 0) -> float:
        """One read-and-write pass over ``size_bytes`` of gradients in HBM (on stage ``device``'s GPU)."""
        return 2.0 * size_bytes / (self._gpu_of(device).hbm_bandwidth_bytes_per_s * OPTIMIZER_HBM_EFFICIENCY)

    def _tied_allreduce(self, graph: TaskGraph, deps: list[int]) -> int | None:
        """The allreduce of the tied word-embedding gradient between the first and the last pipeline stage
        of every (data, context, tensor) index (DeepSpeed ``ReduceTiedGrads``, Megatron's embedding group;
        training/framework.py), or None without a framework, a pipeline or tied embeddings."""
        plan = self.plan
        elements = tied_embedding_elements(self.model) if self.fw is not None and plan.pp > 1 else 0
        if not elements:
            return None
        size = int(elements / plan.tp * self.grad_bytes)
        scheds = tuple(self._schedule(CollectiveOp.ALLREDUCE, "ring", [self.gpus[plan.rank(d, t, 0, c)],
                                                                      self.gpus[plan.rank(d, t, plan.pp - 1, c)]],
                                      size)
                       for d in range(plan.dp) for c in range(plan.cp) for t in range(plan.tp))
        return graph.add("allreduce tied grads", "dp-comm", "tied/comm", deps, comm=CommSpec(f"tied:{size}", scheds),
                         stage=plan.pp - 1)

    def _optimizer_s(self, params: float, device: int = 0) -> float:
        return params * ADAM_BYTES_PER_PARAM / (self._gpu_of(device).hbm_bandwidth_bytes_per_s
                                                * OPTIMIZER_HBM_EFFICIENCY)

    def _send(self, graph: TaskGraph, src_dev: int, dst_dev: int, size_bytes: float, after: int, label: str,
              direction: str) -> int:
        plan = self.plan
        size = int(size_bytes)
        # a framework whose two directions of a stage pair never overlap runs them on one stream (framework.py)
        stream = f"p2p/{direction}/{src_dev}->{dst_dev}"
        if self.fw is not None and self.fw.p2p_serialized:
            stream = f"p2p/{min(src_dev, dst_dev)}-{max(src_dev, dst_dev)}"
        if size <= 0 or src_dev == dst_dev:
            return graph.add(f"send {label}", "pp-comm", stream, [after], 0.0, stage=src_dev)
        key = f"p2p:{src_dev}:{dst_dev}:{size}"
        spec = self._p2p_specs.get(key)
        if spec is None:
            pairs = [(self.gpus[plan.rank(d, t, src_dev, c)], self.gpus[plan.rank(d, t, dst_dev, c)])
                     for d in self.replicas for c in range(plan.cp) for t in range(plan.tp)]
            spec = CommSpec(key, _p2p_schedules(self.topo, pairs, size, self.library))
            self._p2p_specs[key] = spec
        return graph.add(f"send {label}", "pp-comm", stream, [after], comm=spec, stage=src_dev)
