"""Fuzz every verb of the ``topotrain`` command with hostile and absurd input; count what must never happen.

Case families (each case seeded by ``(seed, i)``, so a run is deterministic and a case can be re-made alone):

- scenario: a mutated example scenario (keys dropped, wrong types, zero/negative/huge/non-finite numbers,
  broken units, 100 KB values, control characters) or a hostile YAML text (alias bombs, recursive aliases,
  duplicate keys, deep nesting, unknown tags, binary junk) through ``simulate``, ``topo show``,
  ``collective`` and ``simulate --trace`` onto a refused target;
- studies (``fuzz_studies.py``): ``search`` (spaces, options, corrupt/foreign ``results.sqlite`` and
  ``optuna.sqlite`` on ``--resume``), ``place`` (job files), ``explain``, ``report``, ``scale``,
  ``topo show``, ``validate``, with hostile output folders;
- verbs (``fuzz_verbs.py``): ``profile``, ``trace import/replay/export``, ``run-long``, ``failure-predict``,
  ``list``, ``schema`` and usage errors of every verb (``testbed`` only where it refuses before running);
- subprocess (a sample, in real processes): ``topotrain`` with its stdout on ``/dev/full``, and a ``search``
  killed with SIGKILL at a random time (none of its processes may survive it).

Every output option gets hostile targets (a missing parent folder, an existing file, ``/dev/null``, the input
itself, a folder, a dangling link, a read-only folder: immutable with ``chattr +i``, read-only to root too).
Some cases run with stdout on ``/dev/full`` or a small file-size limit (RLIMIT_FSIZE: a full disk). Each case
runs the real entry point (``topotrain.cli.main``) in-process, one after another, in a batch child forked
from a warm worker (modules imported once), with its stdout/stderr on files, its cwd and TMPDIR in its own
folder, under an address-space cap (RLIMIT_AS: a MemoryError is counted, and the batch goes on in a new
child) and a wall-time cap (past it the child is killed with its process group, the case counted as a hang,
and a new child goes on).

Counted per verb and in total: exit 0 / exit 2 (refused: every stderr line starts ``error:``) and the failures
``internal_error`` (exit 1 "please report" or any other code), ``traceback``, ``hang``, ``memory``,
``accepted_bad`` (exit 0 on an input the case knows is bad: non-UTF-8, non-finite or huge numbers, absurd
options, refused output targets, usage errors), ``damaged_file`` (any file, link or folder in the case's folder,
its TMPDIR included, created, changed or removed that is not an output the run may write; a refusal may write
nothing), ``invalid_json``, ``stray_stderr``, ``long_error_line``, ``stdout_full_unsaid`` and ``survivor``.

Run: ``.venv/bin/python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--workers 2] [--subprocess 20]
[--time-cap-s 60] [--mem-cap-mib 3072]``; exit 1 when any failure was counted.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import hashlib
import json
import multiprocessing as mp
import os
import resource
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_studies  # noqa: E402 - beside this script
import fuzz_verbs  # noqa: E402 - beside this script

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
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
#: the share of the forked cases each family gets (the subprocess sample is counted apart)
#: (the verbs whose valid runs take a second or more get less: 10,000 cases fit in minutes on 2 loaded cores)
FAMILIES = [("scenario", 0.39), ("simulate-trace", 0.03), ("search", 0.07), ("place", 0.05), ("explain", 0.015),
            ("report", 0.015), ("scale", 0.01), ("topo", 0.02), ("validate", 0.015), ("usage", 0.12), ("trace", 0.05),
            ("list", 0.07), ("failure-predict", 0.05), ("run-long", 0.05), ("profile", 0.05)]
#: how often each example scenario is drawn (the 16,384-GPU one takes seconds per valid run)
SCENARIO_WEIGHT = {"llama3-405b-cp.yaml": 0.05}
MAKERS = {"usage": fuzz_verbs.usage_case, "trace": fuzz_verbs.trace_case, "list": fuzz_verbs.list_case,
          "failure-predict": fuzz_verbs.failure_predict_case, "run-long": fuzz_verbs.run_long_case,
          "profile": fuzz_verbs.profile_case, "simulate-trace": fuzz_verbs.simulate_trace_case}
STUDIES = ("search", "place", "explain", "report", "scale", "topo", "validate")
#: longest error line the CLI may print: "error: " + field and message (300) + " (" + fix (2000) + ")"
LONGEST_ERROR_LINE = 7 + 300 + 3 + 2000
BAD = ["internal_error", "traceback", "hang", "memory", "accepted_bad", "damaged_file", "invalid_json",
       "stray_stderr", "long_error_line", "stdout_full_unsaid", "survivor"]


def _scenarios() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        if isinstance(doc, dict) and "cluster" in doc and not p.name.startswith("search-"):
            doc.setdefault("model", "resnet50")
            doc.setdefault("batch", 1024)
            out.append((p.name, doc))
    return out


def scenario_case(rng: np.random.Generator, scenarios: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A mutated or hostile scenario through simulate / topo show / collective / simulate --trace."""
    weights = np.array([SCENARIO_WEIGHT.get(n, 1.0) for n, _ in scenarios])
    name, base = scenarios[int(rng.choice(len(scenarios), p=weights / weights.sum()))]
    why = []
    kind_doc = rng.random() >= 0.12
    doc: Any = None
    if not kind_doc:
        text = HOSTILE_TEXTS[int(rng.integers(len(HOSTILE_TEXTS)))]
        if rng.random() < 0.5:
            text = yaml.safe_dump(base) + text  # hostile tail after a valid scenario
    else:
        doc = fuzz_verbs.mutate(base, rng, 2, VALUES)
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
    if "{T}" in argv:
        why.append("a --trace target it must refuse")
    if argv[0] == "simulate" and "--network" in argv and isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k != "network"}  # the option replaces the file's network
    if argv[0] == "simulate" and fuzz_verbs._has_bad_number(doc if kind_doc else None) or \
            kind_doc and isinstance(doc, dict) and fuzz_verbs._has_bad_number(doc.get("cluster")):
        why.append("a non-finite or huge number")
    files = {name: text.encode("utf-8", "surrogateescape")}
    for extra in EXAMPLES.glob("*topology*.yaml"):
        files[extra.name] = extra.read_bytes()
    target = {"SCENARIO": "{D}/" + name, "": "", ".": "."}.get(trace, "{D}/" + trace)
    argv = [a.replace("{S}", "{D}/" + name).replace("{T}", target) for a in argv]
    verb = "topo show" if argv[0] == "topo" else "simulate --trace" if "--trace" in argv else argv[0]
    return {"verb": verb, "argv": argv, "files": files, "allowed": [], "must_refuse": "; ".join(why), "ro": False}


