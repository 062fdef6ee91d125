"""Speed and findings of the co-design search (issue 15's targets). Every figure is measured here.

(a) A search over a 512-GPU space of ``--points`` points (default 10,000: 3 server templates x 3 networks x
    4 allreduce algorithms x 2 overlap settings x 4 micro-batches x bucket sizes), screened with the analytical
    model, the top 1% confirmed with the flow model, on a local pool of ``--workers`` processes. Prints the
    wall time, points per second, and the time 10,000 points would take at that rate.
(b) The same search (``--dask-points`` points) on a local Dask cluster of 1 and of 2 workers: wall times side
    by side, the speed-up, and whether the stored results are identical.
(c) The EFLOPS-like space of ``examples/search-eflops.yaml`` (ResNet-50 on 512 V100s): where the EFLOPS server
    with HDRM on BiGraph and the shared-NIC server with ring on BiGraph land, both timed with the flow model,
    and which part of the iteration makes the difference; (c2) the GPT-3 13B space of
    ``examples/search-eflops-gpt.yaml`` with the analytical model (the flow model takes minutes per point).
(d) Placement: the four policies on ``examples/search-placement-jobs.yaml`` (mean JCT against first-fit).

Run: ``.venv/bin/python benchmarks/search.py [--points N] [--dask-points N] [--workers N] [--skip a,b,c,c2,d]``.
"""

from __future__ import annotations

import argparse
import math
import random
import sqlite3
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from topotrain.search.cost import price_catalog
from topotrain.search.evaluate import Task, evaluate
from topotrain.search.executors import DaskExecutor, PoolExecutor, make_executor
from topotrain.search.results import describe, ranked, rows_of
from topotrain.search.run import load_records, run_search
from topotrain.search.space import grid, grid_size, point_key, space_from_dict

ROOT = Path(__file__).resolve().parent.parent
BUCKETS_FULL = 35  # 288 x 35 = 10,080 points


