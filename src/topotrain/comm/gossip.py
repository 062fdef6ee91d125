"""Decentralized averaging for real over torch.distributed: D-PSGD's neighbour exchange (Lian et al.,
NeurIPS 2017), the executed counterpart of ``plan.sync: gossip`` (topotrain.training.sync).

:func:`gossip_average` sends a rank's flat model to its out-neighbours and receives its in-neighbours'
(point-to-point ``isend``/``irecv``, all posted at once, as the model's one-phase schedule), then replaces the
model by the uniform average of its own and the received ones (weights ``1/(in-degree + 1)``: doubly
stochastic on the ring, torus and exponential graphs, whose in- and out-degrees are equal).

**Receives are posted before sends** (as :mod:`topotrain.comm.execute` does). Gloo's TCP pair is a
rendezvous: a send waits for the peer's "receive ready" notification, and every message a pair writes — that
notification included — goes through one FIFO transmit queue per pair (``tcp::Pair::sendAsyncMode``: "If an
earlier operation hasn't finished transmitting, add this operation to the transmit queue"). A rank that posts
its send first, after its peer's notification has arrived, starts writing the whole model at once, and its own
notification waits behind it: the peer cannot start its send until this one is over, so a pairwise swap runs
one direction after the other. Measured on the testbed (two hosts on one switch, a 4 MiB swap, three runs
each; ``benchmarks/gossip_measure.py --duplex 0.001,0.002,0.004``): at links shaped to 12.5 / 25 / 50 MB/s
one way alone moved 12.0–12.1 / 23.9–24.0 / 46.3–48.0 MB/s, a swap with sends posted first 6.0 / 12.0–12.1 /
23.8–24.1 MB/s per direction (exactly half, at every rate: not a CPU limit), with receives posted first
11.9–12.0 / 23.2–23.9 / 47.3–47.7 (the link's rate both ways: the emulated links are full duplex, as the
models assume).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("topotrain.comm needs PyTorch: pip install 'topotrain[torch]' (torch==2.13.0)") from e

from topotrain.util.errors import ConfigError

__all__ = ["exchange", "gossip_average", "neighbours", "post_exchange", "wait_requests"]


def neighbours(rank: int, edges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(out-neighbours, in-neighbours) of ``rank`` in the directed ``edges`` (sorted)."""
    return sorted({b for a, b in edges if a == rank}), sorted({a for a, b in edges if b == rank})


def exchange(flat: torch.Tensor, send_to: Sequence[int], recv_from: Sequence[int], group: Any = None) -> list[
        torch.Tensor]:
    """Send ``flat`` to every rank of ``send_to`` and receive a tensor like it from every rank of
    ``recv_from``, all at once (receives posted first); the received tensors in ``recv_from``'s order."""
    bufs, reqs = post_exchange(flat, send_to, recv_from, group)
    wait_requests(reqs)
    return bufs


def post_exchange(flat: torch.Tensor, send_to: Sequence[int], recv_from: Sequence[int],
                  group: Any = None) -> tuple[list[torch.Tensor], list[Any]]:
    """Post :func:`exchange`'s receives, then its sends, without waiting: (the receive buffers, the requests
    for :func:`wait_requests`). Receives first: see the module docstring (gloo's rendezvous)."""
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ConfigError("tensor", "gossip exchanges one flat contiguous tensor", "pass torch.cat of the "
                          "parameters' .view(-1), or parameters_to_vector(model.parameters())")
    bufs = [torch.empty_like(flat) for _ in recv_from]
    reqs = [dist.irecv(b, src, group=group) for b, src in zip(bufs, recv_from, strict=True)]
    reqs += [dist.isend(flat, dst, group=group) for dst in send_to]
    return bufs, reqs


def wait_requests(reqs: Sequence[Any]) -> None:
    """Wait for every request of :func:`post_exchange`."""
    for r in reqs:
        if r is not None:  # None only for a rank outside ``group``
            r.wait()


def gossip_average(flat: torch.Tensor, send_to: Sequence[int], recv_from: Sequence[int], group: Any = None) -> None:
    """One D-PSGD mixing step in place: ``flat ← (flat + Σ received) / (1 + len(recv_from))``."""
    got = exchange(flat, send_to, recv_from, group)
    for b in got:
        flat.add_(b)
    flat.div_(1 + len(got))
