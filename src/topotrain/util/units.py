"""Unit parsing and printing: the one place where "100Gbps", "25GB/s", "256MiB" and "1.5us" become SI floats.

Inside topotrain everything is SI: bytes, seconds, bytes per second, FLOP/s. The rules a user can rely on:

* **Bits or bytes.** A lowercase ``b`` is bits, an uppercase ``B`` bytes: ``100Gbps`` = ``100Gb/s`` =
  12.5 GB/s; ``8Gb`` = 1 GB. Every error message says which of the two it expects.
* **Sizes follow nccl-tests.** A prefix without a unit is binary, as nccl-tests reads ``-b 256M``:
  ``256M`` = ``256MiB`` = 256·2^20 bytes, ``1G`` = 1 GiB, lowercase accepted (``256m``). ``KiB/MiB/GiB``
  are binary (IEC 80000-13); ``kB/MB/GB`` with a capital ``B`` decimal. A plain number is bytes, except
  where the caller asks for a unit (a gradient bucket: ``25`` would be 25 bytes, so ``25MiB`` is required).
* **No bare numbers for time or bandwidth.** ``latency: 1`` would mean one second and ``bandwidth: 100``
  100 bytes/s — both refused, with the fix. A number is accepted where the field's own name states the SI
  unit (``link_latency_s``, ``link_bandwidth_bytes_per_s``), where it is zero, or where the caller says
  the number is SI (``si_number=True``, e.g. a GraphML file written by topotrain).
"""

from __future__ import annotations

import math
import re
from typing import Any

from topotrain.util.errors import ConfigError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50, "ei": 2.0**60}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "ps": 1e-12, "min": 60.0, "h": 3600.0}

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_SIZE_RE = re.compile(rf"^\s*{_NUM}\s*([kKmMgGtTpPeE](?:[iI])?)?\s*(B|bytes?|b|bits?)?\s*$")
_BW_RE = re.compile(rf"^\s*{_NUM}\s*([kKMGTPE]i?)?\s*(bps|b/s|bit/s|Bps|B/s|bytes/s)\s*$")
_TIME_RE = re.compile(rf"^\s*{_NUM}\s*(s|ms|us|µs|ns|ps|min|h)?\s*$")
_SIZE_HINT = "write e.g. 256MiB or 256M (binary, as nccl-tests), 1.5GB for decimal bytes, 8Gb for bits"
_BW_HINT = "write e.g. 100Gbps or 200Gb/s for bits per second, 25GB/s for bytes per second"
_TIME_HINT = "write e.g. 1.5us, 2ms or 0.1s"


#: Accepted magnitudes (a value outside is a typo or an attack: 1e-300 B/s overflows every time computed from it).
MIN_BANDWIDTH_BYTES_PER_S = 1e3
MAX_BANDWIDTH_BYTES_PER_S = 1e15
MAX_SIZE_BYTES = float(2**60)
MAX_TIME_S = 1e9
MAX_FLOPS_PER_S = 1e21
#: Longest part of a typed value quoted back in an error message.
QUOTE_MAX_CHARS = 60


def quote(value: object, limit: int = QUOTE_MAX_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters: how an error message quotes what the user typed."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "…" + text[-3:]


def _prefix(p: str | None) -> float:
    if not p:
        return 1.0
    if p.lower() in _BINARY:
        return _BINARY[p.lower()]
    return _DECIMAL[p]


def _check(value: float, field: str, allow_zero: bool, what: str = "", typed: object = None,
           lo: float = 0.0, hi: float = math.inf) -> float:
    """``value`` if it is finite, ≥ 0 (> 0 unless ``allow_zero``) and, when not 0, within [lo, hi]; else a
    ConfigError quoting ``typed`` (what the user wrote) and the accepted range."""
    got = quote(typed) if typed is not None else f"{value:g}{f' {what}' if what else ''}"
    if not math.isfinite(value):
        raise ConfigError(field, f"{got} is not a finite {what or 'number'}", "give a finite value")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, f"must be {'≥ 0' if allow_zero else '> 0'} (got {got})",
                          "give a positive value")
    if value != 0 and not lo <= value <= hi:
        unit = f" {what}" if what else ""
        raise ConfigError(field, f"{got} is out of range (accepted: {lo:g} to {hi:g}{unit})",
                          "check the value and its unit")
    return value


def _states_unit(field: str, suffixes: tuple[str, ...]) -> bool:
    """True when the last part of a dotted field name states its SI unit (``link_latency_s``)."""
    leaf = field.rsplit(".", 1)[-1]
    return leaf.endswith(suffixes)


