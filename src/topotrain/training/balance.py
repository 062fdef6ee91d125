"""Plans that balance a mixed cluster: uneven pipeline partitions and uneven data-parallel shares.

On a cluster of several GPU types (:mod:`topotrain.training.mixed`) Megatron-LM's even split leaves the fast
GPUs waiting for the slow ones: a pipeline runs at the pace of its slowest stage, and the synchronous gradient
reduction at the pace of its slowest replica. The planner chooses

* the **pipeline partition** — transformer blocks per pipeline chunk (``plan.partition``) — by exact dynamic
  programming over contiguous splits, minimising the largest stage time. This is the objective of the
  pipelined-heterogeneous paper ("Optimizing execution for pipelined-based distributed deep learning in a
  heterogeneously networked GPU cluster": minimise the maximum stage execution time of a pipeline over
  heterogeneous GPUs) and of HPH's intra-pipeline partition ("HPH: Hybrid Parallelism on Heterogeneous
  Clusters", layers assigned so that the slowest stage is as fast as it can be). A stage's time is that of
  its slowest replica class's GPU on it, weighted by that class's micro-batch count plus the pipeline fill
  (``m + pp − 1`` stage times for 1F1B/GPipe);
* the **data-parallel shares** — micro-batches per replica (``plan.dp_shares``) — minimising the largest
  replica time ``(m_d + pp − 1) · T_d`` (``T_d``: replica ``d``'s slowest stage per micro-batch) with the
  shares adding up to the global batch: HPH's inter-pipeline batch allocation, "proportional to speed".
  Each step gives one micro-batch (``pp`` under interleaving) to the replica whose time grows least; for a
  min–max of increasing separable costs this greedy choice is optimal (Fox 1966, marginal allocation).

The two are alternated until neither changes (at most :data:`ROUNDS` rounds). Gradients stay the same
mathematics: replica ``d`` scales its summed gradient by ``1 / Σ m`` micro-batches of the whole batch instead
of ``1 / (dp · m)`` (its loss scale; no extra pass), so the reduced gradient is the global batch's mean.

Stage costs are the compute model's per-layer forward and backward times on each GPU type (plus the
recomputed forward with ``recompute: full``) and each layer's blocking tensor-parallel collectives, timed
alone on a tensor group of that type by the scenario's network model (:func:`tp_comm_s`: a V100 server's
NVLink 2 is slower than an A100's NVLink 3, and the ratio is not the compute ratio); the data-parallel and
pipeline traffic, the same for every replica or small, is left to the simulator, which times the chosen plan
— ``tests/test_mixed.py`` checks the choice against every plan of a small space, simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from topotrain.collectives.protocol import on_the_wire
from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import CollectiveOp
from topotrain.network.registry import get_model
from topotrain.training.mixed import check_groups
from topotrain.training.partition import chunk_of_block
from topotrain.training.plan import Plan
from topotrain.training.simulate import Scenario, compute_model_of
from topotrain.util.errors import ConfigError
from topotrain.workload.context_parallel import cp_local_model
from topotrain.workload.layer import Model

#: Alternations of partition and shares at most (each step never makes the estimate worse; ties stop early).
ROUNDS = 4

LayerTimes = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Balance:
    """The planner's choice and its estimate (seconds, compute alone)."""

    plan: Plan
    #: per replica: its slowest stage's time for one micro-batch
    replica_stage_s: tuple[float, ...]
    #: per replica: ``(m + pp − 1) · stage time``, the estimate the choice minimises the largest of
    replica_s: tuple[float, ...]


def block_costs(model: Model, fwd: np.ndarray, bwd: np.ndarray, recompute: str = "none"
                ) -> tuple[np.ndarray, float, float]:
    """(cost of each transformer block, cost of the layers before the first block, of those after the last)
    for one micro-batch: forward + backward (+ the recomputed forward of block layers with full recompute).
    A layer between blocks goes with the preceding one, as :func:`~topotrain.training.partition.chunk_of_layers`
    places it."""
    blocks = model.num_blocks
    cost = np.zeros(blocks)
    head = tail = 0.0
    current = -1
    for i, lay in enumerate(model.layers):
        c = float(fwd[i] + bwd[i]) + (float(fwd[i]) if recompute == "full" and lay.block >= 0 else 0.0)
        if lay.block >= 0:
            current = lay.block
            cost[current] += c
        elif current < 0:
            head += c
        elif all(x.block < 0 for x in model.layers[i:]):
            tail += c
        else:
            cost[current] += c
    return cost, head, tail


