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
    KinetoSteps,
    backend_span_op,
    collective_bytes,
    describe_steps,
    kind_of,
    load_json,
    read_et,
    read_kineto_steps,
    size_argument,
)
from topotrain.traces.work import op_kernels
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
    """A collective launched on one rank: its op, bytes, c10d event, the top-level operator it is in, its
    storages (what its data dependencies are matched on) and its backend span."""

    op: str
    size_bytes: int
    event: Event
    top: int
    storages: frozenset[int]
    span: Event | None = None
    param_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def synchronous(self) -> bool:
        """The c10d call returned only once the collective had finished on this rank (gloo on a busy CPU,
        FSDP's all-gathers): the call's own time is a wait."""
        return self.span is not None and self.span.end_us <= self.event.end_us

    @property
    def at_us(self) -> float:
        """When the collective was handed to the backend: its span's start on this rank, within the c10d
        call (a call descheduled on a busy CPU can last longer than the collective's start)."""
        if self.span is None:
            return self.event.end_us
        return max(self.event.ts_us, min(self.span.ts_us, self.event.end_us))


@dataclass(frozen=True)
class RankParts:
    """One rank's step before the ranks are joined: its Kineto view, its top-level operators, the events
    nested in each, and its launches in order."""

    kineto: KinetoRank
    tops: tuple[Event, ...]
    nested: tuple[tuple[Event, ...], ...]
    launches: tuple[Launch, ...]
    et: dict[int, EtNode] | None


#: FSDP2's copy-in operators (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): a reduce-scatter's
#: ``chunk_cat`` takes the unit's unsharded gradients (the parameters' shapes), an all-gather's
#: ``all_gather_copy_in`` its padded shards (one flat size each: ⌈d0/W⌉ · rest).
FSDP_CHUNK_CAT, FSDP_COPY_IN = "fsdp::chunk_cat", "fsdp::all_gather_copy_in"


def _first_arg_shapes(e: Event, node: EtNode | None) -> tuple[tuple[int, ...], ...] | None:
    """The shapes of the tensor list that is ``e``'s first argument (the ET's ``shapes``, else Kineto's
    ``Input Dims``); None when neither gives a list of non-empty integer shapes."""
    raw = node.in_shapes[0] if node is not None and node.in_shapes else (e.dims[0] if e.dims else None)
    if not isinstance(raw, list) or not raw or not all(
            isinstance(s, list) and s and all(type(d) is int and d >= 0 for d in s) for s in raw):
        return None
    return tuple(tuple(s) for s in raw)


def _padded(shapes: tuple[tuple[int, ...], ...], world: int) -> int:
    """The unit's padded elements on ``world`` ranks (:func:`topotrain.traces.whatif.fsdp_padded_numel`)."""
    return sum(_shard_numels(shapes, world)) * world


