"""The ``flow`` network model: schedules timed phase by phase on the flow-level fluid network.

The fluid model itself (max-min fair sharing of the real routed paths, event driven, as in SimGrid's flow
models, Velho et al., ACM TOMACS 2013) is :class:`~topotrain.network.flow_network.FlowNetwork`.
:class:`FlowModel` is the ``flow`` network model over it; its :class:`FlowSim` (the engine-facing
:class:`~topotrain.network.base.NetworkSim`) advances every submitted schedule phase by phase in one shared
:class:`FlowNetwork`, so that concurrent collectives contend. :class:`SharedFlowSim` is what the simulators over
one shared network have in common (:mod:`topotrain.network.flow_async` builds on it too), and
:class:`_PairPaths` resolves a schedule's phases onto links, once per (source, destination) pairs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from topotrain.collectives.paths import PhasePaths, path_cache
from topotrain.collectives.schedule import Phase, Schedule
from topotrain.network.base import (
    AloneJobs,
    CollectiveResult,
    JobTiming,
    check_submit,
    overhead_floor_s,
    run_alone,
    time_phases,
)
from topotrain.network.flow_network import FlowNetwork
from topotrain.network.flow_rates import PreparedBatch
from topotrain.network.params import NetworkParams
from topotrain.network.switching import on_fabric, store_forward_phases_s
from topotrain.topology.graph import Topology


# ---- the "flow" NetworkModel ------------------------------------------------------------------------
def _without_local(pp: PhasePaths) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (offsets, links, bytes) of a phase's transfers that cross links (to oneself costs nothing)."""
    lengths = np.diff(pp.offsets)
    keep = np.flatnonzero(lengths > 0)
    if keep.shape[0] == pp.num_transfers:
        return pp.offsets, pp.links, pp.bytes
    lengths = lengths[keep]
    off = np.zeros(keep.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    sel = np.repeat(pp.offsets[:-1][keep] - off[:-1], lengths) + np.arange(int(off[-1]))
    return off, pp.links[sel], pp.bytes[keep]


class _PairPaths:
    """Resolved phases of one schedule, reusing the paths of phases with the same (src, dst) pairs."""

    def __init__(self, topo: Topology, schedule: Schedule) -> None:
        self.schedule = schedule
        self.cache = path_cache(topo, schedule.ranks)
        self.by_pairs: dict[bytes, PhasePaths] = {}
        self.batches: dict[bytes, tuple[np.ndarray | None, PreparedBatch | None]] = {}
        self.pair_keys: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, bytes]] = {}
        #: per phase (by id; the entry holds the phase): what ``launch`` needs of it
        self.launches: dict[int, tuple[Phase, PreparedBatch | None, np.ndarray, bool]] = {}

    def resolve(self, phase: Phase) -> tuple[bytes, PhasePaths]:
        pairs = phase.src.tobytes() + b"|" + phase.dst.tobytes()
        base = self.by_pairs.get(pairs)
        if base is None:
            pp = self.cache.resolve(self.schedule, phase)
            if len(self.by_pairs) >= 64:
                self.by_pairs.clear()
            self.by_pairs[pairs] = pp
            return pairs, pp
        return pairs, PhasePaths(base.offsets, base.links, base.latency_s,
                                 self.schedule.transfer_bytes(phase).astype(np.float64))

    def launch(self, phase: Phase, net: FlowNetwork) -> tuple[PreparedBatch | None, np.ndarray, bool]:
        """:meth:`prepared`, and whether every size is positive and finite, once per phase (a schedule submitted again
        starts the same phases: pipeline sends, one bucket's collective every iteration)."""
        hit = self.launches.get(id(phase))
        if hit is None:
            batch, sizes = self.prepared(phase, net)
            if len(self.launches) >= 4096:
                self.launches.clear()
            ok = bool(sizes.shape[0] and sizes.min() > 0.0 and np.isfinite(sizes.max()))
            hit = self.launches[id(phase)] = (phase, batch, sizes, ok)
        return hit[1], hit[2], hit[3]

    def prepared(self, phase: Phase, net: FlowNetwork) -> tuple[PreparedBatch | None, np.ndarray]:
        """(the phase's transfers that cross links, grouped in ``net`` once per pair signature — None when
        none does —, their sizes in bytes). ``net`` must be the same network at every call."""
        # phases of one pattern share their src/dst arrays: their key is made once (the entry holds the arrays,
        # so no other array can take their ids while it is kept)
        known = self.pair_keys.get((id(phase.src), id(phase.dst)))
        if known is None:
            if len(self.pair_keys) >= 4096:
                self.pair_keys.clear()
            known = self.pair_keys[(id(phase.src), id(phase.dst))] = (
                phase.src, phase.dst, phase.src.tobytes() + b"|" + phase.dst.tobytes())
        pairs = known[2]
        hit = self.batches.get(pairs)
        if hit is None:
            pp = self.resolve(phase)[1]
            keep = np.flatnonzero(np.diff(pp.offsets) > 0)
            off, links, _ = _without_local(pp)
            hit = (None if keep.shape[0] == pp.num_transfers else keep,
                   net.prepare(off, links) if keep.size else None)
            if len(self.batches) >= 64:
                self.batches.clear()
            self.batches[pairs] = hit
        sizes = self.schedule.transfer_bytes(phase).astype(np.float64)
        return hit[1], sizes if hit[0] is None else sizes[hit[0]]


