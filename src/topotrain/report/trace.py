"""The Chrome / Perfetto trace of one simulated iteration (Trace Event Format, JSON object form).

Layout (Google's "Trace Event Format" document: ``X`` complete events, ``M`` metadata, ``s``/``f`` flow
events, ``C`` counters; integer ``pid``/``tid`` as Perfetto's JSON importer expects):

* one *process* per pipeline stage (``pid = stage + 1``), named after the stage and its ranks. The task
  graph simulates one representative of each stage: the ranks of a stage run the same tasks at the same
  times (data- and tensor-parallel peers are symmetric), so they are *folded* into that one process, and
  its name says how many ranks it stands for;
* one *thread* per stream of that stage: ``compute`` (forward/backward/optimizer), ``tp/ep blocking`` (the
  tensor-, sequence- and expert-parallel collectives the engine ran inside compute tasks,
  :meth:`Task.blocking_slices`, drawn on their own track so that they are visible), ``dp`` (gradient
  buckets, ZeRO gathers) and one per pipeline send stream, named for people (:func:`track_name`:
  ``stage 0 → 1, forward activations``; ``stage 1 → 0, backward gradients``);
* every communication event's ``args`` carry what moved (:func:`comm_args`): the collective(s), their
  algorithm(s), the payload per rank (``bytes``) and the bytes on the wire of all its transfers;
* a flow arrow from every pipeline send to the compute task on the next stage that waits for it;
* a ``network`` process with one counter track per busiest link: the link's utilization (0–100 %) over the
  iteration, each collective's bytes on that link spread evenly over the collective's span (the average
  rate of the collective, not its per-phase rate: the integral of the track is exactly the bytes that
  crossed the link by those collectives' routed paths).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topotrain.util import jsonsafe
from topotrain.util.atomic import atomic_write_text

if TYPE_CHECKING:
    from topotrain.topology.graph import Topology
    from topotrain.training.engine import CommSpec, Task
    from topotrain.training.simulate import Result

#: Busiest directed links that get a utilization counter track.
COUNTER_LINKS = 4

_US = 1e6  # the trace's unit: microseconds
_FIXED_TIDS = {"compute": 1, "tp": 2, "dp": 3}


def _stream_kind(stream: str) -> str:
    """``stage0/compute`` → ``compute``; ``stage0/dp`` → ``dp``; ``p2p/f/0->1`` → itself."""
    return stream.split("/", 1)[1] if re.match(r"stage\d+/", stream) else stream


_P2P = re.compile(r"p2p/([fb])/(\d+)->(\d+)$")


def track_name(kind: str) -> str:
    """The name a person reads for a stream: ``p2p/f/0->1`` → ``stage 0 → 1, forward activations``,
    ``p2p/b/1->0`` → ``stage 1 → 0, backward gradients``; others as :func:`_stream_kind` gives them, the
    three fixed ones spelled out."""
    m = _P2P.match(kind)
    if m:
        what = "forward activations" if m.group(1) == "f" else "backward gradients"
        return f"stage {m.group(2)} → {m.group(3)}, {what}"
    return {"compute": "compute", "tp": "tp/ep blocking collectives (on the compute stream)",
            "dp": "dp: gradient buckets, ZeRO gathers"}.get(kind, kind)


def comm_args(spec: CommSpec | None) -> dict[str, Any]:
    """What a communication event moved: ``op`` and ``algorithm`` of its collective(s) (joined with ``+``
    where one step runs several), ``bytes`` (the payload each rank contributes, summed over them),
    ``wire_bytes`` (every transfer of every phase) and ``ranks``; an empty step (nothing to send) says so."""
    if spec is None or not spec.schedules:
        return {"op": "none", "algorithm": "none (nothing to send)", "bytes": 0, "wire_bytes": 0}
    scheds = spec.schedules
    return {"op": "+".join(sorted({str(getattr(x.op, "value", x.op)) for x in scheds})),
            "algorithm": "+".join(sorted({x.algorithm for x in scheds})),
            "bytes": int(sum(x.size_bytes for x in scheds)),
            "wire_bytes": int(sum(float(x.transfer_bytes(ph).sum()) for x in scheds for ph in x.phases)),
            "ranks": int(sum(x.num_ranks for x in scheds)), "collectives": len(scheds)}


def _ranks_of_stage(result: Result, stage: int) -> list[int]:
    p = result.plan
    return sorted(p.rank(d, t, stage, c) for d in range(p.dp) for c in range(p.cp) for t in range(p.tp))


def _span(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    head = ", ".join(map(str, ranks[:4]))
    return head + (f", … ({len(ranks)})" if len(ranks) > 4 else "")


def _spec_link_bytes(spec: CommSpec, topo: Topology, wanted: dict[int, int]) -> dict[int, float]:
    """Bytes that ``spec``'s transfers put on each wanted directed link (routed paths)."""
    out: dict[int, float] = {}
    for s in spec.schedules:
        for ph in s.phases:
            nbytes = s.transfer_bytes(ph)
            for a, b, nb in zip(ph.src.tolist(), ph.dst.tolist(), nbytes.tolist(), strict=True):
                if a == b or nb <= 0:
                    continue
                for lid in topo.route(s.ranks[a], s.ranks[b]):
                    if lid in wanted:
                        out[lid] = out.get(lid, 0.0) + float(nb)
    return out


