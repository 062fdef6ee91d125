"""Name → collective algorithm, and the one checked entry point :func:`build_schedule`.

A lookup from names to implementations, kept apart from topologies (as ASTRA-sim's collective layer
does); every builder emits a plain :class:`~topotrain.collectives.schedule.Schedule`. The table names each
builder by its module of this package and its function, imported when the algorithm is first built
(:attr:`AlgorithmInfo.build`): a process that times a ring does not load the tree packer and the LP of ``synth``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from topotrain.collectives.schedule import CollectiveOp, Schedule, parse_op
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError, did_you_mean

BuildFn = Callable[..., Schedule]

_AR = CollectiveOp.ALLREDUCE
_RS = CollectiveOp.REDUCE_SCATTER
_AG = CollectiveOp.ALLGATHER
_BC = CollectiveOp.BROADCAST
_RD = CollectiveOp.REDUCE
_A2A = CollectiveOp.ALLTOALL


@dataclass(frozen=True)
class AlgorithmInfo:
    """A collective algorithm: its builder, the ops it does, the options it takes, one line about it.
    ``labels_only``: the ops whose schedule uses the ranks only as labels (it reads neither their names nor
    the topology), so one schedule per (op, rank count, size) serves every group, relabelled
    (:func:`relabelled`)."""

    name: str
    #: ``module:function`` of the builder, in this package (``ring:build``): :attr:`build`
    builder: str
    ops: tuple[CollectiveOp, ...]
    description: str
    options: tuple[str, ...] = ()
    labels_only: tuple[CollectiveOp, ...] = ()
    #: whether ``auto`` tries it (``synth`` is asked for by name: its LP takes up to seconds per rank group)
    in_auto: bool = True

    @property
    def build(self) -> BuildFn:
        """The builder, its module imported on first use."""
        module, _, function = self.builder.partition(":")
        fn: BuildFn = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        return fn


ALGORITHMS: dict[str, AlgorithmInfo] = {
    info.name: info
    for info in (
        AlgorithmInfo("ring", "ring:build", (_AR, _RS, _AG, _BC, _RD),
                      "ring reduce-scatter/allgather; pipelined chain for broadcast/reduce",
                      ("chunks", "root", "message_overhead_s"), labels_only=(_AR, _RS, _AG)),
        AlgorithmInfo("halving-doubling", "halving_doubling:build", (_AR, _RS, _AG),
                      "recursive halving reduce-scatter + recursive doubling allgather (Rabenseifner)",
                      labels_only=(_AR, _RS, _AG)),
        AlgorithmInfo("tree", "tree:build", (_AR, _BC, _RD),
                      "double binary tree allreduce (NCCL); binomial broadcast/reduce",
                      ("chunks", "root", "message_overhead_s")),
        AlgorithmInfo("hierarchical", "hierarchical:build", (_AR, _RS, _AG),
                      "intra-server ring, g parallel inter-server rings (allreduce: then intra-server ring)",
                      ("inter",)),
        AlgorithmInfo("torus2d", "torus2d:build", (_AR,),
                      "2D torus: reduce-scatter along X, allreduce along Y, allgather along X", ("dims",)),
        AlgorithmInfo("hdrm", "hdrm:build", (_AR, _RS, _AG),
                      "halving-doubling with the EFLOPS rank mapping for BiGraph"),
        AlgorithmInfo("synth", "synth:build", (_AR, _BC, _RD),
                      "synthesized for the topology: packed spanning trees (LP, HiGHS), pipelined; ring if not faster",
                      ("chunks", "root", "time_budget_s", "message_overhead_s"), in_auto=False),
        AlgorithmInfo("direct", "alltoall:build_direct", (_A2A,), "all-to-all, every message at once",
                      labels_only=(_A2A,)),
        AlgorithmInfo("pairwise", "alltoall:build_pairwise", (_A2A,), "all-to-all, p−1 pairwise exchanges",
                      labels_only=(_A2A,)),
    )
}

ALIASES: dict[str, str] = {"hd": "halving-doubling"}


def _op(op: CollectiveOp | str) -> CollectiveOp:
    return parse_op(op, "collective.op")


def get_algorithm(name: str) -> AlgorithmInfo:
    """The :class:`AlgorithmInfo` of ``name`` (aliases allowed); ConfigError listing the known ones."""
    info = ALGORITHMS.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if info is None:
        raise ConfigError("collective.algorithm", f"unknown algorithm {name!r}",
                          did_you_mean(name, list(ALGORITHMS)))
    return info


def algorithms_for(op: CollectiveOp | str, auto: bool = False) -> list[str]:
    """Names of the algorithms that do ``op``, in registry order (``auto``: those ``auto`` tries)."""
    o = _op(op)
    return [name for name, info in ALGORITHMS.items() if o in info.ops and (info.in_auto or not auto)]


def relabelled(schedule: Schedule, ranks: Sequence[str]) -> Schedule:
    """``schedule`` on ``ranks`` instead (as many, each in the place of the one at its index): the same arrays,
    its own copy of ``meta``. What :func:`build_schedule` gives on ``ranks`` for an op in an algorithm's
    ``labels_only``, when ``ranks`` are distinct GPUs of the topology."""
    s = schedule
    if len(ranks) != len(s.ranks):
        raise ValueError(f"relabelled: {len(ranks)} ranks for a schedule of {len(s.ranks)}")
    return Schedule(s.op, s.algorithm, tuple(ranks), s.size_bytes, s.chunk_bytes, s.chunk_src, s.chunk_dst,
                    s.phases, dict(s.meta))


def _empty(op: CollectiveOp, algorithm: str, ranks: Sequence[str], size_bytes: int) -> Schedule:
    """The schedule of a collective on one rank: nothing to move."""
    one = np.array([int(size_bytes)], dtype=np.int64)
    zero = np.zeros(1, dtype=np.int64)
    src = zero if op in (_AG, _BC, _A2A) else np.full(1, -1, dtype=np.int64)
    dst = zero if op in (_RS, _RD, _A2A) else np.full(1, -1, dtype=np.int64)
    return Schedule(op, algorithm, tuple(ranks), int(size_bytes), one, src, dst, (), {})


def build_schedule(op: CollectiveOp | str, algorithm: str, topo: Topology, ranks: Sequence[str],
                   size_bytes: int, *, message_overhead_s: float | None = None, **options: Any) -> Schedule:
    """Build ``algorithm``'s schedule of ``op`` on ``ranks`` (GPU names of ``topo``) for ``size_bytes``.

    ``message_overhead_s`` (the network parameters' per-message overhead) sizes the default pipeline
    chunks of the algorithms that take the option; it never times anything.

    Checks the inputs once and raises ConfigError naming the field and the fix: unknown op or algorithm,
    an algorithm that does not do the op, unknown options, size_bytes not a positive integer, no ranks,
    duplicate ranks, ranks that are not GPUs of ``topo``. One rank gives an empty schedule.
    """
    o = _op(op)
    info = get_algorithm(algorithm)
    if o not in info.ops:
        does = ", ".join(x.value for x in info.ops)
        others = ", ".join(algorithms_for(o))
        raise ConfigError("collective.algorithm",
                          f"algorithm {info.name!r} does not do {o.value}; it does {does}",
                          f"for {o.value} use one of {others}")
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        known = ", ".join(info.options) or "none"
        raise ConfigError("collective.options", f"algorithm {info.name!r} has no option "
                          f"{', '.join(repr(u) for u in unknown)}", f"its options: {known}")
    raw: object = size_bytes
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int | np.integer):
        raise ConfigError("collective.size_bytes", f"size must be a whole number of bytes, got {raw!r}",
                          "give an integer number of bytes")
    size_bytes = int(raw)
    if size_bytes <= 0:
        raise ConfigError("collective.size_bytes", f"size must be positive, got {size_bytes}",
                          "give a size of at least 1 byte")
    ranks = tuple(ranks)
    if not ranks:
        raise ConfigError("collective.ranks", "no ranks", "give at least one GPU")
    seen: set[str] = set()
    for r in ranks:
        if r in seen:
            raise ConfigError("collective.ranks", f"rank {r!r} is listed twice", "list every GPU once")
        seen.add(r)
        node = topo.nodes.get(r)
        if node is None or node.kind is not NodeKind.GPU:
            what = "not in the topology" if node is None else f"a {node.kind.value}, not a GPU"
            raise ConfigError("collective.ranks", f"rank {r!r} is {what} ({topo.name!r})",
                              "use GPU names of the topology, e.g. topo.gpus")
    if len(ranks) == 1:
        return _empty(o, info.name, ranks, int(size_bytes))
    if message_overhead_s is not None and "message_overhead_s" in info.options:
        options.setdefault("message_overhead_s", message_overhead_s)
    return info.build(o, topo, ranks, int(size_bytes), **options)
