"""The hardware catalog as a value: GPUs, link types and server templates, built-ins plus a scenario's own.

A :class:`Catalog` is frozen. :meth:`Catalog.builtin` holds the built-in entries (:data:`~topotrain.hardware.
gpus.GPUS`, ``LINKS``, ``SERVERS``, and whatever a program added with ``register_*``); ``with_gpu``,
``with_link`` and ``with_server`` return a *new* catalog with one entry added — nothing global changes, so two
scenarios with different catalogs can be loaded side by side. A user's catalog file or a scenario's
``catalog:`` is read by :mod:`topotrain.scenario.catalog`, which validates its entries and adds them here;
the cluster keeps its catalog on the :class:`~topotrain.cluster.Cluster`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from topotrain.hardware import gpus as _gpus
from topotrain.hardware import links as _links
from topotrain.hardware import servers as _servers
from topotrain.hardware.gpus import GPUSpec
from topotrain.hardware.links import LinkType
from topotrain.hardware.servers import ServerTemplate
from topotrain.util.errors import ConfigError, did_you_mean


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
            raise ConfigError(field, f"unknown GPU {name!r}", did_you_mean(name, sorted(self.gpus)) +
                              "; or define it under catalog: gpus:")
        return self.gpus[key]

    def link(self, name: str, field: str = "link") -> LinkType:
        """The link type called ``name`` (case-insensitive)."""
        key = _key(name) if isinstance(name, str) else ""
        if key not in self.links:
            raise ConfigError(field, f"unknown link type {name!r}", did_you_mean(name, sorted(self.links)))
        return self.links[key]

    def server(self, name: str | ServerTemplate, field: str = "server") -> ServerTemplate:
        """The server template called ``name`` (case-insensitive, aliases allowed)."""
        if isinstance(name, ServerTemplate):
            return name
        key = _key(name) if isinstance(name, str) else ""
        key = self.server_aliases.get(key, key)
        if key not in self.servers:
            raise ConfigError(field, f"unknown server template {name!r}",
                              did_you_mean(name, sorted(self.servers)) + "; or define one under servers:")
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
