"""The barrier-free flow model: equal to the barrier model where every rank moves in lock-step, faster where
ranks can run ahead, and bounded below by the analytical per-link drain."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.collectives.registry import build_schedule
from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.network.analytical import AnalyticalModel
from topotrain.network.flow import FlowModel
from topotrain.network.flow_async import FlowAsyncModel
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology

P = NetworkParams(1e-6)  # the per-message overhead of every model below


def _switch(p: int, bw: float = 10e9) -> Topology:
    t = Topology("sw")
    t.add_node("sw", "switch")
    for i in range(p):
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", "sw", bw, 0.0)
    return t


def _async(eager: bool = False, params: NetworkParams = P) -> FlowAsyncModel:
    return FlowAsyncModel(eager_sends=eager, params=params)


@pytest.mark.parametrize("algo", ["ring", "halving-doubling", "tree"])
def test_equals_barrier_model_in_lock_step(algo: str) -> None:
    t = _switch(8)
    s = build_schedule("allreduce", algo, t, t.gpus, 8 * 2**20)
    assert _async().time_schedule(s, t).time_s == pytest.approx(FlowModel(P).time_schedule(s, t).time_s,
                                                                         rel=1e-9)


def test_ranks_run_ahead_without_barrier() -> None:
    """Phase 0: a→b (big) and c→d (small); phase 1: d→c (small). With barriers d→c waits for the big
    transfer; without, it follows c→d at once."""
    t = _switch(4)
    size = 10**8
    small = 10**6
    s = Schedule(CollectiveOp.BROADCAST, "hand", tuple(t.gpus), size, np.array([size, small]), np.array([0, 2]),
                 np.array([-1, -1]),
                 (Phase.of([0, 2], [1, 3], [0, 1], [1, 2], False), Phase.of([3], [2], [1], [2], False)))
    barrier = FlowModel(P).time_schedule(s, t).time_s
    free = _async().time_schedule(s, t).time_s
    assert barrier == pytest.approx(size / 10e9 + small / 10e9 + 2e-6, rel=1e-6)
    assert free == pytest.approx(size / 10e9 + 1e-6, rel=1e-6)
    assert free >= AnalyticalModel(P).time_schedule(s, t).phase_times_s.max() * (1 - 1e-9)


def _chain(t: Topology, sizes: list[int]) -> Schedule:
    """Rank 0 sends chunk k to rank 1 in phase k (a send-only sender: rank 0 never receives)."""
    n = len(sizes)
    return Schedule(CollectiveOp.BROADCAST, "hand", tuple(t.gpus[:2]), sum(sizes), np.array(sizes),
                    np.zeros(n, dtype=np.int64), np.full(n, -1),
                    tuple(Phase.of([0], [1], [k], [k + 1], False) for k in range(n)))


def test_eager_sender_moves_on_when_its_flow_starts() -> None:
    """Two chunks 0→1 in two phases. Rendezvous (flow-async): chunk 1 starts after chunk 0 is delivered,
    2·(alpha + n/B). Eager: the sender passes phase 0 at once but chunk 1 still waits for the receiver
    to enter phase 1 (after chunk 0 + alpha) — the same 2·(alpha + n/B); the sender's own phases end at
    once, so a third rank that waits only for the sender gains (next test)."""
    t = _switch(2)
    n = 10**7
    s = _chain(t, [n, n])
    one = 1e-6 + n / 10e9
    assert _async().time_schedule(s, t).time_s == pytest.approx(2 * one, rel=1e-9)
    assert _async(True).time_schedule(s, t).time_s == pytest.approx(2 * one, rel=1e-9)


def test_eager_send_overlaps_the_next_phase_of_the_sender() -> None:
    """Phase 0: 0→1 (n). Phase 1: 2→0 (n). With rendezvous rank 0 receives from 2 only after its send is
    delivered: 2·(alpha + n/B). Eager: rank 0 enters phase 1 at once and both transfers run together on
    different links: alpha + n/B."""
    t = _switch(3)
    n = 10**7
    s = Schedule(CollectiveOp.BROADCAST, "hand", tuple(t.gpus), n, np.array([n, n]), np.array([0, 2]),
                 np.array([-1, -1]), (Phase.of([0], [1], [0], [1], False), Phase.of([2], [0], [1], [2], False)))
    one = 1e-6 + n / 10e9
    assert _async().time_schedule(s, t).time_s == pytest.approx(2 * one, rel=1e-9)
    assert _async(True).time_schedule(s, t).time_s == pytest.approx(one, rel=1e-9)


@pytest.mark.parametrize(("p", "cores"), [(4, 2), (8, 2), (4, 4), (4, 8)])
def test_shared_cpu_stretches_the_overhead_of_a_lock_step_ring(p: int, cores: int) -> None:
    """A ring of tiny messages, every rank in its per-phase CPU work at the same instants: each phase
    costs bytes/B + o·max(1, p/cores) (processor sharing, at most one core per rank)."""
    t = _switch(p)
    o = 1e-3
    size = 1024 * p
    s = build_schedule("allreduce", "ring", t, t.gpus, size)
    got = _async(True, NetworkParams(o, shared_cpu_cores=cores)).time_schedule(s, t).time_s
    steps = 2 * (p - 1)
    assert got == pytest.approx(steps * (1024 / 10e9 + o * max(1.0, p / cores)), rel=1e-9)
    # without the pool: alpha per delivery, no stretch
    assert _async(True, NetworkParams(o)).time_schedule(s, t).time_s == pytest.approx(
        steps * (1024 / 10e9 + o), rel=1e-9)


def test_shared_cpu_cores_must_be_a_number() -> None:
    from topotrain.util.errors import ConfigError

    with pytest.raises(ConfigError, match="shared_cpu_cores"):
        NetworkParams(shared_cpu_cores="many")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="message_overhead_s"):
        NetworkParams(-1e-6)


def test_shared_cores_is_processor_sharing_capped_at_one_core() -> None:
    """2 cores. t=0: jobs a (1 s) and b (3 s) each get a full core. t=0.5: c (1 s) arrives: three jobs,
    2/3 core each. a has 0.5 s left → done at 0.5 + 0.75 = 1.25 (c has done 0.5, b 1.0). Then two jobs,
    one core each: c done at 1.75, b (1.5 left at 1.75) at 3.25."""
    from topotrain.network.flow_async import SharedCores

    pool = SharedCores(2)
    pool.start(1.0, 0.0, 1)
    pool.start(3.0, 0.0, 2)
    assert pool.next_event_s() == pytest.approx(1.0)
    assert pool.advance(0.5) == []
    pool.start(1.0, 0.5, 3)
    done = pool.advance(10.0)
    assert [tag for _, tag in done] == [1, 3, 2]
    assert [t for t, _ in done] == pytest.approx([1.25, 1.75, 3.25])
    assert pool.next_event_s() == float("inf")


def _slots_by_lexsort(schedule: Schedule) -> list[tuple[int, int, tuple[int, ...]]]:
    """(rank, phase, transfers) of every slot, built the plain way: the remote transfers numbered phase by
    phase, both ends listed, a three-key lexsort by (rank, phase, transfer)."""
    ends = []
    g = 0
    for k, ph in enumerate(schedule.phases):
        for s, d in zip(ph.src.tolist(), ph.dst.tolist(), strict=True):
            if s != d:
                ends += [(s, k, g), (d, k, g)]
                g += 1
    ends.sort()
    slots: dict[tuple[int, int], list[int]] = {}
    for r, k, t in ends:
        slots.setdefault((r, k), []).append(t)
    return [(r, k, tuple(ts)) for (r, k), ts in slots.items()]


@pytest.mark.parametrize("local", [False, True])
def test_job_slots_equal_a_lexsort_of_the_transfer_ends(local: bool) -> None:
    from topotrain.network.flow_async import _AsyncJob

    topo = _switch(6)
    ring = build_schedule("allreduce", "ring", topo, [f"g{i}" for i in range(6)], 6 * 2**20)
    phases = ring.phases
    if local:  # a copy to oneself in some phases: not a transfer, not in any slot
        extra = Phase.of([2], [2], [0], [1], False)
        phases = tuple(Phase.of(np.concatenate([ph.src, extra.src]), np.concatenate([ph.dst, extra.dst]),
                                np.concatenate([ph.chunk_lo, extra.chunk_lo]),
                                np.concatenate([ph.chunk_hi, extra.chunk_hi]),
                                np.concatenate([ph.reduce, extra.reduce])) if k % 3 == 0 else ph
                       for k, ph in enumerate(phases))
    sched = Schedule(ring.op, ring.algorithm, ring.ranks, ring.size_bytes, ring.chunk_bytes, ring.chunk_src,
                     ring.chunk_dst, phases)
    job = _AsyncJob.make("t", sched, topo, 0.0)
    got = []
    for r in range(6):
        for s in range(int(job.ptr[r]) + 1, int(job.rank_end[r])):
            a, n = int(job.slot_start[s]), int(job.slot_count[s])
            got.append((r, int(job.slot_phase[s]), tuple(int(t) for t in job.slot_g[a:a + n])))
    assert got == _slots_by_lexsort(sched)
    n_remote = sum(int((ph.src != ph.dst).sum()) for ph in phases)
    assert job.g_src.shape[0] == n_remote and bool((job.g_src != job.g_dst).all())
