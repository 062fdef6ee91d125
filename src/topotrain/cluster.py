"""A cluster from a scenario file: servers from a template, wired by a network builder — or a user's graph.

Schema (YAML, under the key ``cluster``)::

    cluster:
      name: eflops-16            # optional
      server: eflops             # a template name, or a server definition (see hardware.servers)
      servers: 16                # how many servers
      gpu: v100                  # optional: override the template's GPU
      nic: eth-100g              # optional: override the template's NIC type
      message_overhead: 2us      # optional: software cost per point-to-point message (alpha)
      catalog: my-hardware.yaml  # optional: extra GPUs / links / servers (hardware.catalog)
      network:
        topology: bigraph        # single-switch | bigraph | fat-tree | leaf-spine | rail-optimized |
                                 # torus | ring | dragonfly
        link: eth-100g           # switch-to-switch link type, or `bandwidth: 100Gbps`
        latency: 1us             # per switch-to-switch link
        ...                      # builder parameters (switches, k, dims, oversubscription, ...)

or ``cluster: {graph: my-graph.yaml}`` (GraphML or YAML; ranks are the GPU nodes in file order).
Validation happens here, once; every problem is a :class:`~topotrain.errors.ConfigError` naming its field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from topotrain.errors import ConfigError
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology
from topotrain.units import parse_bandwidth, parse_time

DEFAULT_MESSAGE_OVERHEAD_S = 2e-6
EXAMPLES_DIRS = (Path(__file__).parent / "examples", Path(__file__).resolve().parents[2] / "examples")
_CLUSTER_KEYS = {"name", "server", "servers", "gpu", "nic", "message_overhead", "catalog", "network", "graph"}


@dataclass(frozen=True, eq=False)
class Cluster:
    """A built cluster: its topology, the GPU type of its ranks, and where it came from."""

    name: str
    topology: Topology
    gpu: str
    servers: int
    gpus_per_server: int
    network: str
    #: parameters of the network models (per-message overhead, shared CPU cores): explicit, not on the topology
    network_params: NetworkParams = field(default_factory=NetworkParams)


def example_path(name: str) -> Path:
    """Path of a built-in example scenario (``examples/NAME.yaml``)."""
    for d in EXAMPLES_DIRS:
        p = d / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
        if p.exists():
            return p
    known = sorted({p.stem for d in EXAMPLES_DIRS if d.exists() for p in d.glob("*.yaml")})
    raise ConfigError("scenario", f"no built-in example {name!r}", f"known: {', '.join(known)}")


def read_yaml(path: str | Path) -> Any:
    """Load a YAML file; a missing file or a syntax error is a one-line ConfigError."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(str(p), "file not found", "check the path")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(str(p), f"malformed YAML{where}: {problem}", "fix the YAML syntax") from None


def load_cluster(path: str | Path) -> Cluster:
    """Build the cluster described by a scenario file (the file's ``cluster`` section)."""
    data = read_yaml(path)
    if not isinstance(data, Mapping) or "cluster" not in data:
        raise ConfigError("cluster", f"{path} has no 'cluster' section", "add `cluster: {server: ..., ...}`")
    return cluster_from_dict(data["cluster"], base_dir=Path(path).parent)


def _int(d: Mapping[str, Any], key: str, field: str, default: int | None = None, minimum: int = 1) -> int:
    v = d.get(key, default)
    if v is None:
        raise ConfigError(f"{field}.{key}", "is required", f"give {key}: <integer>")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{field}.{key}", f"must be an integer, got {v!r}", f"give {key}: <integer>")
    if v < minimum:
        raise ConfigError(f"{field}.{key}", f"must be >= {minimum}, got {v}", f"give {key} >= {minimum}")
    return v


