"""Flow-level model without phase barriers: every rank runs ahead as soon as its own data has arrived.

The ``flow`` model (:mod:`topotrain.network.flow`) treats each phase of a schedule as a barrier, as the
step-wise cost models do. Real executions (NCCL, gloo, and :mod:`topotrain.comm`) have no global barrier:
rank ``r`` enters phase ``k+1`` as soon as *its own* sends and receives of phase ``k`` are done, and a
transfer ``s → d`` of phase ``k`` flows once both ``s`` and ``d`` have entered phase ``k`` (a rendezvous:
the receiver has posted its buffer). Pipelined schedules (trees, chunked chains) and congested topologies,
where some ranks finish a step early, run faster than with barriers. Bandwidth is still shared max-min on
the real routed paths (one :class:`~topotrain.network.flow_network.FlowNetwork`); every flow still pays path
latency and the per-message overhead (unless the ranks share a CPU, below).

Eager sends (``eager_sends=True``, the ``flow-eager`` model): a sender's part of a transfer ends as soon
as its flow starts, not when the data has arrived — the message is handed to a send buffer that holds
all of it and the sender moves on. That is gloo's TCP transport (``transport/tcp/pair.cc`` writes a send
once the receiver's recv-ready notification has arrived and grows ``SO_SNDBUF`` to the message, so the
``isend`` completes when written) and MPI's eager protocol for messages below its eager limit. The
receiver still waits for the last byte, path latency and the per-message overhead. A rank whose phase
only sends therefore passes it at once and posts the next one, so a pipelined chain keeps its slowest
link busy (as traced on the emulated incast testbed, ``benchmarks/testbed.py``: the tree's root on the
quarter-speed link passes its send-only phases almost at once instead of in one chunk time).

Shared CPU (:attr:`NetworkParams.shared_cpu_cores` ``= K``, for ranks that run on one machine, as on the
emulated testbed): the per-message overhead :attr:`NetworkParams.message_overhead_s` is then not added to
each delivery but is CPU time of the rank, once per phase — after its transfers of a phase are done, a rank spends
``overhead`` of CPU (posting the phase's batch of messages, waiting, reducing: one
``batch_isend_irecv`` per phase in :mod:`topotrain.comm`) before it enters the next phase, and all ranks'
such work shares ``K`` cores (processor sharing, each rank at most one core: :class:`SharedCores`). When
every rank computes at once — a ring of small messages — each gets K/p of a core and the overhead
stretches p/K-fold; when ranks wait on a slow link at different times it does not. LogP's processor
overhead ``o`` (Culler et al., PPoPP 1993) on a shared, time-sliced CPU, charged per phase rather than
per message: on the testbed, a tree's interior ranks handle four messages a phase without paying four
times a ring rank's two (docs/validation.md §4 compares the two charges on the testbed's rows).

Cost: one event per distinct completion time, no memoization across phases (phases no longer run alone),
so it is slower than ``flow`` on schedules with thousands of identical phases; the shared CPU adds one CPU
event per rank and phase (``benchmarks/speed.py`` prints the figures).

Several schedules submitted to one :class:`FlowAsyncSim` share its network and its CPU pool: each keeps its
own per-rank progress (:class:`_AsyncJob`), their flows contend max-min.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from topotrain.collectives.schedule import Schedule
from topotrain.network.base import (
    CollectiveResult,
    JobTiming,
    check_submit,
    run_alone,
)
from topotrain.network.flow import SharedFlowSim, _PairPaths
from topotrain.network.flow_network import FlowNetwork
from topotrain.network.params import NetworkParams, require_cut_through
from topotrain.topology.graph import Topology


class SharedCores:
    """Processor sharing of ``cores`` among the active jobs, each at most one core: with ``n`` jobs every
    one runs at ``min(1, cores / n)``. Exact and O(log n) per event with a virtual clock (as in GPS /
    fair queueing: Parekh & Gallager, IEEE/ACM ToN 1993): all active jobs progress alike, so a job of
    ``w`` seconds started at virtual time ``V0`` ends when the virtual time reaches ``V0 + w``.
    Same driving API as :class:`~topotrain.network.flow_network.FlowNetwork`: start, next_event_s, advance."""

    def __init__(self, cores: float) -> None:
        self.cores = float(cores)
        self.now_s = 0.0
        self._v = 0.0  # work done by each active job since the start
        self._heap: list[tuple[float, int, object]] = []  # (virtual finish, seq, tag)
        self._seq = 0

    def _rate(self) -> float:
        n = len(self._heap)
        return min(1.0, self.cores / n) if n else 0.0

    def _to(self, t_s: float) -> None:
        if t_s > self.now_s:
            self._v += (t_s - self.now_s) * self._rate()
            self.now_s = t_s

    def start(self, work_s: float, now_s: float, tag: object) -> None:
        self._to(now_s)
        heapq.heappush(self._heap, (self._v + float(work_s), self._seq, tag))
        self._seq += 1

    def next_event_s(self) -> float:
        if not self._heap:
            return float("inf")
        return self.now_s + max(0.0, self._heap[0][0] - self._v) / self._rate()

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        """Progress to ``to_s``; ``(completion time, tag)`` of the jobs done by then, in time order."""
        out: list[tuple[float, object]] = []
        while self._heap:
            t_done = self.next_event_s()
            if t_done > to_s:
                break
            self._to(t_done)
            self._v = max(self._v, self._heap[0][0])
            while self._heap and self._heap[0][0] <= self._v:
                out.append((t_done, heapq.heappop(self._heap)[2]))
        self._to(to_s)
        return out


class FlowAsyncModel:
    """Max-min fair sharing with per-rank progress (no phase barriers); ``eager_sends``: a send is done
    for its sender when its flow starts (module docstring)."""

    def __init__(self, eager_sends: bool = False, params: NetworkParams | None = None) -> None:
        self.eager_sends = bool(eager_sends)
        self.params = params if params is not None else NetworkParams()
        self.name = "flow-eager" if self.eager_sends else "flow-async"
        require_cut_through(self.params, self.name)
        self.contends = True

    def open(self, topo: Topology) -> FlowAsyncSim:
        return FlowAsyncSim(self, topo)

    def time_alone(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        """The schedule on a network of its own (a private simulator: nothing to memoize across phases)."""
        sim = FlowAsyncSim(self, topo)
        sim.submit(schedule, 0.0, 0)
        while (t := sim.next_event_s()) < np.inf:
            sim.advance(t)
        job = sim.timing(0)
        running = np.maximum.accumulate(job.phase_finish_s) if job.phase_finish_s.size else job.phase_finish_s
        times = np.diff(np.concatenate([[0.0], running]))
        return CollectiveResult(self.name, float(job.finish_s), times, sim.net.link_bytes())

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        return run_alone(self, schedule, topo)


def _gather(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(starts[j], starts[j] + counts[j])`` over j (a CSR gather, vectorized)."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    return np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)


def _distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of an int array, sorted (a sort and a comparison: cheaper than np.unique's hash
    table on the few-thousand-element arrays of one instant)."""
    if a.shape[0] < 2:
        return a
    if bool((a[1:] > a[:-1]).all()):  # already distinct and sorted (a lock-step phase's transfers)
        return a
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


