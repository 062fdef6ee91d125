"""What a recorded operator computed: the ATen kernels inside it that topotrain's compute model can time,
each with its FLOPs, bytes and GEMM shape, read from the Execution Trace's tensors
(:class:`~topotrain.traces.model.Kernel`).

A CPU trace carries no FLOP counts, but its ET gives every operator's name and the elements (and, in an
untrimmed ET, the shapes) of its tensors, which is what the roofline needs (Williams, Waterman & Patterson,
CACM 2009; the FLOP formulas are the usual ones, as in PyTorch's ``torch.utils.flop_counter``):

* **GEMMs** — ``aten::mm``, ``addmm``, ``linear``, ``matmul``, ``bmm``, ``baddbmm``: ``2·count·M·N·K``. With
  shapes, M, N, K (and the batch count) are read off them; without (a trimmed ET), a single GEMM's three
  element counts ``a = M·K``, ``b = K·N``, ``c = M·N`` give ``M = √(ac/b)``, ``N = √(bc/a)``, ``K = √(ab/c)``
  (``mm``, ``addmm``, ``linear`` only: a batched GEMM needs its shapes).
* **Convolutions** — ``aten::convolution`` and its backends, ``convolution_backward``: the implicit GEMM
  ``M = N·Ho·Wo``, ``N = Cout``, ``K = Cin/groups·kh·kw`` (Chetlur et al., cuDNN, 2014), from the weight's
  and the output's shapes; the backward does one such GEMM per gradient it returns (input, weight).
* **Attention** — fused SDPA kernels (``_scaled_dot_product_*attention*``, ``_flash_attention_*``):
  ``4·B·H·S·Sk·D`` forward (two GEMMs), 2.5 times that backward (FlashAttention-2, Dao 2023: five GEMMs),
  from the query's and key's shapes.
* **Memory-bound** — element-wise ops, norms, softmax, embedding, the loss: one FLOP per output element,
  and the bytes of every tensor read and written (``kinds`` below).
* **Collective launches** — the ``c10d::*`` call that hands a collective to the backend (kind ``launch``):
  on CPU gloo its span is the backend's host work of taking the buffers in (milliseconds on a busy host);
  with NCCL on a GPU it enqueues one kernel, so it is costed as one kernel launch. (A wait inside the call
  is not in it: the import cuts it out, :mod:`topotrain.traces.importer`.)

An operator's events nest (``aten::linear`` calls ``aten::addmm``): the outermost one that classifies is the
kernel and what it contains is not counted again; one that cannot be classified (no shapes) hands over to
the events inside it. Everything else in the operator — ops the model does not know, the dispatcher, Python
— is what the what-if keeps at its measured time (:mod:`topotrain.traces.gpu`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from topotrain.traces.model import Kernel
from topotrain.traces.readers import C10D_OPS, EtNode, Event

_GEMM = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::linear": (0, 1), "aten::matmul": (0, 1),
         "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
_CONV = frozenset({"aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
                   "aten::mkldnn_convolution", "aten::thnn_conv2d", "aten::_slow_conv2d_forward",
                   "aten::cudnn_convolution", "aten::_nnpack_spatial_convolution"})
_CONV_BWD = frozenset({"aten::convolution_backward"})
_ATTENTION = frozenset({"aten::_scaled_dot_product_flash_attention_for_cpu",
                        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                        "aten::_scaled_dot_product_cudnn_attention",
                        "aten::_flash_attention_forward", "aten::_efficient_attention_forward"})
#: FlashAttention-2's backward FLOPs over its forward's (five GEMMs against two; Dao 2023)
ATTENTION_BWD_RATIO = 2.5
#: Memory-bound ATen operators and the compute model's kind for each (its kernel count and vector rate).
_MEMORY: dict[str, str] = {
    **{f"aten::{n}": "elementwise" for n in (
        "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "exp", "log", "sqrt", "rsqrt", "pow",
        "tanh", "sigmoid", "gelu", "gelu_backward", "relu", "relu_", "threshold_backward", "silu",
        "silu_backward", "tanh_backward", "sigmoid_backward", "copy_", "fill_", "zero_", "clone", "addcmul_",
        "addcdiv_", "lerp_", "clamp", "clamp_", "where", "masked_fill", "masked_fill_", "sum", "mean",
        "_foreach_add_", "_foreach_mul_", "_foreach_addcmul_", "_foreach_addcdiv_", "_foreach_lerp_",
        "_foreach_sqrt", "_foreach_div_", "_foreach_copy_", "_foreach_zero_", "_fused_sgd_", "_fused_adam_",
        "_fused_adamw_", "cat", "_chunk_cat", "split_with_sizes_copy", "max_pool2d_with_indices",
        "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d",
        "_adaptive_avg_pool2d_backward", "native_dropout", "native_dropout_backward")},
    **{f"aten::{n}": "norm" for n in ("native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                                      "native_batch_norm_backward", "_native_batch_norm_legit",
                                      "_native_batch_norm_legit_no_training", "_fused_rms_norm",
                                      "_fused_rms_norm_backward", "native_group_norm",
                                      "native_group_norm_backward")},
    **{f"aten::{n}": "softmax" for n in ("_softmax", "_log_softmax", "_softmax_backward_data",
                                         "_log_softmax_backward_data")},
    **{f"aten::{n}": "embedding" for n in ("embedding", "embedding_dense_backward", "index_select",
                                           "embedding_backward")},
    **{f"aten::{n}": "loss" for n in ("nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
                                      "nll_loss2d_backward")},
}
#: The kinds a kernel can have (a :class:`~topotrain.workload.layer.LayerKind` value each).
KINDS = ("linear", "matmul", "conv", "attention", "elementwise", "norm", "softmax", "embedding", "loss", "launch")


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs) if xs else 1


def _shape(shapes: Sequence[Any], i: int) -> tuple[int, ...] | None:
    """Argument ``i``'s shape (a non-empty list of sizes), else None."""
    s = shapes[i] if len(shapes) > i else None
    if not isinstance(s, list | tuple) or not s or not all(type(d) is int for d in s):
        return None
    return tuple(s)


