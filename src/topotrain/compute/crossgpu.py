"""Cross-GPU prediction of a measured profile: Habitat's wave scaling.

Yu, Gao, Golikov & Pekhimenko, "Habitat: A Runtime-Based Computational Performance Predictor for Deep
Neural Network Training", USENIX ATC 2021, §3.2. A kernel measured at ``T_o`` on the origin GPU takes on
the destination GPU

    T_d = T_o · (BW_o/BW_d)^γ · (clk_o/clk_d)^(1−γ) · (SM_o/SM_d)^(1−γ)

with ``γ ∈ [0, 1]`` the weight of memory bandwidth (γ = 1: memory-bound, scales with the bandwidth
ratio; γ = 0: compute-bound, scales with clock × SM count). γ comes from the kernel's arithmetic intensity
``x = FLOPs / DRAM bytes`` against a roofline ridge point ``R = peak / BW``, by Habitat's mapping

    γ = 1 − 0.5·x/R        for 0 ≤ x ≤ R       (1 at x = 0, 0.5 at the ridge)
    γ = 0.5·R/x            for x > R           (→ 0 as the intensity grows)

Here each *layer* (not each kernel) is scaled, with ``x`` from the layer's counted FLOPs and HBM bytes at
the profiled batch (Habitat reads them from hardware counters) and ``R`` the ridge point of the **origin**
GPU at the table's dtype (``ridge="dest"`` uses the destination's, as Habitat's released code does).
Clocks are the catalog's boost clocks (Habitat uses base clocks); Habitat's separate rule for kernels too
small to fill one wave is not modelled.

Known limit (Habitat §3.3, which therefore uses learned MLPs for conv/linear/bmm): clock × SM does not see
per-SM throughput changes between generations — an A100 SM has 2× a V100 SM's tensor-core rate — so for
tensor-core GEMMs across generations ``compute_scaling="peak"`` replaces ``(clk_o/clk_d)·(SM_o/SM_d)`` by the
dense-peak ratio ``peak_o/peak_d`` (our extension; the default is Habitat's formula).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from topotrain.compute.profile import ProfileEntry, ProfileTable
from topotrain.hardware.gpus import GPUSpec, get_gpu
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model

RIDGES = ("origin", "dest")
COMPUTE_SCALINGS = ("habitat", "peak")


def habitat_gamma(intensity_flop_per_byte: float, ridge_flop_per_byte: float) -> float:
    """Habitat's γ from an arithmetic intensity and a ridge point (both FLOP/byte)."""
    x, r = float(intensity_flop_per_byte), float(ridge_flop_per_byte)
    if not (r > 0 and math.isfinite(r)):
        raise ConfigError(
            "gpu", f"ridge point must be positive, got {r!r}", "check the GPU's peak and bandwidth"
        )
    if x <= 0 or math.isnan(x):
        return 1.0
    if math.isinf(x):
        return 0.0
    return 1.0 - 0.5 * x / r if x <= r else 0.5 * r / x


def ridge_point(gpu: GPUSpec, dtype: str) -> float:
    """FLOP per byte at which ``gpu``'s roofline turns: ``peak(dtype) / HBM bandwidth``."""
    return gpu.peak(dtype) / gpu.hbm_bandwidth_bytes_per_s


def wave_scaling_factor(
    gamma: float, origin: GPUSpec, dest: GPUSpec, *, dtype: str = "bf16", compute_scaling: str = "habitat"
) -> float:
    """``T_d / T_o`` for a kernel of bandwidth weight ``gamma`` (Habitat's wave-scaling formula)."""
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError("gamma", f"must be in [0, 1], got {gamma!r}", "use habitat_gamma()")
    if compute_scaling not in COMPUTE_SCALINGS:
        raise ConfigError(
            "compute_scaling",
            f"unknown value {compute_scaling!r}",
            f"use one of {', '.join(COMPUTE_SCALINGS)}",
        )
    bw = origin.hbm_bandwidth_bytes_per_s / dest.hbm_bandwidth_bytes_per_s
    if compute_scaling == "peak":
        compute = origin.peak(dtype) / dest.peak(dtype)
        return bw**gamma * compute ** (1.0 - gamma)
    for g in (origin, dest):
        if g.boost_clock_hz <= 0 or g.sm_count <= 0:
            raise ConfigError(
                "gpu",
                f"{g.name} has no clock / SM count in the catalog",
                "give boost_clock and sm_count, or use compute_scaling='peak'",
            )
    clk = origin.boost_clock_hz / dest.boost_clock_hz
    sm = origin.sm_count / dest.sm_count
    return bw**gamma * clk ** (1.0 - gamma) * sm ** (1.0 - gamma)


