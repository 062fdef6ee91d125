"""Cluster topologies: the graph model, builders for common networks, routing, file I/O and metrics."""

from topotrain.topology.graph import Link, Node, NodeKind, Topology

__all__ = ["Link", "Node", "NodeKind", "Topology"]
