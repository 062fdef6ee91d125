"""Execute a topotrain :class:`~topotrain.collectives.schedule.Schedule` with torch.distributed.

The schedule is the one the network models time; here every process runs its own part of it with
point-to-point operations (``isend``/``irecv`` batched per phase through
``torch.distributed.batch_isend_irecv``), so the same data that predicts a collective also performs it.
Works with any backend that implements point-to-point operations (gloo on CPU, NCCL on GPU).

Semantics (exactly those of :mod:`topotrain.collectives.schedule`):

* In phase ``k`` this rank posts one ``isend`` per transfer it sources and one ``irecv`` into a fresh
  temporary buffer per transfer it receives, waits for all of them, and only then applies the received
  data in transfer order — ``reduce`` combines it into its chunks, otherwise it overwrites them. Sends
  read the buffer before any receive of the phase is applied, so all transfers of a phase see the state
  from before the phase. A transfer from a rank to itself is a local copy with the same rule.
* Every rank of ``schedule.ranks`` must call the executor (even a rank without transfers); ranks of the
  process group that are not in the schedule must not.
* Matching: a message's tag is its transfer's index in the phase (gloo matches by tag), and both ends
  post a pair's messages in transfer order (NCCL, which ignores tags, matches in order). NCCL wants the
  first operation on a group to involve all its ranks, so the first schedule covering a whole NCCL
  group is preceded by one one-element all_reduce.

Units — a schedule is built in bytes; a tensor is cut in elements. The executor maps the schedule's
cumulative chunk boundaries onto the buffer proportionally, ``b ↦ floor(b·N/T)`` (:func:`chunk_offsets`;
``N`` the buffer's numel, ``T`` the sum of the chunk sizes). That is a partition of the buffer that
every rank computes alike, for any dtype and any numel — smaller than, or not divisible by, the number
of ranks included (chunks that map to no element send nothing) — so the collective's result is exact
whatever the mapping; only the split of the work between chunks can move by less than one element. Two
ways to build a schedule for a tensor (:func:`schedule_size`):

* ``unit="bytes"`` (what the wrappers and the DDP hook do): ``size_bytes = numel · element_size``, the
  very schedule topotrain times for that message, with its size-dependent choices (pipeline chunks,
  ...) made for the real byte count; boundaries map to ``floor(b / element_size)``.
* ``unit="elements"``: ``size = numel``, one schedule "byte" per element; boundaries are then exact
  element offsets (the identity mapping).

Buffer layouts of the wrappers (``p`` ranks; "the buffer" is that of :class:`CollectiveOp`):

* :func:`all_reduce`, :func:`broadcast`, :func:`reduce`: the per-rank tensor, changed in place. The
  broadcast root / reduce destination are whatever the schedule says (``chunk_src`` / ``chunk_dst``);
  after :func:`reduce` the buffers of the other ranks hold partial results.
* :func:`reduce_scatter`: input = the full buffer; returns a new tensor with this rank's chunks
  (``chunk_dst == rank``) concatenated in chunk order; the input is not changed.
* :func:`all_gather`: ``output`` = the full buffer, changed in place, in which this rank's own shard
  (its chunks, ``chunk_src == rank``) is pre-filled — or pass ``input=`` to have it copied there.
* :func:`all_to_all`: the schedule's chunk space is the concatenation of all ranks' send buffers (chunk
  ``i·p + j`` is the block rank ``i`` sends to rank ``j`` in the usual layout): this rank's send buffer
  fills its chunks (``chunk_src == rank``) in chunk order and the returned receive buffer is its chunks
  ``chunk_dst == rank`` in chunk order — block ``i`` from rank ``i``, as ``all_to_all_single``. The
  executor keeps a working copy of the whole chunk space (``p`` times the send buffer).

Source: the step-wise (barrier between phases) execution model of Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005; PyTorch
``torch.distributed`` point-to-point API (``P2POp``, ``batch_isend_irecv``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("topotrain.comm needs PyTorch: pip install 'topotrain[torch]' (torch==2.13.0)") from e

from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

__all__ = [
    "RankPlan",
    "schedule_size",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "build_execution_schedule",
    "chunk_offsets",
    "plan_schedule",
    "rank_slices",
    "reduce",
    "reduce_scatter",
    "resolve_rank_of",
    "run_plan",
    "run_schedule",
    "simulate_schedule",
]


# ---- reductions -----------------------------------------------------------------------------------
def _sum(d: torch.Tensor, s: torch.Tensor) -> None:
    d.add_(s)


def _prod(d: torch.Tensor, s: torch.Tensor) -> None:
    d.mul_(s)


def _max(d: torch.Tensor, s: torch.Tensor) -> None:
    torch.maximum(d, s, out=d)


def _min(d: torch.Tensor, s: torch.Tensor) -> None:
    torch.minimum(d, s, out=d)


_COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    "sum": _sum, "prod": _prod, "max": _max, "min": _min,
}


def _combine(op: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    fn = _COMBINE.get(str(op).lower())
    if fn is None:
        raise ConfigError("op", f"unknown reduction {op!r}", f"use one of {', '.join(_COMBINE)}")
    return fn


# ---- chunk geometry -------------------------------------------------------------------------------
def schedule_size(tensor: torch.Tensor, unit: str = "bytes") -> int:
    """The size to build a schedule of ``tensor`` with: ``numel · element_size`` (``unit="bytes"``, the
    real message) or ``numel`` (``unit="elements"``, one schedule byte per element).

    ``tensor`` is the buffer that :class:`CollectiveOp` names (allgather: the full output; reduce-scatter:
    the full input; all-to-all: the per-rank send buffer).
    """
    if unit == "bytes":
        return int(tensor.numel() * tensor.element_size())
    if unit == "elements":
        return int(tensor.numel())
    raise ConfigError("unit", f"unknown unit {unit!r}", "use 'bytes' or 'elements'")


def chunk_offsets(schedule: Schedule, numel: int) -> np.ndarray:
    """Element offsets of the chunk boundaries over a buffer of ``numel`` elements.

    Returns int64 ``off`` of length ``num_chunks + 1``: chunk ``c`` is ``buffer[off[c]:off[c+1]]``. The
    identity when the schedule was built with ``size = numel``; otherwise ``floor(b·numel/T)`` for each
    cumulative boundary ``b`` (``T`` the sum of the chunk sizes), a partition of the buffer.
    """
    sizes = np.asarray(schedule.chunk_bytes)
    if sizes.ndim != 1 or sizes.dtype.kind not in "iuf" or (sizes < 0).any():
        raise ConfigError("schedule.chunk_bytes", "chunk sizes must be a 1-D array of numbers >= 0",
                          "build the schedule with topotrain.collectives")
    numel = int(numel)
    if numel < 0:
        raise ConfigError("tensor", f"numel {numel} is negative", "pass a tensor")
    if sizes.dtype.kind == "f":  # equal fractional parts (split_bytes): each boundary rounded to an element
        fcum = np.zeros(sizes.shape[0] + 1)
        np.cumsum(sizes, out=fcum[1:])
        if fcum[-1] <= 0:
            return np.zeros(sizes.shape[0] + 1, dtype=np.int64)
        off = np.rint(fcum * (numel / fcum[-1])).astype(np.int64)
        off[-1] = numel
        return np.minimum(np.maximum.accumulate(off), numel)
    sizes = sizes.astype(np.int64, copy=False)
    cum = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    total = int(cum[-1])
    if total == numel:
        return cum
    if numel == 0:
        return np.zeros_like(cum)
    if total == 0:
        raise ConfigError("schedule.size_bytes", f"the schedule moves no data but the buffer has {numel} "
                          "elements", "build the schedule with size = numel of the buffer")
    if total < (1 << 62) // numel:
        return cum * numel // total
    return np.array([c * numel // total for c in cum.tolist()], dtype=np.int64)


def _rank_chunks(schedule: Schedule, rank: int, role: str) -> np.ndarray:
    owner = schedule.chunk_src if role == "src" else schedule.chunk_dst
    owner = np.asarray(owner, dtype=np.int64)
    return np.flatnonzero((owner == rank) | (owner == -1))


def rank_slices(schedule: Schedule, numel: int, rank: int, role: str = "dst") -> list[tuple[int, int]]:
    """Element ranges ``[lo, hi)`` of the chunks ``rank`` holds at the start (``role="src"``) or must hold
    at the end (``role="dst"``), in chunk order, adjacent ranges merged, empty ones dropped.

    A chunk owned by ``-1`` (every rank) counts for every rank.
    """
    if role not in ("src", "dst"):
        raise ConfigError("role", f"unknown role {role!r}", "use 'src' or 'dst'")
    off = chunk_offsets(schedule, numel)
    out: list[tuple[int, int]] = []
    for c in _rank_chunks(schedule, rank, role).tolist():
        lo, hi = int(off[c]), int(off[c + 1])
        if hi <= lo:
            continue
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _gather(flat: torch.Tensor, slices: list[tuple[int, int]]) -> torch.Tensor:
    if not slices:
        return flat.new_empty(0)
    return torch.cat([flat[lo:hi] for lo, hi in slices])


# ---- per-rank plan --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _PhasePlan:
    #: (tag, lo, hi, dst) — element range sent to schedule rank ``dst``
    sends: tuple[tuple[int, int, int, int], ...]
    #: (tag, lo, hi, src, reduce) in transfer order; ``src == rank`` is a local copy
    recvs: tuple[tuple[int, int, int, int, bool], ...]


@dataclass(frozen=True, eq=False)
class RankPlan:
    """What one rank does in each phase of a schedule over a buffer of ``numel`` elements.

    Build with :func:`plan_schedule`; run with :func:`run_plan`. Cheap to keep and reuse (the DDP hook
    caches one per bucket size).
    """

    schedule: Schedule
    rank: int
    numel: int
    offsets: np.ndarray
    phases: tuple[_PhasePlan, ...]

    @property
    def num_messages(self) -> int:
        """Point-to-point messages this rank posts (sends and receives, local copies excluded)."""
        return sum(len(p.sends) + sum(1 for r in p.recvs if r[3] != self.rank) for p in self.phases)


def _check_phase(ph: Phase, k: int, num_ranks: int, num_chunks: int) -> None:
    field = f"schedule.phases[{k}]"
    n = len(ph)
    if any(a.shape != (n,) for a in (ph.dst, ph.chunk_lo, ph.chunk_hi, ph.reduce)):
        raise ConfigError(field, "transfer arrays have different lengths", "build the phase with Phase.of")
    if n == 0:
        return
    lo_rank = min(int(ph.src.min()), int(ph.dst.min()))
    hi_rank = max(int(ph.src.max()), int(ph.dst.max()))
    if lo_rank < 0 or hi_rank >= num_ranks:
        raise ConfigError(field, f"a transfer names a rank outside 0..{num_ranks - 1}",
                          "src/dst are indices into schedule.ranks")
    if (ph.chunk_lo < 0).any() or (ph.chunk_hi > num_chunks).any() or (ph.chunk_lo > ph.chunk_hi).any():
        raise ConfigError(field, f"a transfer's chunk range is outside 0..{num_chunks}",
                          "need 0 <= chunk_lo <= chunk_hi <= num_chunks")


def plan_schedule(schedule: Schedule, numel: int, rank: int) -> RankPlan:
    """The sends and receives of schedule rank ``rank`` over a buffer of ``numel`` elements."""
    p = schedule.num_ranks
    if not 0 <= int(rank) < p:
        raise ConfigError("rank", f"rank {rank} is not an index into the schedule's {p} ranks",
                          f"pass 0 <= rank < {p}")
    rank = int(rank)
    off = chunk_offsets(schedule, numel)
    phases: list[_PhasePlan] = []
    for k, ph in enumerate(schedule.phases):
        _check_phase(ph, k, p, schedule.num_chunks)
        lo = off[ph.chunk_lo]
        hi = off[ph.chunk_hi]
        live = hi > lo
        out_idx = np.flatnonzero(live & (ph.src == rank) & (ph.dst != rank))
        in_idx = np.flatnonzero(live & (ph.dst == rank))
        sends = tuple((int(i), int(lo[i]), int(hi[i]), int(ph.dst[i])) for i in out_idx)
        recvs = tuple((int(i), int(lo[i]), int(hi[i]), int(ph.src[i]), bool(ph.reduce[i])) for i in in_idx)
        phases.append(_PhasePlan(sends, recvs))
    return RankPlan(schedule, rank, int(numel), off, tuple(phases))


# ---- process-group plumbing -----------------------------------------------------------------------
def resolve_rank_of(num_ranks: int, group: Any = None,
                    rank_of: Sequence[int] | None = None) -> tuple[int, ...]:
    """Global torch ranks of the schedule's ranks: ``rank_of`` checked, or the group's ranks in order."""
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError("group", "torch.distributed is not initialized",
                          "call torch.distributed.init_process_group first")
    world = dist.get_world_size()
    members = list(range(world)) if group is None else list(dist.get_process_group_ranks(group))
    if rank_of is None:
        if len(members) != num_ranks:
            raise ConfigError("rank_of", f"the schedule has {num_ranks} ranks but the process group has "
                              f"{len(members)}", "build the schedule for the group's size or pass rank_of")
        return tuple(members)
    out = tuple(int(r) for r in rank_of)
    if len(out) != num_ranks:
        raise ConfigError("rank_of", f"{len(out)} entries for a schedule of {num_ranks} ranks",
                          "give one torch rank per schedule rank")
    if len(set(out)) != len(out):
        raise ConfigError("rank_of", "a torch rank appears twice", "map schedule ranks to distinct ranks")
    bad = sorted(set(out) - set(members))
    if bad:
        raise ConfigError("rank_of", f"torch ranks {bad} are not in the process group",
                          "use global ranks of the group's members")
    return out


def _resolve_me(rank: int | None, rank_of: tuple[int, ...]) -> int:
    me_global = dist.get_rank()
    if rank is None:
        if me_global not in rank_of:
            raise ConfigError("rank", f"torch rank {me_global} takes no part in the schedule",
                              "call the executor only on the schedule's ranks")
        return rank_of.index(me_global)
    if not 0 <= int(rank) < len(rank_of):
        raise ConfigError("rank", f"rank {rank} is not an index into the schedule's {len(rank_of)} ranks",
                          f"pass 0 <= rank < {len(rank_of)}")
    if rank_of[int(rank)] != me_global:
        raise ConfigError("rank", f"schedule rank {rank} maps to torch rank {rank_of[int(rank)]}, but this "
                          f"process is torch rank {me_global}", "pass the rank of this process (or None)")
    return int(rank)


_WARMED: set[Any] = set()


def _warm_up(group: Any, device: torch.device, covers_group: bool) -> None:
    """NCCL: the first operation on a group must involve all its ranks (batch_isend_irecv docs)."""
    if not covers_group or dist.get_backend(group) != "nccl":
        return
    key = group if group is not None else dist.group.WORLD
    if key in _WARMED:
        return
    dist.all_reduce(torch.zeros(1, device=device), group=group)
    _WARMED.add(key)


def _flat(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A flat contiguous view of ``tensor`` (or a contiguous copy, flagged to be copied back)."""
    if tensor.is_contiguous():
        return tensor.view(-1), False
    return tensor.contiguous().view(-1), True


