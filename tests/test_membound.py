"""Memory-bound kernels from NeuSight's measurements (issue 34, part 3) and the A100 wave transfer (part 6)."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.compute import layer_time_s, params_from_dict
from topotrain.compute import membound as mb
from topotrain.compute.gemm_transfer import transferred_model
from topotrain.compute.roofline import gemm_efficiency, memory_fraction, params_for_gpu
from topotrain.hardware.gpus import get_gpu
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind
from topotrain.workload.transformer import transformer


def test_shipped_rows_hold_what_the_source_holds() -> None:
    rows = {(r.device.name, r.cls): r for r in mb.load_rows()}
    assert len(rows) == 7 * 3
    assert sum(len(r) for r in rows.values()) == 19879
    a100 = rows[("a100-pcie-40gb", "norm")]
    # NeuSight test/ln.csv: ln, A100-PCIE-40GB, B=8192, H=768 at 0.07519... ms
    i = int(np.flatnonzero((a100.width == 768) & (a100.nbytes == 8.0 * 8192 * 768 + 8 * 768 + 8 * 8192))[0])
    assert a100.time_s[i] == pytest.approx(7.519e-5, rel=1e-3)


@pytest.mark.parametrize(("device", "cls", "width", "fraction"), [
    ("a100-pcie-40gb", "elementwise", None, 0.886),
    ("v100-pcie-32gb", "elementwise", None, 0.912),
    ("a100-pcie-40gb", "norm", 2048, 0.859),
    ("a100-pcie-80gb", "norm", 12288, 0.553),
    ("a100-pcie-40gb", "softmax", 2048, 0.837),
    ("v100-pcie-32gb", "softmax", 12288, 0.436),
])
def test_fit_reproduces_on_the_shipped_rows(device: str, cls: str, width: int | None, fraction: float) -> None:
    f = mb.device_fit(device, cls)
    assert f is not None
    assert f.fraction(width) == pytest.approx(fraction, abs=0.002)  # docs/validation.md §8 figures
    rows = mb.rows_for(device, cls)
    assert rows is not None
    again = mb.fit(rows, f.latency_s)
    assert again.fraction(width) == f.fraction(width) and again.intercept_s == f.intercept_s


def test_norm_and_softmax_depend_on_the_row_length() -> None:
    """PyTorch's one-warp-per-row softmax (rows ≤ 1,024) streams near the bandwidth; long rows do not."""
    soft = mb.device_fit("a100-pcie-40gb", "softmax")
    norm = mb.device_fit("a100-pcie-80gb", "norm")
    assert soft is not None and norm is not None
    assert soft.fraction(1024) > 0.85 > 0.6 > soft.fraction(16384)
    assert norm.fraction(2048) > 0.75 > 0.6 > norm.fraction(8192)


@pytest.mark.parametrize("rows", mb.load_rows(), ids=lambda r: f"{r.device.name}-{r.cls}")
def test_held_out_errors_within_bands(rows: mb.KernelRows) -> None:
    """Rows held out of the fit (4-fold): streaming rows within 3% median; element-wise 15% worst."""
    checks = {h.check: h for h in mb.cross_validated_errors(rows)}
    stream = checks["rows, >= 4x L2"]
    assert stream.median < 0.03
    assert stream.worst < (0.15 if rows.cls == "elementwise" else 0.50)
    if rows.cls != "elementwise":
        assert checks["row length left out"].median < 0.20


def test_a_tiny_kernel_is_latency_bound_and_a_large_one_streams_at_the_fraction() -> None:
    f = mb.device_fit("a100-pcie-40gb", "elementwise")
    assert f is not None
    assert f.time_s(4096.0) == f.latency_s
    assert 15e-6 < f.latency_s < 50e-6  # PyTorch dispatch + launch in CUDA-event timings
    big = 10e9
    achieved = big / (f.time_s(big) - f.intercept_s)
    assert achieved == pytest.approx(f.device.hbm_bandwidth_bytes_per_s * f.fraction(), rel=1e-9)
    rows = mb.rows_for("a100-pcie-40gb", "elementwise")
    assert rows is not None
    large = rows.nbytes > 5e9
    assert np.all(np.abs(np.array([f.time_s(b) for b in rows.nbytes[large]]) / rows.time_s[large] - 1) < 0.05)


