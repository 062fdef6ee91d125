"""Analytical (alpha-beta) network model, bottleneck-aware, on the real routed paths.

Per phase, every directed link ``l`` must carry the bytes ``B_l`` of all transfers routed over it, at
its capacity ``C_l``. A transfer ``i`` over path ``P_i`` is charged

    t_i = alpha + sum_{l in P_i} latency_l + max_{l in P_i} B_l / C_l

(alpha = :attr:`NetworkParams.message_overhead_s`, the per-message software overhead), and the phase
takes ``max_i t_i``. On a non-blocking network (no link shared) this is exactly Hockney's ``alpha + n·beta`` per
step, so schedules reproduce the closed forms of Thakur, Rabenseifner & Gropp (IJHPCA 2005). Every link must move
its bytes, so ``max_l B_l / C_l`` bounds any fair-sharing model's data time from below; with equal path
latencies the flow model is never faster than this one. (With unequal latencies a short flow on a long
path can leave the flow model earlier than this model charges it, so the bound is per link, not per
transfer.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from topotrain.collectives.paths import PhasePaths, path_cache
from topotrain.collectives.schedule import Schedule
from topotrain.network.base import (
    AloneJobs,
    CollectiveResult,
    JobTiming,
    check_submit,
    overhead_floor_s,
    run_alone,
    time_phases,
)
from topotrain.network.floor import link_floor_s
from topotrain.network.params import NetworkParams
from topotrain.network.switching import on_fabric
from topotrain.topology.graph import Topology


def phase_time_analytical(pp: PhasePaths, capacity_bytes_per_s: np.ndarray, overhead_s: float,
                          num_links: int) -> tuple[float, np.ndarray]:
    """Return (phase time, bytes per directed link) for one resolved phase."""
    if pp.num_transfers == 0:
        return 0.0, np.zeros(num_links)
    link_bytes = pp.link_bytes(num_links)
    drain = link_bytes / capacity_bytes_per_s
    per_transfer = np.zeros(pp.num_transfers)
    has_links = np.diff(pp.offsets) > 0
    if pp.links.size:
        starts = pp.offsets[:-1][has_links]
        per_transfer[has_links] = np.maximum.reduceat(drain[pp.links], starts)
    t = np.where(has_links, overhead_s + pp.latency_s + per_transfer, 0.0)  # to oneself: free
    return float(t.max()), link_bytes


class AnalyticalModel:
    """Fast alpha-beta timing; phases with the same traffic signature are timed once. Concurrent
    submissions do not contend (each is charged its own bottleneck time)."""

    name = "analytical"
    contends = False  # concurrent submissions never slow each other down

    def __init__(self, params: NetworkParams | None = None) -> None:
        self.params = params if params is not None else NetworkParams()

    def time_alone(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        """Alpha-beta time of ``schedule`` phase after phase (the closed forms; module docstring); on a packet
        fabric (:attr:`NetworkParams.fabric`), of its framed schedule, each phase plus its store-and-forward
        term (:mod:`topotrain.network.switching`)."""
        extra = None
        if not self.params.fabric.is_cut_through:  # a packet fabric: its framed schedule, plus a term per phase
            schedule, extra = on_fabric(schedule, topo, self.params.fabric)
        cache = path_cache(topo, schedule.ranks)
        cap = topo.capacity_bytes_per_s
        alpha = self.params.message_overhead_s
        framed = schedule
        return time_phases(self.name, framed, topo, lambda phase: phase_time_analytical(
            cache.resolve(framed, phase), cap, alpha, topo.num_links), extra)

    def floor_s(self, schedule: Schedule, topo: Topology | None = None) -> float:
        """A lower bound of :meth:`time_alone` of ``schedule`` (:func:`~topotrain.network.base.overhead_floor_s`;
        on ``topo``, also :func:`~topotrain.network.floor.link_floor_s`)."""
        floor = overhead_floor_s(schedule, self.params)
        return floor if topo is None else max(floor, link_floor_s(schedule, topo, self.params))

    def open(self, topo: Topology) -> AnalyticalSim:
        return AnalyticalSim(self, topo)

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        return run_alone(self, schedule, topo)


class AnalyticalSim:
    """:class:`~topotrain.network.base.NetworkSim` of the analytical model: every submission is timed by
    itself (no contention), so each one completes at its start plus its alpha-beta time."""

    def __init__(self, model: AnalyticalModel, topo: Topology) -> None:
        self.topo = topo
        self._jobs = AloneJobs(lambda s: model.time_alone(s, topo), topo.num_links)
        self._now_s = 0.0

    def hold(self, parts: Sequence[tuple[Schedule, str]], until_s: float,
             on_release: Callable[[float], None]) -> bool:
        return False  # no contention to hold links against (see FlowSim.hold)

    def submit_started(self, schedule: Schedule, at_s: float, tag: object, key: str) -> None:
        raise AssertionError("no hold is ever granted here")

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        check_submit(at_s, self._now_s)
        self._jobs.submit(schedule, at_s, tag, key)

    def alone(self, schedule: Schedule, key: str | None = None) -> CollectiveResult:
        return self._jobs.result(schedule, key)

    def next_event_s(self, horizon_s: float | None = None) -> float:
        return self._jobs.next_event_s()

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        self._now_s = max(self._now_s, to_s)
        return self._jobs.pop_until(to_s)

    def timing(self, tag: object) -> JobTiming:
        return self._jobs.timing(tag)

    def link_bytes(self) -> np.ndarray:
        return self._jobs.link_bytes.copy()
