"""One rank of a testbed run: times allreduce algorithms over torch.distributed (gloo) and reports.

Run inside a host namespace of an :class:`~topotrain.testbed.netns.Emulation`::

    GLOO_SOCKET_IFNAME=<host veth> python -m topotrain.testbed.worker --rank R --world W \\
        --master IP:PORT --algo ring,halving-doubling,gloo --sizes 65536,1048576 --repeats 3 \\
        --topo-json topo.json --out results.json

For every algorithm and size it runs one warm-up (which also checks the result: every rank contributes
``rank + 1``, so each element must be ``W(W+1)/2``), then ``repeats`` timed runs (``3 · repeats`` up to
16 KiB), each after a barrier; the time of a run is the maximum over ranks of the local elapsed time
(``all_reduce(MAX)`` of it). The
algorithm ``gloo`` is ``torch.distributed.all_reduce`` (gloo's own algorithm) for comparison; the others
are executed by :func:`topotrain.comm.execute.all_reduce` on the schedule topotrain builds for the
topology in ``--topo-json``.

With ``--ddp-steps N`` it trains instead: for every algorithm, the same seeded MLP (``--ddp-width``
wide, three linear layers) wrapped in ``DistributedDataParallel``, gradients averaged by our comm hook
(:func:`topotrain.comm.hook`; ``gloo``: DDP's own allreduce), SGD on seeded per-rank random batches; one
warm-up step, then ``N`` timed steps (each after a barrier, the maximum over ranks). It also reports the
gradient buckets the hook saw, the time of one local forward + backward + step without communication
(a copy of the model, median of 3), whether all ranks end with bit-identical parameters, the loss before
and after, and a parameter checksum. ``--switch-interval`` sets Python's GIL switch interval for DDP mode
(``sys.setswitchinterval``; 0, the default, keeps Python's 5 ms: 0.2 and 0.01 ms made no difference
beyond run-to-run noise on the BiGraph testbed). Rank 0 writes the JSON results atomically. A watchdog
ends the process after ``--deadline`` seconds whatever happens; the process group times out after ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.topology.graph import Topology

__all__ = ["main", "topology_from_dict", "topology_to_dict"]

GLOO = "gloo"
#: Messages up to this size are timed ``3 · repeats`` times (they are cheap, and alpha is fitted to one).
SMALL_BYTES = 16 * 1024


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """A JSON-able, lossless description of ``topo`` (nodes and links in id order, meta)."""
    links = []
    for lk in topo.links:
        rid = topo.link_id(lk.dst, lk.src)
        if rid < lk.id:
            continue
        links.append({"a": lk.src, "b": lk.dst, "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s,
                      "bandwidth_b_to_a": topo.links[rid].bandwidth_bytes_per_s, "latency_s": lk.latency_s,
                      "kind": lk.kind})
    return {"name": topo.name,
            "nodes": [{"name": n.name, "kind": n.kind.value, "server": n.server, "transit": n.transit,
                       "attrs": n.attrs} for n in topo.nodes.values()],
            "links": links, "meta": topo.meta}


def topology_from_dict(doc: dict[str, Any]) -> Topology:
    """Inverse of :func:`topology_to_dict`."""
    t = Topology(doc["name"])
    for n in doc["nodes"]:
        t.add_node(n["name"], n["kind"], n["server"], n["transit"], **n.get("attrs", {}))
    for lk in doc["links"]:
        t.add_link(lk["a"], lk["b"], float(lk["bandwidth_bytes_per_s"]), float(lk["latency_s"]), lk["kind"],
                   bandwidth_b_to_a=float(lk["bandwidth_b_to_a"]))
    t.meta = dict(doc.get("meta", {}))
    return t.freeze()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m topotrain.testbed.worker")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="IP:PORT of rank 0's store")
    ap.add_argument("--algo", required=True, help="comma-separated algorithms; 'gloo' = torch's own")
    ap.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--topo-json", required=True)
    ap.add_argument("--build-alpha", type=float, default=DEFAULT_MESSAGE_OVERHEAD_S,
                    help="per-message overhead the schedules are built with (sizes their pipeline chunks)")
    ap.add_argument("--out", default="")
    ap.add_argument("--timeout", type=float, default=60.0, help="process-group timeout, s")
    ap.add_argument("--deadline", type=float, default=300.0, help="hard limit on the whole run, s")
    ap.add_argument("--ddp-steps", type=int, default=0, help="train a small MLP with DDP for N timed steps")
    ap.add_argument("--ddp-width", type=int, default=256, help="hidden width of the DDP model")
    ap.add_argument("--ddp-batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="Python GIL switch interval in DDP mode, s (0: Python's default, 5 ms)")
    return ap.parse_args(argv)


def _watchdog(seconds: float) -> None:
    def fire() -> None:
        sys.stderr.write(f"worker: deadline of {seconds:.0f} s passed, exiting\n")
        sys.stderr.flush()
        os._exit(3)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    _watchdog(args.deadline)
    import torch
    import torch.distributed as dist

    from topotrain.comm.execute import all_reduce, build_execution_schedule  # deferred: after the watchdog (torch)

    torch.set_num_threads(1)
    topo = topology_from_dict(json.loads(Path(args.topo_json).read_text()))
    ranks = topo.gpus[: args.world]
    algos = [a for a in args.algo.split(",") if a]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=args.timeout))
    w = args.world
    expect = w * (w + 1) / 2
    results = []
    t_start = time.perf_counter()
    if args.ddp_steps > 0:
        results = [_train(args, algo, topo, ranks) for algo in algos]
        algos = []
    for algo in algos:
        for size in sizes:
            numel = max(1, size // 4)
            buf = torch.empty(numel, dtype=torch.float32)
            schedule = None if algo == GLOO else build_execution_schedule(
                "allreduce", algo, topo, ranks, numel * 4, message_overhead_s=args.build_alpha)

            def once(schedule: Any = schedule, buf: torch.Tensor = buf) -> None:
                if schedule is None:
                    dist.all_reduce(buf)
                else:
                    all_reduce(buf, schedule)

            buf.fill_(args.rank + 1)
            once()
            ok = bool(torch.all(buf == expect).item())
            flag = torch.tensor([1.0 if ok else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            times = []
            reps = args.repeats * 3 if numel * 4 <= SMALL_BYTES else args.repeats  # small: noisy, cheap
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                once()
                el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(el, op=dist.ReduceOp.MAX)
                times.append(float(el.item()))
            results.append({"algorithm": algo, "size_bytes": numel * 4, "times_s": times,
                            "median_s": statistics.median(times), "min_s": min(times),
                            "correct": bool(flag.item() == 1.0)})
    dist.barrier()
    if args.rank == 0 and args.out:
        doc = {"world": w, "ranks": ranks, "results": results,
               "wall_s": time.perf_counter() - t_start}
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, args.out)
    dist.destroy_process_group()
    return 0


def _train(args: argparse.Namespace, algo: str, topo: Topology, ranks: list[str]) -> dict[str, Any]:
    """One DDP training run of ``algo`` (module docstring); the result of this rank's view."""
    import copy

    import torch
    import torch.distributed as dist
    from torch import nn

    from topotrain.comm import hook  # deferred: imports torch, after the watchdog is armed

    if args.switch_interval > 0:
        sys.setswitchinterval(args.switch_interval)
    torch.manual_seed(0)
    width = int(args.ddp_width)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    buckets: list[int] = []
    if algo != GLOO:
        inner = hook(algo, topo, ranks=ranks, message_overhead_s=args.build_alpha)

        def logged(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            buf = bucket.buffer()
            buckets.append(buf.numel() * buf.element_size())
            return inner(state, bucket)

        logged.__annotations__ = inner.__annotations__  # DDP checks the hook's signature
        ddp.register_comm_hook(None, logged)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + args.rank)
    x = torch.randn(args.ddp_batch, width, generator=gen)
    y = torch.randint(0, 10, (args.ddp_batch,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())

    loss_first = step()  # warm-up (first bucket rebuild, hook plans)
    buckets.clear()
    times = []
    loss_last = loss_first
    for _ in range(args.ddp_steps):
        dist.barrier()
        t0 = time.perf_counter()
        loss_last = step()
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        times.append(float(el.item()))
    per_step = buckets[: len(buckets) // max(1, args.ddp_steps)]
    # compute alone: a private copy, so the replicas stay in step
    local = copy.deepcopy(model)
    lopt = torch.optim.SGD(local.parameters(), lr=0.05)
    comp = []
    for _ in range(3):
        t0 = time.perf_counter()
        lopt.zero_grad(set_to_none=True)
        loss_fn(local(x), y).backward()
        lopt.step()
        comp.append(time.perf_counter() - t0)
    compute = torch.tensor([statistics.median(comp)], dtype=torch.float64)
    dist.all_reduce(compute, op=dist.ReduceOp.MAX)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return {"kind": "ddp", "algorithm": algo, "size_bytes": int(sum(per_step)), "times_s": times,
            "median_s": statistics.median(times), "min_s": min(times), "compute_s": float(compute.item()),
            "bucket_bytes": per_step, "correct": bool(torch.equal(hi, lo)), "loss_first": loss_first,
            "loss_last": loss_last, "checksum": float(flat.double().sum().item())}


if __name__ == "__main__":
    sys.exit(main())