# ---- execution ------------------------------------------------------------------------------------
def run_plan(plan: RankPlan, tensor: torch.Tensor, rank_of: Sequence[int], group: Any = None,
             op: str = "sum") -> torch.Tensor:
    """Run ``plan`` on ``tensor`` (changed in place; returned). ``rank_of``: global torch rank per
    schedule rank. Collective over the schedule's ranks: every one of them must call it."""
    combine = _combine(op)
    if tensor.numel() != plan.numel:
        raise ConfigError("tensor", f"{tensor.numel()} elements but the plan is for {plan.numel}",
                          "plan the schedule for this tensor's numel")
    flat, copy_back = _flat(tensor)
    me = plan.rank
    for ph in plan.phases:
        ops: list[dist.P2POp] = []
        temps: list[torch.Tensor] = []
        for tag, lo, hi, src, _ in ph.recvs:
            if src == me:
                tmp = flat[lo:hi].clone()
            else:
                tmp = torch.empty(hi - lo, dtype=flat.dtype, device=flat.device)
                ops.append(dist.P2POp(dist.irecv, tmp, rank_of[src], group, tag))
            temps.append(tmp)
        # receives are posted before sends, so every incoming message finds its buffer waiting
        for tag, lo, hi, dst in ph.sends:
            ops.append(dist.P2POp(dist.isend, flat[lo:hi], rank_of[dst], group, tag))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        for (_, lo, hi, _, red), tmp in zip(ph.recvs, temps, strict=True):
            if red:
                combine(flat[lo:hi], tmp)
            else:
                flat[lo:hi].copy_(tmp)
    if copy_back:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def run_schedule(schedule: Schedule, tensor: torch.Tensor, rank: int | None = None, group: Any = None,
                 op: str = "sum", rank_of: Sequence[int] | None = None) -> torch.Tensor:
    """Execute ``schedule`` on this process's buffer ``tensor`` (changed in place; returned).

    ``tensor`` is this rank's view of the schedule's whole chunk space (see the module docstring for the
    layout of each collective, or use the wrappers). ``rank``: this process's index into
    ``schedule.ranks`` (``None``: found from ``rank_of``). ``rank_of[i]``: the global torch rank of
    schedule rank ``i`` (default: the ranks of ``group`` in order, which must then have exactly
    ``schedule.num_ranks`` members). ``op``: the reduction for reducing transfers (sum, prod, max, min).
    """
    ranks = resolve_rank_of(schedule.num_ranks, group, rank_of)
    me = _resolve_me(rank, ranks)
    plan = plan_schedule(schedule, tensor.numel(), me)
    _warm_up(group, tensor.device, len(ranks) == dist.get_world_size(group))
    return run_plan(plan, tensor, ranks, group, op)


