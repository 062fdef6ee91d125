"""The one interface every network model implements, and the helpers built on it.

A *network model* (analytical, flow, flow-async, flow-eager) is a value: its name and its typed
:class:`~topotrain.network.params.NetworkParams`. ``model.open(topo)`` gives a :class:`NetworkSim`, the
event-driven simulator the training engine drives — the engine is the only loop that owns time:

* ``submit(schedule, at_s, tag, key, alone)`` — a collective schedule starts at ``at_s``;
* ``next_event_s(horizon_s)`` — when the next thing happens inside the network (``inf``: nothing pending);
  ``horizon_s`` is the caller's promise to submit nothing before it, so a simulator may step through its
  internal events (a flow model's rate changes) up to the next completion or the horizon, whichever is first,
  and the caller wakes up once per completion (``None``: no promise, every internal event is returned);
* ``advance(to_s)`` — progress to ``to_s`` and return ``(completion time, tag)`` of the schedules done.

``alone=True`` is a promise by the caller that nothing else in the network shares this schedule's links
while it runs; the simulator may then time it by itself, once per ``key`` (:meth:`NetworkSim.alone`), which
is exact. :func:`run_alone` (behind every model's ``time_schedule``) runs one schedule alone through the
interface; :func:`run_concurrent` runs several that contend.

A network model never knows what a layer is; a collective never knows which network model times it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from topotrain.collectives.schedule import Phase, Schedule
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


@dataclass(frozen=True, eq=False)
class CollectiveResult:
    """Time of one collective and where its bytes went."""

    model: str
    time_s: float
    phase_times_s: np.ndarray
    link_bytes: np.ndarray  # bytes carried by each directed link, indexed by link id

    def link_utilization(self, topo: Topology) -> np.ndarray:
        """Mean utilization of each directed link over the collective: bytes / (capacity · time)."""
        if self.time_s <= 0:
            return np.zeros_like(self.link_bytes, dtype=np.float64)
        return self.link_bytes / (topo.capacity_bytes_per_s * self.time_s)

    def busiest_link(self, topo: Topology) -> tuple[str, str, float]:
        """(src, dst, utilization) of the directed link with the highest mean utilization."""
        if topo.num_links == 0:
            return ("", "", 0.0)
        util = self.link_utilization(topo)
        i = int(np.argmax(util))
        lk = topo.links[i]
        return (lk.src, lk.dst, float(util[i]))


@dataclass(frozen=True, eq=False)
class JobTiming:
    """When one submitted schedule started and finished (and when each of its phases did)."""

    start_s: float
    finish_s: float
    phase_finish_s: np.ndarray

    @property
    def time_s(self) -> float:
        return self.finish_s - self.start_s


class NetworkSim(Protocol):
    """An event-driven network simulator over one topology (see the module docstring)."""

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None: ...

    def next_event_s(self, horizon_s: float | None = None) -> float: ...

    def advance(self, to_s: float) -> list[tuple[float, object]]: ...

    def alone(self, schedule: Schedule, key: str | None = None) -> CollectiveResult:
        """The schedule's result with nothing else on the network, memoized by ``key``."""
        ...

    def timing(self, tag: object) -> JobTiming:
        """Start, finish and phase finishes of a completed submission."""
        ...

    def link_bytes(self) -> np.ndarray:
        """Bytes every directed link has carried so far, over all submissions."""
        ...

    def hold(self, parts: Sequence[tuple[Schedule, str]], until_s: float,
             on_release: Callable[[float], None]) -> bool:
        """Hold the links of a compute task's blocking collectives until ``until_s`` so that the engine can
        time the task alone in one event; ``on_release(t)`` when a transfer needs them earlier. False: not
        granted (the engine submits the collectives one by one). Only the flow model grants it
        (:meth:`topotrain.network.flow.FlowSim.hold`)."""
        ...

    def submit_started(self, schedule: Schedule, at_s: float, tag: object, key: str) -> None:
        """From ``on_release``: the held task's collective in progress, started at ``at_s``, goes on."""
        ...