def parse_size(value: str | float | int, field: str = "size", allow_zero: bool = False, *,
               bare_bytes: bool = True) -> float:
    """Bytes from ``"256MiB"``, ``"256M"`` (MiB, as nccl-tests), ``"1.5GB"``, ``"8Gb"`` (bits), or a
    plain number of bytes (refused when ``bare_bytes`` is false, unless the field is named ``*_bytes``)."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a size in bytes, got {value!r}", _SIZE_HINT)
    if isinstance(value, int | float):
        if not bare_bytes and value != 0 and not _states_unit(field, ("_bytes",)):
            raise ConfigError(field, f"a bare number has no unit (got {value!r}; it would be {value!r} bytes)",
                              f"write {value!r}MiB, or give the unit: B, KiB, MiB, GiB")
        return _check(float(value), field, allow_zero, "bytes", value, hi=MAX_SIZE_BYTES)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read size {quote(value)} (bytes)", _SIZE_HINT)
    num, pre, unit = m.groups()
    if pre and unit in (None, "B", "byte", "bytes") and (unit is None or pre.lower().endswith("i")):
        scale = _BINARY[(pre[0] + "i").lower()]  # 256M, 256m, 256MiB, 256mib: binary (nccl-tests, IEC)
    elif pre and pre.lower().endswith("i"):
        scale = _BINARY[pre.lower()] * 8.0  # 1mib: lowercase spelling of MiB (a gibibit is never meant)
    elif pre:
        if pre not in _DECIMAL:
            raise ConfigError(field, f"cannot read size {quote(value)}: {pre!r} is not a decimal prefix",
                              _SIZE_HINT)
        scale = _DECIMAL[pre]
    else:
        scale = 1.0
    if unit in ("b", "bit", "bits"):
        scale /= 8.0
    return _check(float(num) * scale, field, allow_zero, "bytes", value, hi=MAX_SIZE_BYTES)


def parse_bandwidth(value: str | float | int, field: str = "bandwidth", *, si_number: bool = False) -> float:
    """Bytes per second from ``"100Gbps"`` (bits), ``"25GB/s"`` (bytes), ``"200Gb/s"`` (bits).

    A plain number is refused (is ``100`` bits or bytes, per second or per microsecond?) unless
    ``si_number`` is true or the field's name ends in ``_per_s``; then it is bytes/s.
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a bandwidth, got {value!r}", _BW_HINT)
    if isinstance(value, int | float):
        if not (si_number or value == 0 or _states_unit(field, ("_per_s",))):
            raise ConfigError(field, f"a bare number has no unit (got {value!r}: bits or bytes per second?)",
                              f"write {value!r}Gbps for bits/s or {value!r}GB/s for bytes/s")
        return _check(float(value), field, False, "bytes/s", value, MIN_BANDWIDTH_BYTES_PER_S,
                      MAX_BANDWIDTH_BYTES_PER_S)
    m = _BW_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read bandwidth {quote(value)}", _BW_HINT)
    num, pre, unit = m.groups()
    scale = _prefix(pre)
    if unit in ("bps", "b/s", "bit/s"):
        scale /= 8.0
    return _check(float(num) * scale, field, False, "bytes/s", value, MIN_BANDWIDTH_BYTES_PER_S,
                  MAX_BANDWIDTH_BYTES_PER_S)


