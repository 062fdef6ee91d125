"""Workload models against published parameter counts, FLOP counts and closed forms."""

from __future__ import annotations

from typing import Any

import pytest

from topotrain.util.errors import ConfigError
from topotrain.workload import (
    MEGATRON_SC21_TABLE1,
    MODELS,
    LayerKind,
    Model,
    TPSplit,
    alexnet,
    get_model,
    inception_v3,
    model_from_dict,
    resnet50,
    resnet101,
    transformer,
)

GEMM_KINDS = (LayerKind.CONV, LayerKind.LINEAR, LayerKind.MATMUL, LayerKind.ATTENTION, LayerKind.MOE_ROUTER)


def macs(model: Model) -> float:
    """Multiply-adds of the conv and linear layers (what published CNN "GFLOPs" count)."""
    return sum(lay.fwd_flops for lay in model.layers if lay.kind in (LayerKind.CONV, LayerKind.LINEAR)) / 2


def gemm_flops(model: Model, recompute: bool) -> float:
    """fwd + bwd (+ recomputed fwd of block layers) FLOPs of the GEMM layers only."""
    total = 0.0
    for lay in model.layers:
        if lay.kind in GEMM_KINDS:
            total += lay.fwd_flops + lay.bwd_flops + (lay.fwd_flops if recompute and lay.block >= 0 else 0.0)
    return total


# --- CNNs: torchvision's model tables (parameters exact; GFLOPS = G multiply-adds, 3 significant digits) ---


@pytest.mark.parametrize(
    ("name", "params", "gmacs"),
    [
        ("resnet50", 25_557_032, 4.09),
        ("resnet101", 44_549_160, 7.80),
        ("vgg16", 138_357_544, 15.47),
        ("alexnet", 61_100_840, 0.71),
        ("inception-v3", 27_161_264, 5.71),
    ],
)
def test_cnn_published_counts(name: str, params: int, gmacs: float) -> None:
    model = get_model(name)
    assert model.param_count == params
    assert macs(model) / 1e9 == pytest.approx(gmacs, rel=0.01)
    assert model.sample_kind == "image"


def test_cnn_paper_figures() -> None:
    # He et al. 2016 Table 1 (v1: stride on the first 1×1): ResNet-50 3.8e9, ResNet-101 7.6e9 multiply-adds.
    assert macs(resnet50(variant="v1")) / 1e9 == pytest.approx(3.8, abs=0.07)
    assert macs(resnet101(variant="v1")) / 1e9 == pytest.approx(7.6, abs=0.05)
    # 2 FLOPs per multiply-add: ResNet-50 v1.5 forward ≈ 8.2 GFLOP of conv+fc per 224² image.
    assert macs(resnet50()) * 2 / 1e9 == pytest.approx(8.18, rel=0.005)
    # Inception-v3 without the auxiliary classifier: 23.8M (Szegedy et al. 2016 quote 23M+).
    no_aux = inception_v3(aux_logits=False)
    assert no_aux.param_count == 23_834_568
    assert macs(no_aux) / 1e9 == pytest.approx(5.71, rel=0.005)
    # VGG-16: 138M (Simonyan & Zisserman Table 2); AlexNet 61M.
    assert get_model("VGG16").param_count / 1e6 == pytest.approx(138, rel=0.01)


def test_cnn_image_size_and_backward() -> None:
    small, big = resnet50(224), resnet50(448)
    conv = lambda m: sum(la.fwd_flops for la in m.layers if la.kind == LayerKind.CONV)  # noqa: E731
    assert conv(big) == pytest.approx(4 * conv(small), rel=1e-12)  # every feature map doubles per side
    assert big.param_count == small.param_count
    first = small.layers[0]
    assert first.kind == LayerKind.CONV and first.bwd_flops == first.fwd_flops  # no gradient of the image
    for lay in small.layers[1:]:
        if lay.kind in (LayerKind.CONV, LayerKind.LINEAR):
            assert lay.bwd_flops == 2 * lay.fwd_flops
    # conv GEMM shape: conv1 of ResNet-50 is M=112², N=64, K=3·7·7
    assert first.gemm_shape == (112 * 112, 64, 147)
    assert first.gemm_dims(32) == (1, 32 * 112 * 112, 64, 147)


