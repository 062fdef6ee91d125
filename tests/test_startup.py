"""Start-up stays light (issue 40: a small case costs what it computes): ``topotrain collective`` imports neither
networkx, scipy nor numba before it has work for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
HEAVY = ("networkx", "scipy", "numba", "torch", "matplotlib", "pandas")


def imported_after(code: str) -> list[str]:
    """Which of :data:`HEAVY` a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=env)
    return out.stdout.split()


def test_the_collective_verb_imports_no_heavy_library() -> None:
    assert imported_after("import topotrain.cli.collective") == []


def test_the_adjacency_kept_without_networkx_is_networkx_s() -> None:
    """Topology keeps its own adjacency (routing walks it); the networkx graph built on demand lists every node's
    neighbours in the same order, on a built cluster and on one with a failed and a degraded link."""
    from topotrain.scenario.cluster import cluster_from_dict

    topo = cluster_from_dict({"server": "nvswitch-8", "servers": 4, "network": {
        "topology": "fat-tree", "k": 6, "link": "ib-hdr-200g"}}).topology
    up = next(n for n in topo.adjacency if n.startswith("sw/") and any(v.startswith("sw/") for v in topo.adjacency[n]))
    peer = next(v for v in topo.adjacency[up] if v.startswith("sw/"))
    changed = topo.with_degraded_links([(up, peer, 0.0)])
    for t in (topo, changed):
        assert list(t.adjacency) == list(t.graph.adj)
        for n in t.adjacency:
            assert list(t.adjacency[n]) == list(t.graph.adj[n])
    assert peer in topo.adjacency[up] and peer not in changed.adjacency[up]
    assert changed.graph.number_of_edges() == topo.graph.number_of_edges() - 1


def test_the_registries_import_only_what_is_asked_for() -> None:
    """The collectives' and the network models' tables name their builders by module (loaded on first use): a ring
    timed with the flow model loads neither the other algorithms, synth's tree packer and LP, nor the
    asynchronous or packet models; every name of either table still resolves, to its module's function."""
    code = ("from topotrain.scenario.collective_api import load_cluster, time_collective\n"
            "c = load_cluster({'server': 'nvswitch-8', 'servers': 2, 'network': {'topology': 'single-switch', "
            "'link': 'ib-hdr-200g'}})\n"
            "assert time_collective(c, 'allreduce', 'ring', 1 << 20).time_s > 0\n"
            "import sys\n"
            "print(' '.join(sorted(m.split('.', 1)[1] for m in sys.modules if m.startswith(('topotrain.collectives.', "
            "'topotrain.network.')))))")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    loaded = set(out.stdout.split())
    assert {"collectives.ring", "network.flow"} <= loaded
    assert not loaded & {"collectives.synth", "collectives.synth_lp", "collectives.treepack", "collectives.tree",
                         "collectives.alltoall", "network.flow_async", "network.packet_ns3", "network.analytical"}

    import importlib

    from topotrain.collectives.registry import ALGORITHMS
    from topotrain.network import registry as models
    from topotrain.network.params import NetworkParams

    for info in ALGORITHMS.values():
        module, _, name = info.builder.partition(":")
        assert info.build is getattr(importlib.import_module(f"topotrain.collectives.{module}"), name)
    for name in models.model_names():
        if name != "packet":  # needs the optional ns3 package
            assert models.get_model(name, NetworkParams()).name == name
