"""The failures file (``run-long --failures F.yaml``): failure classes, recovery times, checkpoint storage and
policies, validated once (pydantic; every problem at once, one line each, naming the field and the fix).

```yaml
defaults: llama3            # start from the Llama 3 table (llama3) or from nothing (none)
scale: 1.0                  # every default class this many times as frequent
detection: 5min             # a failure noticed (watchdog)
restart: 10min              # the job rescheduled and re-initialized (the checkpoint read is added)
replace: 1h                 # a taken server swapped from the free pool; null: wait for its repair
repair: 24h                 # a taken server repaired (every default class that takes one)
classes:                    # override a default class by name, or add one (mtbf then required)
  faulty-gpu: {distribution: weibull, shape: 0.7}
  leaf-switch: {scope: switch, takes: switch, mtbf: 100000h, repair: 4h}
drop: [ssd]                 # default classes to leave out
checkpoint:
  mode: async               # or sync
  interval: daly            # young, daly, or a duration (30min)
  storage: {write: 2TB/s, read: 2TB/s, per_writer: 2GB/s, snapshot: 25GB/s}
policies:                   # name: {spares: hot spare servers, elastic: shrink the data-parallel degree}
  restart: {}
  spares: {spares: 16}
  elastic: {elastic: true}
samples: 1000               # Monte-Carlo runs per policy
seed: 0
predictor:                  # proactive migration (each policy is also run with it; docs/operations.md §6)
  recall: 0.6               # share of foreseeable failures migrated ahead (topotrain failure-predict)
  precision: 0.5            # share of alarms that were right (each false one costs a migration)
  migration: null           # null: drain + restart from a fresh checkpoint; or a live migration time
  classes: null             # null: the GPU hardware classes (scope gpu, takes a server)
```
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from topotrain.operations.checkpoint import Mode, StorageTier
from topotrain.operations.failures import (
    DEFAULT_DETECT_S,
    DEFAULT_REPAIR_S,
    DEFAULT_RESTART_S,
    SOURCE_LLAMA3,
    FailureClass,
    FailureModel,
    llama3_classes,
)
from topotrain.operations.longrun import Migration, Policy
from topotrain.scenario.cluster import read_yaml
from topotrain.util.errors import ConfigError, ConfigErrors
from topotrain.util.fields import Bandwidth, Duration
from topotrain.util.problems import problem, raise_problems
from topotrain.util.units import parse_time

_Strict = ConfigDict(extra="forbid", frozen=True)
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMBGTP]?)\s*$")
_COUNT_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_count(value: str | float | int, field: str) -> float:
    """A positive amount written as a number or with a decimal suffix: ``15T`` = 15·10¹², ``300B``, ``2M``."""
    if isinstance(value, bool):
        raise ConfigError(field, f"must be a number, got {value!r}", "write e.g. 15T")
    if isinstance(value, int | float):
        x = float(value)
    else:
        m = _COUNT_RE.match(str(value))
        if not m:
            raise ConfigError(field, f"cannot read {str(value)[:40]!r}", "write e.g. 15T, 300B, 2.5M or 1e12")
        x = float(m.group(1)) * _COUNT_SCALE[m.group(2)]
    if not (x > 0 and math.isfinite(x)) or x > 1e18:
        raise ConfigError(field, f"must be in (0, 1e18], got {x!r}", "write e.g. 15T")
    return x


class ClassSpec(BaseModel):
    """One failure class (every field optional when overriding a default class)."""

    model_config = _Strict
    mtbf: Duration | None = None
    scope: Literal["gpu", "server", "nic", "switch", "link", "job"] | None = None
    takes: Literal["none", "server", "switch"] | None = None
    repair: Duration | None = None
    distribution: Literal["exponential", "weibull"] | None = None
    shape: Annotated[float, Field(ge=0.05, le=20)] | None = None
    category: str | None = None


class StorageSpec(BaseModel):
    model_config = _Strict
    name: str = "parallel-fs"
    write: Bandwidth = 2e12
    read: Bandwidth = 2e12
    per_writer: Bandwidth = 2e9
    snapshot: Bandwidth = 2.5e10


class CheckpointSpec(BaseModel):
    model_config = _Strict
    mode: Literal["sync", "async"] = "async"
    interval: float | str = "daly"
    storage: StorageSpec = StorageSpec()

    @field_validator("interval", mode="before")
    @classmethod
    def _interval(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() in ("young", "daly"):
            return v.strip().lower()
        try:
            return parse_time(v, "interval", allow_zero=False)
        except ConfigError as e:
            raise problem(e.message, "write young, daly or a duration such as 30min") from None


class PolicySpec(BaseModel):
    model_config = _Strict
    spares: Annotated[int, Field(strict=True, ge=0, le=65_536)] = 0
    elastic: Annotated[bool, Field(strict=True)] = False


class PredictorSpec(BaseModel):
    model_config = _Strict
    recall: Annotated[float, Field(ge=0, le=1)]
    precision: Annotated[float, Field(gt=0, le=1)]
    migration: Duration | None = None
    classes: list[str] | None = None


class FailuresSpec(BaseModel):
    """The whole failures file."""

    model_config = _Strict
    defaults: Literal["llama3", "none"] = "llama3"
    scale: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    detection: Duration = DEFAULT_DETECT_S
    restart: Duration = DEFAULT_RESTART_S
    replace: Duration | None = 3600.0
    repair: Duration = DEFAULT_REPAIR_S
    classes: dict[str, ClassSpec] = {}
    drop: list[str] = []
    checkpoint: CheckpointSpec = CheckpointSpec()
    policies: dict[str, PolicySpec] | None = None
    samples: Annotated[int, Field(strict=True, ge=1, le=10_000_000)] = 1000
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)] = 0
    predictor: PredictorSpec | None = None


@dataclass(frozen=True)
class PredictorConfig:
    """The failures file's ``predictor``: recall, precision, the migration time (None: drain + restart from a
    fresh checkpoint, sized by the study) and the classes it sees (None: GPU hardware)."""

    recall: float
    precision: float
    migration_s: float | None = None
    classes: tuple[str, ...] | None = None

    def migration(self, drain_restart_s: float) -> Migration:
        return Migration(self.recall, self.precision,
                         drain_restart_s if self.migration_s is None else self.migration_s, self.classes)


@dataclass(frozen=True)
class OperationsConfig:
    """A validated failures file, as the study uses it."""

    model: FailureModel
    storage: StorageTier
    mode: Mode
    #: ``young``, ``daly`` or seconds
    interval: str | float
    #: None: the default policies for the cluster (:func:`default_policies`)
    policies: tuple[Policy, ...] | None
    samples: int
    seed: int
    predictor: PredictorConfig | None = None


def default_policies(servers: int) -> tuple[Policy, ...]:
    """Restart (no spares), hot spares (one server in 64, at least one), elastic (no spares)."""
    return (Policy("restart"), Policy("spares", spares=max(1, math.ceil(servers / 64))),
            Policy("elastic", elastic=True))


def _build_classes(spec: FailuresSpec) -> tuple[FailureClass, ...]:
    base = {c.name: c for c in llama3_classes(spec.repair)} if spec.defaults == "llama3" else {}
    problems = [ConfigError(f"drop[{i}]", f"{name!r} is not a default class",
                            f"known: {', '.join(base) or 'none (defaults: none)'}")
                for i, name in enumerate(spec.drop) if name not in base]
    for name in spec.drop:
        base.pop(name, None)
    if spec.scale != 1.0:
        base = {n: dataclasses.replace(c, mtbf_s=c.mtbf_s / spec.scale) for n, c in base.items()}
    for name, cs in spec.classes.items():
        given = {k: getattr(cs, k) for k in type(cs).model_fields if getattr(cs, k) is not None}
        if name not in base and "mtbf" not in given:
            problems.append(ConfigError(f"classes.{name}.mtbf", "is required for a new class",
                                        "add mtbf: e.g. 100000h (per component of its scope)"))
            continue
        fields: dict[str, Any] = (dataclasses.asdict(base[name]) if name in base
                                  else {"name": name, "source": "failures file"})
        renames = {"mtbf": "mtbf_s", "repair": "repair_s"}
        fields.update({renames.get(k, k): v for k, v in given.items()})
        if fields.get("takes") == "none" and "repair" not in given:
            fields["repair_s"] = 0.0
        try:
            base[name] = FailureClass(**fields)
        except ConfigError as e:
            problems.append(e)
    if problems:
        raise ConfigErrors(problems)
    if not base:
        raise ConfigError("classes", "no failure class left", "keep defaults: llama3 or add a class")
    return tuple(base.values())


def config_from_dict(data: Any) -> OperationsConfig:
    """The :class:`OperationsConfig` of a failures mapping (every problem at once)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("failures", f"must be a mapping (got {type(data).__name__})",
                          "see docs/operations.md for the layout")
    try:
        spec = FailuresSpec.model_validate(data)
    except ValidationError as e:
        raise_problems(e, "", FailuresSpec)
    classes = _build_classes(spec)
    model = FailureModel(classes, detect_s=spec.detection, restart_s=spec.restart, replace_s=spec.replace,
                         source=SOURCE_LLAMA3 if spec.defaults == "llama3" else "failures file")
    st = spec.checkpoint.storage
    storage = StorageTier(st.name, st.write, st.read, st.per_writer, st.snapshot)
    policies = None
    if spec.policies is not None:
        if not spec.policies:
            raise ConfigError("policies", "is empty", "name at least one, e.g. restart: {}")
        policies = tuple(Policy(n, p.spares, p.elastic) for n, p in spec.policies.items())
    pred = None
    if spec.predictor is not None:
        pr = spec.predictor
        pred = PredictorConfig(pr.recall, pr.precision, pr.migration,
                               None if pr.classes is None else tuple(pr.classes))
        pred.migration(0.0).predictable(model)  # unknown class names fail here, at the edge
    return OperationsConfig(model, storage, spec.checkpoint.mode, spec.checkpoint.interval, policies,
                            spec.samples, spec.seed, pred)


def load_config(path: str | Path | None) -> OperationsConfig:
    """The failures file at ``path`` (None: every default)."""
    return config_from_dict(None if path is None else read_yaml(path))
