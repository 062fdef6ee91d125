"""Jobs of a trace for :mod:`topotrain.placement`: the :class:`Job` value and the job file (YAML or CSV).

A job is data-parallel training of a catalog model on ``gpus`` GPUs for ``iterations`` iterations (per-GPU
batch ``batch``), optionally restricted to GPU types (``gpu_type``: names separated by ``|``, matched
against a fleet group's ``types``; empty: any type). Fields are bounded at the edge (one ``error:`` line
naming the field otherwise).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from topotrain.util import yamlio
from topotrain.util.errors import ConfigError

#: Latest arrival a trace may hold, seconds (about 31 years: a later one is a unit mistake).
MAX_ARRIVAL_S = 1e9
#: Most iterations, GPUs and per-GPU batch of one job.
MAX_ITERATIONS = 10**9
MAX_JOB_GPUS = 65_536
MAX_JOB_BATCH = 1 << 20
#: Longest GPU-type list (characters) of one job.
MAX_GPU_TYPE_CHARS = 200


@dataclass(frozen=True)
class Job:
    """One job of a trace."""

    name: str
    arrival_s: float
    model: str
    gpus: int
    iterations: int
    batch: int = 32
    #: GPU types the job may run on (a fleet group's ``types``); empty: any
    gpu_type: tuple[str, ...] = ()


def job_number(v: Any, field: str, hi: float, whole: bool) -> float:
    """A job's number: YAML gives int/float, CSV gives text. Whole fields (gpus, iterations, batch) refuse
    fractions and booleans; every field refuses NaN, infinities, words and values outside [0 or 1, hi]."""
    fix = f"write a {'whole number' if whole else 'number'} from {1 if whole else 0} to {hi:g}"
    if isinstance(v, bool):
        raise ConfigError(field, f"must be a number (got {v!r})", fix)
    if isinstance(v, str):
        text = v.strip()
        try:
            x: float = int(text) if whole and text.lstrip("+-").isdigit() and len(text) < 20 else float(text)
        except ValueError:
            raise ConfigError(field, f"must be a number (got {v[:40]!r})", fix) from None
    elif isinstance(v, int):
        x = v if abs(v) <= 10**18 else math.inf
    elif isinstance(v, float):
        x = v
    else:
        raise ConfigError(field, f"must be a number (got {type(v).__name__})", fix)
    if not math.isfinite(x):
        raise ConfigError(field, f"must be finite (got {str(v)[:40]})", fix)
    if whole and (x != int(x)):
        raise ConfigError(field, f"must be a whole number (got {x!r})", fix)
    lo = 1 if whole else 0
    if not lo <= x <= hi:
        raise ConfigError(field, f"must be from {lo} to {hi:g} (got {x:g})", fix)
    return x


def gpu_types(v: Any, field: str) -> tuple[str, ...]:
    """``"V100M16|V100M32"`` → ("V100M16", "V100M32"); empty or missing → () (any type)."""
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        v = "|".join(str(x) for x in v)
    if not isinstance(v, str) or len(v) > MAX_GPU_TYPE_CHARS:
        raise ConfigError(field, "must be GPU type names separated by |", "write e.g. V100M16|V100M32")
    names = tuple(dict.fromkeys(t.strip() for t in v.split("|") if t.strip()))
    for t in names:
        if not t.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(field, f"{t[:40]!r} is not a GPU type name", "write e.g. V100M16|V100M32")
    return names


_JOB_KEYS = {"name", "arrival", "arrival_s", "model", "gpus", "iterations", "batch", "gpu_type"}


def jobs_from_rows(rows: Sequence[Mapping[str, Any]], where: str = "jobs") -> list[Job]:
    """Jobs from mappings (a YAML list or CSV rows): arrival (s), model, gpus, iterations[, batch, name,
    gpu_type]."""
    out: list[Job] = []
    for i, r in enumerate(rows):
        f = f"{where}[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f, "must be a mapping", "write {arrival: 0, model: resnet50, gpus: 16, iterations: 100}")
        extra = set(r) - _JOB_KEYS
        if extra:
            raise ConfigError(f"{f}.{sorted(extra)[0]}", "is not a job field", "use " + ", ".join(sorted(_JOB_KEYS)))
        arrival = job_number(r.get("arrival_s", r.get("arrival", 0.0)), f"{f}.arrival", MAX_ARRIVAL_S, False)
        for key in ("gpus", "iterations"):
            if key not in r:
                raise ConfigError(f"{f}.{key}", "is required", "give gpus and iterations")
        gpus = int(job_number(r["gpus"], f"{f}.gpus", MAX_JOB_GPUS, True))
        iters = int(job_number(r["iterations"], f"{f}.iterations", MAX_ITERATIONS, True))
        batch = int(job_number(r.get("batch", 32), f"{f}.batch", MAX_JOB_BATCH, True))
        types = gpu_types(r.get("gpu_type"), f"{f}.gpu_type")
        out.append(Job(str(r.get("name", f"job{i}")), arrival, str(r.get("model", "resnet50")), gpus, iters, batch,
                       types))
    if not out:
        raise ConfigError(where, "holds no job", "list at least one job")
    return out


def read_csv_rows(text: str, name: str, field: str = "jobs") -> list[dict[str, Any]]:
    """The rows of a CSV text with a header (a malformed file → one error naming it)."""
    try:
        return list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise ConfigError(field, f"{name}: malformed CSV: {e}", "fix the CSV") from None


def load_jobs(path: str | Path) -> list[Job]:
    """A trace file: YAML (a list, or ``jobs:`` a list) or CSV with a header."""
    p = Path(path)
    text = yamlio.read_text(p, "jobs")
    if p.suffix.lower() == ".csv":
        return jobs_from_rows(read_csv_rows(text, p.name), p.name)
    try:
        data = yamlio.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError("jobs", f"{p.name}: malformed YAML{where}: {getattr(e, 'problem', None) or e}",
                          "fix the YAML syntax") from None
    if isinstance(data, Mapping):
        data = data.get("jobs")
    if not isinstance(data, list):
        raise ConfigError("jobs", f"{p} must hold a list of jobs", "write jobs: [{arrival: 0, gpus: 16, ...}]")
    return jobs_from_rows(data)
