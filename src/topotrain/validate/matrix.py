"""The validation matrix: topologies x traffic x sizes through every model and both independent references.

Each case is one :class:`~topotrain.collectives.schedule.Schedule` on one topology, timed alone (nothing else
on the network, no per-message overhead: ``message_overhead_s = 0`` so that what is compared is the network)
by ``analytical``, ``flow`` and ``flow-async`` in process, by ns-3 (:mod:`topotrain.network.packet_ns3`,
at packet level, twice: ``ns3`` is mainline TCP, ``ns3-lossless`` the lossless RDMA-like mode of
:meth:`~topotrain.network.packet_ns3.PacketConfig.lossless`) and by SimGrid
(:mod:`topotrain.validate.simgrid_runner`, pure max-min and LV08 TCP factors) in subprocesses. ``flow+pkt``
is flow on ns-3's fabric as :mod:`topotrain.network.switching` describes it (its framing and its
store-and-forward switches, :data:`~topotrain.network.switching.NS3_TCP_JUMBO`): the prediction that
assumes what the packet reference is. Errors are ``(ours - reference) / reference``; wall times are each simulator's
own run (the references' interpreter start-up and library loading are left out, and reported apart).

Topologies are built from scenario dictionaries (:func:`topotrain.scenario.cluster.cluster_from_dict`), GPU-level
(one GPU and one 100 Gb/s NIC a server) except rail-optimized (DGX-A100-like servers, 8 rails).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.collectives.protocol import IDEAL, CommLibrary, on_the_wire
from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.network.analytical import AnalyticalModel
from topotrain.network.base import NetworkModel
from topotrain.network.flow import FlowModel
from topotrain.network.flow_async import FlowAsyncModel
from topotrain.network.packet_ns3 import MAX_PACKET_GPUS, PacketConfig, ns3_available, simulate_packet
from topotrain.network.params import NetworkParams
from topotrain.network.registry import get_model
from topotrain.network.switching import NS3_TCP_JUMBO, PacketFabric
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.topology.graph import Topology
from topotrain.util.atomic import atomic_write, atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.util.progress import task as progress_task
from topotrain.util.units import format_size
from topotrain.validate.simgrid_runner import simgrid_python, simulate_simgrid

KIB, MIB = 1 << 10, 1 << 20
_SINGLE = {"server": "single-gpu", "nic": "eth-100g"}
_NET = {"link": "eth-100g", "latency": "1us"}

#: name → (scenario ``cluster`` mapping, what it is)
TOPOLOGIES: dict[str, tuple[dict[str, Any], str]] = {
    "single-switch": ({**_SINGLE, "servers": 8, "network": {**_NET, "topology": "single-switch"}},
                      "8 hosts on one switch"),
    "dumbbell": ({**_SINGLE, "servers": 8, "network": {**_NET, "topology": "leaf-spine", "leaves": 2, "spines": 1,
                                                       "oversubscription": 4}},
                 "2 switches x 4 hosts, one 100 Gb/s path between them"),
    "leaf-spine-2:1": ({**_SINGLE, "servers": 16, "network": {**_NET, "topology": "leaf-spine",
                                                              "endpoints_per_leaf": 4, "oversubscription": 2}},
                       "4 leaves x 4 hosts, 2:1 oversubscribed"),
    "leaf-spine-4:1": ({**_SINGLE, "servers": 16, "network": {**_NET, "topology": "leaf-spine",
                                                              "endpoints_per_leaf": 4, "oversubscription": 4}},
                       "4 leaves x 4 hosts, 4:1 oversubscribed"),
    "fat-tree-k4": ({**_SINGLE, "servers": 16, "network": {**_NET, "topology": "fat-tree", "k": 4}},
                    "k=4 fat tree, 16 hosts"),
    "fat-tree-k8": ({**_SINGLE, "servers": 128, "network": {**_NET, "topology": "fat-tree", "k": 8}},
                    "k=8 fat tree, 128 hosts"),
    "bigraph": ({**_SINGLE, "servers": 16, "network": {**_NET, "topology": "bigraph", "switches": 4, "radix": 16}},
                "BiGraph of 4 switches, 16 hosts"),
    "torus-2d": ({**_SINGLE, "servers": 16, "network": {**_NET, "topology": "torus", "dims": [4, 4]}},
                 "4x4 torus of switches, 16 hosts"),
    "dragonfly": ({**_SINGLE, "servers": 32, "network": {**_NET, "topology": "dragonfly"}},
                  "dragonfly, 32 hosts"),
    "rail-optimized": ({"server": "dgx-a100", "servers": 2, "network": {**_NET, "topology": "rail-optimized"}},
                       "2 DGX-A100-like servers, 8 rails"),
}

TRAFFIC: tuple[str, ...] = ("one-flow", "incast", "permutation", "ring", "halving-doubling", "tree", "hdrm",
                            "all-to-all")
SIZES_BYTES: tuple[int, ...] = (64 * KIB, 1 * MIB, 16 * MIB, 256 * MIB)
#: the ``--quick`` subset (what the tests run): two topologies, three traffic patterns, one size
QUICK: tuple[tuple[str, str, int], ...] = (
    ("single-switch", "one-flow", 1 * MIB), ("single-switch", "ring", 1 * MIB),
    ("dumbbell", "incast", 1 * MIB), ("dumbbell", "permutation", 1 * MIB),
)
#: the model parameters every case runs with (no software overhead: the network alone is compared)
PARAMS = NetworkParams(message_overhead_s=0.0)


def _p2p(ranks: Sequence[str], src: list[int], dst: list[int], size_bytes: int, name: str) -> Schedule:
    """One phase of point-to-point transfers of ``size_bytes`` each."""
    n = len(src)
    chunks = np.full(n, size_bytes, dtype=np.int64)
    phase = Phase.of(src, dst, list(range(n)), list(range(1, n + 1)), False)
    return Schedule(CollectiveOp.BROADCAST, name, tuple(ranks), size_bytes * n, chunks,
                    np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), (phase,))


def derangement(p: int, seed: int = 0) -> list[int]:
    """A seeded random permutation of 0..p-1 without fixed points (rejection sampling, as expected e ≈ 2.7 tries)."""
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(p)
        if not np.any(perm == np.arange(p)):
            return [int(x) for x in perm]


def traffic_schedule(traffic: str, topo: Topology, size_bytes: int) -> Schedule:
    """The schedule of one traffic pattern over all GPUs of ``topo``: ``one-flow`` (first GPU to last),
    ``incast`` (every GPU to the first, ``size`` each), ``permutation`` (a seeded derangement, ``size`` each),
    ``ring`` / ``halving-doubling`` / ``tree`` / ``hdrm`` allreduce of ``size``, ``all-to-all`` (direct,
    ``size`` per rank). ConfigError when the algorithm does not apply (e.g. hdrm off BiGraph)."""
    ranks = topo.gpus
    p = len(ranks)
    if traffic == "one-flow":
        return _p2p(ranks, [0], [p - 1], size_bytes, traffic)
    if traffic == "incast":
        return _p2p(ranks, list(range(1, p)), [0] * (p - 1), size_bytes, traffic)
    if traffic == "permutation":
        return _p2p(ranks, list(range(p)), derangement(p), size_bytes, traffic)
    if traffic == "all-to-all":
        return build_schedule("all-to-all", "direct", topo, ranks, size_bytes)
    if traffic in ("ring", "halving-doubling", "tree", "hdrm"):
        return build_schedule("allreduce", traffic, topo, ranks, size_bytes, message_overhead_s=0.0)
    raise ConfigError("validate.traffic", f"unknown traffic {traffic!r}", f"use one of {', '.join(TRAFFIC)}")


@dataclass(frozen=True, eq=False)
class Case:
    topology: str
    traffic: str
    size_bytes: int
    topo: Topology
    schedule: Schedule

    @property
    def ranks(self) -> int:
        return self.schedule.num_ranks

    @property
    def wire_bytes(self) -> int:
        return self.schedule.total_bytes()


@dataclass
class Row:
    """One case's times (s), wall times (s) and errors, as written to the CSV."""

    case: Case
    time_s: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    note: str = ""
    #: packets the ns-3 ports dropped, per mode (``tcp``, ``lossless``); -1 where not run
    ns3_drops: dict[str, int] = field(default_factory=dict)

    def err(self, model: str, ref: str) -> float:
        a, b = self.time_s.get(model, np.nan), self.time_s.get(ref, np.nan)
        return float((a - b) / b) if np.isfinite(a) and np.isfinite(b) and b > 0 else float("nan")


