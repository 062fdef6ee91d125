"""Reproduce the two EFLOPS results (Dong et al., HPCA 2020) with topotrain's flow-level model.

(a) Intra-server congestion: the same inter-server allreduce on 16 `pcie-shared-nic` servers (8 GPUs
    sharing one 100 Gb/s NIC behind the root complex) and on 16 `eflops` servers (a NIC beside every PCIe
    switch), same BiGraph network. Speedup by message size.
(b) Network congestion: ring vs halving-doubling (identity rank mapping) vs HDRM on BiGraph, 16 to 512
    GPUs (one GPU + NIC per endpoint), 1 MiB to 1 GiB. Speedups of HDRM.

Run: ``.venv/bin/python benchmarks/eflops.py [--quick] [--out DIR]``. Prints two tables; every figure is
computed. The same rows are written to ``DIR/eflops_servers.{csv,json}`` and ``DIR/eflops_bigraph.{csv,json}``
(default DIR: ``benchmarks/results``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from topotrain.api import time_collective
from topotrain.report.tables import write_table
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.util.units import format_size

MiB = 2**20


def server_comparison(sizes: list[int], servers: int = 16) -> list[dict[str, Any]]:
    print(f"(a) allreduce across {servers} servers x 8 GPUs, BiGraph of 8 switches, flow model")
    print(f"{'size':>9} {'algorithm':>18} {'shared-NIC':>12} {'EFLOPS':>12} {'speedup':>8}")
    clusters = {}
    for srv in ("pcie-shared-nic", "eflops"):
        clusters[srv] = cluster_from_dict({"server": srv, "servers": servers, "network": {
            "topology": "bigraph", "switches": 8, "radix": 16, "link": "eth-100g", "latency": "1us"}})
    rows = []
    for algo in ("hierarchical", "halving-doubling", "ring"):
        for size in sizes:
            t = {k: time_collective(c, "allreduce", algo, size, "flow").time_s for k, c in clusters.items()}
            print(f"{format_size(size):>9} {algo:>18} {t['pcie-shared-nic'] * 1e3:>10.2f}ms "
                  f"{t['eflops'] * 1e3:>10.2f}ms {t['pcie-shared-nic'] / t['eflops']:>7.2f}x", flush=True)
            rows.append({"size_bytes": size, "algorithm": algo, "shared_nic_s": t["pcie-shared-nic"],
                         "eflops_s": t["eflops"], "speedup": t["pcie-shared-nic"] / t["eflops"]})
    return rows


def _full_bigraph_switches(n: int) -> int:
    """Power-of-two switch count N with about N/2 endpoints per switch (the paper's full-size shape)."""
    sw = 2
    while sw * sw // 2 < n:
        sw *= 2
    return sw


def bigraph_comparison(gpu_counts: list[int], sizes: list[int], attach: str) -> list[dict[str, Any]]:
    print(f"\n(b) allreduce on BiGraph ({attach} attachment), one GPU+NIC per endpoint, flow model")
    print(f"{'GPUs':>5} {'switches':>8} {'size':>9} {'ring':>11} {'HD':>11} {'HDRM':>11} "
          f"{'HDRM/HD':>8} {'HDRM/ring':>9}")
    rows = []
    for n in gpu_counts:
        sw = _full_bigraph_switches(n)
        per_switch = -(-n // sw)
        c = cluster_from_dict({"server": "single-gpu", "servers": n, "network": {
            "topology": "bigraph", "switches": sw, "radix": max(sw, 2 * per_switch), "attach": attach,
            "link": "eth-100g", "latency": "1us"}})
        for size in sizes:
            t = {a: time_collective(c, "allreduce", a, size, "flow").time_s
                 for a in ("ring", "halving-doubling", "hdrm")}
            print(f"{n:>5} {sw:>8} {format_size(size):>9} {t['ring'] * 1e3:>9.3f}ms "
                  f"{t['halving-doubling'] * 1e3:>9.3f}ms {t['hdrm'] * 1e3:>9.3f}ms "
                  f"{t['halving-doubling'] / t['hdrm']:>7.2f}x {t['ring'] / t['hdrm']:>8.2f}x", flush=True)
            rows.append({"attach": attach, "gpus": n, "switches": sw, "size_bytes": size, "ring_s": t["ring"],
                         "halving_doubling_s": t["halving-doubling"], "hdrm_s": t["hdrm"],
                         "hdrm_vs_hd": t["halving-doubling"] / t["hdrm"], "hdrm_vs_ring": t["ring"] / t["hdrm"]})
    return rows


def main() -> None:
    quick = "--quick" in sys.argv
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else Path(__file__).parent / "results"
    t0 = time.perf_counter()
    sizes = [MiB, 16 * MiB, 256 * MiB] if quick else [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
    servers = server_comparison(sizes)
    counts = [16, 64] if quick else [16, 32, 64, 128, 256, 512]
    bigraph = []
    for attach in ("contiguous", "interleaved"):
        bigraph += bigraph_comparison(counts, sizes, attach)
    meta = {"benchmark": "eflops", "quick": quick, "network": "flow"}
    write_table(servers, out / "eflops_servers", meta)
    write_table(bigraph, out / "eflops_bigraph", meta)
    print(f"\nwall {time.perf_counter() - t0:.1f} s; tables in {out}/eflops_servers.csv, eflops_bigraph.csv "
          "(and .json)")


if __name__ == "__main__":
    main()
