"""Fit the five calibrated constants on published training throughputs, one search each.

Run: ``.venv/bin/python benchmarks/calibrate.py`` (about 40 s). Every fit minimizes the sum of squared log
errors ``ln(predicted/published)`` by golden-section search (each row's time falls monotonically as the
constant rises, so the loss is unimodal); the efficiencies are used rounded to 0.01, the rate to 0.1:

* ``conv_max_efficiency`` (all GPUs, :class:`topotrain.compute.roofline.ComputeParams`) on the two
  single-GPU ResNet-50 rows of ``benchmarks/validation.py`` (V100-16GB 1,200 img/s and A100-80GB
  2,470 img/s, DeepLearningExamples PyTorch 21.03; docs/sources.md 1).
* Hopper's ``gemm_max_efficiency`` (``_HOPPER_EFF`` in ``src/topotrain/hardware/gpus.py``) on the five
  Megatron-Core r0.8.0 H100 rows (:data:`validation.MEGATRON_CORE_H100`, docs/sources.md 3b).
* Ampere's ``gemm_max_efficiency`` (``_AMPERE_EFF`` in ``src/topotrain/hardware/gpus.py``) on LLM Foundry's
  four 1B–13B MPT rows on one DGX A100 without recomputation (docs/sources.md 7a), their attention costed
  as the Triton kernel they ran (``TRITON_ATTENTION_A100`` in ``validation.py``).
* the host input pipeline's ``samples_per_s_per_worker_ghz``
  (:data:`topotrain.training.host_input.SAMPLES_PER_S_PER_WORKER_GHZ`) on ResNet-50 AMP on eight V100-32GB
  in a DGX-1 (8,056 img/s, same README), after the convolution ceiling (the rate only matters where the
  DataLoader workers, not the GPUs, bound the rate).
* the DGX-1 V100's ``tensor_clock_fraction`` (``_V100_SXM2_EFF`` in ``src/topotrain/hardware/gpus.py``: the
  fraction of its 1,530 MHz boost that a 300 W V100 SXM2 holds through GEMM-bound training) on the declared
  calibration *ratio* :data:`validation.SKU_CLOCK_RATIO`: NVIDIA's PyTorch BERT 19.07 per-GPU throughput on a
  DGX-2H (V100 SXM3 at 450 W, taken to hold its rated 2.1 PFLOPS) over that on a DGX-1 V100 32GB, same code
  and micro-batch (docs/sources.md 2f). The loss is the squared log error of the ratio, so the 2019 code's
  own costs, which the model does not describe, cancel.

The row sets are the declared calibration subset, :data:`validation.CALIBRATION_SUBSET`; this script
refuses to fit on any other row. The validation subset (the DGX-1 16GB and DGX A100 ResNet-50 rows and
every BERT, Megatron SC'21 and LLM Foundry H100 row) checks the constants without having been used to fit
them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate
from topotrain.validate.published import (
    CALIBRATION_RATIOS,
    SKU_CLOCK_RATIO,
    Case,
    RatioCase,
    calibration_cases,
    predicted,
    ratio_predicted,
)

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


#: the host input pipeline's constant (a key of ``plan.host_input``, not of ``compute.params``)
HOST_RATE = "samples_per_s_per_worker_ghz"


def errors(rows: list[Case], key: str, value: float) -> list[float]:
    """Log errors ln(predicted / published) of ``rows`` with ``compute.params[key] = value`` (or, for
    :data:`HOST_RATE`, ``plan.host_input[key] = value``)."""
    out = []
    for c in rows:
        sc: dict[str, Any] = {**c.scenario, "network": "analytical"}
        if key == HOST_RATE:
            plan = dict(sc.get("plan", {}))
            plan["host_input"] = {**plan["host_input"], key: value}
            sc["plan"] = plan
        else:  # laid over the row's own compute parameters (e.g. the Triton attention of the A100 rows)
            own = dict(sc.get("compute", {}).get("params", {}))
            sc["compute"] = {"params": {**own, key: value}}
        out.append(math.log(predicted(c, simulate(scenario_from_dict(sc))) / c.published))
    return out


def fit(rows: list[Case], key: str, lo: float, hi: float) -> float:
    """The value of ``key`` in [lo, hi] minimizing the sum of squared log errors of ``rows`` (rows of the
    calibration subset only)."""
    outside = [c.name for c in rows if c.subset != "calibration"]
    if outside:
        raise SystemExit(f"error: refusing to fit on validation rows {outside}: "
                         "add them to validation.CALIBRATION_SUBSET first, or fit on others")
    return golden_section(lambda v: sum(e * e for e in errors(rows, key, v)), lo, hi)


def fit_ratio(rc: RatioCase, key: str, lo: float, hi: float) -> float:
    """The value of ``key`` in [lo, hi] (laid over the denominator's ``compute.params``) minimizing the
    squared log error of the declared calibration ratio ``rc``."""
    if rc not in CALIBRATION_RATIOS:
        raise SystemExit(f"error: refusing to fit on {rc.name!r}: not in validation.CALIBRATION_RATIOS")
    return golden_section(lambda v: math.log(ratio_predicted(rc, {key: v}) / rc.published) ** 2, lo, hi)


def golden_section(loss: Callable[[float], float], lo: float, hi: float, tol: float = 1e-3) -> float:
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = loss(c), loss(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = loss(d)
    return (a + b) / 2.0


def single_gpu_resnet50() -> list[Case]:
    return [c for c in calibration_cases() if c.name.startswith("ResNet-50 1x")]


def megatron_core_h100() -> list[Case]:
    return [c for c in calibration_cases() if c.name.startswith("Megatron-Core")]


def host_input_resnet50() -> list[Case]:
    return [c for c in calibration_cases() if c.name.startswith("ResNet-50 8x")]


def foundry_a100() -> list[Case]:
    return [c for c in calibration_cases() if c.name.endswith("8xA100 FSDP")]


def main() -> None:
    for label, rows, key, lo, hi, digits in (
            ("ResNet-50 single-GPU", single_gpu_resnet50(), "conv_max_efficiency", 0.40, 0.90, 2),
            ("Megatron-Core H100", megatron_core_h100(), "gemm_max_efficiency", 0.40, 0.90, 2),
            ("LLM Foundry A100", foundry_a100(), "gemm_max_efficiency", 0.40, 0.95, 2),
            ("ResNet-50 8-GPU DGX-1 32GB", host_input_resnet50(), HOST_RATE, 20.0, 120.0, 1)):
        t0 = time.perf_counter()
        best = fit(rows, key, lo, hi)
        print(f"{key} fitted on {len(rows)} {label} rows: {best:.4f} (wall {time.perf_counter() - t0:.1f} s)")
        used = round(best, digits)
        for c, e in zip(rows, errors(rows, key, used), strict=True):
            print(f"  {c.name:40s} {100 * (math.exp(e) - 1):+6.1f}% at {used}")
    t0 = time.perf_counter()
    key = "tensor_clock_fraction"
    best = fit_ratio(SKU_CLOCK_RATIO, key, 0.50, 1.0)
    print(f"{key} fitted on the ratio {SKU_CLOCK_RATIO.name}: {best:.4f} "
          f"(wall {time.perf_counter() - t0:.1f} s)")
    used = round(best, 2)
    pred = ratio_predicted(SKU_CLOCK_RATIO, {key: used})
    print(f"  predicted {pred:.4f}, published {SKU_CLOCK_RATIO.published:.4f}: "
          f"{100 * (pred / SKU_CLOCK_RATIO.published - 1):+.1f}% at {used}")


if __name__ == "__main__":
    main()
