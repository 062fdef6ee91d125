"""Topology files: YAML and GraphML in, YAML and GraphML out.

YAML (``.yaml`` / ``.yml``)::

    name: my-cluster            # optional (default: the file's stem)
    message_overhead: 2us       # optional, per point-to-point message
    nodes:
      - {name: g0, kind: gpu, server: s0}          # server optional; transit optional (bool)
      - {name: n0, kind: nic, server: s0, attrs: {bandwidth_bytes_per_s: 12.5e9, rail: 0}}
      - {name: sw, kind: switch}
    links:
      - {a: g0, b: n0, bandwidth: 32GB/s, latency: 0.5us}   # bandwidth: unit string or bytes/s
      - {a: n0, b: sw, bandwidth: 100Gbps, latency: 1us}    # optional: kind, bandwidth_reverse (b→a)
    meta: {...}                 # optional, copied into Topology.meta; {routing: d-mod-k} routes by
                                #   destination (topotrain.topology.routing; default: ecmp)

GraphML (``.graphml``, read with :func:`networkx.read_graphml`): node attributes ``kind`` (required),
``server`` and ``transit`` (optional), any other attribute goes to the node's ``attrs``; edge attributes
``bandwidth`` (unit string or bytes/s), ``latency`` (unit string or seconds; default 0), optional
``kind``, ``bandwidth_reverse`` (the other direction's bandwidth), ``src`` (the end ``bandwidth``
leaves from) and ``index`` (link order); files written by :func:`save_graph` carry ``src`` and ``index``
so that link ids survive a round trip. In a directed
file, a pair of opposite edges is one full-duplex link. Graph attributes ``name``,
``message_overhead_s`` and ``meta_json`` are optional.

A graph file is topotrain's interchange format (:func:`save_graph` writes SI numbers), so a plain number
is read as SI there: bytes/s for a bandwidth, seconds for a latency or the message overhead — unlike a
scenario file, where a bandwidth or time needs its unit. The file's ``message_overhead`` applies to a
cluster built from it unless the scenario's ``cluster.message_overhead`` sets another (then the two
must agree, or the scenario is refused: one value wins, visibly).

Ranks are the GPU nodes in file order. Every problem is a :class:`~topotrain.util.errors.ConfigError` whose
field is the path inside the file (``links[2].bandwidth``) and whose message names the file.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from topotrain.topology.graph import Topology
from topotrain.util import yamlio
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError
from topotrain.util.gc_pause import collector_paused
from topotrain.util.units import parse_bandwidth, parse_time

if TYPE_CHECKING:
    import networkx as nx

_YAML_SUFFIXES = (".yaml", ".yml")
_GRAPHML_SUFFIXES = (".graphml",)
_TOP_KEYS = ("name", "message_overhead", "nodes", "links", "meta")
_NODE_KEYS = ("name", "kind", "server", "transit", "attrs")
_LINK_KEYS = ("a", "b", "bandwidth", "latency", "kind", "bandwidth_reverse")
_RESERVED_NODE_ATTRS = ("name", "kind", "server", "transit")


def _in_file(e: ConfigError, path: Path) -> ConfigError:
    return ConfigError(e.field, f"{path.name}: {e.message}", e.fix)


# ---- loading --------------------------------------------------------------------------------------
def load_graph(path: str | Path, *, field: str = "graph") -> Topology:
    """Read a topology from YAML or GraphML (chosen by suffix) and check it is connected and has GPUs.

    ``field`` names the file in errors about the file itself (missing, unreadable, malformed). A
    per-message overhead written in the file is set on the topology; :func:`load_graph_file` also returns
    it, so a cluster can carry it in its network parameters.
    """
    return load_graph_file(path, field=field)[0]


@collector_paused()
def load_graph_file(path: str | Path, *, field: str = "graph") -> tuple[Topology, float | None]:
    """The topology of a graph file and the per-message overhead (seconds) the file states, or None (read with
    the cyclic garbage collector paused, :mod:`topotrain.util.gc_pause`)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in _YAML_SUFFIXES + _GRAPHML_SUFFIXES:
        raise ConfigError(field, f"{p}: unknown graph file type {suffix or '(none)'!r}",
                          "use a .yaml, .yml or .graphml file")
    if not p.is_file():
        raise ConfigError(field, f"graph file {p} does not exist",
                          "check the path (relative to the scenario)")
    try:
        topo, overhead = (_from_yaml(_read_yaml(p, field), p, field) if suffix in _YAML_SUFFIXES
                          else _from_graphml(p, field))
        topo.validate()
    except ConfigError as e:
        if e.message.startswith(f"{p.name}: ") or e.message.startswith(f"{p}: "):
            raise
        raise _in_file(e, p) from None
    return topo, overhead


