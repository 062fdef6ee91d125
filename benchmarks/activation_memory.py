"""Activation bytes a transformer block really keeps for its backward, measured in torch on the CPU, beside
the bytes topotrain's memory model counts (:func:`topotrain.training.memory.block_activation_bytes`).

Run: ``.venv/bin/python benchmarks/activation_memory.py [--all]`` — one figure per line: a block variant, the
modelled and the measured bytes per block and micro-batch, their ratio. ``--all`` prints every variant of
:data:`VARIANTS` (the test, ``tests/test_memory_measured.py``, checks every one within 5%); without it, the
variants docs/validation.md §9 tabulates.

**What is measured.** A Megatron-style block (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", MLSys 2023, §4.1; Megatron-Core's ``TransformerLayer``) written in plain torch,
bf16 weights and activations (the CPU runs bf16 GEMMs, softmax, norms and SDPA), run forward under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves for the backward is recorded, and
the bytes counted are those of the *storages* they keep alive, each once (a view keeps its whole base; two
ops that save the same tensor cost it once); the weights are not activations and are left out. Per block:
``n_blocks`` blocks run, the total divided by ``n_blocks``. Where a CPU op keeps something other than
what the GPU kernels of a Megatron run keep, the block calls what does keep the GPU's set, and says so:

* **Dropout**: ``torch.nn.functional.dropout`` on the CPU scales by a noise tensor as wide as the data
  (2 bytes per element); on CUDA it calls ``native_dropout``, whose mask is ``bool`` (1 byte: the paper's
  count). The block calls ``torch.native_dropout``, which the CPU runs too.
* **Fused attention**: ``scaled_dot_product_attention`` on the CPU (its flash kernel,
  ``_scaled_dot_product_flash_attention_for_cpu``) saves q, k, v, the output and the fp32 log-sum-exp of
  each query row, K and V at their own (grouped) heads with ``enable_gqa`` — the set FlashAttention-2 saves
  (Dao 2023, Algorithm 2: the backward recomputes the probabilities from Q, K, V, O and L). FlashAttention's
  dropout keeps only its RNG seed and offset, never a mask, so the fused variants run the attention without
  dropout (dropout elsewhere as configured).
* **Eager attention** is Megatron's unfused ``DotProductAttention``: ``baddbmm`` with the 1/√d scale as
  ``alpha``, a softmax that saves its output only (Megatron's fused scale-mask-softmax kernel; here an
  additive causal bias, whose ``add`` saves nothing, then ``softmax``), dropout, ``bmm`` with V. Grouped K
  and V are expanded to every query head by ``repeat_interleave`` first, as Megatron-Core does.
* **RMSNorm** is a fused function keeping the input and the fp32 reciprocal RMS per token (Apex's
  ``FusedRMSNormAffineFunction``, Transformer Engine); ``torch.nn.functional.rms_norm`` on a bf16 CPU tensor
  would save an fp32 upcast. LayerNorm is ``torch.nn.functional.layer_norm`` (input, mean, rstd).
* **SwiGLU** is Megatron-Core's fused ``SwiGLUFunction`` (``fusions/fused_bias_swiglu.py``): it saves its
  input (gate and up, ``2·f`` per token) and recomputes SiLU in the backward.
* **Recomputation** as Megatron's ``tensor_parallel.checkpoint`` (``CheckpointFunction``): the wrapped
  forward runs without grad and only its inputs are saved. ``full``: the whole block (the block input kept);
  ``selective``: the core attention (Korthikanti §5; Megatron-Core's ``_checkpointed_attention_forward``),
  its inputs q, k, v before the expansion of grouped heads.
* **Tensor and sequence parallelism** are emulated on one process as Megatron-LM cuts one rank's share
  (Shoeybi et al. 2019; Korthikanti §4.2): ``a/t`` heads, ``kv/t`` key-value heads, ``f/t`` MLP columns; the
  collectives are autograd functions that save nothing (all-reduce: a new tensor; all-gather: the shard
  repeated ``t`` times; reduce-scatter: one shard). With sequence parallelism the norms, dropouts and
  residuals run on ``s/t`` tokens, and the column-parallel GEMMs gather their input inside an autograd
  function that saves the local shard and re-gathers it in the backward (Megatron's
  ``LinearWithGradAccumulationAndAsyncCommunication``) — what the paper's ``34/t`` assumes.

Not measured: rotary embeddings (none here: the model counts no stash for them, and whether the QKV output
stays alive behind a saved view of V depends on the kernel's layout), the CUDA caching allocator's blocks,
activation-gradient buffers of the backward.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any

from topotrain.training.memory import MemoryPlan, block_activation_bytes, memory_per_rank
from topotrain.workload.layer import Model
from topotrain.workload.transformer import transformer
from topotrain.workload.zoo import get_model


@dataclass(frozen=True)
class Variant:
    """One block variant: architecture, attention kernel, recomputation and parallelism of one TP rank."""

    name: str
    seq_len: int = 64
    micro_batch: int = 2
    hidden: int = 128
    heads: int = 8
    kv_heads: int = 8
    ffn_hidden: int = 512
    norm: str = "layernorm"
    activation: str = "gelu"
    flash: bool = False
    dropout: bool = True
    recompute: str = "none"
    tp: int = 1
    sequence_parallel: bool = False
    n_blocks: int = 2


@dataclass(frozen=True)
class Measurement:
    """Bytes one block keeps for its backward per micro-batch on one TP rank: modelled and measured."""

    variant: Variant
    modelled_bytes: float
    measured_bytes: float

    @property
    def ratio(self) -> float:
        """Modelled / measured."""
        return self.modelled_bytes / self.measured_bytes


def _variants() -> list[Variant]:
    out = []
    for arch, kw in (("gpt", {}), ("gpt-gqa", {"kv_heads": 2}),
                     ("llama", {"kv_heads": 2, "norm": "rmsnorm", "activation": "swiglu", "ffn_hidden": 352}),
                     ("llama-mha", {"norm": "rmsnorm", "activation": "swiglu", "ffn_hidden": 352})):
        for flash in (False, True):
            for dropout in (True, False):
                for tp, sp in ((1, False), (2, False), (2, True)):
                    for rc in ("none", "selective", "full"):
                        name = (f"{arch} {'flash' if flash else 'eager'} {'dropout' if dropout else 'no-dropout'} "
                                f"tp{tp}{' sp' if sp else ''} {rc}")
                        out.append(Variant(name, flash=flash, dropout=dropout, tp=tp, sequence_parallel=sp,
                                           recompute=rc, **kw))  # type: ignore[arg-type]
    return out


#: every variant the test checks: 4 architectures × eager/flash × dropout on/off × (tp1, tp2, tp2+SP) × 3 modes
VARIANTS: tuple[Variant, ...] = tuple(_variants())
#: the rows docs/validation.md tabulates
TABLE = ("gpt eager dropout tp1 none", "gpt eager dropout tp1 selective", "gpt eager dropout tp1 full",
         "gpt eager no-dropout tp1 none", "gpt eager dropout tp2 none", "gpt eager dropout tp2 sp none",
         "gpt eager dropout tp2 sp selective", "gpt eager dropout tp2 sp full", "gpt flash dropout tp1 none",
         "gpt-gqa eager dropout tp1 none", "gpt-gqa eager dropout tp1 selective", "gpt-gqa flash dropout tp1 none",
         "llama flash no-dropout tp1 none", "llama flash no-dropout tp2 sp none",
         "llama eager no-dropout tp1 none", "llama eager no-dropout tp2 sp selective",
         "llama-mha flash no-dropout tp1 full")


def model_of(v: Variant) -> Model:
    """The topotrain transformer of the variant's shapes (``n_blocks`` blocks, no bias, no positions)."""
    return transformer(f"block-{v.name}", layers=v.n_blocks, hidden=v.hidden, heads=v.heads, kv_heads=v.kv_heads,
                       ffn_hidden=v.ffn_hidden, seq_len=v.seq_len, vocab=64, norm=v.norm, activation=v.activation,
                       flash_attention=v.flash, dropout=v.dropout, bias=False, position="none", dtype=2)


