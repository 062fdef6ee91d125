"""D-PSGD's neighbour averaging executed over torch.distributed (gloo, loopback): every rank ends with the
uniform average of its own and its in-neighbours' tensors (topotrain.comm.gossip)."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - a torch built without distributed
    pytest.skip("torch.distributed is unavailable", allow_module_level=True)

from topotrain.comm.gossip import gossip_average, neighbours  # noqa: E402
from topotrain.training.sync import GossipOptions, gossip_edges  # noqa: E402


def _worker(rank: int, world: int, port: int, graph: str, q: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    send_to, recv_from = neighbours(rank, gossip_edges(world, GossipOptions(graph=graph)))
    flat = torch.arange(5, dtype=torch.float64) + 10.0 * rank
    gossip_average(flat, send_to, recv_from)
    q.put((rank, flat.tolist()))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize(("world", "graph"), [(3, "ring")])
def test_gossip_average_over_gloo(world: int, graph: str) -> None:
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(r, world, port, graph, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(q.get(timeout=60) for _ in range(world))
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    edges = gossip_edges(world, GossipOptions(graph=graph))
    for r in range(world):
        ins = neighbours(r, edges)[1]
        want = [k + 10.0 * (r + sum(ins)) / (1 + len(ins)) for k in range(5)]
        assert got[r] == pytest.approx(want)


def test_exchange_posts_receives_before_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gloo's rendezvous serializes a swap whose sends are posted first (comm/gossip.py's docstring): every
    receive must be posted before any send."""
    from topotrain.comm import gossip

    calls: list[tuple[str, int]] = []

    class _Work:
        def wait(self) -> None:
            calls.append(("wait", -1))

    def isend(t: Any, dst: int, group: Any = None) -> _Work:
        calls.append(("send", dst))
        return _Work()

    def irecv(t: Any, src: int, group: Any = None) -> _Work:
        calls.append(("recv", src))
        return _Work()

    monkeypatch.setattr(gossip.dist, "isend", isend)
    monkeypatch.setattr(gossip.dist, "irecv", irecv)
    got = gossip.exchange(torch.zeros(3), [1, 2], [3, 0])
    assert calls == [("recv", 3), ("recv", 0), ("send", 1), ("send", 2)] + [("wait", -1)] * 4
    assert len(got) == 2 and all(b.shape == (3,) for b in got)
