"""Compute models: roofline sanity against closed forms and published throughput, profiles, Habitat."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from topotrain.compute import (
    DEFAULT_PARAMS,
    ComputeModel,
    ComputeParams,
    ProfiledModel,
    RooflineModel,
    achieved_tflops,
    gemm_efficiency,
    habitat_gamma,
    layer_time_s,
    layer_times,
    load_profile,
    make_compute_model,
    model_time_s,
    params_from_dict,
    predict_profile,
    prediction_error,
    save_profile,
)
from topotrain.compute.crossgpu import ridge_point, wave_scaling_factor
from topotrain.compute.profile import ProfileEntry, ProfileTable
from topotrain.hardware.gpus import get_gpu
from topotrain.util.errors import ConfigError
from topotrain.workload.cnn import resnet50
from topotrain.workload.layer import Layer, LayerKind, Model, TPSplit
from topotrain.workload.transformer import transformer

A100 = get_gpu("a100-80gb")
V100 = get_gpu("v100-16gb")
P = DEFAULT_PARAMS
#: A100's own ceiling (Ampere's calibrated GEMM ceiling, hardware/gpus.py), the defaults otherwise
A100_GEMM = A100.compute_efficiency.get("gemm_max_efficiency", P.gemm_max_efficiency)


def _linear(m: int, n: int, k: int, tp_split: TPSplit = TPSplit.NONE, name: str = "fc") -> Layer:
    """A linear layer whose per-sample GEMM is m×n×k (no bias), 2-byte elements."""
    f = 2.0 * m * n * k
    fwd_bytes, bwd_bytes = 2.0 * (m * k + n * k + m * n), 4.0 * (m * k + n * k + m * n)
    return Layer(name, LayerKind.LINEAR, f, 2 * f, fwd_bytes, bwd_bytes, param_count=n * k,
                 param_bytes=2.0 * n * k, tp_split=tp_split, gemm_shape=(m, n, k))


def _elementwise(nbytes: float, name: str = "add") -> Layer:
    return Layer(name, LayerKind.ELEMENTWISE, nbytes / 6, nbytes / 6, nbytes, nbytes)


@pytest.fixture(scope="module")
def r50() -> Model:
    return resnet50()


@pytest.fixture(scope="module")
def tiny_gpt() -> Model:
    return transformer("tiny", layers=2, hidden=64, heads=4, seq_len=32, vocab=128, dropout=True)


# ---- roofline --------------------------------------------------------------------------------------------
def test_huge_gemm_reaches_the_ceiling() -> None:
    eff = gemm_efficiency(1, 16384, 16384, 16384, A100, "bf16")
    assert eff == pytest.approx(A100_GEMM, rel=0.03)
    lay = _linear(16384, 16384, 16384)
    t = layer_time_s(lay, A100, 1, phase="fwd")
    assert t == pytest.approx(lay.fwd_flops / (A100.peak("bf16") * A100_GEMM), rel=0.03)


def test_small_gemm_is_far_less_efficient() -> None:
    big = gemm_efficiency(1, 8192, 8192, 8192, A100, "bf16")
    small = gemm_efficiency(1, 256, 256, 256, A100, "bf16")
    assert small < 0.15 * big
    # efficiency grows with size along the diagonal
    effs = [gemm_efficiency(1, n, n, n, A100, "bf16") for n in (256, 512, 1024, 2048, 4096, 8192)]
    assert all(a < b for a, b in zip(effs, effs[1:], strict=False))


def test_wave_quantization_one_tile_past_a_wave() -> None:
    # 108 tiles of 256x128 fill one A100 wave; 109 tiles need two: the time must jump, not grow by 1/108
    k = 8192
    t108 = layer_time_s(_linear(256 * 108, 128, k), A100, 1, phase="fwd")
    t109 = layer_time_s(_linear(256 * 109, 128, k), A100, 1, phase="fwd")
    assert t109 > 1.2 * t108


def test_elementwise_is_memory_bound() -> None:
    nbytes = 1e9
    t = layer_time_s(_elementwise(nbytes), A100, 1, phase="fwd")
    expect = nbytes / (A100.hbm_bandwidth_bytes_per_s * P.memory_efficiency)
    assert t == pytest.approx(expect + P.kernel_launch_overhead_s, rel=1e-9)


def test_layer_kernel_count_overrides_its_kind() -> None:
    """A layer that stands for several small ops (Layer.kernels) pays the launch overhead that many times,
    forward and backward, and no kernel at all in a pass that moves nothing."""
    from dataclasses import replace

    nbytes = 1e9
    layer = replace(_elementwise(nbytes), kernels=(21, 6))
    mem = nbytes / (A100.hbm_bandwidth_bytes_per_s * P.memory_efficiency)
    assert layer_time_s(layer, A100, 1, phase="fwd") == pytest.approx(mem + 21 * P.kernel_launch_overhead_s)
    assert layer_time_s(layer, A100, 1, phase="bwd") == pytest.approx(mem + 6 * P.kernel_launch_overhead_s)
    fwd_only = replace(layer, bwd_bytes=0.0, bwd_flops=0.0, kernels=(12, 0))
    assert layer_time_s(fwd_only, A100, 1, phase="bwd") == 0.0


def test_tiny_layer_costs_the_launch_overhead() -> None:
    t = layer_time_s(_elementwise(64.0), A100, 1, phase="fwd")
    assert P.kernel_launch_overhead_s <= t < 1.01 * P.kernel_launch_overhead_s


def test_monotone_in_batch(r50: Model, tiny_gpt: Model) -> None:
    for model in (r50, tiny_gpt):
        times = [model_time_s(model, A100, b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
        assert all(a <= b for a, b in zip(times, times[1:], strict=False))
    # throughput grows with batch on a big model (launch overhead and waves amortized)
    assert 256 / model_time_s(r50, A100, 256) > 1.5 * (8 / model_time_s(r50, A100, 8))


def test_tp_halves_gemm_time() -> None:
    up = _linear(2048, 4 * 12288, 12288, TPSplit.COLUMN)
    down = _linear(2048, 12288, 4 * 12288, TPSplit.ROW)
    for lay in (up, down):
        for phase in ("fwd", "bwd"):
            t1 = layer_time_s(lay, A100, 1, phase=phase)
            t2 = layer_time_s(lay, A100, 1, phase=phase, tp=2)
            assert 0.45 < t2 / t1 < 0.6
    rep = _linear(2048, 12288, 12288, TPSplit.REPLICATED)
    assert layer_time_s(rep, A100, 1, phase="fwd", tp=8) == layer_time_s(rep, A100, 1, phase="fwd")


def test_backward_of_a_big_gemm_is_twice_forward() -> None:
    lay = _linear(8192, 8192, 8192)
    ratio = layer_time_s(lay, A100, 1, phase="bwd") / layer_time_s(lay, A100, 1, phase="fwd")
    assert ratio == pytest.approx(2.0, rel=0.05)


def test_resnet50_v100_amp_throughput_in_published_band(r50: Model) -> None:
    # NVIDIA DeepLearningExamples, ResNet-50 v1.5, batch 256, AMP: 1200 img/s (PyTorch 21.03) and 1270 img/s
    # (TF 20.06 + XLA) on one V100-16GB (docs/sources.md §1). The compute model excludes the optimizer step
    # (≈ 1 ms here) and input pipeline; band ±25 % around 1200-1450 img/s.
    img_s = 256 / model_time_s(r50, V100, 256, dtype="fp16")
    assert 0.75 * 1300 <= img_s <= 1.25 * 1450
    assert img_s == pytest.approx(1200, rel=0.25)


def test_resnet50_a100_amp_throughput(r50: Model) -> None:
    # same source: 2470 img/s on one A100-80GB with AMP (PyTorch 21.03), 2375 (TF, A100-40GB)
    img_s = 256 / model_time_s(r50, A100, 256, dtype="bf16")
    assert img_s == pytest.approx(2470, rel=0.25)


def test_achieved_tflops_below_peak(r50: Model, tiny_gpt: Model) -> None:
    tf = achieved_tflops(r50, V100, 256, dtype="fp16")
    assert 0.1 * V100.peak("fp16") / 1e12 < tf < V100.peak("fp16") / 1e12
    big = _linear(8192, 8192, 8192)
    model = Model("one", (big,))
    assert achieved_tflops(model, A100, 1) == pytest.approx(A100_GEMM * 312, rel=0.06)


def test_first_conv_backward_is_weight_gradient_only(r50: Model) -> None:
    conv1 = r50.layers[0]
    assert conv1.bwd_flops == conv1.fwd_flops  # its input needs no gradient
    t = layer_time_s(conv1, A100, 64, phase="bwd")
    assert t > 0
    # one GEMM kernel instead of two
    no_launch = ComputeParams(kernel_launch_overhead_s=0.0)
    assert t - layer_time_s(conv1, A100, 64, phase="bwd", params=no_launch) == pytest.approx(
        P.kernel_launch_overhead_s)


def test_roofline_model_protocol_and_memo(r50: Model) -> None:
    rm = RooflineModel(A100, "bf16")
    assert isinstance(rm, ComputeModel)
    f, b = rm.layer_times(r50, 32, 1)
    f2, b2 = layer_times(r50, A100, 32)
    np.testing.assert_array_equal(f, f2)
    np.testing.assert_array_equal(b, b2)
    f[0] = -1.0  # callers get copies
    assert rm.layer_times(r50, 32, 1)[0][0] == f2[0]
    assert f.shape == (len(r50.layers),)


def test_bad_inputs() -> None:
    lay = _linear(64, 64, 64)
    with pytest.raises(ConfigError, match="bf16"):
        RooflineModel(V100, "bf16")
    with pytest.raises(ConfigError, match="phase"):
        layer_time_s(lay, A100, 1, phase="sideways")
    with pytest.raises(ConfigError, match="batch"):
        layer_time_s(lay, A100, 0, phase="fwd")
    with pytest.raises(ConfigError, match="tp"):
        layer_time_s(lay, A100, 1, phase="fwd", tp=0)
    with pytest.raises(ConfigError, match="gemm_max_efficiency"):
        ComputeParams(gemm_max_efficiency=1.5)
    with pytest.raises(ConfigError, match="kernels_fwd.warp"):
        ComputeParams(kernels_fwd={"warp": 1})
    with pytest.raises(ConfigError, match="gemm_tiles"):
        ComputeParams(gemm_tiles=((128, 0, 1.0),))
    with pytest.raises(ConfigError, match="compute.params.speed"):
        params_from_dict({"speed": 2})


def test_params_from_dict_overrides() -> None:
    p = params_from_dict({"memory_efficiency": 0.9, "kernels_bwd": {"conv": 3}})
    assert p.memory_efficiency == 0.9 and p.kernels_bwd["conv"] == 3 and p.kernels_bwd["linear"] == 2
    t = layer_time_s(_elementwise(1e9), A100, 1, phase="fwd", params=p)
    assert t == pytest.approx(1e9 / (A100.hbm_bandwidth_bytes_per_s * 0.9) + p.kernel_launch_overhead_s)


# ---- profiles --------------------------------------------------------------------------------------------
def _table(model: Model, gpu: str, dtype: str, batch: int) -> ProfileTable:
    """A 'measured' table made from the roofline, with the layers' counts."""
    f, b = layer_times(model, gpu, batch, dtype=dtype)
    entries = {lay.name: ProfileEntry(float(x), float(y), lay.fwd_flops * batch, lay.bwd_flops * batch,
                                      lay.fwd_bytes_at(batch), lay.bwd_bytes_at(batch))
               for lay, x, y in zip(model.layers, f, b, strict=True)}
    return ProfileTable(gpu=gpu, batch=batch, entries=entries, dtype=dtype, device="cuda", model=model.name)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_profile_round_trip(tmp_path: Path, tiny_gpt: Model, suffix: str) -> None:
    t = _table(tiny_gpt, "a100-80gb", "bf16", 4)
    path = save_profile(t, tmp_path / f"prof{suffix}")
    back = load_profile(path)
    assert back == t
    assert [p.name for p in tmp_path.iterdir()] == [f"prof{suffix}"]  # no temporary left behind
    save_profile(t, path)  # overwrite in place
    assert load_profile(path) == t


