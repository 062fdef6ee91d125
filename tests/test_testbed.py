"""The netns testbed: a real emulated run against the flow model, teardown, clean(); pure helpers."""

from __future__ import annotations

import math
import os
import subprocess

import pytest

from topotrain.testbed.compare import MiB, calibrate_alpha, predict, single_switch, small_bigraph
from topotrain.testbed.netns import Emulation, clean, leftovers, netns_available
from topotrain.testbed.worker import topology_from_dict, topology_to_dict

_OK, _WHY = netns_available()
needs_netns = pytest.mark.skipif(not _OK, reason=f"needs root and working `ip netns`: {_WHY}")


# ---- always run ----------------------------------------------------------------------------------
def test_topology_json_round_trip_keeps_links_and_routes() -> None:
    t = small_bigraph()
    u = topology_from_dict(topology_to_dict(t))
    assert [(lk.src, lk.dst, lk.bandwidth_bytes_per_s, lk.latency_s) for lk in u.links] == \
        [(lk.src, lk.dst, lk.bandwidth_bytes_per_s, lk.latency_s) for lk in t.links]
    assert u.meta["bigraph"] == t.meta["bigraph"]
    for a in t.gpus:
        for b in t.gpus:
            assert u.route(a, b) == t.route(a, b)


def test_scaled_topology_scales_bandwidth_and_latency() -> None:
    t = single_switch(4, bw=12.5e9, lat=2e-6)
    s = Emulation(t, bandwidth_scale=1 / 500, latency_scale=3.0).scaled_topology()
    # TCP payload over 1500-byte-MTU Ethernet frames: 1448 of every 1514 shaped bytes
    assert s.capacity_bytes_per_s == pytest.approx(t.capacity_bytes_per_s / 500 * 1448 / 1514)
    assert s.latency_s == pytest.approx(t.latency_s * 3.0)
    assert [lk.src for lk in s.links] == [lk.src for lk in t.links]


def test_calibrate_alpha_recovers_the_overhead() -> None:
    t = single_switch(4, bw=25e6, lat=0.0)
    t.message_overhead_s = 400e-6
    measured = predict(t, "ring", 4096, "flow")
    # ring allreduce on 4 ranks: 2(p-1) = 6 rounds, each alpha + (S/p)/B
    assert measured == pytest.approx(6 * (400e-6 + 1024 / 25e6), rel=1e-6)
    t.message_overhead_s = 0.0
    assert calibrate_alpha(t, "ring", 4096, measured) == pytest.approx(400e-6, rel=1e-6)
    assert t.message_overhead_s == 0.0


def test_calibrate_alpha_of_the_eager_shared_cpu_model_recovers_its_overhead() -> None:
    t = single_switch(4, bw=25e6, lat=0.0)
    t.meta["shared_cpu_cores"] = 2
    t.message_overhead_s = 300e-6
    measured = predict(t, "ring", 4096, "flow-eager")
    # 6 rounds; in each all 4 ranks do their 300 us of CPU at once on 2 cores: 600 us
    assert measured == pytest.approx(6 * (2 * 300e-6 + 1024 / 25e6), rel=1e-6)
    t.message_overhead_s = 0.0
    assert calibrate_alpha(t, "ring", 4096, measured, "flow-eager") == pytest.approx(300e-6, rel=1e-6)
    assert calibrate_alpha(t, "ring", 4096, 1e-6, "flow-eager") == 0.0  # faster than alpha 0 allows
    assert t.message_overhead_s == 0.0


# ---- need root + netns ---------------------------------------------------------------------------
@needs_netns
def test_ring_on_emulated_single_switch_matches_flow_and_tears_down() -> None:
    from topotrain.testbed.compare import run_case

    topo = single_switch(4)  # 100 Gb/s links, emulated at 1/500: 25 MB/s
    res = run_case(topo, ["ring"], [2 * MiB], scale=1 / 500, repeats=2, timeout_s=60)
    row = next(r for r in res if r.size_bytes == 2 * MiB)
    assert row.correct
    # bandwidth term alone: 2(p-1)/p * S / B = 1.5 * 2 MiB / 25 MB/s = 126 ms
    assert row.flow_s > 1.5 * 2 * MiB / 25e6
    assert 0.5 <= row.measured_s / row.flow_s <= 2.0, row
    assert 0.5 <= row.measured_s / row.eager_s <= 2.0, row
    assert math.isfinite(row.alpha_s) and row.alpha_s >= 0
    mine = f"tt-{os.getpid() & 0xFFFF:04x}"  # the tag prefix of every Emulation of this process
    assert not [n for n in leftovers() if n.startswith(mine)]


