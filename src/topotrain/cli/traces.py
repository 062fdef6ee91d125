"""``topotrain trace import``, ``trace replay`` and ``trace export``: a recorded PyTorch step (every rank's
Kineto JSON and Execution Trace) or a Chakra execution trace in, topotrain's replay of it — on its own host,
or resized — out, and a workload out as Chakra (docs/traces.md). protobuf is imported only when a Chakra
file is read or written (``traces.chakra_pb2.messages``)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from topotrain.cli.common import app, console, friendly
from topotrain.collectives.protocol import CommLibrary
from topotrain.network.registry import get_model
from topotrain.report.trace import write_trace
from topotrain.scenario.cluster import cluster_from_dict, load_cluster, read_yaml
from topotrain.scenario.load import apply_overrides, load_scenario
from topotrain.scenario.spec import CommSpec
from topotrain.topology.graph import Topology
from topotrain.topology.routing import routing_mode
from topotrain.traces.chakra import export_chakra, import_chakra, is_chakra_path
from topotrain.traces.cluster import HostCluster, fit_host_cluster, load_host_cluster
from topotrain.traces.gpu import DTYPE_OF_ELEM, on_gpu
from topotrain.traces.importer import import_job_at
from topotrain.traces.model import TraceJob, is_job_dict, job_from_dict, save_job
from topotrain.traces.readers import load_json, parse_step
from topotrain.traces.whatif import core_share_scale, on_shared_host, resize
from topotrain.training.bands import describe as describe_band
from topotrain.training.chakra_export import export_iteration
from topotrain.training.replay import Placement, Replay, cluster_placement, host_placement, replay
from topotrain.training.replay_result import ReplayContext, replay_result
from topotrain.training.simulate import Result, simulate
from topotrain.util.atomic import check_output_path, protect_inputs
from topotrain.util.errors import ConfigError
from topotrain.util.jsonsafe import dumps
from topotrain.util.problems import validated
from topotrain.util.units import format_bandwidth, format_size, format_time, parse_time

trace_app = typer.Typer(rich_markup_mode=None, help="Recorded PyTorch steps: import, replay, what-if.")
app.add_typer(trace_app, name="trace")


#: ``--step``'s help (trace import, replay, export) and the meaning of ``workload.step`` in a scenario.
STEP_HELP = ("which profiled step of a Kineto trace to import when it holds several: last (default), median (the "
             "step whose job step time, the slowest rank's, is the median; the lower one for an even count) or N "
             "(ProfilerStep#N)")


def _step(step: str, field: str = "--step") -> str | int:
    return parse_step(step, field)


def _not_kineto(what: str, step: str | int, field: str) -> None:
    """``--step`` chooses among a Kineto trace's steps: a workload or Chakra file holds one step already."""
    if step != "last":
        raise ConfigError(field, f"chooses among a Kineto trace's profiled steps, and {what} holds one step "
                          "already", f"pass the recorded Kineto and ET files with {field}, or drop {field}")


def _traces(files: list[Path], name: str = "", step: str | int = "last", field: str = "--step") -> TraceJob:
    """The job in trace files: every rank's Chakra ET (``*.et``), or every rank's Kineto JSON and ET JSON
    (``step``: which profiled step, :func:`topotrain.traces.importer.choose_step`)."""
    return _traces_at(files, name, step, field)[0]


def _traces_at(files: list[Path], name: str = "", step: str | int = "last",
               field: str = "--step") -> tuple[TraceJob, str]:
    """:func:`_traces`, and which profiled step it took in words where the Kineto files hold several ("" for
    one, or a Chakra trace)."""
    chakra = [is_chakra_path(f) for f in files]
    if any(chakra) and not all(chakra):
        odd = files[chakra.index(False)] if chakra[0] else files[chakra.index(True)]
        raise ConfigError(str(odd), "mixes Chakra execution traces (.et) with PyTorch JSON traces",
                          "pass one job's files of one kind")
    if files and all(chakra):
        _not_kineto(f"the Chakra trace {files[0]}", step, field)
    try:
        if files and all(chakra):
            return import_chakra(files, name), ""
        job, chosen = import_job_at(files, name, step)
        return job, chosen.describe() if len(chosen.times_s) > 1 else ""
    except (TypeError, KeyError, AttributeError, IndexError) as e:
        # a recorded trace is untrusted JSON: a value of the wrong shape where the reader expects a number, a
        # list or an object (a list as a pid was "internal error TypeError: unhashable type: 'list'")
        where = ", ".join(str(f) for f in files[:2]) + (", ..." if len(files) > 2 else "")
        raise ConfigError("files", f"{where}: not a trace this reader understands ({type(e).__name__}: {e})",
                          "pass the files a PyTorch profiler run (Kineto JSON + Execution Trace) or Chakra "
                          "export wrote, unedited") from None


