"""SimGrid driver (runs under the system Python that Debian's ``python3-simgrid`` is built for).

``/usr/bin/python3 simgrid_driver.py < case.json > result.json``: one case a process (SimGrid's engine is
a singleton). Standard library and ``simgrid`` only: it must not import topotrain (another interpreter).

Input ``{"tcp_factors": bool, "alpha_s": s, "hosts": [name, ...], "links": [[bandwidth_bytes_per_s,
latency_s], ...], "routes": [[src host, dst host, [link index, ...]], ...], "jobs": [{"start_s": s,
"phases": [[[src host, dst host, bytes], ...], ...]}, ...]}``; output ``{"phase_end_s": [[...], ...],
"wall_s": s}`` (each job's phase end times).

The platform is one *full* zone: every host is an endpoint, every directed link of the topology one
SimGrid link (shared), and every (source, destination) pair's route is the topology's own path, so both
simulators share bandwidth over identical paths. A job is one actor: per phase it starts every transfer
(``Comm.sendto_async``), waits for all, then sleeps the per-message overhead, as topotrain's ``flow``
charges it. ``tcp_factors`` false: CM02 with latency factor 1, bandwidth factor 1, no TCP window bound
(TCP-gamma 0), no cross traffic (weight-S 0): max-min sharing (Velho et al., ACM TOMACS 2013, §3), the
mechanism of topotrain's flow model. True: SimGrid's default LV08 model (latency x13.01, bandwidth x0.97,
RTT-weighted sharing, ACK cross traffic, 4 MiB window), its calibration of TCP on Ethernet.
"""

from __future__ import annotations

import json
import sys
import time

_PURE = ["network/model:CM02", "network/latency-factor:1", "network/bandwidth-factor:1", "network/weight-S:0",
         "network/crosstraffic:0", "network/TCP-gamma:0"]


def main() -> int:
    case = json.load(sys.stdin)
    import simgrid as sg

    t0 = time.perf_counter()
    cfg = [] if case["tcp_factors"] else _PURE
    args = ["topotrain-simgrid", "--log=root.thres:critical", *(f"--cfg={c}" for c in cfg)]
    engine = sg.Engine(args)
    zone = sg.NetZone.create_full_zone("topotrain")
    hosts = {h: zone.create_host(h, 1e9) for h in case["hosts"]}
    links = [zone.create_link(f"l{i}", bw).set_latency(lat) for i, (bw, lat) in enumerate(case["links"])]
    for src, dst, path in case["routes"]:
        zone.add_route(hosts[src].netpoint, hosts[dst].netpoint, None, None,
                       [sg.LinkInRoute(links[i]) for i in path], False)
    zone.seal()
    alpha_s = float(case["alpha_s"])
    ends: list[list[float]] = [[] for _ in case["jobs"]]

    def job(j: int) -> None:
        spec = case["jobs"][j]
        sg.this_actor.sleep_until(float(spec["start_s"]))
        for phase in spec["phases"]:
            comms = [sg.Comm.sendto_async(hosts[s], hosts[d], int(b)) for s, d, b in phase]
            if comms:
                sg.Comm.wait_all(comms)
                sg.this_actor.sleep_for(alpha_s)
            ends[j].append(sg.Engine.clock)

    first = hosts[case["hosts"][0]]
    for j in range(len(case["jobs"])):
        sg.Actor.create(f"job{j}", first, job, j)
    engine.run()
    sys.stdout.write(json.dumps({"phase_end_s": ends, "wall_s": time.perf_counter() - t0}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
