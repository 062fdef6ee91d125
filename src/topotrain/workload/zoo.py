"""Named models: ``get_model("gpt3-175b")``, ``get_model("resnet50", image_size=299)``.

Each entry is built from its published architecture (never from typed-in totals). Sources:

* CNNs: see :mod:`topotrain.workload.cnn` (torchvision definitions).
* BERT (Devlin et al. 2019): base 12×768×12, large 24×1024×16, WordPiece vocabulary 30,522, 512 learned
  positions, pre-training heads (MLM + NSP). Default ``seq_len=128`` with the LM head scoring 20 masked
  tokens per 128 (NVIDIA DeepLearningExamples BERT pre-training phase 1, 90% of the steps; phase 2 and
  MLPerf Training use ``seq_len=512``: ``get_model("bert-large", seq_len=512)`` scores 80 tokens).
  Attention as fused as the TorchScript/NVFuser code of DeepLearningExamples' 21.11 figures runs it (no
  head copies; ``eager_attention=True`` gives the eager reference code instead, see
  :mod:`topotrain.workload.transformer`).
* GPT-2 (Radford et al. 2019; the released configs): vocabulary 50,257, context 1024, dropout 0.1.
* GPT-3 (Brown et al. 2020, Table 2.1): sequence 2048, vocabulary 50,257. Two rows of the table are
  inconsistent with ``hidden = heads·d_head``: GPT-3 XL (2048 = 24·128?) is built with 16 heads of 128,
  and GPT-3 13B (d_model 5140) with hidden 5120 = 40·128. Dense attention throughout (the paper's
  alternating locally banded sparse layers are not modelled).
* Megatron-LM SC'21 Table 1 (Narayanan et al. 2021): :data:`MEGATRON_SC21_TABLE1`, vocabulary 51,200,
  sequence 2048, dropout 0.1 as in Megatron-LM's defaults.
* Llama 2 (Touvron et al. 2023, Table 1 and the released configs: vocabulary 32,000, context 4096, 70B with
  8 KV heads) and Llama 3 (Meta 2024: vocabulary 128,256, context 8192, 8 KV heads): RMSNorm, rotary,
  SwiGLU, untied embeddings, no biases; built with fused (flash) attention as they are trained.
* BLOOM-176B (BigScience 2022, the model card and ``config.json``): ALiBi, a LayerNorm after the word
  embedding, GELU MLP of 4h with biases, tied embeddings, its 250,680-token vocabulary padded to 250,880
  (Megatron-DeepSpeed's ``--make-vocab-size-divisible-by 128`` times TP 4).
* Mixtral 8x7B (Jiang et al. 2024): Mistral-7B attention (8 KV heads), 8 SwiGLU experts of 14,336, top-2;
  default ``seq_len=4096`` (its context is 32,768: override ``seq_len``).
* DeepSeekMoE 16B (Dai et al. 2024, §5 and the released ``config.json``): 28 blocks of 2048 with 16 heads,
  the first block dense (SwiGLU of 10,944), the other 27 MoE: 64 routed experts of 1,408, top-6, and 2 shared
  experts (one shared MLP of 2·1,408); vocabulary 102,400, untied; 16.4B parameters, 2.8B activated.
* Qwen1.5-MoE-A2.7B (Qwen team 2024; Hugging Face's ``Qwen2MoeConfig`` defaults are this model): 24 blocks of
  2048, 16 heads, 60 routed experts of 1,408, top-4, a gated shared expert of 5,632 in every block; vocabulary
  151,936, untied; 14.3B parameters, 2.7B activated. Its q, k, v biases (147,456 parameters) are left out
  (``bias`` is all the linears' or none).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topotrain.util.errors import ConfigError, did_you_mean
from topotrain.workload import cnn
from topotrain.workload.layer import Model
from topotrain.workload.transformer import transformer

DTYPE_BYTES: Mapping[str, int] = {
    "fp32": 4,
    "float32": 4,
    "tf32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
}


@dataclass(frozen=True)
class MegatronRun:
    """One row of Narayanan et al., SC'21, Table 1 (weak scaling on Selene, DGX A100 80GB)."""

    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float
    percent_of_peak: float

    @property
    def model_name(self) -> str:
        return "megatron-1t" if self.params_billion >= 1000 else f"megatron-{self.params_billion:g}b"


