"""D-PSGD and AD-PSGD executed for real (gloo, CPU) beside topotrain's prediction of their step.

Each case starts ``world`` processes on the loopback, each training the same seeded MLP (``width`` wide,
three linear layers, fp32) on its own seeded batches with D-PSGD (topotrain.comm.gossip): forward,
backward, average the flat model with the gossip graph's neighbours, apply the gradient (SGD) — the order
``plan.sync: gossip`` models. AD-PSGD (``ad-psgd`` cases): the pairs of
:func:`~topotrain.training.sync.adpsgd_pairs` (seed 0, the same every step, as the model times them) swap
whole models while both compute their gradient (receives and sends posted before the forward, waited for
after the backward), then average. Measured, per case (the slowest rank's time, each after a barrier; the
four below interleaved in every repetition, so that the shared machine's load drifts alike over them;
medians):

* ``step_s``: one whole D-PSGD step;
* ``compute_s``: the same forward + backward + step on a copy of the model without communication;
* ``mix_s`` (shown, not predicted: ``plan.sync: gossip`` does not charge it): the averaging arithmetic alone
  (adding the received models and dividing), on a copy;
* the loopback's per-message overhead α and bandwidth B per rank, from a swap of 4 KiB and of the model's
  size between the pairs (0, 1), (2, 3), … all at once — every rank moving data as in a step, but not the
  gossip pattern itself (``T = α + S/B``, two points).

Predicted: ``compute_s`` + the flow model's time for :func:`topotrain.training.sync.dpsgd_schedule` of the
graph (AD-PSGD: the larger of ``compute_s`` and the time of ``adpsgd_schedule``, its task having no
predecessor in the iteration) on the host cluster (every rank a node on one switch, links of B, overhead α:
topotrain.traces.cluster.HostCluster). The network namespaces of topotrain.testbed (tc-shaped links) are
not used: this runs on plain loopback, unshaped, so the "network" is the kernel's TCP loopback on the
machine's shared cores.

With ``--emulated SCALE`` the ranks run instead in the network namespaces of topotrain.testbed (one host per
rank on one switch, every link shaped by tc to 100 Gb/s × SCALE; needs root): the prediction then takes the
links' bandwidth from the emulation (nothing fitted but α, from the 4 KiB swap), and the model-sized swap is
predicted too, as a check of the emulated links (``swap`` column). Every emulated run starts with a duplex
check (:func:`duplex_check`): per direction, a 4 MiB transfer one way alone and a two-host swap with the
sends or the receives posted first — gloo serializes a swap whose sends go first (comm/gossip.py's
docstring), the links themselves are full duplex. Each row also prints the machine's load (1-minute load
average, CPU steal) over the case.

    PYTHONPATH=src python benchmarks/gossip_measure.py                  # loopback, 10 cases
    PYTHONPATH=src python benchmarks/gossip_measure.py --quick          # 2 cases
    PYTHONPATH=src python benchmarks/gossip_measure.py --emulated 0.002 # 200 Mb/s emulated links (root)
    PYTHONPATH=src python benchmarks/gossip_measure.py --duplex 0.001,0.002,0.004  # the duplex check alone
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

from topotrain.comm.gossip import exchange, gossip_average, neighbours, post_exchange, wait_requests
from topotrain.network.registry import get_model
from topotrain.testbed.compare import GBPS, single_switch
from topotrain.testbed.netns import Emulation, wait_all
from topotrain.testbed.shaping import TCP_PAYLOAD_EFFICIENCY
from topotrain.traces.cluster import HostCluster, rank_name
from topotrain.training.sync import GossipOptions, adpsgd_pairs, adpsgd_schedule, dpsgd_schedule, gossip_edges
from topotrain.util.atomic import atomic_write_text


def _edges(world: int, graph: str, algorithm: str = "d-psgd") -> list[tuple[int, int]]:
    """The directed edges a step moves the model along: the gossip graph's (D-PSGD), or AD-PSGD's pairs of
    that graph both ways (seed 0; the same pairs every step, as the model times them)."""
    edges = gossip_edges(world, GossipOptions(graph=graph))  # type: ignore[arg-type]
    if algorithm != "ad-psgd":
        return edges
    pairs = adpsgd_pairs(world, edges, 0)
    return sorted({(a, b) for a, b in pairs} | {(b, a) for a, b in pairs})


def _schedule(names: list[str], graph: str, algorithm: str, model_bytes: int) -> Any:
    """The schedule topotrain times for this step's exchange (training/sync.py)."""
    if algorithm == "ad-psgd":
        edges = gossip_edges(len(names), GossipOptions(graph=graph))  # type: ignore[arg-type]
        return adpsgd_schedule(names, adpsgd_pairs(len(names), edges, 0), model_bytes)
    return dpsgd_schedule(names, _edges(len(names), graph), model_bytes)


