"""Collective algorithms as schedules of point-to-point transfers, and their closed-form costs."""

from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes

__all__ = ["CollectiveOp", "Phase", "Schedule", "split_bytes"]
