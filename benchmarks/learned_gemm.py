"""The learned cross-GPU GEMM predictor against the wave model and the roofline, leave one GPU out.

Run: ``.venv/bin/python benchmarks/learned_gemm.py`` (under a minute on two cores). For each of the eight GPUs
of NeuSight's FP32 kernel tables (``src/topotrain/compute/data/gemm_neusight*_fp32.csv``; docs/sources.md §10)
it prints, per kind of kernel (``linear``, ``bmm``, ``all``), the median and worst ``|predicted/measured − 1|``
of three predictions that never saw that GPU's kernels:

* ``learned``: :mod:`topotrain.compute.learned` trained on the seven other GPUs' kernels;
* ``wave``: the wave model (:mod:`topotrain.compute.gemm_wave`) with each parameter the median of its fits on
  the seven others (:func:`topotrain.compute.learned.transferred_wave`);
* ``roofline``: topotrain's default compute model (``gemm_model: ceiling``) on the GPU's datasheet figures
  (the catalog's fitted ceilings where the device is a catalog GPU, the defaults otherwise):
  :func:`topotrain.compute.check.roofline_kernel_times`.

First, per GPU, its board power per SM and the median achieved fraction of the FP32 peak of its largest
GEMMs (the mechanism of the learned model's one device feature). Then the band: the 5th-95th percentile of
the pooled held-out log residuals per kind, and the share of each held-out GPU's kernels inside the band
computed from the other GPUs' residuals only. Last, a cross-dtype
check that is not used by the model: XLA's H100 bf16 and tf32 tables predicted by the FP32 model trained on
the seven non-H100 GPUs, at the tensor-core peak.

``--ablation`` adds the learned model's held-out median per GPU with other device features
(:data:`topotrain.compute.learned.VARIANTS`: none, and power per SM with the SM count and per-SM peak).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from topotrain.compute.check import roofline_kernel_times
from topotrain.compute.gemm_tables import load_crossgpu_tables, load_tables
from topotrain.compute.learned import VARIANTS, bands_from, fit_learned, leave_one_gpu_out


def errors(pred: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    e = np.abs(pred / measured - 1.0)
    return float(np.median(e)), float(e.max())


def main() -> None:
    t0 = time.perf_counter()
    for t in load_crossgpu_tables():
        big = t.flops > 1e11
        util = t.flops[big] / t.time_s[big] / t.device.peak(t.dtype)
        print(f"{t.device.name}: {t.device.tdp_w:.0f} W over {t.device.sm_count} SMs = "
              f"{t.device.tdp_w / t.device.sm_count:.2f} W/SM; GEMMs > 100 GFLOP ({int(big.sum())}): median "
              f"{np.median(util):.3f} of the FP32 peak")
    held = leave_one_gpu_out()
    print(f"{'held-out GPU':<16} {'kind':<7} {'rows':>5}  {'learned med/worst':>18}  {'wave med/worst':>15}  "
          f"{'roofline med/worst':>18}")
    wins = 0
    for h in held:
        t = h.table
        roof = roofline_kernel_times(t)
        kinds = np.asarray(t.kind)
        for kind in (*t.kinds, "all"):
            sel = np.ones(len(t), dtype=bool) if kind == "all" else kinds == kind
            cells = [errors(p[sel], t.time_s[sel]) for p in (h.learned_s, h.wave_s, roof)]
            print(f"{t.device.name:<16} {kind:<7} {int(sel.sum()):>5}  "
                  + "  ".join(f"{100 * a:>7.1f}% /{100 * w:>6.0f}%" for a, w in cells))
            if kind == "all":
                wins += cells[0][0] < cells[2][0]
    print(f"learned median below the roofline's on {wins} of {len(held)} held-out GPUs")
    bands = bands_from(held)
    for kind, band in bands.items():
        print(f"band {kind}: x{band.low:.3f} .. x{band.high:.3f} (nominal {100 * band.coverage:.0f}%)")
    for i, h in enumerate(held):
        others = bands_from([o for j, o in enumerate(held) if j != i])["all"]
        r = h.table.time_s / h.learned_s
        inside = float(np.mean((r >= others.low) & (r <= others.high)))
        print(f"band coverage on {h.table.device.name} (band from the other GPUs' residuals): {100 * inside:.1f}%")
    non_h100 = [t for t in load_crossgpu_tables() if t.device.name != "h100-sxm5-80gb"]
    model = fit_learned(non_h100)
    for t in load_tables():
        if t.dtype in ("bf16", "tf32"):
            pred = model.times_s(t.device, t.dtype, t.b, t.m, t.n, t.k, np.asarray(t.kind) == "bmm")
            med, worst = errors(pred, t.time_s)
            roof_med, roof_worst = errors(roofline_kernel_times(t), t.time_s)
            print(f"cross-dtype (not used): XLA {t.device.name} {t.dtype} by the FP32 model of 7 other GPUs: "
                  f"median {100 * med:.1f}% worst {100 * worst:.0f}%; roofline {100 * roof_med:.1f}% "
                  f"/ {100 * roof_worst:.0f}%")
    if "--ablation" in sys.argv:
        for variant in VARIANTS:
            runs = leave_one_gpu_out(wave=False, variant=variant)
            cells = [f"{h.table.device.name} {100 * errors(h.learned_s, h.table.time_s)[0]:.1f}%" for h in runs]
            print(f"ablation, device features {variant}: held-out median " + ", ".join(cells))
    print(f"wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
