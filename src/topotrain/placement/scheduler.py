"""Topology-aware job placement on a shared cluster: a queue of data-parallel jobs, a placement policy, and
the jobs' gradient allreduces contending on the flow model.

Model (each part explicit):

- A job is data-parallel training of a catalog model on ``gpus`` GPUs for ``iterations`` iterations
  (per-GPU batch ``batch``). One iteration = the compute of one forward and backward of the per-GPU batch
  (the roofline of :mod:`topotrain.compute`) followed by a ring allreduce of the gradients (no overlap with
  backward: the conservative bound; the point here is how placement changes the communication).
- Jobs run concurrently; while the set of running jobs does not change, each job's allreduce is timed
  with the others' at once on the flow model (:func:`topotrain.network.base.run_concurrent`: max-min fair
  sharing on the routed paths), so jobs whose rings share links slow each other down — the effect studied
  by topology-aware GPU schedulers (Amaral et al., "Topology-aware GPU scheduling for learning workloads
  in cloud environments", SC 2017). A job's rate is 1 / (compute + contended allreduce) iterations per
  second; the simulation jumps from event to event (arrival, completion).
- The queue is first come, first served: the head job starts when the policy finds it enough free GPUs.

Policies (how a job's GPUs are chosen among the free ones):

- ``first-fit``: the first free GPUs in the cluster's order;
- ``packed``: whole servers first (the server with the fewest free GPUs that still holds the job, else
  servers with the most free GPUs first), so that a ring crosses few servers;
- ``topology-aware``: the GPUs under the fewest network switches (servers grouped by the switch their
  NICs attach to; a group that holds the job alone first, the one least used by running multi-server
  jobs), packed by server inside;
- ``search``: for each job, each of the three placements above is timed with the running jobs on the flow
  model and the one with the least total slowdown is kept (a one-step greedy search).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from topotrain.collectives.registry import build_schedule
from topotrain.compute import make_compute_model
from topotrain.network.base import run_concurrent
from topotrain.network.flow import FlowModel
from topotrain.util import yamlio
from topotrain.util.errors import ConfigError
from topotrain.workload.zoo import get_model

POLICIES = ("first-fit", "packed", "topology-aware", "search")


@dataclass(frozen=True)
class Job:
    """One job of a trace."""

    name: str
    arrival_s: float
    model: str
    gpus: int
    iterations: int
    batch: int = 32


@dataclass(frozen=True)
class JobResult:
    """When a job arrived, started and finished, and where it ran."""

    job: Job
    start_s: float
    finish_s: float
    gpus: tuple[str, ...]
    servers: int
    switches: int

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

    @property
    def mean_jct_s(self) -> float:
        return sum(j.jct_s for j in self.jobs) / len(self.jobs)

    @property
    def mean_queue_s(self) -> float:
        return sum(j.queue_s for j in self.jobs) / len(self.jobs)


#: Latest arrival a trace may hold, seconds (about 31 years: a later one is a unit mistake).
MAX_ARRIVAL_S = 1e9
#: Most iterations, GPUs and per-GPU batch of one job.
MAX_ITERATIONS = 10**9
MAX_JOB_GPUS = 65_536
MAX_JOB_BATCH = 1 << 20


def _job_number(v: Any, field: str, hi: float, whole: bool) -> float:
    """A job's number: YAML gives int/float, CSV gives text. Whole fields (gpus, iterations, batch) refuse
    fractions and booleans; every field refuses NaN, infinities, words and values outside [0 or 1, hi]."""
    fix = f"write a {'whole number' if whole else 'number'} from {1 if whole else 0} to {hi:g}"
    if isinstance(v, bool):
        raise ConfigError(field, f"must be a number (got {v!r})", fix)
    if isinstance(v, str):
        text = v.strip()
        try:
            x: float = int(text) if whole and text.lstrip("+-").isdigit() and len(text) < 20 else float(text)
        except ValueError:
            raise ConfigError(field, f"must be a number (got {v[:40]!r})", fix) from None
    elif isinstance(v, int):
        x = v if abs(v) <= 10**18 else math.inf
    elif isinstance(v, float):
        x = v
    else:
        raise ConfigError(field, f"must be a number (got {type(v).__name__})", fix)
    if not math.isfinite(x):
        raise ConfigError(field, f"must be finite (got {str(v)[:40]})", fix)
    if whole and (x != int(x)):
        raise ConfigError(field, f"must be a whole number (got {x!r})", fix)
    lo = 1 if whole else 0
    if not lo <= x <= hi:
        raise ConfigError(field, f"must be from {lo} to {hi:g} (got {x:g})", fix)
    return x


# ---- trace --------------------------------------------------------------------------------------------------
_JOB_KEYS = {"name", "arrival", "arrival_s", "model", "gpus", "iterations", "batch"}


def jobs_from_rows(rows: Sequence[Mapping[str, Any]], where: str = "jobs") -> list[Job]:
    """Jobs from mappings (a YAML list or CSV rows): arrival (s), model, gpus, iterations[, batch, name]."""
    out: list[Job] = []
    for i, r in enumerate(rows):
        f = f"{where}[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f, "must be a mapping", "write {arrival: 0, model: resnet50, gpus: 16, iterations: 100}")
        extra = set(r) - _JOB_KEYS
        if extra:
            raise ConfigError(f"{f}.{sorted(extra)[0]}", "is not a job field", "use " + ", ".join(sorted(_JOB_KEYS)))
        arrival = _job_number(r.get("arrival_s", r.get("arrival", 0.0)), f"{f}.arrival", MAX_ARRIVAL_S, False)
        for key in ("gpus", "iterations"):
            if key not in r:
                raise ConfigError(f"{f}.{key}", "is required", "give gpus and iterations")
        gpus = int(_job_number(r["gpus"], f"{f}.gpus", MAX_JOB_GPUS, True))
        iters = int(_job_number(r["iterations"], f"{f}.iterations", MAX_ITERATIONS, True))
        batch = int(_job_number(r.get("batch", 32), f"{f}.batch", MAX_JOB_BATCH, True))
        out.append(Job(str(r.get("name", f"job{i}")), arrival, str(r.get("model", "resnet50")), gpus, iters, batch))
    if not out:
        raise ConfigError(where, "holds no job", "list at least one job")
    return out


def load_jobs(path: str | Path) -> list[Job]:
    """A trace file: YAML (a list, or ``jobs:`` a list) or CSV with a header."""
    p = Path(path)
    text = yamlio.read_text(p, "jobs")
    if p.suffix.lower() == ".csv":
        try:
            return jobs_from_rows(list(csv.DictReader(io.StringIO(text, newline=""))), p.name)
        except csv.Error as e:
            raise ConfigError("jobs", f"{p.name}: malformed CSV: {e}", "fix the CSV") from None
    try:
        data = yamlio.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError("jobs", f"{p.name}: malformed YAML{where}: {getattr(e, 'problem', None) or e}",
                          "fix the YAML syntax") from None
    if isinstance(data, Mapping):
        data = data.get("jobs")
    if not isinstance(data, list):
        raise ConfigError("jobs", f"{p} must hold a list of jobs", "write jobs: [{arrival: 0, gpus: 16, ...}]")
    return jobs_from_rows(data)


# ---- the cluster's shape --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """GPUs by server and servers by the switch(es) their NICs attach to."""

    gpus: tuple[str, ...]
    server_of: Mapping[str, str]
    servers: Mapping[str, tuple[str, ...]]
    group_of: Mapping[str, str]


def shape_of(topo: Any) -> Shape:
    gpus = tuple(topo.gpus)
    server_of = {g: topo.nodes[g].server or g for g in gpus}
    servers: dict[str, list[str]] = {}
    for g in gpus:
        servers.setdefault(server_of[g], []).append(g)
    attach: dict[str, set[str]] = {}
    for lk in topo.links:
        a, b = topo.nodes[lk.src], topo.nodes[lk.dst]
        if str(a.kind) == "nic" and str(b.kind) == "switch" and a.server is not None:
            attach.setdefault(a.server, set()).add(lk.dst)
    group_of = {s: ",".join(sorted(attach.get(s, {"none"}))) for s in servers}
    return Shape(gpus, server_of, {s: tuple(v) for s, v in servers.items()}, group_of)


# ---- policies -------------------------------------------------------------------------------------------
Policy = Callable[[Shape, set[str], int, Sequence[tuple[str, ...]]], tuple[str, ...] | None]


def first_fit(shape: Shape, free: set[str], n: int, running: Sequence[tuple[str, ...]]) -> tuple[str, ...] | None:
    chosen = [g for g in shape.gpus if g in free][:n]
    return tuple(chosen) if len(chosen) == n else None


def _pack(shape: Shape, free: set[str], n: int, servers: Sequence[str]) -> tuple[str, ...] | None:
    avail = {s: [g for g in shape.servers[s] if g in free] for s in servers}
    fits = [s for s in servers if len(avail[s]) >= n]
    if fits:
        best = min(fits, key=lambda s: (len(avail[s]), servers.index(s)))
        return tuple(avail[best][:n])
    chosen: list[str] = []
    for s in sorted(servers, key=lambda s: (-len(avail[s]), servers.index(s))):
        chosen.extend(avail[s][: n - len(chosen)])
        if len(chosen) == n:
            return tuple(chosen)
    return None


def packed(shape: Shape, free: set[str], n: int, running: Sequence[tuple[str, ...]]) -> tuple[str, ...] | None:
    return _pack(shape, free, n, list(shape.servers))


def topology_aware(shape: Shape, free: set[str], n: int,
                   running: Sequence[tuple[str, ...]]) -> tuple[str, ...] | None:
    groups: dict[str, list[str]] = {}
    for s in shape.servers:
        groups.setdefault(shape.group_of[s], []).append(s)
    order = list(groups)
    free_in = {gr: sum(1 for s in groups[gr] for g in shape.servers[s] if g in free) for gr in order}
    # how many running multi-server jobs already cross each group (their rings load its uplinks)
    load = dict.fromkeys(order, 0)
    for gpus in running:
        touched = {shape.group_of[shape.server_of[g]] for g in gpus}
        if len({shape.server_of[g] for g in gpus}) > 1:
            for gr in touched:
                load[gr] += 1
    fits = [gr for gr in order if free_in[gr] >= n]
    if fits:
        gr = min(fits, key=lambda x: (load[x], free_in[x], order.index(x)))
        return _pack(shape, free, n, groups[gr])
    chosen_servers: list[str] = []
    have = 0
    for gr in sorted(order, key=lambda x: (load[x], -free_in[x], order.index(x))):
        if free_in[gr] == 0:
            continue
        chosen_servers.extend(groups[gr])
        have += free_in[gr]
        if have >= n:
            return _pack(shape, free, n, chosen_servers)
    return None


_BASE: dict[str, Policy] = {"first-fit": first_fit, "packed": packed, "topology-aware": topology_aware}


# ---- timing ---------------------------------------------------------------------------------------------
class _Timer:
    """Compute time per iteration (per model and batch) and contended allreduce times (per set of running
    placements), memoized."""

    def __init__(self, cluster: Any, algorithm: str = "ring") -> None:
        self.cluster = cluster
        self.topo = cluster.topology
        self.algorithm = algorithm
        self.flow = FlowModel(cluster.network_params)
        self._compute: dict[tuple[str, int], tuple[float, int]] = {}
        self._comm: dict[tuple[tuple[tuple[str, ...], int], ...], list[float]] = {}

    def compute(self, job: Job) -> tuple[float, int]:
        """(seconds of compute per iteration, gradient bytes) of a job's model."""
        key = (job.model, job.batch)
        if key not in self._compute:
            model = get_model(job.model)
            gpu = self.cluster.gpu_spec
            dtype = "bf16" if "bf16" in gpu.peak_flops_per_s else "fp16"
            fwd, bwd = make_compute_model(gpu, model, dtype).layer_times(model, job.batch, 1)
            grad = int(model.param_bytes) if hasattr(model, "param_bytes") else 0
            self._compute[key] = (float(sum(fwd) + sum(bwd)), max(grad, 1))
        return self._compute[key]

    def comm(self, placed: Sequence[tuple[tuple[str, ...], int]]) -> list[float]:
        """Allreduce seconds of each (gpus, bytes) when all run at once on the flow model."""
        key = tuple(sorted(placed))
        if key not in self._comm:
            jobs = []
            idx = []
            for i, (gpus, size) in enumerate(key):
                if len(gpus) > 1:
                    jobs.append((build_schedule("allreduce", self.algorithm, self.topo, list(gpus), size,
                                                message_overhead_s=self.cluster.network_params.message_overhead_s),
                                 0.0))
                    idx.append(i)
            times = [0.0] * len(key)
            if jobs:
                for i, t in zip(idx, run_concurrent(jobs, self.topo, self.flow), strict=True):
                    times[i] = t.time_s
            self._comm[key] = times
        order = {p: t for p, t in zip(key, self._comm[key], strict=True)}
        return [order[p] for p in placed]


