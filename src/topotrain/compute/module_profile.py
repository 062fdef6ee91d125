"""Profile the real torch module of a model, layer by layer, with ``torch.profiler``.

:func:`measure_module_profile` builds the model's ``torch.nn`` module
(:func:`topotrain.compute.torch_modules.build_module`, one leaf per topotrain layer), runs ``warmup``
unrecorded training steps (forward, backward of the loss, gradients cleared) and then ``steps`` steps
under ``torch.profiler.profile``, and derives per-layer times from what the profiler recorded:

* **forward**: each leaf's forward is bracketed by a ``record_function`` range
  ``topotrain::<layer>`` (a forward pre-hook opens it, the forward hook closes it). On the CPU the layer's
  time is the range's span; on a GPU it is the device time of the kernels launched inside it (Kineto's
  CUDA activity, correlated to the launching operators).
* **backward**: the autograd engine records each backward node it runs as
  ``autograd::engine::evaluate_function: <Node>`` carrying the *sequence number* of the forward operator
  that created the node (PyTorch's forward/backward correlation, the same key the profiler's own
  "fwd-bwd" links use). Every forward operator recorded inside a layer's range maps its sequence number to
  that layer, so each backward node's time (CPU span, or its kernels' device time) goes to the layer whose
  forward made it. Nodes with no forward operator inside a layer (``AccumulateGrad``, which adds a
  parameter's gradient into ``.grad``; the loss's seed) are *unattributed*: their total is reported, not
  spread.

Times are the sum over the measured steps divided by ``steps``. Every number comes from the profiler's
events (``prof.events()``), none from a stand-in op.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.compute.profile import (
    _TORCH_DTYPES,
    ProfileEntry,
    ProfileTable,
    _catalog_name,
    _torch,
    resolve_device,
)
from topotrain.compute.torch_modules import build_module
from topotrain.hardware.gpus import normalize_dtype
from topotrain.util import progress
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model

RANGE_PREFIX = "topotrain::"
STEP_RANGE = "topotrain-step"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class ModuleProfile:
    """A measured table and what the measurement was: the module family, device, dtype, warm-up and
    measured steps, the layers measured from recorded ops and those the module lacks (absent from the
    table: timed by the roofline when simulated), and the backward seconds per step no layer owns."""

    table: ProfileTable
    family: str
    steps: int
    warmup: int
    measured: tuple[str, ...]
    fell_back: tuple[str, ...]
    unattributed_bwd_s: float
    events: int
    #: mean wall seconds of one measured step (its ``topotrain-step`` range: zero_grad, forward, backward and,
    #: on a GPU, the synchronize that waits for its kernels)
    step_s: float = 0.0

    @property
    def covered(self) -> float:
        """Share of the profiled step that the layers and the unowned backward account for (the rest: Python
        between the leaves, ``zero_grad``; on a GPU also idle device time, since layers count kernel time)."""
        return (self.table.total_s + self.unattributed_bwd_s) / self.step_s if self.step_s > 0 else 0.0

    def summary(self) -> str:
        t = self.table
        fell = f"; not measured (roofline when simulated): {', '.join(self.fell_back[:5])}" if self.fell_back else ""
        more = f" and {len(self.fell_back) - 5} more" if len(self.fell_back) > 5 else ""
        plural = "" if self.steps == 1 else "s"
        return (
            f"torch.profiler on the real {self.family} module of {t.model} (one leaf module per layer), "
            f"{t.device}, {t.dtype}, batch {t.batch}: {self.warmup} warm-up + {self.steps} measured step{plural} "
            f"of forward + backward, {self.events:,} recorded events; {len(self.measured)} of "
            f"{len(self.measured) + len(self.fell_back)} layers measured{fell}{more}; backward not owned by "
            f"a layer (AccumulateGrad, loss seed): {self.unattributed_bwd_s * 1e3:.3f} ms per step; layers and "
            f"unowned backward: {self.covered:.0%} of the profiled step's {self.step_s * 1e3:.3f} ms"
        )


def _resolve(torch: Any, device: str, dtype: str) -> tuple[Any, str]:
    dev = resolve_device(torch, device)
    dt = ("bf16" if dev.type == "cuda" else "fp32") if dtype == "auto" else normalize_dtype(dtype)
    if dt not in _TORCH_DTYPES:
        raise ConfigError("dtype", f"cannot run a torch module in {dt}", "use bf16, fp16, fp32 or tf32")
    return dev, dt


def _bracket(torch: Any, leaves: dict[str, Any]) -> list[Any]:
    """Forward hooks opening and closing a ``record_function`` range per leaf; returns the handles."""
    handles = []
    for name, mod in leaves.items():
        open_ranges: list[Any] = []

        def pre(_m: Any, _a: Any, name: str = name, open_ranges: list[Any] = open_ranges) -> None:
            r = torch.profiler.record_function(RANGE_PREFIX + name)
            r.__enter__()
            open_ranges.append(r)

        def post(_m: Any, _a: Any, _o: Any, open_ranges: list[Any] = open_ranges) -> None:
            open_ranges.pop().__exit__(None, None, None)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    return handles


def attribute(events: Iterable[Any], cuda: bool) -> tuple[dict[str, float], dict[str, float], float]:
    """(forward µs, backward µs per layer, unattributed backward µs) summed over ``events``, the
    ``FunctionEvent`` s of ``prof.events()`` (see the module docstring for the rule)."""

    def span_us(e: Any) -> float:
        return float(e.device_time_total if cuda else e.cpu_time_total)

    evs = list(events)
    fwd: dict[str, float] = {}
    seq_owner: dict[int, str] = {}
    for e in evs:
        if e.name.startswith(RANGE_PREFIX):
            layer = e.name[len(RANGE_PREFIX):]
            fwd[layer] = fwd.get(layer, 0.0) + span_us(e)
    for e in evs:
        seq = getattr(e, "sequence_nr", -1)
        if seq is None or seq < 0 or e.name.startswith(BACKWARD_PREFIX):
            continue
        p = e.cpu_parent
        while p is not None and not p.name.startswith(RANGE_PREFIX):
            p = p.cpu_parent
        if p is not None:
            seq_owner.setdefault(int(seq), p.name[len(RANGE_PREFIX):])
    bwd: dict[str, float] = {}
    loose = 0.0
    for e in evs:
        if not e.name.startswith(BACKWARD_PREFIX):
            continue
        if e.cpu_parent is not None and e.cpu_parent.name.startswith(BACKWARD_PREFIX):
            continue  # a node run inside another node's span is counted there
        owner = seq_owner.get(int(getattr(e, "sequence_nr", -1) or -1))
        if owner is None:
            loose += span_us(e)
        else:
            bwd[owner] = bwd.get(owner, 0.0) + span_us(e)
    return fwd, bwd, loose


def measure_module_profile(
    model: Model,
    batch: int,
    device: str = "auto",
    *,
    dtype: str = "auto",
    steps: int = 3,
    warmup: int = 1,
    gpu: str | None = None,
    seed: int = 0,
    trace: str | os.PathLike[str] | None = None,
) -> ModuleProfile:
    """Per-layer forward/backward seconds of ``model``'s real torch module at micro-batch ``batch``,
    measured with ``torch.profiler`` (see the module docstring). ``device``/``dtype`` as
    :func:`topotrain.compute.profile.measure_profile`: ``auto`` is CUDA in bf16 when available, else the
    CPU in fp32 (a CPU table says ``gpu: cpu``). ``trace``: also write the measured steps' Kineto trace there.
    A model with no torch module: ConfigError naming the layer."""
    torch = _torch()
    for name, v, lo in (("batch", batch, 1), ("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(name, f"must be an integer ≥ {lo}, got {v!r}", f"give {name} ≥ {lo}")
    dev, dt = _resolve(torch, device, dtype)
    cuda = dev.type == "cuda"
    tdt = getattr(torch, _TORCH_DTYPES[dt])
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if cuda else False
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
    _check_memory(torch, model, batch, dev, tdt)
    with progress.task(f"profiling {model.name}: building the torch module") as bar:
        built = build_module(torch, model, batch, dev, tdt, seed=seed)
    handles = _bracket(torch, built.leaves)
    net, inputs = built.net, built.inputs

    def step() -> None:
        with torch.profiler.record_function(STEP_RANGE):
            net.zero_grad(set_to_none=True)
            try:
                net(*inputs).backward()
            except (RuntimeError, ValueError) as exc:  # e.g. out of memory, BatchNorm of one value per channel
                raise ConfigError("model", f"the torch module of {model.name} failed at batch {batch} on {dev}: "
                                  f"{str(exc).splitlines()[0]}", "change --batch (or the model's size)") from None
            if cuda:
                torch.cuda.synchronize(dev)

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        with progress.task(f"profiling {model.name}: warm-up", total=warmup) as bar:
            for _ in range(warmup):
                step()
                bar.advance()
        with (progress.task(f"profiling {model.name}: measured steps", total=steps) as bar,
              torch.profiler.profile(activities=acts) as prof):
            for _ in range(steps):
                step()
                bar.advance()
        with progress.task(f"profiling {model.name}: attributing recorded ops to layers"):
            events = prof.events()
            fwd_us, bwd_us, loose_us = attribute(events, cuda)
            step_us = sum(float(e.cpu_time_total) for e in events if e.name == STEP_RANGE)
            if trace is not None:
                _export(prof, Path(trace))
    finally:
        for h in handles:
            h.remove()
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    entries: dict[str, ProfileEntry] = {}
    measured, fell_back = [], []
    for lay in model.layers:
        if lay.name not in fwd_us:
            fell_back.append(lay.name)
            continue
        measured.append(lay.name)
        entries[lay.name] = ProfileEntry(
            fwd_us[lay.name] * 1e-6 / steps,
            bwd_us.get(lay.name, 0.0) * 1e-6 / steps,
            lay.fwd_flops * batch,
            lay.bwd_flops * batch,
            lay.fwd_bytes_at(batch),
            lay.bwd_bytes_at(batch),
        )
    if cuda:
        label = torch.cuda.get_device_name(dev)
        name, device_label = gpu or _catalog_name(label), f"cuda:{label}"
    else:
        name, device_label = "cpu", "cpu"
    table = ProfileTable(
        gpu=name, batch=batch, entries=entries, dtype=dt, device=device_label, tp=1, model=model.name
    )
    return ModuleProfile(
        table, built.family, steps, warmup, tuple(measured), tuple(fell_back), loose_us * 1e-6 / steps,
        len(events), step_us * 1e-6 / steps,
    )


def free_bytes(torch: Any, dev: Any) -> int:
    """Memory free for the run: the GPU's free memory, or the host's available physical memory (0: unknown)."""
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _check_memory(torch: Any, model: Model, batch: int, dev: Any, tdt: Any) -> None:
    """Refuse up front a run that cannot fit: the module's parameters (counted on the ``meta`` device, no
    memory) twice (weights and gradients) plus the layer list's stashed activations and outputs at ``batch``
    in the run's dtype, against 90% of :func:`free_bytes`."""
    with torch.device("meta"):
        meta = build_module(torch, model, 1, torch.device("meta"), tdt)
    esize = int(torch.empty((), dtype=tdt).element_size())
    params = sum(int(p.numel()) for p in meta.net.parameters()) * esize
    acts = sum(lay.activation_bytes + lay.output_bytes for lay in model.layers) * batch * esize / model.dtype
    need, free = 2 * params + acts, free_bytes(torch, dev)
    if free and need > 0.9 * free:
        raise ConfigError(
            "batch",
            f"{model.name} at batch {batch} needs about {need / 2**30:.1f} GiB on {dev} ({2 * params / 2**30:.1f} "
            f"GiB weights and gradients, {acts / 2**30:.1f} GiB activations), {free / 2**30:.1f} GiB is free",
            "use a smaller --batch or model, or a device with more memory",
        )


def _export(prof: Any, path: Path) -> None:
    """The measured steps' Kineto trace (Chrome trace-event JSON: Perfetto, chrome://tracing), atomically."""
    with tempfile.TemporaryDirectory(prefix="topotrain-trace-") as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        atomic_write(path, lambda f: f.write(raw.read_bytes()), make_parents=True)
