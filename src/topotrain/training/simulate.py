"""One training iteration end to end: scenario → cluster, model, plan → task graph → engine → Result.

Scenario schema (YAML)::

    cluster: {...}                      # see topotrain.cluster
    model: resnet50                     # a built-in name, or {name: gpt3-175b, seq_len: 1024},
                                        # or a parameterized transformer {type: transformer, layers, ...}
    batch: 256                          # global batch (samples); or plan.global_batch
    plan: {tp: 1, pp: 1, micro_batch: 32, zero_stage: 0, recompute: none, bucket: 25MiB, ...}
    network: flow                       # flow | analytical
    compute: {profile: table.json}      # optional measured per-layer times
    stragglers: {gpus: {s0/gpu3: 1.5}, lognormal_sigma: 0.05, seed: 1}   # optional slowdowns
    degraded_links: [{a: s0/nic0, b: sw/upper0, factor: 0.5}]          # factor 0: failed, rerouted

``dp`` defaults to GPUs / (tp·pp). Every problem is a ConfigError naming its field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.atomic import atomic_write_text
from topotrain.cluster import Cluster, cluster_from_dict, read_yaml
from topotrain.errors import ConfigError
from topotrain.training.engine import Engine, Task
from topotrain.training.plan import Plan, plan_from_dict
from topotrain.workload.layer import Model

_SCENARIO_KEYS = {"cluster", "model", "batch", "plan", "network", "compute", "stragglers", "degraded_links",
                  "name"}


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: Cluster
    model: Model
    plan: Plan
    network: str = "flow"
    compute: Mapping[str, Any] = field(default_factory=dict)
    gpu_slowdown: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Breakdown:
    """Where the critical device's iteration time goes (seconds; they add up to the iteration time)."""

    compute_s: float
    tp_comm_s: float
    exposed_comm_s: float
    bubble_s: float
    overlapped_comm_s: float

    def to_dict(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "tp_comm_s": self.tp_comm_s,
                "exposed_comm_s": self.exposed_comm_s, "bubble_s": self.bubble_s,
                "overlapped_comm_s": self.overlapped_comm_s}


@dataclass
class Result:
    scenario: str
    model: str
    gpus: int
    gpu: str
    plan: Plan
    network: str
    iteration_time_s: float
    samples_per_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown: Breakdown
    peak_memory_bytes: float
    memory: dict[str, float]
    tasks: list[Task]
    link_utilization_top: list[tuple[str, str, float]]

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "scenario": self.scenario, "model": self.model, "gpus": self.gpus, "gpu": self.gpu,
            "network": self.network,
            "plan": {"dp": p.dp, "tp": p.tp, "pp": p.pp, "ep": p.ep, "global_batch": p.global_batch,
                     "micro_batch": p.micro_batch_size, "micro_batches": p.num_micro_batches,
                     "pipeline_schedule": p.pipeline_schedule, "virtual_stages": p.virtual_stages,
                     "zero_stage": p.zero_stage, "fsdp": p.fsdp, "recompute": p.recompute},
            "iteration_time_s": self.iteration_time_s, "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
            "breakdown": self.breakdown.to_dict(), "peak_memory_bytes": self.peak_memory_bytes,
            "memory": self.memory, "tasks": len(self.tasks),
            "busiest_links": [{"src": a, "dst": b, "utilization": u} for a, b, u in self.link_utilization_top],
        }


