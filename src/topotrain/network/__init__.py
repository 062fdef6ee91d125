"""Network models: time a collective Schedule on a Topology (analytical alpha-beta, flow-level max-min)."""

from topotrain.network.analytical import AnalyticalModel
from topotrain.network.base import CollectiveResult, NetworkModel

__all__ = ["AnalyticalModel", "CollectiveResult", "NetworkModel"]
