"""Flow-level model without phase barriers: every rank runs ahead as soon as its own data has arrived.

The ``flow`` model (:mod:`topotrain.network.flow`) treats each phase of a schedule as a barrier, as the
step-wise cost models do. Real executions (NCCL, gloo, and :mod:`topotrain.comm`) have no global barrier:
rank ``r`` enters phase ``k+1`` as soon as *its own* sends and receives of phase ``k`` are done, and a
transfer ``s → d`` of phase ``k`` flows once both ``s`` and ``d`` have entered phase ``k`` (a rendezvous:
the receiver has posted its buffer). Pipelined schedules (trees, chunked chains) and congested topologies,
where some ranks finish a step early, run faster than with barriers. Bandwidth is still shared max-min on
the real routed paths (one :class:`~topotrain.network.flow.FlowNetwork`); every flow still pays path
latency and the per-message overhead.

Cost: one event per distinct completion time, no memoization across phases (phases no longer run alone),
so it is slower than ``flow`` on schedules with thousands of identical phases.
"""

from __future__ import annotations

import numpy as np

from topotrain.collectives.schedule import Schedule
from topotrain.network.base import CollectiveResult, PathCache
from topotrain.network.flow import FlowNetwork
from topotrain.topology.graph import Topology


class FlowAsyncModel:
    """Max-min fair sharing with per-rank progress (no phase barriers)."""

    name = "flow-async"

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        p = schedule.num_ranks
        phases = schedule.phases
        n_ph = len(phases)
        cache = PathCache(topo, schedule.ranks)
        resolved = [cache.resolve(schedule, ph) for ph in phases]
        # ops[k][r]: transfers of phase k that rank r takes part in (self-transfers cost nothing: skipped)
        remote = [ph.src != ph.dst for ph in phases]
        by_rank: list[dict[int, list[int]]] = []
        for k, ph in enumerate(phases):
            d: dict[int, list[int]] = {}
            for i in np.flatnonzero(remote[k]).tolist():
                d.setdefault(int(ph.src[i]), []).append(i)
                d.setdefault(int(ph.dst[i]), []).append(i)
            by_rank.append(d)
        cur = np.zeros(p, dtype=np.int64)  # phase each rank is in
        left = np.zeros(p, dtype=np.int64)  # its unfinished transfers there
        started = [np.zeros(len(ph), dtype=bool) for ph in phases]
        phase_end = np.zeros(n_ph)
        net = FlowNetwork(topo)
        arrivals: list[int] = list(range(p))
        now = 0.0
        finished = 0.0

        def settle(ranks: list[int]) -> list[int]:
            """Move ranks past phases they take no part in; return those that entered a phase with work."""
            entered = []
            for r in ranks:
                k = int(cur[r])
                while k < n_ph and r not in by_rank[k]:
                    k += 1
                cur[r] = k
                if k < n_ph:
                    left[r] = len(by_rank[k][r])
                    entered.append(r)
            return entered

        while True:
            entered = settle(arrivals)
            arrivals = []
            batch_k: list[int] = []
            batch_i: list[int] = []
            for r in entered:
                k = int(cur[r])
                ph = phases[k]
                for i in by_rank[k][r]:
                    if started[k][i]:
                        continue
                    other = int(ph.dst[i]) if int(ph.src[i]) == r else int(ph.src[i])
                    if int(cur[other]) == k:
                        started[k][i] = True
                        batch_k.append(k)
                        batch_i.append(i)
            if batch_i:
                offs = [0]
                links: list[np.ndarray] = []
                sizes = []
                for k, i in zip(batch_k, batch_i, strict=True):
                    pp = resolved[k]
                    seg = pp.links[pp.offsets[i]:pp.offsets[i + 1]]
                    links.append(seg)
                    offs.append(offs[-1] + len(seg))
                    sizes.append(pp.bytes[i])
                net.start_many(np.array(offs, dtype=np.int64),
                               np.concatenate(links) if links else np.zeros(0, dtype=np.int64),
                               np.array(sizes), now, [k * (1 << 32) + i for k, i in zip(batch_k, batch_i, strict=True)])
            t_next = net.next_event_s()
            if t_next == float("inf"):
                break
            for t_done, tag in net.advance(t_next):
                now = t_done
                k, i = divmod(int(tag), 1 << 32)  # type: ignore[call-overload]
                phase_end[k] = max(phase_end[k], t_done)
                finished = max(finished, t_done)
                for r in (int(phases[k].src[i]), int(phases[k].dst[i])):
                    left[r] -= 1
                    if left[r] == 0:
                        cur[r] += 1
                        arrivals.append(r)
            now = t_next
        if bool((cur < n_ph).any()):
            raise RuntimeError("schedule deadlocked: some rank waits for a partner that never arrives")
        running = np.maximum.accumulate(phase_end) if n_ph else phase_end
        times = np.diff(np.concatenate([[0.0], running]))
        return CollectiveResult(self.name, float(finished), times, net.link_bytes())
