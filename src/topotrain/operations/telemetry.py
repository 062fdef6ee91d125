"""GPU telemetry in a DCGM-like CSV layout: the schema, a reader, a writer, and a SYNTHETIC generator.

**Layout** (one row per GPU per sample; extra columns are ignored, so a wider DCGM export reads as is):

============== ======================= =============================================================
column          DCGM field               meaning
============== ======================= =============================================================
time_s          (sample timestamp)       seconds since the start of the record
gpu             (UUID / host:index)      the GPU (a board: its counters restart after a replacement)
gpu_temp_c      DCGM_FI_DEV_GPU_TEMP      GPU temperature, °C
mem_temp_c      DCGM_FI_DEV_MEMORY_TEMP   HBM temperature, °C
power_w         DCGM_FI_DEV_POWER_USAGE   board power, W
sm_clock_mhz    DCGM_FI_DEV_SM_CLOCK      SM clock, MHz
gpu_util_pct    DCGM_FI_DEV_GPU_UTIL      utilization, %
fb_used_mib     DCGM_FI_DEV_FB_USED       frame buffer used, MiB
ecc_sbe_total   DCGM_FI_DEV_ECC_SBE_VOL_TOTAL  correctable (single-bit) ECC errors, a running count
ecc_dbe_total   DCGM_FI_DEV_ECC_DBE_VOL_TOTAL  uncorrectable (double-bit) ECC errors, a running count
xid             DCGM_FI_DEV_XID_ERRORS    the last XID event since the previous sample (0: none)
failed          (the label)              1 on the sample at which the GPU failed and left service
============== ======================= =============================================================

A GPU's rows after a ``failed`` row belong to its replacement (a new *life*: counters may restart at 0).

**Synthetic telemetry** (:func:`synthetic_telemetry`) is for tests and examples only. Every rate and shape in
:class:`SyntheticAssumptions` is an ASSUMPTION, none measured: the precursors follow what field studies
report qualitatively — correctable ECC errors and page retirements (XID 48 double-bit error, XID 63 row
remapping / page retirement pending, XID 79 GPU fallen off the bus) precede hardware failures (NVIDIA XID
catalogue; Ostrouchov et al., SC'20, on Titan: DBE and off-the-bus failures, hotter positions failing
sooner), and GPUs run hotter before they fail — but how strongly, how early and how often are our choices.
A predictor's precision and recall on synthetic telemetry measure the generator, not a fleet.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError

HOUR_S = 3600.0
#: XID codes taken as hardware precursors (NVIDIA's XID catalogue: 48 double-bit ECC error, 63 ECC page
#: retirement / row remapping pending, 64 row remap failure, 79 GPU fallen off the bus, 92 high single-bit
#: ECC rate, 94/95 contained/uncontained ECC error).
PRECURSOR_XIDS = (48, 63, 64, 79, 92, 94, 95)
#: Read at most this many rows (a bigger fleet: split the file by time).
MAX_ROWS = 5_000_000


class TelemetryRow(BaseModel):
    """One telemetry sample: the CSV layout's schema (bounds are physical plausibility, not a spec)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False, str_strip_whitespace=True)
    time_s: Annotated[float, Field(ge=0, le=1e10)]
    gpu: Annotated[str, Field(min_length=1, max_length=200)]
    gpu_temp_c: Annotated[float, Field(ge=-40, le=150)]
    mem_temp_c: Annotated[float, Field(ge=-40, le=150)]
    power_w: Annotated[float, Field(ge=0, le=5000)]
    sm_clock_mhz: Annotated[float, Field(ge=0, le=10_000)]
    gpu_util_pct: Annotated[float, Field(ge=0, le=100)]
    fb_used_mib: Annotated[float, Field(ge=0, le=1e7)]
    ecc_sbe_total: Annotated[int, Field(ge=0)]
    ecc_dbe_total: Annotated[int, Field(ge=0)]
    xid: Annotated[int, Field(ge=0, le=1000)]
    failed: Annotated[int, Field(ge=0, le=1)]


COLUMNS: tuple[str, ...] = tuple(TelemetryRow.model_fields)
#: The numeric columns (every column but ``gpu``), in the layout's order.
NUMERIC: tuple[str, ...] = tuple(c for c in COLUMNS if c != "gpu")


