"""The hardware catalog as a value: GPUs, link types and server templates, built-ins plus a scenario's own.

A :class:`Catalog` is frozen. :meth:`Catalog.builtin` holds the built-in entries (:data:`~topotrain.hardware.
gpus.GPUS`, ``LINKS``, ``SERVERS``, and whatever a program added with ``register_*``); :func:`load_catalog`
and :meth:`Catalog.with_entries` return a *new* catalog with a user's entries added — nothing global
changes, so two scenarios with different catalogs can be loaded side by side. The cluster loader builds
one per scenario and keeps it on the :class:`~topotrain.cluster.Cluster`.

User catalog schema (YAML or a mapping; every section optional; checked by
:class:`topotrain.scenario.spec.CatalogSpec`)::

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
      - <server definition, see topotrain.hardware.servers.server_from_dict>

Sections are read in the order links, gpus, servers, so a server may use GPUs and links of the same file.
An entry whose name is taken by a different entry is an error unless ``replace`` is true.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import ValidationError

from topotrain.hardware import gpus as _gpus
from topotrain.hardware import links as _links
from topotrain.hardware import servers as _servers
from topotrain.hardware.gpus import GPUSpec
from topotrain.hardware.links import LinkType
from topotrain.hardware.servers import ServerTemplate
from topotrain.util import yamlio
from topotrain.util.errors import ConfigError, ConfigErrors, problems_of
from topotrain.util.units import parse_flops

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_FREQ_RE = re.compile(rf"^\s*{_NUM}\s*([kMG]?)\s*Hz\s*$", re.IGNORECASE)
_POWER_RE = re.compile(rf"^\s*{_NUM}\s*(k?)\s*W\s*$", re.IGNORECASE)

_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def _number_with_unit(value: Any, field: str, pattern: re.Pattern[str], what: str, example: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a {what}, got {value!r}", f"write e.g. {example}")
    if isinstance(value, int | float):
        v = float(value)
    else:
        m = pattern.match(str(value))
        if not m:
            raise ConfigError(field, f"cannot read {what} {value!r}", f"write e.g. {example}")
        v = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if not (0 <= v < float("inf")):
        raise ConfigError(field, f"{what} must be ≥ 0, got {value!r}", f"write e.g. {example}")
    return v


def parse_frequency(value: Any, field: str = "frequency") -> float:
    """Hz from ``"1.41GHz"``, ``"1410 MHz"``, or a plain number of Hz."""
    return _number_with_unit(value, field, _FREQ_RE, "frequency", "1.41GHz")


def parse_power(value: Any, field: str = "power") -> float:
    """W from ``"400W"``, ``"0.7kW"``, or a plain number of watts."""
    return _number_with_unit(value, field, _POWER_RE, "power", "400W")


def _key(name: str) -> str:
    return name.strip().lower()


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Catalog:
    """GPUs, link types and server templates by lower-case name (with aliases). A value: the ``with_*``
    methods return a new catalog."""

    gpus: Mapping[str, GPUSpec] = field(default_factory=dict)
    gpu_aliases: Mapping[str, str] = field(default_factory=dict)
    links: Mapping[str, LinkType] = field(default_factory=dict)
    servers: Mapping[str, ServerTemplate] = field(default_factory=dict)
    server_aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("gpus", "gpu_aliases", "links", "servers", "server_aliases"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @classmethod
    def builtin(cls) -> Catalog:
        """The built-in entries (plus any a program registered with ``register_*``)."""
        return cls(_gpus.GPUS, _gpus.GPU_ALIASES, _links.LINKS, _servers.SERVERS, _servers.SERVER_ALIASES)

    # ---- lookups ----------------------------------------------------------------------------------
    def gpu(self, name: str | GPUSpec, field: str = "gpu") -> GPUSpec:
        """The GPU called ``name`` or one of its aliases (case-insensitive); a GPUSpec passes through."""
        if isinstance(name, GPUSpec):
            return name
        key = _key(name) if isinstance(name, str) else ""
        key = self.gpu_aliases.get(key, key)
        if key not in self.gpus:
            raise ConfigError(field, f"unknown GPU {name!r}", "known: " + ", ".join(sorted(self.gpus)) +
                              "; or define it under catalog: gpus:")
        return self.gpus[key]

    def link(self, name: str, field: str = "link") -> LinkType:
        """The link type called ``name`` (case-insensitive)."""
        key = _key(name) if isinstance(name, str) else ""
        if key not in self.links:
            raise ConfigError(field, f"unknown link type {name!r}", "known: " + ", ".join(sorted(self.links)))
        return self.links[key]

    def server(self, name: str | ServerTemplate, field: str = "server") -> ServerTemplate:
        """The server template called ``name`` (case-insensitive, aliases allowed)."""
        if isinstance(name, ServerTemplate):
            return name
        key = _key(name) if isinstance(name, str) else ""
        key = self.server_aliases.get(key, key)
        if key not in self.servers:
            raise ConfigError(field, f"unknown server template {name!r}",
                              "known: " + ", ".join(sorted(self.servers)) + "; or define one under servers:")
        return self.servers[key]

    def bandwidth(self, value: str | float | int, field: str = "bandwidth") -> float:
        """Bytes/s from a link type's name or a bandwidth with its unit."""
        return _links.resolve_bandwidth(value, field, self)

    # ---- new catalogs -----------------------------------------------------------------------------
    def with_gpu(self, spec: GPUSpec, aliases: tuple[str, ...] | list[str] = (), *,
                 replace: bool = False) -> Catalog:
        key = _key(spec.name)
        if key in self.gpu_aliases and not replace:
            raise ConfigError("name", f"{spec.name!r} is already an alias of {self.gpu_aliases[key]!r}",
                              "choose another name or pass replace=True")
        old = self.gpus.get(key)
        if old is not None and old != spec and not replace:
            raise ConfigError("name", f"GPU {spec.name!r} is already in the catalog",
                              "choose another name or pass replace=True")
        al = dict(self.gpu_aliases)
        for alias in aliases:
            a = _key(alias)
            target = al.get(a)
            if (a in self.gpus and a != key) or (target is not None and target != key and not replace):
                raise ConfigError("aliases", f"alias {alias!r} is already taken", "choose another alias")
        al.pop(key, None)
        al.update({_key(a): key for a in aliases})
        return Catalog({**self.gpus, key: spec}, al, self.links, self.servers, self.server_aliases)

    def with_link(self, link: LinkType, *, replace: bool = False) -> Catalog:
        key = _key(link.name)
        old = self.links.get(key)
        if old is not None and old != link and not replace:
            raise ConfigError("name", f"link type {link.name!r} is already in the catalog",
                              "choose another name or pass replace=True")
        return Catalog(self.gpus, self.gpu_aliases, {**self.links, key: link}, self.servers, self.server_aliases)

    def with_server(self, template: ServerTemplate, *, replace: bool = False) -> Catalog:
        key = _key(template.name)
        old = self.servers.get(key)
        if ((old is not None and old != template) or key in self.server_aliases) and not replace:
            raise ConfigError("name", f"server template {template.name!r} is already in the catalog",
                              "choose another name or pass replace=True")
        return Catalog(self.gpus, self.gpu_aliases, self.links, {**self.servers, key: template},
                       self.server_aliases)

    def with_entries(self, spec: Any, where: str = "catalog", *, replace: bool = False) -> Catalog:
        """This catalog plus the entries of a :class:`~topotrain.scenario.spec.CatalogSpec` (or a mapping
        of that shape): links, then GPUs, then servers. Every problem at once, fields under ``where``."""
        from topotrain.scenario.spec import CatalogSpec
        from topotrain.util.problems import raise_problems

        if not isinstance(spec, CatalogSpec):
            try:
                spec = CatalogSpec.model_validate(spec)
            except ValidationError as e:
                raise_problems(e, where, CatalogSpec)
        cat = self
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
            add(lambda sv=server, f=f: cat.with_server(_servers.server_from_entry(sv, f, cat), replace=replace), f)
        if found:
            raise ConfigErrors(found)
        return cat


