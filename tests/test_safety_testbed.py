"""The testbed owns only its own runs (issue 19, part 2): ``clean`` leaves live runs alone, a held tag is
refused with the way out, Ctrl-C during setup leaks nothing, SIGKILL leaves orphans that ``clean`` removes
with their temporary directories, and an ignored SIGINT stays ignored.

Every run here has its own tag (:func:`fresh_tag`) and its lock files live in a private directory
(``TOPOTRAIN_TESTBED_RUN_DIR``); the test that calls ``clean()`` on every run does so in a private network
and mount namespace, so other testbed runs on this machine are never touched."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topotrain.testbed.netns import Emulation, clean, leftovers, netns_available
from topotrain.testbed.runs import RUN_DIR_ENV, fresh_tag
from topotrain.util.errors import ConfigError

needs_netns = pytest.mark.skipif(not netns_available()[0], reason="needs root and ip netns")
_UNSHARE = shutil.which("unshare")


@pytest.fixture(autouse=True)
def _private_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "runs"))


def _holder(tag: str, hosts: int = 2, then: str = "time.sleep(60)") -> str:
    return ("import sys, time\nfrom topotrain.testbed.compare import single_switch\n"
            "from topotrain.testbed.netns import Emulation\n"
            f"topo = single_switch({hosts})\nprint('go', flush=True)\n"
            f"with Emulation(topo, tag={tag!r}) as emu:\n"
            "    with emu.tempdir() as d:\n"
            "        print('up', d, flush=True)\n"
            f"        {then}\n")


def _start(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_netns
def test_a_held_tag_is_refused_and_clean_leaves_the_live_run_alone() -> None:
    tag = fresh_tag()
    p = _start(_holder(tag))
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "go"
        line = p.stdout.readline().split()
        assert line[0] == "up", p.stderr.read() if p.stderr else ""
        tmp = line[1]
        mine = set(leftovers(tag))
        assert mine
        with pytest.raises(ConfigError, match=r"held by another testbed run \(pid \d+\).*clean --force"):
            Emulation(__import__("topotrain.testbed.compare", fromlist=["x"]).single_switch(2), tag=tag).__enter__()
        assert set(leftovers(tag)) == mine  # the refused run touched nothing
        assert clean(tag) == [] and set(leftovers(tag)) == mine and os.path.isdir(tmp)
        p.kill()  # SIGKILL: no teardown runs; the lock is dropped by the kernel
        p.wait(timeout=20)
        assert set(leftovers(tag)) == mine  # orphans
        removed = clean(tag)
        assert mine <= set(removed) | {n for n in mine if n.endswith("b")} and tmp in removed
        assert not leftovers(tag) and not os.path.exists(tmp)
    finally:
        if p.poll() is None:
            p.kill()
        clean(tag, force=True)


@needs_netns
def test_sigint_during_setup_leaks_nothing() -> None:
    """Ctrl-C at several moments of a 12-namespace setup: every time, nothing of the run is left."""
    for delay_s in (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45):
        tag = fresh_tag()
        p = _start(_holder(tag, hosts=11, then="pass"))
        assert p.stdout is not None and p.stdout.readline().strip() == "go"
        time.sleep(delay_s)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        assert leftovers(tag) == [], (delay_s, leftovers(tag))
        clean(tag, force=True)


@needs_netns
def test_an_ignored_sigint_stays_ignored() -> None:
    tag = fresh_tag()
    code = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" +
            _holder(tag, then="sys.stdin.readline(); print('done', flush=True)"))
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "go" and p.stdout.readline().startswith("up")
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert p.poll() is None and leftovers(tag)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
        clean(tag, force=True)
    assert leftovers(tag) == []


#: In a sandbox: two runs and a `clean` of every run at once; both runs must finish and measure.
_TWO_RUNS_AND_CLEAN = """
import json, subprocess, sys
from topotrain.testbed.netns import clean, leftovers
from topotrain.testbed.runs import fresh_tag
code = '''
import sys
from topotrain.testbed.compare import single_switch
from topotrain.testbed.netns import Emulation
with Emulation(single_switch(2), tag=sys.argv[1]) as emu:
    print("up", flush=True)
    sys.stdin.readline()
    rate = emu.measure_rate(0, 1, 200_000)
    print("rate", rate, flush=True)
'''
tags = [fresh_tag(), fresh_tag()]
runs = [subprocess.Popen([sys.executable, "-c", code, t], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for t in tags]
ups = [r.stdout.readline().strip() for r in runs]
before = {t: sorted(leftovers(t)) for t in tags}
removed = clean()
after = {t: sorted(leftovers(t)) for t in tags}
outs = []
for r in runs:
    r.stdin.write("\\n"); r.stdin.flush()
    outs.append(r.stdout.read()); r.wait(timeout=60)
print(json.dumps({"ups": ups, "before": before, "after": after, "removed": removed,
                  "codes": [r.returncode for r in runs], "outs": outs, "end": leftovers()}))
"""


@needs_netns
@pytest.mark.skipif(_UNSHARE is None, reason="needs unshare(1)")
def test_two_runs_and_a_clean_at_once_both_finish(tmp_path: Path) -> None:
    assert _UNSHARE is not None
    setup = "mkdir -p /run/netns && mount -t tmpfs tt-sandbox /run/netns && ip link set lo up && exec \"$@\""
    res = subprocess.run([_UNSHARE, "--mount", "--net", "--propagation", "private", "sh", "-ec", setup, "sh",
                          sys.executable, "-c", _TWO_RUNS_AND_CLEAN], capture_output=True, text=True, timeout=120,
                         env={**os.environ, RUN_DIR_ENV: str(tmp_path / "sandbox-runs")})
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["ups"] == ["up", "up"]
    assert got["removed"] == [] and got["after"] == got["before"] and all(got["before"].values())
    assert got["codes"] == [0, 0], got
    assert all("rate" in o and float(o.split()[-1]) > 0 for o in got["outs"]), got["outs"]
    assert got["end"] == []
