"""Which kernels run the flow network's events: the same Python functions, interpreted or compiled by numba.

The kernels of :mod:`topotrain.network.flow_kernel` (and the filling of :mod:`topotrain.network.maxmin`) are
plain Python functions that numba compiles. Loading them costs a process about a second whatever it computes
(importing numba, then numba's typing and lowering registries, which import scipy.linalg, on the first cached
kernel), while a small case — a 16-GPU collective: ~100 rate computations of a few hundred entries — runs
them interpreted in tens of milliseconds. So a process starts with the **interpreted** kernels: copies of
the same functions (the same code objects) whose calls to each other go to the interpreted copies, and moves
to the **compiled** ones once it has done :data:`INTERPRETED_BUDGET` units of interpreted work (one unit per
incidence entry and per active flow a kernel call is given; counted, never timed, so where it moves is
deterministic). The two run the same IEEE-754 double arithmetic in the same order (numba compiles without
``fastmath``: no reassociation, no fused multiply-add), so their answers are the same bits; moving between
calls is free (both keep their state in the network's arrays). ``tests/test_kernel_choice.py`` checks
congested runs, collectives and simulations both ways for equality, and ``benchmarks/checkset.py`` prints the
same SHA-256 either way.

Interpreted, the kernels return what the compiled ones return: Python ``int`` and ``float`` scalars (numba
boxes its scalars so), not NumPy scalars, whose ``repr`` differs.

``TOPOTRAIN_KERNEL``: ``numpy`` keeps the numpy path (the vectorised steps of ``flow_rates``, equal to
rounding, not bitwise), ``python`` the interpreted kernels throughout, ``numba`` the compiled ones from the
first event; unset, the rule above (the numpy path where numba is not installed, as before).
"""

from __future__ import annotations

import importlib.util
import os
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from topotrain.network import flow_kernel as fk
from topotrain.network import maxmin as mm

#: Units of interpreted work (incidence entries and active flows given to kernel calls) a process does before it
#: loads the compiled kernels. Interpreted, a unit costs ~1.7 µs (the 128-GPU example's five allreduce timings:
#: 553k units, 0.92 s CPU on 2 shared cores); loading the compiled kernels ~0.6-1 s. A case past the budget pays
#: both, so the budget is a quarter of the load (~0.25 s): the 16-GPU collective of benchmarks/startup.py spends
#: 8k units, the 1,024-router ring 49k, the 128-GPU example's tree more than the budget.
INTERPRETED_BUDGET = 150_000


class KernelSet(NamedTuple):
    """The kernels a :class:`~topotrain.network.flow_rates.FlowRates` calls (``flow_kernel``'s names)."""

    recompute: Callable[..., tuple[int, np.ndarray, float, np.ndarray]]  #: ``_recompute``
    step: Callable[..., tuple[np.ndarray, np.ndarray, float]]  #: ``_step``
    lists: fk.EntryKernels  #: ``_compact``, ``_activate``, ``_start``
    partial: Callable[..., float]  #: ``_partial``
    #: ``_steps`` (the departure loop in one call), None interpreted: the network steps event by event, so that
    #: it can move to the compiled kernels between two events
    steps: Callable[..., tuple[Any, ...]] | None
    compiled: bool


_SPENT = [0]
_INTERPRETED: list[KernelSet] = []


def _mode() -> str:
    return os.environ.get("TOPOTRAIN_KERNEL", "")


def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def spent() -> int:
    """Units of interpreted work this process has done."""
    return _SPENT[0]


def budget_left() -> bool:
    """Whether a network on the interpreted kernels keeps them (``TOPOTRAIN_KERNEL=python``, or the budget not
    spent)."""
    return _mode() == "python" or _SPENT[0] < INTERPRETED_BUDGET


def choose() -> KernelSet | None:
    """The kernels a new network starts with (module docstring), or None for the numpy path."""
    mode = _mode()
    if mode == "numpy":
        return None
    if mode == "python":
        return interpreted()
    if mode != "numba" and _SPENT[0] < INTERPRETED_BUDGET:
        return interpreted() if _numba_installed() else None
    return compiled()


def compiled() -> KernelSet | None:
    """The kernels compiled by numba (:func:`topotrain.network.flow_kernel.compiled_recompute`: loaded once from
    numba's cache), or None without numba or with ``TOPOTRAIN_KERNEL=numpy``."""
    rc, step, lists = fk.compiled_recompute(), fk.compiled_step(), fk.compiled_lists()
    partial, steps = fk.compiled_partial(), fk.compiled_steps()
    if rc is None or step is None or lists is None or partial is None or steps is None:
        return None
    return KernelSet(rc, step, lists, partial, steps, True)


def _copy(fn: Callable[..., Any], g: dict[str, Any]) -> Callable[..., Any]:
    """``fn`` (the same code) with the globals ``g``."""
    return types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)


def interpreted() -> KernelSet:
    """The kernels interpreted: copies of flow_kernel's and maxmin's functions that call each other's copies
    (module docstring), their work counted, their scalars returned as Python's."""
    if not _INTERPRETED:
        mg = dict(vars(mm))  # maxmin's globals, its heap helpers the Python ones
        mg.update(_sift=_copy(mm._sift_down, mg), _up=_copy(mm._sift_up, mg))
        kg = dict(vars(fk))  # flow_kernel's globals, every name a kernel calls bound to a copy
        kg["_fill"] = _copy(mm._filling, mg)
        helpers: dict[str, Callable[..., Any]] = {
            "_lp": fk._link_push, "_ml": fk._mark_links, "_gw": fk.grown, "_fl": fk._flush, "_ac": fk._activate,
            "_mm": fk._max_min, "_st": fk._step, "_cp": fk._compact, "_cs": fk._composition_store,
            "_ct": fk._composition_take,
            "_rf": fk._refresh, "_ar": fk._rates, "_dp": fk._depart, "_rfl": fk._rates_flush}
        for alias, fn in helpers.items():
            kg[alias] = _copy(fn, kg)
        find = _copy(fk._composition_find, kg)

        def composition_find(*args: Any) -> Any:  # FNV-1a's products wrap modulo 2**64, as compiled
            with np.errstate(over="ignore"):
                return find(*args)

        kg["_cf"] = composition_find
        rc = _copy(fk._recompute, kg)
        st, cp, ac, start, part = kg["_st"], kg["_cp"], kg["_ac"], _copy(fk._start, kg), _copy(fk._partial, kg)

        def recompute(*args: Any) -> tuple[int, np.ndarray, float, np.ndarray]:
            _SPENT[0] += int(args[0].shape[0]) + int(args[9].shape[0])  # the entries, the active flows
            n_live, act_rate, next_dt, memo = rc(*args)
            return int(n_live), act_rate, float(next_dt), memo

        def step(*args: Any) -> tuple[np.ndarray, np.ndarray, float]:
            _SPENT[0] += int(args[1].shape[0])
            done, left, low = st(*args)
            return done, left, float(low)

        def compact(*args: Any) -> int:
            return int(cp(*args))

        def activate(*args: Any) -> tuple[Any, ...]:
            *arrays, n = ac(*args)
            return (*arrays, int(n))

        def start_flows(*args: Any) -> tuple[Any, ...]:
            _SPENT[0] += int(args[0].shape[0])
            *arrays, n = start(*args)
            return (*arrays, int(n))

        def partial(*args: Any) -> float:
            _SPENT[0] += int(args[1].shape[0])
            return float(part(*args))

        _INTERPRETED.append(KernelSet(recompute, step, fk.EntryKernels(compact, activate, start_flows), partial,
                                      None, False))
    return _INTERPRETED[0]