def _counts(
    name: str, e: ProfileEntry, table: ProfileTable, model: Model | None
) -> tuple[float, float, float, float]:
    if e.has_counts:
        return (
            float(e.fwd_flops or 0.0),
            float(e.bwd_flops or 0.0),
            float(e.fwd_bytes or 0.0),
            float(e.bwd_bytes or 0.0),
        )
    if model is not None:
        for lay in model.layers:
            if lay.name == name:
                s = 1.0 / table.tp if lay.tp_split in ("column", "row") else 1.0
                b = table.batch
                return (
                    lay.fwd_flops * b * s,
                    lay.bwd_flops * b * s,
                    lay.fwd_bytes_at(b) * s,
                    lay.bwd_bytes_at(b) * s,
                )
    raise ConfigError(
        "compute.profile",
        f"layer {name!r} has no FLOP/byte counts, needed for γ",
        "re-measure with measure_profile() or pass model= to predict_profile()",
    )


def predict_profile(
    table: ProfileTable,
    target_gpu: GPUSpec | str,
    *,
    origin_gpu: GPUSpec | str | None = None,
    model: Model | None = None,
    ridge: str = "origin",
    compute_scaling: str = "habitat",
) -> ProfileTable:
    """The profile ``table`` (measured on ``origin_gpu``, by default ``table.gpu``) predicted on
    ``target_gpu`` by Habitat's wave scaling, each layer and pass with its own γ.

    Layer FLOPs/bytes come from the table's entries, else from ``model``. A table measured on a CPU cannot
    be scaled to a GPU (ConfigError)."""
    if table.measured_on_cpu and origin_gpu is None:
        raise ConfigError(
            "compute.profile",
            "the profile was measured on a CPU; wave scaling needs a GPU origin",
            "measure the profile on a GPU (measure_profile(device='cuda'))",
        )
    origin = get_gpu(origin_gpu if origin_gpu is not None else table.gpu, "compute.profile.gpu")
    dest = get_gpu(target_gpu, "gpu")
    if ridge not in RIDGES:
        raise ConfigError("ridge", f"unknown value {ridge!r}", f"use one of {', '.join(RIDGES)}")
    r = ridge_point(origin if ridge == "origin" else dest, table.dtype)
    out: dict[str, ProfileEntry] = {}
    for name, e in table.entries.items():
        ff, bf, fb, bb = _counts(name, e, table, model)
        times = []
        for t, flops, nbytes in ((e.fwd_s, ff, fb), (e.bwd_s, bf, bb)):
            x = flops / nbytes if nbytes > 0 else (math.inf if flops > 0 else 0.0)
            g = habitat_gamma(x, r)
            times.append(
                t * wave_scaling_factor(g, origin, dest, dtype=table.dtype, compute_scaling=compute_scaling)
            )
        out[name] = ProfileEntry(times[0], times[1], ff, bf, fb, bb)
    return ProfileTable(
        gpu=dest.name,
        batch=table.batch,
        entries=out,
        dtype=table.dtype,
        device=f"predicted from {origin.name} ({table.device})",
        tp=table.tp,
        model=table.model,
    )


@dataclass(frozen=True)
class PredictionError:
    """Signed relative errors ``(predicted − measured)/measured`` per layer (fwd+bwd) and of the total."""

    per_layer: Mapping[str, float]
    per_layer_fwd: Mapping[str, float]
    per_layer_bwd: Mapping[str, float]
    total: float
    mean_abs: float
    missing: tuple[str, ...]


def _rel(p: float, m: float) -> float:
    if m > 0:
        return (p - m) / m
    return 0.0 if p == 0 else math.inf


def prediction_error(predicted: ProfileTable, measured: ProfileTable) -> PredictionError:
    """Per-layer and total relative error of ``predicted`` against ``measured`` over their common layers;
    layers of ``measured`` absent from ``predicted`` are listed in ``missing``."""
    if (predicted.batch, predicted.tp) != (measured.batch, measured.tp):
        raise ConfigError(
            "compute.profile",
            f"profiles at different batch/tp ({predicted.batch}/{predicted.tp} vs "
            f"{measured.batch}/{measured.tp})",
            "compare profiles measured at the same batch and tp",
        )
    common = [n for n in measured.entries if n in predicted.entries]
    if not common:
        raise ConfigError(
            "compute.profile", "the two profiles share no layer", "compare profiles of the same model"
        )
    missing = tuple(n for n in measured.entries if n not in predicted.entries)
    per, per_f, per_b = {}, {}, {}
    tp_sum = tm_sum = 0.0
    for n in common:
        p, m = predicted.entries[n], measured.entries[n]
        per_f[n] = _rel(p.fwd_s, m.fwd_s)
        per_b[n] = _rel(p.bwd_s, m.bwd_s)
        per[n] = _rel(p.fwd_s + p.bwd_s, m.fwd_s + m.bwd_s)
        tp_sum += p.fwd_s + p.bwd_s
        tm_sum += m.fwd_s + m.bwd_s
    finite = [abs(v) for v in per.values() if math.isfinite(v)]
    return PredictionError(
        per, per_f, per_b, _rel(tp_sum, tm_sum), sum(finite) / len(finite) if finite else 0.0, missing
    )
