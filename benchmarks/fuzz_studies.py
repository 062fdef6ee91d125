"""The studies' part of ``benchmarks/fuzz.py`` (``--studies``): hostile input to ``search``, ``place``,
``explain``, ``report``, ``scale``, ``topo show`` and ``validate``.

A case is a small valid input (a 2-point search space, a 4-server cluster and a job trace, a scenario),
mutated like fuzz.py's scenarios (keys dropped, values replaced by hostile ones: NaN, infinities, words,
integers of thousands of digits, booleans, 100 KB strings), sometimes saved as non-UTF-8 bytes, run with
hostile options (``--workers`` absurd, a malformed ``--dask-scheduler``, ``--resume`` onto a corrupt or
foreign store) into hostile output targets (someone else's folder, a file, ``/dev/null``, the input itself,
a dangling link, a missing parent folder), sometimes with stdout on ``/dev/full``.

Besides fuzz.py's counts it checks that a refused run changed no file it did not own (someone's folder, a
foreign store, the inputs) and that a run whose stdout is ``/dev/full`` says so on stderr and exits 2.
"""

from __future__ import annotations

import copy
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import yaml

NET = {"topology": "bigraph", "switches": 4, "radix": 16, "link": "eth-100g"}
SPACE = {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "resnet50",
         "batch": {"global": 1024, "micro": 64},
         "plan": {"dp_algorithm": ["ring", "hdrm"], "bucket": {"from": 50, "to": 100, "step": 50, "unit": "MiB"}},
         "search": {"screen_network": "analytical", "confirm_top": 0, "trials": 3, "batch": 2, "seed": 1},
         "costs": {"gpus": {"v100": {"price_usd": 9000}}, "energy": {"usd_per_kwh": 0.1}}}
CLUSTER = {"cluster": {"server": "eflops", "servers": 4, "network": {"topology": "leaf-spine", "leaves": 2,
                                                                    "oversubscription": 8, "link": "eth-100g"}}}
JOBS = [{"arrival": 0, "model": "resnet50", "gpus": 8, "iterations": 3},
        {"arrival": 0.1, "model": "resnet50", "gpus": 16, "iterations": 2, "batch": 32, "name": "b"}]
SCENARIO = {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "resnet50", "batch": 256}
VALUES: list[Any] = [None, 0, -1, 1, 2, 1.5, 2.7, True, False, float("nan"), float("inf"), -float("inf"), 1e10,
                     1e300, 10**30, int("9" * 300), "abc", "", "ten", "1e400", "nan", [], [1, 2], {}, {"x": 1},
                     "x" * 100_000, "\x00\x1b[31m", "é𝄞", {"from": 0, "to": float("inf")}, {"log2": [1, 10**40]},
                     {"choice": []}, list(range(200_000)), "tpe", "nsga2", "grid", "alternate", 2**40, -5]
#: the file a job of the studies' verbs may write (any other change in the case folder is damage)
OUTPUT_TARGETS = ["NEW", "NEW/deep/er", "THEIRS", "FILE", "/dev/null", "INPUT", "LINK", "EMPTY"]


def doc_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indices) into a parsed YAML document, its root left out."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += doc_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += doc_paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, rng: np.random.Generator, most: int = 3) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(int(rng.integers(0, most + 1))):
        paths = doc_paths(doc)
        if not paths:
            break
        path = paths[int(rng.integers(len(paths)))]
        parent: Any = doc
        for k in path[:-1]:
            parent = parent[k]
        if rng.random() < 0.15:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(VALUES[int(rng.integers(len(VALUES)))])
    return doc


def _text(doc: Any, rng: np.random.Generator) -> bytes:
    text = yaml.safe_dump(doc, allow_unicode=True, width=10**9).encode("utf-8")
    r = rng.random()
    if r < 0.06:  # not UTF-8
        cut = int(rng.integers(0, max(1, len(text))))
        text = text[:cut] + b"\xff\xfe\xe9" + text[cut:]
    elif r < 0.09:
        text = text.replace(b"trials: 3", b"trials: " + b"9" * 5000)
    return text


