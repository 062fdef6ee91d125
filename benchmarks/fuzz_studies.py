"""The studies' part of ``benchmarks/fuzz.py`` (``--studies``): hostile input to ``search``, ``place``,
``explain``, ``report``, ``scale``, ``topo show`` and ``validate``.

A case is a small valid input (a 2-point search space, a 4-server cluster and a job trace, a scenario),
mutated like fuzz.py's scenarios (keys dropped, values replaced by hostile ones: NaN, infinities, words,
integers of thousands of digits, booleans, 100 KB strings), sometimes saved as non-UTF-8 bytes, run with
hostile options (``--workers`` absurd, a malformed ``--dask-scheduler``, ``--resume`` onto a corrupt or
foreign store) into hostile output targets (someone else's folder, a file, ``/dev/null``, the input itself,
a dangling link, a missing parent folder), sometimes with stdout on ``/dev/full``.

A case says what the run may write (its new output folder, a resumed store, someone's folder with
``--force``) and why an exit 0 would be a bad input accepted; fuzz.py snapshots the case folder around it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import yaml

import fuzz_verbs  # beside this module (benchmarks/ is on the path of fuzz.py and of the tests)

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
                     {"choice": []}, list(range(100_001)), "tpe", "nsga2", "grid", "alternate", 2**40, -5]
#: the file a job of the studies' verbs may write (any other change in the case folder is damage)
OUTPUT_TARGETS = ["NEW", "NEW/deep/er", "THEIRS", "FILE", "/dev/null", "INPUT", "LINK", "EMPTY", "RO"]


def _mutate(doc: Any, rng: np.random.Generator, most: int = 3) -> Any:
    """``doc`` with 0 to ``most`` keys dropped or given one of this module's hostile values."""
    return fuzz_verbs.mutate(doc, rng, most, VALUES)


def _text(doc: Any, rng: np.random.Generator) -> bytes:
    text = yaml.dump(doc, Dumper=yaml.CSafeDumper, allow_unicode=True, width=10**9).encode("utf-8")
    r = rng.random()
    if r < 0.06:  # not UTF-8
        cut = int(rng.integers(0, max(1, len(text))))
        text = text[:cut] + b"\xff\xfe\xe9" + text[cut:]
    elif r < 0.09:
        text = text.replace(b"trials: 3", b"trials: " + b"9" * 5000)
    return text


def make_study_case(i: int, seed: int, verb: str | None = None) -> dict[str, Any]:
    """Case ``i`` (of ``verb``, else a verb drawn): files to write (name → bytes), argv, what it may write."""
    rng = np.random.default_rng([seed, i, 42])
    drawn = ["search", "search", "search", "place", "place", "explain", "report", "scale", "topo",
             "validate"][int(rng.integers(10))]
    verb = verb or drawn
    files: dict[str, bytes] = {}
    out = OUTPUT_TARGETS[int(rng.integers(len(OUTPUT_TARGETS)))]
    why: list[str] = []
    argv: list[str]
    if verb == "search":
        files["space.yaml"] = _text(_mutate(SPACE, rng), rng)
        argv = ["search", "{D}/space.yaml", "--out", "{O}", "--json"]
        workers = ["1", "1", "1", "2", "0", "-1", "100000", "1" + "0" * 40, "x"][int(rng.integers(9))]
        argv += ["--workers", workers]
        why.append("" if workers in ("1", "2") else "an absurd --workers")
        r = rng.random()
        if r < 0.1:
            argv += ["--dask-scheduler", ["nonsense", "tcp://h:99999", "tcp://:1", "http://x:1", "tcp://a b:1",
                                          "tcp://127.0.0.1:1\x00"][int(rng.integers(6))]]
            why.append("a malformed or unreachable --dask-scheduler")
        elif r < 0.2:
            argv += ["--optimizer", ["tpe", "nsga2", "alternate", "bogus"][int(rng.integers(4))], "--trials",
                     ["3", "0", "-2", "99999999999"][int(rng.integers(4))]]
            why.append("" if argv[-1] == "3" and argv[-3] != "bogus" else "a bad --optimizer/--trials")
        elif r < 0.25:
            argv += ["--seed", ["1", "-1", "99999999999999"][int(rng.integers(3))]]
            why.append("" if argv[-1] == "1" else "a seed outside optuna's range")
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
            why.append("an unknown --policy" if "bogus" in argv else "")
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
            why.append("" if argv[3] in ("8:16", "8:8") else "a bad --gpus range")
            out = "NONE"
        else:
            argv = ["topo", "show", "{D}/a.yaml", "--json"]
            out = "NONE"
    else:
        argv = ["validate", "--quick", "--no-ns3", "--no-simgrid", "--json", "--out", "{O}"]
        if rng.random() < 0.5:
            argv += ["--topologies", ["dumbbell", "nope", "single-switch"][int(rng.integers(3))]]
            why.append("an unknown topology" if argv[-1] == "nope" else "")
        if rng.random() < 0.2:
            argv += ["--traffic", ["incast", "ring", "x"][int(rng.integers(3))]]
            why.append("an unknown traffic" if argv[-1] == "x" else "")
    return _generic(verb, files, argv, out, why, rng)


