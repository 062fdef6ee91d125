"""Network models: time a collective Schedule on a Topology (analytical alpha-beta, flow-level max-min)."""

from topotrain.network.analytical import AnalyticalModel
from topotrain.network.base import CollectiveResult, NetworkModel
from topotrain.network.flow import FlowModel, FlowNetwork, JobTiming, run_concurrent
from topotrain.network.maxmin import max_min_rates
from topotrain.network.registry import get_model

__all__ = ["AnalyticalModel", "CollectiveResult", "FlowModel", "FlowNetwork", "JobTiming", "NetworkModel",
           "get_model", "max_min_rates", "run_concurrent"]
