"""Discrete-event executor of a per-iteration task graph: streams, dependencies, overlap, contention.

The engine is the one loop that owns time. Each :class:`Task` runs on a *stream* (a CUDA-stream-like FIFO:
a stream runs its tasks one at a time, in the order they were added) once all its dependencies have
finished. A compute task lasts ``duration_s`` plus its *blocking collectives* (:class:`Blocking`: the
tensor-, sequence- and expert-parallel collectives that Megatron-LM runs inside a layer's forward or
backward, on the compute stream). A communication task carries a :class:`CommSpec`: one or more collective
schedules that run concurrently (e.g. the data-parallel allreduces of all tensor-parallel ranks of a
pipeline stage).

Every collective — a communication task or a blocking one — is submitted to the scenario's network model
through the one :class:`~topotrain.network.base.NetworkSim` interface, at the time it starts; the engine
advances that simulator and its own event queue together. Blocking collectives whose links no other
stream's collectives use (found by :func:`isolated_keys` from the routed paths, e.g. tensor-parallel
allreduces on a server's private NVSwitch) are timed ``alone``: nothing can contend with them, so the
simulator times them once per key — exact, and why thousands of identical blocking collectives cost one
simulation and one event per compute task.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from topotrain.collectives.paths import path_cache
from topotrain.collectives.protocol import moving_pairs
from topotrain.collectives.schedule import Schedule, merge_schedules
from topotrain.network.base import NetworkModel, NetworkSim
from topotrain.network.registry import get_model
from topotrain.topology.graph import Topology
from topotrain.util import progress
from topotrain.util.gc_pause import collector_paused


@dataclass(frozen=True, eq=False)
class CommSpec:
    """Collectives that one communication step runs concurrently. ``isolated``: ``None`` lets the engine
    decide from the links (:func:`isolated_keys`); ``True``/``False`` force it."""

    key: str
    schedules: tuple[Schedule, ...]
    isolated: bool | None = None


@dataclass(frozen=True, eq=False)
class Blocking:
    """A blocking collective inside a compute task, after ``offset_s`` of the task's compute seconds.

    ``overlap = (gemm_a_s, gemm_b_s, chunks)``: the collective is split into a reduce-scatter and an
    all-gather, each pipelined with a GEMM in ``chunks`` pieces (Megatron-Core ``--tp-comm-overlap``), so it
    exposes only :func:`overlapped_exposure` of its time (timed alone).

    ``beside_s`` > 0: the next ``beside_s`` seconds of the task's compute run *beside* the collective (an
    asynchronous send/recv posted before the compute that does not need it, as ring attention posts the next
    K,V exchange before the current block's attention), so the task goes on after ``max(beside_s, comm)``:
    it exposes ``max(0, comm − beside_s)``. Such a collective is timed in the network like a plain blocking
    one (it contends); the next blocking collective of the task must come ``beside_s`` or more later."""

    comm: CommSpec
    label: str
    offset_s: float = 0.0
    overlap: tuple[float, float, int] | None = None
    beside_s: float = 0.0


def overlapped_exposure(comm_s: float, overlap: tuple[float, float, int]) -> float:
    """Exposed seconds of a collective of ``comm_s`` split into a reduce-scatter overlapped with a GEMM of
    ``gemm_a_s`` and an all-gather overlapped with a GEMM of ``gemm_b_s``, each in ``chunks`` pieces:
    ``sum over halves of max(h / chunks, h - t_gemm)`` with ``h = comm_s / 2`` — a half is hidden by what
    its GEMM lasts, and never by more than all but its first chunk (Wang et al., ASPLOS 2023)."""
    gemm_a_s, gemm_b_s, chunks = overlap
    half = comm_s / 2.0
    return sum(max(half / chunks, half - t) for t in (gemm_a_s, gemm_b_s))


@dataclass(eq=False, slots=True)
class Task:
    id: int
    name: str
    category: str
    stream: str
    deps: tuple[int, ...] = ()
    duration_s: float = 0.0
    comm: CommSpec | None = None
    stage: int = 0
    blocking: tuple[Blocking, ...] = ()
    start_s: float = float("nan")
    end_s: float = float("nan")
    #: seconds of the task spent in its blocking collectives (exposed part), filled by the engine
    blocking_s: float = 0.0
    #: (label, start, end) of blocking collectives timed through the network, filled by the engine
    slices: list[tuple[str, float, float]] = field(default_factory=list)
    #: (label, start, end) relative to ``start_s`` of blocking collectives timed alone (shared, read-only)
    rel_slices: tuple[tuple[str, float, float], ...] = ()

    def blocking_slices(self) -> list[tuple[str, float, float]]:
        """(label, start, end) of every blocking collective of the task, in seconds (for traces)."""
        t0 = self.start_s
        return [(label, t0 + a, t0 + b) for label, a, b in self.rel_slices] + self.slices


@dataclass
class TaskGraph:
    """Tasks in program order; ``add`` returns the new task's id."""

    tasks: list[Task] = field(default_factory=list)

    def add(self, name: str, category: str, stream: str, deps: tuple[int, ...] | list[int] = (),
            duration_s: float = 0.0, comm: CommSpec | None = None, stage: int = 0,
            blocking: tuple[Blocking, ...] = ()) -> int:
        tid = len(self.tasks)
        self.tasks.append(Task(tid, name, category, stream, tuple([d for d in deps if d >= 0]),
                               duration_s if duration_s > 0.0 else 0.0, comm, stage, blocking))
        return tid

    def __len__(self) -> int:
        return len(self.tasks)


