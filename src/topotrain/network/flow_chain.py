"""The phases a job starts next in the compiled departure loop itself: a ring's steps, phase after phase.

A ring collective's 2(p−1) phases cross the same links with the same (source, destination) pairs, so every
phase after the first starts the same prepared batch (:class:`~topotrain.network.flow_rates.PreparedBatch`:
the same path groups and latencies) with its own sizes, at the instant the phase before it completes. Done
from Python (:class:`~topotrain.network.flow.FlowSim`), each such start costs a return from the compiled loop
(:func:`topotrain.network.flow_kernel._steps`), the engine's and FlowSim's bookkeeping, and three kernel calls:
tens of µs, at 20k phase starts per iteration of a 4,096-GPU model more than the loop's own work.

:class:`PhaseChains` holds, per job, the phases FlowSim has registered as its *chain*: the next phases that
start the very batch the running one started, on the very links (so starting them changes nothing outside the
network: no hold or provisional schedule can hold a link a running phase crosses), each with its sizes. When
the compiled loop stops at a job's completion ``t`` before the limit it was given (so neither the engine nor
FlowSim has anything else to do by ``t``), and every job completing at ``t`` has a chained phase left, the
loop does at ``t`` what FlowSim and :class:`~topotrain.network.flow_network.FlowNetwork` would: progresses the
flows to ``t`` (``_advance_fluid``'s last stretch), starts each job's next phase in the job heap's order
(time, last flow, job) as ``start_prepared`` does (the job's counts, flow ids from the flow count, the entries),
recomputes the rates after the arrivals with the batch's memo when one batch arrived alone (``_kernel_inputs``),
compacts as ``_recompute`` does, and goes on from the limit the next call would have had. The same operations on
the same values in the same order: the same bits. It stops instead where anything else would happen then: a
completion with no chained phase (a job's last phase, a phase on other links), or a full composition table
(Python grows it between calls). FlowSim replays what it keeps itself (the phase ends, the phase counters) from
the log the call returns (:meth:`~topotrain.network.flow_network.FlowNetwork._compiled_steps`).

The chains live in flat arrays the kernel reads and advances: per job its slot (``slot_of``); per slot
(``cs``) the batch, the next phase, the number of phases and the offset of their sizes; per batch (``cb``) the
offsets and lengths of its groups, sorted groups, latencies and memo rates in the pools ``pg`` (ints) and ``pf``
(floats), and whether the memo is known. A memo found in the loop is handed back to the batch (and one found in
Python handed to the pool), so both always offer the same memo.
"""

from __future__ import annotations

import numpy as np

from topotrain.network.flow_kernel import grown
from topotrain.network.flow_rates import PreparedBatch

_CS_COLS = 4  # batch, next phase, phases, sizes offset
_CB_COLS = 7  # groups offset, flows, sorted groups offset, their number (0: none), latencies offset,
#               memo offset, memo known
_POOL_MAX = 1 << 18  # values in the pools before they are rebuilt from the live chains alone


