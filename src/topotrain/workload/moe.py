"""Mixture-of-experts blocks as Megatron-Core builds them: routing, capacity, shared experts, MoE layer pattern.

Read from Megatron-Core (NVIDIA/Megatron-LM at d98e8a64dd, Apache-2.0; docs/sources.md §17):

* **Routing** (``transformer/moe/router.py``, ``TopKRouter``): a router GEMM ``h → experts`` (no bias), a
  softmax over the experts and the top-``k`` of every token; each token is copied to its ``k`` experts
  (Shazeer et al. 2017; Fedus et al., "Switch Transformers", 2022; Mixtral: Jiang et al. 2024).
* **Expert hidden size** ``moe_ffn_hidden`` (``TransformerConfig.moe_ffn_hidden_size``, default the dense
  ``ffn_hidden``): every routed expert is an MLP of that width with the model's activation.
* **Capacity** (``moe_utils.get_capacity`` and ``apply_router_token_dropping``): with a capacity factor
  ``cf`` (``moe_expert_capacity_factor``; ``None`` = dropless, Megatron's default) an expert takes at most
  ``capacity = ⌈(k·T / E)·cf⌉`` of the ``T`` tokens it is offered (``num_tokens = T·k``); the rest are
  dropped (their expert output is zero). With ``pad_to_capacity`` (``moe_pad_expert_input_to_capacity``)
  every expert's input is padded to exactly ``capacity`` rows (``final_map = capacity_mask``; when the
  capacity exceeds ``T``, ``capacity_mask`` is all ones, so every expert takes all ``T`` tokens), and the
  all-to-all dispatcher sends the padded rows (``MoEAlltoAllTokenDispatcher``: ``input_splits`` are
  ``capacity`` per local expert). Routing is modelled balanced (every expert offered ``k·T/E`` tokens): a
  capacity factor ≥ 1 then drops nothing, one below 1 drops ``k·T − E·capacity`` copies; padding makes
  every expert compute ``min(capacity, T)`` rows whatever the routing. ``T`` is one sequence here (the
  ceiling is taken per sequence; Megatron takes it over a rank's micro-batch — at most one row per expert
  per sequence apart).
* **Shared experts** (``transformer/moe/shared_experts.py``, ``SharedExpertMLP``): an MLP of
  ``shared_expert_hidden`` (``moe_shared_expert_intermediate_size``, the sum over the shared experts) that
  every token passes through, tensor-parallel like the dense MLP (column-parallel up, row-parallel down)
  and not expert-parallel; ``shared_expert_gate`` (``moe_shared_expert_gate``) adds a ``h → 1`` linear and
  a sigmoid that scales its output (Qwen1.5-MoE's ``shared_expert_gate``).
* **Layer pattern** ``moe_layer_freq`` (``TransformerConfig.moe_layer_freq``): an integer ``N`` makes
  blocks ``0, N, 2N, …`` MoE and the others dense; a list of 0/1 per block gives the pattern
  (DeepSeek-MoE's first dense block: ``[0, 1, 1, …]``). A dense block's MLP has ``ffn_hidden``.

The router's dtype (``moe_router_dtype``: fp32 routing) is not a field: the router GEMM is ``2·T·h·E``
FLOPs, under 0.1% of a block's for every model in the zoo, so its precision does not move a prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topotrain.util.errors import ConfigError
from topotrain.workload.block import LayerBuilder
from topotrain.workload.layer import LayerKind, TPSplit

_SOFTMAX_FLOPS = 5.0
_SIGMOID_FLOPS = 4.0


@dataclass(frozen=True)
class Routing:
    """One MoE MLP's routing: ``experts`` routed experts of ``expert_hidden``, ``top_k`` per token, an optional
    capacity factor (None: dropless) and padding, and the shared experts' total hidden size (None: none)."""

    experts: int
    top_k: int
    expert_hidden: int
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    shared_hidden: int | None = None
    shared_gate: bool = False

    def capacity(self, tokens: int) -> int | None:
        """Megatron-Core's ``get_capacity(num_tokens=tokens·k, num_experts, capacity_factor)``:
        ``⌈(k·tokens / E)·cf⌉``, or None when dropless."""
        if self.capacity_factor is None:
            return None
        return math.ceil((tokens * self.top_k / self.experts) * self.capacity_factor)

    def expert_rows(self, tokens: int) -> int:
        """Token copies the experts compute for ``tokens`` tokens (all experts together), under balanced routing:
        ``k·tokens`` dropless; ``E·min(k·tokens/E, capacity)`` with a capacity; ``E·min(capacity, tokens)``
        padded (module docstring)."""
        routed = self.top_k * tokens
        cap = self.capacity(tokens)
        if cap is None:
            return routed
        if self.pad_to_capacity:
            return self.experts * min(cap, tokens)
        return min(routed, self.experts * cap)


