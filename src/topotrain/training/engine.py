"""Discrete-event executor of a per-iteration task graph: streams, dependencies, overlap, contention.

The engine owns time. Each :class:`Task` runs on a *stream* (a CUDA-stream-like FIFO: a stream runs its
tasks one at a time, in the order they were added) once all its dependencies have finished. A compute
task lasts ``duration_s``. A communication task carries a :class:`CommSpec`: one or more collective
schedules that run *concurrently* (e.g. the data-parallel allreduces of all tensor-parallel ranks of a
pipeline stage).

Communication is timed by the chosen network model:

* ``analytical``: each schedule's alpha-beta time, no contention between tasks.
* ``flow``: every active collective advances phase by phase in one shared
  :class:`~topotrain.network.flow.FlowNetwork`, so overlapping collectives really share links (max-min).
  A CommSpec marked ``isolated`` (its links are used by no other communication class of the graph, e.g.
  tensor-parallel allreduces on a private NVSwitch) is timed once in isolation and memoized — exact,
  since nothing can contend with it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from topotrain.collectives.schedule import Schedule, merge_schedules
from topotrain.network.base import PathCache
from topotrain.topology.graph import Topology


@dataclass(frozen=True, eq=False)
class CommSpec:
    """Collectives that one communication task runs concurrently."""

    key: str
    schedules: tuple[Schedule, ...]
    isolated: bool = False


@dataclass(eq=False)
class Task:
    id: int
    name: str
    category: str
    stream: str
    deps: tuple[int, ...] = ()
    duration_s: float = 0.0
    comm: CommSpec | None = None
    stage: int = 0
    start_s: float = float("nan")
    end_s: float = float("nan")


@dataclass
class TaskGraph:
    """Tasks in program order; ``add`` returns the new task's id."""

    tasks: list[Task] = field(default_factory=list)

    def add(self, name: str, category: str, stream: str, deps: tuple[int, ...] | list[int] = (),
            duration_s: float = 0.0, comm: CommSpec | None = None, stage: int = 0) -> int:
        tid = len(self.tasks)
        self.tasks.append(Task(tid, name, category, stream, tuple(d for d in deps if d >= 0),
                               max(0.0, duration_s), comm, stage))
        return tid

    def __len__(self) -> int:
        return len(self.tasks)


@dataclass
class _Instance:
    """One schedule of a running communication task, in the flow network."""

    task: int
    schedule: Schedule
    paths: PathCache
    phase: int = 0
    pending: int = 0


