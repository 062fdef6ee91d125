"""Replay a recorded step (:class:`~topotrain.traces.model.TraceJob`) through topotrain's engine, on the
trace's own host cluster or another one, with every collective timed by the network model.

The task graph is dPRO's replay graph (Hu et al., MLSys 2022): each rank's main thread is a stream of its
recorded operators (measured duration plus the host gap before each, as Lumos replays host time; Liang et
al., MLSys 2025), an operator that launches a collective is cut at the launch, each collective is one
communication task of its group (a ring allreduce schedule from :mod:`topotrain.collectives`, on the
group's stream, after the launch on every member), and an operator that waits for a collective depends on
it. The engine (:class:`~topotrain.training.engine.Engine`) runs the graph; the replayed step is the latest
rank's end, counted from the earliest rank's start (each rank starts at its recorded offset).

``compute_scale`` multiplies every operator and host gap (a what-if on a slower or faster host, or on more
processes sharing the cores with gloo's collectives: :func:`topotrain.traces.whatif.demand_share_scale`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from topotrain.collectives.protocol import CommLibrary, on_the_wire
from topotrain.collectives.registry import algorithms_for, build_schedule, get_algorithm
from topotrain.collectives.schedule import Schedule
from topotrain.network.base import NetworkModel, fastest
from topotrain.network.registry import get_model
from topotrain.topology.graph import Topology
from topotrain.traces.cluster import HostCluster, rank_name
from topotrain.traces.model import TraceJob
from topotrain.training.engine import CommSpec, Engine, Task, TaskGraph
from topotrain.util.errors import ConfigError

#: Collective algorithm per op that gloo runs for CPU tensors (gloo's ring allreduce, its default for
#: ``allreduce``; pytorch ``ProcessGroupGloo.cpp``).
GLOO_ALGORITHMS = {"allreduce": "ring", "allgather": "ring", "reduce-scatter": "ring", "broadcast": "ring",
                   "reduce": "ring", "all-to-all": "direct"}


#: Threads gloo runs each process group's collectives on (``ProcessGroupGloo``'s default of 2 workers):
#: the collectives of a group take turns on this many streams, so two can run at once, as they do there.
BACKEND_LANES = 2


@dataclass(frozen=True)
class Placement:
    """Where a replay runs: a topology, the node of each rank (rank r on ``ranks[r]``), the network model
    that times the collectives and the per-message overhead that sizes their chunks; the algorithm of each
    collective op (``auto``: the fastest the network model finds for the group and size, as ``simulate``
    chooses), the communication library that puts them on the wire (None: the payload as it is, as gloo over
    loopback) and the streams a group's collectives take turns on. The recording host gives one
    (:func:`host_placement`); any topotrain cluster gives another (:func:`cluster_placement`)."""

    name: str
    topology: Topology
    ranks: tuple[str, ...]
    model: NetworkModel
    message_overhead_s: float
    algorithms: Mapping[str, str] = field(default_factory=lambda: dict(GLOO_ALGORITHMS))
    library: CommLibrary | None = None
    lanes: int = BACKEND_LANES
    #: the GPU type the ranks run on ("" on the recording host)
    gpu: str = ""
    #: each collective runs as the recording's backend ran it (:attr:`TraceCollective.ran_as`: gloo's CPU
    #: reduce-scatter is an allreduce) — on the recording host; elsewhere its library runs the op itself
    as_recorded: bool = False


def cluster_placement(name: str, topology: Topology, model: NetworkModel, message_overhead_s: float,
                      library: CommLibrary | None, algorithm: str = "auto", gpu: str = "") -> Placement:
    """A topotrain cluster as a replay's placement: rank r on its r-th GPU, every collective op by
    ``algorithm`` where it does the op (else the fastest, ``auto``), put on the wire by ``library``, and a
    group's collectives one after another on one stream (NCCL runs a communicator's collectives in order on
    its stream)."""
    return Placement(name, topology, tuple(topology.gpus), model, message_overhead_s,
                     {op: algorithm for op in GLOO_ALGORITHMS}, library, 1, gpu)


def host_placement(cluster: HostCluster, world_size: int) -> Placement:
    """The recording host's star of ``world_size`` ranks, timed by its network model."""
    return Placement(cluster.name, cluster.topology(world_size), tuple(rank_name(r) for r in range(world_size)),
                     get_model(cluster.network, cluster.params()), cluster.message_overhead_s, as_recorded=True)


@dataclass(frozen=True)
class StreamTimes:
    """Where one rank's step went: its operators, its host gaps, its waits for collectives (the rest of its
    span) and the network time of the collectives it is part of (overlapped or not; measured: each
    collective's span while all its ranks were in it)."""

    rank: int
    step_s: float
    op_s: float
    host_gap_s: float
    wait_s: float
    comm_s: float


