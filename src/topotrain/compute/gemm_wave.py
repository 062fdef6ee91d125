"""GEMM time by shape: Habitat's and NeuSight's wave model with parameters fitted on measured kernels, and
the measured tables interpolated around it.

**The wave model** (Yu et al., "Habitat", USENIX ATC 2021, §3.2, wave scaling; Lee et al., "Forecasting GPU
Performance for Deep Learning Training and Inference" (NeuSight), ASPLOS 2025, §4: a kernel's latency is
its number of waves times one tile's latency; NVIDIA, *Matrix Multiplication Background User's Guide*: tile
and wave quantization). For ``b`` GEMMs with an ``m×n`` output and reduction ``k`` on a device with ``S``
SMs, dense peak ``P`` and HBM bandwidth ``W``:

* the output is cut into ``tm×tn`` tiles, one thread block each: ``tiles = b·⌈m/tm⌉·⌈n/tn⌉``;
* with fewer tiles than SMs the library splits ``k`` over up to ``⌊S/tiles⌋`` blocks (split-K), no slice
  shorter than ``split_k_min``; a split GEMM pays ``split_k_latency_s`` for the reduction of partial sums;
* tiles run in waves of one per SM, ``waves = ⌈tiles·split/S⌉``, and one tile's main loop over its K slice
  plus its prologue/epilogue (``k_prologue`` K steps' worth) runs at ``efficiency(tile)`` of the per-SM
  peak: ``t_tile = 2·tm·tn·(k/split + k_prologue) / (P/S · efficiency(tile))``;
* the library runs the fastest tile shape (cuBLAS' heuristics): ``t_compute = min over tiles of waves·t_tile``;
* small or skinny GEMMs are bound by HBM: ``t_memory = e·b·(m·k + k·n + m·n) / (W · memory_efficiency)``,
  ``e`` the bytes per element;
* ``t = max(t_compute, t_memory) + fixed_latency_s`` (grid launch, pipeline fill and drain; in NeuSight's
  CUDA-event timings also the framework's dispatch).

The tile shapes are facts of the libraries (:data:`topotrain.compute.gemm_tables.TENSOR_TILES`); the other
parameters are fitted per device and dtype on that device's kernel table by :func:`fit_wave` (coordinate
descent on the mean absolute log error). No training run enters the fit.

**The table model** is the wave model times the measured-over-modelled ratio at the nearest measured
shapes, interpolated in log-shape space (inverse-distance weights over the nearest four measured shapes in
``log2 b, log2 m, log2 n, log2 k``; a shape beyond the table's range takes the ratio at the range's edge), so
on a measured shape it returns the measurement. A shape measured faster than the same GEMM with a shorter
``k`` (:func:`faster_than_shorter_k`: the library switched algorithm there) is left out of the interpolation,
so that its ratio does not spread to its neighbours. XLA's GPU cost model interpolates its own table's FLOP/s
by distance-weighted averages of neighbouring grid points (``matmul_interpolator.cc``, ``interpolator.h``);
here the wave model underneath carries shapes beyond the table (training GEMMs reach ``k`` = 50k) by the
mechanism, and only the measured/model ratio is interpolated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Literal

import numpy as np

from topotrain.compute.gemm_tables import ELEMENT_BYTES, GemmTable, KernelDevice, table_for_gpu

#: The GEMM models of :class:`topotrain.compute.roofline.ComputeParams` ``gemm_model``.
GemmModelName = Literal["ceiling", "wave", "table", "learned"]
SHAPE_MODELS: tuple[str, ...] = ("wave", "table")

# Bounds of the fitted parameters: (per-tile efficiency, k_prologue, fixed latency, memory efficiency,
# split_k_min, split-K latency). Streaming kernels reach at most about 0.9 of the datasheet HBM bandwidth
# (BabelStream, Deakin et al.; NeuSight's FP32 element-wise kernels above 200 MB: 0.80-0.90 on A100 and
# V100), which bounds the memory efficiency where a table has too few memory-bound shapes to set it.
_LOWER = (0.05, 1.0, 1e-8, 0.05, 32.0, 1e-8)
_UPPER = (1.0, 8192.0, 100e-6, 0.9, 65536.0, 100e-6)
_START = (0.8, 64.0, 4e-6, 0.8, 512.0, 2e-6)
_NEIGHBOURS = 4


@dataclass(frozen=True)
class WaveParams:
    """The wave model's parameters for one device and dtype (see the module docstring)."""

    tiles: tuple[tuple[int, int], ...]
    tile_efficiency: tuple[float, ...]
    k_prologue: float
    fixed_latency_s: float
    memory_efficiency: float
    split_k_min: float
    split_k_latency_s: float

    def vector(self) -> np.ndarray:
        """The fitted numbers as one array (per-tile efficiencies first)."""
        return np.array([*self.tile_efficiency, self.k_prologue, self.fixed_latency_s, self.memory_efficiency,
                         self.split_k_min, self.split_k_latency_s], dtype=np.float64)

    @classmethod
    def from_vector(cls, tiles: tuple[tuple[int, int], ...], v: np.ndarray) -> WaveParams:
        """Inverse of :meth:`vector`."""
        nt = len(tiles)
        rest = [float(x) for x in v[nt:]]
        return cls(tiles, tuple(float(x) for x in v[:nt]), *rest)