def test_cnn_bytes_and_activations() -> None:
    model = alexnet(dtype=2)
    fc = next(la for la in model.layers if la.name == "classifier.1")
    assert fc.param_count == 9216 * 4096 + 4096
    assert fc.param_bytes == 2 * 9216 * 4096 + 2 * 4096
    # forward bytes: input + output + weights; for a batch the weights are read once
    assert fc.fwd_bytes == 2 * (9216 + 4096) + fc.param_bytes
    assert fc.fwd_bytes_at(64) == pytest.approx(64 * 2 * (9216 + 4096) + fc.param_bytes)
    # conv1 stashes the 3×224×224 input (2 bytes each); ReLU stashes its output, the next pool reuses it
    assert model.layers[0].activation_bytes == 2 * 3 * 224 * 224
    relu1, pool1 = model.layers[1], model.layers[2]
    assert relu1.activation_bytes == 2 * 64 * 55 * 55
    assert pool1.activation_bytes == 8 * 64 * 27 * 27  # only the int64 indices are new


# --- transformers: published parameter counts ---


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("gpt2", 124_439_808),  # HF GPT2Model
        ("gpt2-xl", 1_557_611_200),
        ("llama2-7b", 6_738_415_616),  # HF LlamaForCausalLM
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),  # HF Llama-3.1-405B
        ("bloom-176b", 176_247_271_424),  # BLOOM model card
        ("mixtral-8x7b", 46_702_792_704),
        ("bert-base", 110_106_428),  # HF BertForPreTraining (BertModel 109,482,240 + MLM/NSP heads)
        ("bert-large", 336_226_108),  # HF BertForPreTraining (BertModel 335,141,888 + heads)
    ],
)
def test_transformer_exact_params(name: str, params: int) -> None:
    assert get_model(name).param_count == params


def test_bloom_architecture_fields_against_its_model_card() -> None:
    """BLOOM-176B's model card: 176,247,271,424 parameters of which 3,596,615,680 in the (tied) embedding, a
    vocabulary of 250,680 tokens padded to 250,880, a LayerNorm after the embedding, ALiBi (no position
    parameters). Each field moves the count by exactly its parameters."""
    m = get_model("bloom-176b")
    word = next(lay for lay in m.layers if lay.name == "embedding.word")
    assert word.param_count == 3_596_615_680 and m.vocab == 250_880 == 490 * 512
    assert [lay.name for lay in m.layers[:2]] == ["embedding.word", "embedding.norm"]
    assert not any("position" in lay.name or "rotary" in lay.name for lay in m.layers)
    h = 14336
    assert get_model("bloom-176b", embedding_norm=False).param_count == 176_247_271_424 - 2 * h
    assert get_model("bloom-176b", vocab_divisible_by=1).param_count == 176_247_271_424 - 200 * h
    with pytest.raises(ConfigError, match="vocab_divisible_by"):
        get_model("bloom-176b", vocab_divisible_by=0)


def test_mlp_activation_by_name() -> None:
    """``activation`` names the MLP's: ``gated_mlp: true`` is ``swiglu`` (the same layers); squared ReLU
    (Nemotron-4) costs 2 FLOPs per element against GELU's 8, with GELU's two matrices; GeGLU has SwiGLU's
    three. Nemotron-4-340B (96 layers, hidden 18,432, 8 KV heads, FFN 73,728, squared ReLU, vocabulary
    256,000 untied, no biases) has 340 billion parameters (NVIDIA's model card)."""
    kw: dict[str, Any] = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 64, "vocab": 100, "ffn_hidden": 512}
    assert transformer("a", gated_mlp=True, **kw).layers == transformer("a", activation="swiglu", **kw).layers
    assert transformer("a", **kw).layers == transformer("a", activation="gelu", **kw).layers

    def act(name: str) -> Any:
        return next(lay for lay in transformer("a", activation=name, **kw).layers if lay.name.endswith("mlp_act"))

    assert act("squared-relu").fwd_flops == 2 * 64 * 512 and act("gelu").fwd_flops == 8 * 64 * 512
    assert act("relu").fwd_flops == 64 * 512 and act("geglu").fwd_flops == 9 * 64 * 512
    params = {a: transformer("a", activation=a, **kw).param_count for a in ("gelu", "squared-relu", "geglu", "swiglu")}
    assert params["gelu"] == params["squared-relu"] and params["geglu"] == params["swiglu"]
    assert params["swiglu"] - params["gelu"] == 2 * (256 * 512 + 512)  # the second up projection (with bias)
    with pytest.raises(ConfigError, match="gated_mlp"):
        transformer("a", gated_mlp=True, activation="squared-relu", **kw)
    nemotron = transformer("nemotron-4-340b", layers=96, hidden=18432, heads=96, kv_heads=8, ffn_hidden=73728,
                           seq_len=4096, vocab=256000, activation="squared-relu", position="rotary", bias=False,
                           tie_embeddings=False)
    assert nemotron.param_count == pytest.approx(340e9, rel=0.005)