def simulate_schedule(schedule: Schedule, buffers: Sequence[torch.Tensor],
                      op: str = "sum") -> list[torch.Tensor]:
    """Run ``schedule`` in this process on one buffer per rank (changed in place; returned).

    The same semantics as :func:`run_schedule` without torch.distributed: a reference for tests and a
    quick way to check what an algorithm computes.
    """
    p = schedule.num_ranks
    if len(buffers) != p:
        raise ConfigError("buffers", f"{len(buffers)} buffers for {p} ranks", "give one buffer per rank")
    numel = buffers[0].numel()
    if any(b.numel() != numel for b in buffers):
        raise ConfigError("buffers", "buffers differ in size", "give every rank a buffer of the same numel")
    combine = _combine(op)
    flats = [_flat(b) for b in buffers]
    views = [f for f, _ in flats]
    off = chunk_offsets(schedule, numel)
    for k, ph in enumerate(schedule.phases):
        _check_phase(ph, k, p, schedule.num_chunks)
        lo = off[ph.chunk_lo].tolist()
        hi = off[ph.chunk_hi].tolist()
        src, dst, red = ph.src.tolist(), ph.dst.tolist(), ph.reduce.tolist()
        data = [views[src[i]][lo[i]:hi[i]].clone() for i in range(len(ph))]
        for i in range(len(ph)):
            target = views[dst[i]][lo[i]:hi[i]]
            if red[i]:
                combine(target, data[i])
            else:
                target.copy_(data[i])
    for b, (f, copy_back) in zip(buffers, flats, strict=True):
        if copy_back:
            b.copy_(f.view_as(b))
    return list(buffers)


