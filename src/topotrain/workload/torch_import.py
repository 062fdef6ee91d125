"""Import a PyTorch ``nn.Module`` as a :class:`~topotrain.workload.layer.Model` (optional: needs torch).

The module is copied to the ``meta`` device (no memory, no real arithmetic) and run once forward and once
forward + backward under ``torch.utils.flop_counter.FlopCounterMode``, which counts the FLOPs of GEMMs,
convolutions and attention kernels (2 per multiply-add, as in the rest of topotrain) per module. If a
module cannot run on ``meta`` it is run on the CPU with the given input (keep it tiny).

Every module with parameters of its own becomes one :class:`Layer` (its FLOPs are those of its own ops,
children excluded); FLOPs of parameter-less modules and of functional calls (e.g. ``torch.matmul`` in an
attention ``forward``) go to one final ``other`` layer, so the model's total is FlopCounterMode's total.
Bytes come from forward hooks: forward = inputs + outputs + weights, backward ≈ twice that, stash = the
layer's inputs. Every count is divided by the batch (the first dimension of the first input).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind, Model

_FIX = "pip install torch==2.13.0"


def _kind(module: Any) -> LayerKind:
    cls = type(module).__name__.lower()
    if "conv" in cls:
        return LayerKind.CONV
    if "linear" in cls:
        return LayerKind.LINEAR
    if "norm" in cls:
        return LayerKind.NORM
    if "embedding" in cls:
        return LayerKind.EMBEDDING
    if "attention" in cls:
        return LayerKind.ATTENTION
    return LayerKind.OTHER


def _tensors(obj: Any) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def _nbytes(obj: Any) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in _tensors(obj))


def _trace(
    module: Any, inputs: tuple[Any, ...], device: str
) -> tuple[Any, dict[str, int], dict[str, int], dict[str, dict[str, Any]], bool]:
    """Copy ``module`` to ``device``; return (copy, fwd and fwd+bwd FLOPs per fqn, io per fqn, bwd ok)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    mod = copy.deepcopy(module).to(device)
    args = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    root = type(mod).__name__
    io: dict[str, dict[str, Any]] = {}
    hooks = []
    for path, sub in mod.named_modules():
        if not any(True for _ in sub.parameters(recurse=False)):
            continue
        key = f"{root}.{path}" if path else root

        def hook(m: Any, inp: Any, out: Any, key: str = key) -> None:
            rec = io.setdefault(key, {"in": 0, "out": 0, "in_shape": None, "out_shape": None})
            rec["in"] += _nbytes(inp)
            rec["out"] += _nbytes(out)
            ins, outs = _tensors(inp), _tensors(out)
            if rec["in_shape"] is None and ins and outs:
                rec["in_shape"], rec["out_shape"] = tuple(ins[0].shape), tuple(outs[0].shape)

        hooks.append(sub.register_forward_hook(hook))
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            mod(*args)
    finally:
        for h in hooks:
            h.remove()
    fwd = {k: int(sum(v.values())) for k, v in fc.get_flop_counts().items()}
    both = dict(fwd)
    ok = False
    try:
        with FlopCounterMode(display=False) as fc2:
            out = mod(*args)
            floats = [t for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
            if floats:
                sum(t.float().sum() for t in floats).backward()
                ok = True
        if ok:
            both = {k: int(sum(v.values())) for k, v in fc2.get_flop_counts().items()}
    except RuntimeError:
        ok = False
    return mod, fwd, both, io, ok


def _exclusive(counts: dict[str, int], key: str, children: Sequence[str]) -> int:
    return counts.get(key, 0) - sum(counts.get(c, 0) for c in children)


def from_torch(module: Any, example_input: Any, name: str = "torch-model", dtype: int | None = None) -> Model:
    """Trace ``module(example_input)`` (a tensor or a tuple of tensors; first dimension = batch) into a Model.

    ``dtype`` (bytes per element) defaults to the element size of the module's first parameter.
    """
    try:
        import torch
        import torch.utils.flop_counter  # noqa: F401
    except ImportError as exc:
        raise ConfigError("torch", f"PyTorch is needed to import a torch module ({exc})", _FIX) from exc
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            "module",
            f"expected a torch.nn.Module, got {type(module).__name__}",
            "pass the model object itself",
        )
    inputs = tuple(example_input) if isinstance(example_input, list | tuple) else (example_input,)
    if not inputs or not isinstance(inputs[0], torch.Tensor) or inputs[0].dim() == 0:
        raise ConfigError(
            "example_input",
            "expected a tensor (or tuple of tensors) with a batch dimension",
            "pass e.g. torch.randn(1, 3, 224, 224)",
        )
    batch = int(inputs[0].shape[0])
    try:
        mod, fwd, both, io, bwd_ok = _trace(module, inputs, "meta")
    except Exception:  # noqa: BLE001 - some ops have no meta kernel: fall back to a real (tiny) run
        try:
            mod, fwd, both, io, bwd_ok = _trace(module, inputs, "cpu")
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(
                "module",
                f"could not run the module on its example input: {exc}",
                "check that module(example_input) runs",
            ) from exc

    params = list(module.parameters())
    d = int(dtype) if dtype is not None else (int(params[0].element_size()) if params else 4)
    root = type(mod).__name__
    paths = dict(mod.named_modules())
    children = {
        p: [f"{root}.{p}.{c}" if p else f"{root}.{c}" for c, _ in m.named_children()]
        for p, m in paths.items()
    }
    seen: set[int] = set()
    layers: list[Layer] = []
    attributed_fwd = attributed_both = 0
    orig = dict(module.named_modules())
    for path, sub in paths.items():
        own = list(sub.parameters(recurse=False))
        if not own:
            continue
        key = f"{root}.{path}" if path else root
        f_fwd = _exclusive(fwd, key, children[path])
        f_both = _exclusive(both, key, children[path])
        attributed_fwd += f_fwd
        attributed_both += f_both
        # count parameters once even if shared (tied embeddings); the copy keeps sharing, so use originals
        orig_params = list(orig[path].parameters(recurse=False)) if path in orig else []
        count = 0
        for p in orig_params:
            if id(p) not in seen:
                seen.add(id(p))
                count += int(p.numel())
        w_bytes = float(sum(int(p.numel()) for p in own) * d)
        rec = io.get(key, {"in": 0, "out": 0, "in_shape": None, "out_shape": None})
        x, y = rec["in"] / batch, rec["out"] / batch
        bwd = (f_both - f_fwd) if bwd_ok else 2 * f_fwd
        layers.append(
            Layer(
                name=path or root,
                kind=_kind(sub),
                fwd_flops=f_fwd / batch,
                bwd_flops=bwd / batch,
                fwd_bytes=x + y + w_bytes,
                bwd_bytes=2 * (x + y) + 2 * w_bytes,
                param_count=count,
                activation_bytes=x,
                output_bytes=y,
                param_bytes=w_bytes,
                gemm_shape=_gemm_shape(sub, rec, batch),
                gemm_count=int(getattr(sub, "groups", 1)) if _kind(sub) == LayerKind.CONV else 1,
            )
        )
    rest_fwd = fwd.get("Global", 0) - attributed_fwd
    rest_both = both.get("Global", 0) - attributed_both
    if rest_fwd > 0 or rest_both > 0:
        rest_bwd = (rest_both - rest_fwd) if bwd_ok else 2 * rest_fwd
        layers.append(
            Layer(
                name="other" if "other" not in {la.name for la in layers} else "other_ops",
                kind=LayerKind.MATMUL,
                fwd_flops=rest_fwd / batch,
                bwd_flops=max(0, rest_bwd) / batch,
                fwd_bytes=0.0,
                bwd_bytes=0.0,
            )
        )
    first = inputs[0]
    image = first.is_floating_point() and first.dim() == 4
    return Model(
        name=name,
        layers=tuple(layers),
        dtype=d,
        sample_kind="image" if image else "sequence",
        seq_len=None if image or first.dim() < 2 else int(first.shape[1]),
        image_size=int(first.shape[-1]) if image else None,
    )


def _gemm_shape(sub: Any, rec: dict[str, Any], batch: int) -> tuple[int, int, int] | None:
    import torch

    ins, outs = rec.get("in_shape"), rec.get("out_shape")
    if ins is None or outs is None:
        return None
    if isinstance(sub, torch.nn.Linear):
        k = int(sub.in_features)
        rows = 1
        for s in ins[:-1]:
            rows *= int(s)
        return (max(1, rows // batch), int(sub.out_features), k)
    if isinstance(sub, torch.nn.Conv2d) and len(outs) == 4:
        g = int(sub.groups)
        kh, kw = sub.kernel_size
        return (int(outs[2]) * int(outs[3]), int(sub.out_channels) // g, int(sub.in_channels) // g * kh * kw)
    return None
