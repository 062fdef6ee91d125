"""The scenario's ``cluster`` section → a built :class:`~topotrain.cluster.Cluster`: servers from a template,
wired by a network builder — or a user's graph.

Schema (YAML, under the key ``cluster``; the models are :class:`topotrain.scenario.cluster_spec.ClusterSpec`)::

    cluster:
      name: eflops-16            # optional
      server: eflops             # a template name, or a server definition (see hardware.servers)
      servers: 16                # how many servers (at most MAX_SERVERS; GPUs at most MAX_GPUS)
      gpu: v100                  # optional: override the template's GPU
      nic: eth-100g              # optional: override the template's NIC type
      message_overhead: 2us      # optional: software cost per point-to-point message (alpha)
      arbitration: port          # optional: flow (default: max-min per flow on every link) | port (PCIe
                                 # links share per input port, round robin; network.port_arbitration)
      catalog: my-hardware.yaml  # optional: extra GPUs / links / servers (a file, or the entries inline)
      network:
        topology: bigraph        # single-switch | bigraph | fat-tree | leaf-spine | rail-optimized |
                                 # torus | ring | dragonfly
        link: eth-100g           # switch-to-switch link type, or `bandwidth: 100Gbps`; neither: the
                                 # fastest NIC's speed
        latency: 1us             # per switch-to-switch link
        routing: d-mod-k         # optional: ecmp | d-mod-k | ecmp-shared-seed; omitted: the fabric's own
                                 # (d-mod-k on InfiniBand links, else ecmp: network_routing)
        ...                      # builder parameters (switches, k, dims, oversubscription, ...)

or a mixed cluster, groups of servers of several templates, GPUs and NICs joined by the one ``network``
(each group's ``server``, ``servers``, ``gpu``, ``nic`` as above; servers numbered on across the groups,
``s0``, ``s1``, ...; docs/mixed.md)::

    cluster:
      groups:
        - {server: nvswitch-8, servers: 2, gpu: v100, nic: ib-edr-100g}
        - {server: nvswitch-8, servers: 2}
      network: {topology: fat-tree, link: ib-hdr-200g}

or ``cluster: {graph: my-graph.yaml}`` (GraphML or YAML; ranks are the GPU nodes in file order). The
per-message overhead is the cluster's ``message_overhead``, else the graph file's, else
:data:`~topotrain.collectives.costmodel.DEFAULT_MESSAGE_OVERHEAD_S`; a cluster value that contradicts the graph
file's is an error. A graph file whose GPU nodes name several types is a mixed cluster (unless
``cluster.gpu`` names the one datasheet to use). The cluster's hardware catalog (built-ins plus ``catalog:``)
is a value kept on the :class:`Cluster`; nothing global changes. Sizes are checked before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from topotrain.cluster import Cluster
from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.hardware import servers
from topotrain.hardware.catalog import Catalog
from topotrain.hardware.servers import ServerTemplate
from topotrain.network.params import NetworkParams
from topotrain.scenario.cluster_plain import PlainCluster, cluster_spec_of
from topotrain.topology.builders import build_network
from topotrain.topology.graph import Topology
from topotrain.topology.io import load_graph_file
from topotrain.topology.routing import default_routing
from topotrain.util import progress, yamlio
from topotrain.util.errors import ConfigError
from topotrain.util.gc_pause import collector_paused
from topotrain.util.limits import MAX_GPUS

if TYPE_CHECKING:
    from topotrain.scenario.cluster_spec import ClusterSpec

__all__ = ["ASSUMED_GRAPH_GPU", "cluster_from_dict", "cluster_from_spec", "example_path", "group_gpus",
           "group_views", "load_cluster", "network_link_kind", "network_routing", "planned_gpus", "read_yaml"]

#: GPU type assumed for a graph file whose GPU nodes name none (and no ``cluster.gpu``): an assumption,
#: shown by ``topotrain simulate --resolved`` and in every result; give ``cluster.gpu`` to choose.
ASSUMED_GRAPH_GPU = "a100-80gb"
EXAMPLES_DIRS = (Path(__file__).parents[1] / "examples", Path(__file__).resolve().parents[3] / "examples")


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
    text = yamlio.read_text(p, str(p))
    try:
        return yamlio.safe_load(text)
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


def cluster_from_dict(d: Any, base_dir: Path | None = None, field: str = "cluster") -> Cluster:
    """Build a Cluster from the ``cluster`` mapping of a scenario (validated by :class:`ClusterSpec`, or read
    by :func:`~topotrain.scenario.cluster_plain.plain_cluster` where it is a plain template cluster)."""
    return cluster_from_spec(cluster_spec_of(d, field), base_dir, field)


def cluster_catalog(spec: ClusterSpec | PlainCluster, base_dir: Path | None = None, field: str = "cluster") -> Catalog:
    """The catalog a cluster is built from: built-ins plus the spec's ``catalog`` (file or inline)."""
    if spec.catalog is None:
        return Catalog.builtin()
    # deferred: a user catalog is validated by the schema's models (pydantic), which a plain cluster never needs
    from topotrain.scenario.catalog import load_catalog, with_entries

    if isinstance(spec.catalog, str):
        return load_catalog((base_dir or Path(".")) / spec.catalog)
    return with_entries(Catalog.builtin(), spec.catalog, f"{field}.catalog")