def moe_pattern(freq: int | tuple[int, ...], layers: int) -> tuple[bool, ...]:
    """Which blocks are MoE for ``moe_layer_freq`` ``freq`` (an integer N: every N-th block from block 0; a
    tuple: one 0/1 per block), as ``TransformerConfig.moe_layer_freq`` reads it."""
    if isinstance(freq, int):
        return tuple(i % freq == 0 for i in range(layers))
    return tuple(bool(x) for x in freq)


def pattern_problems(freq: int | tuple[int, ...], layers: int, experts: int) -> list[ConfigError]:
    """Why ``moe_layer_freq`` cannot describe a model of ``layers`` blocks (fields ``model.<name>``)."""
    if isinstance(freq, int):
        return [] if freq == 1 or experts > 1 else [
            ConfigError("moe_layer_freq", "places MoE blocks in a model without experts", "set experts > 1")]
    found = []
    if len(freq) != layers:
        found.append(ConfigError("moe_layer_freq", f"has {len(freq)} entries for {layers} layers",
                                 "give one 0 (dense) or 1 (MoE) per block, or an integer N (every N-th block)"))
    if any(x not in (0, 1) for x in freq):
        found.append(ConfigError("moe_layer_freq", "entries must be 0 (dense block) or 1 (MoE block)",
                                 "e.g. [0, 1, 1, 1] for a first dense block"))
    if experts == 1:
        found.append(ConfigError("moe_layer_freq", "places MoE blocks in a model without experts", "set experts > 1"))
    return found


def moe_mlp(b: LayerBuilder, r: Routing, p: str, *, s: int, act_flops: float, gated: bool, bias: bool) -> None:
    """The MoE MLP of one block (module docstring) for a sequence of ``s`` tokens: shared experts (when any:
    Megatron-Core runs them before the router), router, gate softmax, the experts' GEMMs on the routed (or
    padded) rows with the expert-parallel all-to-all of those rows around them, and the weighted combine."""
    h, d = b.h, b.d_bytes
    g = 2 if gated else 1
    e, k, f = r.experts, r.top_k, r.expert_hidden
    if r.shared_hidden:
        fs = r.shared_hidden
        b.linear(f"{p}shared_up", s, g * fs, h, bias=bias, tp=TPSplit.COLUMN, tp_allreduce_bytes_bwd=float(d * s * h))
        b.elementwise(f"{p}shared_act", g * s * fs, s * fs, act_flops, tp=TPSplit.COLUMN,
                      stash_bytes=float(d * g * s * fs))
        b.linear(f"{p}shared_down", s, h, fs, bias=bias, tp=TPSplit.ROW, tp_allreduce_bytes_fwd=float(d * s * h))
        if r.shared_gate:
            b.linear(f"{p}shared_gate", s, 1, h, bias=False, tp=TPSplit.REPLICATED)
            b.elementwise(f"{p}shared_gate_sigmoid", s * h + s, s * h, _SIGMOID_FLOPS, tp=TPSplit.REPLICATED,
                          stash_bytes=float(d * s))
    rows = r.expert_rows(s)
    m = max(1, round(rows / e))  # rows per expert GEMM
    payload = float(d * rows * h)
    b.linear(f"{p}moe_router", s, e, h, bias=False, tp=TPSplit.REPLICATED, kind=LayerKind.MOE_ROUTER)
    b.elementwise(f"{p}moe_gate_softmax", s * e, s * e, _SOFTMAX_FLOPS, tp=TPSplit.REPLICATED, kind=LayerKind.SOFTMAX,
                  row_elems=e)
    b.linear(f"{p}experts_up", m, g * f, h, bias=bias, tp=TPSplit.COLUMN, count=e, rows=rows, expert=True,
             alltoall_bytes_fwd=payload, tp_allreduce_bytes_bwd=payload)
    b.elementwise(f"{p}experts_act", g * rows * f, rows * f, act_flops, tp=TPSplit.COLUMN,
                  stash_bytes=float(d * g * rows * f), expert=True)
    b.linear(f"{p}experts_down", m, h, f, bias=bias, tp=TPSplit.ROW, count=e, rows=rows, expert=True,
             alltoall_bytes_fwd=payload, tp_allreduce_bytes_fwd=payload)
    # the weighted sum of each token's expert outputs: 2 FLOPs per kept copy and output element
    per_token = 2.0 * k if r.capacity_factor is None else 2.0 * rows / s
    b.elementwise(f"{p}moe_combine", rows * h, s * h, per_token, tp=TPSplit.REPLICATED)
