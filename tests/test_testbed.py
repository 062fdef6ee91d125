"""The netns testbed: a real emulated run against the flow model, teardown, clean(); pure helpers.

Tests that create namespaces give each emulation a run tag of their own (:func:`fresh_tag`) and check the
correctness and cleanup of what they created only, so that other testbed runs on the same machine (a
second test suite, a benchmark) neither fail them nor are touched by them. How close measured times come
to the predictions is a benchmark's figure (``benchmarks/testbed_checks.py``), not a test's assertion.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

import pytest

from topotrain.network.params import NetworkParams
from topotrain.testbed.compare import MiB, calibrate_alpha, predict, single_switch, small_bigraph
from topotrain.testbed.netns import Emulation, clean, leftovers, netns_available
from topotrain.testbed.runs import MAX_TAG_LEN, fresh_tag
from topotrain.testbed.worker import topology_from_dict, topology_to_dict
from topotrain.util.errors import ConfigError

_OK, _WHY = netns_available()
needs_netns = pytest.mark.skipif(not _OK, reason=f"needs root and working `ip netns`: {_WHY}")


@pytest.fixture
def tag() -> str:
    """This test's own run tag: the prefix of every namespace and veth it creates."""
    return fresh_tag()


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
    measured = predict(t, NetworkParams(400e-6), "ring", 4096, "flow")
    # ring allreduce on 4 ranks: 2(p-1) = 6 rounds, each alpha + (S/p)/B
    assert measured == pytest.approx(6 * (400e-6 + 1024 / 25e6), rel=1e-6)
    assert calibrate_alpha(t, NetworkParams(0.0), "ring", 4096, measured) == pytest.approx(400e-6, rel=1e-6)


def test_calibrate_alpha_of_the_eager_shared_cpu_model_recovers_its_overhead() -> None:
    t = single_switch(4, bw=25e6, lat=0.0)
    measured = predict(t, NetworkParams(300e-6, shared_cpu_cores=2), "ring", 4096, "flow-eager")
    # 6 rounds; in each all 4 ranks do their 300 us of CPU at once on 2 cores: 600 us
    assert measured == pytest.approx(6 * (2 * 300e-6 + 1024 / 25e6), rel=1e-6)
    shared = NetworkParams(0.0, shared_cpu_cores=2)
    assert calibrate_alpha(t, shared, "ring", 4096, measured, "flow-eager") == pytest.approx(300e-6, rel=1e-6)
    assert calibrate_alpha(t, shared, "ring", 4096, 1e-6, "flow-eager") == 0.0  # faster than alpha 0 allows


def test_run_tags_name_one_run_exactly() -> None:
    from topotrain.testbed.runs import of_run

    a = fresh_tag()
    assert a.startswith("tt-") and len(a) <= MAX_TAG_LEN and fresh_tag() != a
    assert of_run(f"{a}-h0", a) and of_run(f"{a}-s12", a) and of_run(f"{a}e7b", a)
    # a run whose tag starts like ours is another run
    assert not of_run(f"{a}e1-h0", a) and not of_run(f"{a}x-h0", a) and not of_run(f"{a}e1e0a", a)
    assert not of_run(f"{a}-h0", a + "e1")
    for bad in ("xx-abc", "tt-", "tt-ABC", "tt-a-b", "tt-" + "a" * MAX_TAG_LEN):
        with pytest.raises(ConfigError, match="run tag"):
            Emulation(single_switch(2), tag=bad)


# ---- need root + netns ---------------------------------------------------------------------------
@needs_netns
def test_ring_on_emulated_single_switch_is_correct_and_tears_down(tag: str) -> None:
    from topotrain.testbed.compare import run_case

    topo = single_switch(4)  # 100 Gb/s links, emulated at 1/500: 25 MB/s
    res = run_case(topo, ["ring"], [1 * MiB], scale=1 / 500, repeats=1, timeout_s=60,
                   emulation_options={"tag": tag})
    row = next(r for r in res if r.size_bytes == 1 * MiB)
    assert row.correct
    # bandwidth term alone: 2(p-1)/p * S / B = 1.5 * 1 MiB / 25 MB/s = 63 ms
    assert row.flow_s > 1.5 * MiB / 25e6
    assert math.isfinite(row.measured_s) and row.measured_s > 0
    assert math.isfinite(row.eager_s) and row.eager_s > 0
    assert math.isfinite(row.alpha_s) and row.alpha_s >= 0
    assert not leftovers(tag)


