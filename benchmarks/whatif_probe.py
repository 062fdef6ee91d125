"""Where a 2 → 4 process what-if misses, measured on recordings of ``benchmarks/trace_record.py --repeats R``
(``OUT/r<i>/<model>-w<world>/``): per model, repeat and world, per rank (medians over the ranks)

* ``ops``: the main thread's operators and host gaps as the import gives them (what the what-if scales);
* ``hidden wait``: the part of them the thread spent idle inside an operator waiting for a collective that
  the same operator launched — FSDP2 on CPU wraps the c10d call and its ``wait()`` in one
  ``FSDP::all_gather (unit)`` annotation, so the idle time is operator time to the import: from the
  thread's last activity (a start or end of any event that does not hold the launch) before the
  collective's backend span ended, to that end;
* ``ring``: the collectives' alpha-beta ring time on the host fitted from the 2-process trace, at the
  world's ranks, times the what-if's processor-sharing factor (the modelled counterpart);
* the what-if by five rules: processor sharing of the operators (×W/C) with the hidden waits scaled as
  operator time; the same with them grown as their collectives' ring time grows (the rule before
  ``traces.whatif.on_shared_host``); the CPU-demand bound ``W·(b + g_W)/C`` (``b`` the ranks' busy time,
  ``g_W`` their collectives' CPU at W, ``traces.whatif.demand_share_scale``) or the first rule's replay,
  whichever is longer; CPU demand (the operators ×``demand_share_scale``, the hidden waits made waits for
  their collectives, which the replay runs on the shared host once every rank launched them,
  ``traces.whatif.waits_outside``); and ``on_shared_host`` (what ``--replay``, ``trace replay --world`` and
  ``simulate --set workload.world=4`` do: CPU demand and, with more ranks than cores, each collective's hops
  waiting for a core, ``traces.sched``);
* ``hop wait``: per collective at 4 ranks, its all-ranks span less its ring time on the shared host, per gloo
  hop, for the collectives the what-if gives a wait for a core and for those it gives none (medians),
  beside the model's wait per hop;
* ``CPU``: main-thread and other-thread CPU time of the step used (``cputime.r<rank>.json``), and, where
  recorded, gloo's threads' CPU and wake-ups (voluntary context switches) from /proc schedstat; ``ΣCPU/C``:
  every rank's main and gloo threads' schedstat CPU over the cores (the work-conservation floor with the
  CPU measured at that size, a check of the mechanism, not an input).

Every recording is read at its median profiled step by job step time (``step #N``; ``trace import --step
median``), as ``trace_record.py --replay`` reads it; a one-step recording at that step.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/whatif_probe.py OUT [OUT ...] [--models gpt-fsdp,resnet-fsdp]
[--cores 2]``; it ends with each rule's median |error| over every job-repeat and, for ``on_shared_host``, each
job's error over every folder's repeats (median predicted / median measured − 1) with its 90% bootstrap
interval (``trace_record.job_error_interval``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from topotrain.traces.cluster import RING_STEPS, fit_host_cluster
from topotrain.traces.importer import SYMMETRIC_OPS, RankParts, choose_step, import_job, split_rank
from topotrain.traces.readers import load_json, read_kineto_steps
from topotrain.traces.sched import gloo_hops
from topotrain.traces.whatif import (
    busy_s,
    collectives_cpu_s,
    core_share_scale,
    on_shared_host,
    resize,
    ring_time_s,
    shared_host,
)
from topotrain.training.replay import replay
from trace_record import job_error_interval  # the benchmark beside this one (its folder is on sys.path)


def hidden_wait_us(parts: RankParts) -> float:
    """µs the rank's main thread sat idle inside operators for collectives launched in the same operator
    (module docstring), summed over its launches."""
    total = 0.0
    for x in parts.launches:
        span, top = x.span, parts.tops[x.top]
        if span is None or x.op not in SYMMETRIC_OPS or not top.ts_us <= span.end_us <= top.end_us:
            continue
        e0 = x.event
        if any(e.ts_us < span.end_us < e.end_us and not (e.ts_us <= e0.ts_us and e.end_us >= e0.end_us)
               for e in parts.nested[x.top]):
            continue  # the thread was inside another event (busy) when the collective ended: not waiting
        points = [t for e in parts.nested[x.top]
                  if e is e0 or not (e.ts_us <= e0.ts_us and e.end_us >= e0.end_us)
                  for t in (e.ts_us, e.end_us) if t <= span.end_us]
        total += span.end_us - max([*points, top.ts_us])
    return total


def ring_s(job, host) -> float:  # noqa: ANN001 - a TraceJob and a HostCluster
    """The collectives' alpha-beta ring time, ``k(n−1)(α + S/(nB))`` (cluster.py's fit formula), summed."""
    return sum(RING_STEPS.get(c.ran_as, 2) * (len(c.ranks) - 1) * (host.message_overhead_s + c.size_bytes / (
        len(c.ranks) * host.bandwidth_bytes_per_s)) for c in job.collectives)


def grown(job, small, host):  # noqa: ANN001, ANN202 - TraceJobs and a HostCluster
    """``job`` (``small`` resized) with each hidden wait grown by its collective's ring time at the new size over
    the recorded one: the rule before ``on_shared_host``, kept here to compare."""
    def op(o):  # noqa: ANN001, ANN202
        extra = sum(t * (ring_time_s(job.collectives[k], host) / ring_time_s(small.collectives[k], host) - 1)
                    for k, t in o.hidden_waits)
        return replace(o, duration_s=o.duration_s + extra) if o.hidden_waits else o
    return replace(job, ranks=tuple(replace(r, ops=tuple(op(o) for o in r.ops)) for r in job.ranks))


def hop_check(big, j4, shared) -> str:  # noqa: ANN001 - TraceJobs and a HostCluster
    """The wait for a core per gloo hop, measured against modelled: each collective's all-ranks span at 4
    ranks less its ring time on the shared host, over its hops (``traces.sched.gloo_hops``), the median per
    op over the collectives the what-if gives a wait (cores busy) and over those it gives none (waited for
    inside their hook), beside the model's wait per hop."""
    groups: dict[tuple[bool, str], list[tuple[float, float]]] = {}
    for c, c4 in zip(big.collectives, j4.collectives, strict=True):
        hops = gloo_hops(c.op, len(c.ranks))
        if hops:
            groups.setdefault((c.wake_wait_s > 0, c.op), []).append(
                ((c4.measured_net_s - ring_time_s(c, shared)) / hops * 1e3, c.wake_wait_s / hops * 1e3))
    return "hop wait at w4, span − ring per hop (ms): " + "; ".join(
        f"{op} {'(cores busy)' if busy else '(waited inside a hook)'} ×{len(xs)} median "
        f"{statistics.median(x for x, _ in xs):.2f} (model {statistics.median(m for _, m in xs):.2f})"
        for (busy, op), xs in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1])))


