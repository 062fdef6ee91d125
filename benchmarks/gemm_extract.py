"""Regenerate the GEMM kernel tables shipped in ``src/topotrain/compute/data/`` from their public sources.

Run: ``.venv/bin/python benchmarks/gemm_extract.py XLA_TABLE NEUSIGHT_DATASET_DIR`` where ``XLA_TABLE`` is
OpenXLA's ``xla/service/gpu/model/default_matmul_perf_table.txtpb`` (called ``matmul_interpolator_data.h``
before July 2026; Apache-2.0) and ``NEUSIGHT_DATASET_DIR`` is NeuSight's ``scripts/asplos/data/dataset``
(MIT). Commits and licences: docs/sources.md §10. Only measurements are read; no code is carried over.

* XLA: the ``sm_90`` (H100 SXM) entries, dtypes ``bf16xbf16->bf16`` (as ``bf16``) and ``f32xf32->f32``
  (as ``tf32``: XLA runs f32 dots on Hopper's TF32 tensor cores; the measured rates, up to 403 TFLOP/s, are
  six times the FP32 vector peak). XLA stores FLOP/s = ``2·b·m·n·k / median kernel time``; we store that
  time, ``time_s = 2·b·m·n·k / flops_per_s``. The fp8 entries are left out (several exceed the dense FP8
  peak, so their time is not the whole GEMM's).
* NeuSight: FP32 ``torch.nn.Linear`` (with bias) and ``torch.bmm`` latencies (CUDA events around the call,
  mean of the fastest runs; milliseconds in the source, seconds here). NeuSight writes a linear as
  ``(B, M, N, K)`` = (1, rows, in features, out features) and a bmm ``[B,M,N]·[B,N,K]``; both are stored here
  in topotrain's convention, output ``m×n`` and reduction ``k``. Linear: the 1,040 shapes of NeuSight's
  test set per GPU; bmm: 1,000 shapes per GPU drawn with a fixed seed (the test set for A100 and H100; the
  training collection for V100, whose test set holds 72).

``.venv/bin/python benchmarks/gemm_extract.py --crossgpu NEUSIGHT_DATASET_DIR`` writes
``gemm_neusight_crossgpu_fp32.csv``, the same recipe on NeuSight's five other GPUs (Tesla P4, Tesla T4, Tesla
P100 PCIe, L4, A100 80GB PCIe), the training data of the learned cross-GPU predictor
(:mod:`topotrain.compute.learned`): linear from the test set (974 shapes on the P4, 1,040 on the others),
bmm 1,000 shapes drawn with seed 34 from the test set (from the training collection for the P4, whose test
set holds 72).
"""

from __future__ import annotations

import csv
import random
import re
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "topotrain" / "compute" / "data"
XLA_DTYPES = {"bf16xbf16->bf16": "bf16", "f32xf32->f32": "tf32"}
NEUSIGHT_DEVICES = {"NVIDIA A100-PCIE-40GB": "a100-pcie-40gb", "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
                    "NVIDIA H100 80GB HBM3": "h100-sxm5-80gb"}
CROSSGPU_DEVICES = {"Tesla P4": "p4", "Tesla T4": "t4", "Tesla P100-PCIE-16GB": "p100-pcie-16gb",
                    "NVIDIA L4": "l4", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb"}
HEADER = ["device", "dtype", "kind", "b", "m", "n", "k", "time_s"]


def xla_rows(text: str) -> list[list[object]]:
    """The sm_90 bf16 and f32 rows of XLA's matmul table (text format of ``xla.GemmPerfTable``)."""
    section = text.split('key: "sm_90"', 1)[1].split('\n  key: "', 1)[0]
    entry = re.compile(r"entries \{\s*b: (\d+)\s*m: (\d+)\s*n: (\d+)\s*k: (\d+)\s*((?:flops \{[^}]*\}\s*)+)\}")
    rows: list[list[object]] = []
    for b, m, n, k, flops in entry.findall(section):
        for key, value in re.findall(r'key: "([^"]+)" value: (\d+)', flops):
            if key in XLA_DTYPES:
                bi, mi, ni, ki = int(b), int(m), int(n), int(k)
                rows.append(["h100-sxm5-80gb", XLA_DTYPES[key], "matmul" if bi == 1 else "bmm", bi, mi, ni, ki,
                             f"{2.0 * bi * mi * ni * ki / float(value):.6e}"])
    return rows


def neusight_rows(path: Path, kind: str, device: str, limit: int | None,
                  names: dict[str, str] = NEUSIGHT_DEVICES) -> list[list[object]]:
    """One GPU's FP32 rows of a NeuSight kernel CSV, in topotrain's (m, n, k) convention."""
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["Device"] == device]
    if limit is not None and len(rows) > limit:
        rows = random.Random(34).sample(rows, limit)
    out: list[list[object]] = []
    for r in rows:
        b, m, red, outer = int(r["B"]), int(r["M"]), int(r["N"]), int(r["K"])
        out.append([names[device], "fp32", kind, b, m, outer, red, f"{float(r['Latency']) * 1e-3:.6e}"])
    return out


