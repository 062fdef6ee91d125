"""The compiled departure loop (``flow_kernel._steps``: one pass per event for the step, the bytes added in the pass
that reads the new rates) gives the bits of the event-by-event path (``_step`` then ``_recompute`` per event, the
step's bytes flushed in a pass of their own), on hashed (ECMP) traffic over a partly filled fat-tree, where flows
sharing uplinks unevenly leave at many different instants."""

from __future__ import annotations

import numpy as np
import pytest

from test_network_properties import _run_staggered  # the simulator driven as run_concurrent drives it
from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import Schedule
from topotrain.network import flow_rates
from topotrain.network.kernel_choice import KernelSet
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.topology.graph import Topology


def _hashed() -> tuple[Topology, list[tuple[Schedule, float]]]:
    """Five rings of 8 GPUs strided across 7 DGX-style servers (a k = 4 fat-tree filled in part: hashing shares
    its uplinks unevenly), started at different times with sizes a few bytes apart."""
    c = cluster_from_dict({"server": "nvswitch-8", "servers": 7, "network": {
        "topology": "fat-tree", "link": "ib-hdr-200g", "routing": "ecmp"}})
    g = c.topology.gpus
    jobs = [(build_schedule("allreduce", "ring", c.topology, g[i::5][:8], 2**22 + 4099 * i + 1), 3e-5 * i)
            for i in range(5)]
    return c.topology, jobs


def _run(topo: Topology, jobs: list[tuple[Schedule, float]], loop: bool,
         counts: dict[str, int]) -> tuple[list[list[float]], list[float]]:
    """(per job: start, finish, phase finishes; link bytes), with the compiled departure loop or without it."""
    use = flow_rates.FlowRates._use_kernels

    def kernels(self: flow_rates.FlowRates, ks: KernelSet | None) -> None:
        use(self, ks)
        if self._k_steps is not None:
            steps = self._k_steps if loop else None

            def counted(*args: object) -> tuple[object, ...]:
                counts["loop"] = counts.get("loop", 0) + 1
                assert steps is not None
                return steps(*args)  # type: ignore[no-any-return]

            self._k_steps = counted if loop else None

    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("TOPOTRAIN_KERNEL", "numba")
        mp.setattr(flow_rates.FlowRates, "_use_kernels", kernels)
        timings, link_bytes = _run_staggered(topo, jobs)
    finally:
        mp.undo()
    return [t.tolist() for t in timings], link_bytes.tolist()


def test_departure_loop_equals_event_by_event_bit_for_bit() -> None:
    topo, jobs = _hashed()
    counts: dict[str, int] = {}
    looped = _run(topo, jobs, True, counts)
    assert counts.get("loop", 0) > 10  # the loop ran
    stepped = _run(topo, jobs, False, {})
    assert looped == stepped
    assert len({t[1] for t in looped[0]}) == len(jobs)  # the rings end apart
    assert sum(looped[1]) > 0 and np.isfinite(looped[1]).all()


def test_deferred_rate_computation_equals_computing_at_once() -> None:
    """A launch's rate computation left for the next stepping call (``FlowNetwork.defer_rates``: nothing can happen
    before it) gives the bits of computing it at once, on the hashed rings, and it does happen. (Its corner cases —
    a departure within the bound, a start at the same instant before the next stepping call — do not arise in this
    small case: checked by mutation, they pass here; ``benchmarks/checkset.py`` covers the large plans.)"""
    from topotrain.network.flow import FlowSim
    from topotrain.network.flow_network import FlowNetwork

    topo, jobs = _hashed()
    defer = FlowNetwork.defer_rates
    deferred: list[bool] = []

    def counted(self: FlowNetwork, to_s: float) -> bool:
        deferred.append(defer(self, to_s))
        return deferred[-1]

    with pytest.MonkeyPatch.context() as mp:  # (phases started from Python: chained ones need no deferral)
        mp.setattr(FlowSim, "_chain", lambda self, jid, job, batch: None)
        mp.setattr(FlowNetwork, "defer_rates", counted)
        lazy = _run(topo, jobs, True, {})
    assert sum(deferred) > 10
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FlowSim, "_chain", lambda self, jid, job, batch: None)
        mp.setattr(FlowNetwork, "defer_rates", lambda self, to_s: False)
        eager = _run(topo, jobs, True, {})
    assert lazy == eager


def _twins_and_hashed() -> tuple[Topology, list[tuple[Schedule, float]]]:
    """The hashed rings, and two more rings inside servers 0 and 6 with equal sizes started together: their phases
    end at the same instants (two jobs completing at one instant), on links no hashed ring crosses."""
    topo, jobs = _hashed()
    g = topo.gpus
    twins = [(build_schedule("allreduce", "ring", topo, g[s * 8:s * 8 + 8], 2**21 + 3), 1e-5) for s in (0, 6)]
    return topo, jobs[:1] + twins + jobs[1:]  # (in start order: the twins are jobs 1 and 2)


