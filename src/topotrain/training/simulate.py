"""One training iteration end to end: a built :class:`Scenario` (cluster, model, plan) → task graph → engine →
:class:`Result`. Scenarios are made from files and mappings by :mod:`topotrain.scenario.load`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.cluster import Cluster
from topotrain.collectives.protocol import NCCL, CommLibrary
from topotrain.compute import make_compute_model
from topotrain.compute.fp8 import FP8Compute
from topotrain.compute.roofline import RooflineModel
from topotrain.hardware.gpus import GPUSpec
from topotrain.network.registry import get_model
from topotrain.topology.routing import routing_mode
from topotrain.training.bands import Band, band, regime_of
from topotrain.training.builder import IterationBuilder
from topotrain.training.engine import Engine, Task
from topotrain.training.length_binning import PaddedLengthCompute
from topotrain.training.memory import check_fits, memory_per_rank, memory_per_stage, memory_plan_from
from topotrain.training.mixed import replica_classes
from topotrain.training.plan import Plan
from topotrain.training.sync_tasks import stale_iteration_s
from topotrain.util import jsonsafe, progress
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.workload.context_parallel import cp_local_model
from topotrain.workload.layer import Model


@dataclass(frozen=True)
class Scenario:
    """A validated, built scenario: what :func:`simulate` runs."""

    name: str
    cluster: Cluster
    model: Model
    plan: Plan
    network: str = "flow"
    compute: Mapping[str, Any] = field(default_factory=dict)
    gpu_slowdown: Mapping[str, float] = field(default_factory=dict)
    #: the links degraded (a, b, factor) in ``cluster.topology``, as the scenario lists them
    degraded_links: tuple[tuple[str, str, float], ...] = ()
    #: the scenario's model built at another sequence length, every other option as written (what
    #: ``plan.length_binning`` needs; None for a scenario built without its schema)
    model_at_seq_len: Callable[[int], Model] | None = field(default=None, compare=False)
    #: the communication library that puts every collective on the wire (``comm.library``; NCCL by default)
    comm: CommLibrary = NCCL
    #: the scenario of the document this one was loaded from with ``changes`` applied (set by the scenario
    #: loader, :func:`topotrain.scenario.load.scenario_from_dict`; None for a scenario built by hand)
    derive: Callable[[Mapping[str, Any]], Scenario] | None = field(default=None, compare=False, repr=False)

    def with_(self, changes: Mapping[str, Any] | None = None, /, **sections: Any) -> Scenario:
        """A variant of this scenario, validated by the same schema as a file: ``sc.with_(plan={"micro_batch":
        64})``, ``sc.with_({"cluster.servers": 32}, network="analytical")``. Mappings merge into the document
        field by field, dotted keys name nested fields, ``None`` deletes a field (its default applies again), and
        a new ``cluster.network.topology`` drops the old builder's own parameters (the rules of ``--set``:
        :func:`topotrain.scenario.load.apply_changes`). The cluster is rebuilt only where its section changed."""
        if self.derive is None:
            raise ConfigError("scenario", f"{self.name!r} was built by hand, not loaded from a document",
                              "load it with topotrain.load_scenario(path) or topotrain.scenario_from_dict(mapping)")
        return self.derive({**(changes or {}), **sections})


@dataclass
class Breakdown:
    """Where the critical device's iteration time goes (seconds; they add up to the iteration time)."""

    compute_s: float
    tp_comm_s: float
    exposed_comm_s: float
    bubble_s: float
    overlapped_comm_s: float
    #: the GPUs waiting for the host input pipeline (:mod:`topotrain.training.host_input`)
    input_stall_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "tp_comm_s": self.tp_comm_s,
                "exposed_comm_s": self.exposed_comm_s, "bubble_s": self.bubble_s,
                "overlapped_comm_s": self.overlapped_comm_s, "input_stall_s": self.input_stall_s}


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
    #: the calibrated error band of the prediction (topotrain.training.bands; None without residuals)
    error_band: Band | None = None
    #: the communication library the collectives were timed with (``comm.library``)
    comm_library: str = "nccl"
    #: how the cluster network broke ties between equal-cost paths (topotrain.topology.routing)
    routing: str = "ecmp"

    @property
    def iteration_time_s_low(self) -> float:
        """Lower end of the error band (the iteration time itself without a band)."""
        return self.error_band.interval(self.iteration_time_s)[0] if self.error_band else self.iteration_time_s

    @property
    def iteration_time_s_high(self) -> float:
        """Upper end of the error band (``inf`` where the validation rows cannot back the band's level)."""
        return self.error_band.interval(self.iteration_time_s)[1] if self.error_band else self.iteration_time_s

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        band = self.error_band
        uneven = {k: list(v) for k, v in (("partition", p.partition), ("dp_shares", p.dp_shares)) if v is not None}
        return {
            "scenario": self.scenario, "model": self.model, "gpus": self.gpus, "gpu": self.gpu,
            "network": self.network, "comm": {"library": self.comm_library}, "routing": self.routing,
            "plan": {"dp": p.dp, "tp": p.tp, "pp": p.pp, "ep": p.ep, "cp": p.cp, "order": "-".join(p.rank_order),
                     "global_batch": p.global_batch,
                     "micro_batch": p.micro_batch_size, "micro_batches": p.num_micro_batches,
                     "pipeline_schedule": p.pipeline_schedule, "virtual_stages": p.virtual_stages,
                     "zero_stage": p.zero_stage, "fsdp": p.fsdp, "recompute": p.recompute,
                     "sequence_parallel": p.sequence_parallel, **uneven},
            "iteration_time_s": self.iteration_time_s,
            "iteration_time_s_low": self.iteration_time_s_low, "iteration_time_s_high": self.iteration_time_s_high,
            "error_band": band.to_dict() if band else None, "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
            "breakdown": self.breakdown.to_dict(), "peak_memory_bytes": self.peak_memory_bytes,
            "memory": self.memory, "tasks": len(self.tasks),
            "busiest_links": [{"src": a, "dst": b, "utilization": u} for a, b, u in self.link_utilization_top],
        }