def planned_size(spec: ClusterSpec | PlainCluster, catalog: Catalog, field: str = "cluster") -> tuple[int, int]:
    """(servers, GPUs per server) of a template cluster, from the spec alone; a cluster beyond
    :data:`MAX_GPUS` is refused here, before any server is built."""
    template = template_of(spec, catalog, field)
    per = template.num_gpus
    if spec.servers * per > MAX_GPUS:
        raise ConfigError(f"{field}.servers", f"{spec.servers} servers x {per} GPUs = {spec.servers * per} GPUs is "
                          f"beyond the limit of {MAX_GPUS} GPUs", f"use at most {MAX_GPUS // max(per, 1)} servers")
    return spec.servers, per


def group_views(spec: ClusterSpec | PlainCluster,
                field: str = "cluster") -> list[tuple[ClusterSpec | PlainCluster, str]]:
    """Each group of a mixed cluster as a one-template cluster spec (its server, servers, GPU and NIC; the
    cluster's network and catalog) with the field that names it (``cluster.groups[1]``); a template cluster
    is its own one group."""
    if spec.groups is None or isinstance(spec, PlainCluster):
        return [(spec, field)]
    return [(spec.model_copy(update={"server": g.server, "servers": g.servers, "gpu": g.gpu, "nic": g.nic,
                                     "groups": None}), f"{field}.groups[{i}]")
            for i, g in enumerate(spec.groups)]


def planned_gpus(spec: ClusterSpec | PlainCluster, catalog: Catalog, field: str = "cluster") -> int:
    """GPUs of a template or groups cluster, from the spec alone; beyond :data:`MAX_GPUS` is refused here."""
    if spec.groups is None:
        n, per = planned_size(spec, catalog, field)
        return n * per
    total = sum(v.servers * template_of(v, catalog, f).num_gpus for v, f in group_views(spec, field))
    if total > MAX_GPUS:
        raise ConfigError(f"{field}.groups", f"the groups have {total} GPUs, beyond the limit of {MAX_GPUS} GPUs",
                          "use fewer servers")
    return total


def group_gpus(spec: ClusterSpec | PlainCluster, catalog: Catalog, field: str = "cluster") -> list[str]:
    """The catalog name of each group's GPU (``gpu``, else its template's), in group order; a name the catalog
    does not hold is a ConfigError naming the group's field."""
    out = []
    for v, f in group_views(spec, field):
        if v.gpu is not None:
            out.append(catalog.gpu(v.gpu, f"{f}.gpu").name)
        else:
            out.append(catalog.gpu(template_of(v, catalog, f).gpu, f"{f}.server.gpu").name)
    return out


