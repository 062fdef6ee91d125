"""How far the module profile (``topotrain profile``, the default method) is from plain timings.

For each small case: the real torch module profiled with ``torch.profiler`` (per-layer forward/backward from
the recorded operators), beside (a) the same module's training step timed without the profiler (median of
``--repeats`` steps of ``time.perf_counter``), (b) the stand-in method's total for the same layers, and (c)
one layer's module timed alone. CPU by default (a GPU with ``--device cuda``)::

    PYTHONPATH=src .venv/bin/python benchmarks/module_profile_check.py --threads 1

Prints one line per case; every number is measured in that run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from topotrain.compute.module_profile import measure_module_profile
from topotrain.compute.profile import measure_profile
from topotrain.compute.torch_modules import build_module
from topotrain.workload.transformer import transformer
from topotrain.workload.zoo import get_model

CASES = (
    ("resnet50 112px", lambda: get_model("resnet50", image_size=112), 2, "layer3.0.conv2"),
    ("gpt2 1 block s128", lambda: get_model("gpt2", layers=1, seq_len=128), 2, "lm_head"),
    ("llama-shaped h256", lambda: transformer("llama-h256", layers=2, hidden=256, heads=8, kv_heads=2, seq_len=128,
                                              vocab=8192, gated_mlp=True, norm="rmsnorm", position="rotary",
                                              bias=False, flash_attention=True), 2, "layers.0.mlp_up"),
)


def _median(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    print(f"torch {torch.__version__}, device {a.device}, {torch.get_num_threads()} threads, fp32")
    for case, make, batch, layer in CASES:
        model = make()
        r = measure_module_profile(model, batch, a.device, dtype="fp32", steps=a.repeats, warmup=2)
        t = r.table
        built = build_module(torch, model, batch, dev, torch.float32)

        def step(built=built) -> None:
            built.net.zero_grad(set_to_none=True)
            built.net(*built.inputs).backward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        step()
        plain = _median(step, a.repeats)
        standin = measure_profile(model, batch, a.device, dtype="fp32", repeats=a.repeats, warmup=1).total_s
        mod = built.leaves[layer]
        holder: dict[str, object] = {}

        def grab(_m, inp, out, holder=holder) -> None:
            holder["in"], holder["out"] = inp, out

        h = mod.register_forward_hook(grab)
        step()
        h.remove()
        xs = tuple(x.detach().requires_grad_(x.is_floating_point()) for x in holder["in"])
        alone = _median(lambda mod=mod, xs=xs: mod(*xs), a.repeats)
        e = t.entries[layer]
        print(f"{case}, batch {batch}: profiled layers {t.total_s * 1e3:.1f} ms + unattributed backward "
              f"{r.unattributed_bwd_s * 1e3:.1f} ms vs the plain step {plain * 1e3:.1f} ms "
              f"(ratio {(t.total_s + r.unattributed_bwd_s) / plain:.2f}); stand-ins {standin * 1e3:.1f} ms; "
              f"{layer} forward profiled {e.fwd_s * 1e3:.2f} ms vs alone {alone * 1e3:.2f} ms "
              f"(ratio {e.fwd_s / alone:.2f}); {len(r.measured)}/{len(model.layers)} layers measured")


if __name__ == "__main__":
    main()
