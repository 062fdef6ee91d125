"""Max-min fair rates of flows over shared links, by progressive filling.

Progressive filling (Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5.2): every flow that is not yet
frozen grows its rate at the same pace from zero; when a link becomes saturated, every flow crossing it
freezes at the current rate; the others keep growing until every flow is frozen. The result is the
unique max-min fair allocation: no flow can get more without taking from a flow that has no more.

Since all unfrozen flows share one rate (the *level*), a link ``l`` carrying frozen load ``F_l`` and
``n_l`` unfrozen flows saturates at level ``(C_l - F_l) / n_l``. Each iteration jumps straight to the
lowest such level, so the number of iterations is the number of distinct bottleneck levels (one for a
symmetric collective phase), and each costs a few ``numpy.bincount`` passes over the remaining
(flow, link) entries.

A weight ``w_f`` makes flow ``f`` stand for ``w_f`` identical flows on the same path (they provably get
equal max-min rates); the rate returned is that of one of them. This is how the flow network prices
thousands of identical-path flows at the cost of one.

Two implementations of the same algorithm: a compiled kernel (numba, when installed: the links' saturation
levels in a min-heap, so a level costs only the links whose level it changes, and each frozen flow updates
only its own links' counters, O((links + entries)·log links)) and the numpy one
(:func:`max_min_rates_numpy`, a few ``bincount`` passes per level). They agree to rounding (tested to
1e-12); ``TOPOTRAIN_KERNEL=numpy`` forces the numpy one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from topotrain.util.errors import ConfigError

#: Links whose saturation level is within this relative distance of the current level saturate together.
#: They all freeze at the (lower) current level, so no link is ever driven over its capacity.
REL_EPS = 1e-9


def max_min_rates(entry_flow: np.ndarray, entry_link: np.ndarray, num_flows: int,
                  capacity_bytes_per_s: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate (bytes/s) of every flow (see :func:`max_min_rates_numpy` for the arguments), by the
    compiled kernel when numba is installed, else by numpy."""
    kernel = _compiled()
    if kernel is None:
        return max_min_rates_numpy(entry_flow, entry_link, num_flows, capacity_bytes_per_s, weight)
    ef, el, rate, w_e, cap_all = _checked(entry_flow, entry_link, num_flows, capacity_bytes_per_s, weight)
    if ef.size == 0:
        return rate
    f_used, ef_c, l_used, el_c = _compact(ef, el, num_flows, cap_all.shape[0])
    rate[f_used] = kernel(ef_c, el_c, w_e, cap_all[l_used], f_used.shape[0], l_used.shape[0], REL_EPS,
                          _IDS)
    return rate


