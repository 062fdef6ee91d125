"""How long gloo's threads wait for a core when a job's ranks outnumber the host's cores: a host-level term of
the what-if on shared cores (:func:`topotrain.traces.whatif.on_shared_host`), from the Linux scheduler's
documented defaults, not fitted to any recording.

On CPU gloo every ring hop is a hand-off between threads: a rank's gloo thread blocks until its left
neighbour's bytes arrive and is woken then, copies or reduces them, sends on and blocks again. With a core
of its own (or a core whose task has run its slice), a woken thread runs at once. When every core is busy
with the ranks' main threads (more ranks than cores, all computing), the woken thread waits for the task on
its core: Linux's EEVDF scheduler (kernel/sched/fair.c, v6.6 on; this host runs 6.18) protects a task
just picked from wake-up preemption until it has run its slice (``RUN_TO_PARITY``: ``set_protect_slice``
sets ``se->vprot`` to the deadline when every queued task has the default slice, and
``check_preempt_wakeup_fair`` → ``pick_eevdf`` keeps ``curr`` while ``protect_slice(curr)``). A wake-up at
a random moment of that slice waits its residual, half a slice on average (the renewal-theory mean
residual of a fixed interval; Kleinrock, "Queueing Systems" vol. 1, §5.2).

The slice is the kernel's default base slice, ``sysctl_sched_base_slice`` = 0.70 ms (``normalized_sysctl_
sched_base_slice = 700000ULL``, torvalds/linux commit 2ae891b826958b60919ea21c727f77bcd6ffcc2c, "sched:
Reduce the default slice to avoid tasks getting an extra tick", in v6.15; 0.75 ms from v6.6 to v6.14),
scaled by ``get_update_sysctl_factor()`` under the default ``SCHED_TUNABLESCALING_LOG``:
``1 + ilog2(min(ncpus, 8))``. On the recording host (2 cores) that is 1.4 ms, which its
``/proc/<pid>/sched`` shows as ``se.slice 1400000``.

This is the first-order figure, and two effects the module leaves out pull it either way: a wake-up that
finds ``curr`` past its protected slice preempts it at once (``pick_eevdf`` then picks the eligible task
with the earliest deadline), which shortens the mean wait; and with ``HRTICK`` off (the default,
kernel/sched/features.h) the end of the protection is noticed only at the next tick (``update_curr`` from
``task_tick_fair``; every 4 ms at the host's HZ 250) or the next wake-up, which lengthens it. A task with a
shorter slice may break the protection (``PREEMPT_SHORT``); gloo's threads have the default slice, so they
cannot.

Whether a hop finds every core busy: the ranks' main threads compute while a DDP bucket's allreduce runs
(the backward goes on), so with more ranks than cores every core is busy; FSDP2's all-gathers and
reduce-scatters are waited for inside the hook that launched them (:attr:`TraceOp.hidden_waits`), so every
rank's main thread sleeps and leaves its core to gloo. Measured (``benchmarks/whatif_probe.py``, "hop
wait"; docs/traces.md): at 4 processes on 2 cores a gpt DDP allreduce's all-ranks span exceeds the ring on
the shared host by 0.70–1.14 ms per hop (medians of 5 recordings), against 0.70 ms here; FSDP2's
all-gathers by −0.74 to +0.11 ms in 9 of 10 recordings.
"""

from __future__ import annotations

#: The kernel's ``normalized_sysctl_sched_base_slice`` (kernel/sched/fair.c, v6.15 on), seconds.
BASE_SLICE_S = 0.70e-3


def base_slice_s(cores: int) -> float:
    """The default EEVDF slice on a host of ``cores`` CPUs: ``0.70 ms × (1 + ilog2(min(cores, 8)))``
    (kernel/sched/fair.c, ``update_sysctl`` with ``get_update_sysctl_factor``, ``SCHED_TUNABLESCALING_LOG``);
    1.4 ms on 2 cores, 2.1 ms on 4, 2.8 ms on 8 or more."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return BASE_SLICE_S * (1 + (min(cores, 8).bit_length() - 1))


def gloo_hops(op: str, n: int) -> int:
    """Thread hand-offs on one rank in gloo's ring ``op`` over ``n`` ranks: an allreduce is a reduce-scatter
    and an all-gather round, ``2(n−1)`` (gloo/allreduce_ring.h); ProcessGroupGloo runs a CPU reduce-scatter
    as that allreduce (then keeps its chunk), also ``2(n−1)``; an all-gather or a broadcast ``n−1``; any
    other op ``2(n−1)``. 0 on one rank."""
    if n < 2:
        return 0
    return n - 1 if op in ("allgather", "broadcast") else 2 * (n - 1)


def wake_wait_s(op: str, n: int, cores: int, cores_busy: bool) -> float:
    """Seconds one collective's hops wait for a core (module docstring): ``hops × slice / 2`` when its
    ``n`` ranks outnumber the ``cores`` and the main threads keep the cores busy while it runs
    (``cores_busy``), else 0 (``cores`` 0: every rank its own core)."""
    if cores <= 0 or n <= cores or not cores_busy:
        return 0.0
    return gloo_hops(op, n) * base_slice_s(cores) / 2
