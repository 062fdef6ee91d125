"""pydantic's validation errors as topotrain's one-line problems, with the field's path and the fix.

Every model of the scenario is validated by pydantic; this module turns each of pydantic's errors into a
:class:`~topotrain.util.errors.ConfigError` (``plan.micro_batch: must be ≥ 1 (got 0) (give micro_batch: 1 or
more)``), adds "did you mean" for an unknown key (difflib against the keys the model takes there), and
raises them together as one :class:`~topotrain.util.errors.ConfigErrors`. It also holds :func:`config_dataclass`,
which makes a frozen pydantic dataclass raise those errors instead of pydantic's own (so the Python API
fails the same way as the CLI).
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Union, dataclass_transform, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError

from topotrain.util.errors import ConfigError, ConfigErrors, did_you_mean

T = TypeVar("T")

#: pydantic error type of a problem raised by our own validators (its ctx holds field, message and fix).
PROBLEM = "topotrain_problem"
#: pydantic error type of several problems raised by one cross-field validator (ctx: JSON list).
PROBLEMS = "topotrain_problems"




def problem(message: str, fix: str = "", field: str = "") -> PydanticCustomError:
    """A validator's error: ``field`` is relative to where pydantic reports it (empty: that place)."""
    return PydanticCustomError(PROBLEM, "{message}", {"message": message, "fix": fix, "field": field})


def several(found: Sequence[ConfigError]) -> PydanticCustomError:
    """Several problems from one cross-field validator (fields relative to the validated model)."""
    data = [[p.field, p.message, p.fix] for p in found]
    return PydanticCustomError(PROBLEMS, "{count} problems", {"count": len(found), "problems": json.dumps(data)})


def from_config_error(e: ConfigError) -> PydanticCustomError:
    """A ConfigError raised by a parser inside a validator, kept whole (its own field path is dropped:
    pydantic's location is the real one)."""
    return problem(e.message, e.fix)


def _path(prefix: str, loc: Sequence[int | str]) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def _unwrap(tp: Any) -> list[Any]:
    """The concrete types behind an annotation (Optional, Union, Annotated unwrapped)."""
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return [t for a in get_args(tp) for t in _unwrap(a)]
    return [tp]


def _fields_of(tp: Any) -> dict[str, Any] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {n: f.annotation for n, f in tp.model_fields.items()}
    fields = getattr(tp, "__pydantic_fields__", None)
    if isinstance(tp, type) and fields is not None:
        return {n: f.annotation for n, f in fields.items()}
    return None


def _known_keys(root: Any, loc: Sequence[int | str]) -> list[str]:
    """Keys the model takes at ``loc`` (the parent of an unknown key), following pydantic's location."""
    cands = [root]
    for part in loc:
        nxt: list[Any] = []
        for c in cands:
            for t in _unwrap(c):
                flds = _fields_of(t)
                if flds is not None and isinstance(part, str) and part in flds:
                    nxt.append(flds[part])
                elif isinstance(part, str) and getattr(t, "__name__", None) == part:
                    nxt.append(t)  # a union member's tag
                elif get_origin(t) in (list, tuple, Sequence, dict) or t in (list, tuple, dict):
                    args = get_args(t)
                    if args:
                        nxt.append(args[-1])
        if not nxt:
            nxt = cands  # a tag we do not follow (e.g. a function validator): stay where we are
        cands = nxt
    keys: set[str] = set()
    for c in cands:
        for t in _unwrap(c):
            flds = _fields_of(t)
            if flds is not None:
                keys.update(flds)
    return sorted(keys)


def _clean_loc(loc: Sequence[int | str]) -> list[int | str]:
    """pydantic's location without union tags and validator names (``function-after[...]``, ``str``)."""
    out: list[int | str] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "list", "dict",
                                                              "list[str]", "dict[str,float]")):
            continue
        if isinstance(part, str) and part[:1].isupper():
            continue  # a union member's class name (our models are CamelCase, keys are snake_case)
        out.append(part)
    return out


