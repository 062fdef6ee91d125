"""The fuzz of every verb (benchmarks/fuzz.py) in small: a seeded sample of its cases, run the way the benchmark
runs them (in-process in a forked batch child, its folder snapshotted around each case), must give no internal
error, traceback, hang, memory blow-up, bad input accepted or file changed outside the case's own outputs; and
each class of failure the fuzz found, fixed, with the input that showed it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fuzz  # noqa: E402 - the benchmark beside the tests
import fuzz_verbs  # noqa: E402

runner = CliRunner()
TRACES = sorted(str(p) for p in (ROOT / "tests" / "data" / "traces" / "resnet-w2").glob("*.gz"))
SCENARIO = {"cluster": {"server": "eflops", "servers": 2,
                        "network": {"topology": "bigraph", "switches": 4, "radix": 16, "link": "eth-100g"}},
            "model": "resnet50", "batch": 256}


def one_error(r: Any, field: str) -> None:
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], r.output


def _cases(seed: int) -> list[dict[str, Any]]:
    """Cases of the cheap families (each a few milliseconds): 4 of each, seeded."""
    scenarios = fuzz._scenarios()
    out = []
    for k, family in enumerate(["usage", "list", "trace", "profile", "run-long", "failure-predict", "scenario"]):
        for j in range(4):
            rng = np.random.default_rng([seed, k, j])
            case = fuzz.scenario_case(rng, scenarios) if family == "scenario" else fuzz.MAKERS[family](rng)
            case.update(i=100 * k + j, stdout_full=False, fsize=0)
            if family == "scenario" and "llama3" in case["argv"][1]:
                continue  # the 16,384-GPU example takes seconds when valid
            out.append(case)
    return out


def test_a_sample_of_the_fuzz_finds_nothing(tmp_path: Path) -> None:
    results = fuzz.run_batch(_cases(5), 60, 3 << 30, tmp_path)
    assert len(results) == len(_cases(5))
    bad = [(r["verb"], r["kinds"], r["argv"], r["stderr"][-300:], r.get("damage")) for r in results
           if not set(r["kinds"]) <= {"ok", "refused"}]
    assert not bad, bad
    assert {r["verb"] for r in results} >= {"usage", "list", "trace import", "profile", "run-long"}


def test_the_fuzz_counts_what_it_must(tmp_path: Path) -> None:
    """The classifier is not blind: an accepted bad input, a changed file outside the outputs, a traceback, a
    hang and stray stderr are each counted."""
    case = {"i": 1, "verb": "list", "argv": ["list", "models"], "files": {}, "allowed": [],
            "must_refuse": "pretend", "ro": False, "stdout_full": False, "fsize": 0}
    r = fuzz.run_batch([case], 60, 3 << 30, tmp_path)[0]
    assert r["kinds"] == ["accepted_bad"]
    case = {**case, "i": 2, "must_refuse": "", "argv": ["topo", "show", "{D}/s.yaml", "--png", "{D}/t.png"],
            "files": {"s.yaml": yaml.safe_dump(SCENARIO).encode()}}
    r = fuzz.run_batch([case], 60, 3 << 30, tmp_path)[0]
    assert "damaged_file" in r["kinds"] and r["damage"] == ["t.png"]
    assert fuzz.classify({"hang": True, "stderr": "", "stdout": "", "code": None}) == ["hang"]
    assert "traceback" in fuzz.classify({"hang": False, "stderr": "Traceback (most", "stdout": "", "code": 2})
    assert "stray_stderr" in fuzz.classify({"hang": False, "stderr": "UserWarning: x", "stdout": "", "code": 0})


def test_the_fuzz_cases_are_seeded() -> None:
    scenarios = fuzz._scenarios()
    a = [fuzz.make_case(i, 3, scenarios) for i in range(20)]
    b = [fuzz.make_case(i, 3, scenarios) for i in range(20)]
    assert a == b
    assert a != [fuzz.make_case(i, 4, scenarios) for i in range(20)]


# ---- classes the fuzz found -----------------------------------------------------------------------------------
def test_scale_checks_the_scenario_before_reading_its_fields(tmp_path: Path) -> None:
    """``cluster: .nan`` was "internal error TypeError: argument of type 'float' is not iterable"."""
    p = tmp_path / "a.yaml"
    for cluster in (float("nan"), "text", [1, 2]):
        p.write_text(yaml.safe_dump({**SCENARIO, "cluster": cluster}))
        one_error(runner.invoke(app, ["scale", str(p), "--gpus", "8:16", "--json"]), "cluster")
    p.write_text(yaml.safe_dump({**SCENARIO, "plan": "x"}))
    one_error(runner.invoke(app, ["scale", str(p), "--gpus", "8:16", "--json"]), "plan")


def test_failure_predict_writes_no_telemetry_when_it_refuses(tmp_path: Path) -> None:
    """--write-telemetry was written before the options and the record were judged."""
    t = tmp_path / "t.csv"
    one_error(runner.invoke(app, ["failure-predict", "--synthetic", "16,8", "--test-fraction", "1",
                                  "--write-telemetry", str(t)]), "--test-fraction")
    assert not t.exists()
    r = runner.invoke(app, ["failure-predict", "--synthetic", "4,2", "--write-telemetry", str(t)])
    assert r.exit_code == 2 and not t.exists(), r.output


@pytest.mark.parametrize("prefix", ["/dev/null", "DIR", "DIR/", "."])
def test_trace_export_refuses_a_prefix_that_is_not_a_file_name(tmp_path: Path, prefix: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``-o /dev/null`` wrote /dev/null.0.et and /dev/null.1.et into /dev."""
    (tmp_path / "DIR").mkdir()
    monkeypatch.chdir(tmp_path)
    one_error(runner.invoke(app, ["trace", "export", *TRACES, "-o", prefix]), "--out")
    assert sorted(os.listdir(tmp_path)) == ["DIR"] and not os.listdir(tmp_path / "DIR")
    assert not Path("/dev/null.0.et").exists()


