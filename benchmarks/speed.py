"""Speed of the network models: collectives and training iterations, flow beside analytical.

Run: ``.venv/bin/python benchmarks/speed.py [--large]``. Sections:

* ring allreduce of 1 GiB on BiGraph, 64 → 1024 GPUs, flow (GPUs, wall seconds of schedule build +
  routing + simulation, transfers, transfers per second, simulated time);
* the same ring on 1024 GPUs with flow-async and flow-eager (no phase memo: every phase simulated);
* one training iteration, flow and analytical side by side (wall = scenario build + simulation, imports
  not counted): GPT-3 175B DP8×TP8×PP16 on 1024 GPUs and on 1,152 (a fat-tree not fully populated);
  ``--large`` adds 4,096 and 8,192 GPUs (minutes with flow on a 2-core machine).
"""

from __future__ import annotations

import sys
import time

from topotrain.cluster import cluster_from_dict
from topotrain.collectives.registry import build_schedule
from topotrain.network.flow import FlowModel
from topotrain.training.simulate import scenario_from_dict, simulate

GiB = 2**30


def ring_on_bigraph(n: int) -> tuple[float, float, int, float, float]:
    """(cluster build s, collective s, transfers, simulated s, one uncached phase s)."""
    t0 = time.perf_counter()
    c = cluster_from_dict({"server": "single-gpu", "servers": n, "network": {
        "topology": "bigraph", "radix": 64, "link": "eth-100g", "latency": "1us"}})
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


def gpt3_iteration(network: str, servers: int = 128) -> tuple[float, float, int]:
    """GPT-3 175B, TP8 x PP16 x DP(servers/16) on DGX-A100-style servers (fat-tree), batch 12 per replica,
    1F1B. Wall time: scenario (cluster build) + simulation; module imports are not counted."""
    t0 = time.perf_counter()
    dp = servers * 8 // (8 * 16)
    sc = scenario_from_dict({
        "cluster": {"server": "nvswitch-8", "servers": servers,
                    "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
        "model": "gpt3-175b", "batch": 192 * dp,
        "plan": {"tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full"}, "network": network})
    r = simulate(sc)
    return time.perf_counter() - t0, r.iteration_time_s, len(r.tasks)


def ring_async(n: int, network: str) -> tuple[float, float]:
    """(wall s, simulated s) of a 1 GiB ring allreduce on n single-GPU servers on BiGraph with ``network``."""
    from topotrain.network.registry import get_model

    c = cluster_from_dict({"server": "single-gpu", "servers": n, "network": {
        "topology": "bigraph", "radix": 64, "link": "eth-100g", "latency": "1us"}})
    t0 = time.perf_counter()
    sched = build_schedule("allreduce", "ring", c.topology, c.topology.gpus, GiB)
    res = get_model(network, c.network_params).time_schedule(sched, c.topology)
    return time.perf_counter() - t0, res.time_s


def main() -> None:
    print("ring allreduce 1 GiB on BiGraph (flow model)")
    prev = None
    for n in (64, 128, 256, 512, 1024):
        build, wall, transfers, sim, phase = ring_on_bigraph(n)
        growth = f" growth=x{wall / prev:.2f}" if prev else ""
        print(f"gpus={n:5d} wall_s={wall:7.3f} transfers={transfers:9d} transfers_per_s={transfers / wall:12.0f} "
              f"simulated_s={sim:.4f} cluster_build_s={build:.3f} one_uncached_phase_s={phase:.4f}{growth}")
        prev = wall
    print("ring allreduce 1 GiB on 1024 GPUs, BiGraph, without phase barriers")
    for net in ("flow-async", "flow-eager"):
        wall, sim = ring_async(1024, net)
        print(f"network={net:10s} wall_s={wall:7.2f} simulated_s={sim:.4f}")
    sizes = [128, 144] + ([512, 1024] if "--large" in sys.argv else [])
    for servers in sizes:
        print(f"GPT-3 175B one iteration, {servers * 8} GPUs (DP{servers // 16} x TP8 x PP16), flow beside analytical")
        row = []
        for net in ("analytical", "flow"):
            wall, it, tasks = gpt3_iteration(net, servers)
            row.append(f"{net}: wall_s={wall:6.2f} simulated_iteration_s={it:.3f}")
        print(f"gpus={servers * 8:5d} tasks={tasks} " + "  ".join(row))


if __name__ == "__main__":
    main()