# ---- building schedules for execution -------------------------------------------------------------
_CACHE: OrderedDict[tuple[Any, ...], tuple[Any, Schedule]] = OrderedDict()
_CACHE_SIZE = 256


def _topology(topo: Any) -> Any:
    t = getattr(topo, "topology", topo)
    if not isinstance(t, Topology):
        raise ConfigError("topo", f"expected a Topology or a Cluster, got {type(topo).__name__}",
                          "pass cluster.topology or a topotrain Cluster")
    return t


def build_execution_schedule(op: CollectiveOp | str, algorithm: str, topo: Any, ranks: Sequence[str] | None,
                             size_bytes: int, num_ranks: int | None = None, **options: Any) -> Schedule:
    """Build (and cache) a schedule through ``topotrain.collectives.registry.build_schedule``.

    ``topo``: a Topology or a Cluster. ``ranks``: GPU node names, one per schedule rank (default: the
    topology's first ``num_ranks`` GPUs). ``size_bytes``: :func:`schedule_size` of the buffer; an empty
    buffer gets the schedule of one byte, which maps to no element.
    """
    t = _topology(topo)
    if ranks is None:
        gpus = list(t.gpus)
        if num_ranks is None:
            num_ranks = len(gpus)
        if len(gpus) < num_ranks:
            raise ConfigError("ranks", f"the topology has {len(gpus)} GPUs for {num_ranks} ranks",
                              "pass a larger topology or explicit ranks")
        rank_names = tuple(gpus[:num_ranks])
    else:
        rank_names = tuple(str(r) for r in ranks)
        if num_ranks is not None and len(rank_names) != num_ranks:
            raise ConfigError("ranks", f"{len(rank_names)} GPU names for {num_ranks} ranks",
                              "give one GPU per process")
    op_v = CollectiveOp(op)
    size = max(int(size_bytes), 1)
    key = (op_v.value, str(algorithm), id(t), rank_names, size, repr(sorted(options.items())))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is t:
        _CACHE.move_to_end(key)
        return hit[1]
    schedule = build_schedule(op_v, algorithm, t, list(rank_names), size, **options)
    _CACHE[key] = (t, schedule)
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return schedule


