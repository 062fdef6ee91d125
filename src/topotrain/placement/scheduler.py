"""Job placement on a shared fleet: a queue of data-parallel jobs, a placement policy, and the jobs' gradient
allreduces contending on the flow model — simulated event by event.

Model (each part explicit):

- A job (:class:`~topotrain.placement.jobs.Job`) is data-parallel training of a catalog model on ``gpus``
  GPUs for ``iterations`` iterations. One iteration = the compute of one forward and backward of the
  per-GPU batch on the GPU type of the group it runs in (the roofline of :mod:`topotrain.compute`: a job on
  another type runs at the ratio of the two rooflines, from the catalog's peak FLOP/s and memory bandwidth)
  followed by a ring allreduce of the gradients (no overlap with backward: the conservative bound).
- Jobs run concurrently; while the set of running jobs does not change, a job's allreduce is timed with
  those it shares links with on the flow model (:mod:`topotrain.placement.timing`: components of jobs
  joined by shared links, each timed on its own), so jobs whose rings share links slow each other down —
  the effect studied by topology-aware GPU schedulers (Amaral et al., SC 2017). A job's rate is
  1 / (compute + contended allreduce) iterations per second.
- The simulation jumps from event to event (a heap of completions, the next arrival); a job's progress is
  brought up to date only when its component's rates change.
- The queue is first come, first served: the head job starts when the policy finds it enough free GPUs in
  a group it may use (its ``gpu_type``), else it waits and the jobs behind it wait too.

Policies (:data:`POLICIES`):

- ``first-fit``, ``packed``, ``topology-aware``: the groups in the fleet's order, the first one where the
  base policy (:mod:`topotrain.placement.policies`) finds the GPUs;
- ``heterogeneity-aware``: among the groups the job may use that hold it now, the one where it runs fastest
  (its throughput alone, 1 / (compute + allreduce) on that group's GPU type and the topology-aware
  placement there) — the effective-throughput view of Gavel (Narayanan et al., "Heterogeneity-aware
  cluster scheduling policies for deep learning workloads", OSDI 2020), applied greedily at each start;
- ``search``: for each job, every base placement in every group it may use is timed with the running jobs
  it would share links with, and the one with the least cost is kept (a one-step greedy search): the
  change in the other jobs' slowdowns (contended / alone iteration time), plus the job's own slowdown,
  plus its allreduce over its compute, plus how much slower its GPU type computes than the fastest it
  may use.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from topotrain.cluster import Cluster
from topotrain.placement.fleet import Fleet, single
from topotrain.placement.jobs import Job
from topotrain.placement.policies import BASE, FreeState, shape_of, topology_aware
from topotrain.placement.timing import Timer, component
from topotrain.util.errors import ConfigError

POLICIES = ("first-fit", "packed", "topology-aware", "heterogeneity-aware", "search")


@dataclass(frozen=True)
class JobResult:
    """When a job arrived, started and finished, and where it ran."""

    job: Job
    start_s: float
    finish_s: float
    gpus: tuple[str, ...]
    servers: int
    switches: int
    group: str = ""

    @property
    def jct_s(self) -> float:
        """Job completion time: arrival to finish."""
        return self.finish_s - self.job.arrival_s

    @property
    def queue_s(self) -> float:
        return self.start_s - self.job.arrival_s


@dataclass(frozen=True)
class PolicyResult:
    """A trace run under one policy."""

    policy: str
    jobs: tuple[JobResult, ...]
    makespan_s: float
    gpu_utilization: float
    #: per group: (name, GPU type, GPUs, busy GPU-seconds)
    groups: tuple[tuple[str, str, int, float], ...] = ()

    @property
    def mean_jct_s(self) -> float:
        return sum(j.jct_s for j in self.jobs) / len(self.jobs)

    @property
    def mean_queue_s(self) -> float:
        return sum(j.queue_s for j in self.jobs) / len(self.jobs)


class _Group:
    """One group's live state: free GPUs, timer, running jobs and the links they cross."""

    def __init__(self, name: str, cluster: Cluster, timer: Timer) -> None:
        self.name = name
        self.shape = shape_of(cluster.topology)
        self.free = FreeState(self.shape)
        self.timer = timer
        self.gpu = cluster.gpu
        self.links_of: dict[int, frozenset[int]] = {}
        self.users: dict[int, set[int]] = {}
        self.busy_gpu_s = 0.0

    def add(self, i: int, gpus: tuple[str, ...], size: int) -> None:
        self.free.take(gpus)
        links = self.links_of[i] = self.timer.links(gpus, size)
        for lk in links:
            self.users.setdefault(lk, set()).add(i)

    def remove(self, i: int, gpus: tuple[str, ...]) -> set[int]:
        """Take job ``i`` out; the running jobs that shared a link with it."""
        self.free.give(gpus)
        touched: set[int] = set()
        for lk in self.links_of.pop(i):
            us = self.users[lk]
            us.discard(i)
            touched |= us
            if not us:
                del self.users[lk]
        return touched

    def neighbours(self, links: frozenset[int]) -> set[int]:
        """Running jobs of the component a placement crossing ``links`` would join."""
        start: set[int] = set()
        for lk in links:
            start |= self.users.get(lk, set())
        return component(start, self.links_of, self.users) if start else set()


