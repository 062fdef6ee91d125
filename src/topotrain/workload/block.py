"""The layer builder every transformer is assembled with (:mod:`topotrain.workload.transformer`,
:mod:`topotrain.workload.moe`): it appends :class:`~topotrain.workload.layer.Layer` s with the counting
conventions of :mod:`topotrain.workload.layer` (GEMMs at 2 FLOPs a multiply-add, backward 2× forward,
bytes read + written at the model dtype, per sample)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topotrain.workload.layer import Layer, LayerKind, TPSplit

NORM_FLOPS = {"layernorm": 8.0, "rmsnorm": 4.0}
NORM_PARAMS = {"layernorm": 2, "rmsnorm": 1}


@dataclass
class LayerBuilder:
    """Accumulates the layers of one model; knows the shape constants."""

    s: int
    h: int
    d_bytes: int
    norm: str
    layers: list[Layer] = field(default_factory=list)
    block: int = -1

    def add(
        self,
        name: str,
        kind: LayerKind,
        fwd_flops: float,
        bwd_flops: float,
        fwd_bytes: float,
        bwd_bytes: float,
        tp: TPSplit,
        **kw: Any,
    ) -> None:
        kw.setdefault("block", self.block)
        self.layers.append(
            Layer(
                name=name,
                kind=kind,
                fwd_flops=float(fwd_flops),
                bwd_flops=float(bwd_flops),
                fwd_bytes=float(fwd_bytes),
                bwd_bytes=float(bwd_bytes),
                tp_split=tp,
                **kw,
            )
        )

    def linear(
        self,
        name: str,
        m: int,
        n: int,
        k: int,
        *,
        bias: bool,
        tp: TPSplit,
        stash: bool = True,
        tied: bool = False,
        kind: LayerKind = LayerKind.LINEAR,
        count: int = 1,
        rows: float | None = None,
        **kw: Any,
    ) -> None:
        """``count`` GEMMs of ``m×k @ k×n`` (``count`` > 1: experts, each with its own weights).

        ``rows`` is the exact number of input rows over all ``count`` GEMMs when it is not ``count·m``
        (``m`` is then the rounded per-GEMM shape reported in ``gemm_shape``)."""
        d = self.d_bytes
        r = float(count * m) if rows is None else rows
        weights = 0 if tied else count * n * k
        params = weights + (count * n if bias else 0)
        w_bytes = d * count * n * k  # a tied weight is still read
        fwd = 2.0 * r * n * k + (r * n if bias else 0.0)
        x, y = r * k, r * n
        self.add(
            name,
            kind,
            fwd,
            2.0 * fwd,
            d * (x + y) + w_bytes,
            d * (2 * x + 2 * y) + 2 * w_bytes,
            tp,
            param_count=params,
            param_bytes=float(w_bytes),
            activation_bytes=float(d * x if stash else 0),
            output_bytes=float(d * y),
            gemm_shape=(m, n, k),
            gemm_count=count,
            **kw,
        )

    def elementwise(
        self,
        name: str,
        n_in: int,
        n_out: int,
        flops_per_out: float,
        *,
        tp: TPSplit,
        stash_bytes: float = 0.0,
        kind: LayerKind = LayerKind.ELEMENTWISE,
        **kw: Any,
    ) -> None:
        d = self.d_bytes
        f = flops_per_out * n_out
        self.add(
            name,
            kind,
            f,
            f,
            d * (n_in + n_out),
            d * (n_in + n_out + n_out),
            tp,
            activation_bytes=float(stash_bytes),
            output_bytes=float(d * n_out),
            **kw,
        )

    def norm_layer(self, name: str, tokens: int, tp: TPSplit = TPSplit.REPLICATED) -> None:
        d, n = self.d_bytes, tokens * self.h
        params = NORM_PARAMS[self.norm] * self.h
        f = NORM_FLOPS[self.norm] * n
        self.add(
            name,
            LayerKind.NORM,
            f,
            2.0 * f,
            d * (2 * n + params),
            d * (3 * n + 2 * params),
            tp,
            param_count=params,
            param_bytes=float(d * params),
            activation_bytes=float(d * n),
            output_bytes=float(d * n),
            row_elems=self.h,
        )

    def dropout(
        self, name: str, n: int, tp: TPSplit = TPSplit.REPLICATED, stash_output: bool = False
    ) -> None:
        """Dropout stashes its 1-byte mask; ``stash_output`` also counts its output for the next GEMM."""
        d = self.d_bytes
        stash = n + (d * n if stash_output else 0)
        self.add(
            name,
            LayerKind.DROPOUT,
            n,
            n,
            2 * d * n + n,
            2 * d * n + n,
            tp,
            activation_bytes=float(stash),
            output_bytes=float(d * n),
        )