# ---- running ------------------------------------------------------------------------------------
def compute_model_of(sc: Scenario, gpu: GPUSpec | None = None) -> Any:
    """The scenario's compute model (on ``gpu``, default the cluster's); with ``plan.length_binning`` each layer's
    time is its expectation over the micro-batch's padded length
    (:class:`topotrain.training.length_binning.PaddedLengthCompute`)."""
    compute = make_compute_model(gpu or sc.cluster.gpu_spec, sc.model, sc.plan.dtype, sc.compute)
    if sc.plan.dtype == "fp8" and isinstance(compute, RooflineModel):  # Transformer Engine's FP8 (compute/fp8.py)
        compute = FP8Compute(compute, sc.plan.num_micro_batches)
    binning = sc.plan.length_binning
    if binning is None:
        return compute

    if sc.model_at_seq_len is None:
        raise ConfigError("plan.length_binning", "needs the scenario's model spec to build the model at each "
                          "padded length", "build the scenario with scenario_from_dict or load_scenario")
    return PaddedLengthCompute(compute, binning, sc.model_at_seq_len)


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
    """One training iteration of ``sc``: build the task graph, run it in the engine with the scenario's
    network model, and read the time, its breakdown, memory and link use off the result."""
    if not all(hasattr(sc, k) for k in ("cluster", "model", "plan", "network")):
        raise ConfigError("scenario", f"simulate takes a Scenario, got {type(sc).__name__}",
                          "load one with topotrain.load_scenario(path) or scenario_from_dict(dict)")
    plan, model, topo = sc.plan, sc.model, sc.cluster.topology
    local = cp_local_model(model, plan.cp)  # one context-parallel rank's share (the model itself at cp = 1)
    mplan = memory_plan_from(plan)
    mem = memory_per_rank(local, mplan)
    gpu = sc.cluster.gpu_spec
    gpus = topo.gpus
    network = get_model(sc.network, sc.cluster.network_params)
    if plan.sync != "allreduce" and (sc.cluster.mixed or plan.dp_shares is not None):
        raise ConfigError("plan.sync", f"{plan.sync} is modelled on one GPU type with even data-parallel shares",
                          "use sync: allreduce on a mixed cluster or with dp_shares/balance")
    if not sc.cluster.mixed and plan.dp_shares is None:
        check_fits(mem, gpu)
        compute = compute_model_of(sc)
        stage_slow = [1.0] * plan.pp
        for s in range(plan.pp):
            members = [gpus[plan.rank(d, t, s, c)] for d in range(plan.dp) for c in range(plan.cp)
                       for t in range(plan.tp)]
            stage_slow[s] = max((sc.gpu_slowdown.get(g, 1.0) for g in members), default=1.0)
        builder = IterationBuilder(local, plan, gpus, topo, network, gpu,
                                   lambda b, t: compute.layer_times(local, b, t), stage_slowdown=stage_slow,
                                   library=sc.comm)
        with progress.task(f"building the task graph ({plan.gpus} GPUs)"):
            built = builder.build()
        engine = Engine(topo, network)
        t_iter = engine.run(built.graph)
        peak = gpu.peak(plan.dtype)
    else:
        built, engine, t_iter, peak = _run_mixed(sc, local, mplan, network)
    tasks = built.graph.tasks
    t_sync = t_iter  # a bounded-staleness PS overlaps iterations (training/sync.py)
    t_iter = stale_iteration_s(plan, tasks, max(built.compute_s_by_device), t_sync, Engine(topo, network).run)
    # breakdown on the device with the most compute (the critical one)
    crit = int(np.argmax(built.compute_s_by_device))
    comp_iv = [(t.start_s, t.end_s) for t in tasks if t.stage == crit and t.stream.endswith("/compute")]
    comm_iv = [(t.start_s, t.end_s) for t in tasks if t.stage == crit and t.comm is not None
               and t.end_s > t.start_s]
    comm_union = sum(b - a for a, b in _interval_union(comm_iv))
    hidden = _covered(comm_iv, comp_iv)
    exposed = comm_union - hidden
    if t_iter < t_sync:  # what staleness hides is not exposed
        exposed = min(exposed, max(0.0, t_iter - built.compute_s_by_device[crit]))
    compute_s = built.compute_s_by_device[crit]
    tp_s = 0.0
    for t in tasks:
        if t.stage == crit and t.blocking:
            tp_s += t.blocking_s
    bubble = max(0.0, t_iter - compute_s - tp_s - exposed)
    # the host input pipeline prefetches ahead of the GPUs: the iteration is the longer of the two
    stall = 0.0
    if plan.host_input is not None:
        per_server = max(1, min(plan.gpus, sc.cluster.gpus_per_server))
        t_host = plan.replica_batch / plan.host_input.samples_per_s_per_gpu(per_server)
        if t_host > t_iter:
            stall, t_iter = t_host - t_iter, t_host
    samples_per_s = plan.global_batch / t_iter if t_iter > 0 else 0.0
    tokens_per_s = samples_per_s * model.tokens_per_sample
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
    gpu_name = "+".join(sc.cluster.gpu_names) if sc.cluster.mixed else gpu.name
    return Result(sc.name, model.name, n, gpu_name, plan, sc.network, t_iter, samples_per_s, tokens_per_s,
                  tflops, mfu, Breakdown(compute_s, tp_s, exposed, bubble, hidden, stall),
                  float(mem.total_bytes), mem_d, tasks, _top_links(topo, engine.link_bytes, t_iter),
                  band(regime_of(model.sample_kind, model.experts, sc.cluster.servers, sc.cluster.mixed)),
                  sc.comm.name,
                  routing_mode(topo.meta))