MEGATRON_SC21_TABLE1: tuple[MegatronRun, ...] = (
    MegatronRun(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    MegatronRun(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    MegatronRun(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    MegatronRun(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    MegatronRun(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    MegatronRun(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    MegatronRun(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    MegatronRun(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    MegatronRun(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    MegatronRun(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
)


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: a builder, its defaults and where the architecture comes from."""

    builder: Callable[..., Model]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword options a user may override."""
        params = inspect.signature(self.builder).parameters
        return tuple(p for p in params if p not in ("name", "field"))

    def build(self, field_path: str = "model", **overrides: Any) -> Model:
        unknown = sorted(set(overrides) - set(self.options))
        if unknown:
            raise ConfigError(
                f"{field_path}.{unknown[0]}",
                "unknown option for this model",
                f"known: {', '.join(self.options)}",
            )
        kw = {**self.defaults, **overrides}
        if "field" in inspect.signature(self.builder).parameters:
            kw["field"] = field_path
        return self.builder(**kw)


def _bert(name: str, *, seq_len: int = 128, head_tokens: int | None = None, **kw: Any) -> Model:
    """BERT pre-training; the MLM head scores 20 tokens per 128 unless ``head_tokens`` is given."""
    if head_tokens is None and isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0:
        head_tokens = max(1, round(seq_len * 20 / 128))
    return transformer(name, seq_len=seq_len, head_tokens=head_tokens, **kw)


_bert.__signature__ = inspect.signature(transformer)  # type: ignore[attr-defined]

_GPT2 = {"seq_len": 1024, "vocab": 50257, "dropout": True}
_GPT3 = {"seq_len": 2048, "vocab": 50257, "dropout": True}
_LLAMA = {
    "norm": "rmsnorm",
    "position": "rotary",
    "gated_mlp": True,
    "tie_embeddings": False,
    "bias": False,
    "flash_attention": True,
}
_BERT = {"vocab": 30522, "encoder_only": True, "max_positions": 512, "dropout": True}


def _tf(name: str, source: str, **defaults: Any) -> tuple[str, ModelSpec]:
    return name, ModelSpec(transformer, {"name": name, **defaults}, source)


def _registry() -> dict[str, ModelSpec]:
    reg: dict[str, ModelSpec] = {
        "resnet50": ModelSpec(cnn.resnet50, source="He et al. 2016; torchvision"),
        "resnet101": ModelSpec(cnn.resnet101, source="He et al. 2016; torchvision"),
        "vgg16": ModelSpec(cnn.vgg16, source="Simonyan & Zisserman 2015, config D"),
        "alexnet": ModelSpec(cnn.alexnet, source="Krizhevsky 2014; torchvision"),
        "inception-v3": ModelSpec(cnn.inception_v3, source="Szegedy et al. 2016; torchvision"),
        "bert-base": ModelSpec(
            _bert,
            {"name": "bert-base", "layers": 12, "hidden": 768, "heads": 12, **_BERT},
            "Devlin et al. 2019",
        ),
        "bert-large": ModelSpec(
            _bert,
            {"name": "bert-large", "layers": 24, "hidden": 1024, "heads": 16, **_BERT},
            "Devlin et al. 2019",
        ),
    }
    gpt = [
        _tf("gpt2", "Radford et al. 2019", layers=12, hidden=768, heads=12, **_GPT2),
        _tf("gpt2-medium", "Radford et al. 2019", layers=24, hidden=1024, heads=16, **_GPT2),
        _tf("gpt2-large", "Radford et al. 2019", layers=36, hidden=1280, heads=20, **_GPT2),
        _tf("gpt2-xl", "Radford et al. 2019", layers=48, hidden=1600, heads=25, **_GPT2),
        _tf("gpt3-125m", "Brown et al. 2020, Table 2.1", layers=12, hidden=768, heads=12, **_GPT3),
        _tf("gpt3-350m", "Brown et al. 2020, Table 2.1", layers=24, hidden=1024, heads=16, **_GPT3),
        _tf("gpt3-760m", "Brown et al. 2020, Table 2.1", layers=24, hidden=1536, heads=16, **_GPT3),
        _tf(
            "gpt3-1.3b",
            "Brown et al. 2020, Table 2.1 (16 heads of 128)",
            layers=24,
            hidden=2048,
            heads=16,
            **_GPT3,
        ),
        _tf("gpt3-2.7b", "Brown et al. 2020, Table 2.1", layers=32, hidden=2560, heads=32, **_GPT3),
        _tf("gpt3-6.7b", "Brown et al. 2020, Table 2.1", layers=32, hidden=4096, heads=32, **_GPT3),
        _tf(
            "gpt3-13b",
            "Brown et al. 2020, Table 2.1 (hidden 5120)",
            layers=40,
            hidden=5120,
            heads=40,
            **_GPT3,
        ),
        _tf("gpt3-175b", "Brown et al. 2020, Table 2.1", layers=96, hidden=12288, heads=96, **_GPT3),
        _tf(
            "llama2-7b",
            "Touvron et al. 2023",
            layers=32,
            hidden=4096,
            heads=32,
            ffn_hidden=11008,
            seq_len=4096,
            vocab=32000,
            **_LLAMA,
        ),
        _tf(
            "llama2-13b",
            "Touvron et al. 2023",
            layers=40,
            hidden=5120,
            heads=40,
            ffn_hidden=13824,
            seq_len=4096,
            vocab=32000,
            **_LLAMA,
        ),
        _tf(
            "llama2-70b",
            "Touvron et al. 2023",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            ffn_hidden=28672,
            seq_len=4096,
            vocab=32000,
            **_LLAMA,
        ),
        _tf(
            "llama3-8b",
            "Meta 2024, Llama 3",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn_hidden=14336,
            seq_len=8192,
            vocab=128256,
            **_LLAMA,
        ),
        _tf(
            "llama3-70b",
            "Meta 2024, Llama 3",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            ffn_hidden=28672,
            seq_len=8192,
            vocab=128256,
            **_LLAMA,
        ),
        _tf(
            "llama3-405b",
            "Meta 2024, The Llama 3 Herd of Models, Table 3",
            layers=126,
            hidden=16384,
            heads=128,
            kv_heads=8,
            ffn_hidden=53248,
            seq_len=8192,
            vocab=128256,
            **_LLAMA,
        ),
        _tf(
            "bloom-176b",
            "BigScience 2022, BLOOM model card (176,247,271,424 parameters)",
            layers=70,
            hidden=14336,
            heads=112,
            seq_len=2048,
            vocab=250680,
            vocab_divisible_by=512,
            position="alibi",
            embedding_norm=True,
        ),
        _tf(
            "mixtral-8x7b",
            "Jiang et al. 2024",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn_hidden=14336,
            seq_len=4096,
            vocab=32000,
            experts=8,
            top_k=2,
            **_LLAMA,
        ),
        _tf(
            "deepseek-moe-16b",
            "Dai et al. 2024, DeepSeekMoE",
            layers=28,
            hidden=2048,
            heads=16,
            ffn_hidden=10944,
            seq_len=4096,
            vocab=102400,
            experts=64,
            top_k=6,
            moe_ffn_hidden=1408,
            shared_expert_hidden=2 * 1408,
            moe_layer_freq=(0,) + (1,) * 27,
            **_LLAMA,
        ),
        _tf(
            "qwen1.5-moe-a2.7b",
            "Qwen team 2024, Qwen1.5-MoE",
            layers=24,
            hidden=2048,
            heads=16,
            ffn_hidden=5632,
            seq_len=8192,
            vocab=151936,
            experts=60,
            top_k=4,
            moe_ffn_hidden=1408,
            shared_expert_hidden=5632,
            shared_expert_gate=True,
            **_LLAMA,
        ),
    ]
    reg.update(gpt)
    for row in MEGATRON_SC21_TABLE1:
        name, spec = _tf(
            row.model_name,
            "Narayanan et al. SC'21, Table 1",
            layers=row.layers,
            hidden=row.hidden,
            heads=row.heads,
            seq_len=2048,
            vocab=51200,
            dropout=True,
        )
        reg[name] = spec
    return reg


MODELS: Mapping[str, ModelSpec] = _registry()
ALIASES: Mapping[str, str] = {
    "inception_v3": "inception-v3",
    "inceptionv3": "inception-v3",
    "gpt2-small": "gpt2",
    "mixtral": "mixtral-8x7b",
    "megatron-1008b": "megatron-1t",
    "resnet-50": "resnet50",
    "resnet-101": "resnet101",
    "vgg-16": "vgg16",
}


def _dtype(value: Any, field_path: str) -> Any:
    if isinstance(value, str):
        key = value.lower()
        if key not in DTYPE_BYTES:
            raise ConfigError(field_path, f"unknown dtype {value!r}", f"use one of {', '.join(DTYPE_BYTES)}")
        return DTYPE_BYTES[key]
    return value


def _lookup(name: Any, field_path: str) -> ModelSpec:
    if not isinstance(name, str):
        raise ConfigError(field_path, f"expected a model name, got {name!r}", f"known: {', '.join(MODELS)}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in MODELS:
        raise ConfigError(field_path, f"unknown model '{name}'", did_you_mean(name, list(MODELS)))
    return MODELS[key]


def get_model(name: str, **overrides: Any) -> Model:
    """The named model (case-insensitive), with architecture ``overrides`` (e.g. ``seq_len=4096``).

    ``dtype`` may be bytes per element or a name (``"bf16"``, ``"fp32"``).
    """
    spec = _lookup(name, "model")
    if "dtype" in overrides:
        overrides["dtype"] = _dtype(overrides["dtype"], "model.dtype")
    return spec.build("model", **overrides)


_REQUIRED = ("layers", "hidden", "heads", "seq_len", "vocab")


def model_from_dict(d: Any, field: str = "model") -> Model:
    """A model from a scenario's ``model:`` entry.

    * ``"gpt3-175b"`` or ``{name: gpt3-175b, seq_len: 4096}``: a zoo model with overrides;
    * ``{type: transformer, layers, hidden, heads, seq_len, vocab, ...}``: a parameterized transformer
      (any keyword of :func:`~topotrain.workload.transformer.transformer`; ``name`` optional).
    """
    if isinstance(d, str):
        return _lookup(d, field).build(field)
    if not isinstance(d, Mapping):
        raise ConfigError(
            field,
            f"expected a model name or a mapping, got {type(d).__name__}",
            "write e.g. model: resnet50, or model: {type: transformer, layers: 24, ...}",
        )
    body = dict(d)
    kind = body.pop("type", None)
    if "dtype" in body:
        body["dtype"] = _dtype(body["dtype"], f"{field}.dtype")
    if kind is None:
        if "name" not in body:
            raise ConfigError(
                f"{field}.type",
                "missing (and no zoo model name given)",
                "add type: transformer, or name: <zoo model>",
            )
        return _lookup(body.pop("name"), f"{field}.name").build(field, **body)
    if not isinstance(kind, str) or kind.lower() != "transformer":
        raise ConfigError(
            f"{field}.type",
            f"unknown model type {kind!r}",
            "use type: transformer, or give a zoo model's name",
        )
    for key in _REQUIRED:
        if key not in body:
            raise ConfigError(f"{field}.{key}", "missing", f"add {key}: <positive integer>")
    spec = ModelSpec(transformer, {"name": body.pop("name", "custom-transformer")})
    return spec.build(field, **body)
