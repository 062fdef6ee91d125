"""Speed of the network models: collectives and training iterations, flow beside analytical.

Run: ``.venv/bin/python benchmarks/speed.py [--large] [--huge] [--huge-only] [--growth-only] [--ecmp-only]
[--compare-simgrid] [--compare-provisional] [--compare-provisional-only] [--megatron-only]``. Sections:

* ring allreduce of 1 GiB on BiGraph, 64 → 1024 GPUs, flow (GPUs, wall seconds of schedule build +
  routing + simulation, transfers, transfers per second, simulated time);
* the same ring on 1024 GPUs with flow-async and flow-eager (no phase memo: every phase simulated; a 64-GPU ring
  of each runs first, then the best of 3);
* one training iteration, flow and analytical side by side (wall = scenario build + simulation, imports
  not counted, nor the one-time loading of the compiled kernels: a 128-GPU iteration of each model runs
  first; best of 3 runs up to 1,152 GPUs, one run above): GPT-3 175B DP8×TP8×PP16 on 1024 GPUs and on 1,152
  (a fat-tree not fully populated); every timed row starts after a ``gc.collect()``, so that an earlier
  row's garbage is not collected on its time;
  ``--large`` adds 2,048, 4,096 and 8,192 GPUs (about a minute more on a 2-core machine); each row prints its
  growth against GPUs x log2(GPUs) from the 1,024-GPU row (issue 14: no faster than that);
* with ``--large``, the same plan from 1,024 to 8,192 GPUs on a rail-optimized network (each server's NIC k
  on rail k's leaf), the design built for this traffic. The flow model's cost follows its rate-change
  events. On the fat-tree, 1,024 and 8,192 NICs fill a k = 16 and a k = 32 tree exactly, but 1,152, 2,048
  and 4,096 fill k = 18, 22 and 26 trees in part, with 9, 11 and 13 NICs per edge switch: a server's eight
  NICs straddle edge switches, DP-ring flows share uplinks unevenly under hash-based ECMP, run at different
  rates and finish at different times (measured: 9.3k departure events at 1,024 GPUs, 70k at 1,152, 104k at
  2,048, 201k at 4,096, 60k at 8,192, before issue 40). On the rail-optimized network they stay 8-17k at every
  size. Since issue 40 these HDR InfiniBand clusters are routed ``d-mod-k`` by default (the fabric's own); the
  ``--large`` hashed rows name ``routing: ecmp`` (a seed per switch; ``--ecmp-only``: those rows alone, after a
  512-GPU warm-up of each model on the hashed fabric: the compiled kernels loaded);
* a 1T-parameter model (Megatron's 1T: 128 layers, hidden 25,600) TP8 x PP64 on 512 GPUs, interleaved 1F1B
  with 2 virtual stages, global batch 128, flow beside analytical, with CPU seconds and the load average
  (``--megatron-only``: that row alone, after the warm-up of the GPT-3 rows, twice: the second is the figure);
* frontier plans (issue 40), flow beside analytical with flow's wall over analytical's: BLOOM-176B ZeRO-1
  TP4 x PP12 x DP8 with 128 micro-batches per pipeline on 384 A100 (pipeline sends share each server's NVSwitch
  with tensor parallelism); with ``--large`` also GPT-3 175B interleaved (4 virtual stages) on 6,144 H100 and
  Llama-3-405B TP8 x PP16 x DP64/DP128 on 8,192 and 16,384 H100; ``--compare-provisional`` also times the first
  with the flow model's held tasks off and with its provisional schedules off (phase by phase), turn about, best
  of 2; ``--huge`` adds
  Llama-3-405B DP512 on 65,536 H100, the schema's limit (``--huge-only``: the default frontier row as a warm-up,
  then that row alone); each frontier row prints its CPU seconds and the load average beside its wall time;
* a ring allreduce of 1 GiB on 8,192 GPUs read from a graph file (the file is written first, not timed;
  wall = load + schedule + flow);
* ``--compare-simgrid``: the ring rows timed by SimGrid's max-min model too (Debian's python3-simgrid, in a
  subprocess), SimGrid's own simulation wall time beside flow's, with both simulated times.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from topotrain.cluster import Cluster
from topotrain.collectives.registry import build_schedule
from topotrain.network.flow import FlowModel
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate

GiB = 2**30


def bigraph_cluster(n: int, radix: int = 64) -> Cluster:
    """``n`` single-GPU servers on a BiGraph of radix-``radix`` switches, 100 GbE, 1 µs links: the ring rows'
    cluster."""
    return cluster_from_dict({"server": "single-gpu", "servers": n, "network": {
        "topology": "bigraph", "radix": radix, "link": "eth-100g", "latency": "1us"}})


def ring_on_bigraph(n: int) -> tuple[float, float, int, float, float]:
    """(cluster build s, collective s, transfers, simulated s, one uncached phase s)."""
    gc.collect()  # the garbage of earlier rows is not this row's cost
    t0 = time.perf_counter()
    c = bigraph_cluster(n)
    t1 = time.perf_counter()
    sched = build_schedule("allreduce", "ring", c.topology, c.topology.gpus, GiB)
    res = FlowModel().time_schedule(sched, c.topology)
    t2 = time.perf_counter()
    # one phase simulated from scratch (no memo, no route cache): the cost memoization saves per phase
    one = build_schedule("allgather", "ring", c.topology, c.topology.gpus, GiB)
    single = type(one)(one.op, one.algorithm, one.ranks, one.size_bytes, one.chunk_bytes, one.chunk_src,
                       one.chunk_dst, one.phases[:1])
    t3 = time.perf_counter()
    FlowModel().time_schedule(single, c.topology)
    t4 = time.perf_counter()
    return t1 - t0, t2 - t1, sched.num_transfers, res.time_s, t4 - t3


#: runs of the GPT-3 rows up to 1,152 GPUs, the best one shown (the larger rows run once)
GPT3_REPEAT = 3


def gpt3_iteration(network: str, servers: int = 128, topology: str = "fat-tree",
                   routing: str | None = None) -> tuple[float, float, int, float]:
    """GPT-3 175B, TP8 x PP16 x DP(servers/16) on DGX-A100-style servers (a fat-tree, or ``topology``; ties
    between equal paths broken by ``routing``, None: the fabric's own, d-mod-k on this HDR InfiniBand), batch 12
    per replica, 1F1B. Wall time: scenario (cluster build) + simulation; module imports are not counted. Returns
    (wall s, simulated iteration s, tasks, CPU s over the same span)."""
    gc.collect()  # the garbage of earlier rows is not this row's cost
    t0, c0 = time.perf_counter(), time.process_time()
    dp = servers * 8 // (8 * 16)
    sc = scenario_from_dict({
        "cluster": {"server": "nvswitch-8", "servers": servers,
                    "network": {"topology": topology, "link": "ib-hdr-200g",
                                **({"routing": routing} if routing is not None else {})}},
        "model": "gpt3-175b", "batch": 192 * dp,
        "plan": {"tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full"}, "network": network})
    r = simulate(sc)
    return time.perf_counter() - t0, r.iteration_time_s, len(r.tasks), time.process_time() - c0


def ring_async(n: int, network: str) -> tuple[float, float]:
    """(wall s, simulated s) of a 1 GiB ring allreduce on n single-GPU servers on BiGraph with ``network``."""
    from topotrain.network.registry import get_model

    c = bigraph_cluster(n)
    gc.collect()  # the garbage of earlier rows is not this row's cost
    t0 = time.perf_counter()
    sched = build_schedule("allreduce", "ring", c.topology, c.topology.gpus, GiB)
    res = get_model(network, c.network_params).time_schedule(sched, c.topology)
    return time.perf_counter() - t0, res.time_s


def megatron_1t(network: str) -> tuple[float, float, int, float]:
    """Megatron's 1T model, TP8 x PP64 (DP1) on 64 DGX-A100-style servers, interleaved 1F1B with 2 virtual
    stages, global batch 128, micro-batch 1: (wall s = scenario build + simulation, simulated iteration s, tasks,
    CPU s over the same span)."""
    gc.collect()  # the garbage of earlier rows is not this row's cost
    t0, c0 = time.perf_counter(), time.process_time()
    sc = scenario_from_dict({
        "cluster": {"server": "nvswitch-8", "servers": 64,
                    "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
        "model": "megatron-1t", "batch": 128,
        "plan": {"tp": 8, "pp": 64, "micro_batch": 1, "recompute": "full", "pipeline_schedule": "interleaved",
                 "virtual_stages": 2}, "network": network})
    r = simulate(sc)
    return time.perf_counter() - t0, r.iteration_time_s, len(r.tasks), time.process_time() - c0


def megatron_row() -> None:
    """The Megatron 1T row, flow beside analytical, with CPU seconds, flow's wall over analytical's and the load
    average when it ended (the machine may be shared)."""
    print("Megatron 1T one iteration, 512 GPUs (TP8 x PP64, interleaved, 2 virtual stages), flow beside analytical")
    row, walls, cpus = [], {}, {}
    for net in ("analytical", "flow"):
        wall, it, tasks, cpu = megatron_1t(net)
        walls[net], cpus[net] = wall, cpu
        row.append(f"{net}: wall_s={wall:6.2f} cpu_s={cpu:6.2f} simulated_iteration_s={it:.3f}")
    print(f"gpus=  512 tasks={tasks} " + "  ".join(row)
          + f"  flow/analytical = {walls['flow'] / walls['analytical']:.1f}x"
          + f" (cpu {cpus['flow'] / cpus['analytical']:.1f}x)  load={os.getloadavg()[0]:.1f}")


def llama3_405b(dp: int) -> tuple[str, dict[str, object]]:
    """Llama-3-405B TP8 x PP16 (2 virtual stages) x DP``dp`` on ``dp * 128`` H100 (DGX H100 servers) on a
    rail-optimized NDR network, one micro-batch per replica and stage: (label, scenario)."""
    return (f"Llama-3-405B TP8 x PP16 (2 virtual stages) x DP{dp}, {dp * 128:,} H100 on a rail-optimized network",
            {"cluster": {"server": "dgx-h100", "servers": dp * 16,
                         "network": {"topology": "rail-optimized", "link": "ib-ndr-400g", "latency": "1us"}},
             "model": "llama3-405b", "batch": dp * 16,
             "plan": {"tp": 8, "pp": 16, "dp": dp, "micro_batch": 1, "sequence_parallel": True, "zero_stage": 1,
                      "pipeline_schedule": "interleaved", "virtual_stages": 2}})


#: The ``--huge`` row: the schema's limit of 65,536 GPUs (issue 40: simulated with flow in under 2 minutes).
HUGE = llama3_405b(512)


#: Frontier plans (issue 40, "Speed at the frontier"): (label, scenario). Real plans, slower than the tuned GPT-3
#: rows: many micro-batches per pipeline, interleaved stages, pipeline sends sharing a server's NVSwitch with
#: tensor parallelism. The first runs by default, the others with ``--large``.
FRONTIER: tuple[tuple[str, dict[str, object]], ...] = (
    ("BLOOM-176B ZeRO-1 TP4 x PP12 x DP8, 128 micro-batches per pipeline, 384 A100 on a fat-tree",
     {"cluster": {"server": "dgx-a100", "servers": 48, "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
      "model": "bloom-176b", "batch": 1024, "plan": {"tp": 4, "pp": 12, "dp": 8, "zero": 1, "micro_batch": 1}}),
    ("GPT-3 175B interleaved TP8 x PP12 (4 virtual stages) x DP64, 24 micro-batches, 6,144 H100 on a fat-tree",
     {"cluster": {"server": "dgx-h100", "servers": 768,
                  "network": {"topology": "fat-tree", "link": "ib-ndr-400g", "latency": "1us"}},
      "model": "gpt3-175b", "batch": 1536,
      "plan": {"tp": 8, "pp": 12, "dp": 64, "micro_batch": 1, "sequence_parallel": True, "zero_stage": 1,
               "pipeline_schedule": "interleaved", "virtual_stages": 4}}),
    *(llama3_405b(dp) for dp in (64, 128)),
)


def frontier_row(spec: dict[str, object], network: str) -> tuple[float, float, int]:
    """(wall s = scenario build + simulation, simulated iteration s, tasks) of a frontier plan."""
    return frontier_row_cpu(spec, network)[:3]


def frontier_row_cpu(spec: dict[str, object], network: str) -> tuple[float, float, int, float]:
    """:func:`frontier_row` and the process's CPU seconds over the same span (user + system: the figure to compare
    on a shared machine, where the wall time follows the load)."""
    gc.collect()  # the garbage of earlier rows is not this row's cost
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate(scenario_from_dict({**spec, "network": network}))
    return time.perf_counter() - t0, r.iteration_time_s, len(r.tasks), time.process_time() - c0


def provisional_ab(reps: int = 2) -> None:
    """The first frontier row's flow simulation three ways, turn about, best of ``reps`` (CPU seconds, the figure
    to compare on a shared machine, and wall): held tasks and provisional schedules (the default), provisional
    schedules with each blocking collective submitted by itself (``FlowModel(holds=False)``), and phase by phase
    (``FlowModel(provisional=False)``); the answer of each (the same)."""
    from unittest import mock

    from topotrain.network import registry
    from topotrain.network.flow import FlowModel

    label, spec = FRONTIER[0]
    modes = {"held tasks": {}, "collectives one by one": {"holds": False},
             "phase by phase": {"provisional": False}}
    cpu = dict.fromkeys(modes, math.inf)
    wall = dict.fromkeys(modes, math.inf)
    its: dict[str, float] = {}
    for i in range(reps):
        for name in list(modes) if i % 2 == 0 else list(modes)[::-1]:
            kw = modes[name]
            with mock.patch.dict(registry._MODELS, {"flow": lambda p, kw=kw: FlowModel(p, **kw)}):
                w, it, _, c = frontier_row_cpu(spec, "flow")
            cpu[name], wall[name] = min(cpu[name], c), min(wall[name], w)
            its[name] = it
    print(f"{label}, flow (best of {reps}, turn about):")
    for name in modes:
        print(f"  {name:24s} cpu_s={cpu[name]:.2f} wall_s={wall[name]:.2f} iteration {its[name]!r} s")


def frontier_rows(large: bool, huge: bool = False) -> None:
    """The frontier plans, flow beside analytical, with flow's wall over analytical's (target: at most 3x), each
    with its CPU seconds and the load average when it ended (the machine may be shared); ``huge``: the 65,536-GPU
    row too."""
    rows = FRONTIER if large else FRONTIER[:1]
    for label, spec in (*rows, HUGE) if huge else rows:
        print(label + ", flow beside analytical")
        row, walls = [], {}
        for net in ("analytical", "flow"):
            wall, it, tasks, cpu = frontier_row_cpu(spec, net)
            walls[net] = wall
            row.append(f"{net}: wall_s={wall:6.2f} cpu_s={cpu:6.2f} simulated_iteration_s={it:.3f}")
        print(f"tasks={tasks} " + "  ".join(row) + f"  flow/analytical = {walls['flow'] / walls['analytical']:.1f}x"
              f"  load={os.getloadavg()[0]:.1f}")


def graph_file_ring(n: int) -> tuple[float, float, float, float, float]:
    """(load s, schedule s, flow s, simulated s, file MB) of a 1 GiB ring on ``n`` single-GPU servers on a
    BiGraph of radix-128 switches, read back from the graph file ``save_graph`` writes."""
    from topotrain.topology.io import save_graph

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"bigraph-{n}.yaml"
        built = bigraph_cluster(n, radix=128)
        save_graph(built.topology, path, built.network_params.message_overhead_s)
        mb = path.stat().st_size / 1e6
        gc.collect()  # the garbage of earlier rows is not this row's cost
        t0 = time.perf_counter()
        c = cluster_from_dict({"graph": str(path)})
        t1 = time.perf_counter()
        sched = build_schedule("allreduce", "ring", c.topology, c.topology.gpus, GiB)
        t2 = time.perf_counter()
        res = FlowModel(c.network_params).time_schedule(sched, c.topology)
        t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, res.time_s, mb


def simgrid_ring(n: int) -> tuple[float, float] | None:
    """(SimGrid's simulation wall s, simulated s) of the 1 GiB ring on ``n`` GPUs of :func:`ring_on_bigraph`
    (pure max-min, no TCP factors), or None without SimGrid."""
    from topotrain.validate.simgrid_runner import simgrid_python, simulate_simgrid

    if simgrid_python() is None:
        return None
    c = bigraph_cluster(n)
    sched = build_schedule("allreduce", "ring", c.topology, c.topology.gpus, GiB)
    run = simulate_simgrid([(c.topology, [(sched, 0.0)])], tcp_factors=False, params=c.network_params)[0]
    return run.wall_s, run.results[0].time_s


def _nlogn(n: int) -> float:
    return n * math.log2(n)


def gpt3_rows(topology: str, sizes: list[int], routing: str | None = None) -> None:
    """The GPT-3 rows on ``sizes`` servers of ``topology`` (ties broken by ``routing``; None: the fabric's own,
    d-mod-k on InfiniBand), flow beside analytical, each with its flow wall's growth against GPUs x log2(GPUs)
    from this topology's 1,024-GPU row."""
    base: float | None = None
    base_cpu = 0.0
    for servers in sizes:
        print(f"GPT-3 175B one iteration, {servers * 8} GPUs (DP{servers // 16} x TP8 x PP16) on a {topology}"
              + (f" routed {routing}" if routing is not None else "") + ", flow beside analytical"
              + (f", best of {GPT3_REPEAT}" if servers <= 144 else ""))
        row = []
        flow_wall = flow_cpu = 0.0
        for net in ("analytical", "flow"):
            runs = [gpt3_iteration(net, servers, topology, routing)
                    for _ in range(GPT3_REPEAT if servers <= 144 else 1)]
            wall, it, tasks, cpu = min(runs)
            flow_wall, flow_cpu = wall, cpu
            row.append(f"{net}: wall_s={wall:6.2f} cpu_s={cpu:6.2f} simulated_iteration_s={it:.3f}")
        if servers == 128:
            base, base_cpu = flow_wall / _nlogn(1024), flow_cpu / _nlogn(1024)
        growth = (f"  flow / (GPUs·log2 GPUs, 1024-GPU row = 1): wall {flow_wall / _nlogn(servers * 8) / base:.2f}"
                  f" cpu {flow_cpu / _nlogn(servers * 8) / base_cpu:.2f}") if base else ""
        print(f"gpus={servers * 8:5d} tasks={tasks} " + "  ".join(row) + growth + f"  load={os.getloadavg()[0]:.1f}")


def main() -> None:
    large, simgrid, huge = "--large" in sys.argv, "--compare-simgrid" in sys.argv, "--huge" in sys.argv
    if "--growth-only" in sys.argv:  # the fat-tree GPT-3 rows alone, 1,024 to 8,192 GPUs, and their growth curve
        for net in ("analytical", "flow"):
            gpt3_iteration(net, 16)
        gpt3_rows("fat-tree", [128, 144, 256, 512, 1024])
        return
    if "--ecmp-only" in sys.argv:  # the hashed fat-tree rows alone (a seed per switch), 1,024 to 8,192 GPUs
        for net in ("analytical", "flow"):  # one-time costs paid first, on the hashed fabric too
            gpt3_iteration(net, 64, routing="ecmp")
        gpt3_rows("fat-tree", [128, 144, 256, 512, 1024], "ecmp")
        return
    if "--compare-provisional-only" in sys.argv:  # the three flow paths on the BLOOM row alone (after a warm-up)
        frontier_row(FRONTIER[0][1], "analytical")
        frontier_row(FRONTIER[0][1], "flow")
        provisional_ab()
        return
    if "--megatron-only" in sys.argv:  # the Megatron 1T row alone (after a warm-up, as for the GPT-3 rows)
        for net in ("analytical", "flow"):
            gpt3_iteration(net, 16)
        megatron_row()  # twice: the first run also compiles the kernels its joins and holds use (the GPT-3 warm-up
        megatron_row()  # does not reach them; CPU above wall there is numba compiling beside it); the second counts
        return
    if "--huge-only" in sys.argv:  # the 65,536-GPU row alone (after the default frontier row as a warm-up)
        frontier_row(FRONTIER[0][1], "flow")
        frontier_rows(False, huge=True)
        return
    print("ring allreduce 1 GiB on BiGraph (flow model)" + (", SimGrid pure max-min beside" if simgrid else ""))
    prev = None
    for n in (64, 128, 256, 512, 1024):
        build, wall, transfers, sim, phase = ring_on_bigraph(n)
        growth = f" growth=x{wall / prev:.2f}" if prev else ""
        print(f"gpus={n:5d} wall_s={wall:7.3f} transfers={transfers:9d} transfers_per_s={transfers / wall:12.0f} "
              f"simulated_s={sim:.4f} cluster_build_s={build:.3f} one_uncached_phase_s={phase:.4f}{growth}")
        prev = wall
        if simgrid:
            sg = simgrid_ring(n)
            print("          simgrid: not installed (apt-get install -y python3-simgrid)" if sg is None else
                  f"          simgrid: wall_s={sg[0]:8.2f} simulated_s={sg[1]:.4f} ({sg[0] / wall:,.0f}x flow's wall)")
    print(f"ring allreduce 1 GiB on 1024 GPUs, BiGraph, without phase barriers, best of {GPT3_REPEAT}")
    for net in ("flow-async", "flow-eager"):
        ring_async(64, net)  # one-time costs paid first, as for the GPT-3 rows
        wall, sim = min(ring_async(1024, net) for _ in range(GPT3_REPEAT))
        print(f"network={net:10s} wall_s={wall:7.2f} simulated_s={sim:.4f}")
    for net in ("analytical", "flow"):  # one-time costs (compiled kernels loaded, first-use imports) paid first
        gpt3_iteration(net, 16)
    gpt3_rows("fat-tree", [128, 144] + ([256, 512, 1024] if large else []))
    if large:
        gpt3_rows("rail-optimized", [128, 144, 256, 512, 1024])
        gpt3_rows("fat-tree", [128, 144, 256, 512, 1024], "ecmp")  # hashed, a seed per switch (issue 40)
    megatron_row()
    frontier_rows(large, huge)
    if "--compare-provisional" in sys.argv:
        provisional_ab()
    print("ring allreduce 1 GiB on 8192 GPUs from a graph file (flow)")
    load, sched_s, flow_s, sim, mb = graph_file_ring(8192)
    print(f"gpus= 8192 wall_s={load + sched_s + flow_s:6.2f} (load {load:.2f} s of a {mb:.1f} MB file, schedule "
          f"{sched_s:.2f} s, flow {flow_s:.2f} s) simulated_s={sim:.4f}")


if __name__ == "__main__":
    main()
