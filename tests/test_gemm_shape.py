"""GEMM time by shape: the shipped kernel tables, the wave model against its closed form, the fitted models
against measured kernels held out of the fit, and the roofline's opt-in switch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from topotrain.compute import gemm_efficiency, layer_time_s, params_from_dict
from topotrain.compute.gemm_tables import DEVICES, find_table, load_tables, table_for_gpu
from topotrain.compute.gemm_wave import (
    ShapeModel,
    WaveParams,
    cross_validated_times,
    error_summary,
    faster_than_shorter_k,
    shape_model,
    wave_time_s,
)
from topotrain.compute.roofline import params_for_gpu
from topotrain.hardware.gpus import get_gpu
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind

H100 = get_gpu("h100")


def test_tables_hold_what_the_sources_hold() -> None:
    bf16 = find_table("h100-sxm5-80gb", "bf16")
    assert bf16 is not None and len(bf16) == 375  # XLA's sm_90 grid: b ∈ {1,2,4} × m, n, k ∈ {256 … 4096}
    assert sorted(set(bf16.b)) == [1, 2, 4] and sorted(set(bf16.k)) == [256, 512, 1024, 2048, 4096]
    # XLA's sm_90 entry b=1, m=n=k=4096: bf16 780,190,... FLOP/s → 780.2 TFLOP/s
    i = int(np.flatnonzero((bf16.b == 1) & (bf16.m == 4096) & (bf16.n == 4096) & (bf16.k == 4096))[0])
    assert bf16.flops[i] / bf16.time_s[i] / 1e12 == pytest.approx(780.2, abs=0.1)
    for dev in ("a100-pcie-40gb", "v100-pcie-32gb", "h100-sxm5-80gb"):
        t = find_table(dev, "fp32")
        assert t is not None and len(t) == 2040 and t.kinds == ("bmm", "linear")
    # NeuSight's A100 linear (1, 1024, 2560 in, 2560 out): 0.7797 ms
    a100 = find_table("a100-pcie-40gb", "fp32")
    assert a100 is not None
    j = np.flatnonzero((a100.m == 1024) & (a100.n == 2560) & (a100.k == 2560))
    assert a100.time_s[j].min() == pytest.approx(0.7797e-3, rel=1e-3)
    assert all(np.all(t.time_s > 0) for t in load_tables())


def test_devices_mapped_to_the_catalog_carry_its_figures() -> None:
    for dev in DEVICES.values():
        if dev.gpu is None:
            continue
        g = get_gpu(dev.gpu)
        assert (dev.sm_count, dev.hbm_bandwidth_bytes_per_s) == (g.sm_count, g.hbm_bandwidth_bytes_per_s)
        assert dict(dev.peak_flops_per_s) == dict(g.peak_flops_per_s)
    assert DEVICES["v100-pcie-32gb"].gpu is None  # a lower clock than the catalog's V100 SXM2
    assert table_for_gpu("h100", "fp16") is table_for_gpu("h100", "bf16")  # same tensor-core rate
    assert table_for_gpu("a100-80gb", "bf16") is None
    assert table_for_gpu("h200", "bf16") is None


def _params(**kw: float) -> WaveParams:
    base = dict(tiles=((128, 128),), tile_efficiency=(0.8,), k_prologue=64.0, fixed_latency_s=5e-6,
                memory_efficiency=0.9, split_k_min=512.0, split_k_latency_s=2e-6)
    return WaveParams(**{**base, **kw})  # type: ignore[arg-type]


def test_wave_model_closed_form() -> None:
    dev = DEVICES["h100-sxm5-80gb"]
    p = _params()
    per_sm = dev.peak("bf16") / 132
    # 4096 × 4096 output: 1,024 tiles of 128×128 → ⌈1024/132⌉ = 8 waves, no split
    t = float(wave_time_s(p, dev, "bf16", 1, 4096, 4096, 4096))
    assert t == pytest.approx(8 * 2 * 128 * 128 * (4096 + 64) / (per_sm * 0.8) + 5e-6, rel=1e-12)
    # 12 × 11 = 132 tiles fill one wave exactly; 7 × 19 = 133 need two: time doubles (wave quantization)
    one = float(wave_time_s(p, dev, "bf16", 1, 12 * 128, 11 * 128, 4096))
    two = float(wave_time_s(p, dev, "bf16", 1, 7 * 128, 19 * 128, 4096))
    assert two - 5e-6 == pytest.approx(2 * (one - 5e-6), rel=1e-12)
    # 4 tiles, K = 4096: split over min(⌊132/4⌋, ⌊4096/512⌋) = 8 slices, one wave, plus the reduction
    t = float(wave_time_s(p, dev, "bf16", 1, 256, 256, 4096))
    assert t == pytest.approx(2 * 128 * 128 * (512 + 64) / (per_sm * 0.8) + 2e-6 + 5e-6, rel=1e-12)
    # a skinny GEMM is bound by HBM: bytes / (bandwidth · efficiency)
    t = float(wave_time_s(p, dev, "bf16", 1, 8, 65536, 65536))
    nbytes = 2 * (8 * 65536 + 65536 * 65536 + 8 * 65536)
    assert t == pytest.approx(nbytes / (dev.hbm_bandwidth_bytes_per_s * 0.9) + 5e-6, rel=1e-12)
    # the fastest tile is taken
    two_tiles = _params(tiles=((128, 128), (64, 64)), tile_efficiency=(0.8, 0.8))
    assert float(wave_time_s(two_tiles, dev, "bf16", 1, 4096, 4096, 4096)) <= t + float(
        wave_time_s(p, dev, "bf16", 1, 4096, 4096, 4096))


def test_h100_bf16_held_out_shapes_within_the_target() -> None:
    """Issue 34's kernel-level target: H100 GEMM time on held-out shapes within 10 % median, 20 % worst.
    4-fold cross-validation over XLA's 375 shapes; one shape is measured faster than the same GEMM with
    half its K (a split-K kernel the library chose there only) and is reported apart (benchmarks/gemm.py)."""
    t = find_table("h100-sxm5-80gb", "bf16")
    assert t is not None
    odd = faster_than_shorter_k(t)
    assert [(int(t.b[i]), int(t.m[i]), int(t.n[i]), int(t.k[i])) for i in np.flatnonzero(odd)] == [
        (1, 256, 256, 4096)]
    cv = cross_validated_times(t)
    for model in ("wave", "table"):
        every = error_summary(t, cv[model], model)
        assert every.median <= 0.05  # measured 2.5 % (wave), 2.1 % (table)
        usual = error_summary(t, cv[model], model, ~odd)
        assert usual.worst <= 0.20  # measured 18.6 % (wave), 16.7 % (table)


@pytest.mark.parametrize("device", ["a100-pcie-40gb", "v100-pcie-32gb", "h100-sxm5-80gb"])
def test_neusight_fp32_held_out_shapes(device: str) -> None:
    """NeuSight's FP32 kernels (linear and bmm) held out of the fit: median within 6 % on every GPU
    (measured 4.2 %, 5.1 %, 3.8 % for the wave model); the table model no worse than the wave model."""
    t = find_table(device, "fp32")
    assert t is not None
    cv = cross_validated_times(t)
    wave = error_summary(t, cv["wave"], "wave")
    table = error_summary(t, cv["table"], "table")
    assert wave.median <= 0.06
    assert table.median <= wave.median + 0.005


def test_table_model_returns_measurements_and_holds_the_edge_ratio() -> None:
    model = shape_model("h100", "bf16", "table")
    wave = shape_model("h100", "bf16", "wave")
    assert model is not None and wave is not None
    t = model.table
    regular = ~faster_than_shorter_k(t)  # all but (1, 256, 256, 4096), measured faster than at k = 2048
    pred = model.times_s(t.b, t.m, t.n, t.k)
    np.testing.assert_allclose(pred[regular], t.time_s[regular], rtol=1e-9)
    # beyond the table (k = 16,384 > 4,096): the wave model times the ratio measured at the edge
    edge = model.time_s(1, 4096, 4096, 4096) / wave.time_s(1, 4096, 4096, 4096)
    far = model.time_s(1, 4096, 4096, 16384) / wave.time_s(1, 4096, 4096, 16384)
    assert far == pytest.approx(edge, rel=1e-9)
    with pytest.raises(ValueError, match="unknown shape model"):
        ShapeModel(t, model.wave, "ceiling")


def test_roofline_switch() -> None:
    base = params_for_gpu("h100")
    assert base.gemm_model == "ceiling"
    table = params_from_dict({"gemm_model": "table"}, base=base)
    # a measured shape: the table's own throughput (780.2 TFLOP/s of 989.4)
    eff = gemm_efficiency(1, 4096, 4096, 4096, H100, "bf16", params=table)
    assert eff * H100.peak("bf16") / 1e12 == pytest.approx(780.2, abs=0.1)
    assert gemm_efficiency(1, 4096, 4096, 4096, H100, "fp16", params=table) == pytest.approx(eff, rel=1e-12)
    # the kernels were timed at the benchmark's clock: a sustained training clock still slows them
    slow = params_from_dict({"gemm_model": "table", "tensor_clock_fraction": 0.8}, base=base)
    assert gemm_efficiency(1, 4096, 4096, 4096, H100, "bf16", params=slow) == pytest.approx(0.8 * eff, rel=1e-12)
    # no table for the GPU, or a convolution: the ceiling, unchanged
    for gpu in ("a100-80gb", "v100"):
        p = params_for_gpu(gpu)
        assert gemm_efficiency(1, 4096, 4096, 4096, gpu, "fp16", params=params_from_dict(
            {"gemm_model": "wave"}, base=p)) == gemm_efficiency(1, 4096, 4096, 4096, gpu, "fp16", params=p)
    assert gemm_efficiency(1, 4096, 4096, 4096, H100, "bf16", conv=True, params=table) == gemm_efficiency(
        1, 4096, 4096, 4096, H100, "bf16", conv=True, params=base)
    # a linear layer: forward one GEMM, backward the data- and weight-gradient GEMMs, each from the model
    lay = Layer("fc", LayerKind.LINEAR, 2 * 4096 * 4096, 4 * 4096 * 4096, 0, 0, 0, 0,
                gemm_shape=(1, 4096, 4096))
    model = shape_model("h100", "bf16", "table")
    assert model is not None
    fwd = layer_time_s(lay, H100, 4096, phase="fwd", params=table)
    launch = table.kernel_launch_overhead_s
    assert fwd == pytest.approx(model.time_s(1, 4096, 4096, 4096) + launch, rel=1e-9)
    bwd = layer_time_s(lay, H100, 4096, phase="bwd", params=table)
    assert bwd == pytest.approx(2 * model.time_s(1, 4096, 4096, 4096) + 2 * launch, rel=1e-9)
    assert layer_time_s(lay, H100, 4096, phase="fwd", params=base) != fwd


def test_gemm_model_is_checked_at_the_edge() -> None:
    with pytest.raises(ConfigError, match="gemm_model"):
        params_from_dict({"gemm_model": "fitted"})
    assert not math.isnan(gemm_efficiency(1, 64, 64, 64, H100, "bf16", params=params_from_dict(
        {"gemm_model": "wave"})))
