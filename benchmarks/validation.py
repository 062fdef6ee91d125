"""Predictions beside published training measurements (sources: docs/sources.md).

Run: ``.venv/bin/python benchmarks/validation.py [--network flow|analytical] [--write-residuals]
[--gemm-model ceiling|wave|table] [--memory-model constant|measured] [--gemm-transfer]``

— the same report as ``topotrain validate --published``: one row per
published figure (prediction, figure, signed error), the median / worst absolute error of each declared
subset, the mean signed error of the rows of at least 100B parameters, the error bands' leave-one-out
coverage, the BERT sequence-length check. ``--gemm-model`` lays ``compute.params.gemm_model`` over every
row (GEMM time by shape, :mod:`topotrain.compute.gemm_wave`; without it, the rows' own: ``ceiling``);
``--memory-model`` lays ``compute.params.memory_model`` (memory-bound kernels at measured bandwidth,
:mod:`topotrain.compute.membound`), ``--gemm-transfer`` ``compute.params.gemm_transfer`` (the H100 wave model
carried to GPUs without a table, :mod:`topotrain.compute.gemm_transfer`). The
rows, their subsets and the scenario builders live in :mod:`topotrain.validate.published`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from topotrain.validate.published import cases
from topotrain.validate.published_report import run_published


def main() -> None:
    network = sys.argv[sys.argv.index("--network") + 1] if "--network" in sys.argv else "analytical"
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else Path(__file__).parent / "results"
    gemm = sys.argv[sys.argv.index("--gemm-model") + 1] if "--gemm-model" in sys.argv else None
    memory = sys.argv[sys.argv.index("--memory-model") + 1] if "--memory-model" in sys.argv else None
    params: dict[str, object] = {}
    if gemm:
        params["gemm_model"] = gemm
    if memory:
        params["memory_model"] = memory
    if "--gemm-transfer" in sys.argv:
        params["gemm_transfer"] = True
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("simulating", total=len(cases()))
        done = [0]

        def step(name: str) -> None:  # called as each case starts: name it, count the cases done
            prog.update(task, description=name, completed=done[0])
            done[0] += 1

        run_published(network, out=out, write_residuals="--write-residuals" in sys.argv, progress=step,
                      compute_params=params or None)


if __name__ == "__main__":
    main()