@dataclass(frozen=True)
class Telemetry:
    """Telemetry as arrays, sorted by (GPU, time): ``gpu`` indexes ``gpus``; ``life`` numbers each GPU's
    boards (a row after a ``failed`` row starts the next life)."""

    gpus: tuple[str, ...]
    gpu: np.ndarray
    time_s: np.ndarray
    gpu_temp_c: np.ndarray
    mem_temp_c: np.ndarray
    power_w: np.ndarray
    sm_clock_mhz: np.ndarray
    gpu_util_pct: np.ndarray
    fb_used_mib: np.ndarray
    ecc_sbe_total: np.ndarray
    ecc_dbe_total: np.ndarray
    xid: np.ndarray
    failed: np.ndarray
    source: str = "telemetry"

    @property
    def rows(self) -> int:
        return int(self.time_s.size)

    @property
    def life(self) -> np.ndarray:
        """A global life number per row: a new GPU, or the row after a failure, starts a new life."""
        new = np.ones(self.rows, bool)
        new[1:] = (self.gpu[1:] != self.gpu[:-1]) | (self.failed[:-1] == 1)
        return np.cumsum(new) - 1

    def failures(self) -> int:
        return int(self.failed.sum())

    def column(self, name: str) -> np.ndarray:
        return np.asarray(getattr(self, name))


def _from_columns(gpu_names: list[str], cols: dict[str, np.ndarray], source: str) -> Telemetry:
    gpus = tuple(sorted(set(gpu_names), key=lambda g: (len(g), g)))
    index = {g: i for i, g in enumerate(gpus)}
    gi = np.array([index[g] for g in gpu_names], dtype=np.int64)
    order = np.lexsort((cols["time_s"], gi))
    gi = gi[order]
    t = cols["time_s"][order]
    dup = (gi[1:] == gi[:-1]) & (t[1:] == t[:-1])
    if dup.any():
        k = int(np.argmax(dup))
        raise ConfigError(f"{source}: gpu {gpus[gi[k]]}", f"two samples at time_s {t[k]:g}",
                          "keep one row per GPU and time")
    ints = ("ecc_sbe_total", "ecc_dbe_total", "xid", "failed")
    arrays = {c: cols[c][order].astype(np.int64 if c in ints else float) for c in NUMERIC}
    return Telemetry(gpus, gi, **arrays, source=source)


def read_telemetry(path: str | Path) -> Telemetry:
    """The telemetry CSV at ``path``; a bad value is one ConfigError naming the file, row and column."""
    p = Path(path)
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise ConfigError(f"{p}", f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                              f"the header needs {','.join(COLUMNS)} (docs/operations.md §6)")
        names: list[str] = []
        values: dict[str, list[float]] = {c: [] for c in NUMERIC}
        for n, raw in enumerate(reader, start=2):  # row 1 is the header
            if n - 1 > MAX_ROWS:
                raise ConfigError(f"{p}", f"more than {MAX_ROWS:,} rows", "split the file by time")
            try:
                row = TelemetryRow.model_validate({c: raw.get(c) for c in COLUMNS})
            except ValidationError as e:
                err = e.errors()[0]
                col = str(err["loc"][0]) if err["loc"] else "?"
                got = str(raw.get(col))[:40]
                raise ConfigError(f"{p}:row {n}, column {col}", f"{err['msg'].lower()} (got {got!r})",
                                  "fix or drop the row") from None
            names.append(row.gpu)
            for c in NUMERIC:
                values[c].append(getattr(row, c))
    if not names:
        raise ConfigError(f"{p}", "no telemetry rows", "the file has a header only")
    return _from_columns(names, {c: np.asarray(v) for c, v in values.items()}, str(p))


def to_csv(tel: Telemetry) -> str:
    """The layout's CSV text of ``tel`` (integers as integers, other values to 3 decimals)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    ints = {"ecc_sbe_total", "ecc_dbe_total", "xid", "failed"}
    cols = {c: tel.column(c) for c in NUMERIC}

    def fmt(c: str, x: float) -> str:
        return str(int(x)) if c in ints else f"{x:.3f}".rstrip("0").rstrip(".")

    for i in range(tel.rows):
        w.writerow([tel.gpus[tel.gpu[i]] if c == "gpu" else fmt(c, cols[c][i]) for c in COLUMNS])
    return buf.getvalue()


def write_telemetry(tel: Telemetry, path: str | Path) -> None:
    """Write ``tel`` as the layout's CSV, atomically."""
    atomic_write_text(path, to_csv(tel), make_parents=True, field="--write-telemetry")


