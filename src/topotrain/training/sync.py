"""Gradient synchronisation beyond allreduce: parameter servers (Poseidon) and decentralized gossip (D-PSGD,
AD-PSGD) — the plan's options, their checks, and the transfers each scheme puts on the network.

``plan.sync`` chooses the scheme: ``allreduce`` (the default: bucketed collectives, training/builder.py),
``ps`` or ``gossip``. Both others train pure data parallelism (tp = pp = cp = ep = 1, no ZeRO/FSDP).

**Parameter server** (``plan.ps``; Li et al., "Scaling Distributed Machine Learning with the Parameter
Server", OSDI 2014; Zhang et al., "Poseidon: An Efficient Communication Architecture for Distributed Deep
Learning on GPU Clusters", USENIX ATC 2017). Every layer's gradient is split evenly over ``shards`` server
shards; each worker pushes its slice to every shard, the shard sums the pushes, and every worker pulls the
summed slice back (a two-phase schedule: the pull of a layer waits for all its pushes — synchronous,
Poseidon's BSP). Where the shards live:

* ``placement: colocated`` (default, as Poseidon runs them): shard ``j`` of ``shards`` (default: one per
  worker) sits with worker ``j·dp/shards``; its own push and pull stay local.
* ``placement: dedicated``: ``hosts`` names nodes of the cluster graph that train nothing — e.g. a
  ``{name: ps0, kind: cpu}`` node linked to a switch in a ``cluster.graph`` file; shard ``j`` sits on
  ``hosts[j mod len(hosts)]`` (``shards`` defaults to ``len(hosts)``). A GPU, or a name the cluster lacks,
  is refused naming ``plan.ps.hosts[i]``.

``wait_free`` (default on): wait-free backpropagation (Poseidon §3.1): a layer's push starts as soon as
its backward ends, each layer on its own syncer (its own stream: the layers' transfers share the links);
off, every push waits for the whole backward (the "plain PS" baseline).

``sfb`` (default on): Poseidon's hybrid communication (§3.2-3.3, Table 1 and Algorithm 1, "BestScheme"):
a fully connected layer of an ``M × N`` weight whose gradient is the product of ``K`` rows of
sufficient factors (``K`` = rows of the layer's input per worker and iteration) is either synchronised
through the PS or by broadcasting its sufficient factors (SFB: each worker sends its ``K·(M+N)`` factor
values to every other worker, which rebuilds the gradient). The per-node traffic, in values:
PS colocated ``2MN(P1+P2−2)/P2`` (``P1`` workers, ``P2`` shards), PS dedicated ``max(2MN, 2MN·P1/P2)``,
SFB ``2K(P1−1)(M+N)``; the layer takes the smaller (:func:`sfb_preferred`). The rebuild GEMM
(``2KMN`` FLOPs) is not charged.

``staleness`` (default 0, synchronous): bounded-staleness asynchronous training (Stale Synchronous
Parallel, Ho et al., NIPS 2013): a worker may begin iteration ``t + s + 1`` once it holds the parameters
of iteration ``t``. With identical workers in steady state the period is bounded by the compute, by the
network's busy time per iteration, and by one synchronous iteration spread over ``s + 1`` iterations:
``T(s) = max(T_compute, T_net, T_sync / (s + 1))`` (:func:`stale_period`), where ``T_sync`` is the engine's
synchronous iteration and ``T_net`` the engine's time for the iteration's transfers alone. ``s = 0`` is
``T_sync`` itself.

**Gossip** (``plan.gossip``; Lian et al., "Can Decentralized Algorithms Outperform Centralized
Algorithms?", NeurIPS 2017 (D-PSGD); Lian et al., "Asynchronous Decentralized Parallel SGD", ICML 2018
(AD-PSGD)). ``graph`` connects the data-parallel ranks: ``ring`` (both neighbours), ``exponential`` (rank
``i`` sends to ``i + 2^k mod n`` for ``k = 0 … ⌈log2 n⌉−1``, Ying et al., "Exponential Graph is Provably
Efficient for Decentralized Deep Training", NeurIPS 2021), ``torus`` (``torus: [rows, cols]``, default the
squarest factorization of dp; four neighbours) or ``edges`` (a list of undirected rank pairs).
``algorithm: d-psgd``: after its backward, every worker sends its whole model to every out-neighbour, then
averages what it received (uniform weights) and applies its gradient; a ring moves ``2 × model bytes`` per
worker. ``algorithm: ad-psgd``: every even rank (the active half, AD-PSGD's bipartite split) averages
pairwise with one neighbour chosen at random (``seed``) while computing; the iteration waits for both.
A disconnected graph is refused (the models would never mix).
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule, split_bytes
from topotrain.util.errors import ConfigError
from topotrain.util.fields import NonNegativeInt, PositiveInt
from topotrain.util.problems import config_dataclass, several

SyncScheme = Literal["allreduce", "ps", "gossip"]


@config_dataclass("plan.ps")
class PSOptions:
    """``plan.ps``: parameter-server options (module docstring)."""

    placement: Literal["colocated", "dedicated"] = "colocated"
    #: dedicated hosts: node names of the cluster graph (not GPUs)
    hosts: tuple[Annotated[str, Field(strict=True, min_length=1)], ...] | None = None
    #: server shards (default: dp colocated, len(hosts) dedicated)
    shards: PositiveInt | None = None
    wait_free: Annotated[bool, Field(strict=True)] = True
    sfb: Annotated[bool, Field(strict=True)] = True
    staleness: NonNegativeInt = 0

    @model_validator(mode="after")
    def _hosts(self) -> PSOptions:
        if self.placement == "dedicated" and not self.hosts:
            raise several([ConfigError("hosts", "dedicated parameter servers need server hosts, none given",
                                       "list the cluster graph's server nodes, e.g. hosts: [ps0], or use "
                                       "placement: colocated")])
        if self.placement == "colocated" and self.hosts:
            raise several([ConfigError("hosts", "hosts are for placement: dedicated",
                                       "set placement: dedicated or drop hosts")])
        return self


@config_dataclass("plan.gossip")
class GossipOptions:
    """``plan.gossip``: decentralized training options (module docstring)."""

    graph: Literal["ring", "exponential", "torus", "edges"] = "ring"
    algorithm: Literal["d-psgd", "ad-psgd"] = "d-psgd"
    torus: tuple[PositiveInt, PositiveInt] | None = None
    edges: tuple[tuple[NonNegativeInt, NonNegativeInt], ...] | None = None
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _shape(self) -> GossipOptions:
        found = []
        if self.torus is not None and self.graph != "torus":
            found.append(ConfigError("torus", "the torus shape is for graph: torus", "drop torus or set graph: torus"))
        if self.graph == "edges" and not self.edges:
            found.append(ConfigError("edges", "graph: edges needs the edges", "give edges: [[0, 1], [1, 2], ...]"))
        if self.edges is not None and self.graph != "edges":
            found.append(ConfigError("edges", "edges are for graph: edges", "drop edges or set graph: edges"))
        if found:
            raise several(found)
        return self


def sync_problems(sync: str, ps: PSOptions | None, gossip: GossipOptions | None, *, dp: int, tp: int, pp: int,
                  cp: int, ep: int, zero_stage: int, fsdp: bool) -> list[ConfigError]:
    """Problems of the plan's sync choice (fields relative to the plan)."""
    found: list[ConfigError] = []
    if ps is not None and sync != "ps":
        found.append(ConfigError("ps", f"parameter-server options given, but sync is {sync}",
                                 "set sync: ps or drop ps"))
    if gossip is not None and sync != "gossip":
        found.append(ConfigError("gossip", f"gossip options given, but sync is {sync}",
                                 "set sync: gossip or drop gossip"))
    if sync == "allreduce":
        return found
    others = [f"{k}={v}" for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)) if v != 1]
    if zero_stage or fsdp:
        others.append("zero_stage/fsdp")
    if others:
        found.append(ConfigError("sync", f"sync: {sync} is modelled for pure data parallelism, not with "
                                 f"{', '.join(others)}", "use tp=pp=cp=ep=1 without ZeRO/FSDP, or sync: allreduce"))
    if sync == "gossip":
        g = gossip or GossipOptions()
        try:
            gossip_edges(dp, g)
        except ConfigError as e:
            found.append(ConfigError(e.field.removeprefix("plan."), e.message, e.fix))
    if sync == "ps" and ps is not None and ps.shards is not None and ps.placement == "colocated" and ps.shards > dp:
        found.append(ConfigError("ps.shards", f"{ps.shards} colocated shards, but only dp={dp} workers to hold them",
                                 f"use shards ≤ {dp}, or placement: dedicated"))
    return found


