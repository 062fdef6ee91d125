"""The scenario schema: pydantic models of everything a scenario file (or ``--set``, or the Python API) says.

These models check a scenario's *shape* — keys, types, units, ranges, and the rules between fields of
one section — all at once. What needs the catalog or a built cluster (a template's name, dp·tp·pp = GPUs,
a CNN at tp > 1) is checked by :mod:`topotrain.scenario.load` right after, before anything is built.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from topotrain.scenario.cluster_spec import (  # the cluster and catalog sections (their module)
    ClusterSpec,
    CommSpec,
    NetworkModelName,
    Strict,
    _kind_of,
)
from topotrain.training.framework import FrameworkName
from topotrain.training.host_input import HostInput
from topotrain.training.length_binning import LengthBinning
from topotrain.training.plan import DType, PipelineSchedule, Placement, Recompute
from topotrain.training.sync import GossipOptions, PSOptions, SyncScheme
from topotrain.util.fields import (
    MAX_COUNT,
    Count,
    Name,
    NonNegativeInt,
    Size,
)
from topotrain.util.problems import problem
from topotrain.util.units import quote


# ---- model, plan, the rest -------------------------------------------------------------------------------
class ZooModelSpec(BaseModel):
    """``model: {name: gpt3-175b, seq_len: 4096, ...}``: a built-in model with architecture overrides
    (checked by the model's factory)."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)

    name: Name

    @model_validator(mode="after")
    def _counts_bounded(self) -> ZooModelSpec:
        """A whole-number override (``seq_len``, ``layers``, ``hidden``, ...) is a count of at most MAX_COUNT,
        as a parameterized transformer's are (``seq_len: 18446744073709551616`` overflowed int64 deep in a
        collective: "internal error OverflowError")."""
        for key, v in (self.model_extra or {}).items():
            if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_COUNT:
                raise problem(f"must be a whole number from 0 to {MAX_COUNT:,} (got {quote(v)})",
                              f"write e.g. {key}: 4096", key)
        return self


class TransformerSpec(BaseModel):
    """``model: {type: transformer, layers, hidden, heads, seq_len, vocab, ...}``: a parameterized
    transformer (any keyword of topotrain.workload.transformer.transformer; checked there)."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)

    type: Literal["transformer"]
    name: Name = "custom-transformer"
    layers: Count
    hidden: Count
    heads: Count
    seq_len: Count
    vocab: Count


def _model_kind(v: Any) -> str:
    """Which form of ``model:`` a value is — a mapping when validating, a built model when serializing."""
    if isinstance(v, TransformerSpec):
        return "Transformer"
    if isinstance(v, ZooModelSpec):
        return "Zoo"
    if isinstance(v, dict):
        return "Transformer" if "type" in v else "Zoo"
    return "Name"


ModelRef = Annotated[
    Annotated[Name, Tag("Name")] | Annotated[ZooModelSpec, Tag("Zoo")] | Annotated[TransformerSpec,
                                                                                   Tag("Transformer")],
    Discriminator(_model_kind),
]

_PLAN_ALIASES = {"bucket_bytes": "bucket", "schedule": "pipeline_schedule", "zero": "zero_stage",
                 "batch": "global_batch", "virtual": "virtual_stages"}


class PlanSpec(Strict):
    """``plan``: parallel degrees and training options as written (``dp`` defaults to GPUs/(tp·cp·pp);
    ``bucket`` needs its unit, e.g. ``25MiB``; the resolved :class:`~topotrain.training.plan.Plan` is
    checked against the cluster and the model by the loader)."""

    dp: Count | None = None
    tp: Count = 1
    pp: Count = 1
    ep: Count = 1
    #: context parallelism (ring attention over cp ranks; Megatron-Core ``--context-parallel-size``)
    cp: Count = 1
    global_batch: Count | None = None
    micro_batch: Count | None = None
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: Count = 1
    zero_stage: Annotated[NonNegativeInt, Field(le=3)] = 0
    fsdp: Annotated[bool, Field(strict=True)] = False
    recompute: Recompute = "none"
    sequence_parallel: Annotated[bool, Field(strict=True)] = False
    sp_regather: Annotated[bool, Field(strict=True)] = True
    tp_comm_overlap: Annotated[bool, Field(strict=True)] = False
    overlap_param_gather: Annotated[bool, Field(strict=True)] = False
    grad_accumulation_fusion: Annotated[bool, Field(strict=True)] = False
    #: the gradient buffer's dtype, memory only (``fp32``: Megatron's bf16 runs), :mod:`topotrain.training.memory`
    grad_reduce_dtype: Literal["param", "fp32"] = "param"
    #: the caching allocator's reserve beyond the allocated bytes, a fraction of them (an assumption; memory.py)
    allocator_fragmentation: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    bucket: Annotated[Size, Field(json_schema_extra={"default": "25MiB"})] = 25 * 2**20
    overlap: Annotated[bool, Field(strict=True)] = True
    dp_algorithm: Name = "auto"
    tp_algorithm: Name = "ring"
    dtype: DType = "auto"
    placement: Placement = "tp-first"
    #: rank order as Megatron-Core's ``--order`` (fastest-varying first, e.g. ``tp-cp-ep-dp-pp``); default: placement's
    order: Name | None = None
    #: the host input pipeline (DataLoader workers and the server's CPU), :mod:`topotrain.training.host_input`
    host_input: HostInput | None = None
    #: variable-length sequences padded per micro-batch (LDDL's binning), :mod:`topotrain.training.length_binning`
    length_binning: LengthBinning | None = None
    #: transformer blocks per pipeline chunk, in order (uneven pipeline stages; None: Megatron-LM's even cut)
    partition: Annotated[list[Count], Field(min_length=1)] | None = None
    #: micro-batches per data-parallel replica (uneven data-parallel shares; None: the same for every replica)
    dp_shares: Annotated[list[Count], Field(min_length=1)] | None = None
    #: ``speed``: the planner (training/balance.py) chooses partition and dp_shares for the cluster's GPUs
    balance: Literal["none", "speed"] = "none"
    #: gradient synchronisation: allreduce (default), ps or gossip, with their options (training/sync.py)
    sync: SyncScheme = "allreduce"
    ps: PSOptions | None = None
    gossip: GossipOptions | None = None
    #: the framework whose mechanisms the iteration follows (:mod:`topotrain.training.framework`); default none
    framework: FrameworkName | None = None
    #: HSDP's sharding group size (``framework: hsdp``; PyTorch's default: a node's GPUs)
    shard_group: Count | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for alias, key in _PLAN_ALIASES.items():
            if alias in out:
                if key in out:
                    raise problem(f"given twice, as {alias} and {key}", "remove one", alias)
                value = out.pop(alias)
                if alias == "bucket_bytes" and isinstance(value, int) and not isinstance(value, bool):
                    value = f"{value}B"  # the key's name states the unit
                out[key] = value
        return out


class BatchSpec(Strict):
    """``batch: {global: 1024, micro: 4}``."""

    global_: Annotated[Count | None, Field(alias="global")] = None
    micro: Count | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


BatchRef = Annotated[
    Annotated[Count, Tag("Number")] | Annotated[BatchSpec, Tag("Mapping")],
    Discriminator(lambda v: _kind_of(v, "Mapping", "Number")),
]


class ComputeSpec(Strict):
    """``compute``: roofline parameter overrides and/or a measured per-layer profile."""

    #: overrides of topotrain.compute.roofline.ComputeParams (checked by that model)
    params: dict[str, Any] = {}
    profile: Name | None = None
    fallback: Annotated[bool, Field(strict=True)] = True
    allow_cpu_profile: Annotated[bool, Field(strict=True)] = False
    cross_gpu_scaling: Literal["habitat", "peak"] | None = None


class StragglersSpec(Strict):
    """``stragglers``: fixed per-GPU slowdowns (≥ 1) and/or lognormal noise over every GPU."""

    gpus: dict[str, Annotated[float, Field(ge=1)]] = {}
    lognormal_sigma: Annotated[float, Field(ge=0, le=10)] = 0.0
    seed: NonNegativeInt = 0


class DegradedLinkSpec(Strict):
    """One entry of ``degraded_links``: the link a–b keeps ``factor`` of its bandwidth (0: failed)."""

    a: Name
    b: Name
    factor: Annotated[float, Field(ge=0, le=1)] = 0.0


class ScenarioSpec(Strict):
    """A whole scenario as written: cluster, model, batch, plan, network model, communication library,
    compute, faults."""

    name: Name | None = None
    cluster: ClusterSpec
    model: ModelRef
    batch: BatchRef | None = None
    plan: PlanSpec = PlanSpec()
    network: NetworkModelName = "flow"
    comm: CommSpec = CommSpec()
    compute: ComputeSpec = ComputeSpec()
    stragglers: StragglersSpec | None = None
    degraded_links: list[DegradedLinkSpec] = []

    @model_validator(mode="after")
    def _batch_once(self) -> ScenarioSpec:
        if isinstance(self.batch, BatchSpec):
            if self.batch.global_ is not None and self.plan.global_batch is not None:
                raise problem("the global batch is given twice (batch.global and plan.global_batch)",
                              "remove one", "batch")
            if self.batch.micro is not None and self.plan.micro_batch is not None:
                raise problem("the micro-batch is given twice (batch.micro and plan.micro_batch)", "remove one",
                              "batch")
        elif self.batch is not None and self.plan.global_batch is not None:
            raise problem("the global batch is given twice (batch and plan.global_batch)", "remove one", "batch")
        return self

    @model_validator(mode="after")
    def _fabric_model(self) -> ScenarioSpec:
        fabric = self.cluster.fabric
        if (fabric is not None and self.network not in ("flow", "analytical")
                and (fabric.switching == "store-and-forward" or fabric.header > 0)):
            raise problem(f"a packet fabric (framing, store-and-forward) is not modelled by {self.network}",
                          "it is modelled by the barrier models: use network: flow (or analytical)",
                          "cluster.fabric")
        return self
