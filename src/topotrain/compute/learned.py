"""A learned cross-GPU GEMM-kernel predictor (NeuSight/Habitat style), evaluated leave-one-GPU-out.

**What it predicts.** Like NeuSight (Lee et al., "Forecasting GPU Performance for Deep Learning Training and
Inference", ASPLOS 2025, §4: a kernel's *utilization*, bounded by the roofline, not its latency), the target
is the kernel's utilization of its roofline floor,

    ``u = t_floor / t``,  ``t_floor = max(F / P, B / W)``,

``F = 2·b·m·n·k`` its FLOPs, ``B = e·b·(m·k + k·n + m·n)`` the bytes it must move at ``e`` bytes per element,
``P`` the device's peak at the dtype and ``W`` its HBM bandwidth. ``u`` lies in (0, 1] (a kernel cannot beat
its floor); the regressor learns ``ln u`` and a prediction is clipped at 1 (``t ≥ t_floor``).

**Features that carry over between GPUs** (all normalized by the device, except the kernel's own shape):

* the shape: ``log2 b, m, n, k`` and whether it is a batched GEMM (``bmm``) or a linear layer (bias epilogue);
* arithmetic intensity over the device's ridge point, ``log2((F/B) / (P/W))`` (memory- or compute-bound);
* the floor's two terms in seconds, ``log10 F/P`` and ``log10 B/W``, clipped to [1 µs, 1 ms]: they place a
  kernel against the fixed launch and dispatch latency, which is absolute; beyond 1 ms latency no longer
  matters, and an unclipped time would only tell the regressor which (slow or fast) GPU it is looking at;
* tiles over SMs, Habitat's and NeuSight's wave quantization (Yu et al., "Habitat", USENIX ATC 2021, §3.2):
  for ``128×128`` and ``64×64`` output tiles, ``log2(tiles / SMs)`` and the last wave's fill
  ``tiles / (⌈tiles/SMs⌉·SMs)``; and one ``128×128`` tile's main loop at the per-SM peak,
  ``log10(2·128·128·k / (P/SMs))``;
* one device feature: **board power per SM**, ``ln(TDP / SMs)``. A large FP32 GEMM on a board whose power
  limit is low for its SMs runs below its boost clock: NeuSight's own measurements put the largest GEMMs
  (> 100 GFLOP) of the two 70–72 W cards at 0.46 (T4, 1.75 W/SM) and 0.27 (L4, 1.24 W/SM) of the datasheet
  FP32 peak, the 250–700 W cards (2.3–5.3 W/SM) at 0.69–0.97. Held out, without this feature the V100
  PCIe's median error is 27.4 % and the P4's 33.9 % (11.0 % and 12.8 % with it); adding the SM count and the
  per-SM peak moves every GPU's median by at most 1.0 point (``benchmarks/learned_gemm.py --ablation``).
  With eight GPUs, a device constant lets a regression tree recognize *which* GPU a row comes from, which
  does not carry over, so the model keeps the one feature with a mechanism behind it.

**Model**: scikit-learn's ``HistGradientBoostingRegressor`` (squared error, default hyper-parameters,
``random_state=0``, one thread: the fit is the same bit for bit), trained on NeuSight's FP32 ``linear`` and
``bmm`` kernels on eight GPUs (:func:`topotrain.compute.gemm_tables.load_crossgpu_tables`; docs/sources.md
§10). scikit-learn is imported only when a model is fitted (not at start-up).

**Bands.** Every prediction carries the 5th–95th percentile band of the leave-one-GPU-out residuals
``ln(measured / predicted)`` of its kind (each GPU predicted by the model trained on the seven others), so the
band says how far a prediction for a GPU *outside* the training set has been off: nominally 90 % of kernels on
a new GPU fall inside it. Measured, each GPU against the band of the other seven GPUs' residuals: 67.5 % (L4)
to 100 %, 87.8 % on average; the two power-capped cards (T4 72.3 %, L4 67.5 %) are where it falls short.

**Scope.** Only FP32 (SIMT) kernels were measured on more than one GPU, so :func:`learned_gemm_time_s` answers
``fp32`` and returns None for other dtypes, where the roofline keeps its ceiling. The FP32 model does not carry
over to tensor cores: trained on the seven other GPUs, it predicts XLA's H100 bf16 table at 208.6 % median
error (tf32: 99.8 %) against the roofline's 32.2 % (16.0 %) (printed by the benchmark, not used).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import numpy as np

from topotrain.compute.gemm_tables import ELEMENT_BYTES, GemmTable, KernelDevice, load_crossgpu_tables
from topotrain.compute.gemm_wave import WaveParams, fit_wave, wave_time_s
from topotrain.hardware.gpus import GPUSpec

#: dtypes the learned model answers (measured on several GPUs)
LEARNED_DTYPES: tuple[str, ...] = ("fp32",)
#: the band: these quantiles of the leave-one-GPU-out log residuals (a nominal 90 % band)
BAND_QUANTILES: tuple[float, float] = (0.05, 0.95)
_TIME_CLIP_S = (1e-6, 1e-3)
_TILES = ((128, 128), (64, 64))
FEATURES: tuple[str, ...] = (
    "log2 b", "log2 m", "log2 n", "log2 k", "bmm", "log2 intensity/ridge", "log10 F/P s", "log10 B/W s",
    "log2 tiles128/SMs", "wave fill 128", "log2 tiles64/SMs", "wave fill 64", "log10 tile128 loop s",
    "ln TDP/SM",
)
#: Device features: ``power`` (the model's: board power per SM), and for the ablation of
#: ``benchmarks/learned_gemm.py --ablation`` ``none`` (kernel features only) and ``power+sm`` (also
#: ``log2 SMs`` and ``log10`` per-SM peak).
VARIANTS: tuple[str, ...] = ("power", "none", "power+sm")


def floor_time_s(device: KernelDevice, dtype: str, b: np.ndarray, m: np.ndarray, n: np.ndarray,
                 k: np.ndarray) -> np.ndarray:
    """The roofline floor ``max(F/P, B/W)`` of each GEMM (module docstring)."""
    flops = 2.0 * b * m * n * k
    nbytes = ELEMENT_BYTES[dtype] * b * (m * k + k * n + m * n)
    return np.maximum(flops / device.peak(dtype), nbytes / device.hbm_bandwidth_bytes_per_s)


def features(device: KernelDevice, dtype: str, b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
             bmm: np.ndarray, variant: str = "power") -> np.ndarray:
    """The :data:`FEATURES` of each GEMM on ``device`` (rows × features; ``variant``: :data:`VARIANTS`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown feature variant {variant!r}; known: {', '.join(VARIANTS)}")
    b, m, n, k = (np.asarray(x, dtype=np.float64) for x in (b, m, n, k))
    if device.tdp_w <= 0 or device.sm_count <= 0:
        raise ValueError(f"device {device.name!r} needs its SM count and board power for the learned model")
    peak, bw, sms = device.peak(dtype), device.hbm_bandwidth_bytes_per_s, float(device.sm_count)
    flops = 2.0 * b * m * n * k
    nbytes = ELEMENT_BYTES[dtype] * b * (m * k + k * n + m * n)
    lo, hi = _TIME_CLIP_S
    cols = [np.log2(b), np.log2(m), np.log2(n), np.log2(k), np.asarray(bmm, dtype=np.float64),
            np.log2((flops / nbytes) / (peak / bw)),
            np.log10(np.clip(flops / peak, lo, hi)), np.log10(np.clip(nbytes / bw, lo, hi))]
    for tm, tn in _TILES:
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        cols += [np.log2(tiles / sms), tiles / (np.ceil(tiles / sms) * sms)]
    cols.append(np.log10(2.0 * 128 * 128 * k / (peak / sms)))
    if variant != "none":
        cols.append(np.full(b.shape, math.log(device.tdp_w / sms)))
    if variant == "power+sm":
        cols += [np.full(b.shape, math.log2(sms)), np.full(b.shape, math.log10(peak / sms))]
    return np.stack(cols, axis=1)


def _table_xy(table: GemmTable, variant: str) -> tuple[np.ndarray, np.ndarray]:
    bmm = np.array([kind == "bmm" for kind in table.kind])
    x = features(table.device, table.dtype, table.b, table.m, table.n, table.k, bmm, variant)
    y = np.log(floor_time_s(table.device, table.dtype, table.b, table.m, table.n, table.k) / table.time_s)
    return x, y


def _regressor() -> Any:
    # scikit-learn imported here: only a fit needs it, and it costs about a second at start-up
    from sklearn.ensemble import HistGradientBoostingRegressor
    return HistGradientBoostingRegressor(random_state=0)


def _one_thread() -> Any:
    # threadpoolctl (a scikit-learn dependency): one OpenMP thread, so that a fit is the same bit for bit and
    # does not oversubscribe a shared machine (measured: 0.5 s on one thread, 18 s with two busy cores)
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1)


