"""A production GPU-cluster trace as jobs for ``place``: Alibaba PAI's ``openb`` pod list (clusterdata,
``cluster-trace-gpu-v2023``; docs/sources.md), and the rule that maps its tasks onto models and plans.

The file (CSV with a header) holds one row per task: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli,
gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time`` (times in seconds from the trace's
start; ``gpu_spec``: the GPU types the task may run on, ``|``-separated, empty for any). The trace records
neither the model nor the iterations; the mapping (:func:`trace_jobs`) is:

- a task asking no GPU (``num_gpu`` 0) is left out (this is a GPU scheduler);
- ``gpus`` = ``num_gpu``; a GPU-sharing task (``gpu_milli`` < 1000, one GPU) gets one whole GPU (no GPU
  sharing is modelled);
- ``model``: ResNet-50 for one GPU, BERT-large for several (per-GPU batch 32): the trace names no model;
  these stand for the single-GPU vision and the multi-GPU language jobs of PAI's mix;
- ``gpu_type``: the types of ``gpu_spec`` some group of the fleet answers to; a task whose types no group
  has runs on any group (counted as *relaxed*);
- run time: ``deletion_time - scheduled_time`` (the trace's own queueing is dropped: the simulation makes
  its own); a task that never ran (no ``scheduled_time``: pending at the trace's end) or ran for no time is
  left out; a task still running at the trace's end has its run time cut there, as recorded;
- ``iterations`` = run time / the iteration time alone on the *reference group* (the first group, in the
  fleet's order, that the task may use; for a task that names no type, the first group), at least 1: the
  task takes its recorded time on its reference type; on another type it takes that time scaled by the
  ratio of the two compute rooflines (from the catalog's peak FLOP/s and memory bandwidth) and of the
  allreduces on the two networks.

Rows are checked at the edge: a bad one is one error naming ``FILE[row].column`` and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.placement.fleet import Fleet
from topotrain.placement.jobs import (
    MAX_ARRIVAL_S,
    MAX_ITERATIONS,
    MAX_JOB_GPUS,
    Job,
    gpu_types,
    job_number,
    read_csv_rows,
)
from topotrain.placement.policies import FreeState, packed, shape_of
from topotrain.placement.timing import Timer
from topotrain.util import yamlio
from topotrain.util.errors import ConfigError

#: The trace shipped with topotrain (docs/sources.md): 8,152 tasks, 33% of the GPU tasks with a GPU type.
OPENB_SAMPLE = Path(__file__).parent / "data" / "openb_pod_list_gpuspec33.csv"
OPENB_COLUMNS = ("name", "num_gpu", "gpu_milli", "gpu_spec", "creation_time", "deletion_time", "scheduled_time")
DAY_S = 86_400.0
SINGLE_GPU_MODEL = "resnet50"
MULTI_GPU_MODEL = "bert-large"
BATCH = 32


@dataclass(frozen=True)
class Task:
    """One GPU task of the trace, as recorded."""

    name: str
    gpus: int
    gpu_milli: int
    gpu_type: tuple[str, ...]
    created_s: float
    scheduled_s: float
    deleted_s: float

    @property
    def run_s(self) -> float:
        return self.deleted_s - self.scheduled_s


@dataclass(frozen=True)
class TraceRead:
    """The tasks kept, and how many rows were left out or changed, and why."""

    tasks: tuple[Task, ...]
    rows: int
    no_gpu: int
    no_run_time: int
    shared_gpu: int


def read_openb(path: str | Path) -> TraceRead:
    """The GPU tasks of an openb pod list (see the module docstring)."""
    p = Path(path)
    rows = read_csv_rows(yamlio.read_text(p, "jobs"), p.name)
    return openb_from_rows(rows, p.name)


def openb_from_rows(rows: Sequence[Mapping[str, Any]], where: str) -> TraceRead:
    if rows:
        missing = [c for c in OPENB_COLUMNS if c not in rows[0]]
        if missing:
            raise ConfigError(f"{where}.{missing[0]}", "is a missing column",
                              "give an openb pod list (header: " + ", ".join(OPENB_COLUMNS) + ")")
    tasks: list[Task] = []
    no_gpu = no_run = shared = 0
    for i, r in enumerate(rows):
        f = f"{where}[{i}]"
        if None in r:
            raise ConfigError(f, "has more cells than the header", "fix the row")
        if r.get("num_gpu") is None:
            raise ConfigError(f"{f}.num_gpu", "is missing", "fix the row")
        if str(r["num_gpu"]).strip() == "0":
            no_gpu += 1
            continue
        gpus = int(job_number(r["num_gpu"], f"{f}.num_gpu", MAX_JOB_GPUS, True))
        milli = int(job_number(r.get("gpu_milli") or "1000", f"{f}.gpu_milli", 1000, True))
        created = job_number(r["creation_time"], f"{f}.creation_time", MAX_ARRIVAL_S, False)
        if not str(r["scheduled_time"] or "").strip():  # a pending task: never placed, never ran
            no_run += 1
            continue
        scheduled = job_number(r["scheduled_time"], f"{f}.scheduled_time", MAX_ARRIVAL_S, False)
        deleted = job_number(r["deletion_time"], f"{f}.deletion_time", MAX_ARRIVAL_S, False)
        if scheduled < created:
            raise ConfigError(f"{f}.scheduled_time", f"{scheduled:g} s is before creation_time {created:g} s",
                              "fix the row")
        if deleted < scheduled:
            raise ConfigError(f"{f}.deletion_time", f"{deleted:g} s is before scheduled_time {scheduled:g} s",
                              "fix the row")
        if deleted == scheduled:
            no_run += 1
            continue
        shared += milli < 1000
        tasks.append(Task(str(r["name"])[:80], gpus, milli, gpu_types(r.get("gpu_spec") or None, f"{f}.gpu_spec"),
                          created, scheduled, deleted))
    if not tasks:
        raise ConfigError(where, "holds no GPU task", "give an openb pod list with GPU tasks")
    return TraceRead(tuple(tasks), len(rows), no_gpu, no_run, shared)


def window(tasks: Sequence[Task], from_day: float, days: float | None) -> list[Task]:
    """The tasks created in ``[from_day, from_day + days)`` days of the trace (all from ``from_day`` when
    ``days`` is None), arrival times kept."""
    for name, v in (("--from-day", from_day), ("--days", days)):
        if v is not None and not (math.isfinite(v) and 0 <= v <= 10_000):
            raise ConfigError(name, f"must be a number of days from 0 to 10000 (got {v})", "give e.g. 7")
    lo = from_day * DAY_S
    hi = math.inf if days is None else lo + days * DAY_S
    out = [t for t in tasks if lo <= t.created_s < hi]
    if not out:
        raise ConfigError("--from-day", f"no GPU task was created in that window ({from_day:g} d + "
                          f"{'all' if days is None else f'{days:g} d'})", "choose another window")
    return out


def trace_jobs(tasks: Sequence[Task], fleet: Fleet, timers: Sequence[Timer] | None = None,
               algorithm: str = "ring") -> tuple[list[Job], int]:
    """Jobs of ``tasks`` on ``fleet`` by the mapping of the module docstring; (jobs, tasks relaxed). Arrivals
    start at 0 at the first task of the window."""
    timers = timers or [Timer(g.cluster, algorithm) for g in fleet.groups]
    shapes = [shape_of(g.cluster.topology) for g in fleet.groups]
    t0 = min(t.created_s for t in tasks)
    alone: dict[tuple[int, str, int], float] = {}
    jobs: list[Job] = []
    relaxed = 0
    for i, t in enumerate(tasks):
        known = tuple(x for x in t.gpu_type if fleet.allowed((x,)))
        relaxed += bool(t.gpu_type) and not known
        allowed = fleet.allowed(known)
        fit = [k for k in allowed if fleet.groups[k].num_gpus >= t.gpus]
        if not fit:
            raise ConfigError(f"jobs[{i}].gpus", f"task {t.name} asks {t.gpus} GPUs, more than a group it may "
                              "use holds", "give the fleet larger groups")
        ref = fit[0]
        model = SINGLE_GPU_MODEL if t.gpus == 1 else MULTI_GPU_MODEL
        key = (ref, model, t.gpus)
        if key not in alone:
            compute_s, grad = timers[ref].compute(model, BATCH)
            gpus = packed(FreeState(shapes[ref]), t.gpus)
            assert gpus is not None
            alone[key] = compute_s + timers[ref].alone((gpus, grad))
        iters = min(MAX_ITERATIONS, max(1, round(t.run_s / alone[key])))
        jobs.append(Job(t.name, t.created_s - t0, model, t.gpus, iters, BATCH, known))
    return jobs, relaxed


#: Most tasks a resampled trace may hold.
MAX_RESAMPLE = 100_000


def resample(tasks: Sequence[Task], n: int, days: float, seed: int = 0) -> list[Task]:
    """``n`` tasks drawn with replacement from ``tasks`` (each keeps its GPUs, GPU types and run time),
    created at times drawn uniformly over ``days`` days (seeded: the same arguments give the same trace).
    For a load the recorded trace does not reach; the recorded mix, not the recorded arrivals."""
    if not 1 <= n <= MAX_RESAMPLE:
        raise ConfigError("--resample", f"must be from 1 to {MAX_RESAMPLE:,} tasks (got {n})", "give e.g. 10000")
    if not (math.isfinite(days) and 0 < days <= 10_000):
        raise ConfigError("--days", f"must be a number of days above 0 (got {days})", "give e.g. 7")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(tasks), n)
    at = np.sort(rng.uniform(0.0, days * DAY_S, n))
    out = []
    for k, (i, t) in enumerate(zip(pick.tolist(), at.tolist(), strict=True)):
        src = tasks[i]
        out.append(Task(f"{src.name}#{k}", src.gpus, src.gpu_milli, src.gpu_type, t, t, t + src.run_s))
    return out