def _predicted(compute_s: float, comm_s: float, algorithm: str) -> float:
    """The step as ``plan.sync: gossip`` builds it: D-PSGD's exchange after the backward (compute + comm);
    AD-PSGD's swap beside the compute (its task has no predecessor: max)."""
    return max(compute_s, comm_s) if algorithm == "ad-psgd" else compute_s + comm_s


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
    edges = _edges(world, cfg["graph"], cfg.get("algorithm", "d-psgd"))
    send_to, recv_from = neighbours(rank, edges)
    adpsgd = cfg.get("algorithm") == "ad-psgd"
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
        if comm and adpsgd:  # AD-PSGD: the pairwise swap runs while this rank computes its gradient
            bufs, reqs = post_exchange(flat, send_to, recv_from)
            g = grads()
            wait_requests(reqs)
            for b in bufs:
                flat.add_(b)
            flat.div_(1 + len(bufs))
        else:
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
    rows: dict[str, list[float]] = {"compute": [], "small": [], "big": [], "step": [], "mix": []}
    got_like = [torch.ones_like(flat) for _ in recv_from]

    def mix() -> None:  # the averaging arithmetic alone, on a copy (no communication)
        m = flat.clone()
        for b in got_like:
            m.add_(b)
        m.div_(1 + len(got_like))

    for _ in range(cfg["steps"]):
        rows["compute"].append(once(lambda: step(False)))
        rows["small"].append(once(lambda: exchange(small, peer, peer)))
        rows["big"].append(once(lambda: exchange(big, peer, peer)))
        rows["step"].append(once(lambda: step(True)))
        rows["mix"].append(once(mix))
    med = {k: statistics.median(v) for k, v in rows.items()}
    compute, measured = med["compute"], med["step"]
    swap = {small.numel() * 4: med["small"], big.numel() * 4: med["big"]}
    if rank == 0:
        doc = {"compute_s": compute, "step_s": measured, "swap": swap, "model_bytes": flat.numel() * 4,
               "mix_s": med["mix"]}
        if isinstance(out, str):
            atomic_write_text(out, json.dumps(doc))
        else:
            out.put(doc)
    dist.barrier()
    dist.destroy_process_group()


