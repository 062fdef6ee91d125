"""The ``topotrain`` command: time collectives and training iterations on a described cluster.

With no sub-command it runs the main job on the built-in default scenario.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from topotrain.errors import ConfigError
from topotrain.units import format_size, format_time, parse_size

app = typer.Typer(add_completion=False, no_args_is_help=False, help=__doc__, pretty_exceptions_enable=False)
topo_app = typer.Typer(add_completion=False, help="Inspect a cluster topology.")
app.add_typer(topo_app, name="topo")

console = Console(width=None if sys.stdout.isatty() else 150)
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CLUSTER = "eflops-bigraph"


def _friendly(fn: F) -> F:
    """Bad input → one line on stderr, exit code 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(2) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
            print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _cluster_path(path: Path | None) -> Path:
    from topotrain.cluster import example_path

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
@_friendly
def topo_show(cluster: Path | None = typer.Argument(None, help="cluster/scenario YAML (default: built-in example)"),
              png: Path | None = typer.Option(None, "--png", help="draw the topology into this PNG"),
              as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Summary of a cluster's topology: nodes, links, diameter, bisection bandwidth."""
    from topotrain.cluster import load_cluster
    from topotrain.topology.metrics import draw_png, summarize

    c = load_cluster(_cluster_path(cluster))
    s = summarize(c.topology)
    d = s.to_dict() if hasattr(s, "to_dict") else dict(vars(s))
    d = {"cluster": c.name, "network": c.network, "gpu": c.gpu, "servers": c.servers, **d}
    if as_json:
        print(json.dumps(d, default=str))
    else:
        t = Table(title=f"topology {c.name}")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in d.items():
            t.add_row(str(k), str(v))
        console.print(t)
    if png is not None:
        draw_png(c.topology, png)
        console.print(f"wrote {png}")


@app.command("collective")
@_friendly
def collective(cluster: Path | None = typer.Argument(None, help="cluster/scenario YAML (default: built-in example)"),
               op: str = typer.Option("allreduce", "--op"),
               algo: str = typer.Option("auto", "--algo", help="ring, halving-doubling, tree, hierarchical, "
                                        "torus2d, hdrm, direct, pairwise, or auto"),
               size: str = typer.Option("256MiB", "--size", help="per-rank buffer, as nccl-tests"),
               network: str = typer.Option("flow", "--network", help="flow or analytical"),
               sweep_sizes: str | None = typer.Option(None, "--sweep-sizes", help="LOW:HIGH, e.g. 1MiB:1GiB"),
               as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Time one collective (or a sweep of sizes) with NCCL's algbw/busbw."""
    from topotrain.api import time_collective
    from topotrain.cluster import load_cluster

    c = load_cluster(_cluster_path(cluster))
    sizes = _parse_range(sweep_sizes) if sweep_sizes else [int(parse_size(size, "size"))]
    reports = [time_collective(c, op, algo, s, network) for s in sizes]
    if as_json:
        objs = [r.to_dict() for r in reports]
        print(json.dumps(objs[0] if len(objs) == 1 else objs))
        return
    t = Table(title=f"{op} on {c.name} ({reports[0].ranks} ranks, {network} network)")
    for col in ("size", "algorithm", "time", "algbw GB/s", "busbw GB/s", "busiest link", "util"):
        t.add_column(col, justify="right" if col not in ("algorithm", "busiest link") else "left")
    for r in reports:
        name = r.algorithm + (" (auto)" if r.chosen_automatically else "")
        t.add_row(format_size(r.size_bytes), name, format_time(r.time_s), f"{r.algbw_gbps:.2f}",
                  f"{r.busbw_gbps:.2f}", f"{r.busiest_link[0]}→{r.busiest_link[1]}",
                  f"{100 * r.busiest_link_utilization:.0f}%")
    console.print(t)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    """Run the main job on the built-in default scenario when no sub-command is given."""
    if ctx.invoked_subcommand is None:
        collective(None, "allreduce", "auto", "256MiB", "flow", "1MiB:1GiB:x4", False)


def main() -> None:
    app()
