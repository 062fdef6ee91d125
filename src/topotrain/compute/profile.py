"""Measured per-layer times: a :class:`ProfileTable`, its files, a compute model that uses it, and a
micro-benchmark (:func:`measure_profile`) that fills it with torch.

A table holds, per layer name, the forward and backward seconds of one micro-batch of ``batch`` samples on
one tensor-parallel rank (``tp``) of a GPU, plus optionally the layer's FLOPs and HBM bytes at that batch
(needed by the cross-GPU prediction of :mod:`topotrain.compute.crossgpu`).

File formats (``load_profile`` / ``save_profile`` choose by extension):

* JSON::

    {"format": "topotrain-profile", "version": 1, "gpu": "a100-80gb", "dtype": "bf16", "device": "cuda",
     "batch": 32, "tp": 1, "model": "resnet50",
     "layers": [{"name": "conv1", "fwd_s": 1.2e-4, "bwd_s": 2.5e-4, "fwd_flops": ..., "bwd_flops": ...,
                 "fwd_bytes": ..., "bwd_bytes": ...}, ...]}

* CSV: ``# key=value`` metadata lines (``gpu`` and ``batch`` required), then a header with at least
  ``name,fwd_s,bwd_s`` (optionally ``fwd_flops,bwd_flops,fwd_bytes,bwd_bytes``), one row per layer.

Batch scaling (:class:`ProfiledModel`): a layer measured at batch ``b0`` is taken to cost ``T·b/b0`` at
batch ``b`` — exact for kernels that already fill the GPU, pessimistic when scaling up from a batch too
small to fill it, optimistic when scaling down. Profile at the micro-batch you simulate when you can.
Tensor-parallel split layers measured at ``tp0`` cost ``T·tp0/tp`` at ``tp``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from topotrain.compute.roofline import ComputeModel, is_split
from topotrain.hardware.gpus import normalize_dtype
from topotrain.util import progress, yamlio
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind, Model

FORMAT = "topotrain-profile"
VERSION = 1
_COUNT_KEYS = ("fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes")
TORCH_FIX = "pip install torch==2.13.0"


@dataclass(frozen=True)
class ProfileEntry:
    """Measured seconds of one layer (forward, backward) and, optionally, its FLOPs and bytes at the
    table's batch and tp (``None``: unknown)."""

    fwd_s: float
    bwd_s: float
    fwd_flops: float | None = None
    bwd_flops: float | None = None
    fwd_bytes: float | None = None
    bwd_bytes: float | None = None

    @property
    def has_counts(self) -> bool:
        return all(getattr(self, k) is not None for k in _COUNT_KEYS)


@dataclass(frozen=True)
class ProfileTable:
    """Per-layer measured times on ``gpu`` (a catalog name, or ``"cpu"``) at ``dtype``, micro-batch ``batch``
    and tensor-parallel degree ``tp``. ``device`` says where it was measured (``"cuda"``, ``"cpu"``, or a
    label such as ``"cuda:NVIDIA H100 80GB HBM3"``; a predicted table says ``"predicted from ..."``)."""

    gpu: str
    batch: int
    entries: Mapping[str, ProfileEntry] = field(hash=False)
    dtype: str = "bf16"
    device: str = ""
    tp: int = 1
    model: str = ""

    def __post_init__(self) -> None:
        f = "compute.profile"
        if not isinstance(self.gpu, str) or not self.gpu.strip():
            raise ConfigError(
                f"{f}.gpu", "a profile needs the GPU it was measured on", "set gpu, e.g. a100-80gb"
            )
        for name in ("batch", "tp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(
                    f"{f}.{name}", f"must be a positive integer, got {v!r}", f"give {name}: 1 or more"
                )
        if not isinstance(self.entries, Mapping):
            raise ConfigError(
                f"{f}.layers", "expected a mapping of layer name → entry", "give a list of layers"
            )
        for name, e in self.entries.items():
            _check_entry(name, e, f)
        object.__setattr__(self, "entries", MappingProxyType(dict(self.entries)))
        if not self.device:
            object.__setattr__(self, "device", self.gpu)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    @property
    def total_s(self) -> float:
        """Forward + backward seconds of all layers in the table."""
        return float(sum(e.fwd_s + e.bwd_s for e in self.entries.values()))

    @property
    def measured_on_cpu(self) -> bool:
        return self.gpu.lower() == "cpu" or self.device.lower().startswith("cpu")


