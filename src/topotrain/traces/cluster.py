"""The cluster a trace was recorded on, as topotrain data: one host whose ranks talk through its loopback
(the CPU/gloo recordings of benchmarks/trace_record.py), or the same shape with figures the user gives.

A :class:`HostCluster` is a star: every rank a node on one switch (the kernel's loopback), each link of
``bandwidth_bytes_per_s`` and ``latency_s``, each message costing ``message_overhead_s`` (Hockney's alpha;
gloo's per-message software cost over TCP). :func:`fit_host_cluster` measures the bandwidth from the trace
itself, as dPRO measures its communication model from the recorded spans (Hu et al., MLSys 2022): for
every allreduce, allgather and reduce-scatter, the time while all its ranks were in it
(:attr:`TraceCollective.measured_net_s`) is set equal to the ring's alpha-beta time, ``k(n−1)·(α +
S/(n·B))`` with ``k`` 2 for an allreduce and 1 for the others (Thakur, Rabenseifner and Gropp, IJHPCA
2005), for the op the backend ran (:attr:`TraceCollective.ran_as`: gloo runs a CPU reduce-scatter as an
allreduce of the whole buffer, and its span, ``gloo:all_reduce``, is that allreduce's time). When the
collectives' sizes span 4× or more (FSDP's units), ``α`` and ``B`` are both fitted, by least squares on the
relative error constrained to ``α ≥ 0`` and ``1/B ≥ 0`` (Lawson and Hanson, "Solving Least Squares Problems",
1974, ch. 23: the unconstrained solution where it is physical, else the better of the two one-parameter fits on
the boundary); otherwise (DDP's equal buckets cannot tell them apart) ``α`` is given and ``B`` is the
median over the collectives of the bandwidth each one implies (the median, so that
a collective slowed by a preempted rank does not set it). With more ranks than cores the spans of FSDP2's
collectives scatter with the scheduler, not with their bytes (a 230 KB allreduce 2.9 ms, a 5 KB all-gather
5.9 ms in one 4-process recording on 2 cores): the unconstrained fit then gives ``α < 0`` or ``1/B < 0``, and
falling back to an assumed ``α`` and the median bandwidth made the largest collectives 4–12× their span; the
constrained fit keeps what the spans do say (a per-message cost and no measurable per-byte one there).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


#: Ring steps per (n − 1) of each op the fit uses, each moving S/n bytes per rank: an allreduce is a
#: reduce-scatter then an allgather (Thakur, Rabenseifner and Gropp, IJHPCA 2005).
RING_STEPS = {"allreduce": 2, "allgather": 1, "reduce-scatter": 1}


def rank_name(rank: int) -> str:
    return f"rank{rank}"


#: The bandwidth a fit reports where the spans show no per-byte cost (the constrained fit puts ``1/B`` at its
#: bound 0): above any host's memory-copy rate, so a collective's bytes add nothing to its time. A stand-in for
#: "unbounded" (a link needs a finite capacity), not a measured or fitted figure.
UNBOUNDED_BANDWIDTH_BYTES_PER_S = 1e12


def _fit_alpha_beta(rows: list[tuple[int, float, float]]) -> tuple[float, float] | None:
    """(α, B) minimizing the relative error of ``steps·α + wire_bytes/B`` against each measured time, over
    rows of (steps, wire bytes, seconds), with ``α ≥ 0`` and ``1/B ≥ 0`` (the module's docstring): the
    unconstrained least-squares solution where both are positive, else the better (smaller squared relative
    error) of the fits with ``α = 0`` and with ``1/B = 0`` (B then :data:`UNBOUNDED_BANDWIDTH_BYTES_PER_S`).
    None when the sizes span less than 4× (α and B then trade off)."""
    sizes = [w / s for s, w, _ in rows]
    if len(rows) < 3 or max(sizes) < 4 * min(sizes):
        return None
    a = np.array([[s / t, w / t] for s, w, t in rows])
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    if alpha >= 0 and inv_bw > 0:
        return float(alpha), float(1.0 / inv_bw)
    # on the boundary: one column alone, x = (a·1)/(a·a); the one with the smaller residual
    alpha_only, alpha_err = _one_column_fit(a[:, 0])
    inv_bw_only, inv_bw_err = _one_column_fit(a[:, 1])
    if inv_bw_err < alpha_err:
        return 0.0, 1.0 / inv_bw_only
    return alpha_only, UNBOUNDED_BANDWIDTH_BYTES_PER_S


def _one_column_fit(col: np.ndarray) -> tuple[float, float]:
    """The least-squares ``x`` of ``col·x ≈ 1`` and its squared residual."""
    x = float(col @ np.ones_like(col) / (col @ col))
    return x, float(np.sum((col * x - 1.0) ** 2))


def fit_host_cluster(job: TraceJob, *, message_overhead_s: float | None = None, network: str = "flow",
                     cores: int = 0) -> HostCluster:
    """The host cluster whose loopback the job's own collectives imply (see the module's docstring):
    with ``message_overhead_s`` None and collectives of sizes 4× apart or more, α and B both fitted
    (least relative squares with α ≥ 0, 1/B ≥ 0); else α given (default :data:`DEFAULT_OVERHEAD_S`) and B the
    median."""
    rows = []
    for c in job.collectives:
        n = len(c.ranks)
        if n < 2 or c.size_bytes <= 0 or c.ran_as not in RING_STEPS or c.measured_net_s <= 0:
            continue
        steps = RING_STEPS[c.ran_as] * (n - 1)
        rows.append((steps, steps * c.size_bytes / n, c.measured_net_s))
    name = f"{job.name or 'trace'}-host"
    fitted = _fit_alpha_beta(rows) if message_overhead_s is None else None
    if fitted is not None:
        return HostCluster(name, fitted[1], 0.0, fitted[0], network, cores)
    alpha = DEFAULT_OVERHEAD_S if message_overhead_s is None else message_overhead_s
    implied = [w / (t - s * alpha) for s, w, t in rows if t > s * alpha]
    bw = statistics.median(implied) if implied else DEFAULT_BANDWIDTH_BYTES_PER_S
    return HostCluster(name, bw, 0.0, alpha, network, cores)


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
