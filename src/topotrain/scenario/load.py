"""Scenario file (or mapping, or ``--set`` overrides) → validated :class:`ScenarioSpec` → built :class:`Scenario`.

Three steps, each reporting every problem it finds at once (a :class:`~topotrain.util.errors.ConfigErrors`):

1. :class:`~topotrain.scenario.spec.ScenarioSpec` checks the shape (keys, types, units, ranges).
2. :func:`resolve` looks names up in the scenario's catalog, checks sizes against their limits, builds the
   model and the :class:`~topotrain.training.plan.Plan` (dp·tp·pp = GPUs, what the model can run) — all
   before any server or switch is built.
3. :func:`scenario_from_dict` builds the cluster, degrades links and draws straggler slowdowns.

:func:`resolved` is the scenario with every default filled in (``topotrain simulate --resolved``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import TypeAdapter, ValidationError

from topotrain.cluster import Cluster
from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.collectives.protocol import CommLibrary
from topotrain.compute.roofline import params_from_dict
from topotrain.hardware.catalog import Catalog
from topotrain.scenario.cluster import (
    cluster_catalog,
    cluster_from_spec,
    group_gpus,
    network_routing,
    planned_gpus,
    planned_size,
    read_yaml,
    template_of,
)
from topotrain.scenario.cluster_spec import ClusterSpec, NetworkSpec
from topotrain.scenario.collective_api import load_comm as load_comm  # re-exported: its home is there
from topotrain.scenario.memo import shared_cluster
from topotrain.scenario.spec import (
    BatchSpec,
    ScenarioSpec,
    StragglersSpec,
    TransformerSpec,
    ZooModelSpec,
)
from topotrain.training.balance import balanced
from topotrain.training.plan import Plan, plan_for
from topotrain.training.simulate import Scenario
from topotrain.util import jsonsafe, yamlio
from topotrain.util.atomic import note_input
from topotrain.util.errors import ConfigError, ConfigErrors, problems_of
from topotrain.util.problems import raise_problems
from topotrain.util.units import quote, time_value
from topotrain.workload.layer import Model
from topotrain.workload.zoo import MODELS, get_model, model_from_dict

#: Most layers a model may have (a bigger one is almost surely a typo, and would take long to build).
MAX_LAYERS = 10_000


@dataclass(frozen=True)
class Resolved:
    """A scenario checked against its catalog, model and size limits, before anything is built."""

    name: str
    spec: ScenarioSpec
    catalog: Catalog
    model: Model
    plan: Plan
    gpu: str
    gpus: int
    message_overhead_s: float
    #: the cluster, where resolving had to build it (a graph file); else None
    cluster: Cluster | None = None


# ---- overrides ---------------------------------------------------------------------------------------
# Hand-written rather than OmegaConf's dotlist (measured with omegaconf 2.4.0): its merge keeps the old
# builder's keys when the topology changes, merges a mapping value instead of replacing the field, reads
# `~a.b` as a key named "~a" and `a.b=` as null (no deletion), and its import costs 0.28 s of CLI start-up.
#: The keys of ``cluster.network`` that every builder shares; the others are the builder's own parameters
#: (``switches``, ``k``, ``dims``, ...), dropped when an override switches the topology (item: a bigraph's
#: ``switches`` means nothing to a fat-tree).
_NETWORK_COMMON_KEYS = frozenset(NetworkSpec.model_fields)


def _keys(dotted: str, field: str) -> list[str]:
    keys = [k.strip() for k in dotted.split(".")]
    if not all(keys):
        raise ConfigError(field, f"cannot read field path {quote(dotted)}", "write e.g. --set plan.tp=8")
    return keys


def _parent(d: dict[str, Any], keys: list[str], dotted: str, create: bool) -> dict[str, Any] | None:
    """The mapping that holds ``keys[-1]`` (made on the way where ``create``; None where it is missing)."""
    cur = d
    for i, k in enumerate(keys[:-1]):
        nxt = cur.get(k)
        if nxt is None:
            if not create:
                return None
            nxt = {}
        elif isinstance(nxt, str) and k == "model" and i == 0:
            nxt = {"name": nxt}  # --set model.seq_len=4096 on `model: gpt3-1.3b`
        elif not isinstance(nxt, dict):
            where = ".".join(keys[: i + 1])
            raise ConfigError(f"--set {dotted}", f"{where} is {type(nxt).__name__} {quote(nxt)}, not a mapping",
                              f"set {where} itself, e.g. --set {where}=...")
        cur[k] = nxt
        cur = nxt
    return cur


def _set_path(d: dict[str, Any], dotted: str, value: Any, explicit: frozenset[str] = frozenset()) -> None:
    keys = _keys(dotted, "--set")
    cur = _parent(d, keys, dotted, create=True)
    assert cur is not None
    old = cur.get(keys[-1])
    if keys[-1] == "topology" and keys[:-1] == ["cluster", "network"] and old != value:
        # another builder: the old one's own parameters go, unless this command line sets them too
        for k in [k for k in cur if k not in _NETWORK_COMMON_KEYS]:
            if f"cluster.network.{k}" not in explicit:
                del cur[k]
    cur[keys[-1]] = value


def _delete_path(d: dict[str, Any], dotted: str) -> None:
    keys = _keys(dotted, "--set")
    cur = _parent(d, keys, dotted, create=False)
    if cur is None or keys[-1] not in cur:
        raise ConfigError(f"--set ~{dotted}", "is not in the scenario, nothing to delete",
                          "check the field path (topotrain simulate --resolved prints the scenario)")
    del cur[keys[-1]]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``["plan.tp=8", "batch=512"]`` → set those fields (values parsed as YAML; checked by the schema).

    * ``a.b=VALUE`` sets the field (made where missing); a YAML mapping (``cluster.network='{topology: fat-tree,
      link: ib-hdr-200g}'``) replaces the whole mapping.
    * ``~a.b`` or ``a.b=`` (nothing after ``=``) deletes the field: its default applies again.
    * ``cluster.network.topology=NEW`` switches the builder: the old builder's own parameters (``switches``,
      ``k``, ``dims``, ...) are dropped unless the same overrides set them.
    """
    parsed: list[tuple[str, str | None]] = []
    for ov in overrides:
        ov = ov.strip()
        if ov.startswith("~"):
            if "=" in ov:
                raise ConfigError("--set", f"cannot read {quote(ov)}", "write ~field.path to delete a field")
            parsed.append((ov[1:].strip(), None))
            continue
        if "=" not in ov:
            raise ConfigError("--set", f"cannot read {quote(ov)}",
                              "write --set field.path=value (e.g. plan.tp=8), or ~field.path to delete it")
        key, text = ov.split("=", 1)
        parsed.append((key.strip(), text if text.strip() else None))
    explicit = frozenset(k for k, v in parsed if v is not None)
    for key, raw in parsed:
        if raw is None:
            _delete_path(data, key)
            continue
        try:
            value = yamlio.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        _set_path(data, key, value, explicit)
    return data