@dataclass(eq=False)
class _AsyncJob:
    """Per-rank progress of one submitted schedule, as arrays.

    Every transfer between two different ranks has a global id ``g`` (phase by phase). A *slot* is a
    (rank, phase) in which the rank has transfers; each rank walks its slots in phase order: ``ptr[r]`` is
    its current slot (``cur[r]`` the slot's phase, ``n_ph`` once done), ``left[r]`` its transfers there not
    yet done. Transfers to oneself cost nothing and are not there at all."""

    tag: object
    schedule: Schedule
    paths: _PairPaths  # phases resolved onto links on first use (phases with the same pairs share paths)
    g_phase: np.ndarray  # phase of transfer g
    g_index: np.ndarray  # its index in the phase (into resolved[phase])
    g_src: np.ndarray
    g_dst: np.ndarray
    slot_phase: np.ndarray  # slots of all ranks, rank by rank, phase order within a rank
    slot_start: np.ndarray  # into slot_g: the slot's transfers
    slot_count: np.ndarray
    slot_g: np.ndarray
    rank_end: np.ndarray  # one past the last slot of each rank
    start_s: float
    ptr: np.ndarray
    cur: np.ndarray
    left: np.ndarray
    started: np.ndarray
    phase_end: np.ndarray
    finished: float
    arrivals: list[np.ndarray] = field(default_factory=list)
    done_ranks: int = 0

    @classmethod
    def make(cls, tag: object, schedule: Schedule, topo: Topology, at_s: float) -> _AsyncJob:
        phases = schedule.phases
        p = schedule.num_ranks
        lengths = np.fromiter((ph.src.shape[0] for ph in phases), dtype=np.int64, count=len(phases))
        total = int(lengths.sum())
        # the per-transfer arrays are the memory of a large job (a 1,024-rank ring: 2.1 M transfers, each with
        # two ends): 32-bit ids where they fit, half the bytes to write and to fault in (the same values)
        it = np.int32 if max(2 * total, len(phases), p) < 2**31 else np.int64
        if total:
            src = np.concatenate([ph.src for ph in phases]).astype(it, copy=False)
            dst = np.concatenate([ph.dst for ph in phases]).astype(it, copy=False)
        else:
            src = dst = np.zeros(0, dtype=it)
        phase_of = np.repeat(np.arange(len(phases), dtype=it), lengths)
        index_in = _gather(np.zeros(len(phases), dtype=np.int64), lengths).astype(it, copy=False)
        remote = src != dst
        if bool(remote.all()):  # the common case (no copies to oneself): no selection to copy
            g_phase, g_index, g_src, g_dst = phase_of, index_in, src, dst
        else:
            g_phase, g_index, g_src, g_dst = phase_of[remote], index_in[remote], src[remote], dst[remote]
        n_g = g_phase.shape[0]
        # one entry per (rank, transfer) end, sorted by (rank, phase, g): runs of equal (rank, phase) are slots.
        # Entries are laid out in g order (both ends of g together) and g runs phase by phase, so a stable sort
        # by rank alone leaves (phase, g) ascending inside each rank: the order of a three-key lexsort. Ranks
        # fit 16 bits on any cluster up to 32,767 ranks, where numpy's stable sort is a radix sort.
        e_rank = np.stack([g_src, g_dst], axis=1).reshape(-1)
        order = np.argsort(e_rank.astype(np.int16) if p < 2**15 else e_rank, kind="stable")
        e_rank = e_rank[order]
        e_g = (order >> 1).astype(it, copy=False)  # entry 2g and 2g+1 are transfer g's two ends
        e_phase = g_phase[e_g]
        if e_rank.size:
            new = np.concatenate([[True], (e_rank[1:] != e_rank[:-1]) | (e_phase[1:] != e_phase[:-1])])
        else:
            new = np.zeros(0, dtype=bool)
        slot_start = np.flatnonzero(new).astype(np.int64)
        slot_count = np.diff(np.concatenate([slot_start, [e_rank.shape[0]]])).astype(np.int64)
        slot_rank = e_rank[slot_start]
        rank_end = np.searchsorted(slot_rank, np.arange(p), side="right").astype(np.int64)
        rank_begin = np.searchsorted(slot_rank, np.arange(p), side="left").astype(np.int64)
        return cls(tag, schedule, _PairPaths(topo, schedule), g_phase, g_index, g_src,
                   g_dst, e_phase[slot_start].astype(np.int64), slot_start, slot_count, e_g, rank_end, at_s,
                   rank_begin - 1, np.full(p, -1, dtype=np.int64), np.zeros(p, dtype=np.int64),
                   np.zeros(n_g, dtype=bool), np.zeros(len(phases)), at_s, [np.arange(p, dtype=np.int64)])

    def settle(self, ranks: np.ndarray) -> np.ndarray:
        """Ranks that finished their slot move to their next one (or are done); returns those now in a slot."""
        ptr = self.ptr[ranks] + 1
        self.ptr[ranks] = ptr
        more = ptr < self.rank_end[ranks]
        done = ranks[~more]
        self.cur[done] = len(self.schedule.phases)
        self.done_ranks += int(done.shape[0])
        entered = ranks[more]
        slots = ptr[more]
        self.cur[entered] = self.slot_phase[slots]
        self.left[entered] = self.slot_count[slots]
        return entered

    @property
    def complete(self) -> bool:
        return self.done_ranks == self.schedule.num_ranks


