"""FP8 (Transformer Engine, compute/fp8.py) beside LLM Foundry's published H100 FP8 figure (docs/sources.md §7a,
"H100 80GB FP8": mpt-3b, 8 GPUs, micro-batch 10, 6 accumulation steps, batch 480, FULL_SHARD, 30,586 tokens/s
per GPU) and the bf16 row of the same model and batch shape (16 GPUs, micro-batch 10, batch 480: 24,142).
These rows are not in the published validation set; the scenario is built as its LLM Foundry H100 rows are.

Run: ``.venv/bin/python benchmarks/fp8.py`` (analytical network).
"""

from __future__ import annotations

from typing import Any

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate
from topotrain.validate.published import FOUNDRY_METRICS

MPT_3B: dict[str, Any] = {"type": "transformer", "name": "mpt-3b", "layers": 32, "hidden": 2560, "heads": 20,
                          "seq_len": 2048, "vocab": 50368, "flash_attention": True, "attention_unpad": True,
                          **FOUNDRY_METRICS}


def predict(gpus: int, dtype: str) -> float:
    """Tokens per second per GPU of mpt-3b at batch 480, micro-batch 10, FULL_SHARD, on ``gpus`` H100s."""
    sc = scenario_from_dict({"cluster": {"server": "dgx-h100", "servers": max(1, gpus // 8),
                                         "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}},
                             "model": MPT_3B, "batch": 480, "network": "analytical",
                             "plan": {"micro_batch": 10, "fsdp": True, "dtype": dtype}})
    return simulate(sc).tokens_per_s / gpus


def main() -> None:
    print(f"{'row':34} {'published':>9} {'predicted':>9} {'error':>7}")
    for label, gpus, dtype, published in (("mpt-3b 16xH100 bf16 b480 mb10", 16, "bf16", 24142.0),
                                          ("mpt-3b 8xH100 fp8 b480 mb10", 8, "fp8", 30586.0)):
        p = predict(gpus, dtype)
        print(f"{label:34} {published:9.0f} {p:9.0f} {100 * (p / published - 1):+6.1f}%")
    print(f"{'fp8 / bf16 (8 GPUs, predicted)':34} {'':9} {predict(8, 'fp8') / predict(8, 'bf16'):9.3f}")


if __name__ == "__main__":
    main()