def test_csv_by_hand(tmp_path: Path) -> None:
    p = tmp_path / "hand.csv"
    p.write_text("# gpu=h100\n# batch=8\nname,fwd_s,bwd_s\nconv1,1e-3,2e-3\nfc,0.5e-3,1e-3\n")
    t = load_profile(p)
    assert (t.gpu, t.batch, t.tp, t.dtype) == ("h100", 8, 1, "bf16")
    assert t.entries["conv1"].bwd_s == 2e-3 and t.entries["fc"].fwd_flops is None
    assert t.total_s == pytest.approx(4.5e-3)


@pytest.mark.parametrize(("text", "suffix", "match"), [
    ("{not json", ".json", "not valid JSON"),
    ('{"batch": 4, "layers": [{"name": "a", "fwd_s": 1, "bwd_s": 1}]}', ".json", "gpu"),
    ('{"gpu": "h100", "batch": 0, "layers": [{"name": "a", "fwd_s": 1, "bwd_s": 1}]}', ".json", "batch"),
    ('{"gpu": "h100", "batch": 4, "layers": [{"name": "a", "fwd_s": -1, "bwd_s": 1}]}', ".json", "fwd_s"),
    ('{"gpu": "h100", "batch": 4, "layers": [{"name": "a", "fwd_s": 1, "bwd_s": 1}, '
     '{"name": "a", "fwd_s": 1, "bwd_s": 1}]}', ".json", "duplicate"),
    ('{"gpu": "h100", "batch": 4, "layers": []}', ".json", "no layers"),
    ('{"format": "other", "gpu": "h100", "batch": 4, "layers": []}', ".json", "format"),
    ("# gpu=h100\n# batch=4\nname,fwd_s\na,1\n", ".csv", "bwd_s"),
    ("# gpu h100\nname,fwd_s,bwd_s\n", ".csv", "key=value"),
    ("# gpu=h100\n# batch=4\nname,fwd_s,bwd_s\na,fast,1\n", ".csv", "expected a number"),
    ("x", ".txt", "extension"),
])
def test_profile_errors(tmp_path: Path, text: str, suffix: str, match: str) -> None:
    p = tmp_path / f"bad{suffix}"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_profile(p)
    assert str(e.value).startswith("compute.profile")


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no profile file"):
        load_profile(tmp_path / "nope.json")


