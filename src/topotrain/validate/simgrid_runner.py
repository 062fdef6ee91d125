"""SimGrid cross-check: the same topology paths and schedules through SimGrid's flow models, in a subprocess.

SimGrid (Casanova et al., JPDC 2014; flow models validated in Velho et al., ACM TOMACS 2013) is packaged
for the system interpreter (Debian's ``python3-simgrid`` for ``/usr/bin/python3``), not for our virtual
environment, so each case runs ``simgrid_driver.py`` under that interpreter with the case as JSON on stdin
(the driver's docstring has the format and the two model settings). ``tcp_factors=False`` is pure max-min
sharing on the same paths — on barrier-free, equal-latency cases it must equal topotrain's ``flow``;
``True`` is SimGrid's default LV08 calibration of TCP.

Two assumptions differ even in pure mode, and show where paths have unequal latencies: SimGrid's CM02 weighs
a flow's share by its path latency (RTT unfairness of TCP) where ``flow`` shares equally, and a SimGrid
transfer pays its latency before its bytes flow where ``flow`` lets the bytes flow first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.collectives.schedule import Schedule
from topotrain.network.base import CollectiveResult, JobTiming
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

_DRIVER = Path(__file__).with_name("simgrid_driver.py")
#: Interpreter with the ``simgrid`` module (override with the environment variable TOPOTRAIN_SIMGRID_PYTHON).
DEFAULT_SIMGRID_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True, eq=False)
class SimgridRun:
    """One SimGrid simulation: each job's timing and result, and the simulation's wall time."""

    timings: tuple[JobTiming, ...]
    results: tuple[CollectiveResult, ...]
    wall_s: float


@lru_cache(maxsize=4)
def _probe(python: str) -> bool:
    try:
        proc = subprocess.run([python, "-c", "import simgrid"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def simgrid_python() -> str | None:
    """Path of an interpreter that imports ``simgrid``, or None when SimGrid is not installed."""
    python = os.environ.get("TOPOTRAIN_SIMGRID_PYTHON", DEFAULT_SIMGRID_PYTHON)
    exe = shutil.which(python)
    return exe if exe is not None and _probe(exe) else None


def simgrid_case(topo: Topology, jobs: Sequence[tuple[Schedule, float]], params: NetworkParams,
                 tcp_factors: bool) -> dict[str, Any]:
    """The driver's input for ``jobs`` (schedule, start) on ``topo``: only the hosts and links used."""
    host_ids: dict[str, int] = {}
    link_ids: dict[int, int] = {}
    routes: dict[tuple[str, str], list[int]] = {}
    out_jobs = []
    for sched, start_s in jobs:
        phases = []
        for phase in sched.phases:
            sizes = sched.transfer_bytes(phase)
            tr = []
            for s, d, b in zip(phase.src.tolist(), phase.dst.tolist(), sizes.tolist(), strict=True):
                src, dst = sched.ranks[s], sched.ranks[d]
                route = topo.route(src, dst)
                if not route or b <= 0:
                    continue  # a local copy, or nothing to send
                for n in (src, dst):
                    host_ids.setdefault(n, len(host_ids))
                if (src, dst) not in routes:
                    routes[(src, dst)] = [link_ids.setdefault(lid, len(link_ids)) for lid in route]
                tr.append([src, dst, int(b)])
            phases.append(tr)
        out_jobs.append({"start_s": float(start_s), "phases": phases})
    cap, lat = topo.capacity_bytes_per_s, topo.latency_s
    links = [[float(cap[lid]), float(lat[lid])] for lid in sorted(link_ids, key=link_ids.__getitem__)]
    return {"tcp_factors": bool(tcp_factors), "alpha_s": params.message_overhead_s,
            "hosts": sorted(host_ids, key=host_ids.__getitem__) or ["idle"], "links": links,
            "routes": [[s, d, p] for (s, d), p in routes.items()], "jobs": out_jobs}


def _run_one(python: str, case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    proc = subprocess.run([python, str(_DRIVER)], input=json.dumps(case), text=True, capture_output=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
        raise RuntimeError(f"the SimGrid subprocess failed (exit {proc.returncode}):\n{tail}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def simulate_simgrid(cases: Sequence[tuple[Topology, Sequence[tuple[Schedule, float]]]], tcp_factors: bool,
                     params: NetworkParams | None = None, workers: int | None = None,
                     timeout_s: float = 3600.0) -> list[SimgridRun]:
    """Simulate each ``(topology, [(schedule, start_s), ...])`` in SimGrid (one subprocess per case, up to
    ``workers`` at once); the jobs of one case share the network."""
    python = simgrid_python()
    if python is None:
        raise ConfigError("simgrid", "SimGrid is not installed for the system Python",
                          "apt-get install -y python3-simgrid (or set TOPOTRAIN_SIMGRID_PYTHON)")
    params = params if params is not None else NetworkParams()
    built = [simgrid_case(topo, jobs, params, tcp_factors) for topo, jobs in cases]
    n = workers if workers is not None else max(1, min(len(built), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=n) as pool:
        raw = list(pool.map(lambda c: _run_one(python, c, timeout_s), built))
    runs = []
    for (topo, jobs), res in zip(cases, raw, strict=True):
        timings, results = [], []
        for (_sched, start_s), ends in zip(jobs, res["phase_end_s"], strict=True):
            pe = np.asarray(ends, dtype=np.float64)
            finish = float(pe[-1]) if pe.size else float(start_s)
            timings.append(JobTiming(float(start_s), finish, pe))
            prev = np.concatenate(([start_s], pe[:-1])) if pe.size else pe
            results.append(CollectiveResult("simgrid" + ("-tcp" if tcp_factors else ""), finish - float(start_s),
                                            pe - prev, np.zeros(topo.num_links)))
        runs.append(SimgridRun(tuple(timings), tuple(results), float(res["wall_s"])))
    return runs
