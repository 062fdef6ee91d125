"""The roofline checked against a measured profile: per layer kind, the time :func:`roofline.layer_times`
predicts for the layers a :class:`~topotrain.compute.profile.ProfileTable` holds, beside the time measured,
and beside it the two GEMM models by shape: ``wave`` (the wave model fitted on the GPU's kernel table,
:mod:`~topotrain.compute.gemm_wave`; where the GPU has a table at the dtype) and ``learned`` (the learned
cross-GPU model, :mod:`~topotrain.compute.learned`; FP32 tables, with its band). Both change only matrix
multiplies (``linear``, ``matmul``, ``moe_router``): the other kinds keep the roofline's time.

A ratio predicted / measured below 1 means the roofline is optimistic for that kind on that GPU (it assumes
a higher efficiency than the kernels reached), above 1 pessimistic. What the ratio checks depends on what
:func:`~topotrain.compute.profile.measure_profile` ran for the kind:

* ``conv``, ``linear``, ``matmul``, ``moe_router``: the layer's own GEMMs (``torch.matmul`` of its
  ``(count, M, N, K)``, its input- and weight-gradient GEMMs in backward), so the ratio is the roofline's
  GEMM efficiency (peak × shape efficiency × ceiling) against cuBLAS on that shape;
* ``attention``: its GEMMs unfused, an upper bound on a fused kernel's time (a ratio below 1 is then not
  evidence of optimism);
* every other kind: a streaming ``torch.add`` over the layer's HBM bytes, so the ratio is the roofline's
  achievable memory bandwidth against the bandwidth a plain streaming kernel reaches.

A table measured on the CPU is refused: the roofline describes a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from topotrain.compute.gemm_tables import ELEMENT_BYTES, GemmTable, KernelDevice
from topotrain.compute.gemm_wave import shape_model
from topotrain.compute.learned import LEARNED_DTYPES, learned_device, learned_gemm_time_s, shipped_bands
from topotrain.compute.profile import ProfileTable
from topotrain.compute.roofline import ComputeParams, gemm_efficiency, layer_times, params_for_gpu
from topotrain.hardware.gpus import GPUSpec, get_gpu, normalize_dtype
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import LayerKind, Model

#: kinds whose profile entry times the layer's own GEMMs
GEMM_KINDS = frozenset({LayerKind.CONV, LayerKind.LINEAR, LayerKind.MATMUL, LayerKind.MOE_ROUTER})
#: kinds whose time the shape models (wave, learned) change: matrix multiplies, not convolutions
SHAPED_KINDS = frozenset({LayerKind.LINEAR, LayerKind.MATMUL, LayerKind.MOE_ROUTER})


def _measured_as(kind: str) -> str:
    if kind in GEMM_KINDS:
        return "its GEMMs"
    if kind == LayerKind.ATTENTION:
        return "its GEMMs unfused (upper bound)"
    return "a streaming add of its bytes"


@dataclass(frozen=True)
class KindCheck:
    """Forward + backward seconds of the ``layers`` layers of one kind: measured, and as the roofline
    predicts them."""

    kind: str
    layers: int
    measured_s: float
    predicted_s: float
    #: the same layers with ``gemm_model: wave`` (None: no kernel table for the GPU at the dtype)
    wave_s: float | None = None
    #: with ``gemm_model: learned`` (None: the learned model does not answer the dtype)
    learned_s: float | None = None
    #: the learned model's band for a kind of matrix multiplies (None for the others)
    learned_band_s: tuple[float, float] | None = None

    @property
    def ratio(self) -> float:
        """predicted / measured (below 1: the roofline is optimistic)."""
        return self.predicted_s / self.measured_s if self.measured_s > 0 else float("inf")

    @property
    def wave_ratio(self) -> float | None:
        """wave / measured (None: no wave prediction)."""
        return None if self.wave_s is None or self.measured_s <= 0 else self.wave_s / self.measured_s

    @property
    def learned_ratio(self) -> float | None:
        """learned / measured (None: no learned prediction)."""
        return None if self.learned_s is None or self.measured_s <= 0 else self.learned_s / self.measured_s

    @property
    def measured_as(self) -> str:
        """What the profiler ran for this kind (what the ratio checks)."""
        return _measured_as(self.kind)


def roofline_check(table: ProfileTable, model: Model, params: ComputeParams | None = None) -> list[KindCheck]:
    """Per layer kind (in the order kinds first appear in ``model``), the measured seconds of the layers of
    ``model`` that ``table`` holds beside the roofline's prediction for them on ``table.gpu`` at the table's
    micro-batch, dtype and tensor-parallel degree, and the same with ``gemm_model: wave`` and ``learned``
    where they answer (module docstring). ``params``: the roofline's constants (default: the GPU's own)."""
    if table.measured_on_cpu:
        raise ConfigError("compute.profile", f"{table.model or 'the table'} was measured on the CPU",
                          "check the roofline against a table measured on a GPU (topotrain profile --device cuda)")
    unknown = sorted(set(table.entries) - {lay.name for lay in model.layers})
    if unknown:
        raise ConfigError("compute.profile", f"{model.name} has no layer {unknown[0]!r}",
                          "check the profile against the model it was measured on")
    base = params if params is not None else params_for_gpu(table.gpu)
    dtype = normalize_dtype(table.dtype)
    gpu = get_gpu(table.gpu)
    variants: dict[str, ComputeParams] = {"roofline": base}
    if shape_model(gpu.name, dtype, "wave") is not None:
        variants["wave"] = replace(base, gemm_model="wave")
    if dtype in LEARNED_DTYPES and learned_gemm_time_s(learned_device(gpu), dtype, 1, 1, 1, 1) is not None:
        variants["learned"] = replace(base, gemm_model="learned")
    times = {name: layer_times(model, table.gpu, table.batch, dtype=table.dtype, tp=table.tp, params=p)
             for name, p in variants.items()}
    acc: dict[str, dict[str, float]] = {}  # per kind, in model order: layers, measured s, each model's s
    for i, lay in enumerate(model.layers):
        e = table.entries.get(lay.name)
        if e is not None:
            row = acc.setdefault(str(lay.kind), {"layers": 0.0, "measured": 0.0})
            row["layers"] += 1
            row["measured"] += e.fwd_s + e.bwd_s
            for name, (fwd, bwd) in times.items():
                row[name] = row.get(name, 0.0) + float(fwd[i] + bwd[i])
    band = shipped_bands()["all"] if "learned" in variants else None
    out = []
    for kind, row in acc.items():
        learned = row.get("learned")
        shaped = band is not None and learned is not None and kind in SHAPED_KINDS
        out.append(KindCheck(kind, int(row["layers"]), row["measured"], row["roofline"], row.get("wave"), learned,
                             (learned * band.low, learned * band.high) if shaped and band and learned else None))
    return out


def _ms(t: float | None) -> str:
    return "n/a" if t is None else f"{t * 1e3:.3f}"


def _ratio(r: float | None) -> str:
    return "" if r is None else f"{r:.2f}"


def format_check(rows: list[KindCheck]) -> str:
    """The check as an aligned text table, one line per kind, then the total: measured, then the roofline,
    the wave model and the learned model (its band in brackets for matrix multiplies) with each one's
    predicted/measured ratio."""
    lines = [f"{'kind':<12} {'layers':>6} {'measured ms':>12} {'roofline ms':>12} {'ratio':>6} {'wave ms':>10} "
             f"{'ratio':>6} {'learned ms [band]':>28} {'ratio':>6}  measured as"]
    for r in rows:
        band = f" [{r.learned_band_s[0] * 1e3:.3f}-{r.learned_band_s[1] * 1e3:.3f}]" if r.learned_band_s else ""
        lines.append(f"{r.kind:<12} {r.layers:>6d} {r.measured_s * 1e3:>12.3f} {r.predicted_s * 1e3:>12.3f} "
                     f"{r.ratio:>6.2f} {_ms(r.wave_s):>10} {_ratio(r.wave_ratio):>6} "
                     f"{_ms(r.learned_s) + band:>28} {_ratio(r.learned_ratio):>6}  {r.measured_as}")
    m = sum(r.measured_s for r in rows)
    p = sum(r.predicted_s for r in rows)
    tot = [f"{'all':<12} {sum(r.layers for r in rows):>6d} {m * 1e3:>12.3f} {p * 1e3:>12.3f} "
           f"{(p / m if m > 0 else float('inf')):>6.2f}"]
    for attr, width in (("wave_s", 10), ("learned_s", 28)):
        vals = [getattr(r, attr) for r in rows]
        t = None if any(v is None for v in vals) or not vals else sum(vals)
        tot.append(f"{_ms(t):>{width}} {_ratio(None if t is None or m <= 0 else t / m):>6}")
    lines.append(" ".join(tot))
    return "\n".join(lines)

def kernel_device_spec(device: KernelDevice) -> GPUSpec:
    """The catalog GPU a kernel table was measured on, or a GPU spec of the device's own datasheet figures
    (no fitted efficiencies: the roofline's defaults) when the catalog has none."""
    if device.gpu is not None:
        return get_gpu(device.gpu)
    return GPUSpec(device.name, "nvidia", dict(device.peak_flops_per_s), device.hbm_bandwidth_bytes_per_s, 1.0,
                   device.sm_count, tdp_w=device.tdp_w, source=device.source)


def roofline_kernel_times(table: GemmTable) -> np.ndarray:
    """What the roofline (``gemm_model: ceiling``) predicts for each kernel of ``table``, as it times a layer
    of one GEMM (:func:`topotrain.compute.roofline.layer_time_s`): ``max(compute, memory) + one kernel's
    launch overhead``, compute at :func:`~topotrain.compute.roofline.gemm_efficiency` of the peak, memory the
    operands and output once at ``memory_efficiency`` of the HBM bandwidth."""
    g = kernel_device_spec(table.device)
    params = params_for_gpu(g)
    e = ELEMENT_BYTES[table.dtype]
    out = np.empty(len(table))
    for i in range(len(table)):
        b, m, n, k = (int(x[i]) for x in (table.b, table.m, table.n, table.k))
        flops = 2.0 * b * m * n * k
        t_cmp = flops / (gemm_efficiency(b, m, n, k, g, table.dtype, params=params) * g.peak(table.dtype))
        t_mem = e * b * (m * k + k * n + m * n) / (g.hbm_bandwidth_bytes_per_s * params.memory_efficiency)
        out[i] = max(t_cmp, t_mem) + params.kernel_launch_overhead_s
    return out
