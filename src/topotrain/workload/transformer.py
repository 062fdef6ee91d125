"""Transformers (GPT, BERT, Llama, Mixtral, …) decomposed into layers from their architecture.

Per block (pre-norm order; ``pre_norm=False`` gives BERT's post-norm order with the same layers):
norm → QKV linear (column-parallel) → [rotary] → attention scores matmul → softmax → [dropout] →
attention over values matmul → output projection (row-parallel: Megatron's first allreduce) → [dropout]
→ residual add → norm → MLP up (column) → activation → MLP down (row: the second allreduce) → [dropout] →
residual add. ``flash_attention=True`` fuses scores, softmax and context into one ``attention`` layer.
``eager_attention=True`` is the unfused attention as eager PyTorch reference code writes it (BERT's
``BertSelfAttention`` in NVIDIA DeepLearningExamples before its 2022 TorchScript/NVFuser version, Hugging
Face's BERT): the ``1/sqrt(d_head)`` scaling and the additive
padding mask are element-wise kernels of their own over the ``heads·s²`` scores, and the head split and
merge are copies (``torch.matmul`` reshapes permuted 4-D operands to 3-D batches, which copies them;
``permute(...).contiguous()`` for the context), each read and written once forward and once backward.
Megatron-LM's unfused path (the default) scales inside the GEMM (``baddbmm``'s ``alpha``) and fuses the
mask into its softmax kernel, so it has none of these.
``attention_unpad=True`` (with ``flash_attention``) is flash-attn's variable-length call as LLM Foundry's
``attn_impl: flash`` makes it: Q, K and V gathered into unpadded copies before the kernel and the output
scattered back after it (``flash_attn.bert_padding``), each undone in backward (:func:`_unpad_layers`).
``logit_metrics=k`` adds ``k`` cross-entropy evaluations of the logits per micro-batch outside the loss,
without gradient, in fp32 (Composer's training metrics: :func:`_logit_metrics`).
MoE blocks (``experts > 1``; Shazeer et al. 2017, Fedus et al. 2022, Mixtral: Jiang et al. 2024) replace
the MLP by a router and ``experts`` expert MLPs of which each token visits ``top_k``; the expert hidden size,
capacity factor (token dropping, padding), shared experts and which blocks are MoE as Megatron-Core defines
them: :mod:`topotrain.workload.moe`.

Counts for one sequence of ``s`` tokens, hidden ``h``, ``a`` heads, GEMMs at 2 FLOPs per multiply-add:

* GEMMs: QKV ``2·s·h·(h + 2·kv·d)``, scores and context ``2·s²·h`` each, output ``2·s·h²``, MLP
  ``2·s·h·f`` per matrix (3 matrices when gated, SwiGLU: Shazeer 2020), logits ``2·s·h·V``. With
  ``kv_heads = heads`` and ``f = 4h`` the block is ``24·s·h² + 4·s²·h``, as in Narayanan et al. SC'21
  §5.1. Causal masking does not reduce the unfused count (the full score matrix is computed, as the
  paper counts it); a fused causal ``attention`` computes only the lower triangle, ``(s+1)/(2s)``.
* Stashed activations follow Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models" (MLSys 2023), §4.1: with dropout a block stashes ``s·h·(34 + 5·a·s/h)`` bytes at
  2 bytes per element; without dropout ``s·h·(32 + 2·a·s/h)``. With grouped-query attention the unfused
  GEMMs stash K and V expanded to every head (Megatron-Core's ``DotProductAttention`` repeats them before
  ``baddbmm``), so the count is the MHA one; FlashAttention keeps K and V at their own heads. Checked against
  the bytes torch saves for such a block (benchmarks/activation_memory.py, docs/validation.md §9).
* Norms: LayerNorm ≈ 8 FLOPs per element, RMSNorm ≈ 4; softmax ≈ 5; rotary embedding ≈ 3 per rotated element of q
  and k. Partial rotary (``rotary_percent``, Megatron's ``--rotary-percent``: GPT-NeoX/Pythia 0.25, Phi-2 0.4,
  Persimmon and Nemotron-4 0.5) rotates ``int(d_head·rotary_percent)`` dimensions of each head and passes the
  rest through (``apply_rotary_pos_emb`` splits ``t[..., :rot_dim]`` off and concatenates the rest back), so
  the FLOPs scale by the percent and the bytes stay those of the whole q and k; no parameters either way.
  MLP activations (``activation``; ``gated_mlp: true`` is the older spelling of ``swiglu``), FLOPs per output
  element: GELU (tanh form) ≈ 8, ReLU 1, squared ReLU 2 (So et al., "Primer", 2021; Nemotron-4),
  and the gated forms of Shazeer, "GLU Variants Improve Transformer" (2020) — SwiGLU ≈ 6 (SiLU and the
  product), GeGLU ≈ 9 (GELU and the product) — whose up projection is two matrices (``2·f`` outputs).
* ``position: alibi`` (Press et al., "Train Short, Test Long", 2022): no parameters and no layer of its
  own, the linear bias is added to the scores inside the attention kernel (its FLOPs are not counted).
* ``embedding_norm`` (default: an encoder's): a norm of the model's kind after the embeddings (BLOOM's
  ``word_embeddings_layernorm``; BERT's embedding LayerNorm). ``vocab_divisible_by``: the vocabulary padded
  to a multiple (Megatron-LM's ``--make-vocab-size-divisible-by`` times the tensor-parallel size; BLOOM-176B
  pads its 250,680 tokens to 250,880 = 490·128·4), the embedding and head sized by the padded vocabulary.
* Biases (``bias=True``, GPT/BERT) add one FLOP per output element of each linear.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): per block two forward allreduces (after the
output projection and after the MLP down projection) and two backward ones (before QKV and MLP up), each
``s·h·dtype`` bytes per sample; the word embedding is vocabulary-parallel (one forward allreduce).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from topotrain.util.errors import ConfigError, ConfigErrors, problems_of
from topotrain.util.problems import config_dataclass, several
from topotrain.workload.block import LayerBuilder
from topotrain.workload.layer import LayerKind, Model, TPSplit
from topotrain.workload.moe import Routing, moe_mlp, moe_pattern, pattern_problems

_GELU_FLOPS = 8.0
_SWIGLU_FLOPS = 6.0
#: FLOPs per output element of each MLP activation, and whether it is gated (two up projections)
_ACTIVATIONS = {"gelu": (_GELU_FLOPS, False), "relu": (1.0, False), "squared-relu": (2.0, False),
                "swiglu": (_SWIGLU_FLOPS, True), "geglu": (_GELU_FLOPS + 1.0, True)}
_SOFTMAX_FLOPS = 5.0
_ROPE_FLOPS = 3.0
_LOSS_FLOPS_FWD = 5.0
_LOSS_FLOPS_BWD = 2.0
_LOSS_BYTES = 4  # Megatron computes the cross-entropy in fp32 (vocab_parallel_cross_entropy)


def _integral(v: Any) -> Any:
    """An integral float from YAML (``1024.0``) is the integer; anything else is left to the type check."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"must be 1, 2, 4 or 8 bytes per element, not {v!r}")
    return v


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


