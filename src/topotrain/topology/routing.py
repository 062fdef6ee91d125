"""Routing: shortest paths (in hops) with deterministic ECMP, honouring which nodes may forward.

Rules, as a real cluster behaves:

* GPUs never forward traffic; NICs forward only when marked ``transit`` (e.g. a switchless torus).
* Traffic between two different servers leaves its server through the source GPU's NIC (the GPU's
  ``nic`` attribute, else its nearest NIC — as NCCL picks the NIC closest on the PCIe tree), crosses the
  network (nodes outside any server), and enters through the destination GPU's NIC. It never passes
  through a third server's PCIe fabric.
* Traffic inside a server stays on that server's fabric.
* A graph without server annotations (a user's own file) is one routing domain.

Among equal-hop next hops the widest links are preferred (NVLink before PCIe inside a DGX-like
server); among those still tied the choice is a stable hash of (source, destination, hop) — deterministic ECMP
(flows of one pair always take one path; different pairs spread over the equal-cost paths).
"""

from __future__ import annotations

import zlib
from collections import deque
from typing import TYPE_CHECKING

from topotrain.errors import ConfigError

if TYPE_CHECKING:
    from topotrain.topology.graph import Topology

from topotrain.topology.graph import NodeKind

_NET = "__network__"
_ALL = "__all__"


def _stable_hash(*parts: str) -> int:
    return zlib.crc32("\x1f".join(parts).encode())


class Router:
    """Route cache over one Topology (rebuilt whenever the topology changes)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._dist: dict[tuple[str, str], dict[str, int]] = {}
        self._nic_of: dict[str, str | None] = {}
        self._domain_nodes: dict[str, set[str]] = {}

    # ---- domains --------------------------------------------------------------------------------
    def _members(self, domain: str) -> set[str]:
        if domain not in self._domain_nodes:
            nodes = self.topo.nodes
            if domain == _ALL:
                members = set(nodes)
            elif domain == _NET:
                members = {n for n, nd in nodes.items() if nd.server is None or nd.kind is NodeKind.NIC}
            else:
                members = {n for n, nd in nodes.items() if nd.server == domain}
            self._domain_nodes[domain] = members
        return self._domain_nodes[domain]

    def _distances(self, domain: str, dst: str) -> dict[str, int]:
        key = (domain, dst)
        dist = self._dist.get(key)
        if dist is None:
            members = self._members(domain)
            nodes = self.topo.nodes
            adj = self.topo.graph.adj
            dist = {dst: 0}
            q = deque([dst])
            while q:
                u = q.popleft()
                du = dist[u] + 1
                for v in adj[u]:
                    if v in dist or v not in members:
                        continue
                    dist[v] = du
                    if nodes[v].transit:
                        q.append(v)
            self._dist[key] = dist
        return dist

    def _walk(self, domain: str, src: str, dst: str) -> list[str]:
        dist = self._distances(domain, dst)
        if src not in dist:
            raise ConfigError("topology", f"no path from {src} to {dst} in {self.topo.name!r}",
                              "connect them, or check which nodes may forward traffic")
        nodes = self.topo.nodes
        adj = self.topo.graph.adj
        links = self.topo.links
        lid = self.topo.link_id
        path = [src]
        u = src
        hop = 0
        while u != dst:
            want = dist[u] - 1
            cands = sorted(v for v in adj[u] if dist.get(v) == want and (v == dst or nodes[v].transit))
            if len(cands) > 1:  # among equal-hop next hops prefer the widest link (NVLink over PCIe)
                bw = [links[lid(u, v)].bandwidth_bytes_per_s for v in cands]
                best = max(bw)
                cands = [v for v, b in zip(cands, bw, strict=True) if b >= best * (1 - 1e-9)]
            u = cands[0] if len(cands) == 1 else cands[_stable_hash(src, dst, str(hop)) % len(cands)]
            path.append(u)
            hop += 1
        return path

    # ---- NIC choice -----------------------------------------------------------------------------
    def nic_of(self, gpu: str) -> str | None:
        """The NIC a GPU's inter-server traffic uses: its ``nic`` attribute, else the nearest NIC."""
        if gpu in self._nic_of:
            return self._nic_of[gpu]
        node = self.topo.nodes[gpu]
        nic: str | None = node.attrs.get("nic")
        if nic is None and node.server is not None:
            members = self._members(node.server)
            nics = sorted(n for n in members if self.topo.nodes[n].kind is NodeKind.NIC)
            best: list[str] = []
            best_d = None
            for n in nics:
                d = self._distances(node.server, n).get(gpu)
                if d is None:
                    continue
                if best_d is None or d < best_d:
                    best, best_d = [n], d
                elif d == best_d:
                    best.append(n)
            if best:
                local = self.topo.servers().get(node.server, [gpu])
                idx = local.index(gpu) if gpu in local else 0
                nic = best[idx % len(best)]
        self._nic_of[gpu] = nic
        return nic

    # ---- routes ---------------------------------------------------------------------------------
    def node_path(self, src: str, dst: str) -> list[str]:
        if src == dst:
            return [src]
        nodes = self.topo.nodes
        s_srv, d_srv = nodes[src].server, nodes[dst].server
        if s_srv is not None and d_srv is not None and s_srv != d_srv:
            nic_s = src if nodes[src].kind is NodeKind.NIC else self.nic_of(src)
            nic_d = dst if nodes[dst].kind is NodeKind.NIC else self.nic_of(dst)
            if nic_s is None or nic_d is None:
                missing = s_srv if nic_s is None else d_srv
                raise ConfigError("server", f"server {missing!r} has no NIC reachable from its GPUs",
                                  "give the server template at least one NIC")
            head = self._walk(s_srv, src, nic_s) if src != nic_s else [src]
            mid = self._walk(_NET, nic_s, nic_d)
            tail = self._walk(d_srv, nic_d, dst) if dst != nic_d else [dst]
            return head[:-1] + mid + tail[1:]
        if s_srv is not None and s_srv == d_srv:
            return self._walk(s_srv, src, dst)
        return self._walk(_ALL, src, dst)

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            path = self.node_path(src, dst)
            lid = self.topo.link_id
            r = tuple(lid(a, b) for a, b in zip(path, path[1:], strict=False))
            self._routes[key] = r
        return r
