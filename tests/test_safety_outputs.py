"""Outputs never damage what topotrain does not own (issue 19, part 1): devices, FIFOs, directories and the
run's own inputs are refused before any work, symlinks are written through, files get the usual mode,
temporary files are hidden and removed on SIGTERM, and a closed stdout ends the run quietly."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.util.atomic import atomic_write, atomic_write_text, check_output_path, protect_inputs
from topotrain.util.errors import ConfigError

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = """
cluster:
  server: single-gpu
  servers: 2
  network: {topology: single-switch, link: eth-100g}
model: resnet50
batch: 64
network: analytical
"""


def _scenario(tmp_path: Path) -> Path:
    p = tmp_path / "scenario.yaml"
    p.write_text(SMALL)
    return p


def _errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize("target", ["", ".", "DIR", "FILE/x.json", "FIFO", "SOCKET", "SCENARIO"])
def test_refused_trace_targets_are_one_error_exit_2_and_untouched(tmp_path: Path, target: str) -> None:
    sc = _scenario(tmp_path)
    before = sc.read_bytes()
    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("x")
    os.mkfifo(tmp_path / "FIFO")
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "SOCKET"))
    try:
        path = {"SCENARIO": str(sc)}.get(target, str(tmp_path / target) if target not in ("", ".") else target)
        res = runner.invoke(app, ["simulate", str(sc), "--trace", path])
    finally:
        sock.close()
    assert res.exit_code == 2, res.output
    errs = _errors(res.output)
    assert len(errs) == 1 and "--trace" in errs[0], res.output
    assert sc.read_bytes() == before
    assert stat.S_ISFIFO(os.stat(tmp_path / "FIFO").st_mode)
    assert stat.S_ISSOCK(os.stat(tmp_path / "SOCKET").st_mode)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_png_onto_its_own_input_is_refused(tmp_path: Path) -> None:
    g = tmp_path / "g.png"  # an input that happens to have a picture's name (via a symlink to the scenario)
    sc = _scenario(tmp_path)
    g.symlink_to(sc)
    res = runner.invoke(app, ["topo", "show", str(g), "--png", str(sc)])
    assert res.exit_code == 2 and "input of this run" in res.output, res.output
    assert sc.read_text() == SMALL


def test_device_node_is_never_replaced(tmp_path: Path) -> None:
    dev = Path("/dev/null")
    before = os.stat(dev)
    with pytest.raises(ConfigError, match="device"):
        atomic_write_text(dev, "x")
    after = os.stat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_inputs_are_protected_through_hard_links_and_only_inside_the_block(tmp_path: Path) -> None:
    src = tmp_path / "in.yaml"
    src.write_text("a: 1\n")
    hard = tmp_path / "hard.yaml"
    os.link(src, hard)
    with protect_inputs([src]), pytest.raises(ConfigError, match="input of this run"):
        atomic_write_text(hard, "b: 2\n")
    atomic_write_text(hard, "b: 2\n")  # outside the run it is an ordinary file (replaced: the link is broken)
    assert hard.read_text() == "b: 2\n" and src.read_text() == "a: 1\n"


def test_symlink_is_written_through_and_kept(tmp_path: Path) -> None:
    real = tmp_path / "sub" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"
    assert not [p for p in real.parent.iterdir() if p.name != "real.json"]


def test_mode_is_what_open_gives(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "out.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644


def test_path_under_a_file_and_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        check_output_path(tmp_path / "f" / "g" / "out.json", make_parents=True)
    with pytest.raises(ConfigError, match="does not exist"):
        atomic_write_text(tmp_path / "nope" / "out.json", "x")
    assert atomic_write_text(tmp_path / "new" / "out.json", "x", make_parents=True).read_text() == "x"


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "out.json"
    p.write_text("old")

    def boom(fh: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(p, boom)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


_SLOW_WRITER = """
import sys, time
from topotrain.util.atomic import atomic_write
def slow(fh):
    fh.write(b"partial")
    fh.flush()
    print("writing", flush=True)
    time.sleep(30)
atomic_write(sys.argv[1], slow)
"""


def test_sigterm_during_a_write_removes_the_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    p = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "writing"
    tmps = [q.name for q in tmp_path.iterdir()]
    assert len(tmps) == 1 and tmps[0].startswith(".out.json.tmp-")  # hidden, never taken for output
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_closed_stdout_exits_quietly(tmp_path: Path) -> None:
    """``topotrain collective --json --sweep-sizes ... | head -c1``: no traceback, no BrokenPipeError."""
    exe = Path(sys.executable).with_name("topotrain")
    cmd = [str(exe), "collective", "--network", "analytical", "--sweep-sizes", "1KiB:1GiB", "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # closed before the command writes (it takes a while to start): its first write fails
    t0 = time.monotonic()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert time.monotonic() - t0 < 60
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
