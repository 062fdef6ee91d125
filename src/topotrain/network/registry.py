"""Network models by name: ``get_model("flow", params)``, as a scenario file or the CLI names them.

The table names each model's module of this package and its factory there, imported when the model is first
asked for: a process that times with ``flow`` does not load the asynchronous or the packet model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from topotrain.network.base import NetworkModel
from topotrain.network.params import NetworkParams
from topotrain.util.errors import ConfigError, did_you_mean


def _lazy(module: str, factory: str) -> Callable[[NetworkParams], NetworkModel]:
    """The model factory ``factory`` of this package's ``module``, the module imported on the first call."""

    def make(params: NetworkParams) -> NetworkModel:
        fn: Callable[[NetworkParams], NetworkModel] = getattr(importlib.import_module(f"{__package__}.{module}"),
                                                              factory)
        return fn(params)

    return make


#: Model name → its factory from the network parameters.
_MODELS: dict[str, Callable[[NetworkParams], NetworkModel]] = {
    "analytical": _lazy("analytical", "AnalyticalModel"),
    "flow": _lazy("flow", "FlowModel"),
    "flow-async": _lazy("flow_async", "async_model"),
    "flow-eager": _lazy("flow_async", "eager_model"),
    "packet": _lazy("packet_ns3", "packet_model"),
}


def model_names() -> list[str]:
    """Names :func:`get_model` accepts."""
    return list(_MODELS)


def get_model(name: str, params: NetworkParams | None = None) -> NetworkModel:
    """A network model by name with its parameters (default :class:`NetworkParams`): ``analytical``
    (alpha-beta), ``flow`` (max-min fair sharing, phases as barriers), ``flow-async`` (max-min without
    phase barriers), ``flow-eager`` (flow-async where a send is done once its flow starts), ``packet`` (ns-3
    TCP at packet level, optional and for validation: :mod:`topotrain.network.packet_ns3`)."""
    factory = _MODELS.get(name)
    if factory is None:
        raise ConfigError("network", f"unknown network model {name!r}", did_you_mean(name, list(_MODELS)))
    return factory(params if params is not None else NetworkParams())
