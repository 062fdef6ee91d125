"""Context parallelism on the workload side: what one of ``cp`` ranks computes, stores and exchanges.

Megatron-Core's context parallelism (``--context-parallel-size``; NVIDIA, "Context parallelism overview",
Megatron-Core user guide, ``docs/source/api-guide/context_parallel.rst``) splits every sequence of ``s``
tokens over the ``cp`` ranks of a context-parallel group. Every layer but the attention core works on the
rank's ``s/cp`` tokens alone, so its FLOPs, activation bytes, stashed bytes, tensor-parallel collectives and
pipeline sends are ``1/cp`` of the whole sequence's; the weights are the whole model's on every rank.
The attention core is ring attention (Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers
for Near-Infinite Context", 2023; Transformer Engine's ``AttnFuncWithCPAndKVP2P``): the rank keeps its
queries and circulates the keys and values around the group, computing the scores of its queries against one
K,V chunk per step. With causal masking Megatron-Core balances the load: the sequence is cut into ``2·cp``
chunks and rank ``i`` holds chunks ``i`` and ``2·cp − 1 − i``, so every rank does ``1/cp`` of the causal
attention's work (each ring step a half block, the first the causal diagonal). The attention core of one
rank is therefore ``1/cp`` of the whole sequence's FLOPs, run as ``cp`` steps over ``s/cp`` queries and
``s/cp`` keys.

:func:`cp_local_model` is that share as a :class:`~topotrain.workload.layer.Model` (every per-sample count
the rank's own; the architecture metadata — ``seq_len`` and the head counts — stays the whole model's), so a
compute model times it and the memory model stores it unchanged. :func:`kv_chunk_bytes` is what one ring step
sends. Nothing here knows the network: the training layer turns the steps into transfers.
"""

from __future__ import annotations

import math
from dataclasses import replace

from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind, Model


def cp_model_problems(model: Model, cp: int) -> list[ConfigError]:
    """Why ``model`` cannot run context-parallel over ``cp`` ranks (fields relative to the plan)."""
    if model.sample_kind != "sequence" or not model.seq_len:
        return [ConfigError("cp", f"{model.name} has no sequence to split, so it cannot run cp={cp}",
                            "use cp: 1; a CNN trains data-parallel")]
    found: list[ConfigError] = []
    s = int(model.seq_len)
    if s % (2 * cp):
        found.append(ConfigError("cp", f"seq_len {s} is not divisible by 2·cp = {2 * cp}",
                                 "Megatron-Core cuts each sequence into 2·cp chunks for causal load balancing: "
                                 "choose cp with 2·cp dividing seq_len"))
    kinds = {lay.kind for lay in model.layers if lay.block >= 0}
    if LayerKind.ATTENTION not in kinds or LayerKind.MATMUL in kinds:
        found.append(ConfigError("cp", f"{model.name} has no fused attention: ring attention runs inside the fused "
                                 "(flash) attention kernel", "set model.flash_attention: true"))
    return found


def _scaled(lay: Layer, cp: int) -> Layer:
    """``lay`` on ``1/cp`` of the sequence (module docstring): per-token counts divided, weights kept."""
    f = 1.0 / cp
    shape, count = lay.gemm_shape, lay.gemm_count
    if shape is not None:
        m, n, k = shape
        if lay.kind == LayerKind.ATTENTION:
            # cp ring steps, each of s/cp queries against s/cp keys
            shape, count = (max(1, m // cp), max(1, n // cp), k), count * cp
        elif lay.gemm_batch_scales == "m":
            shape = (max(1, round(m / cp)), n, k)
    return replace(
        lay,
        fwd_flops=lay.fwd_flops * f,
        bwd_flops=lay.bwd_flops * f,
        fwd_bytes=(lay.fwd_bytes - lay.param_bytes) * f + lay.param_bytes,
        bwd_bytes=(lay.bwd_bytes - 2.0 * lay.param_bytes) * f + 2.0 * lay.param_bytes,
        activation_bytes=lay.activation_bytes * f,
        output_bytes=lay.output_bytes * f,
        tp_allreduce_bytes_fwd=lay.tp_allreduce_bytes_fwd * f,
        tp_allreduce_bytes_bwd=lay.tp_allreduce_bytes_bwd * f,
        alltoall_bytes_fwd=lay.alltoall_bytes_fwd * f,
        gemm_shape=shape,
        gemm_count=count,
    )


def cp_local_model(model: Model, cp: int) -> Model:
    """The share of ``model`` one of ``cp`` context-parallel ranks runs (module docstring); ``model`` itself
    when ``cp`` is 1. Raises ConfigError (field ``plan.cp``) for a model that cannot run it."""
    if cp == 1:
        return model
    found = cp_model_problems(model, cp)
    if found:
        raise ConfigError(f"plan.{found[0].field}", found[0].message, found[0].fix)
    return replace(model, layers=tuple(_scaled(lay, cp) for lay in model.layers))


def kv_chunk_bytes(model: Model, cp: int, tp: int = 1) -> float:
    """Bytes of the keys and values of one rank's ``s/cp`` tokens for one sample on one tensor-parallel rank:
    ``2 · (s/cp) · ⌈kv_heads/tp⌉ · d_head · dtype`` — what one ring-attention step sends (grouped-query
    attention sends only its ``kv_heads``; Megatron splits them over the tensor-parallel ranks)."""
    s, h = int(model.seq_len or 0), int(model.hidden or 0)
    heads = int(model.heads or 1)
    kv = int(model.kv_heads or heads)
    return 2.0 * (s / cp) * math.ceil(kv / tp) * (h // heads) * model.dtype


def attention_layers(model: Model) -> list[int]:
    """Indices of the fused attention cores of the blocks (where ring attention exchanges K and V)."""
    return [i for i, lay in enumerate(model.layers) if lay.kind == LayerKind.ATTENTION and lay.block >= 0]
