"""Speed and agreement of topotrain's flow model beside ns-3 and SimGrid on 128 GPUs, side by side in one run.

Run: ``.venv/bin/python benchmarks/references.py [--sizes 1MiB,16MiB]``. One line per case (k=8 fat tree,
128 single-GPU hosts at 100 Gb/s): each simulator's wall time for its own run (start-up and library loading
left out, printed at the end), the speed-up of flow over each reference, and flow's error against each.
Needs ns-3 (``pip install ns3``) and SimGrid (``apt-get install -y python3-simgrid``).
"""

from __future__ import annotations

import argparse

from topotrain.util.units import format_size, parse_size
from topotrain.validate.matrix import build_cases, run_matrix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1MiB,16MiB")
    ap.add_argument("--traffic", default="ring,halving-doubling,all-to-all")
    args = ap.parse_args()
    sizes = [int(parse_size(s, "--sizes")) for s in args.sizes.split(",")]
    cases, _ = build_cases(["fat-tree-k8"], args.traffic.split(","), sizes)
    run = run_matrix(cases, ns3_max_bytes=float("inf"), ns3_modes=("tcp",))
    print(f"{'case':<40} {'flow s':>8} {'ns-3 s':>8} {'SimGrid s':>9} {'ns-3/flow':>9} {'SG/flow':>8} "
          f"{'err ns-3':>9} {'err SG':>8}")
    for r in run.rows:
        c = r.case
        w = r.wall_s
        name = f"{c.topology} {c.traffic} {format_size(c.size_bytes)} ({c.ranks} GPUs)"
        print(f"{name:<40} {w['flow']:8.3f} {w.get('ns3', float('nan')):8.2f} {w.get('simgrid', float('nan')):9.2f} "
              f"{w.get('ns3', float('nan')) / w['flow']:8.0f}x {w.get('simgrid', float('nan')) / w['flow']:7.0f}x "
              f"{100 * r.err('flow', 'ns3'):+8.1f}% {100 * r.err('flow', 'simgrid'):+7.2f}%")
    print("references' elapsed time for all cases (s, start-up included): "
          + ", ".join(f"{k} {v:.1f}" for k, v in run.elapsed_s.items()))
    for m in run.missing:
        print(f"not run (not installed): {m}")


if __name__ == "__main__":
    main()
