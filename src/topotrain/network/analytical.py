"""Analytical (alpha-beta) network model, bottleneck-aware, on the real routed paths.

Per phase, every directed link ``l`` must carry the bytes ``B_l`` of all transfers routed over it, at
its capacity ``C_l``. A transfer ``i`` over path ``P_i`` is charged

    t_i = alpha + sum_{l in P_i} latency_l + max_{l in P_i} B_l / C_l

(alpha = the topology's per-message software overhead), and the phase takes ``max_i t_i``. On a
non-blocking network (no link shared) this is exactly Hockney's ``alpha + n·beta`` per step, so
schedules reproduce the closed forms of Thakur, Rabenseifner & Gropp (IJHPCA 2005). Every link must move
its bytes, so ``max_l B_l / C_l`` bounds any fair-sharing model's data time from below; with equal path
latencies the flow model is never faster than this one. (With unequal latencies a short flow on a long
path can leave the flow model earlier than this model charges it, so the bound is per link, not per
transfer.)
"""

from __future__ import annotations

import numpy as np

from topotrain.collectives.schedule import Schedule
from topotrain.network.base import CollectiveResult, PathCache, PhasePaths, time_phases
from topotrain.topology.graph import Topology


def phase_time_analytical(pp: PhasePaths, capacity_bytes_per_s: np.ndarray, overhead_s: float,
                          num_links: int) -> tuple[float, np.ndarray]:
    """Return (phase time, bytes per directed link) for one resolved phase."""
    if pp.num_transfers == 0:
        return 0.0, np.zeros(num_links)
    entry_t = pp.entry_transfer()
    link_bytes = np.bincount(pp.links, weights=pp.bytes[entry_t], minlength=num_links)
    drain = link_bytes / capacity_bytes_per_s
    per_transfer = np.zeros(pp.num_transfers)
    has_links = np.diff(pp.offsets) > 0
    if pp.links.size:
        starts = pp.offsets[:-1][has_links]
        per_transfer[has_links] = np.maximum.reduceat(drain[pp.links], starts)
    t = np.where(has_links, overhead_s + pp.latency_s + per_transfer, 0.0)  # to oneself: free
    return float(t.max()), link_bytes


class AnalyticalModel:
    """Fast alpha-beta timing; phases with the same traffic signature are timed once."""

    name = "analytical"

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        cache = PathCache(topo, schedule.ranks)
        cap = topo.capacity_bytes_per_s
        return time_phases(self.name, schedule, topo, lambda phase: phase_time_analytical(
            cache.resolve(schedule, phase), cap, topo.message_overhead_s, topo.num_links))
