"""A plan on a mixed cluster (several GPU types): which GPU type computes each replica's stages, checked once.

topotrain's task graph is symmetric (:mod:`topotrain.training.builder`): one compute stream per pipeline
stage stands for every data-parallel replica of it, while the communication tasks carry the collectives of
all of them. On a mixed cluster the replicas differ, so the replicas are grouped into *classes*: those whose
stages run on the same GPU types with the same micro-batch count (``plan.dp_shares``). Each class is built
and run as its own symmetric graph — its stages computing at their own GPU's speed, every collective still
on the real groups and links — and the iteration is the slowest class's: the
data-parallel gradient reduction is synchronous, so it is paced by its last member to arrive, and a
collective's transfers are paced by the links its members really cross (per-group NIC speeds in the
topology). A cluster of one GPU type without ``dp_shares`` is one class, every replica — the graph of a
homogeneous cluster, unchanged. A class's graph carries the data-parallel collectives of every replica (they
span the classes) but only its own replicas' tensor- and context-parallel collectives and pipeline sends (each
class runs those at its own pace; where a tensor group crosses servers, another class's traffic on the same
links is not in that graph).

Stragglers (``stragglers:``) compose: a class's stage is slowed by the slowest straggler among that class's
members of the stage (for one class, every member: the homogeneous rule).

Tensor-parallel groups synchronise at every layer, so one across GPU types would run at its slowest GPU and
waste the fast ones; it is refused (``plan.tp``), as are context- and expert-parallel groups across types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from topotrain.training.plan import Plan
from topotrain.util.errors import ConfigError


@dataclass(frozen=True)
class ReplicaClass:
    """Replicas whose stages run on the same GPU types with the same micro-batch count."""

    #: the data-parallel indices of the class's replicas
    replicas: tuple[int, ...]
    #: the GPU type of each pipeline stage
    stage_gpus: tuple[str, ...]
    #: micro-batches each of its replicas runs per iteration
    micro_batches: int
    #: the slowdown of each stage (the slowest straggler among the class's ranks of the stage)
    stage_slowdown: tuple[float, ...]

    def plan_of(self, plan: Plan) -> Plan:
        """``plan`` as every replica of this class runs it (its micro-batch count; shares dropped)."""
        if plan.dp_shares is None and self.micro_batches == plan.num_micro_batches:
            return plan
        mb = plan.micro_batch_size
        return replace(plan, global_batch=plan.dp * self.micro_batches * mb, micro_batch=mb, dp_shares=None)


def _group_types(name: str, field: str, groups: Sequence[Sequence[int]], gpu_of: Sequence[str],
                 gpus: Sequence[str], fix: str) -> None:
    for g in groups:
        types = sorted({gpu_of[r] for r in g})
        if len(types) > 1:
            raise ConfigError(field, f"the {name} group of {gpus[g[0]]}..{gpus[g[-1]]} spans GPU types "
                              f"({', '.join(types)}): it would run at its slowest GPU", fix)


def check_groups(plan: Plan, rank_gpus: Sequence[str], gpus: Sequence[str]) -> None:
    """ConfigError when a tensor-, context- or expert-parallel group of ``plan`` spans GPU types."""
    if len(set(rank_gpus)) <= 1:
        return
    fix = ("keep the group inside one group of servers: choose a degree that divides a server's GPUs, or "
           "an order that keeps it there (plan.order)")
    dims = range(plan.dp), range(plan.tp), range(plan.pp), range(plan.cp)
    if plan.tp > 1:
        tp = [[plan.rank(d, t, p, c) for t in dims[1]] for d in dims[0] for p in dims[2] for c in dims[3]]
        _group_types("tensor-parallel", "plan.tp", tp, rank_gpus, gpus, fix)
    if plan.cp > 1:
        cp = [[plan.rank(d, t, p, c) for c in dims[3]] for d in dims[0] for t in dims[1] for p in dims[2]]
        _group_types("context-parallel", "plan.cp", cp, rank_gpus, gpus, fix)
    if plan.ep > 1:
        raise ConfigError("plan.ep", f"expert parallelism on a cluster of several GPU types "
                          f"({', '.join(sorted(set(rank_gpus)))}) is not modelled", "use ep: 1")


def replica_classes(plan: Plan, rank_gpus: Sequence[str], gpus: Sequence[str],
                    slowdown: Mapping[str, float]) -> list[ReplicaClass]:
    """The replica classes of ``plan`` on ranks of types ``rank_gpus`` (module docstring), in order of their
    first replica; the groups are checked first (:func:`check_groups`)."""
    check_groups(plan, rank_gpus, gpus)
    shares = plan.dp_shares or (plan.num_micro_batches,) * plan.dp
    by_key: dict[tuple[tuple[str, ...], int], list[int]] = {}
    for d in range(plan.dp):
        types = tuple(rank_gpus[plan.rank(d, 0, p)] for p in range(plan.pp))
        by_key.setdefault((types, shares[d]), []).append(d)
    out = []
    for (types, m), reps in by_key.items():
        slow = tuple(max((slowdown.get(gpus[plan.rank(d, t, p, c)], 1.0) for d in reps for c in range(plan.cp)
                          for t in range(plan.tp)), default=1.0) for p in range(plan.pp))
        out.append(ReplicaClass(tuple(reps), types, m, slow))
    return out
