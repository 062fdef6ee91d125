"""Memory-bound kernels (element-wise, normalization, softmax) timed from measured kernels.

NeuSight's kernel measurements (Lee et al., ASPLOS 2025; ``data/membound_neusight_fp32.csv``, docs/sources.md
§10) time PyTorch 2.1's FP32 element-wise ops, ``LayerNorm`` and ``Softmax`` on ``rows×width`` tensors of a few
hundred bytes to 69 GB on seven GPUs. Each kernel's time is modelled as

    t = max(latency, intercept + bytes / (BW · efficiency(class, width)))

``BW`` the datasheet HBM bandwidth, ``bytes`` the minimum traffic (every input read once, every output written
once: 12 B per element for a two-tensor FP32 op, 8 B for a one-tensor op, ``LayerNorm`` also its weight and
bias and its per-row mean and reciprocal deviation):

* **latency** is the median time of the device's tensors under 1 MB of the class (the latency-bound end),
  30–62 µs on the measured cards. In NeuSight's CUDA-event timings (an event recorded before the Python call,
  one after, on an idle GPU) it is **PyTorch's eager dispatch on the host plus the kernel launch**. A training
  step keeps its GPU busy ahead of the host, so this figure is **not** carried into training: the roofline's
  ``kernel_launch_overhead_s`` stays the per-kernel cost there.
* **intercept** is where a line through the streaming rows (below) meets zero bytes (9–48 µs): the same
  dispatch as it overlaps a long kernel's start; it too stays out of training.
* **efficiency** is the fraction of the datasheet bandwidth a kernel of that class reaches, set from the rows
  of at least four times the device's L2 cache (below that the benchmark, which runs the same op 25 times on
  the same tensors, reads its inputs from L2): per row ``bytes / (BW · (t − intercept))``. Element-wise ops
  (``elementwise``: ``add, mul, div, pow``, their scalar forms, ``relu, gelu, tanh``) reach one fraction per
  device (the median). Normalization (``norm``) and softmax (``softmax``) depend on the row length, since
  PyTorch picks a different kernel by it (one warp per row up to 1,024 elements for softmax, a block per row
  with several passes above; row lengths that are not powers of two leave lanes idle): their fraction at row
  length ``w`` is the inverse-distance mean over the four measured rows nearest in ``log2`` row length
  (:data:`WIDTH_NEIGHBOURS`), clamped to the measured range.

:func:`cross_validated_errors` checks the model on rows held out of the fit (4-fold over rows, and for norm
and softmax leave-one-row-length-out over the test grid); ``benchmarks/membound.py`` prints the figures
(docs/validation.md §8). For a catalog GPU the fraction comes from its measured counterpart
(:data:`CATALOG_DEVICE`: the A100 and V100 SXM boards from their PCIe versions, same HBM), and for one without
measurements (H100, H200, AMD, user GPUs) from the **median over the measured HBM data-center GPUs** (A100
40GB/80GB, V100, P100) at the same class and row length (:data:`TRANSFER_DEVICES`). The fractions are FP32
measurements applied to 16-bit tensors by bytes (a memory-bound kernel's time follows its bytes, not its
element count; a stated assumption, since no 16-bit table is public), and the PyTorch kernels stand for the
fused kernels of the training stacks (Apex's layer norm, Megatron's fused softmax), also an assumption.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Literal

import numpy as np

from topotrain.compute.gemm_tables import DATA_DIR

#: The memory-bound kernel classes of the measurements.
KernelClass = Literal["elementwise", "norm", "softmax"]
CLASSES: tuple[KernelClass, ...] = ("elementwise", "norm", "softmax")
DATA_FILE = "membound_neusight_fp32.csv"
#: FP32 bytes per element of each op beyond its per-row terms: two inputs and an output, or one and one.
_BINARY = frozenset({"add", "mul", "div", "pow"})
#: Rows within this many bytes are latency-bound (the intercept); rows of at least ``L2_MULTIPLE`` × L2 set
#: the bandwidth fraction.
LATENCY_BYTES = 1e6
L2_MULTIPLE = 4.0
WIDTH_NEIGHBOURS = 4


@dataclass(frozen=True)
class MeasuredDevice:
    """A GPU NeuSight measured: datasheet HBM bandwidth and L2 size (PCIe boards: their own datasheets)."""

    name: str
    hbm_bandwidth_bytes_per_s: float
    l2_bytes: float
    hbm: bool


#: NeuSight's devices (its ``device_configs``: ``Mem_Bw`` GB/s and ``L2Cache`` MB; the A100 80GB PCIe from
#: NVIDIA's A100 datasheet, PCIe column: 1,935 GB/s).
DEVICES: dict[str, MeasuredDevice] = {d.name: d for d in (
    MeasuredDevice("a100-pcie-40gb", 1555e9, 40e6, True),
    MeasuredDevice("a100-pcie-80gb", 1935e9, 40e6, True),
    MeasuredDevice("v100-pcie-32gb", 900e9, 6e6, True),
    MeasuredDevice("p100-pcie-16gb", 732e9, 4e6, True),
    MeasuredDevice("t4", 320e9, 4e6, False),
    MeasuredDevice("p4", 192e9, 2e6, False),
    MeasuredDevice("l4", 300e9, 48e6, False),
)}
#: Catalog GPU → the measured device whose fractions it takes (same GPU and HBM; SXM vs PCIe board).
CATALOG_DEVICE: dict[str, str] = {
    "a100-40gb": "a100-pcie-40gb", "a100-80gb": "a100-pcie-80gb", "v100": "v100-pcie-32gb",
    "v100-16gb": "v100-pcie-32gb", "p100": "p100-pcie-16gb",
}
#: The devices whose median stands for a GPU without measurements (HBM data-center GPUs only; the GDDR
#: cards T4, P4 and L4 are fitted and checked, not transferred).
TRANSFER_DEVICES: tuple[str, ...] = ("a100-pcie-40gb", "a100-pcie-80gb", "v100-pcie-32gb", "p100-pcie-16gb")


def op_class(op: str) -> KernelClass:
    """The class of one of NeuSight's ops."""
    return "norm" if op == "ln" else "softmax" if op == "softmax" else "elementwise"


