"""Gradient synchronisation compared on one cluster: allreduce vs parameter server vs gossip (plan.sync), and
Poseidon's headline effect in shape.

Table 1 — one cluster (16 single-GPU A100 servers on one 100GbE switch), a CNN (ResNet-50, 64 images per
GPU) and a transformer (GPT-2 124M, 8 sequences of 1024 per GPU), every scheme timed by the same engine and
flow model: seconds per iteration, bytes each GPU sends per iteration (the most any GPU sends), and what
bounds the iteration (the compute when the exposed communication is under 5% of it, else the busiest link).

Table 2 — Poseidon (Zhang et al., USENIX ATC 2017), its Figure 5 setting as we read it: Caffe on single-GPU
Titan X nodes over 40GbE, VGG19 and VGG19-22K, 1 to 32 nodes, throughput speedup over one node of Caffe+PS
(plain PS), Caffe+WFBP (wait-free backprop) and Poseidon (WFBP + hybrid PS/SFB). Here: VGG-16 (the zoo's;
VGG19 adds three 3×3 convolutions, its FC layers are the same) and VGG-16 with 21,841 classes, fp32, batch
32 per node, P100 (the catalog has no Titan X), colocated shards as Poseidon runs them. Compared *in shape*
only: the ordering and where each stops scaling, not the paper's numbers.

Synthesized collectives (issue 38 part 3) have their own comparison: ``benchmarks/synth.py``.

    PYTHONPATH=src python benchmarks/sync_compare.py            # both tables (about 30 s)
    PYTHONPATH=src python benchmarks/sync_compare.py --table 2
"""

from __future__ import annotations

import argparse
from typing import Any

from topotrain.scenario.load import scenario_from_dict
from topotrain.training.simulate import Result, simulate
from topotrain.training.sync_tasks import bytes_sent_per_node

SCHEMES: list[tuple[str, dict[str, Any]]] = [
    ("allreduce (auto)", {}),
    ("PS colocated, plain", {"sync": "ps", "ps": {"wait_free": False, "sfb": False}}),
    ("PS colocated, WFBP+SFB", {"sync": "ps"}),
    ("PS 2 dedicated hosts", {"sync": "ps", "ps": {"placement": "dedicated", "hosts": ["ps0", "ps1"]}}),
    ("PS WFBP+SFB, staleness 2", {"sync": "ps", "ps": {"staleness": 2}}),
    ("gossip D-PSGD ring", {"sync": "gossip"}),
    ("gossip D-PSGD exponential", {"sync": "gossip", "gossip": {"graph": "exponential"}}),
    ("gossip D-PSGD torus 4x4", {"sync": "gossip", "gossip": {"graph": "torus"}}),
    ("gossip AD-PSGD ring", {"sync": "gossip", "gossip": {"algorithm": "ad-psgd"}}),
]


def _graph(n: int, bandwidth: str = "100Gbps", hosts: int = 2) -> dict[str, Any]:
    """n single-GPU hosts and ``hosts`` CPU parameter-server hosts on one switch (a cluster.graph)."""
    nodes = [{"name": f"g{i}", "kind": "gpu"} for i in range(n)] + [
        {"name": f"ps{j}", "kind": "cpu"} for j in range(hosts)] + [{"name": "sw", "kind": "switch"}]
    links = [{"a": x["name"], "b": "sw", "bandwidth": bandwidth, "latency": "1us"} for x in nodes[:-1]]
    return {"nodes": nodes, "links": links}


def _write(tmp: str, doc: dict[str, Any], name: str) -> str:
    import pathlib  # a graph file for the cluster

    import yaml  # the cluster.graph file format

    path = pathlib.Path(tmp) / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def bound_by(r: Result) -> str:
    """What bounds the iteration: the compute, or the busiest link (and how busy it is)."""
    if r.breakdown.exposed_comm_s < 0.05 * r.iteration_time_s:
        return "compute (comm hidden)"
    if not r.link_utilization_top:
        return "network latency"
    a, b, u = r.link_utilization_top[0]
    return f"network: {a}->{b} {100 * u:.0f}% busy"


def table1(tmp: str) -> None:
    n = 16
    cluster = {"graph": _write(tmp, _graph(n), "sync-cluster.yaml"), "gpu": "a100-80gb"}
    for model, batch in (("resnet50", 64), ("gpt2", 8)):
        print(f"\n### {model}, {n} x A100 on one 100GbE switch, {batch} samples per GPU\n")
        print("| scheme | ms / iteration | MB sent / GPU / iteration | bound by |")
        print("|---|---:|---:|---|")
        for name, plan in SCHEMES:
            r = simulate(scenario_from_dict({"cluster": cluster, "model": model, "batch": batch * n, "plan": plan}))
            sent = bytes_sent_per_node(r.tasks)
            per_gpu = max((v for k, v in sent.items() if k.startswith("g")), default=0)
            print(f"| {name} | {1e3 * r.iteration_time_s:.1f} | {per_gpu / 1e6:.1f} | {bound_by(r)} |")


def table2(tmp: str) -> None:
    variants = [("plain PS", {"wait_free": False, "sfb": False}), ("WFBP", {"sfb": False}), ("Poseidon", {})]
    for classes, label, bw in ((1000, "VGG-16", "40Gbps"), (21841, "VGG-16-22K", "40Gbps"),
                               (21841, "VGG-16-22K", "10Gbps")):
        print(f"\n### {label}, fp32, 32 images per node, P100 nodes over {bw} Ethernet: speedup over 1 node\n")
        print("| nodes | " + " | ".join(v for v, _ in variants) + " | MB sent/node: plain PS | Poseidon |")
        print("|---:|" + "---:|" * (len(variants) + 2))
        base: dict[str, float] = {}
        for n in (1, 2, 4, 8, 16, 32):
            cl = {"graph": _write(tmp, _graph(n, bw, 0), f"poseidon-{n}-{bw}.yaml"), "gpu": "p100"}
            cells, sent = [], []
            for v, ps in variants:
                r = simulate(scenario_from_dict({"cluster": cl, "model": {"name": "vgg16", "num_classes": classes},
                                                 "batch": 32 * n, "plan": {"dtype": "fp32", "sync": "ps", "ps": ps}}))
                base.setdefault(v, r.iteration_time_s)
                cells.append(f"{n * base[v] / r.iteration_time_s:.1f}x")
                sent.append(max(bytes_sent_per_node(r.tasks).values(), default=0) / 1e6)
            print(f"| {n} | " + " | ".join(cells) + f" | {sent[0]:.0f} | {sent[2]:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=int, choices=(1, 2), help="print only this table")
    args = ap.parse_args()
    import tempfile  # the graph files live only as long as the run

    with tempfile.TemporaryDirectory() as tmp:
        if args.table in (None, 1):
            table1(tmp)
        if args.table in (None, 2):
            table2(tmp)


if __name__ == "__main__":
    main()
