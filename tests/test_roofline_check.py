"""The roofline checked against a measured profile table (issue 17, part 7): per layer kind, the roofline's
time beside the measured one, hand-built tables with known ratios."""

from __future__ import annotations

import pytest

from topotrain.compute.check import GEMM_KINDS, format_check, roofline_check
from topotrain.compute.profile import ProfileEntry, ProfileTable
from topotrain.compute.roofline import layer_times
from topotrain.util.errors import ConfigError
from topotrain.workload.zoo import get_model

#: the slowdown of each kind in the hand-built "measured" tables below
FACTOR = {"linear": 1.25, "matmul": 2.0, "attention": 1.5}


def _measured(gpu: str = "h100", device: str = "cuda:NVIDIA H100 80GB HBM3", batch: int = 4) -> ProfileTable:
    """A table whose every layer took its roofline time times FACTOR of its kind (1 for the others)."""
    model = get_model("bert-large", layers=2)
    fwd, bwd = layer_times(model, gpu, batch, dtype="bf16")
    entries = {lay.name: ProfileEntry(float(f) * FACTOR.get(str(lay.kind), 1.0),
                                      float(b) * FACTOR.get(str(lay.kind), 1.0))
               for lay, f, b in zip(model.layers, fwd, bwd, strict=True)}
    return ProfileTable(gpu=gpu if device != "cpu" else "cpu", batch=batch, entries=entries, dtype="bf16",
                        device=device, model=model.name)


def test_each_kind_shows_its_slowdown_as_the_inverse_ratio() -> None:
    model = get_model("bert-large", layers=2)
    rows = roofline_check(_measured(), model)
    kinds = [r.kind for r in rows]
    assert len(kinds) == len(set(kinds))
    # kinds in the order they first appear in the model
    first = []
    for lay in model.layers:
        if str(lay.kind) not in first:
            first.append(str(lay.kind))
    assert kinds == first
    for r in rows:
        assert r.ratio == pytest.approx(1.0 / FACTOR.get(r.kind, 1.0), rel=1e-12)
        assert r.layers == sum(1 for lay in model.layers if str(lay.kind) == r.kind)
        assert ("GEMMs" in r.measured_as) == (r.kind in GEMM_KINDS or r.kind == "attention")
    text = format_check(rows)
    assert text.splitlines()[0].startswith("kind") and text.splitlines()[-1].startswith("all")
    assert len(text.splitlines()) == len(rows) + 2


def test_a_partial_table_checks_only_its_layers() -> None:
    model = get_model("bert-large", layers=2)
    full = _measured()
    some = {n: e for n, e in full.entries.items() if n.startswith(model.layers[5].name.split(".")[0])}
    part = ProfileTable(gpu=full.gpu, batch=full.batch, entries=some, dtype="bf16", device=full.device,
                        model=full.model)
    rows = roofline_check(part, model)
    assert sum(r.layers for r in rows) == len(some)
    assert sum(r.measured_s for r in rows) == pytest.approx(sum(e.fwd_s + e.bwd_s for e in some.values()))


def test_a_cpu_table_or_a_foreign_layer_is_refused() -> None:
    model = get_model("bert-large", layers=2)
    with pytest.raises(ConfigError, match="measured on the CPU"):
        roofline_check(_measured(device="cpu"), model)
    t = _measured()
    other = ProfileTable(gpu=t.gpu, batch=t.batch, entries={**t.entries, "no.such.layer": ProfileEntry(1.0, 1.0)},
                         dtype="bf16", device=t.device, model=t.model)
    with pytest.raises(ConfigError, match="no layer 'no.such.layer'"):
        roofline_check(other, model)
