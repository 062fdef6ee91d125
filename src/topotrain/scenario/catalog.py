"""A user's hardware entries, validated by the schema, converted into the hardware catalog's values.

The schema (:class:`~topotrain.scenario.cluster_spec.CatalogSpec`, ``GPUEntry``, ``LinkEntry``, ``ServerEntry``)
checks the shape of a catalog file or a scenario's ``catalog:`` / inline ``server:``; this module resolves
names against a :class:`~topotrain.hardware.catalog.Catalog` and returns new values (a ``GPUSpec``, a
``LinkType``, a ``ServerTemplate``, a new ``Catalog``). The hardware package never sees the schema.

User catalog schema (YAML or a mapping; every section optional)::

    gpus:
      - name: my-gpu            # required; lookups are case-insensitive
        vendor: acme
        peak_flops: {fp16: 312TFLOPS, bf16: 312TFLOPS, fp32: 19.5TFLOPS}   # dense peaks
        hbm_bandwidth: 2TB/s    # bytes per second (TB/s); 16Tbps would be bits
        memory: 80GiB
        sm_count: 108
        boost_clock: 1.41GHz
        tdp: 400W
        nvlink: nvlink3          # a link type name, or omit
        source: "datasheet ..."
        aliases: [mygpu]
    links:
      - {name: my-nic, kind: ethernet, bandwidth: 100Gbps, latency: 0.5us, source: "..."}
    servers:
      - <server definition: topotrain.hardware.servers' docstring; read by server_from_dict below>

Sections are read in the order links, gpus, servers, so a server may use GPUs and links of the same file.
An entry whose name is taken by a different entry is an error unless ``replace`` is true.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from topotrain.hardware import gpus as _gpus
from topotrain.hardware.catalog import Catalog
from topotrain.hardware.gpus import GPUSpec
from topotrain.hardware.links import LinkType
from topotrain.hardware.servers import (
    LinkDef,
    NodeDef,
    ServerTemplate,
    check_structure,
    gpu_name_in,
    link_in,
    nic_type,
)
from topotrain.scenario.cluster_spec import CatalogSpec, GPUEntry, LinkEntry, ServerEntry
from topotrain.util import yamlio
from topotrain.util.errors import ConfigError, ConfigErrors, problems_of
from topotrain.util.problems import validated
from topotrain.util.units import parse_flops


def with_entries(base: Catalog, spec: Any, where: str = "catalog", *, replace: bool = False) -> Catalog:
    """``base`` plus the entries of a :class:`~topotrain.scenario.cluster_spec.CatalogSpec` (or a mapping
    of that shape): links, then GPUs, then servers. Every problem at once, fields under ``where``."""
    spec = validated(CatalogSpec, spec, where)
    cat = base
    found: list[ConfigError] = []

    def add(step: Any, f: str) -> None:
        nonlocal cat
        try:
            cat = step()
        except ConfigError as e:
            for p in problems_of(e):
                sub = p.field if p.field and not p.field.startswith(f) else ""
                found.append(ConfigError(f"{f}.{sub}" if sub else (p.field or f), p.message, p.fix))

    for i, link in enumerate(spec.links):
        add(lambda lk=link: cat.with_link(link_from_entry(lk), replace=replace), f"{where}.links[{i}]")
    for i, gpu in enumerate(spec.gpus):
        f = f"{where}.gpus[{i}]"
        add(lambda g=gpu, f=f: cat.with_gpu(*gpu_from_entry(g, f, cat), replace=replace), f)
    for i, server in enumerate(spec.servers):
        f = f"{where}.servers[{i}]"
        add(lambda sv=server, f=f: cat.with_server(server_from_entry(sv, f, cat), replace=replace), f)
    if found:
        raise ConfigErrors(found)
    return cat


def gpu_from_entry(e: Any, where: str, catalog: Catalog | None = None) -> tuple[GPUSpec, list[str]]:
    """A GPUSpec (and its aliases) from a validated :class:`~topotrain.scenario.cluster_spec.GPUEntry`."""
    cat = catalog or Catalog.builtin()
    peaks = {}
    for k, v in e.peak_flops.items():
        peaks[_gpus.normalize_dtype(k, f"{where}.peak_flops")] = parse_flops(v, f"{where}.peak_flops.{k}")
    nvlink = cat.link(e.nvlink, f"{where}.nvlink").name if e.nvlink is not None else None
    spec = GPUSpec(
        name=e.name.strip(), vendor=e.vendor, peak_flops_per_s=peaks, hbm_bandwidth_bytes_per_s=e.hbm_bandwidth,
        memory_bytes=e.memory, sm_count=e.sm_count,
        boost_clock_hz=e.boost_clock, tdp_w=e.tdp, nvlink=nvlink, source=e.source,
        compute_efficiency=dict(e.compute_efficiency), efficiency_source=e.efficiency_source,
    )
    return spec, list(e.aliases)


def link_from_entry(e: Any) -> LinkType:
    """A LinkType from a validated :class:`~topotrain.scenario.cluster_spec.LinkEntry`."""
    return LinkType(name=e.name.strip().lower(), kind=e.kind, bandwidth_bytes_per_s=e.bandwidth,
                    latency_s=e.latency, source=e.source)


def gpu_from_dict(entry: Any, where: str = "gpu", catalog: Catalog | None = None) -> tuple[GPUSpec, list[str]]:
    """A GPUSpec (and its aliases) from one ``gpus:`` entry of a catalog."""
    return gpu_from_entry(validated(GPUEntry, entry, where), where, catalog)


def link_from_dict(entry: Any, where: str = "link") -> LinkType:
    """A LinkType from one ``links:`` entry of a catalog."""
    return link_from_entry(validated(LinkEntry, entry, where))


def _infer_kind(ka: str, kb: str) -> str:
    if ka == kb == "cpu":
        return "socket"
    if "nvswitch" in (ka, kb) or ka == kb == "gpu":
        return "nvlink"
    return "pcie"


def server_from_dict(d: Any, field: str = "cluster.server", catalog: Catalog | None = None) -> ServerTemplate:
    """A user template from ``{name, gpu, description?, source?, nodes: [...], links: [...]}`` (see the
    module docstring), its link types and GPUs looked up in ``catalog`` (built-ins when None). The shape
    is checked by :class:`topotrain.scenario.cluster_spec.ServerEntry` (every problem at once, e.g.
    ``cluster.server.links[3].b``)."""
    return server_from_entry(validated(ServerEntry, d, field), field, catalog)


def server_from_entry(entry: Any, field: str, catalog: Catalog | None = None) -> ServerTemplate:
    """The template of a validated :class:`~topotrain.scenario.cluster_spec.ServerEntry` (names resolved)."""
    gpu = gpu_name_in(entry.gpu, f"{field}.gpu", catalog)
    kinds = {nd.name: nd.kind for nd in entry.nodes}
    nodes: list[NodeDef] = []
    for i, nd in enumerate(entry.nodes):
        where = f"{field}.nodes[{i}]"
        attrs: dict[str, Any] = dict(nd.model_extra or {})
        for key in ("rail", "nic", "transit"):
            if getattr(nd, key) is not None:
                attrs[key] = getattr(nd, key)
        if nd.gpu is not None:
            attrs["gpu"] = gpu_name_in(nd.gpu, f"{where}.gpu", catalog)
        if nd.kind == "nic":
            lt = nic_type(nd.link, f"{where}.link", catalog) if nd.link is not None else None
            if lt is not None:
                attrs["link"] = lt.name
            attrs["bandwidth_bytes_per_s"] = nd.bandwidth if nd.bandwidth is not None else (
                lt.bandwidth_bytes_per_s if lt is not None else 0.0)
            attrs["latency_s"] = nd.latency if nd.latency is not None else (lt.latency_s if lt is not None else 0.0)
        nodes.append(NodeDef(nd.name, nd.kind, attrs))
    links: list[LinkDef] = []
    for j, lk in enumerate(entry.links):
        lt = link_in(lk.link, f"{field}.links[{j}].link", catalog) if lk.link is not None else None
        bw = lk.bandwidth if lk.bandwidth is not None else (lt.bandwidth_bytes_per_s if lt is not None else 0.0)
        lat = lk.latency if lk.latency is not None else (lt.latency_s if lt is not None else 0.0)
        kind = lk.kind or (lt.kind if lt is not None else _infer_kind(kinds[lk.a], kinds[lk.b]))
        links.append(LinkDef(lk.a, lk.b, bw, lat, kind))
    nodes_checked = check_structure(entry.name, gpu, tuple(nodes), tuple(links), field)
    return ServerTemplate(entry.name, entry.description, gpu, nodes_checked, tuple(links), entry.source)


def _read(source: str | Path | Mapping[str, Any]) -> tuple[Any, str | None]:
    """The parsed document and the file it came from (None for a string or mapping)."""
    if isinstance(source, Mapping):
        return source, None
    path: Path | None = None
    if isinstance(source, Path):
        path = source
    elif isinstance(source, str) and "\n" not in source and (
            source.strip().lower().endswith((".yaml", ".yml", ".json")) or Path(source).is_file()):
        path = Path(source)
    elif not isinstance(source, str):
        raise ConfigError("catalog", f"expected a path, YAML text or mapping, got {type(source).__name__}",
                          "pass a file path or YAML text")
    if path is not None:
        text = yamlio.read_text(path, "catalog")
        label = str(path)
    else:
        text = str(source)
        label = "<string>"
    try:
        doc = yamlio.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError("catalog", f"malformed YAML in {label}{where}: {problem}",
                          "fix the YAML syntax there") from None
    return doc, (str(path) if path is not None else None)


def load_catalog(source: str | Path | Mapping[str, Any], *, replace: bool = False,
                 base: Catalog | None = None) -> Catalog:
    """A new catalog: ``base`` (the built-ins when None) plus the GPUs, link types and server templates of
    a user catalog. Nothing global changes.

    ``source``: a file path (``Path``, or a string naming an existing file or ending in .yaml/.yml/.json),
    YAML text, or an already parsed mapping. ``replace`` lets entries overwrite ones of the same name
    (otherwise a different entry under a taken name is an error).
    """
    doc, path = _read(source)
    cat = base or Catalog.builtin()
    if doc is None:
        return cat
    try:
        return with_entries(cat, doc, "catalog", replace=replace)
    except ConfigError as exc:
        if path is None:
            raise
        raise ConfigErrors([ConfigError(p.field, f"{p.message} (in {path})", p.fix)
                            for p in problems_of(exc)]) from None
