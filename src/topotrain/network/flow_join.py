"""The state a phase timed alone has reached at an instant: what a provisional schedule joining the network needs.

A provisional schedule (:class:`~topotrain.network.flow.FlowSim`) that joins the shared network at ``t`` goes on
from the state its present phase has reached alone ``tau = t − phase start`` after its start: which transfers still
send, the bytes each has left, and the latest completion among those that have sent their last byte (the phase
ends no earlier). :func:`alone_state_rerun` computes it as the definition says: the phase started alone in a
fresh :class:`~topotrain.network.flow_network.FlowNetwork`, advanced to ``tau``.

:class:`AloneTrace` gives the same answer, bit for bit, without a network per join. A fresh network advanced to
``tau`` steps through the phase's departures up to ``tau`` (each the same arithmetic whatever ``tau`` is), then
moves every flow still sending by ``min(rate·(tau − last departure), bytes left)``. The trace records the state
after each departure once — the flows still sending, their bytes left and rates, the latest completion so far —
so the state at any ``tau`` is the last record at or before ``tau`` and that one last stretch, computed with the
network's own float operations (``FlowNetwork._advance_fluid``; its compiled form, ``flow_kernel._partial``, does
the same). A pipeline send joins the network at many instants of the same phase (Megatron-1T, TP8 × PP64 on 512
GPUs: 2,948 joins, a few hundred distinct phases): each phase is now simulated alone once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topotrain.network.flow_network import FlowNetwork
from topotrain.topology.graph import Topology

#: at most this many (flow, record) values per trace (flows still sending, summed over the records: 24 bytes
#: each); a phase with more (hundreds of flows leaving one by one) is re-run at each join instead of recorded
MAX_TRACE_VALUES = 1 << 14


def alone_state_rerun(topo: Topology, overhead_s: float, arbitration: str, offsets: np.ndarray,
                      links: np.ndarray, sizes_bytes: np.ndarray, tau_s: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ids of the flows still sending, their bytes left, the latest completion among the flows that have sent
    their last byte — ``-inf`` when none has) of the phase (CSR paths ``offsets``/``links``, ``sizes_bytes``)
    started alone at 0 in a fresh network and advanced to ``tau_s`` > 0."""
    alone = FlowNetwork(topo, overhead_s=overhead_s, arbitration=arbitration)
    alone.start_many(offsets, links, sizes_bytes, 0.0)
    done = alone.advance(tau_s)
    ids, left = alone.sending()
    floor = max((d for d, _ in done), default=-np.inf)
    still = set(ids.tolist())
    for d, f in alone.run():  # the completions of the transfers in flight at ``tau`` (their last bytes sent)
        if f not in still:
            floor = max(floor, d)
    return ids, left, floor


@dataclass(frozen=True)
class AloneTrace:
    """A phase run alone from 0, recorded at 0 and after each departure (:func:`record_alone`): record ``j`` is
    the state at ``times_s[j]``."""

    #: the instants of the records, increasing (0, then each departure: flows leaving at one instant, one record)
    times_s: np.ndarray
    #: per record, the ids of the flows still sending (in the network's order of them)
    ids: tuple[np.ndarray, ...]
    #: per record, their bytes left
    left_bytes: tuple[np.ndarray, ...]
    #: per record, their rates (bytes/s)
    rates: tuple[np.ndarray, ...]
    #: per record, the latest completion among the flows that have sent their last byte (``-inf``: none has)
    floor_s: np.ndarray

    @property
    def num_values(self) -> int:
        """(flow, record) values held: flows still sending, summed over the records."""
        return sum(a.shape[0] for a in self.ids)

    def at(self, tau_s: float) -> tuple[np.ndarray, np.ndarray, float]:
        """What :func:`alone_state_rerun` gives at ``tau_s`` > 0, bit for bit: the last record at or before
        ``tau_s`` (the departures a network advanced to ``tau_s`` has stepped through), then every flow still
        sending moved by ``min(rate·dt, bytes left)``, ``dt = tau_s −`` the record's instant."""
        j = int(np.searchsorted(self.times_s, tau_s, side="right")) - 1
        ids, rem, rate = self.ids[j], self.left_bytes[j], self.rates[j]
        dt = tau_s - float(self.times_s[j])
        if ids.size and dt > 0.0:
            left = rem - np.minimum(rate * dt, rem)
        else:
            left = rem.copy()
        return ids.copy(), left, float(self.floor_s[j])


def record_alone(topo: Topology, overhead_s: float, arbitration: str, offsets: np.ndarray, links: np.ndarray,
                 sizes_bytes: np.ndarray, max_values: int = MAX_TRACE_VALUES) -> AloneTrace | None:
    """The :class:`AloneTrace` of the phase (CSR paths ``offsets``/``links``, ``sizes_bytes``), in a network made
    as :func:`alone_state_rerun` makes it (no completion queue: it changes no rate), stepped from departure to
    departure; None when it would hold more than ``max_values`` values."""
    net = FlowNetwork(topo, report=False, overhead_s=overhead_s, arbitration=arbitration)
    net.start_many(offsets, links, sizes_bytes, 0.0)
    times: list[float] = []
    ids: list[np.ndarray] = []
    left: list[np.ndarray] = []
    rates: list[np.ndarray] = []
    floors: list[float] = []
    total = 0
    while True:
        act, rate = net.active_rates()
        total += act.shape[0]
        if total > max_values:
            return None
        times.append(net.now_s)
        ids.append(act)
        left.append(net.sending()[1])
        rates.append(rate)
        floors.append(net.last_completion_s if net.num_completed else -np.inf)
        if not act.size:
            break
        net.advance(net.next_event_s())  # the next departure, and any other at that instant
    return AloneTrace(np.array(times), tuple(ids), tuple(left), tuple(rates), np.array(floors))
