"""The elements of a cluster graph: node kinds, nodes and directed links (plain frozen values, shared by the
graph and its router)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class NodeKind(StrEnum):
    GPU = "gpu"
    PCIE = "pcie"
    CPU = "cpu"
    NIC = "nic"
    NVSWITCH = "nvswitch"
    SWITCH = "switch"


#: Kinds that forward traffic between their neighbours unless a node says otherwise.
TRANSIT_BY_DEFAULT = {NodeKind.PCIE, NodeKind.CPU, NodeKind.NVSWITCH, NodeKind.SWITCH}



@dataclass(frozen=True)
class Node:
    """A vertex. ``server`` names the server a node sits in (None for the network between servers).

    ``transit``: whether traffic between *other* nodes may pass through it (GPUs never do; a NIC does
    only where the topology says so, e.g. a switchless torus whose hosts forward).
    """

    name: str
    kind: NodeKind
    server: str | None = None
    transit: bool = False
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Link:
    """One direction of a physical link."""

    id: int
    src: str
    dst: str
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str = ""
