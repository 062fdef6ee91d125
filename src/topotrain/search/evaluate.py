"""One point of a search: check it, prune it, time it, cost it — a pure function of its inputs.

Order (cheapest first, so that nothing is timed that could not be built or run):

1. the scenario schema and the resolver (:func:`topotrain.scenario.load.resolve`): an invalid point is
   recorded as ``invalid`` with the field and message of its first problem, never raised;
2. the GPU-count constraint, then memory (:func:`topotrain.training.memory.memory_per_rank` against the
   GPU's memory): a plan that does not fit is ``infeasible`` before any topology is built;
3. the cluster is built and costed (:mod:`topotrain.search.cost`): budget and power constraints;
4. :func:`topotrain.simulate` with the stage's network model (``analytical`` to screen, ``flow`` to
   confirm), and the objectives computed from its result.

The record is plain data (it crosses process and Dask worker boundaries and goes to SQLite as JSON) and
depends only on the task, so every executor gives identical records.
"""

from __future__ import annotations

import copy
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topotrain.scenario.cluster import group_gpus
from topotrain.scenario.load import resolve, scenario_from_resolved
from topotrain.scenario.memo import built_cluster
from topotrain.search.cost import cluster_cost, run_cost
from topotrain.training.memory import memory_per_rank, memory_plan_from
from topotrain.training.simulate import simulate
from topotrain.util.errors import ConfigError, problems_of

if TYPE_CHECKING:
    from topotrain.cluster import Cluster
    from topotrain.search.cost import ClusterCost
    from topotrain.topology.graph import Topology


@dataclass(frozen=True)
class Task:
    """What a worker needs to evaluate one point."""

    key: str
    seq: int
    stage: str
    point: Mapping[str, Any]
    network: str | None
    prices: Mapping[str, Any]
    gpus: int | None = None
    budget_usd: float | None = None
    max_power_kw: float | None = None
    train_tokens: float | None = None
    train_samples: float | None = None
    base_dir: str = "."
    choices: Mapping[str, Any] = field(default_factory=dict)


#: Bills of materials of the topologies this process costed, by (template, prices) (dropped with the topology).
_COSTS: weakref.WeakKeyDictionary[Topology, dict[tuple[str, str], ClusterCost]] = weakref.WeakKeyDictionary()


def _costed(cluster: Cluster, template: str, prices: Mapping[str, Any]) -> ClusterCost:
    """:func:`topotrain.search.cost.cluster_cost`, memoized per topology (a memoized cluster is costed once)."""
    per = _COSTS.setdefault(cluster.topology, {})
    key = (template, json.dumps(prices, sort_keys=True, default=str))
    if key not in per:
        per[key] = cluster_cost(cluster, template, prices)
    return per[key]


def _record(task: Task, status: str, reason: str = "", field_: str = "",
            metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"key": task.key, "seq": task.seq, "stage": task.stage, "status": status, "field": field_,
            "reason": reason, "metrics": metrics or {}, "choices": dict(task.choices), "point": dict(task.point)}


def _template_name(spec: Any) -> str:
    srv = spec.cluster.server
    if srv is None:
        return "default"
    return srv if isinstance(srv, str) else str(srv.name)


def evaluate(task: Task) -> dict[str, Any]:
    """The record of ``task``'s point: ``status`` ok / invalid / infeasible / error, and its metrics. An
    unexpected exception inside the model is recorded as ``error`` (with its type and message), so one
    point never stops a search."""
    try:
        return _evaluate(task)
    except ConfigError as e:
        first = problems_of(e)[0]
        return _record(task, "invalid", first.message + (f" ({first.fix})" if first.fix else ""), first.field)
    except Exception as e:  # a bug in a model, not bad input: keep it, say what it was
        return _record(task, "error", f"{type(e).__name__}: {e}", "internal")


