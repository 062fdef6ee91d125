"""End-to-end checks of the `topotrain` command: outputs against closed forms, bad input → one line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.collectives import costmodel
from topotrain.collectives.protocol import wire_efficiency

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def _write(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


SINGLE = """
cluster:
  server: single-gpu
  servers: 8
  message_overhead: 0us
  network: {topology: single-switch, link: eth-100g, latency: 0us}
"""


def test_collective_json_matches_ring_closed_form(tmp_path: Path) -> None:
    """8 single-GPU servers on one switch: ring allreduce time = the alpha-beta closed form (NIC-bound)."""
    path = _write(tmp_path, SINGLE)
    code, out = _run("collective", path, "--op", "allreduce", "--algo", "ring", "--size", "64MiB",
                     "--network", "flow", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert {"time_s", "algbw_gb_per_s", "busbw_gb_per_s"} <= set(d)
    n = 64 * 2**20
    # 100 Gb/s NIC is the narrowest link of every path, at NCCL's achievable fraction (collectives/protocol.py)
    beta = 1 / (12.5e9 * wire_efficiency("network", n))
    alpha = 4 * 150e-9  # four PCIe hop latencies of the single-gpu template (GPU-PCIe-NIC, both ends)
    expect = costmodel.ring_allreduce_s(8, n, alpha, beta)
    assert d["time_s"] == pytest.approx(expect, rel=0.02)
    assert d["busbw_gb_per_s"] == pytest.approx(d["algbw_gb_per_s"] * 2 * 7 / 8)
    assert d["busbw_gb_per_s"] < 12.5  # never above the link speed


def test_auto_and_sweep(tmp_path: Path) -> None:
    path = _write(tmp_path, SINGLE)
    code, out = _run("collective", path, "--algo", "auto", "--sweep-sizes", "1MiB:16MiB:x4", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert [r["size_bytes"] for r in rows] == [2**20, 4 * 2**20, 16 * 2**20]
    assert all(r["auto"] for r in rows)
    times = [r["time_s"] for r in rows]
    assert times == sorted(times)


def test_flow_never_faster_than_analytical() -> None:
    path = str(EXAMPLES / "shared-nic-bigraph.yaml")
    t = {}
    for net in ("analytical", "flow"):
        code, out = _run("collective", path, "--algo", "halving-doubling", "--size", "16MiB", "--network", net,
                         "--json")
        assert code == 0, out
        t[net] = json.loads(out)["time_s"]
    assert t["flow"] >= t["analytical"] * (1 - 1e-9)


def test_topo_show(tmp_path: Path) -> None:
    code, out = _run("topo", "show", str(EXAMPLES / "eflops-bigraph.yaml"), "--json",
                     "--png", str(tmp_path / "t.png"))
    assert code == 0, out
    d = json.loads(out.splitlines()[0])
    assert d["num_gpus"] == 128
    assert (tmp_path / "t.png").stat().st_size > 1000


@pytest.mark.parametrize("text,args,needle", [
    ("cluster: {server: nope, servers: 2, network: {topology: single-switch}}", (), "unknown"),
    ("cluster: {server: eflops, servers: 2\n", (), "YAML"),
    (SINGLE, ("--size", "-1MiB"), "size"),
    (SINGLE, ("--algo", "warp-drive"), "algorithm"),
    (SINGLE, ("--op", "gossip"), "collective"),
    (SINGLE.replace("servers: 8", "servers: 6"), ("--algo", "hdrm"), "HDRM"),
    ("cluster: {server: eflops, servers: 2, network: {topology: hypercube}}", (), "hypercube"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, text: str, args: tuple[str, ...], needle: str) -> None:
    path = _write(tmp_path, text)
    res = runner.invoke(app, ["collective", path, *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert needle.lower() in lines[0].lower()
    assert "Traceback" not in res.output


def test_missing_file() -> None:
    code, out = _run("collective", "/nonexistent/cluster.yaml")
    assert code == 2 and "not found" in out


# ---- conventions: nccl-tests output, op aliases, --version, outputs checked first (issue 18) ------------
def test_collective_prints_nccl_tests_rows(tmp_path: Path) -> None:
    path = _write(tmp_path, SINGLE)
    code, out = _run("collective", path, "--algo", "ring", "--sweep-sizes", "1MiB:4MiB")
    assert code == 0, out
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    code, js = _run("collective", path, "--algo", "ring", "--sweep-sizes", "1MiB:4MiB", "--json")
    ref = json.loads(js)
    assert [int(r[0]) for r in rows] == [2**20, 2 * 2**20, 4 * 2**20]  # size in bytes
    for r, d in zip(rows, ref, strict=True):
        assert int(r[1]) == d["size_bytes"] // 4 and r[2] == "float" and r[3] == "sum" and r[4] == "-1"
        assert float(r[5]) == pytest.approx(d["time_s"] * 1e6, abs=0.006)  # µs
        assert float(r[6]) == pytest.approx(d["algbw_gb_per_s"], abs=0.006)
        assert float(r[7]) == pytest.approx(d["busbw_gb_per_s"], abs=0.006)  # awk '{print $8}', as nccl-tests
    avg = [ln for ln in out.splitlines() if ln.startswith("# Avg bus bandwidth")]
    assert len(avg) == 1
    assert float(avg[0].split(":")[1]) == pytest.approx(sum(d["busbw_gb_per_s"] for d in ref) / 3, abs=1e-3)
    assert max(len(ln) for ln in out.splitlines()) <= 150


@pytest.mark.parametrize("alias,op", [("all_reduce", "allreduce"), ("all-reduce", "allreduce"),
                                      ("alltoall", "all-to-all"), ("all_to_all", "all-to-all"),
                                      ("reduce_scatter", "reduce-scatter"), ("all_gather", "allgather")])
def test_op_aliases(tmp_path: Path, alias: str, op: str) -> None:
    path = _write(tmp_path, SINGLE)
    code, out = _run("collective", path, "--op", alias, "--size", "1MiB", "--network", "analytical", "--json")
    assert code == 0, out
    assert json.loads(out)["op"] == op


def test_version_and_completion() -> None:
    from importlib.metadata import version

    code, out = _run("--version")
    assert code == 0 and out.strip() == f"topotrain {version('topotrain')}"
    code, out = _run("--help")
    assert "--install-completion" in out and "<bool>" not in out


def test_topo_show_svg_and_bad_extension_first(tmp_path: Path) -> None:
    code, out = _run("topo", "show", str(EXAMPLES / "dgx-a100-rail.yaml"), "--png", str(tmp_path / "t.svg"))
    assert code == 0, out
    assert "<svg" in (tmp_path / "t.svg").read_text()[:400]
    code, out = _run("topo", "show", "/nonexistent.yaml", "--png", str(tmp_path / "t.gif"))
    assert code == 2 and "--out" in out  # the output is refused before the cluster is even read


def test_outputs_checked_before_work(tmp_path: Path) -> None:
    code, out = _run("report", "/nonexistent.yaml", "-o", str(tmp_path / "r.txt"))
    assert code == 2 and "--out" in out and ".html" in out
    code, out = _run("simulate", "/nonexistent.yaml", "--html", str(tmp_path / "r.pdf"))
    assert code == 2 and "--html" in out
    code, out = _run("profile", "resnet50", "--out", str(tmp_path / "p.txt"))
    assert code == 2 and "--out" in out
    code, out = _run("scale", "/nonexistent.yaml", "--png", str(tmp_path / "s.gif"))
    assert code == 2 and "--out" in out
    assert list(tmp_path.iterdir()) == []


SCALE = """
cluster:
  server: eflops
  servers: 4
  network: {topology: bigraph, switches: 4, radix: 16, link: eth-100g, latency: 1us}
