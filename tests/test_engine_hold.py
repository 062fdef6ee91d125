"""Held tasks (FlowSim.hold): a compute task whose blocking collectives all find their links free runs as
timed alone in one event; when a transfer needs one of those links earlier, the task is put in the state it has
reached. The answers must be those of the step-by-step path (each collective a provisional schedule) and of the
phase-by-phase path (no provisional schedules at all): same iteration, same task times, same link loads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest

from topotrain.network import registry
from topotrain.network.flow import FlowModel, FlowSim
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate


@contextmanager
def _flow(**kw: bool) -> Iterator[dict[str, int]]:
    """The ``flow`` model with ``FlowModel(**kw)``; counts the holds granted and given up."""
    count = {"granted": 0, "given_up": 0}
    hold, free = FlowSim.hold, FlowSim._free_holds

    def counting_hold(self: FlowSim, *a: Any) -> bool:
        ok = hold(self, *a)
        count["granted"] += int(ok)
        return ok

    def counting_free(self: FlowSim, links: np.ndarray, t: float) -> None:
        before = len(self._holds)
        free(self, links, t)
        count["given_up"] += before - len(self._holds)

    with mock.patch.dict(registry._MODELS, {"flow": lambda p: FlowModel(p, **kw)}), \
            mock.patch.object(FlowSim, "hold", counting_hold), mock.patch.object(FlowSim, "_free_holds", counting_free):
        yield count


def _run(spec: dict[str, Any], **kw: bool) -> tuple[Any, dict[str, int]]:
    with _flow(**kw) as count:
        r = simulate(scenario_from_dict({**spec, "network": "flow"}))
    return r, count


#: plans whose tensor-parallel collectives share a server's NVSwitch with pipeline sends (so the engine cannot
#: call them isolated and times them in the network), with context-parallel rings (compute beside a collective)
PLANS = {
    "tp-pp": {"cluster": {"server": "dgx-a100", "servers": 2, "network": {"topology": "fat-tree",
                                                                          "link": "ib-hdr-200g"}},
              "model": "gpt3-1.3b", "batch": 32,
              "plan": {"tp": 4, "pp": 2, "dp": 2, "micro_batch": 1, "zero": 1}},
    "interleaved": {"cluster": {"server": "dgx-a100", "servers": 2, "network": {"topology": "fat-tree",
                                                                                "link": "ib-hdr-200g"}},
                    "model": "gpt3-2.7b", "batch": 16,
                    "plan": {"tp": 2, "pp": 4, "dp": 2, "micro_batch": 1, "pipeline_schedule": "interleaved",
                             "virtual_stages": 2}},
    "cp": {"cluster": {"server": "dgx-h100", "servers": 2, "network": {"topology": "fat-tree",
                                                                       "link": "ib-ndr-400g"}},
           "model": {"name": "llama3-8b", "seq_len": 8192}, "batch": 8,
           "plan": {"tp": 2, "cp": 2, "pp": 2, "dp": 2, "micro_batch": 1}},
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_held_tasks_give_the_step_by_step_answers(name: str) -> None:
    spec = PLANS[name]
    held, count = _run(spec)
    step, none = _run(spec, holds=False)
    phase, _ = _run(spec, provisional=False)
    assert count["granted"] > 0
    assert none == {"granted": 0, "given_up": 0}
    it = held.iteration_time_s
    for other in (step, phase):
        assert it == pytest.approx(other.iteration_time_s, rel=1e-12)
        assert len(held.tasks) == len(other.tasks)
        for a, b in zip(held.tasks, other.tasks, strict=True):
            assert a.name == b.name
            assert a.start_s == pytest.approx(b.start_s, rel=1e-12, abs=1e-12 * it)
            assert a.end_s == pytest.approx(b.end_s, rel=1e-12, abs=1e-12 * it)
            assert a.blocking_s == pytest.approx(b.blocking_s, rel=1e-9, abs=1e-12 * it)
        # the busiest links' loads (equally loaded links may list in another order)
        assert sorted(u for *_, u in held.link_utilization_top) == pytest.approx(
            sorted(u for *_, u in other.link_utilization_top), rel=1e-9)


@pytest.mark.parametrize("name", ["interleaved", "cp"])
def test_holds_are_given_up_and_still_exact(name: str) -> None:
    """These plans give holds up (a pipeline send or a ring meets a held task's links while it runs): the check
    above then covers the state-at-release path, not only holds that run to their end."""
    _, count = _run(PLANS[name])
    assert 0 < count["given_up"] < count["granted"]
