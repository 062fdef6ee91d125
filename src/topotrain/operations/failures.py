"""What fails in a training cluster, how often, and what each failure takes with it.

A :class:`FailureClass` is one cause of job interruption (a faulty GPU, an HBM error, a software bug): a
per-component mean time between failures (``mtbf_s``) of the components it strikes (``scope``: every GPU,
server, NIC, network switch, inter-server link, or the job as a whole), a lifetime law (exponential, or
Weibull with shape ``k`` and the same mean, scale ``mtbf / Γ(1 + 1/k)``), what one failure takes out of the
job (``takes``: nothing but a restart, its server, or every server under a leaf switch: correlated
failures) and how long the taken hardware is away (``repair_s``). A :class:`FailureModel` is a set of
classes plus the detection and restart times every interruption costs.

Defaults (:func:`llama3_model`) are the Llama 3 paper's 54-day snapshot of the 405B pre-training on 16,384
H100 GPUs (Dubey et al., "The Llama 3 Herd of Models", 2024, §3.3.4, Table 5: 419 unexpected
interruptions by root cause; docs/sources.md). Each row becomes a class whose per-component rate is
``count / (components · 54 days)``, with the components counted on that cluster: 16,384 GPUs, 2,048
8-GPU servers, 16,384 NICs (one 400 Gb/s NIC per GPU, as the paper's RoCE fabric gives each GPU), one job.
On another cluster the same per-component rates scale with its own counts (:func:`component_counts`).
The paper gives no detection, restart or repair times: those defaults are assumptions, named as such.

Drawing failures (:func:`draw_failures`) costs the failures, not the components or the iterations: an
exponential class over ``n`` components is a Poisson process of rate ``n/mtbf`` (counts per sample drawn
at once, times uniform over the horizon); a Weibull class draws how many of its components fail before
the horizon (binomial, components new at time 0), their times by the inverse of the truncated law, and
then each failed component's renewals (new after its repair) until none falls inside the horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import numpy as np

from topotrain.cluster import Cluster
from topotrain.topology.elements import NodeKind
from topotrain.util.errors import ConfigError

Scope = Literal["gpu", "server", "nic", "switch", "link", "job"]
Takes = Literal["none", "server", "switch"]
Distribution = Literal["exponential", "weibull"]
SCOPES: tuple[str, ...] = get_args(Scope)
TAKES: tuple[str, ...] = get_args(Takes)
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)

DAY_S = 86_400.0
HOUR_S = 3_600.0
#: The Llama 3 snapshot (Dubey et al. 2024, §3.3.4): its length and the cluster it ran on.
LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16_384
LLAMA3_GPUS_PER_SERVER = 8
#: Table 5 of Dubey et al. 2024: (component, category, interruptions in 54 days, scope, takes). The
#: paper's percentages are count/419 for every row but "Faulty GPU", printed 30.1% (148/419 is 35.3%).
LLAMA3_TABLE5: tuple[tuple[str, str, int, Scope, Takes], ...] = (
    ("faulty-gpu", "GPU", 148, "gpu", "server"),
    ("gpu-hbm3-memory", "GPU", 72, "gpu", "server"),
    ("software-bug", "Dependency", 54, "gpu", "none"),
    ("network-switch-cable", "Network", 35, "nic", "server"),
    ("host-maintenance", "Unplanned Maintenance", 32, "server", "server"),
    ("gpu-sram-memory", "GPU", 19, "gpu", "server"),
    ("gpu-system-processor", "GPU", 17, "gpu", "server"),
    ("nic", "Host", 7, "nic", "server"),
    ("nccl-watchdog-timeout", "Unknown", 7, "gpu", "none"),
    ("silent-data-corruption", "GPU", 6, "gpu", "server"),
    ("gpu-thermal-interface-sensor", "GPU", 6, "gpu", "server"),
    ("ssd", "Host", 3, "server", "server"),
    ("power-supply", "Host", 3, "server", "server"),
    ("server-chassis", "Host", 2, "server", "server"),
    ("io-expansion-board", "Host", 2, "server", "server"),
    ("dependency", "Dependency", 2, "job", "none"),
    ("cpu", "Host", 2, "server", "server"),
    ("system-memory", "Host", 2, "server", "server"),
)
LLAMA3_UNEXPECTED = 419
#: Assumed (no published figure behind them; override in the failures YAML): a hung collective is noticed
#: by the job's watchdog, a restart reschedules and re-initializes the job, a taken server is swapped by
#: the operators or repaired.
DEFAULT_DETECT_S = 5 * 60.0
DEFAULT_RESTART_S = 10 * 60.0
DEFAULT_REPAIR_S = 24 * HOUR_S
SOURCE_LLAMA3 = "Dubey et al. 2024, The Llama 3 Herd of Models, §3.3.4 Table 5 (54 days, 16,384 H100)"


@dataclass(frozen=True)
class FailureClass:
    """One cause of interruption. ``mtbf_s`` is per component of ``scope`` (for ``job``: of the job).

    ``takes``: what one failure removes from the job until ``repair_s`` has passed — nothing (a restart
    suffices: software), its server, or the servers under its leaf switch (a correlated failure)."""

    name: str
    mtbf_s: float
    scope: Scope = "gpu"
    takes: Takes = "server"
    repair_s: float = DEFAULT_REPAIR_S
    distribution: Distribution = "exponential"
    shape: float = 1.0
    category: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        f = f"failures.classes.{self.name}"
        if not (self.mtbf_s > 0 and math.isfinite(self.mtbf_s)):
            raise ConfigError(f"{f}.mtbf", f"must be a positive duration, got {self.mtbf_s!r} s", "e.g. 80000h")
        if not (self.repair_s >= 0 and math.isfinite(self.repair_s)):
            raise ConfigError(f"{f}.repair", f"must be a duration ≥ 0, got {self.repair_s!r} s", "e.g. 24h")
        if self.scope not in SCOPES:
            raise ConfigError(f"{f}.scope", f"unknown scope {self.scope!r}", f"use one of {', '.join(SCOPES)}")
        if self.takes not in TAKES:
            raise ConfigError(f"{f}.takes", f"unknown value {self.takes!r}", f"use one of {', '.join(TAKES)}")
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"{f}.distribution", f"unknown law {self.distribution!r}",
                              "use exponential or weibull")
        if not (0.05 <= self.shape <= 20):
            raise ConfigError(f"{f}.shape", f"must be in [0.05, 20], got {self.shape!r}",
                              "k < 1: infant mortality, 1: exponential, > 1: wear-out")

    @property
    def weibull_scale_s(self) -> float:
        """Scale λ of the Weibull law with mean ``mtbf_s``: ``mtbf / Γ(1 + 1/k)``."""
        return self.mtbf_s / math.gamma(1.0 + 1.0 / self.shape)


@dataclass(frozen=True)
class ComponentCounts:
    """How many components of each scope a job runs on, and how many servers one failure takes."""

    gpus: int
    servers: int
    nics: int
    switches: int
    links: int
    gpus_per_server: int
    #: servers under one leaf switch (what a ``takes: switch`` failure removes)
    servers_per_switch: int = 1

    def of(self, scope: str) -> int:
        return {"gpu": self.gpus, "server": self.servers, "nic": self.nics, "switch": self.switches,
                "link": self.links, "job": 1}[scope]

    def servers_taken(self, takes: str) -> int:
        return {"none": 0, "server": 1, "switch": self.servers_per_switch}[takes]


def llama3_counts() -> ComponentCounts:
    """The Llama 3 405B cluster as the defaults count it (16,384 GPUs in 2,048 servers, a NIC per GPU)."""
    servers = LLAMA3_GPUS // LLAMA3_GPUS_PER_SERVER
    return ComponentCounts(gpus=LLAMA3_GPUS, servers=servers, nics=LLAMA3_GPUS, switches=0, links=0,
                           gpus_per_server=LLAMA3_GPUS_PER_SERVER)


def component_counts(cluster: Cluster) -> ComponentCounts:
    """Components of a built cluster: GPUs, servers, NICs (a GPU-level network without NIC nodes counts one
    per GPU), network switches, inter-server links (a cable counted once), servers per leaf switch."""
    topo = cluster.topology
    nodes = topo.nodes
    nics = len(topo.nodes_of_kind(NodeKind.NIC)) or len(topo.gpus)
    switches = topo.nodes_of_kind(NodeKind.SWITCH)
    cables = {frozenset((lk.src, lk.dst)) for lk in topo.links
              if nodes[lk.src].server is None or nodes[lk.dst].server is None}
    under: dict[str, set[str]] = {}
    for lk in topo.links:
        a, b = nodes[lk.src], nodes[lk.dst]
        if a.kind is NodeKind.SWITCH and b.server is not None:
            under.setdefault(lk.src, set()).add(b.server)
    per_leaf = max((len(v) for v in under.values()), default=1)
    return ComponentCounts(gpus=len(topo.gpus), servers=max(1, cluster.servers), nics=nics,
                           switches=len(switches), links=len(cables),
                           gpus_per_server=max(1, cluster.gpus_per_server), servers_per_switch=max(1, per_leaf))


@dataclass(frozen=True)
class FailureModel:
    """The failure classes of a job and what an interruption costs before computing resumes."""

    classes: tuple[FailureClass, ...]
    detect_s: float = DEFAULT_DETECT_S
    restart_s: float = DEFAULT_RESTART_S
    #: a failed server is swapped for one of the cluster's free pool after this long (None: no free pool,
    #: the job waits for the repair); hot spares (the policy's) swap at once
    replace_s: float | None = 3600.0
    source: str = field(default="", compare=False)

    def rates_per_s(self, counts: ComponentCounts) -> np.ndarray:
        """Failures per second of the job from each class (mean rates; a Weibull class's long-run rate)."""
        return np.array([counts.of(c.scope) / c.mtbf_s for c in self.classes])

    def job_mtbf_s(self, counts: ComponentCounts) -> float:
        """Mean time between interruptions of the job (every class, superposed)."""
        total = float(self.rates_per_s(counts).sum())
        return math.inf if total <= 0 else 1.0 / total

    def away_s(self, c: FailureClass) -> float:
        """How long a server taken by class ``c`` is missing from the job: swapped from the free pool, or
        repaired, whichever comes first."""
        return c.repair_s if self.replace_s is None else min(self.replace_s, c.repair_s)

    def scaled(self, factor: float) -> FailureModel:
        """Every class ``factor`` times as frequent (a sensitivity study)."""
        return replace(self, classes=tuple(replace(c, mtbf_s=c.mtbf_s / factor) for c in self.classes))


def llama3_classes(repair_s: float = DEFAULT_REPAIR_S) -> tuple[FailureClass, ...]:
    """Table 5 of the Llama 3 paper as per-component failure classes (see the module docstring)."""
    counts = llama3_counts()
    span_s = LLAMA3_DAYS * DAY_S
    out = []
    for name, category, n, scope, takes in LLAMA3_TABLE5:
        out.append(FailureClass(name=name, mtbf_s=counts.of(scope) * span_s / n, scope=scope, takes=takes,
                                repair_s=repair_s if takes != "none" else 0.0, category=category,
                                source=SOURCE_LLAMA3))
    return tuple(out)


def llama3_model() -> FailureModel:
    """The default failure model: Llama 3's rates, assumed detection, restart, replacement and repair."""
    return FailureModel(llama3_classes(), source=SOURCE_LLAMA3)


@dataclass(frozen=True)
class Failures:
    """Failures of ``samples`` independent runs over ``[0, horizon_s)``, one row per run, in time order;
    rows are padded with ``inf`` times (``cls`` −1)."""

    time_s: np.ndarray
    cls: np.ndarray
    servers: np.ndarray
    away_s: np.ndarray
    horizon_s: float

    @property
    def samples(self) -> int:
        return int(self.time_s.shape[0])

    def counts_by_class(self, n_classes: int, until_s: np.ndarray | float | None = None) -> np.ndarray:
        """Failures of each class per run (``samples × classes``), those before ``until_s`` only if given."""
        ok = self.cls >= 0
        if until_s is not None:
            ok &= self.time_s < np.broadcast_to(np.asarray(until_s, dtype=float).reshape(-1, 1), self.time_s.shape)
        rows = np.broadcast_to(np.arange(self.samples)[:, None], self.cls.shape)[ok]
        out = np.zeros((self.samples, n_classes), dtype=np.int64)
        np.add.at(out, (rows, self.cls[ok]), 1)
        return out


def _weibull_times(c: FailureClass, n: int, samples: int, horizon_s: float, rng: np.random.Generator,
                   away_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(run, time) of every failure of a Weibull class: first failures of components new at 0, then each
    failed component's renewals (new again once back, ``away_s`` after failing), inside the horizon."""
    lam, k = c.weibull_scale_s, c.shape
    p = -math.expm1(-((horizon_s / lam) ** k))
    first = rng.binomial(n, p, size=samples)
    run = np.repeat(np.arange(samples), first)
    u = rng.random(run.size)
    t = lam * (-np.log1p(-u * p)) ** (1.0 / k)  # inverse CDF of the law truncated to [0, horizon)
    runs, times = [run], [t]
    while t.size:
        t = t + away_s + rng.weibull(k, size=t.size) * lam
        keep = t < horizon_s
        run, t = run[keep], t[keep]
        runs.append(run)
        times.append(t)
    return np.concatenate(runs), np.concatenate(times)


def draw_failures(model: FailureModel, counts: ComponentCounts, samples: int, horizon_s: float,
                  rng: np.random.Generator) -> Failures:
    """Every failure of ``samples`` runs over ``[0, horizon_s)``, drawn in bulk (work ∝ failures)."""
    runs, times, classes = [], [], []
    for i, c in enumerate(model.classes):
        n = counts.of(c.scope)
        if n == 0:
            continue
        if c.distribution == "exponential" or c.shape == 1.0:
            k = rng.poisson(n * horizon_s / c.mtbf_s, size=samples)
            run = np.repeat(np.arange(samples), k)
            t = rng.random(run.size) * horizon_s
        else:
            run, t = _weibull_times(c, n, samples, horizon_s, rng, model.away_s(c))
        runs.append(run)
        times.append(t)
        classes.append(np.full(run.size, i, dtype=np.int64))
    run = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
    t = np.concatenate(times) if times else np.zeros(0)
    cl = np.concatenate(classes) if classes else np.zeros(0, dtype=np.int64)
    order = np.lexsort((t, run))
    run, t, cl = run[order], t[order], cl[order]
    per = np.bincount(run, minlength=samples)
    width = max(1, int(per.max()) if per.size else 1)
    col = np.arange(run.size) - np.repeat(np.cumsum(per) - per, per)
    time_s = np.full((samples, width), np.inf)
    cls = np.full((samples, width), -1, dtype=np.int64)
    time_s[run, col] = t
    cls[run, col] = cl
    taken = np.array([counts.servers_taken(c.takes) for c in model.classes] + [0], dtype=np.int64)
    away = np.array([model.away_s(c) for c in model.classes] + [0.0])
    return Failures(time_s, cls, taken[cls], away[cls], horizon_s)