def test_profiled_model_scaling_and_fallback(tiny_gpt: Model) -> None:
    t = _table(tiny_gpt, "a100-80gb", "bf16", 4)
    pm = ProfiledModel(t, RooflineModel(A100))
    f4, b4 = pm.layer_times(tiny_gpt, 4, 1)
    f8, b8 = pm.layer_times(tiny_gpt, 8, 1)
    np.testing.assert_allclose(f8, 2 * f4)
    np.testing.assert_allclose(b8, 2 * b4)
    split = np.array([lay.tp_split in (TPSplit.COLUMN, TPSplit.ROW) for lay in tiny_gpt.layers])
    f4t, _ = pm.layer_times(tiny_gpt, 4, 2)
    np.testing.assert_allclose(f4t[split], f4[split] / 2)
    np.testing.assert_allclose(f4t[~split], f4[~split])
    # drop one layer: it falls back to the roofline and is reported
    name = tiny_gpt.layers[3].name
    partial = ProfileTable(gpu=t.gpu, batch=4, entries={k: v for k, v in t.entries.items() if k != name})
    f, b, warns = ProfiledModel(partial, RooflineModel(A100)).layer_times_with_warnings(tiny_gpt, 4, 1)
    assert len(warns) == 1 and name in warns[0]
    roof = RooflineModel(A100).layer_times(tiny_gpt, 4, 1)
    assert f[3] == roof[0][3] and b[3] == roof[1][3]
    with pytest.raises(ConfigError, match="not in the profile"):
        ProfiledModel(partial).layer_times(tiny_gpt, 4, 1)