def _schedule_for(op: CollectiveOp, algorithm: str | Schedule, topo: Any, ranks: Sequence[str] | None,
                  size_bytes: int, num_ranks: int, options: dict[str, Any]) -> Schedule:
    if isinstance(algorithm, Schedule):
        if algorithm.op != op:
            raise ConfigError("schedule.op", f"a {algorithm.op.value} schedule was given to {op.value}",
                              f"build a {op.value} schedule")
        return algorithm
    if topo is None:
        raise ConfigError("topo", f"algorithm {algorithm!r} needs a topology",
                          "pass topo= (a Topology or a Cluster)")
    return build_execution_schedule(op, algorithm, topo, ranks, size_bytes, num_ranks, **options)


def _setup(op: CollectiveOp, algorithm: str | Schedule, topo: Any, ranks: Sequence[str] | None,
           buffer: torch.Tensor,
           group: Any, rank: int | None, rank_of: Sequence[int] | None,
           options: dict[str, Any]) -> tuple[Schedule, tuple[int, ...], int]:
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError("group", "torch.distributed is not initialized",
                          "call torch.distributed.init_process_group first")
    n = len(rank_of) if rank_of is not None else dist.get_world_size(group)
    schedule = _schedule_for(op, algorithm, topo, ranks, schedule_size(buffer), n, options)
    rof = resolve_rank_of(schedule.num_ranks, group, rank_of)
    return schedule, rof, _resolve_me(rank, rof)


