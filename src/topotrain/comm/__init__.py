"""Run topotrain collective schedules for real with torch.distributed (needs the ``torch`` extra).

:func:`run_schedule` executes any :class:`~topotrain.collectives.schedule.Schedule` with point-to-point
operations; the wrappers (:func:`all_reduce`, :func:`reduce_scatter`, :func:`all_gather`,
:func:`broadcast`, :func:`reduce`, :func:`all_to_all`) build one by algorithm name and lay out the
buffers; :func:`hook` is a DDP communication hook. See :mod:`topotrain.comm.execute` for the semantics.
"""

from topotrain.comm.execute import (
    RankPlan,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    build_execution_schedule,
    chunk_offsets,
    plan_schedule,
    rank_slices,
    reduce,
    reduce_scatter,
    resolve_rank_of,
    run_plan,
    run_schedule,
    schedule_size,
    simulate_schedule,
)
from topotrain.comm.hook import CommHook, hook

__all__ = [
    "CommHook",
    "RankPlan",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "build_execution_schedule",
    "chunk_offsets",
    "hook",
    "plan_schedule",
    "rank_slices",
    "reduce",
    "reduce_scatter",
    "resolve_rank_of",
    "run_plan",
    "run_schedule",
    "schedule_size",
    "simulate_schedule",
]