def test_make_compute_model(tmp_path: Path, tiny_gpt: Model) -> None:
    assert isinstance(make_compute_model("a100-80gb", tiny_gpt, "bf16", {}), RooflineModel)
    t = _table(tiny_gpt, "a100-80gb", "bf16", 4)
    path = save_profile(t, tmp_path / "p.json")
    same = make_compute_model("a100", tiny_gpt, "bf16", {"profile": str(path)})
    assert isinstance(same, ProfiledModel)
    np.testing.assert_allclose(same.layer_times(tiny_gpt, 4, 1)[0], [t.entries[n.name].fwd_s for n in tiny_gpt.layers])
    other = make_compute_model("h100", tiny_gpt, "bf16", {"profile": str(path)})
    assert isinstance(other, ProfiledModel) and other.table.gpu == "h100"
    assert other.table.total_s < t.total_s  # H100 is faster on every ratio
    cpu = ProfileTable(gpu="cpu", batch=4, entries=t.entries, device="cpu")
    with pytest.raises(ConfigError, match="CPU"):
        make_compute_model("h100", tiny_gpt, "bf16", {"profile": cpu})
    assert isinstance(make_compute_model("h100", tiny_gpt, "bf16", {"profile": cpu, "allow_cpu_profile": True}),
                      ProfiledModel)
    with pytest.raises(ConfigError, match="compute.speed"):
        make_compute_model("h100", tiny_gpt, "bf16", {"speed": 1})
    tuned = make_compute_model("h100", tiny_gpt, "bf16", {"params": {"memory_efficiency": 0.5}})
    assert isinstance(tuned, RooflineModel) and tuned.params.memory_efficiency == 0.5


