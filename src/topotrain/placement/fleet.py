"""The fleet ``place`` schedules on: one cluster, or several groups of servers of different GPU types.

A fleet file (YAML)::

    fleet:
      name: pai-mixed                      # optional
      groups:
        - name: v100                       # unique; a job's result names it
          types: [V100M16, V100M32]        # the GPU type names a trace's jobs may ask for (default: the
                                           # group's name and its GPU's catalog name)
          cluster: {server: eflops, servers: 16, network: {topology: leaf-spine, leaves: 2, link: eth-100g}}
        - name: t4
          cluster: {...}                   # any cluster section (its own catalog:, gpu:, network)

Each group is a cluster section as ``simulate`` reads it (built by :func:`topotrain.scenario.cluster
.cluster_from_dict`), with its own network: a job runs inside one group (one GPU type; production
schedulers such as PAI's allocate a job within one GPU pool), and the contention of its allreduces is timed
on that group's network. A scenario or cluster file (a ``cluster:`` section) is a fleet of one group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.cluster import Cluster
from topotrain.scenario.cluster import cluster_from_dict, load_cluster, read_yaml
from topotrain.util.errors import ConfigError

#: Most groups of one fleet.
MAX_GROUPS = 64


@dataclass(frozen=True)
class FleetGroup:
    """Servers of one GPU type on one network."""

    name: str
    cluster: Cluster
    #: the GPU type names a job's ``gpu_type`` may give to run here
    types: tuple[str, ...]

    @property
    def gpu(self) -> str:
        return self.cluster.gpu

    @property
    def num_gpus(self) -> int:
        return len(self.cluster.topology.gpus)


@dataclass(frozen=True)
class Fleet:
    """Groups in the order first-fit tries them."""

    name: str
    groups: tuple[FleetGroup, ...]

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    def allowed(self, gpu_type: tuple[str, ...]) -> tuple[int, ...]:
        """Indices of the groups a job asking for ``gpu_type`` may run on (every group when it asks none);
        names match case-insensitively."""
        if not gpu_type:
            return tuple(range(len(self.groups)))
        want = {t.lower() for t in gpu_type}
        return tuple(k for k, g in enumerate(self.groups) if want & {t.lower() for t in g.types})


def single(cluster: Cluster, field: str = "cluster") -> Fleet:
    """A fleet of one cluster. A mixed cluster (several GPU types, ``cluster.groups``) is refused: a group's jobs
    are timed at its one GPU type before they are placed, so a job on the slower type would be timed too fast."""
    if cluster.mixed:
        raise ConfigError(f"{field}.groups", f"place times each fleet group at one GPU type; this cluster mixes "
                          f"{', '.join(cluster.gpu_names)}",
                          "write a fleet file, fleet: {groups: [{name, types, cluster}, ...]}, one group per GPU type "
                          "(examples/place-pai-fleet.yaml)")
    return Fleet(cluster.name, (FleetGroup(cluster.name, cluster, (cluster.gpu,)),))


def fleet_from_dict(d: Any, base_dir: Path | None = None, field: str = "fleet") -> Fleet:
    """A fleet from its mapping (see the module docstring); errors name ``fleet.groups[i].FIELD``."""
    if not isinstance(d, Mapping):
        raise ConfigError(field, "must be a mapping with groups:", "write fleet: {groups: [{name, cluster}, ...]}")
    extra = set(d) - {"name", "groups"}
    if extra:
        raise ConfigError(f"{field}.{sorted(extra)[0]}", "is not a fleet field", "use name, groups")
    groups = d.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ConfigError(f"{field}.groups", "must be a non-empty list", "list groups: [{name, cluster}, ...]")
    if len(groups) > MAX_GROUPS:
        raise ConfigError(f"{field}.groups", f"has {len(groups)} groups, beyond {MAX_GROUPS}", "merge groups")
    out: list[FleetGroup] = []
    for i, g in enumerate(groups):
        f = f"{field}.groups[{i}]"
        if not isinstance(g, Mapping):
            raise ConfigError(f, "must be a mapping", "write {name: v100, cluster: {...}}")
        extra = set(g) - {"name", "types", "cluster"}
        if extra:
            raise ConfigError(f"{f}.{sorted(extra)[0]}", "is not a group field", "use name, types, cluster")
        name = g.get("name")
        if not isinstance(name, str) or not name.strip() or len(name) > 64:
            raise ConfigError(f"{f}.name", "must be a short name", "write e.g. name: v100")
        if any(o.name == name for o in out):
            raise ConfigError(f"{f}.name", f"{name!r} names two groups", "give each group its own name")
        if "cluster" not in g:
            raise ConfigError(f"{f}.cluster", "is required", "give the group's cluster section")
        cluster = cluster_from_dict(g["cluster"], base_dir, f"{f}.cluster")
        if cluster.mixed:
            single(cluster, f"{f}.cluster")  # refused: one GPU type per group
        types = g.get("types", [name, cluster.gpu])
        if (not isinstance(types, list) or not types
                or not all(isinstance(t, str) and t.strip() and len(t) <= 64 for t in types)):
            raise ConfigError(f"{f}.types", "must be a non-empty list of GPU type names", "write types: [V100M32]")
        out.append(FleetGroup(name, cluster, tuple(types)))
    name = d.get("name", "fleet")
    return Fleet(str(name)[:64], tuple(out))


def load_fleet(path: str | Path) -> Fleet:
    """A fleet file (``fleet:``), or a scenario or cluster file (its ``cluster:``, a fleet of one group)."""
    p = Path(path)
    data = read_yaml(p)
    if isinstance(data, Mapping) and "fleet" in data:
        return fleet_from_dict(data["fleet"], p.parent)
    if isinstance(data, Mapping) and "cluster" in data:
        return single(cluster_from_dict(data["cluster"], base_dir=p.parent))
    return single(load_cluster(p))  # says what is missing
