"""Network models by name: ``get_model("flow")``, as a scenario file or the CLI names them."""

from __future__ import annotations

from collections.abc import Callable

from topotrain.errors import ConfigError
from topotrain.network.analytical import AnalyticalModel
from topotrain.network.base import NetworkModel
from topotrain.network.flow import FlowModel
from topotrain.network.flow_async import FlowAsyncModel

_MODELS: dict[str, Callable[[], NetworkModel]] = {
    "analytical": AnalyticalModel,
    "flow": FlowModel,
    "flow-async": FlowAsyncModel,
    "flow-eager": lambda: FlowAsyncModel(eager_sends=True),
}


def model_names() -> list[str]:
    """Names :func:`get_model` accepts."""
    return list(_MODELS)


def get_model(name: str) -> NetworkModel:
    """A fresh network model by name (``analytical``: alpha-beta; ``flow``: max-min fair
    sharing, phases as barriers; ``flow-async``: max-min without phase barriers;
    ``flow-eager``: flow-async where a send is done once its flow starts)."""
    factory = _MODELS.get(name)
    if factory is None:
        raise ConfigError("network.model", f"unknown network model {name!r}",
                          f"use one of {', '.join(_MODELS)}")
    return factory()