#: folder outputs (search, validate --out): target → (the argv value, what the run may write, why it must refuse)
_FOLDER_OUT = {"NEW": ("{D}/NEW", "NEW", ""), "NEW/deep/er": ("{D}/NEW/deep/er", "NEW", ""),
               "EMPTY": ("{D}/EMPTY", "EMPTY", ""), "STORE": ("{D}/STORE", "STORE", ""),
               "THEIRS": ("{D}/THEIRS", "", "someone else's folder without --force"),
               "FILE": ("{D}/FILE", "", "--out onto a file"), "/dev/null": ("/dev/null", "", "--out onto /dev/null"),
               "INPUT": ("", "", "--out onto its input"), "LINK": ("{D}/LINK", "", "--out onto a dangling link"),
               "RO": ("{D}/RO/o", "", "--out in a read-only folder")}
#: report's HTML file
_FILE_OUT = {"NEW": ("{D}/NEW.html", "NEW.html", ""), "NEW/deep/er": ("{D}/NEW/deep/er.html", "NEW", ""),
             "EMPTY": ("{D}/EMPTY/r.html", "EMPTY", ""), "STORE": ("{D}/STORE", "", "-o onto a folder"),
             "THEIRS": ("{D}/THEIRS", "", "-o onto a folder"), "FILE": ("{D}/FILE", "FILE", ""),
             "/dev/null": ("/dev/null", "", "-o onto /dev/null"), "INPUT": ("", "", "-o onto its input"),
             "LINK": ("{D}/LINK", "nowhere", ""), "RO": ("{D}/RO/r.html", "", "-o in a read-only folder")}


def _generic(verb: str, files: dict[str, bytes], argv: list[str], out: str, why: list[str],
             rng: np.random.Generator) -> dict[str, Any]:
    """The case in fuzz.py's form: ``{O}`` filled, what the run may write, why an exit 0 would be wrong."""
    allowed: list[str] = []
    if "{O}" in argv or "{OH}" in argv:
        table = _FOLDER_OUT if "{O}" in argv else _FILE_OUT
        value, may, reason = table[out]
        if out == "INPUT":
            value = "{D}/" + next(iter(files), "FILE")
        if out == "THEIRS" and "--force" in argv:
            may, reason = "THEIRS", ""
        if out == "STORE" and "--resume" not in argv:
            reason = "" if "--force" in argv else "a search folder that holds a store, without --resume"
            may = "STORE" if "--force" in argv else ""
        argv = [value if a in ("{O}", "{OH}") else a for a in argv]
        allowed.append(may)
        why.append(reason)
    return {"verb": "topo show" if verb == "topo" else verb, "files": files, "argv": argv,
            "allowed": [a for a in allowed if a], "must_refuse": "; ".join(w for w in why if w),
            "ro": out == "RO", "stdout_full": bool(rng.random() < 0.05)}
