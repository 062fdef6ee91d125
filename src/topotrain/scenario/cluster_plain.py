"""The common cluster section read without pydantic: a template cluster on a network, with plain values.

``topotrain collective``, ``topo show`` and :func:`topotrain.load_cluster` read a ``cluster:`` section and build
it; importing pydantic and building the schema's models (:mod:`topotrain.scenario.cluster_spec`) costs more than
timing a 16-GPU collective. Most sections are plain — a template name, a count, GPU/NIC overrides, a per-message
overhead, an arbitration and a network of a builder, a link or bandwidth, a latency, a routing and numeric builder
parameters — and :func:`plain_cluster` reads exactly those into a :class:`PlainCluster` that holds what the
schema's :class:`~topotrain.scenario.cluster_spec.ClusterSpec` would hold (same attribute names, same values).

Anything else — an inline server, a catalog, a fabric, groups, a graph file, a key the schema does not take, a
value of another type or out of range, ``None`` where the schema needs a value — is not read here: the caller
validates it with the schema (:func:`cluster_spec_of`), so every error message is the schema's own, word for
word. The rule is one-sided: a section read here is one the schema accepts, with equal values; anything doubtful
goes to the schema (tests/test_cluster_plain.py checks both on every example cluster and on mutations of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from topotrain.util.limits import MAX_BUILDER_PARAM, MAX_SERVERS
from topotrain.util.units import parse_bandwidth, parse_time

if TYPE_CHECKING:
    from topotrain.scenario.cluster_spec import ClusterSpec

#: The schema's network builders (``cluster_spec.TopologyName``; tests/test_cluster_plain.py checks they agree).
TOPOLOGIES = ("single-switch", "bigraph", "fat-tree", "leaf-spine", "rail-optimized", "torus", "ring", "dragonfly")
#: The schema's routings (``NetworkSpec.routing``) and arbitrations (``ClusterSpec.arbitration``).
ROUTINGS = ("ecmp", "d-mod-k", "ecmp-shared-seed")
ARBITRATIONS = ("flow", "port")
#: The communication library of a file without ``comm:`` (``CommSpec.library``'s default) and the ones it may name.
DEFAULT_LIBRARY = "nccl"
LIBRARIES = ("nccl", "ideal")
#: ``NetworkSpec.latency``'s default (1 us).
DEFAULT_LATENCY_S = 1e-6

_NETWORK_KEYS = frozenset({"topology", "link", "bandwidth", "latency", "routing"})
_CLUSTER_KEYS = frozenset({"name", "server", "servers", "gpu", "nic", "message_overhead", "arbitration", "network"})


@dataclass(frozen=True)
class PlainNetwork:
    """``cluster.network`` as :class:`~topotrain.scenario.cluster_spec.NetworkSpec` holds it: the builder, the
    switch-to-switch link type or bandwidth (bytes/s), the latency (s), the routing, the builder parameters."""

    topology: str
    link: str | None = None
    bandwidth: float | None = None
    latency: float = DEFAULT_LATENCY_S
    routing: str | None = None
    model_extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PlainCluster:
    """A template cluster as :class:`~topotrain.scenario.cluster_spec.ClusterSpec` holds it (the sections this
    reader does not take are None, as in a spec without them)."""

    server: str
    servers: int = 1
    name: str | None = None
    gpu: str | None = None
    nic: str | None = None
    message_overhead: float | None = None
    arbitration: str | None = None
    network: PlainNetwork | None = None
    fabric: None = None
    catalog: None = None
    graph: None = None
    groups: None = None


class _NotPlain(Exception):
    """This section is not read here: the schema validates it (and words any error)."""


def _name(v: Any, optional: bool = True) -> str | None:
    """A ``Name`` field (strict text, not empty)."""
    if v is None and optional:
        return None
    if type(v) is not str or not v:
        raise _NotPlain
    return v


def _unit(parse: Any, v: Any, label: str, optional: bool = True) -> float | None:
    """A unit-typed field (``Duration``, ``Bandwidth``): the schema's parser, its float as pydantic keeps it."""
    if v is None and optional:
        return None
    try:
        out = parse(v, label)
    except Exception:  # the schema words it
        raise _NotPlain from None
    if type(out) is not float:
        raise _NotPlain
    return out


