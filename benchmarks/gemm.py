"""GEMM time by shape against measured kernels held out of the fit.

Run: ``.venv/bin/python benchmarks/gemm.py [--folds 4] [--seed 34]`` (about a minute). For every shipped
kernel table (``src/topotrain/compute/data/``: XLA's H100 bf16/tf32 matmul table, NeuSight's FP32 linear and
bmm kernels on A100 PCIe, V100 PCIe and H100; docs/sources.md §10) it prints, one figure per line:

* the wave model's parameters fitted on all of the table's rows (:func:`topotrain.compute.gemm_wave.fit_wave`);
* k-fold cross-validation over shapes (each row predicted by the models fitted on the other folds): median,
  90th percentile and worst ``|predicted/measured − 1|`` per kind of kernel and for all, for the ``wave``
  model and the ``table`` model (the wave model corrected by the measured ratio at neighbouring shapes);
* the same for the roofline's calibrated ``ceiling`` model (no fit on the table: the training-row ceiling
  and the hand-set tiles), where the device is a catalog GPU;
* the rows measured faster than the same shape at a shorter ``k`` (a library algorithm change) and the worst
  error without them.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from topotrain.compute.gemm_tables import GemmTable, load_tables
from topotrain.compute.gemm_wave import (
    KernelErrors,
    cross_validated_times,
    error_summary,
    faster_than_shorter_k,
    fit_wave,
)
from topotrain.compute.roofline import gemm_efficiency
from topotrain.hardware.gpus import get_gpu


def ceiling_times(table: GemmTable) -> np.ndarray | None:
    """The roofline's default (``gemm_model: ceiling``) time of each row on the table's catalog GPU."""
    if table.device.gpu is None:
        return None
    g = get_gpu(table.device.gpu)
    out = np.empty(len(table))
    for i in range(len(table)):
        b, m, n, k = (int(x[i]) for x in (table.b, table.m, table.n, table.k))
        eff = gemm_efficiency(b, m, n, k, g, table.dtype)
        out[i] = 2.0 * b * m * n * k / (eff * g.peak(table.dtype))
    return out


def line(e: KernelErrors, label: str = "held-out") -> list[str]:
    tag = f"{e.device} {e.dtype} {e.kind} {e.model}"
    b, m, n, k = e.worst_shape
    return [f"{tag}: {label} rows {e.rows}",
            f"{tag}: {label} median |error| {100 * e.median:.1f}%",
            f"{tag}: {label} p90 |error| {100 * e.p90:.1f}%",
            f"{tag}: {label} worst |error| {100 * e.worst:.1f}% (b={b} m={m} n={n} k={k})"]


def main() -> None:
    folds = int(sys.argv[sys.argv.index("--folds") + 1]) if "--folds" in sys.argv else 4
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 34
    t0 = time.perf_counter()
    for table in load_tables():
        name = f"{table.device.name} {table.dtype}"
        p = fit_wave(table)
        print(f"{name}: rows {len(table)} ({', '.join(table.kinds)})")
        for (tm, tn), eff in zip(p.tiles, p.tile_efficiency, strict=True):
            print(f"{name}: fitted efficiency of a {tm}x{tn} tile {eff:.3f}")
        print(f"{name}: fitted k_prologue {p.k_prologue:.0f}")
        print(f"{name}: fitted fixed latency {p.fixed_latency_s * 1e6:.2f} us")
        print(f"{name}: fitted memory efficiency {p.memory_efficiency:.3f}")
        print(f"{name}: fitted split_k_min {p.split_k_min:.0f}")
        print(f"{name}: fitted split-K latency {p.split_k_latency_s * 1e6:.2f} us")
        predicted = cross_validated_times(table, folds, seed)
        ceiling = ceiling_times(table)
        if ceiling is not None:
            predicted["ceiling"] = ceiling
        kinds = np.asarray(table.kind)
        for model, pred in predicted.items():
            label = "held-out" if model != "ceiling" else "unfitted"
            for kind in (*table.kinds, "all"):
                mask = None if kind == "all" else kinds == kind
                print("\n".join(line(error_summary(table, pred, model, mask, kind), label)))
        odd = faster_than_shorter_k(table)
        print(f"{name}: rows measured faster than at a shorter k {int(odd.sum())}")
        if odd.any():
            for model in ("wave", "table"):
                e = error_summary(table, predicted[model], model, ~odd, "all")
                b, m, n, k = e.worst_shape
                print(f"{name} all {model}: held-out worst |error| without them {100 * e.worst:.1f}% "
                      f"(b={b} m={m} n={n} k={k})")
    print(f"wall {time.perf_counter() - t0:.1f} s ({folds}-fold cross-validation over shapes, seed {seed})")


if __name__ == "__main__":
    main()
