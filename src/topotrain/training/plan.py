"""A parallel plan: how one training iteration is split over the GPUs, validated once at the edge.

Degrees multiply to the GPU count: ``dp · tp · pp = gpus`` (expert parallelism ``ep`` reuses the data-
parallel ranks, as in Megatron-LM/DeepSpeed-MoE, so ``ep`` must divide ``dp``). Rank placement follows
Megatron-LM: tensor-parallel ranks are adjacent (inside a server when ``tp`` ≤ GPUs per server), then data
parallel, then pipeline stages outermost — ``rank = (p·dp + d)·tp + t`` — unless ``placement`` says
``dp-first`` (data-parallel ranks adjacent, then tensor, then pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from topotrain.errors import ConfigError
from topotrain.units import parse_size

PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved")
RECOMPUTE = ("none", "selective", "full")
PLACEMENTS = ("tp-first", "dp-first")


@dataclass(frozen=True)
class Plan:
    """Parallelism and training options of one iteration (sizes in samples)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    global_batch: int = 256
    micro_batch: int = 0  # 0: the whole per-replica batch in one micro-batch (pp = 1) / 1 (pp > 1)
    pipeline_schedule: str = "1f1b"
    virtual_stages: int = 1
    zero_stage: int = 0
    fsdp: bool = False
    recompute: str = "none"
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    overlap_param_gather: bool = False
    bucket_bytes: int = 25 * 2**20
    overlap: bool = True
    dp_algorithm: str = "auto"
    tp_algorithm: str = "ring"
    dtype: str = "auto"  # auto: bf16 where the GPU has it, else fp16
    placement: str = "tp-first"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def replica_batch(self) -> int:
        """Samples per data-parallel replica per iteration."""
        return self.global_batch // self.dp

    @property
    def micro_batch_size(self) -> int:
        if self.micro_batch:
            return self.micro_batch
        return self.replica_batch if self.pp == 1 else 1

    @property
    def num_micro_batches(self) -> int:
        return self.replica_batch // self.micro_batch_size

    def rank(self, d: int, t: int, p: int) -> int:
        """Global rank of (data-parallel index d, tensor index t, pipeline stage p)."""
        if self.placement == "dp-first":
            return (p * self.tp + t) * self.dp + d
        return (p * self.dp + d) * self.tp + t

    def validate(self, gpus: int, field: str = "plan") -> Plan:
        for name in ("dp", "tp", "pp", "ep", "global_batch", "virtual_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{field}.{name}", f"must be a positive integer, got {v!r}",
                                  f"give {name}: 1 or more")
        if self.gpus != gpus:
            raise ConfigError(field, f"dp·tp·pp = {self.dp}·{self.tp}·{self.pp} = {self.gpus}, but the cluster "
                              f"has {gpus} GPUs", "choose degrees whose product is the GPU count")
        if self.dp % self.ep:
            raise ConfigError(f"{field}.ep", f"ep={self.ep} does not divide dp={self.dp}", "choose ep | dp")
        if self.global_batch % self.dp:
            raise ConfigError("batch", f"global batch {self.global_batch} is not divisible by dp={self.dp}",
                              "choose a batch that is a multiple of the data-parallel degree")
        mb = self.micro_batch_size
        if mb < 1 or self.replica_batch % mb:
            raise ConfigError(f"{field}.micro_batch", f"per-replica batch {self.replica_batch} is not divisible "
                              f"by micro-batch {mb}", "choose a micro-batch that divides global_batch/dp")
        checks = (("pipeline_schedule", PIPELINE_SCHEDULES), ("recompute", RECOMPUTE),
                  ("placement", PLACEMENTS))
        for name, allowed in checks:
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{field}.{name}", f"unknown value {getattr(self, name)!r}",
                                  f"use one of {', '.join(allowed)}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"{field}.zero_stage", f"must be 0-3, got {self.zero_stage!r}", "use 0, 1, 2 or 3")
        if self.pipeline_schedule == "interleaved":
            if self.virtual_stages < 2:
                raise ConfigError(f"{field}.virtual_stages", "interleaved 1F1B needs virtual_stages >= 2",
                                  "set virtual_stages: 2 or use pipeline_schedule: 1f1b")
            if self.num_micro_batches % self.pp:
                raise ConfigError(f"{field}.micro_batch", f"interleaved 1F1B needs the micro-batch count "
                                  f"({self.num_micro_batches}) to be a multiple of pp={self.pp}",
                                  "change global_batch or micro_batch")
        elif self.virtual_stages != 1:
            raise ConfigError(f"{field}.virtual_stages", "virtual stages need pipeline_schedule: interleaved",
                              "set pipeline_schedule: interleaved or virtual_stages: 1")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ConfigError(f"{field}.tp_comm_overlap", "tensor-parallel communication overlap splits the "
                              "reduce-scatter/all-gather of sequence parallelism", "set sequence_parallel: true")
        if self.overlap_param_gather and (self.zero_stage not in (1, 2) or self.fsdp):
            raise ConfigError(f"{field}.overlap_param_gather", "overlaps the ZeRO-1/2 parameter all-gather",
                              "set zero_stage: 1 or 2, or drop overlap_param_gather")
        if self.bucket_bytes <= 0:
            raise ConfigError(f"{field}.bucket_bytes", "must be positive", "e.g. bucket: 25MiB")
        return self


_ALIASES = {"bucket": "bucket_bytes", "schedule": "pipeline_schedule", "zero": "zero_stage",
            "batch": "global_batch", "virtual": "virtual_stages"}


def plan_from_dict(d: Mapping[str, Any] | None, field: str = "plan") -> Plan:
    """Plan from the ``plan`` section of a scenario (unknown keys are an error)."""
    d = dict(d or {})
    known = {f.name: f for f in fields(Plan)}
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        name = _ALIASES.get(key, key)
        if name not in known:
            raise ConfigError(f"{field}.{key}", "unknown key", f"known: {', '.join(sorted(known))}")
        default = known[name].default
        if name == "bucket_bytes":
            value = int(parse_size(value, f"{field}.{key}"))
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{field}.{key}", f"must be true or false, got {value!r}", "write true/false")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{field}.{key}", f"must be an integer, got {value!r}", "write a whole number")
        elif isinstance(default, str):
            value = str(value)
        kwargs[name] = value
    return replace(Plan(), **kwargs)