def _message(err: Any, prefix: str, root: Any) -> ConfigError:
    etype = err["type"]
    loc = list(err["loc"])
    where = _path(prefix, _clean_loc(loc))
    ctx = err.get("ctx") or {}
    got = err.get("input")
    if etype == PROBLEM:
        field = ctx.get("field") or ""
        return ConfigError(f"{where}.{field}" if field and where else field or where, ctx["message"],
                           ctx.get("fix", ""))
    if etype in ("extra_forbidden", "unexpected_keyword_argument"):
        key = str(loc[-1])
        known = _known_keys(root, loc[:-1])
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
        fix = (f"did you mean {near[0]!r}? " if near else "") + (f"known: {', '.join(known)}" if known else "")
        return ConfigError(where, "unknown key", fix.strip())
    if etype == "missing":
        return ConfigError(where, "is required", f"add {loc[-1]}: ...")
    if etype in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op, key = {"greater_than_equal": ("≥", "ge"), "greater_than": (">", "gt"),
                   "less_than_equal": ("≤", "le"), "less_than": ("<", "lt")}[etype]
        return ConfigError(where, f"must be {op} {ctx[key]} (got {_short(got)})",
                           f"give {loc[-1] if loc else 'a value'} {op} {ctx[key]}")
    if etype in ("int_type", "int_parsing", "int_from_float"):
        return ConfigError(where, f"must be a whole number (got {_kind(got)}: {_short(got)})",
                           "write e.g. 8")
    if etype in ("float_type", "float_parsing", "finite_number"):
        return ConfigError(where, f"must be a finite number (got {_kind(got)}: {_short(got)})", "write e.g. 1.5")
    if etype in ("bool_type", "bool_parsing"):
        return ConfigError(where, f"must be true or false (got {_short(got)})", "write true or false")
    if etype in ("string_type",):
        return ConfigError(where, f"must be text (got {_kind(got)}: {_short(got)})", "write a name")
    if etype == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        fix = did_you_mean(got, expected) if expected else f"use one of {ctx.get('expected', '')}"
        return ConfigError(where, f"unknown value {_short(got)}", fix)
    if etype in ("model_type", "dict_type", "model_attributes_type", "dataclass_type", "mapping_type"):
        return ConfigError(where, f"must be a mapping (got {_kind(got)}: {_short(got)})",
                           "write key: value pairs under it, as in examples/*.yaml")
    if etype in ("list_type", "tuple_type"):
        return ConfigError(where, f"must be a list (got {_kind(got)}: {_short(got)})", "write [a, b, ...]")
    if etype == "union_tag_invalid":
        return ConfigError(where, f"unknown type {_short(ctx.get('tag'))}",
                           f"use one of {ctx.get('expected_tags', '')}")
    if etype == "value_error":
        msg = str(ctx.get("error", err["msg"]))
        return ConfigError(where, msg)
    return ConfigError(where, f"{err['msg'][:1].lower()}{err['msg'][1:]} (got {_short(got)})")


def problems_from(error: ValidationError, prefix: str = "", root: Any = None) -> list[ConfigError]:
    """pydantic's errors as ConfigErrors, one per problem, fields prefixed with ``prefix``.

    Where a union has several members, pydantic reports a failure against each; we keep the member that
    got furthest (the longest location), which is the one the user meant.
    """
    out: list[ConfigError] = []
    errors = list(error.errors(include_url=False))
    for err in errors:
        if err["type"] == PROBLEMS:
            where = _path(prefix, _clean_loc(err["loc"]))
            for field, message, fix in json.loads(err["ctx"]["problems"]):
                out.append(ConfigError(f"{where}.{field}" if where and field else (field or where), message,
                                       fix))
        else:
            out.append(_message(err, prefix, root))
    seen: set[str] = set()
    unique = []
    for p in out:
        if str(p) not in seen:
            seen.add(str(p))
            unique.append(p)
    return _drop_union_noise(unique)


def _drop_union_noise(found: list[ConfigError]) -> list[ConfigError]:
    """For a field reported several times by the members of a union, keep the most specific reports."""
    by_field: dict[str, list[ConfigError]] = {}
    for p in found:
        by_field.setdefault(p.field, []).append(p)
    out = []
    for p in found:
        deeper = [q for q in found if q.field != p.field and q.field.startswith(p.field + ".")]
        same = by_field[p.field]
        if deeper and p.message.startswith(("must be", "unknown value")):
            continue  # the union member that matched reports the real problem below this field
        if len(same) > 1 and p.message.startswith("must be text") and any(q is not p for q in same):
            continue
        out.append(p)
    return out or found


def raise_problems(error: ValidationError, prefix: str = "", root: Any = None) -> typing.NoReturn:
    """Raise ``error`` as one :class:`ConfigErrors` (all its problems)."""
    raise ConfigErrors(problems_from(error, prefix, root)) from None


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: Any, field: str = "") -> M:
    """``data`` validated by the pydantic ``model`` (an instance of it is taken as it is); every problem at once,
    as one :class:`ConfigErrors` with the fields under ``field``."""
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise_problems(e, field, model)


@dataclass_transform(frozen_default=True)
def config_dataclass(prefix: str) -> Callable[[type[T]], type[T]]:
    """A frozen pydantic dataclass (``extra="forbid"``) whose constructor raises :class:`ConfigErrors`
    with fields under ``prefix`` instead of pydantic's ValidationError. ``dataclasses.replace`` works and
    validates again."""

    def wrap(cls: type[T]) -> type[T]:
        dc: Any = pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))(cls)
        original = dc.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                original(self, *args, **kwargs)
            except ValidationError as e:
                raise_problems(e, prefix, dc)

        __init__.__doc__ = original.__doc__
        dc.__init__ = __init__
        return typing.cast(type[T], dc)

    return wrap
