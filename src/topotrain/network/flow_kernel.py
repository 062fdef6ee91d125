"""One compiled rate recomputation of the flow network: live entries, the changed component, the refill.

:meth:`topotrain.network.flow.FlowNetwork._recompute` runs, at every rate-change event, the same few steps:
select the incidence entries of the path groups that still carry flows, find the connected component of the
groups that changed (max-min fairness decomposes over components of the flow-link graph), refill the rates of
that component by progressive filling (only the groups at or above the lowest departed rate when flows only
left), and find the time to the next departure. In numpy each step is a handful of array passes plus their
call overhead; at thousands of events per iteration the call overhead dominates. This module compiles all of
it into one numba kernel: one call per event, the same arithmetic in the same order (the sums of a link's
load run in entry order as ``numpy.bincount``'s do, the filling is :func:`topotrain.network.maxmin._filling`),
so its rates equal the numpy path's; a test checks a congested run both ways to 1e-12.

``TOPOTRAIN_KERNEL=numpy`` (or no numba) keeps the numpy path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from topotrain.network.maxmin import REL_EPS, _filling

#: Rates of groups within this relative distance below the lowest departed rate are refilled too.
REDO_REL_EPS = 1e-6


def _max_min(ef: np.ndarray, el: np.ndarray, w_e: np.ndarray, cap: np.ndarray, f_map: np.ndarray,
             num_links: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled by numba
    """(groups, their max-min rates) of the entries ``(ef, el)``, as ``maxmin.max_min_rates`` computes them:
    compact ids in ascending order, then progressive filling. ``f_map`` is a scratch array of -1 per group,
    left as it was found."""
    n_e = ef.shape[0]
    if n_e == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    l_map = np.full(num_links, -1, dtype=np.int64)
    nf = 0
    for e in range(n_e):
        if f_map[ef[e]] < 0:
            f_map[ef[e]] = 0
            nf += 1
        l_map[el[e]] = 0
    f_used = np.empty(nf, dtype=np.int64)
    k = 0
    for e in range(n_e):
        if f_map[ef[e]] == 0:
            f_map[ef[e]] = 1
            f_used[k] = ef[e]
            k += 1
    f_used.sort()
    for i in range(nf):
        f_map[f_used[i]] = i
    nl = 0
    for lk in range(num_links):
        if l_map[lk] == 0:
            l_map[lk] = nl
            nl += 1
    cap_c = np.empty(nl)
    for lk in range(num_links):
        if l_map[lk] >= 0:
            cap_c[l_map[lk]] = cap[lk]
    ef_c = np.empty(n_e, dtype=np.int64)
    el_c = np.empty(n_e, dtype=np.int64)
    for e in range(n_e):
        ef_c[e] = f_map[ef[e]]
        el_c[e] = l_map[el[e]]
    r = _fill(ef_c, el_c, w_e, cap_c, nf, nl, REL_EPS)
    for i in range(nf):
        f_map[f_used[i]] = -1
    return f_used, r


def _recompute(eg_all: np.ndarray, el_all: np.ndarray, mult: np.ndarray, group_rate: np.ndarray, cap: np.ndarray,
               touched: np.ndarray, has_touched: bool, full: bool, thr: float, act: np.ndarray, gid: np.ndarray,
               rem: np.ndarray, scratch: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:  # pragma: no cover - compiled by numba
    """(live entry groups, live entry links, rates of the active flows, time to the next departure); the
    groups' rates are updated in ``group_rate``. The steps and their order are those of
    ``FlowNetwork._recompute`` / ``_component`` / ``_refill``; ``scratch`` holds -1 for every group (and is
    left so). Idle groups' rates are zeroed where they went idle (the groups ``touched``)."""
    num_groups = mult.shape[0]
    num_links = cap.shape[0]
    n_ent = eg_all.shape[0]
    n_live = 0
    for e in range(n_ent):
        if mult[eg_all[e]] > 0:
            n_live += 1
    eg = np.empty(n_live, dtype=np.int64)
    el = np.empty(n_live, dtype=np.int64)
    k = 0
    for e in range(n_ent):
        if mult[eg_all[e]] > 0:
            eg[k] = eg_all[e]
            el[k] = el_all[e]
            k += 1
    if act.shape[0] == 0:
        group_rate[:] = 0.0
        return eg, el, np.zeros(0), np.inf
    # the component of the changed groups (all live entries without them)
    sel = np.ones(n_live, dtype=np.bool_)
    if has_touched:
        g_mask = np.zeros(num_groups, dtype=np.bool_)
        for g in touched:
            g_mask[g] = True
        l_mask = np.zeros(num_links, dtype=np.bool_)
        for e in range(n_ent):
            if g_mask[eg_all[e]]:
                l_mask[el_all[e]] = True
        grown = True
        while grown:
            grown = False
            for e in range(n_live):
                if l_mask[el[e]] and not g_mask[eg[e]]:
                    g_mask[eg[e]] = True
                    grown = True
            for e in range(n_live):
                if g_mask[eg[e]] and not l_mask[el[e]]:
                    l_mask[el[e]] = True
                    grown = True
        n_sel = 0
        for e in range(n_live):
            sel[e] = g_mask[eg[e]]
            if sel[e]:
                n_sel += 1
        ceg = np.empty(n_sel, dtype=np.int64)
        cel = np.empty(n_sel, dtype=np.int64)
        k = 0
        for e in range(n_live):
            if sel[e]:
                ceg[k] = eg[e]
                cel[k] = el[e]
                k += 1
    else:
        ceg = eg
        cel = el
    # refill the component
    n_c = ceg.shape[0]
    ok = False
    if not full:
        bound = thr * (1.0 - REDO_REL_EPS)
        n_redo = 0
        for e in range(n_c):
            if group_rate[ceg[e]] >= bound:
                n_redo += 1
        if n_redo < n_c:
            load = np.zeros(num_links)
            fixed_ok = True
            reg = np.empty(n_redo, dtype=np.int64)
            rel = np.empty(n_redo, dtype=np.int64)
            rw = np.empty(n_redo)
            k = 0
            for e in range(n_c):
                g = ceg[e]
                if group_rate[g] >= bound:
                    reg[k] = g
                    rel[k] = cel[e]
                    rw[k] = float(mult[g])
                    k += 1
                else:
                    load[cel[e]] += group_rate[g] * float(mult[g])
                    if not group_rate[g] > 0:
                        fixed_ok = False
            resid = np.empty(num_links)
            for lk in range(num_links):
                d = cap[lk] - load[lk]
                resid[lk] = d if d > 0.0 else 0.0
            groups, part = _mm(reg, rel, rw, resid, scratch, num_links)
            ok = fixed_ok
            for i in range(groups.shape[0]):
                if not part[i] > 0:  # rounding left a refilled flow nothing: do it all again
                    ok = False
            if ok:
                for i in range(groups.shape[0]):
                    group_rate[groups[i]] = part[i]
    if not ok:
        w_e = np.empty(n_c)
        for e in range(n_c):
            w_e[e] = float(mult[ceg[e]])
        groups, part = _mm(ceg, cel, w_e, cap, scratch, num_links)
        for i in range(groups.shape[0]):
            group_rate[groups[i]] = part[i]
    for g in touched:
        if mult[g] == 0:
            group_rate[g] = 0.0
    act_rate = np.empty(act.shape[0])
    next_dt = np.inf
    for i in range(act.shape[0]):
        f = act[i]
        r = group_rate[gid[f]]
        act_rate[i] = r
        dt = rem[f] / r
        if dt < next_dt:
            next_dt = dt
    return eg, el, act_rate, next_dt


