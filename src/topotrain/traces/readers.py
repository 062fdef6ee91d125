"""Readers of one rank's recorded step: the Kineto trace of ``torch.profiler`` and the Execution Trace of
``torch.profiler.ExecutionTraceObserver``.

* **Kineto** (``prof.export_chrome_trace``): the Chrome trace-event format (``traceEvents``; complete events
  ``ph: "X"`` with ``ts``/``dur`` in µs, ``pid``/``tid``; Google's "Trace Event Format" document), with
  PyTorch's additions: ``distributedInfo`` (backend, rank, world size, ``pg_config`` — each process group's
  name and ranks), the ``ProfilerStep#N`` annotation of the step that ``prof.step()`` delimits, CPU operators
  (``cat: cpu_op``) with ``args["Record function id"]`` and, with ``record_shapes``, ``Input Dims`` / ``Input
  type``; the c10d operators (``c10d::allreduce_``, ...) on the thread that launches them, and the backend's
  own span of each collective (``gloo:all_reduce``, ``nccl:all_reduce``) on the thread that runs it
  (PyTorch ``torch/csrc/profiler``, ``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``).
* **Execution Trace** (ET, schema ``1.x-chakra``): ``nodes``, each an operator with ``id``, ``name``,
  ``ctrl_deps`` (its parent), ``inputs``/``outputs`` (``values`` where a tensor is
  ``[tensor_id, storage_id, offset, numel, element_bytes, device]``) and ``attrs`` (``rf_id``: the record
  function id Kineto also carries, the join key between the two files; Chakra's "PyTorch execution trace"
  schema, github.com/mlcommons/chakra, and PyTorch ``execution_trace_observer.cpp``). Data dependencies are
  read from the storages an operator's subtree reads and writes.

Files may be gzip-compressed (``.gz``). A file that is not complete JSON, or lacks what a step needs, is one
ConfigError naming the file and the event.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.util.errors import ConfigError

#: c10d operator (launch) → topotrain collective op. ``barrier`` is gloo's allreduce of one element.
C10D_OPS = {
    "c10d::allreduce_": "allreduce", "c10d::allreduce_coalesced_": "allreduce",
    "c10d::broadcast_": "broadcast", "c10d::reduce_": "reduce",
    "c10d::allgather_": "allgather", "c10d::_allgather_base_": "allgather",
    "c10d::allgather_into_tensor_coalesced_": "allgather",
    "c10d::reduce_scatter_": "reduce-scatter", "c10d::_reduce_scatter_base_": "reduce-scatter",
    "c10d::alltoall_base_": "all-to-all", "c10d::alltoall_": "all-to-all", "c10d::barrier": "allreduce",
}
#: A backend's collective span (``gloo:all_reduce``, ``nccl:_reduce_scatter_base``; the part after the colon,
#: leading underscores and a ``_base`` or ``_coalesced`` ending dropped) → the collective op the backend ran.
BACKEND_SPAN_OPS = {"all_reduce": "allreduce", "allreduce": "allreduce", "all_gather": "allgather",
                    "allgather": "allgather", "all_gather_into_tensor": "allgather",
                    "reduce_scatter": "reduce-scatter", "reduce_scatter_tensor": "reduce-scatter",
                    "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "all-to-all", "alltoall": "all-to-all"}


def backend_span_op(name: str) -> str:
    """The collective op a backend's span names (:data:`BACKEND_SPAN_OPS`), ``""`` for a name it does not
    know (a point-to-point send, a barrier's own span, another backend's)."""
    tail = name.split(":", 1)[1] if ":" in name else ""
    for suffix in ("_base", "_coalesced"):
        tail = tail.removesuffix(suffix)
    return BACKEND_SPAN_OPS.get(tail.strip("_"), "")


#: Bytes per element of the dtypes Kineto names in ``Input type``.
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
               "signed char": 1, "unsigned char": 1, "bool": 1, "short int": 2}
_FIX_RECORD = "record the step again (see benchmarks/trace_record.py) and pass every rank's files"


def load_json(path: Path) -> Any:
    """The JSON document of ``path`` (gzip if it ends in ``.gz``); a truncated or malformed file is one
    ConfigError naming the file and where the JSON stops."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except json.JSONDecodeError as e:
        where = "truncated" if e.pos >= len(raw.rstrip()) else f"malformed at line {e.lineno}, column {e.colno}"
        raise ConfigError(str(path), f"is not complete JSON ({where}: {e.msg})", _FIX_RECORD) from None
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as e:
        if isinstance(e, FileNotFoundError | IsADirectoryError | PermissionError):
            raise
        raise ConfigError(str(path), f"cannot be read as (gzip) JSON: {e}", _FIX_RECORD) from None