class NetworkModel(Protocol):
    """A network model: a name, typed parameters, and the simulator it opens on a topology."""

    name: str
    params: NetworkParams
    #: whether concurrent submissions share links (False: each is timed by itself, as ``analytical``)
    contends: bool

    def open(self, topo: Topology) -> NetworkSim: ...

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult: ...


def run_alone(model: NetworkModel, schedule: Schedule, topo: Topology) -> CollectiveResult:
    """Time one schedule alone through ``model``'s simulator (what ``model.time_schedule`` returns)."""
    return model.open(topo).alone(schedule)


def run_sim(sim: NetworkSim) -> list[tuple[float, object]]:
    """Advance ``sim`` until nothing is pending; all completions in time order."""
    out: list[tuple[float, object]] = []
    while (t := sim.next_event_s(math.inf)) < np.inf:
        out.extend(sim.advance(t))
    return out


def run_concurrent(jobs: Sequence[tuple[Schedule, float]], topo: Topology, model: NetworkModel) -> list[JobTiming]:
    """Run several schedules, each ``(schedule, start_s)``, at once on one network ``model`` (the caller
    chooses it: the interface names no implementation), so that they contend for links; returns one
    :class:`JobTiming` per job, in the order given."""
    starts = [float(s) for _, s in jobs]
    for i, s in enumerate(starts):
        if not np.isfinite(s) or s < 0:
            raise ConfigError(f"jobs[{i}]", f"start time {s} s", "give a finite start time >= 0")
    sim = model.open(topo)
    order = sorted(range(len(jobs)), key=lambda j: (starts[j], j))
    for j in order:  # submit in time order, advancing the network between starts
        t = sim.next_event_s(starts[j])
        while t <= starts[j]:
            sim.advance(t)
            t = sim.next_event_s(starts[j])
        sim.submit(jobs[j][0], starts[j], j)
    run_sim(sim)
    return [sim.timing(j) for j in range(len(jobs))]


#: Whole numbers up to this add exactly in float64 (2**53), in any order.
_EXACT_WHOLE = float(2**53)


class LinkBytesTally:
    """The sum of per-link byte arrays added one after another, equal bit for bit to ``total += array`` in
    that order, without an array addition per submission.

    Arrays of whole, non-negative bytes (every model's per-link bytes are sums of whole transfer sizes) are
    counted per key instead: whole numbers add exactly in float64 while the sums stay below 2**53, so the
    per-key products summed in any order are the same floats. The first array that is not whole (or has no
    key) ends the counting — the exact sum so far is taken and the rest are added one by one — and a total
    past 2**53 is summed again in the order of the additions."""

    def __init__(self, num_links: int) -> None:
        self._sum = np.zeros(num_links)
        self._counts: dict[Hashable, int] | None = {}  # None: adding one by one
        # each key's array, kept sparse (its nonzero links and their bytes): a phase touches a fraction of a large
        # fabric's links. Adding only the nonzero entries gives the same floats (x + 0.0 is x; the sums start at
        # +0.0, so no entry is ever -0.0)
        self._arrays: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}
        self._order: list[Hashable] = []

    def add(self, array: np.ndarray | None, key: Hashable | None) -> None:
        """Add ``array`` (the same array every time for one ``key``; None: the one added before with ``key``)."""
        counts = self._counts
        if counts is not None and key is not None:
            n = counts.get(key)
            if n is not None:
                counts[key] = n + 1
                self._order.append(key)
                return
            if array is not None and bool(np.all((array >= 0) & (array == np.floor(array)))):
                counts[key] = 1
                self._keep(array, key)
                self._order.append(key)
                return
        if counts is not None:
            self._sum = self.total()
            self._counts = None
        if array is None:
            idx, vals = self._arrays[key]
            self._sum[idx] += vals
            return
        self._sum += array
        if key is not None and key not in self._arrays:
            self._keep(array, key)

    def _keep(self, array: np.ndarray, key: Hashable) -> None:
        idx = np.flatnonzero(array)
        self._arrays[key] = (idx, array[idx])

    def total(self) -> np.ndarray:
        """The sum of every array added so far (a new array)."""
        if self._counts is None:
            return self._sum.copy()
        out = np.zeros_like(self._sum)
        for key, n in self._counts.items():
            idx, vals = self._arrays[key]
            out[idx] += vals * n
        if out.size and float(out.max()) > _EXACT_WHOLE:
            out = np.zeros_like(self._sum)
            for key in self._order:
                idx, vals = self._arrays[key]
                out[idx] += vals
        return out