def modelled_bytes(v: Variant) -> float:
    """What the memory model counts for one block of the variant (per micro-batch, per TP rank)."""
    plan = MemoryPlan(tp=v.tp, sequence_parallel=v.sequence_parallel, recompute=v.recompute,  # type: ignore[arg-type]
                      micro_batch=v.micro_batch)
    return block_activation_bytes(model_of(v), plan, block=v.n_blocks - 1)


# ---- the torch block --------------------------------------------------------------------------------------
@cache
def _ops() -> SimpleNamespace:
    """The autograd functions (built on first use: torch is imported only here)."""
    import torch

    class Checkpoint(torch.autograd.Function):
        """Megatron's ``CheckpointFunction``: forward without grad, only the inputs saved, recomputed later."""

        @staticmethod
        def forward(ctx: Any, fn: Any, *args: Any) -> Any:
            ctx.fn = fn
            ctx.save_for_backward(*args)
            with torch.no_grad():
                return fn(*args)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
            with torch.enable_grad():
                out = ctx.fn(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(outs, grads)
            return (None, *(t.grad if t.requires_grad else None for t in inputs))

    class AllReduce(torch.autograd.Function):
        """Tensor-parallel all-reduce of one rank (a new tensor; the backward passes the gradient on)."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    class ReduceScatter(torch.autograd.Function):
        """Sequence-parallel reduce-scatter over the sequence (dim 1) of one rank of ``t``."""

        @staticmethod
        def forward(ctx: Any, x: Any, t: int) -> Any:
            ctx.t = t
            return x[:, : x.shape[1] // t].clone()

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g.repeat(1, ctx.t, 1), None

    class ColumnLinearSP(torch.autograd.Function):
        """Megatron's column-parallel GEMM under sequence parallelism: all-gather the sequence shard inside,
        save only the shard, re-gather it in the backward."""

        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, t: int) -> Any:
            ctx.t = t
            ctx.save_for_backward(x, w)
            return torch.nn.functional.linear(x.repeat(1, t, 1), w)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            x, w = ctx.saved_tensors
            full = x.repeat(1, ctx.t, 1)
            gx = (g @ w)[:, : x.shape[1]]  # the reduce-scatter of one rank
            gw = g.flatten(0, 1).t() @ full.flatten(0, 1)
            return gx, gw, None

    class RMSNorm(torch.autograd.Function):
        """Fused RMSNorm (Apex ``FusedRMSNormAffineFunction``): keeps the input and the fp32 1/rms."""

        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, eps: float) -> Any:
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, w, rstd)
            return (x.float() * rstd).to(x.dtype) * w

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            x, w, rstd = ctx.saved_tensors
            xf, gf = x.float(), g.float() * w.float()
            xhat = xf * rstd
            gx = rstd * (gf - xhat * (gf * xhat).mean(-1, keepdim=True))
            gw = (g.float() * xhat).flatten(0, -2).sum(0)
            return gx.to(x.dtype), gw.to(w.dtype), None

    class SwiGLU(torch.autograd.Function):
        """Megatron-Core's ``SwiGLUFunction``: saves its input (gate | up), recomputes SiLU in the backward."""

        @staticmethod
        def forward(ctx: Any, y: Any) -> Any:
            ctx.save_for_backward(y)
            a, b = y.chunk(2, dim=-1)
            return torch.nn.functional.silu(a) * b

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            (y,) = ctx.saved_tensors
            a, b = y.float().chunk(2, dim=-1)
            s = torch.sigmoid(a)
            ga = g.float() * b * s * (1 + a * (1 - s))
            gb = g.float() * a * s
            return torch.cat([ga, gb], dim=-1).to(y.dtype)

    return SimpleNamespace(torch=torch, Checkpoint=Checkpoint, AllReduce=AllReduce, ReduceScatter=ReduceScatter,
                           ColumnLinearSP=ColumnLinearSP, RMSNorm=RMSNorm, SwiGLU=SwiGLU)


def _weights(v: Variant, seed: int) -> dict[str, Any]:
    """One TP rank's weights of one block (bf16)."""
    torch = _ops().torch
    g = torch.Generator().manual_seed(seed)
    h, t, hd = v.hidden, v.tp, v.hidden // v.heads
    a_l, kv_l, f_l = v.heads // t, v.kv_heads // t, v.ffn_hidden // t
    up = 2 * f_l if v.activation == "swiglu" else f_l

    def w(*shape: int) -> Any:
        return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).to(torch.bfloat16).requires_grad_()

    return {"norm1_w": torch.ones(h, dtype=torch.bfloat16, requires_grad=True),
            "norm1_b": torch.zeros(h, dtype=torch.bfloat16, requires_grad=True),
            "norm2_w": torch.ones(h, dtype=torch.bfloat16, requires_grad=True),
            "norm2_b": torch.zeros(h, dtype=torch.bfloat16, requires_grad=True),
            "qkv": w((a_l + 2 * kv_l) * hd, h), "proj": w(h, a_l * hd), "up": w(up, h), "down": w(h, f_l)}


