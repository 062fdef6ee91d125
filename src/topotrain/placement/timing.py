"""How long one iteration of a placed job takes inside one group: the roofline compute of its per-GPU batch
(:mod:`topotrain.compute`) and its gradient allreduce, timed with the allreduces it shares links with on the
flow model (:func:`topotrain.network.base.run_concurrent`: max-min fair sharing on the routed paths).

Flows on disjoint sets of links do not affect each other under max-min fair sharing, so the running jobs of a
group split into *components* (jobs joined when their allreduces cross a common link, transitively), and a
component is timed on its own: when a job starts or ends only its component is timed again. Times are
memoized by the component's *shape*: the routed links of every transfer, renumbered in order of first use,
with their capacities, latencies and kinds (and the algorithm, rank counts and sizes). Two components of
the same shape are the same problem for the flow model (it reads links, never node names), so a ring over
two servers under one leaf is timed once however many such placements a trace makes.

Two ways to time a component (``contention``):

- ``flow`` (exact): the component's allreduces run together once on the flow model from a common start;
- ``steady`` (fast): the allreduces are taken as running side by side for ever — the max-min fair rates of
  every transfer of every job held constant (water-filling, the flow model's sharing rule: Bertsekas and
  Gallager, *Data Networks*, 6.5.2) — and a job's allreduce is its time alone on the flow model times
  (its time at the shared rates) / (its time at its rates alone), each time the sum over its phases of the
  slowest transfer's bytes / rate. A job alone, or sharing no link, gets exactly its flow-model time; with
  sharing it is pessimistic against ``flow``, where the others speed up once a shorter allreduce ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from topotrain.cluster import Cluster
from topotrain.collectives.paths import path_cache
from topotrain.collectives.registry import build_schedule, get_algorithm, relabelled
from topotrain.collectives.schedule import Schedule
from topotrain.compute import make_compute_model
from topotrain.network.base import run_concurrent
from topotrain.network.flow import FlowModel
from topotrain.util.errors import ConfigError
from topotrain.workload.zoo import get_model

Placed = tuple[tuple[str, ...], int]
CONTENTION = ("flow", "steady")


@dataclass(frozen=True)
class _Flows:
    """One allreduce's transfers for the steady model: its distinct transfers (rank pairs) on links in CSR
    form, and per group of phases with the same pairs, the bytes of each phase's transfers."""

    offsets: np.ndarray  # CSR over flows
    links: np.ndarray
    #: (flow indices of the pair set, bytes per phase × transfer) for each distinct pair set
    sets: tuple[tuple[np.ndarray, np.ndarray], ...]

    def time_s(self, rate: np.ndarray) -> float:
        """Sum over phases of the slowest transfer's bytes / rate."""
        return float(sum((b / rate[f]).max(axis=1).sum() for f, b in self.sets))


