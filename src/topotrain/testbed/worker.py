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
topology in ``--topo-json``. Rank 0 writes the JSON results atomically. A watchdog ends the process
after ``--deadline`` seconds whatever happens; the process group times out after ``--timeout`` seconds.
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
    return {"name": topo.name, "message_overhead_s": topo.message_overhead_s,
            "nodes": [{"name": n.name, "kind": n.kind.value, "server": n.server, "transit": n.transit,
                       "attrs": n.attrs} for n in topo.nodes.values()],
            "links": links, "meta": topo.meta}


def topology_from_dict(doc: dict[str, Any]) -> Topology:
    """Inverse of :func:`topology_to_dict`."""
    t = Topology(doc["name"], float(doc["message_overhead_s"]))
    for n in doc["nodes"]:
        t.add_node(n["name"], n["kind"], n["server"], n["transit"], **n.get("attrs", {}))
    for lk in doc["links"]:
        t.add_link(lk["a"], lk["b"], float(lk["bandwidth_bytes_per_s"]), float(lk["latency_s"]), lk["kind"],
                   bandwidth_b_to_a=float(lk["bandwidth_b_to_a"]))
    t.meta = dict(doc.get("meta", {}))
    return t


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m topotrain.testbed.worker")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="IP:PORT of rank 0's store")
    ap.add_argument("--algo", required=True, help="comma-separated algorithms; 'gloo' = torch's own")
    ap.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--topo-json", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--timeout", type=float, default=60.0, help="process-group timeout, s")
    ap.add_argument("--deadline", type=float, default=300.0, help="hard limit on the whole run, s")
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

    from topotrain.comm.execute import all_reduce, build_execution_schedule

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
    for algo in algos:
        for size in sizes:
            numel = max(1, size // 4)
            buf = torch.empty(numel, dtype=torch.float32)
            schedule = None if algo == GLOO else build_execution_schedule(
                "allreduce", algo, topo, ranks, numel * 4)

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


if __name__ == "__main__":
    sys.exit(main())