def phase_time_flow(pp: PhasePaths, topo: Topology, net: FlowNetwork) -> tuple[float, np.ndarray]:
    """(time, bytes per directed link) of one resolved phase whose transfers all start at 0, alone, on
    ``net`` (a ``report=False`` network of ``topo`` with the model's overhead; it is reset first)."""
    link_bytes = np.bincount(pp.links, weights=pp.bytes[pp.entry_transfer()], minlength=topo.num_links)
    if pp.links.size == 0:
        return 0.0, link_bytes
    net.reset()
    off, links, sizes = _without_local(pp)
    net.start_many(off, links, sizes, 0.0)
    net.run()
    return net.last_completion_s, link_bytes


class FlowModel:
    """Flow-level timing of a Schedule: max-min fair sharing on the routed paths, phase by phase.

    Phases run one after another (a barrier between them); the transfers of a phase all start together
    and the phase ends when its last transfer completes. Timed alone (:meth:`time_alone`), phases with the
    same :func:`phase_key` are simulated once and reused. This is exact, not an approximation: a phase that
    runs alone, from an idle network, depends only on who sends how many bytes to whom (the paths follow
    from the pairs), never on which chunks the bytes are. A ring allreduce with equal chunks costs one
    simulation, not 2(p−1). Phases with the same (source, destination) pairs but other sizes (a ring whose
    chunks differ by a byte) still reuse the resolved paths and their path groups. Schedules that share
    the network (:class:`FlowSim`) advance phase by phase in one :class:`FlowNetwork` and contend.
    """

    name = "flow"
    contends = True

    def __init__(self, params: NetworkParams | None = None) -> None:
        self.params = params if params is not None else NetworkParams()

    def time_alone(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        """The schedule with nothing else on the network, phase by phase, identical phases simulated once; on a
        packet fabric (:attr:`NetworkParams.fabric`), its framed schedule, each phase plus its store-and-forward
        term (:mod:`topotrain.network.switching`)."""
        extra = None
        if not self.params.fabric.is_cut_through:
            schedule, extra = on_fabric(schedule, topo, self.params.fabric)
        paths = _PairPaths(topo, schedule)
        nets: dict[bytes, FlowNetwork] = {}  # one per pair signature, so its path groups are reused
        overhead = self.params.message_overhead_s

        def one(phase: Phase) -> tuple[float, np.ndarray]:
            pairs, pp = paths.resolve(phase)
            net = nets.get(pairs)
            if net is None:
                if len(nets) >= 64:
                    nets.clear()
                net = nets[pairs] = FlowNetwork(topo, report=False, overhead_s=overhead,
                                                arbitration=self.params.arbitration)
            return phase_time_flow(pp, topo, net)

        return time_phases(self.name, schedule, topo, one, extra)

    def floor_s(self, schedule: Schedule) -> float:
        """A lower bound of :meth:`time_alone` of ``schedule`` (:func:`~topotrain.network.base.overhead_floor_s`)."""
        return overhead_floor_s(schedule, self.params)

    def open(self, topo: Topology) -> FlowSim:
        return FlowSim(self, topo)

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        return run_alone(self, schedule, topo)


@dataclass(eq=False)
class _BarrierJob:
    """A submitted schedule advancing phase by phase in the shared network."""

    tag: object
    schedule: Schedule
    paths: _PairPaths
    start_s: float
    phase_end_s: np.ndarray
    phase: int = 0
    #: on a store-and-forward fabric, each phase's term: phase ``k+1`` (or the completion) waits it after phase
    #: ``k``'s fluid completion
    extra_s: np.ndarray | None = None


class SharedFlowSim:
    """What the simulators over one shared :class:`FlowNetwork` have in common: the network, the
    ``alone`` submissions (timed once per key by ``time_alone``), the finished jobs' timings and link bytes."""

    def __init__(self, topo: Topology, net: FlowNetwork, time_alone: Callable[[Schedule], CollectiveResult]) -> None:
        self.topo = topo
        self.net = net
        self._alone = AloneJobs(time_alone, topo.num_links)
        self._timings: dict[object, JobTiming] = {}
        self._next_id = 0

    def _take_id(self) -> int:
        jid = self._next_id
        self._next_id += 1
        return jid

    def alone(self, schedule: Schedule, key: str | None = None) -> CollectiveResult:
        return self._alone.result(schedule, key)

    def timing(self, tag: object) -> JobTiming:
        hit = self._timings.get(tag)
        return hit if hit is not None else self._alone.timing(tag)

    def link_bytes(self) -> np.ndarray:
        return self.net.link_bytes() + self._alone.link_bytes


class FlowSim(SharedFlowSim):
    """:class:`~topotrain.network.base.NetworkSim` of the ``flow`` model: every schedule submitted without
    ``alone`` advances phase by phase (phase ``k+1`` starts when its phase ``k`` has completed) while the
    flows of all of them share one :class:`FlowNetwork`; ``alone`` submissions are timed by
    :meth:`FlowModel.time_alone` once per key.

    On a packet fabric (:attr:`NetworkParams.fabric`, not cut-through) a schedule's framed phases run in the
    network, and phase ``k+1`` (or the schedule's completion) starts its phase ``k``'s store-and-forward term
    after phase ``k``'s fluid completion (a heap of these delayed launches, processed in time order), so a
    schedule alone in the network takes what :meth:`FlowModel.time_alone` gives. One exception: a negative
    term (an incast on paths of unequal latency can have one, of the order of a latency) cannot start the next
    phase before the network's present, so here it counts as 0 (the schedule then ends up to that much later
    than alone)."""

    def __init__(self, model: FlowModel, topo: Topology) -> None:
        super().__init__(topo, FlowNetwork(topo, overhead_s=model.params.message_overhead_s, jobs=True,
                                           arbitration=model.params.arbitration),
                         lambda s: model.time_alone(s, topo))
        self._jobs: dict[int, _BarrierJob] = {}
        self._paths: dict[str, _PairPaths] = {}
        self._ready: list[tuple[float, int, object]] = []  # schedules with nothing to send: done at once
        fabric = model.params.fabric
        self._fabric = None if fabric.is_cut_through else fabric
        self._delayed: list[tuple[float, int, int]] = []  # (time, seq, job): a phase's launch after its term
        self._delayed_seq = 0
        self._fabric_memo: dict[str, tuple[Schedule, np.ndarray | None]] = {}

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        check_submit(at_s, self.net.now_s)
        if alone:
            self._alone.submit(schedule, at_s, tag, key)
            return
        extra = None
        if self._fabric is not None:
            schedule, extra = self._on_fabric(schedule, key)
        paths = self._paths.get(key) if key is not None else None
        if paths is None:
            paths = _PairPaths(self.topo, schedule)
            if key is not None:
                self._paths[key] = paths
        jid = self._take_id()
        job = _BarrierJob(tag, schedule, paths, at_s, np.zeros(len(schedule.phases)), extra_s=extra)
        self._jobs[jid] = job
        if not self._launch(jid, at_s):
            self._complete(jid, at_s)
            heapq.heappush(self._ready, (at_s, jid, tag))

    def _on_fabric(self, schedule: Schedule, key: str | None) -> tuple[Schedule, np.ndarray | None]:
        """(the framed schedule, each phase's store-and-forward term or None), once per key."""
        hit = self._fabric_memo.get(key) if key is not None else None
        if hit is None:
            assert self._fabric is not None
            framed = on_fabric(schedule, self.topo, self._fabric)[0]
            extra = (store_forward_phases_s(schedule, self.topo, self._fabric)
                     if self._fabric.store_and_forward else None)
            hit = (framed, extra)
            if key is not None:
                self._fabric_memo[key] = hit
        return hit

    def _launch(self, jid: int, t: float) -> bool:
        """Start job ``jid``'s next phase that crosses links at ``t`` (phases of local copies end at once);
        False when no phase is left."""
        job = self._jobs[jid]
        phases = job.schedule.phases
        while job.phase < len(phases):
            batch, sizes, sendable = job.paths.launch(phases[job.phase], self.net)
            if batch is not None:
                if sendable:  # every size positive and finite
                    self.net.start_prepared(batch, sizes, t, job=jid, checked=True)
                else:  # empty messages complete at once: the general path
                    off, links, sizes = _without_local(job.paths.resolve(phases[job.phase])[1])
                    self.net.start_many(off, links, sizes, t, job=jid)
                return True
            job.phase_end_s[job.phase] = t
            job.phase += 1
        return False

    def _complete(self, jid: int, t: float) -> None:
        job = self._jobs.pop(jid)
        self._timings[job.tag] = JobTiming(job.start_s, t, job.phase_end_s)

    def next_event_s(self, horizon_s: float | None = None) -> float:
        t = self._alone.next_event_s()
        if self._ready:
            t = min(t, self._ready[0][0])
        if self._delayed:
            t = min(t, self._delayed[0][0])
        return min(t, self.net.next_event_s(None if horizon_s is None else min(horizon_s, t)))

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        out: list[tuple[float, object]] = []
        while (t := self.next_event_s(to_s)) <= to_s:
            for t_done, jid in self.net.advance_jobs(t):
                job = self._jobs[jid]
                if job.extra_s is not None:  # a store-and-forward fabric: the next phase waits this one's term
                    t_next = t_done + max(float(job.extra_s[job.phase]), 0.0)  # never a launch in the past
                    job.phase_end_s[job.phase] = t_next
                    job.phase += 1
                    heapq.heappush(self._delayed, (t_next, self._delayed_seq, jid))
                    self._delayed_seq += 1
                    continue
                job.phase_end_s[job.phase] = t_done
                job.phase += 1
                if not self._launch(jid, t_done):
                    self._complete(jid, t_done)
                    out.append((t_done, job.tag))
            while self._delayed and self._delayed[0][0] <= t:
                t_d, _, jid = heapq.heappop(self._delayed)
                job = self._jobs[jid]
                if not self._launch(jid, t_d):
                    self._complete(jid, t_d)
                    out.append((t_d, job.tag))
            out.extend(self._alone.pop_until(t))
            while self._ready and self._ready[0][0] <= t:
                t_r, _, tag = heapq.heappop(self._ready)
                out.append((t_r, tag))
        self.net.advance_jobs(to_s)
        return out
