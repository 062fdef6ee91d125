"""A simulation leaves nothing behind: the per-topology caches (shared path caches, HDRM's BiGraph parts) hold
their topology weakly, so a topology and everything routed on it are freed once the caller drops it."""

from __future__ import annotations

import gc
import weakref

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate


def test_a_simulated_topology_is_freed_with_its_scenario() -> None:
    # dp_algorithm auto tries HDRM, which refuses a fat-tree (the refusal is cached per topology)
    sc = scenario_from_dict({
        "cluster": {"server": "nvswitch-8", "servers": 4, "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
        "model": "gpt2-small", "batch": 16, "plan": {"tp": 2, "pp": 2, "micro_batch": 2}, "network": "analytical"})
    simulate(sc)
    topo = weakref.ref(sc.cluster.topology)
    del sc
    gc.collect()
    assert topo() is None