def _job(files: list[Path], step: str | int = "last", field: str = "--step") -> TraceJob:
    """One written workload, or the job recorded in trace files (``step``: which profiled step)."""
    if len(files) == 1 and not is_chakra_path(files[0]):
        doc = load_json(files[0])
        if is_job_dict(doc):
            _not_kineto(f"the workload {files[0]}", step, field)
            return job_from_dict(doc, str(files[0]))
    return _traces(files, step=step, field=field)


@trace_app.command("import")
@friendly
def import_cmd(files: list[Path] = typer.Argument(..., help="every rank's Kineto JSON and ET JSON (.json or .json.gz), "
                                                "or every rank's Chakra execution trace (<prefix>.<rank>.et)"),
               out: Path = typer.Option(..., "-o", "--out", help="the workload to write (JSON)"),
               name: str = typer.Option("", "--name", help="the job's name (default: the files' folder)"),
               step: str = typer.Option("last", "--step", help=STEP_HELP)) -> None:
    """Read a recorded step (Kineto + Execution Trace, or Chakra ET, per rank) and write it as a topotrain workload."""
    job, at = _traces_at(files, name, _step(step))
    with protect_inputs(files):  # -o never replaces one of the traces it reads
        save_job(job, out)
    ops = sum(len(r.ops) for r in job.ranks)
    size = sum(c.size_bytes for c in job.collectives)
    console.print(f"{job.name}: {job.world_size} ranks ({job.backend}), {ops} operators, {len(job.collectives)} "
                  f"collectives ({format_size(size)}), measured step {format_time(job.measured_step_s)}"
                  + (f", {at}" if at else "") + f"; wrote {out}")


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
               network: str | None = typer.Option(None, "--network",
                                                  help="network model (default: the cluster's, flow)"),
               overhead: str = typer.Option("", "--overhead", help="per-message overhead of the fitted cluster "
                                            "(default: fitted with the bandwidth when the sizes allow, else 20us)"),
               world: int = typer.Option(0, "--world", help="what-if: replay at this many data-parallel ranks"),
               cores: int = typer.Option(-1, "--cores", help="cores the ranks share (scales the operators when "
                                         "--world changes the process count; default: the cluster's, 0 = none)"),
               on: Path | None = typer.Option(None, "--on", help="what-if: replay on this topotrain cluster (a "
                                              "scenario or cluster YAML), rank r on its r-th GPU; operators keep "
                                              "their measured times"),
               step: str = typer.Option("last", "--step", help=STEP_HELP),
               as_json: bool = typer.Option(False, "--json", help="print the result as JSON")) -> None:
    """Replay a recorded step through the engine on its own host (or --cluster), beside the measured one."""
    if network is not None and not network.strip():
        raise ConfigError("--network", "is empty", "give a network model, e.g. --network flow, or leave it out")
    job = _job(files, _step(step))
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
        if on is None:  # gloo's collectives are CPU work on the same cores: the operators share them with it,
            # the collectives run on the shared host, and FSDP2's waits inside its hooks last as long as they do
            job, host, scale = on_shared_host(job, world, host, share)
        else:  # another cluster: the collectives on its network, the waits inside operators as recorded
            job, scale = resize(job, world), core_share_scale(job.world_size, world, share)
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
                                       "<prefix>.<rank>.et, one per rank (ASTRA-sim's naming)"),
               step: str = typer.Option("last", "--step", help=STEP_HELP)) -> None:
    """Write a trace workload, or a scenario's simulated iteration, as Chakra execution traces, one per rank
    (the format ASTRA-sim reads)."""
    _check_prefix(out)
    choice = _step(step)
    if len(files) == 1 and files[0].suffix in (".yaml", ".yml"):
        _not_kineto(f"the scenario {files[0]} (one simulated iteration)", choice, "--step")
        sc = load_scenario(files[0])
        res = simulate(sc)
        with protect_inputs(files):
            written = export_iteration(res.plan, res.tasks, sc.cluster.topology.gpus, out, sc.name)
        what = (f"{sc.name}: simulated iteration {format_time(res.iteration_time_s)} on {res.gpus} GPUs "
                f"({len(res.tasks)} tasks)")
    else:
        job = _job(files, choice)
        with protect_inputs(files):  # never replaces one of the files it reads
            written = export_chakra(job, out)
        what = f"{job.name}: {job.world_size} ranks, {sum(len(r.ops) for r in job.ranks)} operators, " \
               f"{len(job.collectives)} collectives"
    ets = [p for p in written if p.suffix == ".et"]
    size = sum(p.stat().st_size for p in ets)
    groups = [p for p in written if p.suffix == ".json"]
    console.print(f"{what}; wrote {len(ets)} Chakra files {ets[0]} ... {ets[-1]} ({format_size(size)})"
                  + (f" and {groups[0]}" if groups else ""))