def _execute(schedule: Schedule, buf: torch.Tensor, me: int, rof: tuple[int, ...], group: Any,
             op: str) -> torch.Tensor:
    plan = plan_schedule(schedule, buf.numel(), me)
    _warm_up(group, buf.device, len(rof) == dist.get_world_size(group))
    return run_plan(plan, buf, rof, group, op)


def all_reduce(tensor: torch.Tensor, algorithm: str | Schedule, topo: Any = None,
               ranks: Sequence[str] | None = None, *, group: Any = None, op: str = "sum",
               rank: int | None = None, rank_of: Sequence[int] | None = None, **options: Any) -> torch.Tensor:
    """Allreduce ``tensor`` in place with ``algorithm`` (a registry name, or a ready Schedule)."""
    s, rof, me = _setup(CollectiveOp.ALLREDUCE, algorithm, topo, ranks, tensor, group, rank, rank_of,
                        options)
    return _execute(s, tensor, me, rof, group, op)


def broadcast(tensor: torch.Tensor, algorithm: str | Schedule, topo: Any = None,
              ranks: Sequence[str] | None = None, *, group: Any = None, rank: int | None = None,
              rank_of: Sequence[int] | None = None, **options: Any) -> torch.Tensor:
    """Broadcast in place from the schedule's root (``chunk_src``; pass e.g. ``root=`` in options)."""
    s, rof, me = _setup(CollectiveOp.BROADCAST, algorithm, topo, ranks, tensor, group, rank, rank_of,
                        options)
    return _execute(s, tensor, me, rof, group, "sum")


def reduce(tensor: torch.Tensor, algorithm: str | Schedule, topo: Any = None,
           ranks: Sequence[str] | None = None, *, group: Any = None, op: str = "sum", rank: int | None = None,
           rank_of: Sequence[int] | None = None, **options: Any) -> torch.Tensor:
    """Reduce in place onto the schedule's destination (``chunk_dst``); other ranks keep partial sums."""
    s, rof, me = _setup(CollectiveOp.REDUCE, algorithm, topo, ranks, tensor, group, rank, rank_of,
                        options)
    return _execute(s, tensor, me, rof, group, op)


