"""Part 5's remaining architecture fields (partial rotary; MoE routing as Megatron-Core defines it: top-k, capacity
factor with dropping and padding, expert hidden size, shared experts, layer pattern) and context parallelism
together with expert parallelism (issue 35)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from topotrain.compute import make_compute_model
from topotrain.network import get_model
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.builder import IterationBuilder
from topotrain.training.memory import memory_per_rank, memory_plan_from
from topotrain.training.plan import Plan
from topotrain.training.rank_order import expert_rank_groups, masked_rank_groups, resolved_order
from topotrain.training.simulate import Scenario, simulate
from topotrain.util.errors import ConfigError
from topotrain.workload.context_parallel import cp_local_model
from topotrain.workload.layer import Model
from topotrain.workload.transformer import transformer
from topotrain.workload.zoo import get_model as zoo_model


def _layer(m: Model, name: str) -> Any:
    return next(lay for lay in m.layers if lay.name == name)


# ---- published parameter counts -------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("mixtral-8x7b", 46.7, 12.9),  # Jiang et al. 2024
    ("deepseek-moe-16b", 16.4, 2.8),  # Dai et al. 2024 (first block dense, 2 shared + 64 routed of 1,408, top-6)
    ("qwen1.5-moe-a2.7b", 14.3, 2.7),  # Qwen team 2024 (gated shared expert of 5,632, 60 routed, top-4)
])
def test_moe_models_have_their_published_parameter_counts(name: str, total_b: float, active_b: float) -> None:
    m = zoo_model(name)
    assert round(m.param_count / 1e9, 1) == total_b
    assert round(m.active_param_count / 1e9, 1) == active_b


def test_deepseek_moe_blocks_by_hand() -> None:
    """Block 0 is dense (SwiGLU of 10,944); every other block has a shared MLP of 2·1,408 on every token and 64
    experts of 1,408; the difference of the two MLPs' parameters is exactly the sum of the fields."""
    m = zoo_model("deepseek-moe-16b")
    h = 2048
    assert _layer(m, "layers.0.mlp_up").param_count == 2 * 10944 * h
    assert not any(lay.name.startswith("layers.0.experts") for lay in m.layers)
    assert _layer(m, "layers.1.shared_up").param_count == 2 * 2816 * h
    assert not _layer(m, "layers.1.shared_up").expert
    up = _layer(m, "layers.1.experts_up")
    assert up.param_count == 64 * 2 * 1408 * h and up.expert and up.gemm_count == 64
    assert up.gemm_shape == (round(6 * 4096 / 64), 2 * 1408, h)
    moe_mlp = sum(lay.param_count for lay in m.layers if lay.block == 1) - sum(
        lay.param_count for lay in m.layers if lay.block == 1 and lay.name.split(".")[-1] in
        ("norm1", "qkv", "out_proj", "norm2"))
    assert moe_mlp == 3 * h * (64 * 1408 + 2816) + 64 * h  # routed + shared + router


def test_moe_layer_freq_integer_alternates() -> None:
    m = transformer("alt", layers=4, hidden=256, heads=4, seq_len=64, vocab=100, experts=4, top_k=2, moe_layer_freq=2)
    assert [any(lay.expert for lay in m.layers if lay.block == i) for i in range(4)] == [True, False, True, False]


# ---- capacity factor ------------------------------------------------------------------------------------
_MOE: dict[str, Any] = {"layers": 2, "hidden": 512, "heads": 8, "seq_len": 1000, "vocab": 1000, "experts": 8,
                        "top_k": 2, "ffn_hidden": 2048, "bias": False}


@pytest.mark.parametrize(("cf", "pad", "rows"), [
    (None, False, 2 * 1000),  # dropless: k·s copies
    (1.0, False, 2 * 1000),  # balanced routing: capacity ⌈250·1.0⌉ = 250 = the offered copies, nothing dropped
    (0.5, False, 8 * 125),  # capacity ⌈250·0.5⌉ = 125 per expert: half the copies dropped
    (1.3, True, 8 * 325),  # padded to capacity ⌈250·1.3⌉ = 325 rows per expert
    (0.9, True, 8 * 225),  # padded (and dropped) to ⌈225⌉
    (5.0, True, 8 * 1000),  # capacity 1250 > s: every expert takes every token (Megatron's all-ones mask)
])
def test_capacity_sets_the_expert_rows(cf: float | None, pad: bool, rows: int) -> None:
    """``get_capacity(num_tokens = s·k, E, cf) = ⌈(s·k/E)·cf⌉``; the experts' GEMMs, activation stash and the
    all-to-all payload follow the rows they compute, the weights do not."""
    base = transformer("moe", **_MOE)
    m = transformer("moe", capacity_factor=cf, pad_to_capacity=pad, **_MOE)
    h, f, d = 512, 2048, 2
    up, act, down = (_layer(m, f"layers.0.experts_{x}") for x in ("up", "act", "down"))
    assert up.fwd_flops == 2.0 * rows * f * h and down.fwd_flops == 2.0 * rows * h * f
    assert up.alltoall_bytes_fwd == down.alltoall_bytes_fwd == d * rows * h
    assert act.activation_bytes == d * rows * f
    assert up.gemm_shape == (round(rows / 8), f, h)
    assert m.param_count == base.param_count
    if cf is None:
        assert m.layers == base.layers  # no field: the model as before