def spec_links(spec: CommSpec, topo: Topology, merged: Schedule | None = None) -> np.ndarray:
    """Directed links that ``spec``'s transfers cross (on their routed paths), sorted, each once.
    ``merged``: ``spec``'s schedules merged (:func:`merge_schedules`), when the caller has it already."""
    if merged is None:
        merged = merge_schedules(spec.schedules)
    src, dst = moving_pairs(merged)
    return np.unique(path_cache(topo, merged.ranks).links_of(src, dst))


def isolated_keys(graph: TaskGraph, topo: Topology,
                  merged: Callable[[CommSpec], Schedule] | None = None) -> set[str]:
    """Keys of the blocking collectives whose links no collective of another stream crosses. A stream runs
    one task at a time, so such a collective never shares a link with anything while it runs: timing it
    alone is exact. Communication tasks (data-parallel, pipeline) always run in the network, unless their
    spec forces ``isolated=True``; a spec with ``isolated=False`` is never alone. ``merged``: the caller's
    (cached) merge of a spec's schedules."""
    specs: dict[str, CommSpec] = {}
    streams_of: dict[str, set[str]] = {}
    blocking: set[str] = set()
    for t in graph.tasks:  # each spec once (the first seen), the streams that use it, the blocking ones
        comms = [b.comm for b in t.blocking]
        first_blocking = 0
        if t.comm is not None:
            comms.insert(0, t.comm)
            first_blocking = 1
        for i, spec in enumerate(comms):
            if spec.schedules:
                seen = streams_of.get(spec.key)
                if seen is None:
                    specs[spec.key] = spec
                    streams_of[spec.key] = {t.stream}
                else:
                    seen.add(t.stream)
                if i >= first_blocking:
                    blocking.add(spec.key)
    links = {k: spec_links(s, topo, merged(s) if merged is not None else None) for k, s in specs.items()}
    by_stream: dict[str, list[np.ndarray]] = {}
    for k, lk in links.items():
        for st in streams_of[k]:
            by_stream.setdefault(st, []).append(lk)
    use = np.zeros(topo.num_links, dtype=np.int64)  # streams crossing each link
    for lks in by_stream.values():
        use[np.unique(np.concatenate(lks))] += 1
    out = {k for k, s in specs.items() if s.isolated}
    for k in blocking:
        lk = links[k]
        if specs[k].isolated is None and len(streams_of[k]) == 1 and (not lk.size or int(use[lk].max()) <= 1):
            out.add(k)
    return out