def test_shaping_commands_put_small_tcp_segments_first_within_the_link_rate() -> None:
    from topotrain.testbed.shaping import shaping_commands

    plain = shaping_commands("d0", 200_000_000, 3028, "pfifo limit 1000", ack_priority=False)
    assert len(plain) == 3 and "rate 200000000bit" in plain[1] and "parent 1:1 handle 10: pfifo" in plain[2]
    prio = shaping_commands("d0", 200_000_000, 3028, "pfifo limit 1000", ack_priority=True)
    ack = next(c for c in prio if "classid 1:10" in c)
    data = next(c for c in prio if "classid 1:20" in c)
    assert "prio 0" in ack and "prio 1" in data
    assert "ceil 200000000bit" in ack and "ceil 200000000bit" in data  # either may use the whole link
    rates = [int(c.split(" rate ")[1].split("bit")[0]) for c in (ack, data)]
    assert sum(rates) == 200_000_000  # the children share the parent's rate, no more
    assert "default 20" in prio[0]  # unclassified traffic is data
    assert any("u32" in c and "flowid 1:10" in c and "0xff80 at 2" in c for c in prio)


@needs_netns
def test_emulated_links_have_ack_priority_and_a_small_bucket(tag: str) -> None:
    with Emulation(single_switch(2), tag=tag) as emu:
        ns, dev = emu.shapes[0].namespace, emu.shapes[0].device
        assert ns.startswith(tag)
        classes = subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev], capture_output=True,
                                 text=True).stdout
        filters = subprocess.run(["tc", "-n", ns, "filter", "show", "dev", dev], capture_output=True,
                                 text=True).stdout
    assert "1:10" in classes and "1:20" in classes and "flowid 1:10" in filters
    assert emu.burst_bytes == 3028
    assert not leftovers(tag)


@needs_netns
def test_emulation_context_removes_its_namespaces(tag: str) -> None:
    with Emulation(single_switch(2), tag=tag) as emu:
        names = list(emu.namespace.values())
        assert all(n.startswith(tag) for n in names)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(n in listed for n in names)
        assert set(names) <= set(leftovers(tag))
        assert emu.measure_rate(0, 1, 200_000) > 0  # data flows between the hosts
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
    assert not leftovers(tag)


def _plant(tag: str) -> set[str]:
    """A namespace and a veth pair named as the run ``tag`` names them, as a crashed run leaves them."""
    subprocess.run(["ip", "netns", "add", f"{tag}-h0"], check=True)
    subprocess.run(["ip", "link", "add", f"{tag}e0a", "type", "veth", "peer", "name", f"{tag}e0b"], check=True)
    return {f"{tag}-h0", f"{tag}e0a", f"{tag}e0b"}


@needs_netns
def test_clean_removes_the_leftovers_of_one_run_only(tag: str) -> None:
    other = fresh_tag()
    try:
        mine, theirs = _plant(tag), _plant(other)
        assert set(leftovers(tag)) == mine and set(leftovers(other)) == theirs
        removed = clean(tag)
        assert f"{tag}-h0" in removed and ({f"{tag}e0a", f"{tag}e0b"} & set(removed))
        assert not set(removed) & theirs
        assert not leftovers(tag) and set(leftovers(other)) == theirs  # the other run's are still there
    finally:
        clean(other)
    assert not leftovers(other)


