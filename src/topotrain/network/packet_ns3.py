"""Packet-level network model (``packet``): the same topology and schedules simulated by ns-3, for validation.

ns-3 (Riley & Henderson, *The ns-3 network simulator*, 2010; PyPI package ``ns3``) is an independent,
packet-level reference: every directed link of the :class:`~topotrain.topology.graph.Topology` becomes one
side of a point-to-point channel (the same rate, the same delay, a drop-tail port buffer), every node a
node (switches forward like routers), and every transfer bytes over a persistent TCP connection
(``network/ns3_runner.cc`` has the details). Routes are topotrain's: each connection follows the path
:meth:`Topology.route` gives (the same hash-chosen ECMP path as the fluid models), by per-connection /32
host routes, so what differs from ``flow`` is the transport — slow start, windows, ACK clocking,
store-and-forward serialization per hop, headers, queueing and losses — not the routing. ns-3's mainline
has no RDMA transport (RoCE/InfiniBand verbs), so it offers two transports built from TCP's parts:

* TCP (:class:`PacketConfig`'s defaults): 9000-byte MTU (jumbo frames, as datacenter fabrics run), ns-3's
  default TCP (CUBIC in ns-3.44, slow start from 10 segments) with 16 MiB socket buffers, a 1 ms minimum
  RTO (fine-grained RTO for datacenters, Vasudevan et al., SIGCOMM 2009; ns-3's default of 1 s would make
  one incast loss cost a second), 100-packet drop-tail port buffers.
* lossless, RDMA-like (:meth:`PacketConfig.lossless`): what a RoCE/InfiniBand fabric with PFC assumes and
  the fluid models assume too — the window opens at the socket buffer (no slow start: line-rate injection
  from the first byte), ports too deep to overflow (PFC's losslessness without its pause frames), no
  retransmission timer that can fire, and each sending host serving its connections round robin, a
  packet each (FQ-CoDel with CoDel disabled in front of a one-packet device queue, as an RDMA NIC
  arbitrates its queue pairs). Packets are still stored and forwarded, framed and queued first-in
  first-out at every switch port.

Both acknowledge every segment (RoCE NICs acknowledge per packet; with ns-3's default of one ACK per two
segments its 200 ms delayed-ACK timer stalls a window whose last segment is odd — measured: a 16 MiB
permutation across the dumbbell took 3.3 s instead of 4.3 ms). Connections open before the schedules
start (as NCCL opens its connections when a communicator is created) and carry one byte in the warm-up,
so the peer's scaled window is known (a SYN's window is unscaled, at most 65,535 bytes, RFC 7323 §2.2);
a phase's transfers are posted in the order (dst - src) mod p, as NCCL and MPI post a many-to-many
exchange's; phases keep a barrier and the next phase starts ``message_overhead_s`` after the last
delivery, as ``flow`` charges it. Drops are counted where a full port drops a packet (ns-3's
traffic-control layer, ``TcDrop``: a full device queue stops and the layer drops in front of it).

An ns-3 run cannot be stepped cheaply from outside, so :class:`PacketSim` simulates whole runs: a
submission is only started in ns-3 when the engine asks for the next event, and a new submission reruns
the simulation of everything submitted so far (ns-3 is deterministic, so the completions already reported,
all before the new start, do not change). That is exact and cheap for what the model serves —
``time_schedule`` (one collective alone) and ``topotrain validate`` — and quadratic in the number of
submissions of a training iteration, which is why it is not a model for whole iterations of large
clusters. Clusters beyond :data:`MAX_PACKET_GPUS` GPUs are refused.

ns-3 runs in a subprocess (:mod:`topotrain.network.ns3_driver`): it is a global singleton per process and
loading it takes seconds, so one subprocess runs a whole batch (:func:`simulate_packet`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topotrain.collectives.schedule import Schedule
from topotrain.network.base import AloneJobs, CollectiveResult, JobTiming, check_submit, run_alone
from topotrain.network.ns3_driver import ns3_root
from topotrain.network.params import NetworkParams, require_cut_through
from topotrain.topology.graph import Topology
from topotrain.util import progress
from topotrain.util.errors import ConfigError

#: Largest cluster (GPUs of the topology) the packet model accepts: ns-3 runs of 256 GPUs take minutes.
MAX_PACKET_GPUS = 256
#: Most bytes one packet-level simulation may move (all transfers of all submissions): 64 GiB.
MAX_PACKET_BYTES = 64 << 30
#: the lossless reference's port buffer, packets: 2**20 of 9000 bytes (9.4 GB) holds every byte of the largest
#: case the matrix sends to ns-3 (512 MiB), so no port can drop
LOSSLESS_QUEUE_PACKETS = 1 << 20
#: the lossless reference's initial window, segments: the 16 MiB socket buffer / 8948-byte segments
LOSSLESS_CWND_SEGMENTS = (16 << 20) // (9000 - 52) + 1
_DRIVER = Path(__file__).resolve().with_name("ns3_driver.py")


@dataclass(frozen=True)
class PacketConfig:
    """Transport settings of the ns-3 runs (module docstring)."""

    mtu_bytes: int = 9000
    queue_packets: int = 100
    min_rto_s: float = 1e-3
    tcp_variant: str = "ns3::TcpCubic"
    #: segments per ACK (ns-3's default 2 with its 200 ms delayed-ACK timer stalls windows for 200 ms)
    del_ack_count: int = 1
    #: time before the schedules start in which the connections are opened (not counted)
    warmup_s: float = 0.01
    seed: int = 1
    timeout_s: float = 3600.0
    #: the congestion window a connection opens with, segments; 0 is ns-3's default (10, RFC 6928)
    initial_cwnd_segments: int = 0
    #: whether a sending host serves its connections round robin (a packet each) instead of in write order
    host_fair_queue: bool = False

    @classmethod
    def lossless(cls) -> PacketConfig:
        """The lossless, RDMA-like reference (module docstring): what a RoCE/InfiniBand fabric with PFC
        assumes and mainline TCP does not — no slow start (the window opens at the 16 MiB socket buffer,
        :data:`LOSSLESS_CWND_SEGMENTS`, so a sender injects at line rate as an RDMA NIC does), port buffers
        too deep to overflow (:data:`LOSSLESS_QUEUE_PACKETS`, standing in for PFC's pause frames) and so no
        retransmission timer that can fire (1 s minimum RTO; no packet is lost to time out)."""
        return cls(queue_packets=LOSSLESS_QUEUE_PACKETS, min_rto_s=1.0,
                   initial_cwnd_segments=LOSSLESS_CWND_SEGMENTS, host_fair_queue=True)


@dataclass(frozen=True, eq=False)
class PacketRun:
    """One ns-3 simulation: each job's timing, packets dropped (full ports, routing), ns-3 events, the run's
    wall time."""

    timings: tuple[JobTiming, ...]
    link_bytes: np.ndarray
    drops: int
    events: int
    wall_s: float
    results: tuple[CollectiveResult, ...] = field(default=())


def ns3_available() -> bool:
    """Whether the PyPI ``ns3`` package (headers and libraries) is installed in this interpreter."""
    return ns3_root() is not None


def require_ns3() -> None:
    if not ns3_available():
        raise ConfigError("network", "the packet model needs ns-3, which is not installed",
                          "pip install ns3 (it is in the dev extra: pip install -e '.[dev]')")


def check_packet_size(topo: Topology) -> None:
    """Refuse topologies beyond :data:`MAX_PACKET_GPUS` GPUs (the model's practical size)."""
    n = len(topo.gpus)
    if n > MAX_PACKET_GPUS:
        raise ConfigError("network", f"the packet model (ns-3) simulates at most {MAX_PACKET_GPUS} GPUs, this "
                          f"cluster has {n}", "use the flow model for this cluster (packet is for validation)")


def _node_path(topo: Topology, links: tuple[int, ...]) -> list[str]:
    lk = topo.links
    return [lk[links[0]].src, *(lk[i].dst for i in links)]


def ns3_case(topo: Topology, jobs: Sequence[tuple[Schedule, float]], params: NetworkParams,
             config: PacketConfig) -> tuple[dict[str, Any], np.ndarray]:
    """The arrays the ns-3 runner takes for ``jobs`` (schedule, start) on ``topo``, and the bytes every
    directed link carries (payload, as the other models count them)."""
    check_packet_size(topo)
    names = list(topo.nodes)
    index = {n: i for i, n in enumerate(names)}
    links = topo.links
    by_pair = {(lk.src, lk.dst): lk for lk in links}
    ch_a: list[int] = []
    ch_b: list[int] = []
    r_ab: list[float] = []
    r_ba: list[float] = []
    delay: list[float] = []
    seen: set[tuple[str, str]] = set()
    for lk in links:
        if (lk.src, lk.dst) in seen:
            continue
        back = by_pair.get((lk.dst, lk.src), lk)
        seen.update({(lk.src, lk.dst), (lk.dst, lk.src)})
        ch_a.append(index[lk.src])
        ch_b.append(index[lk.dst])
        r_ab.append(lk.bandwidth_bytes_per_s * 8.0)
        r_ba.append(back.bandwidth_bytes_per_s * 8.0)
        delay.append(0.5 * (lk.latency_s + back.latency_s))
    conn_of: dict[tuple[int, str, str], int] = {}
    conn_src: list[int] = []
    conn_dst: list[int] = []
    fwd_off: list[int] = [0]
    fwd_nodes: list[int] = []
    rev_off: list[int] = [0]
    rev_nodes: list[int] = []
    job_start: list[float] = []
    job_phase_off: list[int] = [0]
    phase_flow_off: list[int] = [0]
    flow_conn: list[int] = []
    flow_bytes: list[float] = []
    link_bytes = np.zeros(topo.num_links)
    total = 0.0
    for j, (sched, start_s) in enumerate(jobs):
        job_start.append(float(start_s))
        p = sched.num_ranks
        for phase in sched.phases:
            sizes = sched.transfer_bytes(phase)
            # a phase's transfers start in the order (dst - src) mod p, then src: every rank posts its sends
            # to rank + 1, rank + 2, ... as NCCL and MPI post a many-to-many exchange's, so that the bytes
            # a sender writes first do not all go to the same few receivers
            order = np.lexsort((phase.src, (phase.dst - phase.src) % max(p, 1))).tolist()
            src_l, dst_l, size_l = phase.src.tolist(), phase.dst.tolist(), sizes.tolist()
            for i in order:
                s, d, b = src_l[i], dst_l[i], size_l[i]
                src, dst = sched.ranks[s], sched.ranks[d]
                route = topo.route(src, dst)
                if not route or b <= 0:
                    continue  # a local copy, or nothing to send
                link_bytes[list(route)] += b
                total += b
                key = (j, src, dst)
                c = conn_of.get(key)
                if c is None:
                    c = conn_of[key] = len(conn_src)
                    conn_src.append(index[src])
                    conn_dst.append(index[dst])
                    fwd_nodes.extend(index[n] for n in _node_path(topo, route))
                    fwd_off.append(len(fwd_nodes))
                    rev_nodes.extend(index[n] for n in _node_path(topo, topo.route(dst, src)))
                    rev_off.append(len(rev_nodes))
                flow_conn.append(c)
                flow_bytes.append(float(b))
            phase_flow_off.append(len(flow_conn))
        job_phase_off.append(len(phase_flow_off) - 1)
    if total > MAX_PACKET_BYTES:
        raise ConfigError("network", f"the packet model (ns-3) moves at most {MAX_PACKET_BYTES >> 30} GiB per "
                          f"simulation, this one moves {total / 2**30:.1f} GiB", "use smaller collectives or flow")
    case = {"n_nodes": len(names), "ch_a": ch_a, "ch_b": ch_b, "rate_ab_bps": r_ab, "rate_ba_bps": r_ba,
            "delay_s": delay, "conn_src": conn_src, "conn_dst": conn_dst, "fwd_off": fwd_off,
            "fwd_nodes": fwd_nodes, "rev_off": rev_off, "rev_nodes": rev_nodes, "job_start_s": job_start,
            "job_phase_off": job_phase_off, "phase_flow_off": phase_flow_off, "flow_conn": flow_conn,
            "flow_bytes": flow_bytes, "alpha_s": params.message_overhead_s, "mtu_bytes": config.mtu_bytes,
            "queue_packets": config.queue_packets, "min_rto_s": config.min_rto_s, "warmup_s": config.warmup_s,
            "seed": config.seed, "tcp_variant": config.tcp_variant, "del_ack_count": config.del_ack_count,
            "initial_cwnd_segments": config.initial_cwnd_segments,
            "host_fair_queue": int(config.host_fair_queue)}
    return case, link_bytes


def run_ns3_cases(cases: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
    """Run the runner's cases in one ns-3 subprocess; raises RuntimeError with its stderr if it fails."""
    require_ns3()
    proc = subprocess.run([sys.executable, str(_DRIVER)], input=json.dumps({"cases": cases}), text=True,
                          capture_output=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the ns-3 subprocess failed (exit {proc.returncode}):\n{tail}")
    out: list[dict[str, Any]] = json.loads(proc.stdout)["results"]
    return out


def simulate_packet(cases: Sequence[tuple[Topology, Sequence[tuple[Schedule, float]]]],
                    params: NetworkParams | None = None, config: PacketConfig | None = None,
                    workers: int = 1) -> list[PacketRun]:
    """Simulate each ``(topology, [(schedule, start_s), ...])`` in ns-3, in ``workers`` subprocesses (cases
    dealt round-robin; each loads ns-3 once); the jobs of one case share the network, cases are independent."""
    params = params if params is not None else NetworkParams()
    require_cut_through(params, "packet (ns-3 simulates its own fabric)")
    config = config if config is not None else PacketConfig()
    built = [ns3_case(topo, jobs, params, config) for topo, jobs in cases]
    n = max(1, min(workers, len(built)))
    raw: list[dict[str, Any]] = [{} for _ in built]
    if built:
        from concurrent.futures import ThreadPoolExecutor

        parts = [list(range(w, len(built), n)) for w in range(n)]
        with progress.task(f"packet model (ns-3): {len(built)} case(s) in {n} subprocess(es)"), \
                ThreadPoolExecutor(max_workers=n) as pool:
            outs = list(pool.map(lambda idx: run_ns3_cases([built[i][0] for i in idx], config.timeout_s), parts))
        for idx, out in zip(parts, outs, strict=True):
            for i, res in zip(idx, out, strict=True):
                raw[i] = res
    runs: list[PacketRun] = []
    for (topo, jobs), (case, link_bytes), res in zip(cases, built, raw, strict=True):
        n_conn = len(case["conn_src"])
        if res["connected"] != n_conn:
            raise RuntimeError(f"ns-3 opened {res['connected']} of {n_conn} connections within the warm-up of "
                               f"{config.warmup_s} s")
        ends = np.asarray(res["phase_end_s"], dtype=np.float64)
        timings: list[JobTiming] = []
        results: list[CollectiveResult] = []
        off = case["job_phase_off"]
        for j, (sched, start_s) in enumerate(jobs):
            pe = ends[off[j]:off[j + 1]]
            if np.any(pe < 0):
                raise RuntimeError(f"ns-3 did not finish job {j} ({sched.algorithm} {sched.op.value})")
            finish = float(pe[-1]) if pe.size else float(start_s)
            timings.append(JobTiming(float(start_s), finish, pe))
            prev = np.concatenate(([start_s], pe[:-1])) if pe.size else pe
            jb = ns3_case(topo, [(sched, 0.0)], params, config)[1] if len(jobs) > 1 else link_bytes
            results.append(CollectiveResult("packet", finish - float(start_s), pe - prev, jb))
        runs.append(PacketRun(tuple(timings), link_bytes, res["drops"], res["events"], float(res["wall_s"]),
                              tuple(results)))
    return runs


class PacketModel:
    """The ``packet`` network model (ns-3; for validation, see the module docstring)."""

    name = "packet"
    contends = True

    def __init__(self, params: NetworkParams | None = None, config: PacketConfig | None = None) -> None:
        self.params = params if params is not None else NetworkParams()
        require_cut_through(self.params, "packet (ns-3 simulates its own fabric)")
        self.config = config if config is not None else PacketConfig()

    def time_alone(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        """One ns-3 run of ``schedule`` alone on ``topo``."""
        return simulate_packet([(topo, [(schedule, 0.0)])], self.params, self.config)[0].results[0]

    def open(self, topo: Topology) -> PacketSim:
        require_ns3()
        check_packet_size(topo)
        return PacketSim(self, topo)

    def time_schedule(self, schedule: Schedule, topo: Topology) -> CollectiveResult:
        return run_alone(self, schedule, topo)


class PacketSim:
    """:class:`~topotrain.network.base.NetworkSim` of the packet model: the submissions so far are simulated
    together in ns-3 when an event is asked for (rerun after each new submission; module docstring)."""

    def __init__(self, model: PacketModel, topo: Topology) -> None:
        self.model = model
        self.topo = topo
        self._alone = AloneJobs(lambda s: model.time_alone(s, topo), topo.num_links)
        self._subs: list[tuple[Schedule, float, object]] = []
        self._run: PacketRun | None = None
        self._reported: set[int] = set()
        self._now_s = 0.0

    def hold(self, parts: Sequence[tuple[Schedule, str]], until_s: float,
             on_release: Callable[[float], None]) -> bool:
        return False  # no contention to hold links against (see FlowSim.hold)

    def submit_started(self, schedule: Schedule, at_s: float, tag: object, key: str) -> None:
        raise AssertionError("no hold is ever granted here")

    def submit(self, schedule: Schedule, at_s: float, tag: object, key: str | None = None,
               alone: bool = False) -> None:
        check_submit(at_s, self._now_s)
        if alone:
            self._alone.submit(schedule, at_s, tag, key)
            return
        self._subs.append((schedule, float(at_s), tag))
        self._run = None

    def _simulated(self) -> PacketRun | None:
        if self._run is None and self._subs:
            jobs = [(s, t) for s, t, _ in self._subs]
            self._run = simulate_packet([(self.topo, jobs)], self.model.params, self.model.config)[0]
        return self._run

    def alone(self, schedule: Schedule, key: str | None = None) -> CollectiveResult:
        return self._alone.result(schedule, key)

    def next_event_s(self, horizon_s: float | None = None) -> float:
        t = self._alone.next_event_s()
        run = self._simulated()
        if run is not None:
            for i, tm in enumerate(run.timings):
                if i not in self._reported:
                    t = min(t, tm.finish_s)
        return t

    def advance(self, to_s: float) -> list[tuple[float, object]]:
        self._now_s = max(self._now_s, to_s)
        out = self._alone.pop_until(to_s)
        run = self._simulated()
        if run is not None:
            for i, tm in enumerate(run.timings):
                if i not in self._reported and tm.finish_s <= to_s:
                    self._reported.add(i)
                    out.append((tm.finish_s, self._subs[i][2]))
        out.sort(key=lambda x: x[0])
        return out

    def timing(self, tag: object) -> JobTiming:
        if self._alone.has(tag):
            return self._alone.timing(tag)
        run = self._simulated()
        for i, (_, _, t) in enumerate(self._subs):
            if t == tag and run is not None:
                return run.timings[i]
        raise KeyError(tag)

    def link_bytes(self) -> np.ndarray:
        run = self._simulated()
        extra = run.link_bytes if run is not None else 0.0
        return self._alone.link_bytes + extra


def packet_model(params: NetworkParams) -> PacketModel:
    """The optional ``packet`` model (ns-3, for validation, run in a subprocess) with ``params``
    (:func:`topotrain.network.registry.get_model`): without the ``ns3`` package it is refused with a ConfigError
    naming the install command."""
    require_ns3()
    return PacketModel(params)