def _run_mixed(sc: Scenario, local: Model, mplan: Any, network: Any) -> tuple[Any, Engine, float, float]:
    """One iteration on a mixed cluster or with uneven data-parallel shares: every replica class
    (:mod:`topotrain.training.mixed`) built and run with its stages' GPUs; the slowest class's run is the
    iteration (synchronous gradient reduction). Each stage's memory is checked against the smallest GPU that
    holds it. Returns (built iteration, engine, iteration time, the ranks' mean peak FLOP/s: MFU's
    denominator is the sum of every rank's own peak)."""
    plan, cluster = sc.plan, sc.cluster
    topo, gpus = cluster.topology, cluster.topology.gpus
    rank_gpus = [cluster.gpu_of(r) for r in range(len(gpus))]
    classes = replica_classes(plan, rank_gpus, gpus, sc.gpu_slowdown)
    for s, stage_mem in enumerate(memory_per_stage(local, mplan)):
        types = {rank_gpus[plan.rank(d, t, s, c)] for d in range(plan.dp) for t in range(plan.tp)
                 for c in range(plan.cp)}
        smallest = min((cluster.spec_of(g) for g in sorted(types)), key=lambda g: g.memory_bytes)
        check_fits(stage_mem, smallest, f"plan (stage {s})")
    models = {g: compute_model_of(sc, cluster.spec_of(g)) for g in cluster.gpu_names}
    best: tuple[Any, Engine, float] | None = None
    for cls in classes:
        cplan = cls.plan_of(plan)
        times = [(lambda b, t, m=models[g]: m.layer_times(local, b, t)) for g in cls.stage_gpus]
        builder = IterationBuilder(local, cplan, gpus, topo, network, cluster.spec_of(cls.stage_gpus[0]),
                                   times[0], stage_slowdown=cls.stage_slowdown, library=sc.comm,
                                   stage_gpus=[cluster.spec_of(g) for g in cls.stage_gpus], stage_layer_times=times,
                                   replicas=cls.replicas)
        built = builder.build()
        engine = Engine(topo, network)
        t = engine.run(built.graph)
        if best is None or t > best[2]:
            best = (built, engine, t)
    assert best is not None
    peak_mean = sum(cluster.spec_of(g).peak(plan.dtype) for g in rank_gpus) / len(rank_gpus)
    return best[0], best[1], best[2], peak_mean


def _top_links(topo: Any, link_bytes: np.ndarray, t_iter: float, k: int = 5) -> list[tuple[str, str, float]]:
    if t_iter <= 0 or not len(link_bytes):
        return []
    util = link_bytes / (topo.capacity_bytes_per_s * t_iter)
    order = np.argsort(-util, kind="stable")[:k]
    return [(topo.links[i].src, topo.links[i].dst, float(util[i])) for i in order if util[i] > 0]


def write_json_atomic(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, jsonsafe.dumps(obj), make_parents=True)