def partition_minmax(costs: Sequence[Sequence[np.ndarray]], weights: Sequence[float], chunks: int,
                     head: Sequence[Sequence[float]] = (), tail: Sequence[Sequence[float]] = ()
                     ) -> tuple[tuple[int, ...], float]:
    """The contiguous split of ``B`` blocks into ``chunks`` non-empty chunks that minimises the largest chunk
    cost, exactly (dynamic programming, ``O(chunks · B² · K)``). ``costs[k][c]`` are replica class ``k``'s
    block costs on chunk ``c``'s GPU, ``weights[k]`` its weight; a chunk's cost is the largest over classes of
    the weighted sum of its blocks (plus ``head[k][c]`` on the first chunk, ``tail[k][c]`` on the last).
    Returns (blocks per chunk, the minimised largest cost); ties go to the earliest cut."""
    blocks = len(costs[0][0])
    if blocks < chunks:
        raise ConfigError("plan.pp", f"{blocks} blocks are too few for {chunks} pipeline chunks",
                          "use fewer pipeline stages")
    prefix = [[np.concatenate(([0.0], np.cumsum(cc))) for cc in ck] for ck in costs]

    def cost(c: int, lo: int, hi: int) -> float:
        out = 0.0
        for k, w in enumerate(weights):
            v = float(prefix[k][c][hi] - prefix[k][c][lo])
            if c == 0 and head:
                v += head[k][c]
            if c == chunks - 1 and tail:
                v += tail[k][c]
            out = max(out, w * v)
        return out

    inf = float("inf")
    best = [[inf] * (blocks + 1) for _ in range(chunks + 1)]
    cut = [[0] * (blocks + 1) for _ in range(chunks + 1)]
    best[0][0] = 0.0
    for c in range(1, chunks + 1):
        for j in range(c, blocks - (chunks - c) + 1):
            for i in range(c - 1, j):
                if best[c - 1][i] == inf:
                    continue
                v = max(best[c - 1][i], cost(c - 1, i, j))
                if v < best[c][j]:
                    best[c][j], cut[c][j] = v, i
    sizes = []
    j = blocks
    for c in range(chunks, 0, -1):
        i = cut[c][j]
        sizes.append(j - i)
        j = i
    return tuple(reversed(sizes)), best[chunks][blocks]


