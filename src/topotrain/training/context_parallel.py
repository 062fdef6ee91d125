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



def spread_beside(blocking: tuple[Blocking, ...], starts_s: list[float],
                  durations_s: list[float]) -> list[tuple[Blocking, ...]]:
    """The blocking collectives of a task cut into parts (starting ``starts_s`` into it, lasting
    ``durations_s``: the last micro-batch's backward cut at the gradient buckets): every exchange run beside
    compute (``beside_s`` > 0) goes to the part where its offset falls, re-based there, so it is hidden by the
    attention steps of that part; the others stay on the first part as the builder puts them. Without such
    exchanges: ``blocking`` on the first part, nothing on the others."""
    if not any(b.beside_s > 0.0 for b in blocking):
        return [blocking] + [()] * (len(starts_s) - 1)
    parts: list[list[Blocking]] = [[] for _ in starts_s]
    for b in blocking:
        k = 0
        if b.beside_s > 0.0:  # the part that holds the middle of its compute (robust to rounding at the cuts)
            mid = b.offset_s + b.beside_s / 2
            k = max(i for i, s0 in enumerate(starts_s) if s0 <= mid or i == 0)
        parts[k].append(b if k == 0 else Blocking(b.comm, b.label, max(0.0, b.offset_s - starts_s[k]), b.overlap,
                                                  b.beside_s))
    return [fit_beside(tuple(sorted(p, key=lambda b: b.offset_s)), d) for p, d in zip(parts, durations_s,
                                                                                       strict=True)]


def fit_beside(blocking: tuple[Blocking, ...], duration_s: float) -> tuple[Blocking, ...]:
    """``blocking`` for a task of ``duration_s`` compute seconds: a collective's ``beside_s`` cut to the compute
    the task has between it and the next one (or its end), so an exchange whose attention steps lie in another
    part of a split backward (the last micro-batch's, cut at the gradient buckets) is exposed here rather than
    hidden behind compute this task does not have. ``blocking`` itself when every ``beside_s`` fits."""
    if not any(b.beside_s > 0.0 for b in blocking):
        return blocking
    out = list(blocking)
    for k, b in enumerate(blocking):
        if b.beside_s <= 0.0:
            continue
        nxt = blocking[k + 1].offset_s if k + 1 < len(blocking) else duration_s
        room = max(0.0, min(nxt, duration_s) - min(b.offset_s, duration_s))
        if b.beside_s > room:
            out[k] = Blocking(b.comm, b.label, b.offset_s, b.overlap, room)
    return tuple(out)
