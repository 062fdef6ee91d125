"""Timing checks of the emulated testbed: how close measurements come to the predictions on the small
runs the tests execute for correctness only.

Needs root and ``ip netns``. Run: ``.venv/bin/python benchmarks/testbed_checks.py``. Prints one figure per
line with the band it is expected in on an idle machine and whether it is inside: the link rate h0→h1
against the shaped rate, a 4-rank ring allreduce against the ``flow`` and ``flow-eager`` predictions, and a
DDP training step against its ``flow-eager`` prediction. These are figures, not tests: on a busy machine
(other test suites, CPU steal) measured times stretch, which says nothing about the code.
"""

from __future__ import annotations

import sys
import time

from topotrain.testbed.compare import MiB, run_case, run_ddp, single_switch
from topotrain.testbed.netns import Emulation, leftovers, netns_available
from topotrain.testbed.runs import fresh_tag


def _line(what: str, value: float, lo: float, hi: float) -> bool:
    inside = lo <= value <= hi
    print(f"{what}: {value:.3f} (expected in [{lo:.3g}, {hi:.3g}]: {'yes' if inside else 'NO'})")
    return inside


def main() -> int:
    ok, why = netns_available()
    if not ok:
        print(f"skipped: {why}")
        return 0
    t0 = time.perf_counter()
    inside = []
    tags = [fresh_tag() for _ in range(3)]
    with Emulation(single_switch(2), tag=tags[0]) as emu:
        rate = emu.measure_rate(0, 1, 1_000_000)
    inside.append(_line("link rate h0->h1 / shaped rate (25 MB/s)", rate / 25e6, 0.6, 1.4))
    rows = run_case(single_switch(4), ["ring"], [2 * MiB], scale=1 / 500, repeats=2, timeout_s=60,
                    emulation_options={"tag": tags[1]})
    row = next(r for r in rows if r.size_bytes == 2 * MiB)
    inside.append(_line("ring 2 MiB on single-switch-4: measured / flow", row.measured_s / row.flow_s, 0.5, 2.0))
    inside.append(_line("ring 2 MiB on single-switch-4: measured / flow-eager", row.measured_s / row.eager_s,
                        0.5, 2.0))
    ddp = run_ddp(single_switch(4), ["ring"], steps=2, width=64, batch=16, timeout_s=120,
                  emulation_options={"tag": tags[2]})
    ours = next(d for d in ddp if d.algorithm == "ring")
    inside.append(_line("DDP step (ring hook, MLP 64 wide) on single-switch-4: measured / flow-eager",
                        ours.step_s / ours.eager_s, 1 / 3, 3.0))
    left = [n for t in tags for n in leftovers(t)]
    print(f"inside the expected band: {sum(inside)} of {len(inside)}; leftovers of this run: {len(left)}; "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