def make_study_case(i: int, seed: int) -> dict[str, Any]:
    """Case ``i``: files to write (name → bytes), argv with placeholders, and flags."""
    rng = np.random.default_rng([seed, i, 42])
    verb = ["search", "search", "search", "place", "place", "explain", "report", "scale", "topo",
            "validate"][int(rng.integers(10))]
    files: dict[str, bytes] = {}
    out = OUTPUT_TARGETS[int(rng.integers(len(OUTPUT_TARGETS)))]
    argv: list[str]
    if verb == "search":
        files["space.yaml"] = _text(_mutate(SPACE, rng), rng)
        argv = ["search", "{D}/space.yaml", "--out", "{O}", "--json"]
        workers = ["1", "1", "1", "2", "0", "-1", "100000", "1" + "0" * 40, "x"][int(rng.integers(9))]
        argv += ["--workers", workers]
        r = rng.random()
        if r < 0.1:
            argv += ["--dask-scheduler", ["nonsense", "tcp://h:99999", "tcp://:1", "http://x:1", "tcp://a b:1",
                                          "tcp://127.0.0.1:1\x00"][int(rng.integers(6))]]
        elif r < 0.2:
            argv += ["--optimizer", ["tpe", "nsga2", "alternate", "bogus"][int(rng.integers(4))], "--trials",
                     ["3", "0", "-2", "99999999999"][int(rng.integers(4))]]
        elif r < 0.25:
            argv += ["--seed", ["1", "-1", "99999999999999"][int(rng.integers(3))]]
        store = rng.random()
        if store < 0.15:
            out = "STORE"
            argv.append("--resume")
        if rng.random() < 0.1:
            argv.append("--force")
    elif verb == "place":
        files["cluster.yaml"] = _text(_mutate(CLUSTER, rng, 1), rng)
        jobs = _mutate(JOBS, rng)
        if rng.random() < 0.4 and isinstance(jobs, list):
            keys = ["arrival", "model", "gpus", "iterations"]
            rows = [",".join(str(j.get(k, "")) if isinstance(j, dict) else "?" for k in keys) for j in jobs]
            files["jobs.csv"] = ("\n".join([",".join(keys), *rows]) + "\n").encode("utf-8", "surrogatepass")
            argv = ["place", "{D}/cluster.yaml", "{D}/jobs.csv", "--policy", "first-fit", "--json"]
        else:
            files["jobs.yaml"] = _text(jobs, rng)
            argv = ["place", "{D}/cluster.yaml", "{D}/jobs.yaml", "--policy",
                    ["first-fit", "packed", "search", "bogus"][int(rng.integers(4))], "--json"]
        out = "NONE"
    elif verb in ("explain", "report", "scale", "topo"):
        files["a.yaml"] = _text(_mutate(SCENARIO, rng), rng)
        files["b.yaml"] = _text(_mutate(SCENARIO, rng, 1), rng)
        if verb == "explain":
            argv = ["explain", "{D}/a.yaml", "--vs", "{D}/b.yaml", "--network", "analytical", "--json"]
            out = "NONE"
        elif verb == "report":
            argv = ["report", "{D}/a.yaml", "--network", "analytical", "-o", "{OH}"]
        elif verb == "scale":
            argv = ["scale", "{D}/a.yaml", "--gpus", ["8:16", "16:8", "1:99999999", "x", "8:8"][int(rng.integers(5))],
                    "--json"]
            out = "NONE"
        else:
            argv = ["topo", "show", "{D}/a.yaml", "--json"]
            out = "NONE"
    else:
        argv = ["validate", "--quick", "--no-ns3", "--no-simgrid", "--json", "--out", "{O}"]
        if rng.random() < 0.5:
            argv += ["--topologies", ["dumbbell", "nope", "single-switch"][int(rng.integers(3))]]
        if rng.random() < 0.2:
            argv += ["--traffic", ["incast", "ring", "x"][int(rng.integers(3))]]
    full = rng.random() < 0.05
    return {"i": i, "verb": verb, "files": files, "argv": argv, "out": out, "stdout_full": full}


def prepare(case: dict[str, Any], folder: Path) -> dict[str, bytes]:
    """Write the case's files and targets into ``folder``; the argv with its placeholders filled. Returns the
    snapshot of every file the run must not change (name → bytes)."""
    for name, data in case["files"].items():
        (folder / name).write_bytes(data)
    theirs = folder / "THEIRS"
    theirs.mkdir()
    (theirs / "points.csv").write_text("their data\n")
    (theirs / "validation.csv").write_text("their data\n")
    (folder / "EMPTY").mkdir()
    (folder / "FILE").write_text("x")
    (folder / "LINK").symlink_to(folder / "nowhere")
    store = folder / "STORE"
    store.mkdir()
    (store / ".topotrain").write_text("topotrain search output folder\n")
    kind = case["i"] % 3
    if kind == 0:
        (store / "results.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    elif kind == 1:
        db = sqlite3.connect(store / "results.sqlite")
        db.execute("CREATE TABLE theirs (x)")
        db.commit()
        db.close()
    out = {"INPUT": str(folder / (next(iter(case["files"]), "FILE"))), "/dev/null": "/dev/null"}.get(
        case["out"], str(folder / case["out"]))
    html = f"{out}.html" if case["out"] in ("NEW", "NEW/deep/er", "EMPTY") else out
    case["argv"] = [a.replace("{D}", str(folder)).replace("{OH}", html).replace("{O}", out) for a in case["argv"]]
    keep: dict[str, bytes] = {}
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            keep[str(p.relative_to(folder))] = p.read_bytes()
    return keep


def damaged(case: dict[str, Any], folder: Path, keep: dict[str, bytes], code: int | None) -> bool:
    """A file the run did not own was changed or removed (someone's folder, a foreign or corrupt store on a
    refused resume, the inputs); a refused run (exit 2) also must not have left a new results store."""
    for name, data in keep.items():
        p = folder / name
        if not p.is_file() or p.read_bytes() != data:
            if name.startswith("STORE/") and code == 0:
                continue  # a resumed search owns its store
            if name.startswith("THEIRS/") and "--force" in case["argv"] and code == 0:
                continue  # forced: the user said so
            return True
    if not (folder / "LINK").is_symlink() or (folder / "nowhere").exists():
        return True
    # (a search whose only failure was its stdout on /dev/full ran whole: its store is a result, not debris)
    return code == 2 and case["verb"] == "search" and not case["stdout_full"] and \
        case["out"] in ("NEW", "NEW/deep/er", "EMPTY") and (folder / case["out"] / "results.sqlite").exists()
