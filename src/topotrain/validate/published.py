"""Published training measurements as scenarios: the rows topotrain's predictions are checked against
(sources: docs/sources.md), their two declared subsets, and the residuals that error bands come from.

Calibration discipline (issue 17): every row belongs to one of two declared subsets.
:data:`CALIBRATION_SUBSET` names the rows a constant is fitted on (``benchmarks/calibrate.py`` fits only
on them: the two single-GPU ResNet-50 rows for ``conv_max_efficiency``, the five Megatron-Core H100 rows
for Hopper's ``gemm_max_efficiency``, four LLM Foundry rows on one DGX A100 for Ampere's, ResNet-50 on eight
V100-32GB for the host input pipeline's rate; and one declared calibration *ratio*, :data:`SKU_CLOCK_RATIO`,
for the DGX-1 V100's sustained tensor clock); every other row is in the *validation subset*, which no constant is
fitted on; the headline statistics and the error bands (:mod:`topotrain.training.bands`) come from it. No
row is left out. A row whose published figure contradicts other figures of the same code may be flagged
``inconsistent`` (and is still counted); none is now: the PyTorch BERT seq-512 row, flagged before, ran
LDDL's 64-token sequence binning, which :mod:`topotrain.training.length_binning` models
(:data:`PYTORCH_BERT_PHASE2`; :func:`sequence_length_check` compares the seq-512 / seq-128 ratios).

Run them with ``topotrain validate --published`` (or ``benchmarks/validation.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.bands import Regime, regime_of
from topotrain.training.simulate import Result, simulate
from topotrain.util.errors import ConfigError
from topotrain.util.progress import task as progress_task
from topotrain.workload.zoo import MEGATRON_SC21_TABLE1


def nvswitch_v100_server(name: str, gpu: str, gpus: int, nics: int) -> dict[str, Any]:
    """A V100 server as one crossbar: ``gpus`` V100s each with its NVLink2 aggregate (150 GB/s) into one
    NVSwitch-like node, two GPUs per PCIe3 switch, ``nics`` EDR NICs behind the PCIe switches."""
    per_nic = gpus // nics
    return {
        "name": name, "gpu": gpu,
        "nodes": [{"name": "nvsw", "kind": "nvswitch"}, {"name": "cpu0", "kind": "cpu"}]
        + [{"name": f"gpu{i}", "kind": "gpu", "nic": f"nic{i // per_nic}"} for i in range(gpus)]
        + [{"name": f"nic{i}", "kind": "nic", "link": "ib-edr-100g"} for i in range(nics)]
        + [{"name": f"pcie{i}", "kind": "pcie"} for i in range(nics)],
        "links": [{"a": f"gpu{i}", "b": "nvsw", "link": "nvlink2"} for i in range(gpus)]
        + [{"a": f"gpu{i}", "b": f"pcie{i // per_nic}", "link": "pcie3-x16"} for i in range(gpus)]
        + [{"a": f"nic{i}", "b": f"pcie{i}", "link": "pcie3-x16"} for i in range(nics)]
        + [{"a": f"pcie{i}", "b": "cpu0", "link": "pcie3-x16"} for i in range(nics)],
    }


# DGX-1 V100 approximated as 8 V100s each with its NVLink2 aggregate (150 GB/s) into one NVSwitch-like
# crossbar (the real hybrid cube-mesh reaches a similar NCCL ring busbw), PCIe3 to 4 NICs.
DGX1 = nvswitch_v100_server("dgx1-v100", "v100-16gb", 8, 4)


# The host input pipeline of NVIDIA DeepLearningExamples' ResNet-50 (PyTorch 21.03, "pytorch" data backend:
# torchvision DataLoader workers decoding JPEGs on the CPU; topotrain.training.host_input). Workers per GPU
# from the example's configs.yml as it stood when the 21.03 figures were published (commit 2bdf2775:
# platform DGX1V: workers 8, DGXA100: workers 16). CPUs as the servers' specifications give them: DGX-1
# two 20-core Intel Xeon E5-2698 v4 at 2.2 GHz (max turbo 3.6 GHz); DGX A100 two 64-core AMD EPYC 7742,
# 128 cores, 2.25 GHz base, 3.4 GHz max boost (docs/sources.md §1e).
DGX1_HOST_INPUT = {"workers_per_gpu": 8, "cpu_cores": 40, "cpu_base_ghz": 2.2, "cpu_boost_ghz": 3.6}
DGXA100_HOST_INPUT = {"workers_per_gpu": 16, "cpu_cores": 128, "cpu_base_ghz": 2.25, "cpu_boost_ghz": 3.4}


#: The rows constants are fitted on (``benchmarks/calibrate.py``), declared by name before any fit; all
#: others form the validation subset. Chosen for what they isolate: one GPU (no communication) for the
#: convolution ceiling; eight V100-32GB in a DGX-1, whose image rate the CPU's DataLoader workers bound, for
#: the host input pipeline's per-worker rate (added to the subset with that mechanism; the 8-GPU DGX-1 16GB
#: and DGX A100 rows stay in the validation subset); Megatron-Core's own H100 table for Hopper's GEMM ceiling;
#: LLM Foundry on one DGX A100 for Ampere's GEMM ceiling (added with it: a code base of its own, so the
#: Megatron-LM and BERT A100 rows test the ceiling rather than fit it). One more calibration figure is a ratio,
#: not a row: :data:`SKU_CLOCK_RATIO` (the DGX-1 V100's sustained tensor clock is fitted on it).
CALIBRATION_SUBSET: tuple[str, ...] = (
    "ResNet-50 1xV100 AMP b256",
    "ResNet-50 1xA100-80GB AMP b256",
    "ResNet-50 8xV100-32GB DGX-1 b256",
    "Megatron-Core 1.7B TP1 PP1 48xH100",
    "Megatron-Core 7.1B TP2 PP1 96xH100",
    "Megatron-Core 16B TP4 PP1 192xH100",
    "Megatron-Core 32B TP8 PP1 384xH100",
    "Megatron-Core 70B TP8 PP2 768xH100",
    "LLM Foundry mpt-1b 8xA100 FSDP",
    "LLM Foundry mpt-3b 8xA100 FSDP",
    "LLM Foundry mpt-7b 8xA100 FSDP",
    "LLM Foundry mpt-13b 8xA100 FSDP",
)


@dataclass(frozen=True)
class Case:
    name: str
    scenario: dict[str, Any]
    metric: str  # samples_per_s | tflops_per_gpu | tokens_per_s_per_gpu
    published: float
    source: str
    inconsistent: str = ""  # why the published figure contradicts other figures of the same code (see below)

    @property
    def subset(self) -> str:
        """``"calibration"`` for a row of :data:`CALIBRATION_SUBSET`, else ``"validation"``."""
        return "calibration" if self.name in CALIBRATION_SUBSET else "validation"

    @property
    def fitted(self) -> bool:
        """A row a constant is fitted on (the calibration subset)."""
        return self.subset == "calibration"


#: How Megatron-LM's own script for SC'21 Table 1 ran each row (``examples/sc21/run_table_1.sh``, commit
#: de7dc40f88, docs/sources.md §3c): params (B) → (micro-batch, ``--DDP-impl``,
#: ``--num-layers-per-virtual-pipeline-stage`` or None). Every row also passes ``--checkpoint-activations``
#: and ``--fp16``.
SC21_RUN: dict[float, tuple[int, str, int | None]] = {
    1.7: (16, "torch", None), 3.6: (16, "torch", None), 7.5: (16, "torch", None), 18.4: (8, "torch", None),
    39.1: (4, "local", None), 76.1: (2, "local", 5), 145.6: (2, "local", 5), 310.1: (1, "local", 3),
    529.6: (1, "local", 1), 1008.0: (1, "local", None),
}


def megatron_virtual_stages(layers: int, pp: int, layers_per_virtual_stage: int | None) -> int:
    """Model chunks per pipeline stage as Megatron-LM derives them:
    ``(num_layers // pipeline size) // num_layers_per_virtual_pipeline_stage`` (1 without the option)."""
    if layers_per_virtual_stage is None:
        return 1
    return (layers // pp) // layers_per_virtual_stage


#: How the PyTorch BERT 21.11 figures read phase 2 (seq 512): LDDL with 64-token sequence bins, each batch
#: padded to its longest sequence rounded up to 8 (commit a9e2c1d5 ``scripts/configs/pretrain_config.sh``,
#: "All configs using bin size=64 with phase2 by default"; docs/sources.md §2c, §2d), on the Wikipedia length
#: histogram of :mod:`topotrain.training.length_binning`. Phase 1 (seq 128, 256 or 64 sequences a batch) is
#: taken as full length: its batches are padded to their longest sequence, which is 128 all but surely.
PYTORCH_BERT_PHASE2: dict[str, Any] = {"lengths": "wikipedia-bert-512", "bin_size": 64}

#: Gradient accumulation of the PyTorch BERT 21.11 rows as the README's tables give it, (micro-batch,
#: accumulation steps) per GPU: A100 seq 128 (256, 32), seq 512 (32, 128); DGX-1 V100 32GB seq 128 (64, 64)
#: (docs/sources.md §2a). ``run_pretraining.py`` (a9e2c1d5) runs the accumulation steps under
#: ``model.no_sync()`` and steps the optimizer (LAMB) once per ``gradient_accumulation_steps``; the rows'
#: ``batch`` is that optimizer step, so the all-reduce and the optimizer are charged once per step.
PYTORCH_BERT_ACCUMULATION: dict[str, tuple[int, int]] = {
    "BERT-large s128 1xA100 b256": (256, 32), "BERT-large s128 8xA100 b256": (256, 32),
    "BERT-large s512 8xA100 b32": (32, 128), "BERT-large s128 8xV100-32GB b64": (64, 64)}


def cases() -> list[Case]:
    out: list[Case] = []
    dlx = "NVIDIA DeepLearningExamples"
    one_v100 = {"server": "single-gpu", "servers": 1, "gpu": "v100-16gb"}
    one_a100 = {"server": "single-gpu", "servers": 1, "gpu": "a100-80gb"}
    dgx_a100 = {"server": "nvswitch-8", "servers": 1}
    dgx1_in, a100_in = {"host_input": DGX1_HOST_INPUT}, {"host_input": DGXA100_HOST_INPUT}
    out += [
        Case("ResNet-50 1xV100 AMP b256", {"cluster": one_v100, "model": "resnet50", "batch": 256,
             "plan": dgx1_in}, "samples_per_s", 1200, f"{dlx} RN50 PyTorch 21.03"),
        Case("ResNet-50 8xV100 DGX-1 b256", {"cluster": {"server": DGX1, "servers": 1}, "model": "resnet50",
             "batch": 2048, "plan": {"micro_batch": 256, **dgx1_in}}, "samples_per_s", 8322,
             f"{dlx} RN50 PyTorch 21.03"),
        Case("ResNet-50 1xA100-80GB AMP b256", {"cluster": one_a100, "model": "resnet50", "batch": 256,
             "plan": a100_in}, "samples_per_s", 2470, f"{dlx} RN50 PyTorch 21.03"),
        Case("ResNet-50 8xA100 DGX A100 b256", {"cluster": dgx_a100, "model": "resnet50", "batch": 2048,
             "plan": {"micro_batch": 256, **a100_in}}, "samples_per_s", 16621, f"{dlx} RN50 PyTorch 21.03"),
        # the host input pipeline's calibration row (benchmarks/calibrate.py): the DGX-1 with 32 GB V100s
        Case("ResNet-50 8xV100-32GB DGX-1 b256", {"cluster": {"server": {**DGX1, "gpu": "v100"}, "servers": 1},
             "model": "resnet50", "batch": 2048, "plan": {"micro_batch": 256, **dgx1_in}}, "samples_per_s",
             8056, f"{dlx} RN50 PyTorch 21.03"),
        # one optimizer step of the run: micro-batch × accumulation steps (PYTORCH_BERT_ACCUMULATION) per GPU
        Case("BERT-large s128 1xA100 b256", {"cluster": one_a100, "model": "bert-large", "batch": 256 * 32,
             "plan": {"micro_batch": 256}}, "samples_per_s", 580, f"{dlx} BERT PyTorch 21.11"),
        Case("BERT-large s128 8xA100 b256", {"cluster": dgx_a100, "model": "bert-large", "batch": 8 * 256 * 32,
             "plan": {"micro_batch": 256}}, "samples_per_s", 4591, f"{dlx} BERT PyTorch 21.11"),
        Case("BERT-large s512 8xA100 b32", {"cluster": dgx_a100, "model": {"name": "bert-large", "seq_len": 512},
             "batch": 8 * 32 * 128, "plan": {"micro_batch": 32, "length_binning": PYTORCH_BERT_PHASE2}},
             "samples_per_s", 1657, f"{dlx} BERT PyTorch 21.11"),
        Case("BERT-large s128 8xV100-32GB b64", {"cluster": {"server": {**DGX1, "gpu": "v100"}, "servers": 1},
             "model": "bert-large", "batch": 8 * 64 * 64, "plan": {"micro_batch": 64}}, "samples_per_s", 1746,
             f"{dlx} BERT PyTorch 21.11"),
    ]
    out.append(megatron_v1_v100_case())
    for r in MEGATRON_SC21_TABLE1:
        name = f"megatron-{r.params_billion}b" if r.params_billion < 1000 else "megatron-1t"
        micro, ddp, per_virtual = SC21_RUN[r.params_billion]
        virtual = megatron_virtual_stages(r.layers, r.pp, per_virtual)
        # Selene, a DGX SuperPOD: DGX A100 servers, eight HDR NICs each, on the SuperPOD's rail-optimized
        # fat tree (each GPU index's NICs share leaf switches; docs/sources.md §3). ``--DDP-impl torch``
        # is PyTorch's DDP (bucketed all-reduce under the backward); ``local`` is Megatron-LM's own, which
        # all-reduces after the whole forward-backward (``train_step`` calls ``allreduce_gradients()`` after
        # ``forward_backward_func``): ``overlap: false``.
        out.append(Case(f"Megatron {r.params_billion}B TP{r.tp} PP{r.pp} {r.gpus} GPUs", {
            "cluster": {"server": "nvswitch-8", "servers": r.gpus // 8,
                        "network": {"topology": "rail-optimized", "link": "ib-hdr-200g"}},
            "model": name, "batch": r.batch,
            "plan": {"tp": r.tp, "pp": r.pp, "micro_batch": micro, "recompute": "full", "overlap": ddp == "torch",
                     "pipeline_schedule": "interleaved" if virtual > 1 else "1f1b",
                     "virtual_stages": virtual}}, "tflops_per_gpu", r.tflops_per_gpu,
            "Narayanan et al. SC'21 Table 1"))
    # MosaicML LLM Foundry benchmarks (scripts/train/benchmarking/README.md), H100 80GB BF16, seq 2048,
    # 128 GPUs; MPT architecture as the benchmark's yamls give it (GELU MLP 4h, learned positions — the
    # yamls set no ``alibi`` — biases, vocab 50368). ``sweep.py`` of commit 5e85bd62d runs 1b, 3b, 7b and
    # 70b with ``--attn_impl flash`` (flash-attn 2.4.2 through LLM Foundry's unpadding: ``attention_unpad``)
    # and 13b, 30b with ``triton`` (costed with FlashAttention-2's ceilings: no H100 figure for that kernel);
    # Composer evaluates MPT's two training metrics on the logits after every micro-batch (FOUNDRY_METRICS).
    foundry = [("mpt-1b", 24, 2048, 16, 12, 1536, False, 44123), ("mpt-3b", 32, 2560, 20, 8, 1024, False, 23422),
               ("mpt-7b", 32, 4096, 32, 6, 768, False, 10475), ("mpt-13b", 40, 5120, 40, 16, 2048, True, 5080),
               ("mpt-30b", 48, 7168, 64, 8, 1024, True, 2199), ("mpt-70b", 80, 8192, 64, 8, 1024, True, 1058)]
    for name, layers, hidden, heads, mb, gb, ckpt, tokens in foundry:
        shard = {"fsdp": True} if ckpt or name == "mpt-7b" else {"zero_stage": 2}  # FULL_SHARD / SHARD_GRAD_OP
        out.append(Case(f"LLM Foundry {name} 128xH100 FSDP", {
            "cluster": {"server": "dgx-h100", "servers": 16,
                        "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}},
            "model": {"type": "transformer", "name": name, "layers": layers, "hidden": hidden, "heads": heads,
                      "seq_len": 2048, "vocab": 50368, "flash_attention": True,
                      "attention_unpad": name not in FOUNDRY_TRITON_H100, **FOUNDRY_METRICS},
            "batch": gb, "plan": {"micro_batch": mb, "recompute": "full" if ckpt else "none", **shard}},
            "tokens_per_s_per_gpu", tokens, "MosaicML LLM Foundry benchmarking README"))
    out += megatron_core_cases()
    out += foundry_a100_cases()
    return out


#: The models LLM Foundry's large-scale H100 sweep ran with ``--attn_impl triton`` (``sweep.py`` at 5e85bd62d).
FOUNDRY_TRITON_H100 = ("mpt-13b", "mpt-30b")
#: Composer's training metrics of LLM Foundry's MPT (``LanguageCrossEntropy`` and ``LanguagePerplexity``;
#: ``use_train_metrics`` defaults to true at both benchmark commits), each a cross-entropy over the logits
#: after every micro-batch (Composer 0.16.4 / 0.17.2 ``_eval_train_metrics``; docs/sources.md §7e).
FOUNDRY_METRICS: dict[str, Any] = {"logit_metrics": 2}


#: One V100 of a DGX-2H as the Megatron-LM v1.0 release blog gives it (docs/sources.md §8a): the DGX-2H
#: lifts the DGX-2's power limit (10 → 12 kW) for "2.1 petaFLOPS" (2.0 on the DGX-2), i.e. 2.1e15 / 16 =
#: 131.25 TFLOP/s fp16 tensor per GPU (Megatron's own "39 TFLOP/s = 30 %" and "62.4 = 48 %" of peak imply
#: 130); HBM2, SMs and the FP32/FP64 rates as the V100 SXM2 datasheet (the higher power limit is taken to
#: raise the tensor clock only). No ``compute_efficiency``: the V100 ceilings are the roofline defaults, and
#: at 450 W the board is taken to hold its rated clock (``tensor_clock_fraction`` 1; the 300 W DGX-1 V100's
#: is fitted against it, :data:`SKU_CLOCK_RATIO`).
V100_DGX2H = {"name": "v100-sxm3-dgx2h", "vendor": "nvidia",
              "peak_flops": {"fp64": 7.8e12, "fp32": 15.7e12, "fp16": 2.1e15 / 16},
              "hbm_bandwidth": "900GB/s", "memory": "32GiB", "sm_count": 80, "nvlink": "nvlink2",
              "source": "NVIDIA DGX-2H: 16 V100 SXM3 32GB, 2.1 PFLOPS tensor (docs/sources.md 8a)"}


#: A DGX-2H as one server: 16 V100 SXM3 (:data:`V100_DGX2H`) on NVSwitch, each GPU's six NVLink2 links taken
#: as its 150 GB/s aggregate (as :data:`DGX1`), PCIe3 to 8 NICs.
DGX2H = nvswitch_v100_server("dgx2h-v100", str(V100_DGX2H["name"]), 16, 8)


@dataclass(frozen=True)
class RatioCase:
    """A calibration figure that is a ratio: per-GPU throughput of ``numerator`` over that of ``denominator``
    (two scenarios of the same code), published as ``published``."""

    name: str
    numerator: dict[str, Any]
    denominator: dict[str, Any]
    published: float
    source: str


#: The declared calibration ratio of the DGX-1 V100's sustained tensor clock (``tensor_clock_fraction`` of
#: ``v100``/``v100-16gb`` in :mod:`topotrain.hardware.gpus`; ``benchmarks/calibrate.py`` fits it on this ratio
#: and on nothing else). NVIDIA DeepLearningExamples PyTorch BERT in the pytorch:19.07-py3 container (README at
#: commit a7089640), BERT-large phase 1 (seq 128), AMP, micro-batch 64 on both boards: one DGX-2H (16 V100
#: SXM3 at 450 W) 3,379.2 seq/s, i.e. 211.2 per GPU ("Pre-training on multiple NVIDIA DGX-2H With 32G", one
#: node), over one V100 32GB of a DGX-1 (SXM2, 300 W) 171.52 seq/s ("Pre-training NVIDIA DGX-1 With 32G"):
#: 1.2313. 128 accumulation steps per optimizer step as ``scripts/run_pretraining.sh`` defaults
#: (``train_batch_size=8192``, ``gradient_accumulation_steps=128``, per GPU) on both. The absolute figures of
#: that code (eager PyTorch 1.2 of 2019) are not rows: the model describes the 21.11 code, and only their ratio,
#: in which the code's own costs cancel, is used (docs/sources.md §2f).
SKU_CLOCK_RATIO = RatioCase(
    "BERT-large s128 PyTorch 19.07 b64: 1 DGX-2H GPU / 1 DGX-1 V100-32GB",
    {"cluster": {"server": DGX2H, "servers": 1, "catalog": {"gpus": [V100_DGX2H]}},
     "model": "bert-large", "batch": 16 * 64 * 128, "plan": {"micro_batch": 64}},
    {"cluster": {"server": "single-gpu", "servers": 1, "gpu": "v100"},
     "model": "bert-large", "batch": 64 * 128, "plan": {"micro_batch": 64}},
    3379.2 / 16 / 171.52, "NVIDIA DeepLearningExamples BERT PyTorch 19.07 README (a7089640)")

#: Declared calibration ratios (fitted on by ``benchmarks/calibrate.py``; no validation row among them).
CALIBRATION_RATIOS: tuple[RatioCase, ...] = (SKU_CLOCK_RATIO,)


def ratio_predicted(rc: RatioCase, denominator_params: dict[str, Any] | None = None,
                    network: str = "analytical") -> float:
    """Predicted per-GPU throughput of ``rc.numerator`` over that of ``rc.denominator``;
    ``denominator_params`` laid over the denominator's ``compute.params`` (what the fit varies)."""
    def per_gpu(sc: dict[str, Any]) -> float:
        r = simulate(scenario_from_dict({"network": network, **sc}))
        return r.samples_per_s / r.gpus
    den = dict(rc.denominator)
    if denominator_params:
        den["compute"] = {"params": {**den.get("compute", {}).get("params", {}), **denominator_params}}
    return per_gpu(rc.numerator) / per_gpu(den)


def megatron_v1_v100_case() -> Case:
    """Megatron-LM v1.0's single-GPU baseline on a V100 of a DGX-2H: the 1.2B GPT-2 (hidden 1536, 16 heads,
    40 layers; Shoeybi et al. 2019, Table 1, taken to be the blog's "baseline model with 1.2 billion
    parameters"), sequence 1024, vocabulary padded to 51,200, batch 8, 1,288 ms
    per iteration (nv-adlr.github.io/MegatronLMV1, 2020-05-15, Table 1; docs/sources.md §8a). The code of
    that release (NVIDIA/Megatron-LM 5897a790c4, ``examples/pretrain_gpt2.sh``: ``--checkpoint-activations
    --fp16``, dropout 0.1) runs the unfused attention of ``megatron/model/transformer.py``: Q, K and V
    split by ``view().permute()`` and multiplied by ``torch.matmul`` on the 4-D views (copies), an
    in-place ``masked_fill_`` of the scores, ``torch.nn.Softmax``, dropout, and ``permute().contiguous()``
    of the context: ``eager_attention`` (which charges one score-sized scaling pass more than Megatron's
    masked fill forward and backward, about 2 % of the step).

    A V100 transformer run from a code base other than DeepLearningExamples, in the validation subset: it
    checks the V100's GEMM ceiling (the roofline default 0.80, not calibrated). It is not a calibration
    row because no defensible ceiling fits it: the model is slow on it at 0.80, and would need more than
    1.0 (docs/validation.md §3)."""
    return Case("Megatron-LM v1.0 GPT-2 1.2B 1xV100 DGX-2H b8", {
        "cluster": {"server": "single-gpu", "servers": 1, "gpu": V100_DGX2H["name"],
                    "catalog": {"gpus": [V100_DGX2H]}},
        "model": {"type": "transformer", "name": "megatron-gpt2-1.2b", "layers": 40, "hidden": 1536, "heads": 16,
                  "seq_len": 1024, "vocab": 51200, "dropout": True, "eager_attention": True},
        "batch": 8, "plan": {"micro_batch": 8, "recompute": "full"}}, "samples_per_s", 8 / 1.288,
        "Megatron-LM v1.0 blog (nv-adlr, 2020), Table 1")


# LLM Foundry on one DGX A100 (8x A100 80GB), seq 2048, FSDP FULL_SHARD without recomputation, amp_bf16
# (README table of commit b2a43a147, docs/sources.md §7a): name, layers, hidden, heads, micro-batch,
# global batch, tokens/s per GPU. The A100 GEMM ceiling's calibration rows (benchmarks/calibrate.py): the
# models of 1B and up that run without recomputation on one server.
FOUNDRY_A100 = (
    ("mpt-1b", 24, 2048, 16, 14, 448, 20513),
    ("mpt-3b", 32, 2560, 20, 10, 160, 10811),
    ("mpt-7b", 32, 4096, 32, 6, 96, 4641),
    ("mpt-13b", 40, 5120, 40, 2, 48, 2262),
)
#: The Triton FlashAttention kernel these runs used (``submit_benchmarks.py`` default ``--attn_impl
#: triton`` at that commit): FlashAttention-2 is "around 1.3-1.5x faster than FlashAttention in Triton in the
#: forward pass and around 2x faster in the backward pass" on A100 (Dao, FlashAttention-2, 2023, §4.1), so
#: the A100 ceilings of FlashAttention-2 (0.65 / 0.55) divided by 1.4 and 2.
TRITON_ATTENTION_A100 = {"attention_fwd_efficiency": round(0.65 / 1.4, 3), "attention_bwd_efficiency": 0.55 / 2}


def foundry_a100_cases() -> list[Case]:
    return [Case(f"LLM Foundry {name} 8xA100 FSDP", {
        "cluster": {"server": "nvswitch-8", "servers": 1},
        "model": {"type": "transformer", "name": name, "layers": layers, "hidden": hidden, "heads": heads,
                  "seq_len": 2048, "vocab": 50368, "flash_attention": True, **FOUNDRY_METRICS},
        "batch": gb, "plan": {"micro_batch": mb, "fsdp": True},
        "compute": {"params": dict(TRITON_ATTENTION_A100)}},
        "tokens_per_s_per_gpu", tokens, "MosaicML LLM Foundry benchmarking README (A100 80GB)")
        for name, layers, hidden, heads, mb, gb, tokens in FOUNDRY_A100]


# Megatron-Core r0.8.0 H100 table (README at f2e5db402c, docs/sources.md 3b): name, heads, hidden, layers,
# TP, PP, GPUs, global batch, TFLOP/s per GPU. The 119B+ rows need more GPUs than the default sweep wants
# and interleaving/recompute settings the README does not give; they are left out.
MEGATRON_CORE_H100 = (
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
)


def megatron_core_scenario(heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
                           batch: int) -> dict[str, Any]:
    """A Megatron-Core H100 row as a scenario: DGX H100 servers on a rail-optimized NDR fabric, seq 4096,
    vocabulary 131,072 untied, flash attention, micro-batch 1, gradient-accumulation fusion (on by default in
    Megatron-Core r0.8: ``--no-gradient-accumulation-fusion`` turns it off, ``megatron/training/arguments.py``
    at f2e5db402c), distributed optimizer (ZeRO-1) with the parameter all-gather overlapped with the forward,
    sequence
    parallelism and tensor-parallel communication overlap where TP > 1 (the README's "DP/TP/PP comm
    overlap")."""
    plan: dict[str, Any] = {"tp": tp, "pp": pp, "micro_batch": 1, "zero_stage": 1, "overlap_param_gather": True,
                            "grad_accumulation_fusion": True}
    if tp > 1:
        plan.update(sequence_parallel=True, tp_comm_overlap=True)
    return {
        "cluster": {"server": "dgx-h100", "servers": gpus // 8,
                    "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}},
        "model": {"type": "transformer", "name": f"mcore-{hidden}", "layers": layers, "hidden": hidden,
                  "heads": heads, "seq_len": 4096, "vocab": 131072, "tie_embeddings": False,
                  "flash_attention": True},
        "batch": batch, "plan": plan}


def megatron_core_cases() -> list[Case]:
    return [Case(f"Megatron-Core {name} TP{tp} PP{pp} {gpus}xH100",
                 megatron_core_scenario(heads, hidden, layers, tp, pp, gpus, batch), "tflops_per_gpu", tflops,
                 "Megatron-LM README (Megatron-Core r0.8.0)")  # Hopper's GEMM ceiling's fit rows
            for name, heads, hidden, layers, tp, pp, gpus, batch, tflops in MEGATRON_CORE_H100]


def calibration_cases() -> list[Case]:
    """The rows of :data:`CALIBRATION_SUBSET` (every name must be a row)."""
    rows = [c for c in cases() if c.subset == "calibration"]
    missing = set(CALIBRATION_SUBSET) - {c.name for c in rows}
    if missing:
        raise RuntimeError(f"CALIBRATION_SUBSET names rows that do not exist: {sorted(missing)}")
    return rows


def validation_cases() -> list[Case]:
    """Every row outside the calibration subset."""
    return [c for c in cases() if c.subset == "validation"]


def predicted(case: Case, result: Result) -> float:
    """The simulated value of ``case.metric``."""
    if case.metric == "tokens_per_s_per_gpu":
        return result.tokens_per_s / result.gpus
    return float(getattr(result, case.metric))


# Sequence-length scaling of BERT-large pre-training, 8 GPUs, AMP: published throughput at seq 512 over that at
# seq 128 on the same machine and code (docs/sources.md 2a/2b), with each table's micro-batches. A dense
# model at full length must get slower per token at 512 (the same GEMMs per token plus 4x the attention
# work): the TF1 code feeds full-length 512-token records; the PyTorch 21.11 code reads phase 2 through LDDL's
# length bins (PYTORCH_BERT_PHASE2), so its seq-512 batches are mostly shorter.
BERT_SEQ_RATIOS: list[tuple[str, dict[str, Any], int, int, float, dict[str, Any] | None]] = [
    # (label, cluster, micro-batch at 512, micro-batch at 128, published ratio, phase-2 length binning)
    ("TF1 20.06 DGX A100 40GB", {"server": "nvswitch-8", "servers": 1, "gpu": "a100-40gb"}, 16, 64,
     572.112 / 2871.89, None),
    ("TF1 20.06 DGX-1 V100 32GB", {"server": {**DGX1, "gpu": "v100"}, "servers": 1}, 8, 64, 255.64 / 1443.05,
     None),
    ("TF1 20.06 DGX-1 V100 16GB", {"server": DGX1, "servers": 1}, 4, 16, 190.65 / 1001.39, None),
    ("PyTorch 21.11 DGX A100 80GB", {"server": "nvswitch-8", "servers": 1}, 32, 256, 1657 / 4591,
     PYTORCH_BERT_PHASE2),
    ("PyTorch 21.11 DGX-1 V100 32GB", {"server": {**DGX1, "gpu": "v100"}, "servers": 1}, 8, 64, 586 / 1746,
     PYTORCH_BERT_PHASE2),
]


def bert_seq_ratio(cluster: dict[str, Any], mb512: int, mb128: int, gpus: int = 8,
                   binning: dict[str, Any] | None = None) -> float:
    """Predicted BERT-large samples/s at seq 512 over that at seq 128 (data parallel, one micro-batch);
    ``binning`` is the seq-512 run's ``plan.length_binning`` (None: full-length sequences)."""
    def thr(seq: int, mb: int, extra: dict[str, Any]) -> float:
        return simulate(scenario_from_dict({"cluster": cluster, "model": {"name": "bert-large", "seq_len": seq},
                                            "batch": mb * gpus, "plan": {"micro_batch": mb, **extra}})).samples_per_s
    return thr(512, mb512, {"length_binning": binning} if binning else {}) / thr(128, mb128, {})


def sequence_length_check() -> list[tuple[str, float, float]]:
    """(label, predicted ratio, published ratio) for :data:`BERT_SEQ_RATIOS`."""
    return [(label, bert_seq_ratio(cl, m512, m128, binning=b), pub)
            for label, cl, m512, m128, pub, b in BERT_SEQ_RATIOS]


@dataclass(frozen=True)
class Row:
    """One published row, simulated: the prediction of its metric, its regime, the simulation's wall time."""

    case: Case
    predicted: float
    regime: Regime
    wall_s: float
    params: int = 0  # the model's parameter count

    @property
    def error(self) -> float:
        """Signed relative error of the prediction against the published figure."""
        return self.predicted / self.case.published - 1.0


def with_compute_params(scenario: dict[str, Any], params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``scenario`` with ``params`` laid over its ``compute.params`` (a copy; the case is left as it is)."""
    if not params:
        return scenario
    compute = dict(scenario.get("compute", {}))
    compute["params"] = {**compute.get("params", {}), **params}
    return {**scenario, "compute": compute}


def run(network: str = "analytical", only: Callable[[Case], bool] | None = None,
        progress: Callable[[str], Any] | None = None,
        compute_params: Mapping[str, Any] | None = None, library: str | None = None) -> list[Row]:
    """Simulate every row (or those ``only`` keeps) on ``network``; ``compute_params`` are laid over every
    row's ``compute.params`` (e.g. ``{"gemm_model": "table"}``), ``library`` (``comm.library``: ``nccl``,
    ``ideal``) replaces every row's communication library."""
    rows = []
    chosen = [c for c in cases() if only is None or only(c)]
    with progress_task(f"validating {len(chosen)} published rows ({network})", total=len(chosen)) as bar:
        for c in chosen:
            if progress is not None:
                progress(c.name)
            bar.update(description=f"validating ({network}): {c.name}")
            t0 = time.perf_counter()
            scenario = with_compute_params(c.scenario, compute_params)
            if library is not None:
                scenario = {**scenario, "comm": {"library": library}}
            sc = scenario_from_dict({"network": network, **scenario})
            r = simulate(sc)
            rows.append(Row(c, predicted(c, r), regime_of(sc.model.sample_kind, sc.model.experts,
                                                          sc.cluster.servers),
                            time.perf_counter() - t0, sc.model.param_count))
            bar.advance()
    return rows


def residuals_document(rows: list[Row], network: str) -> dict[str, Any]:
    """The validation subset's residuals (what :mod:`topotrain.training.bands` reads), with provenance."""
    val = [r for r in rows if r.case.subset == "validation"]
    if {r.case.name for r in val} != {c.name for c in validation_cases()}:
        raise ConfigError("--write-residuals", "residuals need every row of the validation subset",
                          "run topotrain validate --published without a filter")
    return {
        "what": "ln(predicted/published) of the validation subset (no constant fitted on it); "
                "src/topotrain/training/bands.py builds the error bands from them",
        "command": f"topotrain validate --published --network {network} --write-residuals",
        "network": network,
        "rows": [{"case": r.case.name, "metric": r.case.metric, "published": r.case.published,
                  "predicted": r.predicted, "log_error": math.log(r.predicted / r.case.published),
                  "regime": {"family": r.regime.family, "experts": r.regime.experts, "scale": r.regime.scale},
                  "inconsistent": bool(r.case.inconsistent), "source": r.case.source} for r in val],
    }
