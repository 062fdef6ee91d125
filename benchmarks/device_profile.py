"""Profiles from a real GPU (issue 17, part 7): measure the layers of the models behind the published rows
with torch on the local GPU, store each table with its provenance, and print the roofline beside it.

Run on a machine with a GPU (a few minutes)::

    .venv/bin/python benchmarks/device_profile.py --out benchmarks/results/profiles

For each case below it writes ``<out>/<gpu>/<case>.json`` (a ``topotrain-profile`` table: load it with
``compute: {profile: ...}`` in a scenario) and ``<out>/<gpu>/provenance.json`` (torch, CUDA and driver
versions, the device name, the date and the command), and prints :func:`topotrain.compute.check.format_check`
per case: per layer kind, the measured time, the roofline's, and their ratio. Transformers are cut to two
blocks (every block is the same layers). ``--device cpu`` runs the same cases on the CPU, labelled as such and
without the check (a smoke test: the roofline describes a GPU). Nothing is written until a table is complete.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from topotrain.compute.check import format_check, roofline_check
from topotrain.compute.profile import measure_profile, save_profile
from topotrain.util.atomic import atomic_write_text
from topotrain.workload.zoo import get_model

#: (case, zoo model, overrides, micro-batch): the shapes of the published rows' models
CASES: tuple[tuple[str, str, dict[str, object], int], ...] = (
    ("resnet50-b256", "resnet50", {}, 256),
    ("bert-large-s128-b64", "bert-large", {"layers": 2}, 64),
    ("bert-large-s512-b32", "bert-large", {"layers": 2, "seq_len": 512}, 32),
    ("gpt3-1.3b-b4", "gpt3-1.3b", {"layers": 2}, 4),  # hidden 2,048 at sequence 2,048: MPT-1B's GEMMs
    ("gpt3-6.7b-b2", "gpt3-6.7b", {"layers": 2}, 2),  # hidden 4,096: MPT-7B's
    ("megatron-18.4b-b1", "megatron-18.4b", {"layers": 2}, 1),  # hidden 6,144
)


def _provenance(device_label: str) -> dict[str, object]:
    import torch

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    driver = None
    if torch.cuda.is_available():
        try:
            import subprocess

            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit,clocks.max.sm",
                                     "--format=csv,noheader"], capture_output=True, text=True, timeout=20,
                                    check=False).stdout.strip() or None
        except OSError:
            driver = None
    return {"device": device_label, "torch": torch.__version__, "cuda": cuda,
            "nvidia_smi (driver, power limit, max SM clock)": driver, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/profiles"))
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", nargs="*", default=None, help="case names (default: all)")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.cases is None or c[0] in args.cases]
    if not cases:
        ap.error(f"no such case; choose among {', '.join(c[0] for c in CASES)}")
    where: Path | None = None
    for case, name, overrides, batch in cases:
        model = get_model(name, **overrides)
        table = measure_profile(model, batch, args.device, repeats=args.repeats)
        where = args.out / table.gpu
        save_profile(table, where / f"{case}.json")
        print(f"{case}: {len(table.entries)} layers of {model.name} at batch {batch} on {table.device}, "
              f"{table.total_s * 1e3:.3f} ms; wrote {where / f'{case}.json'}", flush=True)
        if not table.measured_on_cpu:
            print(format_check(roofline_check(table, model)), flush=True)
        atomic_write_text(where / "provenance.json", json.dumps(_provenance(table.device), indent=1) + "\n",
                          make_parents=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
