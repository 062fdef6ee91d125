"""Real ``torch.nn`` modules for the model zoo's workloads, one submodule per topotrain layer.

:func:`build_module` turns a :class:`~topotrain.workload.layer.Model` into a runnable module whose every
topotrain layer is one leaf submodule named after it (``layer1.0.conv2``, ``layers.3.qkv``), so that a
profiler that brackets each leaf (:mod:`topotrain.compute.module_profile`) times exactly the work the
layer stands for. Two families are built, both from the layer list itself (shapes from ``gemm_shape``,
``gemm_count`` and ``param_count``), never from a second copy of the architecture:

* **ResNet** (He et al. 2016; torchvision's ``resnet50`` / ``resnet101``, v1.5 with the stride on the 3×3
  conv, v1 when ``layer2.0.conv1`` is strided): conv/bn/relu per bottleneck, the residual ``add`` and
  ``relu3`` as their own modules, the downsample branch, avgpool, fc and a cross-entropy ``loss``.
* **Transformers** (BERT, GPT-2/3, Megatron, Llama, BLOOM): each block is played in the layer list's order
  on a residual stream ``x`` and a branch ``h`` (a norm before the branch is pre-norm, a norm after a
  residual add is post-norm, as BERT); fused ``attention`` is ``scaled_dot_product_attention``, the eager
  ``scores → softmax → dropout → context`` path is its four ops; a gated MLP (``mlp_up`` twice as wide as
  ``mlp_down``'s input) is SwiGLU; RMSNorm where a norm holds ``h`` parameters, LayerNorm where ``2h``.
  Mixture-of-experts blocks (Mixtral) route each token to its top-k experts (see :func:`_moe_module`).
  Heads after the last block (``lm_head``/``loss``, BERT's ``mlm.*``, ``pooler.*``, ``nsp.*``) read the
  rows their first GEMM's ``M`` says (20 masked tokens of 128, the first token for the pooler).

A model with a layer neither family knows (Inception's branches, VGG, AlexNet) gets no module:
:func:`build_module` raises a ConfigError that names the layer and points to ``--method standin``.

torch is passed in (imported by the caller), so importing this module does not import torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind, Model

STANDIN_FIX = "profile it with --method standin (each layer timed as a matmul/add shaped like it)"


@dataclass
class Built:
    """A runnable module: ``net(*inputs)`` returns the scalar loss; ``leaves`` maps each topotrain layer
    name it implements to its leaf submodule (what the profiler brackets)."""

    net: Any
    inputs: tuple[Any, ...]
    leaves: dict[str, Any]
    family: str


def _unsupported(model: Model, layer: str, why: str) -> ConfigError:
    return ConfigError("model", f"{model.name}: no torch module for layer {layer!r} ({why})", STANDIN_FIX)


def build_module(torch: Any, model: Model, batch: int, device: Any, dtype: Any, seed: int = 0) -> Built:
    """The torch module of ``model`` at micro-batch ``batch`` on ``device`` in ``dtype`` (weights seeded)."""
    torch.manual_seed(seed)
    names = [lay.name for lay in model.layers]
    if any(re.fullmatch(r"layer\d+\.\d+\.conv\d", n) for n in names) and "conv1" in names:
        built = _resnet(torch, model, batch)
    elif any(n.startswith("layers.") for n in names):
        built = _transformer(torch, model, batch)
    else:
        raise _unsupported(model, names[0], "only ResNets and transformers are built as torch modules")
    built.net.to(device=device, dtype=dtype)
    built.net.train()
    built.inputs = tuple(
        x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in built.inputs
    )
    return built


class _Net:
    """Factory of the shared container: leaves registered in one ModuleList, called by name."""

    @staticmethod
    def make(torch: Any, program: Any) -> Any:
        nn = torch.nn

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.leaf_list = nn.ModuleList()
                self.by_name: dict[str, Any] = {}

            def add(self, name: str, module: Any) -> None:
                self.leaf_list.append(module)
                self.by_name[name] = module

            def forward(self, *inputs: Any) -> Any:
                return program(self.by_name, *inputs)

        return Net()


# ---- ResNet ---------------------------------------------------------------------------------------------
def _resnet(torch: Any, model: Model, batch: int) -> Built:
    nn = torch.nn
    layers = {lay.name: lay for lay in model.layers}
    image = model.image_size or 224
    blocks: dict[int, int] = {}
    for n in layers:
        m = re.fullmatch(r"layer(\d)\.(\d+)\.conv1", n)
        if m:
            blocks[int(m[1])] = max(blocks.get(int(m[1]), 0), int(m[2]) + 1)
    known = re.compile(
        r"(conv1|bn1|relu|maxpool|avgpool|fc|loss|layer\d\.\d+\.(conv\d|bn\d|relu\d|add|downsample\.[01]))"
    )
    for n in layers:
        if not known.fullmatch(n):
            raise _unsupported(model, n, "not a ResNet bottleneck layer")
    # v1 strides the first 1×1 conv of a stage, v1.5 (torchvision) the 3×3: read it off conv1's output size
    l2 = layers.get("layer2.0.conv1")
    l2_in = layers.get("layer1.0.conv1")
    v1 = bool(l2 and l2_in and l2.gemm_shape and l2_in.gemm_shape and l2.gemm_shape[0] < l2_in.gemm_shape[0])
    fc = layers["fc"]
    classes = fc.gemm_shape[1] if fc.gemm_shape else 1000

    def program(m: dict[str, Any], x: Any, target: Any) -> Any:
        x = m["maxpool"](m["relu"](m["bn1"](m["conv1"](x))))
        for stage in sorted(blocks):
            for i in range(blocks[stage]):
                p = f"layer{stage}.{i}"
                y = m[f"{p}.relu1"](m[f"{p}.bn1"](m[f"{p}.conv1"](x)))
                y = m[f"{p}.relu2"](m[f"{p}.bn2"](m[f"{p}.conv2"](y)))
                y = m[f"{p}.bn3"](m[f"{p}.conv3"](y))
                idt = m[f"{p}.downsample.1"](m[f"{p}.downsample.0"](x)) if f"{p}.downsample.0" in m else x
                x = m[f"{p}.relu3"](m[f"{p}.add"](y, idt))
        return m["loss"](m["fc"](m["avgpool"](x)), target)

    net = _Net.make(torch, program)
    net.add("conv1", nn.Conv2d(3, 64, 7, 2, 3, bias=False))
    net.add("bn1", nn.BatchNorm2d(64))
    net.add("relu", nn.ReLU())
    net.add("maxpool", nn.MaxPool2d(3, 2, 1))
    cin = 64
    for stage, width in zip(sorted(blocks), (64, 128, 256, 512), strict=False):
        for i in range(blocks[stage]):
            p = f"layer{stage}.{i}"
            stride = 2 if (i == 0 and stage > 1) else 1
            s1, s3 = (stride, 1) if v1 else (1, stride)
            net.add(f"{p}.conv1", nn.Conv2d(cin, width, 1, s1, bias=False))
            net.add(f"{p}.bn1", nn.BatchNorm2d(width))
            net.add(f"{p}.relu1", nn.ReLU())
            net.add(f"{p}.conv2", nn.Conv2d(width, width, 3, s3, 1, bias=False))
            net.add(f"{p}.bn2", nn.BatchNorm2d(width))
            net.add(f"{p}.relu2", nn.ReLU())
            net.add(f"{p}.conv3", nn.Conv2d(width, 4 * width, 1, bias=False))
            net.add(f"{p}.bn3", nn.BatchNorm2d(4 * width))
            if f"{p}.downsample.0" in layers:
                net.add(f"{p}.downsample.0", nn.Conv2d(cin, 4 * width, 1, stride, bias=False))
                net.add(f"{p}.downsample.1", nn.BatchNorm2d(4 * width))
            net.add(f"{p}.add", _binary(torch, lambda a, b: a + b))
            net.add(f"{p}.relu3", nn.ReLU())
            cin = 4 * width
    net.add("avgpool", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()))
    net.add("fc", nn.Linear(cin, classes))
    net.add("loss", nn.CrossEntropyLoss())
    x = torch.randn(batch, 3, image, image)
    target = torch.randint(0, classes, (batch,))
    return Built(net, (x, target), dict(net.by_name), "resnet")


# ---- small modules for functional steps -----------------------------------------------------------------
def _binary(torch: Any, fn: Any) -> Any:
    class Binary(torch.nn.Module):
        def forward(self, a: Any, b: Any) -> Any:
            return fn(a, b)

    return Binary()


def _unary(torch: Any, fn: Any) -> Any:
    class Unary(torch.nn.Module):
        def forward(self, a: Any) -> Any:
            return fn(a)

    return Unary()


# ---- transformers ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    seq: int
    causal: bool


def _shape(model: Model) -> _Shape:
    lays = {lay.name: lay for lay in model.layers}
    qkv = lays.get("layers.0.qkv")
    attn = lays.get("layers.0.attention") or lays.get("layers.0.scores")
    if qkv is None or qkv.gemm_shape is None or attn is None or attn.gemm_shape is None:
        raise _unsupported(model, "layers.0.qkv", "a block needs qkv and attention/scores GEMMs")
    seq, n_qkv, hidden = qkv.gemm_shape
    heads = attn.gemm_count
    head_dim = attn.gemm_shape[2]  # K of QKᵀ (scores) and of fused attention alike
    kv = (n_qkv // head_dim - heads) // 2
    if kv < 1 or (heads + 2 * kv) * head_dim != n_qkv or heads % kv:
        raise _unsupported(model, "layers.0.qkv", f"qkv width {n_qkv} is not (heads + 2·kv)·head_dim")
    causal = not any(n.startswith("mlm.") for n in lays)  # BERT attends both ways; decoders are causal
    return _Shape(hidden, heads, kv, head_dim, model.seq_len or seq, causal)


def _norm(torch: Any, lay: Layer, width: int) -> Any:
    if lay.param_count == width:
        return torch.nn.RMSNorm(width, eps=1e-5)
    return torch.nn.LayerNorm(width)


def _linear(torch: Any, lay: Layer) -> Any:
    assert lay.gemm_shape is not None
    _, n, k = lay.gemm_shape
    return torch.nn.Linear(k, n, bias=lay.param_count == n * k + n)


_BLOCK_OPS = (
    "norm1", "norm2", "qkv", "rotary", "scores", "softmax", "attention_dropout", "context", "attention",
    "out_proj", "attention_output_dropout", "attention_residual", "mlp_up", "mlp_act", "mlp_down",
    "mlp_output_dropout", "mlp_residual", "moe_router", "moe_gate_softmax", "experts_up", "experts_act",
    "experts_down", "moe_combine",
)
_MOE_OPS = ("moe_router", "moe_gate_softmax", "experts_up", "experts_act", "experts_down", "moe_combine")


def _transformer(torch: Any, model: Model, batch: int) -> Built:
    nn = torch.nn
    sh = _shape(model)
    h, seq = sh.hidden, sh.seq
    has_dropout = any(lay.kind == LayerKind.DROPOUT for lay in model.layers)
    p_drop = 0.1 if has_dropout else 0.0
    word = next((lay for lay in model.layers if lay.name == "embedding.word"), None)
    if word is None:
        raise _unsupported(model, model.layers[0].name, "a transformer starts with embedding.word")
    vocab = max(1, word.param_count // h)
    steps: list[tuple[str, str]] = []  # (layer name, op)
    net_mods: list[tuple[str, Any]] = []
    groups: list[str] = []
    for lay in model.layers:
        n = lay.name
        m = re.fullmatch(r"layers\.\d+\.(\w+)", n)
        if m:
            op = m[1]
            if op not in _BLOCK_OPS:
                raise _unsupported(model, n, "not a transformer block layer")
            steps.append((n, op))
            if op in _MOE_OPS:
                mod = _moe_module(torch, model, lay, op, sh)
            else:
                mod = _block_module(torch, lay, op, sh, p_drop)
            net_mods.append((n, mod))
            continue
        if n == "embedding.word":
            steps.append((n, "embed"))
            net_mods.append((n, nn.Embedding(vocab, h)))
        elif n in ("embedding.position", "embedding.token_type"):
            rows = max(1, lay.param_count // h)
            steps.append((n, "add_table"))
            net_mods.append((n, _PositionTable.make(torch, rows, h, seq if n.endswith("position") else 1)))
        elif n in ("embedding.norm", "final_norm"):
            steps.append((n, "x_op"))
            net_mods.append((n, _norm(torch, lay, h)))
        elif n == "embedding.dropout":
            steps.append((n, "x_op"))
            net_mods.append((n, nn.Dropout(p_drop)))
        else:  # a head: mlm.*, pooler.*, nsp.*, lm_head, loss
            group = n.split(".", 1)[0] if "." in n else n
            if lay.kind == LayerKind.LINEAR and lay.gemm_shape is not None:
                mod, op = _linear(torch, lay), "head_linear"
            elif lay.kind == LayerKind.NORM:
                mod, op = _norm(torch, lay, h), "head_op"
            elif lay.kind == LayerKind.ELEMENTWISE and "tanh" in n:
                mod, op = nn.Tanh(), "head_op"
            elif lay.kind == LayerKind.ELEMENTWISE:
                mod, op = nn.GELU(), "head_op"
            elif lay.kind == LayerKind.LOSS:
                mod, op = nn.CrossEntropyLoss(), "head_loss"
            else:
                raise _unsupported(model, n, "not a transformer head layer")
            groups.append(group)
            steps.append((n, op))
            net_mods.append((n, mod))
    rows_of = {lay.name: lay.gemm_shape[0] for lay in model.layers if lay.gemm_shape is not None}

    def program(m: dict[str, Any], tokens: Any, target: Any) -> Any:
        x: Any = None
        hb: Any = None
        branch = after_residual = False
        q: Any = None
        k: Any = None
        v: Any = None
        probs: Any = None
        logits: Any = None
        gate: Any = None
        experts: Any = None
        route: Any = None
        head: Any = None
        head_open = False
        losses = []
        for name, op in steps:
            mod = m[name]
            if op == "embed":
                x = mod(tokens)
            elif op in ("add_table", "x_op"):
                x = mod(x)
            elif op in ("norm1", "norm2"):
                if after_residual:
                    x = mod(x)
                else:
                    hb, branch = mod(x), True
            elif op == "qkv":
                q, k, v = mod(hb if branch else x)
            elif op == "rotary":
                q, k = mod(q, k)
            elif op == "scores":
                probs = mod(q, k)
            elif op in ("softmax", "attention_dropout"):
                probs = mod(probs)
            elif op == "context":
                hb = mod(probs, v)
            elif op == "attention":
                hb = mod(q, k, v)
            elif op in ("out_proj", "mlp_down", "mlp_act", "attention_output_dropout", "mlp_output_dropout"):
                hb = mod(hb)
            elif op == "mlp_up":
                hb = mod(hb if branch else x)
            elif op == "moe_router":
                logits = mod(hb if branch else x)
            elif op == "moe_gate_softmax":
                gate = mod(logits)
            elif op == "experts_up":
                experts, route = mod(hb if branch else x, gate)
            elif op == "experts_act":
                experts = mod(experts)
            elif op == "experts_down":
                experts = mod(experts, route)
            elif op == "moe_combine":
                hb = mod(experts, gate, route, x.shape)
            elif op in ("attention_residual", "mlp_residual"):
                x = mod(x, hb)
                branch = False
            elif op == "head_linear":
                if not head_open:
                    head = x[:, : rows_of[name]]
                head, head_open = mod(head), True
            elif op == "head_op":
                head = mod(head)
            elif op == "head_loss":
                logits = head if head_open else x
                losses.append(mod(logits.reshape(-1, logits.shape[-1]).float(),
                                  target[: logits.numel() // logits.shape[-1]] % logits.shape[-1]))
                head_open = False
            after_residual = op in ("attention_residual", "mlp_residual")
        return sum(losses) if losses else x.float().sum()

    net = _Net.make(torch, program)
    for n, mod in net_mods:
        net.add(n, mod)
    tokens = torch.randint(0, vocab, (batch, seq))
    target = torch.randint(0, 1 << 30, (batch * seq,))
    return Built(net, (tokens, target), dict(net.by_name), "transformer")


class _PositionTable:
    """``x + table[:rows]`` (learned positions; token types read row 0)."""

    @staticmethod
    def make(torch: Any, rows: int, width: int, used: int) -> Any:
        class Table(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(rows, width) * 0.02)

            def forward(self, x: Any) -> Any:
                n = min(x.shape[1], rows) if used > 1 else 1
                return x + (self.weight[:n] if used > 1 else self.weight[0])

        return Table()


def _block_module(torch: Any, lay: Layer, op: str, sh: _Shape, p_drop: float) -> Any:
    nn, fn = torch.nn, torch.nn.functional
    heads, kv, d = sh.heads, sh.kv_heads, sh.head_dim
    if op in ("norm1", "norm2"):
        return _norm(torch, lay, sh.hidden)
    if op in ("out_proj", "mlp_up", "mlp_down"):
        return _linear(torch, lay)
    if op in ("attention_dropout", "attention_output_dropout", "mlp_output_dropout"):
        return nn.Dropout(p_drop)
    if op in ("attention_residual", "mlp_residual"):
        return _binary(torch, lambda a, b: a + b)
    if op == "softmax":
        return nn.Softmax(dim=-1)
    if op == "mlp_act":
        return _unary(torch, _mlp_act(fn, lay))
    if op == "qkv":
        lin = _linear(torch, lay)

        class Qkv(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = lin

            def forward(self, x: Any) -> Any:
                b, s, _ = x.shape
                y = self.lin(x)
                q, k, v = y.split([heads * d, kv * d, kv * d], dim=-1)
                q = q.view(b, s, heads, d).transpose(1, 2)
                k = k.view(b, s, kv, d).transpose(1, 2)
                v = v.view(b, s, kv, d).transpose(1, 2)
                if kv != heads:
                    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
                return q, k, v

        return Qkv()
    if op == "rotary":

        class Rotary(torch.nn.Module):
            def forward(self, q: Any, k: Any) -> Any:
                s = q.shape[-2]
                pos = torch.arange(s, device=q.device, dtype=q.dtype)[:, None]
                inv = 10000 ** (-torch.arange(0, d // 2, device=q.device, dtype=q.dtype) * 2 / d)
                ang = pos * inv
                cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)

                def rot(t: Any) -> Any:
                    a, b = t.chunk(2, dim=-1)
                    return t * cos + torch.cat((-b, a), dim=-1) * sin

                return rot(q), rot(k)

        return Rotary()
    causal = sh.causal
    if op == "scores":

        class Scores(torch.nn.Module):
            def forward(self, q: Any, k: Any) -> Any:
                s = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d))
                if causal:
                    n = s.shape[-1]
                    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
                    s = s.masked_fill(mask, float("-inf"))
                return s

        return Scores()
    if op == "context":

        class Context(torch.nn.Module):
            def forward(self, p: Any, v: Any) -> Any:
                o = p @ v
                b, _, s, _ = o.shape
                return o.transpose(1, 2).reshape(b, s, heads * d)

        return Context()
    if op == "attention":

        class Attention(torch.nn.Module):
            def forward(self, q: Any, k: Any, v: Any) -> Any:
                o = fn.scaled_dot_product_attention(q, k, v, is_causal=causal)
                b, _, s, _ = o.shape
                return o.transpose(1, 2).reshape(b, s, heads * d)

        return Attention()
    raise AssertionError(op)  # every op of _BLOCK_OPS is built above


def _moe_module(torch: Any, model: Model, lay: Layer, op: str, sh: _Shape) -> Any:
    """Mixture of experts (Mixtral; Jiang et al. 2024): a router GEMM, softmax and top-k, then each token
    copy sorted by expert and run through its expert's GEMMs (one per expert, the rows the router gave
    it), then the outputs put back in token order, weighted and summed over the k choices. The layer list
    gives the experts (the router's N) and k (the expert GEMM's rows per sample × experts / sequence)."""
    nn, fn = torch.nn, torch.nn.functional
    block = lay.name.rsplit(".", 1)[0]
    lays = {la.name: la for la in model.layers}
    router, up = lays.get(f"{block}.moe_router"), lays.get(f"{block}.experts_up")
    if router is None or router.gemm_shape is None or up is None or up.gemm_shape is None:
        raise _unsupported(model, lay.name, "an MoE block needs moe_router and experts_up GEMMs")
    n_exp = router.gemm_shape[1]
    top_k = max(1, round(up.gemm_shape[0] * n_exp / sh.seq))
    if op == "moe_router":
        return nn.Linear(sh.hidden, n_exp, bias=False)
    if op == "moe_gate_softmax":
        return _unary(torch, lambda t: torch.softmax(t.float(), dim=-1).topk(top_k, dim=-1))
    if op == "experts_act":
        return _unary(torch, _mlp_act(fn, lay))
    if op in ("experts_up", "experts_down"):
        if lay.gemm_shape is None:
            raise _unsupported(model, lay.name, "an expert layer needs its GEMM shape")
        _, n, k = lay.gemm_shape
        first = op == "experts_up"

        class Experts(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = nn.Parameter(torch.randn(n_exp, k, n) * 0.02)

            def forward(self, t: Any, route_or_gate: Any) -> Any:
                if first:  # dispatch: every token top_k times, sorted by the expert that takes it
                    _, idx = route_or_gate
                    flat = idx.reshape(-1)
                    order = flat.argsort(stable=True)
                    counts = torch.bincount(flat, minlength=n_exp).tolist()
                    rows = t.reshape(-1, k).repeat_interleave(top_k, dim=0)[order]
                    route = (order, counts)
                else:
                    rows, route = t, route_or_gate
                parts = rows.split(route[1])
                out = torch.cat([p @ self.weight[e] for e, p in enumerate(parts)])
                return (out, route) if first else out

        return Experts()
    if op == "moe_combine":

        class Combine(torch.nn.Module):
            def forward(self, t: Any, gate: Any, route: Any, shape: Any) -> Any:
                w, _ = gate
                order = route[0]
                back = torch.empty_like(t).index_copy(0, order, t)
                y = (back.view(-1, top_k, t.shape[-1]) * w.reshape(-1, top_k, 1).to(t.dtype)).sum(1)
                return y.view(shape)

        return Combine()
    raise AssertionError(op)  # every MoE op is built above


def _mlp_act(fn: Any, lay: Layer) -> Any:
    """SwiGLU (``silu(a)·b`` of the two halves) when the block's MLP is gated, GELU otherwise. The layer list
    says which: a gated activation's output is half its input (``output_bytes`` < ``activation_bytes``)."""
    gated = lay.activation_bytes > 1.5 * lay.output_bytes > 0

    def act(t: Any) -> Any:
        if gated:
            a, b = t.chunk(2, dim=-1)
            return fn.silu(a) * b
        return fn.gelu(t)

    return act
