"""Unit parsing and printing: the one place where "100Gbps", "25GB/s", "256MiB" and "1.5us" become SI floats.

Inside topotrain everything is SI: bytes, seconds, bytes per second, FLOP/s. Bandwidth strings in bits
(``Gbps``, ``Gb/s``) are divided by 8. Decimal prefixes are powers of 1000, binary ones (``Ki``, ``Mi``,
``Gi``) powers of 1024, as in IEC 80000-13.
"""

from __future__ import annotations

import math
import re

from topotrain.errors import ConfigError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "ps": 1e-12, "min": 60.0, "h": 3600.0}

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_SIZE_RE = re.compile(rf"^\s*{_NUM}\s*([kKMGTPE]i?)?\s*(B|bytes?|b|bits?)?\s*$")
_BW_RE = re.compile(rf"^\s*{_NUM}\s*([kKMGTPE]i?)?\s*(bps|b/s|bit/s|Bps|B/s|bytes/s)\s*$")
_TIME_RE = re.compile(rf"^\s*{_NUM}\s*(s|ms|us|µs|ns|ps|min|h)?\s*$")


def _prefix(p: str | None) -> float:
    if not p:
        return 1.0
    if p in _BINARY:
        return _BINARY[p]
    return _DECIMAL[p]


def _check(value: float, field: str, allow_zero: bool) -> float:
    if not math.isfinite(value):
        raise ConfigError(field, f"{value} is not a finite number", "give a finite value")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, f"must be {'non-negative' if allow_zero else 'positive'}, got {value}",
                          "give a positive value")
    return value


def parse_size(value: str | float | int, field: str = "size", allow_zero: bool = False) -> float:
    """Bytes from ``"256MiB"``, ``"1.5GB"``, ``"8Gb"`` (bits), or a plain number of bytes."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a size, got {value!r}", "write e.g. 256MiB")
    if isinstance(value, int | float):
        return _check(float(value), field, allow_zero)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read size {value!r}", "write e.g. 256MiB, 1GB or 4096")
    num, pre, unit = m.groups()
    scale = _prefix(pre)
    if unit in ("b", "bit", "bits"):
        scale /= 8.0
    return _check(float(num) * scale, field, allow_zero)


def parse_bandwidth(value: str | float | int, field: str = "bandwidth") -> float:
    """Bytes per second from ``"100Gbps"``, ``"25GB/s"``, ``"200Gb/s"``; a plain number is bytes/s."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a bandwidth, got {value!r}", "write e.g. 100Gbps or 25GB/s")
    if isinstance(value, int | float):
        return _check(float(value), field, False)
    m = _BW_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read bandwidth {value!r}", "write e.g. 100Gbps, 200Gb/s or 25GB/s")
    num, pre, unit = m.groups()
    scale = _prefix(pre)
    if unit in ("bps", "b/s", "bit/s"):
        scale /= 8.0
    return _check(float(num) * scale, field, False)


def parse_time(value: str | float | int, field: str = "time", allow_zero: bool = True) -> float:
    """Seconds from ``"1.5us"``, ``"2ms"``, ``"3s"``; a plain number is seconds."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration, got {value!r}", "write e.g. 1.5us")
    if isinstance(value, int | float):
        return _check(float(value), field, allow_zero)
    m = _TIME_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read duration {value!r}", "write e.g. 1.5us, 2ms or 0.1s")
    num, unit = m.groups()
    return _check(float(num) * _TIME[unit or "s"], field, allow_zero)


_FLOPS_RE = re.compile(rf"^\s*{_NUM}\s*([kKmMgGtTpPeE])?\s*((?i:flops|flop/s|flops/s|ops|op/s|ops/s))?\s*$")


def parse_flops(value: str | float | int, field: str = "flops") -> float:
    """FLOP/s from ``"312TFLOPS"``, ``"19.5 TFLOP/s"``, ``"624 TOPS"`` (int ops); a plain number is FLOP/s.

    Prefixes are decimal (``T`` = 10^12) and case-blind (``tflops`` = ``TFLOPS``), as datasheets quote peaks.
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a compute rate, got {value!r}", "write e.g. 312TFLOPS")
    if isinstance(value, int | float):
        return _check(float(value), field, False)
    m = _FLOPS_RE.match(str(value))
    if not m:
        raise ConfigError(field, f"cannot read compute rate {value!r}",
                          "write e.g. 312TFLOPS, 19.5 TFLOP/s or 1.2e15")
    num, pre, _unit = m.groups()
    scale = _DECIMAL[pre.upper()] if pre else 1.0
    return _check(float(num) * scale, field, False)


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
    """``1.5e-6`` → ``"1.5 us"``."""
    if seconds == 0:
        return "0 s"
    steps = [(1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n")]
    return _scaled(seconds, steps, "s", 4)


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes/s → ``"12.5 GB/s"`` (decimal prefixes, as link speeds are quoted)."""
    steps = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    return _scaled(bytes_per_s, steps, "B/s", 4)


def gbps(bytes_per_s: float) -> float:
    """Bytes/s → GB/s (10^9 bytes per second), NCCL's unit for algbw and busbw."""
    return bytes_per_s / 1e9
