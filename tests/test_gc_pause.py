"""The garbage collector's pause (util/gc_pause.py) and the reference cycles it relies on being absent."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate
from topotrain.util.gc_pause import collector_paused


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector enabled for the test (as in a user's program), its state restored after."""
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


class _Box:
    """A tracked object of the test's own."""


def test_objects_made_in_a_pause_leave_it_old_and_unscanned(collector_on: None) -> None:
    with collector_paused():
        made = [_Box() for _ in range(20_000)]
        assert not gc.isenabled()
        assert gc.get_count()[0] >= 20_000  # counted while paused: the next young collection would scan them
    assert gc.isenabled()
    assert gc.get_count()[0] < 700  # no young collection is due
    old = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in old for o in made[::997])
    with collector_paused(), collector_paused():  # nested: only the outermost re-enables
        pass
    assert gc.isenabled()


def test_a_program_s_frozen_objects_stay_frozen(collector_on: None) -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            _ = [_Box() for _ in range(1000)]
        assert gc.get_freeze_count() == frozen  # not thawed by the pause
    finally:
        gc.unfreeze()


def test_a_dropped_scenario_is_freed_without_the_cyclic_collector() -> None:
    """Topology, router and its routing domains hold no reference cycle (the router holds its topology weakly),
    so one iteration leaves no garbage for the collector: the cluster dies with the scenario by reference count."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        sc = scenario_from_dict({"cluster": {"server": "nvswitch-8", "servers": 4,
                                             "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
                                 "model": "gpt3-1.3b", "batch": 8, "plan": {"tp": 2, "pp": 2}, "network": "flow"})
        topo = weakref.ref(sc.cluster.topology)
        r = simulate(sc)
        assert r.iteration_time_s > 0
        del sc, r
        assert topo() is None
    finally:
        if was:
            gc.enable()
