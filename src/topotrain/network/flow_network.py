"""Flow-level fluid network: max-min fair sharing of the real routed paths, event driven.

The fluid model (as in SimGrid's flow models, Velho et al., ACM TOMACS 2013, and the flow-level
simulators surveyed there):

* A flow is a stream of bytes over a fixed path of directed links. While it has bytes left it gets its
  max-min fair rate (:func:`topotrain.network.maxmin.max_min_rates`, progressive filling after
  Bertsekas & Gallager, *Data Networks*, §6.5). Rates change only when the set of active flows changes
  (a flow starts, or sends its last byte), so between such events every flow progresses linearly.
* A flow's data starts at its start time. It *completes* at the moment its last byte has been sent plus
  its path latency (sum of its links' latencies) plus the per-message software overhead
  (:attr:`~topotrain.network.params.NetworkParams.message_overhead_s`). Latency does not occupy
  bandwidth: once the last byte is sent the flow leaves the links, and its bytes in flight are not charged to anybody.
* A flow with no links (a rank sending to itself) is a local copy: it completes when it starts.

Hence a flow alone on its path takes ``alpha + latency + size / min capacity`` — exactly the
alpha-beta cost of :mod:`topotrain.network.analytical`; under contention it takes longer.

:class:`FlowNetwork` is the fluid core (start flows, ask for the next event, advance time). Its state and the
rates computed from it live in its base class, :class:`~topotrain.network.flow_rates.FlowRates`; the ``flow``
network model that drives it is :mod:`topotrain.network.flow`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from topotrain.network.flow_chain import PhaseChains
from topotrain.network.flow_kernel import grown as _grow
from topotrain.network.flow_rates import NO_MEMO, FlowRates, PreparedBatch
from topotrain.util.errors import ConfigError

#: the arguments of a compiled departure loop that recomputes nothing first
_NO_STEP_PRE: tuple[np.ndarray, np.ndarray, np.ndarray, None, bool, bool, float] = (
    np.zeros(0, dtype=np.int64), NO_MEMO[0], NO_MEMO[1], None, False, False, np.inf)

#: Flows whose last byte would leave within this relative distance of the next event leave with it.
_DONE_REL_EPS = 1e-12


class FlowNetwork(FlowRates):
    """Event-driven fluid simulation of flows on a Topology's directed links.

    Typical driving loop (a training engine interleaves its own events the same way)::

        net = FlowNetwork(topo)
        net.start(topo.route("g0", "g1"), 1e6, now_s=0.0, tag="a")
        while (t := net.next_event_s()) < math.inf:
            for done_s, tag in net.advance(t):
                ...  # start the flows that depend on ``tag`` at ``done_s``

    Flows with identical paths form one *group* priced once by max-min (weight = number of its active
    flows), so thousands of identical-path flows cost one. Rates are recomputed lazily, once per change
    of the active set, however many flows start at one instant; when flows only leave, only the flows
    at or above the lowest departed rate are refilled (see :meth:`_recompute`).

    ``overhead_s`` is the per-message software cost added to every completion
    (:attr:`~topotrain.network.params.NetworkParams.message_overhead_s`).
    ``report=False`` skips the per-flow completion queue: :meth:`advance` then returns nothing and only
    :attr:`last_completion_s` / :attr:`num_completed` are kept (the fast path of :class:`FlowModel`).
    ``ids_only=True`` keeps no tags: completions come back as arrays of flow ids from :meth:`advance_ids`
    (for callers that map ids to their own state with numpy).
    ``jobs=True`` reports *jobs*, not flows: every :meth:`start_many` names a job (an int >= 0), a job completes
    when every flow started under it has completed, at the latest of their completion times, and
    :meth:`advance_jobs` returns ``(completion time, job)`` in the order the last flows would have come back
    (time, then flow id). The rate-change events in between are then internal: given a horizon,
    :meth:`next_event_s` steps through them up to the next job completion, and the caller wakes up once per job,
    not once per flow (a phase of flows whose paths differ in latency completes at many instants).
    """

    def reset(self) -> None:
        super().reset()
        #: (``jobs=True``) the phases jobs start next inside the compiled departure loop (:mod:`flow_chain`)
        self._chains = PhaseChains()
        #: called with (times, jobs) of the chained phases a compiled call started, in order
        self.on_chain: Callable[[list[float], list[int]], None] | None = None

    def chain(self, job: int, batch: PreparedBatch, sizes: list[np.ndarray]) -> None:
        """(``jobs=True``, compiled kernels) ``job``'s next phases (after the one it runs now, which started
        ``batch``) start ``batch`` again with these ``sizes``, each when the one before completes: they may start
        inside the compiled departure loop (:mod:`topotrain.network.flow_chain`; :attr:`on_chain` is told).
        The caller guarantees that nothing but the network notices those starts."""
        self._chains.add(job, batch, sizes)

    @property
    def can_chain(self) -> bool:
        """Whether chained phases (:meth:`chain`) can start inside the compiled departure loop now."""
        return self._k_steps is not None

    def chained(self, job: int) -> bool:
        """Whether ``job`` has a chained phase left (:meth:`chain`)."""
        return self._chains.live(job) >= 0

    def _memo_stored(self, batch: PreparedBatch) -> None:
        self._chains.memo_found(batch)

    # ---- queries --------------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        """The time up to which every flow has progressed."""
        return self._now_s

    @property
    def last_completion_s(self) -> float:
        """Latest completion time among flows whose last byte has been sent (0 before any)."""
        return self._last_completion_s

    @property
    def num_completed(self) -> int:
        """Flows whose last byte has been sent (their completion is known, reported or not)."""
        return self._num_completed

    @property
    def num_active(self) -> int:
        """Flows that still have bytes to send."""
        return int(self._act.shape[0])

    @property
    def num_pending(self) -> int:
        """Flows started and not yet returned by :meth:`advance` (sending, or their last byte in flight);
        with ``jobs=True``, flows sending plus jobs whose completion is not yet returned."""
        return len(self._act) + self._num_queued + len(self._job_heap)

    def sending(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, bytes left) of the flows that still have bytes to send, as of :attr:`now_s`."""
        act = self._act.copy()
        return act, self._rem[act].copy()

    def link_rates(self) -> np.ndarray:
        """Current load (bytes/s) of every directed link: the sum of the rates of the flows crossing it."""
        self._ensure_rates()
        eg, el = self._ent_gid[: self._ent_n], self._ent_link[: self._ent_n]
        live = self._mult[eg] > 0
        if not bool(live.any()):
            return np.zeros(self._num_links)
        per_group = self._group_rate * self._mult
        return np.bincount(el[live], weights=per_group[eg[live]], minlength=self._num_links)

    def link_bytes(self) -> np.ndarray:
        """Bytes each directed link has carried so far: every path group's bytes spread over its links."""
        n = len(self._group_links)
        gb = self._group_bytes[:n]
        nz = np.flatnonzero(gb)
        if nz.size == 0:
            return np.zeros(self._num_links)
        lengths = self._g_len[nz]
        offsets = np.zeros(lengths.shape[0], dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        idx = np.repeat(self._g_start[nz] - offsets, lengths) + np.arange(int(lengths.sum()))
        return np.bincount(self._g_flat[idx], weights=np.repeat(gb[nz], lengths), minlength=self._num_links)

    def active_rates(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, current rates in bytes/s) of the flows that still have bytes to send."""
        self._ensure_rates()
        return self._act.copy(), self._act_rate.copy()

    def flow_rate(self, flow_id: int) -> float:
        """Current rate (bytes/s) of one flow; 0 once its last byte has been sent."""
        self._ensure_rates()
        if flow_id < 0 or flow_id >= self._num_flows:
            raise ConfigError("flow_id", f"no flow {flow_id}", f"use an id in 0..{self._num_flows - 1}")
        hit = np.flatnonzero(self._act == flow_id)
        return float(self._act_rate[hit[0]]) if hit.size else 0.0

    def next_event_s(self, horizon_s: float | None = None) -> float:
        """Time of the next completion or rate change (``inf`` when nothing is left).

        ``horizon_s`` (``jobs=True`` only) is the caller's promise to start nothing before it: the rate
        changes up to the next job completion, or up to the horizon, are then stepped through here and the
        time returned is that of the next job completion, or of the first rate change past the horizon."""
        if self._jobs and horizon_s is not None and self._dirty and self._k_steps is not None:
            # the rate computation after arrivals and the departures up to the limit, in one compiled call
            heap = self._job_heap
            self._compiled_steps(self._k_steps, min(horizon_s, heap[0][0]) if heap else horizon_s, True, pre=True)
        elif self._jobs and horizon_s is not None:
            self._ensure_rates()
            heap = self._job_heap
            lim = min(horizon_s, heap[0][0]) if heap else horizon_s
            if self._act.size and self._now_s + self._next_dt <= lim:
                steps = self._steps_kernel()
                if steps is not None:
                    self._compiled_steps(steps, lim, True)
                else:
                    while self._act.size and self._now_s + self._next_dt <= lim:
                        self._step_event()
                        if heap:
                            lim = min(lim, heap[0][0])
        else:
            self._ensure_rates()
        t = self._now_s + self._next_dt if self._act.size else np.inf
        if self._done:
            t = min(t, max(self._done[0][0], self._now_s))
        if self._job_heap:
            t = min(t, max(self._job_heap[0][0], self._now_s))
        return float(t)

    def defer_rates(self, to_s: float) -> bool:
        """(``jobs=True``, compiled kernels) Leave the rate computation the arrivals since the last one need for the
        next :meth:`next_event_s` with a horizon, which makes it in the same compiled call as the departures after
        it, when nothing in this network can happen by ``to_s`` whatever the new rates: no job completes by then
        and no flow can send its last byte by then. A flow's rate is at most the capacity of a link it crosses
        (max-min fills no link past it), so it sends its bytes left ``rem`` no sooner than ``rem / max capacity``
        from now; halved here, a margin for rounding (``fl`` of a quotient and of a sum never decreases as the
        dividend or an addend grows, or as the divisor shrinks). True: deferred. Until then a new start or any
        query of the rates computes them first, at this instant, with the same changes: the same bits as
        computing them now."""
        if not (self._dirty and self._k_steps is not None and self._rate_bound > 0.0):
            return False
        if (self._job_heap and self._job_heap[0][0] <= to_s) or (self._done and self._done[0][0] <= to_s):
            return False
        if self._act.shape[0] and not self._now_s + float(self._rem[self._act].min()) / self._rate_bound > to_s:
            return False
        self._deferred = True
        return True

    # ---- starting flows -------------------------------------------------------------------------
    def start(self, links: tuple[int, ...] | np.ndarray, size_bytes: float, now_s: float,
              tag: object = None) -> int:
        """Start one flow of ``size_bytes`` over directed ``links`` at ``now_s``; returns its flow id.

        ``tag`` comes back with the completion from :meth:`advance` (default: the flow id).
        """
        path = np.asarray(links, dtype=np.int64).reshape(-1)
        offsets = np.array([0, path.shape[0]], dtype=np.int64)
        ids = self.start_many(offsets, path, np.array([size_bytes], dtype=np.float64), now_s,
                              None if tag is None else [tag])
        return int(ids[0])

    def start_many(self, offsets: np.ndarray, links: np.ndarray, sizes_bytes: np.ndarray, now_s: float,
                   tags: Sequence[object] | None = None, job: int = -1) -> np.ndarray:
        """Start many flows at ``now_s`` in one call (CSR paths: flow ``i`` crosses
        ``links[offsets[i]:offsets[i+1]]``); returns their flow ids. Rates are recomputed once.
        ``job`` (``jobs=True`` only, and required there) is the job the flows belong to.

        If ``now_s`` is later than :attr:`now_s` the network first progresses to ``now_s``; completions
        that happen on the way stay queued and come back from the next :meth:`advance`.
        """
        off = np.asarray(offsets, dtype=np.int64)
        lk = np.asarray(links, dtype=np.int64)
        size = np.asarray(sizes_bytes, dtype=np.float64).reshape(-1)
        n = size.shape[0]
        if off.shape != (n + 1,) or (n and (off[0] != 0 or off[-1] != lk.shape[0])):
            raise ConfigError("offsets", f"offsets must have {n + 1} entries from 0 to {lk.shape[0]}",
                              "give CSR offsets of the paths, one more than the number of flows")
        if n and not bool(np.all(np.isfinite(size) & (size >= 0))):
            raise ConfigError("size_bytes", "flow sizes must be finite and >= 0", "give sizes in bytes")
        if lk.size and (int(lk.min()) < 0 or int(lk.max()) >= self._num_links):
            raise ConfigError("links", f"link ids must lie in 0..{self._num_links - 1}",
                              "use directed link ids of this topology")
        if tags is not None and len(tags) != n:
            raise ConfigError("tags", f"{len(tags)} tags for {n} flows", "give one tag per flow")
        self._start_at(now_s, job)
        first = self._num_flows
        ids = np.arange(first, first + n, dtype=np.int64)
        if n == 0:
            return ids
        self._num_flows += n
        self._rem = _grow(self._rem, self._num_flows)
        self._gid = _grow(self._gid, self._num_flows)
        self._tail_s = _grow(self._tail_s, self._num_flows)
        if self._jobs:
            self._start_job(job, first, n)
        elif self._report and not self._ids_only:
            self._tags.update(zip(ids.tolist(), ids.tolist() if tags is None else tags, strict=True))
        # path latency (+ overhead) of every flow, vectorized
        lengths = np.diff(off)
        has_links = lengths > 0
        lat_sum = np.zeros(n)
        if lk.size:
            cum = np.zeros(lk.shape[0] + 1)
            np.cumsum(self._lat[lk], out=cum[1:])
            lat_sum = cum[off[1:]] - cum[off[:-1]]
        tail = np.where(has_links, lat_sum + self._overhead_s, 0.0)
        self._tail_s[first:first + n] = tail
        self._rem[first:first + n] = size
        # immediate completions: local copies and empty messages
        instant = (~has_links) | (size == 0)
        if bool(instant.any()):
            self._finish(np.flatnonzero(instant) + first)
        moving = np.flatnonzero(~instant)
        if moving.size == 0:
            return ids
        gids, prep = self._grouped(off, lk, moving)
        self._grow_groups()
        self._arrival = prep if not self._touched else None
        self._touched.append(gids)
        fids = moving + first
        self._gid[fids] = gids
        np.add.at(self._mult, gids, 1)
        self._activate_entries(gids)
        self._act = np.concatenate([self._act, fids])
        self._dirty = True
        self._full = True
        return ids

    def prepare(self, offsets: np.ndarray, links: np.ndarray) -> PreparedBatch:
        """Group once the CSR paths of a batch whose flows all cross links, for :meth:`start_prepared`: the
        path groups and each flow's latency plus overhead are what :meth:`start_many` would compute for the
        same ``(offsets, links)``, bit for bit (the groups of a network are never forgotten)."""
        off = np.asarray(offsets, dtype=np.int64)
        lk = np.asarray(links, dtype=np.int64)
        n = off.shape[0] - 1
        lengths = np.diff(off)
        if n < 1 or not bool((lengths > 0).all()) or off[0] != 0 or off[-1] != lk.shape[0]:
            raise ConfigError("offsets", "a prepared batch needs at least one flow, each crossing links",
                              "prepare only the flows that cross links (start local copies with start_many)")
        if int(lk.min()) < 0 or int(lk.max()) >= self._num_links:
            raise ConfigError("links", f"link ids must lie in 0..{self._num_links - 1}",
                              "use directed link ids of this topology")
        cum = np.zeros(lk.shape[0] + 1)
        np.cumsum(self._lat[lk], out=cum[1:])
        tail = (cum[off[1:]] - cum[off[:-1]]) + self._overhead_s
        gids, seen = self._grouped(off, lk, np.arange(n, dtype=np.int64))
        self._grow_groups()
        if seen is not None:  # a large batch: _grouped has told its groups apart already
            return PreparedBatch(gids, tail, seen.distinct, seen.sorted_gids)
        distinct = bool(np.unique(gids).shape[0] == n)
        return PreparedBatch(gids, tail, distinct, np.sort(gids) if distinct else None)

    def start_prepared(self, batch: PreparedBatch, sizes_bytes: np.ndarray, now_s: float, job: int = -1,
                       checked: bool = False) -> None:
        """:meth:`start_many` of a batch grouped by :meth:`prepare` (same state, same results): skips
        grouping the paths and summing their latencies again. Sizes must be positive and finite (``checked``:
        the caller has checked these very sizes already, once for every start of them)."""
        size = sizes_bytes
        n = batch.gids.shape[0]
        if size.shape != (n,) or not (checked or (n and size.min() > 0.0 and np.isfinite(size.max()))):
            raise ConfigError("size_bytes", f"{n} positive finite sizes expected",
                              "start empty or local flows with start_many")
        if batch.tail_s.shape != (n,):
            raise ConfigError("batch", "the batch was not made by prepare()",
                              "start a batch returned by this network's prepare()")
        self._start_at(now_s, job)
        first = self._num_flows
        self._num_flows = end = first + n
        gids = batch.gids
        self._arrival = batch if not self._touched else None
        self._touched.append(gids)
        self._dirty = True
        self._full = True
        lists = self._k_lists
        if lists is not None and self._jobs:  # the same arrays in one compiled pass
            self._chains.took(job, batch)
            self._job_counts(job, n)
            (self._rem, self._gid, self._tail_s, self._flow_job, self._act, self._ent_gid, self._ent_link, self._nxt,
             self._ent_n) = lists.start(
                gids, NO_MEMO[0] if batch.sorted_gids is None else batch.sorted_gids, batch.tail_s, size, first, job,
                self._rem, self._gid, self._tail_s, self._flow_job, self._mult, self._act, self._in_ent, self._g_len,
                self._g_start, self._g_flat, self._ent_gid, self._ent_link, self._nxt, self._ent_n, self._g_pos,
                self._head)
            return
        self._rem = _grow(self._rem, end)
        self._gid = _grow(self._gid, end)
        self._tail_s = _grow(self._tail_s, end)
        if self._jobs:
            self._start_job(job, first, n)
        elif self._report and not self._ids_only:
            self._tags.update((i, i) for i in range(first, end))
        self._tail_s[first:end] = batch.tail_s
        self._rem[first:end] = size
        self._gid[first:end] = gids
        if batch.sorted_gids is not None:
            self._mult[gids] += 1
            self._activate_entries(batch.sorted_gids, distinct_sorted=True)
        else:
            np.add.at(self._mult, gids, 1)
            self._activate_entries(gids)
        self._act = np.concatenate([self._act, np.arange(first, end, dtype=np.int64)])

    def _start_at(self, now_s: float, job: int) -> None:
        """Check a start's time and job (errors name the argument), and progress the network to ``now_s``; a
        deferred rate computation (:meth:`defer_rates`) is made first, before these flows join."""
        if self._deferred:
            self._recompute()
        if not np.isfinite(now_s) or now_s < self._now_s:
            raise ConfigError("now_s", f"start at {now_s} s but the network is already at {self._now_s} s",
                              "start flows at or after now_s (advance the network in time order)")
        if self._jobs != (job >= 0):
            raise ConfigError("job", f"job {job} on a network with jobs={self._jobs}",
                              "name a job (>= 0) exactly when the network was opened with jobs=True")
        if now_s > self._now_s:
            self._advance_fluid(now_s)

    def _start_job(self, job: int, first: int, n: int) -> None:
        """Flows ``first .. first+n-1`` belong to ``job``."""
        end = first + n
        self._flow_job = _grow(self._flow_job, end)
        self._flow_job[first:end] = job
        self._job_counts(job, n)

    def _job_counts(self, job: int, n: int) -> None:
        """``job`` has ``n`` more flows to complete."""
        if job >= self._job_pending.shape[0]:
            self._job_pending = _grow(self._job_pending, job + 1)
            self._job_end_s = _grow(self._job_end_s, job + 1)
            self._job_last = _grow(self._job_last, job + 1)
        if self._job_pending[job] == 0:
            self._job_end_s[job] = -np.inf
            self._job_last[job] = -1
        self._job_pending[job] += n

    def _finish(self, fids: np.ndarray) -> None:
        """Flows ``fids`` have sent their last byte now: their completions are now + latency + overhead."""
        times = self._now_s + self._tail_s[fids]
        self._num_completed += int(fids.shape[0])
        self._last_completion_s = max(self._last_completion_s, float(times.max()))
        if self._jobs:
            self._settle_jobs(times, fids)
        elif self._report:
            self._push_done(times, fids)

    def _settle_jobs(self, times: np.ndarray, fids: np.ndarray) -> None:
        """Count the completions ``(times, fids)`` to their jobs; a job with none left joins the job heap at its
        latest completion (ties: the higher flow id, as the per-flow queue would return them)."""
        js = self._flow_job[fids]
        j0 = int(js[0])
        if js.shape[0] == 1 or bool((js == j0).all()):  # one job (the common case)
            self._job_pending[j0] -= js.shape[0]
            t_new = float(times.max())
            f_new = int(fids[times == t_new].max())
            if t_new > self._job_end_s[j0] or (t_new == self._job_end_s[j0] and f_new > self._job_last[j0]):
                self._job_end_s[j0] = t_new
                self._job_last[j0] = f_new
            if self._job_pending[j0] == 0:
                heapq.heappush(self._job_heap, (float(self._job_end_s[j0]), int(self._job_last[j0]), j0))
            return
        order = np.lexsort((fids, times))
        js, ts, fs = js[order], times[order], fids[order]
        jobs, first_rev, counts = np.unique(js[::-1], return_index=True, return_counts=True)
        last = js.shape[0] - 1 - first_rev  # each job's latest (time, flow id) among these
        t_new, f_new = ts[last], fs[last]
        t_old, f_old = self._job_end_s[jobs], self._job_last[jobs]
        later = (t_new > t_old) | ((t_new == t_old) & (f_new > f_old))
        self._job_end_s[jobs[later]] = t_new[later]
        self._job_last[jobs[later]] = f_new[later]
        self._job_pending[jobs] -= counts
        for j in jobs[self._job_pending[jobs] == 0].tolist():
            heapq.heappush(self._job_heap, (float(self._job_end_s[j]), int(self._job_last[j]), j))

    def _push_done(self, times: np.ndarray, fids: np.ndarray) -> None:
        self._done_seq += 1
        self._num_queued += int(fids.shape[0])
        heapq.heappush(self._done, (float(times.min()), self._done_seq, times, fids))

    # ---- time -----------------------------------------------------------------------------------
    def _account(self, moved: np.ndarray) -> None:
        n = len(self._group_links)
        self._group_bytes[:n] += np.bincount(self._gid[self._act], weights=moved, minlength=n)

    def _step_event(self) -> None:
        """Progress to the next time a flow sends its last byte, retire such flows, recompute rates."""
        dt = self._next_dt
        step = self._k_step
        if step is not None:  # the same arithmetic in one compiled pass
            n = len(self._group_links)
            if self._acc.shape[0] < n:
                self._acc = np.zeros(max(n, 2 * self._acc.shape[0]))
            fids, self._act, low = step(dt, self._act, self._act_rate, self._rem, self._gid, self._mult,
                                        self._group_bytes, self._acc, _DONE_REL_EPS)
            self._now_s = self._now_s + dt
            self._left_rate = min(self._left_rate, low)
            self._finish(fids)
            self._touched.append(self._gid[fids])
            self._recompute()
            return
        act = self._act
        rate = self._act_rate
        rem = self._rem[act]
        done = rem / rate <= dt * (1.0 + _DONE_REL_EPS)
        moved = np.where(done, rem, rate * dt)
        self._rem[act] = rem - moved
        self._rem[act[done]] = 0.0
        self._account(moved)
        self._now_s = self._now_s + dt
        fids = act[done]
        self._left_rate = min(self._left_rate, float(rate[done].min()))
        self._finish(fids)
        np.subtract.at(self._mult, self._gid[fids], 1)
        self._touched.append(self._gid[fids])
        self._act = act[~done]
        self._recompute()

    def _steps_kernel(self) -> Callable[..., tuple[Any, ...]] | None:
        """The compiled departure loop, when this network can use it (``jobs=True``, compiled kernels in use and
        their scratch arrays made)."""
        if self._k_steps is None or not self._l_map.shape[0] or self._scratch.shape[0] < len(self._group_links):
            return None
        return self._k_steps

    def _compiled_steps(self, steps: Callable[..., tuple[Any, ...]], lim: float, stop_at_jobs: bool,
                        pre: bool = False) -> None:
        """``_step_event`` while the next departure is at or before ``lim`` (with ``stop_at_jobs``, and before
        any job completes on the way), in one compiled call (``jobs=True``; :func:`flow_kernel._steps`). The
        rates must be up to date, or with ``pre`` they are brought up to date first in the same call, as
        :meth:`_recompute` would."""
        n = len(self._group_links)
        if self._acc.shape[0] < n:
            self._acc = np.zeros(max(n, 2 * self._acc.shape[0]))
        changed, memo_g, memo_r, arrival, has_touched, full, thr = _NO_STEP_PRE
        if pre:
            touched, full, thr = self._take_changes()
            changed, memo_g, memo_r, arrival = self._kernel_inputs(touched, n)
            has_touched = bool(touched)
        ch = self._chains
        (self._now_s, self._next_dt, self._act, self._act_rate, self._n_live, self._ent_n,
         n_done, last_s, ends, lasts, jobs, memo_out, self._rem, self._gid, self._tail_s, self._flow_job, self._ent_gid,
         self._ent_link, self._nxt, self._num_flows, chain_t, chain_j) = steps(
            lim, self._now_s, self._next_dt, self._act, self._act_rate, self._rem, self._gid, self._mult,
            self._group_bytes, self._acc, self._tail_s, self._flow_job, self._job_pending, self._job_end_s,
            self._job_last, self._ent_gid, self._ent_link, self._ent_n, self._in_ent, n, self._group_rate,
            self._cap, self._compact_min, self._scratch, self._l_map, self._g_mask, self._l_mask, self._l_load,
            self._l_resid, self._g_pos, self._g_len, self._g_live, self._head, self._nxt, self._n_live,
            _DONE_REL_EPS, stop_at_jobs, pre, changed, has_touched, full, thr, memo_g, memo_r, self._cm_keys,
            self._cm_where, self._cm_gm, self._cm_r, self._cm_state, stop_at_jobs and ch.n_slots > 0, ch.slot_of,
            ch.cs, ch.cb, ch.pg, ch.pf, self._num_flows, self._g_start, self._g_flat)
        if self._cm_state[2]:
            self._grow_compositions()
        if memo_out.shape[0] and arrival is not None and not arrival.memo:
            arrival.memo.append(memo_out)
            ch.memo_found(arrival)
        if chain_t.shape[0]:
            ch.memo_back()
            if self.on_chain is not None:
                self.on_chain(chain_t.tolist(), chain_j.tolist())
        if n_done:
            self._num_completed += int(n_done)
            self._last_completion_s = max(self._last_completion_s, float(last_s))
        if ends.shape[0]:
            for t, f, j in zip(ends.tolist(), lasts.tolist(), jobs.tolist(), strict=True):
                heapq.heappush(self._job_heap, (t, f, j))

    def _advance_fluid(self, to_s: float) -> None:
        if self._deferred and to_s == self._now_s:  # nothing happens by now (defer_rates): the rates can wait
            return
        self._ensure_rates()
        if self._act.size and self._now_s + self._next_dt <= to_s:
            steps = self._steps_kernel()
            if steps is not None:
                self._compiled_steps(steps, to_s, False)
            while self._act.size and self._now_s + self._next_dt <= to_s:
                self._step_event()
        if self._act.size and to_s > self._now_s:
            dt = to_s - self._now_s
            partial = self._k_partial
            if partial is not None:
                n = len(self._group_links)
                if self._acc.shape[0] < n:
                    self._acc = np.zeros(max(n, 2 * self._acc.shape[0]))
                self._next_dt = partial(dt, self._act, self._act_rate, self._rem, self._gid, self._group_bytes,
                                        self._acc)
                self._now_s = max(self._now_s, to_s)
                return
            act = self._act
            rem = self._rem[act]
            moved = np.minimum(self._act_rate * dt, rem)
            self._rem[act] = rem - moved
            self._account(moved)
            self._next_dt = float(np.min(self._rem[act] / self._act_rate))
        self._now_s = max(self._now_s, to_s)

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        """Progress every flow to ``to_s`` (recomputing rates at each internal completion) and return
        ``(completion time, tag)`` of the flows completed by ``to_s``, in time order (ties: start order)."""
        if not to_s >= self._now_s or not np.isfinite(to_s):
            raise ConfigError("to_s", f"cannot advance to {to_s} s from {self._now_s} s",
                              "advance to a finite time not before now_s (see next_event_s)")
        times, fids = self._pop_done(to_s)
        pop = self._tags.pop
        return [(t, pop(f)) for t, f in zip(times.tolist(), fids.tolist(), strict=True)]

    def advance_ids(self, to_s: float) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`advance`, with the completions as arrays ``(times, flow ids)`` (same order)."""
        if not to_s >= self._now_s or not np.isfinite(to_s):
            raise ConfigError("to_s", f"cannot advance to {to_s} s from {self._now_s} s",
                              "advance to a finite time not before now_s (see next_event_s)")
        return self._pop_done(to_s)

    def advance_jobs(self, to_s: float) -> list[tuple[float, int]]:
        """(``jobs=True``) Progress every flow to ``to_s`` and return ``(completion time, job)`` of the jobs
        completed by ``to_s``, in time order (ties: the order of their last flows' ids)."""
        if not to_s >= self._now_s or not np.isfinite(to_s):
            raise ConfigError("to_s", f"cannot advance to {to_s} s from {self._now_s} s",
                              "advance to a finite time not before now_s (see next_event_s)")
        self._advance_fluid(to_s)
        heap = self._job_heap
        out: list[tuple[float, int]] = []
        while heap and heap[0][0] <= to_s:
            t, _, j = heapq.heappop(heap)
            out.append((t, j))
        return out

    def _pop_done(self, to_s: float) -> tuple[np.ndarray, np.ndarray]:
        self._advance_fluid(to_s)
        done = self._done
        if not done or done[0][0] > to_s:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        parts_t: list[np.ndarray] = []
        parts_f: list[np.ndarray] = []
        later: list[tuple[np.ndarray, np.ndarray]] = []
        while done and done[0][0] <= to_s:
            _, _, times, fids = heapq.heappop(done)
            self._num_queued -= int(fids.shape[0])
            now = times <= to_s
            parts_t.append(times[now])
            parts_f.append(fids[now])
            if not bool(now.all()):
                later.append((times[~now], fids[~now]))
        for times, fids in later:
            self._push_done(times, fids)
        times = np.concatenate(parts_t)
        fids = np.concatenate(parts_f)
        order = np.lexsort((fids, times))
        return times[order], fids[order]

    def run(self) -> list[tuple[float, object]]:
        """Advance until every flow has completed; return all completions in time order."""
        out: list[tuple[float, object]] = []
        while (t := self.next_event_s()) < np.inf:
            out.extend(self.advance(t))
        return out