def shares_minmax(stage_s: Sequence[float], total: int, fill: int, step: int = 1) -> tuple[int, ...]:
    """Micro-batches per replica adding up to ``total`` (each a positive multiple of ``step``) that minimise
    ``max_d (m_d + fill) · stage_s[d]``: marginal allocation, optimal for a min–max of increasing separable
    costs; ties go to the lowest replica."""
    n = len(stage_s)
    if total < n * step or total % step:
        raise ConfigError("plan.dp_shares", f"{total} micro-batches cannot give each of {n} replicas a positive "
                          f"multiple of {step}", "raise the global batch")
    m = [step] * n
    for _ in range((total - n * step) // step):
        d = min(range(n), key=lambda r: ((m[r] + step + fill) * stage_s[r], r))
        m[d] += step
    return tuple(m)


def balance(model: Model, plan: Plan, rank_gpus: Sequence[str], layer_times: Mapping[str, LayerTimes],
            gpus: Sequence[str] | None = None) -> Balance:
    """The balanced partition and shares of ``plan`` for ranks of GPU types ``rank_gpus`` (module docstring);
    ``layer_times[g](micro_batch, tp)`` are type ``g``'s per-layer (forward, backward) times. A partition equal
    to Megatron-LM's even cut, or shares all alike, are left unset (the homogeneous plan)."""
    check_groups(plan, rank_gpus, gpus or [str(r) for r in range(len(rank_gpus))])
    chunks, pp, dp = plan.pp * plan.virtual_stages, plan.pp, plan.dp
    per_type = {}
    for g in sorted(set(rank_gpus)):
        fwd, bwd = layer_times[g](plan.micro_batch_size, plan.tp)
        per_type[g] = block_costs(model, fwd, bwd, plan.recompute)
    replica_types = [tuple(rank_gpus[plan.rank(d, 0, p)] for p in range(pp)) for d in range(dp)]
    kinds = sorted(set(replica_types), key=replica_types.index)
    fill = pp - 1
    step = pp if plan.pipeline_schedule == "interleaved" else 1
    total = dp * plan.num_micro_batches
    can_share = dp > 1 and plan.ep == 1 and plan.cp == 1 and len(kinds) > 1
    shares = plan.dp_shares or (plan.num_micro_batches,) * dp

    def stage_times(partition: tuple[int, ...] | None) -> list[float]:
        of_block = chunk_of_block(model.num_blocks, chunks, partition)
        out = []
        for types in replica_types:
            dev = [0.0] * pp
            for b, c in enumerate(of_block):
                dev[c % pp] += per_type[types[c % pp]][0][b]
            dev[0] += per_type[types[0]][1]
            dev[(chunks - 1) % pp] += per_type[types[(chunks - 1) % pp]][2]
            out.append(max(dev))
        return out

    partition = plan.partition
    best: tuple[float, tuple[int, ...] | None, tuple[int, ...]] | None = None
    for _ in range(ROUNDS):
        if chunks > 1:
            weights = [max(shares[d] for d in range(dp) if replica_types[d] == k) + fill for k in kinds]
            costs = [[per_type[k[c % pp]][0] for c in range(chunks)] for k in kinds]
            head = [[per_type[k[c % pp]][1] for c in range(chunks)] for k in kinds]
            tail = [[per_type[k[c % pp]][2] for c in range(chunks)] for k in kinds]
            partition, _ = partition_minmax(costs, weights, chunks, head, tail)
        t = stage_times(partition)
        if can_share:
            shares = shares_minmax(t, total, fill, step)
        score = max((shares[d] + fill) * t[d] for d in range(dp))
        if best is not None and score >= best[0]:
            break
        best = (score, partition, tuple(shares))
    assert best is not None
    _, partition, shares = best
    even = tuple(np.bincount(chunk_of_block(model.num_blocks, chunks), minlength=chunks).tolist())
    t = stage_times(partition)
    chosen = replace(plan, partition=None if partition == even else partition,
                     dp_shares=None if len(set(shares)) == 1 else shares)
    return Balance(chosen, tuple(t), tuple((shares[d] + fill) * t[d] for d in range(dp)))


def _layer_times(compute: Any, model: Model, comm: tuple[np.ndarray, np.ndarray]) -> LayerTimes:
    """Per-layer (forward, backward) costs: the compute model's times plus the blocking communication."""
    def times(b: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        fwd, bwd = compute.layer_times(model, b, t)
        return np.asarray(fwd) + comm[0], np.asarray(bwd) + comm[1]
    return times


def tp_comm_s(sc: Scenario, model: Model, ranks: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each layer's blocking tensor-parallel communication for one micro-batch on the tensor group ``ranks``
    (forward, backward): its allreduce (with sequence parallelism, its reduce-scatter and all-gather, as
    much traffic) timed alone by the scenario's network model on the wire (``plan.tp_algorithm``, as the
    builder times it). Zero at ``tp = 1``."""
    plan, cluster = sc.plan, sc.cluster
    n = len(model.layers)
    fwd, bwd = np.zeros(n), np.zeros(n)
    if plan.tp == 1:
        return fwd, bwd
    net = get_model(sc.network, cluster.network_params)
    topo, alpha = cluster.topology, cluster.network_params.message_overhead_s
    memo: dict[int, float] = {}

    def timed(size: int) -> float:
        if size not in memo:
            sched = build_schedule(CollectiveOp.ALLREDUCE, plan.tp_algorithm, topo, list(ranks), size,
                                   message_overhead_s=alpha)
            memo[size] = net.time_schedule(on_the_wire(sched, topo, library=sc.comm), topo).time_s
        return memo[size]

    mb = plan.micro_batch_size
    for i, lay in enumerate(model.layers):
        if lay.tp_allreduce_bytes_fwd:
            fwd[i] = timed(int(lay.tp_allreduce_bytes_fwd * mb))
        if lay.tp_allreduce_bytes_bwd:
            bwd[i] = timed(int(lay.tp_allreduce_bytes_bwd * mb))
    return fwd, bwd


def balanced(sc: Scenario) -> Balance:
    """:func:`balance` of the scenario's plan on its cluster: each GPU type's layer costs are the scenario's
    compute model on that GPU plus the blocking tensor-parallel communication on a tensor group of that type
    (:func:`tp_comm_s`); stragglers are left to the simulator."""
    cluster, plan = sc.cluster, sc.plan
    local = cp_local_model(sc.model, plan.cp)
    gpus = cluster.topology.gpus
    rank_gpus = [cluster.gpu_of(r) for r in range(len(gpus))]
    check_groups(plan, rank_gpus, gpus)
    times: dict[str, LayerTimes] = {}
    for g in cluster.gpu_names:
        first = next(r for r in range(len(gpus)) if rank_gpus[r] == g and r in _tp_leaders(plan))
        group = [gpus[first + k] for k in _tp_offsets(plan)]
        times[g] = _layer_times(compute_model_of(sc, cluster.spec_of(g)), local, tp_comm_s(sc, local, group))
    return balance(local, plan, rank_gpus, times, gpus)


def _tp_leaders(plan: Plan) -> set[int]:
    """The rank of tensor index 0 of every tensor group of ``plan``."""
    return {plan.rank(d, 0, p, c) for d in range(plan.dp) for p in range(plan.pp) for c in range(plan.cp)}


def _tp_offsets(plan: Plan) -> list[int]:
    """Rank offsets of a tensor group's members from its first (the same for every group)."""
    return [plan.rank(0, t, 0) - plan.rank(0, 0, 0) for t in range(plan.tp)]