def _bounds(ntiles: int) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([_LOWER[0]] * ntiles + list(_LOWER[1:]))
    hi = np.array([_UPPER[0]] * ntiles + list(_UPPER[1:]))
    return lo, hi


def wave_time_s(
    params: WaveParams, device: KernelDevice, dtype: str,
    b: np.ndarray | float, m: np.ndarray | float, n: np.ndarray | float, k: np.ndarray | float,
) -> np.ndarray:
    """Seconds of ``b`` GEMMs ``m×n`` (reduction ``k``) on ``device`` at ``dtype`` by the wave model
    (vectorized over the shape arrays)."""
    b, m, n, k = (np.asarray(x, dtype=np.float64) for x in (b, m, n, k))
    sms = float(device.sm_count)
    per_sm = device.peak(dtype) / sms
    best = np.full(np.broadcast(b, m, n, k).shape, np.inf)
    for (tm, tn), eff in zip(params.tiles, params.tile_efficiency, strict=True):
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        split = np.where(tiles < sms, np.maximum(1.0, np.minimum(np.floor(sms / tiles),
                                                                 np.floor(k / params.split_k_min))), 1.0)
        waves = np.ceil(tiles * split / sms)
        t = waves * 2.0 * tm * tn * (k / split + params.k_prologue) / (per_sm * eff)
        best = np.minimum(best, t + np.where(split > 1, params.split_k_latency_s, 0.0))
    nbytes = ELEMENT_BYTES[dtype] * b * (m * k + k * n + m * n)
    t_mem = nbytes / (device.hbm_bandwidth_bytes_per_s * params.memory_efficiency)
    return np.maximum(best, t_mem) + params.fixed_latency_s


def _loss(v: np.ndarray, table: GemmTable) -> float:
    p = WaveParams.from_vector(table.tiles, v)
    pred = wave_time_s(p, table.device, table.dtype, table.b, table.m, table.n, table.k)
    return float(np.mean(np.abs(np.log(pred / table.time_s))))