# ---------------------------------------------------------------------------------- simulate a trace
#: The sections a scenario with a trace workload may have (the rest describe a model's plan: not a trace's).
TRACE_SCENARIO_KEYS = ("name", "cluster", "workload", "model", "network", "comm", "plan")
#: The fields of ``workload:`` (docs/traces.md, "simulate a recorded step").
WORKLOAD_KEYS = ("trace", "world", "compute", "batch", "cores", "step")
_TRACE_SUFFIXES = (".workload.json", ".workload.json.gz", ".et", ".et.gz")


def _names_trace(v: object) -> bool:
    return isinstance(v, str) and v.endswith(_TRACE_SUFFIXES)


def is_trace_workload(path: Path) -> bool:
    """Whether ``simulate``'s argument is a recorded step: a workload from ``trace import`` (or a Chakra
    ``.et``), or a scenario YAML whose ``workload:`` (or ``model:``) names one."""
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            return False
        data = read_yaml(path)
        return isinstance(data, dict) and ("workload" in data or _names_trace(data.get("model")))
    if is_chakra_path(path) or path.name.endswith(_TRACE_SUFFIXES):
        return True
    if path.suffix in (".json", ".gz") and path.is_file():
        return is_job_dict(load_json(path))
    return False


def _trace_files(ref: object, base: Path, field: str) -> list[Path]:
    """The files ``workload.trace`` names (relative to the scenario's folder): a workload JSON, one Chakra
    prefix (``<prefix>.<rank>.et``), a folder of one job's Kineto and ET files, or a list of files."""
    refs = ref if isinstance(ref, list) else [ref]
    if not refs or not all(isinstance(r, str) and r for r in refs):
        raise ConfigError(field, f"must name a trace workload (a path or a list of paths), got {ref!r}",
                          "give e.g. trace: gpt-w2.workload.json (written by `topotrain trace import`)")
    files: list[Path] = []
    for r in refs:
        p = base / str(r)
        if p.is_dir():
            found = sorted(p.glob("rank*.json*")) or sorted(p.glob("*.et"))
        elif p.exists():
            found = [p]
        else:
            found = sorted(p.parent.glob(f"{p.name}.*.et")) + sorted(p.parent.glob(f"{p.name}.*.et.gz"))
        if not found:
            raise ConfigError(field, f"{p} does not exist (nor {p}.<rank>.et)",
                              "give a workload written by `topotrain trace import`, or a Chakra prefix")
        files.extend(found)
    return files


