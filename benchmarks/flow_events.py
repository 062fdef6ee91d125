"""Departure events and rate recomputations of the flow model on the fat-tree GPT-3 rows of ``speed.py``.

Run: ``TOPOTRAIN_KERNEL=numpy .venv/bin/python benchmarks/flow_events.py [servers ...]`` (default 128 144: 1,024
and 1,152 GPUs). The numpy path steps event by event in Python, so the counts are exact and do not depend on the
machine's load (the compiled path takes the same events inside one call); the flow model's cost follows them.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import speed  # noqa: E402
from topotrain.network.flow_network import FlowNetwork  # noqa: E402

COUNTS: collections.Counter[str] = collections.Counter()
_step, _recompute = FlowNetwork._step_event, FlowNetwork._recompute


def _counted_step(self: FlowNetwork) -> None:
    COUNTS["departure_events"] += 1
    _step(self)


def _counted_recompute(self: FlowNetwork, *args: Any, **kwargs: Any) -> Any:
    COUNTS["rate_recomputations"] += 1
    return _recompute(self, *args, **kwargs)


def main() -> None:
    if os.environ.get("TOPOTRAIN_KERNEL") != "numpy":
        print("note: set TOPOTRAIN_KERNEL=numpy, or the compiled departure loop hides its events from the count")
    FlowNetwork._step_event = _counted_step  # type: ignore[method-assign]
    FlowNetwork._recompute = _counted_recompute  # type: ignore[method-assign]
    for servers in [int(a) for a in sys.argv[1:]] or [128, 144]:
        COUNTS.clear()
        _, it, _, _ = speed.gpt3_iteration("flow", servers)
        print(f"gpus={servers * 8:5d} departure_events={COUNTS['departure_events']} "
              f"rate_recomputations={COUNTS['rate_recomputations']} simulated_iteration_s={it!r}")


if __name__ == "__main__":
    main()