@pytest.mark.parametrize(
    ("name", "published", "rel"),
    [
        ("bert-base", 110e6, 0.01),
        ("bert-large", 340e6, 0.02),
        ("gpt2", 124e6, 0.01),
        ("gpt3-175b", 175e9, 0.02),
        ("gpt3-13b", 13e9, 0.02),
        ("gpt3-6.7b", 6.7e9, 0.02),
        ("gpt3-2.7b", 2.7e9, 0.02),
        ("gpt3-1.3b", 1.3e9, 0.02),
        ("llama2-7b", 6.74e9, 0.001),
        ("llama2-70b", 69e9, 0.005),
        ("llama3-8b", 8.03e9, 0.001),
    ],
)
def test_transformer_published_params(name: str, published: float, rel: float) -> None:
    assert get_model(name).param_count == pytest.approx(published, rel=rel)


def test_mixtral_active_params() -> None:
    model = get_model("mixtral-8x7b")
    assert model.param_count / 1e9 == pytest.approx(46.7, abs=0.05)
    assert model.active_param_count / 1e9 == pytest.approx(12.9, abs=0.05)  # Jiang et al. 2024: 12.9B active
    # compute follows the active parameters: forward ≈ 2·N_active per token (+ attention)
    per_token = model.fwd_flops_per_sample / model.tokens_per_sample
    assert per_token / (2 * model.active_param_count) == pytest.approx(1.0, abs=0.1)
    ups = [la for la in model.layers if la.name.endswith("experts_up")]
    assert len(ups) == 32 and all(la.expert for la in ups)
    s, h, d = 4096, 4096, 2
    assert ups[0].alltoall_bytes_fwd == 2 * s * h * d  # top-2 copies of every token are dispatched
    assert ups[0].gemm_dims(4) == (8, 4 * 2 * s // 8, 2 * 14336, h)


@pytest.mark.parametrize("row", MEGATRON_SC21_TABLE1, ids=lambda r: r.model_name)
def test_megatron_table_params(row: object) -> None:
    """Narayanan et al. SC'21 Table 1 sizes, within half a unit of the printed last digit."""
    params_b = row.params_billion  # type: ignore[attr-defined]
    model = get_model(row.model_name)  # type: ignore[attr-defined]
    half_unit = 0.5 if params_b >= 1000 else 0.05
    assert abs(model.param_count / 1e9 - params_b) <= half_unit
    assert (model.hidden, model.num_layers, model.heads, model.vocab, model.seq_len) == (
        row.hidden,
        row.layers,
        row.heads,
        51200,
        2048,
    )  # type: ignore[attr-defined]


def test_megatron_formula_vs_layers() -> None:
    """145.6B row, batch 2304: the paper's F against our per-layer sum."""
    model = get_model("megatron-145.6b")
    batch = 2304
    s, ell, h, v = 2048, 80, 12288, 51200
    f_paper = 96 * batch * s * ell * h * h * (1 + s / (6 * h) + v / (16 * ell * h))
    assert model.megatron_flops_per_iteration(batch) == pytest.approx(f_paper, rel=1e-12)
    # GEMMs only: exactly the formula's terms (biases add s·N per linear, ~1e-4)
    assert gemm_flops(model, recompute=True) * batch == pytest.approx(f_paper, rel=1e-3)
    # everything (norms, softmax, residuals, loss...): within a few %
    total = model.train_flops_per_sample(recompute=True) * batch
    assert total / f_paper == pytest.approx(1.0, abs=0.03)
    assert total > f_paper
    f_norecomp = model.megatron_flops_per_iteration(batch, recompute=False)
    assert gemm_flops(model, recompute=False) * batch == pytest.approx(f_norecomp, rel=1e-3)


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-529.6b", "llama2-70b", "gpt3-13b"])
def test_six_n_rule(name: str) -> None:
    """Kaplan et al. 2020 §2.1: training ≈ 6N FLOPs per token, plus 12·l·s·h for (unfused) attention."""
    model = get_model(name, flash_attention=False)
    per_token = model.total_flops_per_sample / model.tokens_per_sample
    n = model.param_count
    assert per_token / (6 * n) == pytest.approx(1.0, abs=0.10)
    assert model.num_layers and model.seq_len and model.hidden
    with_attention = 6 * n + 12 * model.num_layers * model.seq_len * model.hidden
    assert per_token / with_attention == pytest.approx(1.0, abs=0.02)


def test_korthikanti_activation_memory() -> None:
    """Korthikanti et al. 2023 eq. (1): s·b·h·(34 + 5·a·s/h) bytes per block with dropout, 2-byte dtype."""
    s, h, a = 2048, 12288, 96
    model = get_model("gpt3-175b")
    block0 = sum(la.activation_bytes for la in model.layers if la.block == 0)
    assert block0 == pytest.approx(s * h * (34 + 5 * a * s / h), rel=1e-12)
    no_drop = transformer("x", layers=2, hidden=h, heads=a, seq_len=s, vocab=1000)
    blk = sum(la.activation_bytes for la in no_drop.layers if la.block == 1)
    assert blk == pytest.approx(s * h * (32 + 2 * a * s / h), rel=1e-12)
    flash = transformer("x", layers=1, hidden=h, heads=a, seq_len=s, vocab=1000, flash_attention=True)
    blk = sum(la.activation_bytes for la in flash.layers if la.block == 0)
    assert blk == pytest.approx(s * h * 32 + 4 * a * s, rel=1e-12)  # no s² term, plus fp32 logsumexp


def test_block_layer_decomposition_and_tp_metadata() -> None:
    s, h, a, d = 1024, 768, 12, 2
    model = get_model("gpt2")
    block = [la for la in model.layers if la.block == 3]
    names = [la.name.split(".")[-1] for la in block]
    assert names == [
        "norm1",
        "qkv",
        "scores",
        "softmax",
        "attention_dropout",
        "context",
        "out_proj",
        "attention_output_dropout",
        "attention_residual",
        "norm2",
        "mlp_up",
        "mlp_act",
        "mlp_down",
        "mlp_output_dropout",
        "mlp_residual",
    ]
    by = {n: la for n, la in zip(names, block, strict=True)}
    assert by["qkv"].tp_split == TPSplit.COLUMN and by["out_proj"].tp_split == TPSplit.ROW
    assert by["mlp_down"].tp_split == TPSplit.ROW and by["norm1"].tp_split == TPSplit.REPLICATED
    assert [n for n in names if block[names.index(n)].tp_allreduce_bytes_fwd] == ["out_proj", "mlp_down"]
    assert [n for n in names if block[names.index(n)].tp_allreduce_bytes_bwd] == ["qkv", "mlp_up"]
    assert sum(la.tp_allreduce_bytes_fwd for la in block) == 2 * s * h * d
    assert by["qkv"].gemm_shape == (s, 3 * h, h)
    assert by["scores"].gemm_dims(8) == (8 * a, s, s, h // a)
    assert by["scores"].fwd_flops == 2 * s * s * h
    assert by["mlp_up"].fwd_flops == 2 * s * h * 4 * h + s * 4 * h  # GEMM + bias
    lm = next(la for la in model.layers if la.name == "lm_head")
    assert lm.param_count == 0 and lm.fwd_flops == 2 * s * h * 50257  # tied to the word embedding


def test_gqa_and_swiglu_shapes() -> None:
    model = get_model("llama2-70b")
    qkv = next(la for la in model.layers if la.name == "layers.0.qkv")
    h, kv_dim = 8192, 8 * 128
    assert qkv.param_count == h * (h + 2 * kv_dim)
    up = next(la for la in model.layers if la.name == "layers.0.mlp_up")
    assert up.param_count == h * 2 * 28672 and up.bwd_flops == 2 * up.fwd_flops
    att = next(la for la in model.layers if la.name == "layers.0.attention")
    s = 4096
    assert att.kind == LayerKind.ATTENTION
    assert att.fwd_flops == pytest.approx(
        (4 * s * s * h + 5 * 64 * s * s) * (s + 1) / (2 * s)
    )  # causal flash
    assert not any(la.kind == LayerKind.EMBEDDING and "position" in la.name for la in model.layers)


def test_bert_heads_and_overrides() -> None:
    base = get_model("bert-base")
    assert base.seq_len == 128
    dec = next(la for la in base.layers if la.name == "mlm.decoder")
    assert dec.gemm_shape == (20, 30522, 768) and dec.param_count == 30522  # tied weight, own bias
    long = get_model("Bert-Large", seq_len=512)
    assert next(la for la in long.layers if la.name == "mlm.decoder").gemm_shape == (80, 30522, 1024)
    assert long.param_count == get_model("bert-large").param_count  # 512 positions either way
    fp32 = get_model("gpt2", dtype="fp32")
    assert fp32.dtype == 4 and fp32.layers[-2].param_bytes == 4 * 768 * 50257


def test_eager_attention_glue_bytes() -> None:
    """Eager attention: scaling and mask over the heads·s² scores, the head split/merge copies."""
    s, h, a = 128, 1024, 16
    bert = get_model("bert-large", eager_attention=True)
    names = {la.name: la for la in bert.layers if la.block == 0}
    scores = a * s * s
    assert names["layers.0.scores_scale"].fwd_bytes == 2 * 2 * scores  # read + write, 2 bytes
    assert names["layers.0.scores_scale"].bwd_bytes == 2 * 2 * scores
    assert names["layers.0.scores_mask"].fwd_bytes == 2 * 2 * scores and names["layers.0.scores_mask"].bwd_bytes == 0
    assert names["layers.0.head_split"].fwd_bytes == 2 * 2 * 3 * s * h  # q, k, v
    assert names["layers.0.head_merge"].bwd_bytes == 2 * 2 * s * h  # the context
    # the default BERT (the fused TorchScript code of the published rows): same parameters, fewer bytes
    plain = get_model("bert-large")
    assert not any("scores_scale" in la.name for la in plain.layers)
    assert plain.param_count == bert.param_count
    extra = sum(la.fwd_bytes + la.bwd_bytes for la in bert.layers) - sum(
        la.fwd_bytes + la.bwd_bytes for la in plain.layers)
    assert extra == pytest.approx(24 * (3 * 4 * scores + 2 * 4 * 4 * s * h))
    with pytest.raises(ConfigError) as e:
        transformer("x", layers=1, hidden=64, heads=2, seq_len=8, vocab=10, flash_attention=True,
                    eager_attention=True)
    assert "eager_attention" in str(e.value)


def test_attention_unpad_bytes_and_kernels() -> None:
    """flash-attn's unpadding around varlen attention (LLM Foundry's attn_impl: flash): Q, K, V gathered
    (read + write) and zero-filled + scattered back in backward; the output zero-filled + index_put, then
    gathered in backward. Hand counts for s = 16, h = 64, 4 heads (head dim 16), 2 KV heads, bf16."""
    s, h, kv = 16, 64, 2 * 16
    kw = dict(layers=2, hidden=h, heads=4, kv_heads=2, seq_len=s, vocab=100, flash_attention=True)
    m = transformer("x", attention_unpad=True, **kw)
    plain = transformer("x", **kw)
    names = {la.name: la for la in m.layers if la.block == 0}
    order = [la.name for la in m.layers if la.block == 0]
    assert order.index("layers.0.attention_unpad") + 1 == order.index("layers.0.attention")
    assert order.index("layers.0.attention") + 1 == order.index("layers.0.attention_pad")
    unpad, pad = names["layers.0.attention_unpad"], names["layers.0.attention_pad"]
    n = s * (h + 2 * kv)  # elements of Q, K, V
    assert unpad.fwd_bytes == 2 * 2 * n + 3 * 8 * s  # gather: read + write; the row indices, once a call
    assert unpad.bwd_bytes == 3 * 2 * n + 3 * 8 * s  # zeros + scatter (read the gradient, write)
    assert pad.fwd_bytes == 3 * 2 * s * h + 8 * s and pad.bwd_bytes == 2 * 2 * s * h + 8 * s
    assert unpad.kernels == (21, 6) and pad.kernels == (2, 1)
    assert unpad.fwd_flops == unpad.bwd_flops == 0 and unpad.param_count == 0
    assert unpad.tp_split == TPSplit.COLUMN  # heads split under tensor parallelism
    assert m.param_count == plain.param_count and len(m.layers) == len(plain.layers) + 2 * 2
    with pytest.raises(ConfigError) as e:
        transformer("x", layers=1, hidden=64, heads=2, seq_len=8, vocab=10, attention_unpad=True)
    assert "attention_unpad" in str(e.value)


def test_logit_metrics_layer() -> None:
    """Composer's training metrics: k fp32 cross-entropies over tokens × vocab, forward only: each reads
    the bf16 logits, writes an fp32 copy, and the log-softmax reads it three times and writes it once."""
    s, v = 32, 1000
    kw = dict(layers=1, hidden=64, heads=2, seq_len=s, vocab=v, flash_attention=True)
    m = transformer("x", logit_metrics=2, **kw)
    assert [la.name for la in m.layers][-2:] == ["loss", "logit_metrics"]
    lm = m.layers[-1]
    assert lm.kind == LayerKind.LOSS and lm.fwd_bytes == 2 * (2 + 4 + 4 * 4) * s * v
    assert lm.bwd_bytes == 0 and lm.bwd_flops == 0 and lm.kernels == (12, 0)
    assert "logit_metrics" not in [la.name for la in transformer("x", **kw).layers]
    bert = get_model("bert-large", logit_metrics=1)  # an encoder's metrics score its MLM logits
    metrics = next(la for la in bert.layers if la.name == "logit_metrics")
    assert metrics.fwd_bytes == (2 + 4 + 4 * 4) * 20 * 30522
    with pytest.raises(ConfigError):
        transformer("x", logit_metrics=-1, **kw)


def test_model_from_dict() -> None:
    m = model_from_dict(
        {
            "type": "transformer",
            "name": "mine",
            "layers": 4,
            "hidden": 512,
            "heads": 8,
            "seq_len": 256,
            "vocab": 32000,
            "gated_mlp": True,
            "norm": "rmsnorm",
            "dtype": "bf16",
        }
    )
    assert m.name == "mine" and m.num_layers == 4 and m.dtype == 2
    h, f = 512, 4 * 512
    per_layer = 4 * h * h + 4 * h + 3 * h * f + 2 * f + h + 2 * h  # biases on by default, RMSNorm h each
    assert m.param_count == 4 * per_layer + 32000 * h + 256 * h + h
    assert model_from_dict("resnet50").param_count == 25_557_032
    assert model_from_dict({"name": "gpt2", "seq_len": 512}).seq_len == 512


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"type": "transformer", "layers": 4, "heads": 8, "seq_len": 256, "vocab": 100}, "model.hidden"),
        (
            {"type": "transformer", "layers": -4, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 100},
            "model.layers",
        ),
        (
            {"type": "transformer", "layers": 4, "hidden": 500, "heads": 8, "seq_len": 256, "vocab": 100},
            "model.heads",
        ),
        (
            {
                "type": "transformer",
                "layers": 4,
                "hidden": 512,
                "heads": 8,
                "kv_heads": 3,
                "seq_len": 256,
                "vocab": 100,
            },
            "model.kv_heads",
        ),
        (
            {
                "type": "transformer",
                "layers": 4,
                "hidden": 512,
                "heads": 8,
                "seq_len": 256,
                "vocab": 100,
                "experts": 4,
                "top_k": 5,
            },
            "model.top_k",
        ),
        (
            {
                "type": "transformer",
                "layers": 4,
                "hidden": 512,
                "heads": 8,
                "seq_len": 256,
                "vocab": 100,
                "norm": "batchnorm",
            },
            "model.norm",
        ),
        (
            {
                "type": "transformer",
                "layers": 4,
                "hidden": 512,
                "heads": 8,
                "seq_len": 256,
                "vocab": 100,
                "widht": 3,
            },
            "model.widht",
        ),
        (
            {
                "type": "transformer",
                "layers": "four",
                "hidden": 512,
                "heads": 8,
                "seq_len": 256,
                "vocab": 100,
            },
            "model.layers",
        ),
        ({"type": "rnn"}, "model.type"),
        ({"name": "gpt5"}, "model.name"),
        ({"name": "gpt2", "dtype": "fp13"}, "model.dtype"),
    ],
)
def test_config_errors(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        model_from_dict(spec)
    assert err.value.field == field
    assert "\n" not in str(err.value) and err.value.fix


def test_get_model_errors() -> None:
    with pytest.raises(ConfigError, match="unknown model 'x'") as err:
        get_model("x")
    assert err.value.field == "model" and "resnet50" in err.value.fix and "mixtral-8x7b" in err.value.fix
    with pytest.raises(ConfigError) as err:
        get_model("resnet50", seq_len=128)
    assert err.value.field == "model.seq_len" and "image_size" in err.value.fix
    with pytest.raises(ConfigError) as err:
        get_model("alexnet", image_size=32)  # the feature map vanishes at the last max-pool
    assert err.value.field == "image_size"
    with pytest.raises(ConfigError) as err:
        get_model("resnet50").megatron_flops_per_iteration(8)
    assert err.value.field == "model"
    with pytest.raises(ConfigError):
        get_model("gpt2").megatron_flops_per_iteration(0)


def test_registry_complete_and_case_insensitive() -> None:
    for name in (
        "resnet50",
        "resnet101",
        "vgg16",
        "alexnet",
        "inception-v3",
        "bert-base",
        "bert-large",
        "gpt2",
        "gpt2-xl",
        "gpt3-1.3b",
        "gpt3-2.7b",
        "gpt3-6.7b",
        "gpt3-13b",
        "gpt3-175b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "mixtral-8x7b",
        "megatron-1.7b",
        "megatron-145.6b",
        "megatron-1t",
    ):
        assert name in MODELS
    assert get_model("GPT3-175B").param_count == get_model("gpt3-175b").param_count
    assert get_model("Inception_V3").name == "inception-v3"


# --- optional torch import ---


def test_from_torch_matches_hand_built_alexnet() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from topotrain.workload.torch_import import from_torch

    net = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d((6, 6)),
        nn.Flatten(),
        nn.Dropout(),
        nn.Linear(9216, 4096),
        nn.ReLU(),
        nn.Dropout(),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, 1000),
    )
    traced = from_torch(net, torch.randn(4, 3, 224, 224), name="alexnet-torch")
    ours = alexnet()
    assert traced.param_count == ours.param_count == 61_100_840
    assert len(traced.layers) == 8 and traced.sample_kind == "image" and traced.dtype == 4
    # torch's counter ignores bias adds; ours adds one FLOP per output element of each biased layer
    assert traced.fwd_flops_per_sample == pytest.approx(2 * macs(ours), rel=1e-3)
    first = traced.layers[0]
    assert first.bwd_flops == first.fwd_flops  # no input gradient for the image, as in our convention
    assert all(la.bwd_flops == 2 * la.fwd_flops for la in traced.layers[1:])
    assert first.gemm_shape == ours.layers[0].gemm_shape == (55 * 55, 64, 363)


