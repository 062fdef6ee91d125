"""The barrier-free flow model: equal to the barrier model where every rank moves in lock-step, faster where
ranks can run ahead, and bounded below by the analytical per-link drain."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.network.analytical import AnalyticalModel
from topotrain.network.flow import FlowModel
from topotrain.network.flow_async import FlowAsyncModel
from topotrain.topology.graph import Topology


def _switch(p: int, bw: float = 10e9) -> Topology:
    t = Topology("sw", message_overhead_s=1e-6)
    t.add_node("sw", "switch")
    for i in range(p):
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", "sw", bw, 0.0)
    return t


@pytest.mark.parametrize("algo", ["ring", "halving-doubling", "tree"])
def test_equals_barrier_model_in_lock_step(algo: str) -> None:
    t = _switch(8)
    s = build_schedule("allreduce", algo, t, t.gpus, 8 * 2**20)
    assert FlowAsyncModel().time_schedule(s, t).time_s == pytest.approx(FlowModel().time_schedule(s, t).time_s,
                                                                         rel=1e-9)


def test_ranks_run_ahead_without_barrier() -> None:
    """Phase 0: a→b (big) and c→d (small); phase 1: d→c (small). With barriers d→c waits for the big
    transfer; without, it follows c→d at once."""
    t = _switch(4)
    size = 10**8
    small = 10**6
    s = Schedule(CollectiveOp.BROADCAST, "hand", tuple(t.gpus), size, np.array([size, small]), np.array([0, 2]),
                 np.array([-1, -1]),
                 (Phase.of([0, 2], [1, 3], [0, 1], [1, 2], False), Phase.of([3], [2], [1], [2], False)))
    barrier = FlowModel().time_schedule(s, t).time_s
    free = FlowAsyncModel().time_schedule(s, t).time_s
    assert barrier == pytest.approx(size / 10e9 + small / 10e9 + 2e-6, rel=1e-6)
    assert free == pytest.approx(size / 10e9 + 1e-6, rel=1e-6)
    assert free >= AnalyticalModel().time_schedule(s, t).phase_times_s.max() * (1 - 1e-9)
