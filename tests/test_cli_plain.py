"""A plain ``topotrain collective`` command line runs without typer (cli/collective_args.py, collective_run.py) and
exactly as typer runs it: the same options and defaults, the same arguments for every command line it takes, the
same output, errors and exit code; and a 16-GPU collective imports neither typer, click, rich nor pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

import topotrain.cli
from topotrain.cli import collective_args, main
from topotrain.cli.plain import ROOT_HELP

ROOT = Path(__file__).resolve().parent.parent
C16 = """cluster:
  name: nvswitch-2x8
  server: nvswitch-8
  servers: 2
  network: {topology: single_switch, link: ib-hdr-200g, latency: 1us}
"""


def test_the_plain_reader_knows_the_typer_command_s_options_and_defaults() -> None:
    command = typer.main.get_command(topotrain.cli.app).commands["collective"]
    options = {}
    flags = {}
    arguments = []
    for p in command.params:
        if p.param_type_name == "argument":
            arguments.append((p.name, p.default, p.nargs, p.required))
        elif getattr(p, "is_flag", False):
            assert p.secondary_opts == [] and p.default is False
            flags.update({o: p.name for o in p.opts})
        else:
            assert p.nargs == 1 and not p.multiple and p.envvar is None and not p.is_eager
            options.update({o: (p.name, p.default) for o in p.opts})
    assert options == collective_args.OPTIONS
    assert flags == collective_args.FLAGS
    assert arguments == [("cluster", None, 1, False)]
    assert ROOT_HELP.strip() == (topotrain.cli.__doc__ or "").strip()


#: Command lines the plain reader takes (each after ``collective``).
TAKEN = [[], ["c.yaml"], ["c.yaml", "--json"], ["--json", "c.yaml", "--size", "1MiB"], ["--op=allgather", "c.yaml"],
         ["--op", "broadcast", "--algo", "tree", "--size=4M", "--network", "analytical", "--library", "ideal",
          "--sweep-sizes", "1MiB:4MiB", "--json"], ["a=b.yaml"], ["--size", "1e3"], ["--op", "x=y"]]
#: Command lines it leaves to typer.
LEFT = [["--help"], ["c.yaml", "-h"], ["--op"], ["--op", "-1"], ["--size", ""], ["--size="], ["--json", "--json"],
        ["--op", "a", "--op", "b"], ["a.yaml", "b.yaml"], ["--", "c.yaml"], ["-"], ["--json=1"], ["--nope"],
        ["--version"], ["c\nd.yaml"], ["--op", "all\treduce"]]


@pytest.mark.parametrize("argv", TAKEN)
def test_a_plain_command_line_gives_the_arguments_typer_gives(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import topotrain.cli.collective as verb

    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(verb, "run_collective", lambda *a: seen.append(a))
    code = topotrain.cli.app(["collective", *argv], standalone_mode=False)
    assert code in (None, 0) and len(seen) == 1
    got = collective_args.simple_call(["collective", *argv])
    assert got is not None
    names = ["cluster", "op", "algo", "size", "network", "sweep_sizes", "library", "as_json"]
    assert tuple(got[n] for n in names) == seen[0]
    assert [type(got[n]) for n in names] == [type(v) for v in seen[0]]


@pytest.mark.parametrize("argv", LEFT)
def test_other_command_lines_are_left_to_typer(argv: list[str]) -> None:
    assert collective_args.simple_call(["collective", *argv]) is None
    assert collective_args.simple_call(["topo", "show"]) is None and collective_args.simple_call([]) is None


def run_main(argv: list[str], plain: bool, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``topotrain ARGV`` through :func:`topotrain.cli.main`, plain where it may be (or through typer)."""
    with monkeypatch.context() as m:
        m.setattr(sys, "argv", ["topotrain", *argv])
        if not plain:
            m.setattr(topotrain.cli, "simple_call", lambda _argv: None)
        with pytest.raises(SystemExit) as e:
            main()
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def test_plain_and_typer_print_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    c16 = tmp_path / "c16.yaml"
    c16.write_text(C16)
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  server: nvswitch-8\n  severs: 2\n  network: {topology: fat_tre, latency: 1}\n")
    lines = [[str(c16), "--json"], [str(c16), "--size", "1MiB", "--op", "allgather"],
             [str(c16), "--op", "alltoall", "--sweep-sizes", "1MiB:2MiB", "--network", "analytical", "--json"],
             [str(c16), "--op", "bogus"], [str(c16), "--size", "12x"], [str(bad)], [str(tmp_path / "none.yaml")],
             [str(c16), "--library", "gloo"], [str(tmp_path)]]
    for argv in lines:
        assert collective_args.simple_call(["collective", *argv]) is not None
        plain = run_main(["collective", *argv], True, monkeypatch, capsys)
        typed = run_main(["collective", *argv], False, monkeypatch, capsys)
        assert plain == typed, argv
        assert plain[0] == (0 if plain[1] else 2), plain
    assert bad.read_text().startswith("cluster:")  # inputs untouched


def test_a_16_gpu_collective_imports_no_typer_click_rich_or_pydantic(tmp_path: Path) -> None:
    c16 = tmp_path / "c16.yaml"
    c16.write_text(C16)
    code = ("import sys, atexit\n"
            "atexit.register(lambda: print('loaded:', *sorted(m for m in ('typer', 'click', 'rich', 'pydantic', "
            "'pydantic_core', 'numba', 'scipy', 'networkx') if m in sys.modules)))\n"
            "from topotrain.cli import main\nsys.argv = ['topotrain', *sys.argv[1:]]\nmain()")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", code, "collective", str(c16), "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert '"ranks": 16' in res.stdout
    assert res.stdout.rstrip().splitlines()[-1] == "loaded:"
    # a command line the plain path leaves still works through typer
    res = subprocess.run([sys.executable, "-c", code, "collective", str(c16), "--json", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and "typer" in res.stdout.rstrip().splitlines()[-1].split()