class AloneJobs:
    """Submissions a simulator times by themselves (``alone=True``): a heap of their completions and the
    per-key memo of their results. Shared by every :class:`NetworkSim` implementation."""

    def __init__(self, time_alone: Callable[[Schedule], CollectiveResult], num_links: int) -> None:
        self._time_alone = time_alone
        self._memo: dict[str, CollectiveResult] = {}
        self._heap: list[tuple[float, int, object]] = []
        self._seq = 0
        self._started: dict[object, tuple[float, CollectiveResult]] = {}
        self._link_bytes = LinkBytesTally(num_links)

    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes every directed link has carried over all submissions (a new array)."""
        return self._link_bytes.total()

    def result(self, schedule: Schedule, key: str | None) -> CollectiveResult:
        if key is None:
            return self._time_alone(schedule)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._time_alone(schedule)
        return hit

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None) -> None:
        res = self.result(schedule, key)
        self._link_bytes.add(res.link_bytes, key)
        self._started[tag] = (at_s, res)
        heapq.heappush(self._heap, (at_s + res.time_s, self._seq, tag))
        self._seq += 1

    def has(self, tag: object) -> bool:
        return tag in self._started

    def timing(self, tag: object) -> JobTiming:
        at_s, res = self._started[tag]
        return JobTiming(at_s, at_s + res.time_s, at_s + np.cumsum(res.phase_times_s))

    def next_event_s(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def pop_until(self, to_s: float) -> list[tuple[float, object]]:
        out = []
        while self._heap and self._heap[0][0] <= to_s:
            t, _, tag = heapq.heappop(self._heap)
            out.append((t, tag))
        return out


def check_submit(at_s: float, now_s: float) -> None:
    if not at_s >= now_s or at_s == math.inf:
        raise ConfigError("at_s", f"submit at {at_s} s but the network is already at {now_s} s",
                          "submit in time order, at or after the last advance")


def time_phases(name: str, schedule: Schedule, topo: Topology,
                time_phase: Callable[[Phase], tuple[float, np.ndarray]],
                phase_extra_s: Callable[[int], float] | None = None) -> CollectiveResult:
    """Time a schedule phase after phase (each phase a barrier), calling ``time_phase`` once per distinct
    traffic signature (:func:`~topotrain.collectives.schedule.phase_key`) — exact when a phase runs alone — and
    summing times and per-link
    bytes. ``time_phase`` returns (phase seconds, bytes per directed link). ``phase_extra_s(k)``, when given,
    is added to the time of phase ``k`` (once per signature too: it must be a function of the phase's traffic,
    as a packet fabric's store-and-forward term, :func:`~topotrain.network.switching.store_forward_phase_s`)."""
    memo: dict[tuple[int, Hashable], tuple[float, int]] = {}  # the bytes are the tally's (kept sparse)
    signatures = _PhaseSignatures()
    times = np.zeros(len(schedule.phases))
    link_bytes = LinkBytesTally(topo.num_links)  # the phases' sum in order, one product per signature
    for k, phase in enumerate(schedule.phases):
        key = signatures.of(schedule, phase)
        hit = memo.get(key)
        if hit is None:
            t, lb = time_phase(phase)
            if phase_extra_s is not None:
                t = t + phase_extra_s(k)
            hit = memo[key] = (t, len(memo))
            link_bytes.add(lb, hit[1])
        else:
            link_bytes.add(None, hit[1])
        times[k] = hit[0]
    return CollectiveResult(name, float(times.sum()), times, link_bytes.total())


class _PhaseSignatures:
    """:func:`~topotrain.collectives.schedule.phase_key`'s equality, cheaper: a phase's (src, dst) arrays are told
    apart once per pair of array
    objects (a ring's phases share theirs), and sizes that are all equal are signed by their count and value
    instead of every byte. Two phases get equal signatures exactly when their ``phase_key`` are equal."""

    def __init__(self) -> None:
        self._by_arrays: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}  # holds the arrays
        self._by_bytes: dict[bytes, int] = {}

    def of(self, schedule: Schedule, phase: Phase) -> tuple[int, Hashable]:
        known = self._by_arrays.get((id(phase.src), id(phase.dst)))
        if known is None:
            pairs = phase.src.tobytes() + b"|" + phase.dst.tobytes()
            pid = self._by_bytes.setdefault(pairs, len(self._by_bytes))
            known = self._by_arrays[(id(phase.src), id(phase.dst))] = (phase.src, phase.dst, pid)
        sizes = schedule.transfer_bytes(phase)
        if sizes.size and sizes.min() == sizes.max():
            return known[2], (sizes.size, sizes.dtype.str, sizes[0].item())
        return known[2], sizes.tobytes()