model: resnet50
batch: 1024
plan: {micro_batch: 32}
network: analytical
"""


def test_scale_keeps_the_files_network_at_its_size_and_says_what_changes(tmp_path: Path) -> None:
    path = _write(tmp_path, SCALE)
    code, out = _run("scale", path, "--gpus", "16:32", "--json", "--png", str(tmp_path / "s.svg"))
    assert code == 0, out
    pts = {p["gpus"]: p for p in json.loads(out)}
    code, sim = _run("simulate", path, "--json")
    assert pts[32]["iteration_time_s"] == json.loads(sim)["iteration_time_s"]  # the file's own size
    assert pts[32]["network"] == "as in the file"
    assert "switches=" in pts[16]["network"] and "resized" in pts[16]["network"]
    assert "<svg" in (tmp_path / "s.svg").read_text()[:400]


def test_profile_check_needs_a_gpu_table(tmp_path: Path) -> None:
    """``profile --check`` on the CPU measures and writes the table, and says plainly that the roofline check
    needs a GPU table (the check itself: tests/test_roofline_check.py)."""
    pytest.importorskip("torch")
    code, out = _run("profile", "alexnet", "--method", "standin", "--batch", "1", "--repeats", "1", "--device", "cpu",
                     "--out", str(tmp_path / "a.json"), "--check")
    assert code == 0, out
    assert (tmp_path / "a.json").is_file()
    assert "no roofline check" in out and "measured on the CPU" in out


def test_main_imports_only_the_verb_module_the_command_line_names() -> None:
    """Start-up: ``--version`` and ``--help`` import no verb module, a verb its own, an unknown verb all of them;
    no verb: simulate, the default job's."""
    from topotrain.cli import ALL_MODULES, VERB_MODULES, modules_for

    assert modules_for(["--version"]) == ()
    assert modules_for(["collective", "x.yaml", "--size", "64MiB"]) == ("collective",)
    assert modules_for(["topo", "show"]) == ("collective",)
    assert modules_for(["testbed", "clean", "--help"]) == ("testbed",)
    assert modules_for(["--help"]) == ()
    assert modules_for(["no-such-verb"]) == ALL_MODULES
    assert modules_for([]) == ("simulate",)
    assert set(VERB_MODULES.values()) == set(ALL_MODULES)
    registered = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert registered == set(VERB_MODULES)


