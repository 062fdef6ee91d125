"""Subprocess driver of the ns-3 reference: ``python -m topotrain.network.ns3_driver < cases.json``.

Reads ``{"cases": [case, ...]}`` (each case the arrays of :func:`topotrain.network.packet_ns3.ns3_case`) on
stdin and writes ``{"results": [{"phase_end_s": [...], "connected": n, "drops": n, "events": n,
"wall_s": s}, ...]}`` on stdout. It runs in its own process because ns-3 is a global singleton (one
simulator, one node list, one address allocator per process) and its bindings write to stderr; one
process runs a whole batch, so the libraries load once.

It loads only the ns-3 libraries the runner needs from the PyPI ``ns3`` package (the same files ``from ns
import ns`` loads, a few seconds instead of ~15 s for all of them) and compiles ``ns3_runner.cc`` with
cppyy; the simulation itself runs in C++, no Python is called per packet.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

_LIBS = ("core", "network", "internet", "point-to-point", "traffic-control", "stats", "bridge", "mobility")


def ns3_root() -> Path | None:
    """Directory of the installed PyPI ``ns3`` package (headers in include/, libraries in lib64/), or None."""
    spec = importlib.util.find_spec("ns3")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root if (root / "include" / "ns3").is_dir() else None


def _load() -> Any:
    import cppyy

    root = ns3_root()
    if root is None:
        raise RuntimeError("the ns3 package is not installed (pip install ns3)")
    cppyy.add_include_path(str(root / "include"))
    version = next((root / "lib64").glob("libns3.*-core.so")).name.split("-")[0]  # libns3.44
    for lib in _LIBS:
        cppyy.load_library(str(root / "lib64" / f"{version}-{lib}.so"))
    cppyy.cppdef((Path(__file__).with_name("ns3_runner.cc")).read_text())
    return cppyy.gbl


def _vec(gbl: Any, kind: str, values: list[Any]) -> Any:
    v = gbl.std.vector[kind]()
    v.reserve(len(values))
    for x in values:
        v.push_back(x)
    return v


def run_case(gbl: Any, c: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    L, D = "long", "double"  # noqa: N806
    out = gbl.tt.run(
        int(c["n_nodes"]), _vec(gbl, L, c["ch_a"]), _vec(gbl, L, c["ch_b"]), _vec(gbl, D, c["rate_ab_bps"]),
        _vec(gbl, D, c["rate_ba_bps"]), _vec(gbl, D, c["delay_s"]), _vec(gbl, L, c["conn_src"]),
        _vec(gbl, L, c["conn_dst"]), _vec(gbl, L, c["fwd_off"]), _vec(gbl, L, c["fwd_nodes"]),
        _vec(gbl, L, c["rev_off"]), _vec(gbl, L, c["rev_nodes"]), _vec(gbl, D, c["job_start_s"]),
        _vec(gbl, L, c["job_phase_off"]), _vec(gbl, L, c["phase_flow_off"]), _vec(gbl, L, c["flow_conn"]),
        _vec(gbl, D, c["flow_bytes"]), float(c["alpha_s"]), int(c["mtu_bytes"]), int(c["queue_packets"]),
        float(c["min_rto_s"]), float(c["warmup_s"]), int(c["seed"]), str(c["tcp_variant"]),
        int(c.get("del_ack_count", 1)), int(c.get("initial_cwnd_segments", 0)),
        int(c.get("host_fair_queue", 0)))
    vals = list(out)
    return {"phase_end_s": vals[:-3], "connected": int(vals[-3]), "drops": int(vals[-2]), "events": int(vals[-1]),
            "wall_s": time.perf_counter() - t0}


#: a two-node case run first and not reported: the first run compiles the runner's templates (~0.3 s)
_WARMUP = {"n_nodes": 2, "ch_a": [0], "ch_b": [1], "rate_ab_bps": [1e9], "rate_ba_bps": [1e9], "delay_s": [1e-6],
           "conn_src": [0], "conn_dst": [1], "fwd_off": [0, 2], "fwd_nodes": [0, 1], "rev_off": [0, 2],
           "rev_nodes": [1, 0], "job_start_s": [0.0], "job_phase_off": [0, 1], "phase_flow_off": [0, 1],
           "flow_conn": [0], "flow_bytes": [1e5], "alpha_s": 0.0, "mtu_bytes": 1500, "queue_packets": 100,
           "min_rto_s": 1e-3, "warmup_s": 1e-3, "seed": 1, "tcp_variant": "ns3::TcpCubic",
           "del_ack_count": 1}


def main() -> int:
    cases = json.load(sys.stdin)["cases"]
    gbl = _load()
    if cases:
        run_case(gbl, _WARMUP)
    results = [run_case(gbl, c) for c in cases]
    sys.stdout.write(json.dumps({"results": results}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