def _norm(v: Variant, x: Any, wt: dict[str, Any], i: int) -> Any:
    ops = _ops()
    if v.norm == "rmsnorm":
        return ops.RMSNorm.apply(x, wt[f"norm{i}_w"], 1e-5)
    return ops.torch.nn.functional.layer_norm(x, (v.hidden,), wt[f"norm{i}_w"], wt[f"norm{i}_b"])


def _column(v: Variant, x: Any, w: Any) -> Any:
    ops = _ops()
    if v.sequence_parallel:
        return ops.ColumnLinearSP.apply(x, w, v.tp)
    return ops.torch.nn.functional.linear(x, w)


def _row(v: Variant, x: Any, w: Any) -> Any:
    ops = _ops()
    y = ops.torch.nn.functional.linear(x, w)
    if v.sequence_parallel:
        return ops.ReduceScatter.apply(y, v.tp)
    return ops.AllReduce.apply(y) if v.tp > 1 else y


def _dropout(v: Variant, x: Any) -> Any:
    return _ops().torch.native_dropout(x, 0.1, True)[0] if v.dropout else x


def _core_attention(v: Variant, q: Any, k: Any, v_: Any) -> Any:
    """q [b, s, a_l, hd], k and v [b, s, kv_l, hd] → context [b, s, a_l·hd]."""
    torch = _ops().torch
    b, s, a_l, hd = q.shape
    g = a_l // k.shape[2]
    if v.flash:
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v_.transpose(1, 2), is_causal=True, enable_gqa=g > 1)
        return o.transpose(1, 2).reshape(b, s, a_l * hd)
    if g > 1:  # Megatron-Core's DotProductAttention expands the key-value groups to every head
        k, v_ = k.repeat_interleave(g, dim=2), v_.repeat_interleave(g, dim=2)
    q3 = q.transpose(1, 2).reshape(b * a_l, s, hd)
    k3 = k.transpose(1, 2).reshape(b * a_l, s, hd)
    v3 = v_.transpose(1, 2).reshape(b * a_l, s, hd)
    empty = torch.empty(b * a_l, s, s, dtype=q.dtype)
    scores = torch.baddbmm(empty, q3, k3.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(hd))
    bias = torch.full((s, s), float("-inf"), dtype=q.dtype).triu(1)
    probs = _dropout(v, torch.softmax(scores + bias, dim=-1))
    ctx = torch.bmm(probs, v3)
    return ctx.view(b, a_l, s, hd).transpose(1, 2).reshape(b, s, a_l * hd)


