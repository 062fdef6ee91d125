"""The YAML loader's event-driven fast path (yamlio._fast_load) against PyYAML's full safe loader: the same
objects for every plain document, the same limits, and the full loader for whatever it leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from topotrain.util import yamlio

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not hasattr(yaml, "CSafeLoader"), reason="the fast path needs libyaml")

# scalars that YAML 1.1's implicit resolvers type in every way: ints (hex, octal, sexagesimal, underscores),
# floats, bools, nulls, timestamps, and look-alikes that stay strings
TRICKY = ["0", "-1", "+7", "0x1F", "0o17", "017", "1_000", "1:20", "190:20:30", "1.5", "-.5e3", "1e3", ".inf",
          "-.Inf", ".nan", "yes", "No", "on", "OFF", "y", "n", "true", "False", "~", "null", "Null", "",
          "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2002-12-14 21:59:43.10 -5", "12:30", "1.2.3", "s0/gpu0",
          "100Gbps", "0.5us", "=", "<", "- x", "a: b", "#c", "é", "日本"]


def _same(text: str) -> None:
    want = yaml.load(text, Loader=yamlio.SafeLoader)
    got = yamlio._fast_load(text)
    assert got == want and repr(got) == repr(want)  # same values and the same types (1 vs 1.0 vs True)


@pytest.mark.parametrize("value", TRICKY)
def test_every_implicit_type_as_value_key_and_item(value: str) -> None:
    for text in (f"k: {value}\n", f"- {value}\n", f"{{k: [{value!r}, {value}]}}\n" if value else "k:\n"):
        try:
            yaml.load(text, Loader=yamlio.SafeLoader)
        except yaml.YAMLError:
            continue  # not a document (e.g. a bare "- x" key): nothing to compare
        _same(text)
    if value not in ("", "- x", "a: b", "#c", "=", "~", "null", "Null"):
        _same(f"{value}: 1\n")


def test_every_shipped_yaml_file() -> None:
    files = [*sorted((ROOT / "examples").glob("*.yaml")), *sorted((ROOT / "src").rglob("*.yaml"))]
    assert len(files) >= 10
    for p in files:
        _same(p.read_text())


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                     st.text(max_size=12), st.sampled_from(TRICKY))
_docs = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.booleans()),
                                                 inner, max_size=5)), max_leaves=30)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(doc=_docs, flow=st.booleans())
def test_random_documents_load_as_the_full_loader_does(doc: Any, flow: bool) -> None:
    _same(yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=True))


@pytest.mark.parametrize("text", ["a: &x {b: 1}\nc: *x\n", "a: !!str 1\n", "d: {<<: {b: 1}, c: 2}\n",
                                  "? [1, 2]\n: x\n", "--- 1\n--- 2\n", "a: ! 1\n"])
def test_features_it_leaves_go_to_the_full_loader(text: str) -> None:
    with pytest.raises(yamlio._NotPlain):
        yamlio._fast_load(text)
    try:
        want = yaml.load(text, Loader=yamlio.SafeLoader)
    except yaml.YAMLError:
        with pytest.raises(yaml.YAMLError):
            yamlio.safe_load(text)
        return
    assert yamlio.safe_load(text) == want


def test_limits_are_the_full_loaders() -> None:
    for depth in (yamlio.MAX_DEPTH, yamlio.MAX_DEPTH + 1):  # the boundary is the same on both paths
        text = "[" * depth + "1" + "]" * depth
        results = []
        for load in (lambda t: yaml.load(t, Loader=yamlio.SafeLoader), yamlio._fast_load):
            try:
                results.append(repr(load(text)))
            except yamlio.YamlLimitError as e:
                results.append(str(e))
        assert results[0] == results[1]
    text = "a: 1\nb:\n  c: 2\na: 3\n"
    msgs = []
    for load in (lambda t: yaml.load(t, Loader=yamlio.SafeLoader), yamlio._fast_load):
        with pytest.raises(yamlio.YamlLimitError) as info:
            load(text)
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1] and "line 1" in msgs[0] and "line 4" in msgs[0]


def test_read_text_refuses_a_file_over_the_size_limit_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from topotrain.util.errors import ConfigError
    monkeypatch.setattr(yamlio, "MAX_INPUT_BYTES", 1024)
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" * 300)
    with pytest.raises(ConfigError, match="larger than") as e:
        yamlio.read_text(big, "jobs")
    assert e.value.field == "jobs"
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: 1\n" * 200)
    assert yamlio.read_text(ok, "jobs") == "a: 1\n" * 200
