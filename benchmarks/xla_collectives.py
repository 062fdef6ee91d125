"""Intra-server collectives against XLA's measured H100 table (docs/validation.md §11, issue 34 part 4).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/xla_collectives.py [--json]`` (well under a minute).

Every row of ``src/topotrain/validate/data/xla_collectives_sm90.csv`` (all-reduce, all-gather, reduce-scatter,
all-to-all; F32; 1 KiB–2 GiB; groups of 8, 4 and 2 GPUs of one H100 SXM host) is timed on the built-in
``dgx-h100`` server (8 H100 SXM, NVLink 4 at 450 GB/s per direction into one NVSwitch node) through
``topotrain.api.time_collective`` — the path of ``topotrain collective`` — with the size as nccl-tests and XLA
both count it (the larger buffer per device), on the group's GPUs (``gpu0..gpu{g-1}``; XLA's other groups run
at the same time on GPUs of their own, and on a non-blocking NVSwitch they share no link with this one). Four
variants: the analytical and the flow network models, each with ``--algo auto`` and with NCCL's intra-server
algorithm named (``ring``; ``direct`` for all-to-all, NCCL's grouped sends to every peer). Error =
(predicted − measured) / measured; negative is predicted too fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from topotrain.api import load_cluster, time_collective
from topotrain.validate.xla_collectives import OPS, REGIMES, ErrorSummary, by_group, load_rows, relative_errors

NETWORKS = ("analytical", "flow")
#: NCCL's algorithm on one NVSwitch server: ring (NVLS for all-reduce is not modelled), all-to-all as sends.
NCCL_ALGO = {"allreduce": "ring", "allgather": "ring", "reduce-scatter": "ring", "all-to-all": "direct"}
VARIANTS = tuple((net, algo) for net in NETWORKS for algo in ("auto", "nccl"))


def predict(network: str, algo: str) -> tuple[list[float], list[str]]:
    """Predicted time and algorithm of every table row with ``network`` and ``algo`` (``auto`` or ``nccl``)."""
    cluster = load_cluster({"server": "dgx-h100", "servers": 1})
    gpus = cluster.topology.gpus
    times: list[float] = []
    names: list[str] = []
    for r in load_rows():
        name = "auto" if algo == "auto" else NCCL_ALGO[r.op]
        rep = time_collective(cluster, r.op, name, r.size_bytes, network, ranks=list(gpus[:r.group_size]))
        times.append(rep.time_s)
        names.append(rep.algorithm)
    return times, names


def _cell(s: ErrorSummary) -> str:
    return f"{100 * s.median_abs:6.1f} {100 * s.worst_abs:6.1f} {100 * s.median_signed:+7.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = ap.parse_args()
    rows = load_rows()
    t0 = time.perf_counter()
    results = {v: predict(*v) for v in VARIANTS}
    elapsed = time.perf_counter() - t0
    errors = {v: relative_errors(rows, results[v][0]) for v in VARIANTS}
    if args.json:
        out = {f"{net}/{algo}": {key: {"/".join(map(str, k)): vars(s) for k, s in by_group(rows, errors[(net, algo)],
                                                                                      key).items()}
                                 for key in ("op", "regime", "all-regime")}
               for net, algo in VARIANTS}
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    head = "  ".join(f"{net[:5]}/{algo:<4}  med% worst%  sign%" for net, algo in VARIANTS)
    print(f"# {len(rows)} rows of XLA's sm_90 collective table vs topotrain on dgx-h100 "
          f"({elapsed:.1f} s to time {len(rows) * len(VARIANTS)} collectives)")
    print("# |error| median and worst, median signed error (%); nccl = ring (all-to-all: direct)")
    for key, title in (("op", "op, group size"), ("regime", "op, size regime"), ("all-regime", "size regime")):
        print(f"\n{title:<24}  {head}")
        summaries = {v: by_group(rows, errors[v], key) for v in VARIANTS}
        order = list(summaries[VARIANTS[0]])
        if key != "op":
            order.sort(key=lambda k: ((OPS.index(str(k[0])),) if key == "regime" else ()) + (REGIMES.index(str(k[-1])),))
        for k in order:
            label = " ".join(map(str, k))
            print(f"{label:<24}  " + "  ".join(_cell(summaries[v][k]) for v in VARIANTS))
    every = {v: by_group(rows, errors[v], "all-regime") for v in VARIANTS}
    print("\nall rows" + " " * 17 + "  ".join(_cell(_all(errors[v])) for v in VARIANTS))
    del every
    auto_algos = sorted(set(results[("analytical", "auto")][1]))
    print(f"# algorithms auto chose (analytical): {', '.join(auto_algos)}")


def _all(errors: list[float]) -> ErrorSummary:
    from topotrain.validate.xla_collectives import summarize  # noqa: PLC0415 - benchmark-only helper

    return summarize(errors)


if __name__ == "__main__":
    main()
