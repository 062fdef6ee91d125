"""Server templates: the inside of one server (GPUs, PCIe switches, CPU sockets, NICs, NVSwitch) as data.

A :class:`ServerTemplate` is a small graph with local node names; :func:`instantiate` copies it into a
:class:`~topotrain.topology.graph.Topology` under the prefix ``"<server>/"``. Network builders then join
the servers' NIC nodes to switches, using each NIC's ``bandwidth_bytes_per_s`` (port speed) and ``rail``.

Built-in templates (registry :data:`SERVERS`, lookup :func:`get_server`):

``pcie-shared-nic``
    The conventional 8-GPU server that EFLOPS (Dong et al., HPCA 2020) starts from: 2 CPU sockets joined
    by UPI, 2 PCIe switches per socket (PCIe3 x16 uplink to the socket's root complex, i.e. the CPU
    node), 2 V100 per switch (PCIe3 x16), and one 100 Gb/s NIC on socket 0's root complex (PCIe3 x16),
    shared by all 8 GPUs: a GPU's inter-server traffic crosses its PCIe switch uplink, the root complex
    and, from socket 1, UPI. Factory :func:`pcie_shared_nic` (``nics=2`` puts one NIC on each socket).
``eflops``
    The EFLOPS server: the same PCIe tree with a 100 Gb/s NIC beside each PCIe switch, so a GPU's traffic
    goes GPU → its PCIe switch → its own NIC and never crosses the root complex. Factory
    :func:`eflops_server`.
``nvswitch-8`` (alias ``dgx-a100``), ``dgx-h100``
    DGX-style: 8 GPUs, each with one link standing for all its NVLinks (per-GPU aggregate, per direction)
    to one NVSwitch node (the DGX's several NVSwitch chips merged into one non-blocking node); 4 PCIe
    switches with 2 GPUs and 2 NICs each (NIC *i* bound to GPU *i*, rail *i*); 2 CPU sockets. Factory
    :func:`nvswitch_server`.
``single-gpu``
    One GPU and one 100 Gb/s NIC on a PCIe switch, for GPU-level network studies.

The EFLOPS paper's exact server details (PCIe generation, CPU model, NIC attachment points, NIC count of
the baseline) are not in our material (see ``shared/reference/eflops.md``: only the abstract and
secondary sources). The values above are documented defaults, and the factories make them parameters.

User templates: :func:`server_from_dict` reads
``{name, gpu, description?, source?, nodes: [{name, kind, ...attrs}], links: [{a, b, link | bandwidth,
latency?, kind?}]}``. On a node, ``link``/``bandwidth``/``latency``/``rail`` describe a NIC's port, ``nic``
binds a GPU to a NIC, ``gpu`` overrides the server's GPU model for that GPU, ``transit`` overrides whether
the node forwards traffic; other keys are copied into the topology node's attrs. A ``link`` name gives
bandwidth, latency and kind; explicit ``bandwidth``/``latency``/``kind`` override it. Without ``link`` or
``kind``, a link's kind is inferred: cpu–cpu → ``socket``, anything touching an NVSwitch or gpu–gpu →
``nvlink``, else ``pcie``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from topotrain.hardware.gpus import get_gpu
from topotrain.hardware.links import LinkType, get_link
from topotrain.util.errors import ConfigError

if TYPE_CHECKING:
    from topotrain.hardware.catalog import Catalog
    from topotrain.topology.graph import Topology

#: Node kinds a server template may hold (network switches belong to the network, not to a server).
SERVER_NODE_KINDS: tuple[str, ...] = ("gpu", "pcie", "cpu", "nic", "nvswitch")
_TRANSIT_KINDS = {"pcie", "cpu", "nvswitch"}
_NIC_LINK_KINDS = ("ethernet", "infiniband")
#: Attribute names instantiate() sets itself or Topology.add_node takes as arguments.
_RESERVED_ATTRS = {"name", "kind", "server"}


@dataclass(frozen=True)
class NodeDef:
    """One node of a template. ``attrs`` go to the topology node (NICs: ``bandwidth_bytes_per_s``,
    ``latency_s``, ``rail``, optional ``link``; GPUs: optional ``nic`` = local NIC name, ``gpu``)."""

    local_name: str
    kind: str
    attrs: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))


@dataclass(frozen=True)
class LinkDef:
    """One full-duplex link of a template; bandwidth per direction (bytes/s), latency per hop (s)."""

    a: str
    b: str
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    kind: str = ""


@dataclass(frozen=True)
class ServerTemplate:
    """The inside of one server. ``gpu`` is the default GPU catalog name of its GPU nodes.

    Construction checks the structure (names, kinds, links, that every GPU reaches every other GPU and,
    when the server has NICs, a NIC) and fills in a NIC's ``rail`` (its index among the NICs) if absent.
    """

    name: str
    description: str
    gpu: str
    nodes: tuple[NodeDef, ...]
    links: tuple[LinkDef, ...]
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "nodes", check_structure(self.name, self.gpu, self.nodes, self.links,
                                                           "server"))

    @property
    def gpu_names(self) -> tuple[str, ...]:
        """Local names of the GPU nodes in rank order."""
        return tuple(n.local_name for n in self.nodes if n.kind == "gpu")

    @property
    def nic_names(self) -> tuple[str, ...]:
        """Local names of the NIC nodes in rail order."""
        nics = [n for n in self.nodes if n.kind == "nic"]
        return tuple(n.local_name for n in sorted(nics, key=lambda n: int(n.attrs["rail"])))

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_names)


@dataclass(frozen=True)
class ServerInstance:
    """A template copied into a Topology: full node names of its GPUs (rank order) and NICs (rail order)."""

    name: str
    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    template: str = ""


# ---- structure checks ---------------------------------------------------------------------------------
def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def check_structure(name: str, gpu: str, tnodes: tuple[NodeDef, ...], tlinks: tuple[LinkDef, ...], fld: str
                     ) -> tuple[NodeDef, ...]:
    """Validate a template; return its nodes with NIC rails filled in. Errors name ``fld``-rooted paths."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{fld}.name", "a server template needs a non-empty name", "give it a name")
    if not isinstance(gpu, str) or not gpu.strip():
        raise ConfigError(f"{fld}.gpu", "a server template needs a GPU name", "give gpu: <catalog name>")
    if not tnodes:
        raise ConfigError(f"{fld}.nodes", f"server {name!r} has no nodes", "list its GPUs, NICs and switches")
    index: dict[str, int] = {}
    for i, nd in enumerate(tnodes):
        where = f"{fld}.nodes[{i}]"
        if not isinstance(nd, NodeDef):
            raise ConfigError(where, f"expected a NodeDef, got {type(nd).__name__}", "build a NodeDef")
        if not isinstance(nd.local_name, str) or not nd.local_name.strip() or "/" in nd.local_name:
            raise ConfigError(f"{where}.name", f"bad node name {nd.local_name!r}",
                              "give a non-empty name without '/'")
        if nd.local_name in index:
            raise ConfigError(f"{where}.name", f"node {nd.local_name!r} is defined twice",
                              "give every node a unique name")
        index[nd.local_name] = i
        if nd.kind not in SERVER_NODE_KINDS:
            raise ConfigError(f"{where}.kind", f"node {nd.local_name!r} has unknown kind {nd.kind!r}",
                              f"use one of {', '.join(SERVER_NODE_KINDS)} (network switches belong to the "
                              "network builder)")
        bad = sorted(_RESERVED_ATTRS & set(nd.attrs))
        if bad:
            raise ConfigError(f"{where}.{bad[0]}", f"attribute {bad[0]!r} is reserved", "remove it")
        if "transit" in nd.attrs and not isinstance(nd.attrs["transit"], bool):
            raise ConfigError(f"{where}.transit",
                              f"transit must be true or false, got {nd.attrs['transit']!r}",
                              "write transit: true")
    nics = [i for i, nd in enumerate(tnodes) if nd.kind == "nic"]
    gpus = [i for i, nd in enumerate(tnodes) if nd.kind == "gpu"]
    if not gpus:
        raise ConfigError(f"{fld}.nodes", f"server {name!r} has no GPU", "add a node of kind gpu")
    nodes = list(tnodes)
    rails: dict[int, str] = {}
    for r, i in enumerate(nics):
        nd = nodes[i]
        where = f"{fld}.nodes[{i}]"
        bw = nd.attrs.get("bandwidth_bytes_per_s", 0.0)
        if not (_is_number(bw) and bw > 0):
            raise ConfigError(f"{where}.bandwidth", f"NIC {nd.local_name!r} has no port speed",
                              "give link: eth-100g (a link type) or bandwidth: 100Gbps")
        lat = nd.attrs.get("latency_s", 0.0)
        if not (_is_number(lat) and lat >= 0):
            raise ConfigError(f"{where}.latency", f"NIC {nd.local_name!r} has latency {lat!r}",
                              "give e.g. 0.5us")
        rail = nd.attrs.get("rail", r)
        if not (isinstance(rail, int) and not isinstance(rail, bool) and rail >= 0):
            raise ConfigError(f"{where}.rail", f"rail must be an integer >= 0, got {rail!r}", "write rail: 0")
        if rail in rails:
            raise ConfigError(f"{where}.rail",
                              f"NICs {rails[rail]!r} and {nd.local_name!r} share rail {rail}",
                              "give each NIC of a server its own rail")
        rails[rail] = nd.local_name
        if "rail" not in nd.attrs or "latency_s" not in nd.attrs:
            nodes[i] = NodeDef(nd.local_name, nd.kind, {**nd.attrs, "rail": rail, "latency_s": float(lat)})
    for i in gpus:
        nd = nodes[i]
        where = f"{fld}.nodes[{i}]"
        if "gpu" in nd.attrs and (not isinstance(nd.attrs["gpu"], str) or not nd.attrs["gpu"].strip()):
            raise ConfigError(f"{where}.gpu", f"expected a GPU name, got {nd.attrs['gpu']!r}", "give a catalog name")
        if "nic" in nd.attrs:
            nic = nd.attrs["nic"]
            if not isinstance(nic, str) or nic not in index or tnodes[index[nic]].kind != "nic":
                raise ConfigError(f"{where}.nic",
                                  f"GPU {nd.local_name!r} is bound to {nic!r}, which is not a "
                                  "NIC of this server", "name one of: " + (", ".join(
                                      tnodes[j].local_name for j in nics) or "(no NICs)"))
    for i, nd in enumerate(nodes):
        if nd.kind != "gpu" and "gpu" in nd.attrs:
            raise ConfigError(f"{fld}.nodes[{i}].gpu",
                              f"only GPU nodes take a gpu model, not {nd.kind!r} nodes",
                              "remove it")
    adj: dict[str, list[str]] = {nd.local_name: [] for nd in nodes}
    seen: dict[frozenset[str], int] = {}
    for j, lk in enumerate(tlinks):
        where = f"{fld}.links[{j}]"
        if not isinstance(lk, LinkDef):
            raise ConfigError(where, f"expected a LinkDef, got {type(lk).__name__}", "build a LinkDef")
        for end, name in (("a", lk.a), ("b", lk.b)):
            if name not in index:
                raise ConfigError(f"{where}.{end}", f"link names unknown node {name!r}",
                                  "use one of: " + ", ".join(index))
        if lk.a == lk.b:
            raise ConfigError(f"{where}.b", f"link {lk.a}–{lk.b} joins a node to itself",
                              "remove the self-loop")
        pair = frozenset((lk.a, lk.b))
        if pair in seen:
            raise ConfigError(f"{where}", f"link {lk.a}–{lk.b} is defined twice (also links[{seen[pair]}])",
                              "merge parallel links into one with the summed bandwidth")
        seen[pair] = j
        if not (_is_number(lk.bandwidth_bytes_per_s) and lk.bandwidth_bytes_per_s > 0):
            raise ConfigError(f"{where}.bandwidth",
                              f"link {lk.a}–{lk.b} has bandwidth {lk.bandwidth_bytes_per_s!r}",
                              "give a positive bandwidth, e.g. 25GB/s")
        if not (_is_number(lk.latency_s) and lk.latency_s >= 0):
            raise ConfigError(f"{where}.latency", f"link {lk.a}–{lk.b} has latency {lk.latency_s!r}",
                              "give latency >= 0, e.g. 1us")
        adj[lk.a].append(lk.b)
        adj[lk.b].append(lk.a)
    _check_reachability(name, nodes, adj, index, fld)
    return tuple(nodes)