OURS = ("analytical", "flow", "flow-async", "flow+pkt")
REFS = ("ns3", "ns3-lossless", "simgrid", "simgrid-tcp")
#: the ns-3 transports the matrix can run: column name -> configuration
NS3_MODES: dict[str, str] = {"tcp": "ns3", "lossless": "ns3-lossless"}
#: flow against each reference, then the packet-fabric prediction against both ns-3 modes (summary order)
PAIRS: tuple[tuple[str, str], ...] = (
    ("flow", "ns3-lossless"), ("flow+pkt", "ns3-lossless"), ("flow", "ns3"), ("flow+pkt", "ns3"),
    ("flow", "simgrid"), ("flow", "simgrid-tcp"), ("flow-async", "ns3-lossless"), ("analytical", "ns3-lossless"))


def flow_on_fabric_s(model: NetworkModel, schedule: Schedule, topo: Topology,
                     fabric: PacketFabric = NS3_TCP_JUMBO) -> float:
    """``model``'s time of ``schedule`` on a packet fabric: the model opened with ``fabric`` in its
    parameters (:attr:`NetworkParams.fabric`), which times the framed schedule and adds each phase's
    store-and-forward pipeline term (:mod:`topotrain.network.switching`)."""
    return get_model(model.name, replace(model.params, fabric=fabric)).time_schedule(schedule, topo).time_s


