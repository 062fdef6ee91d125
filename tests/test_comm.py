"""topotrain.comm: schedules executed with torch.distributed (gloo over loopback, one job of forked processes).

In-process tests check the chunk → element mapping, the per-rank plans and the reference executor
(:func:`simulate_schedule`) against closed forms. The distributed tests start one gloo job of 8
processes (127.0.0.1 only) once per module, forked from a server that has imported torch (so its import is
paid once, not once per rank), form groups of 2, 3, 4 and 5 ranks (some of them not
starting at rank 0) plus the 8-rank world, run every case in one go and compare each result with
torch.distributed's own collective: bit for bit for integers, copies and max/min, within the rounding
of the dtype for float sums. Each case is then reported as its own test.
"""

from __future__ import annotations

import copy
import datetime
import functools
import importlib
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
import types
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule  # noqa: E402
from topotrain.comm import (  # noqa: E402
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    build_execution_schedule,
    chunk_offsets,
    hook,
    plan_schedule,
    rank_slices,
    reduce,
    reduce_scatter,
    run_schedule,
    schedule_size,
    simulate_schedule,
)
from topotrain.topology.graph import Topology  # noqa: E402
from topotrain.util.errors import ConfigError  # noqa: E402

_registry: types.ModuleType | None
try:
    _registry = importlib.import_module("topotrain.collectives.registry")
except ImportError:  # the registry is optional for this file
    _registry = None

WORLD = 8
#: name → global ranks (None: the default group). Groups overlap; every rank walks the cases in order.
#: DDP runs only on ranks 5–7 (g2, g3): its first use imports torch._dynamo, ~1.5 s of CPU per process.
GROUPS: tuple[tuple[str, tuple[int, ...] | None], ...] = (
    ("g2", (5, 7)), ("g3", (5, 6, 7)), ("g4", (0, 1, 2, 3)), ("g5", (3, 4, 5, 6, 7)), ("w8", None))
