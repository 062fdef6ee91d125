"""JSON that every reader accepts: no ``Infinity``/``NaN`` (not JSON, RFC 8259 §6; Python writes them unless
told not to). Non-finite floats become ``null``; numpy scalars and arrays become plain numbers and lists."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (mappings, lists, tuples and numpy values walked)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    tolist = getattr(obj, "tolist", None)  # numpy scalar or array
    if callable(tolist):
        return finite(tolist())
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """:func:`json.dumps` of :func:`finite` ``(obj)`` with ``allow_nan=False`` (a non-finite value that slipped
    through, e.g. from a ``default=`` hook, is an error rather than invalid JSON)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