def build_cases(topologies: Sequence[str] | None = None, traffic: Sequence[str] | None = None,
                sizes_bytes: Sequence[int] | None = None, quick: bool = False,
                library: CommLibrary = IDEAL) -> tuple[list[Case], list[str]]:
    """The cases of the matrix (or of :data:`QUICK`), and one line per combination that does not apply. Each
    case's schedule is put on the wire by ``library`` (:func:`topotrain.collectives.protocol.on_the_wire`)
    before any model or reference times it: ``ideal`` (the default) leaves its bytes as they are, so the
    models and the references compare on the same payload; ``nccl`` adds NCCL's overhead for all of them."""
    wanted: list[tuple[str, str, int]]
    for t in topologies or ():
        if t not in TOPOLOGIES:
            raise ConfigError("--topologies", f"unknown topology {t!r}", f"use some of {', '.join(TOPOLOGIES)}")
    for t in traffic or ():
        if t not in TRAFFIC:
            raise ConfigError("--traffic", f"unknown traffic {t!r}", f"use some of {', '.join(TRAFFIC)}")
    if quick:  # the quick subset, narrowed by the filters given; a filter it cannot honour is refused
        wanted = [w for w in QUICK if (not topologies or w[0] in topologies) and (not traffic or w[1] in traffic)
                  and (not sizes_bytes or w[2] in sizes_bytes)]
        if not wanted:
            listed = "; ".join(f"{t} {tr} {s}B" for t, tr, s in QUICK)
            raise ConfigError("--quick", f"no quick case matches --topologies/--traffic/--sizes (its cases: {listed})",
                              "drop --quick to run the filtered full matrix, or widen the filters")
    else:
        tops = list(topologies or TOPOLOGIES)
        trs = list(traffic or TRAFFIC)
        szs = list(sizes_bytes or SIZES_BYTES)
        wanted = [(t, tr, s) for t in tops for tr in trs for s in szs]
    topos: dict[str, Topology] = {}
    cases: list[Case] = []
    skipped: list[str] = []
    for tname, tr, size in wanted:
        if tname not in topos:
            topos[tname] = cluster_from_dict(TOPOLOGIES[tname][0], field=f"validate.{tname}").topology
        topo = topos[tname]
        try:
            sched = on_the_wire(traffic_schedule(tr, topo, size), topo, library=library)
        except ConfigError as e:
            skipped.append(f"{tname} {tr}: {e.message}")
            continue
        cases.append(Case(tname, tr, size, topo, sched))
    return cases, skipped


