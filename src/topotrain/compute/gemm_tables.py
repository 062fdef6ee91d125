"""Measured GEMM kernel tables: which devices they were measured on, and the measurements themselves.

The tables ship as CSV files in ``compute/data/`` (one row per kernel: device, dtype, kind, ``b``, ``m``,
``n``, ``k``, seconds), regenerated from their public sources by ``benchmarks/gemm_extract.py``; sources,
commits and licences are in docs/sources.md §10:

* **OpenXLA's matmul performance table** (``xla/service/gpu/model/default_matmul_perf_table.txtpb``, formerly
  ``matmul_interpolator_data.h``; Apache-2.0): the median kernel time of ``b`` batched ``m×k · k×n`` GEMMs on
  an H100 SXM (``sm_90``), ``b ∈ {1, 2, 4}``, ``m, n, k ∈ {256, …, 4096}``, in bf16 and in f32 (which XLA runs
  on the TF32 tensor cores: stored as ``tf32``).
* **NeuSight's kernel dataset** (Lee et al., "Forecasting GPU Performance for Deep Learning Training and
  Inference", ASPLOS 2025; MIT): FP32 ``torch.nn.Linear`` and ``torch.bmm`` latencies on an A100 PCIe 40GB,
  a V100 PCIe 32GB and an H100 SXM, shapes of real models (GPT, BERT, OPT, ViT …).

Convention: a row times ``b`` independent GEMMs whose output is ``m×n`` and whose reduction is ``k``
(``2·b·m·n·k`` FLOPs), as :meth:`topotrain.workload.layer.Layer.gemm_dims` counts them.

A :class:`KernelDevice` is the measured device: its SMs, HBM bandwidth and peaks (datasheet figures), and
the catalog GPU whose roofline its tables may serve (``gpu``; None when no catalog entry is that device:
the V100 PCIe runs at a lower clock than the catalog's V100 SXM2).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import numpy as np

from topotrain.hardware.gpus import get_gpu

DATA_DIR = Path(__file__).with_name("data")
#: The shipped tables (file names in :data:`DATA_DIR`), in the order they are read.
TABLE_FILES: tuple[str, ...] = ("gemm_xla_sm90.csv", "gemm_neusight_fp32.csv")
#: NeuSight's FP32 kernels on five more GPUs, read only by the learned cross-GPU predictor
#: (:mod:`topotrain.compute.learned`); none of them is a catalog GPU.
CROSSGPU_FILES: tuple[str, ...] = ("gemm_neusight_crossgpu_fp32.csv",)
#: Bytes per element of each dtype as a GEMM reads and writes it (TF32 operands are stored as FP32).
ELEMENT_BYTES: Mapping[str, int] = MappingProxyType(
    {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
)
#: Tile shapes (rows × columns of the output a thread block computes) a library chooses among, largest first.
#: Tensor cores: CUTLASS/cuBLAS Hopper and Ampere kernels (``128x256``, ``128x128``, ``64x128``, ``64x64``
#: in their names); FP32 SIMT: the ``sgemm`` kernels NeuSight's traces name (``128x128``, ``128x64``,
#: ``64x64``, ``64x32``).
TENSOR_TILES: tuple[tuple[int, int], ...] = ((128, 256), (128, 128), (64, 128), (64, 64))
SIMT_TILES: tuple[tuple[int, int], ...] = ((128, 128), (128, 64), (64, 64), (64, 32))


@dataclass(frozen=True)
class KernelDevice:
    """A device kernel tables were measured on (datasheet figures; SI units)."""

    name: str
    gpu: str | None
    sm_count: int
    hbm_bandwidth_bytes_per_s: float
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    source: str = ""
    #: board power limit (W; 0: not known), read by the learned cross-GPU predictor
    tdp_w: float = 0.0

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s at ``dtype``."""
        return float(self.peak_flops_per_s[dtype])


def _from_catalog(name: str, gpu: str, source: str, tdp_w: float | None = None) -> KernelDevice:
    g = get_gpu(gpu)
    return KernelDevice(name, g.name, g.sm_count, g.hbm_bandwidth_bytes_per_s,
                        MappingProxyType(dict(g.peak_flops_per_s)), source, g.tdp_w if tdp_w is None else tdp_w)


