"""Ring shifts: every rank of a group sends a block to its ring neighbour, step after step.

This is the communication of ring attention (Liu et al., "Ring Attention with Blockwise Transformers for
Near-Infinite Context", 2023) as Transformer Engine runs it for Megatron-Core's context parallelism
(``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``:
``AttnFuncWithCPAndKVP2P`` and ``flash_attn_p2p_communicate``): at each step rank ``i`` posts an
``isend`` to rank ``i + 1`` (forward; ``i − 1`` in backward) and an ``irecv`` from the other side, of the
block it holds, while it computes on the block it received in the step before. Step ``k`` of the schedule is
one phase of ``p`` concurrent point-to-point transfers of ``step_bytes[k]`` bytes each; the steps are
separate phases because a rank sends at step ``k + 1`` what it received at step ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from topotrain.collectives.schedule import CollectiveOp, Phase, Schedule
from topotrain.util.errors import ConfigError


def ring_shift(ranks: Sequence[str], step_bytes: Sequence[int], direction: int = 1) -> Schedule:
    """A schedule of ``len(step_bytes)`` ring steps over ``ranks``: at step ``k`` every rank ``i`` sends
    ``step_bytes[k]`` bytes to rank ``(i + direction) mod p``. ``size_bytes`` is the largest step's message
    (what sets a transport's protocol); ``op`` is recorded as a broadcast of point-to-point blocks."""
    p = len(ranks)
    if p < 2 or direction not in (1, -1) or not step_bytes or min(step_bytes) < 0:
        raise ConfigError("ring_shift", f"needs ≥ 2 ranks, direction ±1 and steps of ≥ 0 bytes (got {p} ranks, "
                          f"direction {direction}, steps {list(step_bytes)[:4]})", "check the caller's group")
    steps = len(step_bytes)
    src = np.arange(p, dtype=np.int64)
    dst = (src + direction) % p
    # one chunk per (step, rank): chunk k·p + i is what rank i sends at step k
    chunk_bytes = np.repeat(np.asarray(step_bytes, dtype=np.int64), p)
    owner = np.tile(src, steps)
    phases = tuple(Phase.of(src, dst, k * p + src, k * p + src + 1, False) for k in range(steps))
    return Schedule(CollectiveOp.BROADCAST, "ring-shift", tuple(ranks), int(max(step_bytes)), chunk_bytes, owner,
                    np.tile(dst, steps), phases, {"steps": steps, "direction": direction})
