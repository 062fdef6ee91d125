"""Collective algorithms as schedules of point-to-point transfers, and their closed-form costs."""

from topotrain.collectives.registry import ALGORITHMS, AlgorithmInfo, algorithms_for, build_schedule
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.collectives.verify import ScheduleError, check_schedule

__all__ = [
    "ALGORITHMS",
    "AlgorithmInfo",
    "CollectiveOp",
    "Phase",
    "Schedule",
    "ScheduleError",
    "algorithms_for",
    "build_schedule",
    "check_schedule",
    "split_bytes",
]