def _leaves(changes: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) of every leaf of ``changes``; a non-empty mapping is walked into, not set whole."""
    out: list[tuple[str, Any]] = []
    for k, v in changes.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.extend(_leaves(v, path))
        else:
            out.append((path, v))
    return out


def apply_changes(data: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``{"plan": {"micro_batch": 64}, "cluster.servers": 32, "stragglers": None}`` → those fields set in
    ``data`` (mappings merge field by field, dotted keys name nested fields, ``None`` deletes), by the rules of
    :func:`apply_overrides` (a new ``cluster.network.topology`` drops the old builder's own parameters)."""
    leaves = _leaves(changes)
    explicit = frozenset(k for k, v in leaves if v is not None)
    for key, value in leaves:
        if value is None:
            _delete_path(data, key)
        else:
            _set_path(data, key, copy.deepcopy(value), explicit)
    return data


def _derive(data: Mapping[str, Any], base_dir: Path | None, name: str, changes: Mapping[str, Any]) -> Scenario:
    """The scenario of ``data`` with ``changes`` applied (:meth:`Scenario.with_`)."""
    doc = copy.deepcopy(dict(data))
    try:
        apply_changes(doc, changes)
    except ConfigError as e:
        raise ConfigError(e.field.replace("--set", "changes", 1), e.message, e.fix) from None
    return scenario_from_dict(doc, base_dir, name)