def fit_wave(table: GemmTable, restarts: int = 3) -> WaveParams:
    """The wave parameters that minimize the mean ``|ln(model/measured)|`` over ``table``'s rows.

    Deterministic coordinate descent in log-parameter space: each parameter in turn is multiplied and divided
    by ``1 + step`` (kept inside its bounds) while that lowers the loss; ``step`` halves from 1 to 1e-3
    whenever no parameter moves, and the descent restarts from where it ended ``restarts`` times (a move
    that only pays off after another parameter has moved)."""
    if len(table) == 0:
        raise ValueError("cannot fit the wave model on an empty table")
    nt = len(table.tiles)
    lo, hi = _bounds(nt)
    v = np.array([_START[0]] * nt + list(_START[1:]), dtype=np.float64)
    cur = _loss(v, table)
    for _ in range(restarts):
        step = 1.0
        while step > 1e-3:
            moved = False
            for i in range(len(v)):
                for factor in (1.0 + step, 1.0 / (1.0 + step)):
                    trial = v.copy()
                    trial[i] = min(hi[i], max(lo[i], v[i] * factor))
                    loss = _loss(trial, table)
                    if loss < cur - 1e-12:
                        v, cur, moved = trial, loss, True
            if not moved:
                step /= 2.0
    return WaveParams.from_vector(table.tiles, v)