def test_capacity_moves_time_and_memory_in_a_simulation() -> None:
    """Padding to a capacity factor of 2 doubles the experts' rows: the iteration is slower and the expert
    activations larger than dropless; a capacity factor of 1 with balanced routing changes nothing."""
    def run(**kw: Any) -> Any:
        sc = scenario_from_dict({"cluster": {"server": "dgx-h100", "servers": 1}, "batch": 8,
                                 "model": {"type": "transformer", "name": "m", **_MOE, "seq_len": 1024, **kw},
                                 "plan": {"ep": 4, "dp": 8, "micro_batch": 1}})
        return simulate(sc)
    free, one, two = run(), run(capacity_factor=1.0), run(capacity_factor=2.0, pad_to_capacity=True)
    assert one.iteration_time_s == free.iteration_time_s and one.memory == free.memory
    assert two.iteration_time_s > free.iteration_time_s
    assert two.memory["activations_bytes"] > free.memory["activations_bytes"]


@pytest.mark.parametrize(("kw", "field"), [
    ({"pad_to_capacity": True}, "model.pad_to_capacity"),
    ({"capacity_factor": 0.0}, "model.capacity_factor"),
    ({"shared_expert_gate": True}, "model.shared_expert_gate"),
    ({"moe_layer_freq": [1, 0, 1]}, "model.moe_layer_freq"),
    ({"moe_layer_freq": [1, 2]}, "model.moe_layer_freq"),
])
def test_bad_moe_fields_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        transformer("moe", **{**_MOE, **kw})
    assert any(p.field == field for p in getattr(e.value, "errors", [e.value])), e.value


def test_moe_fields_on_a_dense_model_are_refused() -> None:
    with pytest.raises(ConfigError) as e:
        transformer("dense", layers=2, hidden=256, heads=4, seq_len=64, vocab=100, capacity_factor=1.0)
    assert any(p.field == "model.capacity_factor" and "no experts" in p.message
               for p in getattr(e.value, "errors", [e.value]))


# ---- partial rotary -------------------------------------------------------------------------------------
_ROPE: dict[str, Any] = {"layers": 2, "hidden": 1280, "heads": 16, "seq_len": 256, "vocab": 1000,
                         "position": "rotary"}


@pytest.mark.parametrize("pct", [0.25, 0.4, 0.5])
def test_partial_rotary_scales_the_flops_only(pct: float) -> None:
    """GPT-NeoX/Pythia 0.25, Phi-2 0.4, Persimmon/Nemotron-4 0.5: the rotation's FLOPs are the percent of the
    full one; its bytes (q and k read and written whole) and the parameters are unchanged."""
    full = transformer("r", **_ROPE)
    part = transformer("r", rotary_percent=pct, **_ROPE)
    a, b = _layer(full, "layers.0.rotary"), _layer(part, "layers.0.rotary")
    assert b.fwd_flops == pytest.approx(pct * a.fwd_flops) and b.bwd_flops == pytest.approx(pct * a.bwd_flops)
    assert (b.fwd_bytes, b.bwd_bytes) == (a.fwd_bytes, a.bwd_bytes)
    assert part.param_count == full.param_count
    assert a.fwd_flops == 3.0 * 256 * (1280 + 1280)  # head 80, as Phi-2


