"""The iteration a job runs at after a failure inside it, and its speed with servers missing.

A failed GPU belongs to one data-parallel replica ``d`` and one pipeline stage ``p`` (Megatron's rank
order, :meth:`topotrain.training.plan.Plan.rank`). A synchronous job cannot finish the iteration in flight
without it: the stage stalls until a restart (detection + restart). After the restart the job either runs
whole again (a spare took the GPU's place) or, elastic (TorchElastic-style), without the failed GPU's
replica: ``dp' = dp − lost`` replicas (rounded down to a multiple of ``ep``), each with the same per-replica
batch, so an iteration trains ``dp'/dp`` of the samples. Its iteration time comes from the simulator:
:func:`topotrain.training.simulate.simulate` on the scenario with ``dp'`` replicas (placed on the cluster's
first ``dp'·tp·pp`` GPUs: in a symmetric network, the same as the survivors). A job with one replica has
nothing to shrink to: it waits.

:func:`elastic_rates` turns a few such simulations into the relative speed of the job with ``m`` servers
missing (``m`` servers take ``m ×`` the replicas one server holds, as if each held different replicas: the
worst case), interpolating the per-replica throughput linearly in ``dp'`` between the simulated degrees.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from topotrain.training.plan import Plan
from topotrain.training.simulate import Result, Scenario, simulate
from topotrain.util.errors import ConfigError


@dataclass(frozen=True)
class DegradedIteration:
    """What a failure inside an iteration does to the job (times in seconds, throughputs per second)."""

    failed_gpus: tuple[str, ...]
    replicas_lost: tuple[int, ...]
    stages_hit: tuple[int, ...]
    dp_before: int
    dp_after: int
    iteration_time_s: float
    #: the iteration in flight when the GPU fails: it completes only after detection and a restart
    stalled_iteration_s: float
    #: the iteration the shrunk (elastic) job runs at; ``inf`` when nothing is left to shrink to
    degraded_iteration_time_s: float
    samples_per_s: float
    degraded_samples_per_s: float
    tokens_per_s: float
    degraded_tokens_per_s: float

    @property
    def relative_throughput(self) -> float:
        return self.degraded_samples_per_s / self.samples_per_s if self.samples_per_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d["relative_throughput"] = self.relative_throughput
        return d


def coordinates(plan: Plan, rank: int) -> tuple[int, int, int]:
    """(data-parallel index, tensor index, pipeline stage) of ``rank`` (the inverse of ``Plan.rank``)."""
    if plan.placement == "dp-first":
        return rank % plan.dp, (rank // plan.dp) % plan.tp, rank // (plan.dp * plan.tp)
    return (rank // plan.tp) % plan.dp, rank % plan.tp, rank // (plan.tp * plan.dp)


def shrunk(sc: Scenario, dp: int) -> Scenario:
    """``sc`` with ``dp`` data-parallel replicas, each with its per-replica batch as before."""
    plan = sc.plan
    if not 1 <= dp <= plan.dp:
        raise ConfigError("plan.dp", f"cannot shrink dp={plan.dp} to {dp}", f"give 1 ≤ dp ≤ {plan.dp}")
    if dp == plan.dp:
        return sc
    return dataclasses.replace(sc, plan=dataclasses.replace(plan, dp=dp, global_batch=plan.replica_batch * dp))


def allowed_dp(plan: Plan, dp: int) -> int:
    """The largest degree ≤ ``dp`` the plan can shrink to: ``ep`` must divide ``dp·cp`` (Megatron-Core draws the
    expert-parallel ranks from the data- and context-parallel ones); 0 if none."""
    step = plan.ep // math.gcd(plan.ep, plan.cp)  # ep | d·cp  ⇔  ep/gcd(ep, cp) | d
    return max(0, dp - dp % step)


def degraded_iteration(sc: Scenario, failed_gpus: Sequence[str], detect_s: float, restart_s: float,
                       base: Result | None = None, run: Callable[[Scenario], Result] = simulate
                       ) -> DegradedIteration:
    """What losing ``failed_gpus`` does to ``sc`` (module docstring)."""
    gpus = sc.cluster.topology.gpus
    index = {g: i for i, g in enumerate(gpus[: sc.plan.gpus])}
    unknown = [g for g in failed_gpus if g not in index]
    if unknown:
        raise ConfigError("--fail-gpu", f"{unknown[0]!r} is not a GPU of the job", f"e.g. {gpus[0]}")
    if not failed_gpus:
        raise ConfigError("--fail-gpu", "no GPU given", f"name one, e.g. {gpus[0]}")
    base = base or run(sc)
    coords = [coordinates(sc.plan, index[g]) for g in failed_gpus]
    lost = sorted({d for d, _, _ in coords})
    stages = sorted({p for _, _, p in coords})
    dp_after = allowed_dp(sc.plan, sc.plan.dp - len(lost))
    tokens_per_sample = base.tokens_per_s / base.samples_per_s if base.samples_per_s else 0.0
    if dp_after >= 1:
        r = run(shrunk(sc, dp_after))
        t_deg, sps = r.iteration_time_s, r.samples_per_s
    else:
        t_deg, sps = float("inf"), 0.0
    return DegradedIteration(tuple(failed_gpus), tuple(lost), tuple(stages), sc.plan.dp, dp_after,
                             base.iteration_time_s, base.iteration_time_s + detect_s + restart_s, t_deg,
                             base.samples_per_s, sps, base.tokens_per_s, sps * tokens_per_sample)


def replicas_per_server(sc: Scenario) -> int:
    """Distinct data-parallel replicas among the ranks of the job's first server."""
    plan, gps = sc.plan, max(1, sc.cluster.gpus_per_server)
    return len({coordinates(plan, r)[0] for r in range(min(gps, plan.gpus))})


def elastic_rates(sc: Scenario, base: Result, servers_max: int, points: Sequence[int] = (1, 8, 64),
                  run: Callable[[Scenario], Result] = simulate) -> tuple[float, ...]:
    """Relative speed (samples per second over the whole job's) with ``m = 0..servers_max`` servers missing;
    simulated at the ``points`` (clipped to what can still run), interpolated between (module docstring)."""
    plan = sc.plan
    per = replicas_per_server(sc)
    dps = [allowed_dp(plan, plan.dp - m * per) for m in range(servers_max + 1)]
    sim_dp = sorted({d for d in (allowed_dp(plan, plan.dp - m * per) for m in points if m <= servers_max) if d >= 1})
    per_replica = {plan.dp: base.samples_per_s / plan.dp}
    for d in sim_dp:
        if d not in per_replica:
            per_replica[d] = run(shrunk(sc, d)).samples_per_s / d
    xs = np.array(sorted(per_replica))
    ys = np.array([per_replica[x] for x in xs])
    rates = [float(d * np.interp(d, xs, ys) / base.samples_per_s) if d >= 1 else 0.0 for d in dps]
    while len(rates) > 1 and rates[-1] == 0.0 and rates[-2] == 0.0:
        rates.pop()
    return tuple(rates)
