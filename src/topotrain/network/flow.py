"""Flow-level network model: max-min fair sharing of the real routed paths, event driven.

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

:class:`FlowNetwork` is the fluid core (start flows, ask for the next event, advance time).
:class:`FlowModel` is the ``flow`` network model; its :class:`FlowSim` (the engine-facing
:class:`~topotrain.network.base.NetworkSim`) advances every submitted schedule phase by phase in one shared
:class:`FlowNetwork`, so that concurrent collectives contend.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.collectives.paths import PhasePaths, path_cache
from topotrain.collectives.schedule import Phase, Schedule
from topotrain.network.base import AloneJobs, CollectiveResult, JobTiming, check_submit, run_alone, time_phases
from topotrain.network.flow_kernel import (
    compiled_lists,
    compiled_partial,
    compiled_recompute,
    compiled_step,
    compiled_steps,
)
from topotrain.network.flow_kernel import grown as _grow
from topotrain.network.maxmin import max_min_rates
from topotrain.network.params import NetworkParams
from topotrain.network.switching import on_fabric, store_forward_phases_s
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

#: no alone-rates memo to offer the compiled recompute (groups, rates)
_NO_MEMO = (np.zeros(0, dtype=np.int64), np.zeros(0))
#: the arguments of a compiled departure loop that recomputes nothing first
_NO_STEP_PRE: tuple[np.ndarray, np.ndarray, np.ndarray, None, bool, bool, float] = (
    np.zeros(0, dtype=np.int64), _NO_MEMO[0], _NO_MEMO[1], None, False, False, np.inf)

#: Flows whose last byte would leave within this relative distance of the next event leave with it.
_DONE_REL_EPS = 1e-12

#: The table of component compositions (flow_kernel._composition_find): its first slots and (group, flows) pairs
#: (small: every network has one, most never use it), and the most pairs it grows to (24 MB); past that, new
#: compositions are filled and not stored
_CM_SLOTS = 16
_CM_PAIRS = 256
_CM_MAX_PAIRS = 1 << 20


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch of flow paths grouped once by :meth:`FlowNetwork.prepare` (valid for that network only):
    each flow's path group, its path latency plus the per-message overhead (empty for the batches
    :meth:`FlowNetwork.start_many` keeps, which sum latencies per call), and whether no two flows share a
    group."""

    gids: np.ndarray
    tail_s: np.ndarray
    distinct: bool
    sorted_gids: np.ndarray | None  # the groups in ascending order when distinct
    #: the max-min rates of ``sorted_gids`` when they started with nothing else in their component (at most one
    #: array: a function of the batch alone, so every such start gets them without refilling)
    memo: list[np.ndarray] = field(default_factory=list)