def test_trace_replay_refuses_a_world_it_cannot_hold() -> None:
    """``--world 100000000`` ran out of memory ("internal error MemoryError"); now refused by its size."""
    r = runner.invoke(app, ["trace", "replay", *TRACES, "--json", "--world", "100000000"])
    one_error(r, "--world")
    assert "262,144" in r.output
    one_error(runner.invoke(app, ["trace", "replay", *TRACES, "--json", "--world", "-3"]), "--world")


@pytest.mark.parametrize("name", ["", "  "])
def test_trace_replay_refuses_an_empty_network(name: str) -> None:
    """``--network ""`` replayed on the default model (fuzz seed 7, case 2181: accepted bad input)."""
    one_error(runner.invoke(app, ["trace", "replay", *TRACES, "--json", "--network", name]), "--network")


def test_a_search_whose_every_point_is_invalid_for_one_reason_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """A field every point shares (``cluster.servers: .inf``) was accepted: exit 0, every point "invalid"."""
    doc = yaml.safe_load(yaml.safe_dump(fuzz.fuzz_studies.SPACE))
    doc["cluster"]["servers"] = float("inf")
    sp = tmp_path / "space.yaml"
    sp.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    r = runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1"])
    one_error(r, "cluster.servers")
    assert not out.exists() or not [p for p in os.listdir(out) if p != ".topotrain"]


def test_every_output_creates_its_missing_parent_folders(tmp_path: Path) -> None:
    """One rule for every verb's output paths: missing folders are created (``profile -o`` too: it takes
    seconds of torch, so the fuzz covers it, with search/validate --out and failure-predict -o)."""
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(SCENARIO))
    new = tmp_path / "new" / "deep"
    runs = [(["topo", "show", str(sc), "--png", str(new / "t.png")], new / "t.png"),
            (["report", str(sc), "--network", "analytical", "-o", str(new / "r.html")], new / "r.html"),
            (["simulate", str(sc), "--trace", str(new / "t.json")], new / "t.json"),
            (["trace", "import", *TRACES, "-o", str(new / "w.json")], new / "w.json"),
            (["trace", "export", *TRACES, "-o", str(new / "e" / "p")], new / "e" / "p.0.et"),
            (["run-long", str(sc), "--tokens", "1T", "--samples", "5", "-o", str(new / "l.json")], new / "l.json")]
    for argv, made in runs:
        r = runner.invoke(app, argv)
        assert r.exit_code == 0, (argv[0], r.output)
        assert made.is_file(), argv


def test_fuzz_verbs_targets_cover_every_hostile_output() -> None:
    kinds = {t for t, _, _ in fuzz_verbs.FILE_TARGETS}
    assert {"/dev/null", "INPUT", "DIR", "LINK", "RO/o.EXT", "NEW/deep/er/o.EXT", "FILE/x.EXT"} <= kinds


