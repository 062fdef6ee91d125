"""The cluster, catalog and comm sections of the scenario schema: pydantic models of ``cluster:`` (its network,
fabric, groups, inline servers), of a hardware catalog (GPUs, links, servers) and of ``comm:``.

A module of its own so that what reads only a cluster (``topotrain collective``, ``topo show``,
:func:`topotrain.load_cluster`) does not build the whole scenario's schema (the model, plan and training sections
of :mod:`topotrain.scenario.spec`, which imports these from here).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from topotrain.network.switching import PacketFabric
from topotrain.util.fields import (
    MAX_BUILDER_PARAM,
    MAX_SERVERS,
    Bandwidth,
    Duration,
    Frequency,
    Name,
    NonNegativeInt,
    Power,
    Size,
)
from topotrain.util.problems import problem, validated
from topotrain.util.units import quote

#: Network models a scenario may name (see topotrain.network).
NetworkModelName = Literal["analytical", "flow", "flow-async", "flow-eager"]
#: Network builders (see topotrain.topology.builders.NETWORKS).
TopologyName = Literal["single-switch", "bigraph", "fat-tree", "leaf-spine", "rail-optimized", "torus", "ring",
                       "dragonfly"]
LinkKind = Literal["pcie", "nvlink", "socket", "ethernet", "infiniband"]
NodeKind = Literal["gpu", "pcie", "cpu", "nic", "nvswitch"]


class Strict(BaseModel):
    """A section of the scenario: unknown keys are errors, values never change after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _kind_of(value: Any, mapping: str, default: str = "Name") -> str:
    return mapping if isinstance(value, dict) else default


# ---- catalog entries ----------------------------------------------------------------------------------
class GPUEntry(Strict):
    """One GPU of a user catalog (datasheet values, with units)."""

    name: Name
    vendor: str = ""
    peak_flops: Annotated[dict[str, Annotated[float | str, Field(union_mode="left_to_right")]],
                          Field(min_length=1)]
    hbm_bandwidth: Bandwidth
    memory: Size
    sm_count: NonNegativeInt = 0
    boost_clock: Frequency = 0.0
    tdp: Power = 0.0
    nvlink: Name | None = None
    source: str = ""
    aliases: list[Name] = []
    compute_efficiency: dict[str, Annotated[float, Field(gt=0, le=1)]] = {}
    efficiency_source: str = ""