@dataclass(frozen=True, eq=False)
class LearnedGemm:
    """The regressor fitted on ``devices``' kernel tables (:func:`fit_learned`)."""

    devices: tuple[str, ...]
    regressor: Any
    variant: str = "power"

    def times_s(self, device: KernelDevice, dtype: str, b: np.ndarray, m: np.ndarray, n: np.ndarray,
                k: np.ndarray, bmm: np.ndarray | None = None) -> np.ndarray:
        """Predicted seconds of each GEMM on ``device`` (``bmm``: which are batched GEMMs; default ``b > 1``)."""
        b, m, n, k = (np.asarray(x, dtype=np.float64) for x in (b, m, n, k))
        flags = b > 1 if bmm is None else np.asarray(bmm, dtype=bool)
        x = features(device, dtype, b, m, n, k, flags, self.variant)
        with _one_thread():
            log_u = np.minimum(self.regressor.predict(x), 0.0)
        return floor_time_s(device, dtype, b, m, n, k) / np.exp(log_u)


def fit_learned(tables: Sequence[GemmTable], variant: str = "power") -> LearnedGemm:
    """The learned model trained on every row of ``tables`` (deterministic: fixed seed, one thread)."""
    if not tables:
        raise ValueError("cannot fit the learned model on no tables")
    xs, ys = zip(*(_table_xy(t, variant) for t in tables), strict=True)
    reg = _regressor()
    with _one_thread():
        reg.fit(np.concatenate(xs), np.concatenate(ys))
    return LearnedGemm(tuple(t.device.name for t in tables), reg, variant)