def space_doc(buckets: int) -> dict[str, Any]:
    """The 512-GPU benchmark space with ``buckets`` bucket sizes (288 points per bucket size)."""
    step = max(1, 140 // buckets)
    return {
        "cluster": {"server": ["eflops", "pcie-shared-nic", "nvswitch-8"], "servers": 64, "gpu": "v100",
                    "network": [{"topology": "bigraph", "switches": 16, "radix": 64, "link": "eth-100g"},
                                {"topology": "fat-tree", "link": "eth-100g"},
                                {"topology": "rail-optimized", "link": "eth-100g"}]},
        "model": "resnet50",
        "batch": {"global": 65536, "micro": [16, 32, 64, 128]},
        "plan": {"dp_algorithm": ["ring", "hdrm", "halving-doubling", "hierarchical"], "overlap": [True, False],
                 "bucket": {"from": step, "to": step * buckets, "step": step, "unit": "MiB"}},
        "search": {"optimizer": "grid", "screen_network": "analytical", "confirm_network": "flow",
                   "confirm_top": 0.01, "constraints": {"gpus": 512}},
    }


def _results(out: Path) -> dict[tuple[str, str], str]:
    con = sqlite3.connect(out / "results.sqlite")
    try:
        return {(k, s): st + m for k, s, st, m in con.execute("SELECT key, stage, status, metrics FROM results")}
    finally:
        con.close()


def speed(points: int, workers: int) -> None:
    space = space_from_dict(space_doc(BUCKETS_FULL))
    everything = list(grid(space.doc))
    n_full = len(everything)
    print(f"(a) search over 512 GPUs: the {n_full}-point space, analytical screen, flow confirmation of the top 1%, "
          f"{workers} local workers")
    if points >= n_full:
        with tempfile.TemporaryDirectory() as d:
            ex = make_executor(workers)
            t0 = time.perf_counter()
            try:
                o = run_search(space, Path(d) / "out", ex)
            finally:
                ex.close()
            wall = time.perf_counter() - t0
            rows = rows_of(load_records(Path(d) / "out"))
        ok = sum(r.status == "ok" for r in rows)
        print(f"    {n_full} points ({ok} feasible), {o.confirmed} confirmed: {wall:.1f} s wall "
              f"({wall / 60:.1f} min; target: under 10 min on 2 cores)")
        return
    # a seeded random sample of the space's points, screened and confirmed the same way
    sample = random.Random(0).sample(everything, points)
    prices = price_catalog()
    tasks = [Task(point_key(p), i, "screen", p, "analytical", prices, gpus=512) for i, (_c, p) in enumerate(sample)]
    ex = make_executor(workers)
    try:
        t0 = time.perf_counter()
        recs = list(ex.run(tasks))
        t_screen = time.perf_counter() - t0
        ok = sorted((r for r in recs if r["status"] == "ok"),
                    key=lambda r: (r["metrics"]["iteration_time_s"], r["seq"]))
        top = ok[: max(1, math.ceil(0.01 * len(ok)))]
        t1 = time.perf_counter()
        list(ex.run([Task(r["key"], r["seq"], "confirm", r["point"], "flow", prices, gpus=512) for r in top]))
        t_confirm = time.perf_counter() - t1
    finally:
        ex.close()
    bad = Counter(f"{r['status']} {r['field']}: {r['reason']}"[:100] for r in recs if r["status"] != "ok")
    for why, k in sorted(bad.items()):
        print(f"    {k} point(s) {why}")
    per_screen, per_confirm = t_screen / points, t_confirm / len(top)
    est = 10_000 * per_screen + math.ceil(0.01 * 10_000 * len(ok) / points) * per_confirm
    print(f"    seeded random sample of {points} points ({len(ok)} feasible): screen {t_screen:.1f} s "
          f"({points / t_screen:.2f} points/s), flow confirmation of the top {len(top)}: {t_confirm:.1f} s")
    print(f"    10,000 points at these rates: {est / 60:.1f} min (target: under 10 min on 2 cores)")


def dask_scaling(points: int) -> None:
    # every server, network and algorithm; as many bucket sizes as make about ``points`` points
    doc = space_doc(1)
    doc["batch"]["micro"] = [64]
    doc["plan"]["overlap"] = [True]
    doc["plan"]["bucket"] = {"from": 10, "to": 10 * max(1, round(points / 36)), "step": 10, "unit": "MiB"}
    space = space_from_dict(doc)
    n = grid_size(space.doc)
    print(f"\n(b) the same kind of search, {n} points, on a local Dask cluster (one thread per worker)")
    walls: dict[int, float] = {}
    results: dict[int, dict[tuple[str, str], str]] = {}
    with tempfile.TemporaryDirectory() as d:
        for w in (1, 2):
            ex = DaskExecutor(local_workers=w)
            t0 = time.perf_counter()
            try:
                run_search(space, Path(d) / f"w{w}", ex)
            finally:
                ex.close()
            walls[w] = time.perf_counter() - t0
            results[w] = _results(Path(d) / f"w{w}")
        pool = PoolExecutor(2)
        try:
            run_search(space, Path(d) / "pool", pool)
        finally:
            pool.close()
        results[0] = _results(Path(d) / "pool")
    print(f"    1 worker: {walls[1]:.1f} s   2 workers: {walls[2]:.1f} s   speed-up {walls[1] / walls[2]:.2f}x; "
          f"results identical (1 worker, 2 workers, local pool): {results[1] == results[2] == results[0]}")


def _searched(space: Any, workers: int) -> tuple[float, Any]:
    """Run ``space`` on a fresh executor of ``workers`` in a temporary directory: (wall seconds, result rows)."""
    with tempfile.TemporaryDirectory() as d:
        ex = make_executor(workers)
        t0 = time.perf_counter()
        try:
            run_search(space, Path(d) / "out", ex)
        finally:
            ex.close()
        wall = time.perf_counter() - t0
        return wall, rows_of(load_records(Path(d) / "out"))


def eflops(workers: int) -> None:
    path = ROOT / "examples" / "search-eflops.yaml"
    space = space_from_dict(yaml.safe_load(path.read_text()))
    print(f"\n(c) {path.relative_to(ROOT)}: {grid_size(space.doc)} points, ResNet-50 on 512 V100s")
    wall, rows = _searched(space, workers)
    order = ranked(rows, "iteration_time_s")
    print(f"    searched in {wall:.1f} s; best: {describe(order[0])} "
          f"({order[0].best['iteration_time_s'] * 1e3:.2f} ms, {order[0].best.get('network')})")

    def find(server: str, algo: str) -> Any:
        cands = [r for r in order if r.point["cluster"]["server"] == server
                 and r.point["cluster"]["network"]["topology"] == "bigraph" and r.point["plan"]["dp_algorithm"] == algo]
        return min(cands, key=lambda r: r.screen["iteration_time_s"])  # its best bucket size

    pair = {"EFLOPS server + HDRM on BiGraph": find("eflops", "hdrm"),
            "shared-NIC server + ring on BiGraph": find("pcie-shared-nic", "ring")}
    prices = price_catalog(space.costs)
    flow: dict[str, dict[str, Any]] = {}
    for name, r in pair.items():
        rec = evaluate(Task(point_key(r.point), r.seq, "confirm", r.point, "flow", prices))
        flow[name] = rec["metrics"]
        rank = order.index(r) + 1
        m = rec["metrics"]
        print(f"    {name:<36} rank {rank:>2}/{len(order)}: {m['iteration_time_s'] * 1e3:.2f} ms (flow), "
              f"capex {m['capex_usd'] / 1e6:.2f} MUSD, {m['usd_per_1m_tokens']:.4f} USD per 1M images "
              f"[{describe(r)}]")
    a, b = flow.values()
    faster = b["iteration_time_s"] / a["iteration_time_s"]
    diff = {k: b["breakdown"][k] - a["breakdown"][k] for k in ("compute_s", "exposed_comm_s", "bubble_s", "tp_comm_s")}
    why = max(diff, key=lambda k: abs(diff[k]))
    print(f"    EFLOPS + HDRM beats shared-NIC + ring: {a['iteration_time_s'] < b['iteration_time_s']}, "
          f"{faster:.3f}x ({(faster - 1) * 100:.1f}% faster per iteration); the difference is "
          f"{why.removesuffix('_s').replace('_', ' ')} ({diff[why] * 1e3:+.2f} of "
          f"{(b['iteration_time_s'] - a['iteration_time_s']) * 1e3:+.2f} ms); "
          f"cost per 1M images {a['usd_per_1m_tokens'] / b['usd_per_1m_tokens']:.3f}x")


def eflops_gpt(workers: int) -> None:
    from dataclasses import replace

    path = ROOT / "examples" / "search-eflops-gpt.yaml"
    space = space_from_dict(yaml.safe_load(path.read_text()))
    space = replace(space, settings=replace(space.settings, confirm_top=0))  # flow: minutes per point here
    print(f"\n(c2) {path.relative_to(ROOT)}: {grid_size(space.doc)} points, GPT-3 13B on 512 V100s, analytical "
          "model only")
    wall, rows = _searched(space, workers)
    order = ranked(rows, "iteration_time_s")
    print(f"     searched in {wall:.1f} s; {len(order)} feasible")
    best = {}
    for srv in ("eflops", "pcie-shared-nic"):
        r = next(r for r in order if r.point["cluster"]["server"] == srv)
        best[srv] = r
        print(f"     best {srv:<16} rank {order.index(r) + 1:>2}: {r.best['iteration_time_s']:.3f} s [{describe(r)} "
              f"tp{r.best['plan']['tp']} pp{r.best['plan']['pp']}]")
    ring = [r for r in order if r.point["cluster"]["server"] == "pcie-shared-nic" and
            r.point["plan"]["dp_algorithm"] == "ring" and r.point["cluster"]["network"]["topology"] == "bigraph"]
    if ring:
        a, b = best["eflops"].best["iteration_time_s"], ring[0].best["iteration_time_s"]
        print(f"     best EFLOPS point vs best shared-NIC + ring on BiGraph: {b / a:.3f}x")


def placement() -> None:
    from topotrain.placement.jobs import load_jobs
    from topotrain.placement.scheduler import POLICIES, compare
    from topotrain.scenario.cluster import load_cluster

    cl, jobs = ROOT / "examples" / "search-placement-cluster.yaml", ROOT / "examples" / "search-placement-jobs.yaml"
    print(f"\n(d) placement: {jobs.relative_to(ROOT)} on {cl.relative_to(ROOT)} (flow model)")
    t0 = time.perf_counter()
    results = compare(load_cluster(cl), load_jobs(jobs), list(POLICIES))
    wall = time.perf_counter() - t0
    base = results[0].mean_jct_s
    for r in results:
        change = (r.mean_jct_s / base - 1) * 100
        print(f"     {r.policy:<20} mean JCT {r.mean_jct_s:.3f} s ({change:+.1f}% vs first-fit), "
              f"mean queueing {r.mean_queue_s:.3f} s, GPU utilization {100 * r.gpu_utilization:.1f}%")
    print(f"     ({wall:.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=10_080, help="points of the speed search (a): the whole "
                    "10,080-point space, or a seeded random sample of it")
    ap.add_argument("--dask-points", type=int, default=1000, help="points of the Dask comparison (b)")
    ap.add_argument("--workers", type=int, default=2, help="local workers for (a) and (c)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a, b, c, c2, d")
    args = ap.parse_args()
    skip = set(args.skip.split(",")) if args.skip else set()
    if "a" not in skip:
        speed(args.points, args.workers)
    if "b" not in skip:
        dask_scaling(args.dask_points)
    if "c" not in skip:
        eflops(args.workers)
    if "c2" not in skip:
        eflops_gpt(args.workers)
    if "d" not in skip:
        placement()


if __name__ == "__main__":
    main()
