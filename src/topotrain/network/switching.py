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
* **Store-and-forward pipeline** — a packet crosses link ``l`` in ``pkt / C_l``, ``pkt = min(bytes,
  payload) + header``; a transfer alone pays ``sum_{l != b} pkt / C_l`` beyond the fluid time, ``b`` its
  bottleneck (the pipeline of packet switching, Kermani & Kleinrock, *Virtual cut-through*, Computer
  Networks 1979, eq. 1): its first packet is serialized on every link before ``b`` (the fill), its last on
  every link after ``b`` (the drain). Transfers that share their bottleneck keep it busy back to back
  (one server's busy period): the group's last byte leaves ``b`` after the earliest arrival at ``b``
  (``arrive_i``: the serialization and latency of the links before ``b``) plus the bottleneck's work
  (``W_b = bytes on b / C_b``), and reaches its receiver after the ``leave`` (latency from ``b`` on,
  serialization after ``b``) of the transfer that arrived last (served round robin, equal messages that
  start last end last). A fluid model charges the group ``W_b + max_i latency_i`` instead, so the group's
  term is ``min_i arrive_i + leave_last - max_i latency_i``, and a phase adds
  ``max_G(W_G + lat_G + term_G) - max_G(W_G + lat_G)`` — the term of the group that finishes last, not the
  largest term (:func:`store_forward_s`). The bottleneck of a transfer is the link of its path with the
  largest ``bytes of the phase / capacity`` (the first such link along the path on a tie). For a transfer
  alone the term is its fill + drain; for an incast it is smaller (the nearer senders keep the receiver's
  port busy while the farther ones' packets travel), which is latency accounting as much as switching.

Real RoCE/InfiniBand switches cut through (a few hundred ns per hop, which belongs in the links'
latency), so the store-and-forward term is a property of the fabric being modelled — of ns-3's, which
stores and forwards — not a correction every prediction needs; the validation matrix
(:mod:`topotrain.validate.matrix`) declares its ns-3 fabric with :data:`NS3_TCP_JUMBO`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from topotrain.collectives.schedule import Phase, Schedule, phase_key
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError


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
        if not isinstance(self.store_and_forward, bool):
            raise ConfigError("fabric.store_and_forward", f"must be true or false, got {self.store_and_forward!r}",
                              "give true (store-and-forward switches) or false (cut-through)")

    @property
    def is_cut_through(self) -> bool:
        """Both terms are zero: no framing bytes and no store-and-forward (what the fluid models assume)."""
        return self.header_bytes == 0 and not self.store_and_forward


#: a cut-through fabric with no framing: both terms are zero (what the fluid models assume)
CUT_THROUGH = PacketFabric()
#: ns-3's fabric in ``topotrain validate``: 9000-byte MTU, TCP (32 bytes with timestamps) over IPv4 (20) over
#: point-to-point links (2), every node storing and forwarding
NS3_TCP_JUMBO = PacketFabric(payload_bytes=9000 - 20 - 32, header_bytes=20 + 32 + 2, store_and_forward=True)


def framed_bytes(size_bytes: np.ndarray, fabric: PacketFabric) -> np.ndarray:
    """``b + ceil(b / payload) * header`` for each transfer size ``b`` (int64; float64 for fractional sizes)."""
    b = np.asarray(size_bytes)
    if b.dtype.kind == "f":
        return b + np.ceil(b / fabric.payload_bytes) * fabric.header_bytes
    b = b.astype(np.int64, copy=False)
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


def store_forward_phase_s(schedule: Schedule, phase: Phase, topo: Topology, fabric: PacketFabric) -> float:
    """The store-and-forward pipeline term of one phase of ``schedule`` (module docstring):
    ``max_G(W_G + lat_G + term_G) - max_G(W_G + lat_G)`` over the groups ``G`` of the phase's transfers that
    share a bottleneck. 0 for a cut-through fabric. ``schedule`` is the unframed schedule (the packet sizes
    follow from the payload bytes)."""
    if not fabric.store_and_forward:
        return 0.0
    cap = topo.capacity_bytes_per_s
    lat = topo.latency_s
    sizes = schedule.transfer_bytes(phase)
    routes: list[tuple[list[int], int]] = []
    load = np.zeros(topo.num_links)
    for s, d, b in zip(phase.src.tolist(), phase.dst.tolist(), sizes.tolist(), strict=True):
        route = topo.route(schedule.ranks[s], schedule.ranks[d])
        if not route or b <= 0:
            continue
        links = list(route)
        load[links] += b
        routes.append((links, int(b)))
    # bottleneck link -> [(arrive_s, leave_s, path latency_s)] of its transfers
    groups: dict[int, list[tuple[float, float, float]]] = {}
    for links, b in routes:
        pkt = min(b, fabric.payload_bytes) + fabric.header_bytes
        ser = pkt / cap[links]
        lt = lat[links]
        k = int(np.argmax(load[links] / cap[links]))
        arrive = float(ser[:k].sum() + lt[:k].sum())
        leave = float(ser[k + 1:].sum() + lt[k:].sum())
        groups.setdefault(links[k], []).append((arrive, leave, float(lt.sum())))
    fluid = packet = 0.0
    for b, members in groups.items():
        last = max(members)  # latest arrival (then latest leave): served last
        lat_g = max(m[2] for m in members)
        work = float(load[b] / cap[b])
        fluid = max(fluid, work + lat_g)
        packet = max(packet, work + min(m[0] for m in members) + last[1])
    return packet - fluid


def on_fabric(schedule: Schedule, topo: Topology,
              fabric: PacketFabric) -> tuple[Schedule, Callable[[int], float] | None]:
    """What a barrier model times on ``fabric``: the framed schedule (:func:`framed_schedule`, same phases)
    and the store-and-forward term of its phase ``k`` (:func:`store_forward_phase_s` of the unframed phase;
    None when the switches cut through)."""
    framed = framed_schedule(schedule, fabric)
    if not fabric.store_and_forward:
        return framed, None
    return framed, lambda k: store_forward_phase_s(schedule, schedule.phases[k], topo, fabric)


def store_forward_phases_s(schedule: Schedule, topo: Topology, fabric: PacketFabric) -> np.ndarray:
    """:func:`store_forward_phase_s` of every phase of ``schedule`` (phases with the same traffic computed
    once)."""
    out = np.zeros(len(schedule.phases))
    if not fabric.store_and_forward:
        return out
    memo: dict[bytes, float] = {}
    for k, ph in enumerate(schedule.phases):
        key = phase_key(schedule, ph)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = store_forward_phase_s(schedule, ph, topo, fabric)
        out[k] = hit
    return out


def store_forward_s(schedule: Schedule, topo: Topology, fabric: PacketFabric) -> float:
    """The store-and-forward pipeline term of ``schedule`` run phase by phase: the sum over its phases of
    :func:`store_forward_phase_s`. 0 for a cut-through fabric."""
    if not fabric.store_and_forward:
        return 0.0
    total = 0.0
    for ph in schedule.phases:
        total += store_forward_phase_s(schedule, ph, topo, fabric)
    return total