class LinkEntry(Strict):
    """One link type of a user catalog."""

    name: Name
    kind: LinkKind
    bandwidth: Bandwidth
    latency: Duration = 0.0
    source: str = ""

    @field_validator("kind", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v


class NodeEntry(BaseModel):
    """One node of a server template; keys beyond these are copied into the topology node's attrs."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)

    name: Name
    kind: NodeKind
    link: Name | None = None
    bandwidth: Bandwidth | None = None
    latency: Duration | None = None
    rail: NonNegativeInt | None = None
    nic: Name | None = None
    gpu: Name | None = None
    transit: Annotated[bool, Field(strict=True)] | None = None

    @field_validator("kind", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _no_slash(cls, v: str) -> str:
        if "/" in v:
            raise problem(f"bad node name {v!r}", "give a non-empty name without '/'")
        return v

    @model_validator(mode="after")
    def _nic_fields(self) -> NodeEntry:
        for key in sorted(self.model_extra or {}):
            if key in ("server", "bandwidth_bytes_per_s", "latency_s"):
                raise problem(f"key {key!r} is reserved", "give a NIC's port with link: or bandwidth:/latency:",
                              key)
        if self.kind != "nic":
            for key in ("link", "bandwidth", "latency", "rail"):
                if getattr(self, key) is not None:
                    raise problem(f"{key!r} describes a NIC port, but {self.name!r} is a {self.kind}",
                                  "describe links under links:, or make the node kind nic", key)
        elif self.link is None and self.bandwidth is None:
            raise problem(f"NIC {self.name!r} has no port speed",
                          "give link: eth-100g (a link type) or bandwidth: 100Gbps", "bandwidth")
        return self


class ServerLinkEntry(Strict):
    """One link inside a server template: a link type, or an explicit bandwidth (and latency, kind)."""

    a: Name
    b: Name
    link: Name | None = None
    bandwidth: Bandwidth | None = None
    latency: Duration | None = None
    kind: Name | None = None

    @model_validator(mode="after")
    def _speed(self) -> ServerLinkEntry:
        if self.link is None and self.bandwidth is None:
            raise problem(f"link {self.a}–{self.b} has no bandwidth",
                          "give link: <type> (e.g. pcie4-x16) or bandwidth: 25GB/s")
        return self


class ServerEntry(Strict):
    """A server template: its nodes and links (see topotrain.hardware.servers)."""

    name: Name
    gpu: Name
    description: str = ""
    source: str = ""
    nodes: Annotated[list[NodeEntry], Field(min_length=1)]
    links: list[ServerLinkEntry] = []

    @model_validator(mode="after")
    def _names(self) -> ServerEntry:
        seen: set[str] = set()
        for i, nd in enumerate(self.nodes):
            if nd.name in seen:
                raise problem(f"node {nd.name!r} is defined twice", "give every node a unique name",
                              f"nodes[{i}].name")
            seen.add(nd.name)
        for j, lk in enumerate(self.links):
            for end, n in (("a", lk.a), ("b", lk.b)):
                if n not in seen:
                    raise problem(f"link names unknown node {n!r}", "use one of: " + ", ".join(sorted(seen)),
                                  f"links[{j}].{end}")
        return self


class CatalogSpec(Strict):
    """A user catalog: extra GPUs, link types and server templates (read in the order links, gpus,
    servers, so a server may use GPUs and links of the same catalog)."""

    gpus: list[GPUEntry] = []
    links: list[LinkEntry] = []
    servers: list[ServerEntry] = []


# ---- cluster --------------------------------------------------------------------------------------------
class NetworkSpec(BaseModel):
    """``cluster.network``: the builder (``topology``), the switch-to-switch links, how ties between equal-cost
    paths are broken (``routing``: ``ecmp``, a hash of each flow with a seed per switch as Ethernet/RoCE switches
    do; ``d-mod-k``, by destination as an InfiniBand subnet manager routes; ``ecmp-shared-seed``, one hash and
    seed shared by every switch (polarized); omitted: the fabric's own, ``d-mod-k`` where the network's links
    are InfiniBand, else ``ecmp``: :mod:`topotrain.topology.routing`), and builder parameters (``switches``,
    ``radix``, ``k``, ``dims``, ``oversubscription``, ...: checked by the builder)."""

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)

    topology: TopologyName
    link: Name | None = None
    bandwidth: Bandwidth | None = None
    latency: Annotated[Duration, Field(json_schema_extra={"default": "1us"})] = 1e-6
    routing: Literal["ecmp", "d-mod-k", "ecmp-shared-seed"] | None = None

    @field_validator("topology", "routing", mode="before")
    @classmethod
    def _normalize(cls, v: Any) -> Any:
        return v.strip().lower().replace("_", "-") if isinstance(v, str) else v

    @model_validator(mode="after")
    def _one_speed(self) -> NetworkSpec:
        if self.link is not None and self.bandwidth is not None:
            raise problem("give either link or bandwidth, not both", "remove one")
        for key, v in (self.model_extra or {}).items():
            ok = (isinstance(v, int | float | str) or
                  (isinstance(v, list) and all(isinstance(x, int | float | str) and not isinstance(x, bool)
                                               for x in v)))
            if not ok:
                raise problem(f"builder parameter {key!r} must be a number, text or a list of numbers "
                              f"(got {type(v).__name__})", f"write e.g. {key}: 8", key)
            nums = [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, int | float)]
            if any(not math.isfinite(x) or abs(x) > MAX_BUILDER_PARAM for x in nums):
                raise problem(f"builder parameter {key!r} is out of range (got {quote(v)}; accepted: numbers "
                              f"up to {MAX_BUILDER_PARAM:,})", "check the value", key)
        return self


ServerRef = Annotated[
    Annotated[Name, Tag("Name")] | Annotated[ServerEntry, Tag("Mapping")],
    Discriminator(lambda v: _kind_of(v, "Mapping")),
]
CatalogRef = Annotated[
    Annotated[Name, Tag("Name")] | Annotated[CatalogSpec, Tag("Mapping")],
    Discriminator(lambda v: _kind_of(v, "Mapping")),
]


class FabricSpec(Strict):
    """``cluster.fabric``: how the fabric carries bytes (:class:`topotrain.network.switching.PacketFabric`):
    ``payload`` bytes per packet with ``header`` bytes of framing each, switches that ``store-and-forward`` a
    whole packet or ``cut-through`` (the default: no term at all). Carried by the barrier models (``flow``,
    ``analytical``)."""

    switching: Literal["cut-through", "store-and-forward"] = "cut-through"
    payload: Size = 8948
    header: Size = 0

    @model_validator(mode="after")
    def _whole_bytes(self) -> FabricSpec:
        for key, low in (("payload", 1), ("header", 0)):
            v = getattr(self, key)
            if not (math.isfinite(v) and v == int(v) and low <= v <= 2**31):
                raise problem(f"must be a whole number of bytes from {low} to 2 GiB, got {quote(v)}",
                              "write e.g. payload: 8948B, header: 54B", key)
        return self

    def fabric(self) -> Any:
        """The :class:`~topotrain.network.switching.PacketFabric` this section declares."""
        return PacketFabric(int(self.payload), int(self.header), self.switching == "store-and-forward")


class GroupSpec(Strict):
    """One group of a mixed cluster (``cluster.groups[i]``): ``servers`` servers of one template, with its own
    GPU and NIC overrides; every group's NICs join the cluster's one ``network`` (docs/mixed.md)."""

    server: ServerRef
    servers: Annotated[int, Field(strict=True, ge=1, le=MAX_SERVERS)] = 1
    gpu: Name | None = None
    nic: Name | None = None


class ClusterSpec(Strict):
    """``cluster``: servers from a template wired by a network builder, groups of servers of several templates
    (a mixed cluster), or a user's graph file."""

    name: Name | None = None
    server: ServerRef | None = None
    servers: Annotated[int, Field(strict=True, ge=1, le=MAX_SERVERS)] = 1
    gpu: Name | None = None
    nic: Name | None = None
    message_overhead: Duration | None = None
    fabric: FabricSpec | None = None
    #: how links share their capacity in the flow models: ``flow`` (omitted: max-min per flow) or ``port`` (PCIe
    #: links per input port, round robin: topotrain.network.port_arbitration)
    arbitration: Literal["flow", "port"] | None = None
    catalog: CatalogRef | None = None
    network: NetworkSpec | None = None
    graph: Name | None = None
    #: a mixed cluster: groups of servers, each of its own template, GPU and NIC, joined by ``network``
    groups: Annotated[list[GroupSpec], Field(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _shape(self) -> ClusterSpec:
        if self.groups is not None:
            for key in ("server", "gpu", "nic", "graph"):
                if getattr(self, key) is not None:
                    raise problem(f"each group names its own {key}; cluster.{key} does not apply with groups",
                                  f"move {key} into the groups, or remove groups", key)
            if "servers" in self.model_fields_set:
                raise problem("each group gives its own servers; cluster.servers does not apply with groups",
                              "move servers into the groups", "servers")
            if sum(g.servers for g in self.groups) > 1 and self.network is None:
                raise problem("is required with more than one server",
                              "add `network: {topology: single-switch, link: eth-100g}`", "network")
            return self
        if self.graph is not None:
            for key in ("server", "nic", "network"):
                if getattr(self, key) is not None:
                    raise problem(f"a graph file describes the whole cluster; {key} does not apply",
                                  f"remove {key}, or remove graph", key)
            if "servers" in self.model_fields_set:
                raise problem("a graph file describes the whole cluster; servers does not apply",
                              "remove servers, or remove graph", "servers")
        elif self.server is None:
            raise problem("is required", "give a template name (e.g. server: eflops), a definition, "
                          "or graph: my-graph.yaml", "server")
        elif self.servers > 1 and self.network is None:
            raise problem("is required with more than one server",
                          "add `network: {topology: single-switch, link: eth-100g}`", "network")
        return self


class CommSpec(Strict):
    """``comm``: the communication library that puts collectives on the wire
    (:class:`topotrain.collectives.protocol.CommLibrary`): ``nccl`` (the default on GPU clusters: NCCL's link
    efficiency and LL/LL128/Simple protocol) or ``ideal`` (the payload at line rate, no protocol overhead)."""

    library: Literal["nccl", "ideal"] = "nccl"  # cluster_plain.DEFAULT_LIBRARY (tests/test_cluster_plain.py)

    @field_validator("library", mode="before")
    @classmethod
    def _normalize(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v


def validated_cluster(d: Any, field: str = "cluster") -> ClusterSpec:
    """``d`` validated as a ``cluster`` section (every problem at once, as one ConfigErrors under ``field``)."""
    return validated(ClusterSpec, d, field)


def validated_library(section: Any, field: str = "comm") -> str:
    """The library a ``comm`` section names, validated (every problem at once, under ``field``)."""
    return validated(CommSpec, section, field).library