class FlowAsyncSim(SharedFlowSim):
    """:class:`~topotrain.network.base.NetworkSim` of ``flow-async`` / ``flow-eager``: submitted schedules
    progress rank by rank (module docstring) in one shared :class:`FlowNetwork` and CPU pool. All ranks that
    move at one instant are handled together with numpy (a lock-step ring phase costs a few array passes,
    not a Python step per rank)."""

    def __init__(self, model: FlowAsyncModel, topo: Topology) -> None:
        self.eager = model.eager_sends
        self.overhead_s = model.params.message_overhead_s
        cores = model.params.shared_cpu_cores
        cpu_job = cores > 0 and self.overhead_s > 0
        super().__init__(topo, FlowNetwork(topo, overhead_s=0.0 if cpu_job else self.overhead_s, ids_only=True,
                                           arbitration=model.params.arbitration),
                         lambda s: model.time_alone(s, topo))
        self.cpu = SharedCores(cores) if cpu_job else None
        self._jobs: dict[int, _AsyncJob] = {}
        self._out: list[tuple[float, object]] = []
        self._flow_job = np.zeros(0, dtype=np.int64)  # by flow id: the job and transfer it carries
        self._flow_g = np.zeros(0, dtype=np.int64)

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        check_submit(at_s, self.net.now_s)
        if alone:
            self._alone.submit(schedule, at_s, tag, key)
            return
        jid = self._take_id()
        self._jobs[jid] = _AsyncJob.make(tag, schedule, self.topo, at_s)
        self._pump([jid], at_s)

    def _done_with(self, jid: int, job: _AsyncJob, ranks: np.ndarray, t: float) -> None:
        """Ranks with no transfer of their slot left: they move on now, or after their CPU work."""
        if ranks.size == 0:
            return
        if self.cpu is None:
            job.arrivals.append(ranks)
        else:
            for r in ranks.tolist():
                self.cpu.start(self.overhead_s, t, (jid, r))

    def _start(self, jid: int, job: _AsyncJob, g: np.ndarray, now: float) -> None:
        """Start the flows of transfers ``g`` (sorted) of job ``jid`` at ``now``, one network call."""
        phase = job.g_phase[g]
        off_parts: list[np.ndarray] = []
        link_parts: list[np.ndarray] = []
        size_parts: list[np.ndarray] = []
        bounds = np.flatnonzero(np.concatenate([[True], phase[1:] != phase[:-1], [True]]))
        base = 0
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            pp = job.paths.resolve(job.schedule.phases[int(phase[a])])[1]
            idx = job.g_index[g[a:b]]
            lengths = pp.offsets[idx + 1] - pp.offsets[idx]
            link_parts.append(pp.links[_gather(pp.offsets[idx], lengths)])
            off_parts.append(base + np.cumsum(lengths))
            base += int(lengths.sum())
            size_parts.append(pp.bytes[idx])
        offsets = np.concatenate([np.zeros(1, dtype=np.int64)] + off_parts)
        fids = self.net.start_many(offsets, np.concatenate(link_parts), np.concatenate(size_parts), now)
        need = int(fids[-1]) + 1
        if need > self._flow_job.shape[0]:
            grow = max(need, 2 * self._flow_job.shape[0], 1024)
            self._flow_job = np.resize(self._flow_job, grow)
            self._flow_g = np.resize(self._flow_g, grow)
        self._flow_job[fids] = jid
        self._flow_g[fids] = g

    def _pump(self, jids: list[int], now: float) -> None:
        """Settle the arrived ranks of jobs ``jids`` at ``now`` and start every transfer whose two ends are in
        its phase (eager senders move on at once: repeat until nobody enters)."""
        for jid in jids:
            job = self._jobs.get(jid)
            if job is None:
                continue
            while job.arrivals:
                arrived = np.concatenate(job.arrivals)
                job.arrivals = []
                entered = job.settle(arrived)
                if entered.size == 0:
                    continue
                slots = job.ptr[entered]
                idx = _gather(job.slot_start[slots], job.slot_count[slots])
                g = job.slot_g[idx]
                me = np.repeat(entered, job.slot_count[slots])
                other = np.where(job.g_src[g] == me, job.g_dst[g], job.g_src[g])
                ready = ~job.started[g] & (job.cur[other] == job.g_phase[g])
                g = _distinct(g[ready])
                if g.size == 0:
                    continue
                job.started[g] = True
                if self.eager:  # the senders are done with these transfers already
                    senders = job.g_src[g]
                    np.subtract.at(job.left, senders, 1)
                    s_u = _distinct(senders)
                    self._done_with(jid, job, s_u[job.left[s_u] == 0], now)
                self._start(jid, job, g, now)
            if job.complete:
                del self._jobs[jid]
                self._timings[job.tag] = JobTiming(job.start_s, job.finished, job.phase_end)
                self._out.append((job.finished, job.tag))

    def next_event_s(self, horizon_s: float | None = None) -> float:
        t = min(self.net.next_event_s(), self._alone.next_event_s())
        if self._out:
            t = min(t, min(e[0] for e in self._out))
        if self.cpu is not None:
            t = min(t, self.cpu.next_event_s())
        return t

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        out, self._out = self._out, []
        while (t_next := self.next_event_s()) <= to_s:
            times, fids = self.net.advance_ids(t_next)
            touched: set[int] = set()
            if fids.size:
                jobs = self._flow_job[fids]
                one = bool((jobs == jobs[0]).all())  # the common case: one job moves
                for jid in ([int(jobs[0])] if one else np.unique(jobs).tolist()):
                    sel = jobs == jid
                    job = self._jobs[jid]
                    g = self._flow_g[fids[sel]]
                    t_g = times[sel]
                    np.maximum.at(job.phase_end, job.g_phase[g], t_g)
                    job.finished = max(job.finished, float(t_g.max()))
                    ends = job.g_dst[g] if self.eager else np.concatenate([job.g_src[g], job.g_dst[g]])
                    np.subtract.at(job.left, ends, 1)
                    e_u = _distinct(ends)
                    self._done_with(jid, job, e_u[job.left[e_u] == 0], t_next)
                    touched.add(jid)
            if self.cpu is not None:
                for t_done, tag in self.cpu.advance(t_next):  # a rank's CPU work of its phase is done
                    jid, r = cast(tuple[int, int], tag)
                    job = self._jobs[jid]
                    k = int(job.cur[r])
                    job.phase_end[k] = max(job.phase_end[k], t_done)
                    job.finished = max(job.finished, t_done)
                    job.arrivals.append(np.array([r], dtype=np.int64))
                    touched.add(jid)
            self._pump(sorted(touched), t_next)
            out.extend(self._out)
            self._out = []
            out.extend(self._alone.pop_until(t_next))
        self.net.advance_ids(to_s)
        if self.cpu is not None:
            self.cpu.advance(to_s)
        if self.next_event_s() == np.inf and self._jobs:
            raise RuntimeError("schedule deadlocked: some rank waits for a partner that never arrives")
        return out


def async_model(params: NetworkParams) -> FlowAsyncModel:
    """The ``flow-async`` model with ``params`` (:func:`topotrain.network.registry.get_model`)."""
    return FlowAsyncModel(params=params)


def eager_model(params: NetworkParams) -> FlowAsyncModel:
    """The ``flow-eager`` model with ``params``: flow-async where a send is done once its flow starts."""
    return FlowAsyncModel(eager_sends=True, params=params)