# ---- parameter server -----------------------------------------------------------------------------------
def ps_costs_values(m: int, n: int, k: int, workers: int, shards: int, colocated: bool) -> tuple[float, float]:
    """(PS, SFB) per-node traffic in values of one ``m × n`` FC layer with ``k`` factor rows per worker
    (Poseidon, Zhang et al. ATC 2017, Table 1): PS colocated ``2mn(P1+P2−2)/P2``, dedicated
    ``max(2mn, 2mn·P1/P2)``; SFB ``2k(P1−1)(m+n)``."""
    p1, p2 = workers, shards
    ps = 2.0 * m * n * (p1 + p2 - 2) / p2 if colocated else max(2.0 * m * n, 2.0 * m * n * p1 / p2)
    return ps, 2.0 * k * (p1 - 1) * (m + n)


def sfb_preferred(m: int, n: int, k: int, workers: int, shards: int, colocated: bool) -> bool:
    """Poseidon's BestScheme (Algorithm 1): SFB for an FC layer when it moves fewer values than the PS."""
    ps, sfb = ps_costs_values(m, n, k, workers, shards, colocated)
    return workers > 1 and sfb < ps


def shard_nodes(workers: list[str], opts: PSOptions) -> list[str]:
    """The node of every shard (module docstring: colocated with workers, or on the dedicated hosts)."""
    if opts.placement == "dedicated":
        hosts = list(opts.hosts or ())
        n = opts.shards or len(hosts)
        return [hosts[j % len(hosts)] for j in range(n)]
    n = opts.shards or len(workers)
    return [workers[j * len(workers) // n] for j in range(n)]


def ps_schedule(workers: list[str], shards: list[str], size_bytes: int) -> Schedule:
    """Push then pull of one layer of ``size_bytes`` through ``shards`` (a slice per shard): phase 0 every
    worker → every shard (summed there), phase 1 every shard → every worker. A shard's own worker moves
    nothing over the network."""
    ranks = list(dict.fromkeys(workers + shards))
    idx = {r: i for i, r in enumerate(ranks)}
    chunk = split_bytes(size_bytes, len(shards))
    push = [(idx[w], idx[h], j) for j, h in enumerate(shards) for w in workers if w != h]
    pull = [(idx[h], idx[w], j) for j, h in enumerate(shards) for w in workers if w != h]
    phases = tuple(Phase.of([a for a, _, _ in t], [b for _, b, _ in t], [j for _, _, j in t],
                            [j + 1 for _, _, j in t], red) for t, red in ((push, True), (pull, False)) if t)
    return Schedule(CollectiveOp.ALLREDUCE, "ps", tuple(ranks), int(size_bytes), chunk,
                    np.full(len(shards), -1), np.full(len(shards), -1), phases)


def sfb_schedule(workers: list[str], factor_bytes: int) -> Schedule:
    """Sufficient-factor broadcasting: every worker sends its ``factor_bytes`` of factors to every other."""
    n = len(workers)
    src = [a for a in range(n) for b in range(n) if a != b]
    dst = [b for a in range(n) for b in range(n) if a != b]
    ph = Phase.of(src, dst, [a for a in src], [a + 1 for a in src], False)
    return Schedule(CollectiveOp.ALLGATHER, "sfb", tuple(workers), int(factor_bytes) * n,
                    np.full(n, int(factor_bytes), dtype=np.int64), np.arange(n), np.full(n, -1), (ph,))


# ---- gossip ---------------------------------------------------------------------------------------------
def torus_shape(n: int, shape: tuple[int, int] | None) -> tuple[int, int]:
    """``shape``, or the squarest ``rows × cols = n`` with ``rows ≤ cols``."""
    if shape is not None:
        return shape
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return rows, n // rows


def gossip_edges(n: int, opts: GossipOptions) -> list[tuple[int, int]]:
    """Directed edges ``(sender, receiver)`` of the gossip graph on ``n`` ranks, sorted, no self loops; a
    ConfigError naming ``plan.gossip.*`` when the graph does not fit ``n`` or is disconnected."""
    out: set[tuple[int, int]] = set()
    if opts.graph == "ring":
        for i in range(n):
            out |= {(i, (i + 1) % n), ((i + 1) % n, i)}
    elif opts.graph == "exponential":
        for i in range(n):
            out |= {(i, (i + 2**k) % n) for k in range(max(1, math.ceil(math.log2(n))))} if n > 1 else set()
    elif opts.graph == "torus":
        rows, cols = torus_shape(n, opts.torus)
        if rows * cols != n:
            raise ConfigError("plan.gossip.torus", f"a {rows}×{cols} torus has {rows * cols} ranks, but dp={n}",
                              f"give rows·cols = {n}, or leave torus out")
        for r in range(rows):
            for c in range(cols):
                i = r * cols + c
                for j in (r * cols + (c + 1) % cols, ((r + 1) % rows) * cols + c):
                    out |= {(i, j), (j, i)}
    else:
        for k, (a, b) in enumerate(opts.edges or ()):
            if a >= n or b >= n:
                raise ConfigError(f"plan.gossip.edges[{k}]", f"rank {max(a, b)} does not exist (dp={n})",
                                  f"use ranks 0..{n - 1}")
            out |= {(a, b), (b, a)}
    out = {(a, b) for a, b in out if a != b}
    import networkx as nx  # only a gossip plan needs it (a third of a second of start-up otherwise)

    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(out)
    if n > 1 and not nx.is_connected(g):
        parts = sorted((sorted(c) for c in nx.connected_components(g)), key=lambda c: c[0])
        shown = "; ".join("{" + ", ".join(map(str, c[:6])) + (", …" if len(c) > 6 else "") + "}" for c in parts[:3])
        raise ConfigError(f"plan.gossip.{'edges' if opts.graph == 'edges' else 'graph'}",
                          f"the gossip graph is disconnected ({len(parts)} components: {shown}), so the models "
                          "never mix", "connect the components with an edge, or use graph: ring")
    return sorted(out)


def dpsgd_schedule(workers: list[str], edges: list[tuple[int, int]], model_bytes: int) -> Schedule:
    """D-PSGD's exchange: the whole model (``model_bytes``) along every directed edge, all at once."""
    n = len(workers)
    src = [a for a, _ in edges]
    ph = Phase.of(src, [b for _, b in edges], src, [a + 1 for a in src], True)
    return Schedule(CollectiveOp.ALLGATHER, "d-psgd", tuple(workers), int(model_bytes) * n,
                    np.full(n, int(model_bytes), dtype=np.int64), np.arange(n), np.full(n, -1),
                    (ph,) if src else ())


def adpsgd_pairs(n: int, edges: list[tuple[int, int]], seed: int) -> list[tuple[int, int]]:
    """AD-PSGD's pairs of one iteration: every even (active) rank picks one neighbour uniformly at random
    (seeded), preferring odd (passive) ones as AD-PSGD's bipartite split does."""
    rng = random.Random(seed)
    nbrs: dict[int, list[int]] = {i: [] for i in range(n)}
    for a, b in edges:
        nbrs[a].append(b)
    pairs = []
    for i in range(0, n, 2):
        cands = sorted(set(nbrs[i]))
        passive = [j for j in cands if j % 2] or cands
        if passive:
            pairs.append((i, passive[rng.randrange(len(passive))]))
    return pairs


def adpsgd_schedule(workers: list[str], pairs: list[tuple[int, int]], model_bytes: int) -> Schedule:
    """AD-PSGD's pairwise averaging: each pair swaps whole models (both directions at once)."""
    directed = sorted({(a, b) for a, b in pairs} | {(b, a) for a, b in pairs})
    s = dpsgd_schedule(workers, directed, model_bytes)
    return Schedule(s.op, "ad-psgd", s.ranks, s.size_bytes, s.chunk_bytes, s.chunk_src, s.chunk_dst, s.phases)


# ---- bounded staleness --------------------------------------------------------------------------------------
def stale_period(t_sync_s: float, t_compute_s: float, t_net_s: float, staleness: int) -> float:
    """Steady-state seconds per iteration with staleness ``s`` (module docstring):
    ``max(T_compute, T_net, T_sync / (s + 1))``; ``T_sync`` at ``s = 0``."""
    if staleness <= 0:
        return t_sync_s
    return max(t_compute_s, t_net_s, t_sync_s / (staleness + 1))