class FlowNetwork:
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

    def __init__(self, topo: Topology, report: bool = True,
                 overhead_s: float = DEFAULT_MESSAGE_OVERHEAD_S, ids_only: bool = False,
                 jobs: bool = False) -> None:
        self.topo = topo
        self._report = report
        self._ids_only = ids_only or jobs
        self._jobs = jobs
        self._cap = topo.capacity_bytes_per_s
        self._lat = topo.latency_s
        self._overhead_s = float(overhead_s)
        self._num_links = topo.num_links
        # groups (distinct paths), kept by reset()
        self._group_of: dict[tuple[int, ...], int] = {}
        self._group_links: list[tuple[int, ...]] = []
        self._g_start = np.zeros(0, dtype=np.int64)  # group g's links: _g_flat[_g_start[g]:][:_g_len[g]]
        self._g_len = np.zeros(0, dtype=np.int64)
        self._g_flat = np.zeros(0, dtype=np.int64)
        self._g_flat_n = 0
        self._batch_gids: dict[bytes, PreparedBatch] = {}  # group ids of large start_many batches seen
        self._compact_min = 1024  # idle-group entries tolerated before the entry list is compacted
        # scratch arrays of the compiled recompute, each left as it was found by every call: -1 per group,
        # False per group, -1 / False / 0 / anything per link
        self._scratch = np.zeros(0, dtype=np.int64)
        self._g_mask = np.zeros(0, dtype=bool)
        self._l_map = np.zeros(0, dtype=np.int64)
        self._l_mask = np.zeros(0, dtype=bool)
        self._l_load = np.zeros(0)
        self._l_resid = np.zeros(0)
        self._acc = np.zeros(0)  # zeros per group, for the compiled step
        # the compiled kernels (flow_kernel), looked up once: all of them, or none (the numpy path)
        self._k_rc = compiled_recompute()
        self._k_step = compiled_step()
        if self._k_rc is None or self._k_step is None:
            self._k_rc = self._k_step = None
        self._k_lists = compiled_lists() if self._k_rc is not None else None
        self._k_partial = compiled_partial() if self._k_rc is not None else None
        self._k_steps = compiled_steps() if self._k_rc is not None and jobs else None
        # per link, the last entry on it (-1: none); the compiled kernels' link lists
        self._head = np.full(self._num_links if self._k_lists is not None else 0, -1, dtype=np.int64)
        # the compiled recomputation's table of component compositions and their rates
        # (flow_kernel._composition_find), kept by reset() like the path groups: hash slots, their (offset, count),
        # (group, flows) pairs, rates, and (pairs stored, slots used, pairs a store needed, lookups answered)
        on = self._k_rc is not None
        self._cm_keys = np.zeros(_CM_SLOTS if on else 0, dtype=np.uint64)
        self._cm_where = np.zeros(2 * self._cm_keys.shape[0], dtype=np.int64)
        self._cm_gm = np.zeros(2 * _CM_PAIRS if on else 0, dtype=np.int64)
        self._cm_r = np.zeros(_CM_PAIRS if on else 0)
        self._cm_state = np.zeros(4, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        """Forget every flow and return to time 0, as a fresh network; the path groups learnt so far are
        kept, so restarting the same traffic skips grouping it again, and so is the table of component
        compositions' rates (the same rates a filling would give, to rounding)."""
        self._last_completion_s = 0.0
        self._num_completed = 0
        self._now_s = 0.0
        num_groups = len(self._group_links)
        self._mult = np.zeros(num_groups, dtype=np.int64)
        self._group_rate = np.zeros(num_groups)
        self._in_ent = np.zeros(num_groups, dtype=bool)
        # incidence entries (group, link) of every group that may be active, each group's contiguous from
        # _g_pos[g]; compacted lazily. With the compiled kernels, _head / _nxt thread every entry onto its link's
        # list, _g_live is each group's liveness at the last rate computation and _n_live its live entries
        self._ent_gid = np.zeros(0, dtype=np.int64)
        self._ent_link = np.zeros(0, dtype=np.int64)
        self._ent_n = 0
        self._g_pos = np.zeros(num_groups, dtype=np.int64)
        self._g_live = np.zeros(num_groups, dtype=bool)
        self._nxt = np.zeros(0, dtype=np.int64)
        self._n_live = 0
        self._head.fill(-1)
        self._touched: list[np.ndarray] = []  # groups whose flows changed since the last rate computation
        self._arrival: PreparedBatch | None = None  # the prepared batch, when it is the only change since then
        self._group_bytes = np.zeros(num_groups)  # bytes each path group has carried (link bytes on demand)
        # flows
        self._num_flows = 0
        self._rem = np.zeros(0)
        self._gid = np.zeros(0, dtype=np.int64)
        self._tail_s = np.zeros(0)
        self._tags: dict[int, object] = {}  # tags of flows not yet reported
        self._act = np.zeros(0, dtype=np.int64)
        self._act_rate = np.zeros(0)
        self._next_dt = np.inf
        self._dirty = False
        self._full = True  # flows were added since the last rate computation: recompute every rate
        self._left_rate = np.inf  # lowest rate among flows that left since the last rate computation
        # completions not yet reported: a heap of (earliest time, seq, times, flow ids), one per batch
        self._done: list[tuple[float, int, np.ndarray, np.ndarray]] = []
        self._done_seq = 0
        self._num_queued = 0
        # jobs mode: each flow's job; per job its flows not yet sent, latest completion and that flow's id
        self._flow_job = np.zeros(0, dtype=np.int64)
        self._job_pending = np.zeros(0, dtype=np.int64)
        self._job_end_s = np.zeros(0)
        self._job_last = np.zeros(0, dtype=np.int64)
        self._job_heap: list[tuple[float, int, int]] = []  # (completion time, last flow id, job)

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
        return int(self._act.shape[0]) + self._num_queued + len(self._job_heap)

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
            self._job_counts(job, n)
            (self._rem, self._gid, self._tail_s, self._flow_job, self._act, self._ent_gid, self._ent_link, self._nxt,
             self._ent_n) = lists.start(
                gids, _NO_MEMO[0] if batch.sorted_gids is None else batch.sorted_gids, batch.tail_s, size, first, job,
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
        """Check a start's time and job (errors name the argument), and progress the network to ``now_s``."""
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

    def _grow_groups(self) -> None:
        """Per-group arrays sized for every group known."""
        num_groups = len(self._group_links)
        self._mult = _grow(self._mult, num_groups)
        self._group_rate = _grow(self._group_rate, num_groups)
        self._in_ent = _grow(self._in_ent, num_groups)
        self._g_pos = _grow(self._g_pos, num_groups)
        self._g_live = _grow(self._g_live, num_groups)
        self._group_bytes = _grow(self._group_bytes, num_groups)

    def _group_ids(self, off: np.ndarray, lk: np.ndarray, moving: np.ndarray) -> np.ndarray:
        """Group id (distinct path) of each flow ``moving`` of a CSR batch, creating groups as needed."""
        return self._grouped(off, lk, moving)[0]

    def _grouped(self, off: np.ndarray, lk: np.ndarray, moving: np.ndarray) -> tuple[np.ndarray, PreparedBatch | None]:
        """(:meth:`_group_ids`, and for a large batch whose flows all move, the batch as prepared once per distinct
        paths: repeated batches share it, and with it the memo of their rates alone)."""
        batch_key = b""
        if moving.shape[0] >= 64 and moving.shape[0] + 1 == off.shape[0]:
            batch_key = off.tobytes() + b"|" + lk.tobytes()
            hit = self._batch_gids.get(batch_key)
            if hit is not None:
                return hit.gids, hit
        lk_list = lk.tolist()
        off_list = off.tolist()
        gids = np.empty(moving.shape[0], dtype=np.int64)
        group_of = self._group_of
        group_links = self._group_links
        first_new = len(group_links)
        for j, i in enumerate(moving.tolist()):
            key = tuple(lk_list[off_list[i]:off_list[i + 1]])
            g = group_of.get(key)
            if g is None:
                g = group_of[key] = len(group_links)
                group_links.append(key)
            gids[j] = g
        if len(group_links) > first_new:
            new_paths = group_links[first_new:]
            lengths = np.fromiter((len(p) for p in new_paths), dtype=np.int64, count=len(new_paths))
            total = int(lengths.sum())
            num_groups = len(group_links)
            self._g_start = _grow(self._g_start, num_groups)
            self._g_len = _grow(self._g_len, num_groups)
            self._g_len[first_new:num_groups] = lengths
            starts = np.zeros(lengths.shape[0], dtype=np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            self._g_start[first_new:num_groups] = starts + self._g_flat_n
            self._g_flat = _grow(self._g_flat, self._g_flat_n + total)
            self._g_flat[self._g_flat_n:self._g_flat_n + total] = np.fromiter(
                (lid for p in new_paths for lid in p), dtype=np.int64, count=total)
            self._g_flat_n += total
        if batch_key:
            if len(self._batch_gids) >= 16:
                self._batch_gids.clear()
            distinct = bool(np.unique(gids).shape[0] == gids.shape[0])
            prep = self._batch_gids[batch_key] = PreparedBatch(gids, np.zeros(0), distinct,
                                                               np.sort(gids) if distinct else None)
            return gids, prep
        return gids, None

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

    def _activate_entries(self, gids: np.ndarray, distinct_sorted: bool = False) -> None:
        """Add the incidence entries of the groups among ``gids`` that have none (in group order);
        ``distinct_sorted``: ``gids`` are already distinct and ascending."""
        lists = self._k_lists
        if lists is not None:  # the same entries in one compiled pass, threaded onto their links' lists
            self._ent_gid, self._ent_link, self._nxt, self._ent_n = lists.activate(
                gids, distinct_sorted, self._in_ent, self._g_len, self._g_start, self._g_flat, self._ent_gid,
                self._ent_link, self._nxt, self._ent_n, self._g_pos, self._head)
            return
        new = gids[~self._in_ent[gids]]
        if new.size == 0:
            return
        if not distinct_sorted:
            new = np.unique(new)
        lengths = self._g_len[new]
        total = int(lengths.sum())
        need = self._ent_n + total
        self._ent_gid = _grow(self._ent_gid, need)
        self._ent_link = _grow(self._ent_link, need)
        self._ent_gid[self._ent_n:need] = np.repeat(new, lengths)
        offsets = np.zeros(lengths.shape[0], dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        idx = np.repeat(self._g_start[new] - offsets, lengths) + np.arange(total)
        self._ent_link[self._ent_n:need] = self._g_flat[idx]
        self._g_pos[new] = offsets + self._ent_n
        self._ent_n = need
        self._in_ent[new] = True

    # ---- rates ----------------------------------------------------------------------------------
    def _ensure_rates(self) -> None:
        if self._dirty:
            self._recompute()

    def _take_changes(self) -> tuple[list[np.ndarray], bool, float]:
        """(the groups changed, whether flows arrived, the lowest rate of the flows that left) since the last
        rate computation, which is now being made: the network forgets them."""
        self._dirty = False
        touched, self._touched = self._touched, []
        full, thr = self._full, self._left_rate
        self._full, self._left_rate = False, np.inf
        return touched, full, thr

    def _recompute(self) -> None:
        touched, full, thr = self._take_changes()
        num_groups = len(self._group_links)
        eg_all = self._ent_gid[: self._ent_n]
        el_all = self._ent_link[: self._ent_n]
        mult = self._mult[:num_groups]
        group_rate = self._group_rate[:num_groups]
        kernel = self._k_rc
        if kernel is not None:  # the same steps in one compiled call
            changed, memo_g, memo_r, arrival = self._kernel_inputs(touched, num_groups)
            self._n_live, self._act_rate, self._next_dt, memo_out = kernel(
                eg_all, el_all, mult, group_rate, self._cap, changed, bool(touched), full, thr, self._act, self._gid,
                self._rem, self._scratch, self._l_map, self._g_mask, self._l_mask, self._l_load, self._l_resid,
                memo_g, memo_r, self._in_ent, self._g_pos, self._g_len, self._g_live, self._head, self._nxt,
                self._n_live, self._cm_keys, self._cm_where, self._cm_gm, self._cm_r, self._cm_state)
            if self._cm_state[2]:
                self._grow_compositions()
            if memo_out.shape[0] and arrival is not None and not arrival.memo:
                arrival.memo.append(memo_out)
            self._compact_entries(int(self._n_live))
            return
        eg, el = eg_all, el_all
        live = mult[eg] > 0
        n_live = int(np.count_nonzero(live))
        if n_live < self._ent_n:
            eg, el = eg[live], el[live]
        if self._act.size == 0:
            group_rate[:] = 0.0
            self._act_rate = np.zeros(0)
            self._next_dt = np.inf
        else:
            comp = self._component(np.concatenate(touched) if touched else None, eg_all, el_all, eg, el,
                                   num_groups)  # repeats in ``changed`` are harmless: it only sets a mask
            if comp is not None:
                eg, el = eg[comp], el[comp]
            self._refill(eg, el, mult, group_rate, full, thr)
            self._act_rate = group_rate[self._gid[self._act]]
            self._next_dt = float(np.min(self._rem[self._act] / self._act_rate))
        self._compact_entries(n_live)

    def _kernel_inputs(self, touched: list[np.ndarray], num_groups: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, PreparedBatch | None]:
        """What the compiled recomputation takes besides the network's arrays: (the changed groups, the memo's
        groups and rates, the arrival batch they belong to); the scratch arrays are sized for every group."""
        changed = np.concatenate(touched) if touched else np.zeros(0, dtype=np.int64)
        if self._scratch.shape[0] < num_groups:
            size = max(num_groups, 2 * self._scratch.shape[0])
            self._scratch = np.full(size, -1, dtype=np.int64)
            self._g_mask = np.zeros(size, dtype=bool)
        if self._l_map.shape[0] == 0:  # per-link scratch, made on the first use
            n_l = self._num_links
            self._l_map = np.full(n_l, -1, dtype=np.int64)
            self._l_mask = np.zeros(n_l, dtype=bool)
            self._l_load = np.zeros(n_l)
            self._l_resid = np.zeros(n_l)
        arrival, self._arrival = self._arrival, None
        memo_g, memo_r = _NO_MEMO
        if arrival is not None and len(touched) == 1 and arrival.sorted_gids is not None:
            memo_g = arrival.sorted_gids
            memo_r = arrival.memo[0] if arrival.memo else _NO_MEMO[1]
        return changed, memo_g, memo_r, arrival

    def _grow_compositions(self) -> None:
        """Room for the composition the compiled recomputation could not store (it is stored the next time it is
        filled): the pairs it needed, at least twice as many (up to ``_CM_MAX_PAIRS``: past it the table stays as
        it is), and, when half the slots are used, twice the slots (the stored keys placed again)."""
        need = int(self._cm_state[2])
        self._cm_state[2] = 0
        pairs = self._cm_r.shape[0]
        if pairs < _CM_MAX_PAIRS and need <= _CM_MAX_PAIRS:
            size = min(max(need, 2 * pairs), _CM_MAX_PAIRS)  # exactly (grown's doubling could pass the bound)
            self._cm_r = np.concatenate([self._cm_r, np.zeros(size - pairs)])
            self._cm_gm = np.concatenate([self._cm_gm, np.zeros(2 * (size - pairs), dtype=np.int64)])
        slots = self._cm_keys.shape[0]
        if 2 * (int(self._cm_state[1]) + 1) > slots and self._cm_r.shape[0] > pairs:
            keys = np.zeros(2 * slots, dtype=np.uint64)
            where = np.zeros(4 * slots, dtype=np.int64)
            mask = 2 * slots - 1
            for i in np.flatnonzero(self._cm_keys).tolist():
                h = int(self._cm_keys[i])
                j = h & mask
                while keys[j]:
                    j = (j + 1) & mask
                keys[j] = h
                where[2 * j:2 * j + 2] = self._cm_where[2 * i:2 * i + 2]
            self._cm_keys, self._cm_where = keys, where

    def _compact_entries(self, n_live: int) -> None:
        """Forget the entries of idle groups once they outnumber the live ones (and a floor), keeping the
        live ones in entry order."""
        if n_live < self._ent_n and self._ent_n - n_live > max(n_live, self._compact_min):
            lists = self._k_lists
            if lists is not None:  # the link lists and group positions follow
                self._ent_n = lists.compact(self._ent_gid, self._ent_link, self._ent_n, self._mult, self._in_ent,
                                       self._head, self._nxt, self._g_pos)
                return
            eg, el = self._ent_gid[: self._ent_n], self._ent_link[: self._ent_n]
            live = self._mult[eg] > 0
            keep_g, keep_l = eg[live], el[live]
            self._ent_gid[:n_live] = keep_g
            self._ent_link[:n_live] = keep_l
            self._ent_n = n_live
            self._in_ent[:] = False
            self._in_ent[keep_g] = True
            if n_live:
                first = np.flatnonzero(np.r_[True, keep_g[1:] != keep_g[:-1]])
                self._g_pos[keep_g[first]] = first

    def _component(self, changed: np.ndarray | None, eg_all: np.ndarray, el_all: np.ndarray, eg: np.ndarray,
                   el: np.ndarray, num_groups: int) -> np.ndarray | None:
        """Mask of the live entries in the connected component (groups joined by shared links) of the groups
        ``changed`` since the last rate computation, or None for all of them.

        Max-min fairness decomposes over connected components of the flow-link graph: progressive filling
        inside one component never looks at a link or a flow outside it. So an arrival or a departure
        changes only the rates of its own component (the links of departed groups seed the search: the
        flows that shared them may speed up), and the rest stand as computed."""
        if changed is None:
            return None
        g_mask = np.zeros(num_groups, dtype=bool)
        g_mask[changed] = True
        l_mask = np.zeros(self._num_links, dtype=bool)
        l_mask[el_all[g_mask[eg_all]]] = True
        n_links = int(np.count_nonzero(l_mask))
        while True:
            g_mask[eg[l_mask[el]]] = True
            l_mask[el[g_mask[eg]]] = True
            n = int(np.count_nonzero(l_mask))
            if n == n_links:
                break
            n_links = n
        sel = g_mask[eg]
        return None if bool(sel.all()) else sel

    def _refill(self, eg: np.ndarray, el: np.ndarray, mult: np.ndarray, group_rate: np.ndarray, full: bool,
                thr: float) -> None:
        """Max-min rates of the groups of entries (eg, el) — a union of whole components — into group_rate."""
        num_groups = mult.shape[0]
        weight = mult.astype(np.float64)
        rates = None
        if not full:
            # Departures only. A flow that leaves at rate r changes no rate below r (during progressive
            # filling its links saturate no earlier without it, and nothing else changes below r), so
            # only the flows at or above r are refilled, over the capacity the others leave.
            redo = group_rate[eg] >= thr * (1.0 - 1e-6)
            if not bool(redo.all()):
                fixed = ~redo
                load = np.bincount(el[fixed], weights=(group_rate * weight)[eg[fixed]],
                                   minlength=self._num_links)
                resid = np.maximum(self._cap - load, 0.0)
                part = max_min_rates(eg[redo], el[redo], num_groups, resid, weight=weight)
                rates = np.where(np.isfinite(part), part, group_rate)
                if not bool(np.all(rates[eg] > 0)):
                    rates = None  # rounding left a refilled flow nothing: do it all again
        if rates is None:
            rates = max_min_rates(eg, el, num_groups, self._cap, weight=weight)
        gs = np.zeros(num_groups, dtype=bool)  # the groups refilled (a mask: no sort of the entries)
        gs[eg] = True
        group_rate[gs] = rates[gs]
        group_rate[mult == 0] = 0.0

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
        (self._now_s, self._next_dt, self._act, self._act_rate, self._n_live, self._ent_n,
         n_done, last_s, ends, lasts, jobs, memo_out) = steps(
            lim, self._now_s, self._next_dt, self._act, self._act_rate, self._rem, self._gid, self._mult,
            self._group_bytes, self._acc, self._tail_s, self._flow_job, self._job_pending, self._job_end_s,
            self._job_last, self._ent_gid, self._ent_link, self._ent_n, self._in_ent, n, self._group_rate,
            self._cap, self._compact_min, self._scratch, self._l_map, self._g_mask, self._l_mask, self._l_load,
            self._l_resid, self._g_pos, self._g_len, self._g_live, self._head, self._nxt, self._n_live,
            _DONE_REL_EPS, stop_at_jobs, pre, changed, has_touched, full, thr, memo_g, memo_r, self._cm_keys,
            self._cm_where, self._cm_gm, self._cm_r, self._cm_state)
        if self._cm_state[2]:
            self._grow_compositions()
        if memo_out.shape[0] and arrival is not None and not arrival.memo:
            arrival.memo.append(memo_out)
        self._num_completed += int(n_done)
        if n_done:
            self._last_completion_s = max(self._last_completion_s, float(last_s))
        for t, f, j in zip(ends.tolist(), lasts.tolist(), jobs.tolist(), strict=True):
            heapq.heappush(self._job_heap, (t, f, j))

    def _advance_fluid(self, to_s: float) -> None:
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


# ---- the "flow" NetworkModel ------------------------------------------------------------------------
def _without_local(pp: PhasePaths) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (offsets, links, bytes) of a phase's transfers that cross links (to oneself costs nothing)."""
    lengths = np.diff(pp.offsets)
    keep = np.flatnonzero(lengths > 0)
    if keep.shape[0] == pp.num_transfers:
        return pp.offsets, pp.links, pp.bytes
    lengths = lengths[keep]
    off = np.zeros(keep.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    sel = np.repeat(pp.offsets[:-1][keep] - off[:-1], lengths) + np.arange(int(off[-1]))
    return off, pp.links[sel], pp.bytes[keep]


class _PairPaths:
    """Resolved phases of one schedule, reusing the paths of phases with the same (src, dst) pairs."""

    def __init__(self, topo: Topology, schedule: Schedule) -> None:
        self.schedule = schedule
        self.cache = path_cache(topo, schedule.ranks)
        self.by_pairs: dict[bytes, PhasePaths] = {}
        self.batches: dict[bytes, tuple[np.ndarray | None, PreparedBatch | None]] = {}
        self.pair_keys: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, bytes]] = {}
        #: per phase (by id; the entry holds the phase): what ``launch`` needs of it
        self.launches: dict[int, tuple[Phase, PreparedBatch | None, np.ndarray, bool]] = {}

    def resolve(self, phase: Phase) -> tuple[bytes, PhasePaths]:
        pairs = phase.src.tobytes() + b"|" + phase.dst.tobytes()
        base = self.by_pairs.get(pairs)
        if base is None:
            pp = self.cache.resolve(self.schedule, phase)
            if len(self.by_pairs) >= 64:
                self.by_pairs.clear()
            self.by_pairs[pairs] = pp
            return pairs, pp
        return pairs, PhasePaths(base.offsets, base.links, base.latency_s,
                                 self.schedule.transfer_bytes(phase).astype(np.float64))

    def launch(self, phase: Phase, net: FlowNetwork) -> tuple[PreparedBatch | None, np.ndarray, bool]:
        """:meth:`prepared`, and whether every size is positive and finite, once per phase (a schedule submitted again
        starts the same phases: pipeline sends, one bucket's collective every iteration)."""
        hit = self.launches.get(id(phase))
        if hit is None:
            batch, sizes = self.prepared(phase, net)
            if len(self.launches) >= 4096:
                self.launches.clear()
            ok = bool(sizes.shape[0] and sizes.min() > 0.0 and np.isfinite(sizes.max()))
            hit = self.launches[id(phase)] = (phase, batch, sizes, ok)
        return hit[1], hit[2], hit[3]

    def prepared(self, phase: Phase, net: FlowNetwork) -> tuple[PreparedBatch | None, np.ndarray]:
        """(the phase's transfers that cross links, grouped in ``net`` once per pair signature — None when
        none does —, their sizes in bytes). ``net`` must be the same network at every call."""
        # phases of one pattern share their src/dst arrays: their key is made once (the entry holds the arrays,
        # so no other array can take their ids while it is kept)
        known = self.pair_keys.get((id(phase.src), id(phase.dst)))
        if known is None:
            if len(self.pair_keys) >= 4096:
                self.pair_keys.clear()
            known = self.pair_keys[(id(phase.src), id(phase.dst))] = (
                phase.src, phase.dst, phase.src.tobytes() + b"|" + phase.dst.tobytes())
        pairs = known[2]
        hit = self.batches.get(pairs)
        if hit is None:
            pp = self.resolve(phase)[1]
            keep = np.flatnonzero(np.diff(pp.offsets) > 0)
            off, links, _ = _without_local(pp)
            hit = (None if keep.shape[0] == pp.num_transfers else keep,
                   net.prepare(off, links) if keep.size else None)
            if len(self.batches) >= 64:
                self.batches.clear()
            self.batches[pairs] = hit
        sizes = self.schedule.transfer_bytes(phase).astype(np.float64)
        return hit[1], sizes if hit[0] is None else sizes[hit[0]]


def phase_time_flow(pp: PhasePaths, topo: Topology, net: FlowNetwork) -> tuple[float, np.ndarray]:
    """(time, bytes per directed link) of one resolved phase whose transfers all start at 0, alone, on
    ``net`` (a ``report=False`` network of ``topo`` with the model's overhead; it is reset first)."""
    link_bytes = np.bincount(pp.links, weights=pp.bytes[pp.entry_transfer()], minlength=topo.num_links)
    if pp.links.size == 0:
        return 0.0, link_bytes
    net.reset()
    off, links, sizes = _without_local(pp)
    net.start_many(off, links, sizes, 0.0)
    net.run()
    return net.last_completion_s, link_bytes


class FlowModel:
    """Flow-level timing of a Schedule: max-min fair sharing on the routed paths, phase by phase.

    Phases run one after another (a barrier between them); the transfers of a phase all start together
    and the phase ends when its last transfer completes. Timed alone (:meth:`time_alone`), phases with the
    same :func:`phase_key` are simulated once and reused. This is exact, not an approximation: a phase that
    runs alone, from an idle network, depends only on who sends how many bytes to whom (the paths follow
    from the pairs), never on which chunks the bytes are. A ring allreduce with equal chunks costs one
    simulation, not 2(p−1). Phases with the same (source, destination) pairs but other sizes (a ring whose
    chunks differ by a byte) still reuse the resolved paths and their path groups. Schedules that share
    the network (:class:`FlowSim`) advance phase by phase in one :class:`FlowNetwork` and contend.
    """

    name = "flow"
    contends = True

    def __init__(self, params: NetworkParams | None = None) -> None:
        self.params = params if params is not None else NetworkParams()

    def time_alone(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        """The schedule with nothing else on the network, phase by phase, identical phases simulated once; on a
        packet fabric (:attr:`NetworkParams.fabric`), its framed schedule, each phase plus its store-and-forward
        term (:mod:`topotrain.network.switching`)."""
        extra = None
        if not self.params.fabric.is_cut_through:
            schedule, extra = on_fabric(schedule, topo, self.params.fabric)
        paths = _PairPaths(topo, schedule)
        nets: dict[bytes, FlowNetwork] = {}  # one per pair signature, so its path groups are reused
        overhead = self.params.message_overhead_s

        def one(phase: Phase) -> tuple[float, np.ndarray]:
            pairs, pp = paths.resolve(phase)
            net = nets.get(pairs)
            if net is None:
                if len(nets) >= 64:
                    nets.clear()
                net = nets[pairs] = FlowNetwork(topo, report=False, overhead_s=overhead)
            return phase_time_flow(pp, topo, net)

        return time_phases(self.name, schedule, topo, one, extra)

    def open(self, topo: Topology) -> FlowSim:
        return FlowSim(self, topo)

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        return run_alone(self, schedule, topo)


@dataclass(eq=False)
class _BarrierJob:
    """A submitted schedule advancing phase by phase in the shared network."""

    tag: object
    schedule: Schedule
    paths: _PairPaths
    start_s: float
    phase_end_s: np.ndarray
    phase: int = 0
    #: on a store-and-forward fabric, each phase's term: phase ``k+1`` (or the completion) waits it after phase
    #: ``k``'s fluid completion
    extra_s: np.ndarray | None = None


class SharedFlowSim:
    """What the simulators over one shared :class:`FlowNetwork` have in common: the network, the
    ``alone`` submissions (timed once per key by ``time_alone``), the finished jobs' timings and link bytes."""

    def __init__(self, topo: Topology, net: FlowNetwork, time_alone: Callable[[Schedule], CollectiveResult]) -> None:
        self.topo = topo
        self.net = net
        self._alone = AloneJobs(time_alone, topo.num_links)
        self._timings: dict[object, JobTiming] = {}
        self._next_id = 0

    def _take_id(self) -> int:
        jid = self._next_id
        self._next_id += 1
        return jid

    def alone(self, schedule: Schedule, key: str | None = None) -> CollectiveResult:
        return self._alone.result(schedule, key)

    def timing(self, tag: object) -> JobTiming:
        hit = self._timings.get(tag)
        return hit if hit is not None else self._alone.timing(tag)

    def link_bytes(self) -> np.ndarray:
        return self.net.link_bytes() + self._alone.link_bytes


class FlowSim(SharedFlowSim):
    """:class:`~topotrain.network.base.NetworkSim` of the ``flow`` model: every schedule submitted without
    ``alone`` advances phase by phase (phase ``k+1`` starts when its phase ``k`` has completed) while the
    flows of all of them share one :class:`FlowNetwork`; ``alone`` submissions are timed by
    :meth:`FlowModel.time_alone` once per key.

    On a packet fabric (:attr:`NetworkParams.fabric`, not cut-through) a schedule's framed phases run in the
    network, and phase ``k+1`` (or the schedule's completion) starts its phase ``k``'s store-and-forward term
    after phase ``k``'s fluid completion (a heap of these delayed launches, processed in time order), so a
    schedule alone in the network takes what :meth:`FlowModel.time_alone` gives. One exception: a negative
    term (an incast on paths of unequal latency can have one, of the order of a latency) cannot start the next
    phase before the network's present, so here it counts as 0 (the schedule then ends up to that much later
    than alone)."""

    def __init__(self, model: FlowModel, topo: Topology) -> None:
        super().__init__(topo, FlowNetwork(topo, overhead_s=model.params.message_overhead_s, jobs=True),
                         lambda s: model.time_alone(s, topo))
        self._jobs: dict[int, _BarrierJob] = {}
        self._paths: dict[str, _PairPaths] = {}
        self._ready: list[tuple[float, int, object]] = []  # schedules with nothing to send: done at once
        fabric = model.params.fabric
        self._fabric = None if fabric.is_cut_through else fabric
        self._delayed: list[tuple[float, int, int]] = []  # (time, seq, job): a phase's launch after its term
        self._delayed_seq = 0
        self._fabric_memo: dict[str, tuple[Schedule, np.ndarray | None]] = {}

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        check_submit(at_s, self.net.now_s)
        if alone:
            self._alone.submit(schedule, at_s, tag, key)
            return
        extra = None
        if self._fabric is not None:
            schedule, extra = self._on_fabric(schedule, key)
        paths = self._paths.get(key) if key is not None else None
        if paths is None:
            paths = _PairPaths(self.topo, schedule)
            if key is not None:
                self._paths[key] = paths
        jid = self._take_id()
        job = _BarrierJob(tag, schedule, paths, at_s, np.zeros(len(schedule.phases)), extra_s=extra)
        self._jobs[jid] = job
        if not self._launch(jid, at_s):
            self._complete(jid, at_s)
            heapq.heappush(self._ready, (at_s, jid, tag))

    def _on_fabric(self, schedule: Schedule, key: str | None) -> tuple[Schedule, np.ndarray | None]:
        """(the framed schedule, each phase's store-and-forward term or None), once per key."""
        hit = self._fabric_memo.get(key) if key is not None else None
        if hit is None:
            assert self._fabric is not None
            framed = on_fabric(schedule, self.topo, self._fabric)[0]
            extra = (store_forward_phases_s(schedule, self.topo, self._fabric)
                     if self._fabric.store_and_forward else None)
            hit = (framed, extra)
            if key is not None:
                self._fabric_memo[key] = hit
        return hit

    def _launch(self, jid: int, t: float) -> bool:
        """Start job ``jid``'s next phase that crosses links at ``t`` (phases of local copies end at once);
        False when no phase is left."""
        job = self._jobs[jid]
        phases = job.schedule.phases
        while job.phase < len(phases):
            batch, sizes, sendable = job.paths.launch(phases[job.phase], self.net)
            if batch is not None:
                if sendable:  # every size positive and finite
                    self.net.start_prepared(batch, sizes, t, job=jid, checked=True)
                else:  # empty messages complete at once: the general path
                    off, links, sizes = _without_local(job.paths.resolve(phases[job.phase])[1])
                    self.net.start_many(off, links, sizes, t, job=jid)
                return True
            job.phase_end_s[job.phase] = t
            job.phase += 1
        return False

    def _complete(self, jid: int, t: float) -> None:
        job = self._jobs.pop(jid)
        self._timings[job.tag] = JobTiming(job.start_s, t, job.phase_end_s)

    def next_event_s(self, horizon_s: float | None = None) -> float:
        t = self._alone.next_event_s()
        if self._ready:
            t = min(t, self._ready[0][0])
        if self._delayed:
            t = min(t, self._delayed[0][0])
        return min(t, self.net.next_event_s(None if horizon_s is None else min(horizon_s, t)))

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        out: list[tuple[float, object]] = []
        while (t := self.next_event_s(to_s)) <= to_s:
            for t_done, jid in self.net.advance_jobs(t):
                job = self._jobs[jid]
                if job.extra_s is not None:  # a store-and-forward fabric: the next phase waits this one's term
                    t_next = t_done + max(float(job.extra_s[job.phase]), 0.0)  # never a launch in the past
                    job.phase_end_s[job.phase] = t_next
                    job.phase += 1
                    heapq.heappush(self._delayed, (t_next, self._delayed_seq, jid))
                    self._delayed_seq += 1
                    continue
                job.phase_end_s[job.phase] = t_done
                job.phase += 1
                if not self._launch(jid, t_done):
                    self._complete(jid, t_done)
                    out.append((t_done, job.tag))
            while self._delayed and self._delayed[0][0] <= t:
                t_d, _, jid = heapq.heappop(self._delayed)
                job = self._jobs[jid]
                if not self._launch(jid, t_d):
                    self._complete(jid, t_d)
                    out.append((t_d, job.tag))
            out.extend(self._alone.pop_until(t))
            while self._ready and self._ready[0][0] <= t:
                t_r, _, tag = heapq.heappop(self._ready)
                out.append((t_r, tag))
        self.net.advance_jobs(to_s)
        return out
