"""Cluster networks: builders that attach the servers' NICs to a network of switches.

Every builder has the signature ::

    build_x(topo, groups, /, *, link_bandwidth_bytes_per_s, link_latency_s=1e-6, nic_latency_s=1e-6, **params)

``groups[i]`` lists the NIC node names of server ``i`` in order; the *endpoints* are all NICs in that
order (server 0's NICs, then server 1's, ...). A builder adds switch nodes (kind ``switch``, no server,
names prefixed ``sw/``) and links to ``topo``:

* NIC–switch links (kind ``"nic-switch"``) at the NIC's ``bandwidth_bytes_per_s`` attribute (else
  ``link_bandwidth_bytes_per_s``) with latency ``nic_latency_s``;
* switch–switch links (kind ``"switch-switch"``) at ``link_bandwidth_bytes_per_s`` (times the number
  of parallel cables where a builder bundles several, as the Topology holds one link per node pair) with
  latency ``link_latency_s``.

``groups`` is positional-only so that a parameter may be called ``groups`` (the dragonfly's group count).
Unknown or bad parameters raise :class:`~topotrain.util.errors.ConfigError` with the field
``"<network>.<param>"``; :func:`build_network` renames it to ``"<field>.<param>"``. Omitted sizes are
derived as the smallest that fits the endpoints.

What later code needs goes into ``topo.meta``: ``"network"`` (the builder's name), ``"network_params"``
(every parameter, derived ones included), ``"nic_switch"`` (NIC name → the switch it is attached to) and
a per-network entry (``"bigraph"``, ``"fat_tree"``, ``"leaf_spine"``, ``"rail_optimized"``, ``"torus"``,
``"ring"``, ``"dragonfly"``, ``"single_switch"``).

A builder adds the network to a topology that is still being built (its servers are already there) and
leaves it open; whoever completes the cluster freezes it (:meth:`~topotrain.topology.graph.Topology.validate`
does), after which nothing, the builders included, may change it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError, did_you_mean
from topotrain.util.limits import MAX_GPUS
from topotrain.util.units import parse_bandwidth, parse_time

NIC_LINK_KIND = "nic-switch"
FABRIC_LINK_KIND = "switch-switch"
SWITCH_PREFIX = "sw/"

#: BiGraph switch radix when neither ``switches`` nor ``radix`` is given (a common 32-port switch).
DEFAULT_BIGRAPH_RADIX = 32
#: Leaf-spine endpoints per leaf when neither ``leaves`` nor ``endpoints_per_leaf`` is given.
DEFAULT_ENDPOINTS_PER_LEAF = 32


class NetworkBuilder(Protocol):
    def __call__(self, topo: Topology, groups: Sequence[Sequence[str]], /, *,
                 link_bandwidth_bytes_per_s: float, link_latency_s: float = 1e-6,
                 nic_latency_s: float = 1e-6, **params: Any) -> None: ...


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: Most switches one network may have: 4 per GPU at the schema's limit (a full 65,536-GPU fat-tree has 5,120).
MAX_SWITCHES = 4 * MAX_GPUS
#: Most switch-to-switch links one network may have: 16 per GPU at the schema's limit (that fat-tree: 131,072).
MAX_FABRIC_LINKS = 16 * MAX_GPUS


class _Net:
    """Shared checks and helpers of one builder call."""

    def __init__(self, name: str, topo: Topology, groups: Sequence[Sequence[str]], link_bw: float,
                 link_lat: float, nic_lat: float, params: Mapping[str, Any], allowed: Sequence[str]) -> None:
        self.name = name
        self.topo = topo
        self.params = dict(params)
        for key in self.params:
            if key not in allowed:
                fix = f"use one of {', '.join(allowed)}" if allowed else f"{name} takes no parameters"
                raise self.err(str(key), "unknown parameter", fix)
        if isinstance(link_bw, bool) or not isinstance(link_bw, int | float) or not (
                math.isfinite(link_bw) and link_bw > 0):
            raise self.err("link_bandwidth", f"must be a positive number of bytes/s, got {link_bw!r}",
                           "give e.g. 12.5e9 (100 Gb/s)")
        for what, v in (("link_latency", link_lat), ("nic_latency", nic_lat)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v >= 0):
                raise self.err(what, f"must be a non-negative number of seconds, got {v!r}", "give e.g. 1e-6")
        self.link_bw = float(link_bw)
        self.link_lat = float(link_lat)
        self.nic_lat = float(nic_lat)
        if isinstance(groups, str) or not isinstance(groups, Sequence):
            raise self.err("groups", "must be a list (one per server) of lists of NIC names",
                           "pass e.g. [['s0/nic0'], ['s1/nic0']]")
        self.groups: list[list[str]] = []
        self.endpoints: list[str] = []
        self.server_of: list[int] = []
        seen: set[str] = set()
        for i, grp in enumerate(groups):
            if isinstance(grp, str) or not isinstance(grp, Sequence):
                raise self.err(f"groups[{i}]", f"must be a list of NIC names, got {grp!r}",
                               "pass one list of NIC names per server")
            names = [str(n) for n in grp]
            for j, nic in enumerate(names):
                node = topo.nodes.get(nic)
                if node is None:
                    raise self.err(f"groups[{i}][{j}]", f"NIC {nic!r} is not in topology {topo.name!r}",
                                   "instantiate the servers before building the network")
                if node.kind is not NodeKind.NIC:
                    raise self.err(f"groups[{i}][{j}]", f"{nic!r} is a {node.kind.value}, not a NIC",
                                   "attach only NIC nodes to the network")
                if nic in seen:
                    raise self.err(f"groups[{i}][{j}]", f"NIC {nic!r} is listed twice", "list each NIC once")
                seen.add(nic)
                self.endpoints.append(nic)
                self.server_of.append(i)
            self.groups.append(names)
        if not self.endpoints:
            raise self.err("groups", "no NIC to attach", "give the servers at least one NIC")
        self.nic_switch: dict[str, str] = {}
        self.resolved: dict[str, Any] = {}

    # ---- errors and parameters --------------------------------------------------------------------
    def err(self, param: str, message: str, fix: str = "") -> ConfigError:
        return ConfigError(f"{self.name}.{param}", message, fix)

    def int_param(self, key: str, *, minimum: int = 1, even: bool = False) -> int | None:
        v = self.params.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise self.err(key, f"must be a whole number, got {v!r}", f"give an integer >= {minimum}")
        if v < minimum:
            raise self.err(key, f"must be >= {minimum}, got {v}", f"give an integer >= {minimum}")
        if even and v % 2:
            raise self.err(key, f"must be even, got {v}", f"use {v + 1}")
        return int(v)

    def ratio_param(self, key: str, default: float) -> float:
        v = self.params.get(key, default)
        if isinstance(v, str):
            s = v.strip()
            try:
                if ":" in s:
                    num, den = s.split(":", 1)
                    v = float(num) / float(den)
                else:
                    v = float(s)
            except (ValueError, ZeroDivisionError):
                raise self.err(key, f"cannot read ratio {v!r}", "write e.g. 2, 2.0 or '2:1'") from None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise self.err(key, f"must be a positive ratio, got {v!r}", "write e.g. 1 (non-blocking) or 2")
        return float(v)

    def check_size(self, param: str, switches: int, fabric_links: int) -> None:
        """Refuse, before anything is built, a network of more than :data:`MAX_SWITCHES` switches or
        :data:`MAX_FABRIC_LINKS` switch-to-switch links (``param``: the parameter that sets the size)."""
        if switches > MAX_SWITCHES or fabric_links > MAX_FABRIC_LINKS:
            raise self.err(param, f"would build {switches:,} switches and {fabric_links:,} switch-to-switch "
                           f"links, beyond the limit of {MAX_SWITCHES:,} switches and {MAX_FABRIC_LINKS:,} links",
                           f"lower {param} (or leave it out: the default fits the servers)")

    # ---- building ---------------------------------------------------------------------------------
    def nic_bw(self, nic: str) -> float:
        bw = self.topo.nodes[nic].attrs.get("bandwidth_bytes_per_s")
        return float(bw) if bw else self.link_bw

    def port_bw(self) -> float:
        """Speed of a switch's down port: the fastest NIC link (all leaves are built alike)."""
        return max(self.nic_bw(n) for n in self.endpoints)

    def switch(self, name: str, tier: int | None = None, role: str = "") -> str:
        """A switch node; ``tier`` (1 = the servers' own switches, 2 the next, ...) and ``role`` (``edge``,
        ``spine``, ...) are the builder's own account of where it sits (the drawing's rows)."""
        attrs: dict[str, Any] = {} if tier is None else {"tier": tier, "role": role}
        return self.topo.add_node(SWITCH_PREFIX + name, NodeKind.SWITCH, **attrs)

    def attach(self, nic: str, sw: str) -> None:
        self.topo.add_link(nic, sw, self.nic_bw(nic), self.nic_lat, NIC_LINK_KIND)
        self.nic_switch[nic] = sw

    def fabric(self, a: str, b: str, bandwidth_bytes_per_s: float | None = None) -> None:
        bw = self.link_bw if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
        self.topo.add_link(a, b, bw, self.link_lat, FABRIC_LINK_KIND)

    def finish(self, facts: dict[str, Any]) -> None:
        meta = self.topo.meta
        meta["network"] = self.name
        meta["network_params"] = {"link_bandwidth_bytes_per_s": self.link_bw, "link_latency_s": self.link_lat,
                                  "nic_latency_s": self.nic_lat, **self.resolved}
        meta["nic_switch"] = dict(self.nic_switch)
        meta[self.name.replace("-", "_")] = facts


