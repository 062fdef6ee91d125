"""``topotrain trace import``, ``trace replay`` and ``trace export``: a recorded PyTorch step (every rank's
Kineto JSON and Execution Trace) or a Chakra execution trace in, topotrain's replay of it — on its own host,
or resized — out, and a workload out as Chakra (docs/traces.md). protobuf is imported only when a Chakra
file is read or written (``traces.chakra_pb2.messages``)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.network.registry import get_model
from topotrain.scenario.cluster import load_cluster
from topotrain.scenario.load import load_scenario
from topotrain.traces.chakra import export_chakra, import_chakra, is_chakra_path
from topotrain.traces.cluster import HostCluster, fit_host_cluster, load_host_cluster
from topotrain.traces.importer import import_job
from topotrain.traces.model import TraceJob, is_job_dict, job_from_dict, save_job
from topotrain.traces.readers import load_json
from topotrain.traces.whatif import core_share_scale, resize
from topotrain.training.chakra_export import export_iteration
from topotrain.training.replay import Placement, Replay, replay
from topotrain.training.simulate import simulate
from topotrain.util.atomic import check_output_path, protect_inputs
from topotrain.util.errors import ConfigError
from topotrain.util.jsonsafe import dumps
from topotrain.util.units import format_bandwidth, format_size, format_time, parse_time

trace_app = typer.Typer(rich_markup_mode=None, help="Recorded PyTorch steps: import, replay, what-if.")
app.add_typer(trace_app, name="trace")


def _traces(files: list[Path], name: str = "") -> TraceJob:
    """The job in trace files: every rank's Chakra ET (``*.et``), or every rank's Kineto JSON and ET JSON."""
    chakra = [is_chakra_path(f) for f in files]
    if any(chakra) and not all(chakra):
        odd = files[chakra.index(False)] if chakra[0] else files[chakra.index(True)]
        raise ConfigError(str(odd), "mixes Chakra execution traces (.et) with PyTorch JSON traces",
                          "pass one job's files of one kind")
    try:
        return import_chakra(files, name) if files and all(chakra) else import_job(files, name)
    except (TypeError, KeyError, AttributeError, IndexError) as e:
        # a recorded trace is untrusted JSON: a value of the wrong shape where the reader expects a number, a
        # list or an object (a list as a pid was "internal error TypeError: unhashable type: 'list'")
        where = ", ".join(str(f) for f in files[:2]) + (", ..." if len(files) > 2 else "")
        raise ConfigError("files", f"{where}: not a trace this reader understands ({type(e).__name__}: {e})",
                          "pass the files a PyTorch profiler run (Kineto JSON + Execution Trace) or Chakra "
                          "export wrote, unedited") from None


def _job(files: list[Path]) -> TraceJob:
    """One written workload, or the job recorded in trace files."""
    if len(files) == 1 and not is_chakra_path(files[0]):
        doc = load_json(files[0])
        if is_job_dict(doc):
            return job_from_dict(doc, str(files[0]))
    return _traces(files)


@trace_app.command("import")
@friendly
def import_cmd(files: list[Path] = typer.Argument(..., help="every rank's Kineto JSON and ET JSON (.json or .json.gz), "
                                                "or every rank's Chakra execution trace (<prefix>.<rank>.et)"),
               out: Path = typer.Option(..., "-o", "--out", help="the workload to write (JSON)"),
               name: str = typer.Option("", "--name", help="the job's name (default: the files' folder)")) -> None:
    """Read a recorded step (Kineto + Execution Trace, or Chakra ET, per rank) and write it as a topotrain workload."""
    job = _traces(files, name)
    with protect_inputs(files):  # -o never replaces one of the traces it reads
        save_job(job, out)
    ops = sum(len(r.ops) for r in job.ranks)
    size = sum(c.size_bytes for c in job.collectives)
    console.print(f"{job.name}: {job.world_size} ranks ({job.backend}), {ops} operators, {len(job.collectives)} "
                  f"collectives ({format_size(size)}), measured step {format_time(job.measured_step_s)}; wrote {out}")


def _time(seconds: float) -> str:
    """Seconds for the table: below a nanosecond (rounding of µs timestamps) is 0."""
    return format_time(seconds if abs(seconds) >= 1e-9 else 0.0)


def _table(r: Replay) -> Table:
    t = Table(title=f"{r.job}: per-rank streams, replayed | measured")
    for col in ("rank", "step", "operators", "host gaps", "waits", "collectives (network)"):
        t.add_column(col, justify="right")
    for a, b in zip(r.replayed, r.measured, strict=True):
        t.add_row(str(a.rank), *(f"{_time(x)} | {_time(y)}" for x, y in (
            (a.step_s, b.step_s), (a.op_s, b.op_s), (a.host_gap_s, b.host_gap_s), (a.wait_s, b.wait_s),
            (a.comm_s, b.comm_s))))
    return t


@trace_app.command("replay")
@friendly
def replay_cmd(files: list[Path] = typer.Argument(..., help="a workload from `trace import`, or the trace files"),
               cluster: Path | None = typer.Option(None, "--cluster", help="host cluster YAML (bandwidth_bytes_per_s, "
                                                   "latency_s, message_overhead_s, network, cores); default: "
                                                   "fitted from the trace's own collectives"),
               network: str = typer.Option("", "--network", help="network model (default: the cluster's, flow)"),
               overhead: str = typer.Option("", "--overhead", help="per-message overhead of the fitted cluster "
                                            "(default: fitted with the bandwidth when the sizes allow, else 20us)"),
               world: int = typer.Option(0, "--world", help="what-if: replay at this many data-parallel ranks"),
               cores: int = typer.Option(-1, "--cores", help="cores the ranks share (scales the operators when "
                                         "--world changes the process count; default: the cluster's, 0 = none)"),
               on: Path | None = typer.Option(None, "--on", help="what-if: replay on this topotrain cluster (a "
                                              "scenario or cluster YAML), rank r on its r-th GPU; operators keep "
                                              "their measured times"),
               as_json: bool = typer.Option(False, "--json", help="print the result as JSON")) -> None:
    """Replay a recorded step through the engine on its own host (or --cluster), beside the measured one."""
    job = _job(files)
    if cluster is not None:
        host = load_host_cluster(cluster)
    else:
        host = fit_host_cluster(job, message_overhead_s=parse_time(overhead, "--overhead") if overhead else None)
    if network:
        host = HostCluster(host.name, host.bandwidth_bytes_per_s, host.latency_s, host.message_overhead_s, network,
                           host.cores)
    if not -1 <= cores <= MAX_CORES:
        raise ConfigError("--cores", f"must be from 0 to {MAX_CORES:,} (got {cores})", "give e.g. --cores 2")
    share = cores if cores >= 0 else host.cores
    scale = 1.0
    what_if = bool(world) and world != job.world_size
    if what_if:
        _check_replay_size(job, world)
        scale = core_share_scale(job.world_size, world, share)
        job = resize(job, world)
    target: HostCluster | Placement = host
    if on is not None:
        built = load_cluster(on)
        target = Placement(built.name, built.topology, tuple(built.topology.gpus),
                           get_model(network or "flow", built.network_params), built.network_params.message_overhead_s)
        what_if = True
    r = replay(job, target, scale)
    if as_json:
        print(dumps({"job": r.job, "cluster": r.cluster, "step_s": r.step_s,
                     "measured_step_s": None if what_if else r.measured_step_s,
                     "host_bandwidth_bytes_per_s": host.bandwidth_bytes_per_s, "compute_scale": scale,
                     "measured_comm_step_s": r.measured_comm_step_s, "critical_path_s": dict(r.critical),
                     "replayed": [vars(s) for s in r.replayed], "measured": [vars(s) for s in r.measured]}))
        return
    if isinstance(target, Placement):
        console.print(f"on {target.name}: {len(target.ranks)} GPUs, ranks 0-{job.world_size - 1} on the first "
                      f"{job.world_size}, network model {target.model.name}; operators as measured on the "
                      "recording host (no CPU→GPU scaling)")
    else:
        console.print(f"host cluster {host.name}: loopback {format_bandwidth(host.bandwidth_bytes_per_s)}, "
                      f"{format_time(host.message_overhead_s)} per message, network model {host.network}"
                      + (f"; operators ×{scale:.3g} ({share} shared cores)" if scale != 1.0 else ""))
    if what_if:
        console.print(f"{r.job}: replayed step {format_time(r.step_s)} on {r.cluster} (what-if: nothing measured "
                      "there)")
        return
    console.print(_table(r))
    path = ", ".join(f"{k} {format_time(v)}" for k, v in r.critical)
    console.print(f"critical path: {path}; with the measured collective times instead of the network model: "
                  f"step {format_time(r.measured_comm_step_s)}")
    console.print(f"{r.job}: replayed step {format_time(r.step_s)}, measured {format_time(r.measured_step_s)} "
                  f"({r.error * 100:+.1f}%)")


#: Most operators a what-if replay may hold (ranks × operators per rank): about 140 µs and 7.5 KB each, so
#: the limit bounds a replay near half a minute and 2 GB on one core (measured: resnet-w2 at --world 2048,
#: 268,288 operators: 37 s, 2.0 GB peak).
MAX_REPLAY_OPERATORS = 262_144
#: Most cores ``--cores`` may name (a typo past it, not a host).
MAX_CORES = 1_048_576


def _check_replay_size(job: TraceJob, world: int) -> None:
    """``--world`` refused by the replay it would build, before building it (``--world 100000000`` ran out of
    memory)."""
    if world < 0:
        raise ConfigError("--world", f"must be >= 1, got {world}", "give e.g. --world 4")
    per_rank = max((len(r.ops) for r in job.ranks), default=0)
    if world * per_rank > MAX_REPLAY_OPERATORS:
        raise ConfigError("--world", f"{world:,} ranks × {per_rank:,} operators per rank would replay "
                          f"{world * per_rank:,} operators, over the limit of {MAX_REPLAY_OPERATORS:,}",
                          f"give --world {max(1, MAX_REPLAY_OPERATORS // max(per_rank, 1)):,} or fewer")


def _check_prefix(prefix: str) -> None:
    """``-o PREFIX`` names files ``PREFIX.<rank>.et``: it must end in a file name, and a folder, a device or
    ``/dev/null`` as the prefix is a mistake (``-o DIR`` would write ``DIR.0.et`` beside the folder)."""
    if not prefix or prefix.endswith(("/", os.sep)) or Path(prefix).name in ("", ".", ".."):
        raise ConfigError("--out", f"{prefix!r} does not end in a file name", "give a prefix such as out/trace")
    p = Path(prefix)
    if p.exists() and not p.is_file():
        raise ConfigError("--out", f"{prefix} is a folder or a device, not a prefix of file names",
                          f"give a prefix such as {p / 'trace' if p.is_dir() else 'out/trace'}")
    check_output_path(f"{prefix}.0.et", field="--out", make_parents=True)


@trace_app.command("export")
@friendly
def export_cmd(files: list[Path] = typer.Argument(..., help="a workload from `trace import` (or the trace files), or "
                                                "a scenario YAML: its simulated iteration, one file per GPU"),
               out: str = typer.Option(..., "-o", "--out", help="prefix of the Chakra files: writes "
                                       "<prefix>.<rank>.et, one per rank (ASTRA-sim's naming)")) -> None:
    """Write a trace workload, or a scenario's simulated iteration, as Chakra execution traces, one per rank
    (the format ASTRA-sim reads)."""
    _check_prefix(out)
    if len(files) == 1 and files[0].suffix in (".yaml", ".yml"):
        sc = load_scenario(files[0])
        res = simulate(sc)
        with protect_inputs(files):
            written = export_iteration(res.plan, res.tasks, sc.cluster.topology.gpus, out, sc.name)
        what = (f"{sc.name}: simulated iteration {format_time(res.iteration_time_s)} on {res.gpus} GPUs "
                f"({len(res.tasks)} tasks)")
    else:
        job = _job(files)
        with protect_inputs(files):  # never replaces one of the files it reads
            written = export_chakra(job, out)
        what = f"{job.name}: {job.world_size} ranks, {sum(len(r.ops) for r in job.ranks)} operators, " \
               f"{len(job.collectives)} collectives"
    ets = [p for p in written if p.suffix == ".et"]
    size = sum(p.stat().st_size for p in ets)
    groups = [p for p in written if p.suffix == ".json"]
    console.print(f"{what}; wrote {len(ets)} Chakra files {ets[0]} ... {ets[-1]} ({format_size(size)})"
                  + (f" and {groups[0]}" if groups else ""))
