"""The Python API: what a notebook needs, and what the CLI is built on (docs/api.md has worked examples).

Scenarios: :func:`load_scenario` (a file), :func:`scenario_from_dict` (a mapping), :func:`variant` (a changed
copy of a loaded scenario, through the same schema), :func:`simulate` (one iteration, optionally with another
network model). Clusters and collectives: :func:`load_cluster` (a path, a mapping or YAML text),
:func:`time_collective` (sizes as the CLI takes them: ``"256MiB"``), :func:`time_schedule`. Names:
:func:`model_names`, :func:`network_model_names`, :func:`names` (everything ``topotrain list`` prints).
Bad input raises :class:`~topotrain.util.errors.ConfigError`: one line naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from topotrain.collectives.registry import ALGORITHMS
from topotrain.hardware.catalog import Catalog
from topotrain.network.registry import get_model
from topotrain.scenario.collective_api import (  # the collectives' part of the API (a module of its own: light)
    CollectiveReport,
    load_cluster,
    network_model,
    network_model_names,
    time_collective,
    time_schedule,
)
from topotrain.scenario.load import load_scenario, scenario_from_dict
from topotrain.topology.builders import NETWORKS
from topotrain.training.simulate import Result, Scenario
from topotrain.training.simulate import simulate as _simulate
from topotrain.util.errors import ConfigError
from topotrain.util.problems import did_you_mean
from topotrain.workload.zoo import MODELS

__all__ = ["CollectiveReport", "load_cluster", "load_scenario", "model_names", "names", "network_model",
           "network_model_names", "scenario_from_dict", "simulate", "time_collective", "time_schedule", "variant"]


def variant(sc: Scenario, changes: Mapping[str, Any] | None = None, /, **sections: Any) -> Scenario:
    """A copy of ``sc`` with ``changes`` (:meth:`topotrain.training.simulate.Scenario.with_`): validated by the
    scenario schema as a file would be; the cluster is rebuilt only where its section changed.

    ``variant(sc, plan={"micro_batch": 64})``, ``variant(sc, {"cluster.servers": 32})``."""
    if not isinstance(sc, Scenario):
        raise ConfigError("scenario", f"variant takes a Scenario, got {type(sc).__name__}",
                          "load one with topotrain.load_scenario(path) or scenario_from_dict(mapping)")
    return sc.with_(changes, **sections)


def simulate(sc: Scenario, network: str | None = None) -> Result:
    """One training iteration of ``sc`` (:func:`topotrain.training.simulate.simulate`), with the network model
    ``network`` (``analytical``, ``flow``, ``flow-async``, ``flow-eager``) instead of the scenario's own where
    given (checked by the schema, as ``--network`` is)."""
    if network is not None and isinstance(sc, Scenario) and network != sc.network:
        if sc.derive is not None:
            sc = sc.with_(network=network)
        else:
            get_model(network, sc.cluster.network_params)  # an unknown name is refused here
            sc = dataclasses.replace(sc, network=network)
    return _simulate(sc)


# ---- names -----------------------------------------------------------------------------------------------
def model_names() -> list[str]:
    """The models of the zoo (``model: NAME`` in a scenario), e.g. ``resnet50``, ``gpt3-175b``."""
    return sorted(MODELS)


def names(kind: str | None = None) -> dict[str, list[str]] | list[str]:
    """The built-in names a scenario may use, by kind (what ``topotrain list`` prints): ``models``, ``gpus``,
    ``servers``, ``links``, ``topologies``, ``algorithms``, ``networks``; one kind's list where ``kind`` is
    given."""
    cat = Catalog.builtin()
    table = {"models": model_names(), "gpus": sorted(cat.gpus), "servers": sorted(cat.servers),
             "links": sorted(cat.links), "topologies": list(NETWORKS), "algorithms": sorted(ALGORITHMS),
             "networks": network_model_names()}
    if kind is None:
        return table
    if kind not in table:
        raise ConfigError("kind", f"unknown kind {kind!r}", did_you_mean(kind, list(table)))
    return table[kind]
