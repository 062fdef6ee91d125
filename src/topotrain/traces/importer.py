"""Every rank's Kineto trace (and Execution Trace) of one step → a :class:`~topotrain.traces.model.TraceJob`.

Per rank (:func:`rank_trace`): the main thread's top-level operators in program order, each with its
measured span; the collectives it launched (the c10d operators nested in it) and the seconds into it at
which each was launched; the collectives it waits for, from the Execution Trace's data dependencies (the
first operator whose subtree reads a storage the collective wrote, as dPRO builds its dependency graph from
the framework's data flow — Hu et al., MLSys 2022); and the host gap before it, the thread's time outside
any operator, less the part spent waiting for a collective it needs (Lumos, MLSys 2025, keeps such gaps as
CPU time of the step). Without an ET, an operator waits for the collectives whose backend span ended
before it started (a timestamp guess, said so in the job's name).

Across ranks (:func:`import_job`): the i-th collective a rank launches on a group is the i-th of every
member (c10d numbers them so); its op and size must agree, every member must have it, and the backend spans
of one symmetric collective (allreduce, allgather, reduce-scatter, all-to-all) must overlap on all ranks
(an allreduce cannot end on one rank before it starts on another). A violated check is one ConfigError
naming the file and the event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from topotrain.traces.model import RankTrace, TraceCollective, TraceJob, TraceOp
from topotrain.traces.readers import (
    C10D_OPS,
    EtNode,
    Event,
    KinetoRank,
    collective_bytes,
    kind_of,
    load_json,
    read_et,
    read_kineto,
)
from topotrain.util.errors import ConfigError

#: Collectives whose every rank's result needs every rank's input: none can end on one rank before it has
#: started on all (a broadcast's receivers, a reduce's senders are independent of each other).
SYMMETRIC_OPS = frozenset({"allreduce", "allgather", "reduce-scatter", "all-to-all"})
#: Backend spans of one collective on two ranks may miss each other by this much before the clocks are
#: said to disagree (the spans' own start/end are taken on each rank's threads: a few µs apart).
CLOCK_SLACK_S = 200e-6
_FIX_FILES = "pass every rank's Kineto JSON (and its ET) of the same recorded step"


@dataclass(frozen=True)
class Launch:
    """A collective launched on one rank: its op, bytes, c10d event, the top-level operator it is in and
    the seconds into it; its storages (what its data dependencies are matched on); its backend span."""

    op: str
    size_bytes: int
    event: Event
    top: int
    offset_s: float
    storages: frozenset[int]
    span: Event | None = None


@dataclass(frozen=True)
class RankParts:
    """One rank's step before the ranks are joined: its Kineto view, its top-level operators, the events
    nested in each, and its launches in order."""

    kineto: KinetoRank
    tops: tuple[Event, ...]
    nested: tuple[tuple[Event, ...], ...]
    launches: tuple[Launch, ...]
    et: dict[int, EtNode] | None


def split_rank(k: KinetoRank, et: dict[int, EtNode] | None) -> RankParts:
    """The top-level operators of ``k``'s main thread (events not inside another), the events nested in
    each, and the collectives launched, matched in order to the backend's spans."""
    tops: list[Event] = []
    nested: list[list[Event]] = []
    for e in k.main:
        if tops and e.end_us <= tops[-1].end_us + 1e-3 and e.ts_us >= tops[-1].ts_us - 1e-3:
            nested[-1].append(e)
        else:
            tops.append(e)
            nested.append([e])
    launches: list[Launch] = []
    for i, (top, inner) in enumerate(zip(tops, nested, strict=True)):
        for e in inner:
            op = C10D_OPS.get(e.name)
            if op is None:
                continue
            node = et.get(e.rf_id) if et is not None and e.rf_id is not None else None
            size = node.in_bytes if node is not None and node.in_bytes else collective_bytes(e)
            launches.append(Launch(op, size, e, i, (e.end_us - top.ts_us) * 1e-6,
                                   node.reads | node.writes if node is not None else frozenset()))
    spans = k.backend_events
    if len(spans) != len(launches):
        extra = spans[len(launches)] if len(spans) > len(launches) else launches[len(spans)].event
        raise ConfigError(f"{k.path}: {extra.name} at ts {extra.ts_us:.3f}",
                          f"rank {k.rank} launched {len(launches)} collectives and its backend ran {len(spans)}",
                          "profile one whole step (the profiler stopped inside a collective?)")
    launches = [Launch(x.op, x.size_bytes, x.event, x.top, x.offset_s, x.storages, s)
                for x, s in zip(launches, spans, strict=True)]
    return RankParts(k, tuple(tops), tuple(tuple(n) for n in nested), tuple(launches), et)


