"""Capex and power of a built cluster, from a price/power catalog (``prices.yaml`` beside this module).

The bill of materials is read off the frozen topology: its GPUs, its servers (by template), every NIC
(priced by port speed), every network switch (priced by the ports it uses and their speed: the cheapest
catalog switch with enough ports at least as fast; a switch with more ports than any catalog entry is a
chassis of several of the largest), one cable per NIC–switch link (copper) and per switch–switch link
(two optics). Power is the sum of the parts' power (GPUs at ``gpu_utilization_power`` × TDP, from the
hardware catalog's datasheet figure). Every default cites its source and the date of its price; a user
overrides any entry by name (``costs:`` in a space file), as with the hardware catalog.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from topotrain.util import yamlio
from topotrain.util.errors import ConfigError

PRICES_PATH = Path(__file__).with_name("prices.yaml")
_SECTIONS = {"gpus", "servers", "nics", "switches", "cables", "energy", "amortization_years",
             "gpu_utilization_power"}


@cache
def _default_prices() -> dict[str, Any]:
    with open(PRICES_PATH, encoding="utf-8") as fh:
        data = yamlio.safe_load(fh)
    assert isinstance(data, dict)
    return data


#: Numeric fields of catalog entries: those that must be > 0 (the others ≥ 0), and those that are counts.
_POSITIVE = {"gbps", "radix", "pue", "amortization_years", "gpu_utilization_power"}
_NUMERIC = {"price_usd", "power_w", "gbps", "radix", "nic_usd", "switch_usd", "optic_power_w", "usd_per_kwh",
            "pue", "gpu_utilization_power", "amortization_years"}
#: Largest number a price or power field may hold (a typo beyond that).
_MAX_VALUE = 1e15


def _check_number(field: str, key: str, v: Any) -> float:
    """A price, a power, a speed or a count of the catalog: a finite number ≥ 0 (> 0 for speeds, radix, PUE and
    years; radix a whole number); a word, NaN or a negative price is one ConfigError naming the field."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and -_MAX_VALUE <= v <= _MAX_VALUE
    if ok and key == "radix":
        ok = isinstance(v, int)
    lo_ok = ok and (v > 0 if key in _POSITIVE else v >= 0)
    if not lo_ok:
        need = "a whole number > 0" if key == "radix" else "a number > 0" if key in _POSITIVE else "a number ≥ 0"
        raise ConfigError(field, f"must be {need} (got {str(v)[:40]!r})", "see src/topotrain/search/prices.yaml")
    return float(v)


