"""Where the A100 rows' time goes when no GEMM ceiling is fitted to training rows (issue 34: the A100 gap).

Run: ``.venv/bin/python benchmarks/a100_gap.py [--solve] [--rows SUBSTRING]`` (about 1 min; ``--solve`` about
10 min). A diagnostic: it changes no default and fits nothing that a prediction reads.

With the A100's GEMM ceiling at its Maximum Achievable Matmul FLOPS (0.869, docs/sources.md §11: a kernel
measurement, no training row) the Megatron-LM SC'21 and NVIDIA BERT A100 rows are predicted 9–30 % too fast
(docs/validation.md §8). This prints, for every published A100 row under that variant:

1. the step's parts as the engine reports them (compute, tensor-parallel all-reduces, pipeline bubble, exposed
   data-parallel communication) and the compute's split by kind: the dense GEMMs (``linear``, the logits
   included), the unfused attention's batched GEMMs (``matmul``: ``QKᵀ`` and ``softmax·V``, k = head dim or s),
   and the memory-bound kernels (softmax, dropout, element-wise, norms, loss, embedding), each counted as the
   micro-batch runs it (forward twice under full recomputation);
2. the achieved TFLOP/s the compute model gives each GEMM shape of one transformer block (per TP rank), so the
   attention GEMMs' efficiency can be read beside any per-shape A100 measurement;
3. the model's bus bandwidth for the row's tensor-parallel all-reduce (``b·s·h`` fp16 bytes, ring over the
   eight GPUs of one DGX A100, analytical network) beside the measured nccl-tests busbw of eight A100s on
   NVSwitch, 232.5 GB/s (docs/sources.md §4);
4. with ``--solve``: what each row *would need* to be predicted exactly, one mechanism at a time — the GEMM
   ceiling alone (``gemm_max_efficiency``), or a slowdown of all memory traffic alone (``memory_efficiency``
   0.85 divided by the factor). A mechanism that lives in GEMMs needs the same ceiling on every row; one that
   lives in memory-bound kernels needs the same factor. These solved values are **diagnostics of what the
   missing mechanism must look like, not parameters**: nothing reads them (calibration on training rows is
   what issue 34 rules out).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import gemm_mechanisms as gm  # noqa: E402  (the benchmark next to this one: the A100 ceiling override)
from topotrain.api import load_cluster, time_collective  # noqa: E402
from topotrain.compute.roofline import gemm_efficiency, local_gemm_dims  # noqa: E402
from topotrain.scenario.load import scenario_from_dict  # noqa: E402
from topotrain.training.simulate import compute_model_of, simulate  # noqa: E402
from topotrain.validate.published import Case, cases, predicted, with_compute_params  # noqa: E402
from topotrain.workload.layer import LayerKind  # noqa: E402

#: nccl-tests ``all_reduce_perf`` busbw, 8x A100 on NVSwitch (NVIDIA/nccl-tests #175; docs/sources.md §4)
MEASURED_A100_BUSBW = 232.54e9
MEMORY_KINDS = (LayerKind.SOFTMAX, LayerKind.DROPOUT, LayerKind.ELEMENTWISE, LayerKind.NORM, LayerKind.LOSS,
                LayerKind.EMBEDDING, LayerKind.CONCAT, LayerKind.POOL, LayerKind.OTHER)


def a100_cases(only: str = "") -> list[Case]:
    """The published rows run on A100s (their scenario names an A100 or a DGX A100 server)."""
    out = []
    for c in cases():
        sc = scenario_from_dict({"network": "analytical", **c.scenario})
        if sc.cluster.gpu_spec.name.startswith("a100") and only in c.name:
            out.append(c)
    return out


def error(c: Case, params: dict[str, Any] | None = None) -> tuple[float, Any]:
    sc = scenario_from_dict({"network": "analytical", **with_compute_params(c.scenario, params)})
    r = simulate(sc)
    return predicted(c, r) / c.published - 1.0, r


def kind_shares(c: Case) -> dict[str, float]:
    """The share of one micro-batch's compute per class of layer, as the roofline times it."""
    sc = scenario_from_dict({"network": "analytical", **c.scenario})
    model, plan = sc.model, sc.plan
    fwd, bwd = compute_model_of(sc).layer_times(model, plan.micro_batch_size, plan.tp)
    rerun = 2.0 if plan.recompute == "full" else 1.0
    agg: dict[str, float] = defaultdict(float)
    for lay, tf, tb in zip(model.layers, fwd, bwd, strict=True):
        if lay.kind == LayerKind.MATMUL:
            key = "attn-gemm"
        elif lay.kind in (LayerKind.LINEAR, LayerKind.CONV):
            key = "gemm"
        elif lay.kind in MEMORY_KINDS:
            key = "memory-bound"
        else:
            key = lay.kind.value
        agg[key] += rerun * tf + tb
    total = sum(agg.values())
    return {k: v / total for k, v in agg.items()}


