"""What-if on a recorded job: the same step at another data-parallel degree, or on a host with another
number of cores.

* :func:`resize` — the job at ``world_size`` ranks: rank ``r`` runs the operators of recorded rank
  ``r mod n`` (data parallelism: every rank runs the same model on its own batch), and every collective
  spans the new group at its recorded size (a DDP gradient bucket is as large on any number of ranks; the
  network model times the longer ring), except an FSDP2 unit's all-gather and reduce-scatter, whose size
  is the unit's parameters each padded to a multiple of the group size (:func:`fsdp_padded_numel`). This
  is dPRO's and Lumos' way of changing the data-parallel degree of a recorded graph (Hu et al., MLSys
  2022, §5; Liang et al., MLSys 2025, §4.3).
* :func:`core_share_scale` — how much slower each operator runs when ``n`` processes of ``threads``
  busy threads each share ``cores`` cores, as processor sharing gives it (Kleinrock, "Queueing Systems"
  vol. 2, §4.4): a thread gets ``min(1, cores / (n · threads))`` of a core, so an operator recorded at
  ``n_old`` processes lasts ``max(1, n_new·t/c) / max(1, n_old·t/c)`` times as long at ``n_new``. Other
  users of the host share the cores too: given their runnable threads ``b`` at each run (measured, e.g.
  ``procs_running`` of /proc/stat), the ratio is ``max(1, (n_new·t + b_new)/c) / max(1, (n_old·t + b_old)/c)``;
  a recording on a loaded machine carries that load in its durations.
* :func:`shared_host` — the recording host's loopback at that share: on CPU gloo a collective is CPU work
  (copies and reductions on gloo's threads; the bandwidth fitted from a CPU trace is that work's rate, far
  below the loopback's), so a core shared by more processes slows the collectives as it slows the
  operators: the fitted bandwidth is divided by the same factor and the per-message overhead multiplied.
  (Before this, the what-if slowed the operators and left the collectives at the 2-process rate.)
"""

from __future__ import annotations

from dataclasses import replace

from topotrain.traces.cluster import HostCluster
from topotrain.traces.model import RankTrace, TraceCollective, TraceJob
from topotrain.util.errors import ConfigError


def resize(job: TraceJob, world_size: int) -> TraceJob:
    """``job`` at ``world_size`` data-parallel ranks (see the module's docstring). Its measured figures are
    the recorded job's (nothing was measured at the new size)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError("--world", f"must be an integer >= 1, got {world_size!r}", "give e.g. --world 4")
    groups = {c.group for c in job.collectives}
    if any(c.ranks != tuple(range(job.world_size)) for c in job.collectives) or len(groups) > 1:
        raise ConfigError("--world", "the job has collectives on subgroups of its ranks (not plain data parallelism)",
                          "resize only data-parallel jobs whose collectives span all ranks")
    ranks = tuple(range(world_size))
    colls = tuple(TraceCollective(c.op, fsdp_resized_bytes(c, world_size), c.group, ranks, (), 0.0, c.param_shapes)
                  for c in job.collectives)
    by_rank = {r.rank: r for r in job.ranks}
    new_ranks = tuple(RankTrace(r, by_rank[r % job.world_size].start_s, by_rank[r % job.world_size].step_s,
                                by_rank[r % job.world_size].ops, by_rank[r % job.world_size].source)
                      for r in ranks)
    return replace(job, world_size=world_size, ranks=new_ranks, collectives=colls,
                   name=f"{job.name} at {world_size} ranks")


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


def shared_host(host: HostCluster, scale: float) -> HostCluster:
    """``host`` with its collectives ``scale`` times slower (module docstring): bandwidth ÷ ``scale``,
    per-message overhead × ``scale``, latency as it is (the kernel's loopback does not share the cores)."""
    if scale == 1.0:
        return host
    return replace(host, bandwidth_bytes_per_s=host.bandwidth_bytes_per_s / scale,
                   message_overhead_s=host.message_overhead_s * scale)
