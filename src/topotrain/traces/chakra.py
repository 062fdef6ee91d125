"""A trace workload (:class:`~topotrain.traces.model.TraceJob`) to and from Chakra execution traces, one file
per rank (MLCommons Chakra, the format ASTRA-sim consumes; schema ``et_def.proto``; docs/traces.md, "Chakra").

Export (:func:`export_chakra`), per rank, one chain of nodes linked by ``data_deps`` (the dependencies
Chakra's feeder resolves; ``ctrl_deps`` are left empty): each operator a ``COMP_NODE`` with its
``duration_micros``, split at every collective it launches; the host gap before an operator a
``COMP_NODE`` of its own (``is_cpu_op``: thread time, not an operator); each collective a
``COMM_COLL_NODE`` (``comm_type``, ``comm_size`` in bytes, ``pg_name``) that depends on the piece
before its launch; an operator that waits for a collective lists it in its ``data_deps``. Chakra
counts time in whole microseconds, so every node also carries its exact seconds (``duration_s``) and
the job's fields Chakra has no place for ride in attributes (names in :data:`_A`), which ASTRA-sim
keeps as unknown attributes; among them an FSDP2 unit's unsharded parameter shapes (``param_shapes``, a
JSON list of lists, as ``kernels`` is JSON), which a resize pads for the new group size.

Import (:func:`import_chakra`), per rank, the nodes in the order the feeder would issue them on one
thread (a topological order of ``data_deps``, ties by file order): a ``COMP_NODE`` is an operator (the
pieces of one exported operator are joined again), a ``COMM_COLL_NODE`` a collective launched at the end
of the compute node it depends on, and a compute node that depends on a collective waits for it. Across
ranks the i-th collective of a ``pg_name`` on each rank is the same collective (as c10d numbers them),
its group the ranks whose files hold that ``pg_name`` (no ``pg_name``: every rank); op and size must
agree. What Chakra cannot say and the import assumes is listed in docs/traces.md.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.traces.chakra_io import EtFile, read_et, write_et
from topotrain.traces.chakra_pb2 import COMM_COLL_NODE, COMM_TYPES, COMP_NODE, METADATA_NODE, NODE_TYPES, messages
from topotrain.traces.importer import SYMMETRIC_OPS as SYMMETRIC
from topotrain.traces.model import (
    COLLECTIVE_OPS,
    FORMAT,
    Kernel,
    RankTrace,
    TraceCollective,
    TraceJob,
    TraceOp,
    hidden_waits_from,
    kernel_from_list,
    kernel_to_list,
)
from topotrain.traces.whatif import fsdp_padded_numel
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError

#: The Chakra schema version written in ``GlobalMetadata.version`` (Chakra's own generator writes it so).
VERSION = "1.0.0"
#: topotrain collective op → Chakra ``CollectiveCommType`` number.
COMM_TYPE_OF_OP = {"allreduce": 0, "reduce": 1, "allgather": 2, "broadcast": 5, "all-to-all": 6,
                   "reduce-scatter": 7}
#: Chakra ``CollectiveCommType`` → topotrain op (a barrier is a small allreduce, as c10d's gloo runs it).
OP_OF_COMM_TYPE = {**{v: k for k, v in COMM_TYPE_OF_OP.items()}, 8: "reduce-scatter", 9: "allreduce"}
#: Attribute names topotrain adds (exact values behind Chakra's integer microseconds, and job fields).
_A = {"dur": "duration_s", "gap": "host_gap", "op": "op_index", "coll": "collective", "net": "measured_net_s",
      "rank": "rank", "world": "world_size", "start": "start_s", "step": "step_s", "job": "job_name",
      "backend": "backend", "measured": "measured_step_s", "format": "topotrain_format",
      "whole": "op_duration_s", "at": "launch_s", "ranks": "pg_ranks", "label": "pg_label",
      "kernels": "kernels", "shapes": "param_shapes", "hidden": "hidden_waits", "ran": "backend_op"}
#: The ``pg_name`` of every rank's group: ASTRA-sim's default communicator (an empty name is the same).
DEFAULT_GROUP = "0"
_FIX = "give every rank's Chakra file of one job (<prefix>.<rank>.et)"
_RANK_IN_NAME = re.compile(r"\.(\d+)\.et(\.gz)?$")


def _us(seconds: float) -> int:
    return max(0, round(seconds * 1e6))


def _attr(node: Any, name: str, **value: Any) -> None:
    node.attr.add(name=name, **value)


def _attrs(msg: Any) -> dict[str, Any]:
    """A message's attributes as name → value (the set member of the ``value`` oneof; lists as lists)."""
    out: dict[str, Any] = {}
    for a in msg.attr:
        kind = a.WhichOneof("value")
        if kind is not None:
            v = getattr(a, kind)
            out[a.name] = list(v.values) if kind.endswith("_list") else v
    return out