# the functions the kernels call: the Python ones, replaced by their compiled versions before compiling
_fill: Any = _filling
_mm: Any = _max_min
_KERNEL: list[Any] = []
_STEP: list[Any] = []


def compiled_recompute() -> Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, float]] | None:
    """``recompute(eg_all, el_all, mult, group_rate, cap, touched, has_touched, full, thr, act, gid, rem)``
    compiled by numba (once, cached on disk), or None without numba or with ``TOPOTRAIN_KERNEL=numpy``."""
    if not _KERNEL:
        kernel = None
        if os.environ.get("TOPOTRAIN_KERNEL", "") != "numpy":
            try:
                import numba

                global _fill, _mm
                _fill = numba.njit(cache=True, nogil=True)(_filling)
                _mm = numba.njit(cache=True, nogil=True)(_max_min)
                kernel = numba.njit(cache=True, nogil=True)(_recompute)
                _STEP.append(numba.njit(cache=True, nogil=True)(_step))
            except ImportError:
                kernel = None
        _KERNEL.append(kernel)
    return _KERNEL[0]  # type: ignore[no-any-return, unused-ignore]


def _step(dt: float, act: np.ndarray, act_rate: np.ndarray, rem: np.ndarray, gid: np.ndarray, mult: np.ndarray,
          group_bytes: np.ndarray, acc: np.ndarray, done_rel_eps: float
          ) -> tuple[np.ndarray, np.ndarray, float]:  # pragma: no cover - compiled by numba
    """Progress the active flows by ``dt`` (as ``FlowNetwork._step_event``): (flows that sent their last byte,
    the flows still sending, the lowest rate among the first). Bytes are summed per group in ``acc`` (zeros,
    left so) and then added to ``group_bytes``, the order ``numpy.bincount`` adds them in; ``mult`` loses the
    departed flows."""
    n = act.shape[0]
    bound = dt * (1.0 + done_rel_eps)
    n_done = 0
    low = np.inf
    is_done = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        f = act[i]
        r = rem[f]
        rate = act_rate[i]
        g = gid[f]
        if r / rate <= bound:
            is_done[i] = True
            acc[g] += r
            rem[f] = 0.0
            n_done += 1
            if rate < low:
                low = rate
        else:
            moved = rate * dt
            acc[g] += moved
            rem[f] = r - moved
    done = np.empty(n_done, dtype=np.int64)
    left = np.empty(n - n_done, dtype=np.int64)
    k = 0
    j = 0
    for i in range(n):
        f = act[i]
        g = gid[f]
        if acc[g] != 0.0:
            group_bytes[g] += acc[g]
            acc[g] = 0.0
        if is_done[i]:
            done[k] = f
            k += 1
            mult[g] -= 1
        else:
            left[j] = f
            j += 1
    return done, left, low


def compiled_step() -> Callable[..., tuple[np.ndarray, np.ndarray, float]] | None:
    """:func:`_step` compiled (with :func:`compiled_recompute`), or None when that is None."""
    return _STEP[0] if compiled_recompute() is not None else None