def test_help_lists_every_verb_without_importing_torch() -> None:
    """``topotrain --help`` in a fresh interpreter: every verb listed, torch (profile, testbed) not imported."""
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['topotrain', '--help']\nfrom topotrain.cli import main\ntry:\n    main()\n"
            "except SystemExit:\n    pass\nprint('torch imported' if 'torch' in sys.modules else 'no torch')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip().endswith("no torch")
    for verb in ("collective", "simulate", "report", "schema", "scale", "profile", "search", "explain", "place",
                 "validate", "topo", "testbed"):
        assert f"  {verb} " in res.stdout


def test_help_lists_the_verbs_from_their_summaries_exactly_as_from_their_modules() -> None:
    """``topotrain --help`` lists every verb from :data:`~topotrain.cli.common.VERBS` without importing the verb
    modules; the page is the one the loaded commands give, byte for byte (a summary that drifts from its
    command's help, or a verb missing from the table, fails here)."""
    import subprocess
    import sys

    def page(preload: bool) -> str:
        code = ("import sys; sys.argv = ['topotrain', '--help']\nfrom topotrain import cli\n"
                + ("cli.load()\n" if preload else "")
                + "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
                + "print('verb modules loaded:', sorted(m for m in sys.modules if m.startswith('topotrain.cli.')))")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "COLUMNS": "100"})
        assert res.returncode == 0, res.stderr
        return res.stdout

    lazy, full = page(False), page(True)
    assert lazy.splitlines()[-1] == ("verb modules loaded: ['topotrain.cli.collective_args', 'topotrain.cli.common', "
                                     "'topotrain.cli.plain', 'topotrain.cli.root']")  # the non-verb modules only
    assert lazy.splitlines()[:-1] == full.splitlines()[:-1]
