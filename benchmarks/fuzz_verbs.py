"""The verbs ``benchmarks/fuzz.py`` drives besides the scenario and studies cases: ``profile``, ``trace``
(import, replay, export: recorded files truncated, not gzip, mutated JSON, not UTF-8), ``run-long`` (a mutated
failures file, hostile amounts and options), ``failure-predict`` (a mutated telemetry CSV, hostile synthetic
sizes, horizons and fractions), ``list``, ``schema``, and usage errors of every verb (unknown options, missing
values, extra arguments, values of the wrong type; ``testbed`` only with options refused before it runs).

Every file-writing option gets a target from :data:`FILE_TARGETS`: a new file in a missing folder (created:
the one rule for outputs), an existing file (replaced), ``/dev/null``, the input itself, a folder, a path
under a file, a dangling link (written through: its target is created) or a file in a read-only folder (made immutable
with ``chattr +i``, so that it is read-only to root too).

A case is a dict: ``verb`` (the label counted), ``files`` (name → bytes written into the case folder),
``argv`` (``{D}`` is the case folder), ``allowed`` (paths in the folder the run may create or change on
success), ``must_refuse`` (why an exit 0 is a bad input accepted, or ``""``), ``ro`` (the read-only folder is used).
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TRACES = ROOT / "tests" / "data" / "traces" / "resnet-w2"
#: where a file output goes: (target, relative path the run may create, why an exit 0 is wrong or "")
FILE_TARGETS: list[tuple[str, str, str]] = [
    ("NEW/o.EXT", "NEW", ""), ("NEW/deep/er/o.EXT", "NEW", ""), ("FILE", "FILE", ""), ("o.EXT", "o.EXT", ""),
    ("/dev/null", "", "an output onto /dev/null"), ("INPUT", "", "an output onto its own input"),
    ("DIR", "", "an output onto a folder"), ("FILE/x.EXT", "", "an output under a file"),
    ("LINK", "nowhere", ""), ("RO/o.EXT", "", "an output in a read-only folder"),
]
#: values that no numeric field accepts (an exit 0 with one of them in its input is a bad input accepted)
BAD_NUMBERS: list[Any] = [float("nan"), float("inf"), -float("inf"), 10**30, -(10**30), int("9" * 400)]
VALUES: list[Any] = [None, 0, -1, 1, 2, 0.5, 1.5, True, "abc", "", "1e400", "1h", "-1h", "2TB/s", [], [1, 2], {},
                     {"x": 1}, "x" * 100_000, "\x00\x1b[31m", "é𝄞", "weibull", "switch", "llama3", 1e300,
                     *BAD_NUMBERS]


def _has_bad_number(node: Any) -> bool:
    if isinstance(node, bool):
        return False
    if isinstance(node, float):
        return not np.isfinite(node)
    if isinstance(node, int):
        return abs(node) >= 2**63
    if isinstance(node, dict):
        return any(_has_bad_number(k) or _has_bad_number(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_bad_number(v) for v in node)
    return False


def doc_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indices) into a parsed document, its root left out."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += doc_paths(v, (*prefix, k))
    elif isinstance(node, list) and len(node) <= 1000:  # a hostile 100,000-value list is a leaf
        for i, v in enumerate(node):
            out += doc_paths(v, (*prefix, i))
    return out


def mutate(doc: Any, rng: np.random.Generator, most: int = 3, values: list[Any] | None = None) -> Any:
    """``doc`` with 0 to ``most`` random keys dropped or values replaced by hostile ones."""
    doc = copy.deepcopy(doc)
    pool = VALUES if values is None else values
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
            v = pool[int(rng.integers(len(pool)))]
            parent[path[-1]] = v if isinstance(v, list) and len(v) > 1000 else copy.deepcopy(v)  # never mutated
    return doc


def _pick(rng: np.random.Generator, seq: list[Any]) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _damage_bytes(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """``data`` made not UTF-8 (sometimes): (bytes, why it must be refused or "")."""
    if rng.random() < 0.06:
        cut = int(rng.integers(0, max(1, len(data))))
        return data[:cut] + b"\xff\xfe\xe9" + data[cut:], "an input that is not UTF-8"
    return data, ""


def _file_target(rng: np.random.Generator, ext: str, input_name: str) -> tuple[str, str, str, bool]:
    """(argv value, allowed path, must-refuse reason, run unprivileged) of one output option."""
    target, allowed, why = _pick(rng, FILE_TARGETS)
    value = {"INPUT": "{D}/" + input_name, "/dev/null": "/dev/null"}.get(target, "{D}/" + target.replace("EXT", ext))
    return value, allowed.replace("EXT", ext), why, target.startswith("RO/")


def _case(verb: str, argv: list[str], files: dict[str, bytes] | None = None, allowed: list[str] | None = None,
          why: list[str] | None = None, ro: bool = False) -> dict[str, Any]:
    return {"verb": verb, "argv": argv, "files": files or {}, "allowed": [a for a in allowed or [] if a],
            "must_refuse": "; ".join(w for w in why or [] if w), "ro": ro}


def profile_case(rng: np.random.Generator) -> dict[str, Any]:
    """``profile``: the cheap stand-in method with hostile arguments (the torch module method only with
    arguments it must refuse before it measures)."""
    why: list[str] = []
    # (a valid run measures torch on this CPU for seconds: small models and batches only)
    model = _pick(rng, ["resnet50", "resnet50", "bert-base", "nope", "", "x" * 1000])
    if model in ("nope", "", "x" * 1000):
        why.append("an unknown model")
    argv = ["profile", model, "--method", "standin", "--repeats", "1"]
    batch = _pick(rng, ["1", "2", "0", "-1", "100000", "4097", "1e3", "x", "9" * 400])
    argv += ["--batch", batch]
    if batch not in ("1", "2"):
        why.append("an absurd --batch")
    r = rng.random()
    if r < 0.2:
        argv[3] = "module"  # refused before measuring: absurd repeats or warm-up
        bad = _pick(rng, ["0", "-1", "1001", "x", "1e9"])
        argv += [_pick(rng, ["--repeats", "--warmup"]), bad]
        why.append("absurd repeats/warm-up")
    elif r < 0.3:
        argv[3] = _pick(rng, ["bogus", ""])
        why.append("an unknown method")
    elif r < 0.4:
        argv += ["--device", _pick(rng, ["bogus", "", "tpu"])]
        why.append("an unknown device")
    out, allowed, w, ro = _file_target(rng, _pick(rng, ["json", "csv", "txt"]), "none")
    why.append(w)
    if out.endswith(".txt"):
        why.append("an unknown output format")
    return _case("profile", [*argv, "-o", out], allowed=[allowed], why=why, ro=ro)


def _trace_files(rng: np.random.Generator) -> tuple[dict[str, bytes], str]:
    files: dict[str, bytes] = {}
    why = ""
    for p in sorted(TRACES.glob("*.gz")):
        files[p.name] = p.read_bytes()
    if rng.random() < 0.75:
        name = _pick(rng, sorted(files))
        raw = gzip.decompress(files[name])
        r = rng.random()
        if r < 0.2:
            files[name] = files[name][:int(rng.integers(0, len(files[name])))]
            why = "a truncated gzip file"
        elif r < 0.3:
            files[name] = raw  # plain JSON under a .gz name
        elif r < 0.4:
            files[name] = gzip.compress(raw[:int(rng.integers(0, len(raw)))], mtime=0)
            why = "a truncated JSON document"
        elif r < 0.5:
            files[name] = gzip.compress(b"\xff\xfe" + raw, mtime=0)
            why = "an input that is not UTF-8"
        elif r < 0.55:
            files[name] = b""
            why = "an empty file"
        else:
            doc = json.loads(raw)
            files[name] = gzip.compress(json.dumps(mutate(doc, rng, 4, VALUES[:-6] + ["NaN"])).encode(), mtime=0)
    return files, why


def trace_case(rng: np.random.Generator) -> dict[str, Any]:
    """``trace import`` / ``replay`` / ``export`` on a 2-rank recording, some of its files damaged."""
    files, why0 = _trace_files(rng)
    names = sorted(files)
    why = [why0]
    if rng.random() < 0.1:
        names = names[:int(rng.integers(0, len(names)))] + ["missing.json.gz"]
        why.append("a missing file")
    args = ["{D}/" + n for n in names]
    sub = _pick(rng, ["import", "import", "replay", "export"])
    if sub == "import":
        out, allowed, w, ro = _file_target(rng, "json", names[0] if names else "none")
        argv = ["trace", "import", *args, "-o", out]
    elif sub == "export":
        out, allowed, w, ro = _file_target(rng, "et", names[0] if names else "none")
        # a prefix: writes PREFIX.<rank>.et beside it (an existing file or link as the prefix is fine)
        allowed = {"FILE": "FILE.", "nowhere": "LINK.", "o.et": "o.et."}.get(allowed, allowed)
        if w == "an output onto its own input":  # INPUT.0.et is a new file beside it
            w, allowed = "", names[0] + "."
        argv = ["trace", "export", *args, "-o", out]
    else:
        out, allowed, w, ro = "", "", "", False
        argv = ["trace", "replay", *args, "--json"]
        r = rng.random()
        if r < 0.3:
            opt = _pick(rng, ["--world", "--cores"])
            bad = _pick(rng, ["-2", "x", "100000000", "9" * 400] + (["0"] if opt == "--world" else []))
            argv += [opt, bad]
            why.append("an absurd --world/--cores")
        elif r < 0.4:
            argv += ["--network", _pick(rng, ["bogus", "", "flow"])]
            why.append("" if argv[-1] == "flow" else "an unknown network")
    why.append(w)
    return _case(f"trace {sub}", argv, files, [allowed], why, ro)


def run_long_case(rng: np.random.Generator) -> dict[str, Any]:
    """``run-long`` with a mutated failures file and hostile amounts (few Monte-Carlo samples: bounded)."""
    why: list[str] = []
    doc = yaml.safe_load((EXAMPLES / "failures.yaml").read_text())
    doc["samples"] = 20
    doc = mutate(doc, rng, 3)
    if _has_bad_number(doc):
        why.append("a non-finite or huge number")
    text, w = _damage_bytes(yaml.safe_dump(doc, allow_unicode=True, width=10**9).encode(), rng)
    why.append(w)
    files = {"failures.yaml": text, "s.yaml": (EXAMPLES / "resnet50-eflops.yaml").read_bytes()}
    amount = _pick(rng, ["1T", "15T", "1M", "0", "-1", "1e400", "x", "nan", "9" * 400])
    if amount not in ("1T", "15T", "1M"):
        why.append("an absurd --tokens")
    argv = ["run-long", "{D}/s.yaml", "--tokens", amount, "--failures", "{D}/failures.yaml", "--samples",
            _pick(rng, ["5", "20", "20"])]
    r = rng.random()
    if r < 0.15:
        opt, value = _pick(rng, ["--samples", "--workers", "--seed"]), _pick(rng, ["0", "-1", "x", "99999999999"])
        argv += [opt, value]
        why.append("" if opt == "--seed" and value in ("0", "99999999999") else "an absurd option value")
    elif r < 0.25:
        argv += ["--objective", "bogus"]
        why.append("an unknown objective")
    elif r < 0.35:
        argv += ["--tune", _pick(rng, ["0,1", "x", "-1", "1e9"])]
        why.append("" if argv[-1] == "0,1" else "an absurd --tune")
    allowed = []
    if rng.random() < 0.5:
        out, a, w, ro = _file_target(rng, _pick(rng, ["json"]), "failures.yaml")
        argv += ["-o", out]
    else:
        out, a, w, ro = _file_target(rng, _pick(rng, ["png", "svg"]), "failures.yaml")
        argv += ["--png", out]
    allowed.append(a)
    why.append(w)
    return _case("run-long", [*argv, "--json"], files, allowed, why, ro)


_TELEMETRY: list[bytes] = []


def _telemetry() -> bytes:
    """A small synthetic telemetry CSV (16 GPUs, 8 days, seed 0), made once per process."""
    if not _TELEMETRY:
        from topotrain.operations.telemetry import synthetic_telemetry, to_csv

        _TELEMETRY.append(to_csv(synthetic_telemetry(16, 8.0, seed=0)).encode())
    return _TELEMETRY[0]


def failure_predict_case(rng: np.random.Generator) -> dict[str, Any]:
    """``failure-predict`` on a small synthetic record or a mutated telemetry CSV."""
    why: list[str] = []
    files: dict[str, bytes] = {}
    if rng.random() < 0.5:
        size = _pick(rng, ["16,8", "16,8", "8,12", "0,0", "x", "1e9,1", "8,-1", "8", "9" * 400 + ",1", "nan,2"])
        if size not in ("16,8", "8,12"):
            why.append("an absurd --synthetic")
        argv = ["failure-predict", "--synthetic", size]
    else:
        data = _telemetry()
        r = rng.random()
        if r < 0.5:
            lines = data.decode().splitlines()
            k = int(rng.integers(1, len(lines)))
            cells = lines[k].split(",")
            cells[int(rng.integers(len(cells)))] = str(_pick(rng, ["nan", "inf", "", "x", "-1", "1e400", "é"]))
            lines[k] = ",".join(cells)
            data = ("\n".join(lines) + "\n").encode()
        elif r < 0.6:
            data = data[:int(rng.integers(0, len(data)))]
        data, w = _damage_bytes(data, rng)
        why.append(w)
        files["telemetry.csv"] = data
        argv = ["failure-predict", "{D}/telemetry.csv"]
    r = rng.random()
    if r < 0.3:
        argv += ["--horizon", _pick(rng, ["0h", "-1h", "x", "1e400h", "nan", "100000000h"])]
        why.append("an absurd --horizon")
    elif r < 0.5:
        argv += ["--test-fraction", _pick(rng, ["0", "1", "nan", "-1", "inf", "x"])]
        why.append("an absurd --test-fraction")
    out, a, w, ro = _file_target(rng, _pick(rng, ["json", "csv"]), "telemetry.csv")
    opt = "-o" if out.endswith(".json") or rng.random() < 0.5 else "--write-telemetry"
    why.append(w if "telemetry.csv" in files or opt == "-o" or "INPUT" not in out else "")
    return _case("failure-predict", [*argv, opt, out, "--json"], files, [a], why, ro)


def list_case(rng: np.random.Generator) -> dict[str, Any]:
    """``list`` and ``schema`` with known, unknown and hostile words."""
    if rng.random() < 0.15:
        return _case("schema", ["schema"])
    kind = _pick(rng, ["models", "gpus", "servers", "links", "topologies", "algorithms", "bogus", "", "x" * 5000,
                       "\x1b[31m"])
    argv = ["list", kind]
    if rng.random() < 0.5:
        argv.append(_pick(rng, ["a", "gpt", "", "zzz", "é𝄞", "x" * 5000]))
    if rng.random() < 0.6:
        argv.append("--json")
    return _case("list", argv, why=["" if kind in ("models", "gpus", "servers", "links", "topologies",
                                                    "algorithms") else "an unknown kind"])


#: (argv prefix, an option of it that takes a value) for the usage-error cases
USAGE: list[tuple[list[str], str]] = [
    (["simulate", "{D}/s.yaml"], "--network"), (["simulate", "{D}/s.yaml"], "--set"),
    (["collective", "{D}/s.yaml"], "--size"), (["report", "{D}/s.yaml"], "-o"), (["scale", "{D}/s.yaml"], "--gpus"),
    (["profile"], "--batch"), (["search", "{D}/s.yaml"], "--workers"), (["explain", "{D}/s.yaml"], "--vs"),
    (["place", "{D}/s.yaml"], "--policy"), (["validate", "--quick"], "--topologies"),
    (["run-long", "{D}/s.yaml"], "--tokens"), (["failure-predict"], "--horizon"), (["topo", "show"], "--png"),
    (["trace", "import"], "-o"), (["trace", "replay"], "--world"), (["trace", "export"], "-o"),
    (["list"], "--json"), (["testbed", "compare"], "--repeats"), (["testbed", "ddp"], "--steps"),
    (["testbed", "clean"], "--force"),
]


def usage_case(rng: np.random.Generator) -> dict[str, Any]:
    """A usage error: a missing option value, an unknown option, extra arguments, a value of the wrong type,
    an unknown verb; each must be one ``error:`` line (exit 2)."""
    head, opt = _pick(rng, USAGE)
    files = {"s.yaml": (EXAMPLES / "resnet50-eflops.yaml").read_bytes()}
    takes_value = opt not in ("--json", "--force")
    typed = opt in ("--workers", "--batch", "--world", "--repeats", "--steps")
    r = rng.random()
    if r < 0.25 and takes_value:
        argv = [*head, opt]  # the value missing
    elif r < 0.45:
        argv = [*head, _pick(rng, ["--no-such-option", "-Z", "--json=maybe", "---", "--é"])]
    elif r < 0.6 and head[0] != "testbed":
        argv = [*head, "{D}/s.yaml", "extra-2", "extra-3", "extra-4"]
    elif r < 0.75 and typed:
        words = ["x", "1.5", "", "-1e400", "nan"]  # the testbed never gets a number: it would run for real
        argv = [*head, opt, _pick(rng, words if head[0] == "testbed" else [*words, "9" * 400, "0", "-5"])]
    elif r < 0.9:
        argv = [_pick(rng, ["simulat", "no-such-verb", "", "--bogus", "-x", "topo", "trace", "testbed"]),
                _pick(rng, ["bogus", "--bogus"])]
    elif head[0] in ("simulate", "report", "scale"):
        argv = [*head, "--set", "a", "b"]
    else:
        argv = [*head, "--no-such-option", "x"]
    return _case("usage", argv, files, why=["a usage error"])


def simulate_trace_case(rng: np.random.Generator) -> dict[str, Any]:
    """``simulate`` on a recorded step: the example scenario whose ``workload:`` names the Chakra files of a
    2-rank recording (mutated), or one of the files itself, some of them damaged."""
    why: list[str] = []
    files = {p.name: p.read_bytes() for p in sorted((EXAMPLES / "chakra").glob("gpt-w2.*.et"))}
    if rng.random() < 0.3:
        name = _pick(rng, sorted(files))
        r = rng.random()
        if r < 0.4:
            files[name] = files[name][:int(rng.integers(1, len(files[name])))]
            why.append("a truncated Chakra file")
        elif r < 0.6:
            files[name] = b""
            why.append("an empty Chakra file")
        elif r < 0.8:
            files[name] = bytes(rng.integers(0, 256, 200, dtype=np.uint8))
            why.append("a Chakra file of random bytes")
        else:
            del files[name]
            why.append("a rank's file missing")
    if rng.random() < 0.25:
        return _case("simulate (trace)", ["simulate", "{D}/gpt-w2.0.et", "--json"], files, [], why)
    doc = yaml.safe_load((EXAMPLES / "traces" / "gpt-w2-on-h100.yaml").read_text())
    doc["workload"]["trace"] = "gpt-w2"
    if rng.random() < 0.7:
        doc["workload"] = mutate(doc["workload"], rng, 2, VALUES)
        if _has_bad_number(doc["workload"]):
            why.append("a non-finite or huge number")
    else:
        doc = mutate(doc, rng, 2, VALUES)
    files["s.yaml"] = yaml.safe_dump(doc, allow_unicode=True).encode()
    return _case("simulate (trace)", ["simulate", "{D}/s.yaml", "--json"], files, [], why)