# --------------------------------------------------------------------------------------------- export


def group_ids(job: TraceJob) -> dict[str, str]:
    """Each group's ``pg_name``: ASTRA-sim takes a decimal id, ``0`` (or empty) for every rank and any other
    from its communicator-group file (``--comm-group-configuration``). A group keeps its own name when that
    is such an id, else the every-rank group is ``0`` and the others are numbered from 1."""
    everyone = tuple(range(job.world_size))
    names = {c.group: c.ranks for c in job.collectives}
    ids: dict[str, str] = {}
    for g, ranks in names.items():
        if g.isdecimal() and (g != DEFAULT_GROUP or tuple(sorted(ranks)) == everyone):
            ids[g] = g
    used = set(ids.values())
    free = (str(i) for i in range(1, 1 << 31) if str(i) not in used)
    for g, ranks in names.items():
        if g not in ids:
            ids[g] = DEFAULT_GROUP if tuple(sorted(ranks)) == everyone and DEFAULT_GROUP not in used else next(free)
            used.add(ids[g])
    return ids


def rank_nodes(job: TraceJob, index: int) -> tuple[Any, list[Any]]:
    """Rank ``job.ranks[index]`` as Chakra: its ``GlobalMetadata`` and its nodes (module docstring)."""
    m = messages()
    pg = group_ids(job)
    rt = job.ranks[index]
    meta = m.GlobalMetadata(version=VERSION)
    for key, kw in (("format", {"string_val": FORMAT}), ("job", {"string_val": job.name}),
                    ("backend", {"string_val": job.backend}), ("rank", {"int64_val": rt.rank}),
                    ("world", {"int64_val": job.world_size}), ("start", {"double_val": rt.start_s}),
                    ("step", {"double_val": rt.step_s}), ("measured", {"double_val": job.measured_step_s})):
        _attr(meta, _A[key], **kw)
    nodes: list[Any] = []
    coll_node: dict[int, int] = {}
    t = rt.start_s
    prev: int | None = None

    def add(name: str, kind: int, dur_s: float, deps: Sequence[int], start_s: float) -> Any:
        n = m.Node(id=len(nodes), name=name, type=kind, duration_micros=_us(dur_s), start_time_micros=_us(start_s))
        n.data_deps.extend(deps)
        _attr(n, _A["dur"], double_val=dur_s)
        nodes.append(n)
        return n

    def launch(k: int, after: int | None, at_s: float, offset_s: float) -> None:
        c = job.collectives[k]
        if c.op not in COMM_TYPE_OF_OP:
            raise ConfigError(f"workload.collectives[{k}].op", f"{c.op!r} has no Chakra collective type",
                              f"Chakra's are {', '.join(COMM_TYPE_OF_OP)}")
        own = c.measured_s[c.ranks.index(rt.rank)] if len(c.measured_s) == len(c.ranks) else c.measured_net_s
        n = add(f"{c.op} #{k}", COMM_COLL_NODE, own, [] if after is None else [after], at_s)
        for name, kw in (("is_cpu_op", {"bool_val": False}), ("comm_type", {"int64_val": COMM_TYPE_OF_OP[c.op]}),
                         ("comm_size", {"int64_val": c.size_bytes}), ("pg_name", {"string_val": pg[c.group]}),
                         (_A["coll"], {"int64_val": k}), (_A["net"], {"double_val": c.measured_net_s}),
                         (_A["at"], {"double_val": offset_s})):
            _attr(n, name, **kw)
        n.attr.add(name=_A["ranks"]).int64_list.values.extend(c.ranks)
        if c.param_shapes:  # an FSDP2 unit's unsharded shapes (its padding at another group size), as JSON
            _attr(n, _A["shapes"], string_val=json.dumps([list(s) for s in c.param_shapes], separators=(",", ":")))
        if pg[c.group] != c.group:
            _attr(n, _A["label"], string_val=c.group)
        if c.backend_op:  # the op the recording's backend ran (gloo's reduce-scatter is an allreduce)
            _attr(n, _A["ran"], string_val=c.backend_op)
        coll_node[k] = n.id

    for j, op in enumerate(rt.ops):
        if op.host_gap_s > 0:
            g = add("host gap", COMP_NODE, op.host_gap_s, [] if prev is None else [prev], t)
            _attr(g, "is_cpu_op", bool_val=True)
            _attr(g, _A["gap"], bool_val=True)
            prev, t = g.id, t + op.host_gap_s
        done, first = 0.0, True
        waits = [coll_node[k] for k in op.waits if k in coll_node]

        def piece(until_s: float, op: TraceOp = op, j: int = j, t: float = t, waits: list[int] = waits) -> None:
            nonlocal prev, done, first
            p = add(op.name, COMP_NODE, until_s - done, ([] if prev is None else [prev]) + (waits if first else []),
                    t + done)
            _attr(p, "is_cpu_op", bool_val=True)
            _attr(p, _A["op"], int64_val=j)
            _attr(p, _A["whole"], double_val=op.duration_s)
            if first and op.kernels:  # the recognized kernels (traces/work.py), as JSON, and their FLOPs
                _attr(p, _A["kernels"], string_val=json.dumps([kernel_to_list(k) for k in op.kernels]))
                _attr(p, "num_ops", int64_val=round(sum(k.flops for k in op.kernels)))
            if first and op.hidden_waits:  # waits inside the operator: [collective, seconds] as JSON
                _attr(p, _A["hidden"], string_val=json.dumps([list(x) for x in op.hidden_waits]))
            prev, done, first = p.id, until_s, False

        for k, offset_s in sorted(op.launches, key=lambda x: x[1]):
            cut = min(max(offset_s, done), op.duration_s)
            if first or cut > done:  # a launch at the operator's start follows a piece of 0 s (after its waits)
                piece(cut)
            launch(k, prev, t + done, done)
        if first or done < op.duration_s:
            piece(op.duration_s)
        t += op.duration_s
    return meta, nodes