def _rows(a: np.ndarray, need: int) -> np.ndarray:
    """``a`` (2-D), or a copy with zero rows added to ``max(need, 2·rows, 16)`` when it has fewer than ``need``."""
    if need <= a.shape[0]:
        return a
    out = np.zeros((max(need, 2 * a.shape[0], 16), a.shape[1]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def _appended(pool: np.ndarray, n: int, values: np.ndarray) -> tuple[np.ndarray, int]:
    """``pool`` (grown if need be) with ``values`` written after its first ``n`` entries, and the new count."""
    end = n + values.shape[0]
    pool = grown(pool, end)
    pool[n:end] = values
    return pool, end


class PhaseChains:
    """The chained phases of a network's jobs (module docstring)."""

    def __init__(self) -> None:
        self.slot_of = np.full(0, -1, dtype=np.int64)
        self.batches: list[PreparedBatch] = []
        self._index: dict[int, int] = {}  # per batch (by id; the list holds it): its row in ``cb``
        self._sizes: list[np.ndarray] = []  # per slot: its phases' sizes, one row each
        self._jobs: list[int] = []  # per slot: its job
        self._no_memo: list[int] = []  # the batches whose memo is not known yet
        self.cs = np.zeros((0, _CS_COLS), dtype=np.int64)
        self.cb = np.zeros((0, _CB_COLS), dtype=np.int64)
        self.pg = np.zeros(0, dtype=np.int64)
        self.pf = np.zeros(0)
        self._bound = _POOL_MAX  # rebuilt past it (twice what the live chains hold, when more)
        self._clear()

    def _clear(self) -> None:
        """No chains (the arrays are kept, to be written over)."""
        self.n_slots = self.n_batches = self.n_g = self.n_f = 0
        self.slot_of[:] = -1
        self.batches.clear()
        self._index.clear()
        self._sizes.clear()
        self._jobs.clear()
        self._no_memo.clear()

    def live(self, job: int) -> int:
        """``job``'s slot when it has a chained phase left, else -1."""
        s = int(self.slot_of[job]) if job < self.slot_of.shape[0] else -1
        return s if s >= 0 and self.cs[s, 1] < self.cs[s, 2] else -1

    def took(self, job: int, batch: PreparedBatch) -> None:
        """``job`` started its next phase from Python: when that phase is chained, it is taken off its chain (a
        start of another batch, which FlowSim never makes, would drop the chain)."""
        s = self.live(job)
        if s >= 0:
            if self.batches[int(self.cs[s, 0])] is batch:
                self.cs[s, 1] += 1
            else:
                self.slot_of[job] = -1

    def add(self, job: int, batch: PreparedBatch, sizes: list[np.ndarray]) -> None:
        """Chain ``job``'s next phases: each starts ``batch`` with its sizes, in order."""
        if self.n_f + self.n_g > self._bound:
            self._rebuild()
        s = self.n_slots
        self.cs = _rows(self.cs, s + 1)
        flat = np.concatenate(sizes)
        self.cs[s] = (self._batch(batch), 0, len(sizes), self._put_f(flat))
        self.n_slots = s + 1
        if job >= self.slot_of.shape[0]:
            more = np.full(max(job + 1, 2 * self.slot_of.shape[0], 16), -1, dtype=np.int64)
            more[: self.slot_of.shape[0]] = self.slot_of
            self.slot_of = more
        self.slot_of[job] = s
        self._sizes.append(flat)
        self._jobs.append(job)

    def memo_found(self, batch: PreparedBatch) -> None:
        """``batch`` got its memo in Python: the pool offers it too."""
        b = self._index.get(id(batch))
        if b is not None and b in self._no_memo and batch.memo:
            ns = int(self.cb[b, 3])
            self.pf[self.cb[b, 5]:self.cb[b, 5] + ns] = batch.memo[0]
            self.cb[b, 6] = 1
            self._no_memo.remove(b)

    def memo_back(self) -> None:
        """The memos the compiled loop found go to their batches."""
        if self._no_memo:
            for b in [b for b in self._no_memo if self.cb[b, 6]]:
                self._no_memo.remove(b)
                batch = self.batches[b]
                if not batch.memo:
                    ns = int(self.cb[b, 3])
                    batch.memo.append(self.pf[self.cb[b, 5]:self.cb[b, 5] + ns].copy())

    def _batch(self, batch: PreparedBatch) -> int:
        b = self._index.get(id(batch))
        if b is not None:
            return b
        b = self.n_batches
        self.cb = _rows(self.cb, b + 1)
        n = batch.gids.shape[0]
        srt = batch.sorted_gids
        ns = 0 if srt is None else srt.shape[0]
        g_off = self._put_g(batch.gids)
        s_off = self._put_g(srt) if srt is not None else 0
        t_off = self._put_f(batch.tail_s)
        m_off = self._put_f(batch.memo[0] if batch.memo else np.zeros(ns))
        self.cb[b] = (g_off, n, s_off, ns, t_off, m_off, 1 if batch.memo else 0)
        if not batch.memo and ns:
            self._no_memo.append(b)
        self.n_batches = b + 1
        self.batches.append(batch)
        self._index[id(batch)] = b
        return b

    def _put_g(self, values: np.ndarray) -> int:
        """``values`` appended to the integer pool; their offset there."""
        at = self.n_g
        self.pg, self.n_g = _appended(self.pg, at, values)
        return at

    def _put_f(self, values: np.ndarray) -> int:
        """``values`` appended to the float pool; their offset there."""
        at = self.n_f
        self.pf, self.n_f = _appended(self.pf, at, values)
        return at

    def _rebuild(self) -> None:
        """The pools again, holding the chains with phases left alone."""
        live = []
        for s in range(self.n_slots):
            job = self._jobs[s]
            pos, m = int(self.cs[s, 1]), int(self.cs[s, 2])
            if pos < m and self.slot_of[job] == s:
                batch = self.batches[int(self.cs[s, 0])]
                n = batch.gids.shape[0]
                live.append((job, batch, [self._sizes[s][i * n:(i + 1) * n] for i in range(pos, m)]))
        self._clear()
        self._bound = 1 << 62  # (no rebuild while rebuilding)
        for job, batch, sizes in live:
            self.add(job, batch, sizes)
        self._bound = max(_POOL_MAX, 2 * (self.n_f + self.n_g))
