"""Issue 35's last pieces on example plans (no published figure is compared: these are the sizes of the new
mechanisms, not validation rows).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/moe_fsdp.py [--network analytical|flow]``. Three tables:

1. Mixtral 8x7B at 32K tokens on 8 DGX H100 (TP2, EP8): without and with context parallelism (CP×EP, the expert
   groups drawn from dp·cp ranks as Megatron-Core draws them), iteration time and memory per GPU.
2. Mixtral 8x7B at 4K tokens on 8 DGX H100 (TP2, EP8, DP32): dropless against capacity factors with padding.
3. Llama-2-7B on 8 DGX H100 (DP64): ``fsdp: true`` (chunk granularity) against ``framework: fsdp`` and ``hsdp``
   with a shard group of one server (8).
"""

from __future__ import annotations

import sys
from typing import Any

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate

GiB = 2**30
CLUSTER = {"server": "dgx-h100", "servers": 8, "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}}


def _run(model: Any, batch: int, plan: dict[str, Any], network: str) -> tuple[float, float, str]:
    try:
        sc = scenario_from_dict({"cluster": CLUSTER, "model": model, "batch": batch, "plan": plan, "network": network})
        r = simulate(sc)
    except Exception as e:  # a plan that does not fit is a row of the table, not a failure of the script
        return float("nan"), float("nan"), str(e).splitlines()[0][:90]
    return r.iteration_time_s, r.memory["total_bytes"] / GiB, ""


def main(network: str = "analytical") -> None:
    mixtral32k = {"name": "mixtral-8x7b", "seq_len": 32768}
    print("1. Mixtral 8x7B, 32K tokens, 64 H100, TP2 EP8, micro-batch 1, batch 64, full recompute")
    for plan in ({"tp": 2, "ep": 8, "recompute": "full"}, {"tp": 2, "cp": 2, "ep": 8, "recompute": "full"},
                 {"tp": 2, "cp": 4, "ep": 8, "recompute": "full"}):
        t, mem, err = _run(mixtral32k, 64, {"micro_batch": 1, **plan}, network)
        print(f"   cp={plan.get('cp', 1)}: {t:.3f} s/iteration, {mem:.1f} GiB per GPU {err}")
    print("2. Mixtral 8x7B, 4K tokens, 64 H100, TP2 EP8 DP32, batch 256, micro-batch 1, full recompute")
    for extra in ({}, {"capacity_factor": 1.0}, {"capacity_factor": 1.0, "pad_to_capacity": True},
                  {"capacity_factor": 1.25, "pad_to_capacity": True},
                  {"capacity_factor": 2.0, "pad_to_capacity": True}):
        t, mem, err = _run({"name": "mixtral-8x7b", **extra}, 256,
                           {"tp": 2, "ep": 8, "micro_batch": 1, "recompute": "full"}, network)
        print(f"   {extra or 'dropless'}: {t:.3f} s/iteration, {mem:.1f} GiB per GPU {err}")
    print("3. Llama-2-7B, 64 H100, batch 512, micro-batch 2")
    for plan in ({"fsdp": True}, {"framework": "fsdp"}, {"framework": "hsdp", "shard_group": 8}):
        t, mem, err = _run("llama2-7b", 512, {"micro_batch": 2, **plan}, network)
        print(f"   {plan}: {t:.3f} s/iteration, {mem:.1f} GiB per GPU {err}")


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--network") + 1] if "--network" in sys.argv else "analytical")
