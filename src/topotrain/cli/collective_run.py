"""``topotrain collective`` without typer: the command's work (:func:`run_collective`, which the typer command in
:mod:`topotrain.cli.collective` calls too), its nccl-tests table, and :func:`run`, which runs a plain command line
(read by :func:`topotrain.cli.collective_args.simple_call`) as typer would, without importing typer, click, rich
or pydantic.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from topotrain.cli.plain import DEFAULT_CLUSTER, Stop, guarded
from topotrain.collectives.schedule import parse_op
from topotrain.scenario.cluster import example_path
from topotrain.scenario.collective_api import load_cluster, load_comm, time_collective
from topotrain.topology.routing import routing_mode
from topotrain.util import jsonsafe, progress
from topotrain.util.errors import ConfigError
from topotrain.util.units import parse_size


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


def run_collective(cluster: Path | None, op: str, algo: str, size: str, network: str, sweep_sizes: str | None,
                   library: str | None, as_json: bool) -> None:
    """Time one collective (or a sweep of sizes) and print its report: JSON, or nccl-tests' table."""
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


def run(kwargs: dict[str, Any]) -> int:
    """:func:`run_collective` with the arguments of a plain command line, as typer runs the command: its exit code
    (bad input: its ``error:`` lines and 2; an interrupt: 130; a reader that closed stdout: 1, quietly)."""
    try:
        with progress.display():  # a progress bar on stderr when it is a terminal (util/progress.py)
            guarded(run_collective, (), kwargs)
    except Stop as e:
        return e.code
    except KeyboardInterrupt:
        return 130
    except EOFError:
        print(file=sys.stderr)
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # as typer does: the rest of the output goes nowhere, exit 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    return 0
