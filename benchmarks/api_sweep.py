"""A notebook's micro-batch sweep through the Python API: the cost of one point's variant (the scenario with
one field changed) with the cluster rebuilt at every point (the memo cleared) and shared with the base
scenario (the default).

    PYTHONPATH=src python benchmarks/api_sweep.py

One line per case: the scenario, cluster rebuilt or shared, seconds per point (mean of 3 points).
"""

from __future__ import annotations

import time
from pathlib import Path

import topotrain as tt
from topotrain.scenario import memo

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main() -> None:
    for servers in (16, 1024):
        sc = tt.load_scenario(EXAMPLES / "resnet50-eflops.yaml",
                              [f"cluster.servers={servers}", f"batch={servers * 8 * 32}", "plan.micro_batch=32",
                               "cluster.network.topology=fat-tree"])
        for keep in (True, False):  # shared first: clearing the memo forgets the base scenario's cluster too
            times = []
            for micro in (8, 16, 32):
                if not keep:
                    memo.clear()
                t0 = time.perf_counter()
                tt.variant(sc, plan={"micro_batch": micro})
                times.append(time.perf_counter() - t0)
            print(f"resnet50 on {servers * 8} V100 (fat-tree), micro-batch sweep: cluster "
                  f"{'shared' if keep else 'rebuilt'}: {sum(times) / len(times):.3f} s per point")


if __name__ == "__main__":
    main()