# ---- scenario loading ---------------------------------------------------------------------------
def _set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = d
    for k in keys[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = {} if nxt is None or not isinstance(nxt, str) else {"name": nxt}
            cur[k] = nxt
        cur = nxt
    cur[keys[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``["plan.tp=8", "batch=512"]`` → set those fields (values parsed as YAML scalars)."""
    import yaml

    for ov in overrides:
        if "=" not in ov:
            raise ConfigError("--set", f"cannot read {ov!r}", "write --set field.path=value, e.g. plan.tp=8")
        key, raw = ov.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        _set_path(data, key.strip(), value)
    return data


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("scenario", f"{path} is not a mapping", "see examples/*.yaml")
    return scenario_from_dict(apply_overrides(data, overrides or []), base_dir=Path(path).parent,
                              name=Path(path).stem)


def _model(spec: Any) -> Model:
    from topotrain.workload.zoo import get_model, model_from_dict

    if isinstance(spec, str):
        return get_model(spec)
    if isinstance(spec, Mapping):
        if spec.get("type") == "transformer":
            return model_from_dict(spec, "model")
        if "name" in spec:
            kw = {k: v for k, v in spec.items() if k != "name"}
            return get_model(str(spec["name"]), **kw)
    raise ConfigError("model", f"cannot read model {spec!r}", "give a name such as resnet50 or gpt3-175b")


def scenario_from_dict(data: Mapping[str, Any], base_dir: Path | None = None, name: str = "scenario") -> Scenario:
    unknown = set(data) - _SCENARIO_KEYS
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown scenario key", f"known: {', '.join(sorted(_SCENARIO_KEYS))}")
    if "cluster" not in data:
        raise ConfigError("cluster", "is required", "add a cluster section (see examples/)")
    if "model" not in data:
        raise ConfigError("model", "is required", "add e.g. `model: resnet50`")
    cluster = cluster_from_dict(data["cluster"], base_dir=base_dir)
    for item in data.get("degraded_links") or []:
        cluster = _degrade(cluster, item)
    model = _model(data["model"])
    plan_d = dict(data.get("plan") or {})
    if "batch" in data:
        b = data["batch"]
        if isinstance(b, Mapping):
            if "global" in b:
                plan_d["global_batch"] = b["global"]
            if "micro" in b:
                plan_d["micro_batch"] = b["micro"]
        else:
            plan_d["global_batch"] = b
    gpus = len(cluster.topology.gpus)
    tp, pp = (plan_d.get(k, 1) for k in ("tp", "pp"))
    for key, v in (("tp", tp), ("pp", pp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"plan.{key}", f"must be a positive integer, got {v!r}", f"give {key}: 1 or more")
    if "dp" not in plan_d:
        if gpus % (int(tp) * int(pp)):
            raise ConfigError("plan", f"tp·pp = {int(tp) * int(pp)} does not divide the {gpus} GPUs of the cluster",
                              "choose tp and pp whose product divides the GPU count")
        plan_d["dp"] = gpus // (int(tp) * int(pp))
    plan = plan_from_dict(plan_d).validate(gpus)
    if plan.dtype == "auto":
        from topotrain.hardware.gpus import get_gpu

        spec = get_gpu(cluster.gpu)
        plan = replace(plan, dtype="bf16" if "bf16" in spec.peak_flops_per_s else "fp16")
    network = str(data.get("network", "flow"))
    slow = _slowdowns(data.get("stragglers"), cluster.topology.gpus)
    return Scenario(str(data.get("name", name)), cluster, model, plan, network,
                    dict(data.get("compute") or {}), slow)


def _degrade(cluster: Cluster, item: Any) -> Cluster:
    if not isinstance(item, Mapping) or "a" not in item or "b" not in item:
        raise ConfigError("degraded_links", f"cannot read {item!r}", "write {a: NODE, b: NODE, factor: 0.5}")
    factor = float(item.get("factor", 0.0))
    return replace(cluster, topology=cluster.topology.with_degraded_links([(str(item["a"]), str(item["b"]), factor)]))


def _slowdowns(spec: Any, gpus: list[str]) -> dict[str, float]:
    if not spec:
        return {}
    if not isinstance(spec, Mapping):
        raise ConfigError("stragglers", "must be a mapping", "e.g. {gpus: {s0/gpu0: 1.5}}")
    out: dict[str, float] = {}
    sigma = float(spec.get("lognormal_sigma", 0.0))
    if sigma < 0:
        raise ConfigError("stragglers.lognormal_sigma", "must be >= 0", "give e.g. 0.05")
    if sigma > 0:
        rng = np.random.default_rng(int(spec.get("seed", 0)))
        draws = rng.lognormal(0.0, sigma, size=len(gpus))
        out.update({g: float(max(1.0, x)) for g, x in zip(gpus, draws, strict=True)})
    for g, f in dict(spec.get("gpus") or {}).items():
        if g not in gpus:
            raise ConfigError(f"stragglers.gpus.{g}", "is not a GPU of the cluster", f"e.g. {gpus[0]}")
        if float(f) < 1.0:
            raise ConfigError(f"stragglers.gpus.{g}", "a slowdown factor must be >= 1", "1.5 = 50% slower")
        out[g] = float(f) * out.get(g, 1.0)
    return out


# ---- running ------------------------------------------------------------------------------------
def _compute_times(sc: Scenario) -> Any:
    from topotrain.compute import make_compute_model

    return make_compute_model(sc.cluster.gpu, sc.model, sc.plan.dtype, sc.compute)


def _interval_union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(iv: list[tuple[float, float]], by: list[tuple[float, float]]) -> float:
    """Length of the union of ``iv`` that lies inside the union of ``by``."""
    a_u, b_u = _interval_union(iv), _interval_union(by)
    total, j = 0.0, 0
    for a0, a1 in a_u:
        while j < len(b_u) and b_u[j][1] <= a0:
            j += 1
        k = j
        while k < len(b_u) and b_u[k][0] < a1:
            total += max(0.0, min(a1, b_u[k][1]) - max(a0, b_u[k][0]))
            k += 1
    return total


def simulate(sc: Scenario) -> Result:
    from topotrain.training.builder import IterationBuilder
    from topotrain.training.memory import check_fits, memory_per_rank, memory_plan_from

    plan, model, topo = sc.plan, sc.model, sc.cluster.topology
    mem = memory_per_rank(model, memory_plan_from(plan))
    from topotrain.hardware.gpus import get_gpu

    gpu = get_gpu(sc.cluster.gpu)
    check_fits(mem, gpu)
    compute = _compute_times(sc)
    gpus = topo.gpus
    stage_slow = [1.0] * plan.pp
    for s in range(plan.pp):
        members = [gpus[plan.rank(d, t, s)] for d in range(plan.dp) for t in range(plan.tp)]
        stage_slow[s] = max((sc.gpu_slowdown.get(g, 1.0) for g in members), default=1.0)
    engine = Engine(topo, sc.network)
    builder = IterationBuilder(model, plan, gpus, engine, lambda b, t: compute.layer_times(model, b, t),
                               stage_slowdown=stage_slow)
    built = builder.build()
    t_iter = engine.run(built.graph)
    link_bytes = engine.link_bytes.copy()
    for spec, uses in _blocking_uses(builder, built):
        link_bytes += engine._memo[spec.key][1] * uses
    tasks = built.graph.tasks
    # breakdown on the device with the most compute (the critical one)
    crit = int(np.argmax(built.compute_s_by_device))
    comp_iv = [(t.start_s, t.end_s) for t in tasks if t.stage == crit and t.stream.endswith("/compute")]
    comm_iv = [(t.start_s, t.end_s) for t in tasks if t.stage == crit and t.comm is not None
               and t.end_s > t.start_s]
    comm_union = sum(b - a for a, b in _interval_union(comm_iv))
    hidden = _covered(comm_iv, comp_iv)
    exposed = comm_union - hidden
    compute_s = built.compute_s_by_device[crit]
    tp_s = built.tp_comm_s_by_device[crit]
    bubble = max(0.0, t_iter - compute_s - tp_s - exposed)
    samples_per_s = plan.global_batch / t_iter if t_iter > 0 else 0.0
    tokens_per_s = samples_per_s * model.tokens_per_sample
    peak = gpu.peak(plan.dtype)
    try:
        flops_hw = model.megatron_flops_per_iteration(plan.global_batch, recompute=plan.recompute == "full")
        flops_model = model.megatron_flops_per_iteration(plan.global_batch, recompute=False)
    except ConfigError:
        flops_model = model.train_flops_per_sample(False) * plan.global_batch
        flops_hw = model.train_flops_per_sample(plan.recompute == "full") * plan.global_batch
    n = plan.gpus
    tflops = flops_hw / t_iter / n / 1e12 if t_iter > 0 else 0.0
    mfu = flops_model / t_iter / n / peak if t_iter > 0 else 0.0
    mem_d = mem.to_dict() if hasattr(mem, "to_dict") else {k: float(v) for k, v in vars(mem).items()}
    return Result(sc.name, model.name, n, gpu.name, plan, sc.network, t_iter, samples_per_s, tokens_per_s,
                  tflops, mfu, Breakdown(compute_s, tp_s, exposed, bubble, hidden),
                  float(mem.total_bytes), mem_d, tasks, _top_links(topo, link_bytes, t_iter))


def _blocking_uses(builder: Any, built: Any) -> list[tuple[Any, int]]:
    """Each blocking TP/EP collective (timed inside compute tasks) with how many times an iteration runs it:
    once per micro-batch pass through its chunk (forward, backward, and recomputed forward)."""
    plan = builder.plan
    passes = plan.num_micro_batches
    seen: dict[str, tuple[Any, int]] = {}
    for spec in builder.blocking_specs:
        n = seen.get(spec.key, (spec, 0))[1]
        seen[spec.key] = (spec, n + passes)
    return list(seen.values())


def _top_links(topo: Any, link_bytes: np.ndarray, t_iter: float, k: int = 5) -> list[tuple[str, str, float]]:
    if t_iter <= 0 or not len(link_bytes):
        return []
    util = link_bytes / (topo.capacity_bytes_per_s * t_iter)
    order = np.argsort(-util, kind="stable")[:k]
    return [(topo.links[i].src, topo.links[i].dst, float(util[i])) for i in order if util[i] > 0]


def write_trace(result: Result, path: str | Path) -> None:
    """Chrome / Perfetto trace (JSON array format), written atomically."""
    events: list[dict[str, Any]] = []
    for t in result.tasks:
        if not (t.end_s >= t.start_s):
            continue
        events.append({"name": t.name, "cat": t.category, "ph": "X", "ts": t.start_s * 1e6,
                       "dur": (t.end_s - t.start_s) * 1e6, "pid": f"stage {t.stage}", "tid": t.stream})
    write_json_atomic(path, {"traceEvents": events, "displayTimeUnit": "ms"})


def write_json_atomic(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj), make_parents=True)