def link_busy_intervals(tasks: Iterable[Task], topo: Topology,
                        links: list[int]) -> dict[int, list[tuple[float, float, float]]]:
    """Per wanted link: ``(start_s, end_s, bytes)`` of every collective (communication task or blocking
    collective) whose routed transfers cross it."""
    wanted = {lid: i for i, lid in enumerate(links)}
    memo: dict[str, dict[int, float]] = {}
    out: dict[int, list[tuple[float, float, float]]] = {lid: [] for lid in links}

    def add(spec: CommSpec, a: float, b: float) -> None:
        if not spec.schedules or not b > a:
            return
        if spec.key not in memo:
            memo[spec.key] = _spec_link_bytes(spec, topo, wanted)
        for lid, nb in memo[spec.key].items():
            out[lid].append((a, b, nb))

    for t in tasks:
        if t.comm is not None:
            add(t.comm, t.start_s, t.end_s)
        if t.blocking:
            by_label: dict[str, CommSpec] = {}
            for blk in t.blocking:
                by_label.setdefault(blk.label, blk.comm)
            for label, a, b in t.blocking_slices():
                if label in by_label:
                    add(by_label[label], a, b)
    return out


def utilization_steps(intervals: list[tuple[float, float, float]],
                      capacity_bytes_per_s: float) -> list[tuple[float, float]]:
    """Step function ``(time_s, utilization)`` of a link used by ``intervals`` (each one's bytes at its
    average rate ``bytes / (end - start)``), from the first start to the last end (where it is 0)."""
    edges: dict[float, float] = {}
    for a, b, nb in intervals:
        rate = nb / (b - a) / capacity_bytes_per_s
        edges[a] = edges.get(a, 0.0) + rate
        edges[b] = edges.get(b, 0.0) - rate
    steps, level = [], 0.0
    for ts in sorted(edges):
        level += edges[ts]
        steps.append((ts, max(0.0, level) if abs(level) > 1e-12 else 0.0))
    return steps


