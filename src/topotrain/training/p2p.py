"""Pipeline point-to-point transfers as schedules (moved out of :mod:`topotrain.training.builder`)."""

from __future__ import annotations

import numpy as np

from topotrain.collectives.protocol import NCCL, CommLibrary, on_the_wire, pair_bottleneck_kinds
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.topology.graph import Topology


def _p2p(src: str, dst: str, size_bytes: int) -> Schedule:
    """A single point-to-point transfer as a two-rank schedule."""
    return Schedule(CollectiveOp.BROADCAST, "p2p", (src, dst), int(size_bytes),
                    np.array([int(size_bytes)], dtype=np.int64), np.array([0]), np.array([-1]),
                    (Phase.of([0], [1], [0], [1], False),))


def _p2p_schedules(topo: Topology, pairs: list[tuple[str, str]], size_bytes: int,
                   library: CommLibrary = NCCL) -> tuple[Schedule, ...]:
    """:func:`_p2p` of every ``(src, dst)`` of ``pairs`` on the wire (:func:`on_the_wire`), all routed in one
    batch. The wire schedule of a pair depends on its ranks only through its bottleneck link's kind, so it
    is built once per kind and the others are copies with their own ranks."""
    kinds = pair_bottleneck_kinds(topo, pairs)
    templates: dict[str, Schedule] = {}
    out = []
    for (a, b), kind in zip(pairs, kinds, strict=True):
        template = templates.get(kind)
        if template is None:
            template = templates[kind] = on_the_wire(_p2p(a, b, size_bytes), topo, kind, library)
        t = template
        out.append(Schedule(t.op, t.algorithm, (a, b), t.size_bytes, t.chunk_bytes, t.chunk_src, t.chunk_dst,
                            t.phases, dict(t.meta)))
    return tuple(out)
