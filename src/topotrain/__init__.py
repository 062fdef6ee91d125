"""topotrain: predict, explain and optimize distributed DNN training on a GPU cluster before it exists.

The public Python API (what a notebook needs; every name is documented where it is defined)::

    import topotrain as tt

    sc = tt.load_scenario("examples/resnet50-eflops.yaml")
    r = tt.simulate(sc)                        # a Result: iteration_time_s, breakdown, memory, tasks
    r64 = tt.simulate(sc.with_(plan={"micro_batch": 64}), network="analytical")   # a variant, another model
    c = tt.load_cluster("examples/eflops-bigraph.yaml")           # or a mapping, or YAML text
    rep = tt.time_collective(c, "allreduce", "hdrm", "256MiB", network="flow")
    tt.model_names(), tt.network_model_names(), tt.names("gpus")

docs/api.md has worked examples (the test suite runs them).

Bad input raises :class:`ConfigError` (one line naming the field and the fix), as the CLI prints it.
Names are loaded on first use, so ``import topotrain`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": "topotrain.util.errors",
    "Cluster": "topotrain.cluster",
    "load_cluster": "topotrain.api",
    "Scenario": "topotrain.training.simulate",
    "load_scenario": "topotrain.api",
    "scenario_from_dict": "topotrain.api",
    "variant": "topotrain.api",
    "simulate": "topotrain.api",
    "write_trace": "topotrain.report.trace",
    "Result": "topotrain.training.simulate",
    "Breakdown": "topotrain.training.simulate",
    "time_collective": "topotrain.api",
    "time_schedule": "topotrain.api",
    "CollectiveReport": "topotrain.api",
    "build_schedule": "topotrain.collectives.registry",
    "get_model": "topotrain.network.registry",
    "model_names": "topotrain.api",
    "network_model_names": "topotrain.api",
    "names": "topotrain.api",
    "size_of": "topotrain.api",
    "NetworkParams": "topotrain.network.params",
    "Topology": "topotrain.topology.graph",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'topotrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
