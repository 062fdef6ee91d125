"""Wall time and peak memory of one data-parallel iteration as the cluster grows to the schema's limit.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/big.py [--network analytical|flow] [--max-gpus N]``.
Each row is resnet50, one micro-batch per GPU, data-parallel over ``servers`` × nvswitch-8 on an InfiniBand
HDR fat-tree (the case of issue 41 item 12), timed in its own process (start-up, scenario load, cluster build,
simulate): ``wall_s`` is that process's wall time, ``peak_rss_gib`` its peak resident memory (``ru_maxrss``),
``sim_s`` the part spent in ``simulate``. Rows past ``--max-gpus`` (default 65,536) are skipped; a row that
runs past ``--timeout`` seconds (default 600) is reported as such.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CHILD = """
import resource, sys, time
t0 = time.perf_counter()
import topotrain as tt
servers, network = int(sys.argv[1]), sys.argv[2]
sc = tt.scenario_from_dict({
    "cluster": {"server": "nvswitch-8", "servers": servers,
                "network": {"topology": "fat-tree", "link": "ib-hdr-200g", "latency": "1us"}},
    "model": "resnet50", "batch": {"global": 8 * servers, "micro": 1}})
t1 = time.perf_counter()
r = tt.simulate(sc, network=network)
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {rss:.2f} {r.iteration_time_s!r}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="analytical")
    ap.add_argument("--max-gpus", type=int, default=65536)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    print(f"{'GPUs':>7} {'wall_s':>7} {'load_s':>7} {'sim_s':>7} {'peak_rss_gib':>12}  iteration_s  ({args.network})")
    for servers in (128, 512, 2048, 8192):
        gpus = 8 * servers
        if gpus > args.max_gpus:
            continue
        t0 = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, "-c", CHILD, str(servers), args.network], capture_output=True,
                                 text=True, timeout=args.timeout, env=os.environ.copy(), check=False)
        except subprocess.TimeoutExpired:
            print(f"{gpus:>7} past {args.timeout:.0f} s")
            continue
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            print(f"{gpus:>7} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
            continue
        load_s, sim_s, rss, it = out.stdout.split()
        print(f"{gpus:>7} {wall:7.1f} {float(load_s):7.1f} {float(sim_s):7.1f} {float(rss):12.2f}  {float(it):.6g}",
              flush=True)


if __name__ == "__main__":
    main()