def kind_of(doc: Any) -> str:
    """``kineto``, ``et`` or ``""`` (neither)."""
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return "kineto"
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc:
        return "et"
    return ""


@dataclass(frozen=True)
class Event:
    """A complete event of a Kineto trace: name, start and duration (µs), thread, record-function id, the
    dims and types of its inputs (with ``record_shapes``)."""

    name: str
    ts_us: float
    dur_us: float
    tid: int | str
    rf_id: int | None = None
    dims: tuple[Any, ...] = ()
    types: tuple[Any, ...] = ()

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass(frozen=True)
class KinetoRank:
    """What one rank's Kineto trace says about its step. ``main``: the events of the step's thread inside
    the step, sorted by start (longest first on ties); ``backend``: the backend's collective spans
    (``gloo:*``/``nccl:*``) on other threads that start inside the step (one may end after it), in launch
    order (by record-function id; by start where a span has none); ``groups``: process group name → global
    ranks."""

    path: str
    pid: int | str
    rank: int
    world_size: int
    backend: str
    groups: dict[str, tuple[int, ...]]
    step: Event
    main: tuple[Event, ...]
    backend_events: tuple[Event, ...]


def _event(e: dict[str, Any]) -> Event:
    args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
    rf = args.get("Record function id")
    return Event(str(e.get("name", "")), float(e["ts"]), float(e["dur"]), e.get("tid", 0),
                 int(rf) if isinstance(rf, int) else None, tuple(args.get("Input Dims") or ()),
                 tuple(args.get("Input type") or ()))


def _step_number(name: str) -> int:
    """N of ``ProfilerStep#N`` (-1 if it is not a number)."""
    tail = name.rpartition("#")[2]
    return int(tail) if tail.isdigit() else -1


#: How a step is chosen among several profiled ones (:func:`topotrain.traces.importer.choose_step`): the
#: last (the default), the median by job step time, or a step number.
STEP_CHOICES = ("last", "median")