def _shard_numels(shapes: tuple[tuple[int, ...], ...], world: int) -> tuple[int, ...]:
    """Each parameter's padded shard (elements) on ``world`` ranks: ⌈d0/W⌉ · the other dims."""
    out = []
    for s in shapes:
        rest = 1
        for d in s[1:]:
            rest *= d
        out.append(-(-s[0] // world) * rest)
    return tuple(out)


def fsdp_units(k: KinetoRank, nested: list[list[Event]], et: dict[int, EtNode] | None,
               ops: list[str]) -> list[tuple[tuple[int, ...], ...]]:
    """For each launch (c10d events in program order, ``ops`` their collective ops), the FSDP2 unit's
    parameter shapes it moves, or ``()``: a reduce-scatter takes the ``fsdp::chunk_cat`` just before it; an
    all-gather the unit whose padded shards equal its ``fsdp::all_gather_copy_in``'s split sizes (the same
    unit's reduce-scatter names its shapes)."""
    cat: tuple[tuple[int, ...], ...] | None = None
    copy_in: tuple[tuple[int, ...], ...] | None = None
    found: list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]] = []  # (shapes, all-gather split sizes)
    units: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
    for inner in nested:
        for e in inner:
            if e.name in (FSDP_CHUNK_CAT, FSDP_COPY_IN):
                node = et.get(e.rf_id) if et is not None and e.rf_id is not None else None
                if e.name == FSDP_CHUNK_CAT:
                    cat = _first_arg_shapes(e, node)
                else:
                    copy_in = _first_arg_shapes(e, node)
            elif e.name in C10D_OPS:
                op = ops[len(found)]
                if op == "reduce-scatter" and cat is not None:
                    units[_shard_numels(cat, k.world_size)] = cat
                    found.append((cat, ()))
                elif op == "allgather" and copy_in is not None and all(len(s) == 1 for s in copy_in):
                    found.append(((), tuple(s[0] for s in copy_in)))
                else:
                    found.append(((), ()))
                cat = copy_in = None
    return [shapes or units.get(splits, ()) for shapes, splits in found]


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
    for i, inner in enumerate(nested):
        for e in inner:
            op = C10D_OPS.get(e.name)
            if op is None:
                continue
            node = et.get(e.rf_id) if et is not None and e.rf_id is not None else None
            arg = size_argument(op)
            size = (node.arg_bytes[arg] if node is not None and len(node.arg_bytes) > arg and node.arg_bytes[arg]
                    else collective_bytes(e, arg))
            launches.append(Launch(op, size, e, i, node.reads | node.writes if node is not None else frozenset()))
    spans = k.backend_events
    if len(spans) != len(launches):
        extra = spans[len(launches)] if len(spans) > len(launches) else launches[len(spans)].event
        raise ConfigError(f"{k.path}: {extra.name} at ts {extra.ts_us:.3f}",
                          f"rank {k.rank} launched {len(launches)} collectives and its backend ran {len(spans)}",
                          "profile one whole step (the profiler stopped inside a collective?)")
    shapes = fsdp_units(k, nested, et, [x.op for x in launches])
    launches = [Launch(x.op, x.size_bytes, x.event, x.top, x.storages, s,
                       u if u and x.size_bytes % _padded(u, k.world_size) == 0 else ())
                for x, s, u in zip(launches, spans, shapes, strict=True)]
    return RankParts(k, tuple(tops), tuple(tuple(n) for n in nested), tuple(launches), et)


def _node_reads(parts: RankParts, e: Event) -> frozenset[int]:
    """Storages ``e`` reads (its ET node's inputs); none for a c10d operator or without an ET."""
    if parts.et is None or e.rf_id is None or e.name in C10D_OPS:
        return frozenset()
    node = parts.et.get(e.rf_id)
    return node.reads if node is not None else frozenset()


@dataclass(frozen=True)
class Wait:
    """Where a rank's thread waited for its launch ``j``: inside top-level operator ``top``, from ``at_us``
    (the end of what the thread did last before the first reader of the collective's data; the operator's
    start for a top-level reader) to the reader's start ``reader_us``."""

    j: int
    top: int
    at_us: float
    reader_us: float


def find_waits(parts: RankParts) -> tuple[list[Wait], list[int]]:
    """Each launch's wait: with an ET, the first event after the launch (at any depth) that reads a storage
    the collective wrote; without one, the first top-level operator that starts after the collective's
    backend span ended. Returns the waits and the launches nobody read (waited for at the step's end).

    Only symmetric collectives (:data:`SYMMETRIC_OPS`) are waited for: a broadcast's root (a reduce's
    senders) goes on once its own part is sent, before the others have joined — as the recordings show
    (the root's span ends before a late receiver launched) — so a wait for the whole group would be
    wrong; their waits stay in the measured operators."""
    waits: list[Wait] = []
    unread: list[int] = []
    for j, x in enumerate(parts.launches):
        if x.op not in SYMMETRIC_OPS:
            continue
        if x.synchronous:  # the thread waited inside the call itself
            waits.append(Wait(j, x.top, x.at_us, x.event.end_us))
            continue
        found = None
        for i in range(x.top, len(parts.tops)):
            if parts.et is None:
                top = parts.tops[i]
                if i > x.top and x.span is not None and x.span.end_us <= top.ts_us:
                    found = Wait(j, i, top.ts_us, top.ts_us)
            else:
                inner = parts.nested[i]
                hit = next((e for e in inner if e.ts_us >= x.event.end_us and _node_reads(parts, e) & x.storages),
                           None)
                if hit is not None:  # the thread's last activity before the reader: an end, or an ancestor's start
                    before = [e.end_us for e in inner if e.end_us <= hit.ts_us]
                    around = [e.ts_us for e in inner
                              if e is not hit and e.ts_us <= hit.ts_us and e.end_us >= hit.end_us]
                    found = Wait(j, i, max([*before, *around, parts.tops[i].ts_us]), hit.ts_us)
            if found is not None:
                break
        if found is None:
            unread.append(j)
        else:
            waits.append(found)
    return waits, unread


