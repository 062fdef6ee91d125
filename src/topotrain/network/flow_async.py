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

Shared CPU (``topo.meta["shared_cpu_cores"] = K``, for ranks that run on one machine, as on the emulated
testbed): the per-message overhead ``Topology.message_overhead_s`` is then not added to each delivery but
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
event per rank and phase. Measured (``examples/eflops-bigraph.yaml``, 128 GPUs, 64 MiB allreduce, this
2-core VM): ring 0.02 s ``flow``, 0.96 s ``flow-async`` and ``flow-eager``, 1.7 s with 2 shared cores;
HDRM 0.03, 0.05 and 0.05 s.
"""

from __future__ import annotations

import heapq

import numpy as np

from topotrain.collectives.schedule import Schedule
from topotrain.errors import ConfigError
from topotrain.network.base import CollectiveResult, PathCache
from topotrain.network.flow import FlowNetwork
from topotrain.topology.graph import Topology

_JOB = 1 << 62  # tags above this are CPU jobs (rank = tag - _JOB), below it transfers (k << 32 | i)


def shared_cpu_cores(topo: Topology) -> float:
    """``topo.meta["shared_cpu_cores"]`` checked (0 when absent: no shared CPU)."""
    k = topo.meta.get("shared_cpu_cores", 0)
    try:
        cores = float(k)
    except (TypeError, ValueError):
        cores = -1.0
    if not cores >= 0:
        raise ConfigError("meta.shared_cpu_cores", f"must be a number of cores >= 0, got {k!r}",
                          "give e.g. 2, or leave it out")
    return cores


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
        self._heap: list[tuple[float, int, int]] = []  # (virtual finish, seq, tag)
        self._seq = 0

    def _rate(self) -> float:
        n = len(self._heap)
        return min(1.0, self.cores / n) if n else 0.0

    def _to(self, t_s: float) -> None:
        if t_s > self.now_s:
            self._v += (t_s - self.now_s) * self._rate()
            self.now_s = t_s

    def start(self, work_s: float, now_s: float, tag: int) -> None:
        self._to(now_s)
        heapq.heappush(self._heap, (self._v + float(work_s), self._seq, tag))
        self._seq += 1

    def next_event_s(self) -> float:
        if not self._heap:
            return float("inf")
        return self.now_s + max(0.0, self._heap[0][0] - self._v) / self._rate()

    def advance(self, to_s: float) -> list[tuple[float, int]]:
        """Progress to ``to_s``; ``(completion time, tag)`` of the jobs done by then, in time order."""
        out: list[tuple[float, int]] = []
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

    def __init__(self, eager_sends: bool = False) -> None:
        self.eager_sends = bool(eager_sends)
        self.name = "flow-eager" if self.eager_sends else "flow-async"

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        p = schedule.num_ranks
        phases = schedule.phases
        n_ph = len(phases)
        cache = PathCache(topo, schedule.ranks)
        resolved = [cache.resolve(schedule, ph) for ph in phases]
        # ops[k][r]: transfers of phase k that rank r takes part in (self-transfers cost nothing: skipped)
        remote = [ph.src != ph.dst for ph in phases]
        by_rank: list[dict[int, list[int]]] = []
        for k, ph in enumerate(phases):
            d: dict[int, list[int]] = {}
            for i in np.flatnonzero(remote[k]).tolist():
                d.setdefault(int(ph.src[i]), []).append(i)
                d.setdefault(int(ph.dst[i]), []).append(i)
            by_rank.append(d)
        cur = np.zeros(p, dtype=np.int64)  # phase each rank is in
        left = np.zeros(p, dtype=np.int64)  # its unfinished transfers there
        started = [np.zeros(len(ph), dtype=bool) for ph in phases]
        phase_end = np.zeros(n_ph)
        cores = shared_cpu_cores(topo)
        overhead = float(topo.message_overhead_s)
        cpu_job = cores > 0 and overhead > 0
        net = FlowNetwork(topo, overhead_s=0.0 if cpu_job else None)
        cpu = SharedCores(cores) if cpu_job else None
        arrivals: list[int] = list(range(p))
        now = 0.0
        finished = 0.0

        def settle(ranks: list[int]) -> list[int]:
            """Move ranks past phases they take no part in; return those that entered a phase with work."""
            entered = []
            for r in ranks:
                k = int(cur[r])
                while k < n_ph and r not in by_rank[k]:
                    k += 1
                cur[r] = k
                if k < n_ph:
                    left[r] = len(by_rank[k][r])
                    entered.append(r)
            return entered

        def done_with(r: int, t: float) -> None:
            """Rank r has no transfer of its phase left: it moves on now, or after its CPU work."""
            if cpu is None:
                cur[r] += 1
                arrivals.append(r)
            else:
                cpu.start(overhead, t, _JOB + r)

        while True:
            while arrivals:  # eager senders move on at once: settle until nobody enters
                entered = settle(arrivals)
                arrivals = []
                batch_k: list[int] = []
                batch_i: list[int] = []
                for r in entered:
                    k = int(cur[r])
                    ph = phases[k]
                    for i in by_rank[k][r]:
                        if started[k][i]:
                            continue
                        other = int(ph.dst[i]) if int(ph.src[i]) == r else int(ph.src[i])
                        if int(cur[other]) == k:
                            started[k][i] = True
                            batch_k.append(k)
                            batch_i.append(i)
                if batch_i and self.eager_sends:  # the senders are done with these transfers already
                    for k, i in zip(batch_k, batch_i, strict=True):
                        r = int(phases[k].src[i])
                        left[r] -= 1
                        if left[r] == 0:
                            done_with(r, now)
                if batch_i:
                    offs = [0]
                    links: list[np.ndarray] = []
                    sizes = []
                    for k, i in zip(batch_k, batch_i, strict=True):
                        pp = resolved[k]
                        seg = pp.links[pp.offsets[i]:pp.offsets[i + 1]]
                        links.append(seg)
                        offs.append(offs[-1] + len(seg))
                        sizes.append(pp.bytes[i])
                    tags = [k * (1 << 32) + i for k, i in zip(batch_k, batch_i, strict=True)]
                    net.start_many(np.array(offs, dtype=np.int64),
                                   np.concatenate(links) if links else np.zeros(0, dtype=np.int64),
                                   np.array(sizes), now, tags)
            t_next = min(net.next_event_s(), cpu.next_event_s() if cpu is not None else float("inf"))
            if t_next == float("inf"):
                break
            done = net.advance(t_next)
            if cpu is not None:
                done.extend(cpu.advance(t_next))
                done.sort(key=lambda e: e[0])  # stable: at equal times network completions come first
            for t_done, tag in done:
                now = t_done
                if int(tag) >= _JOB:  # type: ignore[call-overload]
                    r = int(tag) - _JOB  # type: ignore[call-overload]
                    phase_end[cur[r]] = max(phase_end[cur[r]], t_done)
                    finished = max(finished, t_done)
                    cur[r] += 1
                    arrivals.append(r)
                    continue
                k, i = divmod(int(tag), 1 << 32)  # type: ignore[call-overload]
                phase_end[k] = max(phase_end[k], t_done)
                finished = max(finished, t_done)
                ends = (int(phases[k].dst[i]),) if self.eager_sends else (int(phases[k].src[i]),
                                                                         int(phases[k].dst[i]))
                for r in ends:
                    left[r] -= 1
                    if left[r] == 0:
                        done_with(r, t_done)
            now = t_next
        if bool((cur < n_ph).any()):
            raise RuntimeError("schedule deadlocked: some rank waits for a partner that never arrives")
        running = np.maximum.accumulate(phase_end) if n_ph else phase_end
        times = np.diff(np.concatenate([[0.0], running]))
        return CollectiveResult(self.name, float(finished), times, net.link_bytes())
