"""The collectives' part of the Python API and of ``topotrain collective``: a cluster from a file, a mapping or YAML
text (:func:`load_cluster`), one collective timed with NCCL's bandwidth metrics (:func:`time_collective`,
:func:`time_schedule`, :class:`CollectiveReport`), the communication library of a file (:func:`load_comm`).

A module of its own (re-exported by :mod:`topotrain.api`) so that timing a collective imports what it needs — the
cluster section's reader (:mod:`topotrain.scenario.cluster_plain`; the schema's models of
:mod:`~topotrain.scenario.cluster_spec` only for a section it leaves), the collectives, the network models — and
not the training simulator or the whole scenario schema: a user scripting thousands of small collectives pays the
start-up of each process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.cluster import Cluster
from topotrain.collectives.costmodel import bus_factor
from topotrain.collectives.protocol import CommLibrary, comm_library, on_the_wire
from topotrain.collectives.registry import algorithms_for, build_schedule
from topotrain.collectives.schedule import CollectiveOp, Schedule, parse_op
from topotrain.network.base import NetworkModel
from topotrain.network.registry import get_model
from topotrain.network.registry import model_names as _network_model_names
from topotrain.scenario.cluster import cluster_from_dict, read_yaml
from topotrain.scenario.cluster import load_cluster as _load_cluster_file
from topotrain.scenario.cluster_plain import plain_library
from topotrain.util import yamlio
from topotrain.util.errors import ConfigError
from topotrain.util.units import parse_size


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
                          "build one with topotrain.load_cluster(path, mapping or YAML text)")
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


def size_of(size: int | str, field: str = "size") -> int:
    """A whole positive number of bytes from ``size``: an int, or text as the CLI takes it (``"256MiB"``,
    ``"256M"``: binary as nccl-tests, ``"1.5GB"``: decimal; :func:`topotrain.util.units.parse_size`). A size
    that is not a whole number of bytes (``1000.5``, ``"1.5B"``) is refused, never rounded silently."""
    if isinstance(size, bool) or not isinstance(size, int | float | str):
        raise ConfigError(field, f"must be a number of bytes or a size with its unit, got {type(size).__name__}",
                          "give e.g. 268435456 or \"256MiB\"")
    value = parse_size(size, field)
    if value != int(value):
        raise ConfigError(field, f"must be a whole number of bytes (got {size!r} = {value!r} bytes)",
                          "give e.g. 268435456 or \"256MiB\"")
    return int(value)


def time_collective(cluster: Cluster, op: str | CollectiveOp, algorithm: str, size_bytes: int | str,
                    network: str | NetworkModel = "flow", ranks: list[str] | None = None,
                    library: str | CommLibrary = "nccl") -> CollectiveReport:
    """Time ``op`` of ``size_bytes`` (bytes, or ``"256MiB"``: :func:`size_of`; the buffer as nccl-tests sizes
    it) with ``algorithm`` (or ``"auto"``: the fastest that applies,
    chosen with ``network`` itself — the same rule as ``simulate``'s ``dp_algorithm: auto``) on
    ``cluster``'s GPUs (or ``ranks``), on the wire as ``library`` puts it there (``nccl``: NCCL's overhead for
    its bottleneck link and message size; ``ideal``: line rate;
    :func:`topotrain.collectives.protocol.on_the_wire`, as ``simulate`` times its collectives)."""
    if not isinstance(cluster, Cluster):
        raise ConfigError("cluster", f"must be a Cluster, got {type(cluster).__name__}",
                          "build one with topotrain.load_cluster(path, mapping or YAML text)")
    cop = _parse_op(op)
    size_bytes = size_of(size_bytes)
    lib = comm_library(library)
    model = network_model(cluster, network)
    alpha = cluster.network_params.message_overhead_s
    group = ranks if ranks is not None else cluster.topology.gpus
    if algorithm != "auto":
        sched = build_schedule(cop, algorithm, cluster.topology, group, int(size_bytes), message_overhead_s=alpha)
        return time_schedule(on_the_wire(sched, cluster.topology, library=lib), cluster, model)
    reasons = []
    floor_s = getattr(model, "floor_s", None)  # a lower bound of a schedule's time (network.base, network.floor)
    cands: list[tuple[float, int, str, Schedule]] = []
    for i, name in enumerate(algorithms_for(cop, auto=True)):
        try:
            sched = on_the_wire(build_schedule(cop, name, cluster.topology, group, int(size_bytes),
                                               message_overhead_s=alpha), cluster.topology, library=lib)
        except ConfigError as e:
            reasons.append(f"{name}: {e.message}")
            continue
        cands.append((floor_s(sched, cluster.topology) if floor_s is not None else 0.0, i, name, sched))
    # timed in the order of their floors; one whose floor is above the best time so far could not win and is not
    # timed (the answer and its tie rule, the first of equal times, are those of timing every one)
    best: tuple[float, int, CollectiveReport] | None = None
    for lb, i, name, sched in sorted(cands, key=lambda c: (c[0], c[1])):
        if best is not None and (lb > best[0] or (lb == best[0] and i > best[1])):
            continue
        try:  # a pair with no route (GPUs of a user's graph never forward) is refused when the schedule is timed
            rep = time_schedule(sched, cluster, model, auto=True)
        except ConfigError as e:
            reasons.append(f"{name}: {e.message}")
            continue
        if best is None or rep.time_s < best[0] or (rep.time_s == best[0] and i < best[1]):
            best = (rep.time_s, i, rep)
    if best is None:
        raise ConfigError("algo", f"no algorithm can run {cop.value} here: {'; '.join(reasons)}",
                          "change the rank count or the topology")
    return best[2]


# ---- scenarios and clusters ---------------------------------------------------------------------------
def _looks_like_yaml(text: str) -> bool:
    """Text with a newline, a ``key: value`` or a flow mapping is YAML; anything else names a file."""
    stripped = text.strip()
    return "\n" in stripped or ": " in stripped or stripped.startswith("{")


def load_cluster(source: str | Path | Mapping[str, Any], base_dir: str | Path | None = None) -> Cluster:
    """The cluster of ``source``: a path to a cluster or scenario file (its ``cluster`` section), a mapping
    (a ``cluster`` section, or a scenario holding one) or YAML text of either. Relative files it names
    (``graph``, ``catalog``) are read from ``base_dir`` (default: the file's folder, else the working folder).

    >>> c = load_cluster({"server": "dgx-h100", "servers": 2,
    ...                   "network": {"topology": "single-switch", "link": "ib-ndr-400g"}})
    """
    if isinstance(source, Path) or (isinstance(source, str) and not _looks_like_yaml(source)):
        if base_dir is None:
            return _load_cluster_file(source)
        data: Any = read_yaml(source)
    elif isinstance(source, str):
        data = yamlio.safe_load(source)
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ConfigError("cluster", f"must be a mapping (got {type(data).__name__})",
                          "give {server: ..., servers: ..., network: {...}} or a path to a YAML file")
    section = data.get("cluster", data)
    return cluster_from_dict(section, base_dir=Path(base_dir) if base_dir is not None else None)


def network_model_names() -> list[str]:
    """The network models (``network: NAME``): ``analytical``, ``flow``, ``flow-async``, ``flow-eager``,
    ``packet``."""
    return list(_network_model_names())


def load_comm(path: str | Path, library: str | None = None) -> CommLibrary:
    """The communication library of a cluster or scenario file: ``library`` where given (``collective
    --library``), else the file's ``comm.library``, else NCCL; a bad name is a ConfigError naming the field."""
    if library is not None:
        try:
            return comm_library(library)
        except ConfigError as e:
            raise ConfigError("--library", e.message, e.fix) from None
    data = read_yaml(path)
    section = data.get("comm") if isinstance(data, Mapping) else None
    name = plain_library({} if section is None else section)  # what the schema reads, without building it
    if name is None:
        # deferred: pydantic and the schema's models are built only for a comm section the plain reader leaves
        from topotrain.scenario.cluster_spec import validated_library

        name = validated_library(section, "comm")
    return CommLibrary(name)
