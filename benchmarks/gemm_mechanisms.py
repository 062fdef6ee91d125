"""The published validation under the GEMM mechanisms of issue 34 (docs/validation.md §8, "From the kernel
table to the training step"): each variant replaces a per-architecture ceiling fitted to training rows by a
kernel- or hardware-level measurement, or adds one mechanism between a GEMM alone and the same GEMM inside a
training step.

Run: ``.venv/bin/python benchmarks/gemm_mechanisms.py [--network analytical|flow] [--only NAME,...]``
(about 25 s per variant on the analytical network). Prints, per variant, the validation subset's median and
worst ``|error|``, the calibration subset's, and the mean signed error of the rows of at least 100B
parameters, then every row whose error moved against the first variant. Nothing here changes a default:
the variants are laid over the rows as ``compute.params`` (and, for the A100 ceiling, as the catalog GPU's
own ``compute_efficiency``) for the run only.

Variants:

* ``ceiling``: the rows as shipped (the default).
* ``table``: ``gemm_model: table`` with no cap (``gemm_mamf_fraction: 1``): XLA's H100 kernel table alone.
* ``table+mamf``: the table model capped at the GPU's Maximum Achievable Matmul FLOPS (H100 0.803).
* ``table+mamf+a100mamf``: and the A100's ceiling (no tensor-core table: the ``ceiling`` model) set to its
  own MAMF, 0.869, in place of the 0.71 fitted on LLM Foundry's rows: no GEMM ceiling fitted to training rows.
* ``...+fsdpNN``: and ``comm_sm_count: NN`` on the FSDP rows only (LLM Foundry: an all-gather or
  reduce-scatter runs beside every layer's compute), 20 (DeepSeek-V3's SMs for communication) or 24 (the
  blocks of an FSDP all-gather beside a GEMM on an H100).
* ``...+mcore16``: and ``comm_sm_count: 16`` on the Megatron-Core rows (Transformer Engine's userbuffers
  default for its ``pipeline`` and ``bulk`` overlap methods; the data-parallel NCCL kernels not counted).
* ``...+a100he``: the A100's ceiling at H. He's cuBLAS 8192³ ``randn`` measurement, 258/312 = 0.827, in place
  of the MAMF (a single large square shape rather than the best shape the MAMF search found; a kernel
  measurement, no training row): how far a library ~5 % below the MAMF moves the A100 rows.
* ``h100:...``: the H100 rows only: the table model capped at the MAMF with the SMs held for communication,
  in place of Hopper's fitted 0.62 ceiling; the A100 keeps its fitted 0.71 ceiling (which already absorbs
  whatever its FSDP rows lose to communication, so its FSDP rows hold no SMs).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from topotrain.hardware import gpus as catalog_gpus
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate
from topotrain.validate.published import Case, cases, predicted, with_compute_params

A100_MAMF = 271.2 / 312.0  # docs/sources.md §11
#: cuBLAS on an A100, 8192³ bf16 on ``randn`` operands (H. He, 2024; docs/sources.md §11): one large square
#: shape at the random-data clock, below the MAMF's best shape
A100_HE_RANDN = 258.0 / 312.0

#: name → (compute.params laid over every row, compute.params laid over the FSDP rows, A100 ceiling or None)
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], float | None]] = {
    "ceiling": ({}, {}, None),
    "table": ({"gemm_model": "table", "gemm_mamf_fraction": 1.0}, {}, None),
    "table+mamf": ({"gemm_model": "table"}, {}, None),
    "table+mamf+a100mamf": ({"gemm_model": "table"}, {}, A100_MAMF),
    "table+mamf+a100mamf+fsdp20": ({"gemm_model": "table"}, {"comm_sm_count": 20}, A100_MAMF),
    "table+mamf+a100mamf+fsdp24": ({"gemm_model": "table"}, {"comm_sm_count": 24}, A100_MAMF),
    "table+mamf+a100mamf+fsdp24+mcore16": ({"gemm_model": "table"}, {"comm_sm_count": 24}, A100_MAMF),
    "h100:table+mamf+fsdp24+mcore16": ({"gemm_model": "table"}, {"comm_sm_count": 24}, None),
    "ceiling+mem": ({"memory_model": "measured"}, {}, None),
    "table+mamf+transfer": ({"gemm_model": "table", "gemm_transfer": True}, {}, A100_MAMF),
    "table+mamf+transfer+mem": ({"gemm_model": "table", "gemm_transfer": True, "memory_model": "measured"}, {},
                                A100_MAMF),
    "table+mamf+transfer+mem+fsdp24+mcore16": ({"gemm_model": "table", "gemm_transfer": True,
                                                "memory_model": "measured"}, {"comm_sm_count": 24}, A100_MAMF),
    "table+mamf+a100mamf+mem": ({"gemm_model": "table", "memory_model": "measured"}, {}, A100_MAMF),
    "table+mamf+a100mamf+mem+fsdp24+mcore16": ({"gemm_model": "table", "memory_model": "measured"},
                                                {"comm_sm_count": 24}, A100_MAMF),
    "h100:table+mamf+fsdp24+mcore16+mem": ({"gemm_model": "table", "memory_model": "measured"},
                                           {"comm_sm_count": 24}, None),
    "table+mamf+a100he": ({"gemm_model": "table"}, {}, A100_HE_RANDN),
    "table+mamf+a100he+mem+fsdp24+mcore16": ({"gemm_model": "table", "memory_model": "measured"},
                                             {"comm_sm_count": 24}, A100_HE_RANDN),
}
#: variants that also hold ``comm_sm_count`` SMs on the Megatron-Core rows (Transformer Engine's userbuffers
#: overlap kernels: ``num_sm`` 16 for its ``pipeline`` and ``bulk`` methods, with ``set_sm_margin``)
MCORE_SMS: dict[str, int] = {"table+mamf+a100mamf+fsdp24+mcore16": 16, "h100:table+mamf+fsdp24+mcore16": 16,
                             "table+mamf+a100mamf+mem+fsdp24+mcore16": 16,
                             "table+mamf+transfer+mem+fsdp24+mcore16": 16, "h100:table+mamf+fsdp24+mcore16+mem": 16,
                             "table+mamf+a100he+mem+fsdp24+mcore16": 16}


def _is_fsdp(case: Case) -> bool:
    return "FSDP" in case.name


def _with_a100_ceiling(ceiling: float | None) -> dict[str, catalog_gpus.GPUSpec]:
    """Lay ``ceiling`` over the A100s' ``gemm_max_efficiency`` in the catalog; returns what it replaced."""
    saved = {name: catalog_gpus.GPUS[name] for name in ("a100-40gb", "a100-80gb")}
    if ceiling is not None:
        for name, g in saved.items():
            eff = {**g.compute_efficiency, "gemm_max_efficiency": ceiling}
            catalog_gpus.GPUS[name] = replace(g, compute_efficiency=eff)
    return saved


