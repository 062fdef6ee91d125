"""Checkpoints: how many bytes, how long they stall training, and how often to take them.

**Bytes.** A checkpoint holds what training needs to resume: the 16-bit weights and the optimizer states
(fp32 master weights, Adam's two moments: ``K = 12`` bytes per parameter in mixed precision), not the
gradients. Per rank they are :mod:`topotrain.training.memory`'s model-state accounting (ZeRO's
``weights_bytes`` and ``optimizer_bytes``, Rajbhandari et al. SC'20 §5), per pipeline stage. Sharded
(ZeRO ≥ 1 or FSDP) every rank writes its own optimizer shard and ``1/dp`` of its stage's replicated weights
(PyTorch Distributed Checkpoint and Megatron's distributed checkpoints deduplicate replicated tensors over
the data-parallel ranks); unsharded (plain data parallelism) one replica's ``tp·pp`` ranks write
everything. Both store the same unique bytes; they differ in how many writers share them.

**Time.** A storage tier has an aggregate write and read bandwidth (the file system's) and a per-writer one
(a GPU's share of its server's path to storage). Writing takes
``max(busiest writer's bytes / per-writer bandwidth, all bytes / aggregate bandwidth)``. A restart reads
every rank's states back (unsharded: each data-parallel replica reads the same files). A synchronous
checkpoint stalls training for the whole write; an asynchronous one (PyTorch DCP ``async_save``,
Megatron's async save, CheckFreq: Mohan et al., FAST'21) stalls only for the copy of each rank's states to
host memory and persists in the background; it counts once persisted, and the next cannot start before.

**Interval.** With ``δ`` the stall and ``M`` the job's mean time between interruptions, Young's first-order
optimum is ``τ = √(2δM)`` (Young, "A first order approximation to the optimum checkpoint interval", CACM
17(9), 1974) and Daly's higher-order one ``τ = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] − δ`` for ``δ < 2M``, else
``τ = M`` (Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
22(3), 2006). Daly's expected wall time for ``W`` seconds of work in segments of ``τ`` with dumps of
``δ`` and restarts of ``R`` under Poisson failures is ``M·e^{R/M}·(e^{(τ+δ)/M} − 1)·W/τ``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from topotrain.training.memory import MemoryPlan, memory_per_stage, memory_plan_from
from topotrain.training.plan import Plan
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model

Mode = Literal["sync", "async"]


@dataclass(frozen=True)
class StorageTier:
    """Where checkpoints go. Bandwidths in bytes per second; ``snapshot_bytes_per_s`` is one GPU's copy of
    its states to host memory (what an asynchronous checkpoint stalls for; PCIe Gen5 x16 ≈ 50 GB/s per
    direction, less in practice)."""

    name: str = "parallel-fs"
    write_bytes_per_s: float = 2e12
    read_bytes_per_s: float = 2e12
    per_writer_bytes_per_s: float = 2e9
    snapshot_bytes_per_s: float = 2.5e10

    def __post_init__(self) -> None:
        for f in ("write_bytes_per_s", "read_bytes_per_s", "per_writer_bytes_per_s", "snapshot_bytes_per_s"):
            v = getattr(self, f)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"checkpoint.storage.{f.removesuffix('_bytes_per_s')}",
                                  f"must be a positive bandwidth, got {v!r} B/s", "write e.g. 2TB/s")


@dataclass(frozen=True)
class CheckpointSize:
    """Bytes of one checkpoint: all of it (unique), the busiest writer's share (what an asynchronous
    checkpoint copies to host memory before writing it), and how many write."""

    total_bytes: float
    per_writer_bytes: float
    writers: int
    #: bytes all ranks read back on a restart (unsharded: every data-parallel replica reads the same files)
    restore_bytes: float
    #: the busiest rank's states (what it reads back on a restart)
    per_rank_bytes: float
    sharded: bool


def checkpoint_size(model: Model, plan: Plan) -> CheckpointSize:
    """The checkpoint of ``model`` trained with ``plan`` (16-bit weights + optimizer states per rank).

    The unique bytes are the model states of the whole model on one rank (what
    :func:`~topotrain.training.memory.memory_per_stage` counts without any parallelism): replicas, tensor
    splits and ZeRO shards change who writes them, not how many there are."""
    stages = memory_per_stage(model, plan)
    whole = memory_per_stage(model, MemoryPlan(optimizer=memory_plan_from(plan).optimizer))[0]
    zero = 3 if plan.fsdp else plan.zero_stage
    dp, sharded = plan.dp, zero >= 1
    busiest = 0.0
    rank_max = 0.0
    restore = 0.0
    for st in stages:
        rank = st.weights_bytes + st.optimizer_bytes
        rank_max = max(rank_max, rank)
        restore += plan.tp * dp * rank  # every rank reads its own states back
        # sharded: a rank writes its optimizer shard and 1/dp of the weights its stage replicates
        writer = st.optimizer_bytes + (st.weights_bytes if zero >= 3 else st.weights_bytes / dp) if sharded else rank
        busiest = max(busiest, writer)
    writers = plan.gpus if sharded else plan.tp * plan.pp
    return CheckpointSize(whole.weights_bytes + whole.optimizer_bytes, busiest, writers, restore, rank_max, sharded)


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint costs: the stall of training (``stall_s``), the time until it is durable after
    the stall ends (``persist_lag_s``: 0 for a synchronous one), and reading it back on a restart."""

    mode: Mode
    write_s: float
    stall_s: float
    persist_lag_s: float
    read_s: float
    size: CheckpointSize


