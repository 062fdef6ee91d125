"""Catalog of GPUs: datasheet peak FLOP/s per data type, HBM bandwidth, memory, SMs, clock, power.

Conventions (every entry follows them):

* ``peak_flops_per_s``: **dense** peaks (no 2:4 structured sparsity), FLOP/s (ops/s for int8). Keys are
  among :data:`DTYPES`. ``fp32`` is the non-tensor (CUDA-core / vector) rate; every other key is the
  tensor-core / matrix-core rate, and a key is present only where the GPU has it at that rate (so a V100
  has no ``bf16``, an A100 no ``fp8``). ``fp64`` is the FP64 tensor/matrix rate where one exists (A100,
  H100, H200, MI250X, MI300X), else the FP64 vector rate (P100, V100). P100 has no tensor cores; its
  ``fp16`` is the packed-half rate (2x fp32), its fastest 16-bit rate.
* ``memory_bytes``: the datasheet's "GB" of HBM read as GiB (HBM stacks come in powers of two: an
  A100-80GB reports 81920 MiB in nvidia-smi). H200's 141 GB is taken as 141 GiB (usable capacity).
* ``hbm_bandwidth_bytes_per_s``: datasheet peak, decimal (1 TB/s = 10^12 B/s).
* ``sm_count``: streaming multiprocessors (NVIDIA) or compute units (AMD).
* ``boost_clock_hz``: the datasheet's maximum boost clock. On H100/H200 the tensor-core peaks imply
  1.83 GHz and the FP32/FP64 peaks 1.98 GHz; we store 1.98 GHz.
* ``compute_efficiency``: per-GPU overrides of the roofline's efficiency ceilings and of the fraction of
  the boost clock its tensor cores hold under sustained GEMM load (``tensor_clock_fraction``)
  (:class:`topotrain.compute.roofline.ComputeParams` fields :data:`EFFICIENCY_KEYS`), for GPUs whose
  achieved fraction of peak differs from the defaults; ``efficiency_source`` says where each value comes
  from. A scenario's ``compute.params`` still wins over them.
* ``nvlink``: the name of the GPU's scale-up link type in :mod:`topotrain.hardware.links`, or None. AMD's
  Infinity Fabric is a direct GPU-to-GPU mesh, not a per-GPU aggregate into a switch, so MI250X/MI300X
  carry None here; model the mesh with explicit links in a user server template.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from topotrain.util.errors import ConfigError

#: ComputeParams fields a GPU may override (fractions of its peak, in (0, 1]).
EFFICIENCY_KEYS: tuple[str, ...] = (
    "gemm_max_efficiency", "conv_max_efficiency", "attention_fwd_efficiency", "attention_bwd_efficiency",
    "memory_efficiency", "tensor_clock_fraction", "gemm_mamf_fraction",
)

#: Data types a peak may be given for, in the order they are listed.
DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")

_DTYPE_ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "single": "fp32",
    "tensorfloat32": "tf32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
}


def normalize_dtype(dtype: str, field: str = "dtype") -> str:
    """``"bfloat16"`` → ``"bf16"``; a name outside :data:`DTYPES` (and its aliases) → ConfigError."""
    key = str(dtype).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ConfigError(field, f"unknown data type {dtype!r}", f"use one of {', '.join(DTYPES)}")
    return key


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model, from its datasheet (``source``). SI units: FLOP/s, bytes/s, bytes, Hz, W."""

    name: str
    vendor: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    hbm_bandwidth_bytes_per_s: float
    memory_bytes: float
    sm_count: int = 0
    boost_clock_hz: float = 0.0
    tdp_w: float = 0.0
    nvlink: str | None = None
    source: str = ""
    compute_efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    efficiency_source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("gpu.name", "a GPU needs a non-empty name", "give it a name, e.g. a100-80gb")
        where = f"gpu {self.name!r}"
        if not isinstance(self.peak_flops_per_s, Mapping) or not self.peak_flops_per_s:
            raise ConfigError(f"{where}.peak_flops", "no peak FLOP/s given",
                              f"give at least one of {', '.join(DTYPES)}")
        peaks: dict[str, float] = {}
        for k, v in self.peak_flops_per_s.items():
            key = normalize_dtype(k, f"{where}.peak_flops")
            if not (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")):
                raise ConfigError(f"{where}.peak_flops.{key}", f"peak must be a positive number, got {v!r}",
                                  "give e.g. 312TFLOPS")
            peaks[key] = float(v)
        ordered = {k: peaks[k] for k in DTYPES if k in peaks}
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(ordered))
        for name, value in (("hbm_bandwidth", self.hbm_bandwidth_bytes_per_s), ("memory", self.memory_bytes)):
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ConfigError(f"{where}.{name}", f"must be positive, got {value!r}",
                                  "give a positive value")
        for name, value in (("sm_count", self.sm_count), ("boost_clock", self.boost_clock_hz),
                            ("tdp", self.tdp_w)):
            if not (isinstance(value, int | float) and 0 <= value < float("inf")):
                raise ConfigError(f"{where}.{name}", f"must be >= 0, got {value!r}",
                                  "give a non-negative value")
        eff = self.compute_efficiency
        if not isinstance(eff, Mapping):
            raise ConfigError(f"{where}.compute_efficiency", f"expected a mapping, got {eff!r}",
                              "write compute_efficiency: {gemm_max_efficiency: 0.7}")
        for k, v in eff.items():
            if k not in EFFICIENCY_KEYS:
                raise ConfigError(f"{where}.compute_efficiency.{k}", "unknown efficiency",
                                  f"known: {', '.join(EFFICIENCY_KEYS)}")
            if not (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1):
                raise ConfigError(f"{where}.compute_efficiency.{k}", f"must be in (0, 1], got {v!r}",
                                  "give e.g. 0.7")
        object.__setattr__(self, "compute_efficiency", MappingProxyType({k: float(v) for k, v in eff.items()}))

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The data types this GPU has a peak for."""
        return tuple(self.peak_flops_per_s)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (``"bf16"``, ``"bfloat16"``, ...); ConfigError if not supported."""
        key = normalize_dtype(dtype)
        if key not in self.peak_flops_per_s:
            raise ConfigError("dtype", f"GPU {self.name!r} has no {key} peak",
                              f"supported: {', '.join(self.peak_flops_per_s)}")
        return self.peak_flops_per_s[key]


