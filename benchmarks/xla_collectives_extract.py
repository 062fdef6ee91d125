"""Regenerate ``src/topotrain/validate/data/xla_collectives_sm90.csv`` from OpenXLA's collective table.

Run: ``.venv/bin/python benchmarks/xla_collectives_extract.py TABLE`` (``TABLE --busbw KEY``: print the busbw at
2 GiB per op and group of another entry, e.g. ``sm_100_B200``, without writing anything) where ``TABLE`` is OpenXLA's
``xla/service/gpu/model/default_collective_perf_table.txtpb`` (called ``collective_interpolator_data.h``, the
same text proto inside a C++ string, until openxla commit ad6eaee1b2; either file is read). Source, commit and
licence (Apache-2.0): docs/sources.md §16. Only measurements are read; no code is carried over.

What XLA measured (``xla/tools/collective_perf_table_gen.cc``): on one 8-GPU H100 SXM host (key ``sm_90``), an
HLO module holding one collective over F32 data, run 20 times by PjRt; the median run time ``t``. The table
stores ``network_throughput_bytes_per_sec = tensor_size_bytes / t`` (integer), where ``tensor_size_bytes`` is
the collective's larger buffer per device: the all-reduce and all-to-all buffer, the all-gather *output*, the
reduce-scatter *input* — nccl-tests' ``size`` convention, so XLA's throughput is nccl-tests' ``algbw``. The
instruction's shape is its result, so the size is ``4·dims`` (F32) except reduce-scatter, ``4·dims·group``.
Replica groups are iota lists over the 8 devices: 1 group of 8, 2 of 4 ({0..3}, {4..7}), 4 of 2, all groups
running at once. Kept: all-reduce, all-gather, reduce-scatter, all-to-all (264 rows). Left out: the 66
collective-permute rows (XLA times them as 100 permutes in a loop; no topotrain collective is a permute).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "topotrain" / "validate" / "data" / "xla_collectives_sm90.csv"
OPS = {"all-reduce": "allreduce", "all-gather": "allgather", "reduce-scatter": "reduce-scatter",
       "all-to-all": "all-to-all"}
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2}
HEADER = ["device", "op", "group_size", "groups", "dtype", "size_bytes", "algbw_bytes_per_s", "time_s"]


def section(text: str, key: str = "sm_90") -> str:
    """The ``key`` entry of the table (the text between its key and the next device key)."""
    if f'key: "{key}"' not in text:
        raise SystemExit(f"no {key} entry in the table")
    return re.split(r'\n\s*key: "', text.split(f'key: "{key}"', 1)[1], maxsplit=1)[0]


def rows(text: str, key: str = "sm_90") -> list[list[object]]:
    """One row per all-reduce / all-gather / reduce-scatter / all-to-all entry of ``key``, sorted."""
    entry = re.compile(r"instruction \{(.*?)\n\s*\}\s*(?:fingerprint: \"[0-9a-f]*\"\s*)?"
                       r"network_throughput_bytes_per_sec: (\d+)", re.S)
    out: list[list[object]] = []
    for body, thr in entry.findall(section(text, key)):
        opcode = re.search(r'opcode: "([^"]+)"', body)
        if opcode is None or opcode.group(1) not in OPS:
            continue
        dtype = re.search(r"element_type: (\w+)", body)
        dims = [int(d) for d in re.findall(r"\n\s*dimensions: (\d+)\s*\n\s*layout", body)]
        groups = re.search(r"num_replica_groups: (\d+)\s*num_devices_per_group: (\d+)", body)
        if dtype is None or groups is None or len(dims) != 1:
            raise SystemExit(f"unexpected entry: {body[:200]!r}")
        n_groups, group = int(groups.group(1)), int(groups.group(2))
        op = OPS[opcode.group(1)]
        size = dims[0] * ELEMENT_BYTES[dtype.group(1)] * (group if op == "reduce-scatter" else 1)
        device = "h100-sxm5-80gb" if key == "sm_90" else key
        out.append([device, op, group, n_groups, dtype.group(1).lower(), size, int(thr), f"{size / int(thr):.6e}"])
    out.sort(key=lambda r: (list(OPS.values()).index(str(r[1])), -int(str(r[2])), int(str(r[5]))))
    return out


def busbw_by_group(text: str, key: str) -> None:
    """Print nccl-tests' busbw at the largest size per op and group size of the ``key`` entry (the same
    measurement on another GPU: ``--busbw sm_100_B200``)."""
    data = rows(text, key)
    top = max(int(str(r[5])) for r in data)
    for r in data:
        if int(str(r[5])) == top:
            n = int(str(r[2]))
            factor = 2 * (n - 1) / n if r[1] == "allreduce" else (n - 1) / n
            print(f"{key} {r[1]:<15} {n}  busbw {int(str(r[6])) * factor / 1e9:6.1f} GB/s at {top} B")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[2] == "--busbw":
        busbw_by_group(Path(sys.argv[1]).read_text(), sys.argv[3])
        return
    data = rows(Path(sys.argv[1]).read_text())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        f.write("# OpenXLA collective performance table, sm_90 (one 8-GPU H100 SXM host): "
                "xla/service/gpu/model/default_collective_perf_table.txtpb\n"
                "# (formerly collective_interpolator_data.h). Copyright The OpenXLA Authors, Apache License 2.0. "
                "Commit: docs/sources.md §16.\n"
                "# size_bytes: the larger buffer per device (nccl-tests' size); algbw_bytes_per_s: XLA's "
                "network_throughput_bytes_per_sec = size / median time; time_s = size / algbw (derived).\n"
                "# groups: replica groups running at once on the 8 GPUs (consecutive devices), group_size each.\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(data)
    print(f"{OUT}: {len(data)} rows")


if __name__ == "__main__":
    main()
