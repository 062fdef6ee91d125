"""Shared-cluster scheduling on job traces: topology-aware placement policies compared by the slowdown
they cause (:mod:`topotrain.placement.scheduler`)."""
