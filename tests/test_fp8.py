"""FP8 as Transformer Engine runs it (compute/fp8.py): the blocks' linear layers at the FP8 roofline plus their
casts (closed forms from the HBM bandwidth), everything else in bf16, and the FP8 weight workspace in memory."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.compute.fp8 import FP8Compute, is_fp8_linear
from topotrain.compute.roofline import RooflineModel, local_gemm_dims
from topotrain.hardware.gpus import get_gpu
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.memory import memory_per_rank, memory_plan_from
from topotrain.training.simulate import simulate
from topotrain.workload.layer import LayerKind
from topotrain.workload.zoo import get_model


def test_fp8_linear_layers_closed_form() -> None:
    gpu, model, batch, tp, m_count = get_gpu("h100-sxm"), get_model("gpt3-125m"), 2, 2, 4
    base = RooflineModel(gpu, "bf16")
    fp8 = FP8Compute(base, micro_batches=m_count)
    f, b = fp8.layer_times(model, batch, tp)
    f16, b16 = base.layer_times(model, batch, tp)
    f8, b8 = RooflineModel(gpu, "fp8").layer_times(model, batch, tp)
    bw = gpu.hbm_bandwidth_bytes_per_s * base.params.memory_efficiency
    launch = base.params.kernel_launch_overhead_s
    linear = [i for i, lay in enumerate(model.layers) if is_fp8_linear(lay)]
    assert len(linear) == 4 * 12  # QKV, projection, fc1, fc2 of each of the 12 blocks
    for i in linear:
        c, m, n, k = local_gemm_dims(model.layers[i], batch, tp)  # type: ignore[misc]
        cast_x, cast_w, cast_y = (4.0 * e / bw + launch for e in (c * m * k, c * n * k, c * m * n))
        assert f[i] == pytest.approx(f8[i] + cast_x + cast_w / m_count, rel=1e-12)
        assert b[i] == pytest.approx(b8[i] + cast_y, rel=1e-12)
        assert f8[i] < f16[i]
    rest = np.array([i not in linear for i in range(len(model.layers))])
    assert np.array_equal(f[rest], f16[rest]) and np.array_equal(b[rest], b16[rest])
    kinds = {model.layers[i].kind for i in np.flatnonzero(rest)}
    assert LayerKind.ATTENTION in kinds or LayerKind.MATMUL in kinds  # attention stays in bf16
    assert not is_fp8_linear(next(lay for lay in model.layers if lay.name == "lm_head"))


def test_fp8_plan_time_and_weight_workspace() -> None:
    """An FP8 plan on H100: faster than bf16, slower than every layer at the FP8 peak, and 2 bytes more per
    local linear parameter of weights (TE's rowwise + columnwise FP8 weight copies)."""
    kw = {"cluster": {"server": "dgx-h100", "servers": 1}, "model": "gpt3-125m", "batch": 32, "network": "analytical"}
    runs = {dt: simulate(scenario_from_dict({**kw, "plan": {"micro_batch": 4, "dtype": dt}})) for dt in ("bf16", "fp8")}
    assert runs["fp8"].iteration_time_s < runs["bf16"].iteration_time_s
    sc = scenario_from_dict({**kw, "plan": {"micro_batch": 4, "dtype": "fp8"}})
    mem8 = memory_per_rank(sc.model, memory_plan_from(sc.plan))
    sc16 = scenario_from_dict({**kw, "plan": {"micro_batch": 4, "dtype": "bf16"}})
    mem16 = memory_per_rank(sc16.model, memory_plan_from(sc16.plan))
    linear_params = sum(lay.param_count for lay in sc.model.layers if is_fp8_linear(lay))
    assert mem8.weights_bytes - mem16.weights_bytes == pytest.approx(2.0 * linear_params, rel=1e-12)
    assert mem8.activations_bytes == mem16.activations_bytes
