"""How one direction of an emulated link is shaped (``tc`` commands), and what the shaped link delivers.

Each direction of a link is shaped on the egress of the veth end it leaves from (:func:`shaping_commands`): an
HTB class with ``rate = ceil = bandwidth · bandwidth_scale`` and, below it, netem with ``delay = latency ·
latency_scale`` (Linux ``tc-htb(8)``, ``tc-netem(8)``), optionally with tiny TCP segments (ACKs) in a strict
priority child; :class:`LinkShape` records, per direction, the model's bandwidth and latency beside the emulated
rate and delay.

What a link delivers: HTB meters Ethernet frames (the skb with its 14-byte header; GSO super-packets are
charged per segment), and over the veths' 1500-byte MTU each frame carries 1448 bytes of TCP payload
(20 IP + 20 TCP + 12 timestamp-option bytes), so a link shaped to ``r`` carries ``r · 1448/1514 =
0.956 r`` of payload (:data:`TCP_PAYLOAD_EFFICIENCY`; measured by ``benchmarks/testbed.py``'s link-rate
check: 23.9 of 25.0 MB/s). :meth:`~topotrain.testbed.netns.Emulation.scaled_topology` gives the models that
payload bandwidth.

Kept apart from :mod:`~topotrain.testbed.netns` (namespaces, veths, routes, processes) because it is where the
models' link numbers become the kernel's queueing discipline, and it runs no command itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LinkShape"]


@dataclass(frozen=True)
class LinkShape:
    """How one direction of a link is emulated."""

    src: str
    dst: str
    device: str
    namespace: str
    model_bandwidth_bytes_per_s: float
    rate_bits_per_s: float
    model_latency_s: float
    delay_s: float
    netem: bool = True

    def describe(self) -> str:
        delay = (f"netem delay {self.delay_s * 1e6:.4g} us" if self.netem
                 else "no delay (kernel has no sch_netem)")
        return (f"{self.src}->{self.dst}: {self.model_bandwidth_bytes_per_s * 8 / 1e9:.4g} Gb/s -> "
                f"htb rate {self.rate_bits_per_s / 1e6:.4g} Mb/s, "
                f"latency {self.model_latency_s * 1e6:.4g} us "
                f"-> {delay} ({self.namespace}:{self.device})")


MTU_BYTES = 1500
#: TCP payload per Ethernet frame over IPv4 with timestamps: (1500 − 52) / (1500 + 14).
TCP_PAYLOAD_EFFICIENCY = (MTU_BYTES - 20 - 20 - 12) / (MTU_BYTES + 14)


#: A pure TCP ACK (or any tiny segment): IPv4, TCP, total length below 128 bytes (20 IP + 20 TCP + up to 40
#: option bytes of timestamps and SACK blocks), as u32 selectors (``tc-u32(8)``).
_SMALL_TCP = "match ip protocol 6 0xff match u16 0x0000 0xff80 at 2"


def shaping_commands(dev: str, rate_bits: int, burst: int, leaf: str, ack_priority: bool) -> list[str]:
    """``tc -batch`` lines that shape egress of ``dev`` to ``rate_bits`` with an HTB class and ``leaf`` below.

    ``ack_priority``: the class has two children sharing its rate, tiny TCP segments (ACKs) in one with
    strict priority and everything else in the other, so the ACKs of a flow in one direction never wait
    behind the data queued in that direction by the flow the other way over the same link (a TCP
    artefact — "ACK compression" behind a FIFO — that RDMA fabrics with their own flow control do not
    have). Each child can use the whole rate (HTB borrowing, ``tc-htb(8)``)."""
    head = [f"qdisc add dev {dev} root handle 1: htb default {20 if ack_priority else 1}",
            f"class add dev {dev} parent 1: classid 1:1 htb rate {rate_bits}bit "
            f"ceil {rate_bits}bit burst {burst} cburst {burst} quantum 60000"]
    if not ack_priority:
        return head + [f"qdisc add dev {dev} parent 1:1 handle 10: {leaf}"]
    ack_rate = max(rate_bits // 20, 8000)
    return head + [
        f"class add dev {dev} parent 1:1 classid 1:10 htb rate {ack_rate}bit ceil {rate_bits}bit "
        f"burst {burst} cburst {burst} prio 0 quantum 1514",
        f"class add dev {dev} parent 1:1 classid 1:20 htb rate {rate_bits - ack_rate}bit ceil {rate_bits}bit "
        f"burst {burst} cburst {burst} prio 1 quantum 60000",
        f"qdisc add dev {dev} parent 1:10 handle 10: pfifo limit 1000",
        f"qdisc add dev {dev} parent 1:20 handle 20: {leaf}",
        f"filter add dev {dev} parent 1: protocol ip prio 1 u32 {_SMALL_TCP} flowid 1:10",
    ]
