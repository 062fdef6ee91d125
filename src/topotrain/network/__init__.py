"""Network models behind one event-driven interface (:class:`NetworkSim`): analytical alpha-beta,
flow-level max-min (``flow``), and the barrier-free ``flow-async`` / ``flow-eager``.

Names are loaded on first use (as :mod:`topotrain` does), so importing one module of this package (the
flow model, the network parameters) does not load every model.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each name this package exports → its module.
_EXPORTS = {
    "AnalyticalModel": "analytical",
    "CollectiveResult": "base",
    "JobTiming": "base",
    "NetworkModel": "base",
    "NetworkSim": "base",
    "run_alone": "base",
    "run_concurrent": "base",
    "FlowModel": "flow",
    "FlowAsyncModel": "flow_async",
    "FlowNetwork": "flow_network",
    "max_min_rates": "maxmin",
    "NetworkParams": "params",
    "get_model": "registry",
    "model_names": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