def write(path: Path, preamble: str, rows: list[list[object]]) -> None:
    with path.open("w", newline="") as f:
        f.write("".join(f"# {line}\n" for line in preamble.strip().splitlines()))
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(rows)
    print(f"{path}: {len(rows)} rows")


def crossgpu(ns: Path) -> None:
    """``gemm_neusight_crossgpu_fp32.csv``: NeuSight's FP32 linear and bmm kernels on five more GPUs."""
    rows: list[list[object]] = []
    for device in CROSSGPU_DEVICES:
        rows += neusight_rows(ns / "test" / "linear.csv", "linear", device, None, CROSSGPU_DEVICES)
        bmm = ns / "test" / "bmm.csv"
        if device == "Tesla P4":
            bmm = ns / "train" / "collect" / "bmm" / "p2.1.0" / f"{device}.csv"
        rows += neusight_rows(bmm, "bmm", device, 1000, CROSSGPU_DEVICES)
    write(DATA / "gemm_neusight_crossgpu_fp32.csv", """
NeuSight (Lee et al., ASPLOS 2025) kernel measurements, github.com/sitar-lab/NeuSight scripts/asplos/data/dataset.
Copyright 2025 Georgia Institute of Technology and Microsoft Corporation, MIT License. Commit: docs/sources.md §10.
FP32 torch.nn.Linear (bias) and torch.bmm; output m x n, reduction k; time_s = CUDA-event latency (ms in source).
""", rows)


def main() -> None:
    if sys.argv[1] == "--crossgpu":
        crossgpu(Path(sys.argv[2]))
        return
    xla, ns = Path(sys.argv[1]), Path(sys.argv[2])
    write(DATA / "gemm_xla_sm90.csv", """
OpenXLA matmul performance table, sm_90 (H100 SXM) entries: xla/service/gpu/model/default_matmul_perf_table.txtpb
(formerly matmul_interpolator_data.h). Copyright The OpenXLA Authors, Apache License 2.0. Commit: docs/sources.md §10.
time_s = 2*b*m*n*k / (XLA's FLOP/s, from the median kernel time); dtype tf32 = XLA's f32xf32->f32 on tensor cores.
""", xla_rows(xla.read_text()))
    rows: list[list[object]] = []
    for device in NEUSIGHT_DEVICES:
        rows += neusight_rows(ns / "test" / "linear.csv", "linear", device, None)
        bmm = ns / "test" / "bmm.csv"
        if device.startswith("Tesla V100"):
            bmm = ns / "train" / "collect" / "bmm" / "p2.1.0" / f"{device}.csv"
        rows += neusight_rows(bmm, "bmm", device, 1000)
    write(DATA / "gemm_neusight_fp32.csv", """
NeuSight (Lee et al., ASPLOS 2025) kernel measurements, github.com/sitar-lab/NeuSight scripts/asplos/data/dataset.
Copyright 2025 Georgia Institute of Technology and Microsoft Corporation, MIT License. Commit: docs/sources.md §10.
FP32 torch.nn.Linear (bias) and torch.bmm; output m x n, reduction k; time_s = CUDA-event latency (ms in source).
""", rows)


if __name__ == "__main__":
    main()