# ---- leave-one-GPU-out ----------------------------------------------------------------------------------
def transferred_wave(fitted: Sequence[WaveParams]) -> WaveParams:
    """The wave parameters a GPU without a table takes from GPUs with one: the median of each fitted
    parameter (per-tile efficiencies, prologue, latencies, memory efficiency, split-K threshold) over them.
    The efficiencies are fractions of the per-SM peak and the latencies seconds, so they carry over as they
    are; the median keeps one odd GPU from moving them."""
    if not fitted:
        raise ValueError("no fitted wave parameters to transfer")
    tiles = fitted[0].tiles
    return WaveParams.from_vector(tiles, np.median(np.stack([p.vector() for p in fitted]), axis=0))


@dataclass(frozen=True, eq=False)
class HeldOut:
    """One GPU's kernels predicted by models that never saw that GPU: ``learned`` (trained on the other
    GPUs' tables) and ``wave`` (the wave model with :func:`transferred_wave` parameters of the others)."""

    table: GemmTable
    learned_s: np.ndarray
    wave_s: np.ndarray


@lru_cache(maxsize=4)
def _wave_fits(tables: tuple[GemmTable, ...]) -> tuple[WaveParams, ...]:
    return tuple(fit_wave(t) for t in tables)


def leave_one_gpu_out(tables: Sequence[GemmTable] | None = None, wave: bool = True,
                      only: Sequence[str] | None = None, variant: str = "power") -> list[HeldOut]:
    """Each GPU of ``tables`` (default: the shipped NeuSight tables) predicted by the learned model trained on
    the others and, with ``wave``, by the wave model transferred from the others (NaN without). ``only``:
    hold out just these devices (the models are still trained on all the others). ``variant``: the device
    features (:data:`VARIANTS`)."""
    tabs = tuple(load_crossgpu_tables() if tables is None else tables)
    fits = _wave_fits(tabs) if wave else ()
    out = []
    for i, held in enumerate(tabs):
        if only is not None and held.device.name not in only:
            continue
        rest = [t for j, t in enumerate(tabs) if j != i]
        model = fit_learned(rest, variant)
        bmm = np.array([kind == "bmm" for kind in held.kind])
        learned = model.times_s(held.device, held.dtype, held.b, held.m, held.n, held.k, bmm)
        if wave:
            params = transferred_wave([p for j, p in enumerate(fits) if j != i])
            waved = wave_time_s(params, held.device, held.dtype, held.b, held.m, held.n, held.k)
        else:
            waved = np.full(len(held), np.nan)
        out.append(HeldOut(held, learned, waved))
    return out