def cputime_rows(job_dir: Path, step: int | None = None) -> list[dict]:
    """Each rank's ``cputime.r<rank>.json`` at profiled step ``step`` (its entry in ``steps`` where the worker
    profiled several; else the file's top level, the last profiled step)."""
    rows = []
    for f in sorted(job_dir.glob("cputime.r*.json")):
        row = json.loads(f.read_text())
        rows.append(next((x for x in row.get("steps") or [] if x.get("step") == step), row))
    return rows


def cpu_floor_ms(job_dir: Path, cores: int, step: int | None = None) -> float:
    """Every rank's main and gloo threads' schedstat CPU over the cores at ``step``, ms (NaN where not
    recorded)."""
    rows = cputime_rows(job_dir, step)
    if not rows or not all(r.get("threads") for r in rows):
        return float("nan")
    return sum(t["cpu_ns"] for r in rows for t in r["threads"]) / 1e6 / cores


def cpu(job_dir: Path, step: int | None = None) -> dict[str, float]:
    """Median over ranks of the main thread's and the other threads' CPU ms, gloo threads' CPU ms and
    wake-ups at ``step`` (schedstat; NaN where not recorded)."""
    rows = cputime_rows(job_dir, step)
    med = statistics.median
    out = {"main_ms": med(r["main_thread_cpu_s"] for r in rows) * 1e3,
           "other_ms": med(r["process_cpu_s"] - r["main_thread_cpu_s"] for r in rows) * 1e3}
    th = [[t for t in r["threads"] if not t["main"]] for r in rows if r.get("threads")]
    out["gloo_ms"] = med(sum(t["cpu_ns"] for t in ts) / 1e6 for ts in th) if th else float("nan")
    out["gloo_wakeups"] = med(sum(t["voluntary_switches"] for t in ts) for ts in th) if th else float("nan")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="+", help="recording folders (OUT of trace_record.py --repeats)")
    ap.add_argument("--models", default="gpt,resnet,gpt-fsdp,resnet-fsdp")
    ap.add_argument("--cores", type=int, default=2)
    a = ap.parse_args(argv)
    scale = core_share_scale(2, 4, a.cores)
    names = ("×W/C", "waits grown", "max(CPU bound, ×W/C)", "CPU demand",
             "CPU demand and the wait for a core (on_shared_host)")
    every: list[tuple[float, ...]] = []
    pooled: dict[str, list[tuple[float, float]]] = {}
    for model, out in ((m, o) for o in a.out for m in a.models.split(",")):
        rows: list[tuple[float, ...]] = []
        for rep in sorted(p for p in out.glob("r*") if (p / f"{model}-w2").is_dir()):
            line = []
            small = None
            jobs = []
            chosen = {}
            for world in (2, 4):
                d = rep / f"{model}-w{world}"
                files = sorted(d.glob("rank*.json*"))
                try:
                    job = import_job(files, step="median")  # the median profiled step, as trace_record.py --replay
                    read = {k.rank: k for k in (read_kineto_steps(load_json(f), str(f)) for f in files
                                                if "kineto" in f.name)}
                    number = choose_step(read, "median")
                except Exception as e:  # noqa: BLE001 - a recording the import refuses is reported, not fatal
                    line.append(f"w{world}: not imported ({str(e)[:60]})")
                    continue
                chosen[world] = number
                small = job if world == 2 else small
                parts = [split_rank(k.at(number), None) for _, k in sorted(read.items())]
                wait = statistics.median(hidden_wait_us(p) for p in parts) / 1e3
                jobs.append((job, wait))
                ops = statistics.median(r.op_s + r.host_gap_s for r in job.ranks) * 1e3
                ring = (ring_s(small, fit_host_cluster(small)) if world == 2 else
                        ring_s(resize(small, 4), fit_host_cluster(small)) * scale) * 1e3 if small else float("nan")
                c = cpu(d, number)
                line.append(f"w{world}: step #{number} {job.measured_step_s * 1e3:6.1f} ops {ops:6.1f} hidden wait "
                            f"{wait:5.1f} "
                            f"ring {ring:5.1f} | CPU main {c['main_ms']:5.1f} other {c['other_ms']:4.1f} gloo "
                            f"{c['gloo_ms']:4.1f} wake-ups {c['gloo_wakeups']:4.0f}")
            print(f"{model:12s} {rep.name}: " + " || ".join(line), flush=True)
            if len(jobs) == 2:
                (j2, _), (j4, _) = jobs
                host = fit_host_cluster(j2)
                pred = replay(resize(j2, 4), shared_host(host, scale), scale).step_s
                est = replay(grown(resize(j2, 4), j2, host), shared_host(host, scale), scale).step_s
                b = statistics.mean(busy_s(r) for r in j2.ranks)
                bound = 4 * (b + collectives_cpu_s(resize(j2, 4).collectives, host)) / a.cores
                big, shared, sc = on_shared_host(j2, 4, host, a.cores)
                new = replay(big, shared, sc).step_s
                plain = replace(big, collectives=tuple(replace(c, wake_wait_s=0.0) for c in big.collectives))
                no_wake = replay(plain, shared, sc).step_s
                m4 = j4.measured_step_s
                rows.append((pred, est, max(bound, pred), no_wake, new, m4))
                print(f"{'':12s} {rep.name}: " + hop_check(big, j4, shared), flush=True)
                floor = cpu_floor_ms(rep / f"{model}-w4", a.cores, chosen.get(4))

                def e(x: float, m4: float = m4) -> str:
                    return f"{x * 1e3:.1f} ms ({(x / m4 - 1) * 100:+.1f}%)"
                print(f"{'':12s} {rep.name}: what-if ×W/C {e(pred)}; waits grown {e(est)}; max(CPU bound "
                      f"{bound * 1e3:.1f}, ×W/C) {e(max(bound, pred))}; CPU demand {e(no_wake)}; CPU demand and "
                      f"the wait for a core (on_shared_host) {e(new)}; "
                      f"measured {m4 * 1e3:.1f} ms (ΣCPU/C at w4 {floor:.1f} ms, {(floor / 1e3 / m4 - 1) * 100:+.1f}%)")
        if rows:
            med = statistics.median
            m = med(r[-1] for r in rows)
            print(f"{model:12s} {out.name} medians over {len(rows)}: " + ", ".join(
                f"{n} {(med(r[i] for r in rows) / m - 1) * 100:+.1f}%" for i, n in enumerate(names)))
        every += rows
        pooled.setdefault(model, []).extend((r[-2], r[-1]) for r in rows)
    if every:  # each job-repeat's own error, over every folder given
        for i, n in enumerate(names):
            errs = [abs(r[i] / r[-1] - 1) * 100 for r in every]
            print(f"over {len(every)} job-repeats, {n}: median |error| {statistics.median(errs):.2f}%, worst "
                  f"{max(errs):.1f}%, {sum(x <= 10 for x in errs)} within 10%")
        # each job over the repeats of every folder given: median predicted / median measured - 1, with the
        # 90% bootstrap interval trace_record.py prints for one folder
        print("on_shared_host per job over every folder's repeats: " + ", ".join(
            f"{m} ({len(v)}) {e * 100:+.1f}% [{lo * 100:+.1f}%, {hi * 100:+.1f}%]"
            for m, v in pooled.items() for e, lo, hi in [job_error_interval(v)]))


if __name__ == "__main__":
    main()
