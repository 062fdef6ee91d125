"""The cluster a trace was recorded on, as topotrain data: one host whose ranks talk through its loopback
(the CPU/gloo recordings of benchmarks/trace_record.py), or the same shape with figures the user gives.

A :class:`HostCluster` is a star: every rank a node on one switch (the kernel's loopback), each link of
``bandwidth_bytes_per_s`` and ``latency_s``, each message costing ``message_overhead_s`` (Hockney's alpha;
gloo's per-message software cost over TCP). :func:`fit_host_cluster` measures the bandwidth from the trace
itself, as dPRO measures its communication model from the recorded spans (Hu et al., MLSys 2022): for
every allreduce, the time while all its ranks were in it (:attr:`TraceCollective.measured_net_s`) is set
equal to the ring allreduce's alpha-beta time, ``2(n−1)·(α + S/(n·B))`` (Thakur, Rabenseifner and Gropp,
IJHPCA 2005), and ``B`` is the median over the collectives of the bandwidth each one implies (the median,
so that a collective slowed by a preempted rank does not set it).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.network.params import NetworkParams
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.traces.model import TraceJob
from topotrain.util.errors import ConfigError
from topotrain.util.units import parse_bandwidth, parse_time
from topotrain.util.yamlio import safe_load

#: Gloo's cost of one message over loopback TCP, assumed when a trace cannot separate it from bandwidth
#: (its buckets are all of one size): tens of µs (a send/recv pair through the kernel and gloo's run loop).
DEFAULT_OVERHEAD_S = 20e-6
#: Loopback bandwidth assumed when a trace has no collective to measure it from.
DEFAULT_BANDWIDTH_BYTES_PER_S = 1e9


@dataclass(frozen=True)
class HostCluster:
    """One host's ranks on its loopback: link bandwidth and latency, per-message overhead, the network
    model that times the collectives, and the CPU cores the ranks share (0: as many as the ranks)."""

    name: str = "host-loopback"
    bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S
    latency_s: float = 0.0
    message_overhead_s: float = DEFAULT_OVERHEAD_S
    network: str = "flow"
    cores: int = 0

    def __post_init__(self) -> None:
        for f in ("bandwidth_bytes_per_s", "latency_s", "message_overhead_s"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf") or (
                    f == "bandwidth_bytes_per_s" and v == 0):
                bound = " > 0" if f.startswith("band") else " >= 0"
                raise ConfigError(f"cluster.{f}", f"must be a finite number{bound}, got {v!r}",
                                  "give e.g. bandwidth_bytes_per_s: 2e9")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 0:
            raise ConfigError("cluster.cores", f"must be an integer >= 0, got {self.cores!r}", "give e.g. cores: 2")

    def topology(self, world_size: int) -> Topology:
        """``world_size`` ranks (``rank0``…) on one switch (``lo``)."""
        t = Topology(f"{self.name}-{world_size}")
        t.add_node("lo", NodeKind.SWITCH)
        for r in range(world_size):
            t.add_node(rank_name(r), NodeKind.GPU)
            t.add_link(rank_name(r), "lo", self.bandwidth_bytes_per_s, self.latency_s / 2)
        return t

    def params(self) -> NetworkParams:
        return NetworkParams(message_overhead_s=self.message_overhead_s)


def rank_name(rank: int) -> str:
    return f"rank{rank}"


def fit_host_cluster(job: TraceJob, *, message_overhead_s: float = DEFAULT_OVERHEAD_S, network: str = "flow",
                     cores: int = 0) -> HostCluster:
    """The host cluster whose loopback bandwidth the job's own collectives imply (see the module's docstring)."""
    implied = []
    for c in job.collectives:
        n = len(c.ranks)
        if n < 2 or c.size_bytes <= 0 or c.op != "allreduce":
            continue
        steps = 2 * (n - 1)
        wire_s = c.measured_net_s - steps * message_overhead_s
        if wire_s > 0:
            implied.append(steps * c.size_bytes / n / wire_s)
    bw = statistics.median(implied) if implied else DEFAULT_BANDWIDTH_BYTES_PER_S
    return HostCluster(f"{job.name or 'trace'}-host", bw, 0.0, message_overhead_s, network, cores)


def _plain_number(v: Any) -> Any:
    """``v`` as a float when it is a string of a plain number (YAML reads ``2e8`` as a string), else ``v``."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def host_cluster_from_dict(d: Any, where: str = "cluster") -> HostCluster:
    """A host cluster from a mapping (a YAML file's contents): its fields by name, each optional; the
    bandwidth and times as numbers (bytes/s, seconds) or with units (``2GB/s``, ``20us``)."""
    if not isinstance(d, dict):
        raise ConfigError(where, f"must be a mapping of fields, got {type(d).__name__}",
                          "give e.g. {bandwidth_bytes_per_s: 2e9, message_overhead_s: 2e-5, cores: 2}")
    known = set(HostCluster.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "is not a field of a host cluster",
                          f"use {', '.join(sorted(known))}")
    fields = {k: _plain_number(v) for k, v in d.items()}
    if "bandwidth_bytes_per_s" in fields:
        fields["bandwidth_bytes_per_s"] = parse_bandwidth(fields["bandwidth_bytes_per_s"],
                                                          f"{where}.bandwidth_bytes_per_s")
    for f in ("latency_s", "message_overhead_s"):
        if f in fields:
            fields[f] = parse_time(fields[f], f"{where}.{f}")
    return HostCluster(**fields)


def load_host_cluster(path: str | Path) -> HostCluster:
    """The host cluster of a YAML (or JSON) file of :class:`HostCluster`'s fields."""
    return host_cluster_from_dict(safe_load(Path(path).read_bytes()), str(path))