class Engine:
    """Run a TaskGraph with one network model on a topology; fills each task's ``start_s`` / ``end_s``
    (and ``blocking_s`` / ``slices``); :meth:`run` returns the makespan."""

    def __init__(self, topo: Topology, network: NetworkModel | str = "flow") -> None:
        if isinstance(network, str):
            network = get_model(network)
        self.topo = topo
        self.model = network
        self._merged: dict[str, Schedule] = {}
        #: bytes carried by every directed link over the last run (for per-link utilization)
        self.link_bytes = np.zeros(topo.num_links)

    def merged(self, spec: CommSpec) -> Schedule:
        """``spec``'s concurrent schedules as one (phase k of all of them together), cached per key."""
        m = self._merged.get(spec.key)
        if m is None:
            m = merge_schedules(spec.schedules)
            self._merged[spec.key] = m
        return m

    @collector_paused()
    def run(self, graph: TaskGraph) -> float:
        tasks = graph.tasks
        n = len(tasks)
        remaining = [len(task.deps) for task in tasks]
        children: list[list[int]] = [[] for _ in range(n)]
        for task in tasks:
            for d in task.deps:
                children[d].append(task.id)
        streams: dict[str, deque[int]] = {}
        for task in tasks:
            streams.setdefault(task.stream, deque()).append(task.id)
        busy: dict[str, bool] = dict.fromkeys(streams, False)
        events: list[tuple[float, int, int, int]] = []  # (time, seq, task id, segment): -1 = finish
        counter = [0]
        sim: NetworkSim = self.model.open(self.topo)
        alone = isolated_keys(graph, self.topo, self.merged) if self.model.contends else None
        uses: dict[str, int] = {}  # blocking collectives timed by their alone result, per key
        used_specs: dict[str, CommSpec] = {}
        # exposures of blocking tuples that need no network events, by id (the tuple is kept alive with it):
        # the builder shares one tuple among all micro-batches of a chunk
        fixed_memo: dict[int, tuple[tuple[Blocking, ...], tuple[tuple[str, float, float], ...], float, list[str]]] = {}
        memo_count: dict[int, int] = {}
        done = [0]
        # held tasks (``sim.hold``): their steps as timed alone, applied when the task ends or its hold is given up
        held: dict[int, list[_Step]] = {}
        plans: dict[tuple[int, float], tuple[tuple[Blocking, ...], _HoldPlan | None]] = {}  # (the tuple kept alive)
        can_hold = bool(getattr(sim, "grants_holds", False))

        def is_alone(spec: CommSpec) -> bool:
            return alone is None or spec.key in alone

        def push(t: float, tid: int, seg: int = -1) -> None:
            heapq.heappush(events, (t, counter[0], tid, seg))
            counter[0] += 1

        def needs_network(b: Blocking) -> bool:
            """A blocking collective that must run in the network (may contend); overlapped ones are
            charged their exposure of the alone time (the overlap model needs the time before the engine
            can know it under contention)."""
            return bool(b.comm.schedules) and b.overlap is None and not is_alone(b.comm)

        def exposure_s(b: Blocking) -> float:
            """Exposed seconds of a blocking collective that needs no network events (from its alone time)."""
            if not b.comm.schedules:
                return 0.0
            used_specs.setdefault(b.comm.key, b.comm)
            c = sim.alone(self.merged(b.comm), b.comm.key).time_s
            if b.beside_s > 0.0:
                c = max(0.0, c - b.beside_s)
            return c if b.overlap is None else overlapped_exposure(c, b.overlap)

        def run_blocking(tid: int, seg: int, t: float) -> None:
            """Task ``tid`` is at its blocking collective ``seg`` at time ``t`` (its compute before it done):
            time the fixed ones at once, stop at the first that needs the network. That one is submitted now
            if it starts now; one that starts later, after fixed ones, waits for its time as an event (the
            network may have events before it: nothing is submitted past the time the engine is at)."""
            task = tasks[tid]
            t_now = t
            while seg < len(task.blocking):
                b = task.blocking[seg]
                if needs_network(b):
                    if t > t_now:
                        push(t, tid, seg)
                    else:
                        sim.submit(self.merged(b.comm), t, (tid, seg), b.comm.key, False)
                    return
                c = exposure_s(b)
                if b.comm.schedules:
                    uses[b.comm.key] = uses.get(b.comm.key, 0) + 1
                task.slices.append((b.label, t, t + c))
                task.blocking_s += c
                t += c
                seg += 1
                if seg < len(task.blocking):
                    gap = _offset(task, seg) - _offset(task, seg - 1)
                    if gap > 0:
                        push(t + gap, tid, seg)
                        return
            push(t + (task.duration_s - _offset(task, len(task.blocking) - 1)), tid)

        def resume_after(tid: int, seg: int, t_done: float) -> None:
            """Task ``tid``'s network-timed collective ``seg`` with compute beside it, submitted at its start,
            finished at ``t_done``: it exposes ``max(0, comm − beside_s)``, and the task's compute (whose
            offsets count the seconds beside it) goes on as after any exposure — never before ``t_done``."""
            task = tasks[tid]
            b = task.blocking[seg]
            start = sim.timing((tid, seg)).start_s
            task.slices.append((b.label, start, t_done))
            exposed = max(0.0, t_done - start - b.beside_s)
            task.blocking_s += exposed
            t_on = start + exposed
            nxt = seg + 1
            if nxt < len(task.blocking):
                at = t_on + (_offset(task, nxt) - _offset(task, seg))
                if at > t_done:
                    push(at, tid, nxt)
                else:
                    run_blocking(tid, nxt, t_done)
            else:
                push(max(t_done, t_on + (task.duration_s - _offset(task, seg))), tid)

        def hold_plan(task: Task) -> _HoldPlan | None:
            """What a held task's walk needs of its blocking collectives, the same for every task that shares the
            tuple and the duration (the builder shares one tuple among a chunk's micro-batches); None if a network
            collective is not timed above zero (the network then times it: a provisional schedule would not take it)."""
            key = (id(task.blocking), task.duration_s)
            hit = plans.get(key)
            if hit is None:
                blk = task.blocking
                segs: list[tuple[bool, float, float, str, str | None, float]] = []
                parts: list[tuple[Schedule, str]] = []
                for seg, b in enumerate(blk):
                    gap = _offset(task, seg + 1) - _offset(task, seg) if seg + 1 < len(blk) else 0.0
                    if needs_network(b):
                        merged = self.merged(b.comm)
                        res = sim.alone(merged, b.comm.key)
                        if not res.time_s > 0.0:
                            plans[key] = (blk, None)
                            return None
                        used_specs.setdefault(b.comm.key, b.comm)
                        parts.append((merged, b.comm.key))
                        segs.append((True, res.time_s, b.beside_s, b.label, b.comm.key, gap))
                    else:
                        segs.append((False, exposure_s(b), 0.0, b.label, b.comm.key if b.comm.schedules else None,
                                     gap))
                last = len(blk) - 1
                hit = plans[key] = (blk, (_offset(task, 0), segs, parts,
                                          task.duration_s - _offset(task, last)))
            return hit[1]

        def walk(task: Task, plan: _HoldPlan, t0: float) -> tuple[list[_Step], float]:
            """Task ``task`` started at ``t0`` as :func:`run_blocking`, :func:`net_done` and :func:`resume_after`
            would run it if each network collective took its alone time (the same float operations in the same
            order): its steps and when its last network collective ends."""
            first, segs, _, rest = plan
            nb = len(segs)
            steps: list[_Step] = []
            last = t0
            seg = 0
            t = t0
            if first > 0:
                t = t0 + first
                steps.append((_CALL, t, 0, None))
            while True:  # one run_blocking call at t, from seg
                t_now = t
                while seg < nb and not segs[seg][0]:
                    _, c, _, label, key, gap = segs[seg]
                    steps.append((_FIXED, t, seg, (label, t, t + c, c, key)))
                    t += c
                    seg += 1
                    if seg < nb and gap > 0:
                        t = t + gap
                        steps.append((_CALL, t, seg, None))
                        t_now = t
                if seg >= nb:
                    steps.append((_FINISH, t + rest, -1, None))
                    return steps, last
                if t > t_now:
                    steps.append((_CALL, t, seg, None))
                _, time_s, beside_s, label, key, gap = segs[seg]
                at = t
                t_done = last = at + time_s
                nxt = seg + 1
                if beside_s > 0.0:
                    exposed = max(0.0, t_done - at - beside_s)
                    steps.append((_NET, t_done, seg, (label, at, t_done, exposed, key)))
                    t_on = at + exposed
                    if nxt >= nb:
                        # (rest = duration − offset of the last segment, which is this one)
                        steps.append((_FINISH, max(t_done, t_on + rest), -1, None))
                        return steps, last
                    at2 = t_on + gap
                    t = t_done
                    if at2 > t_done:
                        t = at2
                        steps.append((_CALL, t, nxt, None))
                else:
                    steps.append((_NET, t_done, seg, (label, at, t_done, t_done - at, key)))
                    if nxt >= nb:
                        steps.append((_FINISH, t_done + rest, -1, None))
                        return steps, last
                    t = t_done
                    if gap > 0:
                        t = t_done + gap
                        steps.append((_CALL, t, nxt, None))
                seg = nxt

        def apply(task: Task, step: _Step) -> None:
            """A fixed or network step's effect on its task (a slice, its exposed seconds, the key's use)."""
            label, s0, s1, c, key = step[3]  # type: ignore[misc]
            task.slices.append((label, s0, s1))
            task.blocking_s += c
            if key is not None:
                uses[key] = uses.get(key, 0) + 1

        def release(tid: int, r: float) -> None:
            """Task ``tid``'s hold is given up at ``r``: the steps done by then take effect; the collective in
            progress (started at or before ``r``, ending at or after it) goes on provisionally from its start;
            the next call or the finish waits as an event, as in the step-by-step path."""
            task = tasks[tid]
            for step in held.pop(tid):
                kind, t, seg, payload = step
                if kind == _CALL:
                    if t > r:
                        push(t, tid, seg)
                        return
                elif kind == _NET:
                    if r <= t:
                        b = task.blocking[seg]
                        sim.submit_started(self.merged(b.comm), payload[1], (tid, seg), b.comm.key)  # type: ignore[index]
                        return
                    apply(task, step)
                elif kind == _FIXED:
                    apply(task, step)
                else:
                    push(t, tid)
                    return

        def try_hold(tid: int, t_now: float) -> bool:
            """Run task ``tid`` as timed alone in one event if the network grants its collectives' links."""
            task = tasks[tid]
            plan = hold_plan(task)
            if plan is None or not plan[2]:
                return False
            steps, last = walk(task, plan, t_now)
            if not sim.hold(plan[2], last, lambda r: release(tid, r)):
                return False
            held[tid] = steps
            push(steps[-1][1], tid, _HELD_FINISH)
            return True

        def start_compute(tid: int, t_now: float) -> None:
            task = tasks[tid]
            if not task.blocking:
                push(t_now + task.duration_s, tid)
                return
            hit = fixed_memo.get(id(task.blocking))
            if hit is None and not any(needs_network(b) for b in task.blocking):
                total = 0.0
                rel: list[tuple[str, float, float]] = []
                for b in task.blocking:
                    c = exposure_s(b)
                    s0 = min(b.offset_s, task.duration_s) + total
                    rel.append((b.label, s0, s0 + c))
                    total += c
                keys = [b.comm.key for b in task.blocking if b.comm.schedules]  # uses: memo_count × these
                hit = fixed_memo[id(task.blocking)] = (task.blocking, tuple(rel), total, keys)
                memo_count[id(task.blocking)] = 0
            if hit is not None:  # the common case: one event for the whole task
                memo_count[id(task.blocking)] += 1
                task.rel_slices = hit[1]
                task.blocking_s = hit[2]
                push(t_now + (task.duration_s + hit[2]), tid)
                return
            if can_hold and try_hold(tid, t_now):
                return
            first = _offset(task, 0)
            if first > 0:
                push(t_now + first, tid, 0)
            else:
                run_blocking(tid, 0, t_now)

        def try_start(stream: str, t_now: float) -> None:
            q = streams[stream]
            if busy[stream] or not q or remaining[q[0]] > 0:
                return
            tid = q.popleft()
            busy[stream] = True
            task = tasks[tid]
            task.start_s = t_now
            spec = task.comm
            if spec is None:
                start_compute(tid, t_now)
            elif not spec.schedules:
                push(t_now, tid)
            else:
                sim.submit(self.merged(spec), t_now, tid, spec.key, is_alone(spec))

        def finish(tid: int, t_now: float) -> None:
            task = tasks[tid]
            task.end_s = t_now
            done[0] += 1
            busy[task.stream] = False
            touched = {task.stream}
            for c in children[tid]:
                remaining[c] -= 1
                if remaining[c] == 0:
                    touched.add(tasks[c].stream)
            for s in (touched if len(touched) == 1 else sorted(touched)):
                try_start(s, t_now)

        def net_done(t_done: float, tag: object) -> None:
            if isinstance(tag, tuple):  # a blocking collective of a compute task
                tid, seg = tag
                if tasks[tid].blocking[seg].beside_s > 0.0:
                    resume_after(tid, seg, t_done)
                    return
                task = tasks[tid]
                start = sim.timing(tag).start_s
                c = t_done - start
                task.slices.append((task.blocking[seg].label, start, t_done))
                task.blocking_s += c
                nxt = seg + 1
                if nxt < len(task.blocking):
                    gap = _offset(task, nxt) - _offset(task, seg)
                    if gap > 0:
                        push(t_done + gap, tid, nxt)
                    else:
                        run_blocking(tid, nxt, t_done)
                else:
                    push(t_done + (task.duration_s - _offset(task, seg)), tid)
                return
            finish(int(tag), t_done)  # type: ignore[call-overload]

        for s in list(streams):
            try_start(s, 0.0)
        shown = progress.active()  # counted only where a display shows it (util/progress.py)
        with progress.task("simulating the iteration: tasks done", total=n) as prog:
            while done[0] < n:
                t_evt = events[0][0] if events else float("inf")
                t_net = sim.next_event_s(t_evt)  # nothing is submitted before the engine's own next event
                if t_evt == float("inf") and t_net == float("inf"):
                    stuck = [tasks[q[0]].name for q in streams.values() if q][:3]
                    raise RuntimeError(f"task graph deadlocked (cycle or missing dependency) at {stuck}")
                t_next = min(t_evt, t_net)
                if shown:
                    prog.update(done[0])
                for t_done, tag in sim.advance(t_next):
                    net_done(t_done, tag)
                while events and events[0][0] <= t_next:
                    t_end, _, tid, seg = heapq.heappop(events)
                    if seg == _HELD_FINISH:
                        steps = held.pop(tid, None)
                        if steps is None:
                            continue  # its hold was given up: the task goes on step by step
                        for step in steps:
                            if step[0] == _FIXED or step[0] == _NET:
                                apply(tasks[tid], step)
                        finish(tid, t_end)
                    elif seg < 0:
                        finish(tid, t_end)
                    else:
                        run_blocking(tid, seg, t_end)
        self.link_bytes = sim.link_bytes()
        for i, count in memo_count.items():
            for key in fixed_memo[i][3]:
                uses[key] = uses.get(key, 0) + count
        for key, k in uses.items():
            self.link_bytes += sim.alone(self.merged(used_specs[key]), key).link_bytes * k
        return max((task.end_s for task in tasks), default=0.0)


