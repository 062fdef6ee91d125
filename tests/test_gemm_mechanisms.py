"""Between a GEMM alone in a kernel table and the same GEMM inside a training step (issue 34): the GPU's
measured Maximum Achievable Matmul FLOPS as the shape models' cap, and the SMs that communication kernels
running beside the compute hold (docs/sources.md §11, docs/validation.md §8)."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.compute import gemm_efficiency, layer_time_s, params_from_dict
from topotrain.compute.gemm_tables import DEVICES, find_table
from topotrain.compute.gemm_wave import shape_model, with_free_sms
from topotrain.compute.roofline import free_sm_count, params_for_gpu
from topotrain.hardware.gpus import get_gpu
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind

H100 = get_gpu("h100")
H100_MAMF = 794.5 / 989.0  # ml-engineering's MAMF table, H100 SXM bf16
A100_MAMF = 271.2 / 312.0  # the same table, A100 SXM bf16


def test_mamf_fractions_are_the_measured_figures() -> None:
    for gpu in ("h100", "h200"):
        assert params_for_gpu(gpu).gemm_mamf_fraction == pytest.approx(H100_MAMF, rel=1e-12)
    for gpu in ("a100-40gb", "a100-80gb"):
        assert params_for_gpu(gpu).gemm_mamf_fraction == pytest.approx(A100_MAMF, rel=1e-12)
    assert params_for_gpu("v100").gemm_mamf_fraction == 1.0  # no MAMF figure: no cap
    for gpu in ("h100", "h200", "a100-40gb", "a100-80gb"):
        src = get_gpu(gpu).efficiency_source
        assert "gemm_mamf_fraction" in src and "MEASURED" in src and "Maximum Achievable Matmul FLOPS" in src
    # what the defaults read: nothing held for communication, the ceiling model (which reads no MAMF)
    assert params_for_gpu("h100").comm_sm_count == 0 and params_for_gpu("h100").gemm_model == "ceiling"


def test_xla_table_tops_out_at_the_mamf() -> None:
    """XLA's fastest H100 bf16 kernel (b=4, 4096×2048, k=4096: 804.7 TFLOP/s, random operands, median of 5
    short traced runs) is within 2 % of the MAMF (794.5: randn, 100 iterations after a 30 s warm-up): the
    table's kernels ran at the clock a board holds on random data under its power limit, not above it."""
    t = find_table("h100-sxm5-80gb", "bf16")
    assert t is not None
    top = float(np.max(t.flops / t.time_s)) / 1e12
    assert top == pytest.approx(804.7, abs=0.1)
    assert abs(top / (H100_MAMF * 989.0) - 1.0) < 0.02


def test_shape_model_capped_at_the_mamf() -> None:
    base = params_for_gpu("h100")
    capped = params_from_dict({"gemm_model": "table"}, base=base)
    free = params_from_dict({"gemm_model": "table", "gemm_mamf_fraction": 1.0}, base=base)
    # GPT-3 175B's QKV GEMM at TP 8: past the table's k ≤ 4,096 the wave model extrapolates above the MAMF
    shape = (1, 8192, 4608, 12288)
    assert gemm_efficiency(*shape, H100, "bf16", params=free) > 0.82  # 0.84 (docs/validation.md §8)
    assert gemm_efficiency(*shape, H100, "bf16", params=capped) == pytest.approx(H100_MAMF, rel=1e-9)
    # a measured shape below the MAMF keeps its measurement (780.2 TFLOP/s)
    eff = gemm_efficiency(1, 4096, 4096, 4096, H100, "bf16", params=capped)
    assert eff * H100.peak("bf16") / 1e12 == pytest.approx(780.2, abs=0.1)
    # the ceiling model does not read the MAMF
    low = params_from_dict({"gemm_mamf_fraction": 0.5}, base=base)
    assert gemm_efficiency(*shape, H100, "bf16", params=low) == gemm_efficiency(*shape, H100, "bf16", params=base)


def test_free_sms_keep_the_per_sm_rate() -> None:
    dev = DEVICES["h100-sxm5-80gb"]
    part = with_free_sms(dev, 108)
    assert part.sm_count == 108 and part.hbm_bandwidth_bytes_per_s == dev.hbm_bandwidth_bytes_per_s
    assert part.peak("bf16") / 108 == pytest.approx(dev.peak("bf16") / 132, rel=1e-12)
    assert with_free_sms(dev, 0).sm_count == 1 and with_free_sms(dev, 500).sm_count == 132
    held = params_from_dict({"comm_sm_count": 24}, base=params_for_gpu("h100"))
    assert free_sm_count(H100, held) == 108 and free_sm_count(H100, params_for_gpu("h100")) == 132
    assert free_sm_count(H100, params_from_dict({"comm_sm_count": 500})) == 1


def test_comm_sms_slow_gemms_by_their_waves() -> None:
    """24 of an H100's 132 SMs held by a collective (the blocks of an FSDP all-gather beside a GEMM on an
    H100, docs/sources.md §11): a GEMM of many waves slows by about 132/108; one that filled the GPU in one
    wave needs a second (the forum's 'tail effect': its GEMM took nearly twice as long)."""
    model = shape_model("h100", "bf16", "wave")
    assert model is not None
    many = model.time_s(1, 16384, 16384, 8192, 24) / model.time_s(1, 16384, 16384, 8192)
    assert many == pytest.approx(132 / 108, rel=0.04)
    one_wave = (1, 11 * 128, 12 * 256, 8192)  # 132 tiles of 128×256
    tail = model.time_s(*one_wave, 24) / model.time_s(*one_wave)
    assert 1.3 <= tail <= 2.05
    # the roofline: the shape models and the ceiling model alike, attention too
    base = params_for_gpu("h100")
    for extra in ({}, {"gemm_model": "table", "gemm_mamf_fraction": 1.0}):
        p = params_from_dict(extra, base=base)
        held = params_from_dict({**extra, "comm_sm_count": 24}, base=base)
        ratio = gemm_efficiency(1, 16384, 16384, 8192, H100, "bf16", params=held) / gemm_efficiency(
            1, 16384, 16384, 8192, H100, "bf16", params=p)
        assert ratio == pytest.approx(108 / 132, rel=0.05)
    att = Layer("attn", LayerKind.ATTENTION, 4 * 2048 * 2048 * 128 * 16, 10 * 2048 * 2048 * 128 * 16, 0, 0,
                gemm_shape=(2048, 2048, 128), gemm_count=16, gemm_batch_scales="count")
    held = params_from_dict({"comm_sm_count": 24}, base=base)
    slow = layer_time_s(att, H100, 8, phase="fwd", params=held) / layer_time_s(att, H100, 8, phase="fwd", params=base)
    assert 1.15 <= slow <= 1.3


def test_new_fields_are_checked_at_the_edge() -> None:
    for bad in ({"comm_sm_count": -1}, {"comm_sm_count": 1.5}, {"gemm_mamf_fraction": 1.2},
                {"gemm_mamf_fraction": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            params_from_dict(bad)
