"""A design space written over the scenario schema: any field of a scenario may hold several values.

A space file is a scenario document (see :mod:`topotrain.scenario`) in which a field may hold

- a list of values: ``plan.micro_batch: [64, 128, 256]`` (every one is tried);
- a range: ``plan.bucket: {from: 8, to: 64, step: 8, unit: MiB}`` or ``servers: {log2: [8, 64]}``
  (the powers of two from 8 to 64);
- a choice of sub-documents: ``cluster: [{server: eflops, ...}, {server: pcie-shared-nic, ...}]`` — each
  sub-document may itself hold dimensions (a conditional space);
- ``{choice: [...]}``: the explicit form of a list (needed where the schema's field is itself a list,
  e.g. ``degraded_links``, ``network.dims``: a plain list there is the field's value, not a dimension);
- a mixed fleet: ``cluster.groups`` is a list of groups, each of which may hold dimensions of its own
  (``cluster.groups[1].servers: [0, 1, 2]``, named so); a group given 0 servers is left out of the point (none
  of that server type is bought), so the search chooses how many of each type to buy (docs/mixed.md).

Besides the scenario's sections a space file has ``search:`` (optimizer, trials, seed, constraints,
objectives, screening; see :class:`SearchSettings`) and an optional ``costs:`` (overrides of the price
catalog, :mod:`topotrain.search.cost`). A point of the space is a plain scenario document; it is checked
by the same schema as any scenario (:func:`topotrain.scenario.load.scenario_from_dict`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from topotrain.search.cost import price_catalog
from topotrain.util.errors import ConfigError

#: Scenario fields whose schema type is a list: a plain list there is the value itself.
_LIST_FIELDS = ("degraded_links", "cluster.network.dims", "cluster.catalog", "cluster.server.nodes",
                "cluster.server.links", "model.")
#: A mixed cluster's groups: a list whose elements may hold dimensions (module docstring).
_GROUPS = "cluster.groups"
#: Keys of a range / explicit choice.
_RANGE_KEYS = {"from", "to", "step", "unit"}

Scalar = int | float | str | bool | None
#: Most values one dimension (a list, a choice or a range) may hold.
MAX_CHOICES = 100_000
#: Largest magnitude of a range's bounds and step (past 2^53 a float no longer counts every integer).
_RANGE_MAX = float(2**53)


class Suggester(Protocol):
    """Who picks a value of each dimension (a grid cursor, or an optuna trial)."""

    def pick(self, name: str, labels: list[Scalar]) -> int:
        """Index of the value chosen for dimension ``name`` among ``labels``."""
        ...


@dataclass(frozen=True)
class Choice:
    """One dimension: ``values`` (each a plain value or a sub-document that may hold more dimensions)."""

    name: str
    values: tuple[Any, ...]
    labels: tuple[Scalar, ...]


def _is_list_field(path: str) -> bool:
    if path.startswith(_GROUPS + "["):  # inside a group, the fields are a cluster's: cluster.groups[i].x → cluster.x
        rest = path[len(_GROUPS) + 1:].partition("]")[2]
        path = "cluster" + rest
    return path == _GROUPS or any(path == f or (f.endswith(".") and path.startswith(f)) or path.startswith(f + ".")
               or path.startswith(f + "[") for f in _LIST_FIELDS)


def _label(v: Any, i: int) -> Scalar:
    if isinstance(v, Mapping):
        for key in ("name", "server", "topology"):
            if isinstance(v.get(key), str):
                return f"{i}:{v[key]}"
        return i
    if isinstance(v, list | tuple):
        return json.dumps(v)
    return v


def _range_values(path: str, spec: Mapping[str, Any]) -> list[Any]:
    """``{from, to, step[, unit]}`` or ``{log2: [a, b][, unit]}`` → the values, in order."""
    unit = spec.get("unit")
    if unit is not None and not isinstance(unit, str):
        raise ConfigError(f"{path}.unit", f"must be a unit such as MiB (got {unit!r})", "write e.g. unit: MiB")
    if "log2" in spec:
        lo_hi = spec["log2"]
        extra = set(spec) - {"log2", "unit"}
        if extra:
            raise ConfigError(f"{path}.{sorted(extra)[0]}", "does not go with log2", "write {log2: [8, 1024]}")
        ok = (isinstance(lo_hi, list) and len(lo_hi) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                    and 1 <= x <= _RANGE_MAX for x in lo_hi))
        if not ok or lo_hi[0] > lo_hi[1]:
            raise ConfigError(f"{path}.log2",
                              f"must be [LOW, HIGH], positive integers, LOW ≤ HIGH (got {str(lo_hi)[:60]})",
                              f"write e.g. {{log2: [8, 1024]}} (at most {_RANGE_MAX:g})")
        lo = 1 << math.ceil(math.log2(lo_hi[0]))
        vals: list[Any] = []
        while lo <= lo_hi[1]:
            vals.append(lo)
            lo *= 2
        if not vals:
            raise ConfigError(f"{path}.log2", f"holds no power of two (got {lo_hi!r})", "widen the range")
    else:
        missing = [k for k in ("from", "to") if k not in spec]
        if missing:
            raise ConfigError(f"{path}.{missing[0]}", "is required in a range", "write {from: 8, to: 64, step: 8}")
        a, b, step = spec["from"], spec["to"], spec.get("step", 1)
        nums = (a, b, step)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and abs(x) <= _RANGE_MAX
                   for x in nums):  # NaN compares false: refused too
            shown = ", ".join(str(x)[:24] for x in nums)
            raise ConfigError(path, f"from, to and step must be finite numbers of magnitude at most "
                              f"{_RANGE_MAX:g} (got {shown})", "write e.g. {from: 8, to: 64, step: 8, unit: MiB}")
        if step <= 0 or b < a:
            raise ConfigError(path, f"needs step > 0 and from ≤ to (got from {a}, to {b}, step {step})",
                              "write e.g. {from: 8, to: 64, step: 8}")
        n = int(math.floor((b - a) / step + 1e-9)) + 1
        if n > MAX_CHOICES:
            raise ConfigError(path, f"holds {n} values", "use a larger step")
        as_int = all(isinstance(x, int) for x in nums)
        vals = [a + i * step if as_int else round(a + i * step, 12) for i in range(n)]
    if unit is not None:
        return [f"{v}{unit}" for v in vals]
    return vals


def _dimension(path: str, value: Any) -> list[Any] | None:
    """The values of a dimension written at ``path``, or None if ``value`` is a plain value."""
    if isinstance(value, Mapping):
        keys = set(value)
        if "choice" in keys:
            if keys != {"choice"} or not isinstance(value["choice"], list) or not value["choice"]:
                raise ConfigError(f"{path}.choice", "must be a non-empty list and the only key",
                                  "write {choice: [a, b]}")
            if len(value["choice"]) > MAX_CHOICES:
                raise ConfigError(f"{path}.choice", f"holds {len(value['choice'])} choices, more than {MAX_CHOICES}",
                                  "split the study")
            return list(value["choice"])
        if "log2" in keys or ({"from", "to"} <= keys and keys <= _RANGE_KEYS):
            return _range_values(path, value)
        return None
    if isinstance(value, list) and not _is_list_field(path):
        if not value:
            raise ConfigError(path, "is an empty list of choices", "give at least one value")
        if len(value) > MAX_CHOICES:
            raise ConfigError(path, f"holds {len(value)} choices, more than {MAX_CHOICES}",
                              "split the study, or use a range with a larger step")
        return value
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def realize(doc: Any, pick: Suggester, path: str = "") -> Any:
    """The point of the space ``doc`` that ``pick`` chooses (dimensions named by their dotted path; a
    dimension inside the i-th sub-document of a choice at ``cluster`` is named ``cluster[i].servers``)."""
    values = _dimension(path, doc) if path else None
    if values is not None:
        labels = [_label(v, i) for i, v in enumerate(values)]
        i = pick.pick(path, labels)
        chosen = values[i]
        sub = f"{path}[{i}]" if isinstance(chosen, Mapping) and len(values) > 1 else path
        return _realize_inner(chosen, pick, sub, path)
    return _realize_inner(doc, pick, path, path)


def _realize_inner(doc: Any, pick: Suggester, name_path: str, field_path: str) -> Any:
    if field_path == _GROUPS and isinstance(doc, list):  # each group realized; groups of 0 servers left out
        groups = [_realize_inner(g, pick, f"{name_path}[{i}]", f"{field_path}[{i}]") for i, g in enumerate(doc)]
        kept = [g for g in groups if not (isinstance(g, Mapping) and g.get("servers") == 0)]
        return kept or groups[:1]  # every group at 0: the first stays, and the schema names the problem
    if isinstance(doc, Mapping):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out[k] = _realize_field(v, pick, _join(name_path, str(k)), _join(field_path, str(k)))
        return out
    return doc


def _realize_field(v: Any, pick: Suggester, name_path: str, field_path: str) -> Any:
    values = _dimension(field_path, v)
    if values is None:
        return _realize_inner(v, pick, name_path, field_path)
    labels = [_label(x, i) for i, x in enumerate(values)]
    i = pick.pick(name_path, labels)
    chosen = values[i]
    sub = f"{name_path}[{i}]" if isinstance(chosen, Mapping) and len(values) > 1 else name_path
    return _realize_inner(chosen, pick, sub, field_path)


class _Cursor:
    """A grid cursor: follows ``fixed`` choices and records each new dimension it meets at index 0; a
    dimension that ``vary`` refuses is held at ``hold``'s index (0 if absent) and not enumerated."""

    def __init__(self, fixed: dict[str, int], hold: Mapping[str, int] | None = None,
                 vary: Callable[[str], bool] | None = None) -> None:
        self.fixed = fixed
        self.hold = hold or {}
        self.vary = vary
        self.met: list[tuple[str, int]] = []
        self.picked: dict[str, int] = {}

    def pick(self, name: str, labels: list[Scalar]) -> int:
        if self.vary is not None and not self.vary(name):
            i = min(self.hold.get(name, 0), len(labels) - 1)
        else:
            if name not in self.fixed:
                self.met.append((name, len(labels)))
            i = self.fixed.get(name, 0)
        self.picked[name] = i
        return i


