"""D-PSGD executed for real (gloo on 127.0.0.1, CPU) beside topotrain's prediction of its step.

Each case starts ``world`` processes on the loopback, each training the same seeded MLP (``width`` wide,
three linear layers, fp32) on its own seeded batches with D-PSGD (topotrain.comm.gossip): forward,
backward, average the flat model with the gossip graph's neighbours, apply the gradient (SGD) — the order
``plan.sync: gossip`` models. Measured, per case (the slowest rank's time, each after a barrier; the four
below interleaved in every repetition, so that the shared machine's load drifts alike over them; medians):

* ``step_s``: one whole D-PSGD step;
* ``compute_s``: the same forward + backward + step on a copy of the model without communication;
* the loopback's per-message overhead α and bandwidth B per rank, from a swap of 4 KiB and of the model's
  size between the pairs (0, 1), (2, 3), … all at once — every rank moving data as in a step, but not the
  gossip pattern itself (``T = α + S/B``, two points).

Predicted: ``compute_s`` + the flow model's time for :func:`topotrain.training.sync.dpsgd_schedule` of the
graph on the host cluster (every rank a node on one switch, links of B, overhead α:
topotrain.traces.cluster.HostCluster). The network namespaces of topotrain.testbed (tc-shaped links) are
not used: this runs on plain loopback, unshaped, so the "network" is the kernel's TCP loopback on the
machine's shared cores.

With ``--emulated SCALE`` the ranks run instead in the network namespaces of topotrain.testbed (one host per
rank on one switch, every link shaped by tc to 100 Gb/s × SCALE; needs root): the prediction then takes the
links' bandwidth from the emulation (nothing fitted but α, from the 4 KiB swap), and the model-sized swap is
predicted too, as a check of the emulated links (``swap`` column).

    PYTHONPATH=src python benchmarks/gossip_measure.py                  # loopback, 6 cases
    PYTHONPATH=src python benchmarks/gossip_measure.py --quick          # 2 cases
    PYTHONPATH=src python benchmarks/gossip_measure.py --emulated 0.01  # 1 Gb/s emulated links
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from topotrain.comm.gossip import exchange, gossip_average, neighbours
from topotrain.network.registry import get_model
from topotrain.testbed.compare import GBPS, single_switch
from topotrain.testbed.netns import Emulation, wait_all
from topotrain.traces.cluster import HostCluster, rank_name
from topotrain.training.sync import GossipOptions, dpsgd_schedule, gossip_edges
from topotrain.util.atomic import atomic_write_text


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


def _max_s(t: float) -> float:
    x = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x.item())


def _worker(rank: int, world: int, port: int, cfg: dict[str, Any], out: Any) -> None:
    """One rank (``out``: a queue, or a file path that rank 0 writes its JSON to)."""
    torch.set_num_threads(1)
    master = cfg.get("master") or f"127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    edges = gossip_edges(world, GossipOptions(graph=cfg["graph"]))
    send_to, recv_from = neighbours(rank, edges)
    model = _model(cfg["width"])
    params = list(model.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach().clone()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(cfg["batch"], cfg["width"], generator=gen)
    y = torch.randint(0, 10, (cfg["batch"],), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()

    def grads() -> torch.Tensor:
        torch.nn.utils.vector_to_parameters(flat, params)
        model.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        return torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])

    def step(comm: bool) -> None:
        g = grads()
        if comm:
            gossip_average(flat, send_to, recv_from)
        flat.add_(g, alpha=-0.01)

    def once(fn: Any) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return _max_s(time.perf_counter() - t0)

    small = torch.zeros(1024)  # fp32: 4 KiB
    big = torch.zeros(flat.numel())  # the model's size
    peer = [rank ^ 1] if (rank ^ 1) < world else []  # pairs (0,1), (2,3), ... swap at once
    step(True)  # warm-up: connections to the neighbours and the peer
    exchange(small, peer, peer)
    # interleaved, so that the machine's load drifts alike over all four
    rows: dict[str, list[float]] = {"compute": [], "small": [], "big": [], "step": []}
    for _ in range(cfg["steps"]):
        rows["compute"].append(once(lambda: step(False)))
        rows["small"].append(once(lambda: exchange(small, peer, peer)))
        rows["big"].append(once(lambda: exchange(big, peer, peer)))
        rows["step"].append(once(lambda: step(True)))
    med = {k: statistics.median(v) for k, v in rows.items()}
    compute, measured = med["compute"], med["step"]
    swap = {small.numel() * 4: med["small"], big.numel() * 4: med["big"]}
    if rank == 0:
        doc = {"compute_s": compute, "step_s": measured, "swap": swap, "model_bytes": flat.numel() * 4}
        if isinstance(out, str):
            atomic_write_text(out, json.dumps(doc))
        else:
            out.put(doc)
    dist.barrier()
    dist.destroy_process_group()


def run_case(world: int, graph: str, width: int, batch: int = 32, steps: int = 9) -> dict[str, Any]:
    """Measure one case (module docstring) and predict it; the row as a dict."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cfg = {"graph": graph, "width": width, "batch": batch, "steps": steps}
    port = _port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, cfg, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = q.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    alpha, bw, comm = _fitted(got, world, graph)
    pred = got["compute_s"] + comm
    return {"world": world, "graph": graph, "width": width, "model_bytes": got["model_bytes"],
            "alpha_s": alpha, "bandwidth_bytes_per_s": bw, "compute_s": got["compute_s"], "comm_pred_s": comm,
            "predicted_s": pred, "measured_s": got["step_s"], "error": pred / got["step_s"] - 1.0}


