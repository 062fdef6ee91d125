"""The plain cluster reader (scenario/cluster_plain.py) is the schema's, for the sections it reads: a section it
takes is one pydantic's ClusterSpec accepts, with equal values, and the cluster built from it is the same; anything
else is left to the schema, so every error message stays the schema's."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from topotrain.scenario.cluster import cluster_from_spec
from topotrain.scenario.cluster_plain import (
    ARBITRATIONS,
    DEFAULT_LIBRARY,
    LIBRARIES,
    ROUTINGS,
    TOPOLOGIES,
    PlainCluster,
    PlainNetwork,
    cluster_spec_of,
    plain_cluster,
    plain_library,
)
from topotrain.scenario.cluster_spec import ClusterSpec, CommSpec, NetworkSpec, TopologyName
from topotrain.util.errors import ConfigError
from topotrain.util.problems import validated

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: Plain sections (besides the examples'), each a shape the reader takes.
PLAIN = [
    {"server": "nvswitch-8", "servers": 2, "network": {"topology": "single_switch", "link": "ib-hdr-200g",
                                                       "latency": "1us"}},
    {"server": "dgx-h100"},
    {"name": "r", "server": "single-gpu", "servers": 8, "gpu": "v100", "nic": "eth-100g", "message_overhead": "2us",
     "arbitration": "port", "network": {"topology": " Ring ", "bandwidth": "100Gbps", "routing": "D_MOD_K"}},
    {"server": "eflops", "servers": 16, "network": {"topology": "bigraph", "link": "eth-100g", "switches": 8,
                                                    "radix": 16, "dims": [4, 4], "mode": "x", "flag": True}},
    {"server": "nvswitch-8", "servers": 4, "message_overhead": 0, "network": {"topology": "fat-tree", "k": 6.0,
                                                                             "latency": 0, "routing": None}},
]
#: Values put in place of each field of a plain section: those the schema takes, those it refuses.
ODD = [None, True, False, 0, 1, -1, 2, 2.0, 1.5, 65_536, 65_537, 2**20 + 1, 2**400, "", " ", "x", "1us", "100Gbps",
       "FLOW", "port", "Ring", "fat_tree", "ecmp", "1", math.nan, math.inf, [], [1, 2], [1, True], ["a", 2.5],
       [math.inf], {}, {"topology": "ring"}, ("a",), b"x"]


def example_sections() -> list[Any]:
    out = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        if isinstance(doc, dict) and "cluster" in doc:
            out.append(doc["cluster"])
    return out


def schema(d: Any) -> ClusterSpec | None:
    try:
        return validated(ClusterSpec, copy.deepcopy(d), "cluster")
    except ConfigError:
        return None


def same(plain: PlainCluster, spec: ClusterSpec) -> bool:
    """Every attribute the builder reads, equal and of the same type."""
    for name in ("name", "server", "servers", "gpu", "nic", "message_overhead", "arbitration", "fabric", "catalog",
                 "graph", "groups"):
        a, b = getattr(plain, name), getattr(spec, name)
        if a != b or type(a) is not type(b):
            return False
    if (plain.network is None) != (spec.network is None):
        return False
    if plain.network is not None and spec.network is not None:
        for name in ("topology", "link", "bandwidth", "latency", "routing"):
            a, b = getattr(plain.network, name), getattr(spec.network, name)
            if a != b or type(a) is not type(b):
                return False
        if list((spec.network.model_extra or {}).items()) != list(plain.network.model_extra.items()):
            return False
    return True


def mutations(d: dict[str, Any]) -> list[Any]:
    """``d`` with each field (and each network field) deleted or replaced by each of :data:`ODD`, and with an
    unknown key."""
    out: list[Any] = [{**d, "severs": 2}, {**d, "fabric": {"switching": "cut-through"}}, {**d, "catalog": {}}]
    for key in [*d, "name", "gpu", "nic", "message_overhead", "arbitration", "network"]:
        out.append({k: v for k, v in d.items() if k != key})
        out.extend({**d, key: v} for v in ODD)
    net = d.get("network")
    if isinstance(net, dict):
        for key in [*net, "link", "bandwidth", "latency", "routing", "k"]:
            out.append({**d, "network": {k: v for k, v in net.items() if k != key}})
            out.extend({**d, "network": {**net, key: v}} for v in ODD)
        out.append({**d, "network": {**net, 3: "x"}})
    return out


def test_the_reader_names_the_schema_s_choices() -> None:
    assert get_args(TopologyName) == TOPOLOGIES
    assert get_args(get_args(NetworkSpec.model_fields["routing"].annotation)[0]) == ROUTINGS
    assert get_args(get_args(ClusterSpec.model_fields["arbitration"].annotation)[0]) == ARBITRATIONS
    assert get_args(CommSpec.model_fields["library"].annotation) == LIBRARIES
    assert CommSpec.model_fields["library"].default == DEFAULT_LIBRARY
    assert PlainNetwork("ring").latency == NetworkSpec(topology="ring").latency


def test_what_the_reader_takes_the_schema_takes_with_equal_values() -> None:
    sections = [*example_sections(), *PLAIN]
    taken = 0
    tried = 0
    for base in sections:
        for d in [base, *(mutations(base) if isinstance(base, dict) else [])]:
            tried += 1
            before = copy.deepcopy(d)
            plain = plain_cluster(d)
            assert d == before or d != d  # never changes its input (nan compares unequal to itself)
            spec = schema(d)
            if plain is None:
                continue
            taken += 1
            assert spec is not None, f"the plain reader took {d!r}, which the schema refuses"
            assert same(plain, spec), f"{d!r}: {plain!r} != {spec!r}"
    # not vacuous: the examples' plain sections and most mutations of the plain ones are read here
    assert taken > 400 and tried - taken > 400, (taken, tried)


def test_every_section_the_reader_leaves_is_the_schema_s() -> None:
    """Sections the reader leaves (an inline server, groups, a graph, a bad value) get the schema's result,
    its errors included."""
    for d in [*example_sections(), {"server": "nvswitch-8", "servers": 2}, {"server": "x", "severs": 2},
              {"server": "nvswitch-8", "servers": 0}, {"server": "nvswitch-8", "network": {"topology": "rign"}}]:
        if plain_cluster(d) is not None:
            continue
        try:
            want: Any = validated(ClusterSpec, copy.deepcopy(d), "cluster")
        except ConfigError as e:
            want = str(e)
        try:
            got: Any = cluster_spec_of(d, "cluster")
        except ConfigError as e:
            got = str(e)
        assert got == want


@pytest.mark.parametrize("d", [PLAIN[0], PLAIN[2], *[s for s in example_sections() if plain_cluster(s)][:2]])
def test_a_cluster_built_from_the_plain_reading_is_the_schema_s(d: dict[str, Any]) -> None:
    a = cluster_from_spec(plain_cluster(d))  # type: ignore[arg-type]
    b = cluster_from_spec(validated(ClusterSpec, d, "cluster"))
    assert (a.name, a.gpu, a.servers, a.network, a.network_params) == (b.name, b.gpu, b.servers, b.network,
                                                                        b.network_params)
    assert a.topology.meta == b.topology.meta and list(a.topology.nodes.items()) == list(b.topology.nodes.items())
    assert list(a.topology.adjacency.items()) == list(b.topology.adjacency.items())
    assert list(a.topology.links) == list(b.topology.links) and len(a.topology.links) > 0


def test_the_comm_section_plain_or_the_schema_s() -> None:
    for section in [{}, {"library": "nccl"}, {"library": " Ideal "}, {"library": "gloo"}, {"library": 1},
                    {"libary": "nccl"}, [], None, {"library": None}]:
        got = plain_library(section)
        try:
            want: str | None = validated(CommSpec, section, "comm").library
        except ConfigError:
            want = None
        assert got is None or got == want, section
    assert plain_library({}) == plain_library({"library": "NCCL"}) == "nccl"