def test_shaping_commands_put_small_tcp_segments_first_within_the_link_rate() -> None:
    from topotrain.testbed.netns import _shaping_commands

    plain = _shaping_commands("d0", 200_000_000, 3028, "pfifo limit 1000", ack_priority=False)
    assert len(plain) == 3 and "rate 200000000bit" in plain[1] and "parent 1:1 handle 10: pfifo" in plain[2]
    prio = _shaping_commands("d0", 200_000_000, 3028, "pfifo limit 1000", ack_priority=True)
    ack = next(c for c in prio if "classid 1:10" in c)
    data = next(c for c in prio if "classid 1:20" in c)
    assert "prio 0" in ack and "prio 1" in data
    assert "ceil 200000000bit" in ack and "ceil 200000000bit" in data  # either may use the whole link
    rates = [int(c.split(" rate ")[1].split("bit")[0]) for c in (ack, data)]
    assert sum(rates) == 200_000_000  # the children share the parent's rate, no more
    assert "default 20" in prio[0]  # unclassified traffic is data
    assert any("u32" in c and "flowid 1:10" in c and "0xff80 at 2" in c for c in prio)


@needs_netns
def test_emulated_links_have_ack_priority_and_a_small_bucket() -> None:
    with Emulation(single_switch(2)) as emu:
        ns, dev = emu.shapes[0].namespace, emu.shapes[0].device
        classes = subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev], capture_output=True,
                                 text=True).stdout
        filters = subprocess.run(["tc", "-n", ns, "filter", "show", "dev", dev], capture_output=True,
                                 text=True).stdout
    assert "1:10" in classes and "1:20" in classes and "flowid 1:10" in filters
    assert emu.burst_bytes == 3028


@needs_netns
def test_emulation_context_removes_its_namespaces() -> None:
    with Emulation(single_switch(2)) as emu:
        names = list(emu.namespace.values())
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(n in listed for n in names)
        rate = emu.measure_rate(0, 1, 1_000_000)
        assert 0.6 * 25e6 <= rate <= 1.4 * 25e6  # 100 Gb/s / 500
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)


@needs_netns
def test_clean_removes_planted_leftovers() -> None:
    ns = f"tt-planted{os.getpid() % 10000}"
    veth = f"tt-pl{os.getpid() % 10000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", veth + "a", "type", "veth", "peer", "name", veth + "b"], check=True)
    assert ns in leftovers()
    removed = clean()
    assert ns in removed
    assert veth + "a" in removed or veth + "b" in removed
    assert not [n for n in leftovers() if n in (ns, veth + "a", veth + "b")]


@needs_netns
def test_sigterm_tears_the_emulation_down() -> None:
    import signal
    import sys

    code = ("import time\nfrom topotrain.testbed.compare import single_switch\n"
            "from topotrain.testbed.netns import Emulation\n"
            "with Emulation(single_switch(2)):\n    print('up', flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        tag = f"tt-{p.pid & 0xFFFF:04x}"
        assert [n for n in leftovers() if n.startswith(tag)]
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) != 0
    finally:
        if p.poll() is None:
            p.kill()
    assert not [n for n in leftovers() if n.startswith(tag)]


@needs_netns
def test_cli_testbed_compare_and_clean() -> None:
    from typer.testing import CliRunner

    from topotrain.cli import app

    res = CliRunner().invoke(app, ["testbed", "compare", "--cases", "single-switch", "--algo", "ring",
                                   "--sizes", "512KiB", "--repeats", "1"])
    assert res.exit_code == 0, res.output
    assert "ring" in res.output and "|error| flow" in res.output
    assert not leftovers()
    res = CliRunner().invoke(app, ["testbed", "clean"])
    assert res.exit_code == 0 and "removed 0" in res.output
    bad = CliRunner().invoke(app, ["testbed", "compare", "--cases", "nope"])
    assert bad.exit_code == 2 and "unknown case" in bad.output


@needs_netns
def test_ddp_training_on_the_emulated_cluster_matches_gloo_and_the_prediction() -> None:
    from topotrain.testbed.compare import run_ddp

    res = run_ddp(single_switch(4), ["ring"], steps=2, width=64, batch=16, timeout_s=120)
    ours, ref = {r.algorithm: r for r in res}["ring"], {r.algorithm: r for r in res}["gloo"]
    assert ours.replicas_equal and ref.replicas_equal
    assert math.isfinite(ours.loss_last) and ours.loss_last < ours.loss_first  # it trains
    # same seeded model and data: averaging with our ring or with gloo gives the same parameters up to
    # floating-point summation order
    assert ours.checksum == pytest.approx(ref.checksum, rel=1e-5, abs=1e-4)
    params = 64 * 64 * 2 + 64 * 2 + 64 * 10 + 10
    assert sum(ours.bucket_bytes) == 4 * params  # every gradient went through our hook, once per step
    assert 1 / 3 <= ours.step_s / ours.eager_s <= 3.0, ours
    mine = f"tt-{os.getpid() & 0xFFFF:04x}"
    assert not [n for n in leftovers() if n.startswith(mine)]