def _fitted(got: dict[str, Any], world: int, graph: str) -> tuple[float, float, float]:
    """(α, B, the gossip's flow time) with α and B from the pair swaps (``T = α + S/B``, two points) and
    every rank a node on one switch with links of B (HostCluster)."""
    (small, t_small), (big, t_big) = sorted((int(k), v) for k, v in got["swap"].items())
    alpha = t_small  # 4 KiB: almost all per-message overhead
    bw = (big - small) / (t_big - t_small) if t_big > t_small else big / t_big
    host = HostCluster("loopback", bw, 0.0, alpha)
    sched = dpsgd_schedule([rank_name(r) for r in range(world)], gossip_edges(world, GossipOptions(graph=graph)),
                           got["model_bytes"])
    return alpha, bw, get_model("flow", host.params()).time_schedule(sched, host.topology(world)).time_s


def run_emulated(world: int, graph: str, width: int, scale: float, batch: int = 32, steps: int = 9) -> dict[str, Any]:
    """One case on :class:`~topotrain.testbed.netns.Emulation` of ``world`` hosts on one 100 Gb/s switch with
    links shaped to ``100 Gb/s · scale``: the bandwidth is the emulation's (not fitted); α is fitted to the
    4 KiB pair swap as the flow model times it (``α = T_meas − T(α = 0)``, one message round)."""
    topo = single_switch(world, 100 * GBPS)
    with Emulation(topo, bandwidth_scale=scale) as emu, emu.tempdir() as tmp:
        out = str(Path(tmp) / "result.json")
        cfg = json.dumps({"graph": graph, "width": width, "batch": batch, "steps": steps,
                          "master": f"{emu.rank_ip(0)}:{29500 + os.getpid() % 1000}"})
        procs = []
        for r in range(world):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=emu.rank_iface(r), OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            procs.append(emu.popen(r, [sys.executable, os.path.abspath(__file__), "--worker", str(r), str(world),
                                       cfg, out], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_all(procs, 300)
        if not Path(out).exists():
            raise RuntimeError(f"emulated case {world}/{graph}/{width}: the workers wrote no result")
        got = json.loads(Path(out).read_text())
        scaled = emu.scaled_topology()
        base = emu.network_params()
    names = scaled.gpus
    small = min(int(k) for k in got["swap"])
    pairs = [(r, r ^ 1) for r in range(world) if (r ^ 1) < world]
    t0 = get_model("flow", replace(base, message_overhead_s=0.0)).time_schedule(
        dpsgd_schedule(names, pairs, small), scaled).time_s
    alpha = max(0.0, got["swap"][str(small)] - t0)
    params = replace(base, message_overhead_s=alpha)
    flow = get_model("flow", params)
    comm = flow.time_schedule(dpsgd_schedule(names, gossip_edges(world, GossipOptions(graph=graph)),
                                             got["model_bytes"]), scaled).time_s
    big = max(int(k) for k in got["swap"])
    swap_pred = flow.time_schedule(dpsgd_schedule(names, pairs, big), scaled).time_s
    pred = got["compute_s"] + comm
    bw = float(scaled.capacity_bytes_per_s.min())
    fit_alpha, fit_bw, fit_comm = _fitted(got, world, graph)
    return {"world": world, "graph": graph, "width": width, "model_bytes": got["model_bytes"], "alpha_s": alpha,
            "bandwidth_bytes_per_s": bw, "compute_s": got["compute_s"], "comm_pred_s": comm, "predicted_s": pred,
            "measured_s": got["step_s"], "error": pred / got["step_s"] - 1.0,
            "swap_error": swap_pred / got["swap"][str(big)] - 1.0, "swap_bandwidth_bytes_per_s": fit_bw,
            "swap_fit_error": (got["compute_s"] + fit_comm) / got["step_s"] - 1.0}


CASES = [(2, "ring", 512), (3, "ring", 512), (4, "ring", 512), (4, "ring", 1024), (4, "exponential", 1024),
         (4, "ring", 2048)]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":  # one rank of an emulated case (run_emulated)
        _, _, rank, world, cfg, out = sys.argv
        _worker(int(rank), int(world), 0, json.loads(cfg), out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two cases only")
    ap.add_argument("--emulated", type=float, default=0.0, metavar="SCALE",
                    help="run on the testbed's network namespaces, links of 100 Gb/s x SCALE (needs root)")
    args = ap.parse_args()
    cases = CASES[2:4] if args.quick else CASES
    rows = []
    print("| world | graph | model MB | alpha us | link GB/s | compute ms | comm pred ms | predicted ms | "
          "measured ms | error |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world, graph, width in cases:
        r = run_emulated(world, graph, width, args.emulated) if args.emulated > 0 else run_case(world, graph, width)
        rows.append(r)
        print(f"| {world} | {graph} | {r['model_bytes'] / 1e6:.2f} | {1e6 * r['alpha_s']:.0f} | "
              f"{r['bandwidth_bytes_per_s'] / 1e9:.3f} | {1e3 * r['compute_s']:.2f} | {1e3 * r['comm_pred_s']:.2f} | "
              f"{1e3 * r['predicted_s']:.2f} | {1e3 * r['measured_s']:.2f} | {100 * r['error']:+.1f}% |"
              + (f" swap {100 * r['swap_error']:+.1f}%; B from the swap {r['swap_bandwidth_bytes_per_s'] / 1e6:.1f} "
                 f"MB/s: error {100 * r['swap_fit_error']:+.1f}%" if "swap_error" in r else ""))
        sys.stdout.flush()
    for key, what in (("error", "links' bandwidth" if args.emulated > 0 else "fitted"),
                      ("swap_fit_error", "bandwidth from the pair swap")):
        errs = sorted(abs(r[key]) for r in rows if key in r)
        if errs:
            print(f"\n|error| ({what}) median {100 * statistics.median(errs):.1f}%, worst {100 * errs[-1]:.1f}% "
                  f"over {len(errs)} cases")


if __name__ == "__main__":
    main()