def test_a_failed_write_removes_the_folders_it_created(tmp_path: Path) -> None:
    """``report -o new/deep/r.html`` on a full disk left new/deep behind: a failure writes nothing."""
    from topotrain.util.atomic import atomic_write
    from topotrain.util.errors import ConfigError

    def full(fh: Any) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(ConfigError, match="No space left"):
        atomic_write(tmp_path / "new" / "deep" / "r.html", full, make_parents=True)
    assert os.listdir(tmp_path) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(ConfigError):
        atomic_write(tmp_path / "kept" / "deep" / "r.html", full, make_parents=True)
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_profile_out_of_memory_is_one_batch_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``profile gpt2 --batch 32`` under a memory limit was "internal error RuntimeError: [enforce fail at
    alloc_cpu.cpp] ... can't allocate memory"."""
    import topotrain.cli.profile as profile_cli

    def oom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(profile_cli, "measure_profile", oom)
    r = runner.invoke(app, ["profile", "gpt2", "--method", "standin", "--batch", "32", "-o", str(tmp_path / "p.json")])
    one_error(r, "--batch")
    assert not (tmp_path / "p.json").exists()

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("some other failure")

    monkeypatch.setattr(profile_cli, "measure_profile", bug)
    r = runner.invoke(app, ["profile", "gpt2", "--method", "standin", "--batch", "32", "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 1 and "internal error" in r.output  # a bug stays a bug


def test_trace_replay_refuses_absurd_cores() -> None:
    one_error(runner.invoke(app, ["trace", "replay", *TRACES, "--json", "--cores", "100000000"]), "--cores")
    one_error(runner.invoke(app, ["trace", "replay", *TRACES, "--json", "--cores", "-2"]), "--cores")


def test_a_zoo_model_override_is_a_bounded_count(tmp_path: Path) -> None:
    """``model: {name: gpt3-2.7b, seq_len: 18446744073709551616}`` overflowed int64 in a collective ("internal
    error OverflowError")."""
    p = tmp_path / "s.yaml"
    for value in (2**64, -5):
        p.write_text(yaml.safe_dump({**SCENARIO, "model": {"name": "gpt3-1.3b", "seq_len": value}}))
        one_error(runner.invoke(app, ["simulate", str(p), "--network", "analytical"]), "model.seq_len")
    p.write_text(yaml.safe_dump({**SCENARIO, "model": {"name": "gpt3-1.3b", "seq_len": 1024}, "batch": 16}))
    assert runner.invoke(app, ["simulate", str(p), "--network", "analytical"]).exit_code == 0


def test_a_trace_of_the_wrong_shape_is_one_error_line(tmp_path: Path) -> None:
    """Fuzz case 8947 of seed 0: a list where the reader expects a process id was "internal error TypeError:
    unhashable type: 'list'"; 8705: a mapping there."""
    for i in (8947, 8705):
        case = fuzz.make_case(i, 0, fuzz._scenarios())
        assert case["verb"] == "trace import"
        folder = tmp_path / str(i)
        folder.mkdir()
        for name, data in case["files"].items():
            (folder / name).write_bytes(data)
        argv = [a.replace("{D}", str(folder)) for a in case["argv"]]
        argv[-1] = str(folder / "w.json")
        one_error(runner.invoke(app, argv), "files")


def test_profile_keeps_torch_cache_out_of_the_temporary_folder() -> None:
    import topotrain.cli.profile as profile_cli

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with profile_cli._private_torch_cache():
        inside = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert inside.is_dir()
    assert not inside.exists() and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before


def test_an_output_in_a_read_only_folder_is_refused_before_the_work(tmp_path: Path) -> None:
    """``profile ... -o RO/o.csv`` measured for seconds, then failed to write; now refused first. Read-only even
    to root: a folder made immutable (``chattr +i``); skipped where that cannot be done."""
    import subprocess

    from topotrain.util.atomic import check_output_path
    from topotrain.util.errors import ConfigError

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    immutable = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(ro)], capture_output=True,
                                                     check=False).returncode == 0
    if os.geteuid() == 0 and not immutable:
        pytest.skip("root, and chattr +i is not available here")
    try:
        for path in (ro / "o.csv", ro / "new" / "o.csv"):
            with pytest.raises(ConfigError, match="read-only"):
                check_output_path(path, field="--out", make_parents=True)
        r = runner.invoke(app, ["trace", "import", *TRACES, "-o", str(ro / "w.json")])
        one_error(r, "--out")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(ro)], check=False)
        ro.chmod(0o755)
