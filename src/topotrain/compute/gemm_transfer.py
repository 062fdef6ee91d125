"""The wave model carried from a GPU with a measured tensor-core table to one without (issue 34, part 6).

No public table times A100 tensor-core GEMMs by shape (docs/sources.md §10). The rule used by
``compute.params.gemm_transfer`` for a catalog GPU with no table at a 16-bit dtype:

* take the wave model fitted on XLA's H100 bf16 table (:func:`topotrain.compute.gemm_wave.shape_model`,
  the ``wave`` fit: per-tile efficiencies, prologue, fixed latency, split-K; no table correction, since the
  measured/model ratios are H100 facts);
* lay it on the target GPU's own SMs, dense peak and HBM bandwidth (the catalog);
* scale each tile's efficiency by the ratio of the two GPUs' Maximum Achievable Matmul FLOPS fractions
  (``gemm_mamf_fraction``, measured per GPU, docs/sources.md §11: A100 0.869 / H100 0.803 = 1.082; at most
  1): the best shape each GPU reaches sets how close to its peak its tiles run;
* keep the prologue's **time** (a tile's prologue and epilogue move the same operand tiles through shared
  memory on both GPUs), i.e. its length in K steps scales with the per-SM peak (``k_prologue ×
  (peak/SMs of the target) / (peak/SMs of the source)``: 202 K steps on H100 → 78 on A100), as
  :func:`topotrain.compute.roofline.effective_k_half` argues for the ceiling model's ramp.

The roofline caps the result at the target's ``gemm_mamf_fraction`` as it does the table models. A rule,
not a measurement: the figures it gives are checked only through the training rows (docs/validation.md §8).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from topotrain.compute.gemm_tables import KernelDevice
from topotrain.compute.gemm_wave import WaveParams, shape_model, wave_time_s, with_free_sms
from topotrain.hardware.gpus import GPUSpec, get_gpu

#: The GPU and dtype whose fitted wave model is carried over.
SOURCE_GPU = "h100"
SOURCE_DTYPE = "bf16"
TRANSFER_DTYPES = frozenset({"bf16", "fp16"})


@dataclass(frozen=True)
class TransferredWave:
    """The wave model of :data:`SOURCE_GPU` laid on another GPU (module docstring)."""

    device: KernelDevice
    dtype: str
    wave: WaveParams

    def time_s(self, b: int, m: int, n: int, k: int, reserved_sms: int = 0) -> float:
        """Seconds of ``b`` GEMMs ``m×n`` with reduction ``k``; ``reserved_sms`` held by other kernels."""
        dev = with_free_sms(self.device, self.device.sm_count - reserved_sms) if reserved_sms else self.device
        return float(wave_time_s(self.wave, dev, self.dtype, np.array([b]), np.array([m]), np.array([n]),
                                 np.array([k]))[0])


def _mamf(gpu: GPUSpec) -> float:
    return float(gpu.compute_efficiency.get("gemm_mamf_fraction", 1.0))


@lru_cache(maxsize=16)
def transferred_model(g: GPUSpec, dtype: str) -> TransferredWave | None:
    """The H100 bf16 wave model carried to GPU ``g`` at ``dtype`` (None for the source GPU itself, a dtype
    other than bf16/fp16, or a GPU without SM count or measured MAMF figure)."""
    if g.name == SOURCE_GPU or dtype not in TRANSFER_DTYPES or dtype not in g.peak_flops_per_s or g.sm_count <= 0:
        return None
    if "gemm_mamf_fraction" not in g.compute_efficiency:
        return None
    source = shape_model(SOURCE_GPU, SOURCE_DTYPE, "wave")
    if source is None:
        return None
    src_dev = source.table.device
    scale = _mamf(g) / _mamf(get_gpu(SOURCE_GPU))
    per_sm = (g.peak(dtype) / g.sm_count) / (src_dev.peak(SOURCE_DTYPE) / src_dev.sm_count)
    wave = replace(source.wave,
                   tile_efficiency=tuple(min(1.0, e * scale) for e in source.wave.tile_efficiency),
                   k_prologue=source.wave.k_prologue * per_sm)
    device = KernelDevice(f"{g.name} (transferred from {SOURCE_GPU})", g.name, g.sm_count,
                          g.hbm_bandwidth_bytes_per_s, MappingProxyType(dict(g.peak_flops_per_s)),
                          f"catalog {g.name}; wave model of {SOURCE_GPU} {SOURCE_DTYPE}")
    return TransferredWave(device, dtype, wave)
