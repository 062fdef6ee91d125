"""The state of a :class:`~topotrain.network.flow_network.FlowNetwork` and the max-min fair rates it implies.

:class:`FlowRates` holds what the fluid network knows (its path groups: flows on identical paths form one group,
weighted by its number of active flows; their incidence entries (group, link); the flows; the jobs) and computes
the flows' rates from it: max-min fairness by progressive filling (:func:`topotrain.network.maxmin.max_min_rates`,
after Bertsekas & Gallager, *Data Networks*, §6.5). Rates are recomputed lazily, once per change of the active
set, and only in the connected component (groups joined by shared links) of what changed, since max-min fairness
decomposes over the components of the flow-link graph; when flows only leave, only the flows at or above the
lowest departed rate are refilled. The compiled kernels (:mod:`topotrain.network.flow_kernel`) run the same steps
in one call.

It is the lower half of :class:`~topotrain.network.flow_network.FlowNetwork` (its base class), which adds the
driving API on top: starting flows, advancing time, reporting completions. The split keeps the rate computation,
the part the kernels mirror, in a module of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.network.flow_kernel import grown as _grow
from topotrain.network.kernel_choice import KernelSet, budget_left, choose, compiled
from topotrain.network.maxmin import max_min_rates
from topotrain.network.port_arbitration import check_arbitration, port_fair_rates, port_links
from topotrain.topology.graph import Topology

#: no alone-rates memo to offer the compiled recompute (groups, rates)
NO_MEMO = (np.zeros(0, dtype=np.int64), np.zeros(0))

#: The table of component compositions (flow_kernel._composition_find): its first slots and (group, flows) pairs
#: (small: every network has one, most never use it), and the most pairs it grows to (24 MB); past that, new
#: compositions are filled and not stored
_CM_SLOTS = 16
_CM_PAIRS = 256
_CM_MAX_PAIRS = 1 << 20


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch of flow paths grouped once by :meth:`~topotrain.network.flow_network.FlowNetwork.prepare` (valid
    for that network only): each flow's path group, its path latency plus the per-message overhead (empty for the
    batches :meth:`~topotrain.network.flow_network.FlowNetwork.start_many` keeps, which sum latencies per call),
    and whether no two flows share a group."""

    gids: np.ndarray
    tail_s: np.ndarray
    distinct: bool
    sorted_gids: np.ndarray | None  # the groups in ascending order when distinct
    #: the max-min rates of ``sorted_gids`` when they started with nothing else in their component (at most one
    #: array: a function of the batch alone, so every such start gets them without refilling)
    memo: list[np.ndarray] = field(default_factory=list)


class FlowRates:
    """The state of a :class:`~topotrain.network.flow_network.FlowNetwork` (path groups, their incidence entries,
    flows, jobs) and the max-min rates it implies (module docstring). The constructor's arguments are
    FlowNetwork's (see there); the class is not used on its own. ``arbitration="port"`` shares PCIe links per
    input port (:mod:`topotrain.network.port_arbitration`, computed with numpy and Python: the compiled kernels
    fill per flow)."""

    def __init__(self, topo: Topology, report: bool = True,
                 overhead_s: float = DEFAULT_MESSAGE_OVERHEAD_S, ids_only: bool = False,
                 jobs: bool = False, arbitration: str = "flow") -> None:
        self.topo = topo
        # per link, whether it shares per input port (arbitration "port"), else None: max-min per flow
        self._port = port_links(topo.link_kinds()) if check_arbitration(arbitration) == "port" else None
        #: rounds and fallback steps of the per-port allocations made (port_arbitration.port_fair_rates)
        self.port_stats: dict[str, int] = {}
        self._report = report
        self._ids_only = ids_only or jobs
        self._jobs = jobs
        self._cap = topo.capacity_bytes_per_s
        top = float(self._cap.max()) if self._cap.shape[0] else 0.0
        # twice the largest link capacity (bytes/s): above any flow's rate (0: a capacity is not finite)
        self._rate_bound = 2.0 * top if np.isfinite(top) else 0.0
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
        # the kernels (flow_kernel), interpreted or compiled (kernel_choice): all of them, or none (the numpy path)
        self._use_kernels(choose() if self._port is None else None)  # the kernels fill per flow
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

    def _use_kernels(self, ks: KernelSet | None) -> None:
        """Run the events with the kernels ``ks`` (None: the numpy path), from the next one on."""
        self._k_interpreted = ks is not None and not ks.compiled
        self._k_rc = ks.recompute if ks is not None else None
        self._k_step = ks.step if ks is not None else None
        self._k_lists = ks.lists if ks is not None else None
        self._k_partial = ks.partial if ks is not None else None
        self._k_steps = ks.steps if ks is not None and self._jobs else None

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
        self._deferred = False  # a rate computation left for the next stepping call (FlowNetwork.defer_rates)
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

    # ---- path groups and their incidence entries ---------------------------------------------
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
        self._deferred = False
        touched, self._touched = self._touched, []
        full, thr = self._full, self._left_rate
        self._full, self._left_rate = False, np.inf
        return touched, full, thr

    def _recompute(self) -> None:
        if self._k_interpreted and not budget_left():  # the same arithmetic compiled from here on
            ks = compiled()
            if ks is not None:
                self._use_kernels(ks)
            self._k_interpreted = False
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
                self._memo_stored(arrival)
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

    def _memo_stored(self, batch: PreparedBatch) -> None:
        """``batch`` has just got its memo rates (FlowNetwork's chained phases offer them too)."""

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
        memo_g, memo_r = NO_MEMO
        if arrival is not None and len(touched) == 1 and arrival.sorted_gids is not None:
            memo_g = arrival.sorted_gids
            memo_r = arrival.memo[0] if arrival.memo else NO_MEMO[1]
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
        if self._port is not None:  # per input port: the whole component again (no departure shortcut)
            gs_used = np.unique(eg)
            group_rate[gs_used] = port_fair_rates([self._group_links[g] for g in gs_used.tolist()],
                                                  mult[gs_used], self._cap, self._port, self.port_stats)
            group_rate[mult == 0] = 0.0
            return
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
