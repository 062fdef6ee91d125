"""Rank order: which global rank each (tensor, context, data, pipeline) coordinate gets, as Megatron-Core's
``--order`` gives it.

Megatron-Core (``megatron/core/parallel_state.py``: ``RankGenerator`` and
``generate_masked_orthogonal_rank_groups``; ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``) names the
parallel dimensions from the fastest-varying to the slowest: with ``order = d_1-d_2-…-d_k`` a rank is
``Σ_i idx(d_i) · Π_{j<i} size(d_j)``. The default ``tp-cp-ep-dp-pp`` puts a tensor-parallel group on adjacent
ranks (one server when ``tp`` ≤ GPUs per server), then the context-parallel ranks, then data parallel, with
the pipeline stages outermost; ``tp-pp-dp`` puts the stages of one pipeline next to each other instead. A
dimension of size 1 may be left out (it is appended, as ``RankGenerator`` does); one of size > 1 may not.

Expert parallelism reuses the data-parallel ranks: Megatron-Core builds a second generator for the expert
layers with the same order string, ``cp = 1`` and the data-parallel dimension split into ``ep`` × expert-data
(its dense generator has ``ep = 1``, so ``ep`` never moves a dense rank). With context parallelism the expert
generator's data-parallel size is ``dp·cp/ep`` (``expert_data_parallel_size = world / (etp·ep·pp)`` with the
expert tensor size ``etp = tp``), so an expert group is drawn from the ``dp·cp`` ranks of a tensor index and
stage: :func:`expert_rank_groups` builds them as Megatron-Core's ``RankGenerator.get_ranks("ep")`` does.
Without context parallelism an expert group is ``ep``
consecutive data-parallel indices when ``ep`` comes before ``dp`` in the order, and ``ep`` indices
``dp/ep`` apart when it comes after; topotrain accepts an order whose ``ep`` and ``dp`` are neighbours (no
dimension of size > 1 between them), the orders Megatron-Core's documentation uses.

The older ``plan.placement`` is an alias: ``tp-first`` (Megatron-LM's ``rank = (p·dp + d)·tp + t``) is the
order ``tp-cp-ep-dp-pp``, ``dp-first`` (``rank = (p·tp + t)·dp + d``) is ``ep-dp-tp-cp-pp``.
"""

from __future__ import annotations

from functools import lru_cache

from topotrain.util.errors import ConfigError

#: The dimensions an order names.
DIMS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
#: Megatron-Core's default ``--order``.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
#: The order each value of ``plan.placement`` stands for.
PLACEMENT_ORDERS: dict[str, str] = {"tp-first": DEFAULT_ORDER, "dp-first": "ep-dp-tp-cp-pp"}
_EXAMPLE = "e.g. order: tp-cp-ep-dp-pp (fastest-varying first) or tp-pp-dp"


def parse_order(order: str) -> tuple[str, ...]:
    """The dimensions of ``order`` (``"tp-cp-dp-pp"`` → ``("tp", "cp", "dp", "pp")``), lower-cased and
    checked: known names, each once. Raises ConfigError (field ``order``)."""
    tokens = tuple(t.strip() for t in order.lower().split("-"))
    unknown = [t for t in tokens if t not in DIMS]
    if unknown:
        raise ConfigError("order", f"unknown dimension {unknown[0]!r} in {order!r}",
                          f"join the names {', '.join(DIMS)} by '-', {_EXAMPLE}")
    dup = sorted({t for t in tokens if tokens.count(t) > 1})
    if dup:
        raise ConfigError("order", f"{dup[0]} appears twice in {order!r}", f"name each dimension once, {_EXAMPLE}")
    return tokens


