"""The workload as data: a :class:`Model` is an ordered tuple of :class:`Layer` s.

Every count on a layer is **per sample**: one image for a CNN, one sequence of ``seq_len`` tokens for a
transformer. Counting conventions (the same in every builder):

* FLOPs: a multiply-add is **2 FLOPs** (so a GEMM ``M×K @ K×N`` is ``2·M·N·K``). Published CNN "GFLOPs"
  (He et al. 2016 Table 1, torchvision's model tables) count multiply-adds; divide our numbers by 2 to
  compare. Backward FLOPs per kind:

  - ``conv``, ``linear``, ``matmul``, ``moe_router``: 2× forward (one GEMM for the input gradient, one
    for the weight gradient or for the second operand) — the factor behind the "6·N per token" rule
    (Kaplan et al. 2020, §2.1). A layer whose input needs no gradient (a CNN's first conv) has 1×.
  - ``attention`` (fused, FlashAttention): 2.5× the forward GEMM FLOPs, since the backward recomputes
    the scores (5 GEMMs against 2; Dao, "FlashAttention-2", 2023, §3).
  - ``norm``: 2× forward (gradients of the input and of the scale/shift).
  - weight-less ``elementwise``, ``softmax``, ``pool``, ``dropout``, ``concat``: ≈ 1× forward.
  - ``loss`` (softmax cross-entropy, ≈ 5 FLOPs per logit forward): 2 FLOPs per logit backward.
  - ``embedding``: forward is a gather (0 FLOPs, a learned position/type embedding adds 1 per element);
    backward is a scatter-add of the output gradient (1 per element).

* Bytes: ``fwd_bytes`` / ``bwd_bytes`` are HBM bytes read + written by the layer for one sample at the
  model dtype, **including** the weights (``param_bytes``) and their gradients. Weights are read once per
  micro-batch, not once per sample; use :meth:`Layer.fwd_bytes_at` / :meth:`Layer.bwd_bytes_at` for a
  micro-batch.
* ``activation_bytes``: bytes this layer stashes for its backward pass. A tensor stashed by two layers
  (e.g. a ReLU output that the next conv also needs) is counted once, on the first layer that stashes it.
* ``output_bytes``: bytes of the layer's output tensor (what a pipeline stage cut after it would send).

Tensor-parallel metadata follows Megatron-LM (Shoeybi et al. 2019, §3; Narayanan et al. SC'21 §2.3):
see :class:`TPSplit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from topotrain.util.errors import ConfigError


class LayerKind(StrEnum):
    """What a layer computes; a compute model picks its efficiency curve by kind."""

    CONV = "conv"
    LINEAR = "linear"
    MATMUL = "matmul"  # batched activation × activation GEMMs (attention scores, attention over values)
    ATTENTION = "attention"  # fused scores + softmax + context (FlashAttention-style)
    NORM = "norm"  # batch/layer/RMS norm
    ELEMENTWISE = "elementwise"  # activation functions, residual adds, rotary embedding
    DROPOUT = "dropout"
    POOL = "pool"
    EMBEDDING = "embedding"
    SOFTMAX = "softmax"
    MOE_ROUTER = "moe_router"
    CONCAT = "concat"
    LOSS = "loss"
    OTHER = "other"


class TPSplit(StrEnum):
    """How a layer is split over a tensor-parallel group of ``t`` GPUs (Megatron-LM).

    * ``column``: each rank does ``1/t`` of the work with no communication in forward — a
      ColumnParallelLinear (weight split along its output features), and the head-partitioned attention
      core / MLP activation that consume its output. A column layer that starts a block carries
      ``tp_allreduce_bytes_bwd``: the allreduce of the input gradient (Megatron's ``f`` operator).
    * ``row``: a RowParallelLinear (weight split along its input features) — or the vocabulary-parallel
      embedding — ``1/t`` of the work, then an allreduce of ``tp_allreduce_bytes_fwd`` in forward
      (Megatron's ``g`` operator; ``b·s·h·dtype`` bytes).
    * ``replicated``: every TP rank does the full work (layer norms, residual adds, dropouts on
      ``s×h`` tensors, without sequence parallelism).
    * ``none``: no tensor-parallel notion (CNN layers); treat as replicated.
    """

    COLUMN = "column"
    ROW = "row"
    REPLICATED = "replicated"
    NONE = "none"


@dataclass(frozen=True)
class Layer:
    """One layer of a model; every count is per sample (see the module docstring for conventions).

    ``gemm_shape`` is ``(M, N, K)`` of the layer's GEMM for one sample (``None`` if it is not a GEMM);
    there are ``gemm_count`` independent GEMMs of that shape (attention heads, conv groups, experts).
    ``gemm_batch_scales`` says what a micro-batch multiplies: ``"m"`` (linear, conv, experts: the rows)
    or ``"count"`` (attention matmuls: more independent per-head GEMMs). See :meth:`gemm_dims`.

    ``expert`` marks MoE expert layers; ``alltoall_bytes_fwd`` is the expert-parallel all-to-all payload
    per sample adjoining this layer (token dispatch before the first expert layer of a block, combine after
    the last), repeated with the gradients in backward. ``block`` is the transformer block / CNN stage
    index the layer belongs to (-1: embedding, head, loss), used for recomputation and pipeline cuts.
    ``kernels`` is ``(forward, backward)`` kernel launches per micro-batch when they are not the ones its
    kind launches (the roofline's ``kernels_fwd`` / ``kernels_bwd``): a layer that stands for several
    small ops, e.g. flash-attn's unpadding around varlen attention. ``row_elems`` is the length of the rows a
    normalization or softmax reduces over (the hidden size, the key length; 0: not given), which selects
    the kernel and so its achieved bandwidth (:mod:`topotrain.compute.membound`).
    """

    name: str
    kind: LayerKind
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float
    param_count: int = 0
    activation_bytes: float = 0.0
    output_bytes: float = 0.0
    param_bytes: float = 0.0
    block: int = -1
    tp_split: TPSplit = TPSplit.NONE
    tp_allreduce_bytes_fwd: float = 0.0
    tp_allreduce_bytes_bwd: float = 0.0
    gemm_shape: tuple[int, int, int] | None = None
    gemm_count: int = 1
    gemm_batch_scales: str = "m"
    expert: bool = False
    alltoall_bytes_fwd: float = 0.0
    kernels: tuple[int, int] | None = None
    row_elems: int = 0

    def fwd_bytes_at(self, batch: int) -> float:
        """HBM bytes of the forward pass of a micro-batch: activations scale, weights are read once."""
        return batch * (self.fwd_bytes - self.param_bytes) + self.param_bytes

    def bwd_bytes_at(self, batch: int) -> float:
        """HBM bytes of the backward pass of a micro-batch (weights read, weight gradients written once)."""
        return batch * (self.bwd_bytes - 2.0 * self.param_bytes) + 2.0 * self.param_bytes

    def gemm_dims(self, batch: int) -> tuple[int, int, int, int] | None:
        """``(count, M, N, K)`` of the layer's GEMMs for a micro-batch of ``batch`` samples."""
        if self.gemm_shape is None:
            return None
        m, n, k = self.gemm_shape
        if self.gemm_batch_scales == "count":
            return (self.gemm_count * batch, m, n, k)
        return (self.gemm_count, m * batch, n, k)


def _megatron_check(model: Model) -> tuple[int, int, int, int]:
    fields = {
        "seq_len": model.seq_len,
        "num_layers": model.num_layers,
        "hidden": model.hidden,
        "vocab": model.vocab,
    }
    missing = [k for k, v in fields.items() if not v]
    if model.sample_kind != "sequence" or missing:
        raise ConfigError(
            "model",
            f"{model.name} is not a GPT-like transformer (missing {missing or 'sequence'})",
            "use a transformer model for the Megatron-LM FLOP formula",
        )
    return (
        int(model.seq_len or 0),
        int(model.num_layers or 0),
        int(model.hidden or 0),
        int(model.vocab or 0),
    )


@dataclass(frozen=True)
class Model:
    """An ordered tuple of layers plus architecture metadata.

    ``dtype`` is the number of bytes per element of weights and activations (2: fp16/bf16).
    ``sample_kind`` is ``"image"`` or ``"sequence"``; for sequences ``seq_len`` tokens make one sample.
    """

    name: str
    layers: tuple[Layer, ...]
    dtype: int = 2
    sample_kind: str = "image"
    seq_len: int | None = None
    image_size: int | None = None
    hidden: int | None = None
    num_layers: int | None = None
    vocab: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    experts: int = 1
    top_k: int = 1

    def __post_init__(self) -> None:
        names = [lay.name for lay in self.layers]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})[:3]
            raise ConfigError(
                "model.layers",
                f"duplicate layer names {dup} in {self.name}",
                "give every layer a unique name",
            )

    @property
    def param_count(self) -> int:
        """All parameters (every expert of an MoE counted)."""
        return sum(lay.param_count for lay in self.layers)

    @property
    def active_param_count(self) -> float:
        """Parameters one token touches: expert layers count ``top_k/experts`` of their parameters."""
        frac = self.top_k / self.experts
        return sum(lay.param_count * (frac if lay.expert else 1.0) for lay in self.layers)

    @property
    def param_bytes(self) -> float:
        """Bytes of the weights at the model dtype."""
        return float(self.param_count * self.dtype)

    @property
    def tokens_per_sample(self) -> int:
        """Tokens in one sample (``seq_len`` for sequences, 1 for images)."""
        return int(self.seq_len or 1) if self.sample_kind == "sequence" else 1

    @property
    def fwd_flops_per_sample(self) -> float:
        return sum(lay.fwd_flops for lay in self.layers)

    @property
    def bwd_flops_per_sample(self) -> float:
        return sum(lay.bwd_flops for lay in self.layers)

    @property
    def total_flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample, without recomputation."""
        return self.fwd_flops_per_sample + self.bwd_flops_per_sample

    @property
    def activation_bytes_per_sample(self) -> float:
        return sum(lay.activation_bytes for lay in self.layers)

    @property
    def num_blocks(self) -> int:
        return 1 + max((lay.block for lay in self.layers), default=-1)

    def train_flops_per_sample(self, recompute: bool = False) -> float:
        """Forward + backward FLOPs of one sample; ``recompute`` adds a second forward of every block layer
        (full activation recomputation as in Megatron-LM: embedding and head are not recomputed)."""
        extra = sum(lay.fwd_flops for lay in self.layers if lay.block >= 0) if recompute else 0.0
        return self.total_flops_per_sample + extra

    def megatron_flops_per_iteration(self, batch: int, recompute: bool = True) -> float:
        """Model FLOPs of one iteration of global batch ``batch`` (Narayanan et al., SC'21, §5.1).

        With recomputation ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``; without it the three passes
        give ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``. Only GEMMs count; GPT-like dense models only.
        """
        if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
            raise ConfigError("batch", f"must be a positive integer, got {batch!r}", "give e.g. batch=512")
        s, layer_count, h, v = _megatron_check(self)
        base = batch * s * layer_count * h * h
        if recompute:
            return 96.0 * base * (1.0 + s / (6.0 * h) + v / (16.0 * layer_count * h))
        return 72.0 * base * (1.0 + s / (6.0 * h) + v / (12.0 * layer_count * h))