def trace_events(result: Result, topology: Topology | None = None,
                 counter_links: int = COUNTER_LINKS) -> list[dict[str, Any]]:
    """The trace's events (see the module docstring); link counters need ``topology``."""
    ev: list[dict[str, Any]] = []
    p = result.plan
    tids: dict[tuple[int, str], int] = {}
    gpus = topology.gpus if topology is not None else None

    def tid_of(stage: int, kind: str) -> int:
        key = (stage, kind)
        if key not in tids:
            used = [v for (s, _), v in tids.items() if s == stage]
            tids[key] = _FIXED_TIDS.get(kind, max([10, *used]) + 1)
            label = track_name(kind)
            ev.append({"ph": "M", "name": "thread_name", "pid": stage + 1, "tid": tids[key],
                       "args": {"name": label}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": stage + 1, "tid": tids[key],
                       "args": {"sort_index": tids[key]}})
        return tids[key]

    for s in range(p.pp):
        ranks = _ranks_of_stage(result, s)
        rep = f"rank {ranks[0]}" + (f" = {gpus[ranks[0]]}" if gpus is not None and ranks[0] < len(gpus) else "")
        folded = f"; {len(ranks)} symmetric ranks folded into one" if len(ranks) > 1 else ""
        ev.append({"ph": "M", "name": "process_name", "pid": s + 1,
                   "args": {"name": f"stage {s} (ranks {_span(ranks)}{folded}; shown: {rep})"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": s + 1, "args": {"sort_index": s + 1}})
        ev.append({"ph": "M", "name": "process_labels", "pid": s + 1,
                   "args": {"labels": f"dp={p.dp} tp={p.tp} pp={p.pp}" + (f" cp={p.cp}" if p.cp > 1 else "")}})

    memo: dict[str, dict[str, Any]] = {}

    def comm_of(spec: CommSpec | None) -> dict[str, Any]:
        if spec is None:
            return comm_args(None)
        if spec.key not in memo:
            memo[spec.key] = comm_args(spec)
        return memo[spec.key]

    consumers: dict[int, list[Task]] = {}
    for t in result.tasks:
        for d in t.deps:
            consumers.setdefault(d, []).append(t)
    flow_id = 0
    for t in result.tasks:
        if not (t.end_s >= t.start_s):
            continue
        pid = t.stage + 1
        tid = tid_of(t.stage, _stream_kind(t.stream))
        args: dict[str, Any] = {"task": t.id, "stream": t.stream}
        if t.comm is not None or t.category.endswith("comm"):
            args.update(comm_of(t.comm))
        ev.append({"name": t.name, "cat": t.category, "ph": "X", "ts": t.start_s * _US,
                   "dur": (t.end_s - t.start_s) * _US, "pid": pid, "tid": tid, "args": args})
        slices = t.blocking_slices()
        if slices:
            btid = tid_of(t.stage, "tp")
            specs: dict[str, CommSpec] = {}
            for blk in t.blocking:
                specs.setdefault(blk.label, blk.comm)
            for label, a, b in slices:
                ev.append({"name": label, "cat": "tp-comm", "ph": "X", "ts": a * _US, "dur": (b - a) * _US,
                           "pid": pid, "tid": btid, "args": {"in": t.name, **comm_of(specs.get(label))}})
        if t.category == "pp-comm":
            for c in consumers.get(t.id, []):
                if c.stage == t.stage or not (c.start_s >= t.end_s):
                    continue
                flow_id += 1
                ev.append({"ph": "s", "id": flow_id, "name": "pipeline send", "cat": "pp-flow",
                           "ts": t.start_s * _US, "pid": pid, "tid": tid})
                ev.append({"ph": "f", "bp": "e", "id": flow_id, "name": "pipeline send", "cat": "pp-flow",
                           "ts": c.start_s * _US, "pid": c.stage + 1, "tid": tid_of(c.stage, _stream_kind(c.stream))})
    if topology is not None and result.link_utilization_top and counter_links > 0:
        net_pid = p.pp + 1
        ev.append({"ph": "M", "name": "process_name", "pid": net_pid,
                   "args": {"name": "network: busiest links' utilization (%)"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": net_pid, "args": {"sort_index": net_pid}})
        links = [topology.link_id(a, b) for a, b, _ in result.link_utilization_top[:counter_links]]
        busy = link_busy_intervals(result.tasks, topology, links)
        cap = topology.capacity_bytes_per_s
        for lid in links:
            lk = topology.links[lid]
            name = f"{lk.src}→{lk.dst}"
            steps = utilization_steps(busy[lid], float(cap[lid]))
            if not steps or steps[0][0] > 0:
                steps.insert(0, (0.0, 0.0))
            for ts, u in steps:
                ev.append({"ph": "C", "name": name, "pid": net_pid, "ts": ts * _US,
                           "args": {"utilization %": round(100.0 * u, 3)}})
    return ev


def write_trace(result: Result, path: str | Path, topology: Topology | None = None) -> None:
    """Write :func:`trace_events` as a Chrome / Perfetto JSON trace, atomically (open it in
    ui.perfetto.dev or chrome://tracing)."""
    doc = {"traceEvents": trace_events(result, topology), "displayTimeUnit": "ms",
           "otherData": {"scenario": result.scenario, "model": result.model, "network": result.network,
                         "iteration_time_s": result.iteration_time_s,
                         "folded": "one process per pipeline stage: its data- and tensor-parallel ranks "
                                   "are symmetric and run the same tasks"}}
    atomic_write_text(path, jsonsafe.dumps(doc), make_parents=True)