def _forwards(nd: NodeDef) -> bool:
    if nd.kind == "gpu":
        return False
    return bool(nd.attrs.get("transit", nd.kind in _TRANSIT_KINDS))


def _reach(start: str, nodes: Mapping[str, NodeDef], adj: Mapping[str, list[str]],
           through: Callable[[NodeDef], bool]) -> set[str]:
    """Nodes reachable from ``start`` passing only through nodes for which ``through`` holds."""
    seen = {start}
    q = deque([start])
    while q:
        u = q.popleft()
        if u != start and not through(nodes[u]):
            continue
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                q.append(v)
    return seen


def _check_reachability(name: str, nodes: list[NodeDef], adj: Mapping[str, list[str]],
                        index: Mapping[str, int], fld: str) -> None:
    by_name = {nd.local_name: nd for nd in nodes}
    everything = _reach(nodes[0].local_name, by_name, adj, lambda _nd: True)
    for nd in nodes:
        if nd.local_name not in everything:
            raise ConfigError(f"{fld}.links", f"server {name!r} is disconnected: node {nd.local_name!r} "
                              f"cannot reach {nodes[0].local_name!r}", "add links joining the parts")
    gpus = [nd for nd in nodes if nd.kind == "gpu"]
    nics = {nd.local_name for nd in nodes if nd.kind == "nic"}
    for g in gpus:
        where = f"{fld}.nodes[{index[g.local_name]}]"
        r = _reach(g.local_name, by_name, adj, _forwards)
        for h in gpus:
            if h.local_name not in r and h is not g:
                raise ConfigError(where,
                                  f"GPU {g.local_name!r} cannot reach GPU {h.local_name!r} inside server "
                                  f"{name!r} (GPUs and NICs do not forward)",
                                  "join them through a pcie, cpu or nvswitch node")
        if nics and not (r & nics):
            raise ConfigError(where, f"GPU {g.local_name!r} cannot reach any NIC of server {name!r}",
                              "join it to a NIC through a pcie, cpu or nvswitch node")
        bound = g.attrs.get("nic")
        if bound is not None and bound not in r:
            raise ConfigError(f"{where}.nic", f"GPU {g.local_name!r} cannot reach its NIC {bound!r}",
                              "join them through a pcie, cpu or nvswitch node")