def _evaluate(task: Task) -> dict[str, Any]:
    doc = copy.deepcopy(dict(task.point))
    if task.network is not None:
        doc["network"] = task.network
    base = Path(task.base_dir)
    try:
        r = resolve(doc, base, "point")
    except ConfigError as e:
        first = problems_of(e)[0]
        return _record(task, "invalid", first.message + (f" ({first.fix})" if first.fix else ""), first.field)
    if task.gpus is not None and r.gpus != task.gpus:
        return _record(task, "infeasible", f"{r.gpus} GPUs, the constraint is {task.gpus}", "gpus")
    gpu = r.catalog.gpu(r.gpu)
    if r.spec.cluster.groups is not None:  # a mixed fleet: the smallest GPU must hold the busiest stage
        gpu = min((r.catalog.gpu(g) for g in group_gpus(r.spec.cluster, r.catalog)), key=lambda g: g.memory_bytes)
    mem = memory_per_rank(r.model, memory_plan_from(r.plan))
    if not mem.total_bytes <= gpu.memory_bytes:
        return _record(task, "infeasible", f"needs {mem.total_bytes / 2**30:.1f} GiB per GPU, {gpu.name} has "
                       f"{gpu.memory_bytes / 2**30:.0f} GiB", "memory",
                       {"peak_memory_bytes": float(mem.total_bytes)})
    try:
        sc = scenario_from_resolved(r, base, build=built_cluster)
    except ConfigError as e:
        first = problems_of(e)[0]
        return _record(task, "invalid", first.message + (f" ({first.fix})" if first.fix else ""), first.field)
    cost = _costed(sc.cluster, _template_name(r.spec), task.prices)
    gpu_name = "+".join(sc.cluster.gpu_names)
    m: dict[str, Any] = {"gpus": r.gpus, "gpu": gpu_name, "capex_usd": cost.capex_usd, "power_kw": cost.power_w / 1000,
                         "capex_parts_usd": dict(cost.parts_usd)}
    if task.budget_usd is not None and cost.capex_usd > task.budget_usd:
        return _record(task, "infeasible", f"capex {cost.capex_usd:,.0f} USD over the budget {task.budget_usd:,.0f}",
                       "budget_usd", m)
    if task.max_power_kw is not None and cost.power_w / 1000 > task.max_power_kw:
        return _record(task, "infeasible", f"power {cost.power_w / 1000:,.1f} kW over {task.max_power_kw:,.1f} kW",
                       "max_power_kw", m)
    try:
        res = simulate(sc)
    except ConfigError as e:
        first = problems_of(e)[0]
        return _record(task, "invalid", first.message, first.field, m)
    tokens_s = res.tokens_per_s
    run = run_cost(cost, task.prices)
    m.update({
        "network": res.network, "comm": {"library": res.comm_library}, "routing": res.routing,
        "iteration_time_s": res.iteration_time_s,
        "iteration_time_s_low": res.iteration_time_s_low, "iteration_time_s_high": res.iteration_time_s_high,
        "error_band": res.error_band.to_dict() if res.error_band else None, "samples_per_s": res.samples_per_s,
        "tokens_per_s": tokens_s, "mfu": res.mfu, "peak_memory_bytes": res.peak_memory_bytes,
        "breakdown": res.breakdown.to_dict(),
        "busiest_links": [[a, b, u] for a, b, u in res.link_utilization_top],
        "usd_per_1m_tokens": run.usd_per_s * 1e6 / tokens_s if tokens_s > 0 else float("inf"),
        "tokens_per_s_per_kw": tokens_s / (cost.power_w / 1000) if cost.power_w > 0 else 0.0,
        "plan": {"dp": res.plan.dp, "tp": res.plan.tp, "pp": res.plan.pp, "dp_algorithm": res.plan.dp_algorithm,
                 **({"cp": res.plan.cp} if res.plan.cp > 1 else {})},
    })
    if task.train_tokens is not None:
        m["time_to_train_s"] = task.train_tokens / tokens_s if tokens_s > 0 else float("inf")
    elif task.train_samples is not None:
        m["time_to_train_s"] = task.train_samples / res.samples_per_s if res.samples_per_s > 0 else float("inf")
    else:
        m["time_to_train_s"] = res.iteration_time_s
    return _record(task, "ok", metrics=m)