_Count = Annotated[int, BeforeValidator(_integral), Field(strict=True, ge=1)]
_Flag = Annotated[bool, Field(strict=True)]


@config_dataclass("model")
class TransformerConfig:
    """The architecture of a transformer, checked whole (every problem at once, fields ``model.<name>``).

    Optional sizes are filled in by the validator: ``ffn_hidden`` = 4·hidden, ``kv_heads`` = heads,
    ``max_positions`` and ``head_tokens`` = seq_len, ``token_types`` = 2 for an encoder (BERT) else 0,
    ``pre_norm`` = not encoder; an encoder is never causal. ``dtype`` is bytes per element.
    """

    name: Annotated[str, Field(strict=True, min_length=1)]
    layers: _Count
    hidden: _Count
    heads: _Count
    seq_len: _Count
    vocab: _Count
    ffn_hidden: _Count | None = None
    kv_heads: _Count | None = None
    gated_mlp: _Flag = False
    activation: Annotated[Literal["gelu", "relu", "squared-relu", "swiglu", "geglu"], BeforeValidator(_lower)] | None \
        = None
    experts: _Count = 1
    top_k: _Count = 1
    moe_ffn_hidden: _Count | None = None
    capacity_factor: Annotated[float, Field(strict=False, gt=0)] | None = None
    pad_to_capacity: _Flag = False
    shared_expert_hidden: _Count | None = None
    shared_expert_gate: _Flag = False
    moe_layer_freq: _Count | tuple[int, ...] = 1
    rotary_percent: Annotated[float, Field(strict=False, gt=0, le=1)] = 1.0
    norm: Annotated[Literal["layernorm", "rmsnorm"], BeforeValidator(_lower)] = "layernorm"
    tie_embeddings: _Flag = True
    position: Annotated[Literal["learned", "rotary", "alibi", "none"], BeforeValidator(_lower)] = "learned"
    causal: _Flag = True
    encoder_only: _Flag = False
    bias: _Flag = True
    dropout: _Flag = False
    flash_attention: _Flag = False
    eager_attention: _Flag = False
    attention_unpad: _Flag = False
    logit_metrics: Annotated[int, BeforeValidator(_integral), Field(strict=True, ge=0)] = 0
    pre_norm: _Flag | None = None
    max_positions: _Count | None = None
    head_tokens: _Count | None = None
    token_types: Annotated[int, BeforeValidator(_integral), Field(strict=True, ge=0)] | None = None
    embedding_norm: _Flag | None = None
    vocab_divisible_by: _Count = 1
    dtype: Annotated[Literal[1, 2, 4, 8], BeforeValidator(_not_bool)] = 2

    @model_validator(mode="after")
    def _resolve(self) -> TransformerConfig:
        s, h, a = self.seq_len, self.hidden, self.heads
        enc = self.encoder_only
        fill = {"ffn_hidden": 4 * h, "kv_heads": a, "max_positions": s, "head_tokens": s,
                "token_types": 2 if enc else 0, "pre_norm": not enc, "embedding_norm": enc,
                "activation": "swiglu" if self.gated_mlp else "gelu"}
        found = []
        if self.gated_mlp and self.activation is not None and not _ACTIVATIONS[self.activation][1]:
            found.append(ConfigError("gated_mlp", f"gated_mlp: true is a gated activation, not {self.activation}",
                                     "drop gated_mlp (activation names the MLP's activation)"))
        for key, default in fill.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, default)
        object.__setattr__(self, "causal", self.causal and not enc)
        if h % a:
            found.append(ConfigError("heads", f"hidden {h} is not divisible by heads {a}",
                                     "choose heads dividing hidden (head dim = hidden/heads)"))
        if a % self.kv_heads_n:
            found.append(ConfigError("kv_heads", f"heads {a} is not a multiple of kv_heads {self.kv_heads_n}",
                                     "choose kv_heads dividing heads (grouped-query attention)"))
        if self.top_k > self.experts:
            found.append(ConfigError("top_k", f"top_k {self.top_k} exceeds experts {self.experts}",
                                     "choose top_k ≤ experts"))
        found += self._moe_problems() + self._rotary_problems()
        if self.position == "learned" and self.max_positions_n < s:
            found.append(ConfigError("max_positions", f"{self.max_positions_n} learned positions cannot cover "
                                     f"seq_len {s}", f"set max_positions ≥ {s} or lower seq_len"))
        if self.eager_attention and self.flash_attention:
            found.append(ConfigError("eager_attention", "eager_attention describes the unfused attention path",
                                     "drop eager_attention or flash_attention"))
        if self.attention_unpad and not self.flash_attention:
            found.append(ConfigError("attention_unpad", "unpadding wraps the fused (flash) attention kernel",
                                     "set flash_attention: true or drop attention_unpad"))
        if self.head_tokens_n > s:
            found.append(ConfigError("head_tokens", f"{self.head_tokens_n} exceeds seq_len {s}",
                                     f"give head_tokens ≤ {s}"))
        if found:
            raise several(found)
        return self

    def _moe_problems(self) -> list[ConfigError]:
        found = pattern_problems(self.moe_layer_freq, self.layers, self.experts)
        moe_only = {"moe_ffn_hidden": self.moe_ffn_hidden, "capacity_factor": self.capacity_factor,
                    "shared_expert_hidden": self.shared_expert_hidden}
        if self.experts == 1:
            found += [ConfigError(k, "is a mixture-of-experts field, but the model has no experts",
                                  f"drop {k} or set experts > 1") for k, v in moe_only.items() if v is not None]
        if self.pad_to_capacity and self.capacity_factor is None:
            found.append(ConfigError("pad_to_capacity", "pads each expert's input to its capacity, which needs a "
                                     "capacity factor", "set capacity_factor (e.g. 1.0) or drop pad_to_capacity"))
        if self.shared_expert_gate and self.shared_expert_hidden is None:
            found.append(ConfigError("shared_expert_gate", "gates the shared experts, and there are none",
                                     "set shared_expert_hidden or drop shared_expert_gate"))
        return found

    def _rotary_problems(self) -> list[ConfigError]:
        if self.rotary_percent == 1.0:
            return []
        if self.position != "rotary":
            return [ConfigError("rotary_percent", f"applies to rotary positions, not position: {self.position}",
                                "set position: rotary or drop rotary_percent")]
        dim = self.rotary_dim
        if dim < 2 or dim % 2:
            return [ConfigError("rotary_percent", f"gives a rotary dimension of {dim} of the head's "
                                f"{self.hidden // self.heads} (int(head_dim·rotary_percent))",
                                "choose a percent that gives an even rotary dimension ≥ 2")]
        return []

    @property
    def rotary_dim(self) -> int:
        """Head dimensions the rotary embedding rotates: ``int(head_dim · rotary_percent)`` (Megatron-Core's
        ``RotaryEmbedding``: ``dim = int(kv_channels * rotary_percent)``; Hugging Face's
        ``partial_rotary_factor``, GPT-NeoX's ``rotary_pct``)."""
        return int((self.hidden // self.heads) * self.rotary_percent)

    @property
    def routing(self) -> Routing:
        """The MoE blocks' routing (:mod:`topotrain.workload.moe`)."""
        return Routing(self.experts, self.top_k, int(self.moe_ffn_hidden or self.ffn_hidden_n),
                       self.capacity_factor, self.pad_to_capacity, self.shared_expert_hidden, self.shared_expert_gate)

    # the resolved sizes (never None after validation)
    @property
    def ffn_hidden_n(self) -> int:
        return int(self.ffn_hidden or 4 * self.hidden)

    @property
    def kv_heads_n(self) -> int:
        return int(self.kv_heads or self.heads)

    @property
    def max_positions_n(self) -> int:
        return int(self.max_positions or self.seq_len)

    @property
    def head_tokens_n(self) -> int:
        return int(self.head_tokens or self.seq_len)

    @property
    def token_types_n(self) -> int:
        return int(self.token_types or 0)

    @property
    def vocab_padded(self) -> int:
        """The vocabulary padded to a multiple of ``vocab_divisible_by``."""
        m = self.vocab_divisible_by
        return -(-self.vocab // m) * m


_Cfg = TransformerConfig


def _eager_copy(b: LayerBuilder, name: str, n: int) -> None:
    """Copies that make ``n`` permuted elements contiguous, forward and backward (read + write each).

    Eager attention (``eager_attention``, e.g. BERT's ``BertSelfAttention`` in NVIDIA DeepLearningExamples
    ``PyTorch/LanguageModeling/BERT/modeling.py`` up to 2021) splits the heads by
    ``reshape(...).permute(0, 2, 1, 3)``; ``torch.matmul`` on those 4-D operands reshapes them to 3-D
    batches, which copies a permuted (non-viewable) tensor, and the context is merged back by
    ``permute(...).contiguous()``. Autograd's reshape of the incoming gradients copies again in backward."""
    d = b.d_bytes
    b.add(name, LayerKind.ELEMENTWISE, 0.0, 0.0, 2.0 * d * n, 2.0 * d * n, TPSplit.COLUMN,
          output_bytes=float(d * n))


def _eager_scores_ops(b: LayerBuilder, p: str, scores: int) -> None:
    """The scaling by ``1/sqrt(d_head)`` and the additive padding mask of eager attention, each its own
    element-wise kernel over the ``heads·s²`` scores (``attention_scores / math.sqrt(d)`` then
    ``attention_scores + attention_mask`` in the reference code: see :func:`_eager_copy`). The scaling has
    a backward kernel (the gradient times the constant); the mask add has none (autograd passes the
    gradient through, and the mask needs none)."""
    d = b.d_bytes
    b.add(f"{p}scores_scale", LayerKind.ELEMENTWISE, float(scores), float(scores), 2.0 * d * scores,
          2.0 * d * scores, TPSplit.COLUMN, output_bytes=float(d * scores))
    b.add(f"{p}scores_mask", LayerKind.ELEMENTWISE, float(scores), 0.0, 2.0 * d * scores, 0.0, TPSplit.COLUMN,
          output_bytes=float(d * scores))


def _unpad_layers(b: LayerBuilder, c: _Cfg, p: str, where: str) -> None:
    """flash-attn's unpadding around ``flash_attn_varlen_func``, as LLM Foundry's ``flash_attn_fn`` calls it
    (``llmfoundry/models/layers/attention.py`` at commit 5e85bd62d; ``flash_attn/bert_padding.py`` of
    flash-attn 2.4.2). ``where="before"``: ``unpad_input`` on each of Q, K and V (one call each, every
    call with the full padding mask): ``mask.sum``, ``torch.nonzero``, ``max().item()``, ``cumsum``,
    ``F.pad`` and a ``torch.gather`` of the rows (``IndexFirstAxis``) that reads the strided view of the
    QKV output and writes an unpadded copy — 7 launches a call, ``nonzero`` and ``.item()`` each reading a
    count back to the host; backward zero-fills a padded gradient and scatters into it (``zeros`` +
    ``scatter_``, 2 kernels per tensor). ``where="after"``: ``pad_input`` (``IndexPutFirstAxis``) zero-fills
    the padded output and ``index_put``s the rows (2 kernels); backward gathers the gradient's rows
    (``grad_output[indices]``, 1 kernel). All elements are ``dtype`` wide; the 8-byte row indices are
    read once per pass. With every token valid (packed pretraining data) each is a full copy."""
    s, d = c.seq_len, c.dtype
    hd = c.hidden // c.heads
    q, kv = s * c.hidden, s * c.kv_heads_n * hd
    col = TPSplit.COLUMN
    if where == "before":
        n = q + 2 * kv
        b.add(f"{p}attention_unpad", LayerKind.ELEMENTWISE, 0.0, 0.0, 2.0 * d * n + 3 * 8.0 * s,
              3.0 * d * n + 3 * 8.0 * s, col, output_bytes=float(d * n), kernels=(21, 6))
    else:
        b.add(f"{p}attention_pad", LayerKind.ELEMENTWISE, 0.0, 0.0, 3.0 * d * q + 8.0 * s, 2.0 * d * q + 8.0 * s,
              col, output_bytes=float(d * q), kernels=(2, 1))


def _attention(b: LayerBuilder, c: _Cfg, p: str) -> None:
    s, h, d = c.seq_len, c.hidden, c.dtype
    hd = h // c.heads
    kvd = c.kv_heads_n * hd
    col = TPSplit.COLUMN
    b.linear(f"{p}qkv", s, h + 2 * kvd, h, bias=c.bias, tp=col, tp_allreduce_bytes_bwd=float(d * s * h))
    if c.position == "rotary":
        n = s * (h + kvd)  # q and k are read and written whole; the rotation runs on rotary_percent of each head
        b.elementwise(f"{p}rotary", n, n, _ROPE_FLOPS * c.rotary_percent, tp=col)
    scores = c.heads * s * s
    if c.flash_attention:
        frac = (s + 1) / (2 * s) if c.causal else 1.0
        gemm = 4.0 * s * s * h * frac
        soft = _SOFTMAX_FLOPS * scores * frac
        qkv_bytes = d * s * (h + 2 * kvd)
        lse = 4.0 * c.heads * s
        if c.attention_unpad:
            _unpad_layers(b, c, p, "before")
        b.add(
            f"{p}attention",
            LayerKind.ATTENTION,
            gemm + soft,
            2.5 * gemm + soft,
            qkv_bytes + d * s * h + lse,
            2 * qkv_bytes + 2 * d * s * h + lse,
            col,
            activation_bytes=qkv_bytes + lse,
            output_bytes=float(d * s * h),
            gemm_shape=(s, s, hd),
            gemm_count=c.heads,
            gemm_batch_scales="count",
        )
        if c.attention_unpad:
            _unpad_layers(b, c, p, "after")
    else:
        f = 2.0 * s * s * h
        q, k = s * h, s * kvd
        # the unfused path expands grouped K and V to every query head before its GEMMs (Megatron-Core's
        # DotProductAttention: repeat_interleave; Hugging Face's repeat_kv), so they stash full-width copies
        k_kept = s * h
        if c.eager_attention:
            _eager_copy(b, f"{p}head_split", q + 2 * k)
        b.add(
            f"{p}scores",
            LayerKind.MATMUL,
            f,
            2 * f,
            d * (q + k + scores),
            d * (2 * scores + 2 * q + 2 * k),
            col,
            activation_bytes=float(d * (q + k_kept)),
            output_bytes=float(d * scores),
            gemm_shape=(s, s, hd),
            gemm_count=c.heads,
            gemm_batch_scales="count",
        )
        if c.eager_attention:
            _eager_scores_ops(b, p, scores)
        b.elementwise(
            f"{p}softmax",
            scores,
            scores,
            _SOFTMAX_FLOPS,
            tp=col,
            stash_bytes=float(d * scores),
            kind=LayerKind.SOFTMAX,
            row_elems=s,
        )
        if c.dropout:
            b.dropout(f"{p}attention_dropout", scores, col)
        probs = d * scores if c.dropout else 0  # without dropout the softmax output is already stashed
        b.add(
            f"{p}context",
            LayerKind.MATMUL,
            f,
            2 * f,
            d * (scores + k + q),
            d * (2 * q + 2 * scores + 2 * k),
            col,
            activation_bytes=float(probs + d * k_kept),
            output_bytes=float(d * q),
            gemm_shape=(s, hd, s),
            gemm_count=c.heads,
            gemm_batch_scales="count",
        )
        if c.eager_attention:
            _eager_copy(b, f"{p}head_merge", q)
    b.linear(f"{p}out_proj", s, h, h, bias=c.bias, tp=TPSplit.ROW, tp_allreduce_bytes_fwd=float(d * s * h))
    if c.dropout:
        b.dropout(f"{p}attention_output_dropout", s * h)
    b.elementwise(f"{p}attention_residual", 2 * s * h, s * h, 1.0, tp=TPSplit.REPLICATED)


def _mlp(b: LayerBuilder, c: _Cfg, p: str, moe: bool) -> None:
    s, h, f, d = c.seq_len, c.hidden, c.ffn_hidden_n, c.dtype
    act_flops, gated = _ACTIVATIONS[c.activation or ("swiglu" if c.gated_mlp else "gelu")]
    g = 2 if gated else 1
    if not moe:
        b.linear(
            f"{p}mlp_up", s, g * f, h, bias=c.bias, tp=TPSplit.COLUMN, tp_allreduce_bytes_bwd=float(d * s * h)
        )
        b.elementwise(
            f"{p}mlp_act", g * s * f, s * f, act_flops, tp=TPSplit.COLUMN, stash_bytes=float(d * g * s * f)
        )
        b.linear(
            f"{p}mlp_down", s, h, f, bias=c.bias, tp=TPSplit.ROW, tp_allreduce_bytes_fwd=float(d * s * h)
        )
    else:
        moe_mlp(b, c.routing, p, s=s, act_flops=act_flops, gated=gated, bias=c.bias)
    if c.dropout:
        b.dropout(f"{p}mlp_output_dropout", s * h)
    b.elementwise(f"{p}mlp_residual", 2 * s * h, s * h, 1.0, tp=TPSplit.REPLICATED)


def _block(b: LayerBuilder, c: _Cfg, i: int, moe: bool) -> None:
    b.block = i
    p = f"layers.{i}."
    s = c.seq_len
    if c.pre_norm:
        b.norm_layer(f"{p}norm1", s)
        _attention(b, c, p)
        b.norm_layer(f"{p}norm2", s)
        _mlp(b, c, p, moe)
    else:
        _attention(b, c, p)
        b.norm_layer(f"{p}norm1", s)
        _mlp(b, c, p, moe)
        b.norm_layer(f"{p}norm2", s)


def _embeddings(b: LayerBuilder, c: _Cfg) -> None:
    s, h, d = c.seq_len, c.hidden, c.dtype
    n = s * h
    b.add(
        "embedding.word",
        LayerKind.EMBEDDING,
        0.0,
        n,
        2 * d * n + 8 * s,
        3 * d * n + 8 * s,
        TPSplit.ROW,
        param_count=c.vocab_padded * h,
        output_bytes=float(d * n),
        tp_allreduce_bytes_fwd=float(d * n),
    )
    if c.position == "learned":
        b.add(
            "embedding.position",
            LayerKind.EMBEDDING,
            n,
            n,
            3 * d * n,
            3 * d * n,
            TPSplit.REPLICATED,
            param_count=c.max_positions_n * h,
            output_bytes=float(d * n),
        )
    if c.token_types_n:
        b.add(
            "embedding.token_type",
            LayerKind.EMBEDDING,
            n,
            n,
            3 * d * n,
            3 * d * n,
            TPSplit.REPLICATED,
            param_count=c.token_types_n * h,
            output_bytes=float(d * n),
        )
    if c.embedding_norm:
        b.norm_layer("embedding.norm", s)
    if c.dropout:
        b.dropout("embedding.dropout", n)


def _loss(b: LayerBuilder, c: _Cfg, name: str, tokens: int, classes: int, tp: TPSplit) -> None:
    n = tokens * classes
    allreduce = 12.0 * tokens if tp == TPSplit.COLUMN else 0.0  # max, sum-exp, target logit in fp32
    b.add(
        name,
        LayerKind.LOSS,
        _LOSS_FLOPS_FWD * n,
        _LOSS_FLOPS_BWD * n,
        (c.dtype + _LOSS_BYTES) * n,
        (c.dtype + _LOSS_BYTES) * n,
        tp,
        activation_bytes=float(_LOSS_BYTES * n),
        output_bytes=4.0,
        tp_allreduce_bytes_fwd=allreduce,
    )


def _logit_metrics(b: LayerBuilder, c: _Cfg, tokens: int, classes: int) -> None:
    """``c.logit_metrics`` cross-entropy evaluations of the logits outside the loss, forward only.

    Composer (0.16/0.17, ``Trainer._train_microbatch``) updates the model's training metrics after every
    micro-batch's backward (``_eval_train_metrics``, under ``torch.no_grad()`` and the run's precision
    context, on the forward's own outputs); LLM Foundry's MPT defines two (``use_train_metrics`` defaults to
    true: ``LanguageCrossEntropy`` and ``LanguagePerplexity``), each ``torch.nn.CrossEntropyLoss`` over the
    whole ``tokens × vocab`` logits. Under autocast ``cross_entropy`` runs in fp32 (PyTorch's autocast op
    reference), so each evaluation reads the ``dtype`` logits and writes an fp32 copy, and the log-softmax
    over a row longer than its shared-memory variant holds (here 50,368 classes) reads that copy three times
    (max, sum of exponentials, output) and writes it once; ``nll_loss`` gathers one element a row. Kernels
    per evaluation: cast, log-softmax, ``nll_loss``, and the metric's state updates (a count of the
    targets, two additions): 6."""
    k = c.logit_metrics
    if not k:
        return
    n = tokens * classes
    b.add("logit_metrics", LayerKind.LOSS, k * _LOSS_FLOPS_FWD * n, 0.0, k * (c.dtype + 5 * 4.0) * n, 0.0,
          TPSplit.COLUMN, output_bytes=4.0, kernels=(6 * k, 0))


def _heads(b: LayerBuilder, c: _Cfg) -> None:
    h, d, t, v = c.hidden, c.dtype, c.head_tokens_n, c.vocab_padded
    b.block = -1
    if c.encoder_only:
        # BERT pre-training heads (Devlin et al. 2019): MLM transform + tied decoder with bias; pooler + NSP.
        b.linear("mlm.dense", t, h, h, bias=True, tp=TPSplit.REPLICATED)
        b.elementwise(
            "mlm.act", t * h, t * h, _GELU_FLOPS, tp=TPSplit.REPLICATED, stash_bytes=float(d * t * h)
        )
        b.norm_layer("mlm.norm", t)
        b.linear(
            "mlm.decoder",
            t,
            v,
            h,
            bias=True,
            tp=TPSplit.COLUMN,
            tied=c.tie_embeddings,
            tp_allreduce_bytes_bwd=float(d * t * h),
        )
        _loss(b, c, "mlm.loss", t, v, TPSplit.COLUMN)
        _logit_metrics(b, c, t, v)
        b.linear("pooler.dense", 1, h, h, bias=True, tp=TPSplit.REPLICATED)
        b.elementwise("pooler.tanh", h, h, 4.0, tp=TPSplit.REPLICATED, stash_bytes=float(d * h))
        b.linear("nsp.classifier", 1, 2, h, bias=True, tp=TPSplit.REPLICATED)
        _loss(b, c, "nsp.loss", 1, 2, TPSplit.REPLICATED)
    else:
        if c.pre_norm:
            b.norm_layer("final_norm", c.seq_len)
        b.linear(
            "lm_head",
            t,
            v,
            h,
            bias=False,
            tp=TPSplit.COLUMN,
            tied=c.tie_embeddings,
            tp_allreduce_bytes_bwd=float(d * t * h),
        )
        _loss(b, c, "loss", t, v, TPSplit.COLUMN)
        _logit_metrics(b, c, t, v)


def transformer(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    vocab: int,
    ffn_hidden: int | None = None,
    kv_heads: int | None = None,
    gated_mlp: bool = False,
    activation: str | None = None,
    experts: int = 1,
    top_k: int = 1,
    moe_ffn_hidden: int | None = None,
    capacity_factor: float | None = None,
    pad_to_capacity: bool = False,
    shared_expert_hidden: int | None = None,
    shared_expert_gate: bool = False,
    moe_layer_freq: int | list[int] | tuple[int, ...] = 1,
    rotary_percent: float = 1.0,
    norm: str = "layernorm",
    tie_embeddings: bool = True,
    position: str = "learned",
    causal: bool = True,
    encoder_only: bool = False,
    bias: bool = True,
    dropout: bool = False,
    flash_attention: bool = False,
    eager_attention: bool = False,
    attention_unpad: bool = False,
    logit_metrics: int = 0,
    pre_norm: bool | None = None,
    max_positions: int | None = None,
    head_tokens: int | None = None,
    token_types: int | None = None,
    embedding_norm: bool | None = None,
    vocab_divisible_by: int = 1,
    dtype: int = 2,
    field: str = "model",
) -> Model:
    """A transformer as an ordered tuple of layers (see the module docstring for what each layer counts).

    ``ffn_hidden`` defaults to ``4·hidden``; ``kv_heads`` (grouped-query attention, Ainslie et al. 2023)
    to ``heads``; ``encoder_only`` builds BERT (bidirectional, post-norm, token types, MLM + NSP heads);
    ``max_positions`` is the size of a learned position table (default ``seq_len``); ``head_tokens`` the
    number of positions the LM head scores (default ``seq_len``; BERT scores only its masked tokens).
    ``dtype`` is bytes per element. ``field`` prefixes the field names in errors.
    """
    args: dict[str, Any] = dict(
        name=name, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab, ffn_hidden=ffn_hidden,
        kv_heads=kv_heads, gated_mlp=gated_mlp, activation=activation, experts=experts, top_k=top_k, norm=norm,
        moe_ffn_hidden=moe_ffn_hidden, capacity_factor=capacity_factor, pad_to_capacity=pad_to_capacity,
        shared_expert_hidden=shared_expert_hidden, shared_expert_gate=shared_expert_gate,
        moe_layer_freq=tuple(moe_layer_freq) if isinstance(moe_layer_freq, list) else moe_layer_freq,
        rotary_percent=rotary_percent,
        tie_embeddings=tie_embeddings, position=position, causal=causal, encoder_only=encoder_only, bias=bias,
        dropout=dropout, flash_attention=flash_attention, eager_attention=eager_attention,
        attention_unpad=attention_unpad, logit_metrics=logit_metrics, pre_norm=pre_norm,
        max_positions=max_positions,
        head_tokens=head_tokens, token_types=token_types, embedding_norm=embedding_norm,
        vocab_divisible_by=vocab_divisible_by, dtype=dtype)
    try:
        cfg = TransformerConfig(**args)
    except ConfigError as e:
        if field == "model":
            raise
        raise ConfigErrors([ConfigError((field + p.field[len("model"):]) if field else p.field[len("model."):],
                                        p.message, p.fix) for p in problems_of(e)]) from None
    s, h, n_layers, v = cfg.seq_len, cfg.hidden, cfg.layers, cfg.vocab_padded
    norm_s = cfg.norm
    b = LayerBuilder(s=s, h=h, d_bytes=cfg.dtype, norm=norm_s)
    _embeddings(b, cfg)
    pattern = moe_pattern(cfg.moe_layer_freq, n_layers) if cfg.experts > 1 else (False,) * n_layers
    for i in range(n_layers):
        _block(b, cfg, i, pattern[i])
    _heads(b, cfg)
    return Model(
        name=name,
        layers=tuple(b.layers),
        dtype=cfg.dtype,
        sample_kind="sequence",
        seq_len=s,
        hidden=h,
        num_layers=n_layers,
        vocab=v,
        heads=cfg.heads,
        kv_heads=cfg.kv_heads_n,
        ffn_hidden=cfg.ffn_hidden_n,
        experts=cfg.experts,
        top_k=cfg.top_k,
    )
