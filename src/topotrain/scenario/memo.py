"""Built clusters shared per process, by their spec: a sweep over micro-batches, a search's thousands of points
and a notebook's variants of one scenario build each cluster once.

Two memos: :func:`shared_cluster` (the scenario loader and the Python API) hands out a cluster that some live
scenario still holds — it keeps nothing alive itself, so a scenario's topology is freed with it — and
:func:`built_cluster` (a search worker) also keeps the last few it built, bounded by count and GPUs.
A cluster is a frozen value of its :class:`~topotrain.scenario.cluster_spec.ClusterSpec`, its base directory and the
files it names (its topology and route caches never change once built, and routes do not depend on the order
they are asked in), so a kept cluster gives bit-identical results; only the build and the route searches are
saved.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from pathlib import Path

from topotrain.cluster import Cluster
from topotrain.hardware.catalog import Catalog
from topotrain.scenario.cluster import cluster_from_spec
from topotrain.scenario.cluster_spec import ClusterSpec

#: Clusters built in this process, by (spec as JSON, base directory, stamps of the files the spec names, the
#: built-in catalog entries).
_Key = tuple[str, str, tuple[tuple[str, int, int], ...], tuple[int, ...]]
_CLUSTERS: OrderedDict[_Key, Cluster] = OrderedDict()
#: Clusters some live object holds, by the same key (weakly: a scenario's topology is freed with it).
_LIVE: weakref.WeakValueDictionary[_Key, Cluster] = weakref.WeakValueDictionary()
#: How many built clusters a process keeps (a 512-GPU cluster with its route caches: about 20 MB) ...
CLUSTER_MEMO_SIZE = 16
#: ... and how many GPUs they may hold together (the newest is always kept): a space of 8,192-GPU clusters
#: keeps four, not sixteen, so that a worker's memory stays bounded.
CLUSTER_MEMO_GPUS = 32_768


def _stamp(base: Path, rel: object) -> tuple[str, int, int]:
    """(path, mtime ns, size) of a file a cluster spec names, so that an edited file is never served stale."""
    p = base / str(rel)
    try:
        st = p.stat()
    except OSError:
        return (str(p), -1, -1)
    return (str(p), st.st_mtime_ns, st.st_size)


def _builtins_stamp() -> tuple[int, ...]:
    """The identity of every built-in catalog entry: a program that registers or replaces one
    (``register_gpu``, ``register_link``, ``register_server``) is never served a cluster built before."""
    cat = Catalog.builtin()
    return tuple(id(v) for table in (cat.gpus, cat.links, cat.servers) for v in table.values())


def _key(spec: ClusterSpec, base: Path) -> _Key:
    files = (_stamp(base, spec.catalog),) if isinstance(spec.catalog, str) else ()
    return (spec.model_dump_json(warnings=False), str(base.resolve()), files, _builtins_stamp())


def shared_cluster(spec: ClusterSpec, base_dir: Path | None) -> Cluster:
    """:func:`topotrain.scenario.cluster.cluster_from_spec`, or the cluster of the same key that a live scenario
    (or a search worker's memo) holds; kept only weakly, so nothing outlives the scenarios that use it."""
    base = base_dir or Path(".")
    if spec.graph is not None:  # a graph file's cluster is built by the resolver; never kept here
        return cluster_from_spec(spec, base_dir)
    key = _key(spec, base)
    hit = _LIVE.get(key)
    if hit is not None:
        return hit
    cluster = cluster_from_spec(spec, base_dir)
    _LIVE[key] = cluster
    return cluster


def built_cluster(spec: ClusterSpec, base_dir: Path | None) -> Cluster:
    """:func:`shared_cluster`, also kept per process (the newest :data:`CLUSTER_MEMO_SIZE` within
    :data:`CLUSTER_MEMO_GPUS`): a search worker sees the same few clusters in thousands of points."""
    base = base_dir or Path(".")
    if spec.graph is not None:
        return cluster_from_spec(spec, base_dir)
    key = _key(spec, base)
    hit = _CLUSTERS.get(key)
    if hit is not None:
        _CLUSTERS.move_to_end(key)
        return hit
    cluster = shared_cluster(spec, base_dir)
    _CLUSTERS[key] = cluster
    while len(_CLUSTERS) > 1 and (len(_CLUSTERS) > CLUSTER_MEMO_SIZE or
                                  sum(len(c.topology.gpus) for c in _CLUSTERS.values()) > CLUSTER_MEMO_GPUS):
        _CLUSTERS.popitem(last=False)
    return cluster


def clear() -> None:
    """Forget every kept and shared cluster (the next use builds again)."""
    _CLUSTERS.clear()
    _LIVE.clear()