def _positive(v: object, field: str, example: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(field, f"must be an integer >= 1, got {v!r}", f"give e.g. {field.split('.')[-1]}: {example}")
    return v


@dataclass(frozen=True)
class TraceRun:
    """A trace workload simulated: the result as ``simulate`` gives it, the replay behind it, and what the
    trace section of the JSON says (the compute rescale, the what-if switches, the measured step)."""

    result: Result
    replay: Replay
    topology: Topology
    extra: dict[str, Any]


def simulate_trace(path: Path, overrides: list[str] | None = None) -> TraceRun:
    """Simulate the recorded step ``path`` names (:func:`is_trace_workload`): replayed on the scenario's
    cluster — its network model, collective algorithm (``plan.dp_algorithm``) and library — with the
    operators re-timed on its GPU (``workload.compute: gpu``, the default there) or as measured; or, for a
    bare workload, on the recording host fitted from the trace. ``workload.world`` is the data-parallel
    what-if, ``workload.cores`` the host's shared cores, ``workload.batch`` the global batch."""
    if path.suffix in (".yaml", ".yml"):
        data, base = read_yaml(path), path.parent
        if not isinstance(data, dict):
            raise ConfigError("scenario", f"{path} is not a mapping of sections", "see docs/traces.md")
        data = dict(data)
    else:  # one Chakra file stands for its job: every <prefix>.<rank>.et beside it
        m = re.match(r"(.+)\.\d+\.et(\.gz)?$", path.name)
        data, base = {"workload": {"trace": m.group(1) if m else path.name}}, path.parent
    data = apply_overrides(data, list(overrides or []))
    for key in data:
        if key not in TRACE_SCENARIO_KEYS:
            raise ConfigError(key, "is not used with a trace workload (the trace fixes the model, batch and plan)",
                              f"remove it; a trace scenario has {', '.join(TRACE_SCENARIO_KEYS)}")
    wl = data.get("workload", {"trace": data.get("model")})
    if isinstance(wl, str):
        wl = {"trace": wl}
    if not isinstance(wl, dict):
        raise ConfigError("workload", f"must be a path or a mapping, got {type(wl).__name__}",
                          "give workload: {trace: job.workload.json, world: 8}")
    if "workload" in data and "model" in data:
        raise ConfigError("model", "is given beside workload: the trace is the model", "remove model:")
    for key in wl:
        if key not in WORKLOAD_KEYS:
            raise ConfigError(f"workload.{key}", "is not a field of a trace workload",
                              f"use {', '.join(WORKLOAD_KEYS)}")
    plan = data.get("plan") or {}
    if not isinstance(plan, dict) or set(plan) - {"dp_algorithm"}:
        odd = sorted(set(plan) - {"dp_algorithm"})[0] if isinstance(plan, dict) else ""
        raise ConfigError(f"plan.{odd}".rstrip("."), "is not used with a trace workload (only plan.dp_algorithm: the "
                          "collectives' algorithm)", "remove it")
    job = _job(_trace_files(wl.get("trace"), base, "workload.trace"), parse_step(wl.get("step", "last"),
                                                                                  "workload.step"), "workload.step")
    recorded = job.world_size
    world = _positive(wl.get("world", recorded), "workload.world", "8")
    batch = _positive(wl["batch"], "workload.batch", "64") if "batch" in wl else 0
    if batch and batch % world:
        raise ConfigError("workload.batch", f"{batch} samples do not split over {world} ranks",
                          f"give a multiple of {world}")
    name = str(data.get("name") or path.name.split(".")[0])
    extra: dict[str, Any] = {"recorded_world_size": recorded, "world_size": world,
                             "measured_step_s": job.measured_step_s, "source": job.name}
    if "cluster" not in data:
        return _on_host(job, wl, world, batch, name, data, extra)
    return _on_cluster(job, wl, world, batch, name, data, base, extra)


def _on_host(job: TraceJob, wl: dict[str, Any], world: int, batch: int, name: str, data: dict[str, Any],
             extra: dict[str, Any]) -> TraceRun:
    """The recording host (fitted from the trace), the operators as measured (scaled by core sharing)."""
    if wl.get("compute", "measured") != "measured":
        raise ConfigError("workload.compute", "a GPU re-timing needs a GPU: there is no cluster here",
                          "add a cluster: section (a scenario's cluster), or compute: measured")
    if "comm" in data or "plan" in data:
        raise ConfigError("comm" if "comm" in data else "plan", "applies to a cluster, and the replay runs on the "
                          "recording host", "add a cluster: section, or remove it")
    host = fit_host_cluster(job)
    if "network" in data:
        host = replace(host, network=str(data["network"]))
    cores = wl.get("cores", 0)
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 0:
        raise ConfigError("workload.cores", f"must be an integer >= 0, got {cores!r}", "give e.g. cores: 2")
    job, host, scale = on_shared_host(job, world, host, cores)  # the recorded size: the job as it is
    r = replay(job, host, scale)
    kind = "host" if world == extra["recorded_world_size"] else "resized"
    ctx = ReplayContext(name, job.name, "cpu (the recording host)", 0.0, host.network, job.backend or "gloo", "-",
                        batch, 0.0, kind)
    extra.update(compute="measured", compute_scale=scale, cores=cores, cluster=host.name,
                 host_bandwidth_bytes_per_s=host.bandwidth_bytes_per_s)
    place = host_placement(host, world)
    return TraceRun(replay_result(r, ctx), r, place.topology, extra)


def _on_cluster(job: TraceJob, wl: dict[str, Any], world: int, batch: int, name: str, data: dict[str, Any],
                base: Path, extra: dict[str, Any]) -> TraceRun:
    """The scenario's cluster: rank r on its r-th GPU, the operators re-timed on its GPU (or as measured)."""
    if "cores" in wl:
        raise ConfigError("workload.cores", "is the recording host's core count: a cluster's GPUs share none",
                          "remove it")
    cluster = cluster_from_dict(data["cluster"], base)
    gpus = len(cluster.topology.gpus)
    if gpus != world:
        fix = (f"replay it at {gpus} data-parallel ranks: workload.world: {gpus} (--set workload.world={gpus}), "
               f"or give a cluster of {world} GPUs")
        raise ConfigError("workload.world" if "world" in wl else "cluster",
                          f"the trace has {world} ranks and the cluster {gpus} GPUs", fix)
    if cluster.mixed:
        raise ConfigError("cluster.groups", "a trace is replayed on one GPU type", "give a cluster of one GPU type")
    network = str(data.get("network", "flow"))
    library = CommLibrary(validated(CommSpec, data.get("comm") or {}, "comm").library)
    algorithm = str((data.get("plan") or {}).get("dp_algorithm", "auto"))
    compute = wl.get("compute", "gpu")
    if compute not in ("gpu", "measured"):
        raise ConfigError("workload.compute", f"is {compute!r}", "give gpu (re-timed by the compute model) or measured")
    if world != job.world_size:
        job = resize(job, world)
    spec = cluster.gpu_spec
    flops = 0.0
    if compute == "gpu":
        job, rescale = on_gpu(job, spec)
        flops = rescale.flops_per_rank
        extra["rescale"] = rescale.to_dict()
    place = cluster_placement(cluster.name, cluster.topology, get_model(network, cluster.network_params),
                              cluster.network_params.message_overhead_s, library, algorithm, spec.name)
    r = replay(job, place)
    dtype = DTYPE_OF_ELEM.get(next((k.elem_bytes for rt in job.ranks for o in rt.ops for k in o.kernels), 4), "fp32")
    peak = spec.peak(dtype) if dtype in spec.peak_flops_per_s else 0.0
    ctx = ReplayContext(name, job.name, spec.name, peak, network, library.name, routing_mode(cluster.topology.meta),
                        batch, flops, "elsewhere", algorithm)
    extra.update(compute=compute, cluster=cluster.name, algorithm=algorithm, mfu_dtype=dtype)
    return TraceRun(replay_result(r, ctx), r, cluster.topology, extra)


def print_trace_run(run: TraceRun) -> None:
    """The result table of ``simulate`` for a trace workload, and what the trace adds (module docstring)."""
    r, x = run.result, run.extra
    d = r.to_dict()
    t = Table(title=f"{d['model']} (recorded step) on {d['gpus']} x {d['gpu']}, {d['network']} network")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("communication", f"{d['comm']['library']} library" + (
        f", {x['algorithm']} algorithm, {d['routing']} routing" if "algorithm" in x else ""))
    t.add_row("iteration time", format_time(r.iteration_time_s) + f"  ± {describe_band(d['error_band'])}")
    t.add_row("throughput", "not in the trace (give workload.batch)" if math.isnan(r.samples_per_s)
              else f"{r.samples_per_s:,.1f} samples/s")
    if not math.isnan(r.tflops_per_gpu):
        t.add_row("TFLOP/s per GPU (recognized kernels)", f"{r.tflops_per_gpu:.2f}")
        t.add_row(f"MFU ({x['mfu_dtype']} peak)", f"{100 * r.mfu:.2f}%")
    b = r.breakdown
    for v, label in ((b.compute_s, "operators and host gaps"), (b.exposed_comm_s, "waiting for collectives"),
                     (b.bubble_s, "start after the earliest rank"),
                     (b.overlapped_comm_s, "comm hidden under operators")):
        share = v / r.iteration_time_s if r.iteration_time_s else 0.0
        t.add_row(f"  {label}", f"{format_time(v)}  ({100 * share:.1f}%)")
    t.add_row("tasks simulated", str(len(r.tasks)))
    for i, (a, bb, u) in enumerate(r.link_utilization_top[:3]):
        t.add_row("busiest links" if i == 0 else "", f"{a}→{bb}  {100 * u:.1f}%")
    console.print(t)
    what = [f"measured {format_time(x['measured_step_s'])} at {x['recorded_world_size']} ranks"]
    if x["world_size"] != x["recorded_world_size"]:
        what.append(f"what-if at {x['world_size']} ranks (collectives resized)")
    if x["compute"] == "measured":
        what.append("operators at their measured CPU times" + (
            f" ×{x['compute_scale']:.3g} ({x['cores']} shared cores)" if x.get("compute_scale", 1.0) != 1.0 else ""))
    console.print(f"trace {x['source']}: " + "; ".join(what))
    rs = x.get("rescale")
    if rs:
        parts = ", ".join(f"{k} {v['kernels']} ({100 * v['fraction_of_measured']:.1f}%)"
                          for k, v in rs["kinds"].items())
        console.print(f"re-timed on {rs['gpu']} by the compute model: {100 * rs['rescaled_fraction']:.1f}% of the "
                      f"measured time — {parts}; kept at measured time: "
                      f"{100 * rs['kept']['fraction_of_measured']:.1f}% (unrecognized parts of operators, host gaps); "
                      "largest kept: " + ", ".join(f"{k} {format_time(v)}" for k, v in rs["kept"]["largest"].items()))


def simulate_trace_cmd(path: Path, overrides: list[str], as_json: bool, trace: Path | None,
                       html_out: Path | None, resolved: bool) -> None:
    """``simulate`` of a trace workload: the table (or ``--json``: the result's JSON with a ``trace``
    section), and ``--trace`` the replayed timeline."""
    if html_out is not None or resolved:
        raise ConfigError("--html" if html_out is not None else "--resolved", "takes a scenario of a model, not a "
                          "recorded step", "use simulate's table or --json (and --trace) for a trace workload")
    run = simulate_trace(path, overrides)
    if trace is not None:
        write_trace(run.result, trace, run.topology)
    if as_json:
        print(dumps({**run.result.to_dict(), "trace": run.extra}))
        return
    print_trace_run(run)
    if trace is not None:
        console.print(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")


def refuse_trace(path: Path | None, verb: str) -> None:
    """A verb that needs a model's scenario (``report``, ``scale``) given a recorded step: one clear error."""
    if path is not None and is_trace_workload(path):
        raise ConfigError(str(path), f"is a recorded step (a trace workload): `{verb}` takes a scenario of a model",
                          f"use `topotrain simulate {path}` (table, --json, --trace; --set workload.world=N)")
