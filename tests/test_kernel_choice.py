"""The flow network's kernels interpreted and compiled give the same bits (network/kernel_choice.py), a process
moves from the first to the second between two events without a change, and the link floor that lets ``auto``
skip what cannot win (network/floor.py) is below every time the models give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import topotrain as tt
from test_network_properties import _run_staggered  # the simulator driven as run_concurrent drives it
from topotrain.collectives.protocol import comm_library, on_the_wire
from topotrain.collectives.registry import algorithms_for, build_schedule
from topotrain.collectives.schedule import Schedule
from topotrain.network import flow_rates
from topotrain.network import kernel_choice as kc
from topotrain.network.floor import link_floor_s
from topotrain.network.flow import FlowModel
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.topology.graph import Topology

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SRC = Path(__file__).resolve().parent.parent / "src"


def _staggered(topo: Topology, jobs: list[tuple[Schedule, float]]) -> tuple[list[list[float]], list[float]]:
    """(per job: start, finish, phase finishes; link bytes) of jobs sharing one flow simulator, as lists (compared
    with ``==``)."""
    timings, link_bytes = _run_staggered(topo, jobs)
    return [t.tolist() for t in timings], link_bytes.tolist()


def _contended() -> tuple[Topology, list[tuple[Schedule, float]]]:
    c = cluster_from_dict({"server": "dgx-a100", "servers": 4, "network": {
        "topology": "leaf-spine", "oversubscription": 4, "link": "ib-hdr-200g"}})
    g = c.topology.gpus
    return c.topology, [(build_schedule("allreduce", a, c.topology, g[i::4], 2**22 + 4096 * i + 3), 2e-5 * i)
                        for i, a in enumerate(("ring", "tree", "halving-doubling", "ring"))]


def test_interpreted_kernels_equal_compiled_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contended collectives started at different times on a 4:1 leaf-spine (partial refills, compositions, the
    departure loop): every phase finish and link byte the same float, interpreted and compiled."""
    topo, jobs = _contended()
    monkeypatch.setenv("TOPOTRAIN_KERNEL", "numba")
    compiled = _staggered(topo, jobs)
    monkeypatch.setenv("TOPOTRAIN_KERNEL", "python")
    before = kc.spent()
    interpreted = _staggered(topo, jobs)
    assert kc.spent() > before  # it did run interpreted
    assert interpreted == compiled
    monkeypatch.setenv("TOPOTRAIN_KERNEL", "numpy")  # the numpy path: equal to rounding only (a sanity check)
    numpy_path = _staggered(topo, jobs)
    np.testing.assert_allclose(np.concatenate([np.array(a) for a in numpy_path[0]]),
                               np.concatenate([np.array(a) for a in compiled[0]]), rtol=1e-12)


def test_component_search_skipping_private_links_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The component search leaves unwalked a link whose list holds only the entry that reached it
    (flow_kernel._mark_links): interpreted with a search that walks every link instead, and with the real one,
    every phase finish and link byte equal the compiled run's, and the real one marked fewer links."""
    from topotrain.network import flow_kernel as fk

    topo, jobs = _contended()
    monkeypatch.setenv("TOPOTRAIN_KERNEL", "numba")
    compiled = _staggered(topo, jobs)
    skipping = fk._mark_links
    marked = {"every": 0, "skipping": 0}

    def every_link(first: int, n: int, el_all: np.ndarray, l_mask: np.ndarray, l_set: np.ndarray, n_l: int,
                   head: np.ndarray, nxt: np.ndarray) -> int:
        for e in range(first, first + n):
            if not l_mask[el_all[e]]:
                l_mask[el_all[e]] = True
                l_set[n_l] = el_all[e]
                n_l += 1
                marked["every"] += 1
        return n_l

    def counted(first: int, n: int, el_all: np.ndarray, l_mask: np.ndarray, l_set: np.ndarray, n_l: int,
                head: np.ndarray, nxt: np.ndarray) -> int:
        out = skipping(first, n, el_all, l_mask, l_set, n_l, head, nxt)
        marked["skipping"] += out - n_l
        return int(out)

    monkeypatch.setenv("TOPOTRAIN_KERNEL", "python")
    runs = {}
    for name, fn in (("every", every_link), ("skipping", counted)):
        monkeypatch.setattr(fk, "_mark_links", fn)
        monkeypatch.setattr(kc, "_INTERPRETED", [])  # the interpreted kernels copied again, with this search
        runs[name] = _staggered(topo, jobs)
    assert runs["every"] == compiled and runs["skipping"] == compiled
    assert 0 < marked["skipping"] < marked["every"]


