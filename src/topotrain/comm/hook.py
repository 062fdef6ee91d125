"""A PyTorch DDP communication hook that averages gradients with a topotrain allreduce schedule.

Usage::

    from topotrain.comm import hook
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, hook("ring", cluster))      # state: the process group, or None

For each gradient bucket the hook divides the flat bucket buffer by the group size (first, as PyTorch's
own ``allreduce_hook`` does, so that float16 sums cannot overflow), runs the allreduce schedule on it
with :func:`topotrain.comm.execute.run_plan` and returns an already completed
``torch.futures.Future`` holding the buffer (the pattern of PyTorch's ``noop_hook``). Schedules and the
per-rank plans are cached per bucket size; buckets of one size on every rank share one plan.

Source: PyTorch DDP communication hooks (``torch.distributed.algorithms.ddp_comm_hooks``,
``DistributedDataParallel.register_comm_hook``).

No ``from __future__ import annotations`` here: DDP inspects the hook's annotations at registration and
wants the real ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` objects, not strings.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from topotrain.collectives.schedule import CollectiveOp, Schedule
from topotrain.comm.execute import (
    RankPlan,
    _topology,
    _warm_up,
    build_execution_schedule,
    plan_schedule,
    resolve_rank_of,
    run_plan,
    schedule_size,
)
from topotrain.util.errors import ConfigError

__all__ = ["CommHook", "hook"]

CommHook = Callable[[Any, "dist.GradBucket"], "torch.futures.Future[torch.Tensor]"]


def hook(algorithm: str | Callable[[torch.Tensor, int], Schedule], cluster_or_topo: Any = None, *,
         ranks: Sequence[str] | None = None, **options: Any) -> CommHook:
    """A DDP comm hook averaging each gradient bucket with our allreduce.

    ``algorithm``: a registry name (``ring``, ``halving-doubling``, ``tree``, ``hierarchical``,
    ``torus2d``, ``hdrm``, ...), built on ``cluster_or_topo`` (a Cluster or a Topology) for ``ranks``
    (GPU node names, one per process of the DDP group; default: the topology's first GPUs), with
    ``options`` passed to the builder; or a callable ``(bucket_buffer, num_ranks) -> Schedule``
    returning an allreduce schedule for that buffer (in bytes or in elements, see
    :mod:`topotrain.comm.execute`). The hook's ``state`` (first argument of ``register_comm_hook``) is
    the process group, ``None`` for the default group. Buckets are built in bytes
    (:func:`~topotrain.comm.execute.schedule_size`), the message topotrain times.
    """
    if isinstance(algorithm, str):
        if cluster_or_topo is None:
            raise ConfigError("cluster_or_topo", f"algorithm {algorithm!r} needs a cluster or topology",
                              "pass hook(algorithm, cluster)")
        topo = _topology(cluster_or_topo)
        name = algorithm

        def build_named(buf: torch.Tensor, num_ranks: int) -> Schedule:
            return build_execution_schedule(CollectiveOp.ALLREDUCE, name, topo, ranks, schedule_size(buf),
                                            num_ranks, **options)

        build: Callable[[torch.Tensor, int], Schedule] = build_named
    elif callable(algorithm):
        build = algorithm
    else:
        raise ConfigError("algorithm", f"expected an algorithm name or a schedule builder, got "
                          f"{type(algorithm).__name__}", "pass e.g. 'ring'")

    plans: dict[tuple[int, int, int, int], tuple[RankPlan, tuple[int, ...]]] = {}

    def comm_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group = state if isinstance(state, dist.ProcessGroup) else None
        buf = bucket.buffer()
        world = dist.get_world_size(group)
        key = (buf.numel(), buf.element_size(), world, dist.get_rank())
        hit = plans.get(key)
        if hit is None:
            schedule = build(buf, world)
            if schedule.op != CollectiveOp.ALLREDUCE:
                raise ConfigError("algorithm", "the hook needs an allreduce schedule, got "
                                  f"{schedule.op.value}", "build an allreduce")
            rank_of = resolve_rank_of(schedule.num_ranks, group)
            me = rank_of.index(dist.get_rank())
            hit = (plan_schedule(schedule, buf.numel(), me), rank_of)
            plans[key] = hit
        plan, rank_of = hit
        buf.div_(world)
        _warm_up(group, buf.device, True)
        run_plan(plan, buf, rank_of, group, "sum")
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return comm_hook