@dataclass(frozen=True)
class Replay:
    """A replayed step beside the measured one."""

    job: str
    cluster: str
    step_s: float
    measured_step_s: float
    replayed: tuple[StreamTimes, ...]
    measured: tuple[StreamTimes, ...]
    #: seconds of the replayed critical path by task category (compute: operators and host gaps; comm;
    #: offset: a rank's recorded start after the earliest)
    critical: tuple[tuple[str, float], ...] = ()
    #: the same graph with every collective lasting its measured network time (no network model): the
    #: step it gives, and its critical path — what the recorded timeline's dependencies alone reproduce
    measured_comm_step_s: float = float("nan")
    measured_comm_critical: tuple[tuple[str, float], ...] = ()
    #: the replayed graph's tasks (timed), the rank whose end is the step's, and the busiest links
    #: (src, dst, utilization over the step)
    tasks: tuple[Task, ...] = field(default=(), compare=False, repr=False)
    last_rank: int = 0
    busiest_links: tuple[tuple[str, str, float], ...] = ()

    @property
    def error(self) -> float:
        """Relative error of the replayed step against the measured one."""
        return self.step_s / self.measured_step_s - 1.0 if self.measured_step_s > 0 else float("nan")


def build_graph(job: TraceJob, place: Placement, compute_scale: float = 1.0,
                measured_comm: bool = False) -> tuple[TaskGraph, list[list[int]], list[int]]:
    """The replay task graph of ``job`` on ``place`` (see the module's docstring): the graph, each rank's
    task ids, and each collective's task id. ``measured_comm``: every collective lasts its measured network
    time instead of being timed by the network model (dPRO's replay of the recorded timeline)."""
    if len(place.ranks) < job.world_size:
        raise ConfigError("cluster", f"{place.name} has {len(place.ranks)} GPUs and the job {job.world_size} ranks",
                          "give a cluster with as many GPUs as the job has ranks (or fewer ranks: --world)")
    graph = TaskGraph()
    comm_ids = []
    wake_ids: dict[int, int] = {}
    memo: dict[tuple[object, ...], Schedule] = {}
    for i, c in enumerate(job.collectives):
        ran = c.ran_as if place.as_recorded else c.op
        algo = place.algorithms.get(ran)
        if algo is None:
            raise ConfigError(f"workload.collectives[{i}].{'backend_op' if ran != c.op else 'op'}",
                              f"{ran!r} cannot be replayed", f"replayable ops: {', '.join(GLOO_ALGORITHMS)}")
        bad = [r for r in c.ranks if not 0 <= r < job.world_size]
        if bad:
            raise ConfigError(f"workload.collectives[{i}].ranks", f"rank {bad[0]} is outside the job's "
                              f"{job.world_size} ranks", "import the trace again")
        if measured_comm:
            sched = None
        else:
            key = (ran, algo, c.ranks, max(1, c.size_bytes))
            sched = memo.get(key)
            if sched is None:
                sched = memo[key] = _schedule(place, ran, algo, [place.ranks[r] for r in c.ranks],
                                              max(1, c.size_bytes))
        label = f"{c.op} #{i} ({c.size_bytes} B)"
        lane = f"comm:{c.group}:{i % max(1, place.lanes)}"
        if c.wake_wait_s > 0 and not measured_comm:  # gloo's threads waiting for a core (traces.sched)
            wake_ids[i] = graph.add(f"(wait for a core) {label}", "comm", lane, duration_s=c.wake_wait_s)
        comm_ids.append(graph.add(label, "comm", lane, duration_s=c.measured_net_s) if sched is None
                        else graph.add(label, "comm", lane, comm=CommSpec(f"c{i}", (sched,))))
    launch_deps: list[list[int]] = [[] for _ in job.collectives]
    rank_ids: list[list[int]] = []
    for rt in job.ranks:
        stream = rank_name(rt.rank)
        ids = [graph.add("(start offset)", "offset", stream, duration_s=rt.start_s)]
        for op in rt.ops:
            deps = [comm_ids[c] for c in op.waits]
            done = 0.0
            gap = op.host_gap_s
            for k, offset_s in sorted(op.launches, key=lambda x: x[1]):
                cut = min(max(offset_s, done), op.duration_s)
                ids.append(graph.add(op.name, "compute", stream, deps, (gap + cut - done) * compute_scale))
                launch_deps[k].append(ids[-1])
                deps, gap, done = [], 0.0, cut
            ids.append(graph.add(op.name, "compute", stream, deps, (gap + op.duration_s - done) * compute_scale))
        rank_ids.append(ids)
    for i, tid in enumerate(comm_ids):
        graph.tasks[wake_ids.get(i, tid)].deps = tuple(launch_deps[i])
    return graph, rank_ids, comm_ids


