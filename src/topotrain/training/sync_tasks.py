"""The gradient-synchronisation tasks of ``plan.sync: ps | gossip`` in the iteration's task graph (the
schemes, their options and their transfers: :mod:`topotrain.training.sync`).

The builder calls :func:`add_sync_tasks` where it would emit the allreduce buckets; the optimizer waits for
the tasks it returns. Transfers go on the wire as the scenario's communication library puts them
(``wire``) and are timed by the engine with the scenario's network model on the cluster's routes, like every
collective (many workers pushing to one shard share its links: the incast is the flows' max-min share).

* PS: one task per layer with parameters (the builder splits the last backward per layer: its buckets are
  one layer each), on its own stream (Poseidon's per-layer syncers), after that layer's backward part
  (``wait_free``) or after the whole backward; an FC layer for which Poseidon's rule prefers sufficient
  factors broadcasts them instead (``sfb``).
* gossip D-PSGD: one exchange of the whole model with the graph's neighbours after the backward.
* gossip AD-PSGD: one pairwise exchange from the start of the iteration, beside the compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from topotrain.collectives.schedule import Schedule
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.training.engine import CommSpec, Task, TaskGraph
from topotrain.training.plan import Plan
from topotrain.training.sync import (
    GossipOptions,
    PSOptions,
    adpsgd_pairs,
    adpsgd_schedule,
    dpsgd_schedule,
    gossip_edges,
    ps_schedule,
    sfb_preferred,
    sfb_schedule,
    shard_nodes,
    stale_period,
)
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind, Model


def _hosts_checked(topo: Topology, opts: PSOptions) -> None:
    """Every dedicated host is a node of the cluster and not a GPU (a GPU trains: use colocated)."""
    for i, h in enumerate(opts.hosts or ()):
        node = topo.nodes.get(h)
        if node is None:
            raise ConfigError(f"plan.ps.hosts[{i}]", f"the cluster has no node {h!r}",
                              "name a server node of the cluster graph, e.g. a {kind: cpu} node on a switch")
        if node.kind == NodeKind.GPU:
            raise ConfigError(f"plan.ps.hosts[{i}]", f"{h} is a GPU, which trains",
                              "name a node that trains nothing, or use placement: colocated")


def fc_dims(layer: Layer) -> tuple[int, int, int] | None:
    """(in, out, rows per sample) of a fully connected layer, or None for any other layer."""
    if layer.kind != LayerKind.LINEAR or layer.gemm_shape is None or layer.gemm_count != 1 or layer.expert:
        return None
    rows, out, inp = layer.gemm_shape
    return int(inp), int(out), int(rows)


def sync_value_bytes(dtype: str) -> int:
    """Bytes per gradient or parameter value a PS or gossip moves: 4 when training in fp32/tf32 (Caffe's
    and Poseidon's fp32 training), else 2 (bf16/fp16, as the allreduce path reduces, builder.GRAD_BYTES)."""
    return 4 if dtype in ("fp32", "tf32") else 2


def bucket_layers(layers: Sequence[int], model: Model) -> list[int]:
    """The layer of each one-layer bucket, in the builder's bucket order (reverse layer order, layers with
    parameters only)."""
    return [i for i in reversed(layers) if model.layers[i].param_count > 0]


def add_sync_tasks(graph: TaskGraph, plan: Plan, model: Model, topo: Topology, workers: list[str],
                   chunks: Sequence[tuple[Sequence[int], Sequence[int], list[int]]], grad_bytes: int,
                   wire: Callable[[Schedule], Schedule], stage: int = 0) -> list[int]:
    """Add the sync tasks of stage ``stage`` and return their ids. ``chunks``: for each model chunk of the
    stage, (its layers, its bucket sizes in bytes, the task ids of its last backward's parts per bucket)."""
    n = len(workers)
    if n <= 1:
        return []
    wire_bytes = sync_value_bytes(plan.dtype)  # the buckets were sized at ``grad_bytes`` per parameter
    chunks = [(layers, [int(round(b * wire_bytes / grad_bytes)) for b in sizes], parts)
              for layers, sizes, parts in chunks]
    grad_bytes = wire_bytes
    if plan.sync == "ps":
        return _ps_tasks(graph, plan, model, topo, workers, chunks, grad_bytes, wire, stage)
    opts = plan.gossip or GossipOptions()
    edges = gossip_edges(n, opts)
    model_bytes = int(sum(sum(bytes_) for _, bytes_, _ in chunks))
    last = [parts[-1] for _, _, parts in chunks if parts]
    if opts.algorithm == "d-psgd":
        sched = wire(dpsgd_schedule(workers, edges, model_bytes))
        return [graph.add("gossip d-psgd", "dp-comm", f"stage{stage}/dp", last,
                          comm=CommSpec(f"gossip:{stage}:{model_bytes}", (sched,)), stage=stage)]
    pairs = adpsgd_pairs(n, edges, opts.seed)
    sched = wire(adpsgd_schedule(workers, pairs, model_bytes))
    return [graph.add("gossip ad-psgd", "dp-comm", f"stage{stage}/gossip", [],
                      comm=CommSpec(f"adpsgd:{stage}:{model_bytes}", (sched,)), stage=stage)]


def _ps_tasks(graph: TaskGraph, plan: Plan, model: Model, topo: Topology, workers: list[str],
              chunks: Sequence[tuple[Sequence[int], Sequence[int], list[int]]], grad_bytes: int,
              wire: Callable[[Schedule], Schedule], stage: int) -> list[int]:
    opts = plan.ps or PSOptions()
    _hosts_checked(topo, opts)
    shards = shard_nodes(workers, opts)
    colocated = opts.placement == "colocated"
    n = len(workers)
    out: list[int] = []
    for c, (layers, sizes, parts) in enumerate(chunks):
        for k, (i, size) in enumerate(zip(bucket_layers(layers, model), sizes, strict=True)):
            lay = model.layers[i]
            dims = fc_dims(lay) if opts.sfb else None
            sched: Schedule
            if dims is not None and sfb_preferred(dims[0], dims[1], dims[2] * plan.replica_batch, n, len(shards),
                                                  colocated):
                factor_bytes = dims[2] * plan.replica_batch * (dims[0] + dims[1]) * grad_bytes
                sched, label = sfb_schedule(workers, factor_bytes), "sfb"
            else:
                sched, label = ps_schedule(workers, shards, int(size)), "ps"
            after = parts[k] if opts.wait_free else parts[-1]
            out.append(graph.add(f"{label} {lay.name}", "dp-comm", f"stage{stage}/sync{c}.{k}", [after],
                                 comm=CommSpec(f"{label}:{stage}:{c}:{k}", (wire(sched),)), stage=stage))
    return out


def bytes_sent_per_node(tasks: Sequence[Task]) -> dict[str, int]:
    """Bytes every node sends over one iteration's communication tasks (blocking ones included)."""
    out: dict[str, float] = {}
    specs = [t.comm for t in tasks if t.comm is not None] + [b.comm for t in tasks for b in t.blocking]
    for spec in specs:
        for s in spec.schedules:
            sent = s.bytes_sent_per_rank()
            for r, b in zip(s.ranks, sent.tolist(), strict=True):
                out[r] = out.get(r, 0) + b
    return {r: round(b) for r, b in out.items()}  # fractional chunks (split_bytes) sum to whole bytes


def comm_only_s(tasks: Sequence[Task], run: Callable[[TaskGraph], float]) -> float:
    """The engine's time for the iteration's communication tasks alone, all released at 0 on their own
    streams (the network's busy time per iteration, ``T_net`` of :func:`~topotrain.training.sync.stale_period`)."""
    g = TaskGraph()
    for t in tasks:
        if t.comm is not None:
            g.add(t.name, t.category, f"{t.stream}/{t.id}", [], comm=t.comm, stage=t.stage)
    return run(g) if len(g) else 0.0




def stale_iteration_s(plan: Plan, tasks: Sequence[Task], compute_s: float, t_sync_s: float,
                      run: Callable[[TaskGraph], float]) -> float:
    """The steady-state iteration of a bounded-staleness PS (:func:`~topotrain.training.sync.stale_period`
    with ``T_net`` from :func:`comm_only_s`); ``t_sync_s`` for every other plan."""
    staleness = plan.ps.staleness if plan.sync == "ps" and plan.ps is not None else 0
    if staleness <= 0:
        return t_sync_s
    return stale_period(t_sync_s, compute_s, comm_only_s(tasks, run), staleness)
