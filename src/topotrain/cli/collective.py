"""``topotrain collective`` and ``topotrain topo show``: one collective (or a sweep of sizes) timed with NCCL's
algbw/busbw, and a cluster topology's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from topotrain.cli.common import DEFAULT_CLUSTER, app, choices, console, friendly
from topotrain.collectives.registry import ALGORITHMS
from topotrain.collectives.schedule import CollectiveOp, parse_op
from topotrain.report.draw import check_picture_path, draw_topology
from topotrain.scenario.cluster import example_path
from topotrain.scenario.collective_api import load_cluster, load_comm, network_model_names, time_collective
from topotrain.topology.metrics import summarize
from topotrain.topology.routing import routing_mode
from topotrain.util import jsonsafe, progress
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_bandwidth, parse_size

topo_app = typer.Typer(help="Inspect a cluster topology.", rich_markup_mode=None)
app.add_typer(topo_app, name="topo")


def cluster_path(path: Path | None) -> Path:
    """``path``, or the built-in example cluster when none is given."""
    return path if path is not None else example_path(DEFAULT_CLUSTER)


def _parse_range(spec: str) -> list[int]:
    """``1MiB:1GiB`` → powers of two from 1 MiB to 1 GiB (``:x4`` for another factor)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError("sweep-sizes", f"cannot read {spec!r}", "write LOW:HIGH, e.g. 1MiB:1GiB")
    lo = int(parse_size(parts[0], "sweep-sizes"))
    hi = int(parse_size(parts[1], "sweep-sizes"))
    factor = 2
    if len(parts) == 3:
        try:
            factor = int(parts[2].lstrip("x"))
        except ValueError:
            raise ConfigError("sweep-sizes", f"bad factor {parts[2]!r}", "write e.g. 1MiB:1GiB:x4") from None
        if factor < 2:
            raise ConfigError("sweep-sizes", "factor must be >= 2", "write e.g. 1MiB:1GiB:x2")
    if hi < lo:
        raise ConfigError("sweep-sizes", f"{parts[1]} is below {parts[0]}", "write LOW:HIGH")
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


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
    cop = parse_op(op, "--op")
    sizes = _parse_range(sweep_sizes) if sweep_sizes else [int(parse_size(size, "size"))]
    path = cluster_path(cluster)
    lib = load_comm(path, library)
    c = load_cluster(path)
    reports = []
    with progress.task(f"timing {cop.value}", total=len(sizes)) as prog:
        for s in sizes:
            reports.append(time_collective(c, cop, algo, s, network, library=lib))
            prog.advance()
    if as_json:
        objs = [r.to_dict() for r in reports]
        print(jsonsafe.dumps(objs[0] if len(objs) == 1 else objs))
        return
    print(nccl_tests_table(reports, f"{cop.value} on {c.name}: {reports[0].ranks} ranks, {network} network, "
                                    f"{lib.name} library, {routing_mode(c.topology.meta)} routing"))


#: Ops whose nccl-tests "count" column is the per-rank share (size / p elements): the others print size / 4.
_PER_RANK_COUNT = {"allgather", "reduce-scatter", "all-to-all"}
_REDUCE_OPS = {"allreduce", "reduce-scatter", "reduce"}
_ROOTED_OPS = {"broadcast", "reduce"}


def nccl_tests_row(r: Any) -> str:
    """One size as nccl-tests prints it: size (B, the total buffer as nccl-tests counts it: the full buffer
    of allgather and reduce-scatter), count (elements of the per-rank parameter), type, redop, root (-1 where
    the op has none), then the out-of-place block (time in us, algbw and busbw in GB/s, #wrong: N/A, no data is
    checked) — the in-place block is left out, it would repeat the same numbers (the model moves the same
    bytes either way) — then our columns: algorithm, protocol, wire efficiency, busiest link and its
    utilization. No field holds a space, so ``awk '{print $8}'`` is busbw as with nccl-tests."""
    count = r.size_bytes // 4 // (r.ranks if r.op in _PER_RANK_COUNT and r.ranks > 0 else 1)
    name = r.algorithm + ("(auto)" if r.chosen_automatically else "")
    link = f"{r.busiest_link[0]}->{r.busiest_link[1]}".replace(" ", "_")
    return (f"{r.size_bytes:>12d} {count:>12d} {'float':>6} {'sum' if r.op in _REDUCE_OPS else 'none':>6} "
            f"{0 if r.op in _ROOTED_OPS else -1:>5d} {r.time_s * 1e6:>10.2f} {r.algbw_gb_per_s:>7.2f} "
            f"{r.busbw_gb_per_s:>7.2f} {'N/A':>6}  {name:<18} {r.protocol or '-':<6} {r.wire_efficiency:>5.3f} "
            f"{link} {100 * r.busiest_link_utilization:.0f}%")


def nccl_tests_table(reports: list[Any], title: str) -> str:
    """Rows as nccl-tests prints them (:func:`nccl_tests_row`), under its header lines, then the closing
    "Avg bus bandwidth" line."""
    head = (f"#\n# {title}\n# out-of-place only (in-place would repeat the same numbers: the model moves the "
            f"same bytes)\n#\n"
            f"# {'':>46} {'out-of-place':^33}\n"
            f"# {'size':>10} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>7} "
            f"{'busbw':>7} {'#wrong':>6}  {'algorithm':<18} {'proto':<6} {'wire':>5} busiest-link\n"
            f"# {'(B)':>10} {'(elements)':>12} {'':>6} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} "
            f"{'':>6}  {'':<18} {'':<6} {'(eff)':>5}")
    lines = [head, *(nccl_tests_row(r) for r in reports)]
    avg = sum(r.busbw_gb_per_s for r in reports) / len(reports)
    lines.append(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {avg:.3f}")
    return "\n".join(lines)
