"""A testbed on one machine: the cluster emulated with network namespaces, measured against predictions.

:mod:`~topotrain.testbed.netns` builds the emulated network, :mod:`~topotrain.testbed.worker` is the
per-rank process that runs collectives over it, :mod:`~topotrain.testbed.compare` runs cases and sets
the measurements beside the flow and analytical models' predictions.
"""

from topotrain.testbed.netns import Emulation, clean, netns_available

__all__ = ["Emulation", "clean", "netns_available"]
