"""Fuzz the ``topotrain`` command with hostile and absurd inputs; count what must never happen.

Each case is a mutated example scenario (keys dropped or renamed, wrong types, zero/negative/huge/non-finite
numbers, broken units, 100 KB values, control characters), or a hostile YAML text (alias bombs, recursive
aliases, duplicate keys, deep nesting, unknown tags, binary junk), run through one of
``simulate --resolved --json``, ``simulate --json --network analytical``, ``topo show --json``,
``collective --json --network analytical`` and ``simulate --trace`` onto a refused target (a directory, a
FIFO, the scenario itself). Every case runs the real entry point (``topotrain.cli.main``) in a forked child
of a warm worker, with its stdout and stderr on files, under an address-space cap (RLIMIT_AS) and a wall-time
cap (killed after it).

Counted: exit 0 / exit 2 (refused: every stderr line starts ``error:``), internal errors (exit 1, "internal
error"), tracebacks, hangs (past the time cap), memory (past the memory cap), invalid JSON (exit 0 with
``--json`` whose stdout is not strict JSON: no ``Infinity``/``NaN``), stray stderr (warnings), damaged
files (a refused ``--trace`` target changed, or a scenario rewritten). The run passes when every bad count
is 0.

``--studies N`` adds N cases of the studies' verbs (``search``, ``place``, ``explain``, ``report``, ``scale``,
``topo show``, ``validate``: mutated spaces, job files and scenarios, non-UTF-8 files, hostile options, stores
and output targets, stdout on ``/dev/full``; see ``benchmarks/fuzz_studies.py``), with two more counts:
``damaged_file`` also covers files the run did not own (someone's folder, a foreign store, a refused run's
new store), and ``stdout_full_unsaid`` a run whose stdout was ``/dev/full`` that did not say so and exit 2.

Run: ``.venv/bin/python benchmarks/fuzz.py [--cases 10000] [--studies 0] [--seed 0] [--workers 2]
[--time-cap-s 60] [--mem-cap-mib 3072]``. Prints the counts and the first failing cases (argv and the stderr's
last lines).
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_studies  # noqa: E402 - beside this script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
VALUES: list[Any] = [None, 0, -1, 1, 2, 3, 7, 10**6, 10**12, 2**63, 2**64, 1e21, 1.5, -0.5, float("nan"),
                     float("inf"), -float("inf"), "abc", "", [], [1, 2], [2**64, 2], {}, {"x": 1}, True, "100Gbps",
                     "-1Gbps", "1e-300B/s", "1e300Gbps", "0Gbps", "1us", "1e300s", "-1us", "25MiB", "1e21B",
                     "1e400", "-1MiB", "x" * 100_000, "9" * 5000 + "Gbps", "\x00\x1b[31m", "é𝄞", "gpt3-1.3b",
                     "flow-async", "bigraph", "torus", "ring", "fat-tree", "1000000000", 10**9, "../../etc/passwd",
                     "/dev/zero", "eflops", "single-gpu", "analytical"]
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
HOSTILE_TEXTS = [BOMB, "&a [*a]\n", "a: &a {b: *a}\n", "[" * 5000 + "]" * 5000, "{" * 3000,
                 "cluster: !!python/object/apply:os.system [echo hi]\n", "cluster: !!binary aGVsbG8=\n",
                 "\x00\x01\x02", "\ufeffcluster: {}\n", "cluster:\n  servers: 2\n  servers: 3\n",
                 "--- 1\n--- 2\n", "? [a, b]\n: 1\n", "a: *undefined\n", "cluster: [" + "1," * 100_000 + "1]\n"]
COMMANDS = [
    (0.45, ["simulate", "{S}", "--resolved", "--json"]),
    (0.2, ["topo", "show", "{S}", "--json"]),
    (0.15, ["collective", "{S}", "--json", "--network", "analytical", "--size", "1MiB"]),
    (0.12, ["simulate", "{S}", "--json", "--network", "analytical"]),
    (0.08, ["simulate", "{S}", "--trace", "{T}"]),
]


def _scenarios() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        if isinstance(doc, dict) and "cluster" in doc and not p.name.startswith("search-"):
            doc.setdefault("model", "resnet50")
            doc.setdefault("batch", 1024)
            out.append((p.name, doc))
    return out


def make_case(i: int, seed: int, scenarios: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Case ``i`` of the run ``seed``: the scenario text, its file name and the command (deterministic)."""
    rng = np.random.default_rng([seed, i])
    name, base = scenarios[int(rng.integers(len(scenarios)))]
    kind = rng.random()
    if kind < 0.12:
        text = HOSTILE_TEXTS[int(rng.integers(len(HOSTILE_TEXTS)))]
        if rng.random() < 0.5:
            text = yaml.safe_dump(base) + text  # hostile tail after a valid scenario
    else:
        doc = copy.deepcopy(base)
        for _ in range(int(rng.integers(0, 3))):
            paths = fuzz_studies.doc_paths(doc)
            if not paths:
                break
            path = paths[int(rng.integers(len(paths)))]
            parent: Any = doc
            for k in path[:-1]:
                parent = parent[k]
            op = rng.random()
            if op < 0.15:
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(VALUES[int(rng.integers(len(VALUES)))])
        text = yaml.safe_dump(doc, allow_unicode=True)
        if rng.random() < 0.1:  # a duplicate key at the end
            text += f"{next(iter(doc), 'cluster')}: null\n"
    r = rng.random()
    acc = 0.0
    argv = COMMANDS[-1][1]
    for share, cmd in COMMANDS:
        acc += share
        if r < acc:
            argv = cmd
            break
    trace = ["DIR", "FIFO", "SCENARIO", "", ".", "FILE/x.json"][int(rng.integers(6))]
    return {"i": i, "name": name, "text": text, "argv": list(argv), "trace": trace}