@dataclass(frozen=True)
class Band:
    """Multiplicative band of a learned prediction: the truth lies in ``[t·low, t·high]`` for the stated
    share of held-out kernels."""

    low: float
    high: float
    coverage: float


def bands_from(held: Sequence[HeldOut]) -> dict[str, Band]:
    """Per kind (``linear``, ``bmm``) and ``all``: the :data:`BAND_QUANTILES` of the pooled leave-one-GPU-out
    log residuals ``ln(measured/predicted)``."""
    res: dict[str, list[np.ndarray]] = {}
    for h in held:
        r = np.log(h.table.time_s / h.learned_s)
        kinds = np.asarray(h.table.kind)
        for kind in (*h.table.kinds, "all"):
            res.setdefault(kind, []).append(r if kind == "all" else r[kinds == kind])
    q0, q1 = BAND_QUANTILES
    out = {}
    for kind, parts in res.items():
        r = np.concatenate(parts)
        out[kind] = Band(float(np.exp(np.quantile(r, q0))), float(np.exp(np.quantile(r, q1))), q1 - q0)
    return out


@lru_cache(maxsize=1)
def shipped_model() -> LearnedGemm:
    """The learned model trained on all shipped NeuSight tables (eight GPUs)."""
    return fit_learned(load_crossgpu_tables())


@lru_cache(maxsize=1)
def shipped_held_out() -> tuple[HeldOut, ...]:
    """Every shipped GPU predicted by the learned model trained on the seven others (eight fits: seconds,
    once per process)."""
    return tuple(leave_one_gpu_out(wave=False))


@lru_cache(maxsize=1)
def shipped_bands() -> dict[str, Band]:
    """The bands of :func:`shipped_model`'s predictions, from the shipped tables' leave-one-GPU-out residuals
    (:func:`shipped_held_out`)."""
    return bands_from(shipped_held_out())


def learned_device(gpu: GPUSpec, sms: int | None = None) -> KernelDevice:
    """A catalog GPU as the learned model sees it when ``sms`` of its SMs are free (default: all): the same
    per-SM peak and power per SM, the whole HBM bandwidth (:func:`topotrain.compute.gemm_wave.with_free_sms`
    does the same for the wave model)."""
    free = gpu.sm_count if sms is None else max(1, min(int(sms), gpu.sm_count))
    scale = free / gpu.sm_count if gpu.sm_count > 0 else 1.0
    peaks = MappingProxyType({d: v * scale for d, v in gpu.peak_flops_per_s.items()})
    return KernelDevice(gpu.name, gpu.name, free, gpu.hbm_bandwidth_bytes_per_s, peaks, gpu.source,
                        gpu.tdp_w * scale)


def learned_gemm_time_s(device: KernelDevice, dtype: str, b: int, m: int, n: int, k: int) -> float | None:
    """Seconds of ``b`` GEMMs ``m×n`` (reduction ``k``) on ``device`` by :func:`shipped_model`; None where
    the model does not answer: a dtype outside :data:`LEARNED_DTYPES`, or a device without its SM count,
    board power or a peak at ``dtype``."""
    if dtype not in LEARNED_DTYPES or dtype not in device.peak_flops_per_s or device.tdp_w <= 0 \
            or device.sm_count <= 0 or min(b, m, n, k) <= 0:
        return None
    t = shipped_model().times_s(device, dtype, np.array([b]), np.array([m]), np.array([n]), np.array([k]))
    return float(t[0])


@dataclass(frozen=True)
class LearnedPrediction:
    """A learned GEMM time with its band: the truth lay in ``[low_s, high_s]`` for ``coverage`` of the
    kernels of GPUs held out of training (:func:`shipped_bands`, per kind)."""

    time_s: float
    low_s: float
    high_s: float
    coverage: float


def learned_gemm_prediction(device: KernelDevice, dtype: str, b: int, m: int, n: int, k: int,
                            kind: str | None = None) -> LearnedPrediction | None:
    """:func:`learned_gemm_time_s` with its band, the band of ``kind`` (``linear`` or ``bmm``; default ``bmm``
    when ``b > 1``); None where the model does not answer."""
    t = learned_gemm_time_s(device, dtype, b, m, n, k)
    if t is None:
        return None
    band = shipped_bands()[kind if kind is not None else ("bmm" if b > 1 else "linear")]
    return LearnedPrediction(t, t * band.low, t * band.high, band.coverage)