def _choice(v: Any, names: tuple[str, ...], normalize: bool) -> str | None:
    """A ``Literal`` field (``normalize``: after the schema's strip/lower/``_``→``-``)."""
    if v is None:
        return None
    if type(v) is not str:
        raise _NotPlain
    if normalize:
        v = v.strip().lower().replace("_", "-")
    if v not in names:
        raise _NotPlain
    return v


def _builder_param(v: Any) -> bool:
    """Whether ``NetworkSpec`` takes ``v`` as a builder parameter (a number, text or a list of them, in range)."""
    if isinstance(v, list):
        if not all(isinstance(x, int | float | str) and not isinstance(x, bool) for x in v):
            return False
        nums = [x for x in v if isinstance(x, int | float)]
    elif isinstance(v, int | float | str):
        nums = [v] if isinstance(v, int | float) else []
    else:
        return False
    return all(math.isfinite(x) and abs(x) <= MAX_BUILDER_PARAM for x in nums)


def _network(d: Any) -> PlainNetwork:
    if type(d) is not dict or not all(type(k) is str for k in d) or "topology" not in d:
        raise _NotPlain
    topology = _choice(d["topology"], TOPOLOGIES, normalize=True)
    link = _name(d.get("link"))
    bandwidth = _unit(parse_bandwidth, d.get("bandwidth"), "bandwidth")
    latency = _unit(parse_time, d["latency"], "time", optional=False) if "latency" in d else DEFAULT_LATENCY_S
    routing = _choice(d.get("routing"), ROUTINGS, normalize=True)
    extra = {k: v for k, v in d.items() if k not in _NETWORK_KEYS}
    if topology is None or latency is None or (link is not None and bandwidth is not None):
        raise _NotPlain
    if not all(_builder_param(v) for v in extra.values()):
        raise _NotPlain
    return PlainNetwork(topology, link, bandwidth, latency, routing, extra)


def plain_cluster(d: Any) -> PlainCluster | None:
    """The cluster section ``d`` read as the schema reads it, when it is a plain template cluster (see the module
    docstring); None for anything else (validate it with the schema then)."""
    try:
        if type(d) is not dict or not all(type(k) is str for k in d) or not set(d) <= _CLUSTER_KEYS:
            raise _NotPlain
        servers = d.get("servers", 1)
        if type(servers) is not int or not 1 <= servers <= MAX_SERVERS:
            raise _NotPlain
        network = _network(d["network"]) if d.get("network") is not None else None
        server = _name(d.get("server"), optional=False)
        if server is None or (servers > 1 and network is None):
            raise _NotPlain
        return PlainCluster(server=server, servers=servers, name=_name(d.get("name")), gpu=_name(d.get("gpu")),
                            nic=_name(d.get("nic")),
                            message_overhead=_unit(parse_time, d.get("message_overhead"), "time"),
                            arbitration=_choice(d.get("arbitration"), ARBITRATIONS, normalize=False),
                            network=network)
    except Exception:  # _NotPlain, or a value the checks above choke on: the schema reads (and words) it
        return None


def cluster_spec_of(d: Any, field: str = "cluster") -> ClusterSpec | PlainCluster:
    """The cluster section ``d`` validated: :func:`plain_cluster` where it reads it, else the schema's
    :class:`~topotrain.scenario.cluster_spec.ClusterSpec` (every problem at once, fields under ``field``)."""
    plain = plain_cluster(d)
    if plain is not None:
        return plain
    # deferred: pydantic and the schema's models are built only for a section the plain reader does not take
    from topotrain.scenario.cluster_spec import validated_cluster

    return validated_cluster(d, field)


def plain_library(section: Any) -> str | None:
    """The library of a ``comm:`` section as ``CommSpec`` reads it (``{}``: the default; ``{library: NAME}``,
    stripped and lower-cased), when it is that plain; None for anything else (validate it with the schema)."""
    if type(section) is not dict or not set(section) <= {"library"}:
        return None
    v = section.get("library", DEFAULT_LIBRARY)
    if type(v) is not str or v.strip().lower() not in LIBRARIES:
        return None
    return v.strip().lower()
