"""Context parallelism's figures: K,V bytes per ring step, the compute split, and the Llama-3-405B 128K plan.

Run: ``.venv/bin/python benchmarks/context_parallel.py [--full]`` — one figure per line (analytical network
model; ``--full`` adds all 16,384 GPUs of Llama 3's long-context run, ~1 min). The tests check the closed
forms (``tests/test_context_parallel.py``); this prints the numbers docs/validation.md quotes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import topotrain as tt
from topotrain.workload.context_parallel import kv_chunk_bytes
from topotrain.workload.zoo import get_model

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "llama3-405b-cp.yaml"
SMALL = {"type": "transformer", "name": "small-llama", "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8,
         "seq_len": 32768, "vocab": 32000, "flash_attention": True, "activation": "swiglu", "ffn_hidden": 14336,
         "norm": "rmsnorm", "position": "rotary", "bias": False, "tie_embeddings": False}


def _fwd_bwd_s(r: tt.Result) -> float:
    return sum(t.end_s - t.start_s - t.blocking_s for t in r.tasks
               if t.category in ("forward", "backward") and t.stage == 0)


def _small(cp: int) -> tt.Result:
    return tt.simulate(tt.scenario_from_dict({
        "cluster": {"server": "dgx-h100", "servers": cp,
                    "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}},
        "model": SMALL, "batch": 8, "plan": {"cp": cp, "micro_batch": 1}, "network": "analytical"}))


def _line(name: str, r: tt.Result) -> None:
    b = r.breakdown
    print(f"{name} iteration_s {r.iteration_time_s:.3f} tflops_per_gpu {r.tflops_per_gpu:.1f} mfu {r.mfu:.3f} "
          f"compute_s {b.compute_s:.3f} blocking_s {b.tp_comm_s:.3f} exposed_comm_s {b.exposed_comm_s:.3f} "
          f"bubble_s {b.bubble_s:.3f} memory_gib {r.peak_memory_bytes / 2**30:.2f}")


def main() -> int:
    for name, seq in (("llama3-70b", 131072), ("llama3-405b", 131072)):
        m = get_model(name, seq_len=seq)
        for cp in (8, 16):
            print(f"kv_chunk_bytes {name} seq {seq} cp {cp} tp 8: {kv_chunk_bytes(m, cp, 8):.0f}")
    base = _small(1)
    for cp in (2, 4, 8):
        r = _small(cp)
        print(f"fwd+bwd with cp {cp} / (without / cp), 32K tokens: {_fwd_bwd_s(r) / (_fwd_bwd_s(base) / cp):.4f}")
        print(f"iteration with cp {cp} / (without / cp), 32K tokens: "
              f"{r.iteration_time_s / (base.iteration_time_s / cp):.4f}")
    for network in ("analytical", "flow"):
        _line(f"example llama3-405b-cp {network}", tt.simulate(tt.load_scenario(EXAMPLE, [f"network={network}"])))
    if "--full" in sys.argv:
        _line("llama3-405b-cp 16384 GPUs analytical", tt.simulate(tt.load_scenario(
            EXAMPLE, ["network=analytical", "cluster.servers=2048", "batch=128"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
