"""Where a job's GPUs go inside one group of servers: the cluster's shape, its free GPUs kept incrementally,
and the base placement policies.

- ``first-fit``: the first free GPUs in the cluster's order;
- ``packed``: whole servers first (the server with the fewest free GPUs that still holds the job, else
  servers with the most free GPUs first), so that a ring crosses few servers;
- ``topology-aware``: the GPUs under the fewest network switches (servers grouped by the switch their NICs
  attach to; a switch group that holds the job alone first, the one least used by running multi-server
  jobs), packed by server inside (Amaral et al., "Topology-aware GPU scheduling for learning workloads in
  cloud environments", SC 2017, motivate it).

:class:`FreeState` keeps, per server, its free GPUs and, per switch group, its free GPU count and how many
running multi-server jobs cross it, updated when a job starts or ends: a placement reads counts, never the
whole list of GPUs or of running jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shape:
    """GPUs by server and servers by the switch(es) their NICs attach to."""

    gpus: tuple[str, ...]
    server_of: Mapping[str, str]
    servers: Mapping[str, tuple[str, ...]]
    group_of: Mapping[str, str]


def shape_of(topo: Any) -> Shape:
    gpus = tuple(topo.gpus)
    server_of = {g: topo.nodes[g].server or g for g in gpus}
    servers: dict[str, list[str]] = {}
    for g in gpus:
        servers.setdefault(server_of[g], []).append(g)
    attach: dict[str, set[str]] = {}
    for lk in topo.links:
        a, b = topo.nodes[lk.src], topo.nodes[lk.dst]
        if str(a.kind) == "nic" and str(b.kind) == "switch" and a.server is not None:
            attach.setdefault(a.server, set()).add(lk.dst)
    group_of = {s: ",".join(sorted(attach.get(s, {"none"}))) for s in servers}
    return Shape(gpus, server_of, {s: tuple(v) for s, v in servers.items()}, group_of)


class FreeState:
    """The free GPUs of one shape, by server and by switch group, and the switch groups' load (running
    multi-server jobs crossing them), updated by :meth:`take` and :meth:`give`."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.server_list = list(shape.servers)
        self.server_pos = {s: k for k, s in enumerate(self.server_list)}
        self.gpu_pos = {g: k for k, g in enumerate(shape.gpus)}
        #: the GPU list is server after server (first-fit may then walk servers instead of GPUs)
        self.contiguous = [g for s in self.server_list for g in shape.servers[s]] == list(shape.gpus)
        self.free: set[str] = set(shape.gpus)
        self.count = {s: len(v) for s, v in shape.servers.items()}
        self.total = len(shape.gpus)
        groups: dict[str, list[str]] = {}
        for s in self.server_list:
            groups.setdefault(shape.group_of[s], []).append(s)
        self.groups = groups
        self.group_list = list(groups)
        self.group_pos = {gr: k for k, gr in enumerate(self.group_list)}
        self.free_in = {gr: sum(self.count[s] for s in v) for gr, v in groups.items()}
        self.load = dict.fromkeys(self.group_list, 0)

    def avail(self, server: str) -> list[str]:
        """Free GPUs of ``server`` in the server's order."""
        return [g for g in self.shape.servers[server] if g in self.free] if self.count[server] else []

    def _crossed(self, gpus: Sequence[str]) -> set[str]:
        servers = {self.shape.server_of[g] for g in gpus}
        return {self.shape.group_of[s] for s in servers} if len(servers) > 1 else set()

    def take(self, gpus: Sequence[str]) -> None:
        for g in gpus:
            s = self.shape.server_of[g]
            self.free.discard(g)
            self.count[s] -= 1
            self.free_in[self.shape.group_of[s]] -= 1
        self.total -= len(gpus)
        for gr in self._crossed(gpus):
            self.load[gr] += 1

    def give(self, gpus: Sequence[str]) -> None:
        for g in gpus:
            s = self.shape.server_of[g]
            self.free.add(g)
            self.count[s] += 1
            self.free_in[self.shape.group_of[s]] += 1
        self.total += len(gpus)
        for gr in self._crossed(gpus):
            self.load[gr] -= 1


BasePolicy = Callable[[FreeState, int], tuple[str, ...] | None]


def first_fit(st: FreeState, n: int) -> tuple[str, ...] | None:
    if st.total < n:
        return None
    if not st.contiguous:
        return tuple([g for g in st.shape.gpus if g in st.free][:n])
    chosen: list[str] = []
    for s in st.server_list:
        if st.count[s]:
            chosen.extend(st.avail(s)[: n - len(chosen)])
            if len(chosen) == n:
                break
    return tuple(chosen)


def _pack(st: FreeState, n: int, servers: Sequence[str]) -> tuple[str, ...] | None:
    pos = {s: k for k, s in enumerate(servers)}
    fits = [s for s in servers if st.count[s] >= n]
    if fits:
        best = min(fits, key=lambda s: (st.count[s], pos[s]))
        return tuple(st.avail(best)[:n])
    chosen: list[str] = []
    for s in sorted((s for s in servers if st.count[s]), key=lambda s: (-st.count[s], pos[s])):
        chosen.extend(st.avail(s)[: n - len(chosen)])
        if len(chosen) == n:
            return tuple(chosen)
    return None


def packed(st: FreeState, n: int) -> tuple[str, ...] | None:
    return _pack(st, n, st.server_list) if st.total >= n else None


def topology_aware(st: FreeState, n: int) -> tuple[str, ...] | None:
    if st.total < n:
        return None
    order, free_in, load, pos = st.group_list, st.free_in, st.load, st.group_pos
    fits = [gr for gr in order if free_in[gr] >= n]
    if fits:
        gr = min(fits, key=lambda x: (load[x], free_in[x], pos[x]))
        return _pack(st, n, st.groups[gr])
    chosen_servers: list[str] = []
    have = 0
    for gr in sorted(order, key=lambda x: (load[x], -free_in[x], pos[x])):
        if free_in[gr] == 0:
            continue
        chosen_servers.extend(st.groups[gr])
        have += free_in[gr]
        if have >= n:
            return _pack(st, n, chosen_servers)
    return None


BASE: dict[str, BasePolicy] = {"first-fit": first_fit, "packed": packed, "topology-aware": topology_aware}