def test_moving_to_compiled_between_events_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a small budget, networks start interpreted and move to the compiled kernels mid-run: the same bits as
    compiled throughout."""
    topo, jobs = _contended()
    monkeypatch.setenv("TOPOTRAIN_KERNEL", "numba")
    compiled = _staggered(topo, jobs)
    monkeypatch.delenv("TOPOTRAIN_KERNEL")
    moved: list[bool] = []
    use = flow_rates.FlowRates._use_kernels

    def spy(self: flow_rates.FlowRates, ks: kc.KernelSet | None) -> None:
        moved.append(ks is not None and ks.compiled)
        use(self, ks)

    monkeypatch.setattr(flow_rates.FlowRates, "_use_kernels", spy)
    monkeypatch.setattr(kc, "_SPENT", [0])
    monkeypatch.setattr(kc, "INTERPRETED_BUDGET", 3000)
    assert _staggered(topo, jobs) == compiled
    assert moved[0] is False and True in moved  # started interpreted, moved on


@pytest.mark.parametrize("cluster", ["dgx-a100-rail.yaml", "custom-graph.yaml"])
def test_collectives_interpreted_equal_compiled(monkeypatch: pytest.MonkeyPatch, cluster: str) -> None:
    """``time_collective`` (every op, auto) reports the same, interpreted and compiled."""
    c = tt.load_cluster(EXAMPLES / cluster)
    out = {}
    for mode in ("numba", "python"):
        monkeypatch.setenv("TOPOTRAIN_KERNEL", mode)
        before = kc.spent()
        out[mode] = [tt.time_collective(c, op, "auto", size).to_dict()
                     for op in ("allreduce", "allgather", "alltoall") for size in (4096, 2**24 + 7)]
        assert (kc.spent() > before) == (mode == "python")
    assert out["python"] == out["numba"]


def test_simulate_interpreted_equals_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training iteration (overlapped buckets, the job accounting) the same, interpreted and compiled."""
    sc = tt.load_scenario(EXAMPLES / "resnet50-eflops.yaml", ["network=flow", "cluster.servers=2"])
    got = {}
    for mode in ("numba", "python"):
        monkeypatch.setenv("TOPOTRAIN_KERNEL", mode)
        before = kc.spent()
        r = tt.simulate(sc)
        assert (kc.spent() > before) == (mode == "python")
        got[mode] = (r.iteration_time_s, r.breakdown.to_dict(), r.link_utilization_top)
    assert got["python"] == got["numba"]


def test_a_small_collective_loads_no_compiled_kernel(tmp_path: Path) -> None:
    """A 16-GPU collective in a fresh process runs interpreted: numba is never imported."""
    f = tmp_path / "c16.yaml"
    f.write_text("cluster:\n  server: nvswitch-8\n  servers: 2\n"
                 "  network: {topology: single_switch, link: ib-hdr-200g}\n")
    code = ("import sys, topotrain as tt; c = tt.load_cluster(sys.argv[1]); "
            "r = tt.time_collective(c, 'allreduce', 'auto', '256MiB'); "
            "print(r.algorithm, 'numba' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}).stdout.split()
    assert out == ["hierarchical", "False", "False"]


@pytest.mark.parametrize("cluster", ["eflops-bigraph.yaml", "shared-nic-bigraph.yaml", "custom-graph.yaml"])
def test_link_floor_is_below_every_time(cluster: str) -> None:
    """For every op and algorithm on the example clusters, at two sizes: the link floor is at most the flow and the
    analytical time (it is a bound), and close to it where one link decides (not a bound that cannot prune)."""
    c = tt.load_cluster(EXAMPLES / cluster)
    topo, params = c.topology, c.network_params
    ratios = []
    for op in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
        for size in (1024, 2**26 + 5):
            for algo in algorithms_for(op):
                try:
                    s = on_the_wire(build_schedule(op, algo, topo, topo.gpus, size,
                                                   message_overhead_s=params.message_overhead_s), topo,
                                    library=comm_library("nccl"))
                except tt.ConfigError:
                    continue
                floor = link_floor_s(s, topo, params)
                for model in ("flow", "analytical"):
                    t = tt.time_schedule(s, c, model).time_s
                    assert floor <= t, (op, size, algo, model, floor, t)
                    ratios.append(floor / t)
    assert max(ratios) > 0.99


def test_auto_answers_as_if_every_algorithm_were_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` with the link floor gives the answer of timing every candidate (floors off), on a physical ring
    where the floor skips tree and halving-doubling."""
    c = tt.load_cluster({"server": "single-gpu", "servers": 64,
                         "network": {"topology": "ring", "link": "eth-100g", "latency": "1us"}})
    with_floor = [tt.time_collective(c, op, "auto", size).to_dict()
                  for op in ("allreduce", "allgather") for size in (4096, 2**24)]
    monkeypatch.setattr(FlowModel, "floor_s", lambda self, s, topo=None: 0.0)
    assert [tt.time_collective(c, op, "auto", size).to_dict()
            for op in ("allreduce", "allgather") for size in (4096, 2**24)] == with_floor