@dataclass(frozen=True)
class SyntheticAssumptions:
    """The SYNTHETIC generator's assumptions: every number is our choice, not a measurement (module docs).

    Failures are a renewal process per GPU slot (Weibull, mean ``mtbf_h``, accelerated far beyond real
    fleets so a small file holds enough failures to learn from); a failed board is replaced after
    ``repair_h``. A fraction ``precursor_fraction`` of failures announce themselves over a window of
    ``precursor_h`` hours (uniform in the range) in which a degradation ``d`` ramps from 0 to 1
    (quadratically) and drives: correctable ECC errors at ``sbe_base_per_h + sbe_peak_per_h · d`` per hour,
    precursor XIDs (48/63/79, weights ``xid_weights``) with probability ``xid_peak_per_h · d`` per hour,
    ``temp_drift_c · d`` °C of thermal drift and ``clock_drop_mhz · d`` of SM-clock throttling. The other
    failures strike without warning. Healthy boards show background correctable errors, benign XIDs
    (13, 31, 43) and, rarely, a precursor XID (``false_xid_per_h``); a share ``hot_fraction`` of boards run
    ``hot_offset_c`` hotter all their life (a confounder)."""

    mtbf_h: float = 720.0
    weibull_shape: float = 1.0
    repair_h: float = 24.0
    precursor_fraction: float = 0.75
    precursor_h: tuple[float, float] = (12.0, 72.0)
    sbe_base_per_h: float = 0.05
    sbe_peak_per_h: float = 12.0
    xid_peak_per_h: float = 0.25
    xid_weights: tuple[float, float, float] = (0.3, 0.6, 0.1)
    temp_drift_c: float = 7.0
    clock_drop_mhz: float = 120.0
    benign_xid_per_h: float = 0.004
    false_xid_per_h: float = 0.0015
    hot_fraction: float = 0.1
    hot_offset_c: float = 6.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            for x in (v if isinstance(v, tuple) else (v,)):
                if not (isinstance(x, int | float) and math.isfinite(x) and x >= 0):
                    raise ConfigError(f"synthetic.{f.name}", f"must be ≥ 0, got {v!r}", "give a number ≥ 0")
        if self.mtbf_h <= 0 or self.weibull_shape <= 0 or not 0 <= self.precursor_fraction <= 1:
            raise ConfigError("synthetic", "mtbf_h and weibull_shape must be > 0, precursor_fraction in [0, 1]",
                              "check the assumptions")
        if not 0 < self.precursor_h[0] <= self.precursor_h[1]:
            raise ConfigError("synthetic.precursor_h", f"must be a range (lo, hi), 0 < lo ≤ hi, got "
                              f"{self.precursor_h!r}", "e.g. (12, 72)")


