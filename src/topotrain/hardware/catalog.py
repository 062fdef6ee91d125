"""User hardware catalogs: GPUs, link types and server templates from YAML (or an equivalent mapping).

Schema (every section optional; units as strings or plain SI numbers)::

    gpus:
      - name: my-gpu            # required; lookups are case-insensitive
        vendor: acme
        peak_flops: {fp16: 312TFLOPS, bf16: 312TFLOPS, fp32: 19.5TFLOPS}   # dense peaks
        hbm_bandwidth: 2TB/s
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
      - <server dict, see topotrain.hardware.servers.server_from_dict>

Sections are read in the order links, gpus, servers, so a server may use GPUs and links of the same file.
Loading is all-or-nothing: on any error the catalog is left as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml

from topotrain.errors import ConfigError
from topotrain.hardware import gpus as _gpus
from topotrain.hardware import links as _links
from topotrain.hardware import servers as _servers
from topotrain.hardware.gpus import GPUSpec, register_gpu
from topotrain.hardware.links import LinkType, get_link, register_link
from topotrain.hardware.servers import register_server, server_from_dict
from topotrain.units import parse_bandwidth, parse_flops, parse_size, parse_time

_TOP_KEYS = ("gpus", "links", "servers")
_GPU_KEYS = {"name", "vendor", "peak_flops", "hbm_bandwidth", "memory", "sm_count", "boost_clock", "tdp",
             "nvlink", "source", "aliases", "compute_efficiency", "efficiency_source"}
_LINK_KEYS = {"name", "kind", "bandwidth", "latency", "source"}

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_FREQ_RE = re.compile(rf"^\s*{_NUM}\s*([kMG]?)\s*Hz\s*$", re.IGNORECASE)
_POWER_RE = re.compile(rf"^\s*{_NUM}\s*(k?)\s*W\s*$", re.IGNORECASE)
V = TypeVar("V")

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
        raise ConfigError(field, f"{what} must be >= 0, got {value!r}", f"write e.g. {example}")
    return v


def parse_frequency(value: Any, field: str = "frequency") -> float:
    """Hz from ``"1.41GHz"``, ``"1410 MHz"``, or a plain number of Hz."""
    return _number_with_unit(value, field, _FREQ_RE, "frequency", "1.41GHz")


def parse_power(value: Any, field: str = "power") -> float:
    """W from ``"400W"``, ``"0.7kW"``, or a plain number of watts."""
    return _number_with_unit(value, field, _POWER_RE, "power", "400W")


def _entries(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    v = doc.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise ConfigError(f"{where}.{key}", f"expected a list, got {type(v).__name__}", f"write {key}: [...]")
    return v


def _check_keys(entry: Any, allowed: set[str], where: str, required: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(entry, Mapping):
        raise ConfigError(where, f"expected a mapping, got {type(entry).__name__}", "write {name: ..., ...}")
    extra = sorted(str(k) for k in entry if k not in allowed)
    if extra:
        raise ConfigError(f"{where}.{extra[0]}", f"unknown key {extra[0]!r}",
                          f"allowed: {', '.join(sorted(allowed))}")
    for k in required:
        if entry.get(k) is None:
            raise ConfigError(f"{where}.{k}", f"missing required key {k!r}", f"add {k}: ...")
    name = entry["name"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name", f"expected a non-empty string, got {name!r}", "write name: <name>")
    return entry


def _str_or_empty(entry: Mapping[str, Any], key: str, where: str) -> str:
    v = entry.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise ConfigError(f"{where}.{key}", f"expected a string, got {v!r}", f'write {key}: "..."')
    return v


def gpu_from_dict(entry: Any, where: str = "gpu") -> tuple[GPUSpec, list[str]]:
    """A GPUSpec (and its aliases) from one ``gpus:`` entry of a catalog."""
    e = _check_keys(entry, _GPU_KEYS, where, ("name", "peak_flops", "hbm_bandwidth", "memory"))
    peaks_in = e["peak_flops"]
    if not isinstance(peaks_in, Mapping) or not peaks_in:
        raise ConfigError(f"{where}.peak_flops", "expected a mapping of data type to FLOP/s",
                          "write peak_flops: {bf16: 312TFLOPS, fp32: 19.5TFLOPS}")
    peaks = {}
    for k, v in peaks_in.items():
        key = _gpus.normalize_dtype(k, f"{where}.peak_flops")
        peaks[key] = parse_flops(v, f"{where}.peak_flops.{k}")
    sm = e.get("sm_count", 0)
    if isinstance(sm, bool) or not isinstance(sm, int) or sm < 0:
        raise ConfigError(f"{where}.sm_count", f"expected a non-negative integer, got {sm!r}",
                          "write sm_count: 108")
    nvlink = e.get("nvlink")
    if nvlink is not None:
        nvlink = get_link(nvlink, f"{where}.nvlink").name
    aliases = e.get("aliases", []) or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise ConfigError(f"{where}.aliases", f"expected a list of names, got {aliases!r}",
                          "write aliases: [x, y]")
    spec = GPUSpec(
        name=e["name"].strip(),
        vendor=_str_or_empty(e, "vendor", where),
        peak_flops_per_s=peaks,
        hbm_bandwidth_bytes_per_s=parse_bandwidth(e["hbm_bandwidth"], f"{where}.hbm_bandwidth"),
        memory_bytes=parse_size(e["memory"], f"{where}.memory"),
        sm_count=sm,
        boost_clock_hz=parse_frequency(e.get("boost_clock", 0), f"{where}.boost_clock"),
        tdp_w=parse_power(e.get("tdp", 0), f"{where}.tdp"),
        nvlink=nvlink,
        source=_str_or_empty(e, "source", where),
        compute_efficiency=e.get("compute_efficiency") or {},
        efficiency_source=_str_or_empty(e, "efficiency_source", where),
    )
    return spec, list(aliases)


def link_from_dict(entry: Any, where: str = "link") -> LinkType:
    """A LinkType from one ``links:`` entry of a catalog."""
    e = _check_keys(entry, _LINK_KEYS, where, ("name", "kind", "bandwidth"))
    kind = e["kind"]
    if not isinstance(kind, str) or kind.strip().lower() not in _links.LINK_KINDS:
        raise ConfigError(f"{where}.kind", f"unknown link kind {kind!r}",
                          f"use one of {', '.join(_links.LINK_KINDS)}")
    return LinkType(
        name=e["name"].strip().lower(),
        kind=kind.strip().lower(),
        bandwidth_bytes_per_s=parse_bandwidth(e["bandwidth"], f"{where}.bandwidth"),
        latency_s=parse_time(e.get("latency", 0.0), f"{where}.latency"),
        source=_str_or_empty(e, "source", where),
    )


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
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError("catalog", f"malformed YAML in {label}{where}: {problem}",
                          "fix the YAML syntax there") from None
    return doc, (str(path) if path is not None else None)


def load_catalog(source: str | Path | Mapping[str, Any], *, replace: bool = False) -> None:
    """Register the GPUs, link types and server templates of a user catalog.

    ``source``: a file path (``Path``, or a string naming an existing file or ending in .yaml/.yml/.json),
    YAML text, or an already parsed mapping. All-or-nothing: on error nothing is registered. ``replace``
    lets entries overwrite registered ones of the same name (otherwise that is an error).
    """
    doc, path = _read(source)
    where = "catalog"
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        raise ConfigError(where, f"expected a mapping with {', '.join(_TOP_KEYS)}, got {type(doc).__name__}",
                          "write gpus: [...], links: [...], servers: [...] (or check the file path)")
    extra = sorted(str(k) for k in doc if k not in _TOP_KEYS)
    if extra:
        raise ConfigError(f"{where}.{extra[0]}", f"unknown section {extra[0]!r}",
                          f"a catalog has {', '.join(_TOP_KEYS)}")
    saved_gpus, saved_aliases = dict(_gpus.GPUS), dict(_gpus.GPU_ALIASES)
    saved_links, saved_servers = dict(_links.LINKS), dict(_servers.SERVERS)
    try:
        for i, e in enumerate(_entries(doc, "links", where)):
            lt = link_from_dict(e, f"{where}.links[{i}]")
            _register(partial(register_link, lt, replace=replace), f"{where}.links[{i}].name")
        for i, e in enumerate(_entries(doc, "gpus", where)):
            spec, aliases = gpu_from_dict(e, f"{where}.gpus[{i}]")
            _register(partial(register_gpu, spec, aliases, replace=replace), f"{where}.gpus[{i}].name")
        for i, e in enumerate(_entries(doc, "servers", where)):
            tpl = server_from_dict(e, f"{where}.servers[{i}]")
            _register(partial(register_server, tpl, replace=replace), f"{where}.servers[{i}].name")
    except ConfigError as exc:
        _restore(_gpus.GPUS, saved_gpus)
        _restore(_gpus.GPU_ALIASES, saved_aliases)
        _restore(_links.LINKS, saved_links)
        _restore(_servers.SERVERS, saved_servers)
        if path is not None:
            raise ConfigError(exc.field, f"{exc.message} (in {path})", exc.fix) from None
        raise


def _register(do: Callable[[], object], field: str) -> None:
    """Run one register_* call, re-labelling its error with the entry's field path."""
    try:
        do()
    except ConfigError as exc:
        raise ConfigError(field, exc.message, exc.fix) from None


def _restore(live: dict[str, V], saved: dict[str, V]) -> None:
    live.clear()
    live.update(saved)
