"""``topotrain profile``: per-layer times measured with torch on the local GPU (the CPU otherwise, labeled so).

torch itself is imported by :func:`topotrain.compute.profile.measure_profile` when the command runs, so
importing this module does not import torch.
"""

from __future__ import annotations

from pathlib import Path

import typer

from topotrain.cli.common import app, console, friendly
from topotrain.compute.check import format_check, roofline_check
from topotrain.compute.profile import measure_profile, save_profile
from topotrain.util.atomic import check_output_path
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_time
from topotrain.workload.zoo import get_model

#: Largest micro-batch and number of repeats ``profile`` measures (beyond them a run takes hours or all the
#: memory before its first number: a typo).
MAX_PROFILE_BATCH = 4_096
MAX_PROFILE_REPEATS = 1_000


@app.command("profile")
@friendly
def profile_cmd(model: str = typer.Argument("resnet50", help="built-in model name"),
                batch: int = typer.Option(32, "--batch", help="micro-batch to measure"),
                out: Path = typer.Option(Path("profile.json"), "-o", "--out", help="profile table (JSON or CSV)"),
                device: str = typer.Option("auto", "--device", help="auto, cuda or cpu"),
                repeats: int = typer.Option(5, "--repeats"),
                check: bool = typer.Option(False, "--check",
                                           help="print the roofline's prediction beside the measurement, per "
                                                "layer kind (a GPU table only)")) -> None:
    """Measure per-layer times with torch on the local GPU (CPU otherwise, clearly labeled)."""
    if not 1 <= batch <= MAX_PROFILE_BATCH:
        raise ConfigError("--batch", f"must be from 1 to {MAX_PROFILE_BATCH} (got {batch})", "give e.g. --batch 32")
    if not 1 <= repeats <= MAX_PROFILE_REPEATS:
        raise ConfigError("--repeats", f"must be from 1 to {MAX_PROFILE_REPEATS} (got {repeats})",
                          "give e.g. --repeats 5")
    if out.suffix.lower() not in (".json", ".csv"):  # checked before minutes of measuring, not after
        raise ConfigError("--out", f"unknown profile extension {out.suffix!r}", "use a .json or .csv file")
    check_output_path(out, field="--out", make_parents=True)  # one rule: missing folders are created
    net = get_model(model)
    table = measure_profile(net, batch, device, repeats=repeats)  # progress per layer on stderr
    save_profile(table, out)
    total = sum(e.fwd_s + e.bwd_s for e in table.entries.values())
    console.print(f"measured {len(table.entries)} layers of {model} at batch {batch} on {table.device} "
                  f"({table.gpu}): {format_time(total)} per iteration; wrote {out}")
    if check:
        if table.measured_on_cpu:
            console.print("no roofline check: the table was measured on the CPU (the roofline describes a GPU)")
        else:
            console.print(format_check(roofline_check(table, net)), markup=False, highlight=False)
