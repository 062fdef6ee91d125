"""``framework: fsdp | hsdp``: PyTorch FSDP's unit-level schedule (training/fsdp.py), each mechanism against the
structure read from torch/distributed/fsdp (per-block units, the rate limiter, BACKWARD_PRE, HSDP's groups)."""

from __future__ import annotations

from typing import Any

import pytest

from topotrain.compute import make_compute_model
from topotrain.network import get_model
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.builder import IterationBuilder
from topotrain.training.fsdp import shard_groups
from topotrain.training.simulate import Scenario, simulate
from topotrain.util.errors import ConfigError

L = 6
M: dict[str, Any] = {"type": "transformer", "name": "m", "layers": L, "hidden": 2048, "heads": 16, "seq_len": 2048,
                     "vocab": 32000, "flash_attention": True, "activation": "swiglu", "norm": "rmsnorm",
                     "position": "rotary", "bias": False, "tie_embeddings": False}


def _sc(plan: dict[str, Any], servers: int = 2) -> Scenario:
    return scenario_from_dict({"cluster": {"server": "dgx-h100", "servers": servers,
                                           "network": {"topology": "rail-optimized", "link": "ib-ndr-400g"}},
                               "model": M, "batch": 64, "plan": {"micro_batch": 2, **plan}})


def _builder(sc: Scenario) -> IterationBuilder:
    compute = make_compute_model(sc.cluster.gpu_spec, sc.model, sc.plan.dtype)
    topo = sc.cluster.topology
    return IterationBuilder(sc.model, sc.plan, topo.gpus, topo, get_model(sc.network, sc.cluster.network_params),
                            sc.cluster.gpu_spec, lambda b, t: compute.layer_times(sc.model, b, t))


def test_fsdp_graph_has_per_block_gathers_and_one_reduce_scatter_per_unit() -> None:
    """2 micro-batches of 6 blocks: forward gathers the root and every block, backward every block again (the
    root stays gathered); the last micro-batch reduce-scatters every block and the root; sizes = the unit's
    parameters at 2 bytes."""
    b = _builder(_sc({"framework": "fsdp"}))
    tasks = b.build().graph.tasks
    ag = [t for t in tasks if t.name.startswith("allgather")]
    rs = [t for t in tasks if t.name.startswith("reduce-scatter")]
    assert len(ag) == 2 * ((1 + L) + L) and len(rs) == L + 1
    block = sum(lay.param_count for lay in b.model.layers if lay.block == 0)
    root = sum(lay.param_count for lay in b.model.layers if lay.block < 0)
    sizes = {t.name.split()[1]: t.comm.schedules[0].size_bytes for t in ag}
    assert sizes["b0"] == 2 * block and sizes["root"] == 2 * root
    assert all(len(t.comm.schedules) == 1 and len(t.comm.schedules[0].ranks) == 16 for t in ag + rs)


def test_rate_limiter_and_backward_pre_prefetch() -> None:
    """limit_all_gathers: block u's forward gather waits for block u−2's forward; BACKWARD_PRE: the gather of
    block u−1 is issued (on the one data-parallel stream) before block u's reduce-scatter, and waits for the
    backward of block u+2."""
    tasks = _builder(_sc({"framework": "fsdp"})).build().graph.tasks
    by = {t.name: t for t in tasks}
    last = 1  # the last micro-batch
    for u in range(2, L):
        ag = [t for t in tasks if t.name == f"allgather b{u} F{last}"][0]
        assert ag.deps == (by[f"F{last}.b{u - 2}"].id,)
    dp = [t.name for t in tasks if t.stream == "stage0/dp" and t.name.endswith(f"B{last}") or
          t.name.startswith("reduce-scatter")]
    for u in range(1, L):
        assert dp.index(f"allgather b{u - 1} B{last}") < dp.index(f"reduce-scatter b{u}")
    for u in range(1, L - 2):
        ag = [t for t in tasks if t.name == f"allgather b{u - 1} B{last}"][0]
        assert ag.deps == (by[f"B{last}.b{u + 2}"].id,)
    for u in range(L):  # each block's backward waits for its own gather
        assert [t for t in tasks if t.name == f"allgather b{u} B{last}"][0].id in by[f"B{last}.b{u}"].deps


def test_fsdp_compute_is_the_chunk_compute() -> None:
    """The unit graph splits the same compute: per micro-batch the forward and backward (with the accumulation
    pass) of the one chunk, plus the optimizer on 1/dp of the parameters."""
    b = _builder(_sc({"framework": "fsdp"}))
    built = b.build()
    c = built.chunks[0]
    params = sum(lay.param_count for lay in b.model.layers)
    expect = (c.fwd_s + c.bwd_s + c.recompute_s) * 2 + c.grad_accum_s * 2 + b._optimizer_s(params / 16)
    assert built.compute_s_by_device[0] == pytest.approx(expect, rel=1e-12)
    seg = sum(t.duration_s for t in built.graph.tasks if t.category in ("forward", "backward", "optimizer"))
    assert seg == pytest.approx(expect, rel=1e-12)


def test_hsdp_groups_and_allreduce_across_replicas() -> None:
    """HSDP with shard_group 8 on 16 ranks: gathers and reduce-scatters within the two servers' groups of 8
    consecutive ranks, then each shard all-reduced over the 8 pairs holding it, at 1/8 of the gradient."""
    assert shard_groups(16, 8) == ([list(range(8)), list(range(8, 16))], [[j, j + 8] for j in range(8)])
    b = _builder(_sc({"framework": "hsdp", "shard_group": 8}))
    tasks = b.build().graph.tasks
    g = b.gpus
    rs = [t for t in tasks if t.name == "reduce-scatter b0"][0]
    assert [list(s.ranks) for s in rs.comm.schedules] == [g[:8], g[8:]]
    ar = [t for t in tasks if t.name == "allreduce b0 shard"][0]
    assert ar.stream == "stage0/dp-allreduce" and ar.deps == (rs.id,)
    assert [list(s.ranks) for s in ar.comm.schedules] == [[g[j], g[j + 8]] for j in range(8)]
    assert ar.comm.schedules[0].size_bytes == rs.comm.schedules[0].size_bytes // 8


def test_hsdp_memory_shards_within_the_group() -> None:
    full, hybrid = simulate(_sc({"framework": "fsdp"})), simulate(_sc({"framework": "hsdp", "shard_group": 8}))
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert hybrid.memory[key] == pytest.approx(2 * full.memory[key])
    assert full.memory["optimizer_bytes"] == pytest.approx(simulate(_sc({"fsdp": True})).memory["optimizer_bytes"])


@pytest.mark.parametrize(("plan", "field"), [
    ({"framework": "hsdp"}, "plan.shard_group"),
    ({"framework": "hsdp", "shard_group": 3}, "plan.shard_group"),
    ({"framework": "fsdp", "shard_group": 8}, "plan.shard_group"),
    ({"framework": "fsdp", "tp": 2}, "plan.framework"),
    ({"framework": "fsdp", "zero_stage": 1}, "plan.framework"),
])
def test_bad_fsdp_plans_name_the_field(plan: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        _sc(plan)
    assert any(p.field == field for p in getattr(e.value, "errors", [e.value])), e.value
