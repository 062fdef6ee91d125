"""Network models behind one event-driven interface (:class:`NetworkSim`): analytical alpha-beta,
flow-level max-min (``flow``), and the barrier-free ``flow-async`` / ``flow-eager``."""

from topotrain.network.analytical import AnalyticalModel
from topotrain.network.base import CollectiveResult, JobTiming, NetworkModel, NetworkSim, run_alone, run_concurrent
from topotrain.network.flow import FlowModel
from topotrain.network.flow_async import FlowAsyncModel
from topotrain.network.flow_network import FlowNetwork
from topotrain.network.maxmin import max_min_rates
from topotrain.network.params import NetworkParams
from topotrain.network.registry import get_model, model_names

__all__ = ["AnalyticalModel", "CollectiveResult", "FlowAsyncModel", "FlowModel", "FlowNetwork", "JobTiming",
           "NetworkModel", "NetworkParams", "NetworkSim", "get_model", "max_min_rates", "model_names", "run_alone",
           "run_concurrent"]
