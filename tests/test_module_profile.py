"""``profile --method module``: the real torch module of a model under ``torch.profiler``, per-layer forward and
backward times attributed from the recorded operators (compute/module_profile.py, compute/torch_modules.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from topotrain.compute.module_profile import measure_module_profile
from topotrain.compute.profile import load_profile, save_profile
from topotrain.util import progress
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model
from topotrain.workload.transformer import transformer
from topotrain.workload.zoo import get_model

torch = pytest.importorskip("torch")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: the CPU is shared, and timings taken on one thread vary less."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _gpt() -> Model:  # GPT-2-like: learned positions, LayerNorm, GELU, eager attention with dropout
    return transformer("tiny-gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=512, dropout=True)


def _llama() -> Model:  # Llama-like: rotary, RMSNorm, SwiGLU, grouped KV heads, fused attention, no biases
    return transformer("tiny-llama", layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=512,
                       gated_mlp=True, norm="rmsnorm", position="rotary", bias=False, flash_attention=True)


def _moe() -> Model:  # Mixtral-like: 4 SwiGLU experts, top-2
    return transformer("tiny-moe", layers=1, hidden=64, heads=4, kv_heads=2, seq_len=16, vocab=256, experts=4,
                       top_k=2, gated_mlp=True, norm="rmsnorm", position="rotary", bias=False, flash_attention=True)


@pytest.mark.parametrize("make", [_gpt, _llama, _moe, lambda: get_model("bert-base", layers=1, seq_len=32),
                                  lambda: get_model("resnet50", image_size=64)],
                         ids=["gpt", "llama", "moe", "bert", "resnet50"])
def test_every_layer_measured_positive_and_loads_back(make, tmp_path: Path, one_thread: None) -> None:
    model = make()
    with progress.display(enabled=False, record=True) as log:
        r = measure_module_profile(model, 2 if model.image_size is None else 1, "cpu", steps=1, warmup=1)
    t = r.table
    assert list(t.entries) == [lay.name for lay in model.layers]  # the profile covers the model's layers
    assert r.measured == tuple(t.entries) and r.fell_back == ()
    for name, e in t.entries.items():
        assert e.fwd_s > 0 and e.bwd_s > 0, name
    assert (t.gpu, t.device, t.dtype, t.model) == ("cpu", "cpu", "fp32", model.name)
    assert r.unattributed_bwd_s >= 0 and r.events > len(model.layers)
    # the layers' ranges and backward nodes are disjoint spans inside the step: nothing counted twice
    assert 0.3 < r.covered <= 1.0 + 1e-9, (r.covered, r.step_s)
    assert "measured steps" in " ".join(d for d, _, _ in log)  # progress was reported
    assert f"{len(model.layers)} of {len(model.layers)} layers measured" in r.summary()
    for suffix in (".json", ".csv"):
        assert load_profile(save_profile(t, tmp_path / f"p{suffix}")) == t


def _median_s(fn, n: int = 7) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return sorted(samples)[n // 2]


def test_a_layers_time_matches_an_independent_timing_of_its_module(one_thread: None) -> None:
    """The profiled lm_head (a 2×64×128 @ 128×4096 GEMM, about a third of the model's forward) against the same
    nn.Linear timed alone with perf_counter: within a factor 3 either way (a shared CPU is noisy; a layer
    given another's time, the step's total or nothing would be far outside)."""
    model = transformer("tiny-head", layers=1, hidden=128, heads=4, seq_len=64, vocab=4096)
    batch = 2
    r = measure_module_profile(model, batch, "cpu", steps=3, warmup=2)
    e = r.table.entries["lm_head"]
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 4096, bias=False)
    x = torch.randn(batch, 64, 128, requires_grad=True)
    grad = torch.randn(batch, 64, 4096)
    fwd_s = _median_s(lambda: lin(x))
    y = lin(x)

    def bwd() -> None:
        x.grad = lin.weight.grad = None
        y.backward(grad, retain_graph=True)

    bwd_s = _median_s(bwd)
    assert fwd_s / 3 < e.fwd_s < fwd_s * 3, (e.fwd_s, fwd_s)
    assert bwd_s / 3 < e.bwd_s < bwd_s * 3, (e.bwd_s, bwd_s)
    others = sum(v.fwd_s for k, v in r.table.entries.items() if k != "lm_head")
    assert e.fwd_s > others / 10  # lm_head's share is not lost among the other layers


def test_models_without_a_module_say_so_and_point_to_standin() -> None:
    with pytest.raises(ConfigError, match=r"features\.0.*--method standin"):
        measure_module_profile(get_model("alexnet"), 1, "cpu")
    with pytest.raises(ConfigError, match=r"Mixed_5b|Conv2d_1a|inception.*--method standin"):
        measure_module_profile(get_model("inception-v3"), 1, "cpu")
    with pytest.raises(ConfigError, match="steps"):
        measure_module_profile(_gpt(), 1, "cpu", steps=0)
    with pytest.raises(ConfigError, match="device"):
        measure_module_profile(_gpt(), 1, "tpu")


def test_a_module_that_cannot_run_is_one_error_line() -> None:
    """BatchNorm refuses one value per channel in training (ResNet at 32 px, batch 1): a ConfigError, not a
    traceback."""
    with pytest.raises(ConfigError, match="failed at batch 1.*channel"):
        measure_module_profile(get_model("resnet50", image_size=32), 1, "cpu", steps=1, warmup=0)


def test_the_profile_verb_profiles_the_module_and_says_what_it_measured(tmp_path: Path, monkeypatch) -> None:
    """``topotrain profile`` (default ``--method module``) on a tiny model: one line says how it measured (the
    real module, torch.profiler, device, dtype, steps, layers measured), the table loads back, and ``--method
    standin`` says it timed stand-ins."""
    from typer.testing import CliRunner

    import topotrain.cli.profile as verb
    from topotrain.cli import app

    monkeypatch.setattr(verb, "get_model", lambda name: _llama())
    out = tmp_path / "p.json"
    trace = tmp_path / "t" / "trace.json"
    res = CliRunner().invoke(app, ["profile", "tiny", "--batch", "1", "--repeats", "1", "--warmup", "0",
                                   "--device", "cpu", "-o", str(out), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert "topotrain::layers.1.mlp_down" in names and "topotrain-step" in names
    text = " ".join(res.output.split())
    assert "torch.profiler on the real transformer module of tiny-llama" in text
    n = len(_llama().layers)
    assert "cpu, fp32, batch 1: 0 warm-up + 1 measured step" in text and f"{n} of {n} layers measured" in text
    assert list(load_profile(out).entries) == [lay.name for lay in _llama().layers]
    res = CliRunner().invoke(app, ["profile", "tiny", "--method", "standin", "--batch", "1", "--repeats", "1",
                                   "--device", "cpu", "-o", str(out)])
    assert res.exit_code == 0 and "stand-ins" in res.output and "not the model's module" in res.output
    res = CliRunner().invoke(app, ["profile", "tiny", "--method", "standin", "--trace", str(trace)])
    assert res.exit_code != 0 and "--trace" in res.output
    res = CliRunner().invoke(app, ["profile", "tiny", "--method", "nope"])
    assert res.exit_code == 2 and "module" in res.output and "standin" in res.output


def test_a_run_that_cannot_fit_is_refused_before_it_starts(monkeypatch) -> None:
    """GPT-3 175B on this host: the parameters alone are 1.4 TB in fp32 (weights and gradients), refused up
    front (nothing allocated: the module is counted on the meta device)."""
    import topotrain.compute.module_profile as mp

    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"gpt3-175b at batch 1 needs about .* GiB weights and gradients"):
        mp.measure_module_profile(get_model("gpt3-175b"), 1, "cpu")
    assert time.perf_counter() - t0 < 30
    monkeypatch.setattr(mp, "free_bytes", lambda torch, dev: 1_000)
    with pytest.raises(ConfigError, match="1 needs about"):
        mp.measure_module_profile(_gpt(), 1, "cpu")