def _reads(parts: RankParts, i: int) -> frozenset[int]:
    """Storages read by top-level operator ``i``'s subtree (ET), c10d operators left out."""
    if parts.et is None:
        return frozenset()
    out: set[int] = set()
    for e in parts.nested[i]:
        node = parts.et.get(e.rf_id) if e.rf_id is not None else None
        if node is not None and e.name not in C10D_OPS:
            out |= node.reads
    return frozenset(out)


def rank_trace(parts: RankParts, index: Sequence[int], t0_us: float) -> RankTrace:
    """One rank's operators with waits and host gaps; ``index[j]`` is the job-wide index of the rank's
    ``j``-th launch; ``t0_us`` the earliest rank's step start."""
    k = parts.kineto
    launched_at = {j: x.top for j, x in enumerate(parts.launches)}
    pending = set(range(len(parts.launches)))
    waits: dict[int, list[int]] = {}
    for i in range(len(parts.tops)):
        reads = _reads(parts, i)
        for j in sorted(pending):
            x = parts.launches[j]
            if launched_at[j] >= i:
                continue
            hit = bool(reads & x.storages) if parts.et is not None else (
                x.span is not None and x.span.end_us <= parts.tops[i].ts_us)
            if hit:
                waits.setdefault(i, []).append(j)
                pending.discard(j)
    ops: list[TraceOp] = []
    prev_end = k.step.ts_us
    for i, top in enumerate(parts.tops):
        w = waits.get(i, [])
        ready = max([prev_end] + [min(s.end_us, top.ts_us) for j in w if (s := parts.launches[j].span) is not None])
        ops.append(TraceOp(top.name, top.dur_us * 1e-6, max(0.0, top.ts_us - ready) * 1e-6,
                           tuple(index[j] for j in w),
                           tuple((index[j], x.offset_s) for j, x in enumerate(parts.launches) if x.top == i)))
        prev_end = max(prev_end, top.end_us)
    # the step ends once every collective is done (DDP waits for all buckets before the optimizer's step)
    last = sorted(pending)
    ready = max([prev_end] + [min(s.end_us, k.step.end_us) for j in last if (s := parts.launches[j].span) is not None])
    ops.append(TraceOp("(step end)", 0.0, max(0.0, k.step.end_us - ready) * 1e-6, tuple(index[j] for j in last)))
    return RankTrace(k.rank, (k.step.ts_us - t0_us) * 1e-6, k.step.dur_us * 1e-6, tuple(ops), k.path)


def _check_clocks(members: list[RankParts], seq: int, spans: list[Event]) -> None:
    """Backend spans of one collective must overlap on all its ranks, within :data:`CLOCK_SLACK_S`."""
    late = max(range(len(spans)), key=lambda m: spans[m].ts_us)
    early = min(range(len(spans)), key=lambda m: spans[m].end_us)
    gap_s = (spans[late].ts_us - spans[early].end_us) * 1e-6
    if gap_s > CLOCK_SLACK_S:
        p, q = members[late].kineto, members[early].kineto
        raise ConfigError(f"{p.path}: {spans[late].name} (collective #{seq}) at ts {spans[late].ts_us:.3f}",
                          f"starts {gap_s * 1e3:.3f} ms after the same collective ended on rank {q.rank} "
                          f"({q.path}): the ranks' clocks disagree",
                          "record every rank on one host, or synchronize the hosts' clocks (chrony/PTP) and "
                          "record again")