def _check_entry(field: str, entry: Mapping[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    for key in required:
        if key not in entry:
            raise ConfigError(f"{field}.{key}", "is required", "see src/topotrain/search/prices.yaml")
    for key, v in entry.items():
        if key in _NUMERIC:
            _check_number(f"{field}.{key}", str(key), v)
    return dict(entry)


_REQUIRED = {"gpus": ("price_usd",), "servers": ("price_usd",), "nics": ("gbps", "price_usd"),
             "switches": ("gbps", "radix", "price_usd"), "cables": ("gbps", "nic_usd", "switch_usd")}


def price_catalog(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The default catalog with ``overrides`` applied: ``gpus``/``servers`` entries replace those of the same
    name, ``energy`` keys replace theirs, a given ``nics``/``switches``/``cables`` list replaces the list."""
    base = _default_prices()
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                           for k, v in base.items()}
    for k, v in (overrides or {}).items():
        if k not in _SECTIONS:
            raise ConfigError(f"costs.{k}", "is not a section of the price catalog",
                              "use " + ", ".join(sorted(_SECTIONS)))
        if k in ("gpus", "servers", "energy"):
            if not isinstance(v, Mapping):
                raise ConfigError(f"costs.{k}", "must be a mapping", "see src/topotrain/search/prices.yaml")
            for name, entry in v.items():
                if k == "energy":
                    if name in _NUMERIC:
                        _check_number(f"costs.energy.{name}", str(name), entry)
                    out[k][name] = entry
                    continue
                if not isinstance(entry, Mapping) or "price_usd" not in entry:
                    raise ConfigError(f"costs.{k}.{name}", "needs price_usd", "write {price_usd: 12000, date: 2024-01}")
                out[k][name] = _check_entry(f"costs.{k}.{name}", entry, _REQUIRED[k])
        elif k in ("nics", "switches", "cables"):
            if not isinstance(v, list) or not v or not all(isinstance(e, Mapping) and "gbps" in e for e in v):
                raise ConfigError(f"costs.{k}", "must be a non-empty list of entries with gbps",
                                  "see src/topotrain/search/prices.yaml")
            out[k] = [_check_entry(f"costs.{k}[{i}]", e, _REQUIRED[k]) for i, e in enumerate(v)]
        else:
            _check_number(f"costs.{k}", k, v)
            out[k] = v
    return out


@dataclass(frozen=True)
class ClusterCost:
    """Capex and power of a cluster, with the parts each comes from."""

    capex_usd: float
    power_w: float
    parts_usd: Mapping[str, float]
    parts_w: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"capex_usd": self.capex_usd, "power_w": self.power_w, "parts_usd": dict(self.parts_usd),
                "parts_w": dict(self.parts_w)}


def _by_speed(entries: list[Mapping[str, Any]], gbps: float, what: str) -> Mapping[str, Any]:
    """The slowest entry at least as fast as ``gbps`` (the fastest, if none is)."""
    ok = sorted((e for e in entries if float(e["gbps"]) >= gbps - 1e-6), key=lambda e: float(e["gbps"]))
    if ok:
        return ok[0]
    return max(entries, key=lambda e: float(e["gbps"]))


def switch_price(ports: int, gbps: float, entries: list[Mapping[str, Any]]) -> tuple[float, float]:
    """(price, power) of a switch with ``ports`` ports of ``gbps``: the cheapest catalog switch with enough
    ports at least as fast; with more ports than any, ceil(ports / radix) of the largest fast-enough one."""
    fast = [e for e in entries if float(e["gbps"]) >= gbps - 1e-6] or [max(entries, key=lambda e: float(e["gbps"]))]
    fits = [e for e in fast if int(e["radix"]) >= ports]
    if fits:
        e = min(fits, key=lambda e: float(e["price_usd"]))
        return float(e["price_usd"]), float(e.get("power_w", 0.0))
    big = max(fast, key=lambda e: int(e["radix"]))
    n = math.ceil(ports / int(big["radix"]))
    return n * float(big["price_usd"]), n * float(big.get("power_w", 0.0))


def cluster_cost(cluster: Any, template: str, prices: Mapping[str, Any]) -> ClusterCost:
    """Bill of materials of a built :class:`~topotrain.cluster.Cluster` whose servers come from ``template``."""
    topo = cluster.topology
    gpu_price = prices["gpus"].get(cluster.gpu, prices["gpus"]["default"])
    srv = prices["servers"].get(template, prices["servers"]["default"])
    n_gpus = len(topo.gpus)
    tdp_w = float(cluster.gpu_spec.tdp_w) * float(prices.get("gpu_utilization_power", 1.0))
    usd: dict[str, float] = {"gpus": n_gpus * float(gpu_price["price_usd"]),
                             "servers": cluster.servers * float(srv["price_usd"])}
    watts: dict[str, float] = {"gpus": n_gpus * tdp_w, "servers": cluster.servers * float(srv.get("power_w", 0.0))}
    kinds = Counter(getattr(cluster, "server_templates", ()))
    if len(kinds) > 1:  # servers of several templates (cluster.groups): each at its own price and power
        usd["servers"] = sum(n * float(prices["servers"].get(t, prices["servers"]["default"])["price_usd"])
                             for t, n in kinds.items())
        watts["servers"] = sum(n * float(prices["servers"].get(t, prices["servers"]["default"]).get("power_w", 0.0))
                               for t, n in kinds.items())
    if getattr(cluster, "mixed", False):  # a mixed cluster: each GPU type at its own price and power
        counts = Counter(cluster.gpu_of(r) for r in range(n_gpus))
        usd["gpus"] = sum(n * float(prices["gpus"].get(g, prices["gpus"]["default"])["price_usd"])
                          for g, n in counts.items())
        watts["gpus"] = sum(n * float(cluster.spec_of(g).tdp_w) * float(prices.get("gpu_utilization_power", 1.0))
                            for g, n in counts.items())
    kind = {n: str(nd.kind) for n, nd in topo.nodes.items()}
    # undirected network links (NIC–switch, switch–switch, NIC–NIC for switchless networks)
    seen: set[tuple[str, str]] = set()
    ports: dict[str, list[float]] = {}
    nic_speed: dict[str, float] = {}
    cables_usd, cables_w = 0.0, 0.0
    for lk in topo.links:
        ka, kb = kind[lk.src], kind[lk.dst]
        if not ({ka, kb} <= {"nic", "switch"}):
            continue
        pair = (min(lk.src, lk.dst), max(lk.src, lk.dst))
        if pair in seen:
            continue
        seen.add(pair)
        gbps = lk.bandwidth_bytes_per_s * 8 / 1e9
        for n, k in ((lk.src, ka), (lk.dst, kb)):
            if k == "switch":
                ports.setdefault(n, []).append(gbps)
            else:
                nic_speed[n] = max(nic_speed.get(n, 0.0), gbps)
        c = _by_speed(prices["cables"], gbps, "cables")
        if ka == kb == "switch":
            cables_usd += float(c["switch_usd"])
            cables_w += float(c.get("optic_power_w", 0.0))
        else:
            cables_usd += float(c["nic_usd"])
            cables_w += float(c.get("power_w", 0.0))
    for n, k in kind.items():  # NICs without a network link still cost
        if k == "nic" and n not in nic_speed:
            nic_speed[n] = 0.0
    nics_usd = nics_w = 0.0
    for gbps in nic_speed.values():
        e = _by_speed(prices["nics"], gbps, "nics")
        nics_usd += float(e["price_usd"])
        nics_w += float(e.get("power_w", 0.0))
    sw_usd = sw_w = 0.0
    for speeds in ports.values():
        p, w = switch_price(len(speeds), max(speeds), prices["switches"])
        sw_usd += p
        sw_w += w
    usd.update(nics=nics_usd, switches=sw_usd, cables=cables_usd)
    watts.update(nics=nics_w, switches=sw_w, cables=cables_w)
    return ClusterCost(sum(usd.values()), sum(watts.values()), usd, watts)


@dataclass(frozen=True)
class RunCost:
    """What running a cluster costs: amortized capex plus energy, per second of use."""

    usd_per_s: float
    energy_usd_per_s: float
    capex_usd_per_s: float


def run_cost(cost: ClusterCost, prices: Mapping[str, Any]) -> RunCost:
    """capex / amortization period + power × PUE × electricity price (USD per second)."""
    years = float(prices["amortization_years"])
    capex_s = cost.capex_usd / (years * 365.25 * 86400)
    e = prices["energy"]
    energy_s = cost.power_w / 1000 * float(e["pue"]) * float(e["usd_per_kwh"]) / 3600
    return RunCost(capex_s + energy_s, energy_s, capex_s)