def test_measure_profile_on_cpu(tiny_gpt: Model) -> None:
    pytest.importorskip("torch")
    from topotrain.compute import measure_profile

    flash = transformer("tiny-flash", layers=1, hidden=64, heads=4, seq_len=32, vocab=128, flash_attention=True)
    for model in (tiny_gpt, flash):
        t = measure_profile(model, 2, device="cpu", repeats=2, warmup=1)
        assert (t.gpu, t.device, t.dtype, t.batch) == ("cpu", "cpu", "fp32", 2)
        assert t.measured_on_cpu
        assert list(t.entries) == [lay.name for lay in model.layers]
        for lay in model.layers:
            e = t.entries[lay.name]
            assert e.fwd_s >= 0 and e.bwd_s >= 0 and e.has_counts
            if lay.gemm_shape is not None:
                assert e.fwd_s > 0 and e.bwd_s > 0
    sub = measure_profile(tiny_gpt, 1, device="cpu", repeats=1, warmup=0, layers=["lm_head"])
    assert list(sub.entries) == ["lm_head"]
    with pytest.raises(ConfigError, match="no layer"):
        measure_profile(tiny_gpt, 1, device="cpu", layers=["nope"])
    with pytest.raises(ConfigError, match="device"):
        measure_profile(tiny_gpt, 1, device="tpu")


# ---- cross-GPU (Habitat) ---------------------------------------------------------------------------------
def test_habitat_gamma_mapping() -> None:
    r = 100.0
    assert habitat_gamma(0.0, r) == 1.0
    assert habitat_gamma(r / 2, r) == pytest.approx(0.75)
    assert habitat_gamma(r, r) == pytest.approx(0.5)
    assert habitat_gamma(2 * r, r) == pytest.approx(0.25)
    assert habitat_gamma(math.inf, r) == 0.0
    xs = np.linspace(0, 10 * r, 200)
    gs = [habitat_gamma(float(x), r) for x in xs]
    assert all(a >= b for a, b in zip(gs, gs[1:], strict=False)) and all(0 <= g <= 1 for g in gs)


def test_cross_gpu_identity(r50: Model) -> None:
    t = _table(r50, "v100-16gb", "fp16", 32)
    same = predict_profile(t, "v100-16gb")
    for name, e in t.entries.items():
        assert same.entries[name].fwd_s == e.fwd_s and same.entries[name].bwd_s == e.bwd_s
    err = prediction_error(same, t)
    assert err.total == 0.0 and err.mean_abs == 0.0 and err.missing == ()