def _devices() -> dict[str, KernelDevice]:
    return {d.name: d for d in (
        _from_catalog("h100-sxm5-80gb", "h100", "catalog h100 (H100 SXM5 80GB datasheet)"),
        # same SMs, clock, HBM and peaks as the A100 SXM4 40GB (A100 datasheet, PCIe column); 250 W
        _from_catalog("a100-pcie-40gb", "a100-40gb", "catalog a100-40gb; A100 datasheet PCIe 40GB column (250 W)",
                      250.0),
        KernelDevice("v100-pcie-32gb", None, 80, 900e9, MappingProxyType({"fp32": 14.0e12}),
                     "V100 datasheet, PCIe column: FP32 14 TFLOPS, 900 GB/s, 80 SMs, 250 W "
                     "(1,380 MHz boost; NeuSight's device config: 14,029 GFLOP/s)", 250.0),
        # The learned cross-GPU predictor's other devices (gemm_neusight_crossgpu_fp32.csv). SM counts as the
        # measurements' own grids give them (grid blocks / NeuSight's blocks per SM), which for the P4 and the L4
        # correct NeuSight's device configs (40 and 60 SMs there).
        KernelDevice("p4", None, 20, 192e9, MappingProxyType({"fp32": 5.5e12}),
                     "Tesla P4 datasheet: FP32 5.5 TFLOPS, GDDR5 192 GB/s, 20 Pascal SMs, 75 W", 75.0),
        KernelDevice("t4", None, 40, 320e9, MappingProxyType({"fp32": 8.1e12}),
                     "Tesla T4 datasheet: FP32 8.1 TFLOPS, GDDR6 320 GB/s, 40 Turing SMs, 70 W", 70.0),
        KernelDevice("p100-pcie-16gb", None, 56, 732e9, MappingProxyType({"fp32": 9.3e12}),
                     "Tesla P100 datasheet, PCIe column: FP32 9.3 TFLOPS, HBM2 732 GB/s, 56 SMs, 250 W", 250.0),
        KernelDevice("l4", None, 58, 300e9, MappingProxyType({"fp32": 30.3e12}),
                     "NVIDIA L4 datasheet: FP32 30.3 TFLOPS, GDDR6 300 GB/s, 58 Ada SMs, 72 W", 72.0),
        KernelDevice("a100-pcie-80gb", None, 108, 1935e9, MappingProxyType({"fp32": 19.5e12}),
                     "A100 datasheet, PCIe 80GB column: FP32 19.5 TFLOPS, HBM2e 1,935 GB/s, 108 SMs, 300 W", 300.0),
    )}


#: Devices with shipped tables, by name.
DEVICES: Mapping[str, KernelDevice] = MappingProxyType(_devices())


@dataclass(frozen=True, eq=False)
class GemmTable:
    """One device's measured GEMMs at one dtype: arrays of equal length, one entry per measured kernel."""

    device: KernelDevice
    dtype: str
    kind: tuple[str, ...]
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    time_s: np.ndarray

    def __len__(self) -> int:
        return len(self.time_s)

    @property
    def flops(self) -> np.ndarray:
        """FLOPs of each row: ``2·b·m·n·k``."""
        return 2.0 * self.b * self.m * self.n * self.k

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of kernel in the table (``matmul``/``bmm`` for XLA, ``linear``/``bmm`` for NeuSight)."""
        return tuple(sorted(set(self.kind)))

    @property
    def tiles(self) -> tuple[tuple[int, int], ...]:
        """The tile shapes the device's library chooses among at this dtype."""
        return SIMT_TILES if self.dtype in ("fp32", "fp64") else TENSOR_TILES

    def subset(self, mask: np.ndarray) -> GemmTable:
        """The rows where ``mask`` is true."""
        mask = np.asarray(mask, dtype=bool)
        return GemmTable(self.device, self.dtype, tuple(np.asarray(self.kind, dtype=object)[mask]),
                         self.b[mask], self.m[mask], self.n[mask], self.k[mask], self.time_s[mask])


def parse_table_csv(text: str) -> list[GemmTable]:
    """The tables (one per device and dtype) of a kernel CSV; ``#`` lines are provenance comments."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        groups.setdefault((row["device"], row["dtype"]), []).append(row)
    tables = []
    for (dev, dtype), rows in groups.items():
        def col(name: str, rows: list[dict[str, str]] = rows) -> np.ndarray:
            return np.array([float(r[name]) for r in rows], dtype=np.float64)
        tables.append(GemmTable(DEVICES[dev], dtype, tuple(r["kind"] for r in rows),
                                col("b"), col("m"), col("n"), col("k"), col("time_s")))
    return tables


@lru_cache(maxsize=1)
def load_tables() -> tuple[GemmTable, ...]:
    """Every shipped table, in :data:`TABLE_FILES` order."""
    out: list[GemmTable] = []
    for name in TABLE_FILES:
        out += parse_table_csv((DATA_DIR / name).read_text())
    return tuple(out)


@lru_cache(maxsize=1)
def load_crossgpu_tables() -> tuple[GemmTable, ...]:
    """NeuSight's FP32 linear/bmm tables on all its GPUs (the three of :data:`TABLE_FILES`, then those of
    :data:`CROSSGPU_FILES`), one per device."""
    out = [t for t in load_tables() if t.dtype == "fp32"]
    for name in CROSSGPU_FILES:
        out += parse_table_csv((DATA_DIR / name).read_text())
    return tuple(out)


def find_table(device: str, dtype: str) -> GemmTable | None:
    """The table measured on ``device`` at ``dtype`` (None if there is none)."""
    for t in load_tables():
        if t.device.name == device and t.dtype == dtype:
            return t
    return None


def table_for_gpu(gpu: str, dtype: str) -> GemmTable | None:
    """The table that times the catalog GPU named ``gpu`` at ``dtype``: measured on a device that is that GPU,
    at that dtype or at one its tensor cores run at the same rate (fp16 ↔ bf16, by the device's figures).
    None when there is none (a GPU a scenario's catalog defines has none)."""
    mine = [t for t in load_tables() if t.device.gpu == gpu]
    for t in mine:
        if t.dtype == dtype:
            return t
    for t in mine:
        peaks = t.device.peak_flops_per_s
        if {t.dtype, dtype} == {"fp16", "bf16"} and peaks.get("fp16") == peaks.get("bf16"):
            return t
    return None
