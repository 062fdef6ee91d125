"""Hardware catalog and server templates: datasheet figures, lookups, templates in a Topology, user input."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from topotrain.hardware import (
    GPU_ALIASES,
    GPUS,
    LINK_KINDS,
    LINKS,
    SERVERS,
    GPUSpec,
    LinkType,
    eflops_server,
    get_gpu,
    get_link,
    get_server,
    instantiate,
    nvswitch_server,
    pcie_shared_nic,
    register_gpu,
    register_link,
    resolve_bandwidth,
    server_to_dict,
)
from topotrain.scenario.catalog import load_catalog, server_from_dict
from topotrain.topology import NodeKind, Topology
from topotrain.util.errors import ConfigError, ConfigErrors
from topotrain.util.units import parse_flops

T = 1e12
GIB = 2.0**30


@pytest.fixture
def registry() -> Iterator[None]:
    """Restore the global catalogs after a test that registers entries."""
    saved: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (d, dict(d)) for d in (GPUS, GPU_ALIASES, LINKS, SERVERS)]
    yield
    for live, old in saved:
        live.clear()
        live.update(old)


# ---- units.parse_flops ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    ("312TFLOPS", 312e12), ("19.5 TFLOP/s", 19.5e12), ("624 TOPS", 624e12), ("989.4 tflops", 989.4e12),
    ("2 PFLOPS", 2e15), ("1.2e15", 1.2e15), (5e12, 5e12), (7, 7.0),
])
def test_parse_flops(text: str | float, expected: float) -> None:
    assert parse_flops(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["fast", "-1TFLOPS", "0", "3 TB/s", True])
def test_parse_flops_rejects(bad: Any) -> None:
    with pytest.raises(ConfigError, match="peak"):
        parse_flops(bad, "peak")


# ---- GPUs ---------------------------------------------------------------------------------------------
def test_datasheet_spot_checks() -> None:
    assert get_gpu("a100-80gb").peak("bf16") == pytest.approx(312 * T, rel=1e-9)
    assert get_gpu("a100-40gb").peak("fp16") == pytest.approx(312 * T, rel=1e-9)
    assert get_gpu("h100").peak("bf16") == pytest.approx(989 * T, rel=0.005)      # dense, not 1979 sparse
    assert get_gpu("h100").peak("fp8") == pytest.approx(1979 * T, rel=0.005)
    assert get_gpu("v100").peak("fp16") == pytest.approx(125 * T, rel=1e-9)
    assert get_gpu("a100-80gb").hbm_bandwidth_bytes_per_s == pytest.approx(2.0e12, rel=0.03)
    assert get_gpu("a100-40gb").hbm_bandwidth_bytes_per_s == pytest.approx(1.555e12, rel=0.01)
    assert get_gpu("h100").hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12, rel=0.01)
    assert get_gpu("h200").memory_bytes == pytest.approx(141 * GIB, rel=1e-9)
    assert get_gpu("mi300x").memory_bytes == pytest.approx(192 * GIB, rel=1e-9)
    assert get_gpu("mi300x").peak("bf16") == pytest.approx(1307.4 * T, rel=0.001)
    assert get_gpu("mi250x").memory_bytes == pytest.approx(128 * GIB, rel=1e-9)
    assert get_gpu("p100").peak("fp16") == pytest.approx(21.2 * T, rel=1e-9)


@pytest.mark.parametrize(("name", "fp32_lanes", "tensor_flop_per_clk"), [
    ("p100", 64, None), ("v100", 64, 1024), ("a100-80gb", 64, 2048), ("h100", 128, None),
])
def test_peaks_match_sm_times_clock(name: str, fp32_lanes: int, tensor_flop_per_clk: int | None) -> None:
    """Closed form: peak = SMs x FLOP/clock/SM x clock (FMA = 2 FLOP); V100 8 TCs x 64 FMA, A100 4 x 256."""
    g = get_gpu(name)
    assert g.peak("fp32") == pytest.approx(g.sm_count * fp32_lanes * 2 * g.boost_clock_hz, rel=0.01)
    if tensor_flop_per_clk is not None:
        assert g.peak("fp16") == pytest.approx(g.sm_count * tensor_flop_per_clk * g.boost_clock_hz, rel=0.01)


def test_catalog_consistency() -> None:
    for g in GPUS.values():
        assert g.source and g.vendor in ("nvidia", "amd")
        assert set(g.peak_flops_per_s) <= {"fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"}
        assert g.nvlink is None or get_link(g.nvlink).kind == "nvlink"
        # tensor rates are never below the non-tensor fp32 rate
        for k in ("tf32", "fp16", "bf16", "fp8"):
            if k in g.peak_flops_per_s:
                assert g.peak(k) > g.peak("fp32")
    for name in ("a100-80gb", "h100", "mi300x"):
        assert get_gpu(name).peak("tf32") == pytest.approx(get_gpu(name).peak("bf16") / 2, rel=0.001)
    with pytest.raises(TypeError):
        get_gpu("a100").peak_flops_per_s["bf16"] = 1.0  # type: ignore[index]


def test_peak_dtype_errors_and_aliases() -> None:
    v100 = get_gpu("v100")
    with pytest.raises(ConfigError) as e:
        v100.peak("bf16")
    assert e.value.field == "dtype" and "bf16" in e.value.message
    assert "fp16" in e.value.fix and "fp32" in e.value.fix and "bf16" not in e.value.fix
    with pytest.raises(ConfigError, match="fp8"):
        get_gpu("a100").peak("fp8")
    with pytest.raises(ConfigError, match="fp4"):
        get_gpu("h100").peak("fp4")
    assert get_gpu("a100").peak("bfloat16") == get_gpu("a100").peak("bf16")
    assert get_gpu("a100").peak("FP16") == get_gpu("a100").peak("float16")


def test_gpu_aliases_and_unknown() -> None:
    assert get_gpu("A100") is get_gpu("a100-80gb")
    assert get_gpu("h100-sxm") is get_gpu("H100")
    assert get_gpu("v100-32gb") is get_gpu("v100")
    assert get_gpu("v100-16gb").memory_bytes == 16 * GIB and get_gpu("v100").memory_bytes == 32 * GIB
    assert get_gpu("a100-40gb") is not get_gpu("a100")
    with pytest.raises(ConfigError) as e:
        get_gpu("x")
    assert e.value.field == "gpu" and e.value.message == "unknown GPU 'x'"
    assert e.value.fix.startswith("known: ") and "a100-80gb" in e.value.fix and "mi300x" in e.value.fix


def test_register_gpu(registry: None) -> None:
    spec = GPUSpec("Mine", "acme", {"bf16": 100 * T, "fp32": 10 * T}, 1e12, 24 * GIB, source="test")
    register_gpu(spec, ["mine-24gb"])
    assert get_gpu("mine") is spec and get_gpu("MINE-24GB") is spec
    register_gpu(spec)  # identical: no-op
    other = GPUSpec("mine", "acme", {"bf16": 200 * T}, 1e12, 24 * GIB)
    with pytest.raises(ConfigError, match="already"):
        register_gpu(other)
    with pytest.raises(ConfigError, match="alias"):
        register_gpu(GPUSpec("a100", "x", {"bf16": 1.0}, 1.0, 1.0))
    register_gpu(other, replace=True)
    assert get_gpu("mine").peak("bf16") == 200 * T
    with pytest.raises(ConfigError, match="peak"):
        GPUSpec("bad", "x", {"bf16": -1.0}, 1.0, 1.0)
    with pytest.raises(ConfigError, match="data type"):
        GPUSpec("bad", "x", {"fp4": 1.0}, 1.0, 1.0)


# ---- links --------------------------------------------------------------------------------------------
def test_link_bandwidths() -> None:
    assert get_link("pcie3-x16").bandwidth_bytes_per_s == pytest.approx(15.75e9, rel=1e-3)
    assert get_link("pcie4-x16").bandwidth_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)
    assert get_link("PCIe5-x16").bandwidth_bytes_per_s == pytest.approx(63.0e9, rel=1e-3)
    assert get_link("nvlink2").bandwidth_bytes_per_s == 150e9
    assert get_link("nvlink3").bandwidth_bytes_per_s == 300e9
    assert get_link("nvlink4").bandwidth_bytes_per_s == 450e9
    assert get_link("upi").bandwidth_bytes_per_s == pytest.approx(62.4e9)
    assert get_link("eth-100g").bandwidth_bytes_per_s == 12.5e9
    assert get_link("eth-25g").bandwidth_bytes_per_s == 3.125e9
    assert get_link("ib-hdr-200g").bandwidth_bytes_per_s == 25e9
    assert get_link("ib-ndr-400g").bandwidth_bytes_per_s == 50e9
    for name in ("eth-40g", "eth-50g", "eth-200g", "eth-400g", "ib-edr-100g", "qpi"):
        assert get_link(name).bandwidth_bytes_per_s > 0
    for lt in LINKS.values():
        assert lt.kind in LINK_KINDS and lt.source
        assert 1e-9 <= lt.latency_s <= 2e-6
    # NIC latency: InfiniBand switch hop is below Ethernet's
    assert get_link("ib-hdr-200g").latency_s < get_link("eth-100g").latency_s


def test_link_lookup_and_resolve(registry: None) -> None:
    with pytest.raises(ConfigError) as e:
        get_link("pcie7")
    assert "pcie7" in e.value.message and "pcie4-x16" in e.value.fix
    assert resolve_bandwidth("pcie4-x16") == get_link("pcie4-x16").bandwidth_bytes_per_s
    assert resolve_bandwidth("25GB/s") == 25e9
    assert resolve_bandwidth("100Gbps", "x") == 12.5e9
    assert resolve_bandwidth(1e9, "link_bandwidth_bytes_per_s") == 1e9  # the name states the unit
    with pytest.raises(ConfigError, match="bare number"):
        resolve_bandwidth(1e9, "cluster.network.bandwidth")
    with pytest.raises(ConfigError) as e:
        resolve_bandwidth("fast", "cluster.nic")
    assert e.value.field == "cluster.nic" and "link type" in e.value.message and "eth-100g" in e.value.fix
    with pytest.raises(ConfigError, match="kind"):
        LinkType("x", "wifi", 1e9, 0.0)
    register_link(LinkType("cxl", "pcie", 64e9, 1e-7, "test"))
    assert resolve_bandwidth("CXL") == 64e9
    with pytest.raises(ConfigError, match="already"):
        register_link(LinkType("cxl", "pcie", 32e9, 1e-7))


# ---- server templates in a Topology -------------------------------------------------------------------
def _build(template: str | Any, servers: int = 1, **kw: Any) -> tuple[Topology, list[Any]]:
    topo = Topology("t")
    insts = [instantiate(topo, template, f"s{i}", **kw) for i in range(servers)]
    return topo, insts


def _path_nodes(topo: Topology, src: str, dst: str) -> list[str]:
    links = topo.route(src, dst)
    return [topo.links[links[0]].src] + [topo.links[i].dst for i in links]


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_every_template_instantiates(name: str) -> None:
    tpl = get_server(name)
    topo, (inst,) = _build(name)
    topo.validate()
    assert inst.name == "s0" and inst.template == tpl.name
    assert topo.gpus == list(inst.gpus) == [f"s0/{g}" for g in tpl.gpu_names]
    assert all(n.startswith("s0/") and topo.nodes[n].server == "s0" for n in topo.nodes)
    assert len(topo.nodes) == len(tpl.nodes) and topo.num_links == 2 * len(tpl.links)
    rails = [topo.nodes[n].attrs["rail"] for n in inst.nics]
    assert rails == list(range(len(inst.nics)))
    for n in inst.nics:
        assert topo.nodes[n].kind is NodeKind.NIC and topo.nodes[n].attrs["bandwidth_bytes_per_s"] > 0
    for g in inst.gpus:
        attrs = topo.nodes[g].attrs
        assert get_gpu(attrs["gpu"]).name == attrs["gpu"] == tpl.gpu
        assert attrs["nic"] in inst.nics
        assert topo.router.nic_of(g) == attrs["nic"]
        assert len(topo.route(g, attrs["nic"])) >= 2  # through at least one switch/root complex
    # every GPU pair inside the server is routable
    for a in inst.gpus:
        for b in inst.gpus:
            if a != b:
                assert topo.route(a, b)


def test_pcie_shared_nic_crosses_root_complex_and_upi() -> None:
    topo, (inst,) = _build("pcie-shared-nic")
    assert inst.nics == ("s0/nic0",)
    upi = {topo.link_id("s0/cpu1", "s0/cpu0"), topo.link_id("s0/cpu0", "s0/cpu1")}
    for i, g in enumerate(inst.gpus):
        assert topo.nodes[g].attrs["nic"] == "s0/nic0"          # all 8 share the NIC
        route = set(topo.route(g, "s0/nic0"))
        assert topo.link_id("s0/cpu0", "s0/nic0") in route         # through socket 0's root complex
        assert bool(route & upi) == (i >= 4)                       # socket-1 GPUs cross UPI
    assert _path_nodes(topo, "s0/gpu6", "s0/nic0") == ["s0/gpu6", "s0/pcie3", "s0/cpu1", "s0/cpu0", "s0/nic0"]
    uplink = topo.link_id("s0/pcie0", "s0/cpu0")
    assert uplink in topo.route("s0/gpu0", "s0/nic0") and uplink in topo.route("s0/gpu1", "s0/nic0")
    # peer-to-peer under one switch stays on the switch
    assert _path_nodes(topo, "s0/gpu0", "s0/gpu1") == ["s0/gpu0", "s0/pcie0", "s0/gpu1"]
    tpl = get_server("pcie-shared-nic")
    for lk in tpl.links:
        expected = "socket" if {lk.a, lk.b} == {"cpu0", "cpu1"} else "pcie"
        assert lk.kind == expected
        assert lk.bandwidth_bytes_per_s == get_link("upi" if expected == "socket" else "pcie3-x16"
                                                    ).bandwidth_bytes_per_s


def test_pcie_shared_nic_two_nics() -> None:
    tpl = pcie_shared_nic(nics=2)
    topo, (inst,) = _build(tpl)
    assert inst.nics == ("s0/nic0", "s0/nic1")
    upi = {topo.link_id("s0/cpu1", "s0/cpu0"), topo.link_id("s0/cpu0", "s0/cpu1")}
    for i, g in enumerate(inst.gpus):
        assert topo.nodes[g].attrs["nic"] == f"s0/nic{i // 4}"
        assert not set(topo.route(g, topo.nodes[g].attrs["nic"])) & upi
    with pytest.raises(ConfigError, match="nics"):
        pcie_shared_nic(nics=3)
    assert get_server("pcie-shared-nic") == pcie_shared_nic()


def test_eflops_never_touches_a_cpu() -> None:
    topo, (inst,) = _build("eflops")
    assert len(inst.nics) == 4
    for i, g in enumerate(inst.gpus):
        nic = topo.nodes[g].attrs["nic"]
        assert nic == f"s0/nic{i // 2}"
        path = _path_nodes(topo, g, nic)
        assert path == [g, f"s0/pcie{i // 2}", nic]
        assert not any(topo.nodes[n].kind is NodeKind.CPU for n in path)
    assert eflops_server(nic="eth-25g").nodes[-1].attrs["bandwidth_bytes_per_s"] == 3.125e9


def test_nvswitch_and_dgx_h100() -> None:
    for name, gpu, nv, nic_bw, pcie in (("nvswitch-8", "a100-80gb", 300e9, 25e9, "pcie4-x16"),
                                         ("dgx-h100", "h100", 450e9, 50e9, "pcie5-x16")):
        topo, (inst,) = _build(name)
        assert len(inst.gpus) == 8 and len(inst.nics) == 8
        assert len(topo.nodes_of_kind("nvswitch")) == 1 and len(topo.nodes_of_kind("pcie")) == 4
        assert len(topo.nodes_of_kind("cpu")) == 2
        for i, g in enumerate(inst.gpus):
            assert topo.nodes[g].attrs["gpu"] == gpu
            assert topo.nodes[g].attrs["nic"] == f"s0/nic{i}"
            assert topo.nodes[f"s0/nic{i}"].attrs["rail"] == i
            assert topo.nodes[f"s0/nic{i}"].attrs["bandwidth_bytes_per_s"] == nic_bw
            lk = topo.links[topo.link_id(g, "s0/nvswitch0")]
            assert lk.bandwidth_bytes_per_s == nv and lk.kind == "nvlink"
            sw = f"s0/pcie{i // 2}"
            pcie_bw = get_link(pcie).bandwidth_bytes_per_s
            assert topo.links[topo.link_id(sw, g)].bandwidth_bytes_per_s == pcie_bw
            assert _path_nodes(topo, g, f"s0/nic{i}") == [g, sw, f"s0/nic{i}"]
        # GPUs on different PCIe switches talk over the NVSwitch
        assert _path_nodes(topo, "s0/gpu0", "s0/gpu7") == ["s0/gpu0", "s0/nvswitch0", "s0/gpu7"]
    assert get_server("DGX-A100") is get_server("nvswitch-8")
    assert nvswitch_server() == get_server("nvswitch-8")


def test_instantiate_overrides_and_errors() -> None:
    topo, (inst,) = _build("eflops", gpu="A100", nic="eth-400g")
    assert {topo.nodes[g].attrs["gpu"] for g in inst.gpus} == {"a100-80gb"}
    assert {topo.nodes[n].attrs["bandwidth_bytes_per_s"] for n in inst.nics} == {50e9}
    assert {topo.nodes[n].attrs["link"] for n in inst.nics} == {"eth-400g"}
    with pytest.raises(ConfigError, match="not a NIC"):
        _build("eflops", nic="pcie4-x16")
    with pytest.raises(ConfigError, match="unknown GPU"):
        _build("eflops", gpu="tpu")
    with pytest.raises(ConfigError) as e:
        get_server("dgx-z")
    assert "eflops" in e.value.fix and "pcie-shared-nic" in e.value.fix
    topo = Topology()
    instantiate(topo, "single-gpu", "a")
    with pytest.raises(ConfigError, match="already"):
        instantiate(topo, "single-gpu", "a")


@pytest.mark.parametrize(("name", "crosses_upi"), [("pcie-shared-nic", True), ("eflops", False)])
def test_two_servers_on_a_switch(name: str, crosses_upi: bool) -> None:
    """Inter-server traffic leaves through the GPU's NIC; on the shared-NIC server a socket-1 GPU crosses UPI
    on both ends, on the EFLOPS server it never reaches a CPU."""
    topo, insts = _build(name, servers=2)
    topo.add_node("sw", "switch")
    for inst in insts:
        for n in inst.nics:
            topo.add_link(n, "sw", topo.nodes[n].attrs["bandwidth_bytes_per_s"], 1e-6, "ethernet")
    topo.validate()
    path = _path_nodes(topo, "s0/gpu7", "s1/gpu7")
    assert "sw" in path and path[0] == "s0/gpu7" and path[-1] == "s1/gpu7"
    cpus = [n for n in path if topo.nodes[n].kind is NodeKind.CPU]
    assert (cpus == ["s0/cpu1", "s0/cpu0", "s1/cpu0", "s1/cpu1"]) == crosses_upi
    assert (not cpus) == (not crosses_upi)


# ---- user templates -----------------------------------------------------------------------------------
def _user_dict() -> dict[str, Any]:
    return {
        "name": "tiny", "gpu": "v100",
        "nodes": [
            {"name": "cpu0", "kind": "cpu"},
            {"name": "sw0", "kind": "pcie"},
            {"name": "g0", "kind": "gpu", "nic": "n0"},
            {"name": "g1", "kind": "gpu", "gpu": "v100-16gb", "slot": 3},
            {"name": "n0", "kind": "nic", "link": "eth-25g"},
        ],
        "links": [
            {"a": "cpu0", "b": "sw0", "link": "pcie4-x16"},
            {"a": "sw0", "b": "g0", "bandwidth": "16GB/s", "latency": "200ns"},
            {"a": "sw0", "b": "g1", "link": "pcie3-x16", "latency": "1us"},
            {"a": "sw0", "b": "n0", "link": "pcie3-x16"},
        ],
    }


def test_user_server_dict_round_trip() -> None:
    tpl = server_from_dict(_user_dict())
    assert tpl.name == "tiny" and tpl.gpu == "v100" and tpl.gpu_names == ("g0", "g1")
    links = {(lk.a, lk.b): lk for lk in tpl.links}
    assert links[("sw0", "g0")].bandwidth_bytes_per_s == 16e9 and links[("sw0", "g0")].kind == "pcie"
    assert links[("sw0", "g0")].latency_s == pytest.approx(200e-9)
    assert links[("sw0", "g1")].latency_s == pytest.approx(1e-6)   # explicit latency overrides the type's
    assert links[("cpu0", "sw0")].bandwidth_bytes_per_s == get_link("pcie4-x16").bandwidth_bytes_per_s
    topo, (inst,) = _build(tpl)
    topo.validate()
    assert topo.nodes["s0/n0"].attrs["bandwidth_bytes_per_s"] == 3.125e9
    assert topo.nodes["s0/n0"].attrs["rail"] == 0
    assert topo.nodes["s0/g0"].attrs["nic"] == "s0/n0" and "nic" not in topo.nodes["s0/g1"].attrs
    assert topo.nodes["s0/g1"].attrs["gpu"] == "v100-16gb" and topo.nodes["s0/g1"].attrs["slot"] == 3
    assert topo.router.nic_of("s0/g1") == "s0/n0"
    again = server_from_dict(server_to_dict(tpl))
    assert again == tpl
    via_yaml = server_from_dict(yaml.safe_load(yaml.safe_dump(server_to_dict(tpl))))
    assert via_yaml == tpl
    for t in SERVERS.values():
        assert server_from_dict(server_to_dict(t)) == t


def test_user_server_without_nic_is_fine() -> None:
    d = _user_dict()
    d["nodes"] = [n for n in d["nodes"] if n["kind"] != "nic"]
    del d["nodes"][2]["nic"]
    d["links"] = d["links"][:3]
    tpl = server_from_dict(d)
    assert tpl.nic_names == ()
    topo, _ = _build(tpl)
    topo.validate()


def _mutate(fn: Any) -> dict[str, Any]:
    d = copy.deepcopy(_user_dict())
    fn(d)
    return d


@pytest.mark.parametrize(("mutation", "field", "words"), [
    (lambda d: d.pop("name"), "cluster.server.name", "is required"),
    (lambda d: d.pop("nodes"), "cluster.server.nodes", "is required"),
    (lambda d: d.update(gpu="tpu9"), "cluster.server.gpu", "unknown GPU"),
    (lambda d: d.update(colour="red"), "cluster.server.colour", "unknown key"),
    (lambda d: d["nodes"][1].update(kind="router"), "cluster.server.nodes[1].kind", "unknown value 'router'"),
    (lambda d: d["nodes"][1].update(kind="switch"), "cluster.server.nodes[1].kind", "unknown value 'switch'"),
    (lambda d: d["nodes"][1].update(name="cpu0"), "cluster.server.nodes[1].name", "twice"),
    (lambda d: d["nodes"][1].update(name="a/b"), "cluster.server.nodes[1].name", "bad node name"),
    (lambda d: d["links"][3].update(b="nic9"), "cluster.server.links[3].b", "unknown node"),
    (lambda d: d["links"][0].update(a="x"), "cluster.server.links[0].a", "unknown node"),
    (lambda d: d["links"][0].update(bw="1GB/s"), "cluster.server.links[0].bw", "unknown key"),
    (lambda d: d["links"][1].update(bandwidth="fast"), "cluster.server.links[1].bandwidth", "bandwidth"),
    (lambda d: d["links"][1].update(latency="soon"), "cluster.server.links[1].latency", "duration"),
    (lambda d: d["links"][0].pop("link"), "cluster.server.links[0]", "no bandwidth"),
    (lambda d: d["links"][0].update(link="pcie9"), "cluster.server.links[0].link", "unknown link type"),
    (lambda d: d["links"].append({"a": "g0", "b": "sw0", "link": "pcie3-x16"}), "cluster.server.links[4]",
     "twice"),
    (lambda d: d["links"].append({"a": "g0", "b": "g0", "bandwidth": "1GB/s"}), "cluster.server.links[4].b",
     "itself"),
    (lambda d: d["nodes"].pop(2) and d["nodes"].pop(2) and d["links"].pop(1) and d["links"].pop(1),
     "cluster.server.nodes", "no GPU"),
    (lambda d: d["nodes"][4].pop("link"), "cluster.server.nodes[4].bandwidth", "port speed"),
    (lambda d: d["nodes"][4].update(link="pcie4-x16"), "cluster.server.nodes[4].link", "not a NIC"),
    (lambda d: d["nodes"][4].update(rail=-1), "cluster.server.nodes[4].rail", "rail"),
    (lambda d: d["nodes"][1].update(link="eth-25g"), "cluster.server.nodes[1].link", "NIC port"),
    (lambda d: d["nodes"][2].update(nic="sw0"), "cluster.server.nodes[2].nic", "not a NIC"),
    (lambda d: d["nodes"][3].update(gpu="tpu9"), "cluster.server.nodes[3].gpu", "unknown GPU"),
    (lambda d: d["nodes"][3].update(server="x"), "cluster.server.nodes[3].server", "reserved"),
    (lambda d: d["nodes"].append({"name": "cpu1", "kind": "cpu"}), "cluster.server.links", "disconnected"),
    # g1 hangs off g0 only: g0 reaches g1 directly, but GPUs do not forward, so g1 reaches no NIC
    (lambda d: d["links"].__setitem__(2, {"a": "g0", "b": "g1", "bandwidth": "50GB/s"}),
     "cluster.server.nodes[3]", "cannot reach any NIC"),
    (lambda d: d.update(links=[]), "cluster.server.links", "disconnected"),
])
def test_user_server_errors(mutation: Any, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        server_from_dict(_mutate(mutation))
    assert e.value.field == field, str(e.value)
    assert words in str(e.value)


def test_gpus_must_reach_each_other_and_field_prefix() -> None:
    d = _user_dict()
    # g1 on its own switch with its own NIC, but no path to g0 through forwarding nodes
    d["nodes"] += [{"name": "sw1", "kind": "pcie"}, {"name": "n1", "kind": "nic", "bandwidth": "25Gbps"}]
    d["links"][2] = {"a": "sw1", "b": "g1", "link": "pcie3-x16"}
    d["links"] += [{"a": "sw1", "b": "n1", "link": "pcie3-x16"}, {"a": "n1", "b": "n0", "bandwidth": "1GB/s"}]
    with pytest.raises(ConfigError, match="cannot reach GPU") as e:
        server_from_dict(d, field="servers[2]")
    assert e.value.field.startswith("servers[2].nodes[")
    d["links"].append({"a": "sw1", "b": "cpu0", "link": "pcie3-x16"})
    tpl = server_from_dict(d)  # now joined through the root complex
    topo, (inst,) = _build(tpl)
    assert inst.nics == ("s0/n0", "s0/n1")
    assert topo.nodes["s0/n1"].attrs["bandwidth_bytes_per_s"] == 25e9 / 8
    assert "s0/cpu0" in _path_nodes(topo, "s0/g0", "s0/g1")


# ---- catalogs -----------------------------------------------------------------------------------------
CATALOG = """\
links:
  - {name: my-nic, kind: ethernet, bandwidth: 800Gbps, latency: 0.4us, source: test}
