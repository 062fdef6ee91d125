"""``topotrain collective`` and ``topotrain topo show``: one collective (or a sweep of sizes) timed with NCCL's
algbw/busbw (the work itself: :mod:`topotrain.cli.collective_run`, which runs a plain command line without
typer), and a cluster topology's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from topotrain.cli.collective_run import cluster_path, run_collective
from topotrain.cli.common import app, choices, console, friendly
from topotrain.collectives.registry import ALGORITHMS
from topotrain.collectives.schedule import CollectiveOp
from topotrain.report.draw import check_picture_path, draw_topology
from topotrain.scenario.collective_api import load_cluster, network_model_names
from topotrain.topology.metrics import summarize
from topotrain.util import jsonsafe, progress
from topotrain.util.units import format_bandwidth

topo_app = typer.Typer(help="Inspect a cluster topology.", rich_markup_mode=None)
app.add_typer(topo_app, name="topo")


@topo_app.command("show")
@friendly
def topo_show(cluster: Path | None = typer.Argument(None, help="cluster/scenario YAML (default: built-in example)"),
              png: Path | None = typer.Option(None, "-o", "--out", "--png", help="draw the topology here, the "
                                              "format from the extension: .png, .svg or .pdf (layered, large "
                                              "clusters aggregated)"),
              as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Summary of a cluster's topology: nodes, links, diameter, bisection bandwidth."""
    if png is not None:
        check_picture_path(png)
    c = load_cluster(cluster_path(cluster))  # progress of large builds on stderr (util/progress.py)
    with progress.task(f"measuring the topology ({len(c.topology.gpus)} GPUs): diameter, bisection"):
        s = summarize(c.topology)
    d = s.to_dict() if hasattr(s, "to_dict") else dict(vars(s))
    d = {"cluster": c.name, "network": c.network, "gpu": c.gpu, "servers": c.servers, **d}
    if c.mixed:  # a mixed cluster: each GPU type and how many (docs/mixed.md)
        d["gpu"] = "+".join(c.gpu_names)
        d["gpus_by_type"] = {g: c.rank_gpus.count(g) for g in c.gpu_names}
    if as_json:
        print(jsonsafe.dumps(d, default=str))
    else:
        t = Table(title=f"topology {c.name}")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for label, value in topology_rows(d):
            t.add_row(label, value)
        console.print(t)
    if png is not None:
        with progress.task(f"drawing {png.name}"):
            draw_topology(c.topology, png)
        if not as_json:
            console.print(f"wrote {png}")


def topology_rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    """``topo show``'s summary for a person: labels in words, sizes with their units (``--json`` keeps the
    keys and SI numbers for scripts)."""
    words = {"gpu": "GPU", "cpu": "CPU", "nic": "NIC", "pcie": "PCIe switch", "switch": "switch"}
    parts = []
    for k, n in dict(d.get("nodes_by_kind") or {}).items():
        word = words.get(str(k), str(k))
        parts.append(f"{n:,} {word}{'' if n == 1 else ('es' if word.endswith('h') else 's')}")
    kinds = ", ".join(parts)
    diameter = f"{d['diameter_hops']} hops" + ("" if d.get("diameter_exact") else
                                               f" (sampled over {d.get('diameter_pairs', 0):,} GPU pairs)")
    return [("cluster", str(d["cluster"])), ("network", str(d["network"])), ("GPU", str(d["gpu"])),
            ("servers", f"{d['servers']:,}"), ("GPUs", f"{d['num_gpus']:,}"),
            ("nodes", f"{d['num_nodes']:,} ({kinds})"), ("links (physical, both directions)",
                                                          f"{d['num_physical_links']:,}"),
            ("diameter (GPU to GPU)", diameter),
            ("bisection bandwidth", format_bandwidth(d["bisection_bandwidth_bytes_per_s"])),
            ("total link capacity", format_bandwidth(d["total_link_capacity_bytes_per_s"]))]


@app.command("collective")
@friendly
def collective(cluster: Path | None = typer.Argument(None, help="cluster/scenario YAML (default: built-in example)"),
               op: str = typer.Option("allreduce", "--op", help="the collective (torch/nccl-tests spellings too: "
                                      "all_reduce, alltoall)", **choices([o.value for o in CollectiveOp])),
               algo: str = typer.Option("auto", "--algo", help="the algorithm, or auto: the fastest that applies",
                                        **choices([*ALGORITHMS, "auto"])),
               size: str = typer.Option("256MiB", "--size", help="the buffer as nccl-tests sizes it: per rank for "
                                        "allreduce, broadcast, reduce, all-to-all; the total (full) buffer for "
                                        "allgather and reduce-scatter"),
               network: str = typer.Option("flow", "--network", help="the network model (packet: ns-3 TCP, for "
                                           "validation, pip install ns3)", **choices(network_model_names())),
               sweep_sizes: str | None = typer.Option(None, "--sweep-sizes", help="LOW:HIGH, e.g. 1MiB:1GiB"),
               library: str | None = typer.Option(None, "--library", **choices(["nccl", "ideal"]),
                                                  help="communication library: nccl (NCCL's "
                                                  "wire efficiency and protocol) or ideal (line rate); default: "
                                                  "the file's comm.library, else nccl"),
               as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Time one collective (or a sweep of sizes) with NCCL's algbw/busbw."""
    run_collective(cluster, op, algo, size, network, sweep_sizes, library, as_json)
