"""Typed parameters of the network models, passed explicitly (never read from or written onto a Topology).

* ``message_overhead_s`` — the fixed software cost of one point-to-point message (Hockney's alpha, LogP's
  ``o + g`` lumped; Culler et al., PPoPP 1993). The default (:data:`~topotrain.collectives.costmodel.
  DEFAULT_MESSAGE_OVERHEAD_S`, 2 µs) is an assumption of the order that NCCL/MPI report for a small message
  on a local fabric; scenarios set their own (``cluster.message_overhead``).
* ``shared_cpu_cores`` — when every rank runs on one machine (the emulated testbed), the number of CPU
  cores they share; 0 means each rank has its own (the overhead is then per message, not CPU time).
* ``fabric`` — how the fabric carries bytes (:class:`~topotrain.network.switching.PacketFabric`): framing
  and store-and-forward switches, added per phase by the barrier models (``flow``, ``analytical``); the
  default, :data:`~topotrain.network.switching.CUT_THROUGH`, adds nothing (the fluid models' assumption).
* ``arbitration`` — how a link's capacity is shared by the flow models (``flow``, ``flow-async``,
  ``flow-eager``): ``flow`` (the default), max-min fair per flow on every link, as switches with fair queueing
  share; ``port``, PCIe links share per input port (round robin over the ports that feed them, the PCIe
  specification's port arbitration; :mod:`topotrain.network.port_arbitration`), other links per flow.
  The analytical model has no sharing to arbitrate and ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.network.port_arbitration import check_arbitration
from topotrain.network.switching import CUT_THROUGH, PacketFabric
from topotrain.util.errors import ConfigError


@dataclass(frozen=True)
class NetworkParams:
    """Parameters every network model takes (a value; :func:`dataclasses.replace` gives a variant)."""

    message_overhead_s: float = DEFAULT_MESSAGE_OVERHEAD_S
    shared_cpu_cores: float = 0.0
    fabric: PacketFabric = CUT_THROUGH
    arbitration: str = "flow"

    def __post_init__(self) -> None:
        for name in ("message_overhead_s", "shared_cpu_cores"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0 or v == float("inf"):
                raise ConfigError(f"network.{name}", f"must be a finite number >= 0, got {v!r}",
                                  "give e.g. 2e-6 (seconds) or 0")
        check_arbitration(self.arbitration)
        if not isinstance(self.fabric, PacketFabric):
            raise ConfigError("network.fabric", f"must be a PacketFabric, got {self.fabric!r}",
                              "give e.g. topotrain.network.switching.NS3_TCP_JUMBO, or leave the default (cut-through)")


def require_cut_through(params: NetworkParams, model: str) -> None:
    """Refuse a packet fabric in a model that does not carry its terms (only the barrier models do)."""
    if not params.fabric.is_cut_through:
        raise ConfigError("network.fabric", f"a packet fabric (framing, store-and-forward) is not modelled by {model}",
                          "it is modelled by the barrier models: use network: flow (or analytical)")