def synthetic_telemetry(gpus: int = 32, days: float = 30.0, step_s: float = HOUR_S, seed: int = 0,
                        assume: SyntheticAssumptions | None = None) -> Telemetry:
    """SYNTHETIC telemetry of ``gpus`` GPU slots over ``days``, one sample every ``step_s`` (seeded; every
    signal per :class:`SyntheticAssumptions`). Rows of a slot under repair are absent."""
    a = assume or SyntheticAssumptions()
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 100_000:
        raise ConfigError("--gpus", f"must be a whole number in [1, 100000], got {gpus!r}", "e.g. 32")
    if not (0 < days <= 3650 and 60 <= step_s <= 86_400 and days * 86_400 / step_s * gpus <= MAX_ROWS):
        raise ConfigError("--days", f"{days!r} days at {step_s!r} s for {gpus} GPUs is out of range",
                          f"at most {MAX_ROWS:,} rows, step 60 s to 1 day")
    rng = np.random.default_rng(seed)
    n_t = int(days * 86_400 // step_s)
    t = np.arange(n_t) * step_s
    step_h = step_s / HOUR_S
    scale_h = a.mtbf_h / math.gamma(1.0 + 1.0 / a.weibull_shape)
    alive = np.ones((gpus, n_t), bool)
    failed = np.zeros((gpus, n_t), np.int64)
    degr = np.zeros((gpus, n_t))
    life_start = np.zeros((gpus, n_t), np.int64)  # the sample a board's life began (counters restart)
    for g in range(gpus):
        start_h = 0.0
        while True:
            fail_h = start_h + scale_h * rng.weibull(a.weibull_shape)
            k = int(fail_h * HOUR_S // step_s)
            s0 = int(math.ceil(start_h * HOUR_S / step_s - 1e-9))
            life_start[g, s0:] = s0
            if k >= n_t:
                break
            failed[g, k] = 1
            if rng.random() < a.precursor_fraction:
                span = rng.uniform(*a.precursor_h)
                lo = max(s0, int((fail_h - span) * HOUR_S // step_s))
                idx = np.arange(lo, k + 1)
                degr[g, idx] = np.clip(1.0 - (fail_h - t[idx] / HOUR_S) / span, 0.0, 1.0) ** 2
            start_h = fail_h + a.repair_h
            back = min(n_t, int(math.ceil(start_h * HOUR_S / step_s - 1e-9)))
            alive[g, k + 1:back] = False
            if back >= n_t:
                break
    hot = (rng.random(gpus) < a.hot_fraction)[:, None] * a.hot_offset_c
    base_temp = rng.normal(62.0, 3.0, (gpus, 1)) + hot
    util = np.where(rng.random((gpus, n_t)) < 0.08, rng.uniform(0, 25, (gpus, n_t)),
                    rng.uniform(88, 100, (gpus, n_t)))
    load = util / 100.0
    temp = base_temp - 18.0 * (1 - load) + a.temp_drift_c * degr + rng.normal(0, 1.5, (gpus, n_t))
    mem_temp = temp + 6.0 + rng.normal(0, 1.0, (gpus, n_t))
    power = 120.0 + 520.0 * load + rng.normal(0, 25.0, (gpus, n_t))
    clock = 1980.0 - 40.0 * np.clip(temp - 75.0, 0, None) - a.clock_drop_mhz * degr + rng.normal(0, 15, (gpus, n_t))
    fb = 20_000.0 + 55_000.0 * load + rng.normal(0, 500, (gpus, n_t))
    sbe_new = rng.poisson((a.sbe_base_per_h + a.sbe_peak_per_h * degr) * step_h)
    dbe_new = failed * (rng.random((gpus, n_t)) < 0.3)
    p_pre = np.clip(a.xid_peak_per_h * degr * step_h, 0, 1)
    pre = (rng.random((gpus, n_t)) < p_pre) | (rng.random((gpus, n_t)) < a.false_xid_per_h * step_h)
    benign = rng.random((gpus, n_t)) < a.benign_xid_per_h * step_h
    w = np.asarray(a.xid_weights, float)
    pre_code = np.array([48, 63, 79])[rng.choice(3, size=(gpus, n_t), p=w / w.sum())]
    xid = np.where(pre, pre_code, np.where(benign, rng.choice([13, 31, 43], size=(gpus, n_t)), 0))
    xid = np.where(failed == 1, np.where(dbe_new > 0, 48, 79), xid)

    def running(new: np.ndarray) -> np.ndarray:  # a running count that restarts with each board
        c = np.cumsum(new, axis=1)
        before = np.concatenate((np.zeros((gpus, 1), new.dtype), c[:, :-1]), axis=1)
        return c - np.take_along_axis(before, life_start, axis=1)

    sbe, dbe = running(sbe_new), running(dbe_new)
    gi, ti = np.nonzero(alive)
    names = [f"gpu{g:04d}" for g in range(gpus)]
    tel = Telemetry(tuple(names), gi.astype(np.int64), t[ti].astype(float),
                    np.round(temp[gi, ti], 2), np.round(mem_temp[gi, ti], 2), np.round(np.maximum(power[gi, ti], 0), 1),
                    np.round(np.maximum(clock[gi, ti], 0), 0), np.round(util[gi, ti], 1),
                    np.round(np.maximum(fb[gi, ti], 0), 0), sbe[gi, ti].astype(np.int64),
                    dbe[gi, ti].astype(np.int64), xid[gi, ti].astype(np.int64), failed[gi, ti],
                    source=f"synthetic (seed {seed}; assumptions: topotrain.operations.telemetry.SyntheticAssumptions)")
    return tel
