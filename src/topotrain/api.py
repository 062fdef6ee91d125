"""Python API for the common questions: how long does this collective take on this cluster?"""

from __future__ import annotations

from dataclasses import dataclass

from topotrain.cluster import Cluster
from topotrain.collectives.costmodel import bus_factor
from topotrain.collectives.protocol import CommLibrary, comm_library, on_the_wire
from topotrain.collectives.registry import algorithms_for, build_schedule
from topotrain.collectives.schedule import CollectiveOp, Schedule, parse_op
from topotrain.network.base import NetworkModel
from topotrain.network.registry import get_model
from topotrain.util.errors import ConfigError


@dataclass(frozen=True)
class CollectiveReport:
    """One timed collective, with NCCL's bandwidth metrics (nccl-tests doc/PERFORMANCE.md).

    ``algbw_gb_per_s`` = size / time and ``busbw_gb_per_s`` = algbw × factor (allreduce 2(p−1)/p;
    reduce-scatter, allgather, all-to-all (p−1)/p; broadcast, reduce 1), both in GB/s (10⁹ bytes per
    second), as nccl-tests prints them.
    """

    op: str
    algorithm: str
    network: str
    ranks: int
    size_bytes: int
    time_s: float
    algbw_gb_per_s: float
    busbw_gb_per_s: float
    phases: int
    transfers: int
    busiest_link: tuple[str, str]
    busiest_link_utilization: float
    chosen_automatically: bool = False
    #: NCCL protocol and payload bytes per wire byte the schedule was timed with (collectives/protocol.py;
    #: "" and 1.0 for a schedule timed as given)
    protocol: str = ""
    wire_efficiency: float = 1.0
    #: the communication library that put it on the wire (collectives/protocol.py; "" for a schedule as given)
    library: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "op": self.op, "algorithm": self.algorithm, "network": self.network, "ranks": self.ranks,
            "size_bytes": self.size_bytes, "time_s": self.time_s, "algbw_gb_per_s": self.algbw_gb_per_s,
            "busbw_gb_per_s": self.busbw_gb_per_s, "phases": self.phases, "transfers": self.transfers,
            "busiest_link": list(self.busiest_link),
            "busiest_link_utilization": self.busiest_link_utilization,
            "auto": self.chosen_automatically, "library": self.library, "protocol": self.protocol,
            "wire_efficiency": self.wire_efficiency,
        }


def _parse_op(op: str | CollectiveOp) -> CollectiveOp:
    return parse_op(str(op).lower(), "op")


def network_model(cluster: Cluster, network: str | NetworkModel = "flow") -> NetworkModel:
    """The network model ``network`` (a name, or a model as is) with the cluster's network parameters."""
    if isinstance(network, str):
        return get_model(network, cluster.network_params)
    return network


def time_schedule(schedule: Schedule, cluster: Cluster, network: str | NetworkModel = "flow",
                  auto: bool = False) -> CollectiveReport:
    """Time one schedule alone on ``cluster`` with ``network`` (a model name or a model)."""
    if not isinstance(cluster, Cluster):
        raise ConfigError("cluster", f"must be a Cluster, got {type(cluster).__name__}",
                          "build one with topotrain.load_cluster(path)")
    model = network_model(cluster, network)
    topo = cluster.topology
    res = model.time_schedule(schedule, topo)
    p = schedule.num_ranks
    algbw = schedule.size_bytes / res.time_s / 1e9 if res.time_s > 0 else float("inf")
    src, dst, util = res.busiest_link(topo)
    return CollectiveReport(
        op=schedule.op.value, algorithm=schedule.algorithm, network=model.name, ranks=p,
        size_bytes=schedule.size_bytes, time_s=res.time_s, algbw_gb_per_s=algbw,
        busbw_gb_per_s=algbw * (bus_factor(schedule.op, p) if p > 1 else 1.0), phases=len(schedule.phases),
        transfers=schedule.num_transfers, busiest_link=(src, dst), busiest_link_utilization=util,
        chosen_automatically=auto, protocol=str(schedule.meta.get("protocol", "")),
        wire_efficiency=eff if isinstance(eff := schedule.meta.get("wire_efficiency"), float) else 1.0,
        library=str(schedule.meta.get("library", "")),
    )


def time_collective(cluster: Cluster, op: str | CollectiveOp, algorithm: str, size_bytes: int,
                    network: str | NetworkModel = "flow", ranks: list[str] | None = None,
                    library: str | CommLibrary = "nccl") -> CollectiveReport:
    """Time ``op`` of ``size_bytes`` per rank with ``algorithm`` (or ``"auto"``: the fastest that applies,
    chosen with ``network`` itself — the same rule as ``simulate``'s ``dp_algorithm: auto``) on
    ``cluster``'s GPUs (or ``ranks``), on the wire as ``library`` puts it there (``nccl``: NCCL's overhead for
    its bottleneck link and message size; ``ideal``: line rate;
    :func:`topotrain.collectives.protocol.on_the_wire`, as ``simulate`` times its collectives)."""
    if not isinstance(cluster, Cluster):
        raise ConfigError("cluster", f"must be a Cluster, got {type(cluster).__name__}",
                          "build one with topotrain.load_cluster(path)")
    cop = _parse_op(op)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int | float) or not size_bytes > 0:
        raise ConfigError("size", f"must be a positive number of bytes, got {size_bytes!r}",
                          "give e.g. 256 * 2**20 (or --size 256MiB)")
    lib = comm_library(library)
    model = network_model(cluster, network)
    alpha = cluster.network_params.message_overhead_s
    group = ranks if ranks is not None else cluster.topology.gpus
    if algorithm != "auto":
        sched = build_schedule(cop, algorithm, cluster.topology, group, int(size_bytes), message_overhead_s=alpha)
        return time_schedule(on_the_wire(sched, cluster.topology, library=lib), cluster, model)
    best: CollectiveReport | None = None
    reasons = []
    for name in algorithms_for(cop, auto=True):
        try:
            sched = build_schedule(cop, name, cluster.topology, group, int(size_bytes), message_overhead_s=alpha)
            # a pair with no route (GPUs of a user's graph never forward) is refused when the schedule is timed
            rep = time_schedule(on_the_wire(sched, cluster.topology, library=lib), cluster, model, auto=True)
        except ConfigError as e:
            reasons.append(f"{name}: {e.message}")
            continue
        if best is None or rep.time_s < best.time_s:
            best = rep
    if best is None:
        raise ConfigError("algo", f"no algorithm can run {cop.value} here: {'; '.join(reasons)}",
                          "change the rank count or the topology")
    return best
