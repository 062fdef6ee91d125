"""Flow-level model without phase barriers: every rank runs ahead as soon as its own data has arrived.

The ``flow`` model (:mod:`topotrain.network.flow`) treats each phase of a schedule as a barrier, as the
step-wise cost models do. Real executions (NCCL, gloo, and :mod:`topotrain.comm`) have no global barrier:
rank ``r`` enters phase ``k+1`` as soon as *its own* sends and receives of phase ``k`` are done, and a
transfer ``s → d`` of phase ``k`` flows once both ``s`` and ``d`` have entered phase ``k`` (a rendezvous:
the receiver has posted its buffer). Pipelined schedules (trees, chunked chains) and congested topologies,
where some ranks finish a step early, run faster than with barriers. Bandwidth is still shared max-min on
the real routed paths (one :class:`~topotrain.network.flow.FlowNetwork`); every flow still pays path
latency and the per-message overhead (unless the ranks share a CPU, below).

Eager sends (``eager_sends=True``, the ``flow-eager`` model): a sender's part of a transfer ends as soon
as its flow starts, not when the data has arrived — the message is handed to a send buffer that holds
all of it and the sender moves on. That is gloo's TCP transport (``transport/tcp/pair.cc`` writes a send
once the receiver's recv-ready notification has arrived and grows ``SO_SNDBUF`` to the message, so the
``isend`` completes when written) and MPI's eager protocol for messages below its eager limit. The
receiver still waits for the last byte, path latency and the per-message overhead. A rank whose phase
only sends therefore passes it at once and posts the next one, so a pipelined chain keeps its slowest
link busy (measured on the emulated incast testbed, ``benchmarks/testbed.py``: the tree's root on the
quarter-speed link passes its send-only phases in 0.3 ms instead of one chunk time).

Shared CPU (:attr:`NetworkParams.shared_cpu_cores` ``= K``, for ranks that run on one machine, as on the
emulated testbed): the per-message overhead :attr:`NetworkParams.message_overhead_s` is then not added to
each delivery but
is CPU time of the rank, once per phase — after its transfers of a phase are done, a rank spends
``overhead`` of CPU (posting the phase's batch of messages, waiting, reducing: one
``batch_isend_irecv`` per phase in :mod:`topotrain.comm`) before it enters the next phase, and all ranks'
such work shares ``K`` cores (processor sharing, each rank at most one core: :class:`SharedCores`). When
every rank computes at once — a ring of small messages — each gets K/p of a core and the overhead
stretches p/K-fold; when ranks wait on a slow link at different times it does not. LogP's processor
overhead ``o`` (Culler et al., PPoPP 1993) on a shared, time-sliced CPU, charged per phase rather than
per message: on the testbed, a tree's interior ranks handle four messages a phase without paying four
times a ring rank's two (re-predicting one testbed run's 36 rows, the worst error was 22% charged per
message, 20% per phase; docs/validation.md §4).

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
    AloneJobs,
    CollectiveResult,
    JobTiming,
    PathCache,
    PhasePaths,
    check_submit,
    run_alone,
)
from topotrain.network.flow import FlowNetwork
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology


class SharedCores:
    """Processor sharing of ``cores`` among the active jobs, each at most one core: with ``n`` jobs every
    one runs at ``min(1, cores / n)``. Exact and O(log n) per event with a virtual clock (as in GPS /
    fair queueing: Parekh & Gallager, IEEE/ACM ToN 1993): all active jobs progress alike, so a job of
    ``w`` seconds started at virtual time ``V0`` ends when the virtual time reaches ``V0 + w``.
    Same driving API as :class:`~topotrain.network.flow.FlowNetwork`: start, next_event_s, advance."""

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


@dataclass(eq=False)
class _AsyncJob:
    """Per-rank progress of one submitted schedule: which phase each rank is in and what it has left."""

    tag: object
    schedule: Schedule
    resolved: list[PhasePaths]
    by_rank: list[dict[int, list[int]]]  # by_rank[k][r]: transfers of phase k that rank r takes part in
    start_s: float
    cur: np.ndarray
    left: np.ndarray
    started: list[np.ndarray]
    phase_end: np.ndarray
    finished: float
    arrivals: list[int] = field(default_factory=list)
    done_ranks: int = 0

    @classmethod
    def make(cls, tag: object, schedule: Schedule, topo: Topology, at_s: float) -> _AsyncJob:
        phases = schedule.phases
        cache = PathCache(topo, schedule.ranks)
        by_rank: list[dict[int, list[int]]] = []
        for ph in phases:  # self-transfers cost nothing: skipped
            d: dict[int, list[int]] = {}
            for i in np.flatnonzero(ph.src != ph.dst).tolist():
                d.setdefault(int(ph.src[i]), []).append(i)
                d.setdefault(int(ph.dst[i]), []).append(i)
            by_rank.append(d)
        p = schedule.num_ranks
        return cls(tag, schedule, [cache.resolve(schedule, ph) for ph in phases], by_rank, at_s,
                   np.zeros(p, dtype=np.int64), np.zeros(p, dtype=np.int64),
                   [np.zeros(len(ph), dtype=bool) for ph in phases], np.zeros(len(phases)), at_s,
                   list(range(p)))

    def settle(self, ranks: list[int]) -> list[int]:
        """Move ranks past phases they take no part in; return those that entered a phase with work."""
        entered = []
        n_ph = len(self.by_rank)
        for r in ranks:
            k = int(self.cur[r])
            while k < n_ph and r not in self.by_rank[k]:
                k += 1
            self.cur[r] = k
            if k < n_ph:
                self.left[r] = len(self.by_rank[k][r])
                entered.append(r)
            else:
                self.done_ranks += 1
        return entered

    @property
    def complete(self) -> bool:
        return self.done_ranks == self.schedule.num_ranks


class FlowAsyncSim:
    """:class:`~topotrain.network.base.NetworkSim` of ``flow-async`` / ``flow-eager``: submitted schedules
    progress rank by rank (module docstring) in one shared :class:`FlowNetwork` and CPU pool."""

    def __init__(self, model: FlowAsyncModel, topo: Topology) -> None:
        self.topo = topo
        self.eager = model.eager_sends
        self.overhead_s = model.params.message_overhead_s
        cores = model.params.shared_cpu_cores
        cpu_job = cores > 0 and self.overhead_s > 0
        self.net = FlowNetwork(topo, overhead_s=0.0 if cpu_job else self.overhead_s)
        self.cpu = SharedCores(cores) if cpu_job else None
        self._alone = AloneJobs(lambda s: model.time_alone(s, topo), topo.num_links)
        self._jobs: dict[int, _AsyncJob] = {}
        self._next_id = 0
        self._timings: dict[object, JobTiming] = {}
        self._out: list[tuple[float, object]] = []
        self._pending: list[int] = []  # jobs with ranks waiting to be settled

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        check_submit(at_s, self.net.now_s)
        if alone:
            self._alone.submit(schedule, at_s, tag, key)
            return
        jid = self._next_id
        self._next_id += 1
        self._jobs[jid] = _AsyncJob.make(tag, schedule, self.topo, at_s)
        self._pump([jid], at_s)

    def alone(self, schedule: Schedule, key: str | None = None) -> CollectiveResult:
        return self._alone.result(schedule, key)

    def _done_with(self, jid: int, job: _AsyncJob, r: int, t: float) -> None:
        """Rank r has no transfer of its phase left: it moves on now, or after its CPU work."""
        if self.cpu is None:
            job.cur[r] += 1
            job.arrivals.append(r)
        else:
            self.cpu.start(self.overhead_s, t, (jid, r))

    def _pump(self, jids: list[int], now: float) -> None:
        """Settle the arrived ranks of jobs ``jids`` at ``now`` and start every transfer whose two ends are in
        its phase (eager senders move on at once: repeat until nobody enters)."""
        for jid in jids:
            job = self._jobs.get(jid)
            if job is None:
                continue
            phases = job.schedule.phases
            while job.arrivals:
                entered = job.settle(job.arrivals)
                job.arrivals = []
                batch_k: list[int] = []
                batch_i: list[int] = []
                for r in entered:
                    k = int(job.cur[r])
                    ph = phases[k]
                    for i in job.by_rank[k][r]:
                        if job.started[k][i]:
                            continue
                        other = int(ph.dst[i]) if int(ph.src[i]) == r else int(ph.src[i])
                        if int(job.cur[other]) == k:
                            job.started[k][i] = True
                            batch_k.append(k)
                            batch_i.append(i)
                if batch_i and self.eager:  # the senders are done with these transfers already
                    for k, i in zip(batch_k, batch_i, strict=True):
                        r = int(phases[k].src[i])
                        job.left[r] -= 1
                        if job.left[r] == 0:
                            self._done_with(jid, job, r, now)
                if batch_i:
                    offs = [0]
                    links: list[np.ndarray] = []
                    sizes = []
                    for k, i in zip(batch_k, batch_i, strict=True):
                        pp = job.resolved[k]
                        seg = pp.links[pp.offsets[i]:pp.offsets[i + 1]]
                        links.append(seg)
                        offs.append(offs[-1] + len(seg))
                        sizes.append(pp.bytes[i])
                    tags = [(jid, k, i) for k, i in zip(batch_k, batch_i, strict=True)]
                    self.net.start_many(np.array(offs, dtype=np.int64),
                                        np.concatenate(links) if links else np.zeros(0, dtype=np.int64),
                                        np.array(sizes), now, tags)
            if job.complete:
                del self._jobs[jid]
                self._timings[job.tag] = JobTiming(job.start_s, job.finished, job.phase_end)
                self._out.append((job.finished, job.tag))

    def next_event_s(self) -> float:
        t = min(self.net.next_event_s(), self._alone.next_event_s())
        if self._out:
            t = min(t, min(e[0] for e in self._out))
        if self.cpu is not None:
            t = min(t, self.cpu.next_event_s())
        return t

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        out, self._out = self._out, []
        while (t_next := self.next_event_s()) <= to_s:
            done: list[tuple[float, object]] = list(self.net.advance(t_next))
            if self.cpu is not None:
                done.extend(self.cpu.advance(t_next))
                done.sort(key=lambda e: e[0])  # stable: at equal times network completions come first
            touched: list[int] = []
            for t_done, tag in done:
                parts = cast(tuple[int, ...], tag)
                if len(parts) == 2:  # a rank's CPU work of a phase is done
                    jid, r = parts
                    job = self._jobs[jid]
                    job.phase_end[job.cur[r]] = max(job.phase_end[job.cur[r]], t_done)
                    job.finished = max(job.finished, t_done)
                    job.cur[r] += 1
                    job.arrivals.append(r)
                    touched.append(jid)
                    continue
                jid, k, i = parts
                job = self._jobs[jid]
                job.phase_end[k] = max(job.phase_end[k], t_done)
                job.finished = max(job.finished, t_done)
                ph = job.schedule.phases[k]
                ends = (int(ph.dst[i]),) if self.eager else (int(ph.src[i]), int(ph.dst[i]))
                for r in ends:
                    job.left[r] -= 1
                    if job.left[r] == 0:
                        self._done_with(jid, job, r, t_done)
                touched.append(jid)
            self._pump(sorted(set(touched)), t_next)
            out.extend(self._out)
            self._out = []
            out.extend(self._alone.pop_until(t_next))
        self.net.advance(to_s)
        if self.cpu is not None:
            self.cpu.advance(to_s)
        if self.next_event_s() == np.inf and self._jobs:
            raise RuntimeError("schedule deadlocked: some rank waits for a partner that never arrives")
        return out

    def timing(self, tag: object) -> JobTiming:
        hit = self._timings.get(tag)
        return hit if hit is not None else self._alone.timing(tag)

    def link_bytes(self) -> np.ndarray:
        return self.net.link_bytes() + self._alone.link_bytes