def grid(doc: Mapping[str, Any], limit: int | None = None, *, hold: Mapping[str, int] | None = None,
         vary: Callable[[str], bool] | None = None) -> Iterator[tuple[dict[str, int], dict[str, Any]]]:
    """Every point of the space, in a fixed order (the last-met dimension varies fastest), as
    (choices by dimension name, scenario document). Conditional dimensions are followed exactly. With
    ``vary``, only the dimensions it accepts are enumerated; the others stay at ``hold``'s choice."""
    count = 0
    stack: list[dict[str, int]] = [{}]
    while stack:
        fixed = stack.pop()
        cur = _Cursor(dict(fixed), hold, vary)
        point = realize(doc, cur)
        if cur.met:
            # expand the first dimension met that is not fixed yet (one at a time, so a dimension that
            # lives under one alternative of a choice is never multiplied into the others)
            first, size = cur.met[0]
            for i in reversed(range(size)):
                stack.append({**fixed, first: i})
            continue
        yield cur.picked, point
        count += 1
        if limit is not None and count >= limit:
            return


def grid_size(doc: Mapping[str, Any], cap: int = 10_000_000) -> int:
    """Number of points of the space (counted, conditional dimensions included; stops at ``cap``)."""
    return sum(1 for _ in grid(doc, cap))