def checkpoint_cost(size: CheckpointSize, storage: StorageTier, mode: Mode = "async") -> CheckpointCost:
    """Write, stall and read times of a checkpoint of ``size`` on ``storage`` (module docstring)."""
    if mode not in ("sync", "async"):
        raise ConfigError("checkpoint.mode", f"unknown mode {mode!r}", "use sync or async")
    write = max(size.per_writer_bytes / storage.per_writer_bytes_per_s, size.total_bytes / storage.write_bytes_per_s)
    read = max(size.per_rank_bytes / storage.per_writer_bytes_per_s, size.restore_bytes / storage.read_bytes_per_s)
    if mode == "sync":
        return CheckpointCost(mode, write, write, 0.0, read, size)
    snap = size.per_writer_bytes / storage.snapshot_bytes_per_s
    return CheckpointCost(mode, write, snap, write, read, size)


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young (1974): ``√(2δM)``, compute time between checkpoints."""
    _check(stall_s, mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Daly (2006): ``√(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] − δ`` for ``δ < 2M``, else ``M``."""
    _check(stall_s, mtbf_s)
    if math.isinf(mtbf_s):
        return math.inf
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall_s


def daly_expected_time_s(work_s: float, interval_s: float, stall_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly (2006): expected wall time of ``work_s`` in segments of ``interval_s``, each followed by a
    dump of ``stall_s``, restarts of ``restart_s``, Poisson interruptions of mean ``mtbf_s`` (failures may
    strike dumps and restarts too)."""
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + stall_s) / m) * work_s / interval_s


def lost_per_failure_s(interval_s: float, stall_s: float, restart_s: float) -> float:
    """First-order time one interruption costs: half a checkpoint cycle of lost work plus the restart."""
    return 0.5 * (interval_s + stall_s) + restart_s


def _check(stall_s: float, mtbf_s: float) -> None:
    if not (stall_s > 0 and math.isfinite(stall_s)):
        raise ConfigError("checkpoint", f"stall must be a positive time, got {stall_s!r} s", "check the storage")
    if not mtbf_s > 0:
        raise ConfigError("failures", f"mean time between failures must be > 0, got {mtbf_s!r} s",
                          "check the failure rates")