def _child(case: dict[str, Any], folder: Path, time_cap_s: float, mem_cap_bytes: int) -> None:
    """In the forked child: files, limits, then the real entry point; never returns."""
    try:
        out = os.open(folder / "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(folder / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(os.open("/dev/full", os.O_WRONLY) if case.get("stdout_full") else out, 1)
        os.dup2(err, 2)
        os.chdir(folder)
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap_bytes, mem_cap_bytes))
        mp.current_process().daemon = False  # forked from a pool worker: a search's own pool may fork again
        signal.alarm(int(time_cap_s) + 5)  # the parent kills at the cap; this is a second line
        from topotrain.cli import main

        sys.argv = ["topotrain", *case["argv"]]
        code: Any = 0
        try:
            main()
        except SystemExit as e:
            code = e.code
        except MemoryError:
            os.write(2, b"\nMEMORY-CAP\n")
            code = 99
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the worker
        import traceback

        traceback.print_exc()
        os._exit(98)


def _forked(case: dict[str, Any], folder: Path, time_cap_s: float,
            mem_cap_bytes: int) -> tuple[int | None, bool, str, str]:
    """Run ``case`` in a forked child under the caps: (exit code or None, hung, stdout, stderr); a child past
    ``time_cap_s`` is killed."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(case, folder, time_cap_s, mem_cap_bytes)
    status = None
    while time.monotonic() - t0 < time_cap_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    hang = status is None
    if hang:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    code = None if hang else (os.waitstatus_to_exitcode(status) if status is not None else None)
    return (code, hang, (folder / "stdout").read_text(errors="replace"),
            (folder / "stderr").read_text(errors="replace"))


def _run_case(case: dict[str, Any], time_cap_s: float, mem_cap_bytes: int, scratch: Path) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(dir=scratch))
    try:
        sc = folder / case["name"]
        sc.write_text(case["text"], encoding="utf-8", errors="surrogateescape")
        for extra in EXAMPLES.glob("*topology*.yaml"):
            shutil.copy(extra, folder / extra.name)
        (folder / "DIR").mkdir()
        (folder / "FILE").write_text("x")
        os.mkfifo(folder / "FIFO")
        trace = {"SCENARIO": str(sc)}.get(case["trace"], case["trace"])
        case["argv"] = [a.replace("{S}", str(sc)).replace("{T}", trace) for a in case["argv"]]
        before = sc.read_bytes()
        t0 = time.monotonic()
        code, hang, stdout, stderr = _forked(case, folder, time_cap_s, mem_cap_bytes)
        damaged = sc.read_bytes() != before or not (folder / "DIR").is_dir() or \
            (folder / "FILE").read_text() != "x" or not (folder / "FIFO").is_fifo()
        return {"i": case["i"], "argv": case["argv"], "code": code, "hang": hang, "stdout": stdout[-2000:],
                "stderr": stderr[-3000:], "wall_s": time.monotonic() - t0, "damaged": damaged,
                "json_out": "--json" in case["argv"], "json_text": stdout if "--json" in case["argv"] else ""}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_study_case(case: dict[str, Any], time_cap_s: float, mem_cap_bytes: int, scratch: Path) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(dir=scratch))
    try:
        keep = fuzz_studies.prepare(case, folder)
        t0 = time.monotonic()
        code, hang, stdout, stderr = _forked(case, folder, time_cap_s, mem_cap_bytes)
        keep.pop("stdout", None)
        keep.pop("stderr", None)
        return {"i": case["i"], "argv": case["argv"], "code": code, "hang": hang, "stdout": stdout[-2000:],
                "stderr": stderr[-3000:], "wall_s": time.monotonic() - t0,
                "damaged": fuzz_studies.damaged(case, folder, keep, code), "stdout_full": case["stdout_full"],
                "json_out": "--json" in case["argv"] and not case["stdout_full"],
                "json_text": stdout if "--json" in case["argv"] else ""}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _strict_json(text: str) -> bool:
    def bad(c: str) -> Any:
        raise ValueError(c)

    try:
        json.loads(text, parse_constant=bad)
    except ValueError:
        return False
    return True


def classify(r: dict[str, Any]) -> list[str]:
    """The counts a result adds to (``ok`` and ``refused`` are fine; the rest are failures)."""
    out = []
    err = r["stderr"]
    if r["hang"]:
        return ["hang"]
    if "MEMORY-CAP" in err or "MemoryError" in err:
        out.append("memory")
    if "Traceback" in err or "Traceback" in r["stdout"]:
        out.append("traceback")
    if "internal error" in err or r["code"] not in (0, 2, 99):
        out.append("internal_error")
    if r["damaged"]:
        out.append("damaged_file")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if r["code"] == 2:
        if not lines or not all(ln.startswith("error: ") for ln in lines):
            out.append("stray_stderr")
        if any(len(ln) > 320 for ln in lines):
            out.append("long_error_line")
    elif r["code"] == 0:
        if any("Warning" in ln for ln in lines):
            out.append("stray_stderr")
        if r["json_out"] and not _strict_json(r["json_text"]):
            out.append("invalid_json")
    if r.get("stdout_full") and r["code"] == 0:  # its output went nowhere and it did not say so
        out.append("stdout_full_unsaid")
    if not out:
        out.append("ok" if r["code"] == 0 else "refused")
    return out


def _warm_up(scratch: Path) -> None:
    """Run each command once in the worker, so that every forked child starts with topotrain's modules
    imported and its caches filled (a fork is then milliseconds, not a second of imports)."""
    from typer.testing import CliRunner

    from topotrain.cli import app

    folder = Path(tempfile.mkdtemp(dir=scratch))
    sc = folder / "warm.yaml"
    sc.write_text((EXAMPLES / "custom-graph.yaml").read_text())
    shutil.copy(EXAMPLES / "custom-graph-topology.yaml", folder)
    for _, argv in COMMANDS:
        CliRunner().invoke(app, [a.replace("{S}", str(sc)).replace("{T}", str(folder / "t.json")) for a in argv])
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump(fuzz_studies.SPACE))
    CliRunner().invoke(app, ["search", str(space), "--out", str(folder / "o"), "--workers", "1", "--json"])
    shutil.rmtree(folder, ignore_errors=True)


def _worker(args: tuple[list[int], int, float, int, str, int]) -> list[dict[str, Any]]:
    idx, seed, time_cap_s, mem_cap_bytes, scratch, first_study = args
    scenarios = _scenarios()
    _warm_up(Path(scratch))

    results = []
    for i in idx:
        if i >= first_study:
            r = _run_study_case(fuzz_studies.make_study_case(i, seed), time_cap_s, mem_cap_bytes, Path(scratch))
        else:
            r = _run_case(make_case(i, seed, scenarios), time_cap_s, mem_cap_bytes, Path(scratch))
        r["kinds"] = classify(r)
        r.pop("json_text")
        results.append(r)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--studies", type=int, default=0, help="cases of the studies' verbs, besides --cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-cap-s", type=float, default=60.0)
    ap.add_argument("--mem-cap-mib", type=int, default=3072)
    ap.add_argument("--chunk", type=int, default=25)
    a = ap.parse_args()
    t0 = time.monotonic()
    counts: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="topotrain-fuzz-") as scratch:
        total = a.cases + a.studies
        chunks = [list(range(s, min(s + a.chunk, total))) for s in range(0, total, a.chunk)]
        jobs = [(c, a.seed, a.time_cap_s, a.mem_cap_mib * 2**20, scratch, a.cases) for c in chunks]
        with mp.get_context("fork").Pool(a.workers) as pool:
            for n, results in enumerate(pool.imap_unordered(_worker, jobs), 1):
                for r in results:
                    walls.append(r["wall_s"])
                    for k in r["kinds"]:
                        counts[k] = counts.get(k, 0) + 1
                    if not set(r["kinds"]) <= {"ok", "refused"}:
                        failures.append(r)
                if n % 20 == 0 or n == len(jobs):
                    done = sum(counts.get(k, 0) for k in ("ok", "refused")) + len(failures)
                    print(f"  {done}/{total} cases, {len(failures)} failing, {time.monotonic() - t0:.0f} s",
                          file=sys.stderr, flush=True)
    bad_kinds = ["internal_error", "traceback", "hang", "memory", "invalid_json", "stray_stderr",
                 "long_error_line", "damaged_file", "stdout_full_unsaid"]
    print(f"fuzz: {a.cases} scenario cases + {a.studies} studies cases (seed {a.seed}),"
          f" time cap {a.time_cap_s:g} s, memory cap {a.mem_cap_mib} MiB, "
          f"wall {time.monotonic() - t0:.0f} s, slowest case {max(walls):.1f} s, median {np.median(walls):.2f} s")
    print(f"  exit 0: {counts.get('ok', 0)}   refused (exit 2, error lines only): {counts.get('refused', 0)}")
    for k in bad_kinds:
        print(f"  {k}: {counts.get(k, 0)}")
    for r in failures[:10]:
        print(f"--- case {r['i']} {r['kinds']} exit {r['code']}: {' '.join(a[:80] for a in r['argv'])}")
        print("    " + "\n    ".join(r["stderr"].strip().splitlines()[-6:]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