_T = 1e12
_GIB = 2.0**30

#: Hopper (H100/H200 SXM) reaches a smaller fraction of its datasheet peak than A100 in training: its
#: tensor peak grew 3.2x over A100 while HBM bandwidth grew 1.6x, and FlashAttention-2 — the attention
#: kernel of PyTorch stacks of 2023-24 — was written for Ampere.
_HOPPER_EFF: dict[str, float] = {
    "attention_fwd_efficiency": 0.35,
    "attention_bwd_efficiency": 0.30,
    "gemm_max_efficiency": 0.62,
    "gemm_mamf_fraction": 794.5 / 989.0,
}
_HOPPER_EFF_SOURCE = (
    "attention_fwd_efficiency 0.35: 'FlashAttention-2 achieving only 35% utilization on the H100 GPU' "
    "(Shah et al., FlashAttention-3, 2024, abstract); attention_bwd_efficiency 0.30: the same fwd/bwd "
    "ratio as the A100 defaults (0.55/0.65), an assumption; gemm_max_efficiency 0.62: CALIBRATED by "
    "benchmarks/calibrate.py (least squares in log TFLOP/s, fit 0.618, used rounded to 0.01) on the five Megatron-Core "
    "r0.8.0 H100 rows (1.7B to 70B, 48 to 768 GPUs; docs/sources.md 3b) and checked, "
    "not fitted, on the LLM Foundry H100 rows (benchmarks/validation.py); gemm_mamf_fraction 0.803: MEASURED, "
    "Maximum Achievable Matmul FLOPS of an H100 SXM, 794.5 of 989 TFLOP/s bf16 (torch 2.7.0+cu126, randn "
    "inputs, mean of 100 iterations after a 30 s warm-up, best shape 2048x2048x13312; 'H200 is the same'), "
    "S. Bekman, ml-engineering compute/accelerator/README.md, MAMF table (docs/sources.md 11); read only by "
    "the shape models (gemm_model wave/table)"
)

