"""Reproduce the two EFLOPS results (Dong et al., HPCA 2020) with topotrain's flow-level model.

(a) Intra-server congestion: the same inter-server allreduce on 16 `pcie-shared-nic` servers (8 GPUs
    sharing one 100 Gb/s NIC behind the root complex) and on 16 `eflops` servers (a NIC beside every PCIe
    switch), same BiGraph network. Speedup by message size.
(b) Network congestion: ring vs halving-doubling (identity rank mapping) vs HDRM on BiGraph, 16 to 512
    GPUs (one GPU + NIC per endpoint), 1 MiB to 1 GiB. Speedups of HDRM.

(a) is timed twice, with the flow model's two arbitration rules (``cluster.arbitration``): ``flow``, max-min per
flow on every link (the default), and ``port``, PCIe links shared per input port, round robin
(:mod:`topotrain.network.port_arbitration`).

Run: ``.venv/bin/python benchmarks/eflops.py [--quick] [--out DIR] [--nic LINK] [--servers-only]``. Prints two
tables; every figure is computed. ``--nic`` sets both servers' NICs and the network's links (default
``eth-100g``; ``eth-200g`` makes the shared server's PCIe link to its NIC the bottleneck); ``--servers-only``
stops after (a) and (a'), the per-GPU rates of one cross-server step under both rules; ``--check`` checks every
per-port allocation of (a) against the allocation's definition (slow: quadratic in the flows). The rows of (a) and (b)
are written to ``DIR/eflops_servers.{csv,json}`` and ``DIR/eflops_bigraph.{csv,json}`` (default DIR:
``benchmarks/results``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from topotrain.api import time_collective
from topotrain.network import FlowNetwork, flow_rates
from topotrain.network.port_arbitration import definition_gap
from topotrain.report.tables import write_table
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.util.units import format_size

MiB = 2**20


def server_comparison(sizes: list[int], servers: int = 16, nic: str = "eth-100g") -> list[dict[str, Any]]:
    """Each allreduce on both servers, with the flow model's two arbitration rules: ``flow`` (max-min per flow on
    every link, the default) and ``port`` (PCIe links share per input port, round robin: issue 40, part 4)."""
    print(f"(a) allreduce across {servers} servers x 8 GPUs, BiGraph of 8 switches, {nic}, flow model; "
          "arbitration flow | port")
    print(f"{'size':>9} {'algorithm':>18} {'shared-NIC':>12} {'EFLOPS':>12} {'speedup':>8} | "
          f"{'shared-NIC':>12} {'EFLOPS':>12} {'speedup':>8}")
    clusters = {}
    for arb in ("flow", "port"):
        for srv in ("pcie-shared-nic", "eflops"):
            clusters[srv, arb] = cluster_from_dict({"server": srv, "servers": servers, "nic": nic,
                                                    "arbitration": arb, "network": {
                "topology": "bigraph", "switches": 8, "radix": 16, "link": nic, "latency": "1us"}})
    rows = []
    for algo in ("hierarchical", "halving-doubling", "ring"):
        for size in sizes:
            t = {k: time_collective(c, "allreduce", algo, size, "flow").time_s for k, c in clusters.items()}
            sp = {a: t["pcie-shared-nic", a] / t["eflops", a] for a in ("flow", "port")}
            print(f"{format_size(size):>9} {algo:>18} " + " | ".join(
                f"{t['pcie-shared-nic', a] * 1e3:>10.2f}ms {t['eflops', a] * 1e3:>10.2f}ms {sp[a]:>7.2f}x"
                for a in ("flow", "port")), flush=True)
            rows.append({"size_bytes": size, "algorithm": algo, "nic": nic,
                         "shared_nic_s": t["pcie-shared-nic", "flow"], "eflops_s": t["eflops", "flow"],
                         "speedup": sp["flow"], "shared_nic_port_s": t["pcie-shared-nic", "port"],
                         "eflops_port_s": t["eflops", "port"], "speedup_port": sp["port"]})
    return rows


def step_rates(servers: int, topology: dict[str, Any], nic: str, fan_out: bool = False) -> list[dict[str, Any]]:
    """Per-GPU rates of one cross-server step on `pcie-shared-nic` servers, alone on the network, under both
    arbitration rules: which links bind, and whether the PCIe ports' round robin shows. The step: GPU i of server s
    to GPU i of server s xor 1 (halving-doubling's step at distance 8); ``fan_out``: GPU i of server 0 to GPU 0 of
    server i + 1 instead (every receiving server takes one flow)."""
    rows = []
    for arb in ("flow", "port"):
        c = cluster_from_dict({"server": "pcie-shared-nic", "servers": servers, "nic": nic, "arbitration": arb,
                               "network": {**topology, "link": nic, "latency": "1us"}})
        topo, gpus = c.topology, c.topology.gpus
        net = FlowNetwork(topo, overhead_s=0.0, arbitration=arb)
        pairs = [(i, 8 * (i + 1)) for i in range(8)] if fan_out else [(i, i ^ 8) for i in range(len(gpus))]
        ids = [net.start(topo.route(gpus[a], gpus[b]), 1e9, 0.0) for a, b in pairs]
        rates = [net.flow_rate(f) for f in ids[:8]]
        ends = [t for t, _ in net.run()]
        print(f"  {servers} servers, {topology['topology']}, {nic}{', fan-out' if fan_out else ''}, arbitration {arb}: "
              "server 0's GPUs at "
              + " ".join(f"{r / 1e9:.4f}" for r in rates) + f" GB/s; 1 GB each ends {min(ends) * 1e3:.3f} to "
              f"{max(ends) * 1e3:.3f} ms; progressive-filling steps: "
              f"{net.port_stats.get('fallback_steps', 0)}", flush=True)
        rows.append({"servers": servers, "topology": topology["topology"], "nic": nic, "fan_out": fan_out,
                     "arbitration": arb,
                     "gpu_rates_bytes_per_s": rates, "first_end_s": min(ends), "last_end_s": max(ends)})
    return rows


def check_definition() -> dict[str, float]:
    """From now on, check every per-port allocation the flow model makes against the allocation's definition
    (:func:`topotrain.network.port_arbitration.definition_gap`, written apart from the filling); returns the tally
    it keeps: allocations checked, how many miss by more than 1e-9, the largest gap, progressive-filling steps."""
    tally: dict[str, float] = {"allocations": 0, "missing": 0, "largest_gap": 0.0, "fallback_steps": 0}
    fill = flow_rates.port_fair_rates

    def checked(paths: Any, mult: Any, cap: Any, port: Any, stats: dict[str, int] | None = None) -> Any:
        own: dict[str, int] = {}
        rate = fill(paths, mult, cap, port, own)
        if stats is not None:
            for k, v in own.items():
                stats[k] = stats.get(k, 0) + v
        gap = definition_gap(paths, mult, cap, port, rate)
        tally["allocations"] += 1
        tally["missing"] += gap > 1e-9
        tally["largest_gap"] = max(tally["largest_gap"], gap)
        tally["fallback_steps"] += own.get("fallback_steps", 0)
        return rate

    flow_rates.port_fair_rates = checked  # the name FlowRates._refill calls
    return tally


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
    nic = sys.argv[sys.argv.index("--nic") + 1] if "--nic" in sys.argv else "eth-100g"
    tally = check_definition() if "--check" in sys.argv else None
    servers = server_comparison(sizes, nic=nic)
    if tally is not None:
        print(f"    per-port allocations checked against the definition: {tally['allocations']:.0f}, missing it: "
              f"{tally['missing']:.0f}, largest gap {tally['largest_gap']:.1e}, progressive-filling steps "
              f"{tally['fallback_steps']:.0f}")
    print("\n(a') one cross-server step alone (GPU i of server s to GPU i of server s xor 1), pcie-shared-nic")
    step_rates(16, {"topology": "bigraph", "switches": 8, "radix": 16}, nic)
    step_rates(2, {"topology": "single-switch"}, nic)
    step_rates(9, {"topology": "single-switch"}, nic, fan_out=True)
    if "--servers-only" in sys.argv:  # (a) and (a')
        write_table(servers, out / "eflops_servers", {"benchmark": "eflops", "quick": quick, "network": "flow"})
        print(f"\nwall {time.perf_counter() - t0:.1f} s; table in {out}/eflops_servers.csv (and .json)")
        return
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