def block_gemms(c: Case) -> list[str]:
    """Achieved TFLOP/s of the first block's GEMMs (forward shape, per TP rank) under the current catalog."""
    sc = scenario_from_dict({"network": "analytical", **c.scenario})
    model, plan = sc.model, sc.plan
    gpu = sc.cluster.gpu_spec
    out = []
    for lay in model.layers:
        if lay.block != 0 or lay.kind not in (LayerKind.LINEAR, LayerKind.MATMUL):
            continue
        dims = local_gemm_dims(lay, plan.micro_batch_size, plan.tp)
        if dims is None:
            continue
        cnt, m, n, k = dims
        eff = gemm_efficiency(cnt, m, n, k, gpu, plan.dtype)
        out.append(f"{lay.name.split('.')[-1]} {cnt}x{m}x{n}x{k} {eff * gpu.peak(plan.dtype) / 1e12:.0f}")
    return out


def tp_busbw(c: Case) -> tuple[float, float] | None:
    """The model's ring all-reduce busbw for the row's TP message (bytes, busbw), or None at TP 1."""
    sc = scenario_from_dict({"network": "analytical", **c.scenario})
    tp = sc.plan.tp
    if tp <= 1:
        return None
    size = int(sc.plan.micro_batch_size * sc.model.seq_len * sc.model.hidden * 2)
    cluster = load_cluster({"server": "nvswitch-8", "servers": 1})
    rep = time_collective(cluster, "allreduce", "ring", size, "analytical",
                          ranks=list(cluster.topology.gpus[:tp]))
    return size, size / rep.time_s * 2 * (tp - 1) / tp


def solve(c: Case, key: str, lo: float, hi: float, make: Any, iters: int = 12) -> float:
    """The value of ``key`` in [lo, hi] at which the row's error is 0 (bisection; the error falls as it rises
    for a ceiling, so ``make`` maps the value to compute params)."""
    e_lo, _ = error(c, make(lo))
    e_hi, _ = error(c, make(hi))
    if e_lo * e_hi > 0:
        return float("nan")
    for _ in range(iters):
        mid = (lo + hi) / 2
        e_mid, _ = error(c, make(mid))
        if (e_mid > 0) == (e_lo > 0):
            lo, e_lo = mid, e_mid
        else:
            hi = mid
    return (lo + hi) / 2


def main() -> None:
    only = sys.argv[sys.argv.index("--rows") + 1] if "--rows" in sys.argv else ""
    saved = gm._with_a100_ceiling(gm.A100_MAMF)
    try:
        rows = a100_cases(only)
        print("A100 at its MAMF (0.869), analytical network; step parts in s; compute split by kind")
        print(f"{'row':40s} {'error':>7s} {'step':>7s} {'compute':>7s} {'tp':>6s} {'bubble':>6s} {'dp':>6s}  "
              f"{'gemm':>5s} {'attn':>5s} {'mem':>5s}")
        for c in rows:
            e, r = error(c)
            b = r.breakdown
            sh = kind_shares(c)
            print(f"{c.name:40s} {100 * e:+6.1f}% {r.iteration_time_s:7.2f} {b.compute_s:7.2f} {b.tp_comm_s:6.2f} "
                  f"{b.bubble_s:6.2f} {b.exposed_comm_s:6.2f}  {100 * sh.get('gemm', 0):4.1f}% "
                  f"{100 * sh.get('attn-gemm', 0):4.1f}% {100 * sh.get('memory-bound', 0):4.1f}%")
        print("\nBlock 0's GEMMs, forward shape per TP rank (count x M x N x K: TFLOP/s the compute model gives)")
        for c in rows:
            print(f"  {c.name:40s} " + "; ".join(block_gemms(c)))
        print(f"\nTP all-reduce: the model's ring busbw beside nccl-tests' 8x A100 NVSwitch "
              f"{MEASURED_A100_BUSBW / 1e9:.1f} GB/s")
        for c in rows:
            got = tp_busbw(c)
            if got is not None:
                size, bw = got
                print(f"  {c.name:40s} {size / 2**20:7.1f} MiB  {bw / 1e9:6.1f} GB/s  "
                      f"({100 * (bw / MEASURED_A100_BUSBW - 1):+.1f}%)")
        if "--solve" in sys.argv:
            print("\nWhat each row would need, one mechanism alone (diagnostic; nothing reads these):")
            print(f"{'row':40s} {'GEMM ceiling':>12s} {'memory-traffic slowdown':>24s}")
            for c in rows:
                ceil = solve(c, "gemm_max_efficiency", 0.40, gm.A100_MAMF,
                             lambda v: {"gemm_max_efficiency": v})
                slow = solve(c, "memory_efficiency", 1.0, 4.0,
                             lambda v: {"memory_efficiency": 0.85 / v})
                print(f"{c.name:40s} {ceil:12.3f} {slow:23.2f}x", flush=True)
    finally:
        gm.catalog_gpus.GPUS.update(saved)


if __name__ == "__main__":
    main()