def max_min_rates_numpy(entry_flow: np.ndarray, entry_link: np.ndarray, num_flows: int,
                        capacity_bytes_per_s: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate (bytes/s) of every flow.

    ``entry_flow[e]`` / ``entry_link[e]`` say that flow ``entry_flow[e]`` crosses directed link
    ``entry_link[e]`` (an incidence list: one entry per flow and link of its path). ``capacity_bytes_per_s``
    is indexed by link id. ``weight[f] > 0`` is the multiplicity of flow ``f`` (default 1); the returned
    rate is per single flow. Flows with no entries get rate ``inf`` (nothing limits them).
    """
    ef, el, rate, w_e, cap_all = _checked(entry_flow, entry_link, num_flows, capacity_bytes_per_s, weight)
    if ef.size == 0:
        return rate
    f_used, ef_c, l_used, el_c = _compact(ef, el, num_flows, cap_all.shape[0])
    cap = cap_all[l_used]
    num_links = l_used.shape[0]
    num_used = f_used.shape[0]
    rate_c = np.empty(num_used)
    frozen_load = np.zeros(num_links)
    while ef_c.size:
        n = np.bincount(el_c, weights=w_e, minlength=num_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            sat = np.where(n > 0, np.maximum(cap - frozen_load, 0.0) / n, np.inf)
        level = float(sat.min())
        tight = sat <= level * (1.0 + REL_EPS)
        newly = np.zeros(num_used, dtype=bool)
        newly[ef_c[tight[el_c]]] = True
        rate_c[newly] = level
        e_new = newly[ef_c]
        frozen_load += np.bincount(el_c[e_new], weights=w_e[e_new] * level, minlength=num_links)
        keep = ~e_new
        ef_c, el_c, w_e = ef_c[keep], el_c[keep], w_e[keep]
    rate[f_used] = rate_c
    return rate


def _checked(entry_flow: np.ndarray, entry_link: np.ndarray, num_flows: int, capacity_bytes_per_s: np.ndarray,
             weight: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validated (entry flows, entry links, rates all inf, per-entry weights, capacities)."""
    ef = np.ascontiguousarray(entry_flow, dtype=np.int64)
    el = np.ascontiguousarray(entry_link, dtype=np.int64)
    if ef.shape != el.shape or ef.ndim != 1:
        raise ConfigError("entry_flow", f"entry_flow {ef.shape} and entry_link {el.shape} differ",
                          "give two 1-D arrays of equal length")
    rate = np.full(num_flows, np.inf)
    cap_all = np.asarray(capacity_bytes_per_s, dtype=np.float64)
    if ef.size == 0:
        return ef, el, rate, np.zeros(0), cap_all
    if int(ef.min()) < 0 or int(ef.max()) >= num_flows:
        raise ConfigError("entry_flow", f"flow ids must lie in 0..{num_flows - 1}",
                          "pass the right num_flows")
    if int(el.min()) < 0 or int(el.max()) >= cap_all.shape[0]:
        raise ConfigError("entry_link", f"link ids must lie in 0..{cap_all.shape[0] - 1}",
                          "pass the capacity of every link")
    if weight is None:
        w_e = np.ones(ef.shape[0])
    else:
        w = np.asarray(weight, dtype=np.float64)
        if w.shape != (num_flows,):
            raise ConfigError("weight", f"weight has shape {w.shape}, expected ({num_flows},)",
                              "give one multiplicity per flow")
        w_e = w[ef]
        if not bool(np.all(w_e > 0)):
            raise ConfigError("weight", "a flow that crosses links has weight <= 0",
                              "give every flow a positive multiplicity, or leave it out")
    return ef, el, rate, w_e, cap_all


def _compact(ef: np.ndarray, el: np.ndarray, num_flows: int,
             num_links: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compact ids of the flows and links present: (used flows, entry flows, used links, entry links)."""
    f_used = np.flatnonzero(np.bincount(ef, minlength=num_flows))
    f_map = np.zeros(num_flows, dtype=np.int64)
    f_map[f_used] = np.arange(f_used.shape[0])
    l_used = np.flatnonzero(np.bincount(el, minlength=num_links))
    l_map = np.zeros(num_links, dtype=np.int64)
    l_map[l_used] = np.arange(l_used.shape[0])
    return f_used, f_map[ef], l_used, l_map[el]


def _sift_down(hk: np.ndarray, hv: np.ndarray, size: int, j: int) -> None:  # pragma: no cover - numba
    """Restore the min-heap ``(hk, hv)[:size]``, ordered by (key, link), below position ``j``."""
    while True:
        c = 2 * j + 1
        if c >= size:
            return
        if c + 1 < size and (hk[c + 1] < hk[c] or (hk[c + 1] == hk[c] and hv[c + 1] < hv[c])):
            c += 1
        if hk[c] < hk[j] or (hk[c] == hk[j] and hv[c] < hv[j]):
            hk[j], hk[c] = hk[c], hk[j]
            hv[j], hv[c] = hv[c], hv[j]
            j = c
        else:
            return


def _sift_up(hk: np.ndarray, hv: np.ndarray, j: int) -> None:  # pragma: no cover - numba
    """Restore the min-heap ``(hk, hv)``, ordered by (key, link), above position ``j`` (just appended)."""
    while j > 0:
        par = (j - 1) // 2
        if hk[j] < hk[par] or (hk[j] == hk[par] and hv[j] < hv[par]):
            hk[j], hk[par] = hk[par], hk[j]
            hv[j], hv[par] = hv[par], hv[j]
            j = par
        else:
            return


#: what :func:`_filling` calls: :func:`_sift_down` and :func:`_sift_up`, replaced by their compiled versions
#: (:func:`compile_helpers`)
_sift: Any = _sift_down
_up: Any = _sift_up


def compile_helpers() -> None:
    """Compile what :func:`_filling` calls (before :func:`_filling` itself is compiled: numba binds a
    kernel's globals when it compiles it)."""
    global _sift, _up
    if _sift is _sift_down:
        import numba

        _sift = numba.njit(cache=True, nogil=True)(_sift_down)
        _up = numba.njit(cache=True, nogil=True)(_sift_up)


def _filling(ef: np.ndarray, el: np.ndarray, w_e: np.ndarray, cap: np.ndarray, num_flows: int,
             num_links: int, rel_eps: float, l_key: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """Progressive filling on compact ids, entry by entry (compiled by :func:`_compiled`). Links that are tight
    at one level freeze their flows in the order of their ids, ``l_key[link]`` (empty: the compact ids are the
    ids).

    A link crossed by one flow only (a *private* link: a GPU's own NIC or PCIe lane) has a level that cannot
    change before that flow freezes, and then the link leaves. So the heap holds one entry per flow for all
    its private links, at their lowest level, beside one entry per shared link: when that entry is the level's,
    the private links within ``rel_eps`` of the level are tight, as each would have been on its own. The tight
    links, the level and the freezing order are those of one heap entry per link; the heap is smaller."""
    n_e = ef.shape[0]
    # CSR of entries by link and by flow
    l_cnt = np.zeros(num_links + 1, dtype=np.int64)
    f_cnt = np.zeros(num_flows + 1, dtype=np.int64)
    for e in range(n_e):
        l_cnt[el[e] + 1] += 1
        f_cnt[ef[e] + 1] += 1
    for i in range(num_links):
        l_cnt[i + 1] += l_cnt[i]
    for i in range(num_flows):
        f_cnt[i + 1] += f_cnt[i]
    l_pos = l_cnt[:-1].copy()
    f_pos = f_cnt[:-1].copy()
    by_link = np.empty(n_e, dtype=np.int64)
    by_flow = np.empty(n_e, dtype=np.int64)
    w_flow = np.zeros(num_flows)
    for e in range(n_e):
        by_link[l_pos[el[e]]] = e
        l_pos[el[e]] += 1
        by_flow[f_pos[ef[e]]] = e
        f_pos[ef[e]] += 1
        w_flow[ef[e]] = w_e[e]
    n = np.zeros(num_links)  # weight of the unfrozen flows on each link
    cnt = np.zeros(num_links, dtype=np.int64)  # and their number
    for e in range(n_e):
        n[el[e]] += w_e[e]
        cnt[el[e]] += 1
    frozen_load = np.zeros(num_links)
    frozen = np.zeros(num_flows, dtype=np.bool_)
    rate = np.empty(num_flows)
    left = num_flows
    active = np.ones(num_links, dtype=np.bool_)  # links that still carry unfrozen flows
    tight = np.empty(num_links, dtype=np.int64)
    # every active link's saturation level (C_l - F_l)_+ / n_l in ``cur``, and in a binary min-heap ordered by
    # (level, entry) whose stale entries (the link left, or its level changed since) are skipped when popped:
    # a level changes only when a flow crossing the link freezes, so each level costs what it changes. Entry
    # ``v >= 0`` is shared link ``v``; ``v < 0`` stands for the private links of flow ``-v - 1``
    cur = np.empty(num_links)
    priv = np.empty(num_links, dtype=np.bool_)
    cap_heap = num_links + n_e + 1
    hk = np.empty(cap_heap)
    hv = np.empty(cap_heap, dtype=np.int64)
    f_low = np.full(num_flows, np.inf)
    has_priv = np.zeros(num_flows, dtype=np.bool_)
    size = 0
    for lk in range(num_links):
        free = cap[lk]
        cur[lk] = (free if free > 0.0 else 0.0) / n[lk]
        priv[lk] = cnt[lk] == 1
        if priv[lk]:
            f = ef[by_link[l_cnt[lk]]]
            has_priv[f] = True
            if cur[lk] < f_low[f]:
                f_low[f] = cur[lk]
        else:
            hk[size] = cur[lk]
            hv[size] = lk
            size += 1
    for f in range(num_flows):
        if has_priv[f]:
            hk[size] = f_low[f]
            hv[size] = -f - 1
            size += 1
    for i in range(size // 2 - 1, -1, -1):  # heapify
        _sift(hk, hv, size, i)
    changed = np.zeros(num_links, dtype=np.bool_)
    changed_list = np.empty(num_links, dtype=np.int64)
    while left > 0:
        # the level: the lowest current saturation level; the tight links: every active link at or within
        # rel_eps of it, in ascending link order (the order their flows freeze in)
        n_tight = 0
        level = np.inf
        while size > 0:
            key = hk[0]
            v = hv[0]
            if v >= 0:
                valid = active[v] and key == cur[v]
            else:
                valid = not frozen[-v - 1]
            if valid:
                if n_tight == 0:
                    level = key
                elif key > level * (1.0 + rel_eps):
                    break
            # pop the top
            size -= 1
            hk[0] = hk[size]
            hv[0] = hv[size]
            _sift(hk, hv, size, 0)
            if valid:
                if v >= 0:
                    active[v] = False  # every unfrozen flow on a tight link freezes now: the link leaves
                    tight[n_tight] = v
                    n_tight += 1
                else:  # the flow's private links within rel_eps of the level
                    bound = level * (1.0 + rel_eps)
                    f = -v - 1
                    for j in range(f_cnt[f], f_cnt[f + 1]):
                        lk = el[by_flow[j]]
                        if priv[lk] and active[lk] and cur[lk] <= bound:
                            active[lk] = False
                            tight[n_tight] = lk
                            n_tight += 1
        if n_tight == 0:  # no link left (cannot happen while a flow is unfrozen)
            break
        if l_key.shape[0] == 0:
            tight[:n_tight].sort()
        elif n_tight > 1:
            order = np.argsort(l_key[tight[:n_tight]])
            tight[:n_tight] = tight[:n_tight][order]
        n_changed = 0
        for t in range(n_tight):
            lk = tight[t]
            for k in range(l_cnt[lk], l_cnt[lk + 1]):
                f = ef[by_link[k]]
                if frozen[f]:
                    continue
                frozen[f] = True
                rate[f] = level
                left -= 1
                wf = w_flow[f]
                for j in range(f_cnt[f], f_cnt[f + 1]):
                    l2 = el[by_flow[j]]
                    n[l2] -= wf
                    frozen_load[l2] += wf * level
                    cnt[l2] -= 1
                    if cnt[l2] == 0:  # all its flows frozen: the link leaves
                        active[l2] = False
                    elif not changed[l2]:
                        changed[l2] = True
                        changed_list[n_changed] = l2
                        n_changed += 1
        for i in range(n_changed):  # the new levels of the links that stay
            l2 = changed_list[i]
            changed[l2] = False
            if not active[l2]:
                continue
            free = cap[l2] - frozen_load[l2]
            cur[l2] = (free if free > 0.0 else 0.0) / n[l2]
            hk[size] = cur[l2]
            hv[size] = l2
            _up(hk, hv, size)
            size += 1
    return rate


#: the empty tight-order key of :func:`_filling`: compact ids are ordered as the ids
_IDS = np.zeros(0, dtype=np.int64)
_KERNEL: list[Any] = []


def _compiled() -> Callable[..., np.ndarray] | None:
    """The numba-compiled :func:`_filling` (compiled once, cached on disk), or None without numba or with
    ``TOPOTRAIN_KERNEL=numpy`` (read at each call: the memo holds only what numba gave)."""
    if os.environ.get("TOPOTRAIN_KERNEL", "") == "numpy":
        return None
    if not _KERNEL:
        try:
            import numba

            compile_helpers()
            kernel = numba.njit(cache=True, nogil=True)(_filling)
        except ImportError:
            kernel = None
        _KERNEL.append(kernel)
    return _KERNEL[0]  # type: ignore[no-any-return, unused-ignore]
