"""Python API for the common questions: how long does this collective take on this cluster?"""

from __future__ import annotations

from dataclasses import dataclass

from topotrain.cluster import Cluster
from topotrain.collectives.costmodel import bus_factor
from topotrain.collectives.schedule import CollectiveOp, Schedule, parse_op
from topotrain.errors import ConfigError


@dataclass(frozen=True)
class CollectiveReport:
    """One timed collective, with NCCL's bandwidth metrics (nccl-tests doc/PERFORMANCE.md).

    algbw = size / time; busbw = algbw × factor (allreduce 2(p−1)/p; reduce-scatter, allgather,
    all-to-all (p−1)/p; broadcast, reduce 1).
    """

    op: str
    algorithm: str
    network: str
    ranks: int
    size_bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    phases: int
    transfers: int
    busiest_link: tuple[str, str]
    busiest_link_utilization: float
    chosen_automatically: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "op": self.op, "algorithm": self.algorithm, "network": self.network, "ranks": self.ranks,
            "size_bytes": self.size_bytes, "time_s": self.time_s, "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps, "phases": self.phases, "transfers": self.transfers,
            "busiest_link": list(self.busiest_link),
            "busiest_link_utilization": self.busiest_link_utilization,
            "auto": self.chosen_automatically,
        }


def _parse_op(op: str | CollectiveOp) -> CollectiveOp:
    return parse_op(str(op).lower(), "op")


def time_schedule(schedule: Schedule, cluster: Cluster, network: str, auto: bool = False) -> CollectiveReport:
    from topotrain.network.registry import get_model

    model = get_model(network)
    topo = cluster.topology
    res = model.time_schedule(schedule, topo)
    p = schedule.num_ranks
    algbw = schedule.size_bytes / res.time_s / 1e9 if res.time_s > 0 else float("inf")
    src, dst, util = res.busiest_link(topo)
    return CollectiveReport(
        op=schedule.op.value, algorithm=schedule.algorithm, network=model.name, ranks=p,
        size_bytes=schedule.size_bytes, time_s=res.time_s, algbw_gbps=algbw,
        busbw_gbps=algbw * (bus_factor(schedule.op, p) if p > 1 else 1.0), phases=len(schedule.phases),
        transfers=schedule.num_transfers, busiest_link=(src, dst), busiest_link_utilization=util,
        chosen_automatically=auto,
    )


def time_collective(cluster: Cluster, op: str | CollectiveOp, algorithm: str, size_bytes: int,
                    network: str = "flow", ranks: list[str] | None = None) -> CollectiveReport:
    """Time ``op`` with ``algorithm`` (or ``"auto"``: the fastest that applies) on ``cluster``."""
    from topotrain.collectives.registry import algorithms_for, build_schedule

    cop = _parse_op(op)
    if size_bytes <= 0:
        raise ConfigError("size", f"must be positive, got {size_bytes}", "give e.g. --size 256MiB")
    group = ranks if ranks is not None else cluster.topology.gpus
    if algorithm != "auto":
        sched = build_schedule(cop, algorithm, cluster.topology, group, int(size_bytes))
        return time_schedule(sched, cluster, network)
    best: CollectiveReport | None = None
    reasons = []
    for name in algorithms_for(cop):
        try:
            sched = build_schedule(cop, name, cluster.topology, group, int(size_bytes))
        except ConfigError as e:
            reasons.append(f"{name}: {e.message}")
            continue
        rep = time_schedule(sched, cluster, network, auto=True)
        if best is None or rep.time_s < best.time_s:
            best = rep
    if best is None:
        raise ConfigError("algo", f"no algorithm can run {cop.value} here: {'; '.join(reasons)}",
                          "change the rank count or the topology")
    return best