def _fleet_of(target: Cluster | Fleet) -> Fleet:
    return target if isinstance(target, Fleet) else single(target)


def _check_fits(fleet: Fleet, jobs: Sequence[Job]) -> list[tuple[int, ...]]:
    allowed: list[tuple[int, ...]] = []
    for i, j in enumerate(jobs):
        ok = fleet.allowed(j.gpu_type)
        if not ok:
            raise ConfigError(f"jobs[{i}].gpu_type", f"no group of the fleet runs {'|'.join(j.gpu_type)}",
                              "name a type of the fleet's groups (their types:)")
        most = max(fleet.groups[k].num_gpus for k in ok)
        if j.gpus > most:
            where = "the cluster has" if len(fleet.groups) == 1 else "its largest group has"
            raise ConfigError(f"jobs[{i}].gpus", f"{j.gpus} GPUs, {where} {most}", "ask for fewer")
        allowed.append(ok)
    return allowed


def run_policy(target: Cluster | Fleet, jobs: Sequence[Job], policy: str, *, algorithm: str = "ring",
               contention: str = "flow", timers: Sequence[Timer] | None = None) -> PolicyResult:
    """Run the trace under ``policy`` on a cluster or a fleet (event by event; see the module docstring)."""
    if policy not in POLICIES:
        raise ConfigError("--policy", f"unknown policy {policy!r}", "use " + ", ".join(POLICIES))
    fleet = _fleet_of(target)
    allowed = _check_fits(fleet, jobs)
    timers = timers or [Timer(g.cluster, algorithm, contention) for g in fleet.groups]
    groups = [_Group(g.name, g.cluster, t) for g, t in zip(fleet.groups, timers, strict=True)]
    comp = [[g.timer.compute(j.model, j.batch) for g in groups] for j in jobs]  # (compute s, gradient bytes)
    queue = deque(sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i)))
    where: dict[int, tuple[int, tuple[str, ...]]] = {}  # running job → (group, GPUs)
    comm: dict[int, float] = {}  # running job → its contended allreduce seconds
    rate: dict[int, float] = {}
    left: dict[int, float] = {}
    since: dict[int, float] = {}
    start: dict[int, float] = {}
    version: dict[int, int] = {}
    heap: list[tuple[float, int, int]] = []  # (finish time, job, version)
    done: dict[int, JobResult] = {}
    now = 0.0

    def retime(k: int, ids: set[int]) -> None:
        """Time the components of ``ids`` in group ``k`` again; bring their jobs' progress up to date."""
        g = groups[k]
        todo = set(ids)
        while todo:
            members = sorted(component([min(todo)], g.links_of, g.users))
            todo.difference_update(members)
            times = g.timer.comm([(where[m][1], comp[m][k][1]) for m in members])
            for m, c in zip(members, times, strict=True):
                if m in comm and c == comm[m]:
                    continue
                if m in rate:
                    left[m] -= (now - since[m]) * rate[m]
                comm[m], since[m] = c, now
                rate[m] = 1.0 / (comp[m][k][0] + c)
                version[m] = version.get(m, 0) + 1
                heapq.heappush(heap, (now + left[m] / rate[m], m, version[m]))

    def candidates(i: int) -> list[tuple[int, tuple[str, ...]]]:
        n = jobs[i].gpus
        if policy in BASE:
            for k in allowed[i]:
                got = BASE[policy](groups[k].free, n)
                if got is not None:
                    return [(k, got)]
            return []
        if policy == "heterogeneity-aware":
            best: tuple[float, int, tuple[str, ...]] | None = None
            for k in allowed[i]:
                got = topology_aware(groups[k].free, n)
                if got is None:
                    continue
                t = comp[i][k][0] + groups[k].timer.alone((got, comp[i][k][1]))
                if best is None or t < best[0]:
                    best = (t, k, got)
            return [] if best is None else [(best[1], best[2])]
        return [(k, got) for k in allowed[i] for name in ("topology-aware", "packed", "first-fit")
                if (got := BASE[name](groups[k].free, n)) is not None]

    def search_cost(i: int, k: int, cand: tuple[str, ...]) -> float:
        g = groups[k]
        size = comp[i][k][1]
        near = sorted(g.neighbours(g.timer.links(cand, size)))
        placed = [(where[m][1], comp[m][k][1]) for m in near] + [(cand, size)]
        times = g.timer.comm(placed)
        alone = [g.timer.alone(p) for p in placed]
        new = sum((comp[m][k][0] + c) / (comp[m][k][0] + a) for m, c, a in zip([*near, i], times, alone, strict=True))
        old = sum((comp[m][k][0] + comm[m]) / (comp[m][k][0] + a) for m, a in zip(near, alone[:-1], strict=True))
        fastest = min(comp[i][q][0] for q in allowed[i])
        return new - old + times[-1] / max(comp[i][k][0], 1e-12) + (comp[i][k][0] / fastest - 1.0)

    def place(i: int) -> tuple[int, tuple[str, ...]] | None:
        cands = candidates(i)
        if policy != "search" or len(cands) <= 1:
            return cands[0] if cands else None
        best: tuple[float, int, tuple[str, ...]] | None = None
        for k, cand in cands:
            cost = search_cost(i, k, cand)
            if best is None or cost < best[0] - 1e-12:
                best = (cost, k, cand)
        assert best is not None
        return best[1], best[2]

    def finish(i: int, t: float, touched: dict[int, set[int]]) -> None:
        k, gpus = where.pop(i)
        g = groups[k]
        near = g.remove(i, gpus)
        g.busy_gpu_s += len(gpus) * (t - start[i])
        for d in (comm, rate, left, since, version):
            d.pop(i, None)
        servers = {g.shape.server_of[x] for x in gpus}
        done[i] = JobResult(jobs[i], start[i], t, gpus, len(servers), len({g.shape.group_of[s] for s in servers}),
                            g.name)
        touched.setdefault(k, set()).update(near)
        touched[k].discard(i)

    def retime_all(touched: dict[int, set[int]]) -> None:
        for k, ids in touched.items():
            ids = {m for m in ids if m in where}
            if ids:
                retime(k, ids)
        touched.clear()

    try_start = True
    touched: dict[int, set[int]] = {}  # group → running jobs whose component changed since it was timed
    while queue or where:
        if try_start:
            while queue and jobs[queue[0]].arrival_s <= now + 1e-12:
                if policy == "search":  # its costs read the running jobs' current allreduce times
                    retime_all(touched)
                got = place(queue[0])
                if got is None:
                    break
                i = queue.popleft()
                k, gpus = got
                where[i], left[i], start[i] = (k, gpus), float(jobs[i].iterations), now
                groups[k].add(i, gpus, comp[i][k][1])
                touched.setdefault(k, set()).add(i)
        retime_all(touched)
        while heap and version.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)  # stale: the job's rate changed or it ended
        t_finish = heap[0][0] if heap else math.inf
        t_arrive = jobs[queue[0]].arrival_s if queue and jobs[queue[0]].arrival_s > now + 1e-12 else math.inf
        t_next = min(t_finish, t_arrive)
        if not math.isfinite(t_next):
            raise ConfigError("jobs", "a job can never start", "check the GPU counts against the cluster")
        t_next = max(t_next, now)
        # the job(s) whose finish is this event end here, and those within 1e-9 of their iterations of it
        # (whatever the rounding of the clock at large times)
        ended = False
        while heap:
            f, i, v = heap[0]
            if version.get(i) != v:
                heapq.heappop(heap)
                continue
            if f <= t_next or (f - t_next) * rate[i] <= 1e-9 * jobs[i].iterations:
                heapq.heappop(heap)
                finish(i, t_next, touched)
                ended = True
                continue
            break
        try_start = ended or t_next == t_arrive
        now = t_next
    results = tuple(done[i] for i in range(len(jobs)))
    makespan = max(j.finish_s for j in results) - min(j.job.arrival_s for j in results)
    busy = sum(g.busy_gpu_s for g in groups)
    util = busy / (fleet.num_gpus * makespan) if makespan > 0 else 0.0
    per = tuple((g.name, g.gpu, len(g.shape.gpus), g.busy_gpu_s) for g in groups)
    return PolicyResult(policy, results, makespan, util, per)


def compare(target: Cluster | Fleet, jobs: Sequence[Job], policies: Sequence[str],
            algorithm: str = "ring", contention: str = "flow") -> list[PolicyResult]:
    """Each policy on the same trace (shared timers: the same placements are timed once)."""
    fleet = _fleet_of(target)
    timers = [Timer(g.cluster, algorithm, contention) for g in fleet.groups]
    return [run_policy(fleet, jobs, p, algorithm=algorithm, timers=timers) for p in policies]