# ---- loading -------------------------------------------------------------------------------------------
def _read(path: str | Path, overrides: list[str] | None) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("scenario", f"{path} is not a mapping of sections", "see examples/*.yaml")
    return apply_overrides(data, overrides or [])


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """The scenario of a YAML file, with ``--set`` style ``overrides`` applied first."""
    return scenario_from_dict(_read(path, overrides), base_dir=Path(path).parent, name=Path(path).stem)


def load_resolved(path: str | Path, overrides: list[str] | None = None) -> Resolved:
    """The scenario of a file, checked and resolved but not built."""
    return resolve(_read(path, overrides), base_dir=Path(path).parent, name=Path(path).stem)


def validate_spec(data: Any) -> ScenarioSpec:
    """The :class:`ScenarioSpec` of a mapping, or every problem of its shape at once."""
    if isinstance(data, ScenarioSpec):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError("scenario", f"must be a mapping of sections (got {type(data).__name__})",
                          "see examples/*.yaml")
    try:
        return ScenarioSpec.model_validate(dict(data))
    except ValidationError as e:
        raise_problems(e, "", ScenarioSpec)


def _model(spec: ScenarioSpec, seq_len: int | None = None) -> Model:
    m = spec.model
    if isinstance(m, str):
        return get_model(m) if seq_len is None else get_model(m, seq_len=seq_len)
    body = m.model_dump()
    if seq_len is not None:
        body["seq_len"] = seq_len
    layers = body.get("layers")
    if isinstance(layers, int) and layers > MAX_LAYERS:
        raise ConfigError("model.layers", f"must be ≤ {MAX_LAYERS} (got {layers})", "check the layer count")
    if isinstance(m, TransformerSpec):
        return model_from_dict(body, "model")
    assert isinstance(m, ZooModelSpec)
    name = body.pop("name")
    return get_model(name, **body)


def model_at_seq_len(spec: ScenarioSpec, seq_len: int) -> Model:
    """The scenario's model built at ``seq_len`` tokens per sample (every other option as written)."""
    return _model(spec, seq_len)


