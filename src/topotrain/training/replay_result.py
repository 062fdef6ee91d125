"""A replayed trace as ``simulate``'s result (:class:`~topotrain.training.simulate.Result`): the same fields,
JSON and table as a simulated iteration, read off the replay (:mod:`topotrain.training.replay`).

* iteration time: the replayed step;
* breakdown, on the rank whose end is the step's: ``compute_s`` its operators and host gaps, ``exposed``
  its waits for collectives, ``bubble_s`` its start after the earliest rank, ``overlapped_comm_s`` the
  collectives' time beyond its waits (hidden under its operators), no tensor-parallel communication;
* samples/s and tokens/s only when the workload says its global batch (a trace does not), else NaN;
  TFLOP/s and MFU from the FLOPs of the kernels the compute model recognized (a lower bound: unrecognized
  operators count no FLOPs), NaN when the operators keep their measured CPU times;
* memory: not in a trace (0);
* the error band: the **trace-replay regime** — conformal (:func:`topotrain.training.bands.conformal_quantile`)
  over the measured replay errors shipped in ``replay_residuals.json`` (fresh recordings replayed on their
  own host, and resized what-ifs checked against a recording at the new size); a replay on another cluster
  or GPU has no measured row, and its band is unbounded (said so).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from topotrain.training.bands import DEFAULT_LEVEL, Band, conformal_quantile
from topotrain.training.plan import Plan
from topotrain.training.replay import Replay
from topotrain.training.simulate import Breakdown, Result

RESIDUALS_PATH = Path(__file__).with_name("replay_residuals.json")
#: The band's regime for each kind of replay: on the recording host, resized on it, elsewhere.
REGIMES = {"host": "trace-replay/recording-host", "resized": "trace-replay/what-if-world",
           "elsewhere": "trace-replay/another-cluster-or-gpu"}


@lru_cache(maxsize=2)
def replay_errors(path: Path = RESIDUALS_PATH) -> dict[str, tuple[float, ...]]:
    """The shipped relative errors (predicted / measured − 1) per regime key of :data:`REGIMES`."""
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    return {k: tuple(float(r["error"]) for r in doc["rows"] if r["kind"] == k) for k in REGIMES}


def replay_band(kind: str, level: float = DEFAULT_LEVEL) -> Band:
    """The trace-replay band of a replay of ``kind`` (``host``, ``resized``, ``elsewhere``): the conformal
    quantile of the shipped rows' absolute log errors (unbounded without enough rows)."""
    errors = replay_errors().get(kind, ())
    scores = [abs(math.log1p(e)) for e in errors]
    q = conformal_quantile(scores, level) if scores else math.inf
    used = f"{REGIMES[kind]} ({len(scores)} measured replays)" if scores else \
        f"{REGIMES[kind]} (no measured replay: nothing checks it)"
    return Band(level, math.exp(q), REGIMES[kind], used, len(scores))


@dataclass(frozen=True)
class ReplayContext:
    """What a replay's result says beside the replay itself: the scenario's name, the workload's, the GPU
    (or host) the ranks ran on and its peak FLOP/s for MFU (0: none), the network model and library,
    the routing, the global batch (0: not known), the FLOPs one rank's recognized kernels do (0: not
    re-timed), which band applies and the collectives' algorithm (``plan.dp_algorithm``)."""

    scenario: str
    model: str
    gpu: str
    peak_flops_per_s: float
    network: str
    library: str
    routing: str
    global_batch: int
    flops_per_rank: float
    band_kind: str
    algorithm: str = "auto"


def replay_result(r: Replay, ctx: ReplayContext) -> Result:
    """``r`` as a :class:`Result` (module docstring)."""
    world = len(r.replayed)
    crit = r.replayed[r.last_rank]
    t = r.step_s
    compute = crit.op_s + crit.host_gap_s
    exposed = crit.wait_s
    bubble = max(0.0, t - crit.step_s)
    hidden = max(0.0, crit.comm_s - exposed)
    nan = float("nan")
    samples = ctx.global_batch / t if ctx.global_batch and t > 0 else nan
    tflops = ctx.flops_per_rank / t / 1e12 if ctx.flops_per_rank and t > 0 else nan
    mfu = ctx.flops_per_rank / t / ctx.peak_flops_per_s if ctx.flops_per_rank and ctx.peak_flops_per_s and t > 0 \
        else nan
    batch = ctx.global_batch if ctx.global_batch and ctx.global_batch % world == 0 else world
    plan = Plan(dp=world, global_batch=batch, dp_algorithm=ctx.algorithm)
    return Result(ctx.scenario, ctx.model, world, ctx.gpu, plan, ctx.network, t, samples, samples, tflops, mfu,
                  Breakdown(compute, 0.0, exposed, bubble, hidden), 0.0, {}, list(r.tasks),
                  list(r.busiest_links), replay_band(ctx.band_kind), ctx.library, ctx.routing)
