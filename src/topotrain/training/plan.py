"""A parallel plan: how one training iteration is split over the GPUs, validated once at the edge.

Degrees multiply to the GPU count: ``dp · tp · cp · pp = gpus`` (expert parallelism ``ep`` reuses the data-
parallel ranks, as in Megatron-LM/DeepSpeed-MoE, so ``ep`` must divide ``dp``; with context parallelism
Megatron-Core draws them from the ``dp·cp`` ranks, so ``ep`` must divide ``dp·cp``). Context parallelism ``cp``
splits every sequence over ``cp`` ranks (ring attention, :mod:`topotrain.training.context_parallel`); the
gradients are reduced over the ``dp · cp`` ranks that hold the same weights (Megatron-Core's data-parallel
group "with context parallel"). Rank placement is Megatron-Core's ``--order`` (``order``, fastest-varying
dimension first, :mod:`topotrain.training.rank_order`); by default ``tp-cp-ep-dp-pp``: tensor-parallel ranks
adjacent (inside a server when ``tp`` ≤ GPUs per server), then context, then data parallel, then pipeline
stages outermost — ``rank = ((p·dp + d)·cp + c)·tp + t``. ``placement`` is the older alias: ``tp-first`` is
that default, ``dp-first`` the order ``ep-dp-tp-cp-pp`` (data-parallel ranks adjacent).

:class:`Plan` is a frozen pydantic dataclass: every field is checked when it is made (``Plan(tp=0)`` and
``dataclasses.replace(plan, tp=0)`` raise :class:`~topotrain.util.errors.ConfigErrors` naming ``plan.tp``), and
the checks that need two fields (ep | dp, a batch divisible by dp, interleaving) run as a model validator
that reports every problem at once. Checks against the cluster and the model (dp·tp·pp = GPUs, a model
without tensor-parallel layers at tp > 1, ep > 1 without experts) run when the scenario loader passes them
as validation context (:func:`plan_for`), or through :meth:`Plan.validate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import Field, TypeAdapter, ValidationError, ValidationInfo, model_validator

from topotrain.training.framework import FrameworkName
from topotrain.training.host_input import HostInput
from topotrain.training.length_binning import LengthBinning, check_model
from topotrain.training.rank_order import PLACEMENT_ORDERS, order_problems, rank_strides, resolved_order
from topotrain.training.sync import GossipOptions, PSOptions, SyncScheme, sync_problems
from topotrain.util.errors import ConfigError, ConfigErrors
from topotrain.util.fields import NonNegativeInt, PositiveInt
from topotrain.util.problems import config_dataclass, raise_problems, several
from topotrain.workload.context_parallel import cp_model_problems
from topotrain.workload.layer import TPSplit

if TYPE_CHECKING:
    from topotrain.workload.layer import Model

PipelineSchedule = Literal["1f1b", "gpipe", "interleaved"]
Recompute = Literal["none", "selective", "full"]
Placement = Literal["tp-first", "dp-first"]
DType = Literal["auto", "fp32", "tf32", "fp16", "bf16", "fp8"]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
PLACEMENTS: tuple[str, ...] = get_args(Placement)

#: Default gradient bucket (PyTorch DDP's ``bucket_cap_mb=25``), bytes.
DEFAULT_BUCKET_BYTES = 25 * 2**20


@config_dataclass("plan")
class Plan:
    """Parallelism and training options of one iteration (sizes in samples; ``bucket_bytes`` in bytes).

    ``micro_batch`` None: the whole per-replica batch in one micro-batch when ``pp`` = 1, else 1 sample.
    """

    dp: PositiveInt = 1
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    ep: PositiveInt = 1
    #: context parallelism: each sequence split over ``cp`` ranks (Megatron-Core ``--context-parallel-size``)
    cp: PositiveInt = 1
    global_batch: PositiveInt = 256
    micro_batch: PositiveInt | None = None
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: PositiveInt = 1
    zero_stage: Annotated[NonNegativeInt, Field(le=3)] = 0
    fsdp: Annotated[bool, Field(strict=True)] = False
    recompute: Recompute = "none"
    sequence_parallel: Annotated[bool, Field(strict=True)] = False
    #: with sequence parallelism, re-gather each column-parallel layer's input in the backward (Megatron-LM)
    #: instead of storing the gathered tensor; memory and time both follow it
    sp_regather: Annotated[bool, Field(strict=True)] = True
    tp_comm_overlap: Annotated[bool, Field(strict=True)] = False
    overlap_param_gather: Annotated[bool, Field(strict=True)] = False
    #: the weight-gradient GEMMs accumulate into the gradient buffer (Megatron's
    #: ``--gradient-accumulation-fusion``); off: autograd adds every micro-batch's gradients after the first
    #: into the accumulated ones, a pass over the local gradients (training/builder.py)
    grad_accumulation_fusion: Annotated[bool, Field(strict=True)] = False
    #: the dtype of the gradient buffer (memory only: training/memory.py, "Framework terms"): ``param``, the
    #: model's; ``fp32``, as Megatron-LM/Core keep it for bf16 training (``accumulate_allreduce_grads_in_fp32``)
    grad_reduce_dtype: Literal["param", "fp32"] = "param"
    #: the caching allocator's reserve beyond the allocated bytes, as a fraction of them (an assumption,
    #: training/memory.py "Framework terms"); 0: memory is checked on the allocated bytes alone
    allocator_fragmentation: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    bucket_bytes: PositiveInt = DEFAULT_BUCKET_BYTES
    overlap: Annotated[bool, Field(strict=True)] = True
    dp_algorithm: Annotated[str, Field(strict=True, min_length=1)] = "auto"
    tp_algorithm: Annotated[str, Field(strict=True, min_length=1)] = "ring"
    dtype: DType = "auto"  # auto: bf16 where the GPU has it, else fp16
    placement: Placement = "tp-first"
    #: Megatron-Core's ``--order`` (e.g. ``tp-cp-ep-dp-pp``, ``tp-pp-dp``); None: the one ``placement`` names
    order: Annotated[str, Field(strict=True, min_length=1)] | None = None
    #: the host input pipeline that can bound the samples per second (None: the GPUs alone bound them)
    host_input: HostInput | None = None
    #: how the data loader pads variable-length sequences (None: every sample is ``seq_len`` tokens)
    length_binning: LengthBinning | None = None
    #: transformer blocks per pipeline chunk, in chunk order (``pp · virtual_stages`` entries summing to the
    #: model's blocks): an uneven pipeline partition (training/partition.py); None: Megatron-LM's even cut
    partition: tuple[PositiveInt, ...] | None = None
    #: micro-batches of each data-parallel replica (``dp`` entries summing to ``dp · num_micro_batches``): uneven
    #: data-parallel shares, gradients weighted by share (training/balance.py); None: every replica alike
    dp_shares: tuple[PositiveInt, ...] | None = None
    #: gradient synchronisation (training/sync.py): bucketed allreduce, a parameter server, or gossip
    sync: SyncScheme = "allreduce"
    ps: PSOptions | None = None
    gossip: GossipOptions | None = None
    #: the framework whose own mechanisms (gradient-reduce timing, buckets, tied-gradient allreduce, pipeline
    #: exchanges) the iteration follows, :mod:`topotrain.training.framework`; None: the plan's fields alone
    framework: FrameworkName | None = None
    #: HSDP's sharding group (``framework: hsdp``): parameters sharded within groups of this many consecutive
    #: data-parallel ranks and replicated across them (PyTorch's HYBRID_SHARD; its default is a node's GPUs)
    shard_group: PositiveInt | None = None

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    @property
    def dp_cp(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together (data × context parallel)."""
        return self.dp * self.cp

    @property
    def rank_order(self) -> tuple[str, ...]:
        """The rank order in effect, every dimension named (fastest-varying first; module docstring)."""
        return resolved_order(self.order if self.order is not None else PLACEMENT_ORDERS[self.placement])

    @property
    def replica_batch(self) -> int:
        """Samples per data-parallel replica per iteration."""
        return self.global_batch // self.dp

    @property
    def micro_batch_size(self) -> int:
        if self.micro_batch is not None:
            return self.micro_batch
        return self.replica_batch if self.pp == 1 else 1

    @property
    def num_micro_batches(self) -> int:
        return self.replica_batch // self.micro_batch_size

    def rank(self, d: int, t: int, p: int, c: int = 0) -> int:
        """Global rank of (data-parallel index d, tensor index t, pipeline stage p, context index c)."""
        s_t, s_c, s_d, s_p = rank_strides(self.rank_order, self.tp, self.cp, self.dp, self.pp)
        return t * s_t + c * s_c + d * s_d + p * s_p

    def validate(self, gpus: int, field: str = "plan", model: Model | None = None) -> Plan:
        """This plan, after checking it against a cluster of ``gpus`` GPUs (and ``model``, if given)."""
        found = [ConfigError(f"{field}.{p.field}" if p.field else field, p.message, p.fix)
                 for p in against(self, gpus, model)]
        if found:
            raise ConfigErrors(found)
        return self

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> Plan:
        found = _own_problems(self)
        ctx = info.context or {}
        if "gpus" in ctx:
            found += against(self, int(ctx["gpus"]), ctx.get("model"))
        if found:
            raise several(found)
        return self


