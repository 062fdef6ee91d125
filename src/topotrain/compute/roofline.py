"""Per-layer compute time on one GPU: a roofline with a size-dependent GEMM efficiency.

For every layer and pass (forward, backward) the time is

    t = max(t_compute, t_memory) + kernels · kernel_launch_overhead_s

(Williams, Waterman & Patterson, "Roofline", CACM 2009), where ``t_memory = bytes / (BW · memory_efficiency)``
and ``t_compute = flops / (peak(dtype) · efficiency(shape))``.

The GEMM efficiency follows NVIDIA's *Matrix Multiplication Background User's Guide* (Deep Learning
Performance documentation, "tile quantization" and "wave quantization"):

* the output ``M×N`` (times the number of independent GEMMs) is cut into ``tm×tn`` tiles, one per thread
  block; partial edge tiles waste work (**tile quantization**: ``M·N / (⌈M/tm⌉·tm·⌈N/tn⌉·tn)``);
* tiles run in waves of ``sm_count`` (one resident tile per SM, the usual case for large tensor-core
  tiles); the last wave is partly empty (**wave quantization**: ``tiles / (⌈tiles/SMs⌉·SMs)``);
* when there are fewer tiles than SMs and ``K`` is long, the library splits ``K`` over several thread
  blocks (CUTLASS/cuBLAS *split-K*), which multiplies the tile count;
* each tile's main loop over ``K`` has a fixed prologue/epilogue cost, so efficiency ramps as
  ``K/(K + k_half)``;
* a kernel has a fixed in-kernel latency (grid start, pipeline fill, tail) that a small GEMM cannot
  amortize: the **small-GEMM ramp** ``t/(t + gemm_fixed_latency_s)``.

Like cuBLAS' heuristics, the best of a few tile shapes is taken, smaller tiles having a lower per-tile
efficiency (less operand reuse). Convolutions use their implicit-GEMM shape (``M = N·Ho·Wo``,
``N = Cout``, ``K = Cin·kh·kw``; Chetlur et al., "cuDNN", 2014) with their own ceiling. Element-wise,
normalization, softmax, pooling, embedding and loss layers are costed on the vector units (FP32 rate) and
are, in practice, memory-bound.

Backward GEMMs: a layer's backward is the input-gradient GEMM ``dX = dY·Wᵀ`` (shape ``M×K``, reduction
``N``) and the weight-gradient GEMM ``dW = Xᵀ·dY`` (shape ``K×N``, reduction ``M``); a layer whose input
needs no gradient (``bwd_flops ≈ fwd_flops``) runs the weight-gradient GEMM only.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): a ``column`` / ``row`` layer does ``1/tp`` of the
FLOPs and bytes; its GEMM's ``N`` (column) or ``K`` (row) is divided by ``tp`` — or, for per-head
GEMMs (attention), the number of heads. ``replicated`` / ``none`` layers do the full work on every rank.

Every constant of :class:`ComputeParams` names its source or says what it was calibrated against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field, fields, replace
from operator import attrgetter
from types import MappingProxyType
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BeforeValidator, Field, model_validator

from topotrain.compute.gemm_transfer import transferred_model
from topotrain.compute.gemm_wave import GemmModelName, shape_model
from topotrain.compute.learned import learned_device, learned_gemm_time_s
from topotrain.compute.membound import KernelClass, bandwidth_fraction
from topotrain.hardware.gpus import GPUSpec, get_gpu, normalize_dtype
from topotrain.util.errors import ConfigError, ConfigErrors, problems_of
from topotrain.util.fields import NonNegativeInt, PositiveInt, no_bool
from topotrain.util.problems import config_dataclass, several
from topotrain.workload.layer import Layer, LayerKind, Model, TPSplit

#: Layer kinds computed as GEMMs (tensor cores).
GEMM_KINDS: frozenset[LayerKind] = frozenset(
    {LayerKind.CONV, LayerKind.LINEAR, LayerKind.MATMUL, LayerKind.MOE_ROUTER}
)

_KERNELS_FWD: dict[str, int] = {
    # one cuBLAS / cuDNN kernel per GEMM; bias and activation epilogues fused (cuBLASLt)
    "conv": 1,
    "linear": 1,
    "matmul": 1,
    # FlashAttention-2 forward is one kernel
    "attention": 1,
    # PyTorch native batch/layer norm forward: one kernel (Welford statistics + normalize)
    "norm": 1,
    "elementwise": 1,
    "dropout": 1,
    "pool": 1,
    "embedding": 1,
    "softmax": 1,
    "concat": 1,
    # cross-entropy = log_softmax + nll_loss
    "loss": 2,
    # router GEMM, top-k, token permutation
    "moe_router": 3,
    "other": 1,
}
_KERNELS_BWD: dict[str, int] = {
    # input-gradient and weight-gradient GEMMs (1 when the input needs no gradient: see layer_time_s)
    "conv": 2,
    "linear": 2,
    "matmul": 2,
    # FlashAttention-2 backward: preprocessing (rowsum dO∘O), main kernel, dQ conversion
    "attention": 3,
    # norm backward: input gradient + weight/bias-gradient reduction
    "norm": 2,
    "elementwise": 1,
    "dropout": 1,
    "pool": 1,
    "softmax": 1,
    "concat": 1,
    # embedding backward: zero-fill + scatter-add of the gradient
    "embedding": 2,
    "loss": 2,
    "moe_router": 3,
    "other": 1,
}


#: Memory-bound layer kinds → the class of measured kernels whose bandwidth fraction they take under
#: ``memory_model: measured`` (:mod:`topotrain.compute.membound`). Dropout, pooling, concatenation, embedding
#: gathers, the loss and "other" have no measurement of their own and take the element-wise class (PyTorch
#: runs them as element-wise or gather/scatter kernels; Megatron's vocab-parallel cross-entropy is a chain of
#: element-wise and row-reduction ops). GEMM kinds and attention keep ``memory_efficiency``.
MEMORY_CLASS: Mapping[LayerKind, KernelClass] = MappingProxyType({
    LayerKind.NORM: "norm", LayerKind.SOFTMAX: "softmax", LayerKind.ELEMENTWISE: "elementwise",
    LayerKind.DROPOUT: "elementwise", LayerKind.POOL: "elementwise", LayerKind.CONCAT: "elementwise",
    LayerKind.EMBEDDING: "elementwise", LayerKind.LOSS: "elementwise", LayerKind.OTHER: "elementwise",
})
MemoryModelName = Literal["constant", "measured"]

#: A fraction of a peak, in (0, 1].
Fraction = Annotated[float, BeforeValidator(no_bool), Field(gt=0, le=1, allow_inf_nan=False)]
#: A finite number ≥ 0.
NonNegative = Annotated[float, BeforeValidator(no_bool), Field(ge=0, allow_inf_nan=False)]
def _tile(v: Any) -> Any:
    v = no_bool(v)
    return int(v) if isinstance(v, float) and math.isfinite(v) and v >= 1 else v


#: A GEMM tile side (a float is truncated to whole elements).
TileSide = Annotated[int, BeforeValidator(_tile), Field(gt=0)]


def _frozen_map(d: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(d))


@config_dataclass("compute.params")
class ComputeParams:
    """Tunable constants of the roofline compute model (SI units).

    Efficiencies are fractions of the datasheet dense peak (:meth:`GPUSpec.peak`) or of the datasheet HBM
    bandwidth. Sources / calibration:

    * ``gemm_max_efficiency`` = 0.80: large bf16/fp16 cuBLAS GEMMs are commonly measured at roughly
      80–88 % of the dense tensor peak on A100 and 70–77 % on H100 SXM; 0.80 sits between. This is an
      order-of-magnitude figure from public microbenchmarks, **not a cited measurement**: check it with
      :func:`topotrain.compute.profile.measure_profile` on the GPU at hand and tune it per GPU. A100 and
      H100/H200 override it with ceilings **calibrated** on training runs (0.71 and 0.62,
      :mod:`topotrain.hardware.gpus`); older GPUs (V100) keep 0.80.
    * ``conv_max_efficiency`` = 0.54: cuDNN implicit-GEMM convolutions (NHWC, tensor cores) run below
      cuBLAS GEMMs of the same shape (address generation, filter layouts). **Calibrated** by
      ``benchmarks/calibrate.py`` (least squares in log throughput, fit 0.542) on ResNet-50 v1.5 training
      at batch 256 with AMP against NVIDIA's published 1,200 img/s on V100-16GB and 2,470 img/s on
      A100-80GB (DeepLearningExamples, PyTorch 21.03; docs/sources.md §1): −3.6 % and +3.2 %.
    * ``attention_fwd_efficiency`` = 0.65 / ``attention_bwd_efficiency`` = 0.55: FlashAttention-2
      reaches 50–73 % of A100 peak, the backward pass at the lower end (Dao, "FlashAttention-2", 2023,
      abstract and §4).
    * ``tensor_clock_fraction`` = 1.0: the fraction of its boost clock (the clock its datasheet peak
      assumes) that a board's tensor cores hold through GEMM-bound training at its power limit; it divides
      the time of every matrix-multiply layer and of attention (not convolutions, whose calibrated ceiling
      already carries the clock the ResNet-50 rows ran at). A SKU attribute: the 300 W V100 SXM2 of a
      DGX-1 sets its own (:mod:`topotrain.hardware.gpus`, fitted by ``benchmarks/calibrate.py`` on NVIDIA's
      same-code DGX-1 / DGX-2H BERT figures); GPUs that hold their boost, or whose calibrated GEMM ceiling
      already absorbs what they hold (A100, H100), keep 1.0.
    * ``gemm_tiles``: ``(tm, tn, relative efficiency)`` candidates. 256×128 and 128×128 are cuBLAS'/CUTLASS'
      default large tensor-core tiles; smaller tiles reuse operands less. The relative efficiencies are
      **calibrated by hand** (not from a datasheet) so that small-N GEMMs are not over-penalized by wave
      quantization; re-check them with :func:`topotrain.compute.profile.measure_profile` on a GPU.
    * ``k_half`` = 64: the K ramp ``K/(K + k_half)``; a tile's prologue (first smem stages) and epilogue
      (store of the C tile) cost roughly one 64-deep main-loop step. **Calibrated** (by hand) together
      with ``conv_max_efficiency`` on ResNet-50, whose 1×1 convs have K = 64…2048.
    * ``k_half_reference_flops_per_sm`` = 125 TFLOP/s / 80 SMs (V100 FP16, where ``k_half`` was
      calibrated): the prologue/epilogue time is roughly fixed while a K step gets faster with the per-SM
      tensor throughput, so the ramp length scales with ``peak/SMs`` (:func:`effective_k_half`); on an
      A100 (312 TFLOP/s, 108 SMs) it is 118, on an H100 (989, 132) 307. 0 turns the scaling off.
      **Derived** from that argument, not fitted; it moved BERT/ResNet-50 on A100 towards their
      published throughputs (docs/validation.md §3).
    * ``split_k_min`` = 256: the shortest K slice split-K hands to one thread block (CUTLASS' split-K
      examples use slices of a few hundred).
    * ``gemm_fixed_latency_s`` = 1.5 µs: in-kernel fixed cost of a GEMM (grid launch onto the SMs,
      pipeline fill, tail) that small GEMMs cannot hide; order of magnitude of the minimum duration of a
      cuBLAS kernel in Nsight traces. **Assumption**, to be replaced by a measured profile.
    * ``memory_efficiency`` = 0.85: streaming benchmarks (BabelStream, Deakin et al.) typically reach
      about 85–92 % of the datasheet HBM bandwidth on NVIDIA data-center GPUs; PyTorch element-wise
      kernels sit at the lower end. **Assumption** of that order, not a measurement of ours; with
      ``memory_model: measured`` it is left to GEMMs and attention.
    * ``memory_model`` = ``constant``: how a memory-bound layer's bytes are timed. ``constant``: at
      ``memory_efficiency`` of the datasheet HBM bandwidth. ``measured``: norms, softmax and element-wise
      kinds (dropout, pooling, concatenation, embedding, the loss: :data:`MEMORY_CLASS`) at the bandwidth
      fraction NeuSight's kernel measurements give their class at their row length (``Layer.row_elems``)
      (:mod:`topotrain.compute.membound`; **measured** on A100 40/80GB, V100 and P100 — FP32 PyTorch
      kernels on PCIe boards, applied by bytes — and **transferred** to other GPUs as the median over those
      four, e.g. H100 element-wise 0.879, layer norm 0.71 at hidden 2,048 and 0.57 at 12,288, softmax 0.75
      over rows of 2,048; held-out kernel errors in docs/validation.md §8). The measured latency of those
      kernels (30–62 µs) is PyTorch's host dispatch in an idle-GPU benchmark and is not used:
      ``kernel_launch_overhead_s`` stays the per-kernel cost. Not the default: it moves the published
      validation from 4.4 % / 14.2 % (median / worst) to 4.9 % / 14.7 %.
    * ``vector_efficiency`` = 0.7: fraction of the FP32 (non-tensor) peak that element-wise math reaches;
      rarely binding, since these layers are memory-bound. **Assumption.**
    * ``kernel_launch_overhead_s`` = 4 µs per kernel: PyTorch eager dispatch + CUDA launch, of order
      4–5 µs per op (CUDA launch latency alone is a few µs). **Assumption**; applied to every kernel, so
      it bounds the time of tiny layers (and makes small-batch runs launch-bound).
    * ``gemm_model`` = ``ceiling``: how a matrix multiply's time is found. ``ceiling``: the shape efficiency
      above under ``gemm_max_efficiency``. ``wave``: the wave model fitted on a measured kernel table of the
      GPU at the dtype (:mod:`topotrain.compute.gemm_wave`; Habitat, NeuSight); ``table``: that model
      corrected towards the table's measurements. Both replace the ceiling, the tile/K ramps and the
      small-GEMM ramp for GEMMs whose GPU and dtype have a table (H100 bf16/fp16/tf32 from XLA; H100 and
      A100 fp32 from NeuSight); other GEMMs, convolutions and attention keep the ceiling. ``learned``: the
      learned cross-GPU model (:mod:`topotrain.compute.learned`) for FP32 GEMMs on any GPU whose SM count
      and board power are known; other dtypes keep the ceiling.
      ``tensor_clock_fraction`` still divides their time (1.0 on H100), though XLA's fastest H100 kernel
      (804.7 TFLOP/s, random operands) is within 1.3 % of the MAMF below, which was measured after a 30 s
      warm-up: the table already runs at the clock an H100 holds on random data under its power limit.
    * ``gemm_mamf_fraction`` = 1.0: the shape models' (``wave``, ``table``) cap on a matrix multiply's
      achieved FLOP/s, as a fraction of the dense peak: the **Maximum Achievable Matmul FLOPS** (MAMF) of
      the GPU, the best mean over 100 iterations of ``torch.matmul`` on ``randn`` bf16 inputs after a 30 s
      warm-up (so at the clock the board sustains on random data under its power limit), searched over
      shapes (S. Bekman, *Machine Learning Engineering*, ``compute/accelerator/README.md``, "Maximum
      Achievable Matmul FLOPS comparison table"; docs/sources.md §11). A **measurement**, per GPU
      (:mod:`topotrain.hardware.gpus`: A100 SXM 271.2/312 = 0.869, H100 SXM 794.5/989 = 0.803); the wave
      model extrapolates beyond its table's ``k`` ≤ 4,096 to up to 0.84 of the peak, above any shape the
      MAMF search found. 1.0: no cap. The ``ceiling`` model does not read it.
    * ``gemm_transfer`` = False: with ``gemm_model: wave | table``, a GPU with no measured table at a 16-bit
      dtype (the A100: none is public) takes the wave model fitted on the H100 bf16 table, laid on its own
      SMs, peak and bandwidth, the per-tile efficiencies scaled by the ratio of the two MAMF fractions and
      the prologue's time kept (:mod:`topotrain.compute.gemm_transfer`; a stated **rule**, not a
      measurement). Capped at ``gemm_mamf_fraction``. With it no GEMM ceiling fitted to training rows is
      read; docs/validation.md §8 gives what it does to the published rows (A100 rows too fast).
    * ``comm_sm_count`` = 0: SMs that communication kernels running beside the compute hold (NCCL runs one
      thread block per channel on its own SM; DeepSeek-V3 reserves 20 of an H800's 132 SMs for its
      all-to-all kernels; an FSDP all-gather beside a GEMM on an H100 launched 24 blocks; docs/sources.md
      §11). Matrix multiplies and attention then run their tiles in waves over the other SMs at the same
      per-SM rate (:func:`topotrain.compute.gemm_wave.with_free_sms`). It applies to **every** GEMM and
      attention kernel of the step, so it describes a run whose collectives overlap the whole compute
      (FSDP's per-layer all-gathers and reduce-scatters) and bounds any other; 0 (the default) for a step
      whose collectives do not overlap the compute. **Not fitted**; what-if figures in
      docs/validation.md §8.
    * ``kernels_fwd`` / ``kernels_bwd``: kernels per layer kind and pass, counted from the kernels
      PyTorch eager runs (one cuBLAS/cuDNN kernel per GEMM, FlashAttention-2's three backward kernels,
      a norm backward's input-gradient and weight-gradient kernels). A layer that stands for several
      ops gives its own count (:attr:`Layer.kernels`), which wins over the table.

    A GPU may override the efficiency ceilings (:attr:`GPUSpec.compute_efficiency`; H100/H200 do, see
    :mod:`topotrain.hardware.gpus`); :func:`params_for_gpu` merges defaults, GPU and user overrides.
    """

    gemm_max_efficiency: Fraction = 0.80
    conv_max_efficiency: Fraction = 0.54
    attention_fwd_efficiency: Fraction = 0.65
    attention_bwd_efficiency: Fraction = 0.55
    tensor_clock_fraction: Fraction = 1.0
    gemm_tiles: Annotated[tuple[tuple[TileSide, TileSide, Fraction], ...], Field(min_length=1)] = (
        (256, 128, 1.0),
        (128, 128, 0.95),
        (128, 64, 0.85),
        (64, 64, 0.70),
    )
    k_half: NonNegative = 64.0
    k_half_reference_flops_per_sm: NonNegative = 125e12 / 80
    split_k_min: PositiveInt = 256
    gemm_fixed_latency_s: NonNegative = 1.5e-6
    memory_efficiency: Fraction = 0.85
    memory_model: MemoryModelName = "constant"
    vector_efficiency: Fraction = 0.7
    kernel_launch_overhead_s: NonNegative = 4e-6
    gemm_model: GemmModelName = "ceiling"
    gemm_mamf_fraction: Fraction = 1.0
    gemm_transfer: Annotated[bool, Field(strict=True)] = False
    comm_sm_count: NonNegativeInt = 0
    kernels_fwd: Mapping[str, NonNegativeInt] = field(default_factory=lambda: _frozen_map(_KERNELS_FWD), hash=False)
    kernels_bwd: Mapping[str, NonNegativeInt] = field(default_factory=lambda: _frozen_map(_KERNELS_BWD), hash=False)

    @model_validator(mode="after")
    def _complete(self) -> ComputeParams:
        """Kernel counts laid over the defaults (unknown layer kinds refused)."""
        found = []
        for name, defaults in (("kernels_fwd", _KERNELS_FWD), ("kernels_bwd", _KERNELS_BWD)):
            merged = dict(defaults)
            for k, v in getattr(self, name).items():
                if k not in merged:
                    found.append(ConfigError(f"{name}.{k}", "unknown layer kind",
                                             f"known: {', '.join(sorted(merged))}"))
                merged[k] = v
            object.__setattr__(self, name, _frozen_map(merged))
        if found:
            raise several(found)
        return self


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


DEFAULT_PARAMS = ComputeParams()
#: Alias of :data:`DEFAULT_PARAMS`.
DEFAULT = DEFAULT_PARAMS


def params_from_dict(
    d: Mapping[str, Any] | None, field_prefix: str = "compute.params", base: ComputeParams | None = None
) -> ComputeParams:
    """ComputeParams from a scenario's ``compute.params`` mapping laid over ``base`` (default
    :data:`DEFAULT_PARAMS`); unknown keys are an error."""
    import difflib


    known = sorted(f.name for f in fields(ComputeParams))
    d = dict(d or {})
    unknown = []
    for key in d:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)
            unknown.append(ConfigError(f"{field_prefix}.{key}", "unknown compute parameter",
                                       (f"did you mean {near[0]!r}? " if near else "") + f"known: {', '.join(known)}"))
    if unknown:
        raise ConfigErrors(unknown)
    try:
        return replace(DEFAULT_PARAMS if base is None else base, **d)
    except ConfigError as e:
        raise ConfigErrors([ConfigError(field_prefix + p.field[len("compute.params"):], p.message, p.fix)
                            for p in problems_of(e)]) from None


_GPU_PARAMS: dict[tuple[str, tuple[tuple[str, float], ...]], ComputeParams] = {}


def params_for_gpu(
    gpu: GPUSpec | str, overrides: Mapping[str, Any] | None = None, field_prefix: str = "compute.params"
) -> ComputeParams:
    """The roofline constants for ``gpu``: :data:`DEFAULT_PARAMS`, then the GPU's own
    ``compute_efficiency`` (:attr:`GPUSpec.compute_efficiency`, e.g. Hopper's lower ceilings), then the
    user's ``overrides`` (a scenario's ``compute.params``), each later one winning."""
    g = get_gpu(gpu)
    key = (g.name, tuple(sorted(g.compute_efficiency.items())))
    base = _GPU_PARAMS.get(key)
    if base is None:
        gpu_eff: dict[str, Any] = dict(g.compute_efficiency)
        base = replace(DEFAULT_PARAMS, **gpu_eff) if gpu_eff else DEFAULT_PARAMS
        _GPU_PARAMS[key] = base
    return params_from_dict(overrides, field_prefix, base) if overrides else base


def _resolve(gpu: GPUSpec, params: ComputeParams | None) -> ComputeParams:
    return params if params is not None else params_for_gpu(gpu)


# ---- GEMM efficiency ----------------------------------------------------------------------------------
def _tile_candidate(
    count: int, m: int, n: int, k: int, sms: int, tm: int, tn: int, rel: float, params: ComputeParams,
    k_half: float,
) -> float:
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tiles = count * tiles_m * tiles_n
    tile_q = (m * n) / (tiles_m * tm * tiles_n * tn)
    splits = 1
    if tiles < sms and k >= 2 * params.split_k_min:
        splits = max(1, min(sms // tiles, k // params.split_k_min))
    work = tiles * splits
    wave_q = work / (math.ceil(work / sms) * sms)
    k_slice = k / splits
    k_ramp = k_slice / (k_slice + k_half)
    return rel * tile_q * wave_q * k_ramp


def gemm_shape_efficiency(
    count: int,
    m: int,
    n: int,
    k: int,
    sm_count: int,
    params: ComputeParams = DEFAULT_PARAMS,
    k_half: float | None = None,
) -> float:
    """Fraction of the ceiling (``*_max_efficiency``) that ``count`` GEMMs of ``M×N×K`` reach: the best tile
    shape's tile quantization × wave quantization (with split-K) × K ramp. Excludes the small-GEMM ramp."""
    if min(count, m, n, k) <= 0:
        return 0.0
    sms = max(1, int(sm_count))
    kh = params.k_half if k_half is None else k_half
    return max(
        _tile_candidate(count, m, n, k, sms, tm, tn, rel, params, kh) for tm, tn, rel in params.gemm_tiles
    )


def effective_k_half(gpu: GPUSpec, dtype: str, params: ComputeParams = DEFAULT_PARAMS) -> float:
    """``k_half`` on ``gpu``: a tile's fixed prologue/epilogue time, expressed in main-loop K steps.

    The fixed part takes about the same time on every GPU while one K step is faster on an SM with more
    tensor throughput, so the ramp's length in K grows with the per-SM peak:
    ``k_half · (peak(dtype)/SMs) / (reference_peak/reference SMs)``, the reference being the GPU on which
    ``k_half`` was calibrated (``k_half_reference_flops_per_sm``, V100 FP16: 125 TFLOP/s / 80 SMs).
    ``k_half_reference_flops_per_sm = 0`` turns the scaling off."""
    ref = params.k_half_reference_flops_per_sm
    if ref <= 0 or gpu.sm_count <= 0:
        return params.k_half
    return params.k_half * (gpu.peak(dtype) / gpu.sm_count) / ref


def gemm_time_s(
    flops: float,
    count: int,
    m: int,
    n: int,
    k: int,
    gpu: GPUSpec,
    dtype: str,
    ceiling: float,
    params: ComputeParams = DEFAULT_PARAMS,
) -> float:
    """Compute time of ``flops`` run as ``count`` GEMMs ``M×N×K``: ``flops/(peak·ceiling·shape_eff)`` plus the
    small-GEMM ramp (``gemm_fixed_latency_s``). Memory time and launch overhead not included."""
    if flops <= 0:
        return 0.0
    sms = free_sm_count(gpu, params)
    eff = ceiling * gemm_shape_efficiency(count, m, n, k, sms, params, effective_k_half(gpu, dtype, params))
    if eff <= 0:
        return 0.0
    return flops / (gpu.peak(dtype) * _free_share(gpu, sms) * eff) + params.gemm_fixed_latency_s


def free_sm_count(gpu: GPUSpec, params: ComputeParams = DEFAULT_PARAMS) -> int:
    """SMs a compute kernel may use: all of ``gpu``'s but the ``comm_sm_count`` that communication kernels
    running beside it hold (at least one; a GPU whose SM count is not given keeps it)."""
    if params.comm_sm_count <= 0 or gpu.sm_count <= 0:
        return gpu.sm_count
    return max(1, gpu.sm_count - params.comm_sm_count)


def _free_share(gpu: GPUSpec, sms: int) -> float:
    """The share of ``gpu``'s peak that ``sms`` of its SMs hold."""
    return sms / gpu.sm_count if 0 < sms < gpu.sm_count else 1.0


def gemm_efficiency(
    count: int,
    m: int,
    n: int,
    k: int,
    gpu: GPUSpec | str,
    dtype: str = "bf16",
    *,
    conv: bool = False,
    params: ComputeParams | None = None,
) -> float:
    """Achieved fraction of ``peak(dtype)`` of ``count`` GEMMs ``M×N×K`` (compute only, small-GEMM ramp
    and, for matrix multiplies, the sustained clock ``tensor_clock_fraction`` included):
    ``2·count·M·N·K / (time · peak)``."""
    g = get_gpu(gpu)
    params = _resolve(g, params)
    flops = 2.0 * count * m * n * k
    shaped = None if conv else _shape_time_s(flops, count, m, n, k, g, dtype, params)
    if shaped is not None:
        t = shaped / _clock(conv, params)
    else:
        ceiling = params.conv_max_efficiency if conv else params.gemm_max_efficiency
        t = gemm_time_s(flops, count, m, n, k, g, dtype, ceiling, params) / _clock(conv, params)
    return flops / (t * g.peak(dtype)) if t > 0 else 0.0


def _shape_time_s(
    flops: float, count: int, m: int, n: int, k: int, gpu: GPUSpec, dtype: str, params: ComputeParams
) -> float | None:
    """Seconds of ``flops`` run as ``count`` GEMMs ``M×N×K`` by the shape model ``params.gemm_model`` names
    (:func:`topotrain.compute.gemm_wave.shape_model`), scaled to the layer's ``flops`` when they differ from
    ``2·count·M·N·K``; None with ``gemm_model: ceiling`` or when no measured table times ``gpu`` at ``dtype``.
    At most ``gemm_mamf_fraction`` of the peak of the SMs left free by ``comm_sm_count``."""
    if params.gemm_model == "ceiling" or flops <= 0 or min(count, m, n, k) <= 0:
        return None
    sms = free_sm_count(gpu, params)
    reserved = gpu.sm_count - sms if 0 < sms < gpu.sm_count else 0
    if params.gemm_model == "learned":  # the learned cross-GPU model: no table needed, FP32 only
        t_one = learned_gemm_time_s(learned_device(gpu, sms), normalize_dtype(dtype), count, m, n, k)
    else:
        model: Any = shape_model(gpu.name, normalize_dtype(dtype), params.gemm_model)
        if model is None and params.gemm_transfer:  # A100 bf16: the H100 fit carried over (gemm_transfer)
            model = transferred_model(gpu, normalize_dtype(dtype))
        t_one = None if model is None else model.time_s(count, m, n, k, reserved)
    if t_one is None:
        return None
    t = t_one * flops / (2.0 * count * m * n * k)
    if params.gemm_mamf_fraction < 1.0:  # no faster than the GPU's measured maximum achievable matmul rate
        t = max(t, flops / (gpu.peak(dtype) * _free_share(gpu, sms) * params.gemm_mamf_fraction))
    return t


# ---- per-layer time -----------------------------------------------------------------------------------
def _check_pos_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise ConfigError(field, f"must be a positive integer, got {value!r}", f"give e.g. {field}=1")
    return int(value)


def is_split(layer: Layer) -> bool:
    """Whether a tensor-parallel group splits this layer's work (Megatron column / row layers)."""
    return layer.tp_split in (TPSplit.COLUMN, TPSplit.ROW)


def local_gemm_dims(layer: Layer, batch: int, tp: int) -> tuple[int, int, int, int] | None:
    """``(count, M, N, K)`` of the layer's GEMMs on one tensor-parallel rank for a micro-batch."""
    dims = layer.gemm_dims(batch)
    if dims is None:
        return None
    c, m, n, k = dims
    if tp > 1 and is_split(layer):
        if layer.gemm_batch_scales == "count" or layer.kind == LayerKind.ATTENTION:
            c = math.ceil(c / tp)
        elif layer.tp_split == TPSplit.COLUMN:
            n = math.ceil(n / tp)
        else:
            k = math.ceil(k / tp)
    return (c, m, n, k)


def _kernels(layer: Layer, phase: str, params: ComputeParams, wgrad_only: bool) -> int:
    if layer.kernels is not None:  # the layer's own count (several small ops in one layer)
        return layer.kernels[0 if phase == "fwd" else 1]
    table = params.kernels_fwd if phase == "fwd" else params.kernels_bwd
    n = table.get(str(layer.kind), 1)
    if phase == "bwd" and wgrad_only and layer.kind in GEMM_KINDS:
        n = max(1, n - 1)
    return n


def layer_time_s(
    layer: Layer,
    gpu: GPUSpec | str,
    batch: int,
    *,
    phase: str,
    dtype: str = "bf16",
    tp: int = 1,
    params: ComputeParams | None = None,
) -> float:
    """Seconds of one pass (``"fwd"`` or ``"bwd"``) of ``layer`` over a micro-batch of ``batch`` samples on
    one tensor-parallel rank of ``gpu``: ``max(compute, memory) + kernels · launch overhead``.
    ``params=None``: the GPU's own constants (:func:`params_for_gpu`)."""
    g = get_gpu(gpu)
    params = _resolve(g, params)
    batch = _check_pos_int(batch, "batch")
    tp = _check_pos_int(tp, "tp")
    if phase not in ("fwd", "bwd"):
        raise ConfigError("phase", f"unknown phase {phase!r}", "use 'fwd' or 'bwd'")
    dtype = normalize_dtype(dtype)
    share = 1.0 / tp if is_split(layer) else 1.0
    fwd = phase == "fwd"
    flops = (layer.fwd_flops if fwd else layer.bwd_flops) * batch * share
    nbytes = (layer.fwd_bytes_at(batch) if fwd else layer.bwd_bytes_at(batch)) * share
    t_mem = max(0.0, nbytes) / (g.hbm_bandwidth_bytes_per_s * memory_fraction(layer, g, params))
    dims = local_gemm_dims(layer, batch, tp)
    wgrad_only = False
    if flops <= 0:
        t_cmp = 0.0
    elif layer.kind == LayerKind.ATTENTION and dims is not None:
        t_cmp = _attention_time(flops, dims, g, dtype, fwd, params) / params.tensor_clock_fraction
    elif layer.kind == LayerKind.ATTENTION:  # no shape given: the ceiling alone
        ceiling = params.attention_fwd_efficiency if fwd else params.attention_bwd_efficiency
        t_cmp = flops / (g.peak(dtype) * _free_share(g, free_sm_count(g, params)) * ceiling
                         * params.tensor_clock_fraction)
    elif layer.kind in GEMM_KINDS and dims is None:  # no shape given: the ceiling alone
        ceiling = params.conv_max_efficiency if layer.kind == LayerKind.CONV else params.gemm_max_efficiency
        t_cmp = flops / (g.peak(dtype) * _free_share(g, free_sm_count(g, params)) * ceiling
                         * _clock(layer.kind == LayerKind.CONV, params))
    elif layer.kind in GEMM_KINDS and dims is not None:
        c, m, n, k = dims
        conv = layer.kind == LayerKind.CONV
        ceiling = params.conv_max_efficiency if conv else params.gemm_max_efficiency
        if fwd:
            shapes = [(c, m, n, k)]
        else:
            wgrad_only = layer.bwd_flops < 1.5 * layer.fwd_flops
            shapes = [(c, k, n, m)] if wgrad_only else [(c, m, k, n), (c, k, n, m)]
        part = flops / len(shapes)
        shaped = [None if conv else _shape_time_s(part, *s, g, dtype, params) for s in shapes]
        if all(t is not None for t in shaped):
            t_cmp = sum(t for t in shaped if t is not None) / _clock(conv, params)
        elif fwd:
            t_cmp = gemm_time_s(flops, c, m, n, k, g, dtype, ceiling, params) / _clock(conv, params)
        else:
            t_cmp = sum(gemm_time_s(part, *s, g, dtype, ceiling, params) for s in shapes) / _clock(conv, params)
    else:
        t_cmp = flops / (g.peak("fp32") * params.vector_efficiency)
    kernels = _kernels(layer, phase, params, wgrad_only)
    if flops <= 0 and nbytes <= 0:
        kernels = 0
    return max(t_cmp, t_mem) + kernels * params.kernel_launch_overhead_s


def memory_fraction(layer: Layer, gpu: GPUSpec, params: ComputeParams = DEFAULT_PARAMS) -> float:
    """The fraction of ``gpu``'s datasheet HBM bandwidth ``layer``'s memory traffic runs at:
    ``memory_efficiency``, or with ``memory_model: measured`` for a memory-bound kind (:data:`MEMORY_CLASS`)
    the measured fraction of its kernel class at its row length
    (:func:`topotrain.compute.membound.bandwidth_fraction`)."""
    cls = MEMORY_CLASS.get(layer.kind) if params.memory_model == "measured" else None
    if cls is None:
        return params.memory_efficiency
    return bandwidth_fraction(gpu.name, cls, int(layer.row_elems))


def _clock(conv: bool, params: ComputeParams) -> float:
    """The fraction of the boost clock a GEMM runs at: ``tensor_clock_fraction`` for matrix multiplies, 1 for
    convolutions (``conv``: their ceiling is calibrated on the clock they ran at)."""
    return 1.0 if conv else params.tensor_clock_fraction


def _attention_time(
    flops: float, dims: tuple[int, int, int, int], gpu: GPUSpec, dtype: str, fwd: bool, params: ComputeParams
) -> float:
    """FlashAttention-2: a thread block per (head, 128-query block), looping over the keys (length ``N``)."""
    c, m, n, k = dims
    blocks_q = math.ceil(m / 128)
    work = c * blocks_q
    free = free_sm_count(gpu, params)
    sms = max(1, free)
    wave_q = work / (math.ceil(work / sms) * sms)
    ramp = n / (n + effective_k_half(gpu, dtype, params))
    ceiling = params.attention_fwd_efficiency if fwd else params.attention_bwd_efficiency
    eff = ceiling * wave_q * ramp * (m / (blocks_q * 128))
    if eff <= 0:
        return 0.0
    return flops / (gpu.peak(dtype) * _free_share(gpu, free) * eff) + params.gemm_fixed_latency_s


#: the fields of a layer that :func:`layer_time_s` reads (all but its name and block), as one tuple
_TIMED_FIELDS = attrgetter(*(f.name for f in fields(Layer) if f.name not in ("name", "block")))


def layer_times(
    model: Model,
    gpu: GPUSpec | str,
    batch: int,
    *,
    dtype: str = "bf16",
    tp: int = 1,
    params: ComputeParams | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every layer of ``model`` (arrays in layer order). Layers that differ
    only in name and block (a transformer's repeated blocks) are timed once: :func:`layer_time_s` reads
    neither."""
    g = get_gpu(gpu)
    params = _resolve(g, params)
    times: dict[tuple[Any, ...], tuple[float, float]] = {}
    fwd = np.empty(len(model.layers), dtype=np.float64)
    bwd = np.empty(len(model.layers), dtype=np.float64)
    for i, lay in enumerate(model.layers):
        key = _TIMED_FIELDS(lay)
        hit = times.get(key)
        if hit is None:
            hit = times[key] = (layer_time_s(lay, g, batch, phase="fwd", dtype=dtype, tp=tp, params=params),
                                layer_time_s(lay, g, batch, phase="bwd", dtype=dtype, tp=tp, params=params))
        fwd[i], bwd[i] = hit
    return fwd, bwd


def model_time_s(
    model: Model,
    gpu: GPUSpec | str,
    batch: int,
    *,
    dtype: str = "bf16",
    tp: int = 1,
    params: ComputeParams | None = None,
) -> float:
    """Forward + backward seconds of one micro-batch through the whole model on one GPU (no optimizer step,
    no communication)."""
    fwd, bwd = layer_times(model, gpu, batch, dtype=dtype, tp=tp, params=params)
    return float(fwd.sum() + bwd.sum())


def achieved_tflops(
    model: Model,
    gpu: GPUSpec | str,
    batch: int,
    *,
    dtype: str = "bf16",
    tp: int = 1,
    params: ComputeParams | None = None,
) -> float:
    """Model TFLOP/s per GPU the roofline predicts: forward + backward FLOPs of the micro-batch (``1/tp`` of
    the split layers' FLOPs on each rank) over :func:`model_time_s`."""
    t = model_time_s(model, gpu, batch, dtype=dtype, tp=tp, params=params)
    flops = sum(
        (lay.fwd_flops + lay.bwd_flops) * batch * (1.0 / tp if is_split(lay) else 1.0) for lay in model.layers
    )
    return flops / t / 1e12 if t > 0 else 0.0


# ---- the compute-model interface ---------------------------------------------------------------------
@runtime_checkable
class ComputeModel(Protocol):
    """Anything that times a model's layers on one GPU: the roofline, a measured table, a prediction."""

    def layer_times(self, model: Model, batch: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds per layer (layer order) for a micro-batch on one TP rank."""
        ...


class RooflineModel:
    """:class:`ComputeModel` backed by :func:`layer_time_s`; results are memoized per (model, batch, tp)."""

    def __init__(
        self, gpu: GPUSpec | str, dtype: str = "bf16", params: ComputeParams | None = None
    ) -> None:
        self.gpu = get_gpu(gpu)
        self.dtype = normalize_dtype(dtype)
        self.gpu.peak(self.dtype)  # unsupported dtype → ConfigError now, not mid-simulation
        self.params = _resolve(self.gpu, params)
        self._memo: dict[tuple[int, int, int], tuple[Model, np.ndarray, np.ndarray]] = {}

    def layer_times(self, model: Model, batch: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        key = (id(model), int(batch), int(tp))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is model:
            return hit[1].copy(), hit[2].copy()
        fwd, bwd = layer_times(model, self.gpu, batch, dtype=self.dtype, tp=tp, params=self.params)
        self._memo[key] = (model, fwd, bwd)
        return fwd.copy(), bwd.copy()

    def layer_time(self, layer: Layer, batch: int, tp: int, phase: str) -> float:
        return layer_time_s(layer, self.gpu, batch, phase=phase, dtype=self.dtype, tp=tp, params=self.params)

    def __repr__(self) -> str:
        return f"RooflineModel({self.gpu.name!r}, dtype={self.dtype!r})"