@dataclass
class MatrixRun:
    rows: list[Row]
    skipped: list[str]
    #: each reference's elapsed time for the whole matrix (subprocesses, loading, parallel workers), seconds
    elapsed_s: dict[str, float] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def run_matrix(cases: Sequence[Case], *, ns3: bool = True, simgrid: bool = True,
               ns3_max_bytes: float = 2 * 2**30, progress: Callable[[str], None] | None = None,
               ns3_workers: int | None = None, ns3_queue_packets: int | None = None,
               ns3_modes: Sequence[str] = ("tcp", "lossless")) -> MatrixRun:
    """Time every case with our models and the references that are installed and asked for; ns-3 (in each
    of ``ns3_modes``, :data:`NS3_MODES`) only for cases that move at most ``ns3_max_bytes`` (a packet-level
    run costs per packet and hop). ``ns3_queue_packets`` sets the TCP mode's port buffer."""
    for mode in ns3_modes:
        if mode not in NS3_MODES:
            raise ConfigError("--ns3-modes", f"unknown ns-3 mode {mode!r}", f"use some of {', '.join(NS3_MODES)}")
    say = progress or (lambda _m: None)
    import os

    if ns3_workers is None:
        ns3_workers = os.cpu_count() or 1
    rows = [Row(c) for c in cases]
    models: dict[str, NetworkModel] = {"analytical": AnalyticalModel(PARAMS), "flow": FlowModel(PARAMS),
                                       "flow-async": FlowAsyncModel(params=PARAMS)}
    say(f"timing {len(rows)} cases with {', '.join(models)}")
    for r in rows:  # routes are computed once per topology and cached: warm them so no model pays for them
        sched = r.case.schedule
        for ph in sched.phases:
            for s, d in zip(ph.src.tolist(), ph.dst.tolist(), strict=True):
                r.case.topo.route(sched.ranks[s], sched.ranks[d])
    if rows:  # first calls pay one-time costs (imports, caches): warm every model on the smallest case
        small = min(rows, key=lambda r: r.case.wire_bytes).case
        for m in models.values():
            m.time_schedule(small.schedule, small.topo)
    on_fabric = FlowModel(replace(PARAMS, fabric=NS3_TCP_JUMBO))  # flow on ns-3's fabric (the params' hook)
    with progress_task(f"timing {len(rows)} cases with our models", total=len(rows)) as bar:
        for r in rows:
            bar.update(description=f"timing {r.case.topology} {r.case.traffic} {r.case.size_bytes} B")
            for name, m in models.items():
                t0 = time.perf_counter()
                r.time_s[name] = m.time_schedule(r.case.schedule, r.case.topo).time_s
                r.wall_s[name] = time.perf_counter() - t0
            t0 = time.perf_counter()
            r.time_s["flow+pkt"] = on_fabric.time_schedule(r.case.schedule, r.case.topo).time_s
            r.wall_s["flow+pkt"] = time.perf_counter() - t0
            bar.advance()
    run = MatrixRun(rows, [])
    if ns3 and not ns3_available():
        run.missing.append("ns-3 (pip install ns3)")
        ns3 = False
    if simgrid and simgrid_python() is None:
        run.missing.append("SimGrid (apt-get install -y python3-simgrid)")
        simgrid = False
    if ns3:
        todo = [r for r in rows if r.case.wire_bytes <= ns3_max_bytes and len(r.case.topo.gpus) <= MAX_PACKET_GPUS]
        for r in rows:
            if r not in todo:
                r.note = f"ns-3 skipped: {r.case.wire_bytes / 2**30:.1f} GiB > --ns3-max-bytes"
        for mode in ns3_modes:
            key = NS3_MODES[mode]
            say(f"ns-3 ({mode}): {len(todo)} cases")
            t0 = time.perf_counter()
            if mode == "lossless":
                cfg = PacketConfig.lossless()
            else:
                cfg = PacketConfig() if ns3_queue_packets is None else PacketConfig(queue_packets=ns3_queue_packets)
            packet = simulate_packet([(r.case.topo, [(r.case.schedule, 0.0)]) for r in todo], PARAMS, cfg,
                                     workers=ns3_workers)
            total = time.perf_counter() - t0
            for r, pr in zip(todo, packet, strict=True):
                r.time_s[key] = pr.results[0].time_s
                r.wall_s[key] = pr.wall_s
                r.ns3_drops[mode] = pr.drops
            run.elapsed_s[key] = total
    if simgrid:
        for tcp, key in ((False, "simgrid"), (True, "simgrid-tcp")):
            say(f"SimGrid ({'LV08 TCP factors' if tcp else 'pure max-min'}): {len(rows)} cases")
            t0 = time.perf_counter()
            with progress_task(f"SimGrid ({'LV08 TCP' if tcp else 'max-min'}): {len(rows)} cases"):
                sg = simulate_simgrid([(r.case.topo, [(r.case.schedule, 0.0)]) for r in rows], tcp, PARAMS)
            total = time.perf_counter() - t0
            for r, sr in zip(rows, sg, strict=True):
                r.time_s[key] = sr.results[0].time_s
                r.wall_s[key] = sr.wall_s
            run.elapsed_s[key] = total
    return run