def hidden_waits(parts: RankParts, waits: Sequence[Wait]) -> list[tuple[int, float, float]]:
    """The rank's waits that stay inside operator time: (launch ``j``, its backend span's end in µs, µs the
    thread sat idle before that end) for each collective launched and waited for inside one top-level
    operator where :func:`find_waits` removed nothing (its wait point is at or after the collective's end);
    symmetric collectives only, as :func:`find_waits` (a broadcast's wait stays measured operator time).
    FSDP2 on CPU wraps the c10d call and its ``wait()`` in one ``FSDP::all_gather (unit)`` annotation
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``unshard``/``wait_for_unshard``), so the
    thread's next activity comes only after the collective ended: the idle time runs from the thread's last
    activity before that end (a start or an end of any event of the operator that does not hold the launch)
    to the end. It stays in the operator (each rank's wait holds its own gloo thread's tail and its wake-up,
    which a network model does not give); a what-if on the recording host makes it a wait for its collective
    as the replay runs it at the new size (:func:`topotrain.traces.whatif.waits_outside`)."""
    out = []
    removed = {w.j for w in waits if w.top == parts.launches[w.j].top and parts.launches[w.j].span is not None
               and w.at_us < parts.launches[w.j].span.end_us}  # type: ignore[union-attr]
    for j, x in enumerate(parts.launches):
        span, top = x.span, parts.tops[x.top]
        if span is None or j in removed or x.op not in SYMMETRIC_OPS or not top.ts_us < span.end_us <= top.end_us:
            continue
        e0 = x.event
        if any(e.ts_us < span.end_us < e.end_us and not (e.ts_us <= e0.ts_us and e.end_us >= e0.end_us)
               for e in parts.nested[x.top]):
            continue  # the thread was inside another event (busy) when the collective ended: not waiting
        points = [t for e in parts.nested[x.top] if e is e0 or not (e.ts_us <= e0.ts_us and e.end_us >= e0.end_us)
                  for t in (e.ts_us, e.end_us) if t <= span.end_us]
        idle = span.end_us - max([*points, top.ts_us])
        if idle > 0:
            out.append((j, span.end_us, idle))
    return out


def _segments(parts: RankParts, i: int, waits: list[Wait], index: Sequence[int], gap_us: float,
              hidden: Sequence[tuple[int, float, float]] = ()) -> list[TraceOp]:
    """Top-level operator ``i`` as operators cut at the waits inside it: each piece after a cut waits for
    its collectives and loses the time the thread spent waiting (from the cut to the earlier of the reader's
    start and the collective's end on this rank); launches keep their place in the remaining compute."""
    top = parts.tops[i]

    def cut(w: Wait) -> bool:  # a wait inside the operator, or for a collective launched in it (never before)
        return w.at_us > top.ts_us or parts.launches[w.j].top == i

    cuts = sorted({w.at_us for w in waits if cut(w)})
    bounds = [top.ts_us, *cuts, top.end_us]
    kernels = op_kernels(parts.nested[i], parts.et)
    out = []
    for s, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        group = [w for w in waits if (cut(w) and s > 0 and w.at_us == a) or (s == 0 and not cut(w))]
        removed = 0.0
        if s > 0:
            for w in group:
                span = parts.launches[w.j].span
                end = w.reader_us if span is None else min(w.reader_us, span.end_us)
                removed = max(removed, min(end, b) - a)
        launches = tuple((index[j], max(0.0, x.at_us - a - removed) * 1e-6)
                         for j, x in enumerate(parts.launches)
                         if x.top == i and (a < x.at_us <= b or (s == 0 and x.at_us == a)
                                            or (b == top.end_us and x.at_us > b)))
        last = b == top.end_us
        mine = tuple(k for ts, k in kernels if a <= ts < b or (last and ts >= b))
        held = tuple((index[j], idle * 1e-6) for j, end, idle in hidden if a < end <= b or (s == 0 and end <= a))
        out.append(TraceOp(top.name, (b - a - removed) * 1e-6, gap_us * 1e-6 if s == 0 else 0.0,
                           tuple(index[w.j] for w in group), launches, mine, held))
    return out