def test_cross_gpu_direction() -> None:
    mem = ProfileEntry(1e-3, 2e-3, 0.0, 0.0, 1e9, 2e9)  # no FLOPs: γ = 1
    cmp_ = ProfileEntry(1e-3, 2e-3, 1e12, 2e12, 0.0, 0.0)  # no bytes: γ = 0
    t = ProfileTable(gpu="v100-16gb", batch=1, entries={"mem": mem, "cmp": cmp_}, dtype="fp16")
    p = predict_profile(t, "a100-80gb")
    bw = V100.hbm_bandwidth_bytes_per_s / A100.hbm_bandwidth_bytes_per_s
    clk_sm = (V100.boost_clock_hz / A100.boost_clock_hz) * (V100.sm_count / A100.sm_count)
    assert p.entries["mem"].fwd_s == pytest.approx(1e-3 * bw)
    assert p.entries["mem"].bwd_s == pytest.approx(2e-3 * bw)
    assert p.entries["cmp"].fwd_s == pytest.approx(1e-3 * clk_sm)
    peak = predict_profile(t, "a100-80gb", compute_scaling="peak")
    assert peak.entries["cmp"].fwd_s == pytest.approx(1e-3 * V100.peak("fp16") / A100.peak("fp16"))
    assert peak.entries["mem"].fwd_s == pytest.approx(1e-3 * bw)


def test_cross_gpu_mixed_intensity() -> None:
    r = ridge_point(V100, "fp16")
    e = ProfileEntry(1e-3, 1e-3, r * 1e6, r * 1e6, 1e6, 1e6)  # exactly at the ridge: γ = 0.5
    t = ProfileTable(gpu="v100-16gb", batch=1, entries={"x": e}, dtype="fp16")
    p = predict_profile(t, "h100")
    assert p.entries["x"].fwd_s == pytest.approx(1e-3 * wave_scaling_factor(0.5, V100, get_gpu("h100"), dtype="fp16"))
    dest = predict_profile(t, "h100", ridge="dest")
    assert dest.entries["x"].fwd_s != p.entries["x"].fwd_s


def test_cross_gpu_against_roofline(r50: Model) -> None:
    # A 'measured' V100 table from the roofline, predicted to A100, against the roofline on A100: the peak
    # variant tracks it; Habitat's clock×SM rule misses the A100's 2x per-SM tensor rate and predicts slower.
    tv = _table(r50, "v100-16gb", "fp16", 64)
    ta = _table(r50, "a100-80gb", "fp16", 64)
    peak = prediction_error(predict_profile(tv, "a100-80gb", compute_scaling="peak"), ta)
    habitat = prediction_error(predict_profile(tv, "a100-80gb"), ta)
    assert abs(peak.total) < 0.10
    assert habitat.total > peak.total
    assert set(habitat.per_layer) == set(ta.entries)


def test_cross_gpu_errors(tiny_gpt: Model) -> None:
    t = _table(tiny_gpt, "a100-80gb", "bf16", 4)
    cpu = ProfileTable(gpu="cpu", batch=4, entries=t.entries, device="cpu")
    with pytest.raises(ConfigError, match="CPU"):
        predict_profile(cpu, "h100")
    no_counts = ProfileTable(gpu="a100-80gb", batch=4, entries={"lm_head": ProfileEntry(1e-3, 2e-3)})
    with pytest.raises(ConfigError, match="counts"):
        predict_profile(no_counts, "h100")
    ok = predict_profile(no_counts, "h100", model=tiny_gpt)
    assert ok.entries["lm_head"].has_counts
    with pytest.raises(ConfigError, match="ridge"):
        predict_profile(t, "h100", ridge="middle")
    other = ProfileTable(gpu="a100-80gb", batch=8, entries=t.entries)
    with pytest.raises(ConfigError, match="batch"):
        prediction_error(other, t)


def test_prediction_error_values(tiny_gpt: Model) -> None:
    t = _table(tiny_gpt, "a100-80gb", "bf16", 4)
    slow = ProfileTable(gpu=t.gpu, batch=4, entries={k: ProfileEntry(1.1 * v.fwd_s, 1.1 * v.bwd_s)
                                                     for k, v in list(t.entries.items())[:-1]})
    err = prediction_error(slow, t)
    assert all(v == pytest.approx(0.1) for v in err.per_layer.values())
    assert err.mean_abs == pytest.approx(0.1)
    assert err.missing == (list(t.entries)[-1],)
    assert json.dumps({"total": err.total})  # plain floats


