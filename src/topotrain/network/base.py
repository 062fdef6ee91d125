"""What every network model answers: the time of a :class:`~topotrain.collectives.Schedule` on a Topology.

A network model never knows what a layer is; a collective never knows which network model times it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from topotrain.collectives.schedule import Phase, Schedule
from topotrain.topology.graph import Topology


@dataclass(frozen=True, eq=False)
class CollectiveResult:
    """Time of one collective and where its bytes went."""

    model: str
    time_s: float
    phase_times_s: np.ndarray
    link_bytes: np.ndarray  # bytes carried by each directed link, indexed by link id

    def link_utilization(self, topo: Topology) -> np.ndarray:
        """Mean utilization of each directed link over the collective: bytes / (capacity · time)."""
        if self.time_s <= 0:
            return np.zeros_like(self.link_bytes, dtype=np.float64)
        return self.link_bytes / (topo.capacity_bytes_per_s * self.time_s)

    def busiest_link(self, topo: Topology) -> tuple[str, str, float]:
        """(src, dst, utilization) of the directed link with the highest mean utilization."""
        if topo.num_links == 0:
            return ("", "", 0.0)
        util = self.link_utilization(topo)
        i = int(np.argmax(util))
        lk = topo.links[i]
        return (lk.src, lk.dst, float(util[i]))


class NetworkModel(Protocol):
    name: str

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult: ...


@dataclass(frozen=True, eq=False)
class PhasePaths:
    """A phase's transfers resolved onto directed links, in CSR form.

    Transfer ``i`` crosses links ``links[offsets[i]:offsets[i+1]]``; ``latency_s[i]`` is the sum of their
    latencies; ``bytes`` the transfer's size.
    """

    offsets: np.ndarray
    links: np.ndarray
    latency_s: np.ndarray
    bytes: np.ndarray

    @property
    def num_transfers(self) -> int:
        return int(self.bytes.shape[0])

    def entry_transfer(self) -> np.ndarray:
        """For every entry of ``links``, the transfer it belongs to."""
        return np.repeat(np.arange(self.num_transfers), np.diff(self.offsets))


class PathCache:
    """Routes of rank pairs of one (schedule ranks, topology), as numpy arrays."""

    def __init__(self, topo: Topology, ranks: tuple[str, ...]) -> None:
        self.topo = topo
        self.ranks = ranks
        self._pairs: dict[tuple[int, int], tuple[int, ...]] = {}

    def resolve(self, schedule: Schedule, phase: Phase) -> PhasePaths:
        pairs = self._pairs
        ranks = self.ranks
        route = self.topo.route
        paths = []
        for s, d in zip(phase.src.tolist(), phase.dst.tolist(), strict=True):
            p = pairs.get((s, d))
            if p is None:
                p = route(ranks[s], ranks[d])
                pairs[(s, d)] = p
            paths.append(p)
        lengths = np.fromiter((len(p) for p in paths), dtype=np.int64, count=len(paths))
        offsets = np.zeros(len(paths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        links = np.fromiter((lid for p in paths for lid in p), dtype=np.int64, count=int(offsets[-1]))
        lat = self.topo.latency_s
        if links.size:
            entry_lat = lat[links]
            cum = np.zeros(links.size + 1)
            np.cumsum(entry_lat, out=cum[1:])
            latency = cum[offsets[1:]] - cum[offsets[:-1]]
        else:
            latency = np.zeros(len(paths))
        return PhasePaths(offsets, links, latency, schedule.transfer_bytes(phase).astype(np.float64))


def phase_key(schedule: Schedule, phase: Phase) -> bytes:
    """A signature of a phase's traffic (who sends how many bytes to whom): equal keys time equally
    when the phase runs alone, whatever chunks they carry."""
    return b"|".join((phase.src.tobytes(), phase.dst.tobytes(), schedule.transfer_bytes(phase).tobytes()))


def time_phases(name: str, schedule: Schedule, topo: Topology,
                time_phase: Callable[[Phase], tuple[float, np.ndarray]]) -> CollectiveResult:
    """Time a schedule phase after phase (each phase a barrier), calling ``time_phase`` once per distinct
    traffic signature (:func:`phase_key`) — exact when a phase runs alone — and summing times and per-link
    bytes. ``time_phase`` returns (phase seconds, bytes per directed link)."""
    memo: dict[bytes, tuple[float, np.ndarray]] = {}
    times = np.zeros(len(schedule.phases))
    link_bytes = np.zeros(topo.num_links)
    for k, phase in enumerate(schedule.phases):
        key = phase_key(schedule, phase)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = time_phase(phase)
        times[k] = hit[0]
        link_bytes += hit[1]
    return CollectiveResult(name, float(times.sum()), times, link_bytes)