gpus:
  - name: Acme-X1
    vendor: acme
    peak_flops: {bf16: 500TFLOPS, fp32: "40 TFLOP/s", bfloat16: 500e12}
    hbm_bandwidth: 4TB/s
    memory: 96GiB
    sm_count: 100
    boost_clock: 1.5GHz
    tdp: 600W
    nvlink: nvlink4
    aliases: [x1]
    compute_efficiency: {gemm_max_efficiency: 0.7}
    efficiency_source: test
servers:
  - name: acme-box
    gpu: x1
    nodes:
      - {name: sw, kind: pcie}
      - {name: g0, kind: gpu, nic: n0}
      - {name: g1, kind: gpu, nic: n0}
      - {name: n0, kind: nic, link: my-nic}
    links:
      - {a: sw, b: g0, link: pcie5-x16}
      - {a: sw, b: g1, link: pcie5-x16}
      - {a: sw, b: n0, link: pcie5-x16}
"""


def test_load_catalog_from_string(registry: None) -> None:
    cat = load_catalog(CATALOG)
    assert "acme-x1" not in GPUS and "my-nic" not in LINKS  # a value: the built-in catalog is unchanged
    g = cat.gpu("X1")
    assert g is cat.gpu("acme-x1") and g.name == "Acme-X1"
    assert g.peak("bf16") == 500e12 and g.peak("fp32") == 40e12
    assert g.memory_bytes == 96 * GIB and g.hbm_bandwidth_bytes_per_s == 4e12
    assert g.boost_clock_hz == 1.5e9 and g.tdp_w == 600 and g.sm_count == 100 and g.nvlink == "nvlink4"
    assert dict(g.compute_efficiency) == {"gemm_max_efficiency": 0.7} and g.efficiency_source == "test"
    lt = cat.link("my-nic")
    assert lt.bandwidth_bytes_per_s == 100e9 and lt.latency_s == pytest.approx(0.4e-6)
    topo, (inst,) = _build("acme-box", catalog=cat)
    topo.validate()
    assert topo.nodes["s0/g0"].attrs["gpu"] == "Acme-X1"
    assert topo.nodes["s0/n0"].attrs["bandwidth_bytes_per_s"] == 100e9
    again = load_catalog(CATALOG, base=cat)  # identical entries: idempotent
    assert again.gpu("x1") == g
    assert load_catalog(yaml.safe_load(CATALOG)).gpu("x1") == g
    with pytest.raises(ConfigError, match="unknown server template"):
        _build("acme-box")  # not in the built-in catalog


def test_load_catalog_from_file(registry: None, tmp_path: Path) -> None:
    path = tmp_path / "hw.yaml"
    path.write_text(CATALOG)
    assert load_catalog(path).gpu("x1").peak("bf16") == 500e12
    assert load_catalog(str(path)).gpu("x1").peak("bf16") == 500e12
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - name: a\n    peak_flops: {bf16: 1TFLOPS\n  - name: b\n")
    with pytest.raises(ConfigError) as e:
        load_catalog(bad)
    assert "bad.yaml" in str(e.value) and "line " in e.value.message
    bad.write_text("gpus:\n  - {name: q, peak_flops: {bf16: 1TFLOPS}, hbm_bandwidth: 1TB/s, memory: lots}\n")
    with pytest.raises(ConfigError) as e:
        load_catalog(str(bad))
    assert e.value.field == "catalog.gpus[0].memory" and "bad.yaml" in e.value.message
    with pytest.raises(ConfigError, match="missing.yaml: file not found") as e:
        load_catalog(tmp_path / "missing.yaml")
    assert e.value.field == "catalog"


def test_malformed_yaml_string_names_line() -> None:
    with pytest.raises(ConfigError) as e:
        load_catalog("links:\n  - {name: x, kind: pcie\nservers: [\n")
    assert "<string>" in e.value.message and "line 3" in e.value.message


def test_load_catalog_is_all_or_nothing(registry: None) -> None:
    text = CATALOG.replace("nvlink: nvlink4", "nvlink: nvlink9")
    with pytest.raises(ConfigError) as e:
        load_catalog(text)
    assert e.value.field == "catalog.gpus[0].nvlink"
    assert "my-nic" not in LINKS and "acme-x1" not in GPUS
    with pytest.raises(ConfigErrors) as many:
        load_catalog(text.replace("tdp: 600W", "tdp: hot").replace("memory: 96GiB", "memory: 96"))
    assert [p.field for p in many.value.problems] == ["catalog.gpus[0].memory", "catalog.gpus[0].tdp"]
    with pytest.raises(ConfigError) as e:
        load_catalog(CATALOG.replace("gpu: x1", "gpu: x2"))
    assert e.value.field == "catalog.servers[0].gpu" and "my-nic" not in LINKS
    with pytest.raises(ConfigError, match="unknown key"):
        load_catalog("nics: []")
    with pytest.raises(ConfigError, match="catalog.links"):
        load_catalog("links: {name: x}")
    with pytest.raises(ConfigError) as e:
        load_catalog("gpus:\n  - {name: a100, peak_flops: {bf16: 1}, hbm_bandwidth: 1TB/s, memory: 1GiB}\n")
    assert e.value.field == "catalog.gpus[0].name" and "alias" in e.value.message
    with pytest.raises(ConfigError) as e:
        load_catalog("links:\n  - {name: eth-100g, kind: ethernet, bandwidth: 1Gbps}\n")
    assert e.value.field == "catalog.links[0].name" and "already" in e.value.message
    cat = load_catalog("links:\n  - {name: eth-100g, kind: ethernet, bandwidth: 1Gbps}\n", replace=True)
    assert cat.link("eth-100g").bandwidth_bytes_per_s == 1e9 / 8
    assert get_link("eth-100g").bandwidth_bytes_per_s == 12.5e9
