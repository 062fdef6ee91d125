"""``topotrain place`` at production scale: a week of Alibaba PAI's GPU trace on a mixed fleet, every policy
side by side, and the scheduler's speed on synthetic traces of 1,000 and 10,000 jobs.

    PYTHONPATH=src python benchmarks/place_trace.py              # all parts
    PYTHONPATH=src python benchmarks/place_trace.py --skip c     # parts a, b only
    PYTHONPATH=src python benchmarks/place_trace.py --full       # and 10,000 jobs with flow contention

(a) The recorded trace: the GPU tasks created in its busiest week (day 142 to its end, 149.3, of the openb pod
    list, ``src/topotrain/placement/data``; docs/sources.md) on ``examples/place-pai-fleet.yaml`` (V100, T4,
    P100 and A100 groups), every policy, exact (flow) contention.
(b) A week at production load: 10,000 tasks resampled (seed 0) from the trace's mix, arriving uniformly over
    7 days, on the same fleet, every policy, exact (flow) contention. The recorded trace holds fewer than
    10,000 GPU tasks in any week (docs/search.md says why), so this is the ≥ 10,000-job week.
(c) Speed: synthetic data-parallel traces (ResNet-50, 4–32 GPUs, Poisson arrivals every 0.2 s on average,
    seed 1) of 1,000 and 10,000 jobs on ``examples/search-placement-cluster.yaml`` (128 V100 on a 4:1
    oversubscribed leaf-spine: most jobs cross servers and contend, and the queue grows all along), first-fit,
    each contention model (10,000 with ``flow`` only with ``--full``: minutes).

Each part prints its wall time; the side-by-side table is ``topotrain place``'s own.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from topotrain.cli.common import console
from topotrain.cli.place import tables
from topotrain.placement.fleet import load_fleet
from topotrain.placement.jobs import Job
from topotrain.placement.scheduler import POLICIES, compare
from topotrain.placement.timing import Timer
from topotrain.placement.trace import OPENB_SAMPLE, read_openb, resample, trace_jobs, window
from topotrain.scenario.cluster import load_cluster

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "examples" / "place-pai-fleet.yaml"
CLUSTER = ROOT / "examples" / "search-placement-cluster.yaml"


def synthetic(n: int, seed: int = 1) -> list[Job]:
    """``n`` ResNet-50 jobs of 4–32 GPUs, 20–100 iterations, Poisson arrivals (mean gap 0.2 s)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1 / 0.2)
        out.append(Job(f"j{i}", round(t, 3), "resnet50", rng.choice([4, 8, 12, 16, 24, 32]),
                       rng.choice([20, 50, 100]), 32))
    return out


def trace_part(label: str, jobs: list[Job], fleet_name: str, contention: str) -> None:
    fleet = load_fleet(FLEET)
    t0 = time.perf_counter()
    results = compare(fleet, jobs, list(POLICIES), contention=contention)
    wall = time.perf_counter() - t0
    for t in tables(results, f"({label}) {len(jobs):,} jobs on {fleet_name} ({fleet.num_gpus} GPUs), {contention}"):
        console.print(t)
    base = results[0].mean_jct_s
    for r in results:
        change = (r.mean_jct_s / base - 1) * 100
        print(f"     ({label}) {r.policy:<20} mean JCT {r.mean_jct_s:,.0f} s ({change:+.1f}% vs first-fit), "
              f"mean queueing {r.mean_queue_s:,.0f} s")
    print(f"     ({label}) {len(jobs):,} jobs x {len(POLICIES)} policies scheduled and simulated in {wall:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a, b, c")
    ap.add_argument("--contention", default="flow", help="contention model of (a) and (b): flow or steady")
    ap.add_argument("--full", action="store_true", help="(c): also 10,000 jobs with flow contention (minutes)")
    args = ap.parse_args()
    skip = set(args.skip.split(",")) if args.skip else set()
    fleet = load_fleet(FLEET)
    read = read_openb(OPENB_SAMPLE)
    timers = [Timer(g.cluster) for g in fleet.groups]
    if "a" not in skip:
        t0 = time.perf_counter()
        jobs, relaxed = trace_jobs(window(read.tasks, 142, None), fleet, timers)
        print(f"(a) recorded trace, days 142 to its end (149.3): {len(jobs):,} GPU tasks ({relaxed} with GPU types "
              f"not in the fleet); read and mapped in {time.perf_counter() - t0:.1f} s")
        trace_part("a", jobs, fleet.name, args.contention)
    if "b" not in skip:
        t0 = time.perf_counter()
        jobs, relaxed = trace_jobs(resample(read.tasks, 10_000, 7.0, 0), fleet, timers)
        print(f"\n(b) a week at production load: {len(jobs):,} tasks resampled from the trace's "
              f"{len(read.tasks):,} GPU tasks ({relaxed} with GPU types not in the fleet); mapped in "
              f"{time.perf_counter() - t0:.1f} s")
        trace_part("b", jobs, fleet.name, args.contention)
    if "c" not in skip:
        cluster = load_cluster(CLUSTER)
        print(f"\n(c) speed: synthetic traces on {CLUSTER.name} (first-fit)")
        for n, models in ((1_000, ("flow", "steady")), (10_000, ("steady", "flow") if args.full else ("steady",))):
            jobs = synthetic(n)
            for c in models:
                t0 = time.perf_counter()
                (r,) = compare(cluster, jobs, ["first-fit"], contention=c)
                print(f"     {n:>6,} jobs, {c:<6}: {time.perf_counter() - t0:6.1f} s (mean JCT {r.mean_jct_s:.2f} s, "
                      f"GPU utilization {100 * r.gpu_utilization:.1f}%)", flush=True)


if __name__ == "__main__":
    main()
