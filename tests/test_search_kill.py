"""Searches killed with SIGKILL: a resumed tpe / nsga2 search ends bit for bit where an uninterrupted one ends,
and no pool worker outlives the search.

Each killed run is a subprocess of the real command line whose optuna ``ask``/``tell`` or result store ``add``
kills its own process (SIGKILL, nothing cleaned up) at the N-th call, or that is killed after a random delay.
Small spaces, the analytical network model, a few seconds per process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app

runner = CliRunner()
SRC = str(Path(__file__).resolve().parents[1] / "src")

NET = {"topology": "bigraph", "switches": 4, "radix": 16, "link": "eth-100g"}

HARNESS = r'''
import os, signal, sys, threading
hook, n = sys.argv[1].split(":")
n = float(n)
calls = {"ask": 0, "tell": 0, "add": 0}

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def wrap(owner, name, key):
    orig = getattr(owner, name)
    def f(*a, **kw):
        out = orig(*a, **kw)
        calls[key] += 1
        if hook == key and calls[key] == n:
            die()
        return out
    setattr(owner, name, f)

import optuna
from topotrain.search import store
wrap(optuna.study.Study, "ask", "ask")
wrap(optuna.study.Study, "tell", "tell")
wrap(store.ResultStore, "add", "add")
if hook == "time":
    threading.Timer(n, die).start()
if hook == "slow":  # pool workers that take their time: the test kills this process meanwhile
    import time
    from topotrain.search import executors
    executors.available_cpus = lambda: 2
    real = executors.evaluate
    def slow(t):
        time.sleep(60)
        return real(t)
    executors.evaluate = slow
from topotrain.cli import main
sys.argv = ["topotrain", *sys.argv[2:]]
main()
'''


def _space(optimizer: str) -> dict[str, Any]:
    trials, batch = (7, 3) if optimizer == "tpe" else (6, 2)
    return {
        "cluster": [{"server": "eflops", "servers": 2, "network": NET},
                    {"server": "pcie-shared-nic", "servers": 2, "network": NET}],
        "model": "resnet50",
        "batch": {"global": 1024, "micro": 64},
        "plan": {"dp_algorithm": ["ring", "hdrm"], "bucket": {"from": 8, "to": 96, "step": 8, "unit": "MiB"}},
        "search": {"optimizer": optimizer, "trials": trials, "batch": batch, "seed": 3,
                   "screen_network": "analytical", "confirm_network": "analytical", "confirm_top": 2},
    }


def _run(harness: Path, hook: str, args: list[str], timeout: float = 120) -> int:
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.run([sys.executable, str(harness), hook, *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode in (0, -signal.SIGKILL), p.stderr[-2000:]
    return p.returncode


def _outcome(out: Path) -> dict[str, Any]:
    """Everything a search leaves that must not depend on kills: every stored row, the files, and the
    sequence of optuna trials that count (abandoned asks told FAIL are not part of the sequence)."""
    db = sqlite3.connect(out / "results.sqlite")
    rows = db.execute("SELECT * FROM results ORDER BY seq, stage").fetchall()
    db.close()
    import optuna

    study = optuna.load_study(study_name="search", storage=f"sqlite:///{out / 'optuna.sqlite'}")
    rounds = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in study.user_attrs.items()
                    if k.startswith("topotrain_round_"))
    by_number = {t.number: t for t in study.trials}
    trials = [(by_number[num].params, by_number[num].state.name, by_number[num].values)
              for _, nums in rounds for num in nums]
    files = {f: (out / f).read_bytes() for f in ("points.csv", "pareto.csv", "best.yaml", "runner-up.yaml")}
    return {"rows": rows, "trials": trials, "files": files}


@pytest.mark.parametrize(("optimizer", "seed"), [("tpe", 1), ("nsga2", 2)])
def test_a_search_killed_anywhere_resumes_to_the_uninterrupted_result(tmp_path: Path, optimizer: str,
                                                                      seed: int) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(_space(optimizer)))
    full = tmp_path / "full"
    r = runner.invoke(app, ["search", str(space), "--out", str(full), "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    out = tmp_path / "killed"
    rng = random.Random(seed)
    # right after the first ask (the case that diverged), then random points of every kind
    hooks = ["ask:1", f"add:{rng.randint(1, 3)}", f"tell:{rng.randint(1, 4)}", f"ask:{rng.randint(2, 3)}",
             f"time:{rng.uniform(2.0, 4.0):.2f}"]
    kills = 0
    for i, hook in enumerate(hooks):
        args = ["search", str(space), "--out", str(out), "--workers", "1", "--json"] + (["--resume"] if i else [])
        kills += _run(harness, hook, args) == -signal.SIGKILL
    assert kills >= 2  # the first kill always happens (ask 1); most others do
    r = runner.invoke(app, ["search", str(space), "--out", str(out), "--workers", "1", "--resume", "--json"])
    assert r.exit_code == 0, r.output
    assert _outcome(out) == _outcome(full)
    again = json.loads(r.output)
    assert again["evaluated"] + again["reused"] >= 1


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(x) for x in text.split()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_no_pool_worker_survives_a_kill_of_the_search(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    doc = _space("tpe")
    doc["search"] = {"screen_network": "analytical", "confirm_top": 0}
    space.write_text(yaml.safe_dump(doc))
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.Popen([sys.executable, str(harness), "slow:0", "search", str(space), "--out",
                          str(tmp_path / "out"), "--workers", "2"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and p.poll() is None:
            workers = _children(p.pid)
            time.sleep(0.1)
        assert len(workers) >= 2, "the pool did not start"
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [w for w in workers if _alive(w)]
        for w in survivors:  # leave nothing behind, even when the test fails
            os.kill(w, signal.SIGKILL)
        assert not survivors
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
