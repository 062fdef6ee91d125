"""Weak-scaling curves: the same per-GPU batch on more servers, against ideal linear scaling.

For each GPU count N (powers of two between LOW and HIGH that fill whole servers) the scenario is re-run
with ``cluster.servers = N / gpus_per_server`` and the global batch scaled by N / N0. At the scenario's own
size the network is exactly the file's (so that point equals ``topotrain simulate``); at every other size
the network's size parameters (switch counts, radix, k, dims, ...) are dropped so that the builder sizes
its network for the new endpoint count, and each point records the sizes the builder chose
(:attr:`ScalePoint.network`), which the CLI prints. Efficiency = throughput(N) / (throughput(N0) · N / N0).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.report.draw import check_picture_path
from topotrain.scenario.cluster import read_yaml
from topotrain.scenario.load import apply_overrides, scenario_from_dict
from topotrain.training.bands import describe as describe_band
from topotrain.training.simulate import simulate
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError

_SIZE_KEYS = ("switches", "radix", "k", "leaves", "spines", "endpoints_per_leaf", "dims", "groups",
              "routers_per_group", "global_links_per_router", "endpoints_per_router", "servers_per_block")


@dataclass(frozen=True)
class ScalePoint:
    gpus: int
    servers: int
    iteration_time_s: float
    samples_per_s: float
    ideal_samples_per_s: float
    efficiency: float
    mfu: float
    #: the network's size parameters at this point: the file's (``"as in the file"``), or those the
    #: builder chose once the file's were dropped, e.g. ``"switches=16, radix=16"``
    network: str = "as in the file"
    #: the prediction's error band (topotrain.training.bands): iteration time ×/÷ (1 + plus_minus)
    iteration_time_s_low: float = 0.0
    iteration_time_s_high: float = 0.0
    #: where the band comes from (:func:`topotrain.training.bands.describe`; says when it is borrowed)
    band: str = ""

    def to_dict(self) -> dict[str, float | str]:
        return dict(vars(self))


def scaling_curve(path: str | Path, lo: int, hi: int, overrides: list[str],
                  progress: Callable[[int, int], Any] | None = None) -> list[ScalePoint]:
    base = read_yaml(path)
    if not isinstance(base, dict) or "cluster" not in base:
        raise ConfigError("scenario", f"{path} has no cluster section", "see examples/")
    base = apply_overrides(base, overrides)
    probe = scenario_from_dict(base, Path(path).parent)  # checks every field before the dict is used below
    if "graph" in base["cluster"]:
        raise ConfigError("cluster.graph", "a user graph has a fixed size", "scale a server-based cluster")
    per_server = probe.cluster.gpus_per_server
    gpus0 = len(probe.cluster.topology.gpus)
    batch0 = probe.plan.global_batch
    counts = []
    n = 1
    while n <= hi:
        if n >= lo and n % per_server == 0 and n % (probe.plan.tp * probe.plan.cp * probe.plan.pp) == 0:
            counts.append(n)
        n *= 2
    if not counts:
        raise ConfigError("--gpus", f"no power of two in {lo}:{hi} fills whole {per_server}-GPU servers",
                          f"use a range that reaches at least {per_server}")
    points: list[ScalePoint] = []
    for i, n in enumerate(counts):
        d = copy.deepcopy(base)
        d["cluster"]["servers"] = n // per_server
        net = d["cluster"].get("network")
        dropped = []
        if isinstance(net, dict) and n != gpus0:
            dropped = [k for k in _SIZE_KEYS if k in net]
            for k in _SIZE_KEYS:
                net.pop(k, None)
        batch = batch0 * n // gpus0
        d["batch"] = batch
        d.setdefault("plan", {}).pop("global_batch", None)
        d["plan"].pop("dp", None)
        sc = scenario_from_dict(d, Path(path).parent)
        r = simulate(sc)
        note = "as in the file"
        if n != gpus0:
            chosen = dict(sc.cluster.topology.meta.get("network_params", {}))
            sizes = {k: v for k, v in chosen.items() if k in _SIZE_KEYS}
            note = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "sized by the builder"
            if dropped:
                note += " (resized)"
        if not points:
            ideal = r.samples_per_s
            ref = (n, r.samples_per_s)
        else:
            ideal = ref[1] * n / ref[0]
        points.append(ScalePoint(n, n // per_server, r.iteration_time_s, r.samples_per_s, ideal,
                                 r.samples_per_s / ideal if ideal else 0.0, r.mfu, note,
                                 r.iteration_time_s_low, r.iteration_time_s_high,
                                 describe_band(r.error_band.to_dict()) if r.error_band else ""))
        if progress is not None:
            progress(i + 1, len(counts))
    return points


def plot_scaling(points: list[ScalePoint], path: str | Path, title: str = "weak scaling") -> None:
    """Throughput against ideal linear scaling (log-log, ticks at the GPU counts) and efficiency; PNG, SVG
    or PDF by the file's extension, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator


    fmt = check_picture_path(path)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    g = [p.gpus for p in points]
    a.loglog(g, [p.samples_per_s for p in points], "o-", color="#1f77b4", lw=2.5, ms=7, label="predicted", zorder=2)
    a.loglog(g, [p.ideal_samples_per_s for p in points], "s--", color="#ff7f0e", mfc="none", lw=1.3, ms=9,
             label="ideal linear", zorder=3)
    a.set_ylabel("samples/s")
    a.set_title("throughput")
    a.legend()
    b.semilogx(g, [100 * p.efficiency for p in points], "o-", color="#d62728", lw=2.2)
    b.axhline(100, color="#7f7f7f", ls="--", lw=1)
    b.set_ylabel("scaling efficiency (%)")
    b.set_ylim(0, 105)
    b.set_title("efficiency vs. ideal")
    for ax in (a, b):
        ax.set_xlabel("GPUs")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(g, [str(x) for x in g])
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=100), make_parents=True)
    finally:
        plt.close(fig)
