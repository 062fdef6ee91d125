"""What NCCL really puts on the wire: achievable bus bandwidth per link type and message size.

A collective never reaches its links' datasheet rate. Two mechanisms, multiplied:

* **Link-layer efficiency** of the transport (``LINK_EFFICIENCY``), read from nccl-tests bus bandwidths
  that NCCL's maintainers quote as the expected peak (docs/sources.md §6):

  - NVLink (NVLink3 / NVLink4 through NVSwitch): 0.80. H100 NVLink4 450 GB/s per direction "is the line
    rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370 GB/s"
    (370/450 = 0.82; NVIDIA/nccl-tests#212); A800 NVLink3 (200 GB/s per direction): "you should get
    ~160 GB/s intra-node" (0.80; NVIDIA/nccl#412). NVLink SHARP (NVLS) allreduce is not modelled.
  - InfiniBand / the NIC path: 0.95. HDR 200 Gb/s (25 GB/s): "24 GB/s inter-node" (0.96; NVIDIA/nccl#412);
    NDR 400 Gb/s (50 GB/s): "46-48 GB/s per NIC" (0.92–0.96; NVIDIA/nccl-tests#290), "48-49 GB/s per NIC"
    (NVIDIA/nccl-tests#267).
  - PCIe (and the host path): 0.91, derived from the PCIe transaction layer: a 256-byte max payload
    carries 24 bytes of TLP header, sequence number, LCRC and framing, 256/280 = 0.914 (PCI-SIG base
    specification; an upper bound, flow-control DLLPs come on top).

* **Protocol payload fraction** (``PROTOCOL_PAYLOAD``): NCCL's LL protocol sends 8-byte lines of 4 data
  bytes and a 4-byte flag (0.5); LL128 sends 128-byte lines with an 8-byte flag (120/128); Simple sends
  data only and synchronizes with separate flags (1.0) (NCCL documentation, ``NCCL_PROTO``). NCCL's tuner
  picks LL for small messages, LL128 in between and Simple for large ones; :func:`protocol_for` stands
  for that choice with fixed thresholds (``LL_MAX_BYTES``, ``LL128_MAX_BYTES``) — an **assumption** of
  the order NCCL's tuner gives on one server, not its per-platform cost model.

:func:`on_the_wire` applies it as extra bytes: each chunk of a schedule carries ``bytes / efficiency``
on the wire (``size_bytes`` stays the user's payload), so every network model — analytical, flow, packet —
times the same effective bytes, and link utilisation counts wire bytes. Per-message latency stays the
network parameters' ``message_overhead_s``.

**The library is a value** (:class:`CommLibrary`, a scenario's ``comm.library``): ``nccl`` (the default on GPU
clusters) applies the two factors above; ``ideal`` puts the payload itself on the wire (efficiency 1, no
protocol), the line-rate fabric of an alpha-beta model (Hockney 1994; Thakur, Rabenseifner and Gropp 2005),
so a collective takes exactly its closed form at the links' datasheet rate. No other library is offered: gloo
and MPI implementations publish no per-transport wire efficiency to source one from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topotrain.collectives.paths import path_cache
from topotrain.collectives.schedule import Schedule
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

#: Fraction of a link's datasheet rate that NCCL's large-message bus bandwidth reaches, per transport.
LINK_EFFICIENCY: dict[str, float] = {"nvlink": 0.80, "network": 0.95, "pcie": 256 / 280}
#: Payload bytes per wire byte of each NCCL protocol.
PROTOCOL_PAYLOAD: dict[str, float] = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
#: Largest message (bytes per rank) sent with LL, and with LL128; above: Simple (assumption, see module doc).
LL_MAX_BYTES = 64 * 2**10
LL128_MAX_BYTES = 4 * 2**20

#: Topology link kinds → transport of :data:`LINK_EFFICIENCY` (NIC and switch links: the network).
_TRANSPORT = {"nvlink": "nvlink", "pcie": "pcie", "socket": "pcie", "infiniband": "network",
              "ethernet": "network", "network": "network"}


def transport(link_kind: str) -> str:
    """The transport (``nvlink`` | ``pcie`` | ``network``) of a topology link kind or catalog link kind."""
    return _TRANSPORT.get(link_kind, "network")


def protocol_for(message_bytes: float) -> str:
    """NCCL's protocol for a message of ``message_bytes`` per rank: LL, LL128 or Simple."""
    if message_bytes <= LL_MAX_BYTES:
        return "LL"
    if message_bytes <= LL128_MAX_BYTES:
        return "LL128"
    return "Simple"


def wire_efficiency(link_kind: str, message_bytes: float) -> float:
    """Payload bytes per wire byte of a collective of ``message_bytes`` per rank bounded by a link of
    ``link_kind``: ``LINK_EFFICIENCY[transport] × PROTOCOL_PAYLOAD[protocol]``, in (0, 1]."""
    return LINK_EFFICIENCY[transport(link_kind)] * PROTOCOL_PAYLOAD[protocol_for(message_bytes)]


#: The communication libraries a scenario may name (``comm.library``; see the module docstring).
COMM_LIBRARIES = ("nccl", "ideal")