class Engine:
    """Run a TaskGraph on a topology; fills each task's ``start_s`` / ``end_s``; returns the makespan."""

    def __init__(self, topo: Topology, network: str = "flow") -> None:
        from topotrain.network.registry import get_model

        self.topo = topo
        self.network = network
        self.model = get_model(network)
        self._memo: dict[str, tuple[float, np.ndarray]] = {}
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

    def comm_time_isolated(self, spec: CommSpec) -> float:
        """Time of ``spec``'s schedules running together, with nothing else on the network (memoized).

        The concurrent schedules are timed as one merged schedule, so their traffic shares the links
        (in both models: the analytical one sums their bytes per link)."""
        hit = self._memo.get(spec.key)
        if hit is None:
            if spec.schedules:
                res = self.model.time_schedule(self.merged(spec), self.topo)
                hit = (res.time_s, res.link_bytes)
            else:
                hit = (0.0, np.zeros(self.topo.num_links))
            self._memo[spec.key] = hit
        return hit[0]

    def _account(self, spec: CommSpec) -> float:
        t = self.comm_time_isolated(spec)
        self.link_bytes += self._memo[spec.key][1]
        return t

    def run(self, graph: TaskGraph) -> float:
        from topotrain.network.flow import FlowNetwork

        tasks = graph.tasks
        n = len(tasks)
        remaining = np.array([len(task.deps) for task in tasks], dtype=np.int64)
        children: list[list[int]] = [[] for _ in range(n)]
        for task in tasks:
            for d in task.deps:
                children[d].append(task.id)
        streams: dict[str, deque[int]] = {}
        for task in tasks:
            streams.setdefault(task.stream, deque()).append(task.id)
        busy: dict[str, bool] = dict.fromkeys(streams, False)
        events: list[tuple[float, int, int]] = []  # (time, seq, task id): completions of timed tasks
        counter = [0]
        net = FlowNetwork(self.topo)
        self.link_bytes = np.zeros(self.topo.num_links)
        instances: dict[int, _Instance] = {}
        open_instances: dict[int, int] = {}
        paths: dict[str, PathCache] = {}
        done = [0]

        ids = itertools.count()

        def push(t_end: float, tid: int) -> None:
            heapq.heappush(events, (t_end, counter[0], tid))
            counter[0] += 1

        def start_phase(inst_id: int, t_now: float) -> bool:
            inst = instances[inst_id]
            sched = inst.schedule
            while inst.phase < len(sched.phases):
                pp = inst.paths.resolve(sched, sched.phases[inst.phase])
                keep = np.diff(pp.offsets) > 0  # transfers to oneself cost nothing
                started = int(keep.sum())
                if started:
                    if started < pp.num_transfers:
                        lengths = np.diff(pp.offsets)[keep]
                        offsets = np.zeros(started + 1, dtype=np.int64)
                        np.cumsum(lengths, out=offsets[1:])
                        sel = np.repeat(keep, np.diff(pp.offsets))
                        net.start_many(offsets, pp.links[sel], pp.bytes[keep], t_now, [inst_id] * started)
                    else:
                        net.start_many(pp.offsets, pp.links, pp.bytes, t_now, [inst_id] * started)
                    inst.pending = started
                    return True
                inst.phase += 1
            return False

        def try_start(stream: str, t_now: float) -> None:
            q = streams[stream]
            if busy[stream] or not q or remaining[q[0]] > 0:
                return
            tid = q.popleft()
            busy[stream] = True
            task = tasks[tid]
            task.start_s = t_now
            spec = task.comm
            if spec is None or not spec.schedules:
                push(t_now + task.duration_s, tid)
            elif spec.isolated or self.network == "analytical":
                push(t_now + self._account(spec), tid)
            else:
                merged = self.merged(spec)
                pc = paths.get(spec.key)
                if pc is None:
                    pc = PathCache(self.topo, merged.ranks)
                    paths[spec.key] = pc
                iid = next(ids)
                instances[iid] = _Instance(tid, merged, pc)
                if start_phase(iid, t_now):
                    open_instances[tid] = 1
                else:
                    del instances[iid]
                    push(t_now, tid)

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
            for s in sorted(touched):
                try_start(s, t_now)

        for s in list(streams):
            try_start(s, 0.0)
        while done[0] < n:
            t_evt = events[0][0] if events else float("inf")
            t_net = net.next_event_s()
            if t_evt == float("inf") and t_net == float("inf"):
                stuck = [tasks[q[0]].name for q in streams.values() if q][:3]
                raise RuntimeError(f"task graph deadlocked (cycle or missing dependency) at {stuck}")
            t_next = min(t_evt, t_net)
            for t_done, tag in net.advance(t_next):
                inst_id = int(tag)  # type: ignore[call-overload]
                inst = instances[inst_id]
                inst.pending -= 1
                if inst.pending:
                    continue
                inst.phase += 1
                if start_phase(inst_id, t_done):
                    continue
                tid = inst.task
                del instances[inst_id]
                open_instances[tid] -= 1
                if open_instances[tid] == 0:
                    del open_instances[tid]
                    finish(tid, t_done)
            while events and events[0][0] <= t_next:
                t_end, _, tid = heapq.heappop(events)
                finish(tid, t_end)
        self.link_bytes += net.link_bytes()
        return max((task.end_s for task in tasks), default=0.0)