@needs_netns
def test_sigterm_tears_the_emulation_down(tag: str) -> None:
    import signal

    code = ("import time\nfrom topotrain.testbed.compare import single_switch\n"
            "from topotrain.testbed.netns import Emulation\n"
            f"with Emulation(single_switch(2), tag={tag!r}):\n    print('up', flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        assert leftovers(tag)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) != 0
    finally:
        if p.poll() is None:
            p.kill()
    assert not leftovers(tag)


_UNSHARE = shutil.which("unshare")

#: Run in a sandbox (see :func:`_sandboxed`): the CLI's compare, then clean on planted leftovers.
_CLI_IN_SANDBOX = """
import json, subprocess
from typer.testing import CliRunner
from topotrain.cli import app
from topotrain.testbed.netns import leftovers
cli = CliRunner()
compare = cli.invoke(app, ["testbed", "compare", "--cases", "single-switch", "--algo", "ring",
                           "--sizes", "512KiB", "--repeats", "1"])
after_compare = leftovers()
subprocess.run(["ip", "netns", "add", "tt-zz-h0"], check=True)
subprocess.run(["ip", "link", "add", "tt-zze0a", "type", "veth", "peer", "name", "tt-zze0b"], check=True)
planted = leftovers()
clean = cli.invoke(app, ["testbed", "clean"])
print(json.dumps({"compare": [compare.exit_code, compare.output], "after_compare": after_compare,
                  "planted": planted, "clean": [clean.exit_code, clean.output], "after_clean": leftovers()}))
"""


def _sandboxed(argv: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` where the only namespaces and links are those it makes: a private network namespace
    and a private mount namespace with its own ``/run/netns``. A command that acts on every testbed
    leftover (``topotrain testbed clean``) can run there without touching other runs'."""
    assert _UNSHARE is not None
    setup = "mkdir -p /run/netns && mount -t tmpfs tt-sandbox /run/netns && ip link set lo up && exec \"$@\""
    return subprocess.run([_UNSHARE, "--mount", "--net", "--propagation", "private", "sh", "-ec", setup, "sh",
                           *argv], capture_output=True, text=True, timeout=timeout_s)


@needs_netns
@pytest.mark.skipif(_UNSHARE is None, reason="needs unshare(1)")
def test_cli_testbed_compare_and_clean() -> None:
    import json

    from typer.testing import CliRunner

    from topotrain.cli import app

    res = _sandboxed([sys.executable, "-c", _CLI_IN_SANDBOX])
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    code, out = got["compare"]
    assert code == 0, out
    assert "ring" in out and "|error| flow" in out
    assert got["after_compare"] == []  # the run removed all it made
    assert sorted(got["planted"]) == ["tt-zz-h0", "tt-zze0a", "tt-zze0b"]
    code, out = got["clean"]
    assert code == 0 and "removed 2 leftover(s): tt-zz-h0, tt-zze0" in out  # the namespace, one end of the pair
    assert got["after_clean"] == []
    bad = CliRunner().invoke(app, ["testbed", "compare", "--cases", "nope"])
    assert bad.exit_code == 2 and "unknown case" in bad.output


@needs_netns
def test_ddp_training_on_the_emulated_cluster_matches_gloo(tag: str) -> None:
    from topotrain.testbed.compare import run_ddp

    res = run_ddp(single_switch(4), ["ring"], steps=2, width=64, batch=16, timeout_s=120,
                  emulation_options={"tag": tag})
    ours, ref = {r.algorithm: r for r in res}["ring"], {r.algorithm: r for r in res}["gloo"]
    assert ours.replicas_equal and ref.replicas_equal
    assert math.isfinite(ours.loss_last) and ours.loss_last < ours.loss_first  # it trains
    # same seeded model and data: averaging with our ring or with gloo gives the same parameters up to
    # floating-point summation order
    assert ours.checksum == pytest.approx(ref.checksum, rel=1e-5, abs=1e-4)
    params = 64 * 64 * 2 + 64 * 2 + 64 * 10 + 10
    assert sum(ours.bucket_bytes) == 4 * params  # every gradient went through our hook, once per step
    assert math.isfinite(ours.step_s) and ours.step_s > 0 and math.isfinite(ours.eager_s) and ours.eager_s > 0
    assert not leftovers(tag)