def _gemm(n: EtNode) -> tuple[str, tuple[int, int, int, int]] | None:
    """(kind, (count, M, N, K)) of a GEMM operator, from shapes where the ET has them, else from three element
    counts (single GEMMs only); None when they do not determine it."""
    a_i, b_i = _GEMM[n.name]
    a, b = _shape(n.in_shapes, a_i), _shape(n.in_shapes, b_i)
    if a is not None and b is not None:
        if n.name == "aten::linear" and len(b) == 2:  # weight (N, K)
            return "linear", (1, _prod(a[:-1]), b[0], b[1])
        if len(b) == 2 and len(a) >= 2:  # (…, M, K) @ (K, N): one GEMM over all leading rows
            return "linear", (1, _prod(a[:-1]), b[1], a[-1])
        if len(a) >= 3 and len(b) >= 3 and a[-1] == b[-2]:  # batched
            return "matmul", (_prod(a[:-2]), a[-2], b[-1], a[-1])
        return None
    if n.name not in ("aten::mm", "aten::addmm", "aten::linear"):
        return None
    ea = n.in_numel[a_i] if len(n.in_numel) > a_i else 0
    eb = n.in_numel[b_i] if len(n.in_numel) > b_i else 0
    ec = n.out_numel[0] if n.out_numel else 0
    if min(ea, eb, ec) <= 0:
        return None
    m, nn, k = (round(math.sqrt(x)) for x in (ea * ec / eb, eb * ec / ea, ea * eb / ec))
    if m * k != ea or k * nn != eb or m * nn != ec:  # not a single GEMM's counts
        return None
    return "linear", (1, m, nn, k)


def _conv(n: EtNode) -> tuple[tuple[int, int, int, int], int] | None:
    """((1, M, N, K), GEMMs) of a convolution (forward: 1) or its backward (one per gradient returned)."""
    if n.name in _CONV_BWD:
        out, w = _shape(n.in_shapes, 0), _shape(n.in_shapes, 2)  # grad_output, input, weight
        gemms = sum(1 for i in (0, 1) if len(n.out_numel) > i and n.out_numel[i] > 0)
    else:
        out, w = _shape(n.out_shapes, 0), _shape(n.in_shapes, 1)
        gemms = 1
    if out is None or w is None or len(w) < 3 or w[0] <= 0 or gemms == 0:
        return None
    return (1, _prod(out) // w[0], w[0], _prod(w[1:])), gemms


def _attention(n: EtNode, backward: bool) -> tuple[int, int, int, int] | None:
    """(B·H, S, Sk, D) of a fused attention kernel from its query's and key's shapes (the backward's are its
    2nd and 3rd inputs, after the output gradient)."""
    q, k = (_shape(n.in_shapes, 1), _shape(n.in_shapes, 2)) if backward else (_shape(n.in_shapes, 0),
                                                                               _shape(n.in_shapes, 1))
    if q is None or k is None or len(q) < 3 or len(k) < 3:
        return None
    return _prod(q[:-2]), q[-2], k[-2], q[-1]


def classify(n: EtNode, measured_s: float) -> Kernel | None:
    """The kernel an ET operator is (module docstring), or None when the model does not know it or its
    tensors do not determine it."""
    if n.name in C10D_OPS:
        return Kernel("launch", n.name, measured_s, 0.0, 0.0)
    nbytes = float(sum(n.in_numel) + sum(n.out_numel)) * n.elem_bytes
    if n.name in _GEMM:
        g = _gemm(n)
        if g is None:
            return None
        kind, (c, m, nn, k) = g
        return Kernel(kind, n.name, measured_s, 2.0 * c * m * nn * k, nbytes, (c, m, nn, k), n.elem_bytes)
    if n.name in _CONV or n.name in _CONV_BWD:
        cv = _conv(n)
        if cv is None:
            return None
        (c, m, nn, k), gemms = cv
        return Kernel("conv", n.name, measured_s, 2.0 * gemms * m * nn * k, nbytes, (c, m, nn, k), n.elem_bytes,
                      n.name in _CONV_BWD)
    base = n.name.removesuffix("_backward")
    if base in _ATTENTION:
        backward = base != n.name
        at = _attention(n, backward)
        if at is None:
            return None
        c, s, sk, d = at
        flops = 4.0 * c * s * sk * d * (ATTENTION_BWD_RATIO if backward else 1.0)
        return Kernel("attention", n.name, measured_s, flops, nbytes, at, n.elem_bytes, backward)
    mem = _MEMORY.get(n.name)
    if mem is None:
        return None
    return Kernel(mem, n.name, measured_s, float(max(n.out_numel or (0,))), nbytes, (), n.elem_bytes)


def op_kernels(events: Sequence[Event], et: dict[int, EtNode] | None) -> list[tuple[float, Kernel]]:
    """(start µs, kernel) of the outermost classifiable events among ``events`` (one top-level operator and
    the events nested in it, sorted by start, longest first): an event inside a classified one is skipped."""
    if et is None:
        return []
    out: list[tuple[float, Kernel]] = []
    covered_until = -math.inf
    for e in events:
        if e.ts_us < covered_until:
            continue
        node = et.get(e.rf_id) if e.rf_id is not None else None
        k = classify(node, e.dur_us * 1e-6) if node is not None else None
        if k is not None:
            out.append((e.ts_us, k))
            covered_until = e.end_us
    return out
