"""``topotrain profile``: per-layer times measured with torch on the local GPU (the CPU otherwise, labeled so).

Two methods (``--method``):

* ``module`` (default): the model's real ``torch.nn`` module (one leaf per topotrain layer) runs warm-up and
  measured training steps under ``torch.profiler``; each layer's forward and backward times come from the
  recorded operators (and CUDA kernels on a GPU): :mod:`topotrain.compute.module_profile`.
* ``standin``: every layer timed alone as ``torch.matmul`` / ``torch.add`` shaped like it
  (:func:`topotrain.compute.profile.measure_profile`). Kept because it covers every model of the zoo (the
  module method builds ResNets and transformers, not VGG, AlexNet or Inception-v3) and because it times a
  layer's GEMMs in isolation, what the roofline check (``--check``) compares with cuBLAS.

torch itself is imported when the command runs, so importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import typer

from topotrain.cli.common import app, console, friendly
from topotrain.compute.check import format_check, roofline_check
from topotrain.compute.module_profile import measure_module_profile
from topotrain.compute.profile import measure_profile, save_profile
from topotrain.util.atomic import check_output_path
from topotrain.util.errors import ConfigError
from topotrain.util.units import format_time
from topotrain.workload.zoo import get_model

#: Largest micro-batch and number of repeats ``profile`` measures (beyond them a run takes hours or all the
#: memory before its first number: a typo).
MAX_PROFILE_BATCH = 4_096
MAX_PROFILE_REPEATS = 1_000


class Method(StrEnum):
    module = "module"
    standin = "standin"


@contextlib.contextmanager
def out_of_memory_is_bad_input(model: str, batch: int) -> Iterator[None]:
    """The device running out of memory while measuring is a batch too large for this machine, not a bug: one
    ``error:`` line naming ``--batch`` (torch says "can't allocate memory" on the CPU, "out of memory" on a GPU;
    ``gpt2 --batch 32`` asked the CPU for 1.6 GB at once under a 3 GB limit and was "internal error")."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        text = str(e)
        if not isinstance(e, MemoryError) and "out of memory" not in text.lower() and \
                "can't allocate memory" not in text:
            raise
        raise ConfigError("--batch", f"measuring {model} at batch {batch} ran out of memory on this machine",
                          "give a smaller --batch") from None


@contextlib.contextmanager
def _private_torch_cache() -> Iterator[None]:
    """torch's compiler cache (``$TMPDIR/torchinductor_<user>``, made by the profiler) in a folder of this run,
    removed at the end: a run leaves nothing in the temporary folder (the fuzz found it left there)."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="topotrain-torch-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@app.command("profile")
@friendly
def profile_cmd(model: str = typer.Argument("resnet50", help="built-in model name"),
                batch: int = typer.Option(32, "--batch", help="micro-batch to measure"),
                out: Path = typer.Option(Path("profile.json"), "-o", "--out", help="profile table (JSON or CSV)"),
                device: str = typer.Option("auto", "--device", help="auto, cuda or cpu"),
                method: Method = typer.Option(Method.module, "--method",
                                              help="module: the real torch module under torch.profiler; "
                                                   "standin: each layer as a matmul/add shaped like it"),
                repeats: int = typer.Option(5, "--repeats",
                                            help="measured steps (module) or timing repeats per layer (standin)"),
                warmup: int = typer.Option(1, "--warmup", help="unmeasured warm-up steps (module method)"),
                trace: Path | None = typer.Option(None, "--trace",
                                                  help="also write the measured steps' torch.profiler trace "
                                                       "(Chrome JSON, for Perfetto; module method)"),
                check: bool = typer.Option(False, "--check",
                                           help="print the roofline's, the wave model's and the learned "
                                                "model's predictions beside the measurement, per layer kind "
                                                "(a GPU table only)")) -> None:
    """Profile the model's torch module per layer (torch.profiler; GPU, else the CPU, labeled)."""
    if not 1 <= batch <= MAX_PROFILE_BATCH:
        raise ConfigError("--batch", f"must be from 1 to {MAX_PROFILE_BATCH} (got {batch})", "give e.g. --batch 32")
    if not 1 <= repeats <= MAX_PROFILE_REPEATS:
        raise ConfigError("--repeats", f"must be from 1 to {MAX_PROFILE_REPEATS} (got {repeats})",
                          "give e.g. --repeats 5")
    if not 0 <= warmup <= MAX_PROFILE_REPEATS:
        raise ConfigError("--warmup", f"must be from 0 to {MAX_PROFILE_REPEATS} (got {warmup})",
                          "give e.g. --warmup 1")
    if out.suffix.lower() not in (".json", ".csv"):  # checked before minutes of measuring, not after
        raise ConfigError("--out", f"unknown profile extension {out.suffix!r}", "use a .json or .csv file")
    check_output_path(out, field="--out", make_parents=True)  # one rule: missing folders are created
    if trace is not None:
        if method != Method.module:
            raise ConfigError("--trace", "only the module method runs under torch.profiler",
                              "drop --trace or use --method module")
        if trace.suffix.lower() != ".json":
            raise ConfigError("--trace", f"a trace is Chrome JSON, got {trace.suffix!r}", "name it e.g. trace.json")
        check_output_path(trace, field="--trace", make_parents=True)
    net = get_model(model)
    with out_of_memory_is_bad_input(model, batch), _private_torch_cache():
        if method == Method.module:
            result = measure_module_profile(net, batch, device, steps=repeats, warmup=warmup, trace=trace)
            table, what = result.table, result.summary()
        else:
            table = measure_profile(net, batch, device, repeats=repeats)  # progress per layer on stderr
            what = (f"stand-ins: each of {len(table)} layers of {model} timed alone as torch.matmul/torch.add "
                    f"shaped like it (not the model's module), {table.device}, {table.dtype}, batch {batch}, median "
                    f"of {repeats} repeats")
    save_profile(table, out)
    console.print(f"measured: {what}", markup=False, highlight=False)
    console.print(f"{len(table.entries)} layers, {format_time(table.total_s)} forward + backward per micro-batch "
                  f"on {table.device} ({table.gpu}); wrote {out}", markup=False, highlight=False)
    if trace is not None:
        console.print(f"trace of the measured steps: {trace} (open it in Perfetto)", markup=False, highlight=False)
    if check:
        if table.measured_on_cpu:
            console.print("no roofline check (nor wave, nor learned): the table was measured on the CPU (the "
                          "models describe a GPU)")
        else:
            console.print(format_check(roofline_check(table, net)), markup=False, highlight=False)