def _schedule(place: Placement, op: str, algorithm: str, ranks: list[str], size_bytes: int) -> Schedule:
    """``algorithm``'s schedule of ``op`` on ``ranks`` (``auto``, or one that does not do ``op``: the fastest
    of those that do, timed alone by the placement's network model), put on the wire by its library."""
    def build(name: str) -> Schedule:
        s = build_schedule(op, name, place.topology, ranks, size_bytes, message_overhead_s=place.message_overhead_s)
        return s if place.library is None else on_the_wire(s, place.topology, None, place.library)

    if algorithm != "auto" and op in {o.value for o in get_algorithm(algorithm).ops}:
        return build(algorithm)
    best = fastest(place.model, place.topology, [partial(build, n) for n in algorithms_for(op, auto=True)],
                   getattr(place.model, "floor_s", None))
    if best is None:
        raise ConfigError("plan.dp_algorithm", f"no algorithm can run {op} on {len(ranks)} ranks of {place.name}",
                          "set plan.dp_algorithm to one that does it")
    return best


def critical_path(graph: TaskGraph, last: int) -> tuple[tuple[str, float], ...]:
    """Seconds by task category on the critical path of a run graph ending at task ``last``: walking back,
    each task's predecessor is whichever of its dependencies and its stream's previous task ended last
    (the one it waited for), as dPRO finds the critical path of its replayed timeline (Hu et al., MLSys
    2022, §4)."""
    prev: dict[int, int] = {}
    seen: dict[str, int] = {}
    for t in graph.tasks:
        if t.stream in seen:
            prev[t.id] = seen[t.stream]
        seen[t.stream] = t.id
    out: dict[str, float] = {}
    tid: int | None = last
    while tid is not None:
        t = graph.tasks[tid]
        out[t.category] = out.get(t.category, 0.0) + (t.end_s - t.start_s)
        cands = [*t.deps, *([prev[tid]] if tid in prev else [])]
        tid = max(cands, key=lambda d: graph.tasks[d].end_s) if cands else None
    return tuple(sorted(out.items()))


def _run(job: TraceJob, place: Placement, compute_scale: float, measured_comm: bool
         ) -> tuple[TaskGraph, list[list[int]], list[int], float, tuple[tuple[str, float], ...], Engine]:
    graph, rank_ids, comm_ids = build_graph(job, place, compute_scale, measured_comm)
    engine = Engine(place.topology, place.model)
    engine.run(graph)
    last = max((ids[-1] for ids in rank_ids), key=lambda i: graph.tasks[i].end_s)
    return graph, rank_ids, comm_ids, graph.tasks[last].end_s, critical_path(graph, last), engine


def _busiest(topo: Topology, link_bytes: np.ndarray, step_s: float, k: int = 5) -> tuple[tuple[str, str, float], ...]:
    """The ``k`` links with the highest utilization over the step (bytes / (capacity · step))."""
    lb = np.asarray(link_bytes, dtype=float)
    if step_s <= 0 or not len(lb):
        return ()
    util = lb / (topo.capacity_bytes_per_s * step_s)
    order = np.argsort(-util, kind="stable")[:k]
    return tuple((topo.links[i].src, topo.links[i].dst, float(util[i])) for i in order if util[i] > 0)


def replay(job: TraceJob, cluster: HostCluster | Placement, compute_scale: float = 1.0) -> Replay:
    """Replay ``job`` on ``cluster``: the recording host's kind, or a placement on any topology (see the
    module's docstring)."""
    place = cluster if isinstance(cluster, Placement) else host_placement(cluster, job.world_size)
    graph, rank_ids, comm_ids, step_s, critical, engine = _run(job, place, compute_scale, False)
    _, _, _, m_step_s, m_critical, _ = _run(job, place, compute_scale, True)
    tasks = graph.tasks
    replayed, measured = [], []
    for rt, ids in zip(job.ranks, rank_ids, strict=True):
        mine = [k for k, c in enumerate(job.collectives) if rt.rank in c.ranks]
        span = tasks[ids[-1]].end_s - rt.start_s
        op_s, gap_s = rt.op_s * compute_scale, rt.host_gap_s * compute_scale
        comm = sum(tasks[comm_ids[k]].end_s - tasks[comm_ids[k]].start_s for k in mine)
        replayed.append(StreamTimes(rt.rank, span, op_s, gap_s, max(0.0, span - op_s - gap_s), comm))
        m_comm = sum(job.collectives[k].measured_net_s for k in mine)
        measured.append(StreamTimes(rt.rank, rt.step_s, rt.op_s, rt.host_gap_s,
                                    max(0.0, rt.step_s - rt.op_s - rt.host_gap_s), m_comm))
    last = max(range(len(rank_ids)), key=lambda i: tasks[rank_ids[i][-1]].end_s)
    return Replay(job.name, place.name, step_s, job.measured_step_s, tuple(replayed), tuple(measured), critical,
                  m_step_s, m_critical, tuple(tasks), last, _busiest(place.topology, engine.link_bytes, step_s))