def test_from_torch_attention_block_and_missing_input() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from topotrain.workload.torch_import import from_torch

    class Block(nn.Module):
        def __init__(self, h: int, a: int) -> None:
            super().__init__()
            self.a = a
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, h = x.shape
            q, k, v = (
                z.view(b, t, self.a, h // self.a).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(h, -1)
            )
            ctx = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, t, h)
            x = x + self.out(ctx)
            return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))

    s, h = 128, 256
    traced = from_torch(Block(h, 4), torch.randn(2, s, h))
    assert traced.sample_kind == "sequence" and traced.seq_len == s
    assert traced.param_count == 12 * h * h + 13 * h
    assert traced.fwd_flops_per_sample == 24 * s * h * h + 4 * s * s * h  # Narayanan et al. block GEMMs
    assert traced.layers[-1].name == "other" and traced.layers[-1].fwd_flops == 4 * s * s * h
    ours = transformer("x", layers=1, hidden=h, heads=4, seq_len=s, vocab=10)
    ours_block = sum(la.fwd_flops for la in ours.layers if la.block == 0 and la.kind in GEMM_KINDS)
    assert traced.fwd_flops_per_sample == pytest.approx(ours_block, rel=0.01)
    with pytest.raises(ConfigError):
        from_torch(Block(h, 4), "not a tensor")

    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(1000, 64), nn.Linear(64, 1000, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.emb(x))

    lm = from_torch(TiedLM(), torch.randint(0, 1000, (2, 16)))
    assert lm.param_count == 64_000  # the shared weight is counted once
    assert [la.kind for la in lm.layers] == [LayerKind.EMBEDDING, LayerKind.LINEAR]
    assert lm.layers[1].fwd_flops == 2 * 16 * 64 * 1000 and lm.layers[1].gemm_shape == (16, 1000, 64)