def export_chakra(job: TraceJob, prefix: str | Path) -> list[Path]:
    """Write ``job`` as Chakra files ``<prefix>.<rank>.et`` (ASTRA-sim's naming), one per rank, and, when a
    collective runs on fewer than every rank, ASTRA-sim's communicator-group file ``<prefix>.comm_groups.json``
    (``{"id": [ranks]}``); the paths written."""
    out = []
    for i, rt in enumerate(job.ranks):
        meta, nodes = rank_nodes(job, i)
        out.append(write_et(f"{prefix}.{rt.rank}.et", meta, nodes))
    pg = group_ids(job)
    groups = {pg[c.group]: list(c.ranks) for c in job.collectives if pg[c.group] != DEFAULT_GROUP}
    if groups:
        out.append(atomic_write_text(f"{prefix}.comm_groups.json", json.dumps(groups, sort_keys=True) + "\n",
                                     make_parents=True, field="--out"))
    return out


# --------------------------------------------------------------------------------------------- import


@dataclass
class _Op:
    name: str
    key: Any
    duration_s: float = 0.0
    host_gap_s: float = 0.0
    waits: list[int] | None = None
    launches: list[tuple[int, float]] | None = None
    whole_s: float | None = None
    kernels: tuple[Kernel, ...] = ()
    hidden: tuple[tuple[int, float], ...] = ()  # (collective as the file numbers it, seconds)


@dataclass(frozen=True)
class _Coll:
    """A collective node of one rank: its group, op, bytes, measured span, and where the node is."""

    group: str
    op: str
    size_bytes: int
    start_s: float
    duration_s: float
    attrs: dict[str, Any]
    where: str


@dataclass(frozen=True)
class _Rank:
    rank: int
    file: EtFile
    ops: tuple[TraceOp, ...]  # waits and launches name the rank's own collectives (``colls``), in walk order
    colls: tuple[_Coll, ...]
    start_s: float | None
    step_s: float


