"""A built cluster: its topology, the GPU type of its ranks, its hardware catalog and the network models'
parameters — one value handed to the training simulator, the collective API and the studies.

It is made from a scenario's ``cluster`` section by :mod:`topotrain.scenario.cluster` (servers from a template
wired by a network builder, or a user's graph file), or directly from a :class:`~topotrain.topology.graph.
Topology` a program built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topotrain.hardware.catalog import Catalog
from topotrain.hardware.gpus import GPUSpec
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology


@dataclass(frozen=True, eq=False)
class Cluster:
    """A built cluster: its topology, the GPU type of its ranks, its hardware catalog, where it came from."""

    name: str
    topology: Topology
    gpu: str
    servers: int
    gpus_per_server: int
    network: str
    #: parameters of the network models (per-message overhead, shared CPU cores): explicit, not on the topology
    network_params: NetworkParams = field(default_factory=NetworkParams)
    #: the hardware catalog the cluster was built from (built-ins plus the scenario's ``catalog:``)
    catalog: Catalog = field(default_factory=Catalog.builtin)
    #: the GPU type of every rank (``topology.gpus`` order) of a cluster built from groups; empty: all ``gpu``
    rank_gpus: tuple[str, ...] = ()
    #: the template name of every server, in order (a cluster built from groups); empty: not recorded
    server_templates: tuple[str, ...] = ()

    @property
    def gpu_names(self) -> tuple[str, ...]:
        """The cluster's GPU types, each once, in rank order (``(gpu,)`` for a cluster of one type)."""
        return tuple(dict.fromkeys(self.rank_gpus)) if self.rank_gpus else (self.gpu,)

    @property
    def mixed(self) -> bool:
        """Whether the ranks are of more than one GPU type (docs/mixed.md)."""
        return len(self.gpu_names) > 1

    def gpu_of(self, rank: int) -> str:
        """The GPU type of rank ``rank``."""
        return self.rank_gpus[rank] if self.rank_gpus else self.gpu

    def spec_of(self, gpu: str) -> GPUSpec:
        """The datasheet of GPU type ``gpu``, from the cluster's own catalog."""
        return self.catalog.gpu(gpu, "cluster.gpu")

    @property
    def gpu_spec(self) -> GPUSpec:
        """The datasheet of the cluster's GPU, from the cluster's own catalog."""
        return self.catalog.gpu(self.gpu, "cluster.gpu")