# ---- instantiation ------------------------------------------------------------------------------------
def gpu_name_in(name: str, field: str, catalog: Catalog | None) -> str:
    """Canonical name of GPU ``name`` in ``catalog`` (the built-in catalog when None)."""
    return (catalog.gpu(name, field) if catalog is not None else get_gpu(name, field)).name


def link_in(name: str, field: str, catalog: Catalog | None) -> LinkType:
    return catalog.link(name, field) if catalog is not None else get_link(name, field)


def nic_type(nic: str, field: str, catalog: Catalog | None = None) -> LinkType:
    lt = link_in(nic, field, catalog)
    if lt.kind not in _NIC_LINK_KINDS:
        raise ConfigError(field, f"{lt.name!r} is a {lt.kind} link, not a NIC",
                          "use an ethernet or infiniband link type, e.g. eth-100g or ib-hdr-200g")
    return lt


def instantiate(topo: Topology, template: ServerTemplate | str, server: str, *, gpu: str | None = None,
                nic: str | None = None, catalog: Catalog | None = None) -> ServerInstance:
    """Copy ``template`` into ``topo`` as server ``server``: nodes ``f"{server}/{local}"`` with
    ``server=server``; GPU nodes in rank order with attrs ``gpu`` (catalog name) and ``nic`` (full name of
    the bound NIC, where the design binds one); NIC nodes with ``bandwidth_bytes_per_s``, ``latency_s``,
    ``rail`` (and ``link``, the port's link type). ``gpu`` overrides the GPU model of every GPU (links
    stay as the template has them); ``nic`` overrides every NIC's port link type (e.g. ``"eth-100g"``).
    Names are looked up in ``catalog`` (the built-in catalog when None).
    """
    tpl = catalog.server(template) if catalog is not None and not isinstance(template, ServerTemplate) \
        else get_server(template)
    if not isinstance(server, str) or not server.strip():
        raise ConfigError("server", f"bad server name {server!r}", "give a non-empty name")
    gpu_name = gpu_name_in(gpu, "gpu", catalog) if gpu is not None else None
    port = nic_type(nic, "nic", catalog) if nic is not None else None
    gpu_names: dict[str, str] = {}

    def full(local: str) -> str:
        return f"{server}/{local}"

    clash = [full(nd.local_name) for nd in tpl.nodes if full(nd.local_name) in topo.nodes]
    if clash:
        raise ConfigError("server", f"server {server!r} is already in topology {topo.name!r} ({clash[0]})",
                          "give every server a unique name")
    gpus: list[str] = []
    nics: list[tuple[int, str]] = []
    for nd in tpl.nodes:
        attrs = dict(nd.attrs)
        transit = attrs.pop("transit", None)
        name = full(nd.local_name)
        if nd.kind == "gpu":
            own = str(attrs.get("gpu", tpl.gpu))
            if gpu_name is None and own not in gpu_names:
                gpu_names[own] = gpu_name_in(own, "gpu", catalog)
            attrs["gpu"] = gpu_name or gpu_names[own]
            if "nic" in attrs:
                attrs["nic"] = full(attrs["nic"])
            gpus.append(name)
        elif nd.kind == "nic":
            if port is not None:
                attrs.update(link=port.name, bandwidth_bytes_per_s=port.bandwidth_bytes_per_s,
                             latency_s=port.latency_s)
            nics.append((int(attrs["rail"]), name))
        topo.add_node(name, nd.kind, server=server, transit=transit, **attrs)
    for lk in tpl.links:
        topo.add_link(full(lk.a), full(lk.b), lk.bandwidth_bytes_per_s, lk.latency_s, lk.kind)
    return ServerInstance(server, tuple(gpus), tuple(n for _, n in sorted(nics)), tpl.name)