def make_case(i: int, seed: int, scenarios: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Forked case ``i`` of the run ``seed`` (deterministic): family, files, argv, what it may write."""
    rng = np.random.default_rng([seed, i, 7])
    r = rng.random() * sum(w for _, w in FAMILIES)
    family = FAMILIES[-1][0]
    for name, w in FAMILIES:
        if r < w:
            family = name
            break
        r -= w
    if family == "scenario":
        case = scenario_case(rng, scenarios)
    elif family in STUDIES:
        case = fuzz_studies.make_study_case(i, seed, family)
    else:
        case = MAKERS[family](rng)
    case["i"] = i
    case.setdefault("stdout_full", bool(rng.random() < 0.03))
    case["fsize"] = int(rng.choice([2_000, 20_000, 200_000])) if rng.random() < 0.03 else 0
    for name in case["files"]:
        if f"{{D}}/{name}" not in case["argv"] or name.endswith((".gz", ".et")):  # binary inputs: gzip, protobuf
            continue
        data = case["files"][name]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            case["must_refuse"] = "; ".join(w for w in (case["must_refuse"], "an input that is not UTF-8") if w)
            continue
        if name.endswith(".yaml") and family != "scenario":
            try:
                doc = yaml.load(text, Loader=yaml.CSafeLoader)  # noqa: S506 - the C form of safe_load
            except (yaml.YAMLError, RecursionError, ValueError):  # the CLI's own reader judges these
                continue
            if case["verb"] == "topo show" and isinstance(doc, dict):
                doc = doc.get("cluster")  # topo show reads only the cluster
            if fuzz_verbs._has_bad_number(doc):
                case["must_refuse"] = "; ".join(w for w in (case["must_refuse"], "a non-finite or huge number")
                                                if w)
    return case


# ------------------------------------------------------------------------------------------ the case folder
def _fixtures(folder: Path, i: int, folders: bool) -> None:
    """What a case folder holds besides its files: targets an output may be pointed at (and, with
    ``folders``, for the verbs that write a folder: someone's folder, an empty one, a corrupt or foreign
    store)."""
    (folder / "DIR").mkdir()
    (folder / "FILE").write_text("x")
    os.mkfifo(folder / "FIFO")
    (folder / "LINK").symlink_to(folder / "nowhere")
    (folder / "RO").mkdir()
    (folder / "TMP").mkdir()
    if not folders:
        return
    (folder / "EMPTY").mkdir()
    theirs = folder / "THEIRS"
    theirs.mkdir()
    (theirs / "points.csv").write_text("their data\n")
    (theirs / "validation.csv").write_text("their data\n")
    store = folder / "STORE"
    store.mkdir()
    (store / ".topotrain").write_text("topotrain search output folder\n")
    kind = i % 4
    if kind == 0:
        (store / "results.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    elif kind == 1:
        db = sqlite3.connect(store / "results.sqlite")
        db.execute("CREATE TABLE theirs (x)")
        db.commit()
        db.close()
    elif kind == 3:
        (store / "optuna.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)


def snapshot(folder: Path) -> dict[str, tuple[Any, ...]]:
    """Every path under ``folder`` (its stdout/stderr files left out): its kind, mode and content hash."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            if rel in ("stdout", "stderr"):
                continue
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode)
            elif p.is_file():
                out[rel] = ("file", st.st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[rel] = ("other", st.st_mode)
    return out


def _allowed(rel: str, allowed: list[str]) -> bool:
    return any(rel == a or rel.startswith(a.rstrip("/") + "/") or (a.endswith(".") and rel.startswith(a))
               for a in allowed)


def prepare(case: dict[str, Any], folder: Path) -> None:
    """Write the case's fixtures and files, fill the argv's ``{D}``."""
    _fixtures(folder, case["i"], case["verb"] in ("search", "validate", "report"))
    for name, data in case["files"].items():
        (folder / name).write_bytes(data)
    case["argv"] = [a.replace("{D}", str(folder)) for a in case["argv"]]
    if case["ro"]:  # read-only to root too (a mode is not: root writes through 0o555)
        os.chmod(folder / "RO", 0o555)
        subprocess.run(["chattr", "+i", str(folder / "RO")], check=False, capture_output=True)


# ------------------------------------------------------------------------------------------------ running
def run_in_process(case: dict[str, Any], folder: Path) -> tuple[int | None, str, str]:
    """Run ``case`` through the real entry point in this process, its stdout and stderr on files (at the
    descriptor level), its cwd and TMPDIR in ``folder``, under its file-size limit: (exit code, stdout,
    stderr)."""
    from topotrain.cli import main

    pid = os.getpid()
    saved = os.dup(1), os.dup(2)
    streams = sys.stdout, sys.stderr
    cwd = os.getcwd()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    out = os.open(folder / "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    err = os.open(folder / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    full = os.open("/dev/full", os.O_WRONLY)
    code: Any = 0
    try:
        os.dup2(full if case.get("stdout_full") else out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        os.chdir(folder)
        os.environ["TMPDIR"] = str(folder / "TMP")
        tempfile.tempdir = str(folder / "TMP")
        if case.get("fsize"):
            resource.setrlimit(resource.RLIMIT_FSIZE, (case["fsize"], hard))
        sys.argv = ["topotrain", *case["argv"]]
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except MemoryError:
            os.write(2, b"\nMEMORY-CAP\n")
            code = 99
        except BaseException:  # noqa: BLE001 - escaped the CLI's own handlers: a traceback, counted
            import traceback

            traceback.print_exc()
            code = 98
    finally:
        if os.getpid() != pid:  # a process the case forked came back up through main(): never go on as us
            os.write(2, b"\nFORKED-CHILD-RETURNED-FROM-MAIN\n")
            os._exit(97)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, out, err, full):
            os.close(fd)
        os.chdir(cwd)
    return code, (folder / "stdout").read_text(errors="replace"), (folder / "stderr").read_text(errors="replace")


def run_case(case: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Prepare the case's folder, snapshot it, run the case in this process, and compare."""
    folder = scratch / f"case-{case['i']}"
    folder.mkdir()
    try:
        prepare(case, folder)
        before = snapshot(folder)
        t0 = time.monotonic()
        code, stdout, stderr = run_in_process(case, folder)
        wall = time.monotonic() - t0
        after = snapshot(folder)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if code == 0 or case["stdout_full"]:
            allowed = case["allowed"]
        elif case["fsize"] and case["verb"] in ("search", "validate"):
            allowed = case["allowed"]  # a full disk half-way: the store is kept to resume
        else:
            allowed = []  # a refusal writes nothing
        damage = [] if code not in (0, 2) else [c for c in changed if not _allowed(c, allowed)]
        json_text = stdout if "--json" in case["argv"] and not case["stdout_full"] and not case["fsize"] else ""
        return {"i": case["i"], "verb": case["verb"], "argv": case["argv"], "code": code, "hang": False,
                "stdout": stdout[-2000:], "stderr": stderr[-3000:], "wall_s": wall, "damage": damage,
                "stdout_full": case["stdout_full"], "must_refuse": case["must_refuse"], "json_text": json_text}
    finally:
        _remove(folder, case["ro"])


def _remove(folder: Path, ro: bool = False) -> None:
    if ro:
        subprocess.run(["chattr", "-i", str(folder / "RO")], check=False, capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def _batch_child(cases: list[dict[str, Any]], wfd: int, scratch: Path, mem_cap_bytes: int) -> None:
    """In a child forked from the warm worker: run ``cases`` one after another in this process, telling the
    parent on ``wfd`` when each starts ("S i") and what it gave (a JSON line); never returns. A memory-capped
    case ends the child (its state is suspect): the parent starts a new one for the rest."""
    try:
        os.setpgid(0, 0)  # a hung case is killed with every process it started
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap_bytes, mem_cap_bytes))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails with EFBIG
        mp.current_process().daemon = False  # a pool worker's child: a search's own pool may fork again
        pipe = os.fdopen(wfd, "w", buffering=1)
        for case in cases:
            pipe.write(f"S {case['i']}\n")
            r = run_case(case, scratch)
            r["kinds"] = classify(r)
            r.pop("json_text", None)
            pipe.write(json.dumps(r) + "\n")
            if r["code"] == 99:
                break
        pipe.close()
        os._exit(0)
    except BaseException:  # noqa: BLE001 - the child must never return into the worker
        import traceback

        traceback.print_exc()
        os._exit(98)


def run_batch(cases: list[dict[str, Any]], time_cap_s: float, mem_cap_bytes: int,
              scratch: Path) -> list[dict[str, Any]]:
    """Run ``cases`` in forked batch children (:func:`_batch_child`): a case past ``time_cap_s`` is a hang
    (its child killed with its process group), a child that dies is a crash of its current case; either way
    a new child goes on with the next case."""
    results: list[dict[str, Any]] = []
    todo = list(cases)
    while todo:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            _batch_child(todo, wfd, scratch, mem_cap_bytes)
        os.close(wfd)
        reader = os.fdopen(rfd, "r")
        current: dict[str, Any] | None = None
        started = time.monotonic()
        buf = ""
        dead = False
        while True:
            left = time_cap_s - (time.monotonic() - started) if current is not None else time_cap_s * 4
            ready, _, _ = select.select([reader], [], [], max(0.0, left))
            if not ready:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                dead = True
                break
            chunk = os.read(rfd, 1 << 20).decode()
            if not chunk:
                break
            buf += chunk
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                if line.startswith("S "):
                    i = int(line[2:])
                    current = next(c for c in todo if c["i"] == i)
                    started = time.monotonic()
                else:
                    r = json.loads(line)
                    results.append(r)
                    todo = [c for c in todo if c["i"] != r["i"]]
                    current = None
        _, status = os.waitpid(pid, 0)
        reader.close()
        if current is not None:  # hung (killed at the cap) or the child died inside it
            code = None if dead else os.waitstatus_to_exitcode(status)
            r = {"i": current["i"], "verb": current["verb"], "argv": current["argv"], "code": code, "hang": dead,
                 "stdout": "", "stderr": "" if dead else f"the batch child died: {code}",
                 "wall_s": time.monotonic() - started, "damage": [], "stdout_full": current["stdout_full"],
                 "must_refuse": current["must_refuse"]}
            r["kinds"] = classify(r)
            results.append(r)
            todo = [c for c in todo if c["i"] != current["i"]]
            _remove(scratch / f"case-{current['i']}", current["ro"])  # the killed case's folder
        elif dead:
            break  # no case running and no word for 4 time caps: give up on the rest (counted as missing)
    return results


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
    if r.get("damage"):
        out.append("damaged_file")
    if r.get("survivors"):
        out.append("survivor")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if r["code"] == 2:
        if not lines or not all(ln.startswith("error: ") for ln in lines):
            out.append("stray_stderr")
        if any(len(ln) > LONGEST_ERROR_LINE for ln in lines):
            out.append("long_error_line")
    elif r["code"] == 0:
        if any("Warning" in ln or "warn" in ln.lower() for ln in lines):
            out.append("stray_stderr")
        if r.get("json_text") and not _strict_json(r["json_text"]):
            out.append("invalid_json")
        if r.get("must_refuse") and not r.get("stdout_full"):
            out.append("accepted_bad")
    if r.get("stdout_full") and r["code"] == 0:  # its output went nowhere and it did not say so
        out.append("stdout_full_unsaid")
    if not out:
        out.append("ok" if r["code"] == 0 else "refused")
    return out


# -------------------------------------------------------------------------------------- the subprocess sample
def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process under ``pid``, from /proc."""
    parent: dict[int, int] = {}
    start: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(fields[1])
            start[int(d)] = fields[19]
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c, pp in parent.items():
            if pp == p:
                out.append((c, start[c]))
                todo.append(c)
    return out


def _alive(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


def subprocess_case(i: int, seed: int, time_cap_s: float, scratch: Path) -> dict[str, Any]:
    """A real ``topotrain`` process: stdout on /dev/full (it must say so and exit 2), or a ``search`` killed
    with SIGKILL after a random delay (none of its processes may outlive it by 10 s)."""
    rng = np.random.default_rng([seed, i, 11])
    folder = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(folder)}
    cmd = [sys.executable, "-c", "from topotrain.cli import main; main()"]
    space = folder / "space.yaml"
    doc: dict[str, Any] = copy.deepcopy(fuzz_studies.SPACE)
    doc["plan"]["bucket"] = {"from": 5, "to": 200, "step": 5, "unit": "MiB"}
    space.write_text(yaml.safe_dump(doc))
    t0 = time.monotonic()
    r: dict[str, Any] = {"i": i, "stdout": "", "damage": [], "stdout_full": False, "must_refuse": ""}
    try:
        if i % 2 == 0:
            sc = str(EXAMPLES / "eflops-bigraph.yaml")
            argv = [["list", "models"], ["schema"], ["simulate", sc, "--network", "analytical"],
                    ["topo", "show", sc, "--json"], ["collective", sc, "--network", "analytical", "--json"],
                    ["explain", sc, "--vs", str(EXAMPLES / "resnet50-eflops.yaml"), "--network", "analytical"],
                    ["list", "gpus", "--json"]][int(rng.integers(7))]
            with open("/dev/full", "w") as full:
                p = subprocess.run([*cmd, *argv], stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                                   cwd=folder, timeout=time_cap_s, check=False)
            r.update(verb="stdout /dev/full (subprocess)", argv=argv, code=p.returncode, hang=False,
                     stderr=p.stderr, stdout_full=True)
        else:
            argv = ["search", str(space), "--out", str(folder / "o"), "--workers", "2"]
            p2 = subprocess.Popen([*cmd, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  cwd=folder)
            delay = float(rng.uniform(0.5, 8.0))
            kids: list[tuple[int, str]] = []
            while time.monotonic() - t0 < delay and p2.poll() is None:
                kids = _descendants(p2.pid) or kids
                time.sleep(0.05)
            kids = _descendants(p2.pid) or kids
            p2.kill()
            p2.wait()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(_alive(*k) for k in kids):
                time.sleep(0.1)
            survivors = [k for k in kids if _alive(*k)]
            for pid, _ in survivors:  # ours: do not leave them running
                os.kill(pid, signal.SIGKILL)
            r.update(verb="search kill -9 (subprocess)", argv=[*argv, f"(killed after {delay:.1f} s)"], code=0,
                     hang=False, stderr="", survivors=survivors)
    except subprocess.TimeoutExpired:
        r.update(verb="stdout /dev/full (subprocess)", argv=argv, code=None, hang=True, stderr="")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    r["wall_s"] = time.monotonic() - t0
    return r


# ---------------------------------------------------------------------------------------------------- driver
def _warm_up(scratch: Path) -> None:
    """Run each family once in the worker, so that every forked child starts with topotrain's modules
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
    fuzz_verbs._telemetry()
    for argv in (["list", "models"], ["schema"], ["failure-predict", "--synthetic", "16,8", "--json"],
                 ["trace", "import", *map(str, sorted(fuzz_verbs.TRACES.glob("*.gz"))), "-o",
                  str(folder / "w.json")]):
        CliRunner().invoke(app, argv)
    shutil.rmtree(folder, ignore_errors=True)


def _cache_command() -> None:
    """Build the root click command once in the worker instead of once per case: ``Typer.__call__`` rebuilds it
    from the functions' signatures on every call (70 ms of a 100 ms refusal). Same command, same behaviour;
    every verb is loaded by the warm-up, so the cached command is the whole one."""
    import typer.main

    build = typer.main.get_command
    cache: dict[int, Any] = {}

    def cached(typer_instance: Any) -> Any:
        key = id(typer_instance)
        if key not in cache:
            cache[key] = build(typer_instance)
        return cache[key]

    typer.main.get_command = cached


_WARM: list[list[tuple[str, dict[str, Any]]]] = []


def _worker(args: tuple[list[int], int, float, int, str, int]) -> list[dict[str, Any]]:
    idx, seed, time_cap_s, mem_cap_bytes, scratch, forked = args
    results = []
    if any(i < forked for i in idx) and not _WARM:  # once per worker process
        _warm_up(Path(scratch))
        _cache_command()
        gc.collect()
        gc.freeze()  # fewer copy-on-write faults in each forked batch child
        _WARM.append(_scenarios())
    cases = [make_case(i, seed, _WARM[0]) for i in idx if i < forked]
    if cases:
        results += run_batch(cases, time_cap_s, mem_cap_bytes, Path(scratch))
    for i in idx:
        if i >= forked:
            r = subprocess_case(i, seed, time_cap_s, Path(scratch))
            r["kinds"] = classify(r)
            results.append(r)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases in all, the subprocess sample included")
    ap.add_argument("--subprocess", type=int, default=20, help="of them, real processes (/dev/full, kill -9)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-cap-s", type=float, default=60.0)
    ap.add_argument("--mem-cap-mib", type=int, default=3072)
    ap.add_argument("--chunk", type=int, default=50)
    ap.add_argument("--failures-json", type=Path, default=None, help="write every failing case here")
    a = ap.parse_args()
    t0 = time.monotonic()
    counts: dict[str, int] = {}
    per_verb: dict[str, dict[str, float]] = {}
    failures: list[dict[str, Any]] = []
    walls: list[float] = []
    all_walls: list[tuple[float, str, int]] = []
    os.environ.setdefault("MPLBACKEND", "Agg")
    sub = min(a.subprocess, a.cases)
    forked = a.cases - sub
    with tempfile.TemporaryDirectory(prefix="topotrain-fuzz-") as scratch:
        mpl = Path(scratch) / "mpl"
        mpl.mkdir()
        os.chmod(mpl, 0o777)
        os.environ["MPLCONFIGDIR"] = str(mpl)
        chunks = [list(range(s, min(s + a.chunk, forked))) for s in range(0, forked, a.chunk)]
        chunks += [[i] for i in range(forked, a.cases)]
        jobs = [(c, a.seed, a.time_cap_s, a.mem_cap_mib * 2**20, scratch, forked) for c in chunks]
        done = 0
        with mp.get_context("fork").Pool(a.workers) as pool:
            for n, results in enumerate(pool.imap_unordered(_worker, jobs), 1):
                for r in results:
                    done += 1
                    walls.append(r["wall_s"])
                    all_walls.append((r["wall_s"], r["verb"], r["i"]))
                    v = per_verb.setdefault(r["verb"], {"cases": 0, "ok": 0, "refused": 0, "failing": 0,
                                                        "wall_s": 0.0})
                    v["cases"] += 1
                    v["wall_s"] += r["wall_s"]
                    for k in r["kinds"]:
                        counts[k] = counts.get(k, 0) + 1
                        if k in ("ok", "refused"):
                            v[k] += 1
                    if not set(r["kinds"]) <= {"ok", "refused"}:
                        failures.append(r)
                        v["failing"] += 1
                if n % 10 == 0 or n == len(jobs):
                    print(f"  {done}/{a.cases} cases, {len(failures)} failing, {time.monotonic() - t0:.0f} s",
                          file=sys.stderr, flush=True)
    print(f"fuzz: {a.cases} cases ({forked} forked, {sub} subprocess; seed {a.seed}), time cap {a.time_cap_s:g} s,"
          f" memory cap {a.mem_cap_mib} MiB, wall {time.monotonic() - t0:.0f} s, slowest case {max(walls):.1f} s,"
          f" median {np.median(walls):.2f} s")
    print(f"  {'verb':32s} {'cases':>6s} {'exit 0':>7s} {'exit 2':>7s} {'failing':>8s} {'mean s':>7s}")
    for verb, v in sorted(per_verb.items()):
        print(f"  {verb:32s} {v['cases']:6.0f} {v['ok']:7.0f} {v['refused']:7.0f} {v['failing']:8.0f}"
              f" {v['wall_s'] / v['cases']:7.2f}")
    print(f"  {'total':32s} {sum(v['cases'] for v in per_verb.values()):6.0f} {counts.get('ok', 0):7d}"
          f" {counts.get('refused', 0):7d} {len(failures):8d}")
    if done < a.cases:
        counts["lost"] = a.cases - done
        failures.append({"i": -1, "kinds": ["lost"], "code": None, "argv": [], "stderr": "cases never reported"})
    for k in [*BAD, "lost"]:
        print(f"  {k}: {counts.get(k, 0)}")
    slow = sorted(all_walls, reverse=True)[:8]
    print("  slowest: " + "; ".join(f"{w:.1f} s {v} #{i}" for w, v, i in slow))
    if a.failures_json is not None:
        a.failures_json.write_text(json.dumps(failures, indent=1))
    for r in failures[:12]:
        print(f"--- case {r['i']} {r['kinds']} exit {r['code']}: {' '.join(x[:80] for x in r['argv'])}")
        if r.get("damage"):
            print(f"    changed: {r['damage'][:6]}")
        if r.get("must_refuse") and "accepted_bad" in r["kinds"]:
            print(f"    should refuse: {r['must_refuse']}")
        print("    " + "\n    ".join(r["stderr"].strip().splitlines()[-6:]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