def cluster_from_dict(d: Any, base_dir: Path | None = None, field: str = "cluster") -> Cluster:
    """Build a Cluster from the ``cluster`` mapping of a scenario."""
    from topotrain.hardware import catalog, servers
    from topotrain.hardware.links import resolve_bandwidth
    from topotrain.topology.builders import build_network

    if not isinstance(d, Mapping):
        raise ConfigError(field, f"must be a mapping, got {type(d).__name__}", "see examples/*.yaml")
    unknown = set(d) - _CLUSTER_KEYS
    if unknown:
        raise ConfigError(f"{field}.{sorted(unknown)[0]}", "unknown key",
                          f"known keys: {', '.join(sorted(_CLUSTER_KEYS))}")
    base = base_dir or Path(".")
    overhead = parse_time(d.get("message_overhead", DEFAULT_MESSAGE_OVERHEAD_S), f"{field}.message_overhead")
    if "catalog" in d:
        catalog.load_catalog(base / str(d["catalog"]))

    if "graph" in d:
        from topotrain.topology.io import load_graph

        topo = load_graph(base / str(d["graph"]))
        topo.message_overhead_s = overhead
        topo.validate()
        name = str(d.get("name", Path(str(d["graph"])).stem))
        gpu_names = {topo.nodes[g].attrs.get("gpu") for g in topo.gpus} - {None}
        gpu = str(d.get("gpu") or (gpu_names.pop() if len(gpu_names) == 1 else "a100-80gb"))
        return Cluster(name, topo, gpu, 1, len(topo.gpus), "graph", NetworkParams(topo.message_overhead_s))

    srv = d.get("server")
    if srv is None:
        raise ConfigError(f"{field}.server", "is required", "give a template name (e.g. eflops) or a definition")
    template = (servers.server_from_dict(srv, f"{field}.server") if isinstance(srv, Mapping)
                else servers.get_server(str(srv)))
    n_servers = _int(d, "servers", field, default=1)
    gpu_override = d.get("gpu")
    if gpu_override is not None:
        from topotrain.hardware.gpus import get_gpu

        get_gpu(str(gpu_override))
    nic_override = d.get("nic")
    name = str(d.get("name", f"{template.name}-x{n_servers}"))
    topo = Topology(name, message_overhead_s=overhead)
    instances = [servers.instantiate(topo, template, f"s{i}", gpu=gpu_override, nic=nic_override)
                 for i in range(n_servers)]
    net = d.get("network")
    if net is None:
        if n_servers > 1:
            raise ConfigError(f"{field}.network", "is required with more than one server",
                              "add `network: {topology: single-switch, link: eth-100g}`")
        net_name = "none"
    else:
        if not isinstance(net, Mapping):
            raise ConfigError(f"{field}.network", "must be a mapping", "e.g. {topology: bigraph, link: eth-100g}")
        params = dict(net)
        net_name = str(params.pop("topology", "") or "")
        if not net_name:
            raise ConfigError(f"{field}.network.topology", "is required", "e.g. topology: bigraph")
        link = params.pop("link", None)
        bw = params.pop("bandwidth", None)
        if link is not None and bw is not None:
            raise ConfigError(f"{field}.network", "give either link or bandwidth, not both", "remove one")
        if link is not None:
            bw_bps = resolve_bandwidth(str(link), f"{field}.network.link")
        elif bw is not None:
            bw_bps = parse_bandwidth(bw, f"{field}.network.bandwidth")
        else:
            nic_bw = [topo.nodes[n].attrs.get("bandwidth_bytes_per_s") for i in instances for n in i.nics]
            bw_bps = float(max((b for b in nic_bw if b), default=12.5e9))
        lat = parse_time(params.pop("latency", 1e-6), f"{field}.network.latency")
        groups = [list(i.nics) for i in instances]
        if not any(groups):
            raise ConfigError(f"{field}.server", f"server {template.name!r} has no NIC to attach to the network",
                              "add a NIC to the server definition")
        build_network(topo, net_name, groups, {"link_bandwidth_bytes_per_s": bw_bps, "link_latency_s": lat,
                                               **params}, field=f"{field}.network")
    topo.validate()
    gpu = str(gpu_override or template.gpu)
    per_server = len(instances[0].gpus) if instances else 0
    return Cluster(name, topo, gpu, n_servers, per_server, net_name, NetworkParams(overhead))
