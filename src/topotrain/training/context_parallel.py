"""Ring attention's exchanges as blocking steps of the attention layer's forward and backward.

Megatron-Core runs context parallelism through Transformer Engine's ``AttnFuncWithCPAndKVP2P``
(``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``; NVIDIA, "Context
parallelism overview", Megatron-Core user guide; Liu et al., "Ring Attention with Blockwise Transformers for
Near-Infinite Context", 2023). With ``cp`` ranks in a group and ``kv`` the bytes of one rank's keys and
values (:func:`topotrain.workload.context_parallel.kv_chunk_bytes`), per attention layer and micro-batch:

* **forward**: ``cp`` attention steps, one per K,V chunk. Before step ``i < cp − 1`` the rank posts the
  send of the chunk it holds to rank ``+1`` and the receive of the next one, so transfer ``i`` runs beside
  step ``i``'s attention: ``cp − 1`` ring steps of ``kv`` bytes, each exposing ``max(0, transfer − step)``.
* **backward**: ``cp`` steps in the reverse ring (to rank ``−1``); each step's buffer holds K,V and the
  partial dK,dV travelling with them (TE's ``p2p_comm_buffers``: ``[kv, dkv]``): step 0 sends K,V only,
  steps ``1 … cp − 2`` both (``2·kv``), the last the finished dK,dV only (back to their owner), each beside one
  step of the attention backward: ``2·(cp − 1)·kv`` bytes in all, in the model dtype.

A step's compute is ``1/cp`` of the layer's attention time on the rank (causal load balancing makes every
step alike: :mod:`topotrain.workload.context_parallel`). Each group of equal steps is one
:class:`~topotrain.training.engine.Blocking` with ``beside_s`` its steps' compute: the engine times it on
the network (it contends with the data-parallel and pipeline traffic where they share links) and charges
``max(0, transfer − compute)`` summed over its steps when the steps are equal, as their sum of maxima.
"""

from __future__ import annotations

from collections.abc import Callable

from topotrain.training.engine import Blocking, CommSpec

#: A ring exchange of the group of a pipeline stage: (step bytes, direction) → the collective of all groups.
RingSpec = Callable[[tuple[int, ...], int], CommSpec | None]


def forward_steps(kv_bytes: int, cp: int) -> tuple[int, ...]:
    """Bytes sent by every rank at each forward ring step: ``cp − 1`` steps of the K,V chunk."""
    return (kv_bytes,) * (cp - 1)


def backward_steps(kv_bytes: int, cp: int) -> tuple[int, ...]:
    """Bytes sent by every rank at each backward ring step (module docstring): ``kv``, ``cp − 2`` of
    ``2·kv``, ``kv``."""
    return (kv_bytes,) + (2 * kv_bytes,) * (cp - 2) + (kv_bytes,)


def forward_ring(spec: RingSpec, kv_bytes: int, cp: int, attention_s: float, at_s: float,
                 label: str) -> list[Blocking]:
    """The forward exchange of one attention layer whose compute (all ``cp`` steps) is ``attention_s`` and
    starts ``at_s`` into its task."""
    comm = spec(forward_steps(kv_bytes, cp), 1)
    if comm is None:
        return []
    step_s = attention_s / cp
    return [Blocking(comm, f"cp ring K,V {label}", at_s, beside_s=(cp - 1) * step_s)]


def backward_ring(spec: RingSpec, kv_bytes: int, cp: int, attention_s: float, at_s: float,
                  label: str) -> list[Blocking]:
    """The backward exchanges of one attention layer whose backward compute is ``attention_s``, starting
    ``at_s`` into its task: the first step, the middle ones (``cp > 2``), the last, each a group of equal
    steps beside as many steps of compute."""
    steps = backward_steps(kv_bytes, cp)
    step_s = attention_s / cp
    groups = [(steps[:1], 0), (steps[1:-1], 1), (steps[-1:], cp - 1)]
    out: list[Blocking] = []
    for part, first in groups:
        if not part:
            continue
        comm = spec(part, -1)
        if comm is not None:
            out.append(Blocking(comm, f"cp ring K,V,dK,dV {label} (bwd, steps {first}-{first + len(part) - 1})",
                                at_s + first * step_s, beside_s=len(part) * step_s))
    return out