def _block(v: Variant, x: Any, wt: dict[str, Any]) -> Any:
    """One pre-norm block of one TP rank; ``x`` is [b, s (or s/t with SP), h]."""
    ops = _ops()
    hd = v.hidden // v.heads
    a_l, kv_l = v.heads // v.tp, v.kv_heads // v.tp
    g = a_l // kv_l
    qkv = _column(v, _norm(v, x, wt, 1), wt["qkv"])
    b, s = qkv.shape[:2]
    grouped = qkv.view(b, s, kv_l, (g + 2) * hd)  # Megatron-Core's layout: per group its queries, key, value
    q, k, v_ = grouped.split([g * hd, hd, hd], dim=-1)
    q = q.reshape(b, s, a_l, hd)
    if v.recompute == "selective":
        ctx = ops.Checkpoint.apply(lambda q_, k_, vv: _core_attention(v, q_, k_, vv), q, k, v_)
    else:
        ctx = _core_attention(v, q, k, v_)
    x = x + _dropout(v, _row(v, ctx, wt["proj"]))
    y = _column(v, _norm(v, x, wt, 2), wt["up"])
    y = ops.SwiGLU.apply(y) if v.activation == "swiglu" else ops.torch.nn.functional.gelu(y)
    return x + _dropout(v, _row(v, y, wt["down"]))


def _forward(v: Variant, x: Any, weights: list[dict[str, Any]]) -> Any:
    ops = _ops()
    for wt in weights:
        if v.recompute == "full":
            x = ops.Checkpoint.apply(lambda x_, wt=wt: _block(v, x_, wt), x)
        else:
            x = _block(v, x, wt)
    return x


