"""A collective as plain data: phases of point-to-point transfers of chunks of a buffer.

A :class:`Schedule` is what a collective algorithm emits and what every network model times. It never
knows which network model will time it.

* The collective's buffer is split into chunks (``chunk_bytes``; they sum to the logical buffer — see
  :class:`CollectiveOp` for what "the buffer" is for each op). Integers (int64) where the split is even; a
  buffer that ``p`` parts do not divide is cut into ``p`` equal fractional parts (float64, :func:`split_bytes`),
  so that the steps of a ring or of halving-doubling move equal bytes and end together.
* A :class:`Phase` is a set of concurrent transfers; phase ``k+1`` starts when phase ``k`` has finished
  (a barrier between steps, as in the step-wise cost models of Thakur et al. 2005).
* Transfer ``i`` of a phase sends chunks ``chunk_lo[i]:chunk_hi[i]`` from rank ``src[i]`` to rank
  ``dst[i]`` (indices into ``Schedule.ranks``). If ``reduce[i]`` the receiver adds them into its copy,
  otherwise it overwrites its copy. All transfers of a phase read the state from before the phase.
* ``chunk_src[c]`` is the rank that initially holds chunk ``c`` (``-1``: every rank holds its own
  contribution, as in allreduce). ``chunk_dst[c]`` is the rank that must hold the finished chunk ``c`` at
  the end (``-1``: every rank).

Arrays are numpy so that schedules of thousands of ranks stay cheap to build and to time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from topotrain.util.errors import ConfigError


class CollectiveOp(StrEnum):
    """Collective operations, with the buffer that ``size_bytes`` measures (nccl-tests conventions).

    allreduce, reduce, broadcast: the per-rank buffer. reduce-scatter: the input (full) buffer, each rank
    ends with ``size/p``. allgather: the output (full) buffer, each rank starts with ``size/p``.
    all-to-all: the per-rank send buffer, ``size/p`` to each peer.
    """

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "all-to-all"


def parse_op(op: CollectiveOp | str, field: str = "op") -> CollectiveOp:
    """``"allreduce"`` → :attr:`CollectiveOp.ALLREDUCE`; anything else is a ConfigError naming ``field``.

    Case, ``_``, ``-`` and spaces are ignored, so torch's and nccl-tests' spellings (``all_reduce``,
    ``all-reduce``, ``alltoall``, ``all_to_all``, ``reduce_scatter``, ``all_gather``) name the same op."""
    if isinstance(op, CollectiveOp):
        return op
    key = "".join(ch for ch in str(op).lower() if ch not in "_- ")
    for o in CollectiveOp:
        if o.value.replace("-", "") == key:
            return o
    raise ConfigError(field, f"unknown collective {op!r}",
                      f"use one of {', '.join(o.value for o in CollectiveOp)}")


def _i64(a: np.ndarray | list[int]) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Phase:
    """Concurrent transfers (parallel arrays, one entry per transfer)."""

    src: np.ndarray
    dst: np.ndarray
    chunk_lo: np.ndarray
    chunk_hi: np.ndarray
    reduce: np.ndarray

    @staticmethod
    def of(src: np.ndarray | list[int], dst: np.ndarray | list[int], chunk_lo: np.ndarray | list[int],
           chunk_hi: np.ndarray | list[int], reduce: bool | np.ndarray | list[bool]) -> Phase:
        s = _i64(src)
        r = np.broadcast_to(np.asarray(reduce, dtype=bool), s.shape).copy()
        return Phase(s, _i64(dst), _i64(chunk_lo), _i64(chunk_hi), r)

    def __len__(self) -> int:
        return int(self.src.shape[0])


@dataclass(frozen=True, eq=False)
class Schedule:
    op: CollectiveOp
    algorithm: str
    ranks: tuple[str, ...]
    size_bytes: int
    chunk_bytes: np.ndarray
    chunk_src: np.ndarray
    chunk_dst: np.ndarray
    phases: tuple[Phase, ...]
    meta: dict[str, object] = field(default_factory=dict)
    _cum: np.ndarray | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cum = None
        if self.chunk_bytes.dtype.kind in "iu":  # integer chunks: a transfer's bytes are exact differences
            cum = np.zeros(len(self.chunk_bytes) + 1, dtype=np.int64)
            np.cumsum(self.chunk_bytes, out=cum[1:])
        object.__setattr__(self, "_cum", cum)

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @property
    def num_chunks(self) -> int:
        return int(self.chunk_bytes.shape[0])

    def transfer_bytes(self, phase: Phase) -> np.ndarray:
        """Bytes of each transfer of ``phase``: int64 for integer chunks, else float64 (each transfer's chunks
        summed on their own, not as differences of a running sum: equal runs of equal chunks give equal bytes
        wherever they lie in the buffer, to the last bit, so that symmetric transfers finish together)."""
        if self._cum is not None:
            return self._cum[phase.chunk_hi] - self._cum[phase.chunk_lo]
        return _run_sums(self.chunk_bytes, phase.chunk_lo, phase.chunk_hi)

    @property
    def num_transfers(self) -> int:
        return sum(len(p) for p in self.phases)

    def total_bytes(self) -> int:
        """Bytes put on the wire by all transfers together (fractional chunks: the sum rounded to whole bytes,
        which it is wherever every chunk travels equally often)."""
        if self._cum is not None:
            return int(sum(int(self.transfer_bytes(p).sum()) for p in self.phases))
        return round(math.fsum(v for p in self.phases for v in self.transfer_bytes(p).tolist()))

    def bytes_sent_per_rank(self) -> np.ndarray:
        """Bytes each rank sends over all phases (the chunks' dtype)."""
        out = np.zeros(self.num_ranks, dtype=np.int64 if self._cum is not None else np.float64)
        for p in self.phases:
            np.add.at(out, p.src, self.transfer_bytes(p))
        return out


def _run_sums(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``values[lo[i]:hi[i]].sum()`` for each ``i`` (0 where ``hi <= lo``), each run summed by itself."""
    if lo.shape[0] == 0:
        return np.zeros(0, dtype=values.dtype)
    if bool((hi == lo + 1).all()):  # one chunk per transfer (rings, pipelines): the chunk itself
        return values[lo]
    padded = np.append(values, values.dtype.type(0))  # ``hi`` may be the number of chunks
    bounds = np.empty(2 * lo.shape[0], dtype=np.int64)
    bounds[0::2], bounds[1::2] = lo, hi
    return np.where(hi > lo, np.add.reduceat(padded, bounds)[0::2], values.dtype.type(0))


def split_bytes(size_bytes: float, parts: int) -> np.ndarray:
    """``size_bytes`` cut into ``parts`` equal chunks: int64 ``size_bytes // parts`` each where ``parts`` divides
    an integral size, else float64 ``size_bytes / parts`` each — fractional bytes, not integers a byte apart,
    so that the concurrent transfers of a ring step (or of a halving-doubling step) carry equal bytes and end at
    one instant, as the step-wise cost models (Thakur et al. 2005: ``(p-1)/p · n`` bytes per rank) have it."""
    whole = isinstance(size_bytes, int | np.integer) or float(size_bytes).is_integer()
    if whole and int(size_bytes) % parts == 0:
        return np.full(parts, int(size_bytes) // parts, dtype=np.int64)
    return np.full(parts, (int(size_bytes) if whole else float(size_bytes)) / parts, dtype=np.float64)


def merge_schedules(schedules: tuple[Schedule, ...] | list[Schedule], algorithm: str | None = None) -> Schedule:
    """Run several schedules as one: their ranks and chunks side by side, phase ``k`` of the result holding
    phase ``k`` of every input. Used to time concurrent, symmetric collectives (e.g. the data-parallel
    groups of all tensor ranks) in one pass, so that the network model sees all their traffic together.
    """
    if len(schedules) == 1:
        return schedules[0]
    num_ranks = np.array([s.num_ranks for s in schedules], dtype=np.int64)
    num_chunks = np.array([s.num_chunks for s in schedules], dtype=np.int64)
    rank_off = np.cumsum(num_ranks) - num_ranks
    chunk_off = np.cumsum(num_chunks) - num_chunks
    ranks = tuple(r for s in schedules for r in s.ranks)
    phases = tuple(_merged_phase([s.phases[k] if k < len(s.phases) else None for s in schedules], rank_off,
                                 chunk_off) for k in range(max(len(s.phases) for s in schedules)))
    first = schedules[0]
    return Schedule(first.op, algorithm or first.algorithm, ranks, max(s.size_bytes for s in schedules),
                    np.concatenate([s.chunk_bytes for s in schedules]),
                    _shifted(np.concatenate([s.chunk_src for s in schedules]), rank_off, num_chunks),
                    _shifted(np.concatenate([s.chunk_dst for s in schedules]), rank_off, num_chunks),
                    phases, {"merged": len(schedules)})


def _shifted(ranks: np.ndarray, offsets: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Rank indices of concatenated schedules (``counts[j]`` entries from schedule ``j``) moved by their
    schedule's rank offset, ``-1`` (every rank) kept."""
    return np.where(ranks >= 0, _plus(ranks, np.repeat(offsets, counts)), -1)


def _plus(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``values + offsets`` in ``values``' dtype (as adding a Python int would)."""
    return values + offsets.astype(values.dtype, copy=False)


def _merged_phase(parts: list[Phase | None], rank_off: np.ndarray, chunk_off: np.ndarray) -> Phase:
    """One phase holding the transfers of ``parts`` (schedule ``j``'s phase, or None where it has no such
    phase), their ranks and chunks moved by schedule ``j``'s offsets."""
    have = [j for j, ph in enumerate(parts) if ph is not None]
    phs = [ph for ph in parts if ph is not None]
    lengths = np.array([len(ph) for ph in phs], dtype=np.int64)
    r_off = np.repeat(rank_off[have], lengths)
    c_off = np.repeat(chunk_off[have], lengths)
    return Phase(_plus(np.concatenate([ph.src for ph in phs]), r_off),
                 _plus(np.concatenate([ph.dst for ph in phs]), r_off),
                 _plus(np.concatenate([ph.chunk_lo for ph in phs]), c_off),
                 _plus(np.concatenate([ph.chunk_hi for ph in phs]), c_off),
                 np.concatenate([ph.reduce for ph in phs]))


def phase_key(schedule: Schedule, phase: Phase) -> bytes:
    """A signature of a phase's traffic (who sends how many bytes to whom): equal keys time equally
    when the phase runs alone, whatever chunks they carry."""
    return b"|".join((phase.src.tobytes(), phase.dst.tobytes(), schedule.transfer_bytes(phase).tobytes()))