def overhead_floor_s(schedule: Schedule, params: NetworkParams) -> float:
    """A lower bound of the time a barrier model (``analytical``, ``flow``) gives ``schedule`` alone: every phase
    with a transfer between two ranks ends no earlier than that transfer's per-message overhead (alpha), so the
    schedule takes at least alpha per such phase (times 0.999, a margin for the summation's rounding). 0 on a
    packet fabric, whose framing rewrites the phases. Costs a step per phase, not per transfer: phases that share
    their (src, dst) arrays (a ring's) are looked at once. Lets ``auto`` skip timing an algorithm that cannot win
    (a ring of 65,536 ranks has 131,070 phases, each with its own sizes)."""
    if not params.fabric.is_cut_through or params.message_overhead_s <= 0:
        return 0.0
    seen: dict[tuple[int, int], bool] = {}
    moving = 0
    for phase in schedule.phases:
        key = (id(phase.src), id(phase.dst))
        hit = seen.get(key)
        if hit is None:
            hit = seen[key] = bool((phase.src != phase.dst).any())
        moving += hit
    return 0.999 * params.message_overhead_s * moving


def fastest(model: NetworkModel, topo: Topology, builds: Sequence[Callable[[], Schedule]],
            floor_s: Callable[[Schedule, Topology], float] | None = None) -> Schedule | None:
    """The schedule that ``model`` times fastest alone among those ``builds`` make (the first of equal times; a
    build or a timing that raises :class:`ConfigError` is passed over), or None when none can run. With
    ``floor_s`` (a lower bound of a schedule's time on ``topo``), candidates are timed in the order of their floors
    and one whose floor is above the best time so far is not timed: the answer is the same, since it could not
    win."""
    cands: list[tuple[float, int, Schedule]] = []
    for i, build in enumerate(builds):
        try:
            s = build()
        except ConfigError:
            continue
        cands.append((floor_s(s, topo) if floor_s is not None else 0.0, i, s))
    best: tuple[float, int, Schedule] | None = None
    for lb, i, s in sorted(cands, key=lambda c: (c[0], c[1])):
        if best is not None and (lb > best[0] or (lb == best[0] and i > best[1])):
            continue
        try:
            t = model.time_schedule(s, topo).time_s  # refuses a pair with no route
        except ConfigError:
            continue
        if best is None or t < best[0] or (t == best[0] and i < best[1]):
            best = (t, i, s)
    return None if best is None else best[2]