def test_catalog_gpus_take_their_measured_counterpart_or_the_transfer_median() -> None:
    assert mb.bandwidth_fraction("a100-80gb", "norm", 2048) == mb.device_fit("a100-pcie-80gb", "norm").fraction(2048)  # type: ignore[union-attr]
    fr = [mb.device_fit(d, "elementwise").fraction() for d in mb.TRANSFER_DEVICES]  # type: ignore[union-attr]
    assert mb.bandwidth_fraction("h100", "elementwise") == pytest.approx(float(np.median(fr)))
    assert mb.bandwidth_fraction("some-user-gpu", "softmax", 2048) == mb.bandwidth_fraction("h100", "softmax", 2048)
    assert "MEASURED" in mb.fraction_source("v100") and "TRANSFERRED" in mb.fraction_source("h100")


def _norm(hidden: int) -> Layer:
    n = 2048 * hidden
    return Layer("ln", LayerKind.NORM, 8.0 * n, 16.0 * n, 2.0 * (2 * n + 2 * hidden), 2.0 * (3 * n + 4 * hidden),
                 param_bytes=4.0 * hidden, row_elems=hidden)


def test_memory_model_measured_times_memory_bound_layers_at_the_fraction() -> None:
    lay = _norm(12288)
    g = get_gpu("a100-80gb")
    const = params_for_gpu(g)
    meas = params_for_gpu(g, {"memory_model": "measured"})
    assert memory_fraction(lay, g, const) == const.memory_efficiency
    frac = mb.bandwidth_fraction("a100-80gb", "norm", 12288)
    assert memory_fraction(lay, g, meas) == frac
    t_c = layer_time_s(lay, g, 4, phase="fwd", params=const) - const.kernel_launch_overhead_s
    t_m = layer_time_s(lay, g, 4, phase="fwd", params=meas) - meas.kernel_launch_overhead_s
    assert t_m / t_c == pytest.approx(const.memory_efficiency / frac, rel=1e-9)
    gemm = Layer("fc", LayerKind.LINEAR, 1e6, 2e6, 1e3, 2e3, gemm_shape=(16, 16, 16))
    assert memory_fraction(gemm, g, meas) == meas.memory_efficiency  # GEMMs keep memory_efficiency


def test_transformer_layers_carry_their_row_lengths() -> None:
    m = transformer("t", layers=1, hidden=1024, heads=16, seq_len=512, vocab=1000, flash_attention=False)
    kinds = {lay.kind: lay.row_elems for lay in m.layers if lay.kind in (LayerKind.NORM, LayerKind.SOFTMAX)}
    assert kinds == {LayerKind.NORM: 1024, LayerKind.SOFTMAX: 512}


def test_switches_refuse_bad_values() -> None:
    with pytest.raises(ConfigError, match="memory_model"):
        params_from_dict({"memory_model": "fast"})
    with pytest.raises(ConfigError, match="gemm_transfer"):
        params_from_dict({"gemm_transfer": "yes"})


def test_a100_bf16_transfer_rule() -> None:
    a100 = get_gpu("a100-80gb")
    t = transferred_model(a100, "bf16")
    assert t is not None and t.device.sm_count == 108
    h100 = transferred_model(get_gpu("h100"), "bf16")
    assert h100 is None and transferred_model(a100, "fp32") is None
    p = params_for_gpu(a100, {"gemm_model": "table", "gemm_transfer": True})
    big = gemm_efficiency(1, 8192, 8192, 8192, a100, "bf16", params=p)
    assert big == pytest.approx(271.2 / 312.0, rel=1e-6)  # capped at the A100's MAMF
    small = gemm_efficiency(1, 512, 512, 512, a100, "bf16", params=p)
    assert small < 0.5 * big
    # without the switch an A100 keeps its ceiling model under gemm_model: table
    plain = params_for_gpu(a100, {"gemm_model": "table"})
    assert gemm_efficiency(1, 8192, 8192, 8192, a100, "bf16", params=plain) < 0.75
