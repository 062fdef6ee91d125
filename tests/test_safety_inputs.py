"""Hostile and absurd inputs (issue 19, part 3): alias bombs and duplicate keys refused at load, absurd
magnitudes refused with their field and the accepted range, errors quoting what was typed and cut to a
readable length, paths inside a scenario relative to it, JSON never holding Infinity or NaN, and
``topo show --json`` identical to the last digit under any PYTHONHASHSEED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from topotrain.cli import app
from topotrain.util import jsonsafe, yamlio

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BASE = """
cluster:
  server: single-gpu
  servers: 4
  network: {topology: single-switch, link: eth-100g}
model: resnet50
batch: 64
network: analytical
"""


def _bomb(levels: int = 9) -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for name in "bcdefghijk"[: levels - 1]:
        text += f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]\n"
        prev = name
    return text


def _errors(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("error:")]


def _simulate(tmp_path: Path, text: str, *extra: str) -> tuple[int, list[str]]:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    res = runner.invoke(app, ["simulate", str(p), "--resolved", *extra])
    return res.exit_code, _errors(res.output)


def test_billion_laughs_fails_fast_with_a_clear_error(tmp_path: Path) -> None:
    bomb = _bomb()
    assert len(bomb) < 700
    t0 = time.perf_counter()
    code, errs = _simulate(tmp_path, bomb + BASE)
    assert time.perf_counter() - t0 < 5.0
    assert code == 2 and len(errs) == 1 and "alias" in errs[0], errs
    with pytest.raises(yaml.YAMLError, match="alias"):
        yamlio.safe_load(bomb)


def test_recursive_and_deep_documents_are_refused() -> None:
    with pytest.raises(yaml.YAMLError, match="contains it"):
        yamlio.safe_load("&a [*a]")
    with pytest.raises(yaml.YAMLError, match="deeper"):
        yamlio.safe_load("[" * 500 + "]" * 500)


def test_duplicate_key_is_an_error_with_both_lines(tmp_path: Path) -> None:
    code, errs = _simulate(tmp_path, BASE + "batch: 128\n")
    assert code == 2 and len(errs) == 1, errs
    assert "duplicate key 'batch'" in errs[0] and "line 7" in errs[0] and "line 9" in errs[0], errs


def test_merge_keys_still_override() -> None:
    assert yamlio.safe_load("a: &x {b: 1, c: 2}\nd: {<<: *x, b: 3}\n")["d"] == {"b": 3, "c": 2}


def test_loader_matches_pyyaml_on_every_example() -> None:
    for p in sorted(EXAMPLES.glob("*.yaml")):
        assert yamlio.safe_load(p.read_text()) == yaml.safe_load(p.read_text()), p.name


@pytest.mark.parametrize(("override", "field", "words"), [
    ("cluster.network.bandwidth=1e-300B/s", "cluster.network.bandwidth", "accepted"),
    ("cluster.network.bandwidth=1e300Gbps", "cluster.network.bandwidth", "accepted"),
    ("plan.bucket=1e21B", "plan.bucket", "accepted"),
    ("cluster.servers=18446744073709551616", "cluster.servers", "65536"),
    ("batch=1000000000", "batch", "16777216"),
    ("model={type: transformer, layers: 2, hidden: 18446744073709551616, heads: 2, seq_len: 8, vocab: 8}",
     "model.hidden", "16777216"),
    ("cluster.network={topology: torus, dims: [18446744073709551616, 2]}", "cluster.network.dims", "1,048,576"),
    ("cluster.network.latency=1e300s", "cluster.network.latency", "accepted"),
])
def test_absurd_magnitudes_name_the_field_and_the_range(tmp_path: Path, override: str, field: str,
                                                        words: str) -> None:
    code, errs = _simulate(tmp_path, BASE, "--set", override)
    assert code == 2 and errs, errs
    assert any(e.startswith(f"error: {field}") and words in e for e in errs), errs


def test_errors_quote_what_was_typed_and_stay_short(tmp_path: Path) -> None:
    code, errs = _simulate(tmp_path, BASE, "--set", "cluster.network.bandwidth=-1Gbps")
    assert code == 2 and "'-1Gbps'" in errs[0], errs
    code, errs = _simulate(tmp_path, BASE, "--set", "cluster.network.bandwidth=" + "9" * 100_000 + "Gbps")
    assert code == 2 and errs and max(len(e) for e in errs) <= 320, [len(e) for e in errs]
    code, errs = _simulate(tmp_path, BASE, "--set", "model=" + "x" * 100_000)
    # what was typed is cut; the list of valid names after it is whole (and bounded by the catalog)
    assert code == 2 and errs and max(len(e.split(" (known: ")[0]) for e in errs) <= 320, [len(e) for e in errs]
    assert all(e.endswith("megatron-1t)") and len(e) <= 320 + 2000 for e in errs), errs


def test_compute_profile_is_relative_to_the_scenario(tmp_path: Path) -> None:
    sub = tmp_path / "study"
    sub.mkdir()
    (sub / "prof.csv").write_text("# gpu=v100\n# batch=64\nname,fwd_s,bwd_s\nconv1,1e-3,2e-3\n")
    (sub / "s.yaml").write_text(BASE.replace("single-gpu", "single-gpu") + "compute: {profile: prof.csv}\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)  # elsewhere: the profile is found next to the scenario, not in the working directory
    try:
        res = runner.invoke(app, ["simulate", str(sub / "s.yaml"), "--json"])
    finally:
        os.chdir(cwd)
    assert "no profile file" not in res.output, res.output


def test_json_never_holds_infinity_or_nan() -> None:
    text = jsonsafe.dumps({"a": float("inf"), "b": [float("nan"), 1.5], "c": (-float("inf"),)})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == {
        "a": None, "b": [None, 1.5], "c": [None]}


def test_topo_show_json_is_identical_under_any_hash_seed() -> None:
    exe = str(Path(sys.executable).with_name("topotrain"))
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        p = subprocess.run([exe, "topo", "show", str(EXAMPLES / "dgx-a100-rail.yaml"), "--json"], env=env,
                           capture_output=True, text=True, timeout=120, check=True)
        outs.add(p.stdout)
    assert len(outs) == 1, outs


@pytest.mark.parametrize("field", ["cluster.graph", "compute.profile"])
def test_a_nul_byte_in_a_scenario_path_is_refused(tmp_path: Path, field: str) -> None:
    """Found by benchmarks/fuzz.py: a NUL byte in a path was a ValueError ("internal error")."""
    text = BASE + ("compute: {profile: \"a\\0b.json\"}\n" if field == "compute.profile" else "")
    if field == "cluster.graph":
        text = text.replace("cluster:\n  server: single-gpu\n  servers: 4\n  network: {topology: single-switch, "
                            "link: eth-100g}\n", "cluster: {graph: \"g\\0.yaml\"}\n")
    code, errs = _simulate(tmp_path, text)
    assert code == 2 and any(e.startswith(f"error: {field}") and "NUL" in e for e in errs), errs


def test_an_algorithm_the_plan_cannot_use_is_named_as_the_plan_field() -> None:
    """ZeRO-2 reduce-scatters gradients and sequence parallelism reduce-scatters activations: a tree cannot, and
    the one error line names the plan field that chose it (not the collective layer's field) and the fix."""
    from topotrain.scenario.load import scenario_from_dict
    from topotrain.training.simulate import simulate
    from topotrain.util.errors import ConfigError

    example = str(EXAMPLES / "resnet50-eflops.yaml")
    res = runner.invoke(app, ["simulate", example, "--set", "plan.zero_stage=2", "--set", "plan.dp_algorithm=tree"])
    errs = _errors(res.output)
    assert res.exit_code == 2 and len(errs) == 1, res.output
    assert errs[0].startswith("error: plan.dp_algorithm: algorithm 'tree' does not do reduce-scatter"), errs
    assert "use one of ring" in errs[0]
    sc = scenario_from_dict({
        "cluster": {"server": "nvswitch-8", "servers": 1}, "model": "gpt3-350m", "batch": 8,
        "plan": {"tp": 2, "micro_batch": 1, "sequence_parallel": True, "tp_algorithm": "tree"}, "network": "flow"})
    with pytest.raises(ConfigError) as err:
        simulate(sc)
    assert err.value.field == "plan.tp_algorithm" and "reduce-scatter" in err.value.message
