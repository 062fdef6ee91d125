"""Regenerate NeuSight's memory-bound kernel table shipped in ``src/topotrain/compute/data/``.

Run: ``.venv/bin/python benchmarks/membound_extract.py NEUSIGHT_DATASET_DIR`` where ``NEUSIGHT_DATASET_DIR`` is
NeuSight's ``scripts/asplos/data/dataset`` (github.com/sitar-lab/NeuSight, MIT; commit in docs/sources.md §10).
Only measurements are read; no code is carried over.

NeuSight times one PyTorch 2.1 op on a ``B×H`` FP32 tensor by CUDA events around the call (the mean of the
fastest 5 of 25 runs; milliseconds in the source, seconds here; ``neusight/Dataset/collect.py``): element-wise
``add, mul, div, pow`` (two tensors), ``addu, mulu, divu, powu`` (a tensor and a Python scalar), ``relu, gelu,
tanh``, ``torch.nn.LayerNorm(H)`` (``ln``) and ``torch.nn.Softmax`` over the last dimension (``softmax``). Kept:

* every row of the test sets (``test/vec.csv``: sizes 50 MB–69 GB, 7 GPUs including two not in the training
  sets, the A100 80GB PCIe and the L4) and of the training sets (``train/elem.csv``, ``train/ln.csv``,
  ``train/softmax.csv``: 18–500 MB, 5 GPUs);
* 150 rows per GPU of ``add``, ``addu``, ``ln`` and ``softmax`` from the small-tensor collection
  (``train/collect/*.csv``: tensors of a few hundred bytes to a few MB, the latency-bound end), drawn with
  seed 34.
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "topotrain" / "compute" / "data"
DEVICES = {"NVIDIA A100-PCIE-40GB": "a100-pcie-40gb", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
           "Tesla V100-PCIE-32GB": "v100-pcie-32gb", "Tesla P100-PCIE-16GB": "p100-pcie-16gb",
           "Tesla T4": "t4", "Tesla P4": "p4", "NVIDIA L4": "l4"}
HEADER = ["device", "op", "set", "rows", "width", "time_s"]
COLLECT_OPS = ("add", "addu", "ln", "softmax")
COLLECT_PER_DEVICE = 150


def rows_of(path: Path, label: str, limit: int | None = None) -> list[list[object]]:
    """The rows of one NeuSight CSV: (device, op, set, B, H, seconds), ``limit`` per device drawn with seed 34."""
    with path.open() as f:
        found = [r for r in csv.DictReader(f) if r["Device"] in DEVICES]
    if limit is not None:
        by_device: dict[str, list[dict[str, str]]] = {}
        for r in found:
            by_device.setdefault(r["Device"], []).append(r)
        found = [r for d in sorted(by_device) for r in random.Random(34).sample(by_device[d],
                                                                                 min(limit, len(by_device[d])))]
    return [[DEVICES[r["Device"]], r["OPName"], label, int(r["B"]), int(r["H"]),
             f"{float(r['Latency']) * 1e-3:.6e}"] for r in found]


def main() -> None:
    ns = Path(sys.argv[1])
    rows = rows_of(ns / "test" / "vec.csv", "test")
    for name in ("elem", "ln", "softmax"):
        rows += rows_of(ns / "train" / f"{name}.csv", "train")
    for op in COLLECT_OPS:
        rows += rows_of(ns / "train" / "collect" / f"{op}.csv", "collect", COLLECT_PER_DEVICE)
    path = DATA / "membound_neusight_fp32.csv"
    with path.open("w", newline="") as f:
        f.write("""# NeuSight (Lee et al., ASPLOS 2025) kernel measurements,
# github.com/sitar-lab/NeuSight scripts/asplos/data/dataset.
# Copyright 2025 Georgia Institute of Technology and Microsoft Corporation, MIT License. Commit: docs/sources.md §10.
# FP32 PyTorch 2.1 ops on a rows x width tensor (LayerNorm and Softmax over width); time_s = CUDA-event latency.
""")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(rows)
    print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