#: Ampere (A100) GEMM ceiling: cuBLAS GEMMs in PyTorch training stacks reach a smaller fraction of the
#: dense peak than the 0.80 default assumed.
_AMPERE_EFF: dict[str, float] = {"gemm_max_efficiency": 0.71, "gemm_mamf_fraction": 271.2 / 312.0}
_AMPERE_EFF_SOURCE = (
    "gemm_max_efficiency 0.71: CALIBRATED by benchmarks/calibrate.py (least squares in log tokens/s, fit "
    "0.713, used rounded to 0.01) on LLM Foundry's four 1B-13B MPT rows on one DGX A100 (docs/sources.md 7a, "
    "with Composer's training metrics, 7e), and checked, not fitted, on the Megatron-LM SC'21 and "
    "DeepLearningExamples BERT A100 rows (docs/validation.md 3); gemm_mamf_fraction 0.869: MEASURED, Maximum "
    "Achievable Matmul FLOPS of an A100 SXM, 271.2 of 312 TFLOP/s bf16 (torch 2.6.0+cu126, randn inputs, mean of "
    "100 iterations after a 30 s warm-up, best shape 1024x10240x5120), S. Bekman, ml-engineering "
    "compute/accelerator/README.md, MAMF table (docs/sources.md 11); read only by the shape models (no A100 "
    "tensor-core table ships, so no default prediction reads it)"
)

#: The 300 W V100 SXM2 (DGX-1) does not hold its 1,530 MHz boost through GEMM-bound training: NVIDIA's own
#: figures for the same code and micro-batch give a V100 of a DGX-2H (SXM3, 450 W) 1.23x the throughput of one
#: of a DGX-1 (PyTorch BERT 19.07, 1.231; Transformer-XL base 20.06, 1.234), where the rated peaks differ by
#: 1.05x (2.1 PFLOPS / 16 against 125 TFLOPS).
_V100_SXM2_EFF: dict[str, float] = {"tensor_clock_fraction": 0.80}
_V100_SXM2_EFF_SOURCE = (
    "tensor_clock_fraction 0.80 (1.22 GHz of 1.53 under sustained GEMM load at 300 W): CALIBRATED by "
    "benchmarks/calibrate.py (squared log error of the ratio, fit 0.801, used rounded to 0.01) on the declared "
    "calibration ratio SKU_CLOCK_RATIO of topotrain.validate.published: NVIDIA DeepLearningExamples PyTorch "
    "BERT-large 19.07, seq 128, micro-batch 64, per-GPU throughput on a DGX-2H (taken to hold its rated 2.1 "
    "PFLOPS) over that on a DGX-1 V100 32GB, 211.2 / 171.52 = 1.231 (docs/sources.md 2f); applied to matrix "
    "multiplies and attention, not to convolutions (their ceiling is calibrated on a DGX-1 V100 row); the "
    "GEMM ceiling itself stays the uncalibrated 0.80 default"
)

