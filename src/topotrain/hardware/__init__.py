"""Hardware catalog: GPUs (datasheet peaks), link types (PCIe, NVLink, socket links, NICs) and server
templates (conventional shared-NIC PCIe server, EFLOPS server, DGX-style NVSwitch servers), as values
(a user's own entries are read by :mod:`topotrain.scenario.catalog`)."""

from topotrain.hardware.catalog import Catalog
from topotrain.hardware.gpus import (
    DTYPES,
    GPU_ALIASES,
    GPUS,
    GPUSpec,
    get_gpu,
    gpu_names,
    normalize_dtype,
    register_gpu,
)
from topotrain.hardware.links import LINK_KINDS, LINKS, LinkType, get_link, register_link, resolve_bandwidth
from topotrain.hardware.servers import (
    SERVER_ALIASES,
    SERVER_NODE_KINDS,
    SERVERS,
    LinkDef,
    NodeDef,
    ServerInstance,
    ServerTemplate,
    eflops_server,
    get_server,
    instantiate,
    nvswitch_server,
    pcie_shared_nic,
    register_server,
    server_names,
    server_to_dict,
    single_gpu_server,
)

__all__ = [
    "Catalog",
    "DTYPES",
    "GPUS",
    "GPU_ALIASES",
    "LINKS",
    "LINK_KINDS",
    "SERVERS",
    "SERVER_ALIASES",
    "SERVER_NODE_KINDS",
    "GPUSpec",
    "LinkDef",
    "LinkType",
    "NodeDef",
    "ServerInstance",
    "ServerTemplate",
    "eflops_server",
    "get_gpu",
    "get_link",
    "get_server",
    "gpu_names",
    "instantiate",
    "normalize_dtype",
    "nvswitch_server",
    "pcie_shared_nic",
    "register_gpu",
    "register_link",
    "register_server",
    "resolve_bandwidth",
    "server_names",
    "server_to_dict",
    "single_gpu_server",
]