def _err_col(ours: str, ref: str) -> str:
    return f"err_{ours.replace('-', '_')}_vs_{ref.replace('-', '_')}"


COLUMNS = ("topology", "traffic", "size_bytes", "ranks", *(f"{m}_s" for m in (*OURS, *REFS)),
           *(_err_col(o, r) for o, r in PAIRS), *(f"wall_{m}_s" for m in (*OURS, *REFS)),
           *(f"ns3_{mode}_drops" for mode in NS3_MODES), "note")


def row_values(r: Row) -> dict[str, Any]:
    c = r.case
    out: dict[str, Any] = {"topology": c.topology, "traffic": c.traffic, "size_bytes": c.size_bytes,
                           "ranks": c.ranks}
    for m in (*OURS, *REFS):
        out[f"{m}_s"] = r.time_s.get(m, float("nan"))
        out[f"wall_{m}_s"] = r.wall_s.get(m, float("nan"))
    for o, ref in PAIRS:
        out[_err_col(o, ref)] = r.err(o, ref)
    for mode in NS3_MODES:
        out[f"ns3_{mode}_drops"] = r.ns3_drops.get(mode, -1)
    out["note"] = r.note
    return out


def write_csv(run: MatrixRun, path: Path) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in run.rows:
        vals = row_values(r)
        w.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in vals.items()})
    return atomic_write_text(path, buf.getvalue(), make_parents=True)


