"""What a packet fabric adds to a fluid model's time: framing bytes and store-and-forward serialization.

The fluid models (``flow``, ``flow-async``) move payload bytes as a continuous fluid through cut-through
links: a transfer pays its bottleneck's share once and its path's latency once. A packet fabric cuts a
message into packets of at most ``payload_bytes`` with ``header_bytes`` of framing each, and a
store-and-forward switch receives a whole packet before it sends it on. Two terms follow, both mechanisms
with a closed form, and both zero for a cut-through fabric with no framing (:data:`CUT_THROUGH`, which
changes nothing):

* **Framing** — a transfer of ``b`` bytes puts ``b + ceil(b / payload) * header`` bytes on every link of
  its path (:func:`framed_schedule`; with ns-3's TCP/IPv4 with timestamps over point-to-point links,
  9000-byte MTU: 8948 bytes of payload, 20 + 32 + 2 = 54 bytes of header per packet, 0.6% at full
  packets, 10% for a 512-byte message).
* **Store-and-forward pipeline** — a packet crosses link ``l`` in ``pkt / C_l``; the first packet reaches
  the transfer's bottleneck ``b`` only after it has been serialized on every link before it (the fill),
  and the last one leaves the path after it has been serialized on every link after it (the drain):
  ``fill + drain = sum_{l != b} pkt / C_l``, ``pkt = min(bytes, payload) + header`` (the pipeline of
  packet switching, Kermani & Kleinrock, *Virtual cut-through*, Computer Networks 1979, eq. 1). Transfers
  that share their bottleneck keep it busy back to back, so such a group pays the earliest fill and the
  latest drain once (the busy period of one server), and a phase pays the largest group's term
  (:func:`store_forward_s`). The bottleneck of a transfer is the link of its path with the largest
  ``bytes of the phase / capacity`` (the first such link along the path on a tie).

Real RoCE/InfiniBand switches cut through (a few hundred ns per hop, which belongs in the links'
latency), so the store-and-forward term is a property of the fabric being modelled — of ns-3's, which
stores and forwards — not a correction every prediction needs; the validation matrix
(:mod:`topotrain.validate.matrix`) declares its ns-3 fabric with :data:`NS3_TCP_JUMBO`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topotrain.collectives.schedule import Phase, Schedule
from topotrain.errors import ConfigError
from topotrain.topology.graph import Topology


@dataclass(frozen=True)
class PacketFabric:
    """How a fabric carries bytes: ``payload_bytes`` per packet, ``header_bytes`` of framing per packet,
    and whether its switches (every node of a path) store and forward a whole packet (``True``) or cut
    through (``False``)."""

    payload_bytes: int = 8948
    header_bytes: int = 0
    store_and_forward: bool = False

    def __post_init__(self) -> None:
        for name in ("payload_bytes", "header_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "payload_bytes" else 0):
                raise ConfigError(f"fabric.{name}", f"must be an integer >= {1 if name == 'payload_bytes' else 0}"
                                  f", got {v!r}", "give bytes, e.g. payload 8948 and header 54")


#: a cut-through fabric with no framing: both terms are zero (what the fluid models assume)
CUT_THROUGH = PacketFabric()
#: ns-3's fabric in ``topotrain validate``: 9000-byte MTU, TCP (32 bytes with timestamps) over IPv4 (20) over
#: point-to-point links (2), every node storing and forwarding
NS3_TCP_JUMBO = PacketFabric(payload_bytes=9000 - 20 - 32, header_bytes=20 + 32 + 2, store_and_forward=True)


def framed_bytes(size_bytes: np.ndarray, fabric: PacketFabric) -> np.ndarray:
    """``b + ceil(b / payload) * header`` for each transfer size ``b`` (int64)."""
    b = np.asarray(size_bytes, dtype=np.int64)
    return b + (-(-b // fabric.payload_bytes)) * fabric.header_bytes


def framed_schedule(schedule: Schedule, fabric: PacketFabric) -> Schedule:
    """``schedule`` with every transfer carrying its framed bytes: one chunk per transfer (so a transfer of
    many chunks is framed once, as one message), the same ranks, endpoints and phases. ``schedule``
    itself when the fabric has no header."""
    if fabric.header_bytes == 0:
        return schedule
    sizes: list[np.ndarray] = []
    phases: list[Phase] = []
    n = 0
    for ph in schedule.phases:
        b = framed_bytes(schedule.transfer_bytes(ph), fabric)
        k = len(ph)
        lo = np.arange(n, n + k, dtype=np.int64)
        phases.append(Phase(ph.src, ph.dst, lo, lo + 1, ph.reduce))
        sizes.append(b)
        n += k
    chunk_bytes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    src = np.concatenate([ph.src for ph in schedule.phases]) if sizes else np.zeros(0, dtype=np.int64)
    dst = np.concatenate([ph.dst for ph in schedule.phases]) if sizes else np.zeros(0, dtype=np.int64)
    return Schedule(schedule.op, schedule.algorithm, schedule.ranks, int(chunk_bytes.sum()), chunk_bytes,
                    src, dst, tuple(phases), dict(schedule.meta))


def store_forward_s(schedule: Schedule, topo: Topology, fabric: PacketFabric) -> float:
    """The store-and-forward pipeline term of ``schedule`` run phase by phase (module docstring): per phase,
    the largest over bottleneck groups of (earliest fill + latest drain); summed over phases. 0 for a
    cut-through fabric."""
    if not fabric.store_and_forward:
        return 0.0
    cap = topo.capacity_bytes_per_s
    total = 0.0
    for ph in schedule.phases:
        sizes = schedule.transfer_bytes(ph)
        routes: list[tuple[list[int], int]] = []
        load = np.zeros(topo.num_links)
        for s, d, b in zip(ph.src.tolist(), ph.dst.tolist(), sizes.tolist(), strict=True):
            route = topo.route(schedule.ranks[s], schedule.ranks[d])
            if not route or b <= 0:
                continue
            links = list(route)
            load[links] += b
            routes.append((links, int(b)))
        groups: dict[int, tuple[float, float]] = {}  # bottleneck link -> (earliest fill, latest drain)
        for links, b in routes:
            pkt = min(b, fabric.payload_bytes) + fabric.header_bytes
            per_link = pkt / cap[links]
            k = int(np.argmax(load[links] / cap[links]))
            fill, drain = float(per_link[:k].sum()), float(per_link[k + 1:].sum())
            old = groups.get(links[k])
            groups[links[k]] = (fill, drain) if old is None else (min(old[0], fill), max(old[1], drain))
        total += max((f + d for f, d in groups.values()), default=0.0)
    return total
