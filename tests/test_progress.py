"""Progress of long runs (issue 41 item 11): one helper (util/progress.py), shown on a terminal's stderr,
silent when piped or used from Python; the long paths report phases and counters."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import simulate
from topotrain.util import progress
from topotrain.validate import published

ROOT = Path(__file__).resolve().parents[1]
#: the cluster's name is this test's own, so that no cluster another test left alive is shared with it (the
#: per-process memo, scenario/memo.py): the phases below include building it
SCENARIO = {"cluster": {"name": "progress-phases", "server": "nvswitch-8", "servers": 2,
                        "network": {"topology": "fat-tree", "link": "ib-hdr-200g"}},
            "model": "gpt3-1.3b", "batch": 32, "plan": {"micro_batch": 2}, "network": "flow"}


def test_simulate_reports_its_phases_on_a_terminal() -> None:
    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=120)
    with progress.display(enabled=True, console=term) as log:
        r = simulate(scenario_from_dict(SCENARIO))
    phases = [what for what, _, _ in log]
    assert any(p.startswith("building the cluster") for p in phases)
    assert any(p.startswith("building the task graph") for p in phases)
    sim = [(done, total) for what, done, total in log if what.startswith("simulating the iteration")]
    assert sim and sim[-1][1] == len(r.tasks)
    assert not progress.active()  # closed with the block
    # the result is the same with and without a display: progress only reads counters
    assert simulate(scenario_from_dict(SCENARIO)).iteration_time_s == r.iteration_time_s


def test_quiet_without_a_terminal_and_from_python() -> None:
    assert not progress.active()
    with progress.task("nobody sees this", total=3) as t:  # no display: a no-op
        t.advance()
    with progress.display(enabled=False) as log:
        with progress.task("x", total=1) as t:
            t.advance()
        assert log == [] and not progress.active()


def test_validate_counts_cases() -> None:
    with progress.display(enabled=False, record=True) as log:
        rows = published.run("analytical", only=lambda c: c.name.startswith("ResNet-50 8x"))
    counted = [(d, t) for what, d, t in log if what.startswith("validating")]
    assert counted[0] == (0, len(rows)) and counted[-1] == (len(rows), len(rows)) and len(rows) >= 2
    names = {what for what, _, _ in log}
    assert all(any(r.case.name in n for n in names) for r in rows)  # each case named while it runs


def test_cli_is_silent_when_piped(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", "import sys; from topotrain.cli import main; "
                          "sys.argv[0] = 'topotrain'; main()", "simulate", "--network", "analytical", "--json"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0 and res.stderr == "" and res.stdout.lstrip().startswith("{")
