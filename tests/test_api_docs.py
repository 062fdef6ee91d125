"""docs/api.md's examples run as written (in order, one namespace, from the repository root), and the API's
refusals: a variant through the schema, sizes as text, names."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

import topotrain as tt

ROOT = Path(__file__).resolve().parents[1]


def _blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)


def test_api_page_examples_run() -> None:
    blocks = _blocks(ROOT / "docs" / "api.md")
    assert len(blocks) >= 5
    ns: dict[str, object] = {}
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            for i, code in enumerate(blocks):
                exec(compile(code, f"docs/api.md block {i + 1}", "exec"), ns)  # noqa: S102
    finally:
        os.chdir(cwd)
    text = out.getvalue()
    assert "refused: plan.micro_batch" in text
    assert "fat-tree" in text


def test_variant_goes_through_the_schema() -> None:
    sc = tt.load_scenario(ROOT / "examples" / "resnet50-eflops.yaml")
    v = tt.variant(sc, {"plan.micro_batch": 64})
    assert v.plan.micro_batch == 64 and sc.plan.micro_batch == 256
    assert v.cluster is sc.cluster  # the cluster section did not change: not rebuilt
    with pytest.raises(tt.ConfigError) as e:
        sc.with_(network="flw")
    assert e.value.field == "network" and "did you mean 'flow'" in e.value.fix
    with pytest.raises(tt.ConfigError) as e:
        sc.with_(plan={"tpp": 2})
    assert e.value.field == "plan.tpp"
    assert tt.simulate(sc, network="analytical").network == "analytical"
    with pytest.raises(tt.ConfigError):
        tt.simulate(sc, network="nope")
    gone = sc.with_(plan={"micro_batch": None})  # deleted: the default applies again
    assert gone.plan.micro_batch != 256


def test_load_cluster_from_path_mapping_and_text() -> None:
    text = "cluster: {server: eflops, servers: 2, network: {topology: single-switch, link: eth-100g}}"
    a = tt.load_cluster(text)
    b = tt.load_cluster({"server": "eflops", "servers": 2,
                         "network": {"topology": "single-switch", "link": "eth-100g"}})
    assert a.topology.gpus == b.topology.gpus and len(a.topology.gpus) == 16
    c = tt.load_cluster(str(ROOT / "examples" / "eflops-bigraph.yaml"))
    assert c.servers == 16
    with pytest.raises(tt.ConfigError):
        tt.load_cluster("[1, 2]\n")


def test_time_collective_sizes() -> None:
    c = tt.load_cluster({"server": "eflops", "servers": 2,
                         "network": {"topology": "single-switch", "link": "eth-100g"}})
    assert (tt.time_collective(c, "allreduce", "ring", "256MiB").time_s ==
            tt.time_collective(c, "allreduce", "ring", 256 * 2**20).time_s)
    for bad in (1000.5, "1.5B", -4, True, "lots"):
        with pytest.raises(tt.ConfigError) as e:
            tt.time_collective(c, "allreduce", "ring", bad)  # type: ignore[arg-type]
        assert e.value.field == "size"
    assert tt.time_collective(c, "allreduce", "ring", 1024.0).size_bytes == 1024


def test_names_are_what_they_say() -> None:
    assert "resnet50" in tt.model_names() and "flow" not in tt.model_names()
    assert "flow" in tt.network_model_names() and "resnet50" not in tt.network_model_names()
    table = tt.names()
    assert isinstance(table, dict)
    assert {"models", "gpus", "servers", "links", "topologies", "algorithms"} <= set(table)
    assert "fat-tree" in table["topologies"] and "ring" in table["algorithms"] and "v100" in table["gpus"]
    with pytest.raises(tt.ConfigError) as e:
        tt.names("gpu")
    assert "did you mean 'gpus'" in e.value.fix


def test_kept_clusters_follow_their_section_and_the_builtin_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant with the same cluster section reuses the built cluster; another section, or a built-in link
    replaced by the program, builds anew (never a stale cluster)."""
    import dataclasses

    from topotrain.hardware import links

    doc = {"cluster": {"server": "eflops", "servers": 2,
                       "network": {"topology": "single-switch", "link": "eth-100g"}},
           "model": "resnet50", "batch": 1024, "plan": {"micro_batch": 32}}
    sc = tt.scenario_from_dict(doc)
    assert tt.variant(sc, plan={"micro_batch": 64}).cluster is sc.cluster
    assert tt.variant(sc, {"cluster.servers": 4}).cluster is not sc.cluster
    slow = dataclasses.replace(links.LINKS["eth-100g"], bandwidth_bytes_per_s=1.25e9)
    monkeypatch.setitem(links.LINKS, "eth-100g", slow)
    again = tt.scenario_from_dict(doc)
    assert again.cluster is not sc.cluster
    assert tt.scenario_from_dict(doc).cluster is again.cluster