# ---- built-in templates -------------------------------------------------------------------------------
class _Draft:
    """Collects nodes and links of a built-in template."""

    def __init__(self) -> None:
        self.nodes: list[NodeDef] = []
        self.links: list[LinkDef] = []

    def node(self, name: str, kind: str, **attrs: Any) -> str:
        self.nodes.append(NodeDef(name, kind, attrs))
        return name

    def nic(self, name: str, port: LinkType, rail: int) -> str:
        return self.node(name, "nic", link=port.name, bandwidth_bytes_per_s=port.bandwidth_bytes_per_s,
                         latency_s=port.latency_s, rail=rail)

    def link(self, a: str, b: str, lt: LinkType) -> None:
        self.links.append(LinkDef(a, b, lt.bandwidth_bytes_per_s, lt.latency_s, lt.kind))


def _pcie_tree(d: _Draft, pcie: LinkType, socket: LinkType, switches: int = 4, gpus_per_switch: int = 2
               ) -> tuple[list[str], list[str], list[list[str]]]:
    """2 CPU sockets (socket link), ``switches`` PCIe switches split evenly over them (x16 uplinks to the
    root complex), ``gpus_per_switch`` GPUs per switch. Returns (cpus, switches, GPUs per switch)."""
    cpus = [d.node("cpu0", "cpu"), d.node("cpu1", "cpu")]
    d.link(cpus[0], cpus[1], socket)
    sws = []
    for s in range(switches):
        sws.append(d.node(f"pcie{s}", "pcie"))
        d.link(cpus[s * 2 // switches], sws[-1], pcie)
    groups = [[f"gpu{s * gpus_per_switch + k}" for k in range(gpus_per_switch)] for s in range(switches)]
    return cpus, sws, groups


def pcie_shared_nic(nics: int = 1, gpu: str = "v100", nic: str = "eth-100g") -> ServerTemplate:
    """The conventional server EFLOPS starts from (Dong et al., HPCA 2020, the baseline server):
    8 GPUs under 4 PCIe3 switches on 2 UPI-joined sockets, sharing ``nics`` NICs on the root complexes
    (1: on socket 0; 2: one per socket, each GPU bound to its socket's NIC). Defaults are documented
    assumptions: the paper's exact configuration is not in our material (shared/reference/eflops.md)."""
    if nics not in (1, 2) or isinstance(nics, bool):
        raise ConfigError("nics", f"pcie-shared-nic takes 1 or 2 NICs, got {nics!r}",
                          "use nics=1 (socket 0) or nics=2 (one per socket)")
    spec = get_gpu(gpu)
    port = nic_type(nic, "nic")
    pcie, upi = get_link("pcie3-x16"), get_link("upi")
    d = _Draft()
    cpus, sws, groups = _pcie_tree(d, pcie, upi)
    nic_names = [f"nic{k}" for k in range(nics)]
    for s, (sw, group) in enumerate(zip(sws, groups, strict=True)):
        socket = s * 2 // len(sws)
        for g in group:
            d.node(g, "gpu", nic=nic_names[socket if nics == 2 else 0])
            d.link(sw, g, pcie)
    for k, n in enumerate(nic_names):
        d.nic(n, port, k)
        d.link(cpus[k], n, pcie)
    return ServerTemplate(
        "pcie-shared-nic" if nics == 1 else f"pcie-shared-nic-{nics}",
        f"conventional 8-GPU PCIe server: 2 sockets (UPI), 4 PCIe3 switches, 2 GPUs each, {nics} shared "
        f"{port.name} NIC{'s' if nics > 1 else ''} on the root complex", spec.name, tuple(d.nodes),
        tuple(d.links),
        "Dong et al., EFLOPS, HPCA 2020 (baseline server, as described in the abstract and secondary "
        "sources); PCIe generation, CPU link and NIC placement are documented defaults")


def eflops_server(gpu: str = "v100", nic: str = "eth-100g") -> ServerTemplate:
    """The EFLOPS server (Dong et al., HPCA 2020): the same PCIe tree as :func:`pcie_shared_nic`, with a
    NIC beside each PCIe switch; GPUs 2i and 2i+1 use NIC i, whose traffic never crosses a root complex."""
    spec = get_gpu(gpu)
    port = nic_type(nic, "nic")
    pcie, upi = get_link("pcie3-x16"), get_link("upi")
    d = _Draft()
    _cpus, sws, groups = _pcie_tree(d, pcie, upi)
    for s, (sw, group) in enumerate(zip(sws, groups, strict=True)):
        for g in group:
            d.node(g, "gpu", nic=f"nic{s}")
            d.link(sw, g, pcie)
    for s, sw in enumerate(sws):
        d.nic(f"nic{s}", port, s)
        d.link(sw, f"nic{s}", pcie)
    return ServerTemplate(
        "eflops", f"EFLOPS server: 4 PCIe3 switches with 2 GPUs and one {port.name} NIC each, 2 sockets",
        spec.name, tuple(d.nodes), tuple(d.links),
        "Dong et al., EFLOPS, HPCA 2020 (NIC per PCIe switch, traffic bypasses the root complex); PCIe "
        "generation and CPU link are documented defaults")


def nvswitch_server(gpu: str = "a100-80gb", nvlink: str = "nvlink3", pcie: str = "pcie4-x16",
                    nic: str = "ib-hdr-200g", socket: str = "xgmi2", name: str = "nvswitch-8"
                    ) -> ServerTemplate:
    """DGX-style 8-GPU server (NVIDIA DGX A100 / DGX H100 user guides' block diagrams): GPU i → one
    NVSwitch node (per-GPU NVLink aggregate); PCIe switch i//2 holds GPUs 2k, 2k+1 and NICs 2k, 2k+1;
    NIC i is GPU i's (rail i); 2 CPU sockets with 2 PCIe switches each."""
    spec = get_gpu(gpu)
    nv, pc, sock = get_link(nvlink), get_link(pcie), get_link(socket)
    port = nic_type(nic, "nic")
    d = _Draft()
    _cpus, sws, groups = _pcie_tree(d, pc, sock)
    nvs = d.node("nvswitch0", "nvswitch")
    for sw, group in zip(sws, groups, strict=True):
        for g in group:
            i = int(g[3:])
            d.node(g, "gpu", nic=f"nic{i}")
            d.link(g, nvs, nv)
            d.link(sw, g, pc)
    for sw, group in zip(sws, groups, strict=True):
        for g in group:
            i = int(g[3:])
            d.nic(f"nic{i}", port, i)
            d.link(sw, f"nic{i}", pc)
    return ServerTemplate(
        name, f"8x {spec.name} on one NVSwitch ({nv.name}), 4 {pc.name} switches with 2 GPUs and 2 "
        f"{port.name} NICs each (one per GPU), 2 sockets ({sock.name})", spec.name, tuple(d.nodes),
        tuple(d.links),
        "NVIDIA DGX A100 / DGX H100 system architecture (user guide block diagrams): one NIC per GPU on the "
        "GPU's PCIe switch; the NVSwitch chips merged into one node")


def single_gpu_server(gpu: str = "v100", nic: str = "eth-100g", pcie: str = "pcie3-x16") -> ServerTemplate:
    """One GPU and one NIC on a PCIe switch: the server of a GPU-level network (each GPU its own host)."""
    spec = get_gpu(gpu)
    port = nic_type(nic, "nic")
    pc = get_link(pcie)
    d = _Draft()
    d.node("pcie0", "pcie")
    d.node("gpu0", "gpu", nic="nic0")
    d.nic("nic0", port, 0)
    d.link("pcie0", "gpu0", pc)
    d.link("pcie0", "nic0", pc)
    return ServerTemplate("single-gpu", f"1 {spec.name} and 1 {port.name} NIC on a {pc.name} switch",
                          spec.name, tuple(d.nodes), tuple(d.links), "topotrain default (GPU-level networks)")


#: Registered server templates by lower-case name.
SERVERS: dict[str, ServerTemplate] = {
    t.name: t for t in (
        pcie_shared_nic(),
        eflops_server(),
        nvswitch_server(),
        nvswitch_server("h100", "nvlink4", "pcie5-x16", "ib-ndr-400g", "upi2", name="dgx-h100"),
        single_gpu_server(),
    )
}

#: Alternative names → template name.
SERVER_ALIASES: dict[str, str] = {"dgx-a100": "nvswitch-8", "shared-nic": "pcie-shared-nic"}


def get_server(name: str | ServerTemplate, field: str = "server") -> ServerTemplate:
    """The template called ``name`` (case-insensitive, aliases allowed); a ServerTemplate passes through."""
    if isinstance(name, ServerTemplate):
        return name
    key = name.strip().lower() if isinstance(name, str) else ""
    key = SERVER_ALIASES.get(key, key)
    if key not in SERVERS:
        raise ConfigError(field, f"unknown server template {name!r}",
                          "known: " + ", ".join(sorted(SERVERS)) + "; or define one under servers:")
    return SERVERS[key]


def register_server(template: ServerTemplate, *, replace: bool = False) -> ServerTemplate:
    """Add a user template. Identical re-registration is a no-op; a different one under a taken name
    raises ConfigError unless ``replace`` is true."""
    if not isinstance(template, ServerTemplate):
        raise ConfigError("server", f"expected a ServerTemplate, got {type(template).__name__}",
                          "build one with server_from_dict")
    key = template.name.strip().lower()
    old = SERVERS.get(key)
    if ((old is not None and old != template) or key in SERVER_ALIASES) and not replace:
        raise ConfigError("server", f"server template {template.name!r} is already in the catalog",
                          "choose another name or pass replace=True")
    SERVERS[key] = template
    return template


def server_to_dict(template: ServerTemplate) -> dict[str, Any]:
    """The inverse of :func:`topotrain.scenario.catalog.server_from_dict`: bandwidths and latencies exact,
    with their SI unit."""
    nodes: list[dict[str, Any]] = []
    for nd in template.nodes:
        out: dict[str, Any] = {"name": nd.local_name, "kind": nd.kind}
        for k, v in nd.attrs.items():
            if k == "bandwidth_bytes_per_s":
                out["bandwidth"] = f"{float(v)!r}B/s"
            elif k == "latency_s":
                out["latency"] = f"{float(v)!r}s"
            else:
                out[k] = v
        nodes.append(out)
    links = [{"a": lk.a, "b": lk.b, "bandwidth": f"{float(lk.bandwidth_bytes_per_s)!r}B/s",
              "latency": f"{float(lk.latency_s)!r}s", "kind": lk.kind} for lk in template.links]
    return {"name": template.name, "gpu": template.gpu, "description": template.description,
            "source": template.source, "nodes": nodes, "links": links}


def server_names() -> list[str]:
    """Names of the registered templates, sorted."""
    return sorted(SERVERS)