def _order(f: EtFile) -> list[int]:
    """The nodes' indices in the order Chakra's feeder may issue them on one thread: a topological order of
    ``data_deps``, ties by file order; a duplicate id, a dependency on a missing node or a cycle is an error."""
    index: dict[int, int] = {}
    for i, n in enumerate(f.nodes):
        if n.id in index:
            raise ConfigError(f"{f.path}: byte {f.offsets[i]}", f"node id {n.id} ({n.name!r}) appears twice", _FIX)
        index[n.id] = i
    children: list[list[int]] = [[] for _ in f.nodes]
    missing = [0] * len(f.nodes)
    for i, n in enumerate(f.nodes):
        for d in set(n.data_deps):
            if d not in index:
                raise ConfigError(f"{f.path}: byte {f.offsets[i]}", f"node {n.id} ({n.name!r}) depends on node {d}, "
                                  "which the file does not hold", _FIX)
            children[index[d]].append(i)
            missing[i] += 1
    ready = [i for i, k in enumerate(missing) if k == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for c in children[i]:
            missing[c] -= 1
            if missing[c] == 0:
                heapq.heappush(ready, c)
    if len(out) < len(f.nodes):
        i = next(i for i, k in enumerate(missing) if k > 0)
        raise ConfigError(f"{f.path}: byte {f.offsets[i]}", f"node {f.nodes[i].id} ({f.nodes[i].name!r}) is on a "
                          "cycle of data dependencies (no simulator can issue it)", _FIX)
    return out


def _json_attr(raw: Any) -> Any:
    """A string attribute's JSON value; ``None`` when it is not a string or not JSON (the caller words the error)."""
    try:
        return json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def _kernels(raw: Any, where: str) -> tuple[Kernel, ...]:
    """The ``kernels`` attribute topotrain writes (a JSON list of kernels); none when absent."""
    if not isinstance(raw, str):
        return ()
    items = _json_attr(raw)
    if not isinstance(items, list):
        raise ConfigError(f"{where}: attribute kernels", "is not a JSON list of kernels", _FIX)
    return tuple(kernel_from_list(v, f"{where}: kernels[{i}]") for i, v in enumerate(items))


def _hidden(raw: Any, where: str) -> tuple[tuple[int, float], ...]:
    """The ``hidden_waits`` attribute topotrain writes (JSON [collective, seconds] pairs); none when absent."""
    if raw is None:
        return ()
    items = _json_attr(raw)
    if not isinstance(items, list):
        raise ConfigError(f"{where}: attribute {_A['hidden']}", "is not a JSON list of [collective, seconds]", _FIX)
    return hidden_waits_from(items, f"{where}: attribute {_A['hidden']}", 1 << 62)


def _read_rank(f: EtFile, rank: int) -> _Rank:
    """One rank's operators and collectives, walked in :func:`_order` (module docstring)."""
    meta = _attrs(f.metadata)
    ops: list[_Op] = []
    colls: list[_Coll] = []
    coll_of_id: dict[int, int] = {}
    end_of: dict[int, tuple[int, float] | None] = {}
    rank_of_pos = {}
    pending_gap, pending_launch = 0.0, list[int]()
    t_first, t_last = float("inf"), 0.0
    for pos, i in enumerate(_order(f)):
        n, where = f.nodes[i], f"{f.path}: byte {f.offsets[i]}"
        rank_of_pos[n.id] = pos
        a = _attrs(n)
        dur = float(a.get(_A["dur"], n.duration_micros * 1e-6))
        if n.start_time_micros:
            t_first, t_last = min(t_first, n.start_time_micros * 1e-6), max(t_last, n.start_time_micros * 1e-6 + dur)
        if n.type == METADATA_NODE:
            continue
        if n.type == COMP_NODE:
            if a.get(_A["gap"]):
                pending_gap += dur
                end_of[n.id] = None
                continue
            key = a.get(_A["op"])
            waits_here = any(d in coll_of_id for d in n.data_deps)  # a piece after a wait is an operator of its own
            if not (ops and key is not None and ops[-1].key == key and pending_gap == 0.0 and not waits_here):
                ops.append(_Op(n.name, key, 0.0, pending_gap, [], [(k, 0.0) for k in pending_launch],
                               kernels=_kernels(a.get(_A["kernels"]), where),
                               hidden=_hidden(a.get(_A["hidden"]), where)))
                pending_gap, pending_launch = 0.0, list[int]()
            cur = ops[-1]
            cur.duration_s += dur
            whole = a.get(_A["whole"])
            assert cur.waits is not None
            cur.waits.extend(coll_of_id[d] for d in n.data_deps if d in coll_of_id and coll_of_id[d] not in cur.waits)
            end_of[n.id] = (len(ops) - 1, cur.duration_s)
            if isinstance(whole, float):  # the exact duration behind the pieces' sum
                cur.whole_s = whole
            continue
        if n.type != COMM_COLL_NODE:
            raise ConfigError(where, f"node {n.id} ({n.name!r}) is a {NODE_TYPES[n.type]}: topotrain's trace workload "
                              "holds compute and collectives only (no point-to-point or memory nodes)",
                              "give a trace of COMP_NODE and COMM_COLL_NODE nodes")
        ctype = a.get("comm_type")
        if ctype not in OP_OF_COMM_TYPE:
            name = COMM_TYPES.get(ctype, "missing") if isinstance(ctype, int) else "missing"
            raise ConfigError(where, f"node {n.id} ({n.name!r}) has comm_type {ctype} ({name}): no topotrain "
                              "collective", f"topotrain's are {', '.join(COMM_TYPES[t] for t in OP_OF_COMM_TYPE)}")
        size = a.get("comm_size")
        if not isinstance(size, int) or size < 0:
            raise ConfigError(where, f"node {n.id} ({n.name!r}) has no comm_size (bytes) >= 0, got {size!r}", _FIX)
        k = len(colls)
        coll_of_id[n.id] = k
        group = str(a.get(_A["label"]) or a.get("pg_name") or DEFAULT_GROUP)
        colls.append(_Coll(group, OP_OF_COMM_TYPE[ctype], size, n.start_time_micros * 1e-6, dur,
                           a, where))
        parents = [d for d in n.data_deps if d in end_of]
        at = end_of[max(parents, key=lambda d: rank_of_pos[d])] if parents else None
        if at is None:
            pending_launch.append(k)
        else:
            launches = ops[at[0]].launches
            assert launches is not None
            exact = a.get(_A["at"])
            launches.append((k, exact if isinstance(exact, float) else at[1]))
    if pending_launch or pending_gap or not ops:  # launches or a gap after the last operator: an empty one ends
        ops.append(_Op("(end)", None, 0.0, pending_gap, [], [(k, 0.0) for k in pending_launch]))
    written = {c.attrs.get(_A["coll"]): k for k, c in enumerate(colls)}
    for o in ops:
        for k, _ in o.hidden:
            if k not in written:
                raise ConfigError(f"{f.path}: attribute {_A['hidden']}", f"names collective {k}, which the "
                                  "file's collective nodes do not (their attribute collective)", _FIX)
    out = tuple(TraceOp(o.name, o.duration_s if o.whole_s is None else o.whole_s, o.host_gap_s, tuple(o.waits or ()),
                        tuple(o.launches or ()), o.kernels, tuple((written[k], t) for k, t in o.hidden))
                for o in ops)
    serial = sum(o.duration_s + o.host_gap_s for o in out)
    if _A["step"] in meta and _A["start"] in meta:
        return _Rank(rank, f, out, tuple(colls), float(meta[_A["start"]]), float(meta[_A["step"]]))
    has_times = t_last > 0.0
    return _Rank(rank, f, out, tuple(colls), t_first if has_times else None,
                 max(serial, t_last - t_first) if has_times else serial)


def is_chakra_path(path: str | Path) -> bool:
    """Whether a file is named as a Chakra execution trace (``*.et``, ``*.et.gz``; an ``*.et.json`` is PyTorch's)."""
    name = Path(path).name
    return name.endswith((".et", ".et.gz"))


def _rank_number(f: EtFile, i: int) -> int:
    """The rank of a file: its metadata's ``rank``, else the ``.<rank>.et`` of its name, else its position."""
    r = _attrs(f.metadata).get(_A["rank"])
    if isinstance(r, int):
        return r
    m = _RANK_IN_NAME.search(Path(f.path).name)
    return int(m.group(1)) if m else i


def _groups(ranks: Sequence[_Rank]) -> dict[str, tuple[int, ...]]:
    """Each ``pg_name``'s ranks: its ``pg_ranks`` attribute where topotrain wrote one, else the ranks whose
    files hold that ``pg_name`` (every rank for ``0``, ASTRA-sim's default group, which an empty name is)."""
    out: dict[str, tuple[int, ...]] = {}
    for rk in ranks:
        for c in rk.colls:
            if c.group in out:
                continue
            given = c.attrs.get(_A["ranks"])
            if isinstance(given, list) and given:
                out[c.group] = tuple(int(x) for x in given)
            elif c.group == DEFAULT_GROUP:
                out[c.group] = tuple(r.rank for r in ranks)
            else:
                out[c.group] = tuple(r.rank for r in ranks if any(x.group == c.group for x in r.colls))
    return out


def import_chakra(paths: Sequence[str | Path], name: str = "") -> TraceJob:
    """Every rank's Chakra file of one job → a :class:`~topotrain.traces.model.TraceJob` (module docstring)."""
    if not paths:
        raise ConfigError("files", "none given", _FIX)
    files = [read_et(p) for p in paths]
    numbers = [_rank_number(f, i) for i, f in enumerate(files)]
    by_rank: dict[int, EtFile] = {}
    for f, r in zip(files, numbers, strict=True):
        if r in by_rank:
            raise ConfigError(f.path, f"is rank {r}, and so is {by_rank[r].path}", _FIX)
        by_rank[r] = f
    worlds = [w for f in files if isinstance(w := _attrs(f.metadata).get(_A["world"]), int)]
    n = max([len(files), *worlds, *(r + 1 for r in by_rank)])
    for r in range(n):
        if r not in by_rank:
            raise ConfigError("files", f"rank {r} of {n} is missing (have ranks {sorted(by_rank)})", _FIX)
    ranks = [_read_rank(by_rank[r], r) for r in range(n)]
    groups = _groups(ranks)
    seq: dict[int, list[tuple[str, int]]] = {}  # per rank: (group, i-th on the group) of its collectives
    members: dict[tuple[str, int], list[tuple[int, _Coll]]] = {}
    for rk in ranks:
        count: dict[str, int] = {}
        seq[rk.rank] = []
        for c in rk.colls:
            if rk.rank not in groups[c.group]:
                raise ConfigError(c.where, f"rank {rk.rank} runs a collective of group {c.group!r}, whose ranks are "
                                  f"{list(groups[c.group])}", _FIX)
            i = count[c.group] = count.get(c.group, -1) + 1
            seq[rk.rank].append((c.group, i))
            members.setdefault((c.group, i), []).append((rk.rank, c))
    for g, gr in groups.items():
        counts = {r: sum(1 for x in seq.get(r, ()) if x[0] == g) for r in gr}
        most = max(counts, key=lambda r: (counts[r], -r))
        for r in gr:
            if r >= n:
                raise ConfigError(f"group {g!r}", f"names rank {r}, and the job has {n} files", _FIX)
            if counts[r] != counts[most]:
                c = next(c for q, c in members[(g, counts[r])] if q == most)
                raise ConfigError(c.where, f"collective #{counts[r]} of group {g!r} ({c.op}, {c.size_bytes} B) on "
                                  f"rank {most} has no peer on rank {r} ({by_rank[r].path} has {counts[r]})", _FIX)
    keys = sorted(members, key=lambda k: _coll_order(k, members[k], seq))
    index = {k: j for j, k in enumerate(keys)}
    colls = []
    for k in keys:
        xs = sorted(members[k], key=lambda x: x[0])
        first = xs[0][1]
        for r, c in xs:
            if (c.op, c.size_bytes) != (first.op, first.size_bytes):
                raise ConfigError(c.where, f"collective #{k[1]} of group {k[0]!r} is {c.op} of {c.size_bytes} B on "
                                  f"rank {r} and {first.op} of {first.size_bytes} B on rank {xs[0][0]}: no peer",
                                  _FIX)
        net = first.attrs.get(_A["net"])
        if not isinstance(net, float):
            net = (max(0.0, min(c.start_s + c.duration_s for _, c in xs) - max(c.start_s for _, c in xs))
                   if first.op in SYMMETRIC else min(c.duration_s for _, c in xs))
        shapes = _param_shapes(first)
        for r, c in xs:
            if _param_shapes(c) != shapes:
                raise ConfigError(c.where, f"collective #{k[1]} of group {k[0]!r} has param_shapes {_param_shapes(c)} "
                                  f"on rank {r} and {shapes} on rank {xs[0][0]}: one FSDP unit has one set of shapes",
                                  _FIX)
        numel = fsdp_padded_numel(shapes, len(xs)) if shapes else 0
        if shapes and (numel == 0 or first.size_bytes % numel or first.size_bytes // numel not in (1, 2, 4, 8)):
            raise ConfigError(f"{first.where}: attribute {_A['shapes']}", f"gives {numel} elements padded for "
                              f"{len(xs)} ranks, which {first.size_bytes} B (comm_size) is not a whole 1, 2, 4 or "
                              "8 bytes per element of", "give the unit's unsharded shapes, or leave them out")
        ran = first.attrs.get(_A["ran"], "")
        if ran and ran not in COLLECTIVE_OPS:
            raise ConfigError(f"{first.where}: attribute {_A['ran']}", f"is {ran!r}, not one of "
                              f"{', '.join(COLLECTIVE_OPS)}", "leave it out, or give the op the backend ran")
        colls.append(TraceCollective(first.op, first.size_bytes, k[0], tuple(r for r, _ in xs),
                                     tuple(c.duration_s for _, c in xs), net, shapes, backend_op=str(ran)))
    rank_traces = []
    starts = [rk.start_s for rk in ranks if rk.start_s is not None]
    t0 = min(starts) if starts else 0.0
    meta = _attrs(files[0].metadata)
    for rk in ranks:
        glob = [index[x] for x in seq[rk.rank]]
        ops = tuple(TraceOp(o.name, o.duration_s, o.host_gap_s, tuple(glob[k] for k in o.waits),
                            tuple((glob[k], at) for k, at in o.launches), o.kernels,
                            tuple((glob[k], t) for k, t in o.hidden_waits)) for o in rk.ops)
        start = rk.start_s - t0 if rk.start_s is not None and _A["start"] not in _attrs(rk.file.metadata) else \
            (rk.start_s or 0.0)
        rank_traces.append(RankTrace(rk.rank, start, rk.step_s, ops, rk.file.path))
    measured = meta.get(_A["measured"])
    if not isinstance(measured, float):
        measured = max(r.start_s + r.step_s for r in rank_traces)
    label = name or str(meta.get(_A["job"]) or Path(files[0].path).name.split(".")[0])
    return TraceJob(n, str(meta.get(_A["backend"]) or "chakra"), tuple(rank_traces), tuple(colls), measured, label)


def _param_shapes(c: _Coll) -> tuple[tuple[int, ...], ...]:
    """A collective node's ``param_shapes`` attribute (an FSDP2 unit's unsharded parameter shapes, a JSON
    list of lists of sizes, as :func:`rank_nodes` writes it); ``()`` when absent. Shapes that do not give
    the node's ``comm_size`` at its group size are an error (a resize would pad the wrong parameters)."""
    raw = c.attrs.get(_A["shapes"])
    if raw is None:
        return ()
    items = _json_attr(raw)
    if not (isinstance(items, list) and items and all(
            isinstance(s, list) and s and all(type(d) is int and d >= 0 for d in s) for s in items)):
        raise ConfigError(f"{c.where}: attribute {_A['shapes']}", f"is not a JSON list of parameter shapes, got "
                          f"{str(raw)[:60]!r}", 'write e.g. "[[16,3,3,3],[16]]" (or leave it out)')
    return tuple(tuple(s) for s in items)


def _coll_order(key: tuple[str, int], xs: list[tuple[int, _Coll]], seq: dict[int, list[tuple[str, int]]]) -> tuple:
    """Where a collective goes in the job's list: at the index topotrain wrote (``collective``), else by its
    place in the lowest member rank's walk."""
    idx = xs[0][1].attrs.get(_A["coll"])
    r = min(q for q, _ in xs)
    return (0, idx, "", 0) if isinstance(idx, int) else (1, seq[r].index(key), key[0], key[1])