GROUP_SIZE = {name: (WORLD if ranks is None else len(ranks)) for name, ranks in GROUPS}
#: GPUs per server of each group's test topology
SERVER_GPUS = {"g2": 1, "g3": 1, "g4": 2, "g5": 1, "w8": 4}
DTYPES = {"int64": torch.int64, "int32": torch.int32, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


# ---- reference schedules, written here directly ---------------------------------------------------
def _sched(op: str, name: str, p: int, size: int, chunk_bytes: Sequence[int] | np.ndarray,
           chunk_src: Sequence[int] | np.ndarray, chunk_dst: Sequence[int] | np.ndarray,
           phases: list[Phase]) -> Schedule:
    i64 = np.int64
    return Schedule(CollectiveOp(op), name, tuple(f"r{i}" for i in range(p)), int(size),
                    np.asarray(chunk_bytes, dtype=i64), np.asarray(chunk_src, dtype=i64),
                    np.asarray(chunk_dst, dtype=i64), tuple(phases))


def split_bytes(size: int, parts: int) -> np.ndarray:
    """Integer chunks a byte apart, larger first (written here: the library's own split is fractional where
    ``parts`` does not divide ``size``; a hand-written schedule may well use whole elements)."""
    base, extra = divmod(size, parts)
    return np.array([base + 1] * extra + [base] * (parts - extra), dtype=np.int64)


def _ring_rs(p: int) -> list[Phase]:
    """Ring reduce-scatter ending with chunk r on rank r: step k, rank r sends chunk (r−k−1) mod p."""
    r = np.arange(p)
    return [Phase.of(r, (r + 1) % p, (r - k - 1) % p, (r - k - 1) % p + 1, True) for k in range(p - 1)]


def _ring_ag(p: int) -> list[Phase]:
    """Ring allgather from chunk r on rank r: step k, rank r forwards chunk (r−k) mod p."""
    r = np.arange(p)
    return [Phase.of(r, (r + 1) % p, (r - k) % p, (r - k) % p + 1, False) for k in range(p - 1)]


def ref_allreduce(p: int, size: int) -> Schedule:
    return _sched("allreduce", "ref-ring", p, size, split_bytes(size, p), [-1] * p, [-1] * p,
                  _ring_rs(p) + _ring_ag(p))


def ref_reduce_scatter(p: int, size: int) -> Schedule:
    return _sched("reduce-scatter", "ref-ring", p, size, split_bytes(size, p), [-1] * p, range(p),
                  _ring_rs(p))


def ref_allgather(p: int, size: int) -> Schedule:
    return _sched("allgather", "ref-ring", p, size, split_bytes(size, p), range(p), [-1] * p, _ring_ag(p))


def ref_chain_broadcast(p: int, size: int, root: int, k: int = 3) -> Schedule:
    """Pipelined chain root → root+1 → … in ``k`` chunks: in phase t stage s forwards chunk t − s."""
    order = [(root + i) % p for i in range(p)]
    phases = []
    for t in range(k + p - 2):
        trip = [(order[s], order[s + 1], t - s) for s in range(p - 1) if 0 <= t - s < k]
        phases.append(Phase.of([a for a, _, _ in trip], [b for _, b, _ in trip], [c for _, _, c in trip],
                               [c + 1 for _, _, c in trip], False))
    return _sched("broadcast", "ref-chain", p, size, split_bytes(size, k), [root] * k, [-1] * k, phases)


def ref_flat_broadcast(p: int, size: int, root: int, k: int = 2) -> Schedule:
    """One phase: the root sends chunks 0:k (one transfer spanning several chunks) to every rank."""
    others = [r for r in range(p) if r != root]
    phase = Phase.of([root] * len(others), others, [0] * len(others), [k] * len(others), False)
    return _sched("broadcast", "ref-flat", p, size, split_bytes(size, k), [root] * k, [-1] * k, [phase])


def ref_reduce(p: int, size: int, root: int) -> Schedule:
    """One phase: every other rank sends its buffer to the root, which adds them all (same range)."""
    others = [r for r in range(p) if r != root]
    phase = Phase.of(others, [root] * len(others), [0] * len(others), [1] * len(others), True)
    return _sched("reduce", "ref-direct", p, size, [size], [-1], [root], [phase])


def ref_alltoall(p: int, size: int) -> Schedule:
    """Chunk i·p + j is rank i's block for rank j; one phase of all p(p−1) messages."""
    idx = np.arange(p * p)
    i, j = idx // p, idx % p
    off = i != j
    phase = Phase.of(i[off], j[off], idx[off], idx[off] + 1, False)
    return _sched("all-to-all", "ref-direct", p, size, np.tile(split_bytes(size, p), p), i, j, [phase])


def ref_builder(buf: torch.Tensor, p: int) -> Schedule:
    """A DDP-hook schedule builder: the reference ring in element units."""
    return ref_allreduce(p, buf.numel())


# ---- a small BiGraph-like test topology (servers of g GPUs on an NVSwitch, one NIC each) ----------
def make_topology(p: int, g: int) -> Topology:
    t = Topology(f"test-{p}x{g}")
    m = p // g
    half = 2 if m >= 4 else 1
    ups = [t.add_node(f"sw/upper{i}", "switch") for i in range(half)]
    los = [t.add_node(f"sw/lower{i}", "switch") for i in range(half)]
    for u in ups:
        for lo in los:
            t.add_link(u, lo, 12.5e9, 1e-6)
    switches = [x for pair in zip(ups, los, strict=True) for x in pair]
    for s in range(m):
        srv = f"s{s}"
        nvs = t.add_node(f"{srv}/nvs", "nvswitch", server=srv)
        nic = t.add_node(f"{srv}/nic", "nic", server=srv)
        t.add_link(nvs, nic, 50e9, 1e-7)
        t.add_link(nic, switches[s % len(switches)], 12.5e9, 1e-6)
        for k in range(g):
            t.add_link(t.add_node(f"{srv}/gpu{k}", "gpu", server=srv), nvs, 150e9, 1e-7)
    return t




# ---- inputs and comparisons -----------------------------------------------------------------------
def _seed(case_id: str, rank: int) -> int:
    return zlib.crc32(case_id.encode()) * 131 + rank + 1


def make_input(case_id: str, rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Deterministic input of schedule rank ``rank`` (any rank can regenerate any other's)."""
    g = torch.Generator().manual_seed(_seed(case_id, rank))
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    hi = 2**40 if dtype == torch.int64 else 2**20
    return torch.randint(-hi, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def _exact(dtype: torch.dtype, op: str) -> bool:
    return not dtype.is_floating_point or op in ("max", "min")


def compare(ours: torch.Tensor, ref: torch.Tensor, p: int, exact: bool, what: str) -> str | None:
    """None if ``ours`` matches ``ref`` (bit for bit if ``exact``, else within p² dtype epsilons)."""
    if ours.shape != ref.shape:
        return f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    if exact:
        if ours.dtype != ref.dtype or not torch.equal(ours, ref):
            bad = int((ours.to(ref.dtype) != ref).sum())
            return f"{what}: {bad} of {ref.numel()} elements differ"
        return None
    if ours.numel() == 0:
        return None
    tol = p * p * torch.finfo(ours.dtype).eps
    err = float((ours.double() - ref.double()).abs().max())
    return None if err <= tol else f"{what}: max error {err:.3g} > {tol:.3g}"


_REDUCE_OP = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT"}


# ---- distributed cases ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Case:
    """One distributed check. ``schedule`` (reference) or ``algorithm`` (registry name, built by the
    wrapper in the worker on the group's test topology)."""

    id: str
    group: str
    kind: str  # a CollectiveOp value, or "ddp"
    dtype: str = "int64"
    numel: int = 0
    schedule: Schedule | None = None
    algorithm: str | None = None
    op: str = "sum"
    api: str = "wrapper"  # wrapper | run | input (allgather from input=)
    perm: bool = False  # rank_of: the group's ranks in reverse order
    options: dict[str, Any] = field(default_factory=dict)


def _reference_cases() -> list[Case]:
    out: list[Case] = []
    for gname, p in GROUP_SIZE.items():
        awkward = sorted({1, p - 1, 1003})

        def add(kind: str, dtype: str, n: int, sched: Schedule, tag: str = "", gname: str = gname,
                **kw: Any) -> None:
            cid = f"{gname}-{kind}-{sched.algorithm}-{dtype}-n{n}{tag}"
            out.append(Case(cid, gname, kind, dtype, n, sched, **kw))

        for n in awkward:
            add("allreduce", "int64", n, ref_allreduce(p, n))
        for dt in ("float32", "float16", "bfloat16", "int32"):
            add("allreduce", dt, 1003, ref_allreduce(p, 1003))
        for op in ("max", "min"):
            add("allreduce", "int64", 1003, ref_allreduce(p, 1003), f"-{op}", op=op)
            add("allreduce", "float32", 1003, ref_allreduce(p, 1003), f"-{op}", op=op)
        add("allreduce", "int64", 1003, ref_allreduce(p, 1003), "-run", api="run")
        add("allreduce", "float32", 1003, ref_allreduce(p, 1003), "-perm", perm=True)
        # built in bytes (size = numel·4 for float32): boundaries map to floor(b/4)
        add("allreduce", "float32", 1003, ref_allreduce(p, 1003 * 4), "-bytes")
        add("allreduce", "int64", 7, ref_allreduce(p, 7 * 8), "-bytes")
        for n in awkward + [4 * p]:
            add("reduce-scatter", "int64", n, ref_reduce_scatter(p, n))
            add("allgather", "int64", n, ref_allgather(p, n))
        for kind, build in (("reduce-scatter", ref_reduce_scatter), ("allgather", ref_allgather)):
            add(kind, "float32", 1003, build(p, 1003))
            add(kind, "int64", 1003, build(p, 1003), "-perm", perm=True)
            add(kind, "bfloat16", 8 * p, build(p, 8 * p))
        add("allgather", "float16", 1003, ref_allgather(p, 1003), "-input", api="input")
        root = p - 1
        for dt, n in (("int64", 1003), ("float16", 1003), ("int64", 1)):
            add("broadcast", dt, n, ref_chain_broadcast(p, n, root))
        add("broadcast", "float32", 1003, ref_flat_broadcast(p, 1003, 1 % p))
        add("broadcast", "int64", 1003, ref_chain_broadcast(p, 1003, 0), "-perm", perm=True)
        for dt in ("int64", "float32"):
            add("reduce", dt, 1003, ref_reduce(p, 1003, root))
        for dt, n in (("int64", 1), ("int64", p), ("int64", 1003), ("float16", 1003)):
            add("all-to-all", dt, n, ref_alltoall(p, n))
        add("all-to-all", "int64", 1003, ref_alltoall(p, 1003), "-perm", perm=True)
        add("all-to-all", "float32", 5 * p + 3, ref_alltoall(p, (5 * p + 3) * 4), "-bytes")
    out.append(Case("g4-allreduce-ref-ring-float32-n1000003", "g4", "allreduce", "float32", 1_000_003,
                    ref_allreduce(4, 1_000_003)))
    out.append(Case("w8-allreduce-ref-ring-int64-n1000003", "w8", "allreduce", "int64", 1_000_003,
                    ref_allreduce(8, 1_000_003)))
    out.append(Case("g3-ddp-ref-ring", "g3", "ddp", "float32", options={"builder": "ref"}))
    return out


def _registry_cases() -> tuple[list[Case], list[tuple[str, str]]]:
    """(cases, build failures other than a ConfigError for an unsupported combination)."""
    if _registry is None:
        return [], []
    cases: list[Case] = []
    broken: list[tuple[str, str]] = []
    for gname, p in GROUP_SIZE.items():
        topo = make_topology(p, SERVER_GPUS[gname])
        for name, info in _registry.ALGORITHMS.items():
            for op in info.ops:
                opts = {"root": p - 1} if op in (CollectiveOp.BROADCAST, CollectiveOp.REDUCE) else {}
                try:
                    _registry.build_schedule(op, name, topo, topo.gpus, 1003 * 8, **opts)
                except ConfigError:
                    continue  # not for this rank count / topology: the registry says so
                except Exception as e:  # noqa: BLE001 - reported as a failing test below
                    broken.append((f"{gname}-{op.value}-{name}", f"{type(e).__name__}: {e}"))
                    continue
                variants = [("int64", 1), ("int64", p - 1), ("int64", 1003), ("float32", 1003)]
                if op is CollectiveOp.ALLREDUCE:
                    variants.append(("bfloat16", 1003))
                for dt, n in sorted(set(variants)):
                    cases.append(Case(f"{gname}-{op.value}-{name}-{dt}-n{n}", gname, op.value, dt, n,
                                      algorithm=name, options=opts))
        if gname == "g3":  # empty buffers: a one-byte schedule that maps to no element
            for kind, name in (("allreduce", "ring"), ("reduce-scatter", "ring"), ("allgather", "ring"),
                               ("broadcast", "tree"), ("all-to-all", "pairwise")):
                opts = {"root": 1} if kind == "broadcast" else {}
                cases.append(Case(f"g3-{kind}-{name}-float32-n0", gname, kind, "float32", 0, algorithm=name,
                                  options=opts))
        for name in ("ring", "halving-doubling", "tree", "hierarchical", "torus2d", "hdrm"):
            try:
                _registry.build_schedule("allreduce", name, topo, topo.gpus, 4096)
            except ConfigError:
                continue
            if gname in ("g2", "g3"):
                cases.append(Case(f"{gname}-ddp-{name}", gname, "ddp", "float32", algorithm=name))
    return cases, broken


# Built lazily (spawned workers import this module but need only its functions).
reference_cases = functools.cache(_reference_cases)
registry_cases = functools.cache(_registry_cases)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "reference_case" in metafunc.fixturenames:
        metafunc.parametrize("reference_case", reference_cases(), ids=lambda c: c.id)
    if "registry_case" in metafunc.fixturenames:
        metafunc.parametrize("registry_case", registry_cases()[0], ids=lambda c: c.id)


# ---- the worker -----------------------------------------------------------------------------------
def _all_reduce_ref(x: torch.Tensor, exact: bool, op: str, pg: Any) -> torch.Tensor:
    r = x.clone() if exact else x.double()
    dist.all_reduce(r, op=getattr(dist.ReduceOp, _REDUCE_OP[op]), group=pg)
    return r


def _run_case(case: Case, pg: Any, members: list[int], topo: Topology) -> str | None:
    p = len(members)
    rof = list(reversed(members)) if case.perm else list(members)
    me = rof.index(dist.get_rank())
    dtype = DTYPES[case.dtype]
    n = case.numel
    rank_of = rof if case.perm else None
    algo: str | Schedule = case.schedule if case.schedule is not None else str(case.algorithm)
    kw: dict[str, Any] = {"group": pg, "rank_of": rank_of, **case.options}
    topo_arg = None if case.schedule is not None else topo
    exact = _exact(dtype, case.op)
    if case.kind == "ddp":
        return _run_ddp(case, pg, p, topo)
    op = CollectiveOp(case.kind)
    x = make_input(case.id, me, n, dtype)
    if case.schedule is not None:
        sched = case.schedule
    else:
        buf_numel = n
        probe = torch.empty(buf_numel, dtype=dtype)
        sched = build_execution_schedule(op, str(case.algorithm), topo, None, schedule_size(probe), p,
                                         **case.options)
    if op is CollectiveOp.ALLREDUCE:
        if case.api == "run":
            ours = run_schedule(sched, x.clone(), rank=me, group=pg, op=case.op, rank_of=rank_of)
        else:
            ours = all_reduce(x.clone(), algo, topo_arg, op=case.op, **kw)
        return compare(ours, _all_reduce_ref(x, exact, case.op, pg), p, exact, "allreduce")
    if op is CollectiveOp.REDUCE_SCATTER:
        x0 = x.clone()
        ours = reduce_scatter(x, algo, topo_arg, op=case.op, **kw)
        if not torch.equal(x, x0):
            return "reduce_scatter changed its input"
        full = _all_reduce_ref(x, exact, case.op, pg)
        want = torch.cat([full[lo:hi] for lo, hi in rank_slices(sched, n, me, "dst")] + [full[:0]])
        err = compare(ours, want.to(dtype) if exact else want, p, exact, "reduce-scatter vs all_reduce")
        off = chunk_offsets(sched, n)
        standard = (sched.num_chunks == p and np.array_equal(sched.chunk_dst, np.arange(p))
                    and np.array_equal(off, np.arange(p + 1) * (n // p)) and n % p == 0)
        if err is None and standard and exact and not case.perm:
            native = torch.empty(n // p, dtype=dtype)
            dist.reduce_scatter_single(native, x.clone(), group=pg)
            err = compare(ours, native, p, True, "reduce-scatter vs reduce_scatter_single")
        return err
    if op is CollectiveOp.ALLGATHER:
        truth = make_input(case.id, -1, n, dtype)
        mine = rank_slices(sched, n, me, "src")
        out = torch.full((n,), 3, dtype=dtype)  # junk outside this rank's shard
        placed = torch.zeros(n, dtype=dtype)
        for lo, hi in mine:
            placed[lo:hi] = truth[lo:hi]
            if case.api != "input":
                out[lo:hi] = truth[lo:hi]
        if case.api == "input":
            shard = torch.cat([truth[lo:hi] for lo, hi in mine] + [truth[:0]])
            ours = all_gather(out, algo, topo_arg, input=shard, **kw)
        else:
            ours = all_gather(out, algo, topo_arg, **kw)
        if ours is not out:
            return "all_gather did not fill its output in place"
        dist.all_reduce(placed, group=pg)  # zeros elsewhere: the sum is the gathered buffer, exactly
        err = compare(ours, placed, p, True, "allgather vs all_reduce of placed shards")
        if err is None:
            err = compare(ours, truth, p, True, "allgather vs closed form")
        off = chunk_offsets(sched, n)
        standard = (sched.num_chunks == p and np.array_equal(sched.chunk_src, np.arange(p))
                    and n % p == 0 and np.array_equal(off, np.arange(p + 1) * (n // p)))
        if err is None and standard and not case.perm:
            native = torch.empty(n, dtype=dtype)
            dist.all_gather_single(native, truth[me * (n // p):(me + 1) * (n // p)].clone(), group=pg)
            err = compare(ours, native, p, True, "allgather vs all_gather_single")
        return err
    if op is CollectiveOp.BROADCAST:
        root = int(sched.chunk_src[0])
        ours = broadcast(x.clone(), algo, topo_arg, **kw)
        ref = x.clone()
        dist.broadcast(ref, src=rof[root], group=pg)
        err = compare(ours, ref, p, True, "broadcast")
        return err or compare(ours, make_input(case.id, root, n, dtype), p, True, "broadcast vs root's input")
    if op is CollectiveOp.REDUCE:
        root = int(sched.chunk_dst[0])
        ours = reduce(x.clone(), algo, topo_arg, op=case.op, **kw)
        ref = x.clone() if exact else x.double()
        dist.reduce(ref, dst=rof[root], group=pg)
        return compare(ours, ref, p, exact, "reduce") if me == root else None
    if op is CollectiveOp.ALLTOALL:
        ours = all_to_all(x, algo, topo_arg, **kw)
        space = n * p
        off = chunk_offsets(sched, space)
        size = np.diff(off)
        blocks = [make_input(case.id, i, n, dtype)[int(off[i * p + me] - off[i * p]):
                                                    int(off[i * p + me + 1] - off[i * p])] for i in range(p)]
        err = compare(ours, torch.cat(blocks), p, True, "all-to-all vs closed form")
        if err is None and not case.perm:
            native = torch.empty(int(sum(size[i * p + me] for i in range(p))), dtype=dtype)
            dist.all_to_all_single(native, x.clone(), [int(size[i * p + me]) for i in range(p)],
                                   [int(size[me * p + j]) for j in range(p)], group=pg)
            err = compare(ours, native, p, True, "all-to-all vs all_to_all_single")
        return err
    return f"unknown kind {case.kind}"


def _run_ddp(case: Case, pg: Any, p: int, topo: Topology) -> str | None:
    """Train a tiny model with the default DDP allreduce and with our hook; the parameters must agree."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    me = dist.get_rank(pg)
    torch.manual_seed(1234)
    base = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    calls = [0]
    inner = hook(ref_builder) if case.options.get("builder") == "ref" else hook(str(case.algorithm), topo)

    @functools.wraps(inner)  # DDP checks the hook's annotations; wraps exposes those of ``inner``
    def counting(state: Any, bucket: Any) -> Any:
        calls[0] += 1
        return inner(state, bucket)

    models = []
    for with_hook in (False, True):
        m = DDP(copy.deepcopy(base), process_group=pg, bucket_cap_mb=1e-4)  # several buckets
        if with_hook:
            m.register_comm_hook(pg, counting)
        models.append((m, torch.optim.SGD(m.parameters(), lr=0.1)))
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + me)
        xb, yb = torch.randn(6, 7, generator=g), torch.randn(6, 1, generator=g)
        for m, opt in models:
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xb), yb).backward()
            opt.step()
    if calls[0] < 4:
        return f"the hook ran {calls[0]} times in 4 steps"
    for (name, a), b, b0 in zip(models[0][0].module.named_parameters(), models[1][0].module.parameters(),
                                base.parameters(), strict=True):
        if torch.equal(a, b0):
            return f"{name} did not train"
        err = float((a - b).detach().abs().max())
        if err > 1e-5:
            return f"{name}: hook vs default DDP differ by {err:.3g}"
    return None


def _worker(rank: int, port: int, cases: list[Case], topos: dict[str, Topology], out: Any,
            ready: Any) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    members_of = {name: (list(range(WORLD)) if ranks is None else list(ranks)) for name, ranks in GROUPS}
    mine = [c for c in cases if rank in members_of[c.group]]
    if any(c.kind == "ddp" for c in mine):
        importlib.import_module("torch._dynamo")  # DDP's lazy import: now, not while peers wait
    try:
        ready.wait(timeout=180)  # everyone imported: the 30 s rendezvous starts only now
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=30))
    except Exception:  # noqa: BLE001
        out.put(("__error__", rank, traceback.format_exc(), 0.0))
        out.put(("__done__", rank, None, 0.0))
        return
    aborted: str | None = None
    try:
        groups = {name: None if ranks is None else dist.new_group(list(ranks)) for name, ranks in GROUPS}
        for case in mine:
            if aborted is not None:
                out.put((case.id, rank, f"not run: {aborted}", 0.0))
                continue
            t0 = time.perf_counter()
            try:
                err = _run_case(case, groups[case.group], members_of[case.group], topos[case.group])
            except ConfigError as e:  # raised before any message, alike on every rank: no desync
                err = f"ConfigError: {e}"
            except Exception as e:  # noqa: BLE001
                # a timeout or a failed transfer leaves peers mid-collective: stop rather than desync
                err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
                aborted = f"the job stopped after an error in {case.id} on rank {rank}"
            out.put((case.id, rank, err, time.perf_counter() - t0))
        if aborted is None:
            dist.barrier()
        else:
            out.put(("__error__", rank, aborted, 0.0))
    except Exception:  # noqa: BLE001
        out.put(("__error__", rank, traceback.format_exc(), 0.0))
    finally:
        out.put(("__done__", rank, None, 0.0))
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cases(cases: list[Case], deadline_s: float = 150.0) -> dict[str, Any]:
    """Start the 8-rank gloo job and run ``cases``: {case id: {rank: error or None}, "__error__": [...]}."""
    # forkserver with torch preloaded: torch (and DDP's lazy torch._dynamo) are imported once, in the
    # server, instead of once per rank; each rank is a fork of it, so still a fresh process for gloo.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", __name__])
    out = ctx.Queue()
    ready = ctx.Barrier(WORLD)
    topos = {g: make_topology(p, SERVER_GPUS[g]) for g, p in GROUP_SIZE.items()}
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, cases, topos, out, ready), daemon=True)
             for r in range(WORLD)]
    results: dict[str, Any] = {"__error__": [], "__time__": {}}
    done = 0
    end = time.monotonic() + deadline_s
    try:
        for pr in procs:
            pr.start()
        while done < WORLD and time.monotonic() < end:
            try:
                cid, rank, err, took = out.get(timeout=1.0)
            except queue.Empty:
                if not any(pr.is_alive() for pr in procs):
                    break
                continue
            if cid == "__done__":
                done += 1
            elif cid == "__error__":
                results["__error__"].append(f"rank {rank}: {err}")
            else:
                results.setdefault(cid, {})[rank] = err
                results["__time__"][cid] = max(results["__time__"].get(cid, 0.0), took)
        if done < WORLD:
            results["__error__"].append(f"only {done} of {WORLD} workers finished within {deadline_s:.0f} s")
    finally:
        join_end = time.monotonic() + 15
        for pr in procs:
            pr.join(timeout=max(0.1, join_end - time.monotonic()))
        for pr in procs:
            if pr.is_alive():
                pr.terminate()
                pr.join(timeout=5)
        out.close()
    return results


@pytest.fixture(scope="module")
def dist_results() -> dict[str, Any]:
    return run_cases(reference_cases() + registry_cases()[0])


def _check_result(case: Case, results: dict[str, Any]) -> None:
    members = dict(GROUPS)[case.group]
    expected = set(range(WORLD) if members is None else members)
    got = results.get(case.id, {})
    missing = sorted(expected - set(got))
    if missing:
        pytest.fail(f"no result from ranks {missing}; job errors: {' | '.join(results['__error__'])[:2000]}")
    errors = {r: e for r, e in got.items() if e is not None}
    if errors:
        r = min(errors)
        more = f" (and {len(errors) - 1} more ranks)" if len(errors) > 1 else ""
        pytest.fail(f"rank {r}: {errors[r]}{more}")


def test_distributed_reference(reference_case: Case, dist_results: dict[str, Any]) -> None:
    _check_result(reference_case, dist_results)


def test_distributed_registry(registry_case: Case, dist_results: dict[str, Any]) -> None:
    _check_result(registry_case, dist_results)


def test_registry_is_covered() -> None:
    """Every registry algorithm builds for some group and is executed; no builder crashes."""
    if _registry is None:
        pytest.skip("topotrain.collectives.registry is not available")
    cases, broken = registry_cases()
    assert not broken, broken
    covered = {(c.algorithm, c.kind) for c in cases}
    for name, info in _registry.ALGORITHMS.items():
        for op in info.ops:
            assert (name, op.value) in covered, f"{name}/{op.value} is never executed"


def test_job_ran_cleanly(dist_results: dict[str, Any]) -> None:
    assert not dist_results["__error__"], dist_results["__error__"]


# ---- in-process tests -----------------------------------------------------------------------------
def _inputs(p: int, n: int, seed: int) -> list[torch.Tensor]:
    return [make_input(f"sim{seed}", r, n, torch.int64) for r in range(p)]


def expected_final(schedule: Schedule, inputs: list[torch.Tensor], finals: list[torch.Tensor],
                   combine: Callable[[list[torch.Tensor]], torch.Tensor] | None = None) -> None:
    """Check the end state of every rank against chunk_src/chunk_dst (the Schedule's contract)."""
    p = schedule.num_ranks
    off = chunk_offsets(schedule, inputs[0].numel())
    combine = combine or (lambda xs: torch.stack(xs).sum(0))
    for c in range(schedule.num_chunks):
        lo, hi = int(off[c]), int(off[c + 1])
        src, dst = int(schedule.chunk_src[c]), int(schedule.chunk_dst[c])
        want = combine([x[lo:hi] for x in inputs]) if src == -1 else inputs[src][lo:hi]
        for t in range(p) if dst == -1 else [dst]:
            assert torch.equal(finals[t][lo:hi], want), (schedule.algorithm, c, t)


REF_BUILDERS: dict[str, Callable[[int, int], Schedule]] = {
    "allreduce": ref_allreduce, "reduce-scatter": ref_reduce_scatter, "allgather": ref_allgather,
    "broadcast": lambda p, n: ref_chain_broadcast(p, n, p - 1), "flat-broadcast": lambda p, n:
    ref_flat_broadcast(p, n, 0), "reduce": lambda p, n: ref_reduce(p, n, p // 2), "all-to-all": ref_alltoall,
}


@pytest.mark.parametrize("kind", list(REF_BUILDERS))
@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_simulate_reference_schedules(kind: str, p: int) -> None:
    for n in (1, p - 1, p, 37):
        s = REF_BUILDERS[kind](p, n)
        numel = n * p if kind == "all-to-all" else n
        inputs = _inputs(p, numel, p * 1000 + n)
        finals = simulate_schedule(s, [x.clone() for x in inputs])
        expected_final(s, inputs, finals)


def test_simulate_max_and_transfer_to_self() -> None:
    p, n = 4, 10
    s = ref_allreduce(p, n)
    r = np.arange(p)
    own = Phase.of(r, r, r, r + 1, False)  # a local copy per rank: a no-op that must stay one
    s2 = Schedule(s.op, "with-self", s.ranks, s.size_bytes, s.chunk_bytes, s.chunk_src, s.chunk_dst,
                  (own,) + s.phases + (own,))
    inputs = _inputs(p, n, 7)
    finals = simulate_schedule(s2, [x.clone() for x in inputs], op="max")
    expected_final(s2, inputs, finals, combine=lambda xs: torch.stack(xs).max(0).values)
    plan = plan_schedule(s2, n, 0)
    assert plan.num_messages == 2 * 2 * (p - 1)  # self copies are not messages


def test_phases_read_the_state_before_the_phase() -> None:
    """Two ranks swap their buffers in one phase: each must get the other's *old* data."""
    s = _sched("allreduce", "swap", 2, 4, [4], [-1], [-1], [Phase.of([0, 1], [1, 0], [0, 0], [1, 1], False)])
    a, b = torch.arange(4), torch.arange(4) + 10
    simulate_schedule(s, [a, b])
    assert a.tolist() == [10, 11, 12, 13] and b.tolist() == [0, 1, 2, 3]


def test_chunk_offsets_mapping() -> None:
    s = ref_allreduce(4, 10)  # chunks 3, 3, 2, 2
    assert chunk_offsets(s, 10).tolist() == [0, 3, 6, 8, 10]  # element units: the identity
    sb = ref_allreduce(4, 10 * 4)  # bytes of float32: 10, 10, 10, 10 → floor(b / 4)
    assert chunk_offsets(sb, 10).tolist() == [0, 2, 5, 7, 10]
    assert chunk_offsets(s, 0).tolist() == [0, 0, 0, 0, 0]
    tiny = ref_allreduce(3, 4)  # 1 float32 element in 3 chunks of 2, 1, 1 bytes
    assert chunk_offsets(tiny, 1).tolist() == [0, 0, 0, 1]
    huge = ref_allreduce(2, 2**50)  # no int64 overflow in b·N
    off = chunk_offsets(huge, 2**40)
    assert off.tolist() == [0, 2**39, 2**40]
    assert rank_slices(sb, 10, 2, "dst") == [(0, 10)]  # allreduce: every rank gets every chunk
    assert rank_slices(ref_allgather(4, 10), 10, 1, "src") == [(3, 6)]
    assert rank_slices(ref_reduce_scatter(4, 40), 10, 3, "dst") == [(7, 10)]


def test_bytes_and_elements_schedules_agree() -> None:
    for dt in (torch.float32, torch.float16, torch.int64):
        x = torch.zeros(13, dtype=dt)
        assert schedule_size(x) == 13 * x.element_size()
        assert schedule_size(x, "elements") == 13
        p = 3
        inputs = [make_input("agree", r, 13, torch.int64) for r in range(p)]
        for size in (schedule_size(x), schedule_size(x, "elements")):
            s = ref_allgather(p, size)
            finals = simulate_schedule(s, [t.clone() for t in inputs])
            expected_final(s, inputs, finals)


def test_plan_messages_ring() -> None:
    """Ring allreduce: each rank sends 2(p−1) messages and receives 2(p−1) — none when chunks are empty."""
    p = 5
    plan = plan_schedule(ref_allreduce(p, 100), 100, 2)
    assert plan.num_messages == 4 * (p - 1)
    one = plan_schedule(ref_allreduce(p, 1), 1, 2)  # only chunk 0 has an element
    sends = sum(len(ph.sends) for ph in one.phases)
    assert sends == 2  # rank 2 forwards chunk 0 once in each half of the ring


def test_input_errors() -> None:
    s = ref_allreduce(3, 9)
    with pytest.raises(ConfigError, match="op: unknown reduction"):
        simulate_schedule(s, [torch.zeros(9) for _ in range(3)], op="mean")
    with pytest.raises(ConfigError, match="buffers"):
        simulate_schedule(s, [torch.zeros(9)] * 2)
    with pytest.raises(ConfigError, match="rank"):
        plan_schedule(s, 9, 3)
    bad = _sched("allreduce", "bad", 2, 4, [4], [-1], [-1], [Phase.of([0], [2], [0], [1], False)])
    with pytest.raises(ConfigError, match=r"schedule.phases\[0\]"):
        plan_schedule(bad, 4, 0)
    bad_range = _sched("allreduce", "bad", 2, 4, [4], [-1], [-1], [Phase.of([0], [1], [0], [2], False)])
    with pytest.raises(ConfigError, match="chunk range"):
        plan_schedule(bad_range, 4, 0)
    with pytest.raises(ConfigError, match="unit"):
        schedule_size(torch.zeros(2), "bits")
    with pytest.raises(ConfigError, match="needs a cluster"):
        hook("ring")
    with pytest.raises(ConfigError, match="Topology or a Cluster"):
        hook("ring", object())
    if not dist.is_initialized():
        with pytest.raises(ConfigError, match="init_process_group"):
            run_schedule(s, torch.zeros(9), rank=0)
        with pytest.raises(ConfigError, match="init_process_group"):
            all_reduce(torch.zeros(9), s)


@pytest.mark.skipif(_registry is None, reason="topotrain.collectives.registry is not available")
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_simulate_registry_schedules(p: int) -> None:
    """Every registry algorithm × op, executed in-process in bytes of int64, gives its collective."""
    assert _registry is not None
    topo = make_topology(p, {2: 1, 3: 1, 4: 2, 5: 1, 8: 4}[p])
    ran = 0
    for name, info in _registry.ALGORITHMS.items():
        for op in info.ops:
            opts = {"root": 1} if op in (CollectiveOp.BROADCAST, CollectiveOp.REDUCE) else {}
            for n in (1, p + 1, 64):
                numel = n * p if op is CollectiveOp.ALLTOALL else n
                try:
                    s = _registry.build_schedule(op, name, topo, topo.gpus, numel * 8, **opts)
                except ConfigError:
                    continue
                inputs = _inputs(p, numel, n)
                finals = simulate_schedule(s, [x.clone() for x in inputs])
                expected_final(s, inputs, finals)
                ran += 1
    assert ran >= 30
