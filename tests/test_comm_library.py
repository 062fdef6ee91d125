"""The communication library as a value (``comm.library``): ``nccl`` (NCCL's wire efficiency and protocol,
the default) or ``ideal`` (line rate), the same in ``collective``, ``simulate``, ``search`` and ``validate``."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topotrain.api import time_collective
from topotrain.cli import app
from topotrain.collectives import costmodel
from topotrain.collectives.protocol import COMM_LIBRARIES, IDEAL, NCCL, CommLibrary, comm_library, wire_efficiency
from topotrain.scenario.load import load_comm, resolve, resolved, scenario_from_dict
from topotrain.scenario.spec import CommSpec
from topotrain.search.cost import price_catalog
from topotrain.search.evaluate import Task, evaluate
from topotrain.search.space import grid, point_key, space_from_dict
from topotrain.training.simulate import simulate
from topotrain.util.errors import ConfigError
from topotrain.validate import published

runner = CliRunner()
SEARCH_NET = {"topology": "bigraph", "switches": 4, "radix": 16, "link": "eth-100g"}

#: 8 single-GPU servers on one switch, no per-message overhead: the ring is NIC-bound
SINGLE = {"server": "single-gpu", "servers": 8, "message_overhead": "0us",
          "network": {"topology": "single-switch", "link": "eth-100g", "latency": "0us"}}
NIC_BYTES_PER_S = 12.5e9
#: four PCIe hop latencies of the single-gpu template (GPU-PCIe-NIC, both ends) and the two NIC-switch links
#: (the builders' nic_latency_s, 1 us)
ALPHA_S = 4 * 150e-9 + 2 * 1e-6


def _cluster_file(tmp_path: Path, extra: str = "") -> str:
    p = tmp_path / "c.yaml"
    p.write_text("cluster:\n  server: single-gpu\n  servers: 8\n  message_overhead: 0us\n"
                 "  network: {topology: single-switch, link: eth-100g, latency: 0us}\n" + extra)
    return str(p)


def test_the_schema_and_the_protocol_name_the_same_libraries() -> None:
    assert typing.get_args(CommSpec.model_fields["library"].annotation) == COMM_LIBRARIES
    assert comm_library(" IDEAL ") == IDEAL and comm_library(NCCL) is NCCL
    with pytest.raises(ConfigError) as err:
        CommLibrary("gloo")
    assert err.value.field == "comm.library" and "nccl, ideal" in str(err.value)


@pytest.mark.parametrize("network", ["flow", "analytical"])
@pytest.mark.parametrize("size", [2**20, 64 * 2**20])
def test_ideal_is_the_alpha_beta_closed_form_at_line_rate(tmp_path: Path, network: str, size: int) -> None:
    """With ``ideal`` a ring allreduce runs at the alpha-beta time with β = 1/(NIC line rate); with NCCL, β is
    divided by NCCL's wire efficiency for the message (0.95 × the protocol's payload fraction)."""
    c = scenario_from_dict({"cluster": SINGLE, "model": "resnet50", "batch": 8}).cluster
    ideal = time_collective(c, "allreduce", "ring", size, network, library="ideal")
    nccl = time_collective(c, "allreduce", "ring", size, network)
    expect = costmodel.ring_allreduce_s(8, size, ALPHA_S, 1 / NIC_BYTES_PER_S)
    assert ideal.time_s == pytest.approx(expect, rel=0.005)
    assert (ideal.library, ideal.wire_efficiency, ideal.protocol) == ("ideal", 1.0, "line-rate")
    eff = wire_efficiency("network", size)
    assert nccl.library == "nccl" and nccl.wire_efficiency == eff
    assert nccl.time_s == pytest.approx(costmodel.ring_allreduce_s(8, size, ALPHA_S, 1 / (NIC_BYTES_PER_S * eff)),
                                        rel=0.005)


def test_a_scenario_names_its_library_and_the_result_shows_it() -> None:
    base = {"cluster": SINGLE, "model": "resnet50", "batch": 64, "network": "analytical"}
    default = simulate(scenario_from_dict(base))
    ideal = simulate(scenario_from_dict({**base, "comm": {"library": "Ideal"}}))
    assert default.to_dict()["comm"] == {"library": "nccl"} and ideal.to_dict()["comm"] == {"library": "ideal"}
    assert ideal.to_dict()["routing"] == "ecmp"
    # the same compute, less communication: gradients of ResNet-50 on the wire at line rate
    assert ideal.breakdown.compute_s == default.breakdown.compute_s
    assert ideal.iteration_time_s < default.iteration_time_s
    assert resolved(resolve(base))["comm"] == {"library": "nccl"}
    with pytest.raises(ConfigError) as err:
        scenario_from_dict({**base, "comm": {"library": "mpi"}})
    assert err.value.field == "comm.library" and "nccl" in str(err.value)


def test_collective_takes_the_library_from_the_option_or_the_file(tmp_path: Path) -> None:
    plain = _cluster_file(tmp_path)
    assert load_comm(plain) == NCCL and load_comm(plain, "ideal") == IDEAL
    (tmp_path / "i.yaml").write_text(Path(plain).read_text() + "comm: {library: ideal}\n")
    assert load_comm(tmp_path / "i.yaml") == IDEAL
    outs = {}
    for args in (["--library", "ideal"], [], ["--library", "nccl"]):
        res = runner.invoke(app, ["collective", plain, "--algo", "ring", "--size", "64MiB", "--json", *args])
        assert res.exit_code == 0, res.output
        outs[tuple(args)] = json.loads(res.output)
    assert outs[("--library", "ideal")]["library"] == "ideal" and outs[()]["library"] == "nccl"
    assert outs[()] == outs[("--library", "nccl")]
    assert outs[("--library", "ideal")]["time_s"] < outs[()]["time_s"]
    res = runner.invoke(app, ["collective", str(tmp_path / "i.yaml"), "--algo", "ring", "--size", "64MiB"])
    assert res.exit_code == 0 and "ideal library" in res.output
    res = runner.invoke(app, ["collective", plain, "--library", "gloo"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0 and "--library" in res.output


def test_simulate_prints_the_library_and_the_routing() -> None:
    res = runner.invoke(app, ["simulate", "--set", "comm.library=ideal", "--network", "analytical"])
    assert res.exit_code == 0, res.output
    assert "ideal library" in res.output and "routing" in res.output
    res = runner.invoke(app, ["simulate", "--set", "comm.library=gloo"])
    assert res.exit_code == 2 and "comm.library" in res.output


def test_validate_published_lays_the_library_over_the_rows() -> None:
    first = next(c for c in published.cases() if c.scenario.get("cluster", {}).get("servers", 1) == 1
                 and c.subset == "validation")
    rows = {lib: published.run("analytical", only=lambda c: c.name == first.name, library=lib)[0]
            for lib in ("nccl", "ideal")}
    assert rows["ideal"].predicted >= rows["nccl"].predicted  # throughput: never slower at line rate


def test_search_takes_the_library_from_each_point_and_records_it() -> None:
    """``comm.library: [nccl, ideal]`` in a space is a dimension like any field; each point's record names its
    library and the fabric's routing (an Ethernet BiGraph: the per-switch hash)."""
    doc = {"cluster": {"server": "eflops", "servers": 2, "network": SEARCH_NET}, "model": "resnet50",
           "batch": {"global": 512, "micro": 32}, "comm": {"library": ["nccl", "ideal"]}}
    space_from_dict({**doc, "search": {"screen_network": "analytical"}})  # a valid space
    points = [p for _, p in grid(doc)]
    assert sorted(p["comm"]["library"] for p in points) == ["ideal", "nccl"]
    metrics = {}
    for p in points:
        rec = evaluate(Task(point_key(p), 0, "screen", p, "analytical", price_catalog()))
        assert rec["status"] == "ok", rec
        metrics[p["comm"]["library"]] = rec["metrics"]
    assert {k: m["comm"] for k, m in metrics.items()} == {"nccl": {"library": "nccl"}, "ideal": {"library": "ideal"}}
    assert metrics["nccl"]["routing"] == metrics["ideal"]["routing"] == "ecmp"
    assert metrics["ideal"]["iteration_time_s"] < metrics["nccl"]["iteration_time_s"]