def _read_yaml(p: Path, field: str) -> Any:
    text = yamlio.read_text(p, field)
    try:
        return yamlio.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(field, f"{p.name}: malformed YAML{where}: {problem}",
                          "fix the YAML syntax there") from None


def _name(value: Any, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise ConfigError(field, f"must be a non-empty name, got {value!r}", "write a string")
    return str(value)


def _number_or_string(value: Any) -> Any:
    """A plain-number string (GraphML attributes typed ``string``) becomes a float."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(field, f"must be true or false, got {value!r}", "write true or false")


def _from_yaml(doc: Any, p: Path, field: str) -> tuple[Topology, float | None]:
    if not isinstance(doc, Mapping):
        raise ConfigError(field, f"{p.name}: expected a mapping with nodes and links, got "
                          f"{type(doc).__name__}", "see topotrain.topology.io for the format")
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(str(key), "unknown key", f"use {', '.join(_TOP_KEYS)}")
    name = _name(doc["name"], "name") if doc.get("name") is not None else p.stem
    topo = Topology(name)
    overhead = (parse_time(doc["message_overhead"], "message_overhead", si_number=True)
                if doc.get("message_overhead") is not None else None)
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise ConfigError("nodes", "must be a non-empty list", "list the nodes as {name, kind, server?}")
    for i, nd in enumerate(nodes):
        f = f"nodes[{i}]"
        if not isinstance(nd, Mapping):
            raise ConfigError(f, f"must be a mapping, got {nd!r}", "write {name: g0, kind: gpu}")
        for key in nd:
            if key not in _NODE_KEYS:
                raise ConfigError(f"{f}.{key}", "unknown key", f"use {', '.join(_NODE_KEYS)}")
        if "name" not in nd or "kind" not in nd:
            missing = "name" if "name" not in nd else "kind"
            raise ConfigError(f"{f}.{missing}", "is required", "give every node a name and a kind")
        server = _name(nd["server"], f"{f}.server") if nd.get("server") is not None else None
        transit = _bool(nd["transit"], f"{f}.transit") if nd.get("transit") is not None else None
        attrs = nd.get("attrs") or {}
        if not isinstance(attrs, Mapping):
            raise ConfigError(f"{f}.attrs", "must be a mapping", "write e.g. {rail: 0}")
        for k in attrs:
            if str(k) in _RESERVED_NODE_ATTRS:
                raise ConfigError(f"{f}.attrs.{k}", "is a node field, not an attribute",
                                  f"write {k} beside name, outside attrs")
        _add_node(topo, f, _name(nd["name"], f"{f}.name"), nd["kind"], server, transit,
                  {str(k): v for k, v in attrs.items()})
    links = doc.get("links") or []
    if not isinstance(links, list):
        raise ConfigError("links", "must be a list", "list the links as {a, b, bandwidth, latency}")
    for i, lk in enumerate(links):
        f = f"links[{i}]"
        if not isinstance(lk, Mapping):
            raise ConfigError(f, f"must be a mapping, got {lk!r}", "write {a: g0, b: n0, bandwidth: 100Gbps}")
        for key in lk:
            if key not in _LINK_KEYS:
                raise ConfigError(f"{f}.{key}", "unknown key", f"use {', '.join(_LINK_KEYS)}")
        for key in ("a", "b", "bandwidth"):
            if lk.get(key) is None:
                raise ConfigError(f"{f}.{key}", "is required", "give a, b and bandwidth for every link")
        _add_link(topo, f, _name(lk["a"], f"{f}.a"), _name(lk["b"], f"{f}.b"), lk["bandwidth"],
                  lk.get("latency"), lk.get("kind"), lk.get("bandwidth_reverse"))
    meta = doc.get("meta")
    if meta is not None:
        if not isinstance(meta, Mapping):
            raise ConfigError("meta", "must be a mapping", "remove it or write a mapping")
        topo.meta.update({str(k): v for k, v in meta.items()})
    return topo, overhead


def _add_node(topo: Topology, f: str, name: str, kind: Any, server: str | None, transit: bool | None,
              attrs: dict[str, Any]) -> None:
    try:
        topo.add_node(name, str(kind), server, transit, **attrs)
    except ConfigError as e:
        where = f"{f}.kind" if "unknown kind" in e.message else f"{f}.name"
        raise ConfigError(where, e.message, e.fix) from None


def _add_link(topo: Topology, f: str, a: str, b: str, bandwidth: Any, latency: Any, kind: Any,
              reverse: Any) -> None:
    bw = parse_bandwidth(_number_or_string(bandwidth), f"{f}.bandwidth", si_number=True)
    lat = parse_time(_number_or_string(latency), f"{f}.latency", si_number=True) if latency is not None else 0.0
    bw_rev = (parse_bandwidth(_number_or_string(reverse), f"{f}.bandwidth_reverse", si_number=True)
              if reverse is not None else None)
    try:
        topo.add_link(a, b, bw, lat, "" if kind is None else str(kind), bw_rev)
    except ConfigError as e:
        raise ConfigError(f, e.message, e.fix) from None


def _from_graphml(p: Path, field: str) -> tuple[Topology, float | None]:
    import networkx as nx  # GraphML only: YAML graph files and built clusters start without networkx

    try:
        g = nx.parse_graphml(yamlio.read_text(p, field))
    except ET.ParseError as e:
        line, col = e.position
        raise ConfigError(field, f"{p.name}: malformed XML at line {line}, column {col + 1}",
                          "fix the GraphML syntax there") from None
    except (nx.NetworkXError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(field, f"{p.name}: not a readable GraphML graph: {e}",
                          "write GraphML as networkx.write_graphml does") from None
    name = str(g.graph.get("name") or p.stem)
    topo = Topology(name)
    overhead = (parse_time(_number_or_string(g.graph["message_overhead_s"]), "graph.message_overhead_s",
                           si_number=True) if g.graph.get("message_overhead_s") is not None else None)
    for i, (n, data) in enumerate(g.nodes(data=True)):
        f = f"nodes[{i}]"
        if data.get("kind") in (None, ""):
            raise ConfigError(f"{f}.kind", f"node {n!r} has no kind attribute",
                              "add kind (gpu, pcie, cpu, nic, nvswitch or switch)")
        server = data.get("server")
        server = None if server in (None, "") else str(server)
        transit = _bool(data["transit"], f"{f}.transit") if data.get("transit") is not None else None
        attrs = {str(k): v for k, v in data.items() if k not in _RESERVED_NODE_ATTRS}
        _add_node(topo, f, str(n), data["kind"], server, transit, attrs)
    edges = list(g.edges(data=True))
    if edges and all(isinstance(d.get("index"), int | float) for _, _, d in edges):
        edges.sort(key=lambda e: float(e[2]["index"]))
    used: set[tuple[str, str]] = set()
    count = 0
    for u, v, data in edges:
        u, v = str(u), str(v)
        if (u, v) in used:
            continue
        f = f"links[{count}]"
        if data.get("bandwidth") is None:
            raise ConfigError(f"{f}.bandwidth", f"edge {u}–{v} has no bandwidth attribute",
                              "add bandwidth (e.g. 100Gbps, or bytes/s)")
        reverse = data.get("bandwidth_reverse")
        src = data.get("src")
        if src is not None and str(src) == v:
            u, v = v, u
        if g.is_directed() and not g.is_multigraph() and g.has_edge(v, u) and reverse is None:
            back = g.edges[v, u]
            if back.get("bandwidth") is None:
                raise ConfigError(f"{f}.bandwidth", f"edge {v}–{u} has no bandwidth attribute",
                                  "add bandwidth (e.g. 100Gbps, or bytes/s)")
            reverse = back["bandwidth"]
            used.add((v, u))
        used.add((u, v))
        _add_link(topo, f, u, v, data["bandwidth"], data.get("latency"), data.get("kind"), reverse)
        count += 1
    meta_json = g.graph.get("meta_json")
    if meta_json:
        try:
            meta = json.loads(str(meta_json))
        except json.JSONDecodeError as e:
            raise ConfigError("graph.meta_json", f"is not valid JSON: {e}", "remove it or fix it") from None
        if isinstance(meta, dict):
            topo.meta.update(meta)
    return topo, overhead


# ---- saving ---------------------------------------------------------------------------------------
class _Unplain(Exception):
    pass


def _plain(value: Any) -> Any:
    """``value`` as YAML/JSON-safe data (numpy scalars unwrapped, tuples as lists); _Unplain if not."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Unplain
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return _plain(item())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    raise _Unplain


def _plain_items(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        try:
            out[str(k)] = _plain(v)
        except _Unplain:
            continue
    return out


def _physical_links(topo: Topology) -> list[tuple[Any, Any]]:
    """Pairs (a→b, b→a) of directed links: :meth:`Topology.add_link` appends the two in a row."""
    return [(topo.links[i], topo.links[i + 1]) for i in range(0, topo.num_links, 2)]


def save_graph(topo: Topology, path: str | Path, message_overhead_s: float | None = None) -> None:
    """Write ``topo`` as YAML or GraphML (by suffix), atomically. Bandwidths in bytes/s, latencies in s;
    ``message_overhead_s`` (a cluster's network parameter, not the graph's) is written when given, so that
    a cluster built from the file gets it back.

    Node attributes and ``topo.meta`` entries that are not plain data are left out (GraphML keeps only
    scalar node attributes; meta travels there as the JSON graph attribute ``meta_json``).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in _YAML_SUFFIXES:
        doc = _to_yaml_doc(topo, message_overhead_s)
        data = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode("utf-8")

        def write(fh: IO[bytes]) -> None:
            fh.write(data)

        atomic_write(p, write, make_parents=True)
    elif suffix in _GRAPHML_SUFFIXES:
        import networkx as nx  # GraphML only (see _from_graphml)

        g = _to_nx(topo, message_overhead_s)
        atomic_write(p, lambda fh: nx.write_graphml(g, fh), make_parents=True)
    else:
        raise ConfigError("path", f"{p}: unknown graph file type {suffix or '(none)'!r}",
                          "use a .yaml, .yml or .graphml file")


def _to_yaml_doc(topo: Topology, message_overhead_s: float | None) -> dict[str, Any]:
    nodes = []
    for nd in topo.nodes.values():
        item: dict[str, Any] = {"name": nd.name, "kind": nd.kind.value}
        if nd.server is not None:
            item["server"] = nd.server
        item["transit"] = nd.transit
        attrs = _plain_items(nd.attrs)
        if attrs:
            item["attrs"] = attrs
        nodes.append(item)
    links = []
    for ab, ba in _physical_links(topo):
        lk: dict[str, Any] = {"a": ab.src, "b": ab.dst, "bandwidth": ab.bandwidth_bytes_per_s,
                              "latency": ab.latency_s}
        if ab.kind:
            lk["kind"] = ab.kind
        if ba.bandwidth_bytes_per_s != ab.bandwidth_bytes_per_s:
            lk["bandwidth_reverse"] = ba.bandwidth_bytes_per_s
        links.append(lk)
    doc: dict[str, Any] = {"name": topo.name}
    if message_overhead_s is not None:
        doc["message_overhead"] = message_overhead_s
    doc.update(nodes=nodes, links=links)
    meta = _plain_items(topo.meta)
    if meta:
        doc["meta"] = meta
    return doc


def _to_nx(topo: Topology, message_overhead_s: float | None) -> nx.Graph:
    import networkx as nx  # GraphML only (see _from_graphml)

    g = nx.Graph()
    g.graph["name"] = topo.name
    if message_overhead_s is not None:
        g.graph["message_overhead_s"] = float(message_overhead_s)
    meta = _plain_items(topo.meta)
    if meta:
        g.graph["meta_json"] = json.dumps(meta, sort_keys=True)
    for nd in topo.nodes.values():
        data: dict[str, Any] = {"kind": nd.kind.value, "transit": nd.transit}
        if nd.server is not None:
            data["server"] = nd.server
        for k, v in _plain_items(nd.attrs).items():
            if k not in _RESERVED_NODE_ATTRS and isinstance(v, bool | int | float | str):
                data[k] = v
        g.add_node(nd.name, **data)
    for i, (ab, ba) in enumerate(_physical_links(topo)):
        e: dict[str, Any] = {"bandwidth": ab.bandwidth_bytes_per_s, "latency": ab.latency_s, "index": i,
                             "src": ab.src}
        if ab.kind:
            e["kind"] = ab.kind
        if ba.bandwidth_bytes_per_s != ab.bandwidth_bytes_per_s:
            e["bandwidth_reverse"] = ba.bandwidth_bytes_per_s
        g.add_edge(ab.src, ab.dst, **e)
    return g
