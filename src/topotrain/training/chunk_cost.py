"""The values the iteration builder (:mod:`topotrain.training.builder`) computes per model chunk and returns:
one chunk's costs for one micro-batch (:class:`ChunkCost`), the built iteration (:class:`BuiltIteration`),
and two small pure helpers (a collective hidden behind a GEMM, a layer's parameters on one rank)."""

from __future__ import annotations

from dataclasses import dataclass, field

from topotrain.training.engine import Blocking, TaskGraph
from topotrain.workload.layer import Layer, TPSplit


def _hidden_by(gemm_s: float, chunks: int) -> tuple[float, float, int] | None:
    """The :class:`Blocking` overlap of *one* collective of ``c`` seconds pipelined with one GEMM of
    ``gemm_s`` in ``chunks`` pieces: ``max(c / chunks, c - gemm_s)`` exposed, written as the engine's two
    halves each hidden by ``gemm_s / 2``; None (fully exposed) when ``chunks`` is 0."""
    if chunks <= 0:
        return None
    return (gemm_s / 2.0, gemm_s / 2.0, chunks)


@dataclass(frozen=True)
class ChunkCost:
    """Costs of one model chunk for one micro-batch, on one tensor-parallel rank."""

    layers: tuple[int, ...]
    fwd_s: float
    bwd_s: float
    recompute_s: float
    fwd_blocking: tuple[Blocking, ...]  # TP/EP collectives of the forward, in order
    bwd_blocking: tuple[Blocking, ...]  # those of the (recomputed forward and) backward, in order
    out_bytes: float
    bucket_bwd_fraction: tuple[float, ...]
    bucket_bytes: tuple[int, ...]
    params_local: float
    #: one gradient-accumulation pass over the chunk's local gradients (0: none; see the module docstring)
    grad_accum_s: float = 0.0


@dataclass
class BuiltIteration:
    graph: TaskGraph
    devices: int
    chunks: list[ChunkCost]
    compute_s_by_device: list[float] = field(default_factory=list)


def _local_params(layer: Layer, tp: int, ep: int) -> float:
    p = float(layer.param_count)
    if layer.tp_split in (TPSplit.COLUMN, TPSplit.ROW):
        p /= tp
    if layer.expert:
        p /= ep
    return p