def rank_trace(parts: RankParts, index: Sequence[int], t0_us: float) -> RankTrace:
    """One rank's operators with waits and host gaps; ``index[j]`` is the job-wide index of the rank's
    ``j``-th launch; ``t0_us`` the earliest rank's step start. A wait at a top-level operator's start is
    charged to the gap before it (the gap less the wait is host time); a wait inside an operator cuts it
    (:func:`_segments`)."""
    k = parts.kineto
    waits, unread = find_waits(parts)
    hidden = hidden_waits(parts, waits)
    ops: list[TraceOp] = []
    prev_end = k.step.ts_us
    for i, top in enumerate(parts.tops):
        mine = [w for w in waits if w.top == i]
        at_start = [w for w in mine if w.at_us <= top.ts_us and parts.launches[w.j].top != i]
        ready = max([prev_end] + [min(s.end_us, top.ts_us) for w in at_start
                                  if (s := parts.launches[w.j].span) is not None])
        ops.extend(_segments(parts, i, mine, index, max(0.0, top.ts_us - ready),
                             [h for h in hidden if parts.launches[h[0]].top == i]))
        prev_end = max(prev_end, top.end_us)
    # the step ends once every collective is done (DDP waits for all buckets before the optimizer's step)
    ready = max([prev_end] + [min(s.end_us, k.step.end_us) for j in unread
                              if (s := parts.launches[j].span) is not None])
    ops.append(TraceOp("(step end)", 0.0, max(0.0, k.step.end_us - ready) * 1e-6, tuple(index[j] for j in unread)))
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


def job_step_times(ranks: dict[int, KinetoSteps]) -> dict[int, float]:
    """Each profiled step's job step time in seconds: the slowest rank's ``ProfilerStep#N`` span, by N. Every
    rank must hold every step (else one ConfigError naming the file that lacks it and the step)."""
    numbers = sorted({n for k in ranks.values() for n in k.steps})
    for r in sorted(ranks):
        k = ranks[r]
        lacking = [n for n in numbers if n not in k.steps]
        if lacking:
            other = next(q for q in sorted(ranks) if lacking[0] in ranks[q].steps)
            raise ConfigError(f"{k.path}: ProfilerStep#{lacking[0]}", f"is missing on rank {r}, which has steps "
                              f"{describe_steps(k.steps)} (rank {other} has it)", "pass every rank's files of "
                              "the same profiled steps, or --step N of a step every rank has")
    return {n: max(k.steps[n].dur_us for k in ranks.values()) * 1e-6 for n in numbers}