def template_of(spec: ClusterSpec | PlainCluster, catalog: Catalog, field: str) -> ServerTemplate:
    """The server template ``spec`` names (looked up in ``catalog``) or defines inline."""
    if spec.server is None or isinstance(spec.server, str):
        return catalog.server(str(spec.server), f"{field}.server")
    # deferred: an inline server's entry is the schema's (pydantic) model, which a plain cluster never holds
    from topotrain.scenario.catalog import server_from_entry

    return server_from_entry(spec.server, f"{field}.server", catalog)


def network_link_kind(spec: ClusterSpec | PlainCluster, catalog: Catalog, field: str = "cluster") -> str:
    """The catalog link kind (``ethernet``, ``infiniband``) of a template cluster's network: the kind of
    ``network.link`` where it names a link type, else that of the servers' NIC ports (``cluster.nic``, else the
    template's NICs: their ``link``) where they all share one; "" where nothing says (a NIC given by bandwidth
    alone, NICs of mixed kinds)."""
    net = spec.network
    if net is not None and net.link is not None:
        return catalog.link(net.link, f"{field}.network.link").kind
    kinds = set()
    for view, where in group_views(spec, field):
        if view.nic is not None:
            kinds.add(catalog.link(view.nic, f"{where}.nic").kind)
            continue
        for nd in template_of(view, catalog, where).nodes:
            if nd.kind == "nic":
                link = nd.attrs.get("link")
                if not isinstance(link, str):
                    return ""
                kinds.add(catalog.link(link, f"{where}.server").kind)
    return kinds.pop() if len(kinds) == 1 else ""


def network_routing(spec: ClusterSpec | PlainCluster, catalog: Catalog, field: str = "cluster") -> str | None:
    """How the cluster network of a template cluster breaks ties between equal-cost paths: ``network.routing``
    where given, else the fabric's own (:func:`topotrain.topology.routing.default_routing` of
    :func:`network_link_kind`: ``d-mod-k`` on InfiniBand, ``ecmp`` otherwise); None without a network (or for
    a graph file, whose ``meta.routing`` says, default ``ecmp``)."""
    net = spec.network
    if net is None or spec.graph is not None:
        return None
    if net.routing is not None:
        return net.routing
    return default_routing(network_link_kind(spec, catalog, field))


def _params(spec: ClusterSpec | PlainCluster, overhead: float) -> NetworkParams:
    arbitration = spec.arbitration or "flow"
    if spec.fabric is None:
        return NetworkParams(overhead, arbitration=arbitration)
    return NetworkParams(overhead, fabric=spec.fabric.fabric(), arbitration=arbitration)