def test_split_k_rescues_long_thin_gemms() -> None:
    # a weight-gradient GEMM: tiny output (one tile), huge reduction (batch × pixels): split-K fills the GPU
    thin = gemm_efficiency(1, 128, 128, 2**22, A100, "bf16")
    assert thin > 0.5 * P.gemm_max_efficiency
    no_split = ComputeParams(split_k_min=2**30)
    assert gemm_efficiency(1, 128, 128, 2**22, A100, "bf16", params=no_split) < 0.05  # ≤ 4 tiles on 108 SMs


def test_gemm_layer_without_shape_uses_the_ceiling() -> None:
    f = 1e12
    lay = Layer("opaque", LayerKind.LINEAR, f, 2 * f, 1e6, 2e6)
    t = layer_time_s(lay, A100, 1, phase="fwd")
    assert t == pytest.approx(f / (A100.peak("bf16") * A100_GEMM) + P.kernel_launch_overhead_s)


def test_k_half_scales_with_per_sm_throughput() -> None:
    from topotrain.compute.roofline import effective_k_half

    v100, h100 = V100, get_gpu("h100")
    assert effective_k_half(v100, "fp16") == pytest.approx(P.k_half, rel=1e-9)  # the reference GPU
    assert effective_k_half(A100, "bf16") == pytest.approx(64 * (312e12 / 108) / (125e12 / 80), rel=1e-3)
    assert effective_k_half(h100, "bf16") > effective_k_half(A100, "bf16") > P.k_half
    off = ComputeParams(k_half_reference_flops_per_sm=0)
    assert effective_k_half(h100, "bf16", off) == P.k_half
    # a K=64 GEMM on A100 loses more of its ceiling than with the unscaled ramp
    assert gemm_efficiency(1, 8192, 8192, 64, A100) < gemm_efficiency(1, 8192, 8192, 64, A100, params=off)


def test_gpu_efficiency_overrides_and_precedence() -> None:
    from topotrain.compute import params_for_gpu

    h100 = get_gpu("h100")
    assert set(h100.compute_efficiency) <= {f for f in ComputeParams.__dataclass_fields__}
    p = params_for_gpu(h100)
    for key, value in h100.compute_efficiency.items():
        assert getattr(p, key) == value
    assert p.gemm_max_efficiency < A100_GEMM < P.gemm_max_efficiency  # Hopper's ceiling sits below A100's
    assert params_for_gpu(get_gpu("p100")) is DEFAULT_PARAMS  # no overrides → the defaults themselves
    user = params_for_gpu(h100, {"gemm_max_efficiency": 0.9})
    assert user.gemm_max_efficiency == 0.9 and user.attention_fwd_efficiency == p.attention_fwd_efficiency
    # the default RooflineModel and make_compute_model use the GPU's constants; compute.params wins
    assert RooflineModel(h100).params == p
    m = make_compute_model(h100, config={"params": {"attention_fwd_efficiency": 0.5}})
    assert isinstance(m, RooflineModel)
    assert m.params.attention_fwd_efficiency == 0.5 and m.params.gemm_max_efficiency == p.gemm_max_efficiency
    with pytest.raises(ConfigError, match=r"compute\.params\.nonsense"):
        params_for_gpu(h100, {"nonsense": 1})
    big = _linear(8192, 8192, 8192)
    assert layer_time_s(big, h100, 1, phase="fwd") > layer_time_s(big, h100, 1, phase="fwd", params=P)


@pytest.mark.parametrize(
    ("eff", "match"),
    [({"gemm_max_efficiency": 1.5}, r"compute_efficiency\.gemm_max_efficiency"),
     ({"gemm_max_efficiency": True}, r"compute_efficiency\.gemm_max_efficiency"),
     ({"k_half": 0.5}, r"compute_efficiency\.k_half.*unknown"),
     ([("gemm_max_efficiency", 0.5)], r"compute_efficiency.*mapping")],
)
def test_gpu_efficiency_validation(eff: object, match: str) -> None:
    from topotrain.hardware.gpus import GPUSpec

    with pytest.raises(ConfigError, match=match):
        GPUSpec("x1", "nvidia", {"bf16": 1e14}, 1e12, 1e9, 10, 1e9, compute_efficiency=eff)  # type: ignore[arg-type]