_BUILTIN: tuple[GPUSpec, ...] = (
    GPUSpec("p100", "nvidia", {"fp64": 5.3 * _T, "fp32": 10.6 * _T, "fp16": 21.2 * _T},
            732e9, 16 * _GIB, 56, 1.48e9, 300.0, "nvlink1",
            "NVIDIA Tesla P100 SXM2 datasheet / P100 whitepaper (2016): FP64 5.3, FP32 10.6, FP16 21.2 "
            "TFLOPS; 16 GB HBM2 at 732 GB/s; 56 SMs, 1480 MHz boost; 300 W"),
    GPUSpec("v100", "nvidia", {"fp64": 7.8 * _T, "fp32": 15.7 * _T, "fp16": 125 * _T},
            900e9, 32 * _GIB, 80, 1.53e9, 300.0, "nvlink2",
            "NVIDIA Tesla V100 SXM2 datasheet (2018): FP64 7.8, FP32 15.7, tensor FP16 125 TFLOPS; "
            "32 GB HBM2 at 900 GB/s; 80 SMs, 1530 MHz boost; 300 W", _V100_SXM2_EFF, _V100_SXM2_EFF_SOURCE),
    GPUSpec("v100-16gb", "nvidia", {"fp64": 7.8 * _T, "fp32": 15.7 * _T, "fp16": 125 * _T},
            900e9, 16 * _GIB, 80, 1.53e9, 300.0, "nvlink2",
            "NVIDIA Tesla V100 SXM2 datasheet (2018): FP64 7.8, FP32 15.7, tensor FP16 125 TFLOPS; "
            "16 GB HBM2 at 900 GB/s; 80 SMs, 1530 MHz boost; 300 W", _V100_SXM2_EFF, _V100_SXM2_EFF_SOURCE),
    GPUSpec("a100-40gb", "nvidia",
            {"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "fp16": 312 * _T, "bf16": 312 * _T,
             "int8": 624 * _T},
            1555e9, 40 * _GIB, 108, 1.41e9, 400.0, "nvlink3",
            "NVIDIA A100 Tensor Core GPU datasheet, SXM 40GB: FP64 tensor 19.5, FP32 19.5, TF32 156, "
            "BF16/FP16 312 TFLOPS, INT8 624 TOPS (dense); HBM2 1555 GB/s; 108 SMs, 1410 MHz; 400 W",
            _AMPERE_EFF, _AMPERE_EFF_SOURCE),
    GPUSpec("a100-80gb", "nvidia",
            {"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "fp16": 312 * _T, "bf16": 312 * _T,
             "int8": 624 * _T},
            2039e9, 80 * _GIB, 108, 1.41e9, 400.0, "nvlink3",
            "NVIDIA A100 Tensor Core GPU datasheet, SXM 80GB: FP64 tensor 19.5, FP32 19.5, TF32 156, "
            "BF16/FP16 312 TFLOPS, INT8 624 TOPS (dense); HBM2e 2039 GB/s; 108 SMs, 1410 MHz; 400 W",
            _AMPERE_EFF, _AMPERE_EFF_SOURCE),
    GPUSpec("h100", "nvidia",
            {"fp64": 66.9 * _T, "fp32": 66.9 * _T, "tf32": 494.7 * _T, "fp16": 989.4 * _T,
             "bf16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            3.35e12, 80 * _GIB, 132, 1.98e9, 700.0, "nvlink4",
            "NVIDIA H100 Tensor Core GPU datasheet and Hopper whitepaper, SXM5 80GB: FP64 tensor 67, "
            "FP32 67, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOPS, INT8 1978.9 TOPS (dense; datasheet "
            "shows 2x with sparsity); HBM3 3.35 TB/s; 132 SMs; 700 W", _HOPPER_EFF, _HOPPER_EFF_SOURCE),
    GPUSpec("h200", "nvidia",
            {"fp64": 66.9 * _T, "fp32": 66.9 * _T, "tf32": 494.7 * _T, "fp16": 989.4 * _T,
             "bf16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            4.8e12, 141 * _GIB, 132, 1.98e9, 700.0, "nvlink4",
            "NVIDIA H200 Tensor Core GPU datasheet, SXM: compute as H100 SXM (BF16 989 TFLOPS dense, "
            "1979 sparse); 141 GB HBM3e at 4.8 TB/s; up to 700 W", _HOPPER_EFF, _HOPPER_EFF_SOURCE),
    GPUSpec("mi250x", "amd",
            {"fp64": 95.7 * _T, "fp32": 47.9 * _T, "fp16": 383 * _T, "bf16": 383 * _T, "int8": 383 * _T},
            3.2768e12, 128 * _GIB, 220, 1.7e9, 560.0, None,
            "AMD Instinct MI250X datasheet (OAM): FP64 matrix 95.7, FP32 vector 47.9, FP16/BF16 383 TFLOPS, "
            "INT8 383 TOPS; 128 GB HBM2e at 3.2768 TB/s; 220 CUs, 1700 MHz; 560 W"),
    GPUSpec("mi300x", "amd",
            {"fp64": 163.4 * _T, "fp32": 163.4 * _T, "tf32": 653.7 * _T, "fp16": 1307.4 * _T,
             "bf16": 1307.4 * _T, "fp8": 2614.9 * _T, "int8": 2614.9 * _T},
            5.3e12, 192 * _GIB, 304, 2.1e9, 750.0, None,
            "AMD Instinct MI300X datasheet (OAM): FP64 matrix 163.4, FP32 vector 163.4, TF32 653.7, "
            "FP16/BF16 1307.4, FP8 2614.9 TFLOPS, INT8 2614.9 TOPS (dense); 192 GB HBM3 at 5.3 TB/s; "
            "304 CUs, 2100 MHz; 750 W"),
)

#: Registered GPUs by lower-case canonical name (built-ins and user entries).
GPUS: dict[str, GPUSpec] = {g.name: g for g in _BUILTIN}

#: Alternative names → canonical name (lower case).
GPU_ALIASES: dict[str, str] = {
    "v100-32gb": "v100", "v100-sxm2": "v100", "v100-sxm2-32gb": "v100", "v100-sxm2-16gb": "v100-16gb",
    "p100-sxm2": "p100", "p100-16gb": "p100",
    "a100": "a100-80gb", "a100-sxm": "a100-80gb", "a100-sxm-80gb": "a100-80gb", "a100-sxm-40gb": "a100-40gb",
    "h100-sxm": "h100", "h100-sxm5": "h100", "h100-80gb": "h100", "h100-sxm5-80gb": "h100",
    "h200-sxm": "h200", "h200-141gb": "h200",
}


def _key(name: str) -> str:
    return name.strip().lower()


def gpu_names() -> list[str]:
    """Canonical names of all registered GPUs, sorted."""
    return sorted(GPUS)


def get_gpu(name: str | GPUSpec, field: str = "gpu") -> GPUSpec:
    """The GPU called ``name`` or one of its aliases (case-insensitive); unknown → ConfigError.

    A GPUSpec passes through unchanged."""
    if isinstance(name, GPUSpec):
        return name
    if not isinstance(name, str):
        raise ConfigError(field, f"expected a GPU name, got {name!r}", "known: " + ", ".join(gpu_names()))
    key = _key(name)
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise ConfigError(field, f"unknown GPU {name!r}",
                          "known: " + ", ".join(gpu_names()) + "; aliases: " + ", ".join(sorted(GPU_ALIASES)))
    return GPUS[key]


def register_gpu(spec: GPUSpec, aliases: tuple[str, ...] | list[str] = (), *,
                 replace: bool = False) -> GPUSpec:
    """Add a user GPU (and optional aliases). Re-registering an identical entry is a no-op; a different one
    under a taken name or alias raises ConfigError unless ``replace`` is true."""
    if not isinstance(spec, GPUSpec):
        raise ConfigError("gpu", f"expected a GPUSpec, got {type(spec).__name__}", "build a GPUSpec")
    key = _key(spec.name)
    if key in GPU_ALIASES and not replace:
        raise ConfigError("gpu", f"{spec.name!r} is already an alias of {GPU_ALIASES[key]!r}",
                          "choose another name or pass replace=True")
    old = GPUS.get(key)
    if old is not None and old != spec and not replace:
        raise ConfigError("gpu", f"GPU {spec.name!r} is already in the catalog",
                          "choose another name or pass replace=True")
    for alias in aliases:
        a = _key(alias)
        target = GPU_ALIASES.get(a)
        if (a in GPUS and a != key) or (target is not None and target != key and not replace):
            raise ConfigError("gpu", f"alias {alias!r} is already taken", "choose another alias")
    GPU_ALIASES.pop(key, None)
    GPUS[key] = spec
    for alias in aliases:
        GPU_ALIASES[_key(alias)] = key
    return spec