def _check_entry(name: str, e: ProfileEntry, f: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{f}.layers", f"bad layer name {name!r}", "give every layer a non-empty name")
    if not isinstance(e, ProfileEntry):
        raise ConfigError(
            f"{f}.layers.{name}", f"expected a ProfileEntry, got {type(e).__name__}", "build entries"
        )
    for key in ("fwd_s", "bwd_s", *_COUNT_KEYS):
        v = getattr(e, key)
        if v is None and key not in ("fwd_s", "bwd_s"):
            continue
        if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise ConfigError(
                f"{f}.layers.{name}.{key}",
                f"must be a finite number ≥ 0, got {v!r}",
                "give seconds (fwd_s, bwd_s) or counts as non-negative numbers",
            )


# ---- files ---------------------------------------------------------------------------------------------
def _num(value: Any, where: str, optional: bool = False) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if optional:
            return None
        raise ConfigError(where, "missing value", "give a number")
    if isinstance(value, bool):
        raise ConfigError(where, f"expected a number, got {value!r}", "give a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(where, f"expected a number, got {value!r}", "give a number") from None
    if not math.isfinite(x) or x < 0:
        raise ConfigError(where, f"must be a finite number ≥ 0, got {value!r}", "give a non-negative number")
    return x


def _int_field(value: Any, where: str, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    x = _num(value, where)
    if x is None or not float(x).is_integer() or x < 1:
        raise ConfigError(where, f"must be a positive integer, got {value!r}", "give e.g. 32")
    return int(x)


def _table_from(meta: Mapping[str, Any], rows: Iterable[Mapping[str, Any]], where: str) -> ProfileTable:
    gpu = meta.get("gpu")
    if not isinstance(gpu, str) or not gpu.strip():
        raise ConfigError(
            f"{where}.gpu", "missing the GPU the profile was measured on", "add gpu: <name> (or cpu)"
        )
    batch = _int_field(meta.get("batch"), f"{where}.batch")
    tp = _int_field(meta.get("tp"), f"{where}.tp", default=1)
    entries: dict[str, ProfileEntry] = {}
    for i, row in enumerate(rows):
        name = row.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}.layers[{i}].name", "missing layer name", "give every row a name")
        name = name.strip()
        if name in entries:
            raise ConfigError(f"{where}.layers[{i}]", f"duplicate layer {name!r}", "give each layer once")
        lw = f"{where}.layers.{name}"
        fwd = _num(row.get("fwd_s"), f"{lw}.fwd_s")
        bwd = _num(row.get("bwd_s"), f"{lw}.bwd_s")
        counts = {k: _num(row.get(k), f"{lw}.{k}", optional=True) for k in _COUNT_KEYS}
        entries[name] = ProfileEntry(float(fwd or 0.0), float(bwd or 0.0), **counts)
    if not entries:
        raise ConfigError(f"{where}.layers", "the profile has no layers", "add one row per layer")
    dtype = str(meta.get("dtype") or "bf16")

    return ProfileTable(
        gpu=gpu.strip(),
        batch=batch,
        entries=entries,
        dtype=normalize_dtype(dtype, f"{where}.dtype"),
        device=str(meta.get("device") or ""),
        tp=tp,
        model=str(meta.get("model") or ""),
    )


def _parse_json(text: str, where: str) -> ProfileTable:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            where, f"not valid JSON ({e.msg} at line {e.lineno})", "fix the file or re-measure it"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(where, "expected a JSON object", f'write {{"format": "{FORMAT}", ...}}')
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise ConfigError(f"{where}.format", f"unknown format {fmt!r}", f"use format: {FORMAT}")
    version = data.get("version", VERSION)
    if version != VERSION:
        raise ConfigError(f"{where}.version", f"unsupported version {version!r}", f"use version {VERSION}")
    layers = data.get("layers")
    if not isinstance(layers, list) or not all(isinstance(r, dict) for r in layers):
        raise ConfigError(
            f"{where}.layers", "expected a list of {name, fwd_s, bwd_s} objects", "add layers: [...]"
        )
    return _table_from(data, layers, where)


def _parse_csv(text: str, where: str) -> ProfileTable:
    meta: dict[str, Any] = {}
    body: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if s.startswith("#"):
            item = s[1:].strip()
            if not item:
                continue
            if "=" not in item:
                raise ConfigError(
                    where,
                    f"line {lineno}: metadata must read '# key=value', got {s!r}",
                    "write e.g. '# gpu=a100-80gb'",
                )
            k, v = item.split("=", 1)
            meta[k.strip()] = v.strip()
        elif s:
            body.append(line)
    if not body:
        raise ConfigError(where, "no header row", "add a header: name,fwd_s,bwd_s")
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in ("name", "fwd_s", "bwd_s") if c not in header]
    if missing:
        raise ConfigError(
            where, f"CSV header lacks {', '.join(missing)}", "use columns name,fwd_s,bwd_s[,fwd_flops,...]"
        )
    rows = [
        {(k or "").strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items()} for r in reader
    ]
    return _table_from(meta, rows, where)


def load_profile(path: str | os.PathLike[str], field: str = "compute.profile") -> ProfileTable:
    """A :class:`ProfileTable` from a ``.json`` or ``.csv`` file; a bad file: ConfigError on ``field``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(field, f"no profile file {str(p)!r}", "give the path of a .json or .csv profile")
    text = yamlio.read_text(p, field)
    suffix = p.suffix.lower()
    if suffix == ".json":
        return _parse_json(text, field)
    if suffix == ".csv":
        return _parse_csv(text, field)
    raise ConfigError(field, f"unknown profile extension {suffix!r}", "use a .json or .csv file")


def profile_to_dict(table: ProfileTable) -> dict[str, Any]:
    layers = []
    for name, e in table.entries.items():
        row: dict[str, Any] = {"name": name, "fwd_s": e.fwd_s, "bwd_s": e.bwd_s}
        for k in _COUNT_KEYS:
            v = getattr(e, k)
            if v is not None:
                row[k] = v
        layers.append(row)
    return {
        "format": FORMAT,
        "version": VERSION,
        "gpu": table.gpu,
        "dtype": table.dtype,
        "device": table.device,
        "batch": table.batch,
        "tp": table.tp,
        "model": table.model,
        "layers": layers,
    }


def _csv_text(table: ProfileTable) -> str:
    out = io.StringIO()
    for k in ("gpu", "dtype", "device", "batch", "tp", "model"):
        out.write(f"# {k}={getattr(table, k)}\n")
    cols = ["name", "fwd_s", "bwd_s", *_COUNT_KEYS]
    w = csv.writer(out, lineterminator="\n")
    w.writerow(cols)
    for name, e in table.entries.items():
        w.writerow(
            [
                name,
                repr(e.fwd_s),
                repr(e.bwd_s),
                *("" if getattr(e, k) is None else repr(float(getattr(e, k))) for k in _COUNT_KEYS),
            ]
        )
    return out.getvalue()


def save_profile(table: ProfileTable, path: str | os.PathLike[str]) -> Path:
    """Write ``table`` as JSON or CSV (by extension), atomically: a temporary file in the same folder is
    renamed over ``path``, so a reader never sees half a file."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".json":
        text = json.dumps(profile_to_dict(table), indent=1) + "\n"
    elif suffix == ".csv":
        text = _csv_text(table)
    else:
        raise ConfigError("path", f"unknown profile extension {suffix!r}", "use a .json or .csv file")
    return atomic_write_text(p, text, make_parents=True)


# ---- a compute model backed by a table -----------------------------------------------------------------
class ProfiledModel:
    """:class:`~topotrain.compute.roofline.ComputeModel` that reads measured times from a table.

    Layers absent from the table are timed by ``fallback`` (normally the roofline of the same GPU); their
    names are returned by :meth:`missing` and by :meth:`layer_times_with_warnings`. Without a fallback a
    missing layer is a ConfigError."""

    def __init__(self, table: ProfileTable, fallback: ComputeModel | None = None) -> None:
        self.table = table
        self.fallback = fallback

    def missing(self, model: Model) -> list[str]:
        """Names of ``model``'s layers that the table lacks."""
        return [lay.name for lay in model.layers if lay.name not in self.table.entries]

    def _scale(self, layer: Layer, batch: int, tp: int) -> float:
        s = batch / self.table.batch
        if is_split(layer):
            s *= self.table.tp / tp
        return s

    def layer_times_with_warnings(
        self, model: Model, batch: int, tp: int
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        for name, v in (("batch", batch), ("tp", tp)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ConfigError(name, f"must be a positive integer, got {v!r}", f"give {name} ≥ 1")
        n = len(model.layers)
        fwd, bwd = np.zeros(n), np.zeros(n)
        missing = self.missing(model)
        fb: tuple[np.ndarray, np.ndarray] | None = None
        if missing:
            if self.fallback is None:
                raise ConfigError(
                    "compute.profile",
                    f"{len(missing)} layers of {model.name} are not in the profile (e.g. {missing[0]!r})",
                    "re-measure the profile for this model or allow a fallback",
                )
            fb = self.fallback.layer_times(model, batch, tp)
        warnings = []
        for i, lay in enumerate(model.layers):
            e = self.table.entries.get(lay.name)
            if e is None:
                assert fb is not None  # set above whenever a layer is missing
                fwd[i], bwd[i] = fb[0][i], fb[1][i]
                warnings.append(f"layer {lay.name!r} not in the profile: timed by the roofline")
            else:
                s = self._scale(lay, int(batch), int(tp))
                fwd[i], bwd[i] = e.fwd_s * s, e.bwd_s * s
        return fwd, bwd, warnings

    def layer_times(self, model: Model, batch: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        fwd, bwd, _ = self.layer_times_with_warnings(model, batch, tp)
        return fwd, bwd

    def __repr__(self) -> str:
        return f"ProfiledModel({self.table.gpu!r}, {len(self.table)} layers, batch={self.table.batch})"


# ---- measuring with torch ------------------------------------------------------------------------------
def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "torch", "measuring a profile needs PyTorch, which is not installed", TORCH_FIX
        ) from None
    return torch


def resolve_device(torch: Any, device: str) -> Any:
    """The torch device ``device`` names (``auto``: CUDA when torch has it, else the CPU), or a ConfigError on
    ``device`` for an unknown name or CUDA that torch cannot use."""
    dev_s = str(device).strip().lower()
    if dev_s == "auto":
        dev_s = "cuda" if torch.cuda.is_available() else "cpu"
    if dev_s.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device", "CUDA is not available to torch here", "use device='cpu' or 'auto'")
    elif dev_s != "cpu":
        raise ConfigError("device", f"unknown device {device!r}", "use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return torch.device(dev_s)


_TORCH_DTYPES = {
    "fp32": "float32",
    "tf32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
}
_GPU_NAME_HINTS = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100-80gb"),
    ("v100", "v100"),
    ("p100", "p100"),
    ("mi300x", "mi300x"),
    ("mi250x", "mi250x"),
)


def _catalog_name(device_name: str) -> str:
    low = device_name.lower()
    for hint, name in _GPU_NAME_HINTS:
        if hint in low:
            if name == "a100-80gb" and "40gb" in low:
                return "a100-40gb"
            if name == "v100" and "16gb" in low:
                return "v100-16gb"
            return name
    return device_name


def _timer(torch: Any, dev: Any, repeats: int, warmup: int) -> Callable[[Callable[[], object]], float]:
    cuda = dev.type == "cuda"

    def run(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()
        if cuda:
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) * 1e-3 / repeats
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return float(np.median(samples))

    return run


def _gemm_ops(
    torch: Any, dev: Any, tdt: Any, dims: tuple[int, int, int, int], passes: list[tuple[int, int, int]]
) -> Callable[[], object]:
    """A closure running ``count`` matmuls per (M, N, K) in ``passes`` (operands allocated once)."""
    c = dims[0]
    ops = []
    for m, n, k in passes:
        shape_a, shape_b = ((m, k), (k, n)) if c == 1 else ((c, m, k), (c, k, n))
        a = torch.randn(*shape_a, device=dev, dtype=tdt)
        b = torch.randn(*shape_b, device=dev, dtype=tdt)
        out = torch.empty(*(shape_a[:-1] + shape_b[-1:]), device=dev, dtype=tdt)
        ops.append((a, b, out))

    def fn() -> None:
        for a, b, out in ops:
            torch.matmul(a, b, out=out)

    return fn


def _stream_op(torch: Any, dev: Any, tdt: Any, nbytes: float, esize: int) -> Callable[[], object] | None:
    """``c = a + b`` on tensors sized so that the op moves ``nbytes`` (2 reads + 1 write)."""
    numel = int(nbytes // (3 * esize))
    if numel < 1:
        return None
    a = torch.ones(numel, device=dev, dtype=tdt)
    b = torch.ones(numel, device=dev, dtype=tdt)
    out = torch.empty(numel, device=dev, dtype=tdt)
    return lambda: torch.add(a, b, out=out)


def _measure_layer(
    torch: Any,
    dev: Any,
    tdt: Any,
    esize: int,
    layer: Layer,
    batch: int,
    timer: Callable[[Callable[[], object]], float],
) -> tuple[float, float]:
    dims = layer.gemm_dims(batch)
    if dims is not None and layer.kind == LayerKind.ATTENTION:
        # FlashAttention's GEMMs, unfused: fwd S = QKᵀ, O = PV; bwd recomputes S and runs dV, dP, dQ, dK
        c, m, n, k = dims
        fwd = _gemm_ops(torch, dev, tdt, dims, [(m, n, k), (m, k, n)])
        bwd = _gemm_ops(torch, dev, tdt, dims, [(m, n, k), (n, k, m), (m, n, k), (m, k, n), (n, k, m)])
        return timer(fwd), timer(bwd)
    if dims is not None and layer.kind in (
        LayerKind.CONV,
        LayerKind.LINEAR,
        LayerKind.MATMUL,
        LayerKind.MOE_ROUTER,
    ):
        c, m, n, k = dims
        wgrad_only = layer.bwd_flops < 1.5 * layer.fwd_flops
        bwd_passes = [(k, n, m)] if wgrad_only else [(m, k, n), (k, n, m)]
        return (
            timer(_gemm_ops(torch, dev, tdt, dims, [(m, n, k)])),
            timer(_gemm_ops(torch, dev, tdt, dims, bwd_passes)),
        )
    times = []
    for nbytes in (layer.fwd_bytes_at(batch), layer.bwd_bytes_at(batch)):
        op = _stream_op(torch, dev, tdt, nbytes, esize)
        times.append(timer(op) if op is not None else 0.0)
    return times[0], times[1]


def measure_profile(
    model: Model,
    batch: int,
    device: str = "auto",
    *,
    dtype: str = "auto",
    repeats: int = 5,
    warmup: int = 2,
    gpu: str | None = None,
    layers: Iterable[str] | None = None,
    seed: int = 0,
) -> ProfileTable:
    """Time every layer of ``model`` (or those named in ``layers``) as a small torch op on one device.

    Each layer kind becomes: GEMMs (conv via its implicit-GEMM shape, linear, matmul, router) →
    ``torch.matmul`` of the layer's ``(count, M, N, K)`` in forward and its input-gradient and weight-gradient
    GEMMs in backward; fused attention → its GEMMs unfused (an upper bound on FlashAttention); every other
    kind → ``torch.add`` on tensors moving the layer's HBM bytes. Times are CUDA-event timings averaged over
    ``repeats`` on a GPU, and the median ``time.perf_counter`` of ``repeats`` runs on the CPU, where the
    table's ``gpu`` and ``device`` are both ``"cpu"`` (a CPU table must not be mistaken for a GPU one).

    ``device``: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``dtype``:
    ``"auto"`` is bf16 on a GPU and fp32 on the CPU. ``gpu`` overrides the catalog name recorded for a GPU
    (by default guessed from ``torch.cuda.get_device_name``). Torch is imported only here.
    """
    torch = _torch()
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError("batch", f"must be a positive integer, got {batch!r}", "give e.g. batch=32")
    for name, v, lo in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(name, f"must be an integer ≥ {lo}, got {v!r}", f"give {name} ≥ {lo}")
    dev = resolve_device(torch, device)
    on_gpu = dev.type == "cuda"

    dt = ("bf16" if on_gpu else "fp32") if dtype == "auto" else normalize_dtype(dtype)
    if dt not in _TORCH_DTYPES:
        raise ConfigError("dtype", f"cannot measure {dt} with torch.matmul", "use bf16, fp16, fp32 or tf32")
    tdt = getattr(torch, _TORCH_DTYPES[dt])
    esize = int(torch.empty((), dtype=tdt).element_size())
    wanted = set(layers) if layers is not None else None
    if wanted is not None:
        unknown = sorted(wanted - {lay.name for lay in model.layers})
        if unknown:
            raise ConfigError(
                "layers", f"{model.name} has no layer {unknown[0]!r}", "name layers of the model"
            )
    torch.manual_seed(seed)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if on_gpu else False
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
    timer = _timer(torch, dev, repeats, warmup)
    entries: dict[str, ProfileEntry] = {}
    try:
        chosen = [lay for lay in model.layers if wanted is None or lay.name in wanted]
        with torch.no_grad(), progress.task(f"profiling {model.name}: layers", total=len(chosen)) as bar:
            for lay in chosen:
                bar.update(description=f"profiling {model.name}: {lay.name}")
                f_s, b_s = _measure_layer(torch, dev, tdt, esize, lay, batch, timer)
                bar.advance()
                entries[lay.name] = ProfileEntry(
                    f_s,
                    b_s,
                    lay.fwd_flops * batch,
                    lay.bwd_flops * batch,
                    lay.fwd_bytes_at(batch),
                    lay.bwd_bytes_at(batch),
                )
    finally:
        if on_gpu:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    if on_gpu:
        label = torch.cuda.get_device_name(dev)
        name = gpu or _catalog_name(label)
        device_label = f"cuda:{label}"
    else:
        name, device_label = "cpu", "cpu"
    return ProfileTable(
        gpu=name, batch=batch, entries=entries, dtype=dt, device=device_label, tp=1, model=model.name
    )
