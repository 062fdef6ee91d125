"""Issue 34, the A100 gap: what the SC'21 rows' model counts is what Megatron-LM 2021 ran, and the tensor-parallel
all-reduces the rows block on run at the bus bandwidth nccl-tests measures on eight A100s (benchmarks/a100_gap.py,
docs/validation.md §8 "The A100 gap")."""

from __future__ import annotations

import pytest

from topotrain.api import load_cluster, time_collective
from topotrain.workload.layer import LayerKind
from topotrain.workload.zoo import get_model

#: nccl-tests ``all_reduce_perf`` busbw of 8x A100 on NVSwitch (NVIDIA/nccl-tests #175; docs/sources.md §4)
MEASURED_BUSBW = 232.54e9


@pytest.mark.parametrize("mib", [64, 80, 96, 128, 192, 256])
def test_tp_allreduce_at_the_sc21_message_sizes_runs_at_the_measured_a100_busbw(mib: int) -> None:
    """The SC'21 rows' TP all-reduces (``b·s·h`` fp16: 64–256 MiB) over the eight GPUs of a DGX A100 are within
    5 % of nccl-tests' measured busbw; a model 20 % off either way (NVLink at 0.8x or 1.2x) fails."""
    cluster = load_cluster({"server": "nvswitch-8", "servers": 1})
    size = mib * 2**20
    rep = time_collective(cluster, "allreduce", "ring", size, "analytical", ranks=list(cluster.topology.gpus[:8]))
    busbw = size / rep.time_s * 2 * 7 / 8
    assert abs(busbw / MEASURED_BUSBW - 1) < 0.05


def test_sc21_attention_is_megatron_2021s_unfused_path() -> None:
    """Megatron-LM of SC'21 (no FlashAttention): ``baddbmm`` scores with the scale in the GEMM (k = head dim), the
    fused scale-mask-softmax over rows of s keys, dropout over the ``a·s²`` probabilities with a 1-byte mask, then
    ``bmm`` with the values (k = s); the score matrix is read and written at 2 bytes an element."""
    s, h, a = 2048, 2304, 24
    layers = {lay.name.split(".")[-1]: lay for lay in get_model("megatron-1.7b").layers if lay.block == 0}
    scores, soft, drop, ctx = (layers[k] for k in ("scores", "softmax", "attention_dropout", "context"))
    assert scores.kind == ctx.kind == LayerKind.MATMUL
    assert (scores.gemm_shape, scores.gemm_count) == ((s, s, h // a), a)
    assert (ctx.gemm_shape, ctx.gemm_count) == ((s, h // a, s), a)
    assert "scale" not in layers and "mask" not in layers  # no element-wise scale or mask kernel of their own
    elems = a * s * s
    assert soft.kind == LayerKind.SOFTMAX and soft.row_elems == s
    assert soft.fwd_bytes == pytest.approx(2 * 2 * elems)  # read the scores, write the probabilities
    assert drop.fwd_bytes == pytest.approx(2 * 2 * elems + elems)  # and its mask, one byte an element
    assert scores.fwd_bytes >= 2 * elems and ctx.fwd_bytes >= 2 * elems