def measured_bytes(v: Variant, backward: bool = False) -> float:
    """Bytes of the distinct storages autograd keeps for the backward of one block (per micro-batch, one TP
    rank): the forward of ``n_blocks`` blocks under ``saved_tensors_hooks``, divided by ``n_blocks``.
    ``backward=True`` also runs the backward (a check that the block's functions are a working model)."""
    torch = _ops().torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: threads only contend (2 shared cores); the bytes do not depend on it
    try:
        return _measured_bytes(v, backward)
    finally:
        torch.set_num_threads(threads)


def _measured_bytes(v: Variant, backward: bool) -> float:
    torch = _ops().torch
    torch.manual_seed(0)
    weights = [_weights(v, seed=i) for i in range(v.n_blocks)]
    params = {p.untyped_storage().data_ptr() for wt in weights for p in wt.values()}
    s_local = v.seq_len // v.tp if v.sequence_parallel else v.seq_len
    x = torch.randn(v.micro_batch, s_local, v.hidden, dtype=torch.bfloat16, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            kept[st.data_ptr()] = max(kept.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = _forward(v, x, weights)
    if backward:
        out.float().sum().backward()
    return sum(kept.values()) / v.n_blocks


def measure(v: Variant) -> Measurement:
    return Measurement(v, modelled_bytes(v), measured_bytes(v))


#: Llama 3 405B's 8K pre-training (Meta 2024, "The Llama 3 Herd of Models", Table 4; docs/sources.md §7c): TP 8,
#: CP 1, PP 16 at 8,192 GPUs (DP 64, 32 sequences per DP group) and 16,384 GPUs (DP 128, 16), micro-batch 1
LLAMA3_8K = ((8192, 64, 32), (16384, 128, 16))


def llama3_405b_lines() -> list[str]:
    """The 405B 8K stage read as micro-batch 1 without recomputation: memory per GPU for each reading of the
    schedule and of the framework's states (GiB; the busiest stage)."""
    m = get_model("llama3-405b")
    gib = 2.0**30
    out = [f"llama3-405b 8K block stash per micro-batch, tp 8 + SP: "
           f"{block_activation_bytes(m, MemoryPlan(tp=8, sequence_parallel=True), block=1) / gib:.4f} GiB"]
    for gpus, dp, mbs in LLAMA3_8K:
        for sched, v in (("1f1b", 1), ("interleaved", 2)):
            for zero, grad, label in ((1, None, "ZeRO-1, bf16 grads"), (1, 4, "ZeRO-1, fp32 grads (Megatron-Core)"),
                                      (2, 4, "grads sharded, fp32 (Meta's FSDP)")):
                plan = MemoryPlan(tp=8, pp=16, dp=dp, zero_stage=zero, sequence_parallel=True, micro_batch=1,
                                  num_micro_batches=mbs, pipeline_schedule=sched, virtual_stages=v,  # type: ignore[arg-type]
                                  grad_buffer_bytes=grad)  # type: ignore[arg-type]
                b = memory_per_rank(m, plan)
                out.append(f"llama3-405b 8K {gpus} GPUs dp {dp} {mbs} micro-batches {sched} v{v} {label}: "
                           f"weights {b.weights_bytes / gib:.1f} grads {b.gradients_bytes / gib:.1f} "
                           f"optimizer {b.optimizer_bytes / gib:.2f} activations {b.activations_bytes / gib:.1f} "
                           f"total {b.total_bytes / gib:.1f} GiB")
    return out


def main() -> int:
    names = set(TABLE)
    rows = VARIANTS if "--all" in sys.argv else tuple(v for v in VARIANTS if v.name in names)
    v0 = VARIANTS[0]
    print(f"shapes: s {v0.seq_len}, b {v0.micro_batch}, h {v0.hidden}, a {v0.heads}, gqa kv 2, ffn 512 (gelu) / "
          f"352 (swiglu), bf16, {v0.n_blocks} blocks")
    worst = 0.0
    for v in rows:
        m = measure(v)
        worst = max(worst, abs(m.ratio - 1.0))
        print(f"{v.name}: modelled {m.modelled_bytes:.0f} B measured {m.measured_bytes:.0f} B "
              f"modelled/measured {m.ratio:.4f}")
    print(f"worst |modelled/measured - 1| over {len(rows)} variants: {worst:.4f}")
    for line in llama3_405b_lines():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["LLAMA3_8K", "TABLE", "VARIANTS", "Measurement", "Variant", "measure", "measured_bytes", "model_of",
           "llama3_405b_lines", "modelled_bytes"]
