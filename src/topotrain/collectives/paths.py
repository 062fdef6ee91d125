"""A schedule's transfers resolved onto the topology's routed links: :class:`PhasePaths` (one phase in CSR
form) and :class:`PathCache` (every rank pair of a rank tuple routed once, shared per topology).

Every network model and the wire-protocol rule (:mod:`topotrain.collectives.protocol`) read routes through
here, so a pair is routed once per process however many schedules, buckets or points ask for it.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import numpy as np

from topotrain.collectives.schedule import Phase, Schedule
from topotrain.topology.graph import Topology


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

    def link_bytes(self, num_links: int) -> np.ndarray:
        """Bytes the phase puts on each of ``num_links`` directed links (every transfer's bytes on each of its)."""
        return np.bincount(self.links, weights=self.bytes[self.entry_transfer()], minlength=num_links)


#: Rank counts up to which a pair's path index is kept in a dense p×p table (8 bytes per pair: 2 MiB at 512) instead
#: of a dict (caches are shared per topology and rank tuple, so the table must stay small).
_DENSE_PAIRS_MAX_RANKS = 512


class PathCache:
    """Routes of rank pairs of one (schedule ranks, topology), as numpy arrays: every pair is routed once, its
    links appended to one flat array; a phase's paths are then gathered from it with numpy (no Python step
    per link). The topology is held weakly: the shared caches of :func:`path_cache` are values of a
    weak-keyed dict, and a value that held its key would keep every topology (and its routes) alive."""

    def __init__(self, topo: Topology, ranks: tuple[str, ...]) -> None:
        self._topo = weakref.ref(topo)
        self.ranks = ranks
        p = len(ranks)
        self._p = p
        self._dense = np.full(p * p, -1, dtype=np.int64) if p <= _DENSE_PAIRS_MAX_RANKS else None
        # beyond the dense table: the pairs seen, sorted by key, and their indices (a searchsorted, not a dict:
        # no Python step per transfer, 16 bytes per pair)
        self._keys = np.zeros(0, dtype=np.int64)
        self._ids = np.zeros(0, dtype=np.int64)
        self._start = np.zeros(16, dtype=np.int64)  # pair index -> its links in _flat
        self._len = np.zeros(16, dtype=np.int64)
        self._flat = np.zeros(64, dtype=np.int64)
        self._n_pairs = 0
        self._n_flat = 0
        #: resolved (offsets, links, latency) per phase (src, dst) array objects, which it holds so that their
        #: ids stay theirs: a ring's phases share one pair of arrays, their sizes rotating (chunks a byte apart)
        self._phase_memo: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                      np.ndarray]] = {}

    @property
    def topo(self) -> Topology:
        """The topology these routes are on (alive as long as its caller holds it)."""
        topo = self._topo()
        if topo is None:
            raise ReferenceError("the topology of this PathCache no longer exists")
        return topo

    def _pair_index(self, keys: np.ndarray) -> np.ndarray:
        if self._dense is not None:
            return self._dense[keys]
        if self._keys.size == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        return np.where(self._keys[pos] == keys, self._ids[pos], -1)

    def _add(self, keys: np.ndarray) -> None:
        """Route the pairs ``keys`` (``src·p + dst``, distinct) and append their links."""
        ranks = self.ranks
        p = self._p
        paths = self.topo.router.route_many([(ranks[k // p], ranks[k % p]) for k in keys.tolist()], keep=False)
        lengths = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
        total = int(lengths.sum())
        n0, f0 = self._n_pairs, self._n_flat
        n1, f1 = n0 + len(paths), f0 + total
        if n1 > self._start.shape[0]:
            self._start = np.resize(self._start, max(n1, 2 * self._start.shape[0]))
            self._len = np.resize(self._len, self._start.shape[0])
        if f1 > self._flat.shape[0]:
            self._flat = np.resize(self._flat, max(f1, 2 * self._flat.shape[0]))
        self._len[n0:n1] = lengths
        starts = np.zeros(len(paths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        self._start[n0:n1] = starts + f0
        self._flat[f0:f1] = np.fromiter(itertools.chain.from_iterable(paths), dtype=np.int64, count=total)
        idx = np.arange(n0, n1, dtype=np.int64)
        if self._dense is not None:
            self._dense[keys] = idx
        else:  # keys are distinct and new (np.unique of the missing ones: sorted)
            at = np.searchsorted(self._keys, keys)
            self._keys = np.insert(self._keys, at, keys)
            self._ids = np.insert(self._ids, at, idx)
        self._n_pairs, self._n_flat = n1, f1

    def _gather(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, links) of the pairs ``keys`` (``src·p + dst``), routing those not seen yet."""
        idx = self._pair_index(keys)
        missing = idx < 0
        if bool(missing.any()):
            self._add(np.unique(keys[missing]))
            idx = self._pair_index(keys)
        lengths = self._len[idx]
        offsets = np.zeros(keys.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total:
            gather = np.repeat(self._start[idx] - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
            links = self._flat[gather]
        else:
            links = np.zeros(0, dtype=np.int64)
        return offsets, links

    def links_of(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Every link on the routes of the rank pairs ``(src[i], dst[i])``, concatenated."""
        return self._gather(src.astype(np.int64) * self._p + dst.astype(np.int64))[1]

    def resolve(self, schedule: Schedule, phase: Phase) -> PhasePaths:
        memo_key = (id(phase.src), id(phase.dst))
        hit = self._phase_memo.get(memo_key)
        if hit is None or hit[0] is not phase.src or hit[1] is not phase.dst:
            offsets, links, latency = self._resolve_pairs(phase.src, phase.dst)
            if len(self._phase_memo) >= _PHASE_MEMO_MAX:
                self._phase_memo.clear()
            hit = self._phase_memo[memo_key] = (phase.src, phase.dst, offsets, links, latency)
        return PhasePaths(hit[2], hit[3], hit[4], schedule.transfer_bytes(phase).astype(np.float64))

    def _resolve_pairs(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keys = src.astype(np.int64) * self._p + dst.astype(np.int64)
        offsets, links = self._gather(keys)
        lat = self.topo.latency_s
        if links.size:
            entry_lat = lat[links]
            cum = np.zeros(links.size + 1)
            np.cumsum(entry_lat, out=cum[1:])
            latency = cum[offsets[1:]] - cum[offsets[:-1]]
        else:
            latency = np.zeros(keys.shape[0])
        for a in (offsets, links, latency):  # shared by every phase on these arrays
            a.flags.writeable = False
        return offsets, links, latency


#: Phases whose resolved paths a :class:`PathCache` keeps (by their arrays; cleared when full).
_PHASE_MEMO_MAX = 64


#: Path caches shared by every model and schedule on one topology, per rank tuple (a topology's routes never
#: change, so a pair is routed once per process however many schedules, buckets or points ask for it).
_SHARED_PATHS: weakref.WeakKeyDictionary[Topology, dict[tuple[str, ...], PathCache]] = weakref.WeakKeyDictionary()
#: Rank tuples kept per topology (the oldest is dropped beyond this).
SHARED_PATHS_PER_TOPOLOGY = 32


def path_cache(topo: Topology, ranks: tuple[str, ...]) -> PathCache:
    """The :class:`PathCache` of ``ranks`` on ``topo``, shared (its answers do not depend on what was asked
    before: a pair's route is fixed by the topology, so sharing changes no result)."""
    per = _SHARED_PATHS.get(topo)
    if per is None:
        per = _SHARED_PATHS[topo] = {}
    cache = per.get(ranks)
    if cache is None:
        cache = per[ranks] = PathCache(topo, ranks)
        while len(per) > SHARED_PATHS_PER_TOPOLOGY:
            del per[next(iter(per))]
    return cache