def run_case(world: int, graph: str, width: int, batch: int = 32, steps: int = 9,
             algorithm: str = "d-psgd") -> dict[str, Any]:
    """Measure one case on the loopback (module docstring) and predict it; the row as a dict."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cfg = {"graph": graph, "width": width, "batch": batch, "steps": steps, "algorithm": algorithm}
    port = _port()
    load0 = _load()
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
    alpha, bw, comm = _fitted(got, world, graph, algorithm)
    pred = _predicted(got["compute_s"], comm, algorithm)
    return {"world": world, "graph": graph, "algorithm": algorithm, "width": width, "model_bytes": got["model_bytes"],
            "alpha_s": alpha, "bandwidth_bytes_per_s": bw, "compute_s": got["compute_s"], "comm_pred_s": comm,
            "predicted_s": pred, "measured_s": got["step_s"], "error": pred / got["step_s"] - 1.0,
            "mix_s": got.get("mix_s", 0.0), **_load_since(load0)}


def _fitted(got: dict[str, Any], world: int, graph: str, algorithm: str = "d-psgd") -> tuple[float, float, float]:
    """(α, B, the gossip's flow time) with α and B from the pair swaps (``T = α + S/B``, two points) and
    every rank a node on one switch with links of B (HostCluster)."""
    (small, t_small), (big, t_big) = sorted((int(k), v) for k, v in got["swap"].items())
    alpha = t_small  # 4 KiB: almost all per-message overhead
    bw = (big - small) / (t_big - t_small) if t_big > t_small else big / t_big
    host = HostCluster("loopback", bw, 0.0, alpha)
    sched = _schedule([rank_name(r) for r in range(world)], graph, algorithm, got["model_bytes"])
    return alpha, bw, get_model("flow", host.params()).time_schedule(sched, host.topology(world)).time_s


def _load() -> tuple[float, float]:
    """(steal, total) jiffies of all CPUs so far (``/proc/stat``; zeros where it cannot be read)."""
    try:
        vals = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    return (vals[7] if len(vals) > 7 else 0.0), sum(vals[:8])


def _load_since(before: tuple[float, float]) -> dict[str, float]:
    """The machine's load over a case: CPU steal (the hypervisor's share) and the 1-minute load average (the
    runnable processes of everyone on this shared machine, these ranks included)."""
    now = _load()
    total = now[1] - before[1]
    try:
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        load1 = float("nan")
    return {"steal": (now[0] - before[0]) / total if total > 0 else 0.0, "loadavg": load1}


def run_emulated(world: int, graph: str, width: int, scale: float, batch: int = 32, steps: int = 9,
                 algorithm: str = "d-psgd") -> dict[str, Any]:
    """One case on :class:`~topotrain.testbed.netns.Emulation` of ``world`` hosts on one 100 Gb/s switch with
    links shaped to ``100 Gb/s · scale``: the bandwidth is the emulation's (not fitted); α is fitted to the
    4 KiB pair swap as the flow model times it (``α = T_meas − T(α = 0)``, one message round)."""
    topo = single_switch(world, 100 * GBPS)
    load0 = _load()
    with Emulation(topo, bandwidth_scale=scale) as emu, emu.tempdir() as tmp:
        out = str(Path(tmp) / "result.json")
        cfg = json.dumps({"graph": graph, "width": width, "batch": batch, "steps": steps, "algorithm": algorithm,
                          "master": f"{emu.rank_ip(0)}:{29500 + os.getpid() % 1000}"})
        procs = []
        logs = [open(Path(tmp) / f"rank{r}.log", "w") for r in range(world)]  # noqa: SIM115 - closed below
        for r in range(world):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=emu.rank_iface(r), OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            procs.append(emu.popen(r, [sys.executable, os.path.abspath(__file__), "--worker", str(r), str(world),
                                       cfg, out], env=env, stdout=subprocess.DEVNULL,
                                 stderr=logs[r]))
        codes = wait_all(procs, 300)
        for f in logs:
            f.close()
        if not Path(out).exists():
            errs = " | ".join(f"rank {r} ({c}): " + (Path(tmp) / f"rank{r}.log").read_text()[-300:].strip()
                              for r, c in enumerate(codes) if c != 0)
            raise RuntimeError(f"emulated case {world}/{graph}/{width}/{algorithm}: the workers wrote no result; "
                               f"{errs}")
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
    comm = flow.time_schedule(_schedule(names, graph, algorithm, got["model_bytes"]), scaled).time_s
    big = max(int(k) for k in got["swap"])
    swap_pred = flow.time_schedule(dpsgd_schedule(names, pairs, big), scaled).time_s
    pred = _predicted(got["compute_s"], comm, algorithm)
    bw = float(scaled.capacity_bytes_per_s.min())
    fit_alpha, fit_bw, fit_comm = _fitted(got, world, graph, algorithm)
    return {"world": world, "graph": graph, "algorithm": algorithm, "width": width, "model_bytes": got["model_bytes"],
            "alpha_s": alpha, "bandwidth_bytes_per_s": bw, "compute_s": got["compute_s"], "comm_pred_s": comm,
            "predicted_s": pred, "measured_s": got["step_s"], "error": pred / got["step_s"] - 1.0,
            "swap_error": swap_pred / got["swap"][str(big)] - 1.0, "swap_bandwidth_bytes_per_s": fit_bw,
            "swap_fit_error": _predicted(got["compute_s"], fit_comm, algorithm) / got["step_s"] - 1.0,
            "mix_s": got.get("mix_s", 0.0), **_load_since(load0)}


def _duplex_worker(rank: int, master: str, size_bytes: int, repeats: int, out: str) -> None:
    """One of two ranks of :func:`duplex_check`: per order, the slowest rank's time of each repetition."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    a, b, ack = torch.ones(size_bytes // 4), torch.empty(size_bytes // 4), torch.zeros(1)
    peer = 1 - rank

    def one_way() -> None:  # the receiver acknowledges: a send returns once its data is buffered
        if rank == 0:
            dist.send(a, peer)
            dist.recv(ack, peer)
        else:
            dist.recv(b, peer)
            dist.send(ack, peer)

    def sends_first() -> None:  # as comm.gossip.exchange did before it posted receives first
        reqs = [dist.isend(a, peer), dist.irecv(b, peer)]
        for r in reqs:
            r.wait()

    def receives_first() -> None:
        exchange(a, [peer], [peer])

    orders = {"one-way": one_way, "swap, sends first": sends_first, "swap, receives first": receives_first}
    times: dict[str, list[float]] = {k: [] for k in orders}
    receives_first()  # connect
    for _ in range(repeats):
        for name, fn in orders.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(_max_s(time.perf_counter() - t0))
    if rank == 0:
        atomic_write_text(out, json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def duplex_check(scale: float, size_bytes: int = 4 * 2**20, repeats: int = 3) -> dict[str, list[float]]:
    """Bytes/s per direction between two hosts of one emulated switch (links ``100 Gb/s · scale``): one way
    alone, and a swap with the sends or the receives posted first (comm/gossip.py's docstring); the run's
    repetitions, interleaved."""
    with Emulation(single_switch(2, 100 * GBPS), bandwidth_scale=scale) as emu, emu.tempdir() as tmp:
        out = str(Path(tmp) / "duplex.json")
        master = f"{emu.rank_ip(0)}:{29500 + os.getpid() % 1000}"
        procs = [emu.popen(r, [sys.executable, os.path.abspath(__file__), "--duplex-worker", str(r), master,
                               str(size_bytes), str(repeats), out],
                           env=dict(os.environ, GLOO_SOCKET_IFNAME=emu.rank_iface(r), OMP_NUM_THREADS="1",
                                    PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for r in range(2)]
        wait_all(procs, 120)
        if not Path(out).exists():
            raise RuntimeError("duplex check: the workers wrote no result")
        times = json.loads(Path(out).read_text())
    return {k: [size_bytes / t for t in v] for k, v in times.items()}


def _print_duplex(scale: float) -> None:
    rates = duplex_check(scale)
    link = 100 * GBPS * scale * TCP_PAYLOAD_EFFICIENCY
    print(f"duplex check, links {100 * GBPS * scale / 1e6:.4g} MB/s ({link / 1e6:.2f} MB/s TCP payload), 4 MiB, "
          "MB/s per direction: " + "; ".join(f"{k} " + " ".join(f"{x / 1e6:.1f}" for x in v)
                                            for k, v in rates.items()))
    sys.stdout.flush()


#: (ranks, graph, width, algorithm): widths 512 / 1024 / 2048 are 1.1 / 4.2 / 16.9 MB models (fp32).
CASES = [(2, "ring", 512, "d-psgd"), (3, "ring", 512, "d-psgd"), (4, "ring", 512, "d-psgd"),
         (4, "ring", 1024, "d-psgd"), (3, "exponential", 1024, "d-psgd"), (4, "exponential", 1024, "d-psgd"),
         (4, "torus", 1024, "d-psgd"), (4, "ring", 2048, "d-psgd"), (2, "ring", 1024, "ad-psgd"),
         (4, "ring", 1024, "ad-psgd")]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":  # one rank of an emulated case (run_emulated)
        _, _, rank, world, cfg, out = sys.argv
        _worker(int(rank), int(world), 0, json.loads(cfg), out)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--duplex-worker":  # one rank of duplex_check
        _, _, rank, master, size, repeats, out = sys.argv
        _duplex_worker(int(rank), master, int(size), int(repeats), out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two cases only")
    ap.add_argument("--emulated", type=float, default=0.0, metavar="SCALE",
                    help="run on the testbed's network namespaces, links of 100 Gb/s x SCALE (needs root)")
    ap.add_argument("--duplex", default="", metavar="SCALES",
                    help="only the duplex check, at these comma-separated scales (e.g. 0.001,0.002,0.004; root)")
    args = ap.parse_args()
    if args.duplex:
        for sc in args.duplex.split(","):
            _print_duplex(float(sc))
        return
    t_start = time.perf_counter()
    if args.emulated > 0:
        _print_duplex(args.emulated)
    cases = CASES[2:4] if args.quick else CASES
    rows = []
    print("| world | graph | model MB | alpha us | link MB/s | compute ms | comm pred ms | predicted ms | "
          "measured ms | error | load | not modelled |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for world, graph, width, algorithm in cases:
        name = graph if algorithm == "d-psgd" else f"{algorithm} ({graph})"
        try:
            r = (run_emulated(world, graph, width, args.emulated, algorithm=algorithm) if args.emulated > 0
                 else run_case(world, graph, width, algorithm=algorithm))
        except RuntimeError as e:  # one failed case (e.g. a gloo timeout on the loaded machine) is reported
            print(f"| {world} | {name} | failed: {str(e)[:400]} |")
            continue
        rows.append(r)
        print(f"| {world} | {name} | {r['model_bytes'] / 1e6:.2f} | {1e6 * r['alpha_s']:.0f} | "
              f"{r['bandwidth_bytes_per_s'] / 1e6:.2f} | {1e3 * r['compute_s']:.2f} | {1e3 * r['comm_pred_s']:.2f} | "
              f"{1e3 * r['predicted_s']:.2f} | {1e3 * r['measured_s']:.2f} | {100 * r['error']:+.1f}% | "
              f"load {r['loadavg']:.1f}, steal {100 * r['steal']:.0f}% | averaging {1e3 * r['mix_s']:.1f} ms |"
              + (f" swap {100 * r['swap_error']:+.1f}%; B from the swap {r['swap_bandwidth_bytes_per_s'] / 1e6:.1f} "
                 f"MB/s: error {100 * r['swap_fit_error']:+.1f}%" if "swap_error" in r else ""))
        sys.stdout.flush()
    for key, what in (("error", "links' bandwidth" if args.emulated > 0 else "fitted"),
                      ("swap_fit_error", "bandwidth from the pair swap")):
        errs = sorted(abs(r[key]) for r in rows if key in r)
        if errs:
            print(f"\n|error| ({what}) median {100 * statistics.median(errs):.1f}%, worst {100 * errs[-1]:.1f}% "
                  f"over {len(errs)} cases")
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
