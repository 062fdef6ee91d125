"""A simulated topotrain iteration as Chakra execution traces, one file per GPU (docs/traces.md, "Chakra"):
the task graph of :mod:`topotrain.training.builder`, after the engine ran it, unfolded per GPU.

The graph holds one compute stream per pipeline stage and communication tasks that carry the concrete
schedules of every GPU they stand for (the builder's symmetry). Per GPU ``r`` (NPU id = its global rank in
the plan; its stage from :meth:`Plan.rank`), in task order:

* a compute task of its stage → a ``COMP_NODE`` (``duration_micros`` = its compute seconds, ``is_cpu_op``
  false), split at each blocking collective (Megatron's TP/SP/EP/CP collectives inside a layer), which
  becomes a ``COMM_COLL_NODE`` between the pieces — fully exposed: the chunked overlap of
  ``tp_comm_overlap`` and the ``beside_s`` of ring attention have no Chakra form;
* a communication task → one ``COMM_COLL_NODE`` per schedule of the task that includes the GPU
  (``comm_type``, ``comm_size`` = the schedule's bytes in nccl-tests' convention, ``pg_name``); a pipeline
  transfer (a two-rank ``p2p`` schedule) → ``COMM_SEND_NODE`` on the sender (``comm_dst``) and
  ``COMM_RECV_NODE`` on the receiver (``comm_src``), ``comm_tag`` the task's id;
* ``data_deps``: the task's dependencies that have a node on this GPU, and the previous task of the same
  stream (a stream runs its tasks in order, as the engine does).

Process groups: each distinct rank set of the collectives is a ``pg_name`` (ASTRA-sim's decimal
communicator id: ``0`` every GPU, the others in ``<prefix>.comm_groups.json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topotrain.collectives.schedule import Schedule
from topotrain.traces.chakra import COMM_TYPE_OF_OP, DEFAULT_GROUP, VERSION
from topotrain.traces.chakra_io import write_et
from topotrain.traces.chakra_pb2 import COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE, COMP_NODE, messages
from topotrain.training.engine import Task
from topotrain.training.plan import Plan
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError


def _stages(plan: Plan) -> list[int]:
    """The pipeline stage of every global rank."""
    stage = [0] * plan.gpus
    for d in range(plan.dp):
        for t in range(plan.tp):
            for s in range(plan.pp):
                for c in range(plan.cp):
                    stage[plan.rank(d, t, s, c)] = s
    return stage


def _group_ids(tasks: Sequence[Task], index: dict[str, int], world: int) -> dict[tuple[int, ...], str]:
    """``pg_name`` of every rank set a collective runs on: ``0`` for every GPU, others from 1 in order."""
    ids: dict[tuple[int, ...], str] = {tuple(range(world)): DEFAULT_GROUP}
    for t in tasks:
        specs = ([t.comm] if t.comm is not None else []) + [b.comm for b in t.blocking]
        for spec in specs:
            for s in spec.schedules:
                if s.algorithm != "p2p":
                    key = tuple(sorted(index[g] for g in s.ranks))
                    ids.setdefault(key, str(len(ids)))
    return ids


def iteration_nodes(plan: Plan, tasks: Sequence[Task], gpus: Sequence[str], name: str) -> list[tuple[Any, list[Any]]]:
    """Per GPU of the plan (global rank order): its Chakra ``GlobalMetadata`` and nodes (module docstring)."""
    if plan.sync != "allreduce":
        raise ConfigError("plan.sync", f"{plan.sync} has no Chakra export", "export a plan with sync: allreduce")
    index = {g: r for r, g in enumerate(gpus[:plan.gpus])}
    stage = _stages(plan)
    pg = _group_ids(tasks, index, plan.gpus)
    return [_gpu_nodes(tasks, index, pg, r, gpus[r], stage[r], plan.gpus, name) for r in range(plan.gpus)]


def _gpu_nodes(tasks: Sequence[Task], index: dict[str, int], pg: dict[tuple[int, ...], str], r: int, me: str,
               stage: int, world: int, name: str) -> tuple[Any, list[Any]]:
    """GPU ``me`` (rank ``r`` of pipeline stage ``stage``): its metadata and nodes."""
    m = messages()
    meta = m.GlobalMetadata(version=VERSION)
    meta.attr.add(name="job_name", string_val=name)
    meta.attr.add(name="rank", int64_val=r)
    meta.attr.add(name="world_size", int64_val=world)
    nodes: list[Any] = []
    last_of_task: dict[int, int] = {}
    last_of_stream: dict[str, int] = {}

    def node(label: str, kind: int, deps: list[int], dur_s: float = 0.0, task_id: int = -1) -> Any:
        n = m.Node(id=len(nodes), name=label, type=kind, duration_micros=max(0, round(dur_s * 1e6)))
        n.data_deps.extend(sorted(set(deps)))
        n.attr.add(name="is_cpu_op", bool_val=False)
        if kind == COMP_NODE:  # exact seconds behind the microseconds, and which task (traces.chakra reads both)
            n.attr.add(name="duration_s", double_val=dur_s)
            n.attr.add(name="op_index", int64_val=task_id)
        nodes.append(n)
        return n

    def comm(t: Task, s: Schedule, deps: list[int]) -> int:
        if s.algorithm == "p2p":
            send = s.ranks[0] == me
            n = node(f"{'send' if send else 'recv'} {t.name}", COMM_SEND_NODE if send else COMM_RECV_NODE, deps)
            n.attr.add(name="comm_dst" if send else "comm_src", int32_val=index[s.ranks[1 if send else 0]])
            n.attr.add(name="comm_tag", int32_val=t.id)
        else:
            n = node(f"{s.op.value} {t.name}", COMM_COLL_NODE, deps)
            n.attr.add(name="comm_type", int64_val=COMM_TYPE_OF_OP[s.op.value])
            key = tuple(sorted(index[g] for g in s.ranks))
            n.attr.add(name="pg_name", string_val=pg[key])
            n.attr.add(name="pg_ranks").int64_list.values.extend(key)
        n.attr.add(name="comm_size", int64_val=int(s.size_bytes))
        return int(n.id)

    for t in tasks:
        mine_compute = t.comm is None and t.stream.startswith(f"stage{stage}/")
        scheds = [s for s in t.comm.schedules if me in s.ranks] if t.comm is not None else []
        if not mine_compute and not scheds:
            continue
        deps = [last_of_task[d] for d in t.deps if d in last_of_task]
        if t.stream in last_of_stream:
            deps.append(last_of_stream[t.stream])
        if mine_compute:
            done = 0.0
            for b in sorted(t.blocking, key=lambda b: b.offset_s):
                cut = min(max(b.offset_s, done), t.duration_s)
                piece = node(t.name, COMP_NODE, deps, cut - done, t.id)
                deps, done = [piece.id], cut
                for s in b.comm.schedules:
                    if me in s.ranks:
                        deps = [comm(t, s, deps)]
            last = node(t.name, COMP_NODE, deps, t.duration_s - done, t.id).id
        else:
            ids = [comm(t, s, deps) for s in scheds]  # the schedules of one task run together, after its deps
            last = ids[0] if len(ids) == 1 else node(f"{t.name} (done)", COMP_NODE, ids, 0.0, t.id).id
        last_of_task[t.id] = last_of_stream[t.stream] = last
    return meta, nodes


def export_iteration(plan: Plan, tasks: Sequence[Task], gpus: Sequence[str], prefix: str | Path,
                     name: str = "") -> list[Path]:
    """Write :func:`iteration_nodes` as ``<prefix>.<rank>.et`` and, when a collective runs on fewer than every
    GPU, ``<prefix>.comm_groups.json`` (ASTRA-sim's communicator groups); the paths written."""
    written = [write_et(f"{prefix}.{r}.et", meta, nodes)
               for r, (meta, nodes) in enumerate(iteration_nodes(plan, tasks, gpus, name or Path(prefix).name))]
    index = {g: r for r, g in enumerate(gpus[:plan.gpus])}
    groups = {v: list(k) for k, v in _group_ids(tasks, index, plan.gpus).items() if v != DEFAULT_GROUP}
    if groups:
        written.append(atomic_write_text(f"{prefix}.comm_groups.json", json.dumps(groups, sort_keys=True) + "\n",
                                         make_parents=True, field="--out"))
    return written