def parse_time(value: str | float | int, field: str = "time", allow_zero: bool = True, *,
               si_number: bool = False) -> float:
    """Seconds from ``"1.5us"``, ``"2ms"``, ``"3s"``.

    A plain number is refused (``latency: 1`` would be one second) unless it is zero, ``si_number`` is
    true, or the field's name ends in ``_s``; then it is seconds.
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration, got {value!r}", _TIME_HINT)
    if isinstance(value, int | float):
        if not (si_number or value == 0 or _states_unit(field, ("_s",))):
            raise ConfigError(field, f"a bare number has no unit (got {value!r}; it would be {value!r} seconds)",
                              f"write {value!r}us, {value!r}ms or {value!r}s")
        return _check(float(value), field, allow_zero, "s", value, hi=MAX_TIME_S)
    m = _TIME_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read duration {quote(value)}", _TIME_HINT)
    num, unit = m.groups()
    if unit is None and float(num) != 0 and not (si_number or _states_unit(field, ("_s",))):
        raise ConfigError(field, f"a bare number has no unit (got {value!r}; it would be {num} seconds)",
                          f"write {num}us, {num}ms or {num}s")
    return _check(float(num) * _TIME[unit or "s"], field, allow_zero, "s", value, hi=MAX_TIME_S)


_FLOPS_RE = re.compile(rf"^\s*{_NUM}\s*([kKmMgGtTpPeE])?\s*((?i:flops|flop/s|flops/s|ops|op/s|ops/s))?\s*$")


def parse_flops(value: str | float | int, field: str = "flops") -> float:
    """FLOP/s from ``"312TFLOPS"``, ``"19.5 TFLOP/s"``, ``"624 TOPS"`` (int ops); a plain number is FLOP/s.

    Prefixes are decimal (``T`` = 10^12) and case-blind (``tflops`` = ``TFLOPS``), as datasheets quote peaks.
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a compute rate, got {value!r}", "write e.g. 312TFLOPS")
    if isinstance(value, int | float):
        return _check(float(value), field, False, "FLOP/s", value, hi=MAX_FLOPS_PER_S)
    m = _FLOPS_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read compute rate {quote(value)}",
                          "write e.g. 312TFLOPS, 19.5 TFLOP/s or 1.2e15")
    num, pre, _unit = m.groups()
    scale = _DECIMAL[pre.upper()] if pre else 1.0
    return _check(float(num) * scale, field, False, "FLOP/s", value, hi=MAX_FLOPS_PER_S)


def _scaled(value: float, steps: list[tuple[float, str]], unit: str, digits: int = 3) -> str:
    for scale, prefix in steps:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    scale, prefix = steps[-1]
    return f"{value / scale:.{digits}g} {prefix}{unit}"


def format_size(size_bytes: float) -> str:
    """``268435456`` → ``"256 MiB"`` (binary prefixes, as nccl-tests prints sizes)."""
    steps = [(2.0**50, "Pi"), (2.0**40, "Ti"), (2.0**30, "Gi"), (2.0**20, "Mi"), (2.0**10, "Ki"), (1.0, "")]
    return _scaled(size_bytes, steps, "B", 4)


def format_time(seconds: float) -> str:
    """``1.5e-6`` → ``"1.5 us"``; below a picosecond (a rounding residue of a sum of times, never a time that
    was modelled) ``"< 1 ps"``."""
    if seconds == 0:
        return "0 s"
    if abs(seconds) < 1e-12:
        return "< 1 ps"
    steps = [(1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n")]
    return _scaled(seconds, steps, "s", 4)


def time_value(seconds: float) -> str:
    """Seconds as a value a scenario file accepts back, in the largest unit that keeps it ≥ 1: ``2e-06`` →
    ``"2us"``, ``0.0015`` → ``"1.5ms"`` (12 significant digits: ``parse_time`` reads back the same float up to
    rounding in the last bit)."""
    if seconds == 0:
        return "0s"
    steps = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))
    scale, unit = next((step for step in steps if abs(seconds) >= step[0]), steps[-1])
    return f"{seconds / scale:.12g}{unit}"


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes/s → ``"12.5 GB/s"`` (decimal prefixes, as link speeds are quoted)."""
    steps = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    return _scaled(bytes_per_s, steps, "B/s", 4)


def gbps(bytes_per_s: float) -> float:
    """Bytes/s → GB/s (10^9 bytes per second), NCCL's unit for algbw and busbw."""
    return bytes_per_s / 1e9


_FREQ_RE = re.compile(rf"^\s*{_NUM}\s*([kMG]?)\s*Hz\s*$", re.IGNORECASE)
_POWER_RE = re.compile(rf"^\s*{_NUM}\s*(k?)\s*W\s*$", re.IGNORECASE)

_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def _number_with_unit(value: Any, field: str, pattern: re.Pattern[str], what: str, example: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a {what}, got {value!r}", f"write e.g. {example}")
    if isinstance(value, int | float):
        v = float(value)
    else:
        m = pattern.match(str(value))
        if not m:
            raise ConfigError(field, f"cannot read {what} {value!r}", f"write e.g. {example}")
        v = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if not (0 <= v < float("inf")):
        raise ConfigError(field, f"{what} must be ≥ 0, got {value!r}", f"write e.g. {example}")
    return v


def parse_frequency(value: Any, field: str = "frequency") -> float:
    """Hz from ``"1.41GHz"``, ``"1410 MHz"``, or a plain number of Hz."""
    return _number_with_unit(value, field, _FREQ_RE, "frequency", "1.41GHz")


def parse_power(value: Any, field: str = "power") -> float:
    """W from ``"400W"``, ``"0.7kW"``, or a plain number of watts."""
    return _number_with_unit(value, field, _POWER_RE, "power", "400W")
