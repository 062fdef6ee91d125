"""A recorded training step as data: what each rank's main thread ran, which collectives it launched and
waited for, and how long each took — the workload a trace import gives (docs/traces.md).

The shape follows dPRO's global data-flow graph (Hu et al., "dPRO: A Generic Performance Diagnosis and
Optimization Toolkit for Expediting Distributed DNN Training", MLSys 2022): per worker, a sequence of
computation operators with measured durations, and communication operators shared by the workers of a
group, with dependency edges between them; and Lumos' addition of the host gaps between operators (Liang
et al., "Lumos: Efficient Performance Modeling and Estimation for Large-scale LLM Training", MLSys 2025):
the time a thread spends between operators is part of the step and is replayed, not dropped.

Every figure is in seconds or bytes (SI); a job is written as JSON (:func:`job_to_dict` /
:func:`job_from_dict`, format :data:`FORMAT`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.util.jsonsafe import dumps

#: The ``format`` field of a written trace workload.
FORMAT = "topotrain.trace-workload/1"


@dataclass(frozen=True)
class Kernel:
    """A piece of an operator that the compute model can time (:mod:`topotrain.traces.work`): its kind (a
    :class:`~topotrain.workload.layer.LayerKind` value), the ATen operator, its measured span, its FLOPs and
    the bytes its tensors read and write, its GEMM shape ``(count, M, N, K)`` (``()`` for none), the bytes
    per element of its tensors and whether it is a backward kernel (attention's backward is costed so)."""

    kind: str
    name: str
    measured_s: float
    flops: float
    bytes: float
    dims: tuple[int, ...] = ()
    elem_bytes: int = 4
    backward: bool = False


@dataclass(frozen=True)
class TraceOp:
    """One top-level operator of a rank's main thread, in program order.

    ``duration_s``: its measured span; ``host_gap_s``: the thread's time before it that is neither an
    operator nor a wait for a collective (Python, the dispatcher, the profiler); ``waits``: indices of the
    job's collectives it needs finished (from the Execution Trace's data dependencies); ``launches``: the
    collectives launched inside it, each with the seconds into the operator at which it was launched;
    ``kernels``: the pieces of it the compute model knows (shapes from the Execution Trace), for a what-if on
    a GPU (:mod:`topotrain.traces.gpu`); ``hidden_waits``: (collective, seconds) the thread sat idle inside
    it, within ``duration_s``, waiting for a collective it launched itself (FSDP2 on CPU launches and waits
    inside one hook; :func:`topotrain.traces.importer.hidden_waits`), which a what-if on the recording host
    turns into a wait for that collective in the replay (:func:`topotrain.traces.whatif.on_shared_host`)."""

    name: str
    duration_s: float
    host_gap_s: float = 0.0
    waits: tuple[int, ...] = ()
    launches: tuple[tuple[int, float], ...] = ()
    kernels: tuple[Kernel, ...] = ()
    hidden_waits: tuple[tuple[int, float], ...] = ()


#: The collective ops a trace's collectives are (what the import maps c10d's operators and the backends'
#: spans to).
COLLECTIVE_OPS = ("allreduce", "allgather", "reduce-scatter", "broadcast", "reduce", "all-to-all")


@dataclass(frozen=True)
class TraceCollective:
    """One collective of the job (the same on every rank of its group): ``op`` a topotrain collective op
    (``allreduce``, ...), ``size_bytes`` the buffer per rank, ``group`` its process group's name and
    ``ranks`` the group's global ranks; ``measured_s`` its measured span per rank of the group (the
    backend thread's event), ``measured_net_s`` the span while every rank was in it (last start to first
    end; a broadcast's or reduce's quickest rank's span), the time a network model answers for.
    ``param_shapes``: for an FSDP2 unit's all-gather or reduce-scatter, the unsharded shapes of the unit's
    parameters (from FSDP2's ``fsdp::chunk_cat``), which its size at another group size follows (each is
    padded to a multiple of the group size on dim 0, :func:`topotrain.traces.whatif.fsdp_padded_numel`);
    ``()`` for any other collective. ``wake_wait_s``: seconds gloo's threads wait for a core before and
    between the collective's ring hops, added to its network time by the replay (0 as recorded; a what-if
    with more ranks than cores sets it: :func:`topotrain.traces.sched.wake_wait_s`). ``backend_op``: the op
    the recording's backend ran for it where that is not ``op``, as its backend span names it (PyTorch's
    ProcessGroupGloo runs a CPU reduce-scatter as an allreduce of the whole buffer and keeps its chunk: the
    span is ``gloo:all_reduce``); ``""`` where the backend ran ``op`` itself. The recording host's fit and
    replay time the collective as it ran (:attr:`ran_as`); another cluster's library runs ``op``."""

    op: str
    size_bytes: int
    group: str
    ranks: tuple[int, ...]
    measured_s: tuple[float, ...]
    measured_net_s: float
    param_shapes: tuple[tuple[int, ...], ...] = ()
    wake_wait_s: float = 0.0
    backend_op: str = ""

    @property
    def ran_as(self) -> str:
        """The op the recording's backend ran: ``backend_op``, or ``op`` where it ran that."""
        return self.backend_op or self.op


@dataclass(frozen=True)
class RankTrace:
    """One rank's step: ``start_s`` its step's start after the earliest rank's (one clock), ``step_s`` its
    measured step span, ``ops`` its main thread's operators, ``source`` the files it came from."""

    rank: int
    start_s: float
    step_s: float
    ops: tuple[TraceOp, ...]
    source: str

    @property
    def op_s(self) -> float:
        return sum(o.duration_s for o in self.ops)

    @property
    def host_gap_s(self) -> float:
        return sum(o.host_gap_s for o in self.ops)


@dataclass(frozen=True)
class TraceJob:
    """A recorded step of a distributed job: its ranks, its collectives, its measured step time (the
    earliest rank's step start to the latest rank's end), the backend it ran on."""

    world_size: int
    backend: str
    ranks: tuple[RankTrace, ...]
    collectives: tuple[TraceCollective, ...]
    measured_step_s: float
    name: str = ""


def kernel_to_list(k: Kernel) -> list[Any]:
    """A kernel as a compact JSON list ``[kind, name, measured_s, flops, bytes, dims, elem_bytes, backward]``."""
    return [k.kind, k.name, k.measured_s, k.flops, k.bytes, list(k.dims), k.elem_bytes, k.backward]


def kernel_from_list(v: Any, where: str) -> Kernel:
    """The kernel of :func:`kernel_to_list`'s list; a wrong one is one ConfigError naming it."""
    try:
        kind, name, measured_s, flops, nbytes, dims, elem, backward = v
        k = Kernel(str(kind), str(name), float(measured_s), float(flops), float(nbytes),
                   tuple(int(d) for d in dims), int(elem), bool(backward))
    except (TypeError, ValueError):
        raise ConfigError(where, f"is not a kernel [kind, name, measured_s, flops, bytes, dims, elem_bytes, "
                          f"backward]: {v!r}"[:200], "write it with `topotrain trace import`") from None
    if not (k.measured_s >= 0 and k.flops >= 0 and k.bytes >= 0):
        raise ConfigError(where, "has a negative time, FLOP count or byte count",
                          "write it with `topotrain trace import`")
    return k


def hidden_waits_from(raw: Any, where: str, n_collectives: int) -> tuple[tuple[int, float], ...]:
    """An operator's ``hidden_waits`` from JSON data: [collective index, seconds >= 0] pairs (absent: none)."""
    if raw is None:
        return ()
    fix = "write it with `topotrain trace import` (pairs [collective index, seconds])"
    if not isinstance(raw, list) or not all(isinstance(x, list) and len(x) == 2 for x in raw):
        raise ConfigError(where, f"must be a list of [collective, seconds] pairs, got {str(raw)[:60]}", fix)
    out = []
    for k, t in raw:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n_collectives:
            raise ConfigError(where, f"names collective {k!r}, and the job has {n_collectives}", fix)
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < float("inf"):
            raise ConfigError(where, f"has {t!r} seconds for collective {k}: not a finite number >= 0", fix)
        out.append((k, float(t)))
    return tuple(out)


def _op_dict(o: TraceOp) -> dict[str, Any]:
    d = {"name": o.name, "duration_s": o.duration_s, "host_gap_s": o.host_gap_s, "waits": list(o.waits),
         "launches": [list(x) for x in o.launches]}
    if o.kernels:
        d["kernels"] = [kernel_to_list(k) for k in o.kernels]
    if o.hidden_waits:
        d["hidden_waits"] = [list(x) for x in o.hidden_waits]
    return d


def job_to_dict(job: TraceJob) -> dict[str, Any]:
    """The job as plain JSON data (format :data:`FORMAT`)."""
    return {
        "format": FORMAT, "name": job.name, "world_size": job.world_size, "backend": job.backend,
        "measured_step_s": job.measured_step_s,
        "collectives": [{"op": c.op, "size_bytes": c.size_bytes, "group": c.group, "ranks": list(c.ranks),
                         "measured_s": list(c.measured_s), "measured_net_s": c.measured_net_s}
                        | ({"param_shapes": [list(s) for s in c.param_shapes]} if c.param_shapes else {})
                        | ({"wake_wait_s": c.wake_wait_s} if c.wake_wait_s else {})
                        | ({"backend_op": c.backend_op} if c.backend_op else {})
                        for c in job.collectives],
        "ranks": [{"rank": r.rank, "start_s": r.start_s, "step_s": r.step_s, "source": r.source,
                   "ops": [_op_dict(o) for o in r.ops]} for r in job.ranks],
    }


def _num(d: Any, key: str, where: str, *, integer: bool = False) -> Any:
    v: Any = d.get(key) if isinstance(d, dict) else None
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    if isinstance(v, bool) or not ok or not v >= 0:
        raise ConfigError(f"{where}.{key}", f"must be a number >= 0, got {v!r}",
                          "write the workload with `topotrain trace import`")
    return int(v) if integer else float(v)


def _entries(d: Any, key: str, where: str) -> list[dict[str, Any]]:
    """``d[key]``: a list of mappings (missing: empty), else one ConfigError naming the field."""
    v = d.get(key) if isinstance(d, dict) else None
    v = [] if v is None else v
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise ConfigError(f"{where}.{key}", "must be a list of mappings", "write it with `topotrain trace import`")
    return v


def _backend_op(c: dict[str, Any], where: str) -> str:
    """A collective's ``backend_op`` (absent: ``""``); one that is not a string is one ConfigError naming it."""
    v = c.get("backend_op", "")
    if not isinstance(v, str) or (v and v not in COLLECTIVE_OPS):
        raise ConfigError(f"{where}.backend_op", f"must be one of {', '.join(COLLECTIVE_OPS)}, got {v!r}",
                          "write it with `topotrain trace import`")
    return v


def job_from_dict(d: Any, where: str = "workload") -> TraceJob:
    """The job written by :func:`job_to_dict`; a field that is missing or wrong is one ConfigError naming it."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise ConfigError(f"{where}.format", f"is {got!r}, not {FORMAT!r}",
                          "give a file written by `topotrain trace import`")
    colls = []
    for i, c in enumerate(_entries(d, "collectives", where)):
        w = f"{where}.collectives[{i}]"
        ranks = c.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
            raise ConfigError(f"{w}.ranks", "must be a list of ranks", "write it with `topotrain trace import`")
        shapes = c.get("param_shapes") or []
        if not isinstance(shapes, list) or not all(isinstance(s, list) and s and all(
                type(x) is int and x >= 0 for x in s) for s in shapes):
            raise ConfigError(f"{w}.param_shapes", "must be a list of parameter shapes (lists of sizes)",
                              "write it with `topotrain trace import`")
        colls.append(TraceCollective(str(c.get("op")), _num(c, "size_bytes", w, integer=True), str(c.get("group")),
                                     tuple(ranks), tuple(float(x) for x in c.get("measured_s") or ()),
                                     _num(c, "measured_net_s", w), tuple(tuple(s) for s in shapes),
                                     _num(c, "wake_wait_s", w) if "wake_wait_s" in c else 0.0,
                                     _backend_op(c, w)))
    ranks_out = []
    for i, r in enumerate(_entries(d, "ranks", where)):
        w = f"{where}.ranks[{i}]"
        ops = []
        for j, o in enumerate(_entries(r, "ops", w)):
            wo = f"{w}.ops[{j}]"
            try:
                waits = tuple(int(x) for x in o.get("waits") or ())
                launches = tuple((int(a), float(b)) for a, b in o.get("launches") or ())
            except (TypeError, ValueError):
                raise ConfigError(f"{wo}.waits", "waits must be collective indices and launches [index, seconds] "
                                  "pairs", "write it with `topotrain trace import`") from None
            for k in (*waits, *(a for a, _ in launches)):
                if not 0 <= k < len(colls):
                    raise ConfigError(wo, f"names collective {k}, and the job has {len(colls)}",
                                      "write it with `topotrain trace import`")
            raw = o.get("kernels") or []
            if not isinstance(raw, list):
                raise ConfigError(f"{wo}.kernels", "must be a list", "write it with `topotrain trace import`")
            kernels = tuple(kernel_from_list(v, f"{wo}.kernels[{n}]") for n, v in enumerate(raw))
            ops.append(TraceOp(str(o.get("name")), _num(o, "duration_s", wo), _num(o, "host_gap_s", wo), waits,
                               launches, kernels, hidden_waits_from(o.get("hidden_waits"), f"{wo}.hidden_waits",
                                                                    len(colls))))
        ranks_out.append(RankTrace(_num(r, "rank", w, integer=True), _num(r, "start_s", w), _num(r, "step_s", w),
                                   tuple(ops), str(r.get("source", ""))))
    if not ranks_out:
        raise ConfigError(f"{where}.ranks", "is empty", "write the workload with `topotrain trace import`")
    return TraceJob(_num(d, "world_size", where, integer=True), str(d.get("backend", "")), tuple(ranks_out),
                    tuple(colls), _num(d, "measured_step_s", where), str(d.get("name", "")))


def save_job(job: TraceJob, path: str | Path) -> Path:
    """Write ``job`` as JSON to ``path`` (atomically: :func:`topotrain.util.atomic.atomic_write_text`)."""
    return atomic_write_text(path, dumps(job_to_dict(job), indent=1) + "\n", make_parents=True, field="--out")


def is_job_dict(d: Any) -> bool:
    """Whether ``d`` is a written trace workload (its ``format`` field says so)."""
    return isinstance(d, dict) and d.get("format") == FORMAT
