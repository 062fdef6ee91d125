"""The check-set of predictions: a fixed list of answers whose every bit a refactor must keep.

Run: ``.venv/bin/python benchmarks/checkset.py [--out FILE] [--quick]`` — prints one line per prediction
(its name and the float's ``repr``, so every bit shows) and, last, the SHA-256 of all of them; ``--out``
writes the same lines to a file to ``diff`` against a later run. The set: every published validation row
(:func:`topotrain.validate.published.cases`) simulated with the analytical and the flow network model
(iteration time, every part of its breakdown, peak memory per GPU, the busiest links), every example scenario with both
models, and every collective algorithm on every example cluster (allreduce, allgather, reduce-scatter,
all-to-all at 1 KiB and 64 MiB) with analytical and flow. ``--quick`` leaves out the flow model for the
published rows (the slow part). It uses the public API, the published rows and the collective registry.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import topotrain as tt
from topotrain.collectives.registry import algorithms_for
from topotrain.validate.published import cases

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCENARIOS = ["resnet50-eflops.yaml"]
CLUSTERS = ["eflops-bigraph.yaml", "shared-nic-bigraph.yaml", "dgx-a100-rail.yaml", "custom-graph.yaml"]
OPS = ["allreduce", "allgather", "reduce_scatter", "alltoall"]
SIZES = [1024, 64 * 2**20]


def _result_lines(name: str, r: tt.Result) -> Iterator[str]:
    yield f"{name} iteration_time_s {r.iteration_time_s!r}"
    yield f"{name} breakdown " + " ".join(f"{k}={v!r}" for k, v in r.breakdown.to_dict().items())
    yield f"{name} peak_memory_bytes {r.peak_memory_bytes!r}"
    yield f"{name} top_links " + " ".join(f"{a}>{b}={u!r}" for a, b, u in r.link_utilization_top)


def lines(quick: bool) -> Iterator[str]:
    for c in cases():
        for network in ("analytical",) if quick else ("analytical", "flow"):
            try:
                r = tt.simulate(tt.scenario_from_dict({**c.scenario, "network": network}))
            except tt.ConfigError as e:
                yield f"published/{c.name}/{network} error {e}"
                continue
            yield from _result_lines(f"published/{c.name}/{network}", r)
    for sc in SCENARIOS:
        for network in ("analytical", "flow"):
            r = tt.simulate(tt.load_scenario(EXAMPLES / sc, [f"network={network}"]))
            yield from _result_lines(f"example/{sc}/{network}", r)
    for cl in CLUSTERS:
        cluster = tt.load_cluster(EXAMPLES / cl)
        for op in OPS:
            for size in SIZES:
                for network in ("analytical", "flow"):
                    for algo in ["auto", *algorithms_for(op)]:
                        try:
                            rep = tt.time_collective(cluster, op, algo, size, network=network)
                        except tt.ConfigError as e:
                            yield f"collective/{cl}/{op}/{size}/{network}/{algo} refused {e.field}"
                            continue
                        yield (f"collective/{cl}/{op}/{size}/{network}/{algo} {rep.algorithm} {rep.time_s!r} "
                               f"{rep.busiest_link_utilization!r}")


def main() -> None:
    quick = "--quick" in sys.argv
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    digest = hashlib.sha256()
    kept = []
    for line in lines(quick):
        print(line, flush=True)
        digest.update(line.encode() + b"\n")
        kept.append(line)
    print(f"sha256 {digest.hexdigest()} ({len(kept)} predictions)")
    if out is not None:
        out.write_text("\n".join(kept) + "\n")


if __name__ == "__main__":
    main()