def _attempt(found: list[ConfigError], fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ConfigError as e:
        found.extend(problems_of(e))
        return None


def resolve(data: Any, base_dir: Path | None = None, name: str = "scenario") -> Resolved:
    """Check a scenario against its catalog, its model and the size limits (nothing is built but the
    model, and a graph file's topology), and resolve the plan."""
    spec = validate_spec(data)
    found: list[ConfigError] = []
    base = base_dir or Path(".")
    _note_inputs(spec, base)
    catalog = _attempt(found, cluster_catalog, spec.cluster, base)
    model = _attempt(found, _model, spec)
    if spec.compute.params:
        _attempt(found, params_from_dict, spec.compute.params)
    gpus, gpu, cluster = None, None, None
    gpu_types: list[str] | None = None
    overhead = spec.cluster.message_overhead
    if catalog is not None:
        if spec.cluster.graph is not None:
            cluster = _attempt(found, cluster_from_spec, spec.cluster, base)
            if cluster is not None:
                gpus, gpu = len(cluster.topology.gpus), cluster.gpu
                overhead = cluster.network_params.message_overhead_s
        elif spec.cluster.groups is not None:
            gpus = _attempt(found, planned_gpus, spec.cluster, catalog)
            types = _attempt(found, group_gpus, spec.cluster, catalog) if gpus is not None else None
            if gpus is not None and types is not None:
                gpu, gpu_types = types[0], types
        else:
            size = _attempt(found, planned_size, spec.cluster, catalog)
            if size is not None:
                gpus = size[0] * size[1]
                gpu = _attempt(found, _template_gpu, spec, catalog)
    plan = None
    if gpus is not None and gpu is not None:
        if cluster is not None and cluster.mixed:
            gpu_types = list(cluster.gpu_names)
        specs = [catalog.gpu(g) for g in (gpu_types or [gpu])]
        plan = _attempt(found, _plan, spec, gpus, model, specs)
    if found:
        raise ConfigErrors(found)
    assert catalog is not None and model is not None and plan is not None and gpu is not None
    assert gpus is not None
    overhead = DEFAULT_MESSAGE_OVERHEAD_S if overhead is None else overhead
    return Resolved(spec.name or name, spec, catalog, model, plan, gpu, gpus, overhead, cluster)


def _note_inputs(spec: ScenarioSpec, base: Path) -> None:
    """The files a scenario names (graph, catalog, compute profile) are inputs of the run: no output of it
    may replace them (:mod:`topotrain.util.atomic`). A path no file system accepts (a NUL byte) is refused."""
    bad = []
    for where, rel in (("cluster.graph", spec.cluster.graph), ("cluster.catalog", spec.cluster.catalog),
                       ("compute.profile", spec.compute.profile)):
        if isinstance(rel, str):
            if "\x00" in rel:
                bad.append(ConfigError(where, f"{quote(rel)} contains a NUL byte, which no file name can hold",
                                       "give the path of a file"))
            else:
                note_input(base / rel)
    if bad:
        raise ConfigErrors(bad)


def _compute_config(spec: ScenarioSpec, base_dir: Path | None) -> dict[str, Any]:
    """``compute`` as the compute model takes it, ``profile`` resolved relative to the scenario file (as
    ``graph`` and ``catalog`` are)."""
    compute = spec.compute.model_dump(exclude_unset=True)
    prof = compute.get("profile")
    if isinstance(prof, str) and base_dir is not None:
        compute["profile"] = str(base_dir / prof)
    return compute


def _template_gpu(spec: ScenarioSpec, catalog: Catalog) -> str:
    if spec.cluster.gpu is not None:
        return catalog.gpu(spec.cluster.gpu, "cluster.gpu").name
    return catalog.gpu(template_of(spec.cluster, catalog, "cluster").gpu, "cluster.server.gpu").name


def _plan(spec: ScenarioSpec, gpus: int, model: Model | None, gpu_specs: list[Any]) -> Plan:
    """The plan the scenario writes; ``dtype: auto`` is bf16 where every GPU type of the cluster has it."""
    p = spec.plan
    fields = p.model_dump(exclude={"bucket", "dp", "global_batch", "micro_batch", "balance"})
    for key in ("partition", "dp_shares"):
        if fields[key] is not None:
            fields[key] = tuple(fields[key])
    fields["bucket_bytes"] = int(p.bucket)
    if p.bucket != int(p.bucket):
        raise ConfigError("plan.bucket", f"must be a whole number of bytes (got {p.bucket!r} bytes)",
                          "write e.g. 25MiB")
    batch, micro = p.global_batch, p.micro_batch
    if isinstance(spec.batch, BatchSpec):
        batch = spec.batch.global_ if spec.batch.global_ is not None else batch
        micro = spec.batch.micro if spec.batch.micro is not None else micro
    elif spec.batch is not None:
        batch = spec.batch
    if batch is not None:
        fields["global_batch"] = batch
    if micro is not None:
        fields["micro_batch"] = micro
    if p.dp is not None:
        fields["dp"] = p.dp
    elif gpus % (p.tp * p.cp * p.pp) and p.cp > 1:
        raise ConfigError("plan", f"tp·cp·pp = {p.tp}·{p.cp}·{p.pp} = {p.tp * p.cp * p.pp} does not divide the "
                          f"{gpus} GPUs of the cluster", "choose tp, cp and pp whose product divides the GPU count")
    elif gpus % (p.tp * p.pp):
        raise ConfigError("plan", f"tp·pp = {p.tp}·{p.pp} = {p.tp * p.pp} does not divide the {gpus} GPUs of "
                          "the cluster", "choose tp and pp whose product divides the GPU count")
    else:
        fields["dp"] = gpus // (p.tp * p.cp * p.pp)
    if fields["dtype"] == "auto":
        fields["dtype"] = "bf16" if all("bf16" in g.peak_flops_per_s for g in gpu_specs) else "fp16"
    return plan_for(fields, gpus, model)


def _slowdowns(spec: StragglersSpec | None, gpus: list[str]) -> dict[str, float]:
    if spec is None:
        return {}
    out: dict[str, float] = {}
    if spec.lognormal_sigma > 0:
        rng = np.random.default_rng(spec.seed)
        draws = rng.lognormal(0.0, spec.lognormal_sigma, size=len(gpus))
        out.update({g: float(max(1.0, x)) for g, x in zip(gpus, draws, strict=True)})
    known = set(gpus)
    bad = [ConfigError(f"stragglers.gpus.{g}", "is not a GPU of the cluster", f"e.g. {gpus[0]}")
           for g in spec.gpus if g not in known]
    if bad:
        raise ConfigErrors(bad)
    for g, f in spec.gpus.items():
        out[g] = float(f) * out.get(g, 1.0)
    return out


def _degrade(cluster: Cluster, changes: list[tuple[str, str, float]]) -> Cluster:
    if not changes:
        return cluster
    return replace(cluster, topology=cluster.topology.with_degraded_links(changes))


def _which_link(cluster: Cluster, changes: list[tuple[str, str, float]], error: ConfigError) -> ConfigError:
    """The problem of a failed degradation, named by the entry that caused it."""
    for i, (a, b, _factor) in enumerate(changes):
        try:
            _degrade(cluster, changes[: i + 1])
        except ConfigError as e:
            return ConfigError(f"degraded_links[{i}]", f"{a}–{b}: {e.message}", e.fix)
    return ConfigError("degraded_links", error.message, error.fix)


def scenario_from_dict(data: Any, base_dir: Path | None = None, name: str = "scenario") -> Scenario:
    """Validate, resolve and build a scenario from its mapping (the Python API and the CLI both come here).
    The cluster is shared by its section with the live scenarios
    (:func:`topotrain.scenario.memo.shared_cluster`): variants of a scenario in a sweep over anything but the
    cluster build it once. The scenario can derive variants of itself
    (:meth:`Scenario.with_`)."""
    sc = scenario_from_resolved(resolve(data, base_dir, name), base_dir, build=shared_cluster)
    if isinstance(data, Mapping):
        sc = replace(sc, derive=functools.partial(_derive, copy.deepcopy(dict(data)), base_dir, name))
    return sc


def scenario_from_resolved(r: Resolved, base_dir: Path | None = None,
                           build: Callable[[ClusterSpec, Path | None], Cluster] = cluster_from_spec) -> Scenario:
    """Build the scenario of a resolved document. ``build`` makes the cluster from its spec (the search passes
    a memoized :func:`topotrain.scenario.cluster.cluster_from_spec`: a cluster is a frozen value of its spec)."""
    spec = r.spec
    cluster = r.cluster or build(spec.cluster, base_dir)
    changes = [(d.a, d.b, d.factor) for d in spec.degraded_links]
    try:
        cluster = _degrade(cluster, changes)
    except ConfigError as e:
        raise _which_link(cluster, changes, e) from None
    slow = _slowdowns(spec.stragglers, cluster.topology.gpus)
    compute = _compute_config(spec, base_dir)
    sc = Scenario(r.name, cluster, r.model, r.plan, spec.network, compute, slow, tuple(changes),
                  functools.partial(model_at_seq_len, spec), comm=CommLibrary(spec.comm.library))
    if spec.plan.balance == "speed":  # the planner chooses partition and shares (training/balance.py)
        if spec.plan.partition is not None or spec.plan.dp_shares is not None:
            raise ConfigError("plan.balance", "the planner chooses partition and dp_shares itself",
                              "drop plan.partition / plan.dp_shares, or drop balance")
        sc = replace(sc, plan=balanced(sc).plan)
    return sc


# ---- the resolved scenario and the schema ---------------------------------------------------------------
def resolved(r: Resolved) -> dict[str, Any]:
    """The scenario with every default filled in, as plain data (units written out, SI where exact)."""
    doc = r.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"batch"})
    doc["name"] = r.name
    plan = TypeAdapter(Plan).dump_python(r.plan, mode="json")
    bucket = plan.pop("bucket_bytes")
    plan["bucket"] = f"{bucket}B" if bucket % 2**20 else f"{bucket // 2**20}MiB"
    plan = {k: v for k, v in plan.items() if v is not None}
    doc["plan"] = plan
    doc.pop("batch", None)
    if r.spec.plan.balance != "none":
        plan["balance"] = r.spec.plan.balance
    cl = doc["cluster"]
    if r.spec.cluster.groups is not None:
        cl.pop("servers", None)  # each group gives its own
        for g, name in zip(cl["groups"], group_gpus(r.spec.cluster, r.catalog), strict=True):
            g["gpu"] = name
    else:
        cl["gpu"] = r.gpu
    cl["message_overhead"] = time_value(r.message_overhead_s)
    routing = network_routing(r.spec.cluster, r.catalog)
    if routing is not None:  # the fabric's own where the file names none (d-mod-k on InfiniBand)
        cl["network"]["routing"] = routing
    return {"name": doc.pop("name"), **doc}