def op_bytes(op: str, rows: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Minimum HBM bytes of one FP32 op on ``rows×width`` tensors (inputs read once, outputs written once)."""
    n = rows * width
    if op in _BINARY:
        return 12.0 * n
    if op == "ln":  # x in, y out, weight and bias in, per-row mean and 1/std out
        return 8.0 * n + 8.0 * width + 8.0 * rows
    return 8.0 * n


@dataclass(frozen=True)
class KernelRows:
    """One device's measured rows of one class."""

    device: MeasuredDevice
    cls: KernelClass
    op: tuple[str, ...]
    source: tuple[str, ...]
    width: np.ndarray
    nbytes: np.ndarray
    time_s: np.ndarray

    def __len__(self) -> int:
        return len(self.time_s)

    def subset(self, mask: np.ndarray) -> KernelRows:
        m = np.asarray(mask, dtype=bool)
        return KernelRows(self.device, self.cls, tuple(np.asarray(self.op, dtype=object)[m]),
                          tuple(np.asarray(self.source, dtype=object)[m]), self.width[m], self.nbytes[m],
                          self.time_s[m])

    @property
    def streaming(self) -> np.ndarray:
        """Rows large enough that the benchmark's repeated runs cannot hold their inputs in L2."""
        return self.nbytes >= L2_MULTIPLE * self.device.l2_bytes


@lru_cache(maxsize=1)
def load_rows() -> tuple[KernelRows, ...]:
    """Every shipped row, grouped by device and class."""
    text = (DATA_DIR / DATA_FILE).read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        groups.setdefault((r["device"], op_class(r["op"])), []).append(r)
    out = []
    for (dev, cls), rows in sorted(groups.items()):
        ops = tuple(r["op"] for r in rows)
        b = np.array([float(r["rows"]) for r in rows])
        w = np.array([float(r["width"]) for r in rows])
        nbytes = np.concatenate([op_bytes(o, b[i:i + 1], w[i:i + 1]) for i, o in enumerate(ops)])
        out.append(KernelRows(DEVICES[dev], cls, ops, tuple(r["set"] for r in rows), w, nbytes,  # type: ignore[arg-type]
                              np.array([float(r["time_s"]) for r in rows])))
    return tuple(out)


def rows_for(device: str, cls: str) -> KernelRows | None:
    """The rows measured on ``device`` of class ``cls`` (None if there are none)."""
    for r in load_rows():
        if r.device.name == device and r.cls == cls:
            return r
    return None


@dataclass(frozen=True)
class KernelFit:
    """The fitted model of one device and class (module docstring): the latency floor, the streaming
    intercept and the bandwidth fractions, per row length (``log2`` row length of every streaming row, norm
    and softmax) or one number (element-wise)."""

    device: MeasuredDevice
    cls: KernelClass
    latency_s: float
    intercept_s: float
    log_width: np.ndarray
    efficiency: np.ndarray

    def fraction(self, width: float | None = None) -> float:
        """Achieved fraction of the datasheet HBM bandwidth at row length ``width`` (elements; None or 0:
        the median over the measured rows)."""
        if self.cls == "elementwise" or not width or width <= 0:
            return float(np.median(self.efficiency))
        lw = np.clip(math.log2(width), self.log_width.min(), self.log_width.max())
        d = np.abs(self.log_width - lw)
        near = np.argsort(d, kind="stable")[:WIDTH_NEIGHBOURS]
        wts = 1.0 / (d[near] + 1e-3)
        return float(np.sum(wts * self.efficiency[near]) / np.sum(wts))

    def time_s(self, nbytes: float, width: float | None = None) -> float:
        """Predicted kernel time as NeuSight measured it: ``max(latency, intercept + bytes/(BW·fraction))``."""
        stream = self.intercept_s + nbytes / (self.device.hbm_bandwidth_bytes_per_s * self.fraction(width))
        return max(self.latency_s, stream)


def _intercept(nbytes: np.ndarray, time_s: np.ndarray) -> float | None:
    """The intercept ``a`` of ``t = a + s·bytes`` fitted in relative error (least squares of
    ``(a + s·bytes)/t − 1``) over rows spanning at least 2x in bytes; None with fewer than 3 such rows."""
    if len(time_s) < 3 or nbytes.max() < 2.0 * nbytes.min():
        return None
    a = np.vstack([1.0 / time_s, nbytes / time_s]).T
    coef = np.linalg.lstsq(a, np.ones(len(time_s)), rcond=None)[0]
    return max(0.0, float(coef[0]))


def fit(rows: KernelRows, latency_s: float | None = None) -> KernelFit:
    """Fit :class:`KernelFit` on ``rows``: the latency floor from its rows under :data:`LATENCY_BYTES` (or
    ``latency_s`` where it has none); the intercept from the streaming rows (element-wise: one line through
    them; norm and softmax: the median intercept of the row lengths measured at 3 or more sizes); the
    fractions ``bytes / (BW · (t − intercept))`` of the streaming rows."""
    tiny = rows.nbytes < LATENCY_BYTES
    lat = float(np.median(rows.time_s[tiny])) if tiny.any() else latency_s
    if lat is None:
        raise ValueError(f"{rows.device.name} {rows.cls}: no latency-bound rows and no latency given")
    s = rows.streaming
    if not s.any():
        raise ValueError(f"{rows.device.name} {rows.cls}: no rows of at least {L2_MULTIPLE:g}x L2")
    if rows.cls == "elementwise":
        cut = _intercept(rows.nbytes[s], rows.time_s[s])
    else:
        per_width = [_intercept(rows.nbytes[s & (rows.width == w)], rows.time_s[s & (rows.width == w)])
                     for w in np.unique(rows.width[s])]
        found = [a for a in per_width if a is not None]
        cut = float(np.median(found)) if found else None
    intercept = min(lat, cut) if cut is not None else 0.0
    big = s & (rows.time_s > intercept)
    eff = rows.nbytes[big] / (rows.device.hbm_bandwidth_bytes_per_s * (rows.time_s[big] - intercept))
    return KernelFit(rows.device, rows.cls, lat, intercept, np.log2(rows.width[big]), eff)


def _class_latency(cls: str, exclude: str | None = None) -> float:
    """Median latency of class ``cls`` over the devices with latency-bound rows (for a device without)."""
    lats = [float(np.median(r.time_s[r.nbytes < LATENCY_BYTES])) for r in load_rows()
            if r.cls == cls and r.device.name != exclude and (r.nbytes < LATENCY_BYTES).any()]
    return float(np.median(lats))


@cache
def device_fit(device: str, cls: str) -> KernelFit | None:
    """The fit on every shipped row of ``device`` and ``cls`` (None where nothing was measured)."""
    rows = rows_for(device, cls)
    if rows is None:
        return None
    return fit(rows, _class_latency(cls, device))


@lru_cache(maxsize=4096)
def bandwidth_fraction(gpu: str, cls: str, width: int = 0) -> float:
    """The fraction of its datasheet HBM bandwidth a ``cls`` kernel with rows of ``width`` elements reaches
    on the catalog GPU ``gpu``: its measured counterpart's (:data:`CATALOG_DEVICE`), else the median over
    :data:`TRANSFER_DEVICES`. At most 1."""
    names = (CATALOG_DEVICE[gpu],) if gpu in CATALOG_DEVICE else TRANSFER_DEVICES
    fits = [f for f in (device_fit(n, cls) for n in names) if f is not None]
    return min(1.0, float(np.median([f.fraction(width or None) for f in fits])))


def fraction_source(gpu: str) -> str:
    """Where :func:`bandwidth_fraction` takes ``gpu``'s figures from, in words."""
    if gpu in CATALOG_DEVICE:
        return f"MEASURED on {CATALOG_DEVICE[gpu]} (NeuSight, FP32)"
    return "TRANSFERRED: median of " + ", ".join(TRANSFER_DEVICES) + " (no measurement of this GPU)"


# ---- held-out checks ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldOut:
    """Held-out ``|predicted/measured − 1|`` of one device and class."""

    device: str
    cls: str
    check: str
    rows: int
    median: float
    p90: float
    worst: float


def _summary(device: str, cls: str, check: str, pred: np.ndarray, meas: np.ndarray) -> HeldOut:
    err = np.abs(pred / meas - 1.0)
    return HeldOut(device, cls, check, len(err), float(np.median(err)), float(np.quantile(err, 0.9)),
                   float(err.max()))


def cross_validated_errors(rows: KernelRows, folds: int = 4, seed: int = 34) -> list[HeldOut]:
    """Errors on rows held out of the fit: ``streaming`` and ``all`` rows of a ``folds``-fold split (seed
    ``seed``), and for norm and softmax ``width``: every row length of the test grid left out in turn
    (streaming rows; predicted from the neighbouring row lengths)."""
    lat_other = _class_latency(rows.cls, rows.device.name)
    fold = np.random.default_rng(seed).permutation(len(rows)) % folds
    pred = np.empty(len(rows))
    for f in range(folds):
        model = fit(rows.subset(fold != f), lat_other)
        test = np.flatnonzero(fold == f)
        pred[test] = [model.time_s(rows.nbytes[i], rows.width[i]) for i in test]
    name = rows.device.name
    out = [_summary(name, rows.cls, "rows, all", pred, rows.time_s)]
    s = rows.streaming
    out.append(_summary(name, rows.cls, "rows, >= 4x L2", pred[s], rows.time_s[s]))
    if rows.cls != "elementwise":
        grid = np.array([src == "test" for src in rows.source]) & s
        wp, wm = [], []
        for w in np.unique(rows.width[grid]):
            held = rows.width == w
            model = fit(rows.subset(~held), lat_other)
            idx = np.flatnonzero(held & grid)
            wp += [model.time_s(rows.nbytes[i], rows.width[i]) for i in idx]
            wm += list(rows.time_s[idx])
        if wp:
            out.append(_summary(name, rows.cls, "row length left out", np.array(wp), np.array(wm)))
    return out
