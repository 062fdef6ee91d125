"""Catalog of link types: PCIe generations, NVLink generations, CPU socket links and NICs.

Conventions (every entry follows them):

* ``bandwidth_bytes_per_s`` is **per direction**. Links are full duplex; :meth:`Topology.add_link` gives
  each direction this capacity.
* PCIe: the usable data rate after line encoding, ``lanes × GT/s × encoding / 8``. Gen1/2 use 8b/10b,
  gen3 onwards 128b/130b, so x16 gives gen3 ≈ 15.75 GB/s, gen4 ≈ 31.5 GB/s, gen5 ≈ 63.0 GB/s (PCI-SIG base
  specifications 3.0/4.0/5.0). TLP/DLLP protocol overhead (another 5–15 % depending on payload size) is
  *not* removed: it belongs to a measured efficiency, not to the catalog.
* NVLink: the per-GPU aggregate of all its links, per direction (datasheets quote the bidirectional total,
  twice this): a server template joins each GPU to one NVSwitch node with one link standing for them all.
* NICs: the nominal data rate (after 64b/66b encoding, which the "100 Gb/s" already is) divided by 8.
* ``latency_s``: a typical *hardware* per-hop latency (switch traversal and a few metres of wire at
  ~5 ns/m); software cost per message lives in :attr:`NetworkParams.message_overhead_s`. These are
  order-of-magnitude values from vendor literature, not measurements: PCIe switch port-to-port
  ~100–150 ns (Broadcom/PLX PEX datasheets quote 100–150 ns), CPU socket hop ~100 ns (a remote-socket
  access adds ~50–100 ns), NVLink/NVSwitch hop ~100 ns, InfiniBand switch port-to-port 90–130 ns
  (Mellanox Switch-IB 2 / Quantum datasheets) plus cable, Ethernet datacenter switch 300–600 ns
  cut-through.

User entries: :func:`register_link` (or a YAML catalog, :mod:`topotrain.hardware.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from topotrain.util.errors import ConfigError
from topotrain.util.units import parse_bandwidth

if TYPE_CHECKING:
    from topotrain.hardware.catalog import Catalog

#: The kinds a link type may have.
LINK_KINDS: tuple[str, ...] = ("pcie", "nvlink", "socket", "ethernet", "infiniband")


@dataclass(frozen=True)
class LinkType:
    """One kind of physical link. Bandwidth is per direction (bytes/s); latency is per hop (s)."""

    name: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        field = f"link {self.name!r}" if self.name else "link"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("link.name", "a link type needs a non-empty name",
                              "give it a name, e.g. pcie4-x16")
        if self.kind not in LINK_KINDS:
            raise ConfigError(f"{field}.kind", f"unknown link kind {self.kind!r}",
                              f"use one of {', '.join(LINK_KINDS)}")
        if not (isinstance(self.bandwidth_bytes_per_s, int | float) and self.bandwidth_bytes_per_s > 0
                and self.bandwidth_bytes_per_s < float("inf")):
            raise ConfigError(f"{field}.bandwidth",
                              f"bandwidth must be positive, got {self.bandwidth_bytes_per_s}",
                              "give e.g. 25GB/s")
        if not (isinstance(self.latency_s, int | float) and 0 <= self.latency_s < float("inf")):
            raise ConfigError(f"{field}.latency", f"latency must be >= 0, got {self.latency_s}",
                              "give e.g. 1us")


def _pcie_x16(gt_per_s: float) -> float:
    """Usable bytes/s of a x16 link with 128b/130b encoding (PCIe 3.0 and later)."""
    return 16 * gt_per_s * 1e9 * (128 / 130) / 8


_PCIE_LAT = 150e-9
_NVLINK_LAT = 100e-9
_SOCKET_LAT = 100e-9
_IB_LAT = 150e-9
_ETH_LAT = 500e-9

_BUILTIN: tuple[LinkType, ...] = (
    LinkType("pcie3-x16", "pcie", _pcie_x16(8.0), _PCIE_LAT,
             "PCI-SIG PCIe 3.0: 8 GT/s x16, 128b/130b -> 15.75 GB/s per direction"),
    LinkType("pcie4-x16", "pcie", _pcie_x16(16.0), _PCIE_LAT,
             "PCI-SIG PCIe 4.0: 16 GT/s x16, 128b/130b -> 31.5 GB/s per direction"),
    LinkType("pcie5-x16", "pcie", _pcie_x16(32.0), _PCIE_LAT,
             "PCI-SIG PCIe 5.0: 32 GT/s x16, 128b/130b -> 63.0 GB/s per direction"),
    LinkType("nvlink1", "nvlink", 4 * 20e9, _NVLINK_LAT,
             "NVIDIA Tesla P100 whitepaper: 4 NVLink links x 20 GB/s per direction = 80 GB/s "
             "(160 GB/s bidir.)"),
    LinkType("nvlink2", "nvlink", 6 * 25e9, _NVLINK_LAT,
             "NVIDIA Tesla V100 whitepaper: 6 NVLink2 links x 25 GB/s per direction = 150 GB/s "
             "(300 GB/s bidir.)"),
    LinkType("nvlink3", "nvlink", 12 * 25e9, _NVLINK_LAT,
             "NVIDIA A100 datasheet: 12 NVLink3 links, 600 GB/s bidirectional = 300 GB/s per direction"),
    LinkType("nvlink4", "nvlink", 18 * 25e9, _NVLINK_LAT,
             "NVIDIA H100 datasheet: 18 NVLink4 links, 900 GB/s bidirectional = 450 GB/s per direction"),
    LinkType("upi", "socket", 3 * 20.8e9, _SOCKET_LAT,
             "Intel Xeon Scalable (Skylake-SP/Cascade Lake) technical overview: 3 UPI links at 10.4 GT/s, "
             "20.8 GB/s per direction each = 62.4 GB/s; nominal, measured cross-socket PCIe peer-to-peer "
             "is often far lower (register a slower link to model it)"),
    LinkType("qpi", "socket", 2 * 19.2e9, _SOCKET_LAT,
             "Intel Xeon E5-2600 v3/v4 (Haswell/Broadwell-EP): 2 QPI links at 9.6 GT/s, 19.2 GB/s per "
             "direction each = 38.4 GB/s; nominal"),
    LinkType("upi2", "socket", 4 * 32e9, _SOCKET_LAT,
             "Intel Xeon 4th gen (Sapphire Rapids, DGX H100): 4 UPI 2.0 links at 16 GT/s, taken as ~32 GB/s "
             "per direction each = 128 GB/s; approximate nominal value"),
    LinkType("xgmi2", "socket", 4 * 32e9, _SOCKET_LAT,
             "AMD EPYC 7002 (Rome, DGX A100) socket-to-socket Infinity Fabric: 4 x16 xGMI-2 links at "
             "16 GT/s, ~32 GB/s per direction each = 128 GB/s; approximate nominal value"),
    LinkType("eth-25g", "ethernet", 25e9 / 8, _ETH_LAT, "IEEE 802.3by 25GbE: 25 Gb/s data rate"),
    LinkType("eth-40g", "ethernet", 40e9 / 8, _ETH_LAT, "IEEE 802.3ba 40GbE: 40 Gb/s data rate"),
    LinkType("eth-50g", "ethernet", 50e9 / 8, _ETH_LAT, "IEEE 802.3cd 50GbE: 50 Gb/s data rate"),
    LinkType("eth-100g", "ethernet", 100e9 / 8, _ETH_LAT, "IEEE 802.3ba/cd 100GbE: 100 Gb/s data rate"),
    LinkType("eth-200g", "ethernet", 200e9 / 8, _ETH_LAT, "IEEE 802.3bs/cd 200GbE: 200 Gb/s data rate"),
    LinkType("eth-400g", "ethernet", 400e9 / 8, _ETH_LAT, "IEEE 802.3bs 400GbE: 400 Gb/s data rate"),
    LinkType("ib-edr-100g", "infiniband", 100e9 / 8, _IB_LAT,
             "InfiniBand EDR 4x: 100 Gb/s data rate (IBTA; Mellanox ConnectX-4/5)"),
    LinkType("ib-hdr-200g", "infiniband", 200e9 / 8, _IB_LAT,
             "InfiniBand HDR 4x: 200 Gb/s data rate (IBTA; Mellanox ConnectX-6)"),
    LinkType("ib-ndr-400g", "infiniband", 400e9 / 8, _IB_LAT,
             "InfiniBand NDR 4x: 400 Gb/s data rate (IBTA; NVIDIA ConnectX-7)"),
)

#: Registered link types by lower-case name (built-ins and user entries).
LINKS: dict[str, LinkType] = {lt.name: lt for lt in _BUILTIN}


def _known() -> str:
    return "known: " + ", ".join(sorted(LINKS))


def get_link(name: str, field: str = "link") -> LinkType:
    """The link type called ``name`` (case-insensitive); unknown → ConfigError listing the known ones."""
    if not isinstance(name, str) or name.strip().lower() not in LINKS:
        raise ConfigError(field, f"unknown link type {name!r}", _known())
    return LINKS[name.strip().lower()]


def register_link(link: LinkType, *, replace: bool = False) -> LinkType:
    """Add a user link type. Re-registering an identical entry is a no-op; a different one under a taken
    name raises ConfigError unless ``replace`` is true."""
    if not isinstance(link, LinkType):
        raise ConfigError("link", f"expected a LinkType, got {type(link).__name__}", "build a LinkType")
    key = link.name.strip().lower()
    old = LINKS.get(key)
    if old is not None and old != link and not replace:
        raise ConfigError("link", f"link type {link.name!r} is already in the catalog",
                          "choose another name or pass replace=True")
    LINKS[key] = link
    return link


def resolve_bandwidth(value: str | float | int, field: str = "bandwidth", catalog: Catalog | None = None) -> float:
    """Bytes/s per direction from a link-type name (``"pcie4-x16"``, looked up in ``catalog``, the built-in
    one when None) or a bandwidth with its unit (``"25GB/s"`` bytes, ``"100Gbps"`` bits)."""
    links = catalog.links if catalog is not None else LINKS
    if isinstance(value, str) and value.strip().lower() in links:
        return links[value.strip().lower()].bandwidth_bytes_per_s
    try:
        return parse_bandwidth(value, field)
    except ConfigError:
        if isinstance(value, str):
            raise ConfigError(field, f"{value!r} is neither a known link type nor a bandwidth",
                              "write e.g. 25GB/s (bytes/s) or 100Gbps (bits/s), or a link type "
                              f"({', '.join(sorted(links))})") from None
        raise
