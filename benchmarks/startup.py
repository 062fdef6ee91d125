"""Start-up cost of small cases, as a user scripting thousands of them pays it: whole processes, timed.

Run: ``.venv/bin/python benchmarks/startup.py [--runs N] [--compare OTHER/src]`` (default 5; the minimum of
the runs is shown, the machine's other load only ever adds time, with the process's user+sys CPU time, which
load changes less; ``--compare`` times another checkout's sources beside these, turn about). Rows (issue 40,
"Speed at the frontier": a 16-GPU collective under 0.3 s, a 1,024-GPU collective on a 1,024-router ring under
1 s):

* ``import topotrain.cli.collective`` alone: the typer verb module (what ``topotrain collective --help`` and any
  command line the plain path leaves pay before reading a file; a plain ``collective`` command line imports
  ``topotrain.cli.collective_run`` instead, without typer, click, rich or pydantic: cli/collective_args.py);
* ``topotrain collective <16 GPUs> --json``: two nvswitch-8 servers (8 GPUs, 8 HDR NICs each) on one switch;
* ``topotrain collective --json``: the built-in example cluster (16 EFLOPS servers, 128 GPUs, BiGraph);
* ``topotrain collective <1,024 GPUs on a ring of 1,024 routers> --json``: single-GPU servers, 100 GbE, 1 µs
  links (routes of up to 512 hops, in closed form: topology/ring_routes.py; ``auto`` skips tree and
  halving-doubling by their link floors, network/floor.py).

Small cases run the flow kernels interpreted (network/kernel_choice.py: numba is not loaded).

Each process is ``python -c "...topotrain.cli.main()"`` with the command line set, the flow network model and
the automatic algorithm choice (the command's defaults); the cluster files are written first, not timed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: A 16-GPU cluster: two nvswitch-8 servers on one switch.
CLUSTER_16 = """cluster:
  name: nvswitch-2x8
  server: nvswitch-8
  servers: 2
  network: {topology: single_switch, link: ib-hdr-200g, latency: 1us}
"""
#: 1,024 single-GPU servers on a ring of 1,024 routers.
RING_1024 = """cluster:
  name: ring-1024
  server: single-gpu
  servers: 1024
  network: {topology: ring, link: eth-100g, latency: 1us}
"""

RUN_CLI = "import sys; from topotrain.cli import main; sys.argv = ['topotrain', *sys.argv[1:]]; main()"


def timed(argv: list[str], runs: int, srcs: list[str]) -> list[tuple[float, float]]:
    """(least wall time, least user+sys CPU time), in seconds, of ``runs`` runs of the process ``argv`` (each must
    succeed) with each of ``srcs`` first on ``PYTHONPATH``, the sources taking turns (so that a change of the
    machine's load falls on all of them alike), after one run each that is not counted (it writes the byte-code
    and numba's kernel caches a user's second run finds)."""
    best = [(float("inf"), float("inf"))] * len(srcs)
    env0 = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for r in range(runs + 1):
        for i, src in enumerate(srcs):
            env = {**env0, "PYTHONPATH": src + os.pathsep + env0.get("PYTHONPATH", "")}
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, cwd=Path(src).parent)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode:
                raise SystemExit(f"{argv} failed ({proc.returncode}) with {src}")
            if r:
                best[i] = (min(best[i][0], wall), min(best[i][1], usage.ru_utime + usage.ru_stime))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each row; the least time is shown")
    ap.add_argument("--compare", metavar="SRC", action="append", default=[],
                    help="another checkout's src folder, timed beside this one (e.g. a copy of an older commit)")
    args = ap.parse_args()
    srcs = [str(Path(__file__).resolve().parent.parent / "src"), *map(str, args.compare)]
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        c16, ring = Path(tmp) / "c16.yaml", Path(tmp) / "ring1024.yaml"
        c16.write_text(CLUSTER_16)
        ring.write_text(RING_1024)
        rows = [("python -c pass (the interpreter alone)", [py, "-c", "pass"]),
                ("import topotrain.cli.collective", [py, "-c", "import topotrain.cli.collective"]),
                ("topotrain collective <16 GPUs, 2 x nvswitch-8> --json", [py, "-c", RUN_CLI, "collective",
                                                                           str(c16), "--json"]),
                ("topotrain collective --json (built-in example, 128 GPUs)", [py, "-c", RUN_CLI, "collective",
                                                                             "--json"]),
                ("topotrain collective <1,024 GPUs, ring of 1,024 routers> --json",
                 [py, "-c", RUN_CLI, "collective", str(ring), "--json"])]
        print(f"the least of {args.runs} runs (after one not counted): wall s / user+sys CPU s; load: the 1-minute "
              f"load average before the row; columns: " + ", ".join(srcs))
        print(f"{'case':<66} {'load':>5}" + "".join(f" {'src ' + str(i) + ' wall/cpu':>17}" for i in range(len(srcs))))
        for label, argv in rows:
            load = os.getloadavg()[0]
            cells = "".join(f" {w:>8.3f}/{c:<8.3f}" for w, c in timed(argv, args.runs, srcs))
            print(f"{label:<66} {load:>5.1f}" + cells, flush=True)


if __name__ == "__main__":
    main()
