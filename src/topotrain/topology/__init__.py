"""Cluster topologies: the graph model, builders for common networks, routing, file I/O and metrics."""

from topotrain.topology.elements import Link, Node, NodeKind
from topotrain.topology.graph import Topology

__all__ = ["Link", "Node", "NodeKind", "Topology"]