def order_problems(order: str, tp: int, cp: int, ep: int, dp: int, pp: int) -> list[ConfigError]:
    """What Megatron-Core would refuse of ``order`` for these degrees (fields relative to the plan)."""
    try:
        tokens = parse_order(order)
    except ConfigError as e:
        return [e]
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    found = [ConfigError("order", f"{d}={sizes[d]} but {order!r} does not place {d}",
                         f"add {d}: only a dimension of size 1 may be left out, {_EXAMPLE}")
             for d in DIMS if d not in tokens and sizes[d] > 1]
    if found or ep == 1:
        return found
    full = full_order(tokens)
    expert_sizes = {"tp": tp, "cp": 1, "ep": ep, "dp": dp * cp // ep, "pp": pp}
    i, j = sorted((full.index("ep"), full.index("dp")))
    between = [d for d in full[i + 1:j] if expert_sizes[d] > 1]
    if between:
        found.append(ConfigError("order", f"{between[0]} lies between ep and dp in {order!r}: the expert groups "
                                 "are carved from the data-parallel ranks", "put ep next to dp, e.g. tp-cp-ep-dp-pp"))
    if pp > 1 and full[-1] != "pp":
        found.append(ConfigError("order", f"with ep > 1 and pp > 1 Megatron-Core needs the pipeline outermost "
                                 f"(the expert and dense data-parallel sizes differ), not {order!r}",
                                 "end the order with pp, e.g. tp-cp-ep-dp-pp"))
    return found


def full_order(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """``tokens`` with the dimensions it leaves out appended (size 1 there, as ``RankGenerator`` does)."""
    return tokens + tuple(d for d in DIMS if d not in tokens)


@lru_cache(maxsize=64)
def resolved_order(order: str) -> tuple[str, ...]:
    """The full order (every dimension once, fastest-varying first) that ``order`` writes."""
    return full_order(parse_order(order))


@lru_cache(maxsize=256)
def rank_strides(order: tuple[str, ...], tp: int, cp: int, dp: int, pp: int) -> tuple[int, int, int, int]:
    """Strides of (tensor, context, data, pipeline) indices in the global rank for a full ``order`` (every
    dimension of :data:`DIMS` once; ``ep`` has size 1 for dense ranks)."""
    sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    stride, out = 1, {}
    for d in order:
        out[d] = stride
        stride *= sizes[d]
    return out["tp"], out["cp"], out["dp"], out["pp"]


def expert_groups_contiguous(order: tuple[str, ...]) -> bool:
    """Whether an expert group is ``ep`` consecutive data-parallel indices (``ep`` before ``dp`` in the full
    order) rather than indices ``dp/ep`` apart."""
    return order.index("ep") < order.index("dp")


def masked_rank_groups(sizes: tuple[int, ...], mask: tuple[bool, ...]) -> list[list[int]]:
    """Megatron-Core's ``generate_masked_orthogonal_rank_groups(world, parallel_size=sizes, mask)``: the groups
    of the dimensions ``mask`` selects, for dimensions of ``sizes`` (fastest-varying first). A rank is
    ``Σ idx_i · stride_i`` with ``stride_i = Π_{j<i} size_j``; the ``g``-th group fixes the unselected indices
    to the digits of ``g`` (mixed radix over the unselected sizes, fastest first) and runs through the selected
    ones in the same mixed-radix order."""
    strides = [1]
    for n in sizes[:-1]:
        strides.append(strides[-1] * n)
    inner = [(n, st) for n, st, m in zip(sizes, strides, mask, strict=True) if m]
    outer = [(n, st) for n, st, m in zip(sizes, strides, mask, strict=True) if not m]

    def offsets(dims: list[tuple[int, int]]) -> list[int]:
        out = [0]
        for n, st in dims:  # the first dimension varies fastest
            out = [o + i * st for i in range(n) for o in out]
        return out

    members = offsets(inner)
    return [[base + m for m in members] for base in offsets(outer)]


def expert_rank_groups(order: tuple[str, ...], tp: int, cp: int, ep: int, dp: int, pp: int) -> list[list[int]]:
    """The expert-parallel groups of Megatron-Core's expert ``RankGenerator`` (``tp``, ``ep``,
    ``dp = dp·cp/ep``, ``pp``, ``cp = 1``, the same ``order``; its ``get_ranks("ep")``), global ranks in group
    order, for a full ``order`` (every dimension of :data:`DIMS`)."""
    sizes = {"tp": tp, "cp": 1, "ep": ep, "dp": dp * cp // ep, "pp": pp}
    return masked_rank_groups(tuple(sizes[d] for d in order), tuple(d == "ep" for d in order))
