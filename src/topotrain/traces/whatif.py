"""What-if on a recorded job: the same step at another data-parallel degree, or on a host with another
number of cores.

* :func:`resize` — the job at ``world_size`` ranks: rank ``r`` runs the operators of recorded rank
  ``r mod n`` (data parallelism: every rank runs the same model on its own batch), and every collective
  spans the new group at its recorded size (a DDP gradient bucket is as large on any number of ranks; the
  network model times the longer ring), except an FSDP2 unit's all-gather and reduce-scatter, whose size
  is the unit's parameters each padded to a multiple of the group size (:func:`fsdp_padded_numel`). This
  is dPRO's and Lumos' way of changing the data-parallel degree of a recorded graph (Hu et al., MLSys
  2022, §5; Liang et al., MLSys 2025, §4.3).
* :func:`on_shared_host` — the what-if on the recording host's ``cores`` shared cores (the rule that
  ``trace replay --world``, ``simulate --set workload.world=N`` on the host and ``trace_record.py
  --replay`` use): the resized job, its operators slowed by the CPU the ranks *demand*, gloo's work
  counted (:func:`demand_share_scale`), the waits left inside operators made waits the replay times
  (:func:`waits_outside`), the collectives on :func:`shared_host`, and, with more ranks
  than cores, each collective's wait for a core between its ring hops (:func:`with_wake_waits`,
  :mod:`topotrain.traces.sched`: the Linux scheduler's slice).
* :func:`core_share_scale` — how much slower each operator runs when ``n`` processes of ``threads``
  busy threads each share ``cores`` cores, as processor sharing gives it (Kleinrock, "Queueing Systems"
  vol. 2, §4.4): a thread gets ``min(1, cores / (n · threads))`` of a core, so an operator recorded at
  ``n_old`` processes lasts ``max(1, n_new·t/c) / max(1, n_old·t/c)`` times as long at ``n_new``. Other
  users of the host share the cores too: given their runnable threads ``b`` at each run (measured, e.g.
  ``procs_running`` of /proc/stat), the ratio is ``max(1, (n_new·t + b_new)/c) / max(1, (n_old·t + b_old)/c)``;
  a recording on a loaded machine carries that load in its durations.
* :func:`group_share_slowdown` / :func:`group_share_scale` — the same on a Linux host that shares its cores
  between scheduling groups first (autogroups: one per session), as the recording host here does: the
  job's processes are one group, so going from 2 to 4 processes halves each one's share of the group's
  part of the cores, whatever the other groups run; the other groups' runnable threads (sampled during
  each recording) set how large that part is (max-min fair).
* :func:`shared_host` — the recording host's loopback at that share: on CPU gloo a collective is CPU work
  (copies and reductions on gloo's threads; the bandwidth fitted from a CPU trace is that work's rate, far
  below the loopback's), so a core shared by more processes slows the collectives as it slows the
  operators: the fitted bandwidth is divided by the same factor and the per-message overhead multiplied.
  (Before this, the what-if slowed the operators and left the collectives at the 2-process rate.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from topotrain.traces.cluster import RING_STEPS, HostCluster
from topotrain.traces.model import RankTrace, TraceCollective, TraceJob, TraceOp
from topotrain.traces.sched import wake_wait_s
from topotrain.util.errors import ConfigError


def resize(job: TraceJob, world_size: int) -> TraceJob:
    """``job`` at ``world_size`` data-parallel ranks (see the module's docstring). Its measured figures are
    the recorded job's (nothing was measured at the new size); each operator as recorded, the waits left
    inside operators (:attr:`TraceOp.hidden_waits`) included (:func:`on_shared_host` makes them waits the
    replay times)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError("--world", f"must be an integer >= 1, got {world_size!r}", "give e.g. --world 4")
    groups = {c.group for c in job.collectives}
    if any(c.ranks != tuple(range(job.world_size)) for c in job.collectives) or len(groups) > 1:
        raise ConfigError("--world", "the job has collectives on subgroups of its ranks (not plain data parallelism)",
                          "resize only data-parallel jobs whose collectives span all ranks")
    ranks = tuple(range(world_size))
    colls = tuple(TraceCollective(c.op, fsdp_resized_bytes(c, world_size), c.group, ranks, (), 0.0, c.param_shapes,
                                  backend_op=c.backend_op) for c in job.collectives)
    by_rank = {r.rank: r for r in job.ranks}
    new_ranks = tuple(RankTrace(r, by_rank[r % job.world_size].start_s, by_rank[r % job.world_size].step_s,
                                by_rank[r % job.world_size].ops, by_rank[r % job.world_size].source)
                      for r in ranks)
    return replace(job, world_size=world_size, ranks=new_ranks, collectives=colls,
                   name=f"{job.name} at {world_size} ranks")


def ring_time_s(c: TraceCollective, host: HostCluster) -> float:
    """``c``'s time on ``host`` by the ring formula the host was fitted with, ``k(n−1)·(α + S/(n·B))``
    (:mod:`topotrain.traces.cluster`; ``k`` 2 for an allreduce, 1 for an allgather or reduce-scatter, 2 for any
    other op), for the op the recording's backend ran (:attr:`TraceCollective.ran_as`: gloo's CPU
    reduce-scatter is an allreduce); 0 on one rank."""
    n = len(c.ranks)
    per_step_s = host.message_overhead_s + c.size_bytes / (n * host.bandwidth_bytes_per_s)
    return RING_STEPS.get(c.ran_as, 2) * (n - 1) * per_step_s


def fsdp_padded_numel(shapes: tuple[tuple[int, ...], ...], world_size: int) -> int:
    """Elements of an FSDP2 unit's all-gather output (= its reduce-scatter input) on ``world_size`` ranks:
    each parameter is chunked on dim 0 with ``torch.chunk`` and every rank's shard padded to the first
    (largest) chunk, so dim 0 is padded up to a multiple of ``world_size``:
    ``Σ_p ⌈d0_p / W⌉ · W · Π(other dims of p)``. PyTorch 2.13, torch/distributed/fsdp/_fully_shard/:
    ``FSDPParam._init_sharded_param`` (_fsdp_param.py: ``padded_sharded_param_size = chunks[0].size()``, the
    all-gather input), ``foreach_reduce`` (_fsdp_collectives.py: ``_get_dim0_padded_size``, the
    reduce-scatter input) and ``_get_dim0_padded_size`` (_fsdp_common.py: ``ceil(d0 / W) * W``)."""
    total = 0
    for shape in shapes:
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += -(-shape[0] // world_size) * world_size * rest
    return total


def fsdp_resized_bytes(c: TraceCollective, world_size: int) -> int:
    """``c``'s bytes on ``world_size`` ranks: an FSDP2 unit's (``param_shapes`` known) re-padded for the new
    group (:func:`fsdp_padded_numel`, at the recorded bytes per element); any other collective's as recorded."""
    if not c.param_shapes:
        return c.size_bytes
    elem_bytes = c.size_bytes // fsdp_padded_numel(c.param_shapes, len(c.ranks))
    return elem_bytes * fsdp_padded_numel(c.param_shapes, world_size)


def core_share_scale(old_processes: int, new_processes: int, cores: int, threads: int = 1,
                     background_old: float = 0.0, background_new: float = 0.0) -> float:
    """Slowdown of each operator from ``old_processes`` to ``new_processes`` processes of ``threads`` busy
    threads on ``cores`` shared cores (processor sharing; 1.0 when ``cores`` is 0: every process its own).
    ``background_old``/``background_new``: the other users' runnable threads on the host at the recording and
    at the run predicted (a thread gets ``cores / (n·t + b)`` of a core once they outnumber the cores), so
    on a host busy with other work more processes of the job slow each other less than on an idle one."""
    if cores <= 0:
        return 1.0
    old = max(1.0, (old_processes * threads + background_old) / cores)
    return max(1.0, (new_processes * threads + background_new) / cores) / old


def group_share_slowdown(own_threads: int, others: Sequence[int], cores: int) -> float:
    """How many times longer a thread of a job of ``own_threads`` busy threads (one scheduling group) takes
    than on a core of its own, when the other groups on the host have ``others`` runnable threads each and
    ``cores`` cores are shared. Linux's CFS with autogroups (sched(7), "The autogroup feature", on where
    /proc/sys/kernel/sched_autogroup_enabled is 1) shares the CPU fairly between groups (a session's
    processes are one group), then between a group's threads: each group gets the max-min fair share
    (water-filling, Bertsekas & Gallager, "Data Networks", §6.5.2) of ``cores``, at most its threads, and
    the job's threads split its share. 1.0 when ``cores`` is 0 (every thread its own core)."""
    if cores <= 0 or own_threads <= 0:
        return 1.0
    demands = sorted([*(d for d in others if d > 0), own_threads])
    left, groups = float(cores), len(demands)
    level = left / groups
    for d in demands:  # water-filling: a group that wants less than the level keeps what it wants
        if d >= level:
            break
        left -= d
        groups -= 1
        level = left / groups
    return own_threads / min(float(own_threads), level)


def group_share_scale(old_threads: int, new_threads: int, cores: int, samples_old: Sequence[Sequence[int]],
                      samples_new: Sequence[Sequence[int]]) -> float:
    """Slowdown of each operator from a job of ``old_threads`` to one of ``new_threads`` busy threads on
    ``cores`` shared cores (:func:`group_share_slowdown`), averaged over samples of the other groups'
    runnable threads during the recording (``samples_old``) and during the run predicted (``samples_new``;
    give ``samples_old`` again to assume the host's other load unchanged)."""
    def mean(n: int, samples: Sequence[Sequence[int]]) -> float:
        return sum(group_share_slowdown(n, s, cores) for s in samples) / len(samples) if samples else \
            group_share_slowdown(n, (), cores)
    return mean(new_threads, samples_new) / mean(old_threads, samples_old)


def shared_host(host: HostCluster, scale: float) -> HostCluster:
    """``host`` with its collectives ``scale`` times slower (module docstring): bandwidth ÷ ``scale``,
    per-message overhead × ``scale``, latency as it is (the kernel's loopback does not share the cores)."""
    if scale == 1.0:
        return host
    return replace(host, bandwidth_bytes_per_s=host.bandwidth_bytes_per_s / scale,
                   message_overhead_s=host.message_overhead_s * scale)


def busy_s(rank: RankTrace) -> float:
    """Seconds of the rank's step its main thread was at work: operators and host gaps, less the waits left
    inside operators (:attr:`TraceOp.hidden_waits`; the waits between operators are already outside both)."""
    return rank.op_s + rank.host_gap_s - sum(t for o in rank.ops for _, t in o.hidden_waits)


def collectives_cpu_s(collectives: Sequence[TraceCollective], host: HostCluster) -> float:
    """Seconds of CPU one rank spends in gloo's collectives: :func:`ring_time_s` summed, on ``host`` as fitted
    from the recording (unshared). On CPU gloo a collective *is* CPU work — its threads copy and reduce each
    ring step's S/n bytes and wake up once per step — and the fit's α (per message) and B (bytes per second)
    come from spans where each rank had its own core, so they stand for that work's per-step and per-byte cost.
    Checked against the threads' own CPU (schedstat, ``benchmarks/whatif_probe.py``): same order at 2
    processes (gpt DDP 3.3–3.8 ms modelled, 3.7–5.6 ms measured per rank); at 4 it under-counts it (median
    ×1.7 over 12 recordings: docs/traces.md, "The what-if on shared cores")."""
    return sum(ring_time_s(c, host) for c in collectives)


def demand_share_scale(job: TraceJob, world_size: int, host: HostCluster, cores: int) -> float:
    """How many times longer each operator takes at ``world_size`` ranks on ``cores`` shared cores than in
    the recording, when gloo's collectives are CPU work taken from the same cores: processor sharing
    (Kleinrock, "Queueing Systems" vol. 2, §4.4) of a work-conserving host, whose step cannot be shorter
    than the ranks' CPU demand over the cores. Each rank demands ``b + g_W`` CPU seconds per step: ``b``
    its busy time in the recording (:func:`busy_s`, the mean over the recorded ranks: what a rank with a core
    of its own took), ``g_W`` its collectives' CPU at ``world_size`` ranks (:func:`collectives_cpu_s` on the
    resized collectives, ``host`` unshared). So ``W`` ranks stretch each rank's work ×``W·(b + g_W)/(C·b)``
    once they outnumber the cores (×1 while each has a core of its own, ``W ≤ C``), over the recording's own
    stretch by the same rule (×1 for a recording of ``n ≤ C`` ranks: measured, at 2 processes on 2 cores a
    rank's busy time is its main thread's CPU and its run-queue wait, docs/traces.md). 1.0 when ``cores``
    is 0 (every rank its own core). The only inputs are the trace and the host (its cores, its fitted α and
    B); nothing is fitted to a recording at the new size."""
    if cores <= 0 or not job.ranks:
        return 1.0
    b = sum(busy_s(r) for r in job.ranks) / len(job.ranks)
    if b <= 0:
        return 1.0

    def stretch(n: int) -> float:  # W·(b + g_W)/(C·b) with more ranks than cores, 1 with a core each
        if n <= cores:
            return 1.0
        colls = job.collectives if n == job.world_size else resize(job, n).collectives
        return n * (b + collectives_cpu_s(colls, host)) / (cores * b)
    return stretch(world_size) / stretch(job.world_size)


def waits_outside(ops: Sequence[TraceOp]) -> tuple[TraceOp, ...]:
    """``ops`` with each wait left inside an operator (:attr:`TraceOp.hidden_waits`) made a wait the replay times:
    the operator is cut after the last launch of a collective it waited for, and its work after that cut
    (its duration less the recorded waits) becomes an operator that waits for those collectives, as the replay
    waits between operators. So the wait lasts from the rank's launch to the collective's end in the replay —
    the collective starting once every rank of its group has launched it (gloo's ring cannot go on before),
    timed by the network model on the host it runs on — where the recorded wait was what it was at the
    recorded size. A wait at the new size is not the recorded wait grown: measured, FSDP2's waits at 4
    processes were 66–86 ms per rank in 6 recordings whatever they were at 2 (6–37 ms; docs/traces.md). The
    cut keeps every launch at its place (those after the cut move to the second operator) and the host gap on
    the first; the first keeps the kernels (a what-if on the recording host does not read them)."""
    out: list[TraceOp] = []
    for o in ops:
        if not o.hidden_waits:
            out.append(o)
            continue
        waited = tuple(dict.fromkeys(k for k, _ in o.hidden_waits))
        work = max(0.0, o.duration_s - sum(t for _, t in o.hidden_waits))
        cut = min(work, max((t for k, t in o.launches if k in waited), default=0.0))
        out.append(replace(o, duration_s=cut, launches=tuple((k, t) for k, t in o.launches if t <= cut),
                           hidden_waits=()))
        out.append(TraceOp(o.name, work - cut, 0.0, waited,
                           tuple((k, t - cut) for k, t in o.launches if t > cut)))
    return tuple(out)


def with_wake_waits(job: TraceJob, big: TraceJob, cores: int) -> TraceJob:
    """``big`` (``job`` resized) with each collective's wait for a core (:func:`topotrain.traces.sched.
    wake_wait_s`): its gloo hops find every core busy unless the recorded ranks waited for it inside the
    operator that launched it (:attr:`TraceOp.hidden_waits`: FSDP2's all-gathers, during which every main
    thread sleeps)."""
    inside = {k for r in job.ranks for o in r.ops for k, _ in o.hidden_waits}
    colls = tuple(replace(c, wake_wait_s=wake_wait_s(c.ran_as, len(c.ranks), cores, k not in inside))
                  for k, c in enumerate(big.collectives))
    return replace(big, collectives=colls)


def on_shared_host(job: TraceJob, world_size: int, host: HostCluster, cores: int
                   ) -> tuple[TraceJob, HostCluster, float]:
    """The what-if at ``world_size`` ranks on the recording host of ``cores`` shared cores: the resized job
    with its hidden waits made waits the replay times (:func:`waits_outside`) and each collective's wait for a
    core when the ranks outnumber the cores (:func:`with_wake_waits`), the host its collectives run on
    (:func:`shared_host` at processor sharing's factor for gloo's threads, :func:`core_share_scale`) and the
    operators' scale (:func:`demand_share_scale`) — replay it as ``replay(job, host, scale)``. At the
    recorded size the job comes back unchanged (an own-host replay)."""
    if world_size == job.world_size:
        return job, host, 1.0
    scale = demand_share_scale(job, world_size, host, cores)
    shared = shared_host(host, core_share_scale(job.world_size, world_size, cores))
    big = with_wake_waits(job, resize(job, world_size), cores)
    return replace(big, ranks=tuple(replace(r, ops=waits_outside(r.ops)) for r in big.ranks)), shared, scale