def max_min_rates(offsets: np.ndarray, links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows crossing ``links[offsets[i]:offsets[i+1]]`` (progressive filling:
    raise every unfrozen flow's rate together; freeze the flows of the links that fill)."""
    n = offsets.shape[0] - 1
    flow_of = np.repeat(np.arange(n), np.diff(offsets))
    rate = np.zeros(n)
    frozen = np.zeros(n, dtype=bool)
    used = np.unique(links)
    local = np.searchsorted(used, links)
    left = capacity[used].astype(np.float64)
    count = np.bincount(local, minlength=used.shape[0]).astype(np.float64)
    level = 0.0
    while not frozen.all():
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, left / count, np.inf)
        step = float(share.min())
        if not np.isfinite(step):  # flows crossing no link: unbounded, take them as instant
            rate[~frozen] = np.inf
            break
        level += step
        left -= step * count
        full = (count > 0) & (left <= 1e-12 * capacity[used])
        hit = np.zeros(n, dtype=bool)
        hit[flow_of[full[local]]] = True
        hit &= ~frozen
        rate[hit] = level
        frozen |= hit
        gone = hit[flow_of]
        count -= np.bincount(local[gone], minlength=used.shape[0])
    return rate


class Timer:
    """Compute time per iteration (per model and batch), links of a placement and contended allreduce times
    (per set of placements), memoized, for one cluster."""

    def __init__(self, cluster: Cluster, algorithm: str = "ring", contention: str = "flow") -> None:
        if contention not in CONTENTION:
            raise ConfigError("--contention", f"unknown contention model {contention!r}", "use flow or steady")
        self.contention = contention
        self.cluster = cluster
        self.topo = cluster.topology
        self.algorithm = algorithm
        self.flow = FlowModel(cluster.network_params)
        self._compute: dict[tuple[str, int], tuple[float, int]] = {}
        self._comm: dict[tuple[object, ...], list[float]] = {}
        self._steady_alone: dict[Placed, float] = {}
        self._alone: dict[Placed, float] = {}
        self._links: dict[Placed, frozenset[int]] = {}
        self._flows: dict[Placed, _Flows] = {}
        self._sched: dict[tuple[int, int], object] = {}
        self._paths: dict[Placed, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._relabel = any(o.value == "allreduce" for o in get_algorithm(algorithm).labels_only)

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

    def _schedule(self, gpus: Sequence[str], size: int) -> Schedule:
        """The allreduce schedule (built once per rank count and size where the algorithm uses the ranks as
        labels only, then relabelled)."""
        if not self._relabel:
            return build_schedule("allreduce", self.algorithm, self.topo, list(gpus), size,
                                  message_overhead_s=self.cluster.network_params.message_overhead_s)
        base = self._sched.get((len(gpus), size))
        if base is None:
            base = self._sched[(len(gpus), size)] = build_schedule(
                "allreduce", self.algorithm, self.topo, list(gpus), size,
                message_overhead_s=self.cluster.network_params.message_overhead_s)
        assert isinstance(base, Schedule)
        return relabelled(base, gpus)

    def _routes(self, p: Placed) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(links per transfer of each distinct set of rank pairs, the links in that order), once per placement."""
        hit = self._paths.get(p)
        if hit is None:
            sched = self._schedule(*p)
            cache = path_cache(self.topo, sched.ranks)
            seen: set[bytes] = set()
            lengths: list[int] = []
            links: list[int] = []
            for ph in sched.phases:
                k = ph.src.tobytes() + b"|" + ph.dst.tobytes()
                if k not in seen:
                    seen.add(k)
                    pp = cache.resolve(sched, ph)
                    lengths.extend(np.diff(pp.offsets).tolist())
                    lengths.append(-1)  # end of the pair set
                    links.extend(pp.links.tolist())
            hit = self._paths[p] = (tuple(lengths), tuple(links))
        return hit

    def shape_key(self, placed: Sequence[Placed]) -> tuple[object, ...]:
        """The shape of placements timed together (see the module docstring)."""
        ids: dict[int, int] = {}
        parts: list[object] = []
        for gpus, size in placed:
            lengths, links = self._routes((gpus, size))
            parts.append((len(gpus), size, lengths, tuple(ids.setdefault(lk, len(ids)) for lk in links)))
        used = list(ids)
        topo = self.topo
        return (tuple(parts), tuple(topo.capacity_bytes_per_s[used].tolist()), tuple(topo.latency_s[used].tolist()),
                tuple(str(topo.links[lk].kind) for lk in used))

    def links(self, gpus: tuple[str, ...], size: int) -> frozenset[int]:
        """The links an allreduce of ``size`` bytes over ``gpus`` crosses (none for one GPU)."""
        p = (gpus, size)
        hit = self._links.get(p)
        if hit is None:
            hit = self._links[p] = frozenset(self._routes(p)[1]) if len(gpus) > 1 else frozenset()
        return hit

    def comm(self, placed: Sequence[Placed]) -> list[float]:
        """Allreduce seconds of each (gpus, bytes) when all run at once on the flow model."""
        key = tuple(sorted(placed))
        multi = [p for p in key if len(p[0]) > 1]
        if self.contention == "steady" and len(multi) > 1:  # cheap to compute: memoized by the placements
            times = self._comm.get(key)
            if times is None:
                times = self._comm[key] = self._steady(multi)
        else:
            shape = self.shape_key(multi)
            times = self._comm.get(shape)
            if times is None:
                jobs = [(self._schedule(*p), 0.0) for p in multi]
                timed = run_concurrent(jobs, self.topo, self.flow) if jobs else []
                times = self._comm[shape] = [t.time_s for t in timed]
        each = iter(times)
        order = {p: (next(each) if len(p[0]) > 1 else 0.0) for p in key}
        return [order[p] for p in placed]

    def alone(self, p: Placed) -> float:
        """Allreduce seconds of one placement with no other job (memoized per placement)."""
        hit = self._alone.get(p)
        if hit is None:
            hit = self._alone[p] = self.comm([p])[0]
        return hit

    def flows(self, p: Placed) -> _Flows:
        """The transfers of one placement for the steady model."""
        hit = self._flows.get(p)
        if hit is None:
            sched = self._schedule(*p)
            cache = path_cache(self.topo, sched.ranks)
            by_pairs: dict[bytes, tuple[int, list[np.ndarray]]] = {}
            offs: list[np.ndarray] = []
            lks: list[np.ndarray] = []
            n = 0
            for ph in sched.phases:
                b = sched.transfer_bytes(ph).astype(np.float64)
                if not b.size or not float(b.max()) > 0:
                    continue
                k = ph.src.tobytes() + b"|" + ph.dst.tobytes()
                if k not in by_pairs:
                    pp = cache.resolve(sched, ph)
                    offs.append(np.diff(pp.offsets))
                    lks.append(pp.links)
                    by_pairs[k] = (n, [])
                    n += pp.num_transfers
                by_pairs[k][1].append(b)
            lengths = np.concatenate(offs) if offs else np.zeros(0, dtype=np.int64)
            offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            sets = tuple((np.arange(first, first + len(bs[0])), np.vstack(bs)) for first, bs in by_pairs.values())
            hit = self._flows[p] = _Flows(offsets, np.concatenate(lks) if lks else np.zeros(0, dtype=np.int64), sets)
        return hit

    def _steady(self, placed: Sequence[Placed]) -> list[float]:
        """Contended allreduce seconds of ``placed`` (each of several GPUs) by the steady model."""
        cap = self.topo.capacity_bytes_per_s
        fl = [self.flows(p) for p in placed]
        lengths = np.concatenate([np.diff(f.offsets) for f in fl])
        offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        shared = max_min_rates(offsets, np.concatenate([f.links for f in fl]), cap)
        out: list[float] = []
        first = 0
        for p, f in zip(placed, fl, strict=True):
            m = f.offsets.shape[0] - 1
            together = f.time_s(shared[first:first + m])
            by_itself = self._steady_alone.get(p)
            if by_itself is None:
                by_itself = self._steady_alone[p] = f.time_s(max_min_rates(f.offsets, f.links, cap))
            first += m
            out.append(self.alone(p) * (together / by_itself if by_itself > 0 else 1.0))
        return out


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