@pytest.mark.parametrize("name, tp", [("gpt3-175b", 8), ("bert-large", 1), ("resnet50", 1)])
def test_layer_times_equal_each_layer_timed_alone(name: str, tp: int) -> None:
    """layer_times times repeated layers once (those differing only in name and block); every entry equals
    layer_time_s of its own layer, bit for bit."""
    from topotrain.workload.zoo import get_model

    model = get_model(name)
    fwd, bwd = layer_times(model, "a100-80gb", 2, tp=tp)
    for i, lay in enumerate(model.layers):
        assert fwd[i] == layer_time_s(lay, "a100-80gb", 2, phase="fwd", tp=tp)
        assert bwd[i] == layer_time_s(lay, "a100-80gb", 2, phase="bwd", tp=tp)


def test_tensor_clock_fraction_divides_matmul_and_attention_time_not_convolutions() -> None:
    """A board below its boost clock (``tensor_clock_fraction``) runs its matrix multiplies and attention
    that much slower; convolutions (their ceiling calibrated at the clock they ran at) and memory-bound
    layers are unchanged. Hand-computed on opaque layers (the ceiling alone, compute-bound)."""
    f = 1e12
    half = ComputeParams(tensor_clock_fraction=0.5)
    lin = Layer("opaque", LayerKind.LINEAR, f, 2 * f, 1e6, 2e6)
    conv = Layer("conv", LayerKind.CONV, f, 2 * f, 1e6, 2e6)
    att = Layer("att", LayerKind.ATTENTION, f, 2 * f, 1e6, 2e6)
    launch = P.kernel_launch_overhead_s
    peak = A100.peak("bf16")
    assert layer_time_s(lin, A100, 1, phase="fwd", params=half) == pytest.approx(
        f / (peak * P.gemm_max_efficiency * 0.5) + launch)
    assert layer_time_s(att, A100, 1, phase="fwd", params=half) == pytest.approx(
        f / (peak * P.attention_fwd_efficiency * 0.5) + P.kernels_fwd["attention"] * launch)
    assert layer_time_s(conv, A100, 1, phase="fwd", params=half) == layer_time_s(conv, A100, 1, phase="fwd",
                                                                                 params=P)
    ew = _elementwise(1e9)
    assert layer_time_s(ew, A100, 1, phase="fwd", params=half) == layer_time_s(ew, A100, 1, phase="fwd", params=P)
    # a shaped GEMM, forward and backward: the whole compute time doubles (compute-bound at this size)
    big = _linear(8192, 8192, 8192)
    for phase in ("fwd", "bwd"):
        full = layer_time_s(big, A100, 1, phase=phase, params=P) - launch * (1 if phase == "fwd" else 2)
        slow = layer_time_s(big, A100, 1, phase=phase, params=half) - launch * (1 if phase == "fwd" else 2)
        assert slow == pytest.approx(2 * full, rel=1e-12)
    assert gemm_efficiency(1, 8192, 8192, 8192, A100, params=half) == pytest.approx(
        0.5 * gemm_efficiency(1, 8192, 8192, 8192, A100, params=P))
    assert gemm_efficiency(1, 8192, 8192, 8192, A100, conv=True, params=half) == gemm_efficiency(
        1, 8192, 8192, 8192, A100, conv=True, params=P)


def test_v100_sxm2_sustained_tensor_clock() -> None:
    """The 300 W V100 SXM2 boards (DGX-1) carry their calibrated sustained tensor clock, 0.80 of 1,530 MHz;
    the A100/H100 (ceilings calibrated at the clock they ran at) and the P100 keep the boost."""
    from topotrain.compute import params_for_gpu

    for name in ("v100", "v100-16gb"):
        g = get_gpu(name)
        assert g.compute_efficiency["tensor_clock_fraction"] == 0.80
        assert "CALIBRATED" in g.efficiency_source and "SKU_CLOCK_RATIO" in g.efficiency_source
        assert params_for_gpu(g).tensor_clock_fraction == 0.80
        assert params_for_gpu(g).gemm_max_efficiency == P.gemm_max_efficiency  # the ceiling is not touched
    for name in ("p100", "a100-80gb", "h100"):
        assert params_for_gpu(get_gpu(name)).tensor_clock_fraction == 1.0
