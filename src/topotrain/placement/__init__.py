"""Shared-cluster scheduling on job traces: placement policies on one cluster or a mixed fleet of GPU types,
compared by the slowdown they cause (:mod:`topotrain.placement.scheduler`), on job files or production
traces (:mod:`topotrain.placement.trace`)."""
