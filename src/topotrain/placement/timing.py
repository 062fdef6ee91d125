"""How long one iteration of a placed job takes inside one group: the roofline compute of its per-GPU batch
(:mod:`topotrain.compute`) and its gradient allreduce, timed with the allreduces it shares links with on the
flow model (:func:`topotrain.network.base.run_concurrent`: max-min fair sharing on the routed paths).

Flows on disjoint sets of links do not affect each other under max-min fair sharing, so the running jobs of a
group split into *components* (jobs joined when their allreduces cross a common link, transitively), and a
component is timed on its own: when a job starts or ends only its component is timed again, memoized by
the component's placements.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from topotrain.cluster import Cluster
from topotrain.collectives.paths import path_cache
from topotrain.collectives.registry import build_schedule
from topotrain.compute import make_compute_model
from topotrain.network.base import run_concurrent
from topotrain.network.flow import FlowModel
from topotrain.workload.zoo import get_model

Placed = tuple[tuple[str, ...], int]


class Timer:
    """Compute time per iteration (per model and batch), links of a placement and contended allreduce times
    (per set of placements), memoized, for one cluster."""

    def __init__(self, cluster: Cluster, algorithm: str = "ring") -> None:
        self.cluster = cluster
        self.topo = cluster.topology
        self.algorithm = algorithm
        self.flow = FlowModel(cluster.network_params)
        self._compute: dict[tuple[str, int], tuple[float, int]] = {}
        self._comm: dict[tuple[Placed, ...], list[float]] = {}
        self._links: dict[tuple[str, ...], frozenset[int]] = {}

    def compute(self, model_name: str, batch: int) -> tuple[float, int]:
        """(seconds of compute per iteration, gradient bytes) of a model at a per-GPU batch on this GPU."""
        key = (model_name, batch)
        if key not in self._compute:
            model = get_model(model_name)
            gpu = self.cluster.gpu_spec
            dtype = "bf16" if "bf16" in gpu.peak_flops_per_s else "fp16"
            fwd, bwd = make_compute_model(gpu, model, dtype).layer_times(model, batch, 1)
            grad = int(model.param_bytes) if hasattr(model, "param_bytes") else 0
            self._compute[key] = (float(sum(fwd) + sum(bwd)), max(grad, 1))
        return self._compute[key]

    def _schedule(self, gpus: Sequence[str], size: int):  # type: ignore[no-untyped-def]
        return build_schedule("allreduce", self.algorithm, self.topo, list(gpus), size,
                              message_overhead_s=self.cluster.network_params.message_overhead_s)

    def links(self, gpus: tuple[str, ...]) -> frozenset[int]:
        """The links an allreduce over ``gpus`` crosses (none for one GPU)."""
        hit = self._links.get(gpus)
        if hit is None:
            found: set[int] = set()
            if len(gpus) > 1:
                sched = self._schedule(gpus, 1 << 20)
                cache = path_cache(self.topo, sched.ranks)
                seen: set[bytes] = set()
                for ph in sched.phases:
                    k = ph.src.tobytes() + b"|" + ph.dst.tobytes()
                    if k not in seen:
                        seen.add(k)
                        found.update(np.unique(cache.links_of(ph.src, ph.dst)).tolist())
            hit = self._links[gpus] = frozenset(found)
        return hit

    def comm(self, placed: Sequence[Placed]) -> list[float]:
        """Allreduce seconds of each (gpus, bytes) when all run at once on the flow model."""
        key = tuple(sorted(placed))
        if key not in self._comm:
            jobs = []
            idx = []
            for i, (gpus, size) in enumerate(key):
                if len(gpus) > 1:
                    jobs.append((self._schedule(gpus, size), 0.0))
                    idx.append(i)
            times = [0.0] * len(key)
            if jobs:
                for i, t in zip(idx, run_concurrent(jobs, self.topo, self.flow), strict=True):
                    times[i] = t.time_s
            self._comm[key] = times
        order = dict(zip(key, self._comm[key], strict=True))
        return [order[p] for p in placed]

    def alone(self, p: Placed) -> float:
        return self.comm([p])[0]


def component(start: Iterable[int], links_of: dict[int, frozenset[int]],
              users: dict[int, set[int]]) -> set[int]:
    """Running jobs reachable from ``start`` through shared links (``users``: link → jobs crossing it)."""
    seen = set(start)
    todo = list(seen)
    while todo:
        j = todo.pop()
        for lk in links_of[j]:
            for k in users.get(lk, ()):
                if k not in seen:
                    seen.add(k)
                    todo.append(k)
    return seen
