"""``topotrain collective`` without typer: the command's work (:func:`run_collective`, which the typer command in
:mod:`topotrain.cli.collective` calls too), its nccl-tests table, and the reading of a plain command line
(:func:`simple_call`) that lets :func:`topotrain.cli.main` run it without importing typer, click, rich or pydantic.

A command line is read here only when click would read it the same way: ``collective`` first, then the
command's own options, each once, as ``--name VALUE`` or ``--name=VALUE`` (a value neither empty nor starting
with ``-``), ``--json``, and at most one cluster file (not starting with ``-``). Anything else — help, another
verb, an option given twice, an unknown option, ``--``, shell completion — goes to typer as before, which
gives its own usage errors and help. The options and their defaults are the typer command's
(tests/test_cli_plain.py compares them, and the arguments each command line gives, with typer's).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
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

#: The command's options (as typer declares them in cli/collective.py): option → (parameter, default).
OPTIONS: dict[str, tuple[str, str | None]] = {
    "--op": ("op", "allreduce"),
    "--algo": ("algo", "auto"),
    "--size": ("size", "256MiB"),
    "--network": ("network", "flow"),
    "--sweep-sizes": ("sweep_sizes", None),
    "--library": ("library", None),
}
#: Its flags: flag → parameter (default False).
FLAGS = {"--json": "as_json"}


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


def simple_call(argv: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of :func:`run_collective` for the command line ``argv`` (without the program name),
    when it is a plain ``collective`` command line (module docstring); None for any other."""
    if not argv or argv[0] != "collective" or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None
    kwargs: dict[str, Any] = {name: default for name, default in OPTIONS.values()}
    kwargs.update({name: False for name in FLAGS.values()})
    kwargs["cluster"] = None
    given: set[str] = set()
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if not arg.isprintable() or arg in given or name in given:
            return None
        if arg in FLAGS:
            kwargs[FLAGS[arg]] = True
        elif name in OPTIONS:
            if not eq:
                i += 1
                value = rest[i] if i < len(rest) else ""
            if not value or value.startswith("-") or not value.isprintable():
                return None
            kwargs[OPTIONS[name][0]] = value
        elif not arg.startswith("-") and arg and kwargs["cluster"] is None:
            kwargs["cluster"] = Path(arg)
        else:
            return None
        given.add(name if eq else arg)
        i += 1
    return kwargs


def runner(argv: list[str]) -> Callable[[], int] | None:
    """A function that runs the plain command line ``argv`` as typer would run it and returns its exit code
    (bad input: its ``error:`` lines and 2; an interrupt: 130; a reader that closed stdout: 1, quietly), or None
    when ``argv`` is not plain (:func:`simple_call`)."""
    kwargs = simple_call(argv)
    if kwargs is None:
        return None

    def run() -> int:
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

    return run