def _own_problems(p: Plan) -> list[ConfigError]:
    """Problems between the plan's own fields (field names relative to the plan)."""
    found: list[ConfigError] = []
    if p.cp == 1 and p.dp % p.ep:
        found.append(ConfigError("ep", f"ep={p.ep} does not divide dp={p.dp}",
                                 "choose ep | dp: experts are spread over the data-parallel ranks"))
    elif (p.dp * p.cp) % p.ep:
        found.append(ConfigError("ep", f"ep={p.ep} does not divide dp·cp = {p.dp * p.cp}",
                                 "choose ep | dp·cp: experts are spread over the data- and context-parallel ranks "
                                 "(Megatron-Core's expert data-parallel size is dp·cp/ep)"))
    if p.global_batch % p.dp:
        found.append(ConfigError("global_batch", f"global batch {p.global_batch} is not divisible by dp={p.dp}",
                                 "choose a batch that is a multiple of the data-parallel degree"))
    elif p.replica_batch % p.micro_batch_size:
        found.append(ConfigError("micro_batch", f"per-replica batch {p.replica_batch} (global_batch/dp) is not "
                                 f"divisible by micro-batch {p.micro_batch_size}",
                                 "choose a micro-batch that divides global_batch/dp"))
    elif p.pipeline_schedule == "interleaved" and p.num_micro_batches % p.pp:
        found.append(ConfigError("micro_batch", f"interleaved 1F1B needs the micro-batch count "
                                 f"({p.num_micro_batches}) to be a multiple of pp={p.pp}",
                                 "change global_batch or micro_batch"))
    if p.pipeline_schedule == "interleaved":
        if p.virtual_stages < 2:
            found.append(ConfigError("virtual_stages", "interleaved 1F1B needs virtual_stages ≥ 2",
                                     "set virtual_stages: 2 or use pipeline_schedule: 1f1b"))
    elif p.virtual_stages != 1:
        found.append(ConfigError("virtual_stages", "virtual stages need pipeline_schedule: interleaved",
                                 "set pipeline_schedule: interleaved or virtual_stages: 1"))
    if p.tp_comm_overlap and not p.sequence_parallel:
        found.append(ConfigError("tp_comm_overlap", "tensor-parallel communication overlap splits the "
                                 "reduce-scatter/all-gather of sequence parallelism", "set sequence_parallel: true"))
    if p.order is not None:
        found += order_problems(p.order, p.tp, p.cp, p.ep, p.dp, p.pp)
        if p.placement != "tp-first":
            found.append(ConfigError("placement", "the rank order is given twice (placement and order)",
                                     f"drop placement: {p.placement} is order: {PLACEMENT_ORDERS[p.placement]}"))
    if p.cp > 1 and p.length_binning is not None:
        found.append(ConfigError("cp", "context parallelism with variable-length (binned) sequences is not "
                                 "modelled", "drop length_binning or use cp: 1"))
    found += sync_problems(p.sync, p.ps, p.gossip, dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep,
                           zero_stage=p.zero_stage, fsdp=p.fsdp)
    if p.overlap_param_gather and (p.zero_stage not in (1, 2) or p.fsdp):
        found.append(ConfigError("overlap_param_gather", "overlaps the ZeRO-1/2 parameter all-gather",
                                 "set zero_stage: 1 or 2, or drop overlap_param_gather"))
    if p.dp_shares is not None:
        if len(p.dp_shares) != p.dp:
            found.append(ConfigError("dp_shares", f"has {len(p.dp_shares)} entries for dp={p.dp} replicas",
                                     "give one micro-batch count per data-parallel replica"))
        elif p.global_batch % p.dp == 0 and sum(p.dp_shares) != p.dp * p.num_micro_batches:
            found.append(ConfigError("dp_shares", f"adds up to {sum(p.dp_shares)} micro-batches, but the global "
                                     f"batch is {p.dp * p.num_micro_batches} micro-batches of {p.micro_batch_size}",
                                     "make the shares add up to global_batch / micro_batch"))
        if p.pipeline_schedule == "interleaved" and any(m % p.pp for m in p.dp_shares):
            found.append(ConfigError("dp_shares", f"interleaved 1F1B needs every share to be a multiple of pp={p.pp}",
                                     "round the shares to multiples of pp"))
        if p.ep > 1 or p.cp > 1:
            found.append(ConfigError("dp_shares", "uneven data-parallel shares with expert or context parallelism "
                                     "are not modelled", "use ep: 1 and cp: 1, or drop dp_shares"))
    if p.partition is not None and len(p.partition) != p.pp * p.virtual_stages:
        found.append(ConfigError("partition", f"has {len(p.partition)} entries for pp·virtual_stages = "
                                 f"{p.pp * p.virtual_stages} pipeline chunks", "give one block count per chunk"))
    if p.framework is not None:
        found += _framework_problems(p)
    if p.shard_group is not None and p.framework != "hsdp":
        found.append(ConfigError("shard_group", "is HSDP's sharding group", "set framework: hsdp or drop shard_group"))
    return found


