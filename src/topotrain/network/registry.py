"""Network models by name: ``get_model("flow", params)``, as a scenario file or the CLI names them."""

from __future__ import annotations

from collections.abc import Callable

from topotrain.network.analytical import AnalyticalModel
from topotrain.network.base import NetworkModel
from topotrain.network.flow import FlowModel
from topotrain.network.flow_async import FlowAsyncModel
from topotrain.network.packet_ns3 import PacketModel, require_ns3
from topotrain.network.params import NetworkParams
from topotrain.util.errors import ConfigError, did_you_mean

_MODELS: dict[str, Callable[[NetworkParams], NetworkModel]] = {
    "analytical": lambda p: AnalyticalModel(p),
    "flow": lambda p: FlowModel(p),
    "flow-async": lambda p: FlowAsyncModel(params=p),
    "flow-eager": lambda p: FlowAsyncModel(eager_sends=True, params=p),
    "packet": lambda p: _packet(p),
}


def _packet(params: NetworkParams) -> NetworkModel:
    """The optional ``packet`` model (ns-3, for validation, run in a subprocess): without the ``ns3`` package it
    is refused with a ConfigError naming the install command."""
    require_ns3()
    return PacketModel(params)


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
