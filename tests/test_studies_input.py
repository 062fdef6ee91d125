"""The studies (search, place, validate, explain, profile, topo) against hostile or careless input: one ``error:``
line naming the field, exit 2, nothing written; bounded work; output folders that are not topotrain's."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app, main
from topotrain.placement.jobs import Job, jobs_from_rows
from topotrain.placement.scheduler import run_policy
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.search.executors import (
    InlineExecutor,
    available_cpus,
    check_scheduler_address,
    make_executor,
    worker_count,
)
from topotrain.util.errors import ConfigError
from topotrain.util.outdir import MARKER

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
NET = {"topology": "bigraph", "switches": 4, "radix": 16, "link": "eth-100g"}
CLUSTER = {"server": "eflops", "servers": 4, "network": {"topology": "leaf-spine", "leaves": 2,
                                                        "oversubscription": 8, "link": "eth-100g"}}


def space(**search: Any) -> dict[str, Any]:
    """2 points (ring, hdrm on 2 EFLOPS servers), a few milliseconds each with the analytical model."""
    return {"cluster": {"server": "eflops", "servers": 2, "network": NET}, "model": "resnet50",
            "batch": {"global": 1024, "micro": 64}, "plan": {"dp_algorithm": ["ring", "hdrm"], "bucket": "100MiB"},
            "search": {"screen_network": "analytical", "confirm_top": 0, **search}}


def one_error(r: Any, field: str) -> None:
    """Exit 2 and a single ``error:`` line that names ``field``."""
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], r.output


@pytest.fixture()
def alarm() -> Iterator[None]:
    """Fail (instead of hanging) past 60 s."""
    def boom(*_: Any) -> None:
        raise TimeoutError("took more than 60 s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- 2: place ends, its job fields are bounded --------------------------------------------------------------
def test_place_ends_for_jobs_arriving_very_late(alarm: None) -> None:
    c = cluster_from_dict(CLUSTER)
    jobs = [Job("a", 0.0, "resnet50", 16, 7, 32), Job("b", 1e10, "resnet50", 8, 3, 32),
            Job("c", 1e10 + 0.5, "resnet50", 16, 11, 32), Job("d", 3.3e12, "resnet50", 24, 13, 32)]
    r = run_policy(c, jobs, "first-fit")
    assert [j.finish_s > j.job.arrival_s for j in r.jobs] == [True] * 4
    assert r.jobs[3].finish_s - 3.3e12 == pytest.approx(r.jobs[3].finish_s - r.jobs[3].start_s)


@pytest.mark.parametrize(("row", "field"), [
    ({"arrival": 1e10}, "jobs[0].arrival"), ({"arrival": math.nan}, "jobs[0].arrival"),
    ({"arrival": "soon"}, "jobs[0].arrival"), ({"arrival": -1}, "jobs[0].arrival"),
    ({"gpus": 1.5}, "jobs[0].gpus"), ({"gpus": True}, "jobs[0].gpus"), ({"gpus": "1.5"}, "jobs[0].gpus"),
    ({"iterations": 2.7}, "jobs[0].iterations"), ({"iterations": 10**400}, "jobs[0].iterations"),
    ({"iterations": math.inf}, "jobs[0].iterations"), ({"batch": 0}, "jobs[0].batch"),
])
def test_job_fields_are_whole_finite_and_bounded(row: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        jobs_from_rows([{"gpus": 8, "iterations": 10, **row}])
    assert e.value.field == field


def test_place_reads_non_utf8_and_bad_job_files_as_one_line(tmp_path: Path) -> None:
    cl = tmp_path / "cluster.yaml"
    cl.write_text(yaml.safe_dump({"cluster": CLUSTER}))
    for name, body in (("jobs.csv", b"arrival,model,gpus,iterations\n0,r\xe9snet,8,5\n"),
                       ("jobs.yaml", b"- {arrival: 0, model: \xff, gpus: 8, iterations: 5}\n")):
        (tmp_path / name).write_bytes(body)
        one_error(runner.invoke(app, ["place", str(cl), str(tmp_path / name)]), "not UTF-8")
    (tmp_path / "j.yaml").write_text("- {arrival: 0, model: resnet50, gpus: true, iterations: 5}\n")
    one_error(runner.invoke(app, ["place", str(cl), str(tmp_path / "j.yaml")]), "jobs[0].gpus")


# ---- 3: workers ------------------------------------------------------------------------------------------
def test_workers_are_capped_and_absurd_counts_refused() -> None:
    for bad in (0, -3, 100_000, 10**30):
        with pytest.raises(ConfigError) as e:
            make_executor(bad)
        assert e.value.field == "--workers"
    assert worker_count("--workers", 64, cap=3) == min(3, available_cpus())
    assert worker_count("--workers", 1000) == available_cpus()
    assert isinstance(make_executor(8, points=1), InlineExecutor)  # one point to do: no pool at all
    with pytest.raises(ConfigError) as e:
        make_executor(dask_local=50_000)
    assert e.value.field == "--dask-local"


@pytest.mark.parametrize("address", ["nonsense", "tcp://host:99999", "tcp://:8786", "http://h:1", "tcp://h:x",
                                     "tcp://h:²", "tcp://a b:1", "tcp://h:8786\n"])
def test_malformed_scheduler_addresses_are_refused_before_connecting(address: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_scheduler_address(address)
    assert e.value.field == "--dask-scheduler"
    check_scheduler_address("tcp://127.0.0.1:8786")
    check_scheduler_address("tls://[::1]:8786")


# ---- 5, 6, 7: what a search writes, and where -----------------------------------------------------------------
def _space_file(tmp_path: Path, doc: dict[str, Any], name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def test_a_search_without_feasible_point_names_only_the_files_it_wrote(tmp_path: Path) -> None:
    doc = space()
    doc["plan"]["dp_algorithm"] = ["no-such-algo", "neither"]
    out = tmp_path / "out"
    r = runner.invoke(app, ["search", str(_space_file(tmp_path, doc)), "--out", str(out), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "no feasible point" in r.output
    for f in ("pareto.png", "best.yaml", "runner-up.yaml"):
        assert f not in r.output.split("no feasible point")[1].split("wrote")[1]
        assert not (out / f).exists()
    assert (out / "points.csv").exists()


def test_an_out_folder_topotrain_did_not_write_is_refused_unless_forced(tmp_path: Path) -> None:
    sp = _space_file(tmp_path, space())
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "points.csv").write_text("their data\n")
    r = runner.invoke(app, ["search", str(sp), "--out", str(theirs), "--workers", "1"])
    one_error(r, "--out")
    assert "--force" in r.output and (theirs / "points.csv").read_text() == "their data\n"
    assert sorted(os.listdir(theirs)) == ["points.csv"]
    r = runner.invoke(app, ["search", str(sp), "--out", str(theirs), "--workers", "1", "--force"])
    assert r.exit_code == 0, r.output
    assert (theirs / MARKER).exists()
    # a topotrain folder (the marker) is accepted: resume it without --force
    r = runner.invoke(app, ["search", str(sp), "--out", str(theirs), "--workers", "1", "--resume"])
    assert r.exit_code == 0, r.output
    # validate --out: the same rule, refused before any case runs
    v = tmp_path / "v"
    v.mkdir()
    (v / "validation.csv").write_text("theirs\n")
    r = runner.invoke(app, ["validate", "--quick", "--no-ns3", "--no-simgrid", "--out", str(v)])
    one_error(r, "--out")
    assert (v / "validation.csv").read_text() == "theirs\n"


@pytest.mark.parametrize("kind", ["file", "devnull", "dangling", "input", "readonly"])
def test_bad_out_targets_are_one_error_line(tmp_path: Path, kind: str) -> None:
    sp = _space_file(tmp_path, space())
    out: Path = {"file": tmp_path / "f.txt", "devnull": Path(os.devnull), "dangling": tmp_path / "link",
                 "input": sp, "readonly": tmp_path / "ro"}[kind]
    if kind == "file":
        out.write_text("x")
    elif kind == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    elif kind == "readonly":
        out.mkdir()
        out.chmod(0o500)
        if os.access(out, os.W_OK):
            pytest.skip("running as root: a read-only folder is writable")
    try:
        one_error(runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1"]), "--out")
    finally:
        if kind == "readonly":
            out.chmod(0o700)
    assert sp.read_text() == yaml.safe_dump(space())


def test_a_refused_search_writes_nothing_and_a_rerun_is_not_blocked(tmp_path: Path) -> None:
    big = space(max_grid=1)  # two points, over max_grid: refused once the grid is counted
    out = tmp_path / "new" / "out"
    sp = _space_file(tmp_path, big)
    one_error(runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1"]), "search.optimizer")
    assert not (tmp_path / "new").exists()
    one_error(runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "0"]), "--workers")
    assert not (tmp_path / "new").exists()
    ok = _space_file(tmp_path, space(), "ok.yaml")
    r = runner.invoke(app, ["search", str(ok), "--out", str(out), "--workers", "1"])  # no --resume needed
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("what", ["corrupt", "foreign", "optuna-corrupt"])
def test_resume_on_a_corrupt_or_foreign_store_is_one_error_line(tmp_path: Path, what: str) -> None:
    doc = space(optimizer="tpe", trials=2, batch=2) if what.startswith("optuna") else space()
    sp = _space_file(tmp_path, doc)
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("topotrain search output folder\n")
    if what == "corrupt":
        (out / "results.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(2000))
    elif what == "foreign":
        db = sqlite3.connect(out / "results.sqlite")
        db.execute("CREATE TABLE theirs (x)")
        db.commit()
        db.close()
    else:
        assert runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1"]).exit_code == 0
        (out / "optuna.sqlite").write_bytes(b"not a database" * 100)
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    one_error(runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1", "--resume"]), "--resume")
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before  # left as it was


# ---- 8, 11: numbers and files that are not what they claim -------------------------------------------------------
@pytest.mark.parametrize(("section", "fragment", "field"), [
    ("search", "confirm_top: .nan", "search.confirm_top"),
    ("search", "confirm_top: .inf", "search.confirm_top"),
    ("search", "constraints: {budget_usd: .inf}", "search.constraints.budget_usd"),
    ("search", "constraints: {budget_usd: lots}", "search.constraints.budget_usd"),
    ("search", "train: {tokens: .nan}", "search.train.tokens"),
    ("search", "train: {tokens: many}", "search.train.tokens"),
    ("search", "trials: " + "9" * 5000, "value cannot be read"),
    ("search", "trials: " + "9" * 300, "search.trials"),
    ("search", "optimizer: tpe, seed: 99999999999", "search.seed"),
    ("search", "trials: ten", "search.trials"),
    ("plan", "bucket: {from: .nan, to: 8}", "plan.bucket"),
    ("plan", "bucket: {from: 1, to: " + "9" * 400 + "}", "plan.bucket"),
    ("costs", "gpus: {v100: {price_usd: cheap}}", "costs.gpus.v100.price_usd"),
    ("costs", "gpus: {v100: {price_usd: -5}}", "costs.gpus.v100.price_usd"),
    ("costs", "gpus: {v100: {price_usd: .nan}}", "costs.gpus.v100.price_usd"),
    ("costs", "energy: {usd_per_kwh: free}", "costs.energy.usd_per_kwh"),
])
def test_bad_numbers_in_a_space_are_one_error_line(tmp_path: Path, section: str, fragment: str, field: str) -> None:
    doc = space()
    base = yaml.safe_dump({k: v for k, v in doc.items() if k not in ("plan", "search")})
    plan = f"plan: {{dp_algorithm: ring, {fragment}}}" if section == "plan" else "plan: {dp_algorithm: ring}"
    settings = fragment + ("" if "confirm_top" in fragment else ", confirm_top: 0") if section == "search" \
        else "confirm_top: 0"
    body = f"{base}{plan}\nsearch: {{screen_network: analytical, {settings}}}\n"
    if section == "costs":
        body += f"costs: {{{fragment}}}\n"
    sp = tmp_path / "space.yaml"
    sp.write_text(body)
    out = tmp_path / "out"
    one_error(runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1"]), field)
    assert not out.exists()


@pytest.mark.parametrize("verb", ["search", "explain", "place-cluster", "topo", "simulate"])
def test_input_files_that_are_not_utf8_are_one_error_line(tmp_path: Path, verb: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"cluster: {server: eflops}\nmodel: r\xe9snet50\n")
    good = tmp_path / "jobs.yaml"
    good.write_text("- {arrival: 0, model: resnet50, gpus: 8, iterations: 5}\n")
    args = {"search": ["search", str(bad), "--out", str(tmp_path / "o")],
            "explain": ["explain", str(bad), "--vs", str(bad)],
            "place-cluster": ["place", str(bad), str(good)],
            "topo": ["topo", "show", str(bad)],
            "simulate": ["simulate", str(bad)]}[verb]
    one_error(runner.invoke(app, args), "not UTF-8")


def test_profile_refuses_an_absurd_batch(tmp_path: Path) -> None:
    for batch in ("0", "1000000000"):
        one_error(runner.invoke(app, ["profile", "resnet50", "--batch", batch, "--out",
                                      str(tmp_path / "p.json")]), "--batch")


# ---- 12: usage errors, stdout on a full device, missing parent folders -----------------------------------------
def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["topotrain", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("argv", [("explain", "best.yaml"), ("search", "--workers"), ("search", "x", "--bogus"),
                                  ("place", "a"), ("no-such-verb",)])
def test_usage_errors_are_one_error_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         argv: tuple[str, ...]) -> None:
    code, err = _main(monkeypatch, capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Usage:" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_on_a_full_device_is_said_and_exits_non_zero() -> None:
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", "from topotrain.cli import main; main()", "schema"],
                           env={**os.environ, "PYTHONPATH": SRC}, stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "No space left" in lines[0]
    assert "please report" not in p.stderr


def test_outputs_create_missing_parent_folders(tmp_path: Path) -> None:
    png = tmp_path / "new" / "dir" / "t.png"
    example = ROOT / "examples" / "eflops-bigraph.yaml"
    r = runner.invoke(app, ["topo", "show", str(example), "--png", str(png), "--json"])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_store_locked_by_another_process_is_one_error_line_after_a_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from topotrain.search import store

    sp = _space_file(tmp_path, space())
    out = tmp_path / "out"
    assert runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1"]).exit_code == 0
    holder = sqlite3.connect(out / "results.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO meta VALUES ('held', 'by another process')")
    monkeypatch.setattr(store, "LOCK_TIMEOUT_S", 0.2)
    try:
        r = runner.invoke(app, ["search", str(sp), "--out", str(out), "--workers", "1", "--resume"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    one_error(r, "locked")


def test_validate_png_without_references_warns_nothing(tmp_path: Path) -> None:
    import warnings

    from topotrain.validate.matrix import MatrixRun, write_png

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matplotlib warning on stderr on success fails here
        write_png(MatrixRun(rows=[], skipped=[]), tmp_path / "v.png")
    assert (tmp_path / "v.png").read_bytes()[:4] == b"\x89PNG"


def test_validate_quick_honours_its_filters_or_refuses_them() -> None:
    from topotrain.validate.matrix import build_cases

    cases, _ = build_cases(["dumbbell"], None, None, quick=True)
    assert {c.topology for c in cases} == {"dumbbell"} and len(cases) == 2
    with pytest.raises(ConfigError) as e:
        build_cases(["single-switch"], ["incast"], None, quick=True)
    assert e.value.field == "--quick"
    with pytest.raises(ConfigError) as e:
        build_cases(["no-such-topology"], None, None, quick=True)
    assert e.value.field == "--topologies"
    r = runner.invoke(app, ["validate", "--published", "--topologies", "dumbbell", "--out", "x-never-made"])
    one_error(r, "--published")
    assert not Path("x-never-made").exists()