@collector_paused()
def cluster_from_spec(spec: ClusterSpec | PlainCluster, base_dir: Path | None = None,
                      field: str = "cluster") -> Cluster:
    """Build the Cluster a validated :class:`ClusterSpec` describes (names resolved in its catalog). The cyclic
    garbage collector is paused meanwhile (:mod:`topotrain.util.gc_pause`: a topology is tens of thousands of
    long-lived objects; 8,192 GPUs build in half the time)."""
    base = base_dir or Path(".")
    catalog = cluster_catalog(spec, base, field)
    overhead = spec.message_overhead

    if spec.graph is not None:
        topo, file_overhead = load_graph_file(base / spec.graph)
        if overhead is not None and file_overhead is not None and overhead != file_overhead:
            raise ConfigError(f"{field}.message_overhead", f"is {overhead!r} s, but the graph file {spec.graph} "
                              f"says {file_overhead!r} s", "remove one of the two (they must agree)")
        overhead = overhead if overhead is not None else file_overhead
        overhead = DEFAULT_MESSAGE_OVERHEAD_S if overhead is None else overhead
        if len(topo.gpus) > MAX_GPUS:
            raise ConfigError(f"{field}.graph", f"has {len(topo.gpus)} GPUs, beyond the limit of {MAX_GPUS}",
                              "split the study")
        topo.validate()
        name = spec.name or Path(spec.graph).stem
        named = [topo.nodes[g].attrs.get("gpu") for g in topo.gpus]
        gpu_names = sorted({str(g) for g in named if g is not None})
        rank_gpus: tuple[str, ...] = ()
        if spec.gpu is not None:
            gpu = catalog.gpu(spec.gpu, f"{field}.gpu").name
        elif len(gpu_names) > 1:  # a mixed cluster: every GPU node must say its type
            if any(g is None for g in named):
                raise ConfigError(f"{field}.graph", f"some GPU nodes name a type ({', '.join(gpu_names)}), some "
                                  "none", "give every GPU node its gpu: attribute, or give cluster.gpu")
            rank_gpus = tuple(catalog.gpu(str(g), f"{field}.graph").name for g in named)
            gpu = rank_gpus[0]
        else:
            gpu = catalog.gpu(gpu_names[0] if gpu_names else ASSUMED_GRAPH_GPU, f"{field}.gpu").name
        return Cluster(name, topo, gpu, 1, len(topo.gpus), "graph", _params(spec, overhead), catalog, rank_gpus)

    views = group_views(spec, field)
    planned_gpus(spec, catalog, field)
    templates = [template_of(v, catalog, f) for v, f in views]
    gpu_overrides = [catalog.gpu(v.gpu, f"{f}.gpu").name if v.gpu is not None else None for v, f in views]
    for v, f in views:
        if v.nic is not None:
            servers.nic_type(v.nic, f"{f}.nic", catalog)
    overhead = DEFAULT_MESSAGE_OVERHEAD_S if overhead is None else overhead
    n_servers = sum(v.servers for v, _ in views)
    if spec.name:
        name = spec.name
    elif len(views) == 1:
        name = f"{templates[0].name}-x{n_servers}"
    else:
        name = "+".join(f"{t.name}-x{v.servers}" for t, (v, _) in zip(templates, views, strict=True))
    net = spec.network
    link_bw: float | None = None
    if net is not None:
        link_bw = catalog.bandwidth(net.link, f"{field}.network.link") if net.link is not None else net.bandwidth
        for t, (_, f) in zip(templates, views, strict=True):
            if not t.nic_names:
                raise ConfigError(f"{f}.server", f"server {t.name!r} has no NIC to attach to the network",
                                  "add a NIC to the server definition")
    topo = Topology(name)
    instances: list[servers.ServerInstance] = []
    with progress.task(f"building the cluster: {n_servers} servers", total=n_servers) as prog:
        for t, gpu_override, (v, _) in zip(templates, gpu_overrides, views, strict=True):
            for _i in range(v.servers):
                instances.append(servers.instantiate(topo, t, f"s{len(instances)}", gpu=gpu_override, nic=v.nic,
                                                     catalog=catalog))
                prog.advance()
        if net is None:
            net_name = "none"
        else:
            net_name = net.topology
            prog.update(description=f"building the cluster: the {net_name} network")
            params: dict[str, Any] = {"link_latency_s": net.latency, **(net.model_extra or {})}
            if link_bw is not None:  # else the builder takes the fastest NIC's port speed
                params["link_bandwidth_bytes_per_s"] = link_bw
            build_network(topo, net_name, [list(i.nics) for i in instances], params, field=f"{field}.network")
            routing = network_routing(spec, catalog, field)
            if routing != "ecmp":  # read by the topology's router (topotrain.topology.routing; default ecmp)
                topo.meta["routing"] = routing
        topo.validate()
    per_server = min(t.num_gpus for t in templates)
    gpu = gpu_overrides[0] or catalog.gpu(templates[0].gpu, f"{views[0][1]}.server.gpu").name
    rank_gpus = tuple(str(topo.nodes[g].attrs.get("gpu", gpu)) for g in topo.gpus)
    templates_by_server = tuple(t.name for t, (v, _) in zip(templates, views, strict=True) for _ in range(v.servers))
    return Cluster(name, topo, gpu, n_servers, per_server, net_name, _params(spec, overhead), catalog, rank_gpus,
                   templates_by_server)