def summary(run: MatrixRun) -> dict[str, Any]:
    """Median and worst |error| of flow (and flow-async, analytical) against each reference; the speed ratio
    reference wall / flow wall on the cases with the largest flow wall times (the top tenth, at least one)."""
    out: dict[str, Any] = {}
    for ours, ref in PAIRS:
        e = np.array([abs(r.err(ours, ref)) for r in run.rows])
        e = e[np.isfinite(e)]
        if e.size:
            worst = max((r for r in run.rows if np.isfinite(r.err(ours, ref))), key=lambda r: abs(r.err(ours, ref)))
            out[f"{ours} vs {ref}"] = {"cases": int(e.size), "median": float(np.median(e)), "worst": float(e.max()),
                                       "within_5pct": int((e <= 0.05).sum()), "within_15pct": int((e <= 0.15).sum()),
                                       "worst_case": f"{worst.case.topology} {worst.case.traffic} "
                                                     f"{worst.case.size_bytes}"}
    for ref in REFS:
        both = [r for r in run.rows if ref in r.wall_s and r.wall_s.get("flow", 0) > 0]
        if not both:
            continue
        both.sort(key=lambda r: r.wall_s[ref], reverse=True)
        top = both[: max(1, len(both) // 10)]
        out[f"speed {ref}/flow"] = {
            "cases": len(top), "ratio_median": float(np.median([r.wall_s[ref] / r.wall_s["flow"] for r in top])),
            "ref_wall_s": float(sum(r.wall_s[ref] for r in top)),
            "flow_wall_s": float(sum(r.wall_s["flow"] for r in top)),
            "largest": f"{top[0].case.topology} {top[0].case.traffic} {top[0].case.size_bytes}"}
    return out


def spread_positions(sizes: Sequence[int], width: float = 0.7) -> tuple[list[float], list[int]]:
    """x positions for a strip plot of cases by size: the distinct sizes become categories 0, 1, 2, ...
    (ascending), and the cases of one size spread evenly over ``width`` around their category, in their
    order, so that many cases at one size stand side by side instead of on one point. Returns (each case's
    x, the distinct sizes)."""
    distinct = sorted(set(int(s) for s in sizes))
    where = {s: i for i, s in enumerate(distinct)}
    count = {s: sum(1 for x in sizes if int(x) == s) for s in distinct}
    seen: dict[int, int] = {}
    xs = []
    for s in sizes:
        k, n = seen.get(int(s), 0), count[int(s)]
        seen[int(s)] = k + 1
        xs.append(where[int(s)] + (0.0 if n == 1 else width * (k / (n - 1) - 0.5)))
    return xs, distinct


def write_png(run: MatrixRun, path: Path) -> Path:
    """flow's time against each reference's (log-log, y = x dashed), and |flow error| of every case as a
    strip by size (the cases of one size side by side: :func:`spread_positions`; ticks labelled in bytes
    with units)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs, distinct = spread_positions([r.case.size_bytes for r in run.rows])
    pos = {id(r): x for r, x in zip(run.rows, xs, strict=True)}
    for ref, marker in (("ns3", "o"), ("ns3-lossless", "D"), ("simgrid", "s"), ("simgrid-tcp", "^")):
        pts = [(r.time_s[ref], r.time_s["flow"]) for r in run.rows if ref in r.time_s]
        if pts:
            x, y = zip(*pts, strict=True)
            ax1.loglog(x, y, marker, ms=4, alpha=0.7, label=ref, mfc="none")
        errs = [(pos[id(r)], 100 * abs(r.err("flow", ref))) for r in run.rows if ref in r.time_s]
        if errs:
            px, e = zip(*errs, strict=True)
            ax2.semilogy(px, np.maximum(e, 1e-4), marker, ms=4, alpha=0.7, label=ref, mfc="none")
    lo, hi = ax1.get_xlim()
    ax1.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    for ax in (ax1.xaxis, ax1.yaxis):
        ax.set_major_locator(LogLocator(base=10, numticks=6))  # decades only: labels never run together
    ax1.tick_params(labelsize=8)
    ax1.set_xlabel("reference time (s)")
    ax1.set_ylabel("topotrain flow time (s)")
    ax1.set_title("flow vs independent references")
    if ax1.get_legend_handles_labels()[0]:  # no reference ran: no legend (and no warning on stderr)
        ax1.legend(fontsize=8)
    ax2.axhline(5.0, color="k", ls="--", lw=0.8)
    ax2.set_xticks(range(len(distinct)))
    ax2.set_xticklabels([format_size(s) for s in distinct], rotation=30 if len(distinct) > 6 else 0,
                        ha="right" if len(distinct) > 6 else "center", fontsize=8)
    if distinct:
        ax2.set_xlim(-0.6, len(distinct) - 0.4)
    ax2.set_xlabel("message size (each case a point, side by side)")
    ax2.set_ylabel("|flow error| (%, floored at 1e-4)")
    ax2.set_title("error by size (dashed: 5%)")
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), make_parents=True)
