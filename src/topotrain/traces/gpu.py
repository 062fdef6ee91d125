"""What-if on a GPU: a recorded (CPU) job's operators re-timed on another device by topotrain's compute
model, as Lumos and dPRO re-time a recorded graph's operators for a what-if (Liang et al., MLSys 2025, §4;
Hu et al., MLSys 2022, §5).

Each kernel the Execution Trace lets :mod:`topotrain.traces.work` recognize (GEMMs, convolutions, fused
attention, element-wise ops, norms, softmax, embedding, the loss) is timed by the roofline of
:func:`topotrain.compute.roofline.layer_time_s` on the GPU — ``max(FLOPs / (peak · efficiency(shape)),
bytes / (HBM bandwidth · efficiency)) + kernels · launch overhead`` — at the precision its tensors were
recorded in (4-byte elements: ``fp32``, 2-byte: ``bf16``). The rule for the rest, stated:

* a collective's launch call (``c10d::*``) costs one kernel launch, as NCCL enqueues one kernel;
* the part of an operator that no recognized kernel covers (ATen ops the model does not know, the
  dispatcher, autograd and Python time inside the operator) **keeps its measured time** — host work a GPU
  does not take away;
* host gaps between operators keep their measured time too;
* an operator becomes ``Σ GPU kernel times + (measured − Σ measured kernel times)``, run serially on the
  rank's thread (no overlap of host work with the GPU's queue: an upper end for a launch-bound step), and
  the collectives it launches keep their place in proportion;
* every rank starts at once: the recorded offsets between the ranks' step starts are the recording host's
  (its scheduler, its Python) and are dropped.

:class:`Rescale` reports per kernel kind how many kernels and what share of the measured time were
re-timed, and what share was kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from topotrain.compute.roofline import ComputeParams, layer_time_s, params_for_gpu
from topotrain.hardware.gpus import GPUSpec
from topotrain.traces.model import Kernel, RankTrace, TraceJob, TraceOp
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind

#: Recorded element size → the dtype the GPU runs the kernel in.
DTYPE_OF_ELEM = {4: "fp32", 2: "bf16", 8: "fp64", 1: "fp8"}


@dataclass(frozen=True)
class KindShare:
    """One kernel kind's part of the job (summed over ranks): kernels, measured seconds, seconds on the GPU."""

    kind: str
    kernels: int
    measured_s: float
    gpu_s: float


@dataclass(frozen=True)
class Rescale:
    """How a job was re-timed on ``gpu``: per kind, and what was kept at its measured time (seconds summed
    over every rank: ``kept_op_s`` the operators' unrecognized part, ``kept_gap_s`` the host gaps)."""

    gpu: str
    kinds: tuple[KindShare, ...]
    kept_op_s: float
    kept_gap_s: float
    ops_without_kernel: int
    ops: int
    #: FLOPs of the recognized kernels of one rank (the largest over the ranks)
    flops_per_rank: float
    #: the operators whose kept (unrecognized) time is largest: (name, seconds summed over ranks), at most 5
    kept_top: tuple[tuple[str, float], ...] = ()

    @property
    def measured_s(self) -> float:
        return sum(k.measured_s for k in self.kinds) + self.kept_op_s + self.kept_gap_s

    @property
    def rescaled_fraction(self) -> float:
        """Share of the measured operator and host-gap time that the compute model re-timed."""
        total = self.measured_s
        return sum(k.measured_s for k in self.kinds) / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        total = self.measured_s or 1.0
        return {"gpu": self.gpu, "rule": "recognized kernels timed by the roofline on the GPU; the rest of each "
                "operator and the host gaps keep their measured time",
                "rescaled_fraction": self.rescaled_fraction,
                "kinds": {k.kind: {"kernels": k.kernels, "measured_s": k.measured_s, "gpu_s": k.gpu_s,
                                   "fraction_of_measured": k.measured_s / total} for k in self.kinds},
                "kept": {"operators_unrecognized_s": self.kept_op_s, "host_gaps_s": self.kept_gap_s,
                         "fraction_of_measured": (self.kept_op_s + self.kept_gap_s) / total,
                         "operators_without_any_kernel": self.ops_without_kernel, "operators": self.ops,
                         "largest": dict(self.kept_top)},
                "flops_per_rank": self.flops_per_rank}