@pytest.mark.parametrize(("kw", "needle"), [
    ({"position": "learned", "rotary_percent": 0.5}, "applies to rotary"),
    ({"rotary_percent": 0.0125}, "rotary dimension of 1 "),
    ({"rotary_percent": 1.5}, ""),
])
def test_bad_rotary_percent(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        transformer("r", **{**_ROPE, **kw})
    assert any(p.field == "model.rotary_percent" and needle in p.message for p in getattr(e.value, "errors", [e.value]))


# ---- context × expert parallelism -----------------------------------------------------------------------
def test_masked_groups_reproduce_megatron_cores_docstring_example() -> None:
    """``generate_masked_orthogonal_rank_groups``'s own example: sizes [tp 2, dp 3, pp 4], mask dp."""
    g = masked_rank_groups((2, 3, 4), (False, True, False))
    assert g[0] == [0, 2, 4] and g[1] == [1, 3, 5] and g[7] == [19, 21, 23] and len(g) == 8


def test_expert_groups_span_context_and_data_ranks() -> None:
    """tp 2, cp 2, dp 2, ep 4, pp 2, order tp-cp-ep-dp-pp (16 ranks). Megatron-Core's expert generator has tp 2,
    ep 4, expert-dp dp·cp/ep = 1, pp 2 and cp 1, so the ep stride is tp = 2: groups [0,2,4,6], [1,3,5,7],
    [8,…,14], [9,…,15]. The dense layout puts rank t + 2c + 4d + 8p, so the first group holds (c, d) = (0,0),
    (1,0), (0,1), (1,1): both context ranks of both replicas."""
    order = resolved_order("tp-cp-ep-dp-pp")
    assert expert_rank_groups(order, 2, 2, 4, 2, 2) == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    p = Plan(tp=2, cp=2, dp=2, ep=4, pp=2)
    assert [p.rank(d, 0, 0, c) for d in range(2) for c in range(2)] == [0, 2, 4, 6]
    # cp 4, dp 2, ep 2: an expert group is two context ranks of one replica; ep after dp: dp·cp/ep = 4 apart
    assert expert_rank_groups(resolved_order("tp-cp-ep-dp-pp"), 1, 4, 2, 2, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert expert_rank_groups(resolved_order("tp-cp-dp-ep-pp"), 1, 4, 2, 2, 1) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # cp 1: the same groups the builder has always formed
    assert expert_rank_groups(resolved_order("tp-ep-dp-pp"), 2, 1, 2, 4, 2)[:2] == [[0, 2], [1, 3]]


_SMALL_MOE: dict[str, Any] = {"type": "transformer", "name": "small-moe", "layers": 2, "hidden": 1024, "heads": 8,
                              "kv_heads": 8, "seq_len": 8192, "vocab": 32000, "flash_attention": True,
                              "activation": "swiglu", "ffn_hidden": 2048, "norm": "rmsnorm", "position": "rotary",
                              "bias": False, "experts": 8, "top_k": 2}


def _sc(plan: dict[str, Any], servers: int = 1) -> Scenario:
    return scenario_from_dict({"cluster": {"server": "dgx-h100", "servers": servers}, "model": _SMALL_MOE,
                               "batch": 8, "plan": {"micro_batch": 1, **plan}})


def test_cp_with_ep_is_accepted_and_builds_megatrons_groups() -> None:
    """cp 2 × dp 2 × ep 4 on 8 GPUs (tp 2): each all-to-all runs on the expert groups of the dp·cp ranks, with
    the rank's s/cp tokens' payload."""
    sc = _sc({"tp": 2, "cp": 2, "ep": 4})
    local = cp_local_model(sc.model, 2)
    compute = make_compute_model(sc.cluster.gpu_spec, local, sc.plan.dtype)
    topo = sc.cluster.topology
    b = IterationBuilder(local, sc.plan, topo.gpus, topo, get_model(sc.network, sc.cluster.network_params),
                         sc.cluster.gpu_spec, lambda bb, t: compute.layer_times(local, bb, t))
    g = topo.gpus
    assert b._groups("ep", 0) == [[g[0], g[2], g[4], g[6]], [g[1], g[3], g[5], g[7]]]
    costs = b.chunk_costs()
    a2a = [x for x in costs[0].fwd_blocking if x.label.startswith("ep alltoall")]
    up = _layer(sc.model, "layers.0.experts_up")
    assert len(a2a) == 2 * 2  # dispatch and combine in each block
    assert all(len(s.ranks) == 4 for x in a2a for s in x.comm.schedules)
    assert a2a[0].comm.schedules[0].size_bytes == int(up.alltoall_bytes_fwd / 2)  # s/cp tokens per rank
    r = simulate(sc)
    assert r.iteration_time_s > 0


def test_cp_with_ep_memory_shards_experts_over_dp_cp_over_ep() -> None:
    """Expert weights are 1/ep per rank; ZeRO-1 shards the expert optimizer over Megatron-Core's expert
    data-parallel group of dp·cp/ep ranks (here dp 2, cp 2, ep 4: 1 rank, no sharding), the dense one over dp·cp."""
    sc = _sc({"tp": 1, "cp": 2, "dp": 4, "ep": 8, "zero_stage": 1})
    mp = memory_plan_from(sc.plan)
    m = cp_local_model(sc.model, 2)
    one = memory_per_rank(m, mp)
    sc2 = _sc({"tp": 1, "cp": 2, "dp": 4, "ep": 4, "zero_stage": 1})
    two = memory_per_rank(m, memory_plan_from(sc2.plan))
    expert = sum(lay.param_count for lay in m.layers if lay.expert)
    # ep 8 holds 1/8 of the experts with an expert-dp of 1; ep 4 holds 1/4 with an expert-dp of 2: optimizer equal
    assert one.optimizer_bytes == pytest.approx(two.optimizer_bytes)
    assert two.weights_bytes - one.weights_bytes == pytest.approx(2 * expert * (1 / 4 - 1 / 8))
    assert math.isfinite(one.total_bytes)
