"""FP8 training as Transformer Engine runs it on Hopper (``plan.dtype: fp8``): which GEMMs run in FP8, and the
scaling work around them, read from TE's code (NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b,
2026-08-22; docs/frameworks.md "FP8").

* **Which GEMMs.** The linear layers inside the transformer blocks — TE's ``Linear``/``LayerNormLinear``/
  ``LayerNormMLP`` as Megatron-Core builds them (QKV, attention output projection, the MLP) — run their three
  GEMMs (forward, data gradient, weight gradient) in FP8 at the GPU's FP8 peak through the same roofline
  (:func:`topotrain.compute.roofline.layer_times` at ``fp8``). The default recipe is ``DelayedScaling``
  (``transformer_engine/common/recipe/__init__.py``: ``fp8_format = Format.HYBRID``, E4M3 forward and E5M2
  gradients; ``fp8_dpa = False``): attention itself stays in bf16, and so do the embedding and the output
  layer (Megatron's ``ColumnParallelLinear``, not a TE module) and every memory-bound layer.
* **Scaling overheads** (memory-bound kernels; the amax of each tensor is taken inside its cast kernel):
  ``transformer_engine/pytorch/module/linear.py: _linear_forward`` quantizes the input rowwise and, since the
  backward needs it, columnwise (``input_quantizer.set_usage(rowwise=True, columnwise=backward_needs_input)``):
  read 2 bytes, write 1 + 1 per input element; it quantizes the weight the same way only on the first
  micro-batch (``update_ws = is_first_microbatch is None or is_first_microbatch`` → ``quantize_weight(...,
  update_workspace=update_ws)``), charged here as ``1/num_micro_batches`` of it per micro-batch; the backward
  quantizes the output gradient rowwise (data gradient) and columnwise (weight gradient) with
  ``grad_output_quantizer``: read 2, write 1 + 1 per element. Each cast is one kernel launch.
* **Not modelled**: the per-step amax-history reduction and scale update (``FP8GlobalStateManager``: one
  small allreduce and one fused kernel per step); FP8 activations saved for the backward (the memory model
  keeps them in bf16, an over-estimate).
* **Memory**: the cached FP8 weight workspace, rowwise and columnwise: 2 bytes per local parameter of those
  linear layers (:func:`fp8_weight_copy_params`, training/memory.py).
"""

from __future__ import annotations

import numpy as np

from topotrain.compute.roofline import ComputeParams, RooflineModel, local_gemm_dims
from topotrain.workload.layer import Layer, LayerKind, Model

#: bytes one cast moves per element: read the 16-bit tensor, write its FP8 rowwise and columnwise copies
CAST_BYTES_PER_ELEMENT = 2.0 + 1.0 + 1.0
#: bytes of the FP8 weight workspace per parameter (rowwise + columnwise copies)
FP8_WEIGHT_COPY_BYTES = 2.0


def is_fp8_linear(layer: Layer) -> bool:
    """A linear layer of a transformer block with its own weights: a TE module whose GEMMs run in FP8."""
    return (layer.kind == LayerKind.LINEAR and layer.block >= 0 and layer.param_count > 0
            and layer.gemm_shape is not None)


class FP8Compute:
    """:class:`~topotrain.compute.roofline.ComputeModel` of TE's FP8 training (module docstring): the FP8
    linear layers at the FP8 roofline plus their casts, every other layer at ``base_dtype``."""

    def __init__(self, base: RooflineModel, micro_batches: int, base_dtype: str = "bf16") -> None:
        self.gpu = base.gpu
        self.params: ComputeParams = base.params
        self.base = RooflineModel(base.gpu, base_dtype, base.params)
        self.fp8 = RooflineModel(base.gpu, "fp8", base.params)
        self.micro_batches = max(1, int(micro_batches))

    def cast_s(self, elements: float) -> float:
        """One quantizing cast of ``elements`` 16-bit values (rowwise + columnwise FP8) and its launch."""
        bw = self.gpu.hbm_bandwidth_bytes_per_s * self.params.memory_efficiency
        return CAST_BYTES_PER_ELEMENT * elements / bw + self.params.kernel_launch_overhead_s

    def layer_times(self, model: Model, batch: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        fwd, bwd = self.base.layer_times(model, batch, tp)
        f8, b8 = self.fp8.layer_times(model, batch, tp)
        for i, lay in enumerate(model.layers):
            dims = local_gemm_dims(lay, batch, tp) if is_fp8_linear(lay) else None
            if dims is None:
                continue
            c, m, n, k = dims
            weight_cast = self.cast_s(float(c * n * k)) / self.micro_batches
            fwd[i] = f8[i] + self.cast_s(float(c * m * k)) + weight_cast
            bwd[i] = b8[i] + self.cast_s(float(c * m * n))
        return fwd, bwd


def fp8_weight_copy_params(layer: Layer) -> float:
    """Parameters of ``layer`` that TE keeps an FP8 workspace copy of (0 for a layer outside FP8)."""
    return float(layer.param_count) if is_fp8_linear(layer) else 0.0
