"""Record real training steps on the CPU: a small GPT-like model and a small ResNet under DDP, or FSDP2
(models ``gpt-fsdp``, ``resnet-fsdp``; ``mlp``, a two-layer MLP, the smallest job), with gloo on 2 to 4
processes on 127.0.0.1, ``--steps`` profiled steps per rank (5 by default), as the Kineto JSON of
``torch.profiler`` (CPU activities) and the Execution Trace of ``torch.profiler.ExecutionTraceObserver``
(docs/traces.md).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/trace_record.py --out /tmp/traces [--models gpt,resnet]
[--worlds 2,3,4] [--steps K] [--gzip] [--trim] [--replay | --replay-only] [--cores N] [--repeats R] [--compare]``
(``--repeats``: every job R times into ``OUT/r<i>/``, each model's worlds side by side in time, and the
what-ifs' medians; ``--compare``: each part of the step at the smallest and largest world). Beside each job
it writes ``load.json`` (load average, the other users' runnable threads before and while it ran, the other
scheduling groups' runnable threads sampled every 0.1 s) and each rank's ``cputime.r<rank>.json``: per
profiled step (``steps``, each with its ``ProfilerStep`` number ``step``) its wall, main-thread and process
CPU time (from the iteration's start to after its ``prof.step()``, which for the last one stops the
profiler), every thread's scheduler counters (``threads``, from the reading after the previous step's work to
the reading after this step's work, both before their ``prof.step()``) and the main thread's use per part of
the step (``main_thread_phases``); the file's top level repeats the last profiled step (what a one-step
recording wrote). ``benchmarks/whatif_probe.py`` reads the median step's entry.
Each job is written to
``OUT/<model>-w<world>/`` as ``rank<r>.kineto.json`` and ``rank<r>.et.json`` (``.json.gz`` with ``--gzip``;
``--trim`` keeps only what the import reads, as the test fixtures under tests/data/traces/ are stored) and
prints one line: the job, which profiled step stands for it (the median step by job step time, the
slowest rank's ``ProfilerStep`` span; the lower median for an even count; every step's job step time
printed) and that step's time (the slowest rank's span, the median over ranks beside it). Every job runs in its own
process group on a free loopback port, under a wall-clock limit (``--timeout-s``): a hung job is killed with
its processes, and the run fails with the job named. Traffic stays on 127.0.0.1.

``--replay`` then imports every job at that median step (``topotrain trace import --step median``: one
profiled step is a noisy sample of the job's step time on a shared host, so the step that stands for it is
the median of several) and replays it through topotrain's engine on the host cluster fitted
from its own collectives (``topotrain trace replay``), printing the error per job, the median and worst over
the jobs, and for each model recorded at 2 and more processes the what-if: the larger world predicted from
the 2-process trace (collectives resized; the operators slowed by the CPU the ranks demand on ``--cores``
cores, gloo's collectives' CPU counted, the waits inside FSDP2's hooks made waits for their collectives,
with more ranks than cores each collective's hops waiting for a core for half the kernel's slice,
``traces.whatif.on_shared_host``), and beside it the same without that
wait and processor sharing of the operators alone (×W/C) for comparison. With ``--repeats`` the summary
gives each what-if's median prediction over the repeats against the median measured step (the job's error,
median predicted / median measured − 1) and the median |error| over the job-repeats; for the main rule each
job's line carries a 90% bootstrap interval of that error over the repeats (:func:`job_error_interval`:
2,000 resamples of the repeats, seed 0), and a last line lists every job's error with its interval and how
many jobs are within 10% (and how many have the whole interval within ±10%).

The steps profiled follow ``--warmup`` unprofiled steps and one profiler warm-up step
(``schedule(wait=0, warmup=1, active=K)``), so gloo's connections and DDP's buckets are built before them (as
a user profiles a steady state); ``--steps 1`` records the one step recorded before ``--steps`` existed.
Each rank uses ``--threads`` intra-op threads (1 by default: the processes share the machine's cores, and a
replay must know how many there are).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from topotrain.traces.cluster import fit_host_cluster
from topotrain.traces.importer import choose_step, import_job, import_job_at, job_step_times
from topotrain.traces.readers import load_json, read_kineto_steps
from topotrain.traces.whatif import core_share_scale, group_share_scale, on_shared_host, resize, shared_host
from topotrain.training.replay import replay
from topotrain.util.errors import ConfigError


class Block(nn.Module):
    """One pre-norm transformer block (GPT-2's layout): attention and a 4x MLP, each with a residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small GPT: token and position embeddings, ``layers`` blocks, a final norm and the vocabulary head."""

    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


class Basic(nn.Module):
    """ResNet's basic block (He et al. 2016): two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.sc = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                   if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.sc(x))


class TinyResNet(nn.Module):
    """A small CIFAR-style ResNet: a stem and three stages of one basic block each (16, 32, 64 channels)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.stages = nn.Sequential(Basic(16, 16, 1), Basic(16, 32, 2), Basic(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.stages(self.stem(x)).mean((2, 3)))


def _model_and_batch(name: str, batch: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if name == "gpt":
        seq, vocab = 64, 512
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        return TinyGPT(vocab=vocab, seq=seq), idx, torch.randint(0, vocab, (batch, seq), generator=g)
    if name == "resnet":
        return TinyResNet(), torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    if name == "mlp":  # the smallest job (85 k parameters, two DDP buckets): small multi-step test fixtures
        mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        return mlp, torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    raise SystemExit(f"unknown model {name!r} (gpt, resnet or mlp, each optionally -fsdp)")


def _worker(rank: int, world: int, port: int, model_name: str, out: str, warmup: int, threads: int,
            batch: int, bucket_mb: float, steps: int = 1) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    from datetime import timedelta

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        model, x, y = _model_and_batch(model_name.removesuffix("-fsdp"), batch)
        if model_name.endswith("-fsdp"):  # FSDP2: each block (stage) its own all-gather / reduce-scatter unit
            from torch.distributed.fsdp import fully_shard

            for unit in getattr(model, "blocks", None) or model.stages:
                fully_shard(unit)
            ddp = fully_shard(model)
        else:
            ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()

        phases: list[tuple[str, tuple[float, ...]]] = []  # the main thread's use at each part's end

        def step() -> None:
            phases[:] = [("start", main_thread_use())]
            opt.zero_grad(set_to_none=True)
            logits = ddp(x)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            phases.append(("forward", main_thread_use()))
            loss.backward()
            phases.append(("backward", main_thread_use()))
            opt.step()
            phases.append(("optimizer", main_thread_use()))

        for _ in range(warmup):
            step()
        dist.barrier()
        et_path = os.path.join(out, f"rank{rank}.et.json")
        kineto_path = os.path.join(out, f"rank{rank}.kineto.json")
        et = torch.profiler.ExecutionTraceObserver().register_callback(et_path)
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1),
            execution_trace_observer=et)
        # per profiled step: read outside its span, after the step's work and before its prof.step() (the
        # first reading after the warm-up step); the wall and CPU clocks from the iteration's start to after
        # its prof.step() (which, for the last, stops the profiler)
        sched = []
        per_step: list[dict[str, Any]] = []
        with prof:
            for i in range(1 + steps):
                t = (time.perf_counter(), time.thread_time(), time.process_time())
                step()
                sched.append(thread_sched())
                number = prof.step_num  # the ProfilerStep#N this iteration ran as
                prof.step()
                spent = [b - a for a, b in zip(t, (time.perf_counter(), time.thread_time(), time.process_time()),
                                                strict=True)]
                if i:
                    per_step.append({"step": number, "wall_s": spent[0], "main_thread_cpu_s": spent[1],
                                     "process_cpu_s": spent[2],
                                     "threads": sched_delta(sched[-2], sched[-1], threading.get_native_id()),
                                     "main_thread_phases": phase_use(phases)})
        prof.export_chrome_trace(kineto_path)
        with open(os.path.join(out, f"cputime.r{rank}.json"), "w") as f:  # the profiled steps' CPU use
            json.dump(per_step[-1] | {"steps": per_step}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


#: Per thread, what ``sched_delta`` reports: CPU ns, ns runnable but waiting for a core, times it ran,
#: voluntary (it blocked) and involuntary (it was preempted) context switches, minor page faults, and its
#: CPU split into user and system time in clock ticks (/proc's USER_HZ, 10 ms: coarse).
SCHED_FIELDS = ("cpu_ns", "runqueue_wait_ns", "timeslices", "voluntary_switches", "involuntary_switches",
                "minor_faults", "user_ticks", "system_ticks")


def thread_sched() -> dict[int, tuple[str, tuple[int, ...]]]:
    """Each thread of this process now: its name and the counters of :data:`SCHED_FIELDS`, from
    /proc/self/task/<tid>/schedstat (the scheduler's own run and run-queue-wait clocks, in ns;
    Documentation/scheduler/sched-stats.rst), .../status (context switches) and .../stat (faults, ticks;
    proc(5)). Empty where there is no /proc."""
    out: dict[int, tuple[str, tuple[int, ...]]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                run, wait, slices = (int(x) for x in f.read().split()[:3])
            with open(f"{base}/status") as f:
                sw = {k: int(v) for k, v in (ln.split(":") for ln in f if "ctxt_switches" in ln)}
            with open(f"{base}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()  # proc(5): state is field 3, minflt 10, utime 14
        except (OSError, ValueError):
            continue
        out[int(tid)] = (name, (run, wait, slices, sw.get("voluntary_ctxt_switches", 0),
                                sw.get("nonvoluntary_ctxt_switches", 0), int(st[7]), int(st[11]), int(st[12])))
    return out


#: What :func:`main_thread_use` reads (getrusage(RUSAGE_THREAD), getrusage(2)), per part of the step.
USE_FIELDS = ("wall_s", "user_s", "system_s", "minor_faults", "voluntary_switches", "involuntary_switches")


def main_thread_use() -> tuple[float, ...]:
    """The calling thread's :data:`USE_FIELDS` so far (wall: ``time.perf_counter``)."""
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return (time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt, r.ru_nvcsw, r.ru_nivcsw)


def phase_use(marks: list[tuple[str, tuple[float, ...]]]) -> dict[str, dict[str, float]]:
    """Each part of the step (forward with the loss, backward, optimizer) as :data:`USE_FIELDS` spent in it,
    from the marks :func:`main_thread_use` took at its end (the first mark: the step's start)."""
    return {name: dict(zip(USE_FIELDS, (b - a for a, b in zip(prev, now, strict=True)), strict=True))
            for (_, prev), (name, now) in zip(marks, marks[1:], strict=False)}


def sched_delta(before: dict[int, tuple[str, tuple[int, ...]]], after: dict[int, tuple[str, tuple[int, ...]]],
                main_tid: int) -> list[dict[str, Any]]:
    """Each thread's :data:`SCHED_FIELDS` spent between two :func:`thread_sched` readings (a thread born in
    between counts from zero), its name and whether it is ``main_tid``; threads that did nothing left out."""
    rows = []
    for tid, (name, now) in sorted(after.items()):
        then = before.get(tid, (name, (0,) * len(now)))[1]
        d = [b - a for a, b in zip(then, now, strict=True)]
        if any(d):
            rows.append({"tid": tid, "name": name, "main": tid == main_tid} | dict(zip(SCHED_FIELDS, d, strict=True)))
    return rows


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def step_choice(paths: list[Path], choice: str = "median") -> tuple[int, dict[int, float], list[float]]:
    """The profiled step the replay and the what-if use (``traces.importer.choose_step``: the median step by
    job step time, the slowest rank's ``ProfilerStep`` span), every profiled step's job step time by step
    number, and each rank's span (s) at the chosen step, by rank."""
    read = {}
    for p in paths:
        if "kineto" in p.name:
            k = read_kineto_steps(load_json(p), str(p))
            read[k.rank] = k
    number = choose_step(read, choice)
    return number, job_step_times(read), [read[r].steps[number].dur_us / 1e6 for r in sorted(read)]


def describe_choice(number: int, times: dict[int, float]) -> str:
    """``ProfilerStep#N`` and what it was chosen from, for the printed lines."""
    if len(times) == 1:
        return f"ProfilerStep#{number}, the one profiled step"
    ts = sorted(times.values())
    return (f"ProfilerStep#{number}, the median of {len(times)} profiled steps by job step time "
            f"({', '.join(f'{times[n] * 1e3:.1f}' for n in sorted(times))} ms; min {ts[0] * 1e3:.1f}, max "
            f"{ts[-1] * 1e3:.1f})")


_KEEP_ARGS = ("Record function id", "Input Dims", "Input type")


def trim_kineto(doc: dict[str, Any]) -> dict[str, Any]:
    """A Kineto document cut to what ``topotrain trace import`` reads (for small test fixtures): the
    metadata and complete events inside the profiled step, each with its record-function id, and the input
    dims and types of the collectives' events only; times rounded to 0.1 µs."""
    steps = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    t0, t1 = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    events = []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or not (t0 - 1 <= e.get("ts", -1) <= t1 + 1):
            continue
        comm = str(e.get("name", "")).startswith(("c10d::", "gloo:", "nccl:", "fsdp::"))  # sizes, FSDP shapes
        args = {k: v for k, v in (e.get("args") or {}).items() if k in _KEEP_ARGS and (comm or k == _KEEP_ARGS[0])}
        events.append({"ph": "X", "cat": e.get("cat"), "name": e["name"], "pid": e["pid"], "tid": e["tid"],
                       "ts": round(e["ts"], 1), "dur": round(e["dur"], 1), "args": args})
    return {k: doc[k] for k in ("schemaVersion", "distributedInfo", "baseTimeNanoseconds") if k in doc} | {
        "traceEvents": events}


def trim_et(doc: dict[str, Any]) -> dict[str, Any]:
    """An Execution Trace cut to what the import reads: each node's id, name, parent, record-function id, the
    tensors of its inputs and outputs (the tuples its data dependencies come from) and their shapes (the
    FLOPs of the GPU what-if, traces/work.py)."""
    def tensors(v: Any) -> Any:
        if isinstance(v, list):
            if len(v) == 6 and all(type(x) is int for x in v[:5]) and isinstance(v[5], str):
                return v
            kept = [t for t in (tensors(x) for x in v) if t is not None]
            return kept or None
        return None

    def side(d: Any) -> dict[str, Any]:  # the tensors, each argument's shape (what the GPU what-if reads)
        out = {"values": tensors(d.get("values")) or []}
        return out | ({"shapes": d["shapes"]} if isinstance(d.get("shapes"), list) else {})

    nodes = []
    for n in doc["nodes"]:
        rf = [a for a in n.get("attrs", []) if a.get("name") == "rf_id"]
        nodes.append({"id": n["id"], "name": n["name"], "ctrl_deps": n.get("ctrl_deps"), "attrs": rf,
                      "inputs": side(n.get("inputs") or {}), "outputs": side(n.get("outputs") or {})})
    return {k: doc[k] for k in ("schema", "pid", "time", "start_ts", "finish_ts") if k in doc} | {"nodes": nodes}


def _running() -> int:
    """/proc/stat's ``procs_running``: the host's runnable threads now (-1 where it is not there)."""
    try:
        with open("/proc/stat") as f:
            return int(next(x for x in f if x.startswith("procs_running")).split()[1])
    except (OSError, StopIteration, ValueError):
        return -1


def other_groups(own_group: str) -> list[int]:
    """Runnable threads (state R) of each scheduling group (autogroup, /proc/<pid>/autogroup) on the host
    other than ``own_group``, now; this process's own thread is not counted."""
    counts: dict[str, int] = {}
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/autogroup") as f:
                group = f.read().split()[0]
            if group == own_group:
                continue
            n = 0
            for t in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    n += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
        if n:
            counts[group] = counts.get(group, 0) + n
    return sorted(counts.values())


def _own_group() -> str:
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return ""


def _own_running(pids: list[int]) -> int:
    """Threads of the processes ``pids`` that are runnable now (state R in /proc/<pid>/task/*/stat)."""
    n = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    n += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                continue
    return n


def background_threads(samples: int = 25, interval_s: float = 0.04) -> float:
    """Other users' runnable threads on this host now: the mean of /proc/stat's ``procs_running`` over
    ``samples`` readings (less this reader itself); 0.0 where /proc/stat is not there."""
    counts = []
    for _ in range(samples):
        r = _running()
        if r < 0:
            return 0.0
        counts.append(max(0, r - 1))
        time.sleep(interval_s)
    return sum(counts) / len(counts)


def record(model: str, world: int, out: Path, *, warmup: int, threads: int, batch: int, bucket_mb: float,
           timeout_s: float, compress: bool, trim: bool = False, groups: list[list[int]] | None = None,
           steps: int = 1) -> tuple[list[float], float, int, dict[int, float]]:
    """Record one job into ``out``, ``steps`` profiled steps per rank; returns each rank's step time in seconds
    at the median step (:func:`step_choice`), the other users' runnable
    threads while it ran (the mean over ~0.1 s samples of /proc/stat's ``procs_running`` less the job's own
    runnable threads and this process); ``groups`` gets, every ~0.1 s, the runnable threads of each other
    scheduling group (:func:`other_groups`); and which step that is with every step's job step time
    (:func:`step_choice`)."""
    groups = [] if groups is None else groups
    tmp = Path(tempfile.mkdtemp(prefix=f"trace-{model}-w{world}-"))
    try:
        ctx = mp.start_processes(_worker, args=(world, _free_port(), model, str(tmp), warmup, threads, batch,
                                                bucket_mb, steps), nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        others: list[int] = []
        pids = [p.pid for p in ctx.processes if p.pid is not None]
        group = _own_group()
        while not ctx.join(timeout=0.1):
            r = _running()
            if r >= 0:
                others.append(max(0, r - 1 - _own_running(pids)))
            if group:
                groups.append(other_groups(group))
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                for p in ctx.processes:
                    p.join(5)
                raise SystemExit(f"{model}-w{world}: no result in {timeout_s:.0f} s (processes killed)")
        out.mkdir(parents=True, exist_ok=True)
        for src in sorted(tmp.iterdir()):
            if src.name.startswith("cputime."):
                shutil.copyfile(src, out / src.name)
                continue
            if trim:
                with open(src) as f:
                    doc = json.load(f)
                data = json.dumps(trim_kineto(doc) if "traceEvents" in doc else trim_et(doc),
                                  separators=(",", ":")).encode()
            else:
                data = src.read_bytes()
            if compress:
                (out / (src.name + ".gz")).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
            else:
                (out / src.name).write_bytes(data)
        number, times, spans = step_choice(sorted(tmp.glob("rank*.kineto.json")))
        return spans, sum(others) / len(others) if others else 0.0, number, times
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replay_all(out: Path, jobs: list[tuple[str, int]],
               cores: int) -> tuple[dict[tuple[str, int], tuple[float, float]], list[float]]:
    """Import and replay every recorded job (its median profiled step, :func:`step_choice`) on the host cluster
    fitted from its own trace; print one line per job, the median and worst |error|, and each 2 → larger-world
    what-if against its recording. Returns each what-if's (predicted, measured) step seconds by (model,
    world), and the replays' |errors|."""
    errors = []
    chosen: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], Any] = {}
    profiled: dict[tuple[str, int], dict[int, float]] = {}
    whatifs: dict[tuple[str, int], tuple[float, float]] = {}
    recorded = {}
    for model, world in jobs:
        files = sorted((out / f"{model}-w{world}").glob("rank*.json*"))
        try:
            t0 = time.perf_counter()
            job, chosen_step = import_job_at(files, step="median")
            number, times = chosen_step.number, chosen_step.times_s
        except ConfigError as e:  # a refused recording counts as a miss of the benchmark, not as a crash
            print(f"replay {model}-w{world}: refused by the import: {e}", flush=True)
            errors.append(math.inf)
            continue
        r = replay(job, fit_host_cluster(job))
        wall = time.perf_counter() - t0
        recorded[model, world] = job
        chosen[model, world] = number
        profiled[model, world] = times
        if len(times) > 1 and number != max(times):  # the last profiled step too: the what-if as one step gives it
            last[model, world] = import_job(files, step="last")
        errors.append(abs(r.error))
        graph_err = r.measured_comm_step_s / job.measured_step_s - 1
        print(f"replay {model}-w{world}: {describe_choice(number, times)}; measured (that step, earliest rank's "
              f"start to latest rank's end) {job.measured_step_s * 1e3:.2f} ms, "
              f"replayed {r.step_s * 1e3:.2f} ms, error {r.error * 100:+.2f}% (import + replay {wall:.2f} s; "
              f"with the measured collective times {graph_err * 100:+.2f}%)", flush=True)
    if errors:
        errors.sort()
        print(f"replay error over {len(errors)} jobs: median {errors[len(errors) // 2] * 100:.2f}%, "
              f"worst {errors[-1] * 100:.2f}%")
    for (model, world), job in sorted(recorded.items()):
        small = recorded.get((model, 2))
        if world == 2 or small is None:
            continue
        b_old, b_new = _background(out / f"{model}-w2"), _background(out / f"{model}-w{world}")
        g_old, g_new = _groups(out / f"{model}-w2"), _groups(out / f"{model}-w{world}")
        host = fit_host_cluster(small)
        big, shared, scale = on_shared_host(small, world, host, cores)
        pred = replay(big, shared, scale).step_s
        whatifs[model, world] = (pred, job.measured_step_s)
        wake = sum(c.wake_wait_s for c in big.collectives)
        print(f"what-if {model}: w2 trace (ProfilerStep#{chosen[model, 2]}) → w{world} (measured: ProfilerStep#"
              f"{chosen[model, world]}; each the median step) predicted {pred * 1e3:.2f} ms (CPU demand on {cores} "
              f"cores: "
              f"operators ×{scale:.3g}, waits inside operators re-timed, gloo's hops waiting for a core "
              f"{wake * 1e3:.1f} ms over the collectives), measured {job.measured_step_s * 1e3:.2f} ms, "
              f"error {(pred / job.measured_step_s - 1) * 100:+.1f}%")
        if len(profiled[model, 2]) > 1 or len(profiled[model, world]) > 1:
            # the same rule on the last profiled step of each recording (what a one-step recording gives)
            s_last, j_last = last.get((model, 2), small), last.get((model, world), job)
            b, sh, sc = on_shared_host(s_last, world, fit_host_cluster(s_last), cores)
            p_last = replay(b, sh, sc).step_s
            whatifs[model + " (at the last profiled step)", world] = (p_last, j_last.measured_step_s)
            print(f"what-if {model}: w2 trace → w{world} at the last profiled step of each recording instead: "
                  f"predicted {p_last * 1e3:.2f} ms, measured {j_last.measured_step_s * 1e3:.2f} ms, "
                  f"error {(p_last / j_last.measured_step_s - 1) * 100:+.1f}%")
        plain = replace(big, collectives=tuple(replace(c, wake_wait_s=0.0) for c in big.collectives))
        pred = replay(plain, shared, scale).step_s  # the rule before traces.sched, for comparison
        whatifs[model + " (without the wait for a core)", world] = (pred, job.measured_step_s)
        print(f"what-if {model}: w2 trace → w{world} predicted {pred * 1e3:.2f} ms (the same without the wait for "
              f"a core), measured {job.measured_step_s * 1e3:.2f} ms, "
              f"error {(pred / job.measured_step_s - 1) * 100:+.1f}%")
        variants = [("operators ×W/C only", 0.0, 0.0, core_share_scale(2, world, cores))]
        if b_old is not None and b_new is not None:
            variants.append(("background measured", b_old, b_new, core_share_scale(2, world, cores, 1, b_old, b_new)))
        if g_old and g_new:
            variants.append(("groups as at w2", 0.0, 0.0, group_share_scale(2, world, cores, g_old, g_old)))
            variants.append(("groups measured", 0.0, 0.0, group_share_scale(2, world, cores, g_old, g_new)))
        for label, bo, bn, vscale in variants:  # processor sharing of the operators alone, for comparison
            pred = replay(resize(small, world), shared_host(host, vscale), vscale).step_s
            err = pred / job.measured_step_s - 1
            whatifs[model + f" ({label})", world] = (pred, job.measured_step_s)
            print(f"what-if {model}: w2 trace → w{world} predicted {pred * 1e3:.2f} ms (operators ×{vscale:.3g}, "
                  f"{cores} cores, {label}" + (f" {bo:.2f} → {bn:.2f} threads" if label.startswith("back") else "")
                  + f"), measured {job.measured_step_s * 1e3:.2f} ms, error {err * 100:+.1f}%")
    return whatifs, errors


def category(name: str) -> str:
    """The part of a training step a main-thread operator belongs to (for comparing two recordings)."""
    if name.startswith("Optimizer."):
        return "optimizer step"
    if "RegisterPostBackward" in name or name.startswith("FSDP::post_backward") or "root_post_backward" in name:
        return "FSDP post-backward (copy-in, reduce-scatter, shard copy-out)"
    if name.startswith("FSDP::"):
        return "FSDP " + name.removeprefix("FSDP::").split(" ")[0]
    if "AccumulateGrad" in name:
        return "gradient accumulation"
    if name.startswith("autograd::"):
        return "backward operators"
    if name == "(step end)":
        return "step end"
    return "forward and other operators"


def categories(job: Any) -> dict[str, float]:
    """Seconds per :func:`category`, the host gaps and the waits (the step less both), median over ranks."""
    per_rank = []
    for rt in job.ranks:
        c: dict[str, float] = {}
        for o in rt.ops:
            c[category(o.name)] = c.get(category(o.name), 0.0) + o.duration_s
        c["host gaps"] = rt.host_gap_s
        c["waiting for collectives"] = max(0.0, rt.step_s - rt.op_s - rt.host_gap_s)
        per_rank.append(c)
    keys = {k for c in per_rank for k in c}
    return {k: _median([c.get(k, 0.0) for c in per_rank]) for k in keys}


def compare(outs: list[Path], models: list[str], worlds: list[int], cores: int) -> None:
    """Per model, each category's time at the smallest and the largest world (medians over the repeats),
    their ratio, and the ratio the what-if applies (processor sharing on ``cores`` cores)."""
    lo, hi = min(worlds), max(worlds)
    for model in models:
        rows: dict[str, tuple[list[float], list[float]]] = {}
        for out in outs:
            small = import_job(sorted((out / f"{model}-w{lo}").glob("rank*.json*")), step="median")
            big = import_job(sorted((out / f"{model}-w{hi}").glob("rank*.json*")), step="median")
            cs, cb = categories(small), categories(big)
            for k in cs.keys() | cb.keys():
                rows.setdefault(k, ([], []))[0].append(cs.get(k, 0.0))
                rows[k][1].append(cb.get(k, 0.0))
        print(f"compare {model} w{lo} → w{hi} over {len(outs)} recording(s), what-if scale "
              f"×{core_share_scale(lo, hi, cores):g} (ms, medians):")
        for k in ("wall_s", "main_thread_cpu_s", "process_cpu_s"):
            a = [c[k] for out in outs if (c := cpu_use(out / f"{model}-w{lo}"))]
            b = [c[k] for out in outs if (c := cpu_use(out / f"{model}-w{hi}"))]
            if a and b:
                print(f"  per rank {k:<58} {_median(a) * 1e3:9.2f} {_median(b) * 1e3:9.2f}  "
                      f"×{_median(b) / _median(a):.2f}")
        for k, (a, b) in sorted(rows.items(), key=lambda kv: -_median(kv[1][1])):
            ma, mb = _median(a), _median(b)
            print(f"  {k:<62} {ma * 1e3:9.2f} {mb * 1e3:9.2f}  ×{mb / ma if ma else float('nan'):.2f}")


def cputime_rows(job_dir: Path, step: int | None = None) -> list[dict[str, Any]]:
    """Each rank's ``cputime.r<rank>.json`` for profiled step ``step`` (its entry in ``steps``, where the
    worker profiled several), by default the last profiled (the file's top level)."""
    rows = []
    for f in sorted(job_dir.glob("cputime.r*.json")):
        row = json.loads(f.read_text())
        rows.append(next((x for x in row.get("steps") or [] if x.get("step") == step), row))
    return rows


def cpu_use(job_dir: Path, step: int | None = None) -> dict[str, float]:
    """Profiled step ``step``'s wall time, main-thread and process CPU time per rank (medians over the ranks;
    default: the last profiled), from the ``cputime.r<rank>.json`` the workers wrote (empty when there are
    none)."""
    rows = cputime_rows(job_dir, step)
    if not rows:
        return {}
    return {k: _median([float(r[k]) for r in rows]) for k in rows[0]
            if k != "step" and isinstance(rows[0][k], int | float)}


def _background(job_dir: Path) -> float | None:
    """The other users' runnable threads measured before the job in ``job_dir`` was recorded (None: not
    measured)."""
    try:
        v = json.loads((job_dir / "load.json").read_text())
    except (OSError, ValueError):
        return None
    return float(v["background_threads"]) if isinstance(v, dict) and "background_threads" in v else None


def _groups(job_dir: Path) -> list[list[int]]:
    """The other scheduling groups' runnable threads sampled while the job in ``job_dir`` was recorded."""
    try:
        v = json.loads((job_dir / "load.json").read_text())
    except (OSError, ValueError):
        return []
    return list(v.get("other_groups") or []) if isinstance(v, dict) else []


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def job_error_interval(pairs: list[tuple[float, float]], resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float, float]:
    """A job's what-if error over its repeats, median(predicted) / median(measured) − 1, and its 90% percentile
    bootstrap interval (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13): ``resamples``
    times the repeats drawn with replacement, each repeat's (predicted, measured) pair kept together (both come
    from the same two recordings), the statistic recomputed on each draw, and the 5th and 95th percentiles of
    those. Seeded (``numpy.random.default_rng(seed)``): the same pairs give the same interval, bit for bit.
    Returns (error, low, high); one repeat gives a zero-width interval."""
    if not pairs:
        raise ValueError("job_error_interval: no (predicted, measured) pairs; record the job at least once")
    a = np.asarray(pairs, dtype=float)
    err = float(np.median(a[:, 0]) / np.median(a[:, 1]) - 1)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    draws = np.median(a[idx, 0], axis=1) / np.median(a[idx, 1], axis=1) - 1
    lo, hi = np.percentile(draws, [5.0, 95.0])
    return err, float(lo), float(hi)


def summarize(whatifs: list[dict[tuple[str, int], tuple[float, float]]]) -> None:
    """Each what-if over the repeats: the median prediction against the median measured step, and the
    median of the per-repeat errors; for the main rule (``on_shared_host``, the keys without a "(") also the
    job's error's 90% bootstrap interval over the repeats (:func:`job_error_interval`), and a last line with
    every job's error and interval and how many are within 10%."""
    jobs: list[tuple[str, float, float, float]] = []
    for key in sorted({k for w in whatifs for k in w}):
        rows = [w[key] for w in whatifs if key in w]
        pred, meas = _median([p for p, _ in rows]), _median([m for _, m in rows])
        errs = ", ".join(f"{(p / m - 1) * 100:+.1f}%" for p, m in rows)
        interval = ""
        if "(" not in key[0]:
            err, lo, hi = job_error_interval(rows)
            jobs.append((f"{key[0]} w2 → w{key[1]}", err, lo, hi))
            interval = f"; 90% bootstrap interval of the error [{lo * 100:+.1f}%, {hi * 100:+.1f}%]"
        print(f"what-if {key[0]} w2 → w{key[1]} over {len(rows)} repeats: median predicted {pred * 1e3:.2f} ms, "
              f"median measured {meas * 1e3:.2f} ms, error {(pred / meas - 1) * 100:+.1f}% (per repeat: {errs}; "
              f"median {_median([p / m - 1 for p, m in rows]) * 100:+.1f}%{interval})")
    for label, pick in (("", lambda k: "(" not in k), (" at the last profiled step",
                                                       lambda k: k.endswith("(at the last profiled step)"))):
        rule = [abs(p / m - 1) * 100 for w in whatifs for k, (p, m) in sorted(w.items()) if pick(k[0])]
        if rule:
            print(f"what-if (CPU demand and the wait for a core){label} over {len(rule)} job-repeats: median |error| "
                  f"{_median(rule):.2f}%, worst {max(rule):.1f}%, {sum(x <= 10 for x in rule)} within 10%")
    if jobs:
        within = sum(abs(e) <= 0.10 for _, e, _, _ in jobs)
        inside = sum(lo >= -0.10 and hi <= 0.10 for _, _, lo, hi in jobs)
        print("what-if per job (median over repeats): " + ", ".join(
            f"{name} {e * 100:+.1f}% [{lo * 100:+.1f}%, {hi * 100:+.1f}%]" for name, e, lo, hi in jobs)
            + f"; {within} of {len(jobs)} jobs within 10% ({inside} of {len(jobs)} with the whole 90% interval "
            f"within ±10%)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="gpt,resnet", help="gpt, resnet, mlp (DDP); gpt-fsdp, resnet-fsdp (FSDP2)")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per recording (schedule active=K); the "
                    "replay and the what-if use the median one by job step time (1: the one profiled step)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="DDP bucket size (several buckets per step)")
    ap.add_argument("--timeout-s", type=float, default=180.0)
    ap.add_argument("--gzip", action="store_true", help="write .json.gz (the fixtures are stored so)")
    ap.add_argument("--trim", action="store_true", help="keep only what the import reads (the fixtures are so)")
    ap.add_argument("--replay", action="store_true", help="import and replay every job recorded, print the errors")
    ap.add_argument("--replay-only", action="store_true", help="replay the jobs already under --out, record none")
    ap.add_argument("--repeats", type=int, default=1, help="record every job this many times, worlds turn about "
                    "(w2, w4, w2, w4, ...) into OUT/r<i>/, and give the what-if's medians over the repeats")
    ap.add_argument("--compare", action="store_true", help="per model, each part of the step (optimizer, FSDP "
                    "hooks, backward, waits, ...) at the smallest and largest world, medians over the repeats")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 0, help="cores the what-if shares (default: "
                    "this machine's)")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error(f"--steps must be >= 1 (got {a.steps})")
    jobs = [(m, int(w)) for m in a.models.split(",") for w in a.worlds.split(",")]
    outs = [a.out] if a.repeats <= 1 else [a.out / f"r{i}" for i in range(a.repeats)]
    for out in ([] if a.replay_only else outs):  # repeats turn about: each model's worlds side by side in time
        for model, world in jobs:
            background = background_threads()  # before the job's processes start: the others' load
            groups: list[list[int]] = []
            t, during, number, times = record(
                model, world, out / f"{model}-w{world}", warmup=a.warmup, threads=a.threads, batch=a.batch,
                bucket_mb=a.bucket_mb, timeout_s=a.timeout_s, compress=a.gzip, trim=a.trim, groups=groups,
                steps=a.steps)
            ts = sorted(t)
            load = os.getloadavg()  # what-ifs across recordings depend on it
            (out / f"{model}-w{world}" / "load.json").write_text(json.dumps(
                {"loadavg": list(load), "background_threads_before": background, "background_threads": during,
                 "other_groups": groups}))
            cpu = cpu_use(out / f"{model}-w{world}", number)
            print(f"{out.name}/{model}-w{world}: step {max(t) * 1e3:.2f} ms ({describe_choice(number, times)}; "
                  f"slowest rank; median rank "
                  f"{ts[len(ts) // 2] * 1e3:.2f} ms; load average {', '.join(f'{x:.2f}' for x in load)}; "
                  f"other runnable threads before it {background:.2f}, during it {during:.2f} in "
                  f"{_median([len(g) for g in groups]) if groups else 0:g} other groups (median); per rank "
                  f"(median) CPU "
                  f"{cpu['process_cpu_s'] * 1e3:.1f} ms, main thread {cpu['main_thread_cpu_s'] * 1e3:.1f} ms, "
                  f"wall {cpu['wall_s'] * 1e3:.1f} ms)", flush=True)
    if a.replay or a.replay_only:
        done = [replay_all(out, jobs, a.cores) for out in outs]
        whatifs = [w for w, _ in done]
        if len(outs) > 1:
            errors = sorted(e for _, es in done for e in es)
            print(f"replay error over all {len(errors)} recorded jobs of {len(outs)} repeats: median (upper) "
                  f"{errors[len(errors) // 2] * 100:.2f}%, worst {errors[-1] * 100:.2f}%")
            summarize(whatifs)
    if a.compare:
        compare(outs, a.models.split(","), [int(w) for w in a.worlds.split(",")], a.cores)


if __name__ == "__main__":
    sys.exit(main())