def _run_chained(chain: bool, counts: dict[str, int]) -> tuple[list[list[float]], list[float], list[int]]:
    """:func:`_run` of :func:`_twins_and_hashed` with a ring's next phases chained into the compiled loop or not,
    and every flow's job (the flow ids the starts took)."""
    from topotrain.network.flow import FlowSim
    from topotrain.network.flow_network import FlowNetwork

    topo, jobs = _twins_and_hashed()
    replay = FlowSim._chained

    def chained(jobs: dict[int, object], times: list[float], jids: list[int]) -> None:
        counts["chained"] = counts.get("chained", 0) + len(times)
        counts["together"] = counts.get("together", 0) + len(times) - len(set(times))
        replay(jobs, times, jids)  # type: ignore[arg-type]

    nets: list[FlowNetwork] = []
    init = FlowSim.__init__

    def opened(self: FlowSim, *args: object) -> None:
        init(self, *args)  # type: ignore[arg-type]
        nets.append(self.net)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FlowSim, "_chained", staticmethod(chained))
        mp.setattr(FlowSim, "__init__", opened)
        if not chain:
            mp.setattr(FlowSim, "_chain", lambda self, jid, job, batch: None)
        timings, link_bytes = _run(topo, jobs, True, counts)
    net = nets[-1]
    return timings, link_bytes, net._flow_job[: net._num_flows].tolist()


def test_chained_phases_equal_phases_started_from_python() -> None:
    """A ring's next phases started inside the compiled departure loop (``flow_chain``) give the bits of starting
    each from FlowSim: every phase end and link byte equal, with most phase starts chained, some of them two jobs'
    at one instant (the job heap's order), and the memo of a batch that starts alone."""
    on: dict[str, int] = {}
    chained = _run_chained(True, on)
    phases = sum(len(t) - 2 for t in chained[0])
    assert on.get("chained", 0) > phases // 2  # most phases started in the loop
    assert on.get("together", 0) > 5  # the twins' phases started at one instant, in the loop
    off: dict[str, int] = {}
    python = _run_chained(False, off)
    assert off.get("chained", 0) == 0
    assert on["loop"] < off["loop"]  # fewer returns from the loop
    assert chained == python  # (the jobs of the flow ids too: the starts at one instant in the job heap's order)


def test_chain_pool_rebuilt_keeps_the_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny pool bound the chains' pools are rebuilt from the live chains (again as they grow): same bits."""
    from topotrain.network import flow_chain

    monkeypatch.setattr(flow_chain, "_POOL_MAX", 64)
    rebuild = flow_chain.PhaseChains._rebuild
    rebuilt = [0]

    def counted(self: flow_chain.PhaseChains) -> None:
        rebuilt[0] += 1
        rebuild(self)

    monkeypatch.setattr(flow_chain.PhaseChains, "_rebuild", counted)
    small = _run_chained(True, {})
    assert rebuilt[0] >= 3
    monkeypatch.undo()
    assert small == _run_chained(False, {})


def test_chain_pool_rebuild_keeps_what_is_left() -> None:
    """A rebuild of the chains' pools keeps each live chain's phases not yet started (their sizes, in order), its
    batch's groups, latencies and memo, and drops the chains with none left."""
    from topotrain.network.flow_chain import PhaseChains
    from topotrain.network.flow_rates import PreparedBatch

    b = PreparedBatch(np.array([3, 1, 2]), np.array([1e-6, 2e-6, 3e-6]), True, np.array([1, 2, 3]))
    c = PhaseChains()
    sizes = [np.array([1.0, 2.0, 3.0]) + 10 * k for k in range(4)]
    c.add(5, b, sizes)
    c.add(7, b, sizes[:2])
    c.took(5, b)  # job 5 started its first chained phase from Python
    c.took(7, b)
    c.took(7, b)  # job 7 has none left
    b.memo.append(np.array([0.5, 0.25, 0.125]))
    c.memo_found(b)
    c._rebuild()
    s = c.live(5)
    assert s >= 0 and c.live(7) == -1 and c.n_slots == 1
    pos, m, off, bi = (int(v) for v in (c.cs[s, 1], c.cs[s, 2], c.cs[s, 3], c.cs[s, 0]))
    assert [c.pf[off + 3 * i:off + 3 * i + 3].tolist() for i in range(pos, m)] == [x.tolist() for x in sizes[1:]]
    g_off, n, s_off, ns, t_off, m_off, memo = (int(v) for v in c.cb[bi])
    assert c.pg[g_off:g_off + n].tolist() == [3, 1, 2] and c.pg[s_off:s_off + ns].tolist() == [1, 2, 3]
    assert c.pf[t_off:t_off + n].tolist() == [1e-6, 2e-6, 3e-6]
    assert memo == 1 and c.pf[m_off:m_off + ns].tolist() == [0.5, 0.25, 0.125]
    other = PreparedBatch(b.gids, b.tail_s, True, b.sorted_gids)
    c.took(5, other)  # a start of another batch drops the chain
    assert c.live(5) == -1
