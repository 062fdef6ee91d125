"""Compute models: how long each layer of a model takes on one GPU.

* :mod:`.roofline` — analytical: roofline with size-dependent GEMM efficiency (the default);
* :mod:`.profile` — measured per-layer tables (JSON/CSV), and a stand-in torch micro-benchmark to fill them;
* :mod:`.module_profile` — a table measured on the model's real torch module (:mod:`.torch_modules`) under
  ``torch.profiler`` (docs/profiling.md);
* :mod:`.crossgpu` — Habitat's wave scaling of a table measured on one GPU to another;
* :mod:`.gemm_tables` / :mod:`.gemm_wave` — GEMM time by shape: measured kernel tables (XLA, NeuSight) and
  the wave model fitted on them, which the roofline uses with ``compute.params.gemm_model: wave|table``;
* :mod:`.learned` — a learned cross-GPU GEMM predictor (NeuSight's FP32 kernels on eight GPUs, evaluated
  leave-one-GPU-out), ``compute.params.gemm_model: learned`` for FP32 GEMMs on a GPU with no table.

All of them answer the :class:`ComputeModel` protocol: ``layer_times(model, batch, tp) -> (fwd, bwd)``.
:func:`make_compute_model` builds one from a scenario's ``compute:`` section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topotrain.compute.crossgpu import PredictionError, habitat_gamma, predict_profile, prediction_error
from topotrain.compute.profile import (
    ProfiledModel,
    ProfileEntry,
    ProfileTable,
    load_profile,
    measure_profile,
    save_profile,
)
from topotrain.compute.roofline import (
    DEFAULT_PARAMS,
    ComputeModel,
    ComputeParams,
    RooflineModel,
    achieved_tflops,
    gemm_efficiency,
    layer_time_s,
    layer_times,
    model_time_s,
    params_for_gpu,
    params_from_dict,
)
from topotrain.hardware.gpus import GPUSpec, get_gpu
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model

__all__ = [
    "DEFAULT_PARAMS",
    "ComputeModel",
    "ComputeParams",
    "PredictionError",
    "ProfileEntry",
    "ProfileTable",
    "ProfiledModel",
    "RooflineModel",
    "achieved_tflops",
    "gemm_efficiency",
    "habitat_gamma",
    "layer_time_s",
    "layer_times",
    "load_profile",
    "make_compute_model",
    "measure_profile",
    "model_time_s",
    "params_for_gpu",
    "params_from_dict",
    "predict_profile",
    "prediction_error",
    "save_profile",
]

_KEYS = ("profile", "params", "fallback", "cross_gpu_scaling", "allow_cpu_profile")


def make_compute_model(
    gpu: GPUSpec | str,
    model: Model | None = None,
    dtype: str = "bf16",
    config: Mapping[str, Any] | None = None,
    field: str = "compute",
) -> ComputeModel:
    """The compute model a scenario asks for. ``config`` (the scenario's ``compute:`` section) keys:

    * ``params``: overrides of :class:`ComputeParams` for the roofline (on top of the GPU's own
      ``compute_efficiency``, :func:`params_for_gpu`);
    * ``profile``: path of a measured table (or a :class:`ProfileTable`). Measured on another catalog GPU
      it is first scaled to ``gpu`` by :func:`predict_profile` (``cross_gpu_scaling``: ``habitat`` or
      ``peak``); a CPU-measured table is refused unless ``allow_cpu_profile: true``;
    * ``fallback`` (default true): time layers missing from the profile by the roofline.

    With no profile the roofline of ``gpu`` at ``dtype`` is returned.
    """
    cfg = dict(config or {})
    for key in cfg:
        if key not in _KEYS:
            raise ConfigError(f"{field}.{key}", "unknown key", f"known: {', '.join(_KEYS)}")
    params_cfg = cfg.get("params")
    if params_cfg is not None and not isinstance(params_cfg, Mapping):
        raise ConfigError(
            f"{field}.params", f"expected a mapping, got {params_cfg!r}", "give e.g. {memory_efficiency: 0.9}"
        )
    g = get_gpu(gpu)
    params = params_for_gpu(g, params_cfg, f"{field}.params")
    roofline = RooflineModel(g, dtype, params)
    prof = cfg.get("profile")
    if prof is None:
        return roofline
    table = prof if isinstance(prof, ProfileTable) else load_profile(str(prof), f"{field}.profile")
    for key in ("fallback", "allow_cpu_profile"):
        if key in cfg and not isinstance(cfg[key], bool):
            raise ConfigError(
                f"{field}.{key}", f"must be true or false, got {cfg[key]!r}", "write true or false"
            )
    if table.measured_on_cpu:
        if not cfg.get("allow_cpu_profile", False):
            raise ConfigError(
                f"{field}.profile",
                f"the profile was measured on a CPU, not on {g.name}",
                "measure it on the GPU, or set compute.allow_cpu_profile: true",
            )
    elif get_gpu(table.gpu, f"{field}.profile.gpu").name != g.name:
        scaling = str(cfg.get("cross_gpu_scaling", "habitat"))
        table = predict_profile(table, g, model=model, compute_scaling=scaling)
    return ProfiledModel(table, roofline if cfg.get("fallback", True) else None)