def reduce_scatter(input: torch.Tensor, algorithm: str | Schedule, topo: Any = None,
                   ranks: Sequence[str] | None = None, *, group: Any = None, op: str = "sum",
                   rank: int | None = None, rank_of: Sequence[int] | None = None,
                   **options: Any) -> torch.Tensor:
    """Reduce-scatter the full buffer ``input`` (unchanged); returns this rank's chunks, in chunk order."""
    s, rof, me = _setup(CollectiveOp.REDUCE_SCATTER, algorithm, topo, ranks, input, group, rank,
                        rank_of, options)
    work = input.detach().reshape(-1).clone()
    _execute(s, work, me, rof, group, op)
    return _gather(work, rank_slices(s, work.numel(), me, "dst"))


def all_gather(output: torch.Tensor, algorithm: str | Schedule, topo: Any = None,
               ranks: Sequence[str] | None = None, *, input: torch.Tensor | None = None, group: Any = None,
               rank: int | None = None, rank_of: Sequence[int] | None = None, **options: Any) -> torch.Tensor:
    """Allgather in place into the full buffer ``output``, whose own shard is pre-filled (or copied from
    ``input``: this rank's chunks, ``chunk_src == rank``, in chunk order)."""
    s, rof, me = _setup(CollectiveOp.ALLGATHER, algorithm, topo, ranks, output, group, rank, rank_of,
                        options)
    if input is not None:
        flat, copy_back = _flat(output)
        src = input.reshape(-1)
        pos = 0
        slices = rank_slices(s, output.numel(), me, "src")
        need = sum(hi - lo for lo, hi in slices)
        if src.numel() != need:
            raise ConfigError("input", f"{src.numel()} elements but this rank's shard has {need}",
                              "pass this rank's shard of the output")
        for lo, hi in slices:
            flat[lo:hi].copy_(src[pos:pos + hi - lo])
            pos += hi - lo
        if copy_back:
            output.copy_(flat.view_as(output))
    return _execute(s, output, me, rof, group, "sum")


def _alltoall_space(schedule: Schedule, rank: int, send_numel: int) -> int:
    """Elements of the whole all-to-all chunk space such that this rank's chunks hold ``send_numel``."""
    sizes = np.asarray(schedule.chunk_bytes)
    total = round(float(sizes.sum()))  # fractional chunks (split_bytes) sum to whole units up to rounding
    mine = round(float(sizes[_rank_chunks(schedule, rank, "src")].sum()))
    if mine == send_numel:
        return total
    if mine == 0 or (total * send_numel) % mine:
        raise ConfigError("send", f"the send buffer has {send_numel} elements, this rank's chunks "
                          f"{mine} units",
                          "build the schedule with size = send.numel()")
    return total * send_numel // mine


def all_to_all(send: torch.Tensor, algorithm: str | Schedule, topo: Any = None,
               ranks: Sequence[str] | None = None, *, group: Any = None, rank: int | None = None,
               rank_of: Sequence[int] | None = None, **options: Any) -> torch.Tensor:
    """All-to-all: ``send`` fills this rank's chunks; returns the chunks destined to it, in chunk order
    (for the ``i·p + j`` layout: block ``i`` came from rank ``i``, like ``all_to_all_single``)."""
    s, rof, me = _setup(CollectiveOp.ALLTOALL, algorithm, topo, ranks, send, group, rank, rank_of,
                        options)
    space = _alltoall_space(s, me, send.numel())
    work = send.new_zeros(space)
    src = send.reshape(-1)
    slices = rank_slices(s, space, me, "src")
    if sum(hi - lo for lo, hi in slices) != src.numel():
        raise ConfigError("send", "the send buffer does not map onto this rank's chunks",
                          "build the schedule with size = send.numel()")
    pos = 0
    for lo, hi in slices:
        work[lo:hi].copy_(src[pos:pos + hi - lo])
        pos += hi - lo
    _execute(s, work, me, rof, group, "sum")
    return _gather(work, rank_slices(s, space, me, "dst"))
