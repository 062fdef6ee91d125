"""Measured allreduce times on the emulated cluster beside the flow and analytical predictions.

:func:`run_case` builds an :class:`~topotrain.testbed.netns.Emulation` of a Topology, starts one
:mod:`~topotrain.testbed.worker` per host, and predicts every (algorithm, size) with both network models
on :meth:`Emulation.scaled_topology` — the same scaled bandwidths and the latencies really emulated.

Calibration of the per-message overhead alpha (:attr:`NetworkParams.message_overhead_s`), once per run: the
first algorithm is run alone at ``calibration_size_bytes`` (small, so the time is almost all overhead)
before the main run, which builds its schedules with the alpha fitted there, and again at that size in
the main run; the alpha of the predictions is fitted to the median of both runs' times pooled. With
``T(α)`` the flow model's time for that schedule, which is affine in α, ``α = (T_meas − T(0)) /
T'`` with ``T' = (T(1 ms) − T(0)) / 1 ms`` (the number of message rounds on the critical path), clipped
at 0. That α — the software cost of one gloo point-to-point message plus the veth/stack latency — is
then used for every prediction of the run (both models). Alpha-beta model: Hockney, "The communication
challenge for MPP", Parallel Computing 1994.

The ``flow-eager`` model (:mod:`topotrain.network.flow_async`: no phase barriers, a send done once its
flow starts, the overhead as CPU time of each rank per phase on the cores the ranks share —
:meth:`Emulation.network_params` gives this machine's core count as ``shared_cpu_cores``) is
fitted the same way to the same calibration run (its time is monotone but not affine in α: bisection)
and predicts every row too.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from topotrain.collectives.registry import build_schedule
from topotrain.network.params import NetworkParams
from topotrain.network.registry import get_model
from topotrain.report.draw import check_picture_path
from topotrain.testbed.netns import Emulation, wait_all
from topotrain.testbed.worker import GLOO, topology_to_dict
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util import progress
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError

__all__ = ["CASES", "Case", "CaseResult", "DDPResult", "calibrate_alpha", "plot", "predict", "run_case", "run_ddp",
           "summarize"]

GBPS = 1e9 / 8  # bytes/s in one Gb/s
EAGER = "flow-eager"  # the barrier-free, eager-send, shared-CPU model, predicted beside flow and analytical
KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class CaseResult:
    """One (algorithm, size) of a case: measured and predicted seconds; ``error`` = flow / measured − 1,
    ``eager_error`` = flow-eager / measured − 1 (with its own fitted overhead ``eager_alpha_s``)."""

    case: str
    algorithm: str
    size_bytes: int
    measured_s: float
    measured_min_s: float
    flow_s: float
    analytical_s: float
    error: float
    analytical_error: float
    alpha_s: float
    bandwidth_scale: float
    correct: bool
    eager_s: float = math.nan
    eager_error: float = math.nan
    eager_alpha_s: float = math.nan


def predict(topo: Topology, params: NetworkParams, algorithm: str, size_bytes: int, model: str,
            build_alpha_s: float | None = None) -> float:
    """Predicted seconds of an allreduce of ``size_bytes`` with ``algorithm`` on all GPUs of ``topo``, timed
    by ``model`` with ``params`` (the overhead alpha and the shared CPU cores).

    ``build_alpha_s``: the per-message overhead the *executed* schedule was built with (size-dependent
    choices such as pipeline chunk counts depend on it), so that the very schedule that ran is timed;
    default ``params.message_overhead_s``."""
    build = params.message_overhead_s if build_alpha_s is None else build_alpha_s
    s = build_schedule("allreduce", algorithm, topo, topo.gpus, int(size_bytes), message_overhead_s=build)
    return float(get_model(model, params).time_schedule(s, topo).time_s)


def calibrate_alpha(topo: Topology, params: NetworkParams, algorithm: str, size_bytes: int, measured_s: float,
                    model: str = "flow") -> float:
    """α such that ``model``'s time of (algorithm, size) equals ``measured_s`` (see module doc): closed
    form for ``flow`` (affine in α), bisection to 1e-9 relative for the others (monotone in α); 0 when
    even α = 0 is slower than measured. The schedule is built with ``params.message_overhead_s``; the fit
    replaces only the overhead it is timed with (the shared cores stay)."""

    def at(a: float) -> float:
        return predict(topo, replace(params, message_overhead_s=a), algorithm, size_bytes, model,
                       build_alpha_s=params.message_overhead_s)

    if model == "flow":
        t0 = at(0.0)
        slope = (at(1e-3) - t0) / 1e-3
        return 0.0 if slope <= 0 else max(0.0, (measured_s - t0) / slope)
    if at(0.0) >= measured_s:
        return 0.0
    lo, hi = 0.0, 1e-3
    while at(hi) < measured_s and hi < 10.0:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if at(mid) < measured_s else (lo, mid)
    return 0.5 * (lo + hi)


def _free_port() -> int:
    return 20000 + (os.getpid() * 7) % 20000


def _launch(emu: Emulation, scaled: Topology, tmp: Path, case: str, algos: Sequence[str], sizes: Sequence[int],
            repeats: int, tag: int, timeout_s: float, extra: Sequence[str] = (),
            build_alpha_s: float = 0.0) -> dict[str, Any]:
    """Start one :mod:`~topotrain.testbed.worker` per host of ``emu`` and return rank 0's results; the
    workers build their schedules with ``build_alpha_s`` as the per-message overhead."""
    world = len(emu.hosts)
    topo_json = tmp / f"topo{tag}.json"
    topo_json.write_text(json.dumps(topology_to_dict(scaled)))
    out = tmp / f"results{tag}.json"
    master = f"{emu.rank_ip(0)}:{_free_port() + tag}"
    procs = []
    for r in range(world):
        env = dict(os.environ, GLOO_SOCKET_IFNAME=emu.rank_iface(r), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        argv = [sys.executable, "-m", "topotrain.testbed.worker", "--rank", str(r), "--world",
                str(world), "--master", master, "--algo", ",".join(algos), "--sizes",
                ",".join(map(str, sizes)), "--repeats", str(repeats), "--topo-json", str(topo_json),
                "--build-alpha", repr(float(build_alpha_s)),
                "--out", str(out), "--timeout", "60", "--deadline", str(timeout_s), *extra]
        procs.append(emu.popen(r, argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
    what = "DDP steps" if extra else f"{len(sizes)} size(s) x {repeats} repeat(s)"
    with progress.task(f"testbed {case}: {', '.join(algos)} on {world} ranks, {what}"):
        codes = wait_all(procs, timeout_s + 10)
    if not out.exists():
        err = procs[0].stderr.read().decode(errors="replace")[-2000:] if procs[0].stderr else ""
        raise RuntimeError(f"case {case}: workers exited {codes} without results: {err}")
    return dict(json.loads(out.read_text()))


def run_case(topo: Topology, algorithms: Sequence[str], sizes: Sequence[int], scale: float = 1 / 500,
             repeats: int = 3, *, name: str | None = None, gloo: bool = False,
             calibration_size_bytes: int = 4 * KiB, latency_scale: float = 1.0, queue_packets: int = 1000,
             timeout_s: float = 240.0, emulation_options: dict[str, Any] | None = None,
             log: Callable[[str], None] | None = None) -> list[CaseResult]:
    """Emulate ``topo`` at ``scale``, time each algorithm × size, and predict each with both models.

    ``gloo`` also times ``torch.distributed.all_reduce`` (its predictions are NaN: topotrain does not
    model gloo's own algorithm). The first result row of each algorithm at ``calibration_size_bytes`` is
    returned too (it is what α was fitted to, so its flow error is ~0 for the first algorithm).
    """
    if not algorithms:
        raise ConfigError("algorithms", "no algorithm given", "pass e.g. ['ring']")
    if repeats < 1:
        raise ConfigError("repeats", f"must be >= 1, got {repeats}", "give e.g. 3")
    case = name or topo.name
    say = log or (lambda _m: None)
    all_sizes = [int(calibration_size_bytes)] + [int(s) for s in sizes if int(s) != calibration_size_bytes]
    algos = list(algorithms) + ([GLOO] if gloo else [])
    with Emulation(topo, bandwidth_scale=scale, latency_scale=latency_scale,
                   queue_packets=queue_packets, **(emulation_options or {})) as emu, \
            emu.tempdir() as tmp:
        for line in emu.describe():
            say("  " + line)
        scaled = emu.scaled_topology()
        base = emu.network_params()
        first = algos[0]

        def launch(run_algos: list[str], sizes_b: list[int], tag: int, alpha_s: float) -> dict[str, Any]:
            return _launch(emu, scaled, Path(tmp), case, run_algos, sizes_b, repeats, tag, timeout_s,
                           build_alpha_s=alpha_s)

        # 1. fit alpha on a small run of the first algorithm; 2. build every executed schedule with that
        # alpha (size-dependent choices such as a tree's pipeline chunk count then suit this testbed) and
        # time exactly those schedules; 3. refit alpha on the pooled times of both small runs of the first
        # algorithm (the separate one and the same size in the main run), so one slow launch on a noisy
        # machine does not skew every prediction; predictions use the refit alpha.
        calib_doc = launch([first], [int(calibration_size_bytes)], 0, base.message_overhead_s)
        c0 = calib_doc["results"][0]
        built_alpha = calibrate_alpha(scaled, base, first, c0["size_bytes"], c0["median_s"])
        doc = launch(algos, all_sizes, 1, built_alpha)  # the main run builds its schedules with it
    built = replace(base, message_overhead_s=built_alpha)
    rows = {(d["algorithm"], d["size_bytes"]): d for d in doc["results"]}
    again = rows.get((first, c0["size_bytes"]), {})
    pooled = statistics.median(list(c0.get("times_s", [c0["median_s"]])) + list(again.get("times_s", [])))
    alpha = calibrate_alpha(scaled, built, first, c0["size_bytes"], pooled)  # schedules built with built_alpha
    eager_alpha = calibrate_alpha(scaled, built, first, c0["size_bytes"], pooled, EAGER)
    say(f"  alpha = {alpha * 1e6:.1f} us (fitted to {first} at {c0['size_bytes']} B: {pooled * 1e3:.2f} ms, "
        f"median of both runs; schedules built with {built_alpha * 1e6:.1f} us)")
    results = []
    for (algo, size), d in rows.items():
        if algo == GLOO:
            fl = an = ea = math.nan
        else:
            fl = predict(scaled, replace(built, message_overhead_s=alpha), algo, size, "flow", built_alpha)
            an = predict(scaled, replace(built, message_overhead_s=alpha), algo, size, "analytical", built_alpha)
            ea = predict(scaled, replace(built, message_overhead_s=eager_alpha), algo, size, EAGER, built_alpha)
        m = float(d["median_s"])
        results.append(CaseResult(case, algo, int(size), m, float(d["min_s"]), fl, an, fl / m - 1.0,
                                  an / m - 1.0, alpha, float(scale), bool(d["correct"]), ea, ea / m - 1.0,
                                  eager_alpha))
    return results


@dataclass(frozen=True)
class DDPResult:
    """A small DDP training run on the emulated cluster: measured seconds per step, and predicted as the
    local compute (measured in the same run, without communication) plus the allreduce of every gradient
    bucket the hook saw, each timed by ``flow`` and ``flow-eager`` (the hook runs each bucket to completion
    before backward goes on, so nothing overlaps). ``gloo`` (DDP's own allreduce) is measured only."""

    case: str
    algorithm: str
    step_s: float
    compute_s: float
    bucket_bytes: tuple[int, ...]
    flow_s: float
    eager_s: float
    loss_first: float
    loss_last: float
    replicas_equal: bool
    checksum: float

    @property
    def error(self) -> float:
        return self.flow_s / self.step_s - 1.0

    @property
    def eager_error(self) -> float:
        return self.eager_s / self.step_s - 1.0


def run_ddp(topo: Topology, algorithms: Sequence[str], steps: int = 5, scale: float = 1 / 500, *,
            name: str | None = None, gloo: bool = True, width: int = 256, batch: int = 32,
            calibration_size_bytes: int = 4 * KiB, timeout_s: float = 240.0, switch_interval_s: float = 0.0,
            emulation_options: dict[str, Any] | None = None) -> list[DDPResult]:
    """Train the worker's seeded MLP with DDP on the emulation of ``topo`` for ``steps`` timed steps per
    algorithm (our comm hook; plus DDP's own gloo allreduce if ``gloo``), and predict each step.

    Alpha is fitted as in :func:`run_case` on a 4 KiB run of the first algorithm (five repeats).
    ``switch_interval_s``: the workers' Python GIL switch interval (0: Python's 5 ms; see
    :mod:`~topotrain.testbed.worker`)."""
    if not algorithms:
        raise ConfigError("algorithms", "no algorithm given", "pass e.g. ['ring']")
    if steps < 1:
        raise ConfigError("steps", f"must be >= 1, got {steps}", "give e.g. 5")
    if width < 1 or batch < 1:
        raise ConfigError("width/batch", f"must be >= 1, got {width}/{batch}", "give e.g. 256 and 32")
    case = name or topo.name
    algos = list(algorithms) + ([GLOO] if gloo else [])
    with Emulation(topo, bandwidth_scale=scale, **(emulation_options or {})) as emu, \
            emu.tempdir() as tmp:
        scaled = emu.scaled_topology()
        base = emu.network_params()
        c0 = _launch(emu, scaled, Path(tmp), case, [algos[0]], [calibration_size_bytes], 5, 0,
                     timeout_s, build_alpha_s=base.message_overhead_s)["results"][0]
        alpha = calibrate_alpha(scaled, base, algos[0], c0["size_bytes"], c0["median_s"])
        eager_alpha = calibrate_alpha(scaled, base, algos[0], c0["size_bytes"], c0["median_s"], EAGER)
        doc = _launch(emu, scaled, Path(tmp), case, algos, [0], 1, 1, timeout_s,
                      ["--ddp-steps", str(steps), "--ddp-width", str(width), "--ddp-batch", str(batch),
                       "--switch-interval", str(switch_interval_s)], build_alpha_s=alpha)
    fitted = replace(base, message_overhead_s=alpha)
    out = []
    for d in doc["results"]:
        algo = str(d["algorithm"])
        buckets = tuple(int(b) for b in d["bucket_bytes"])
        if algo == GLOO:
            fl = ea = math.nan
        else:
            fl = d["compute_s"] + sum(predict(scaled, fitted, algo, b, "flow") for b in buckets)
            ea = d["compute_s"] + sum(predict(scaled, replace(fitted, message_overhead_s=eager_alpha), algo, b, EAGER,
                                              alpha) for b in buckets)
        out.append(DDPResult(case, algo, float(d["median_s"]), float(d["compute_s"]), buckets, float(fl),
                             float(ea), float(d["loss_first"]), float(d["loss_last"]), bool(d["correct"]),
                             float(d["checksum"])))
    return out


# ---- built-in cases -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A small emulated cluster and what to run on it."""

    name: str
    build: Callable[[], Topology]
    algorithms: tuple[str, ...]
    sizes: tuple[int, ...] = (256 * KiB, 1 * MiB, 4 * MiB)
    description: str = ""
    gloo: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _star(name: str, hosts: int, bw: float, lat: float, host_bw: Sequence[float] | None = None) -> Topology:
    t = Topology(name)
    t.add_node("sw", NodeKind.SWITCH)
    for i in range(hosts):
        t.add_node(f"h{i}", NodeKind.GPU)
        t.add_link(f"h{i}", "sw", host_bw[i] if host_bw else bw, lat)
    return t


def single_switch(hosts: int = 4, bw: float = 100 * GBPS, lat: float = 1e-6) -> Topology:
    """``hosts`` hosts on one switch."""
    return _star(f"single-switch-{hosts}", hosts, bw, lat)


def dumbbell(bw: float = 100 * GBPS, middle_bw: float = 25 * GBPS, lat: float = 1e-6) -> Topology:
    """2 + 2 hosts on two switches joined by one thin link."""
    t = Topology("dumbbell")
    for s in ("swA", "swB"):
        t.add_node(s, NodeKind.SWITCH)
    for i in range(4):
        t.add_node(f"h{i}", NodeKind.GPU)
        t.add_link(f"h{i}", "swA" if i < 2 else "swB", bw, lat)
    t.add_link("swA", "swB", middle_bw, lat)
    return t


def incast(bw: float = 100 * GBPS, lat: float = 1e-6) -> Topology:
    """4 hosts on one switch, host h0 behind a link of a quarter the speed: every flow into h0 shares it
    (the tree allreduce's root and the ring's h3→h0 step all cross it)."""
    return _star("incast", 4, bw, lat, host_bw=[bw / 4, bw, bw, bw])


def leaf_spine(bw: float = 100 * GBPS, lat: float = 1e-6) -> Topology:
    """2 leaves × 4 hosts, 2 spines, one link leaf–spine each: 400 Gb/s down, 200 up (2:1)."""
    t = Topology("leaf-spine-2to1")
    for s in ("spine0", "spine1", "leaf0", "leaf1"):
        t.add_node(s, NodeKind.SWITCH)
    for i in range(8):
        t.add_node(f"h{i}", NodeKind.GPU)
        t.add_link(f"h{i}", f"leaf{i // 4}", bw, lat)
    for lf in ("leaf0", "leaf1"):
        for sp in ("spine0", "spine1"):
            t.add_link(lf, sp, bw, lat)
    return t


def small_bigraph(bw: float = 100 * GBPS, lat: float = 1e-6) -> Topology:
    """BiGraph of 4 switches (2 upper, 2 lower) and 8 hosts, attached as topotrain's builder does
    (endpoint e to part e mod 2, switch (e // 2) mod 2): every upper switch linked to every lower one."""
    t = Topology("bigraph-4sw")
    upper, lower = ["upper0", "upper1"], ["lower0", "lower1"]
    for s in upper + lower:
        t.add_node(s, NodeKind.SWITCH)
    for e in range(8):
        t.add_node(f"h{e}", NodeKind.GPU)
        part = upper if e % 2 == 0 else lower
        t.add_link(f"h{e}", part[(e // 2) % 2], bw, lat)
    for u in upper:
        for lo in lower:
            t.add_link(u, lo, bw, lat)
    t.meta["bigraph"] = {"upper": upper, "lower": lower}
    return t


def shared_nic(bw: float = 100 * GBPS, lat: float = 1e-6, eflops: bool = False) -> Topology:
    """Two servers of 2 hosts. Shared: the hosts of a server reach the switch through one PCIe switch
    and one uplink (4× faster host–PCIe links); EFLOPS: every host has its own uplink."""
    t = Topology("eflops-server" if eflops else "shared-nic")
    t.add_node("sw", NodeKind.SWITCH)
    for s in range(2):
        if not eflops:
            t.add_node(f"pcie{s}", NodeKind.PCIE)
            t.add_link(f"pcie{s}", "sw", bw, lat)
        for j in range(2):
            h = f"h{2 * s + j}"
            t.add_node(h, NodeKind.GPU)
            t.add_link(h, "sw" if eflops else f"pcie{s}", bw if eflops else 4 * bw, lat)
    return t


CASES: dict[str, Case] = {c.name: c for c in (
    Case("single-switch", single_switch, ("ring", "halving-doubling"), description="4 hosts, one switch"),
    Case("dumbbell", dumbbell, ("ring", "halving-doubling"), description="2+2 hosts, 25 Gb/s middle link"),
    Case("incast", incast, ("ring", "tree"), description="4 hosts, h0 on a 1/4-speed link"),
    Case("leaf-spine", leaf_spine, ("ring", "halving-doubling"), sizes=(1 * MiB, 4 * MiB),
         description="2 leaves x 4 hosts, 2 spines, 2:1"),
    Case("bigraph", small_bigraph, ("ring", "halving-doubling", "hdrm"), sizes=(1 * MiB, 4 * MiB),
         description="4 switches, 8 hosts", gloo=True),
    Case("shared-nic", shared_nic, ("ring", "halving-doubling"), sizes=(1 * MiB, 4 * MiB),
         description="2 servers x 2 hosts, one uplink per server"),
    Case("eflops-server", lambda: shared_nic(eflops=True), ("ring", "halving-doubling"),
         sizes=(1 * MiB, 4 * MiB),
         description="2 servers x 2 hosts, one uplink per host"),
)}


# ---- summaries and plot ---------------------------------------------------------------------------
def summarize(results: Sequence[CaseResult], calibration_size_bytes: int = 4 * KiB) -> dict[str, float]:
    """Median and worst |error| of flow, analytical and flow-eager over the non-calibration, non-gloo rows."""
    rows = [r for r in results if r.algorithm != GLOO and r.size_bytes > calibration_size_bytes]
    fe = [abs(r.error) for r in rows]
    ae = [abs(r.analytical_error) for r in rows]
    ee = [abs(r.eager_error) for r in rows if r.eager_error == r.eager_error]
    if not rows:
        return {"n": 0.0}
    out = {"n": float(len(rows)), "flow_median": statistics.median(fe), "flow_worst": max(fe),
           "analytical_median": statistics.median(ae), "analytical_worst": max(ae)}
    if ee:
        out |= {"eager_median": statistics.median(ee), "eager_worst": max(ee)}
    return out


def plot(results: Sequence[CaseResult], png: str | Path) -> Path:
    """Predicted (flow, analytical, flow-eager) against measured seconds, log-log, one marker per case; written
    atomically (temporary file, then rename)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.algorithm != GLOO]
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    cases = sorted({r.case for r in rows})
    markers = "osD^v<>ph*"
    for i, c in enumerate(cases):
        rs = [r for r in rows if r.case == c]
        ax.scatter([r.measured_s for r in rs], [r.flow_s for r in rs], marker=markers[i % len(markers)],
                   label=f"{c} (flow)")
        ax.scatter([r.measured_s for r in rs], [r.analytical_s for r in rs], marker=markers[i % len(markers)],
                   facecolors="none", edgecolors="gray")
    eager = [r for r in rows if r.eager_s == r.eager_s]
    if eager:
        ax.scatter([r.measured_s for r in eager], [r.eager_s for r in eager], marker="x", c="k", s=14, lw=0.8,
                   label="flow-eager (all cases)")
    if rows:
        lo = min(min(r.measured_s, r.flow_s) for r in rows) * 0.7
        hi = max(max(r.measured_s, r.flow_s) for r in rows) * 1.4
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.plot([lo, hi], [lo * 1.25, hi * 1.25], "k:", lw=0.6)
        ax.plot([lo, hi], [lo / 1.25, hi / 1.25], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured allreduce time on the emulated cluster (s)")
    ax.set_ylabel("predicted (s): filled = flow, hollow = analytical, x = flow-eager")
    ax.legend(fontsize=7)
    ax.set_title("topotrain predictions vs netns testbed (dotted: ±25%)")
    fig.tight_layout()
    try:
        fmt = check_picture_path(png)
        return atomic_write(png, lambda fh: fig.savefig(fh, format=fmt, dpi=110), make_parents=True)
    finally:
        plt.close(fig)
