"""A search on a real Dask cluster (a scheduler and two workers on 127.0.0.1), killed halfway and resumed:
nothing is lost, nothing is evaluated twice, and the results equal those of evaluating in this process."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("dask.distributed")

from topotrain.search.cost import price_catalog  # noqa: E402
from topotrain.search.evaluate import Task, evaluate  # noqa: E402

POINTS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dask(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "dask", *args]


def _space() -> dict[str, Any]:
    # 40 points of 64 GPUs, a few hundredths of a second each with the analytical model
    return {"cluster": {"server": "eflops", "servers": 8,
                        "network": {"topology": "bigraph", "switches": 8, "radix": 64, "link": "eth-100g"}},
            "model": "resnet50", "batch": {"global": 4096, "micro": 64},
            "plan": {"dp_algorithm": "ring", "bucket": {"from": 1, "to": POINTS, "step": 1, "unit": "MiB"}},
            "search": {"screen_network": "analytical", "confirm_top": 0}}


def _rows(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return int(con.execute("SELECT COUNT(*) FROM results").fetchone()[0])
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0


def _search_cmd(space: Path, out: Path, address: str, *extra: str) -> list[str]:
    return [sys.executable, "-c", "from topotrain.cli import main; main()", "search", str(space), "--out", str(out),
            "--dask-scheduler", address, *extra]


def test_dask_search_killed_halfway_resumes_without_loss_or_repeat(tmp_path: Path) -> None:
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(_dask("scheduler", "--host", "127.0.0.1", "--port", str(port),
                                            "--no-dashboard"), cwd=tmp_path, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(2):
            procs.append(subprocess.Popen(_dask("worker", address, "--host", "127.0.0.1", "--nthreads", "1",
                                                "--no-nanny", "--no-dashboard"), cwd=tmp_path, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from dask.distributed import Client

        deadline = time.monotonic() + 30
        client = None
        while time.monotonic() < deadline:
            try:
                client = Client(address, timeout="2s")
                client.wait_for_workers(2, timeout=20)
                break
            except (OSError, TimeoutError):
                time.sleep(0.2)
        assert client is not None, "the local Dask cluster did not start"
        client.close()

        space = tmp_path / "space.yaml"
        space.write_text(yaml.safe_dump(_space()))
        out = tmp_path / "out"
        db = out / "results.sqlite"
        first = subprocess.Popen(_search_cmd(space, out, address), cwd=tmp_path, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _rows(db) < 3 and first.poll() is None:
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait()
        before = _rows(db)
        assert 0 < before < POINTS, f"the search was not stopped halfway ({before} of {POINTS} points stored)"

        r = subprocess.run(_search_cmd(space, out, address, "--resume", "--json"), cwd=tmp_path,
                           capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
        doc = json.loads(r.stdout)
        assert doc["reused"] == before and doc["evaluated"] == POINTS - before  # nothing repeated
        con = sqlite3.connect(db)
        keys = [k for (k,) in con.execute("SELECT key FROM results")]
        stored = {k: (s, json.loads(m)) for k, s, m in con.execute("SELECT key, status, metrics FROM results")}
        points = {k: json.loads(p) for k, p in con.execute("SELECT key, point FROM results")}
        con.close()
        assert len(keys) == len(set(keys)) == POINTS  # nothing lost, nothing twice
        assert all(s == "ok" for s, _ in stored.values())
        # the workers' results equal this process's, bit for bit
        prices = price_catalog()
        for k in sorted(points)[:2]:
            rec = evaluate(Task(k, 0, "screen", points[k], "analytical", prices))
            assert json.loads(json.dumps(rec["metrics"])) == stored[k][1]
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_a_local_dask_cluster_leaves_nothing_in_the_temporary_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    import dask

    from topotrain.search.executors import DaskExecutor

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        ex = DaskExecutor(local_workers=1)
        try:
            assert ex.workers == 1
        finally:
            ex.close()
    assert os.listdir(tmp_path) == []