def run_policy(cluster: Any, jobs: Sequence[Job], policy: str, *, algorithm: str = "ring",
               timer: _Timer | None = None) -> PolicyResult:
    """Run the trace under ``policy`` (event by event; see the module docstring)."""
    if policy not in POLICIES:
        raise ConfigError("--policy", f"unknown policy {policy!r}", "use " + ", ".join(POLICIES))
    shape = shape_of(cluster.topology)
    total_gpus = len(shape.gpus)
    for i, j in enumerate(jobs):
        if j.gpus > total_gpus:
            raise ConfigError(f"jobs[{i}].gpus", f"{j.gpus} GPUs, the cluster has {total_gpus}", "ask for fewer")
    timer = timer or _Timer(cluster, algorithm)
    queue = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))
    free = set(shape.gpus)
    running: dict[int, tuple[str, ...]] = {}
    left: dict[int, float] = {}
    start: dict[int, float] = {}
    done: dict[int, JobResult] = {}
    now = 0.0
    busy_gpu_s = 0.0

    def rates() -> dict[int, float]:
        ids = sorted(running)
        placed = [(running[i], timer.compute(jobs[i])[1]) for i in ids]
        comm = timer.comm(placed)
        return {i: 1.0 / (timer.compute(jobs[i])[0] + c) for i, c in zip(ids, comm, strict=True)}

    def place(i: int) -> tuple[str, ...] | None:
        others = list(running.values())
        if policy != "search":
            return _BASE[policy](shape, free, jobs[i].gpus, others)
        best: tuple[float, tuple[str, ...]] | None = None
        for name in ("topology-aware", "packed", "first-fit"):
            cand = _BASE[name](shape, free, jobs[i].gpus, others)
            if cand is None:
                continue
            ids = sorted(running)
            placed = [(running[k], timer.compute(jobs[k])[1]) for k in ids] + [(cand, timer.compute(jobs[i])[1])]
            comm = timer.comm(placed)
            alone = [timer.comm([p])[0] for p in placed]
            slow = sum((timer.compute(jobs[k])[0] + c) / (timer.compute(jobs[k])[0] + a)
                       for k, c, a in zip([*ids, i], comm, alone, strict=True))
            cost = slow + comm[-1] / max(timer.compute(jobs[i])[0], 1e-12)
            if best is None or cost < best[0] - 1e-12:
                best = (cost, cand)
        return None if best is None else best[1]

    while queue or running:
        # start jobs from the head of the queue while they fit (first come, first served)
        while queue and jobs[queue[0]].arrival_s <= now + 1e-12:
            gpus = place(queue[0])
            if gpus is None:
                break
            i = queue.pop(0)
            running[i], left[i], start[i] = gpus, float(jobs[i].iterations), now
            free.difference_update(gpus)
        r = rates() if running else {}
        finish_at = {i: now + left[i] / r[i] for i in running}
        t_finish = min(finish_at.values(), default=math.inf)
        t_arrive = jobs[queue[0]].arrival_s if queue and jobs[queue[0]].arrival_s > now + 1e-12 else math.inf
        t_next = min(t_finish, t_arrive)
        if not math.isfinite(t_next):
            raise ConfigError("jobs", "a job can never start", "check the GPU counts against the cluster")
        dt = max(0.0, t_next - now)
        busy_gpu_s += dt * sum(len(g) for g in running.values())
        for i in list(running):
            left[i] -= dt * r[i]
            # the job(s) whose finish is this event end here, whatever the rounding of ``now + dt`` (at large
            # times a residual could otherwise stay above the tolerance, or dt round to 0, for ever)
            if finish_at[i] <= t_next or left[i] <= 1e-9 * jobs[i].iterations:
                gpus = running.pop(i)
                free.update(gpus)
                servers = {shape.server_of[g] for g in gpus}
                done[i] = JobResult(jobs[i], start[i], t_next, gpus, len(servers),
                                    len({shape.group_of[s] for s in servers}))
        now = t_next
    results = tuple(done[i] for i in range(len(jobs)))
    makespan = max(j.finish_s for j in results) - min(j.job.arrival_s for j in results)
    util = busy_gpu_s / (total_gpus * makespan) if makespan > 0 else 0.0
    return PolicyResult(policy, results, makespan, util)


def compare(cluster: Any, jobs: Sequence[Job], policies: Sequence[str], algorithm: str = "ring") -> list[PolicyResult]:
    """Each policy on the same trace (one shared timer: the same placements are timed once)."""
    timer = _Timer(cluster, algorithm)
    return [run_policy(cluster, jobs, p, algorithm=algorithm, timer=timer) for p in policies]
