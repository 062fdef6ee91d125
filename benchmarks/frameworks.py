"""The framework's own mechanisms (plan.framework, training/framework.py) on the published rows whose source
names the framework's code: each such row predicted with and without its ``framework``, beside the figure.

Run: ``.venv/bin/python benchmarks/frameworks.py [--network analytical|flow]``. Rows: Megatron SC'21 Table 1
with ``--DDP-impl local`` (docs/sources.md §3c: Megatron-LM's own DDP at de7dc40f88, fp16, no contiguous
buffers) → ``megatron-lm-2021``. The published set holds no row that ran DeepSpeed's pipeline engine; the
second table shows the size of ``deepspeed``'s mechanisms on a plan shaped as BLOOM-176B's (TP4 PP12 DP8,
micro-batch 2, batch 2048, ZeRO-1, full recompute, on 48 DGX A100 of this catalog — the cluster is not
Jean Zay's, and no published figure is compared).
"""

from __future__ import annotations

import sys
from typing import Any

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate
from topotrain.validate.published import SC21_RUN, Case, cases, predicted

#: published rows → the framework their source names (the ``--DDP-impl local`` rows of SC'21 Table 1)
LOCAL_DDP = {p for p, (_, ddp, _) in SC21_RUN.items() if ddp == "local"}
BLOOM: dict[str, Any] = {
    "cluster": {"server": "nvswitch-8", "servers": 48, "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
    "model": "bloom-176b", "batch": 2048,
    "plan": {"tp": 4, "pp": 12, "micro_batch": 2, "recompute": "full", "zero_stage": 1}}


def framework_of(case: Case) -> str | None:
    """The framework a row's source says it ran (None: PyTorch DDP, or not named)."""
    if case.source != "Narayanan et al. SC'21 Table 1":
        return None
    billions = float(case.name.split()[1].rstrip("B"))
    return "megatron-lm-2021" if billions in LOCAL_DDP else None


def _predict(case: Case, network: str, fw: str | None) -> float:
    scenario: dict[str, Any] = {"network": network, **case.scenario}
    if fw is not None:
        scenario["plan"] = {**scenario["plan"], "framework": fw}
    return predicted(case, simulate(scenario_from_dict(scenario)))


def main() -> None:
    network = sys.argv[sys.argv.index("--network") + 1] if "--network" in sys.argv else "analytical"
    print(f"{'row':44} {'framework':17} {'published':>9} {'before':>8} {'err':>7} {'after':>8} {'err':>7}")
    for case in cases():
        fw = framework_of(case)
        if fw is None:
            continue
        before, after = _predict(case, network, None), _predict(case, network, fw)
        e0, e1 = 100 * (before / case.published - 1), 100 * (after / case.published - 1)
        print(f"{case.name:44} {fw:17} {case.published:9.1f} {before:8.1f} {e0:+6.1f}% {after:8.1f} {e1:+6.1f}%")
    print()
    print(f"{'BLOOM-176B-shaped plan':44} {'iteration s':>11} {'TFLOP/s/GPU':>11} {'exposed comm s':>14}")
    for fw, extra in ((None, {}), ("deepspeed", {}), ("deepspeed", {"grad_reduce_dtype": "fp32"})):
        plan = {**BLOOM["plan"], **extra, **({"framework": fw} if fw else {})}
        r = simulate(scenario_from_dict({**BLOOM, "network": network, "plan": plan}))
        label = f"framework {fw or 'none'}" + (" grad_reduce_dtype fp32" if extra else "")
        print(f"{label:44} {r.iteration_time_s:11.3f} {r.tflops_per_gpu:11.1f} {r.breakdown.exposed_comm_s:14.3f}")


if __name__ == "__main__":
    main()