def _framework_problems(p: Plan) -> list[ConfigError]:
    """Fields a framework fixes itself, or cannot run (:mod:`topotrain.training.framework`)."""
    found: list[ConfigError] = []
    if p.bucket_bytes != DEFAULT_BUCKET_BYTES:
        found.append(ConfigError("bucket", f"framework {p.framework} sets its own gradient bucket size",
                                 "drop bucket, or drop framework to use plan.bucket"))
    if p.framework == "deepspeed" and (p.zero_stage >= 2 or p.fsdp):
        found.append(ConfigError("framework", "deepspeed models DeepSpeed's pipeline engine, which refuses "
                                 "ZeRO-2/3 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\")",
                                 "use zero_stage: 0 or 1, or drop framework"))
    if p.framework in ("megatron-core", "megatron-lm-2021") and p.fsdp:
        found.append(ConfigError("framework", f"{p.framework} does not run FSDP", "drop fsdp or framework"))
    if p.framework in ("fsdp", "hsdp"):
        others = [f"{k}={v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)) if v != 1]
        if others:
            found.append(ConfigError("framework", f"{p.framework} models PyTorch FSDP's unit-level schedule alone, "
                                     f"not with {', '.join(others)}", "use fsdp: true (FSDP at pipeline-chunk "
                                     "granularity) with the other degrees, or drop them"))
        if p.zero_stage or p.fsdp or p.sync != "allreduce":
            found.append(ConfigError("framework", f"{p.framework} shards parameters, gradients and optimizer itself",
                                     "drop zero_stage, fsdp and sync"))
    if p.framework == "hsdp":
        if p.shard_group is None:
            found.append(ConfigError("shard_group", "hsdp needs its sharding group size",
                                     "give shard_group (PyTorch's default is the GPUs of one server, e.g. 8)"))
        elif p.dp % p.shard_group:
            found.append(ConfigError("shard_group", f"{p.shard_group} does not divide dp={p.dp}",
                                     "choose a shard group dividing the data-parallel degree"))
    return found


def against(p: Plan, gpus: int, model: Model | None = None) -> list[ConfigError]:
    """Problems of ``p`` on a cluster of ``gpus`` GPUs training ``model`` (fields relative to the plan)."""
    found: list[ConfigError] = []
    if p.gpus != gpus and p.cp > 1:
        found.append(ConfigError("", f"dp·tp·cp·pp = {p.dp}·{p.tp}·{p.cp}·{p.pp} = {p.gpus}, but the cluster has "
                                 f"{gpus} GPUs", "choose degrees whose product is the GPU count, or leave dp out: "
                                 "it is then GPUs/(tp·cp·pp)"))
    elif p.gpus != gpus:
        found.append(ConfigError("", f"dp·tp·pp = {p.dp}·{p.tp}·{p.pp} = {p.gpus}, but the cluster has {gpus} GPUs",
                                 "choose degrees whose product is the GPU count, or leave dp out: it is then "
                                 "GPUs/(tp·pp)"))
    if model is not None:
        splittable = any(layer.tp_split in (TPSplit.COLUMN, TPSplit.ROW) for layer in model.layers)
        if p.tp > 1 and not splittable:
            found.append(ConfigError("tp", f"{model.name} has no tensor-parallel layers, so it cannot run tp={p.tp}",
                                     "use tp: 1; a CNN trains data-parallel"))
        if p.sequence_parallel and not splittable:
            found.append(ConfigError("sequence_parallel", f"{model.name} has no tensor-parallel layers",
                                     "drop sequence_parallel"))
        if p.ep > 1 and model.experts <= 1:
            found.append(ConfigError("ep", f"{model.name} has no experts, so it cannot run ep={p.ep}",
                                     "use ep: 1, or a mixture-of-experts model"))
        elif p.ep > 1 and model.experts % p.ep:
            found.append(ConfigError("ep", f"ep={p.ep} does not divide the {model.experts} experts of {model.name}",
                                     "choose ep | experts"))
        if p.length_binning is not None:
            found += check_model(p.length_binning, model)
        if p.partition is not None and sum(p.partition) != model.num_blocks:
            found.append(ConfigError("partition", f"adds up to {sum(p.partition)} blocks, but {model.name} has "
                                     f"{model.num_blocks}", "make the block counts add up to the model's blocks"))
        if p.cp > 1:
            found += cp_model_problems(model, p.cp)
    return found


_ADAPTER: TypeAdapter[Plan] = TypeAdapter(Plan)


def plan_for(fields: dict[str, Any], gpus: int, model: Model | None = None, prefix: str = "plan") -> Plan:
    """The plan of ``fields`` checked against the cluster's ``gpus`` and ``model``: every problem at once."""
    try:
        return _ADAPTER.validate_python(fields, context={"gpus": gpus, "model": model})
    except ValidationError as e:
        raise_problems(e, prefix, Plan)