# ---- single switch --------------------------------------------------------------------------------
def build_single_switch(topo: Topology, groups: Sequence[Sequence[str]], /, *,
                        link_bandwidth_bytes_per_s: float, link_latency_s: float = 1e-6,
                        nic_latency_s: float = 1e-6, **params: Any) -> None:
    """One switch with every NIC on it (an ideal crossbar; the NIC links are the only bottleneck)."""
    net = _Net("single-switch", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s,
               params, ())
    sw = net.switch("switch0", 1, "switch")
    for nic in net.endpoints:
        net.attach(nic, sw)
    net.finish({"switch": sw})


# ---- BiGraph (EFLOPS) -----------------------------------------------------------------------------
def build_bigraph(topo: Topology, groups: Sequence[Sequence[str]], /, *, link_bandwidth_bytes_per_s: float,
                  link_latency_s: float = 1e-6, nic_latency_s: float = 1e-6, **params: Any) -> None:
    """BiGraph of EFLOPS (Dong et al., HPCA 2020).

    N switches in two parts (``sw/upper{i}``, ``sw/lower{i}``, N/2 each); every upper switch is linked to
    every lower switch, none inside a part: (N/2)² inter-switch links. Radix-k switches use k/2 ports
    down (to NICs) and k/2 up, so N <= k and at most N·k/2 endpoints; the full-size network has k
    switches and k²/2 endpoints.

    Parameters: ``switches`` (N, even), ``radix`` (k, even). Sizing: with neither, k =
    ``DEFAULT_BIGRAPH_RADIX`` (32) and N is the smallest even number with N·k/2 >= endpoints; with only
    ``radix``, the same; with only ``switches``, k = N (the paper's full-size arrangement: one link per
    switch pair).

    Attachment rule: endpoint e (global NIC order) goes to part e mod 2 (0 = upper) and to switch
    (e // 2) mod (N/2) of that part. So consecutive NICs of a server alternate parts, every run of N
    consecutive endpoints puts one on every switch (the grouping HDRM's rank mapping expects), and the
    switches' endpoint counts differ by at most one. ``attach: contiguous`` instead fills the switches
    one after the other (upper0, lower0, upper1, ...) with consecutive endpoints — the numbering of a
    cluster wired rack by rack, and the baseline EFLOPS' rank mapping improves on.

    Parallel cables: where N < k a switch has more up ports than peers; it cables
    ``min((k/2) // (N/2), ceil(M / (N/2)))`` ports (at least 1) to each peer, M the most endpoints on one
    switch — as many as it needs to be non-blocking for cross-part traffic — and the Topology holds them
    as one link of that many times ``link_bandwidth_bytes_per_s`` (``links_per_switch_pair`` in meta).
    """
    net = _Net("bigraph", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s, params,
               ("switches", "radix", "attach"))
    e_count = len(net.endpoints)
    attach = str(net.params.get("attach", "interleaved"))
    if attach not in ("interleaved", "contiguous"):
        raise net.err("attach", f"unknown attachment {attach!r}", "use interleaved or contiguous")
    radix = net.int_param("radix", minimum=2, even=True)
    n = net.int_param("switches", minimum=2, even=True)
    if n is None:
        k = radix if radix is not None else DEFAULT_BIGRAPH_RADIX
        n = max(2, 2 * _ceil_div(e_count, k))
        if n > k:
            k_min = 2
            while k_min * k_min // 2 < e_count:
                k_min += 2
            raise net.err("radix", f"{e_count} endpoints do not fit a BiGraph of radix-{k} switches "
                          f"(at most k²/2 = {k * k // 2})", f"set radix >= {k_min}, or use another network")
    else:
        k = radix if radix is not None else n
        if n > k:
            raise net.err("switches", f"{n} switches need radix >= {n} (N/2 up ports each), radix is {k}",
                          f"lower switches to <= {k} or raise radix")
        if e_count > n * k // 2:
            need = 2 * _ceil_div(e_count, k)
            fix = (f"raise switches to >= {need}" if need <= k and radix is not None else
                   f"raise switches to >= {_smallest_full_bigraph(e_count)} or give a larger radix")
            raise net.err("switches", f"too many endpoints: {e_count} > N·k/2 = {n * k // 2} down ports "
                          f"({n} switches of radix {k})", fix)
    net.check_size("switches", n, (n // 2) ** 2)
    half = n // 2
    upper = [net.switch(f"upper{i}") for i in range(half)]
    lower = [net.switch(f"lower{i}") for i in range(half)]
    m = _ceil_div(_ceil_div(e_count, 2), half)
    for e, nic in enumerate(net.endpoints):
        if attach == "contiguous":  # fill upper0, lower0, upper1, ... with consecutive endpoints
            sw = e // m
            net.attach(nic, (upper if sw % 2 == 0 else lower)[(sw // 2) % half])
        else:
            part = upper if e % 2 == 0 else lower
            net.attach(nic, part[(e // 2) % half])
    trunk = max(1, min((k // 2) // half, _ceil_div(m, half)))
    for u in upper:
        for lo in lower:
            net.fabric(u, lo, trunk * net.link_bw)
    net.resolved = {"switches": n, "radix": k}
    net.finish({"upper": upper, "lower": lower, "radix": k, "endpoints_per_switch": m,
                "links_per_switch_pair": trunk})


def _smallest_full_bigraph(e_count: int) -> int:
    n = 2
    while n * n // 2 < e_count:
        n += 2
    return n


# ---- fat-tree -------------------------------------------------------------------------------------
def build_fat_tree(topo: Topology, groups: Sequence[Sequence[str]], /, *, link_bandwidth_bytes_per_s: float,
                   link_latency_s: float = 1e-6, nic_latency_s: float = 1e-6, **params: Any) -> None:
    """k-ary 3-tier fat-tree (Al-Fares, Loukissas, Vahdat, SIGCOMM 2008), built as a partly filled one is
    bought and cabled.

    A full tree has k pods of k/2 edge (``sw/pod{p}/edge{i}``, tier 1) and k/2 aggregation
    (``sw/pod{p}/agg{i}``, tier 2) switches, edge and aggregation fully linked inside a pod, and (k/2)² core
    switches (``sw/core{c}``, tier 3), aggregation switch i of every pod linked to cores
    i·k/2 .. i·k/2 + k/2 − 1: k/2 endpoints per edge switch, k³/4 in all, 5k²/4 switches. Endpoints fill
    edge switches in order (endpoint e → edge switch e // (k/2)). Parameter ``k`` (even; default the
    smallest that fits).

    With fewer than k³/4 endpoints only what carries traffic is built (the *populated-pod rule*): the pods
    that hold an endpoint (⌈E / (k²/4)⌉ of them), each with its k/2 aggregation switches (every edge switch
    keeps its k/2 uplinks) and the edge switches that hold an endpoint; the (k/2)² core switches when two
    or more pods are built (each populated pod keeps its k²/4 core uplinks: full bisection between the
    populated pods), none for one pod. Every switch left out lies on no shortest path between two
    endpoints (a path through another pod or another edge switch is longer), so the routes, and every
    prediction, are those of the whole tree; only the price, the power and the picture change.
    """
    net = _Net("fat-tree", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s, params,
               ("k",))
    e_count = len(net.endpoints)
    k = net.int_param("k", minimum=2, even=True)
    if k is None:
        k = 2
        while k**3 // 4 < e_count:
            k += 2
    elif e_count > k**3 // 4:
        k_min = 2
        while k_min**3 // 4 < e_count:
            k_min += 2
        raise net.err("k", f"too many endpoints: {e_count} > k³/4 = {k**3 // 4} for k = {k}",
                      f"raise k to >= {k_min}")
    net.check_size("k", 5 * k * k // 4, k**3 // 2)
    half = k // 2
    n_edges = _ceil_div(e_count, half)  # edge switches that hold an endpoint
    n_pods = _ceil_div(n_edges, half)
    core = [net.switch(f"core{c}", 3, "core") for c in range(half * half)] if n_pods > 1 else []
    edges: list[str] = []
    aggs_all: list[str] = []
    for p in range(n_pods):
        edge = [net.switch(f"pod{p}/edge{i}", 1, "edge") for i in range(min(half, n_edges - p * half))]
        agg = [net.switch(f"pod{p}/agg{i}", 2, "aggregation") for i in range(half)]
        for ed in edge:
            for ag in agg:
                net.fabric(ed, ag)
        for i, ag in enumerate(agg):
            for j in range(half if core else 0):
                net.fabric(ag, core[i * half + j])
        edges += edge
        aggs_all += agg
    for e, nic in enumerate(net.endpoints):
        net.attach(nic, edges[e // half])
    net.resolved = {"k": k}
    net.finish({"k": k, "pods": n_pods, "edge": edges, "aggregation": aggs_all, "core": core,
                "full_tree_switches": 5 * k * k // 4})


# ---- leaf-spine and rail-optimized ----------------------------------------------------------------
def _two_tier(net: _Net, leaves: list[str], members: list[list[str]], spines: int | None,
              oversubscription: float, ports_per_leaf: int) -> tuple[list[str], float]:
    """Attach members to leaves and join every leaf to every spine.

    Each leaf's uplink bandwidth is its downlink bandwidth (``ports_per_leaf`` ports at the fastest NIC's
    speed) divided by ``oversubscription``, split equally over its links to the spines. Default spine
    count: ceil(ports_per_leaf / oversubscription) (as many spines as up ports of the down-port speed).
    """
    n_spines = spines if spines is not None else max(1, math.ceil(ports_per_leaf / oversubscription - 1e-9))
    uplink_bw = ports_per_leaf * net.port_bw() / oversubscription / n_spines
    spine_names = [net.switch(f"spine{j}", 2, "spine") for j in range(n_spines)]
    for leaf, nics in zip(leaves, members, strict=True):
        for nic in nics:
            net.attach(nic, leaf)
    for leaf in leaves:
        for sp in spine_names:
            net.fabric(leaf, sp, uplink_bw)
    return spine_names, uplink_bw


def build_leaf_spine(topo: Topology, groups: Sequence[Sequence[str]], /, *, link_bandwidth_bytes_per_s: float,
                     link_latency_s: float = 1e-6, nic_latency_s: float = 1e-6, **params: Any) -> None:
    """Two-tier leaf-spine (folded Clos; Alizadeh & Edsall, "On the Data Path Performance of Leaf-Spine
    Datacenter Fabrics", HOTI 2013).

    Parameters: ``leaves``, ``spines``, ``endpoints_per_leaf`` (P), ``oversubscription`` (down:up
    bandwidth ratio, default 1.0; a number or ``"3:1"``). Endpoints fill leaves in order (endpoint e →
    leaf e // P), so a server's NICs share a leaf. A leaf's downlink bandwidth is P × the fastest NIC's
    speed (every leaf alike, even a partly filled one); its uplink bandwidth is that / oversubscription,
    split equally over one link to every spine. Defaults: P = ceil(endpoints / leaves) if ``leaves`` is
    given, else min(endpoints, 32); leaves = ceil(endpoints / P); spines = ceil(P / oversubscription).
    ``link_bandwidth_bytes_per_s`` is only the speed of NICs that do not state theirs.
    """
    net = _Net("leaf-spine", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s, params,
               ("leaves", "spines", "endpoints_per_leaf", "oversubscription"))
    e_count = len(net.endpoints)
    n_leaves = net.int_param("leaves")
    n_spines = net.int_param("spines")
    per_leaf = net.int_param("endpoints_per_leaf")
    ratio = net.ratio_param("oversubscription", 1.0)
    if per_leaf is None:
        per_leaf = _ceil_div(e_count, n_leaves) if n_leaves is not None else min(e_count,
                                                                                  DEFAULT_ENDPOINTS_PER_LEAF)
    if n_leaves is None:
        n_leaves = _ceil_div(e_count, per_leaf)
    if e_count > n_leaves * per_leaf:
        raise net.err("leaves", f"too many endpoints: {e_count} > leaves × endpoints_per_leaf = "
                      f"{n_leaves} × {per_leaf}",
                      f"raise leaves to >= {_ceil_div(e_count, per_leaf)} or endpoints_per_leaf")
    spines_est = n_spines if n_spines is not None else max(1, math.ceil(per_leaf / ratio - 1e-9))
    net.check_size("leaves" if n_spines is None else "spines", n_leaves + spines_est, n_leaves * spines_est)
    leaves = [net.switch(f"leaf{i}", 1, "leaf") for i in range(n_leaves)]
    members = [net.endpoints[i * per_leaf:(i + 1) * per_leaf] for i in range(n_leaves)]
    spines, uplink_bw = _two_tier(net, leaves, members, n_spines, ratio, per_leaf)
    net.resolved = {"leaves": n_leaves, "spines": len(spines), "endpoints_per_leaf": per_leaf,
                    "oversubscription": ratio}
    net.finish({"leaves": leaves, "spines": spines, "endpoints_per_leaf": per_leaf, "oversubscription": ratio,
                "uplink_bandwidth_bytes_per_s": uplink_bw})


def build_rail_optimized(topo: Topology, groups: Sequence[Sequence[str]], /, *,
                         link_bandwidth_bytes_per_s: float, link_latency_s: float = 1e-6,
                         nic_latency_s: float = 1e-6, **params: Any) -> None:
    """Rail-optimized network (NVIDIA DGX SuperPOD reference architecture; Wang et al., "Rail-only",
    HOTI 2024, describe the same rail/spine structure).

    Servers form blocks of ``servers_per_block`` (default: all in one block). In block b, the NIC with
    ``rail`` attribute r (else its index in the server) of every server goes to rail switch
    ``sw/block{b}/rail{r}``, so same-rail NICs of a block meet at one switch. All rail switches of all
    blocks are leaves of one spine layer (``sw/spine{j}``), carrying cross-rail and cross-block traffic,
    sized as in :func:`build_leaf_spine`: a rail switch's uplink bandwidth is (its port count × the
    fastest NIC's speed) / ``oversubscription`` (default 1.0: full bisection), split over every spine;
    ``spines`` defaults to ceil(ports / oversubscription).
    """
    net = _Net("rail-optimized", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s,
               params, ("servers_per_block", "spines", "oversubscription"))
    n_servers = len(net.groups)
    per_block = net.int_param("servers_per_block") or n_servers
    n_spines = net.int_param("spines")
    ratio = net.ratio_param("oversubscription", 1.0)
    rails_of: list[list[int]] = []
    for i, grp in enumerate(net.groups):
        rails = []
        for j, nic in enumerate(grp):
            r = topo.nodes[nic].attrs.get("rail", j)
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise net.err(f"groups[{i}][{j}]", f"NIC {nic!r} has rail {r!r}",
                              "give NICs a non-negative integer rail attribute")
            rails.append(r)
        rails_of.append(rails)
    n_rails = 1 + max((r for rails in rails_of for r in rails), default=0)
    n_blocks = _ceil_div(n_servers, per_block)
    if n_rails > MAX_SWITCHES:
        raise net.err("groups", f"a NIC's rail is {n_rails - 1:,}, beyond the limit of {MAX_SWITCHES:,} rails",
                      "number the rails 0, 1, 2, ...")
    if n_spines is not None:
        net.check_size("spines", n_blocks * n_rails + n_spines, n_blocks * n_rails * n_spines)
    leaves: list[str] = []
    members: list[list[str]] = []
    index: dict[tuple[int, int], int] = {}
    for b in range(n_blocks):
        for r in range(n_rails):
            index[(b, r)] = len(leaves)
            leaves.append(net.switch(f"block{b}/rail{r}", 1, "rail"))
            members.append([])
    for i, grp in enumerate(net.groups):
        for nic, r in zip(grp, rails_of[i], strict=True):
            members[index[(i // per_block, r)]].append(nic)
    ports = max(1, max(len(m) for m in members))
    spines, uplink_bw = _two_tier(net, leaves, members, n_spines, ratio, ports)
    net.resolved = {"servers_per_block": per_block, "spines": len(spines), "oversubscription": ratio}
    net.finish({"rails": n_rails, "blocks": n_blocks, "servers_per_block": per_block,
                "rail_switches": [[leaves[index[(b, r)]] for r in range(n_rails)] for b in range(n_blocks)],
                "spines": spines, "uplink_bandwidth_bytes_per_s": uplink_bw})


# ---- torus and ring -------------------------------------------------------------------------------
def _torus_core(net: _Net, dims: list[int], per_vertex: int) -> dict[str, Any]:
    """Routers ``sw/router{c0}.{c1}...`` at every vertex (row-major), wrap-around links in each dimension.

    A dimension of size 2 would need two parallel links between the same pair (the +1 and the −1
    neighbour coincide): it gets one link of twice ``link_bandwidth_bytes_per_s``. A dimension of size
    1 has no links. Server i's NICs all attach to vertex i // per_vertex.
    """
    n_vertices = math.prod(dims)
    coords: list[tuple[int, ...]] = []
    for v in range(n_vertices):
        digits: list[int] = []
        rest = v
        for d in reversed(dims):
            digits.append(rest % d)
            rest //= d
        coords.append(tuple(reversed(digits)))
    names = [net.switch("router" + ".".join(str(x) for x in c)) for c in coords]
    vertex = {c: i for i, c in enumerate(coords)}
    for i, c in enumerate(coords):
        for d, size in enumerate(dims):
            if size == 1 or (size == 2 and c[d] == 1):
                continue
            nb = list(c)
            nb[d] = (c[d] + 1) % size
            net.fabric(names[i], names[vertex[tuple(nb)]], net.link_bw * (2.0 if size == 2 else 1.0))
    for nic, s in zip(net.endpoints, net.server_of, strict=True):
        net.attach(nic, names[s // per_vertex])
    return {"dims": list(dims), "servers_per_vertex": per_vertex, "switches": names,
            "vertex_of_switch": {names[i]: list(c) for i, c in enumerate(coords)},
            "vertex_of_nic": {nic: list(coords[net.server_of[e] // per_vertex])
                              for e, nic in enumerate(net.endpoints)}}


def _near_square(n: int) -> list[int]:
    a = max(2, math.isqrt(n))
    return [a, max(2, _ceil_div(n, a))]


def build_torus(topo: Topology, groups: Sequence[Sequence[str]], /, *, link_bandwidth_bytes_per_s: float,
                link_latency_s: float = 1e-6, nic_latency_s: float = 1e-6, **params: Any) -> None:
    """2-D or 3-D torus of routers (as in Blue Gene/L, Adiga et al. 2005, and TPU v4's ICI torus).

    Parameters: ``dims`` (list of 2 or 3 integers >= 2, e.g. [4, 4]) and ``servers_per_vertex``.
    Servers attach to vertices in order (server i → vertex i // servers_per_vertex, vertices numbered
    row-major). Defaults: servers_per_vertex = ceil(servers / vertices) (1 when dims is omitted too);
    dims = [a, ceil(V / a)] with a = max(2, floor(sqrt(V))), V = ceil(servers / servers_per_vertex).
    A dimension of size 2 gets one link of double bandwidth (see :func:`_torus_core`).
    ``topo.meta["torus"]`` holds ``dims``, ``vertex_of_switch`` (router → coordinates), ``switches``
    (row-major), ``servers_per_vertex`` and ``vertex_of_nic``.
    """
    net = _Net("torus", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s, params,
               ("dims", "servers_per_vertex"))
    n_servers = len(net.groups)
    per_vertex = net.int_param("servers_per_vertex")
    raw = net.params.get("dims")
    if raw is None:
        dims = _near_square(_ceil_div(n_servers, per_vertex or 1))
    else:
        if isinstance(raw, str) or not isinstance(raw, Sequence) or len(raw) not in (2, 3):
            raise net.err("dims", f"must be a list of 2 or 3 integers, got {raw!r}",
                          "write e.g. [4, 4] or [4, 4, 2]")
        dims = []
        for i, d in enumerate(raw):
            if isinstance(d, bool) or not isinstance(d, int) or d < 2:
                raise net.err(f"dims[{i}]", f"must be an integer >= 2, got {d!r}", "write e.g. [4, 4]")
            dims.append(int(d))
    n_vertices = math.prod(dims)
    net.check_size("dims", n_vertices, n_vertices * len(dims))
    if per_vertex is None:
        per_vertex = max(1, _ceil_div(n_servers, n_vertices))
    elif n_servers > n_vertices * per_vertex:
        raise net.err("servers_per_vertex", f"too many servers: {n_servers} > {n_vertices} vertices × "
                      f"{per_vertex}",
                      f"raise servers_per_vertex to {_ceil_div(n_servers, n_vertices)} or dims")
    facts = _torus_core(net, dims, per_vertex)
    net.resolved = {"dims": list(dims), "servers_per_vertex": per_vertex}
    net.finish(facts)


def build_ring(topo: Topology, groups: Sequence[Sequence[str]], /, *, link_bandwidth_bytes_per_s: float,
               link_latency_s: float = 1e-6, nic_latency_s: float = 1e-6, **params: Any) -> None:
    """A ring of routers: the 1-D torus of :func:`build_torus`.

    Parameters: ``routers`` (default: one per server, ceil(servers / servers_per_router)) and
    ``servers_per_router`` (default ceil(servers / routers)). Two routers share one double-bandwidth
    link. Records ``topo.meta["ring"]`` and, for torus-aware code, the same facts as
    ``topo.meta["torus"]`` (``dims`` = [routers]).
    """
    net = _Net("ring", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s, params,
               ("routers", "servers_per_router"))
    n_servers = len(net.groups)
    routers = net.int_param("routers")
    per_router = net.int_param("servers_per_router")
    if routers is None:
        routers = _ceil_div(n_servers, per_router or 1)
    if per_router is None:
        per_router = max(1, _ceil_div(n_servers, routers))
    elif n_servers > routers * per_router:
        raise net.err("routers", f"too many servers: {n_servers} > routers × servers_per_router = "
                      f"{routers} × {per_router}", f"raise routers to >= {_ceil_div(n_servers, per_router)}")
    net.check_size("routers", routers, routers)
    facts = _torus_core(net, [routers], per_router)
    net.resolved = {"routers": routers, "servers_per_router": per_router}
    net.finish(facts)
    topo.meta["torus"] = facts


# ---- dragonfly ------------------------------------------------------------------------------------
def build_dragonfly(topo: Topology, groups: Sequence[Sequence[str]], /, *, link_bandwidth_bytes_per_s: float,
                    link_latency_s: float = 1e-6, nic_latency_s: float = 1e-6, **params: Any) -> None:
    """Dragonfly (Kim, Dally, Scott, Abts, ISCA 2008).

    ``groups`` g groups of ``routers_per_group`` a routers (``sw/g{i}/r{j}``), complete graph inside a
    group; every router has ``global_links_per_router`` h global ports and ``endpoints_per_router`` p
    endpoints (endpoint e → router e // p, groups filled in order). At most g = a·h + 1 groups.

    Global links, "consecutive" arrangement (Hastings et al., "Comparing global link arrangements for
    Dragonfly networks", IEEE Cluster 2015): every pair of groups gets m = floor(a·h / (g − 1)) links
    (>= 1, so all groups are directly connected); group i numbers its global slots by peer offset
    d = (j − i) mod g, slot (d − 1)·m + c for the c-th link to group j, and slot s sits on router s // h.
    With g = a·h + 1 this is the canonical arrangement, one link per group pair. Cables between the same
    two routers are one link of their summed bandwidth. Spare ports (when a·h is not a multiple of g − 1)
    stay unused.

    Defaults, balanced as Kim et al. advise (a = 2p = 2h): p = a/2 if a is given, else h if h is given,
    else the smallest p whose largest network (g = 2p² + 1) holds the endpoints; a = 2p; h = a/2;
    g = ceil(endpoints / (a·p)).
    """
    net = _Net("dragonfly", topo, groups, link_bandwidth_bytes_per_s, link_latency_s, nic_latency_s, params,
               ("groups", "routers_per_group", "global_links_per_router", "endpoints_per_router"))
    e_count = len(net.endpoints)
    g_in = net.int_param("groups")
    a_in = net.int_param("routers_per_group")
    h_in = net.int_param("global_links_per_router")
    p_in = net.int_param("endpoints_per_router")
    free = a_in is None and h_in is None and p_in is None
    t = 1
    while True:
        p = p_in if p_in is not None else (max(1, a_in // 2) if a_in is not None else
                                           (h_in if h_in is not None else t))
        a = a_in if a_in is not None else 2 * p
        h = h_in if h_in is not None else max(1, a // 2)
        g = g_in if g_in is not None else max(1, _ceil_div(e_count, a * p))
        fits = g <= a * h + 1 and e_count <= g * a * p
        if fits:
            break
        if not free or t > 4096:
            if g > a * h + 1:
                raise net.err("groups", f"{g} groups cannot all be linked: at most a·h + 1 = {a * h + 1} "
                              f"with {a} routers per group and {h} global links per router",
                              "raise routers_per_group or global_links_per_router, or lower groups")
            raise net.err("groups", f"too many endpoints: {e_count} > groups × routers × endpoints = "
                          f"{g} × {a} × {p}", "raise groups, routers_per_group or endpoints_per_router")
        t += 1
    param = "groups" if g_in is not None else ("routers_per_group" if a_in is not None else "endpoints_per_router")
    net.check_size(param, g * a, g * a * (a - 1) // 2 + g * (g - 1) // 2 * max(1, (a * h) // max(1, g - 1)))
    names = [[net.switch(f"g{i}/r{j}") for j in range(a)] for i in range(g)]
    for grp in names:
        for x in range(a):
            for y in range(x + 1, a):
                net.fabric(grp[x], grp[y])
    m = (a * h) // (g - 1) if g > 1 else 0
    cables: dict[tuple[str, str], int] = {}
    for i in range(g):
        for j in range(i + 1, g):
            d_ij, d_ji = (j - i) % g, (i - j) % g
            for c in range(m):
                key = (names[i][((d_ij - 1) * m + c) // h], names[j][((d_ji - 1) * m + c) // h])
                cables[key] = cables.get(key, 0) + 1
    for (r_a, r_b), count in cables.items():
        net.fabric(r_a, r_b, count * net.link_bw)
    for e, nic in enumerate(net.endpoints):
        r = e // p
        net.attach(nic, names[r // a][r % a])
    net.resolved = {"groups": g, "routers_per_group": a, "global_links_per_router": h,
                    "endpoints_per_router": p}
    net.finish({"groups": g, "routers_per_group": a, "global_links_per_router": h, "endpoints_per_router": p,
                "links_per_group_pair": m, "routers": names})


NETWORKS: dict[str, NetworkBuilder] = {
    "single-switch": build_single_switch,
    "bigraph": build_bigraph,
    "fat-tree": build_fat_tree,
    "leaf-spine": build_leaf_spine,
    "rail-optimized": build_rail_optimized,
    "torus": build_torus,
    "ring": build_ring,
    "dragonfly": build_dragonfly,
}

_COMMON = {
    "link_bandwidth_bytes_per_s": ("link_bandwidth", "bw"),
    "link_latency_s": ("link_latency", "time"),
    "nic_latency_s": ("nic_latency", "time"),
}


def build_network(topo: Topology, name: str, groups: Sequence[Sequence[str]], params: Mapping[str, Any],
                  field: str = "cluster.network") -> None:
    """Build network ``name`` (a key of :data:`NETWORKS`; ``_`` may stand for ``-``) over ``groups``.

    ``params`` holds the builder's parameters and the common ones, each in SI (``link_bandwidth_bytes_per_s``,
    ``link_latency_s``, ``nic_latency_s``) or as a unit string (``link_bandwidth: 100Gbps``,
    ``link_latency: 1us``, ``nic_latency: 1us``). ``link_bandwidth`` defaults to the fastest NIC's speed;
    latencies to 1 us. Errors name ``f"{field}.<param>"``.
    """
    key = str(name).strip().lower().replace("_", "-")
    builder = NETWORKS.get(key)
    if builder is None:
        raise ConfigError(field, f"unknown network {name!r}", did_you_mean(name, list(NETWORKS)))
    p: dict[str, Any] = {}
    for k, v in params.items():
        if not isinstance(k, str):
            raise ConfigError(field, f"parameter name {k!r} is not a string", "write parameter names as text")
        p[k] = v
    common: dict[str, float] = {}
    for si, (short, kind) in _COMMON.items():
        if si in p and short in p:
            raise ConfigError(f"{field}.{short}", f"given twice, as {short} and {si}", "remove one")
        if si in p or short in p:
            raw = p.pop(si) if si in p else p.pop(short)
            f = f"{field}.{si if si in params else short}"
            common[si] = parse_bandwidth(raw, f) if kind == "bw" else parse_time(raw, f)
    if "link_bandwidth_bytes_per_s" not in common:
        bws = []
        for grp in groups:
            for nic in grp:
                node = topo.nodes.get(nic)
                bw = node.attrs.get("bandwidth_bytes_per_s") if node is not None else None
                if bw:
                    bws.append(float(bw))
        if not bws:
            raise ConfigError(f"{field}.link_bandwidth", "is required (no NIC states its bandwidth)",
                              "give e.g. link_bandwidth: 100Gbps")
        common["link_bandwidth_bytes_per_s"] = max(bws)
    try:
        builder(topo, groups, **common, **p)
    except ConfigError as e:
        if e.field == key or e.field.startswith(key + "."):
            raise ConfigError(field + e.field[len(key):], e.message, e.fix) from None
        raise