def _with_names(node: Any, known: list[str]) -> None:
    """Every plain-text branch of a property's schema becomes "one of ``known``, or any other name" (an
    ``anyOf`` of an ``enum`` and the text): editors complete the built-in names and still accept a name the
    scenario's own catalog defines."""
    if isinstance(node, dict):
        for key in ("anyOf", "oneOf"):
            for i, branch in enumerate(node.get(key, [])):
                if isinstance(branch, dict) and branch.get("type") == "string" and "enum" not in branch:
                    node[key][i] = {"anyOf": [{"enum": known}, branch]}
                else:
                    _with_names(branch, known)
        if node.get("type") == "string" and "enum" not in node and "anyOf" not in node:
            text = {k: node.pop(k) for k in ("type", "minLength") if k in node}
            node["anyOf"] = [{"enum": known}, text]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (for editors: YAML language servers complete and check with it).
    Names with a built-in list (models, GPUs, servers, links) carry it as an ``enum`` beside free text (a
    catalog may define more); topologies, network models and routing are closed lists (``enum``)."""
    schema = ScenarioSpec.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    cat = Catalog.builtin()
    models = sorted(MODELS)
    for where, known in ((defs.get("ClusterSpec", {}).get("properties", {}).get("gpu"), sorted(cat.gpus)),
                         (defs.get("ClusterSpec", {}).get("properties", {}).get("nic"), sorted(cat.links)),
                         (defs.get("ClusterSpec", {}).get("properties", {}).get("server"), sorted(cat.servers)),
                         (defs.get("NetworkSpec", {}).get("properties", {}).get("link"), sorted(cat.links)),
                         (defs.get("ZooModelSpec", {}).get("properties", {}).get("name"), models),
                         (schema.get("properties", {}).get("model"), models)):
        if where is not None:
            _with_names(where, known)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "topotrain scenario"
    return schema


def dumps_resolved(r: Resolved, as_json: bool = False) -> str:
    """:func:`resolved` as YAML (default) or JSON text."""
    doc = resolved(r)
    if as_json:
        return jsonsafe.dumps(doc)
    types = "+".join(dict.fromkeys(group_gpus(r.spec.cluster, r.catalog))) if r.spec.cluster.groups else r.gpu
    head = (f"# resolved by topotrain: {r.gpus} x {types} GPUs, model {r.model.name} ({len(r.model.layers)} "
            f"layers); this file loads as it is\n")
    return head + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)