def _log_coords(b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    return np.log2(np.stack([np.asarray(x, dtype=np.float64) for x in (b, m, n, k)], axis=-1))


@dataclass(frozen=True, eq=False)
class ShapeModel:
    """GEMM time by shape on one device and dtype: the wave model fitted on its table (``mode="wave"``) or
    that model corrected towards the table's measurements (``mode="table"``; the rows
    :func:`faster_than_shorter_k` flags are not interpolated)."""

    table: GemmTable
    wave: WaveParams
    mode: str = "table"

    def __post_init__(self) -> None:
        if self.mode not in SHAPE_MODELS:
            raise ValueError(f"unknown shape model {self.mode!r}; known: {', '.join(SHAPE_MODELS)}")
        t = self.table
        keep = ~faster_than_shorter_k(t)
        model = wave_time_s(self.wave, t.device, t.dtype, t.b, t.m, t.n, t.k)
        object.__setattr__(self, "_coords", _log_coords(t.b, t.m, t.n, t.k)[keep])
        object.__setattr__(self, "_log_ratio", np.log(t.time_s / model)[keep])

    def _correction(self, coords: np.ndarray) -> np.ndarray:
        known: np.ndarray = self._coords  # type: ignore[attr-defined]
        ratio: np.ndarray = self._log_ratio  # type: ignore[attr-defined]
        q = np.clip(coords, known.min(axis=0), known.max(axis=0))
        d2 = ((q[:, None, :] - known[None, :, :]) ** 2).sum(axis=-1)
        near = np.argsort(d2, axis=1, kind="stable")[:, :_NEIGHBOURS]
        dn = np.take_along_axis(d2, near, axis=1)
        w = 1.0 / (dn + 1e-12)
        return np.exp((w * ratio[near]).sum(axis=1) / w.sum(axis=1))

    def times_s(self, b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                reserved_sms: int = 0) -> np.ndarray:
        """Seconds of each shape (arrays of equal length). ``reserved_sms``: SMs that other kernels (a
        communication kernel running beside the GEMM) hold, so that the GEMM's tiles run in waves over the
        others (:func:`with_free_sms`); the table's measured/model ratio at the shape is kept."""
        t = self.table
        device = with_free_sms(t.device, t.device.sm_count - reserved_sms) if reserved_sms else t.device
        base = wave_time_s(self.wave, device, t.dtype, b, m, n, k)
        if self.mode == "wave":
            return base
        return base * self._correction(_log_coords(b, m, n, k))

    def time_s(self, b: int, m: int, n: int, k: int, reserved_sms: int = 0) -> float:
        """Seconds of ``b`` GEMMs ``m×n`` with reduction ``k`` (``reserved_sms``: see :meth:`times_s`)."""
        return float(self.times_s(np.array([b]), np.array([m]), np.array([n]), np.array([k]), reserved_sms)[0])


def with_free_sms(device: KernelDevice, sms: int) -> KernelDevice:
    """``device`` as a kernel sees it when only ``sms`` of its SMs are free (at least one): the same per-SM
    peak and the same HBM, the whole-device peaks scaled by ``sms / sm_count``."""
    free = max(1, min(int(sms), device.sm_count))
    scale = free / device.sm_count
    peaks = MappingProxyType({k: v * scale for k, v in device.peak_flops_per_s.items()})
    return replace(device, sm_count=free, peak_flops_per_s=peaks)


@lru_cache(maxsize=32)
def shape_model(gpu: str, dtype: str, mode: str) -> ShapeModel | None:
    """The shape model of catalog GPU ``gpu`` at ``dtype``, fitted on all of its table's rows; None when no
    table times that GPU at that dtype (:func:`topotrain.compute.gemm_tables.table_for_gpu`)."""
    table = table_for_gpu(gpu, dtype)
    if table is None:
        return None
    return ShapeModel(table, fit_wave(table), mode)


# ---- held-out kernel errors ---------------------------------------------------------------------------
def folds_of(table: GemmTable, folds: int = 4, seed: int = 34) -> np.ndarray:
    """Each row's fold (0 … folds−1), drawn with a fixed seed."""
    return np.random.default_rng(seed).integers(0, folds, size=len(table))


def cross_validated_times(table: GemmTable, folds: int = 4, seed: int = 34) -> dict[str, np.ndarray]:
    """Each row's time predicted by the wave and table models fitted on the other folds only (k-fold
    cross-validation over shapes): ``{"wave": ..., "table": ...}``."""
    fold = folds_of(table, folds, seed)
    out = {mode: np.empty(len(table)) for mode in SHAPE_MODELS}
    for f in range(folds):
        held = fold == f
        if not held.any():
            continue
        train = table.subset(~held)
        params = fit_wave(train)
        for mode in SHAPE_MODELS:
            model = ShapeModel(train, params, mode)
            out[mode][held] = model.times_s(table.b[held], table.m[held], table.n[held], table.k[held])
    return out


def faster_than_shorter_k(table: GemmTable) -> np.ndarray:
    """Rows measured faster than the same ``(b, m, n)`` at a shorter ``k``: more work, less time, so the
    library ran a different algorithm there (a split-K or stream-K kernel its heuristic chose for one shape
    and not the other); no model of the shape alone can follow both."""
    out = np.zeros(len(table), dtype=bool)
    keys = np.stack([table.b, table.m, table.n], axis=1)
    for key in np.unique(keys, axis=0):
        idx = np.flatnonzero((keys == key).all(axis=1))
        for i in idx:
            shorter = idx[table.k[idx] < table.k[i]]
            out[i] = bool(shorter.size) and bool(table.time_s[i] < table.time_s[shorter].max())
    return out


@dataclass(frozen=True)
class KernelErrors:
    """Absolute relative errors of a model on a table's held-out rows of one kind (``"all"``: every kind)."""

    device: str
    dtype: str
    kind: str
    model: str
    rows: int
    median: float
    p90: float
    worst: float
    worst_shape: tuple[int, int, int, int]


def error_summary(table: GemmTable, predicted_s: np.ndarray, model: str,
                  mask: np.ndarray | None = None, kind: str = "all") -> KernelErrors:
    """Median / 90th percentile / worst ``|predicted/measured − 1|`` over the rows ``mask`` keeps."""
    keep = np.ones(len(table), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    err = np.abs(predicted_s[keep] / table.time_s[keep] - 1.0)
    if err.size == 0:
        return KernelErrors(table.device.name, table.dtype, kind, model, 0, math.nan, math.nan, math.nan,
                            (0, 0, 0, 0))
    i = int(np.argmax(err))
    shape = tuple(int(x[keep][i]) for x in (table.b, table.m, table.n, table.k))
    return KernelErrors(table.device.name, table.dtype, kind, model, int(err.size), float(np.median(err)),
                        float(np.percentile(err, 90)), float(err[i]), shape)  # type: ignore[arg-type]
