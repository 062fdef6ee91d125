"""Schedule-building speed: wall time of building a ring allreduce for many ranks on one switch.

Run: ``.venv/bin/python benchmarks/schedule_build.py``. Prints one line per rank count (best of three builds,
each on a fresh topology so that no route is cached). The test suite checks these schedules' correctness;
their build time is this benchmark's figure, since a test's wall-clock bound fails on a busy machine.
"""

from __future__ import annotations

import sys
import time

from topotrain.collectives.registry import build_schedule
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology


def star(p: int, bw: float = 12.5e9) -> Topology:
    """``p`` GPUs on one non-blocking switch."""
    t = Topology(f"star{p}")
    t.add_node("sw", NodeKind.SWITCH)
    for i in range(p):
        t.add_node(f"g{i}", NodeKind.GPU)
        t.add_link(f"g{i}", "sw", bw)
    return t.freeze()


def main() -> int:
    for p in (256, 2048):
        best = float("inf")
        for _ in range(3):
            topo = star(p)
            t0 = time.perf_counter()
            build_schedule("allreduce", "ring", topo, topo.gpus, 1 << 30)
            best = min(best, time.perf_counter() - t0)
        print(f"ring allreduce schedule, {p} ranks on one switch: {best * 1e3:.0f} ms to build (best of 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
