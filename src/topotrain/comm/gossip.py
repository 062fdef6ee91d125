"""Decentralized averaging for real over torch.distributed: D-PSGD's neighbour exchange (Lian et al.,
NeurIPS 2017), the executed counterpart of ``plan.sync: gossip`` (topotrain.training.sync).

:func:`gossip_average` sends a rank's flat model to its out-neighbours and receives its in-neighbours'
(point-to-point ``isend``/``irecv``, all posted at once, as the model's one-phase schedule), then replaces the
model by the uniform average of its own and the received ones (weights ``1/(in-degree + 1)``: doubly
stochastic on the ring, torus and exponential graphs, whose in- and out-degrees are equal).
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

__all__ = ["exchange", "gossip_average", "neighbours"]


def neighbours(rank: int, edges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(out-neighbours, in-neighbours) of ``rank`` in the directed ``edges`` (sorted)."""
    return sorted({b for a, b in edges if a == rank}), sorted({a for a, b in edges if b == rank})


def exchange(flat: torch.Tensor, send_to: Sequence[int], recv_from: Sequence[int], group: Any = None) -> list[
        torch.Tensor]:
    """Send ``flat`` to every rank of ``send_to`` and receive a tensor like it from every rank of
    ``recv_from``, all at once; the received tensors in ``recv_from``'s order."""
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ConfigError("tensor", "gossip exchanges one flat contiguous tensor", "pass torch.cat of the "
                          "parameters' .view(-1), or parameters_to_vector(model.parameters())")
    bufs = [torch.empty_like(flat) for _ in recv_from]
    reqs = [dist.isend(flat, dst, group=group) for dst in send_to]
    reqs += [dist.irecv(b, src, group=group) for b, src in zip(bufs, recv_from, strict=True)]
    for r in reqs:
        if r is not None:  # None only for a rank outside ``group``
            r.wait()
    return bufs


def gossip_average(flat: torch.Tensor, send_to: Sequence[int], recv_from: Sequence[int], group: Any = None) -> None:
    """One D-PSGD mixing step in place: ``flat ← (flat + Σ received) / (1 + len(recv_from))``."""
    got = exchange(flat, send_to, recv_from, group)
    for b in got:
        flat.add_(b)
    flat.div_(1 + len(got))
