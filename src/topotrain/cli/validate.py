"""``topotrain validate``: the network models against ns-3 and SimGrid over a matrix of topologies, traffic
and sizes (:mod:`topotrain.validate.matrix`), or training iterations against published measurements
(:mod:`topotrain.validate.published_report`). ns-3 and SimGrid run in subprocesses, started only when the
command runs."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console

from topotrain.cli.common import app, console, friendly
from topotrain.collectives.protocol import IDEAL, comm_library
from topotrain.util import jsonsafe
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.util.outdir import check_out_dir, claim_out_dir, release_out_dir
from topotrain.util.units import format_size, parse_size
from topotrain.validate.matrix import build_cases, run_matrix, summary, write_csv, write_png
from topotrain.validate.published_report import run_published


def _list(raw: str | None) -> list[str] | None:
    return [x.strip() for x in raw.split(",") if x.strip()] if raw else None


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def _us(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x * 1e6:.1f}"


def _ms(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x * 1e3:.1f}"


@app.command("validate")
@friendly
def validate(quick: bool = typer.Option(False, "--quick", help="a small subset (4 cases, seconds)"),
             topologies: str | None = typer.Option(None, "--topologies", help="comma list (default: all)"),
             traffic: str | None = typer.Option(None, "--traffic", help="comma list (default: all)"),
             sizes: str | None = typer.Option(None, "--sizes", help="comma list, e.g. 64KiB,1MiB "
                                              "(default: 64KiB,1MiB,16MiB,256MiB)"),
             out: Path = typer.Option(Path("validation-out"), "-o", "--out", help="directory for validation.csv, "
                                      "validation.png and summary.json"),
             ns3: bool = typer.Option(True, "--ns3/--no-ns3", help="run the ns-3 reference (pip install ns3)"),
             simgrid: bool = typer.Option(True, "--simgrid/--no-simgrid",
                                          help="run SimGrid (apt-get install -y python3-simgrid)"),
             ns3_max_bytes: str = typer.Option("2GiB", "--ns3-max-bytes",
                                               help="skip ns-3 on cases moving more bytes than this"),
             ns3_queue: int = typer.Option(100, "--ns3-queue-packets", min=1,
                                           help="ns-3 TCP mode's port buffer, packets of 9000 bytes"),
             ns3_modes: str = typer.Option("tcp,lossless", "--ns3-modes",
                                           help="ns-3 transports to run: tcp (mainline TCP, drop-tail "
                                                "ports) and/or lossless (RDMA-like: no slow start, no "
                                                "loss, round robin at senders)"),
             as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
             published: bool = typer.Option(False, "--published", help="instead of the network matrix: "
                                            "training iterations beside published measurements (with "
                                            "--quick: the single-server rows), error-band coverage"),
             network: str = typer.Option("analytical", "--network", help="with --published: the model"),
             library: str | None = typer.Option(None, "--library", help="communication library: nccl or ideal "
                                                "(line rate). With --published: every row's (default: the "
                                                "rows' own, nccl); the network matrix: the bytes every model "
                                                "and reference times (default: ideal, the payload itself)"),
             write_residuals: bool = typer.Option(False, "--write-residuals", help="with --published: "
                                                  "store the validation rows' residuals for the error "
                                                  "bands (topotrain/training/residuals.json)"),
             force: bool = typer.Option(False, "--force", help="write into an --out folder that holds files "
                                        "topotrain did not write")) -> None:
    """Validate the network models (analytical, flow, flow-async) against ns-3 (TCP, packet level) and
    SimGrid (pure max-min and LV08 TCP factors): each case's times, our error against each reference,
    each model's wall time; writes CSV + PNG."""
    lib = None
    if library is not None:
        try:
            lib = comm_library(library)
        except ConfigError as e:
            raise ConfigError("--library", e.message, e.fix) from None
    check_out_dir(out, force=force)
    if published and (topologies or traffic or sizes):
        raise ConfigError("--published", "compares training iterations; --topologies, --traffic and --sizes "
                          "select network cases", "drop them, or drop --published")
    if published:
        claim_out_dir(out, "validate")
        summ_p = run_published(network, quick=quick, out=out, write_residuals=write_residuals,
                               seq_check=not quick, echo=(lambda m: None) if as_json else print,
                               library=lib.name if lib is not None else None)
        if as_json:
            print(jsonsafe.dumps(summ_p))
        return

    size_list = [int(parse_size(s, "--sizes")) for s in _list(sizes) or []] or None
    limit = float(parse_size(ns3_max_bytes, "--ns3-max-bytes"))
    cases, skipped = build_cases(_list(topologies), _list(traffic), size_list, quick=quick,
                                 library=lib if lib is not None else IDEAL)
    if not cases:
        raise ConfigError("validate", "no case to run", "check --topologies, --traffic and --sizes")
    err = Console(stderr=True)
    modes = _list(ns3_modes) or []
    if not modes:
        raise ConfigError("--ns3-modes", "no mode given", "give tcp, lossless or both (comma list)")
    made = claim_out_dir(out, "validate")
    try:
        run = run_matrix(cases, ns3=ns3, simgrid=simgrid, ns3_max_bytes=limit, ns3_queue_packets=ns3_queue,
                         ns3_modes=modes, progress=None if as_json else (lambda m: err.print(m)))
    except BaseException:
        release_out_dir(made)
        raise
    csv_path = write_csv(run, out / "validation.csv")
    png_path = write_png(run, out / "validation.png")
    summ = summary(run)
    summ["library"] = (lib or IDEAL).name
    summ["missing_references"] = run.missing
    summ["reference_elapsed_s"] = run.elapsed_s
    summ["not_applicable"] = skipped
    atomic_write_text(out / "summary.json", jsonsafe.dumps(summ, indent=1) + "\n", make_parents=True)
    if as_json:
        print(jsonsafe.dumps(summ))
        return
    nan = float("nan")
    head = (f"{'topology':<15} {'traffic':<16} {'size':>8} | {'flow':>9} {'flow+pkt':>9} {'ns-3 LL':>9} "
            f"{'ns-3 TCP':>9} {'SimGrid':>9} {'SG-TCP':>9} | {'vs LL':>7} {'pkt/LL':>7} {'vs TCP':>7} "
            f"{'vs SG':>7} {'vs SG-TCP':>9} | {'flow':>7} {'LL':>7} {'TCP':>7} {'SG':>7}")
    print("times (us) | flow's error against each reference (pkt/LL: flow+pkt against ns-3 lossless) | "
          "wall times (ms)")
    print(head)
    for r in run.rows:
        g, w = r.time_s.get, r.wall_s.get
        print(f"{r.case.topology:<15} {r.case.traffic:<16} {format_size(r.case.size_bytes):>8} | "
              f"{_us(g('flow', nan)):>9} {_us(g('flow+pkt', nan)):>9} {_us(g('ns3-lossless', nan)):>9} "
              f"{_us(g('ns3', nan)):>9} {_us(g('simgrid', nan)):>9} {_us(g('simgrid-tcp', nan)):>9} | "
              f"{_pct(r.err('flow', 'ns3-lossless')):>7} {_pct(r.err('flow+pkt', 'ns3-lossless')):>7} "
              f"{_pct(r.err('flow', 'ns3')):>7} {_pct(r.err('flow', 'simgrid')):>7} "
              f"{_pct(r.err('flow', 'simgrid-tcp')):>9} | {_ms(w('flow', nan)):>7} "
              f"{_ms(w('ns3-lossless', nan)):>7} {_ms(w('ns3', nan)):>7} {_ms(w('simgrid', nan)):>7}"
              + (f"  {r.note}" if r.note else ""))
    for key, s in summ.items():
        if key.startswith("speed "):
            console.print(f"{key}: {s['ratio_median']:.1f}x on the {s['cases']} slowest cases "
                          f"(largest: {s['largest']})")
        elif isinstance(s, dict) and "median" in s:
            console.print(f"{key}: median |error| {100 * s['median']:.2f}%, worst {100 * s['worst']:.2f}% "
                          f"({s['worst_case']}), {s['within_5pct']}/{s['cases']} within 5%, "
                          f"{s['within_15pct']}/{s['cases']} within 15%")
    for m in run.missing:
        console.print(f"not run (not installed): {m}")
    if skipped:
        console.print(f"{len(skipped)} combinations do not apply (e.g. {skipped[0]})")
    console.print(f"communication library: {summ['library']} (every model and reference timed the same wire bytes)")
    console.print(f"wrote {csv_path} and {png_path}")