def parse_step(value: str | int, field: str = "--step") -> str | int:
    """``last``, ``median`` or a step number N (of ``ProfilerStep#N``) from a command line or a scenario; anything
    else is one ConfigError naming ``field``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip().lower()
    if text in STEP_CHOICES:
        return text
    if text.isdigit():
        return int(text)
    raise ConfigError(field, f"is {value!r}, not a step choice",
                      "give last (the last profiled step), median (the median step by job step time) or a step "
                      "number N of ProfilerStep#N")


@dataclass(frozen=True)
class KinetoSteps:
    """One rank's Kineto trace read once, before a step is chosen: its distributed info, its complete events
    sorted by start, and each profiled step's ``ProfilerStep#N`` span by N (a trace profiled with
    ``schedule(active=K)`` holds K)."""

    path: str
    rank: int
    world_size: int
    backend: str
    groups: dict[str, tuple[int, ...]]
    events: tuple[Event, ...]
    steps: dict[int, Event]
    pids: dict[int | str, int | str]

    @property
    def last(self) -> int:
        """The last step profiled (the largest N)."""
        return max(self.steps)

    def at(self, number: int) -> KinetoRank:
        """The rank's view of step ``number`` (:class:`KinetoRank`): the step thread's events inside its span,
        and the backend spans that start inside it, whatever their end. A backend span starts after its
        launch, which is inside the step; its end may come after the step's: the main thread resumes from the
        work's completion (DDP's bucket future) before the backend's worker closes its record function (a
        ``gloo:all_reduce`` of a recorded DDP step ended 115 µs after its ``ProfilerStep#N``), and that span
        belongs to this step, not the next (whose start it precedes)."""
        step = self.steps[number]
        lo, hi = step.ts_us - 1e-3, step.end_us + 1e-3
        starting = [e for e in self.events if e is not step and lo <= e.ts_us <= hi]
        main = sorted((e for e in starting if e.tid == step.tid and e.end_us <= hi),
                      key=lambda e: (e.ts_us, -e.dur_us))
        spans = [e for e in starting if e.tid != step.tid and e.name.split(":", 1)[0] in ("gloo", "nccl", "mpi")
                 and ":" in e.name]
        # In launch order: a backend with several worker threads (gloo runs two) may start a later collective
        # first, but each span's record-function id is taken when the work is created, in launch order.
        backend = sorted(spans, key=(lambda e: (e.rf_id, e.ts_us)) if all(e.rf_id is not None for e in spans)
                         else (lambda e: (0, e.ts_us)))
        return KinetoRank(self.path, self.pids.get(step.tid, 0), self.rank, self.world_size, self.backend,
                          self.groups, step, tuple(main), tuple(backend))


def read_kineto_steps(doc: dict[str, Any], path: str) -> KinetoSteps:
    """One rank's Kineto document with every profiled step (see the module's docstring); a step number twice
    keeps its longer span."""
    info = doc.get("distributedInfo")
    if not isinstance(info, dict) or not all(isinstance(info.get(f), int) for f in ("rank", "world_size")):
        raise ConfigError(f"{path}: distributedInfo", "is missing or has no rank / world_size",
                          "record under torch.distributed (init_process_group before the profiler starts)")
    complete = []
    pids: dict[int | str, int | str] = {}
    for i, e in enumerate(doc["traceEvents"]):
        if isinstance(e, dict) and e.get("ph") == "X":
            try:
                complete.append(_event(e))
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"{path}: traceEvents[{i}]",
                                  f"complete event {e.get('name')!r} has no numeric ts/dur", _FIX_RECORD) from None
            if "pid" in e:
                pids.setdefault(complete[-1].tid, e["pid"])
    steps: dict[int, Event] = {}
    for e in complete:
        if e.name.startswith("ProfilerStep#"):
            n = _step_number(e.name)
            if n not in steps or e.dur_us > steps[n].dur_us:
                steps[n] = e
    if not steps:
        raise ConfigError(f"{path}: ProfilerStep#", "no profiled step in the trace",
                          "profile with torch.profiler.schedule(...) and call prof.step() after every step")
    groups: dict[str, tuple[int, ...]] = {}
    for g in info.get("pg_config") or []:
        if isinstance(g, dict):
            try:
                ranks = g.get("ranks") or list(range(int(g.get("pg_size") or info["world_size"])))
                groups[str(g.get("pg_name"))] = tuple(int(r) for r in ranks)
            except (TypeError, ValueError):
                raise ConfigError(f"{path}: distributedInfo.pg_config", f"group {g.get('pg_name')!r} has ranks "
                                  f"{g.get('ranks')!r}, not a list of ranks", _FIX_RECORD) from None
    if not groups:
        groups["0"] = tuple(range(info["world_size"]))
    return KinetoSteps(path, int(info["rank"]), int(info["world_size"]), str(info.get("backend", "")), groups,
                       tuple(complete), steps, pids)


def read_kineto(doc: dict[str, Any], path: str, step: int | None = None) -> KinetoRank:
    """One rank's step from its Kineto document: step ``step`` (N of ``ProfilerStep#N``), by default the last
    profiled (see the module's docstring)."""
    k = read_kineto_steps(doc, path)
    number = k.last if step is None else step
    if number not in k.steps:
        raise ConfigError(f"{path}: ProfilerStep#{number}", f"is not in the trace (it has steps "
                          f"{describe_steps(k.steps)})", "give a step the trace holds")
    return k.at(number)


def describe_steps(steps: dict[int, Any] | set[int]) -> str:
    """Step numbers as ``1-5`` (consecutive) or ``1, 3, 4``."""
    ns = sorted(steps)
    if len(ns) > 2 and ns == list(range(ns[0], ns[-1] + 1)):
        return f"{ns[0]}-{ns[-1]}"
    return ", ".join(str(n) for n in ns)


@dataclass(frozen=True)
class EtNode:
    """An Execution Trace operator: its record-function id, its parent's node id, and the storages its
    tensors read (inputs) and write (outputs)."""

    id: int
    name: str
    parent: int
    rf_id: int | None
    reads: frozenset[int]
    writes: frozenset[int]
    #: bytes of the tensors of each input argument (elements × element size, from the ET's tensor tuples)
    arg_bytes: tuple[int, ...] = ()
    #: elements of each input / output argument (a list of tensors: their sum; not a tensor: 0)
    in_numel: tuple[int, ...] = ()
    out_numel: tuple[int, ...] = ()
    #: each input / output argument's entry of the ET's ``shapes`` as recorded (an untrimmed ET has them;
    #: a tensor's is a list of sizes); () when it has none
    in_shapes: tuple[Any, ...] = ()
    out_shapes: tuple[Any, ...] = ()
    #: bytes per element of its first tensor (4 when it has none)
    elem_bytes: int = 4


def _args(values: Any) -> tuple[set[int], tuple[int, ...], tuple[int, ...], int]:
    """One walk over an ET ``values`` list (a tensor is ``[tid, storage, off, numel, element bytes, device]``;
    lists of tensors nest): its tensors' storage ids, each argument's bytes and elements (0: not a tensor),
    and the bytes per element of its first tensor (4 when none)."""
    storages: set[int] = set()
    nbytes, numel = [], []
    elem = 0
    for arg in values if isinstance(values, list) else ():
        b = n = 0
        stack = [arg]
        while stack:
            v = stack.pop()
            if isinstance(v, list):
                if len(v) == 6 and type(v[3]) is int and type(v[4]) is int and type(v[1]) is int \
                        and isinstance(v[5], str) and type(v[0]) is int and type(v[2]) is int:
                    storages.add(v[1])
                    b += v[3] * v[4]
                    n += v[3]
                    elem = elem or v[4]
                else:
                    stack.extend(v)
        nbytes.append(b)
        numel.append(n)
    return storages, tuple(nbytes), tuple(numel), elem or 4


def _shapes(side: Any) -> tuple[Any, ...]:
    """Each argument's entry of an ET ``inputs``/``outputs`` mapping's ``shapes``, as recorded (a list of sizes
    for a tensor; checked where it is used, :mod:`topotrain.traces.work`); () when it records none."""
    raw = side.get("shapes") if isinstance(side, dict) else None
    return tuple(raw) if isinstance(raw, list) else ()


def read_et(doc: dict[str, Any], path: str) -> tuple[int | str, dict[int, EtNode]]:
    """(the recording process's pid, the nodes by record-function id) of an Execution Trace."""
    by_rf: dict[int, EtNode] = {}
    for i, n in enumerate(doc["nodes"]):
        if not isinstance(n, dict) or not isinstance(n.get("id"), int):
            raise ConfigError(f"{path}: nodes[{i}]", "is not an operator with an integer id", _FIX_RECORD)
        attrs = {a.get("name"): a.get("value") for a in n.get("attrs") or [] if isinstance(a, dict)}
        rf = attrs.get("rf_id")
        ins = (n.get("inputs") or {}).get("values", []) if isinstance(n.get("inputs"), dict) else []
        outs = (n.get("outputs") or {}).get("values", []) if isinstance(n.get("outputs"), dict) else []
        reads, args, in_n, elem = _args(ins)
        writes, _, out_n, _ = _args(outs)
        node = EtNode(n["id"], str(n.get("name", "")), int(n.get("ctrl_deps") or 0),
                      rf if isinstance(rf, int) else None, frozenset(reads), frozenset(writes), args, in_n, out_n,
                      _shapes(n.get("inputs")), _shapes(n.get("outputs")), elem)
        if node.rf_id is not None:
            by_rf[node.rf_id] = node
    return doc.get("pid", 0), by_rf


def size_argument(op: str) -> int:
    """Which argument of the c10d operator holds the buffer topotrain's ``size_bytes`` counts (nccl-tests'
    convention, :class:`~topotrain.collectives.schedule.CollectiveOp`): the input (second argument) of a
    reduce-scatter, the first (the tensors, or a gather's full output) of the others."""
    return 1 if op == "reduce-scatter" else 0


def collective_bytes(e: Event, arg: int = 0) -> int:
    """Bytes per rank of the collective launched by c10d event ``e``, from Kineto alone: the elements of
    argument ``arg``'s tensors (``Input Dims``) × the bytes of their dtype (``Input type``; 4 when it names
    no dtype, as for a tensor list)."""
    dims = e.dims[arg] if len(e.dims) > arg else []
    shapes = dims if dims and isinstance(dims[0], list) else [dims]
    elems = 0
    for s in shapes:
        n = 1
        for d in s:
            n *= int(d)
        elems += n if s else 0
    t = str(e.types[arg]) if len(e.types) > arg else "float"
    return elems * DTYPE_BYTES.get(t.removeprefix("GenericList[Tensor(").removesuffix(")]"), 4)
