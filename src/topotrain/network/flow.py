"""The ``flow`` network model: schedules timed phase by phase on the flow-level fluid network.

The fluid model itself (max-min fair sharing of the real routed paths, event driven, as in SimGrid's flow
models, Velho et al., ACM TOMACS 2013) is :class:`~topotrain.network.flow_network.FlowNetwork`.
:class:`FlowModel` is the ``flow`` network model over it; its :class:`FlowSim` (the engine-facing
:class:`~topotrain.network.base.NetworkSim`) advances every submitted schedule phase by phase in one shared
:class:`FlowNetwork`, so that concurrent collectives contend. :class:`SharedFlowSim` is what the simulators over
one shared network have in common (:mod:`topotrain.network.flow_async` builds on it too), and
:class:`_PairPaths` resolves a schedule's phases onto links, once per (source, destination) pairs. A job's next
phases that start the same prepared batch on the same links (a ring's steps) are *chained*: the network's compiled
departure loop starts them itself when the phase before completes (:mod:`topotrain.network.flow_chain`).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from topotrain.collectives.paths import PhasePaths, path_cache
from topotrain.collectives.schedule import Phase, Schedule
from topotrain.network.base import (
    AloneJobs,
    CollectiveResult,
    JobTiming,
    LinkBytesTally,
    check_submit,
    overhead_floor_s,
    run_alone,
    time_phases,
)
from topotrain.network.floor import link_floor_s
from topotrain.network.flow_join import AloneTrace, alone_state_rerun, record_alone
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
        #: per phase (by id; the entry holds the phase): the distinct links its transfers cross
        self.links_of: dict[int, tuple[Phase, np.ndarray]] = {}
        #: per pair signature: the distinct links its transfers cross
        self.links_by_pairs: dict[bytes, np.ndarray] = {}
        self._all_links: np.ndarray | None = None

    def phase_links(self, phase: Phase) -> np.ndarray:
        """The distinct directed links that ``phase``'s transfers cross (sorted), once per phase, and found once
        per pair signature (the paths follow from the pairs: the phases of a ring, and the phases a schedule
        submitted again builds anew, share them)."""
        hit = self.links_of.get(id(phase))
        if hit is None:
            pairs = self._pairs_key(phase)
            links = self.links_by_pairs.get(pairs)
            if links is None:
                if len(self.links_by_pairs) >= 64:
                    self.links_by_pairs.clear()
                links = self.links_by_pairs[pairs] = np.unique(self.resolve(phase)[1].links)
            if len(self.links_of) >= 4096:
                self.links_of.clear()
            hit = self.links_of[id(phase)] = (phase, links)
        return hit[1]

    def _pairs_key(self, phase: Phase) -> bytes:
        """``phase``'s pair signature (its sources', then its destinations' bytes); phases of one pattern share
        their src/dst arrays, so it is made once per pair of arrays (the entry holds the arrays, so no other
        array can take their ids while it is kept)."""
        known = self.pair_keys.get((id(phase.src), id(phase.dst)))
        if known is None:
            if len(self.pair_keys) >= 4096:
                self.pair_keys.clear()
            known = self.pair_keys[(id(phase.src), id(phase.dst))] = (
                phase.src, phase.dst, phase.src.tobytes() + b"|" + phase.dst.tobytes())
        return known[2]

    def all_links(self) -> np.ndarray:
        """The distinct directed links that any phase of the schedule crosses (sorted), once per schedule."""
        if self._all_links is None:
            seen: dict[bytes, np.ndarray] = {}
            for phase in self.schedule.phases:
                pairs = self._pairs_key(phase)
                if pairs not in seen:
                    seen[pairs] = self.resolve(phase)[1].links
            parts = list(seen.values())
            self._all_links = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        return self._all_links

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
        pairs = self._pairs_key(phase)
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
    link_bytes = pp.link_bytes(topo.num_links)
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

    def __init__(self, params: NetworkParams | None = None, provisional: bool = True, holds: bool = True) -> None:
        self.params = params if params is not None else NetworkParams()
        #: schedules submitted onto idle links run as timed alone until something else needs their links
        #: (:class:`FlowSim`); False: every schedule runs phase by phase in the network (the same answers)
        self.provisional = provisional
        #: with ``provisional``, a compute task's blocking collectives may hold their links for the whole task
        #: (:meth:`FlowSim.hold`); False: each is submitted as a provisional schedule (the same answers)
        self.holds = holds

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

    def floor_s(self, schedule: Schedule, topo: Topology | None = None) -> float:
        """A lower bound of :meth:`time_alone` of ``schedule`` (:func:`~topotrain.network.base.overhead_floor_s`;
        on ``topo``, also :func:`~topotrain.network.floor.link_floor_s`)."""
        floor = overhead_floor_s(schedule, self.params)
        return floor if topo is None else max(floor, link_floor_s(schedule, topo, self.params))

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
    #: the links the phase now in the network crosses (counted in :attr:`FlowSim._busy` until it completes)
    busy_links: np.ndarray | None = None
    #: a materialized phase's earliest end: the completion of its transfers that had sent their last byte
    #: before it joined the network (:meth:`FlowSim._materialize`)
    floor_s: float = -np.inf


@dataclass(eq=False)
class _Hold:
    """Links a compute task's blocking collectives hold while the engine times the task alone
    (:meth:`FlowSim.hold`)."""

    links: np.ndarray
    on_release: Callable[[float], None]


@dataclass(eq=False)
class _Provisional:
    """A schedule submitted onto links that nothing else used: it runs as timed alone until another transfer
    needs one of its links (then :meth:`FlowSim._materialize` puts its state at that instant in the network)."""

    tag: object
    schedule: Schedule
    paths: _PairPaths
    start_s: float
    result: CollectiveResult
    links: np.ndarray
    key: str
    #: False once its links are given back (its last transfer has sent its last byte)
    holds: bool = True


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

    def hold(self, parts: Sequence[tuple[Schedule, str]], until_s: float,
             on_release: Callable[[float], None]) -> bool:
        return False  # (see FlowSim.hold)

    def submit_started(self, schedule: Schedule, at_s: float, tag: object, key: str) -> None:
        raise AssertionError("no hold is ever granted here")

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
        # provisional schedules (:class:`_Provisional`): timed alone while their links are theirs alone
        self._provisional_on = model.provisional and self._fabric is None
        #: whether :meth:`hold` may grant anything (the engine skips walking its tasks otherwise)
        self.grants_holds = self._provisional_on and model.holds
        self._busy = np.zeros(topo.num_links, dtype=np.int64)  # phases in the network crossing each link
        self._held = np.full(topo.num_links, -1, dtype=np.int64)  # the provisional job holding each link
        self._provisional: dict[int, _Provisional] = {}
        self._holds: dict[int, _Hold] = {}  # held tasks (:meth:`hold`), by id (shared with the jobs' ids)
        self._hold_links: dict[tuple[str, ...], np.ndarray] = {}  # the union of a held task's links, per keys
        self._prov_heap: list[tuple[float, int]] = []  # (end, job) of provisional jobs; stale entries skipped
        self._prov_bytes = np.zeros(topo.num_links)  # bytes of provisional jobs up to their materializing
        self._prov_tally = LinkBytesTally(topo.num_links)  # bytes of provisional jobs that ended so
        self._phase_ends: dict[int, tuple[CollectiveResult, np.ndarray]] = {}  # per result: its phases' ends
        self._overhead_s = model.params.message_overhead_s
        self._arbitration = model.params.arbitration
        #: provisional jobs that joined the network (a statistic)
        self.materialized = 0
        #: a joining phase's state read from its alone run recorded once (:mod:`topotrain.network.flow_join`);
        #: False: the phase re-run alone at each join (the same answers)
        self.join_traces = True
        self._traces: dict[bytes, AloneTrace | None] = {}  # per (paths, sizes): the phase's alone trace
        self._trace_values = 0  # (flow, record) values the traces hold
        # per (paths, phase) joining: the phase's paths and sizes as the join needs them (:meth:`_join_phase`)
        self._join_phases: dict[tuple[int, int], tuple[_PairPaths, Phase, np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray, bytes]] = {}
        # (horizon, answer) of the last next_event_s with a horizon, until anything changes (submit, hold,
        # submit_started, advance): advance to at most that horizon starts from that answer (:meth:`advance`)
        self._last_next: tuple[float, float] | None = None
        #: a job's next phases that start the same batch on the same links may start inside the network's
        #: compiled departure loop (:mod:`topotrain.network.flow_chain`); False: each from here (the same answers)
        self.chain_phases = True
        self.net.on_chain = functools.partial(FlowSim._chained, self._jobs)

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        self._last_next = None
        check_submit(at_s, self.net.now_s)
        if alone:
            self._alone.submit(schedule, at_s, tag, key)
            return
        extra = None
        if self._fabric is not None:
            schedule, extra = self._on_fabric(schedule, key)
        paths = self._pair_paths(schedule, key)
        jid = self._take_id()
        if self._provisional_on and key is not None and self._try_provisional(jid, schedule, paths, at_s, tag, key):
            return
        job = _BarrierJob(tag, schedule, paths, at_s, np.zeros(len(schedule.phases)), extra_s=extra)
        self._jobs[jid] = job
        if not self._launch(jid, at_s):
            self._complete(jid, at_s)
            heapq.heappush(self._ready, (at_s, jid, tag))

    def _pair_paths(self, schedule: Schedule, key: str | None) -> _PairPaths:
        paths = self._paths.get(key) if key is not None else None
        if paths is None:
            paths = _PairPaths(self.topo, schedule)
            if key is not None:
                self._paths[key] = paths
        return paths

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

    def _launch(self, jid: int, t: float, ran_on: np.ndarray | None = None) -> bool:
        """Start job ``jid``'s next phase that crosses links at ``t`` (phases of local copies end at once);
        False when no phase is left. ``ran_on``: the links of the job's phase that ended just now, still counted
        busy. When the phase starts on that very array (a ring's next step: the same pairs), they stay busy and
        nothing is checked: while a link is busy no hold or provisional schedule takes it (:meth:`hold`,
        :meth:`_try_provisional`; a held task's collective given up goes on on links of its hold, which a phase's
        start frees), so none holds one of them, and nothing reads the counts in between."""
        job = self._jobs[jid]
        phases = job.schedule.phases
        while job.phase < len(phases):
            batch, sizes, sendable = job.paths.launch(phases[job.phase], self.net)
            if batch is not None:
                if self._provisional_on:
                    links = job.busy_links = job.paths.phase_links(phases[job.phase])
                    if links is not ran_on:
                        if ran_on is not None:
                            self._busy[ran_on] -= 1
                        if self._holds:
                            self._free_holds(links, t)
                        if self._provisional and int(self._held[links].max()) >= 0:
                            self._release_held(links, t)
                        self._busy[links] += 1
                if sendable:  # every size positive and finite
                    self.net.start_prepared(batch, sizes, t, job=jid, checked=True)
                    if self.chain_phases and job.extra_s is None and self.net.can_chain and not self.net.chained(jid):
                        self._chain(jid, job, batch)
                else:  # empty messages complete at once: the general path
                    off, links, sizes = _without_local(job.paths.resolve(phases[job.phase])[1])
                    self.net.start_many(off, links, sizes, t, job=jid)
                return True
            job.phase_end_s[job.phase] = t
            job.phase += 1
        if ran_on is not None:
            self._busy[ran_on] -= 1
        return False

    def _chain(self, jid: int, job: _BarrierJob, batch: PreparedBatch) -> None:
        """Chain the job's next phases that start ``batch`` again on the links the running one crosses
        (:meth:`FlowNetwork.chain`; :mod:`topotrain.network.flow_chain`): the same pair signature (sources,
        destinations), so the batch prepared already and the same links. Starting them changes nothing outside
        the network: a running phase's links stay busy (:meth:`_launch`), so no hold or provisional schedule is on
        them; no floor (only a joining phase has one) and no store-and-forward term delays them. Each start is
        replayed here from the network's log (:meth:`_chained`)."""
        phases = job.schedule.phases
        pairs = job.paths._pairs_key(phases[job.phase])
        links = job.busy_links
        sizes: list[np.ndarray] = []
        k = job.phase + 1
        while k < len(phases) and job.paths._pairs_key(phases[k]) == pairs:  # (else another batch: not prepared)
            nb, nsizes, ok = job.paths.launch(phases[k], self.net)
            if nb is not batch or not ok or (links is not None and job.paths.phase_links(phases[k]) is not links):
                break
            sizes.append(nsizes)
            k += 1
        if sizes:
            self.net.chain(jid, batch, sizes)

    @staticmethod
    def _chained(jobs: dict[int, _BarrierJob], times: list[float], jids: list[int]) -> None:
        """The network started these jobs' chained phases at these times (:meth:`_chain`): each phase before
        ended then. (Given the jobs, not the simulator: the network holds it, and holding the simulator would
        make a reference cycle.)"""
        for t, jid in zip(times, jids, strict=True):
            job = jobs[jid]
            job.phase_end_s[job.phase] = t
            job.phase += 1

    def _complete(self, jid: int, t: float) -> None:
        job = self._jobs.pop(jid)
        self._timings[job.tag] = JobTiming(job.start_s, t, job.phase_end_s)

    # ---- provisional schedules ------------------------------------------------------------------
    def link_bytes(self) -> np.ndarray:
        return super().link_bytes() + self._prov_bytes + self._prov_tally.total()

    def _try_provisional(self, jid: int, schedule: Schedule, paths: _PairPaths, at_s: float, tag: object,
                         key: str) -> bool:
        """Run the schedule as timed alone if none of its links carries a phase now or is held by another
        provisional schedule (that one then joins the network first, and this one does too)."""
        links = paths.all_links()
        if links.size == 0:
            return False
        if self._holds:
            self._free_holds(links, at_s)
        if self._provisional and int(self._held[links].max()) >= 0:
            self._release_held(links, at_s)
            return False
        if int(self._busy[links].max()) > 0:
            return False
        res = self._alone.result(schedule, key)
        if not res.time_s > 0.0:
            return False
        self._provisional[jid] = _Provisional(tag, schedule, paths, at_s, res, links, key)
        self._held[links] = jid
        heapq.heappush(self._prov_heap, (at_s + res.time_s, jid))
        return True

    def hold(self, parts: Sequence[tuple[Schedule, str]], until_s: float,
             on_release: Callable[[float], None]) -> bool:
        """Hold the links of a compute task's blocking collectives (``parts``: each merged schedule and its key)
        until ``until_s``, when the last of them ends as timed alone: the engine then runs the whole task as
        timed alone in one event instead of submitting each collective (:mod:`topotrain.training.engine`).
        Granted only when none of the links carries a phase or is held now (False: submit them one by one).
        When a transfer needs one of the links before ``until_s``, the hold is given up at that instant and
        ``on_release(t)`` called: the engine puts the task in the state it has reached — the collective in
        progress, if any, as a provisional schedule started when it started (:meth:`submit_started`). Exact for
        the same reason as a provisional schedule: until then nothing else crossed those links."""
        self._last_next = None
        if not self._provisional_on:
            return False
        keys = tuple(k for _, k in parts)
        links = self._hold_links.get(keys)
        if links is None:
            arrays = [self._pair_paths(schedule, k).all_links() for schedule, k in parts]
            links = (np.unique(np.concatenate(arrays)) if arrays and all(a.size for a in arrays)
                     else np.zeros(0, dtype=np.int64))
            self._hold_links[keys] = links
        if links.size == 0:
            return False
        if (self._provisional or self._holds) and int(self._held[links].max()) >= 0:
            return False
        if int(self._busy[links].max()) > 0:
            return False
        hid = self._take_id()
        self._holds[hid] = _Hold(links, on_release)
        self._held[links] = hid
        heapq.heappush(self._prov_heap, (until_s, hid))
        return True

    def submit_started(self, schedule: Schedule, at_s: float, tag: object, key: str) -> None:
        """A provisional schedule that started at ``at_s`` (at or before now) on links a hold gave up just now
        (from ``on_release``): it goes on as timed alone from ``at_s``, as if submitted then."""
        self._last_next = None
        paths = self._pair_paths(schedule, key)
        res = self._alone.result(schedule, key)
        jid = self._take_id()
        links = paths.all_links()
        self._provisional[jid] = _Provisional(tag, schedule, paths, at_s, res, links, key)
        self._held[links] = jid
        heapq.heappush(self._prov_heap, (at_s + res.time_s, jid))

    def _free_holds(self, links: np.ndarray, t: float) -> None:
        """Every hold on one of ``links`` is given up at ``t`` (its task told, in id order)."""
        held = self._held[links]
        for hid in np.unique(held[held >= 0]).tolist():
            h = self._holds.pop(int(hid), None)
            if h is not None:
                self._held[h.links] = -1
                h.on_release(t)

    def _release_held(self, links: np.ndarray, t: float) -> None:
        """Every provisional schedule holding one of ``links`` joins the network at ``t``."""
        held = self._held[links]
        for jid in np.unique(held[held >= 0]).tolist():
            self._materialize(int(jid), t)

    def _materialize(self, jid: int, t: float) -> None:
        """Provisional job ``jid`` joins the network at ``t``, in the state it has reached alone: the phases
        before the present one are done (their ends as timed alone); the present phase's state alone at ``t``
        (:meth:`_alone_state`: read from its alone run, recorded once) gives the bytes each transfer has left and
        the completions of those that have sent their last byte; the transfers with bytes left start in the
        network with them.
        Exact: until ``t`` nothing else crossed its links, so it ran at its alone rates."""
        p = self._provisional.pop(jid)
        self.materialized += 1
        self._held[p.links] = -1
        ends = p.start_s + np.cumsum(p.result.phase_times_s)
        phases = p.schedule.phases
        k = int(np.searchsorted(ends, t, side="right"))
        while k < len(phases) and p.paths.resolve(phases[k])[1].links.size == 0:
            k += 1  # local copies only: such a phase ends where it starts
        if k >= len(phases):  # its transfers have all sent their last bytes: it ends as timed alone
            self._prov_tally.add(p.result.link_bytes, p.key)
            self._provisional[jid] = p
            p.holds = False
            return
        job = _BarrierJob(p.tag, p.schedule, p.paths, p.start_s, np.zeros(len(phases)))
        job.phase_end_s[:k] = ends[:k]
        job.phase = k
        self._jobs[jid] = job
        for i in range(k):
            pp = p.paths.resolve(phases[i])[1]
            self._prov_bytes += pp.link_bytes(self.topo.num_links)
        phase_start = float(ends[k - 1]) if k else p.start_s
        if t <= phase_start:  # the phase starts now
            if not self._launch(jid, t):
                self._complete(jid, t)
                heapq.heappush(self._ready, (t, jid, p.tag))
            return
        off, links, sizes, lengths, key = self._join_phase(p.paths, phases[k])
        ids, left, floor = self._alone_state(off, links, sizes, t - phase_start, key)
        sent = sizes.copy()
        sent[ids] -= left
        self._prov_bytes += np.bincount(links, weights=np.repeat(sent, lengths), minlength=self.topo.num_links)
        if ids.size == 0:  # every transfer of the phase has sent its last byte
            end = max(phase_start + floor, t)
            job.phase_end_s[k] = end
            job.phase += 1
            heapq.heappush(self._delayed, (end, self._delayed_seq, jid))
            self._delayed_seq += 1
            return
        sub_len = lengths[ids]
        sub_off = np.zeros(ids.shape[0] + 1, dtype=np.int64)
        np.cumsum(sub_len, out=sub_off[1:])
        sel = np.repeat(off[:-1][ids] - sub_off[:-1], sub_len) + np.arange(int(sub_off[-1]))
        job.busy_links = p.paths.phase_links(phases[k])
        self._busy[job.busy_links] += 1
        job.floor_s = phase_start + floor
        self.net.start_many(sub_off, links[sel], left, t, job=jid)

    def _join_phase(self, paths: _PairPaths, phase: Phase) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                                     bytes]:
        """(CSR offsets, links, sizes and path lengths of ``phase``'s transfers that cross links, and the key of
        its alone trace: the three arrays' bytes), once per (schedule's paths, phase) (the entry holds both, so
        that no other object takes their ids while it is kept)."""
        hit = self._join_phases.get((id(paths), id(phase)))
        if hit is None:
            off, links, sizes = _without_local(paths.resolve(phase)[1])
            if len(self._join_phases) >= 4096:
                self._join_phases.clear()
            hit = self._join_phases[(id(paths), id(phase))] = (
                paths, phase, off, links, sizes, np.diff(off),
                off.tobytes() + b"|" + links.tobytes() + b"|" + sizes.tobytes())
        return hit[2], hit[3], hit[4], hit[5], hit[6]

    def _alone_state(self, off: np.ndarray, links: np.ndarray, sizes: np.ndarray, tau_s: float,
                     key: bytes) -> tuple[np.ndarray, np.ndarray, float]:
        """:func:`~topotrain.network.flow_join.alone_state_rerun` of a phase (its transfers that cross links: CSR
        paths ``off``/``links``, ``sizes``; ``key`` the three arrays' bytes) at ``tau_s`` after its start, read
        from its :class:`AloneTrace`, recorded once per (paths, sizes) (the same answer, bit for bit); re-run where
        the trace would be too large."""
        if key in self._traces:
            trace = self._traces[key]
        else:
            trace = record_alone(self.topo, self._overhead_s, self._arbitration, off, links, sizes) \
                if self.join_traces else None
            held = 0 if trace is None else trace.num_values
            if len(self._traces) >= 1024 or self._trace_values + held > 1 << 20:  # at most ~25 MB of traces
                self._traces.clear()
                self._trace_values = 0
            self._traces[key] = trace
            self._trace_values += held
        if trace is not None:
            return trace.at(tau_s)
        return alone_state_rerun(self.topo, self._overhead_s, self._arbitration, off, links, sizes, tau_s)

    def _end_provisional(self, to_s: float, out: list[tuple[float, object]]) -> None:
        """The provisional jobs that end by ``to_s`` (as timed alone)."""
        heap = self._prov_heap
        while heap and heap[0][0] <= to_s:
            t_end, jid = heapq.heappop(heap)
            p = self._provisional.pop(jid, None)
            if p is None:
                h = self._holds.pop(jid, None)
                if h is not None:  # a held task's last collective ended (the engine times the task)
                    self._held[h.links] = -1
                continue  # (or it joined the network)
            if p.holds:
                self._held[p.links] = -1  # (a link is held by one provisional job at a time)
                self._prov_tally.add(p.result.link_bytes, p.key)
            hit = self._phase_ends.get(id(p.result))
            if hit is None:
                hit = self._phase_ends[id(p.result)] = (p.result, np.cumsum(p.result.phase_times_s))
            self._timings[p.tag] = JobTiming(p.start_s, t_end, p.start_s + hit[1])
            out.append((t_end, p.tag))

    def next_event_s(self, horizon_s: float | None = None, by_s: float | None = None) -> float:
        """(``by_s``: :meth:`advance`'s loop, which only asks whether anything happens by ``by_s``, its
        horizon too: when nothing outside the network does and the network can defer its rate computation past
        it (:meth:`FlowNetwork.defer_rates`), ``inf``: the engine's next call makes it, with the departures after
        it, in one compiled call.)"""
        t = self._alone.next_event_s()
        heap = self._prov_heap
        while heap and heap[0][1] not in self._provisional and heap[0][1] not in self._holds:
            heapq.heappop(heap)  # it joined the network (or the hold was given up)
        if heap:
            t = min(t, heap[0][0])
        if self._ready:
            t = min(t, self._ready[0][0])
        if self._delayed:
            t = min(t, self._delayed[0][0])
        if not self.net.num_pending:  # nothing in the network (every collective provisional or alone)
            return t
        if by_s is not None and t > by_s and self.net.defer_rates(by_s):
            return np.inf
        t = min(t, self.net.next_event_s(None if horizon_s is None else min(horizon_s, t)))
        if horizon_s is not None and by_s is None:
            self._last_next = (horizon_s, t)
        return t

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        last, self._last_next = self._last_next, None
        if not (self._ready or self._delayed or self.net.num_pending):
            # only alone and provisional completions: the loop below in one pass (by time; at one instant the
            # alone ones first, as there)
            alone = self._alone.pop_until(to_s)
            prov: list[tuple[float, object]] = []
            self._end_provisional(to_s, prov)
            if not alone or not prov:
                return alone or prov
            return [e for _, _, e in sorted([(t, 0, (t, g)) for t, g in alone] + [(t, 1, (t, g)) for t, g in prov],
                                            key=lambda x: (x[0], x[1]))]
        out: list[tuple[float, object]] = []
        net = self.net
        # the engine asked next_event_s with a horizon at or past to_s just now, nothing changed since: the network
        # stepped as far as this call would (its limit, the horizon or a job end, only lower now), so this call
        # would answer the same
        first = last[1] if last is not None and last[0] >= to_s else None
        while (t := first if first is not None else self.next_event_s(to_s, to_s)) <= to_s:
            first = None
            for t_done, jid in (net.advance_jobs(t) if net.num_pending else ()):
                job = self._jobs[jid]
                ran_on = job.busy_links
                job.busy_links = None
                if ran_on is not None and (job.floor_s > t_done or job.extra_s is not None):
                    self._busy[ran_on] -= 1  # (the next phase starts later)
                    ran_on = None
                if job.floor_s > t_done:  # a materialized phase: its earlier transfers complete later
                    job.phase_end_s[job.phase] = job.floor_s
                    job.phase += 1
                    heapq.heappush(self._delayed, (job.floor_s, self._delayed_seq, jid))
                    self._delayed_seq += 1
                    job.floor_s = -np.inf
                    continue
                job.floor_s = -np.inf
                if job.extra_s is not None:  # a store-and-forward fabric: the next phase waits this one's term
                    t_next = t_done + max(float(job.extra_s[job.phase]), 0.0)  # never a launch in the past
                    job.phase_end_s[job.phase] = t_next
                    job.phase += 1
                    heapq.heappush(self._delayed, (t_next, self._delayed_seq, jid))
                    self._delayed_seq += 1
                    continue
                job.phase_end_s[job.phase] = t_done
                job.phase += 1
                if not self._launch(jid, t_done, ran_on):
                    self._complete(jid, t_done)
                    out.append((t_done, job.tag))
            while self._delayed and self._delayed[0][0] <= t:
                t_d, _, jid = heapq.heappop(self._delayed)
                job = self._jobs[jid]
                if not self._launch(jid, t_d):
                    self._complete(jid, t_d)
                    out.append((t_d, job.tag))
            if self._alone.next_event_s() <= t:
                out.extend(self._alone.pop_until(t))
            if self._prov_heap:
                self._end_provisional(t, out)
            while self._ready and self._ready[0][0] <= t:
                t_r, _, tag = heapq.heappop(self._ready)
                out.append((t_r, tag))
        if self.net.num_pending:
            self.net.advance_jobs(to_s)
        return out
