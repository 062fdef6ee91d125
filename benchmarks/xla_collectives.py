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
import statistics
import sys
import time

from topotrain.api import load_cluster, time_collective
from topotrain.validate.xla_collectives import (
    OPS,
    REGIMES,
    ErrorSummary,
    XlaCollectiveRow,
    by_group,
    load_rows,
    relative_errors,
    summarize,
)

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
                                 for key in ("op", "regime", "group-regime", "all-regime")}
               for net, algo in VARIANTS}
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    head = "  ".join(f"{net[:5]}/{algo:<4}  med% worst%  sign%" for net, algo in VARIANTS)
    print(f"# {len(rows)} rows of XLA's sm_90 collective table vs topotrain on dgx-h100 "
          f"({elapsed:.1f} s to time {len(rows) * len(VARIANTS)} collectives)")
    print("# |error| median and worst, median signed error (%); nccl = ring (all-to-all: direct)")
    for key, title in (("op", "op, group size"), ("regime", "op, size regime"),
                       ("group-regime", "group size, size regime"), ("all-regime", "size regime")):
        print(f"\n{title:<24}  {head}")
        summaries = {v: by_group(rows, errors[v], key) for v in VARIANTS}
        order = list(summaries[VARIANTS[0]])
        if key != "op":
            order.sort(key=lambda k: ((OPS.index(str(k[0])),) if key == "regime" else
                                      (-int(str(k[0])),) if key == "group-regime" else ())
                       + (REGIMES.index(str(k[-1])),))
        for k in order:
            label = " ".join(map(str, k))
            print(f"{label:<24}  " + "  ".join(_cell(summaries[v][k]) for v in VARIANTS))
    print("\nall rows" + " " * 17 + "  ".join(_cell(summarize(errors[v])) for v in VARIANTS))
    auto_algos = sorted(set(results[("analytical", "auto")][1]))
    print(f"# algorithms auto chose (analytical): {', '.join(auto_algos)}")
    ceilings(rows, results[("analytical", "nccl")][0])
    per_call(rows, results[("analytical", "nccl")][0])


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw: 2(n−1)/n for all-reduce, (n−1)/n for the others."""
    return 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n


def ceilings(rows: list[XlaCollectiveRow], predicted_s: list[float]) -> None:
    """Bus bandwidth at the largest size (2 GiB), measured and predicted (analytical, NCCL's algorithm)."""
    print("\n# bus bandwidth at 2 GiB (GB/s): XLA measured / topotrain analytical nccl")
    top = max(r.size_bytes for r in rows)
    for r, p in zip(rows, predicted_s, strict=True):
        if r.size_bytes == top:
            f = busbw_factor(r.op, r.group_size) * r.size_bytes / 1e9
            print(f"{r.op:<15} {r.group_size}  {f / r.time_s:6.1f} / {f / p:6.1f}")


def per_call(rows: list[XlaCollectiveRow], predicted_s: list[float]) -> None:
    """Diagnostic, not a model: the median gap (measured − predicted) of the small rows (< 1 MiB) taken as a
    per-call time outside the network and added to every prediction; judged on the middle and large rows only
    (held out: the gap is set from the small rows alone)."""
    gap_s = statistics.median(r.time_s - p for r, p in zip(rows, predicted_s, strict=True) if r.regime == "small")
    errors = relative_errors(rows, [p + gap_s for p in predicted_s])
    print(f"\n# diagnostic: + {gap_s * 1e6:.1f} us per call (median gap of the small rows; middle/large held out)"
          "\n# analytical nccl; |error| median, worst, median signed (%)")
    for k, s in by_group(rows, errors, "all-regime").items():
        if k[0] != "small":
            print(f"{k[0]:<8} all groups  {_cell(s)}")
    for g in (8, 4, 2):
        sel = [(r, e) for r, e in zip(rows, errors, strict=True) if r.regime != "small" and r.group_size == g]
        print(f"≥ 1 MiB  group {g}     {_cell(summarize([e for _, e in sel]))}")


if __name__ == "__main__":
    main()