def choose_step(ranks: dict[int, KinetoSteps], step: str | int = "last") -> int:
    """The step number to import among the profiled ones: ``last``, the largest N (what a one-step recording
    holds; each rank's last must be the same step); ``median``, the step whose job step time
    (:func:`job_step_times`: the slowest rank's span) is the median over the profiled steps — the lower median
    for an even count, ties by step number — so one noisy step does not stand for the job (dPRO and Lumos
    profile several iterations); or ``N``, that step, which every rank must hold. A step missing on a rank
    is one ConfigError naming its file and the step."""
    if step == "last":
        lasts = {r: k.last for r, k in ranks.items()}
        number = max(lasts.values())
        odd = next((r for r in sorted(ranks) if number not in ranks[r].steps), None)
        if odd is not None:
            k = ranks[odd]
            raise ConfigError(f"{k.path}: ProfilerStep#{number}", f"is missing on rank {odd}, which has steps "
                              f"{describe_steps(k.steps)} (the last profiled step is rank "
                              f"{next(r for r in sorted(ranks) if lasts[r] == number)}'s)",
                              "pass every rank's files of the same profiled steps, or --step N of a step every "
                              "rank has")
        return number
    if step == "median":
        times = job_step_times(ranks)
        order = sorted(times, key=lambda n: (times[n], n))
        return order[(len(order) - 1) // 2]
    if isinstance(step, bool) or not isinstance(step, int):
        raise ConfigError("--step", f"is {step!r}", "give last, median or a step number N")
    for r in sorted(ranks):
        k = ranks[r]
        if step not in k.steps:
            raise ConfigError(f"{k.path}: ProfilerStep#{step}", f"is missing on rank {r}, which has steps "
                              f"{describe_steps(k.steps)}", "give --step N of a step every rank has, or last or "
                              "median")
    return step


def profiled_steps(paths: Sequence[str | Path]) -> dict[int, float]:
    """Each profiled step's job step time (:func:`job_step_times`) over the Kineto files among ``paths`` (the
    Execution Traces are skipped), by step number: what :func:`choose_step` chooses from."""
    read: dict[int, KinetoSteps] = {}
    for p in paths:
        doc = load_json(Path(p))
        if kind_of(doc) == "kineto":
            k = read_kineto_steps(doc, str(p))
            read[k.rank] = k
    if not read:
        raise ConfigError("traces", f"no Kineto trace among {len(paths)} file(s)", _FIX_FILES)
    return job_step_times(read)


@dataclass(frozen=True)
class StepChoice:
    """Which profiled step a job was imported at: its number, how it was chosen, and the job step time of
    every profiled step that every rank holds (seconds by step number)."""

    number: int
    rule: str
    times_s: dict[int, float]

    def describe(self) -> str:
        """``ProfilerStep#N`` and what it was chosen from, in words."""
        if len(self.times_s) <= 1:
            return f"ProfilerStep#{self.number}" + (", the one profiled step" if self.times_s else "")
        ts = sorted(self.times_s.values())
        how = {"median": "the median by job step time", "last": "the last"}.get(self.rule, "as given")
        return (f"ProfilerStep#{self.number} ({how}; {len(ts)} profiled steps, job step times "
                f"{ts[0] * 1e3:.1f}–{ts[-1] * 1e3:.1f} ms)")


def import_job(paths: Sequence[str | Path], name: str = "", step: str | int = "last") -> TraceJob:
    """The job recorded in ``paths``: every rank's Kineto JSON, and optionally each rank's ET (matched to its
    Kineto file by the recording process's pid). Files may be ``.json.gz``. ``step`` chooses among several
    profiled steps (:func:`choose_step`): only that step's operators and backend spans are read, and through
    them its ET nodes; the ET nodes of the other steps stay unreferenced."""
    return import_job_at(paths, name, step)[0]


def import_job_at(paths: Sequence[str | Path], name: str = "",
                  step: str | int = "last") -> tuple[TraceJob, StepChoice]:
    """:func:`import_job`, and the step it was imported at (:class:`StepChoice`)."""
    if not paths:
        raise ConfigError("traces", "no files given", _FIX_FILES)
    read: dict[int, KinetoSteps] = {}
    ets: dict[int | str, tuple[str, dict[int, EtNode]]] = {}
    for p in paths:
        path = Path(p)
        doc = load_json(path)
        kind = kind_of(doc)
        if kind == "kineto":
            ks = read_kineto_steps(doc, str(path))
            if ks.rank in read:
                raise ConfigError(str(path), f"is rank {ks.rank} again (also {read[ks.rank].path})",
                                  "pass one Kineto file per rank")
            read[ks.rank] = ks
        elif kind == "et":
            pid, nodes = read_et(doc, str(path))
            ets[pid] = (str(path), nodes)
        else:
            raise ConfigError(str(path), "is neither a Kineto trace (traceEvents) nor an Execution Trace "
                              "(nodes, schema)", _FIX_FILES)
    if not read:
        raise ConfigError("traces", f"no Kineto trace among {len(paths)} file(s) (only Execution Traces)", _FIX_FILES)
    world = {k.world_size for k in read.values()}
    if len(world) > 1:
        raise ConfigError("traces", f"the files disagree on the world size ({sorted(world)})", _FIX_FILES)
    n = world.pop()
    missing = sorted(set(range(n)) - set(read))
    if missing:
        have = ", ".join(f"{r} ({Path(read[r].path).name})" for r in sorted(read))
        raise ConfigError("traces", f"rank {missing[0]} of {n} is missing (have ranks {have})", _FIX_FILES)
    number = choose_step(read, step)
    common = set.intersection(*(set(k.steps) for k in read.values()))
    choice = StepChoice(number, str(step), {m: max(k.steps[m].dur_us for k in read.values()) * 1e-6
                                            for m in sorted(common)})
    kinetos: dict[int, KinetoRank] = {r: k.at(number) for r, k in read.items()}
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
        shapes = xs[0].param_shapes if all(x.param_shapes == xs[0].param_shapes for x in xs) else ()
        ran = {backend_span_op(s.name) for s in spans}  # the op the backend ran, where its spans agree on it
        backend_op = ran.pop() if len(ran) == 1 else ""
        colls.append(TraceCollective(xs[0].op, xs[0].size_bytes, group_name, group,
                                     tuple(s.dur_us * 1e-6 for s in spans), max(net_s, 0.0), shapes,
                                     backend_op=backend_op if backend_op != xs[0].op else ""))
    t0 = min(rp.kineto.step.ts_us for rp in parts)
    t1 = max(rp.kineto.step.end_us for rp in parts)
    ranks = tuple(rank_trace(rp, range(counts[0]), t0) for rp in parts)
    label = name or Path(parts[0].kineto.path).parent.name
    if not use_et:
        label += " (dependencies from timestamps: no Execution Trace)"
    return TraceJob(n, parts[0].kineto.backend, ranks, tuple(colls), (t1 - t0) * 1e-6, label), choice