def point_key(point: Mapping[str, Any]) -> str:
    """A stable identity of a point: the SHA-1 of its canonical JSON (keys sorted)."""
    text = json.dumps(point, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


# ---- the search: section ---------------------------------------------------------------------------------
Optimizer = Literal["grid", "tpe", "nsga2", "alternate"]
OBJECTIVES = ("iteration_time_s", "time_to_train_s", "capex_usd", "usd_per_1m_tokens", "tokens_per_s_per_kw")
#: which way each objective is better
MINIMIZE = {"iteration_time_s": True, "time_to_train_s": True, "capex_usd": True, "usd_per_1m_tokens": True,
            "tokens_per_s_per_kw": False}


@dataclass(frozen=True)
class Constraints:
    """``search.constraints``: every point must satisfy these (memory always: a plan that does not fit is
    pruned before it is timed)."""

    gpus: int | None = None
    budget_usd: float | None = None
    max_power_kw: float | None = None


@dataclass(frozen=True)
class SearchSettings:
    """``search:`` of a space file."""

    optimizer: Optimizer = "grid"
    trials: int = 100
    seed: int = 0
    batch: int = 16
    objectives: tuple[str, ...] = ("iteration_time_s", "capex_usd")
    constraints: Constraints = Constraints()
    screen_network: str = "analytical"
    confirm_network: str = "flow"
    confirm_top: float = 0.01
    train_tokens: float | None = None
    train_samples: float | None = None
    max_grid: int = 200_000
    rounds: int = 2


_SETTINGS_KEYS = {"optimizer", "trials", "seed", "batch", "objectives", "constraints", "screen_network",
                  "confirm_network", "confirm_top", "train", "max_grid", "rounds"}


#: Largest value of each numeric setting (beyond it a value is a typo, and some would never end: a loop of
#: 10^3000 trials). optuna's samplers take a seed below 2^32; the sampler of each round gets seed + trials.
_MAX = {"trials": 1_000_000, "batch": 10_000, "max_grid": 10_000_000, "rounds": 1_000,
        "seed": 2**32 - 1 - 1_000_000, "confirm_top": 1_000_000, "train": 1e30, "gpus": 1 << 30,
        "budget_usd": 1e15, "max_power_kw": 1e12}


def _num(field: str, v: Any, lo: float = 0.0, integer: bool = False, strict_lo: bool = True,
         hi: float = math.inf) -> Any:
    """A number of the ``search:`` section (a whole number where ``integer``; numbers written as text, e.g.
    ``3e11``, are read): finite, above ``lo``, at most ``hi``; anything else is one ConfigError on ``field``."""
    kind = "a whole number" if integer else "a number"
    if isinstance(v, str) and not integer:
        try:
            v = float(v.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(field, f"must be {kind} (got {v[:40]!r})", "see docs/search.md") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not isinstance(v, int)):
        raise ConfigError(field, f"must be {kind} (got {str(v)[:40]!r})", "see docs/search.md")
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(field, f"must be a finite number (got {v!r})", "see docs/search.md")
    if (v <= lo) if strict_lo else (v < lo):
        raise ConfigError(field, f"must be {'>' if strict_lo else '≥'} {lo:g} (got {v!r})", "see docs/search.md")
    if v > hi:
        shown = f"{v:g}" if isinstance(v, float) or v < 10**15 else f"a number of {len(str(v))} digits"
        raise ConfigError(field, f"must be at most {hi:g} (got {shown})", "see docs/search.md")
    return v


def settings_from(d: Any) -> SearchSettings:
    """The :class:`SearchSettings` of a space's ``search:`` mapping."""
    from difflib import get_close_matches

    if d is None:
        return SearchSettings()
    if not isinstance(d, Mapping):
        raise ConfigError("search", f"must be a mapping (got {type(d).__name__})", "see docs/search.md")
    for k in d:
        if k not in _SETTINGS_KEYS:
            near = get_close_matches(str(k), sorted(_SETTINGS_KEYS), 1)
            raise ConfigError(f"search.{k}", "is not a setting",
                              f"did you mean {near[0]}?" if near else "see docs/search.md")
    kw: dict[str, Any] = {}
    if "optimizer" in d:
        if d["optimizer"] not in ("grid", "tpe", "nsga2", "alternate"):
            raise ConfigError("search.optimizer", f"unknown optimizer {d['optimizer']!r}",
                              "use grid, tpe, nsga2 or alternate")
        kw["optimizer"] = d["optimizer"]
    for key in ("trials", "batch", "max_grid", "rounds"):
        if key in d:
            kw[key] = _num(f"search.{key}", d[key], 0, integer=True, hi=_MAX[key])
    if "seed" in d:
        kw["seed"] = _num("search.seed", d["seed"], 0, integer=True, strict_lo=False, hi=_MAX["seed"])
    if "confirm_top" in d:
        v = _num("search.confirm_top", d["confirm_top"], 0, strict_lo=False, hi=_MAX["confirm_top"])
        if v > 1 and not isinstance(v, int):
            raise ConfigError("search.confirm_top", f"must be a fraction ≤ 1 or a count (got {v!r})",
                              "write 0.01 (top 1%) or 5 (top five)")
        kw["confirm_top"] = v
    for key in ("screen_network", "confirm_network"):
        if key in d:
            if d[key] not in ("analytical", "flow", "flow-async", "flow-eager", None):
                raise ConfigError(f"search.{key}", f"unknown network model {d[key]!r}",
                                  "use analytical, flow, flow-async or flow-eager (or null for none)")
            kw[key] = d[key]
    if "objectives" in d:
        obj = d["objectives"]
        if isinstance(obj, str):
            obj = [obj]
        if not isinstance(obj, list) or not obj:
            raise ConfigError("search.objectives", "must be a list of objectives", "e.g. [iteration_time_s, capex_usd]")
        for i, o in enumerate(obj):
            if o not in OBJECTIVES:
                raise ConfigError(f"search.objectives[{i}]", f"unknown objective {o!r}", "use " + ", ".join(OBJECTIVES))
        kw["objectives"] = tuple(obj)
    if "train" in d:
        t = d["train"]
        if not isinstance(t, Mapping) or set(t) - {"tokens", "samples"} or len(t) != 1:
            raise ConfigError("search.train", "must be {tokens: N} or {samples: N}", "write e.g. train: {tokens: 3e11}")
        k, v = next(iter(t.items()))
        kw[f"train_{k}"] = float(_num(f"search.train.{k}", v, 0, hi=_MAX["train"]))
    if "constraints" in d:
        c = d["constraints"]
        if not isinstance(c, Mapping):
            raise ConfigError("search.constraints", "must be a mapping", "e.g. {gpus: 512, budget_usd: 5e6}")
        ckw: dict[str, Any] = {}
        for k, v in c.items():
            if k == "gpus":
                ckw["gpus"] = _num("search.constraints.gpus", v, 0, integer=True, hi=_MAX["gpus"])
            elif k in ("budget_usd", "max_power_kw"):
                ckw[k] = float(_num(f"search.constraints.{k}", v, 0, hi=_MAX[k]))
            elif k == "fits_in_memory":
                if v is not True:
                    raise ConfigError("search.constraints.fits_in_memory", "is always on",
                                      "remove it (a plan that does not fit can never run)")
            else:
                raise ConfigError(f"search.constraints.{k}", "is not a constraint",
                                  "use gpus, budget_usd, max_power_kw or fits_in_memory")
        kw["constraints"] = Constraints(**ckw)
    return SearchSettings(**kw)


@dataclass(frozen=True)
class Space:
    """A parsed space file: the scenario document with dimensions, the settings, the cost overrides."""

    doc: Mapping[str, Any]
    settings: SearchSettings
    costs: Mapping[str, Any]
    name: str = "space"


def space_from_dict(data: Any, name: str = "space") -> Space:
    """A :class:`Space` from the mapping of a space file (its dimensions are checked here; each point is
    checked by the scenario schema when it is evaluated)."""
    if not isinstance(data, Mapping):
        raise ConfigError("space", f"must be a mapping of sections (got {type(data).__name__})",
                          "see examples/search-eflops.yaml")
    doc = {k: v for k, v in data.items() if k not in ("search", "costs")}
    if "cluster" not in doc or "model" not in doc:
        missing = "cluster" if "cluster" not in doc else "model"
        raise ConfigError(missing, "is required", "a space is a scenario whose fields may hold several values")
    settings = settings_from(data.get("search"))
    costs = data.get("costs") or {}
    if not isinstance(costs, Mapping):
        raise ConfigError("costs", "must be a mapping", "see src/topotrain/search/prices.yaml")
    price_catalog(costs)  # a bad price is refused here, before anything runs
    # walk the whole space once so that a malformed range is reported before anything runs
    next(grid(doc, 1))
    return Space(doc, settings, costs, name)
