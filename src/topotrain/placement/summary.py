"""Figures of a placement run, per policy and per group (GPU type): what ``place`` prints, writes as JSON
and plots.

Utilization is given two ways: over the makespan (first arrival to last completion; :class:`PolicyResult`'s
own figure) and over the *arrival window* (first to last arrival): busy GPU-seconds inside the window over
the GPU-seconds the window offers. A production trace's longest jobs run for months after its last
arrival, so the makespan figure says little about how busy the fleet was while the trace was arriving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topotrain.placement.scheduler import JobResult, PolicyResult


@dataclass(frozen=True)
class Figures:
    """One policy's figures over some jobs (all, or one group's)."""

    jobs: int
    mean_jct_s: float
    p95_jct_s: float
    mean_queue_s: float
    utilization: float  # over the makespan
    window_utilization: float  # over the arrival window


def _p95(xs: list[float]) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(0.95 * len(s)) - 1))]


def figures(r: PolicyResult, jobs: Sequence[JobResult], gpus: int, busy_gpu_s: float) -> Figures:
    arrivals = [j.job.arrival_s for j in r.jobs]
    lo, hi = min(arrivals), max(arrivals)
    window_busy = sum(j.job.gpus * max(0.0, min(j.finish_s, hi) - max(j.start_s, lo)) for j in jobs)
    n = len(jobs)
    jct = [j.jct_s for j in jobs]
    return Figures(n, sum(jct) / n if n else 0.0, _p95(jct), sum(j.queue_s for j in jobs) / n if n else 0.0,
                   busy_gpu_s / (gpus * r.makespan_s) if r.makespan_s > 0 and gpus else 0.0,
                   window_busy / (gpus * (hi - lo)) if hi > lo and gpus else 0.0)


def overall(r: PolicyResult) -> Figures:
    gpus = sum(g[2] for g in r.groups)
    return figures(r, r.jobs, gpus, sum(g[3] for g in r.groups))


def per_group(r: PolicyResult) -> list[tuple[str, str, int, Figures]]:
    """(group, GPU type, GPUs, figures of the jobs that ran there) in the fleet's order."""
    out = []
    for name, gpu, n, busy in r.groups:
        out.append((name, gpu, n, figures(r, [j for j in r.jobs if j.group == name], n, busy)))
    return out