def kernel_time_s(k: Kernel, gpu: GPUSpec, params: ComputeParams | None = None) -> float:
    """Seconds of one recognized kernel on ``gpu`` by the roofline (one layer pass of its FLOPs, bytes and
    GEMM shape; attention's backward costed as a backward pass)."""
    if k.kind == "launch":  # a collective handed to NCCL: one kernel launch (traces/work.py)
        return (params or params_for_gpu(gpu)).kernel_launch_overhead_s
    dtype = DTYPE_OF_ELEM.get(k.elem_bytes, "fp32")
    shape = (k.dims[1], k.dims[2], k.dims[3]) if len(k.dims) == 4 else None
    count = k.dims[0] if len(k.dims) == 4 else 1
    layer = Layer(k.name, LayerKind(k.kind), k.flops, k.flops, k.bytes, k.bytes, gemm_shape=shape, gemm_count=count)
    if k.kind == "attention" and k.backward:
        fwd = Layer(k.name, LayerKind.ATTENTION, k.flops, k.flops, k.bytes, k.bytes, gemm_shape=shape,
                    gemm_count=count)
        return layer_time_s(fwd, gpu, 1, phase="bwd", dtype=dtype, params=params)
    return layer_time_s(layer, gpu, 1, phase="fwd", dtype=dtype, params=params)


def _op_on_gpu(op: TraceOp, gpu: GPUSpec, params: ComputeParams | None,
               cache: dict[Kernel, float]) -> tuple[TraceOp, float]:
    """``op`` re-timed (module docstring): its new duration, launches at the same share of it; and the
    measured seconds its kernels cover."""
    if not op.kernels:
        return op, 0.0
    gpu_s = 0.0
    for k in op.kernels:
        t = cache.get(k)
        if t is None:
            t = cache[k] = kernel_time_s(k, gpu, params)
        gpu_s += t
    covered = min(op.duration_s, sum(k.measured_s for k in op.kernels))
    new = gpu_s + op.duration_s - covered
    ratio = new / op.duration_s if op.duration_s > 0 else 1.0
    return replace(op, duration_s=new, launches=tuple((c, at * ratio) for c, at in op.launches)), covered


def on_gpu(job: TraceJob, gpu: GPUSpec, params: ComputeParams | None = None) -> tuple[TraceJob, Rescale]:
    """``job`` with every operator re-timed on ``gpu`` (module docstring), and the report of what was."""
    if not any(o.kernels for r in job.ranks for o in r.ops):
        raise ConfigError("workload", f"{job.name or 'the job'} has no operator the compute model knows (its "
                          "Execution Trace was missing or carried no tensors)",
                          "import the trace with each rank's Execution Trace (ExecutionTraceObserver)")
    cache: dict[Kernel, float] = {}
    per_kind: dict[str, list[float]] = {}
    kept_op = kept_gap = 0.0
    bare = count = 0
    flops = 0.0
    kept_by_name: dict[str, float] = {}
    ranks = []
    for r in job.ranks:
        ops = []
        rank_flops = 0.0
        for o in r.ops:
            new, covered = _op_on_gpu(o, gpu, params, cache)
            ops.append(new)
            kept_op += o.duration_s - covered
            kept_by_name[o.name] = kept_by_name.get(o.name, 0.0) + o.duration_s - covered
            kept_gap += o.host_gap_s
            count += 1
            bare += not o.kernels
            spans = sum(k.measured_s for k in o.kernels)
            share = covered / spans if spans > covered else 1.0  # a kernel's span may hold a wait the import cut
            for k in o.kernels:
                row = per_kind.setdefault(k.kind, [0, 0.0, 0.0])
                row[0] += 1
                row[1] += k.measured_s * share
                row[2] += cache[k]
                rank_flops += k.flops
        flops = max(flops, rank_flops)
        ranks.append(RankTrace(r.rank, 0.0, r.step_s, tuple(ops), r.source))
    kinds = tuple(KindShare(k, int(v[0]), v[1], v[2]) for k, v in sorted(per_kind.items()))
    return (replace(job, ranks=tuple(ranks), name=f"{job.name} on {gpu.name}"),
            Rescale(gpu.name, kinds, kept_op, kept_gap, bare, count, flops,
                    tuple(sorted(kept_by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:5])))
