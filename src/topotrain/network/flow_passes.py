"""The passes over the active flows that the flow network's compiled kernels make at every event.

:func:`_depart` progresses the active flows to a departure (who leaves, who stays, the bytes moved per group),
:func:`_rates` and :func:`_rates_flush` read the refilled groups' rates back into the flows (and the time to the
next departure), :func:`_flush` adds the bytes summed per group. They call no other kernel: numba compiles them
as they are (:func:`topotrain.network.flow_kernel.compiled_recompute`), and
:mod:`topotrain.network.kernel_choice` runs them interpreted. Moved out of :mod:`topotrain.network.flow_kernel`
(the module size limit); the arithmetic and its order are those documented there.
"""

from __future__ import annotations

import numpy as np


def _rates(act: np.ndarray, gid: np.ndarray, group_rate: np.ndarray,
           rem: np.ndarray) -> tuple[np.ndarray, float]:  # pragma: no cover - compiled by numba
    """(the rates of the active flows ``act``, the time to the next departure: the least bytes left over rate)."""
    act_rate = np.empty(act.shape[0])
    next_dt = np.inf
    for i in range(act.shape[0]):
        f = act[i]
        r = act_rate[i] = group_rate[gid[f]]
        if rem[f] / r < next_dt:
            next_dt = rem[f] / r
    return act_rate, next_dt


def _flush(act: np.ndarray, gid: np.ndarray, acc: np.ndarray,
           group_bytes: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """Add the bytes summed per group in ``acc`` to ``group_bytes`` and zero them, group by group in the order
    of the active flows ``act`` (what ``group_bytes += numpy.bincount(...)`` adds)."""
    for i in range(act.shape[0]):
        g = gid[act[i]]
        if acc[g] != 0.0:
            group_bytes[g] += acc[g]
            acc[g] = 0.0


def _depart(dt: float, act: np.ndarray, act_rate: np.ndarray, rem: np.ndarray, gid: np.ndarray, mult: np.ndarray,
            acc: np.ndarray, done_rel_eps: float
            ) -> tuple[np.ndarray, np.ndarray, float]:  # pragma: no cover - compiled by numba
    """Progress the active flows by ``dt`` in one pass: (flows that sent their last byte, the flows still sending,
    the lowest rate among the first); bytes summed per group in ``acc`` in the order of ``act`` (the order
    ``numpy.bincount`` sums them in), left there; ``mult`` loses the departed flows."""
    n = act.shape[0]
    bound = dt * (1.0 + done_rel_eps)
    low = np.inf
    done = np.empty(n, dtype=np.int64)
    left = np.empty(n, dtype=np.int64)
    k = j = 0
    for i in range(n):
        f, rate = act[i], act_rate[i]
        r, g = rem[f], gid[f]
        if r / rate <= bound:
            acc[g] += r
            rem[f] = 0.0
            mult[g] -= 1
            done[k] = f
            k += 1
            if rate < low:
                low = rate
        else:
            moved = rate * dt
            acc[g] += moved
            rem[f] = r - moved
            left[j] = f
            j += 1
    return done[:k], left[:j], low


def _rates_flush(act: np.ndarray, gone: np.ndarray, gid: np.ndarray, group_rate: np.ndarray, rem: np.ndarray,
                 acc: np.ndarray, group_bytes: np.ndarray) -> tuple[np.ndarray, float]:  # pragma: no cover - numba
    """:func:`_rates` of the active flows ``act``, adding in the same pass (then over the departed ``gone``) the
    bytes :func:`_depart` summed per group in ``acc`` to ``group_bytes``: one sum per group and event, as
    :func:`_flush` adds it (groups are independent, so the order of the groups does not matter)."""
    act_rate = np.empty(act.shape[0])
    next_dt = np.inf
    for i in range(act.shape[0]):
        f = act[i]
        g = gid[f]
        if acc[g] != 0.0:
            group_bytes[g] += acc[g]
            acc[g] = 0.0
        r = act_rate[i] = group_rate[g]
        dt = rem[f] / r
        if dt < next_dt:
            next_dt = dt
    for f in gone:
        g = gid[f]
        if acc[g] != 0.0:
            group_bytes[g] += acc[g]
            acc[g] = 0.0
    return act_rate, next_dt
