"""Field types of the scenario schema: unit-typed values (parsed by :mod:`topotrain.util.units`) and counts.

A unit-typed field accepts the text a user writes (``100Gbps``, ``1us``, ``25MiB``) and holds the SI float;
its JSON Schema says "a string with a unit" so an editor can complete and check it.
"""

from __future__ import annotations

__all__ = ["MAX_BUILDER_PARAM", "MAX_COUNT", "MAX_GPUS", "MAX_INT", "MAX_SERVERS", "Bandwidth", "Count", "Duration",
           "Frequency", "Name", "NonNegativeInt", "PositiveInt", "Power", "Size", "no_bool"]

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

from topotrain.util.errors import ConfigError
from topotrain.util.limits import MAX_BUILDER_PARAM, MAX_COUNT, MAX_GPUS, MAX_INT, MAX_SERVERS
from topotrain.util.problems import from_config_error
from topotrain.util.units import (
    format_bandwidth,
    format_size,
    format_time,
    parse_bandwidth,
    parse_frequency,
    parse_power,
    parse_size,
    parse_time,
)


def _parser(parse: Callable[[Any], float]) -> Callable[[Any], float]:
    def run(value: Any) -> float:
        try:
            return parse(value)
        except ConfigError as e:
            raise from_config_error(e) from None

    return run


def _bw(value: Any) -> float:
    return parse_bandwidth(value, "bandwidth")


def _time(value: Any) -> float:
    return parse_time(value, "time")


def _size(value: Any) -> float:
    return parse_size(value, "size", bare_bytes=False)


def _exact(pretty: Callable[[float], str], parse: Callable[[Any], float], unit: str) -> Callable[[float], str]:
    """Print a value readably when that reads back exactly, else as its exact SI number with the unit."""

    def out(v: float) -> str:
        text = pretty(v).replace(" ", "")
        try:
            if parse(text) == v:
                return text
        except ConfigError:
            pass
        return f"{v!r}{unit}"

    return out


def _schema(pattern: str, examples: list[str], description: str) -> WithJsonSchema:
    """Text with a unit, or the number 0 (the one value that needs none)."""
    return WithJsonSchema({"anyOf": [{"type": "string", "pattern": pattern}, {"const": 0}], "examples": examples,
                           "description": description})


#: Bytes per second, written with its unit: ``100Gbps`` (bits) or ``12.5GB/s`` (bytes).
Bandwidth = Annotated[
    float,
    BeforeValidator(_parser(_bw)),
    PlainSerializer(_exact(format_bandwidth, _bw, "B/s"), return_type=str),
    _schema(r"^\s*[0-9.eE+-]+\s*[kKMGTPE]?i?\s*(bps|b/s|bit/s|Bps|B/s|bytes/s)\s*$", ["100Gbps", "25GB/s"],
            "bandwidth with its unit: Gbps / Gb/s are bits per second, GB/s bytes per second"),
]
#: Seconds, written with its unit: ``1us``, ``2ms``, ``0.5s`` (a bare number is refused, except 0).
Duration = Annotated[
    float,
    BeforeValidator(_parser(_time)),
    PlainSerializer(_exact(format_time, _time, "s"), return_type=str),
    _schema(r"^\s*[0-9.eE+-]+\s*(s|ms|us|µs|ns|ps|min|h)\s*$", ["1us", "2ms"],
            "duration with its unit (s, ms, us, ns)"),
]
#: Bytes, written with its unit: ``25MiB``, ``25M`` (MiB, as nccl-tests), ``1GB`` (decimal), ``8Gb`` (bits).
Size = Annotated[
    float,
    BeforeValidator(_parser(_size)),
    PlainSerializer(_exact(format_size, _size, "B"), return_type=str),
    _schema(r"^\s*[0-9.eE+-]+\s*[kKmMgGtTpPeE]?[iI]?\s*(B|b|bytes?|bits?)?\s*$", ["25MiB", "1GiB"],
            "size with its unit: MiB/GiB (or M/G, as nccl-tests) binary, MB/GB decimal, Mb/Gb bits"),
]

#: A positive whole number (``true`` and ``2.0`` are refused: they are not counts), at most MAX_INT.
PositiveInt = Annotated[int, Field(strict=True, ge=1, le=MAX_INT)]
#: A whole number ≥ 0, at most MAX_INT.
NonNegativeInt = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]
#: A positive count of a scenario (batch, model dimension, parallel degree), at most MAX_COUNT.
Count = Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)]
#: A non-empty name.
Name = Annotated[str, Field(strict=True, min_length=1)]


def no_bool(value: Any) -> Any:
    """Refuse a boolean where a number is meant (YAML's ``yes``/``true`` would pass as 1)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {value!r}")
    return value


def _freq(value: Any) -> float:
    return parse_frequency(value, "frequency")


def _power(value: Any) -> float:
    return parse_power(value, "power")


#: Hz: ``1.41GHz``, ``1410MHz`` (a plain number is Hz).
Frequency = Annotated[float, BeforeValidator(_parser(_freq)),
                      WithJsonSchema({"type": ["string", "number"], "examples": ["1.41GHz"]})]
#: Watts: ``400W``, ``0.7kW`` (a plain number is W).
Power = Annotated[float, BeforeValidator(_parser(_power)),
                  WithJsonSchema({"type": ["string", "number"], "examples": ["400W"]})]