#: a held task's step (:meth:`Engine.run`'s ``walk``): (kind, time, segment, payload). ``_CALL``: a run of its
#: blocking collectives from ``segment`` at ``time``; ``_FIXED``: a collective timed by its exposure, at its call's
#: time; ``_NET``: a network collective, at its end; ``_FINISH``: the task's end. Payload (fixed, network):
#: (label, slice start, slice end, exposed seconds, key or None)
_Step = tuple[int, float, int, tuple[str, float, float, float, str | None] | None]
_CALL, _FIXED, _NET, _FINISH = 0, 1, 2, 3
#: a held task's blocking collectives (``hold_plan``): (compute before the first, per segment (in the network,
#: seconds alone or exposed, seconds beside, label, key or None, compute to the next), the network ones'
#: (merged schedule, key), compute after the last)
_HoldPlan = tuple[float, list[tuple[bool, float, float, str, "str | None", float]], list[tuple[Schedule, str]], float]
_HELD_FINISH = -2  # the event segment of a held task's end


def _offset(task: Task, seg: int) -> float:
    """Compute seconds of ``task`` before its blocking collective ``seg`` (clamped to the task's compute)."""
    if seg < 0:
        return 0.0
    return min(max(task.blocking[seg].offset_s, 0.0), task.duration_s)