def run_variant(network: str, every: Mapping[str, Any], fsdp: Mapping[str, Any],
                a100_ceiling: float | None, mcore_sms: int = 0) -> dict[str, tuple[float, str, float]]:
    """Each row's signed error, subset and parameter count under one variant."""
    saved = _with_a100_ceiling(a100_ceiling)
    try:
        out = {}
        for c in cases():
            params = {**every, **(fsdp if _is_fsdp(c) and (a100_ceiling is not None or "H100" in c.name) else {})}
            if mcore_sms and c.name.startswith("Megatron-Core"):
                params["comm_sm_count"] = mcore_sms
            sc = scenario_from_dict({"network": network, **with_compute_params(c.scenario, params)})
            r = simulate(sc)
            out[c.name] = (predicted(c, r) / c.published - 1.0, c.subset, float(sc.model.param_count))
        return out
    finally:
        catalog_gpus.GPUS.update(saved)


def summary(errors: Mapping[str, tuple[float, str, float]]) -> str:
    val = [abs(e) for e, subset, _ in errors.values() if subset == "validation"]
    cal = [abs(e) for e, subset, _ in errors.values() if subset != "validation"]
    large = [e for e, _, p in errors.values() if p >= 100e9]
    return (f"validation {100 * statistics.median(val):.1f}% / {100 * max(val):.1f}%   "
            f"calibration {100 * statistics.median(cal):.1f}% / {100 * max(cal):.1f}%   "
            f">=100B mean signed {100 * sum(large) / len(large):+.1f}%")


def main() -> None:
    network = sys.argv[sys.argv.index("--network") + 1] if "--network" in sys.argv else "analytical"
    names = list(VARIANTS)
    if "--only" in sys.argv:
        names = sys.argv[sys.argv.index("--only") + 1].split(",")
    results = {}
    for name in names:
        results[name] = run_variant(network, *VARIANTS[name], MCORE_SMS.get(name, 0))
        print(f"{name:30s} {summary(results[name])}", flush=True)
    first = results[names[0]]
    for name in names[1:]:
        moved = [(row, first[row][0], e) for row, (e, _, _) in results[name].items()
                 if abs(e - first[row][0]) >= 0.0005]
        print(f"\n{name}: {len(moved)} rows moved against {names[0]}")
        for row, before, after in moved:
            print(f"  {row:44s} {100 * before:+6.1f}% -> {100 * after:+6.1f}%")


if __name__ == "__main__":
    main()