def import_job(paths: Sequence[str | Path], name: str = "") -> TraceJob:
    """The job recorded in ``paths``: every rank's Kineto JSON, and optionally each rank's ET (matched to its
    Kineto file by the recording process's pid). Files may be ``.json.gz``."""
    if not paths:
        raise ConfigError("traces", "no files given", _FIX_FILES)
    kinetos: dict[int, KinetoRank] = {}
    ets: dict[int | str, tuple[str, dict[int, EtNode]]] = {}
    for p in paths:
        path = Path(p)
        doc = load_json(path)
        kind = kind_of(doc)
        if kind == "kineto":
            k = read_kineto(doc, str(path))
            if k.rank in kinetos:
                raise ConfigError(str(path), f"is rank {k.rank} again (also {kinetos[k.rank].path})",
                                  "pass one Kineto file per rank")
            kinetos[k.rank] = k
        elif kind == "et":
            pid, nodes = read_et(doc, str(path))
            ets[pid] = (str(path), nodes)
        else:
            raise ConfigError(str(path), "is neither a Kineto trace (traceEvents) nor an Execution Trace "
                              "(nodes, schema)", _FIX_FILES)
    if not kinetos:
        raise ConfigError("traces", f"no Kineto trace among {len(paths)} file(s) (only Execution Traces)", _FIX_FILES)
    world = {k.world_size for k in kinetos.values()}
    if len(world) > 1:
        raise ConfigError("traces", f"the files disagree on the world size ({sorted(world)})", _FIX_FILES)
    n = world.pop()
    missing = sorted(set(range(n)) - set(kinetos))
    if missing:
        have = ", ".join(f"{r} ({Path(kinetos[r].path).name})" for r in sorted(kinetos))
        raise ConfigError("traces", f"rank {missing[0]} of {n} is missing (have ranks {have})", _FIX_FILES)
    steps = {k.step.name for k in kinetos.values()}
    if len(steps) > 1:
        odd = next(k for k in kinetos.values() if k.step.name != kinetos[0].step.name)
        raise ConfigError(f"{odd.path}: {odd.step.name}", f"is not the step rank 0 recorded ({kinetos[0].step.name})",
                          _FIX_FILES)
    pids = {k.pid: r for r, k in kinetos.items()}
    for pid, (et_path, _) in ets.items():
        if pid not in pids:
            raise ConfigError(et_path, f"is the Execution Trace of process {pid}, which no Kineto file recorded",
                              _FIX_FILES)
    if ets and len(ets) != n:
        lacking = next(r for r in range(n) if kinetos[r].pid not in ets)
        raise ConfigError(kinetos[lacking].path, f"rank {lacking} has no Execution Trace, and {len(ets)} other "
                          "rank(s) have one", "pass every rank's ET (rank<r>.et.json), or none (dependencies are "
                          "then guessed from timestamps)")
    use_et = bool(ets)
    parts = [split_rank(kinetos[r], ets[kinetos[r].pid][1] if use_et else None) for r in range(n)]
    group_name, group = next(iter(parts[0].kineto.groups.items()))
    counts = [len(p.launches) for p in parts]
    for r, rp in enumerate(parts):  # a collective with no peer: one rank launched more than another
        if counts[r] != counts[0]:
            more, less = (rp, parts[0]) if counts[r] > counts[0] else (parts[0], rp)
            x = more.launches[len(less.launches)]
            raise ConfigError(f"{more.kineto.path}: {x.event.name} at ts {x.event.ts_us:.3f}",
                              f"collective #{len(less.launches)} ({x.op}, {x.size_bytes} B) on rank {more.kineto.rank} "
                              f"has no peer on rank {less.kineto.rank} ({less.kineto.path} has {len(less.launches)})",
                              _FIX_FILES)
    colls: list[TraceCollective] = []
    for i in range(counts[0]):
        xs = [p.launches[i] for p in parts]
        for rp, x in zip(parts, xs, strict=True):
            if (x.op, x.size_bytes) != (xs[0].op, xs[0].size_bytes):
                raise ConfigError(f"{rp.kineto.path}: {x.event.name} at ts {x.event.ts_us:.3f}",
                                  f"collective #{i} is {x.op} of {x.size_bytes} B on rank {rp.kineto.rank} and "
                                  f"{xs[0].op} of {xs[0].size_bytes} B on rank 0: no matching peer", _FIX_FILES)
        spans = [x.span for x in xs if x.span is not None]
        if xs[0].op in SYMMETRIC_OPS:
            _check_clocks(parts, i, spans)
            net_s = (min(s.end_us for s in spans) - max(s.ts_us for s in spans)) * 1e-6
        else:  # a broadcast or reduce: its quickest rank's span
            net_s = min(s.dur_us for s in spans) * 1e-6
        colls.append(TraceCollective(xs[0].op, xs[0].size_bytes, group_name, group,
                                     tuple(s.dur_us * 1e-6 for s in spans), max(net_s, 0.0)))
    t0 = min(rp.kineto.step.ts_us for rp in parts)
    t1 = max(rp.kineto.step.end_us for rp in parts)
    ranks = tuple(rank_trace(rp, range(counts[0]), t0) for rp in parts)
    label = name or Path(parts[0].kineto.path).parent.name
    if not use_et:
        label += " (dependencies from timestamps: no Execution Trace)"
    return TraceJob(n, parts[0].kineto.backend, ranks, tuple(colls), (t1 - t0) * 1e-6, label)
