"""``topotrain validate --published``: every published row simulated, printed beside its figure with the
statistics of the two declared subsets, the BERT sequence-length check, the error bands' cross-validated
coverage, and a CSV/JSON table (and, with ``--write-residuals``, the residuals the error bands use)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from topotrain.report.tables import write_table
from topotrain.training import bands
from topotrain.util import jsonsafe
from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError
from topotrain.validate import published

#: The unit of each published metric, as the report labels every row (one column mixes them).
METRIC_UNITS = {"samples_per_s": "samples/s", "tflops_per_gpu": "TFLOP/s per GPU",
                "tokens_per_s_per_gpu": "tokens/s per GPU"}


def _stats(errs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(errs), "worst": max(errs), "cases": len(errs)} if errs else {}


def run_published(network: str = "analytical", quick: bool = False, out: Path | None = None,
                  write_residuals: bool = False, seq_check: bool = True,
                  progress: Callable[[str], Any] | None = None,
                  echo: Callable[[str], Any] = print,
                  compute_params: Mapping[str, Any] | None = None, library: str | None = None) -> dict[str, Any]:
    """Run the published rows (``quick``: the single-server rows only), print the report through ``echo``
    and return its summary. ``out``: a folder for ``published_NETWORK.csv``/``.json``. ``compute_params``:
    laid over every row's ``compute.params`` (e.g. ``{"gemm_model": "table"}``; residuals are not written
    with them). ``library``: every row's communication library (``comm.library``; default: the rows' own, NCCL)."""
    if write_residuals and compute_params:
        raise ConfigError("--write-residuals", "residuals are written with the rows' own compute parameters",
                          "drop the compute parameter overrides")
    if write_residuals and library is not None:
        raise ConfigError("--write-residuals", "residuals are written with the rows' own communication library",
                          "drop --library")
    if write_residuals and quick:
        raise ConfigError("--write-residuals", "residuals need every validation row", "drop --quick")
    t0 = time.perf_counter()
    only = (lambda c: c.scenario.get("cluster", {}).get("servers", 1) == 1) if quick else None
    rows = published.run(network, only=only, progress=progress, compute_params=compute_params, library=library)
    echo(f"{'case':44s} {'regime':30s} {'predicted':>10s} {'published':>10s} {'unit':<18s} {'error':>8s}")
    for r in rows:
        flag = ("  (fit)" if r.case.fitted else "") + ("  (inconsistent)" if r.case.inconsistent else "")
        unit = METRIC_UNITS.get(r.case.metric, r.case.metric)
        echo(f"{r.case.name:44s} {str(r.regime):30s} {r.predicted:10.1f} {r.case.published:10.1f} {unit:<18s} "
             f"{100 * r.error:+7.1f}%{flag}")
    summary: dict[str, Any] = {"network": network, "library": library or "nccl", "wall_s": time.perf_counter() - t0}
    val = [r for r in rows if r.case.subset == "validation"]
    groups = {
        "validation subset (no constant fitted on it)": [abs(r.error) for r in val],
        "calibration subset (benchmarks/calibrate.py fits on it)": [abs(r.error) for r in rows if r.case.fitted],
        "all rows": [abs(r.error) for r in rows],
    }
    if any(r.case.inconsistent for r in val):
        groups["validation subset without the (inconsistent) rows"] = [abs(r.error) for r in val
                                                                       if not r.case.inconsistent]
    echo(f"\n{network} network, {summary['library']} library, wall {summary['wall_s']:.1f} s")
    for label, errs in groups.items():
        s = _stats(errs)
        summary[label] = s
        if s:
            echo(f"{label}: median |error| {100 * s['median']:.1f}%  worst {100 * s['worst']:.1f}%  "
                 f"({s['cases']} cases)")
    large = [r.error for r in rows if r.params >= 100e9]
    if large:
        summary["mean signed error, rows >= 100B parameters"] = sum(large) / len(large)
        echo(f"rows >= 100B parameters: mean signed error {100 * sum(large) / len(large):+.1f}% "
             f"({len(large)} cases)")
    for r in rows:
        if r.case.inconsistent:
            echo(f"  (inconsistent) {r.case.name}: {100 * r.error:+.1f}% — {r.case.inconsistent}")
    residuals = [bands.Residual(r.case.name, r.regime, math.log(r.predicted / r.case.published)) for r in val]
    if len(residuals) >= 2:
        echo("\nerror bands (split conformal on the validation subset; leave-one-out coverage):")
        cov = {}
        for level in (0.5, 0.8, 0.9):
            cov[level] = bands.cross_validated_coverage(residuals, level)
            echo(f"  nominal {100 * level:.0f}%: covers {100 * cov[level]:.0f}% of {len(residuals)} held-out rows")
        summary["loo_coverage"] = cov
        every = {bands.Regime(f, e, sc) for f in ("cnn", "transformer") for e in ("dense", "moe")
                 for sc in ("single-node", "multi-node")}
        for reg in sorted(every, key=str):
            b = bands.band_from(reg, residuals)
            echo(f"  {str(reg):30s} ±{100 * b.plus_minus:.1f}% at {100 * b.level:.0f}% "
                 f"({'BORROWED: ' if b.borrowed else ''}from {b.rows} rows of {b.used})")
    ratios: list[tuple[str, float, float]] = published.sequence_length_check() if seq_check else []
    if ratios:
        echo("\nBERT-large seq 512 / seq 128 throughput, 8 GPUs (same code and machine):")
        for label, pred, pub in ratios:
            echo(f"  {label:32s} predicted {pred:.3f}  published {pub:.3f}  error {100 * (pred / pub - 1):+.1f}%")
    cal_ratios = [(rc, published.ratio_predicted(rc, network=network)) for rc in published.CALIBRATION_RATIOS]
    if cal_ratios:
        echo("\ncalibration ratios (benchmarks/calibrate.py fits on them; per-GPU throughput, same code):")
        for rc, pred in cal_ratios:
            echo(f"  {rc.name}: predicted {pred:.3f}  published {rc.published:.3f}  "
                 f"error {100 * (pred / rc.published - 1):+.1f}%  (fit)")
        summary["calibration_ratios"] = {rc.name: {"predicted": pred, "published": rc.published}
                                         for rc, pred in cal_ratios}
    if out is not None:
        table = [{"case": r.case.name, "metric": r.case.metric, "regime": str(r.regime), "predicted": r.predicted,
                  "published": r.case.published, "error": r.error, "fitted": r.case.fitted,
                  "inconsistent": bool(r.case.inconsistent), "wall_s": r.wall_s, "source": r.case.source}
                 for r in rows]
        table += [{"case": f"BERT-large seq512/seq128 {label}", "metric": "throughput_ratio", "regime": "",
                   "predicted": pred, "published": pub, "error": pred / pub - 1.0, "fitted": False,
                   "inconsistent": False, "wall_s": 0.0, "source": "sequence_length_check"}
                  for label, pred, pub in ratios]
        table += [{"case": rc.name, "metric": "per_gpu_throughput_ratio", "regime": "", "predicted": pred,
                   "published": rc.published, "error": pred / rc.published - 1.0, "fitted": True,
                   "inconsistent": False, "wall_s": 0.0, "source": rc.source} for rc, pred in cal_ratios]
        csv_path, _ = write_table(table, out / f"published_{network}", {"benchmark": "published", "network": network})
        echo(f"\ntable in {csv_path} (and .json)")
    if write_residuals:
        doc = published.residuals_document(rows, network)
        atomic_write_text(bands.RESIDUALS_PATH, jsonsafe.dumps(doc, indent=1) + "\n")
        bands.load_residuals.cache_clear()
        echo(f"wrote {bands.RESIDUALS_PATH}")
    return summary