def gpu_from_entry(e: Any, where: str, catalog: Catalog | None = None) -> tuple[GPUSpec, list[str]]:
    """A GPUSpec (and its aliases) from a validated :class:`~topotrain.scenario.spec.GPUEntry`."""
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
    """A LinkType from a validated :class:`~topotrain.scenario.spec.LinkEntry`."""
    return LinkType(name=e.name.strip().lower(), kind=e.kind, bandwidth_bytes_per_s=e.bandwidth,
                    latency_s=e.latency, source=e.source)


def _validated(model: Any, entry: Any, where: str) -> Any:
    from topotrain.util.problems import raise_problems

    try:
        return model.model_validate(entry)
    except ValidationError as e:
        raise_problems(e, where, model)


def gpu_from_dict(entry: Any, where: str = "gpu", catalog: Catalog | None = None) -> tuple[GPUSpec, list[str]]:
    """A GPUSpec (and its aliases) from one ``gpus:`` entry of a catalog."""
    from topotrain.scenario.spec import GPUEntry

    return gpu_from_entry(_validated(GPUEntry, entry, where), where, catalog)


def link_from_dict(entry: Any, where: str = "link") -> LinkType:
    """A LinkType from one ``links:`` entry of a catalog."""
    from topotrain.scenario.spec import LinkEntry

    return link_from_entry(_validated(LinkEntry, entry, where))

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
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("catalog", f"cannot read catalog file {str(path)!r}: {exc.strerror or exc}",
                              "check the path") from None
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
        return cat.with_entries(doc, "catalog", replace=replace)
    except ConfigError as exc:
        if path is None:
            raise
        raise ConfigErrors([ConfigError(p.field, f"{p.message} (in {path})", p.fix)
                            for p in problems_of(exc)]) from None
