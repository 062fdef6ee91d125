"""The host input pipeline: how many samples per second the CPU of a server decodes and augments per GPU.

A CNN trained from JPEG files (PyTorch ``DataLoader`` with ``num_workers`` worker processes per training
process, as NVIDIA DeepLearningExamples' ResNet-50 "pytorch" data backend does) prepares each batch on
the CPU: every worker is one process that decodes, crops, flips and collates one image after the other.
The workers prefetch ahead of the GPU, so in steady state a GPU trains at

    min(GPU rate, workers_per_gpu · samples_per_s_per_worker_ghz · f_cpu)

samples per second (the iteration time is the longer of the GPU's and the loader's), where ``f_cpu`` is
the core clock the workers run at. A CPU runs near its maximum boost clock while few cores are busy and
drops towards its base clock — the clock the vendor guarantees with every core busy at its rated power
(Intel's "Processor Base Frequency", AMD's "Base Clock") — as all cores load:

    f_cpu = boost − (boost − base) · min(1, busy / cores),   busy = gpus_per_server · (workers_per_gpu + 1)

(each training process is one more busy core). Real CPUs step through turbo bins by the number of active
cores and often hold an all-core turbo above base; the linear interpolation to the guaranteed base clock
is the datasheet-only approximation (no per-core-count bins are published for every CPU). So the same
workers feed one GPU faster than they feed eight: NVIDIA's published 1 → 8 GPU ResNet-50 scaling inside
a DGX-1 (6.93x) and a DGX A100 (6.72x) with that loader, against 7.72x for the same code at TF32, whose
GPU rate is under the loader's.

``samples_per_s_per_worker_ghz`` (images per second per worker per GHz of clock) is **calibrated** by
``benchmarks/calibrate.py`` on a row of the calibration subset (ResNet-50 on 8 V100-32GB in a DGX-1,
8,056 img/s; docs/validation.md §3); workers per GPU and the CPU's cores and clocks are each run's
configuration and datasheet figures (``src/topotrain/validate/published.py`` cites them). The model
treats a worker as one hardware thread: it does not model two workers sharing a core's SMT threads.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from topotrain.util.errors import ConfigError
from topotrain.util.fields import PositiveInt, no_bool
from topotrain.util.problems import config_dataclass, several

#: Images per second per DataLoader worker per GHz of core clock: **calibrated** by
#: ``benchmarks/calibrate.py`` (ResNet-50 AMP, 8x V100-32GB DGX-1, DeepLearningExamples PyTorch 21.03,
#: 8,056 img/s with 8 workers per GPU on two 20-core Xeon E5-2698 v4 at their 2.2 GHz base clock).
SAMPLES_PER_S_PER_WORKER_GHZ = 57.2


_GHz = Annotated[float, BeforeValidator(no_bool), Field(gt=0, le=10, allow_inf_nan=False)]
_Rate = Annotated[float, BeforeValidator(no_bool), Field(gt=0, allow_inf_nan=False)]


@config_dataclass("plan.host_input")
class HostInput:
    """A host input pipeline (module docstring): DataLoader workers per GPU, the server's physical CPU
    cores and its base and maximum boost clocks (GHz), and the per-worker rate."""

    workers_per_gpu: PositiveInt
    cpu_cores: PositiveInt
    cpu_base_ghz: _GHz
    cpu_boost_ghz: _GHz
    samples_per_s_per_worker_ghz: _Rate = SAMPLES_PER_S_PER_WORKER_GHZ

    @model_validator(mode="after")
    def _boost_over_base(self) -> HostInput:
        if self.cpu_boost_ghz < self.cpu_base_ghz:
            raise several([ConfigError("cpu_boost_ghz", f"boost clock {self.cpu_boost_ghz} GHz is below the base "
                                       f"clock {self.cpu_base_ghz} GHz",
                                       "give the CPU's maximum boost (turbo) clock, at least its base clock")])
        return self

    def clock_ghz(self, gpus_per_server: int) -> float:
        """The workers' core clock with ``gpus_per_server`` training processes and their workers busy."""
        busy = gpus_per_server * (self.workers_per_gpu + 1)
        load = min(1.0, busy / self.cpu_cores)
        return self.cpu_boost_ghz - (self.cpu_boost_ghz - self.cpu_base_ghz) * load

    def samples_per_s_per_gpu(self, gpus_per_server: int) -> float:
        """Samples per second the loader delivers to each GPU (module docstring)."""
        if gpus_per_server < 1:
            raise ConfigError("plan.host_input", f"{gpus_per_server} GPUs per server", "need at least one GPU")
        return self.workers_per_gpu * self.samples_per_s_per_worker_ghz * self.clock_ghz(gpus_per_server)