@dataclass(frozen=True)
class CommLibrary:
    """The communication library that puts a collective's bytes on the wire: ``nccl`` (NCCL's link efficiency
    and protocol, :func:`wire_efficiency`) or ``ideal`` (the payload at line rate). A ConfigError naming
    ``comm.library`` refuses any other name."""

    name: str = "nccl"

    def __post_init__(self) -> None:
        if self.name not in COMM_LIBRARIES:
            raise ConfigError("comm.library", f"unknown communication library {self.name!r}",
                              f"use one of {', '.join(COMM_LIBRARIES)}")

    @property
    def needs_link_kind(self) -> bool:
        """Whether the wire bytes depend on the bottleneck link's kind (NCCL's do; line rate's do not)."""
        return self.name == "nccl"

    def protocol(self, message_bytes: float) -> str:
        """The protocol a message of ``message_bytes`` per rank goes with: NCCL's (:func:`protocol_for`), or
        ``line-rate``."""
        return protocol_for(message_bytes) if self.name == "nccl" else "line-rate"

    def efficiency(self, link_kind: str, message_bytes: float) -> float:
        """Payload bytes per wire byte (:func:`wire_efficiency` for NCCL; 1 at line rate)."""
        return wire_efficiency(link_kind, message_bytes) if self.name == "nccl" else 1.0


#: NCCL, the default library of a GPU cluster.
NCCL = CommLibrary("nccl")
#: The line-rate fabric: every byte of payload is a byte on the wire.
IDEAL = CommLibrary("ideal")


def comm_library(name: str | CommLibrary) -> CommLibrary:
    """The :class:`CommLibrary` called ``name`` (case-insensitive), or ``name`` as is."""
    if isinstance(name, CommLibrary):
        return name
    return CommLibrary(name.strip().lower() if isinstance(name, str) else name)


def moving_pairs(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (source, destination) rank indices of ``schedule``'s transfers between distinct ranks, in
    order of ``source·p + destination``: what :func:`bottleneck_kind` routes (it depends on nothing else of
    the schedule but its ranks)."""
    if not schedule.phases:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    p = len(schedule.ranks)
    # phases built by one pattern share their src/dst arrays (a ring's 2(p−1) steps: two pairs of arrays)
    distinct = {(id(ph.src), id(ph.dst)): ph for ph in schedule.phases}
    codes = np.unique(np.concatenate([ph.src.astype(np.int64) * p + ph.dst.astype(np.int64)
                                      for ph in distinct.values()]))
    src, dst = codes // p, codes % p
    moving = src != dst
    return src[moving], dst[moving]


def bottleneck_kind(schedule: Schedule, topo: Topology) -> str:
    """Kind of the slowest link on the routed paths of ``schedule``'s transfers (the one that bounds its
    bus bandwidth; among equally slow links the lowest link id); ``"nvlink"`` when it moves nothing between
    distinct GPUs. Routes come from the topology's shared path cache (each rank pair routed once)."""
    src, dst = moving_pairs(schedule)
    if src.size == 0:
        return "nvlink"
    links = path_cache(topo, schedule.ranks).links_of(src, dst)
    if links.size == 0:
        return "nvlink"
    caps = topo.capacity_bytes_per_s[links]
    slowest = int(links[caps == caps.min()].min())
    return topo.links[slowest].kind


def pair_bottleneck_kinds(topo: Topology, pairs: list[tuple[str, str]]) -> list[str]:
    """For each pair of distinct endpoints, what :func:`bottleneck_kind` says of a one-transfer schedule between
    them (the kind of the slowest link on its route; among equally slow links the lowest link id), with every
    pair routed in one batch through the shared path cache of the topology's GPUs."""
    if not pairs:
        return []
    ranks = tuple(topo.gpus)
    index = {name: i for i, name in enumerate(ranks)}
    extra = sorted({n for pair in pairs for n in pair if n not in index})
    if extra:  # endpoints that are not GPUs (NICs): a rank tuple of their own
        ranks = ranks + tuple(extra)
        index.update((n, len(index)) for n in extra)
    src = np.fromiter((index[a] for a, _ in pairs), dtype=np.int64, count=len(pairs))
    dst = np.fromiter((index[b] for _, b in pairs), dtype=np.int64, count=len(pairs))
    if bool((src == dst).any()):
        raise ValueError("pair_bottleneck_kinds takes pairs of distinct endpoints")
    offsets, links = path_cache(topo, ranks)._gather(src * len(ranks) + dst)
    starts = offsets[:-1]
    caps = topo.capacity_bytes_per_s[links]
    slowest_cap = np.minimum.reduceat(caps, starts)
    at_min = caps == np.repeat(slowest_cap, np.diff(offsets))
    slowest = np.minimum.reduceat(np.where(at_min, links, np.iinfo(np.int64).max), starts)
    return [topo.links[int(lk)].kind for lk in slowest.tolist()]


def on_the_wire(schedule: Schedule, topo: Topology, kind: str | None = None,
                library: CommLibrary = NCCL) -> Schedule:
    """``schedule`` with every chunk carrying its wire bytes, ``ceil(bytes / efficiency)``, as ``library`` puts
    them there: NCCL's for the transport of its bottleneck link (``kind``: that link's kind when already known,
    e.g. from :func:`pair_bottleneck_kinds`) and its per-rank message size, or the payload itself at line rate
    (``ideal``); ``size_bytes`` is unchanged and ``meta`` records ``library``, ``protocol`` and
    ``wire_efficiency``."""
    if kind is None and library.needs_link_kind:
        kind = bottleneck_kind(schedule, topo)
    eff = library.efficiency(kind or "", schedule.size_bytes)
    wire = np.ceil(schedule.chunk_bytes / eff).astype(np.int64) if eff != 1.0 else schedule.chunk_bytes.copy()
    meta = {**schedule.meta, "library": library.name, "protocol": library.protocol(schedule.size_bytes),
            "wire_efficiency": eff, "transport": transport(kind) if kind is not None else ""}
    s = schedule
    return Schedule(s.op, s.algorithm, s.ranks, s.size_bytes, wire, s.chunk_src, s.chunk_dst, s.phases, meta)
