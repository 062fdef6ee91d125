"""The one pipeline partition: which model chunk every layer belongs to, for the timing and the memory model.

Megatron-LM cuts the transformer layers evenly over the ``pp · v`` model chunks (``--num-layers`` divided
by the pipeline size, ``get_num_layers_to_build``; Narayanan et al., SC'21 §2.2): block ``b`` of ``B``
goes to chunk ``b·chunks // B``. Layers outside the blocks go with their neighbours: those before the
first block (the embedding) to chunk 0, those after the last (final norm, head, loss) to the last chunk,
and any in between stay with the preceding layer. Both the task-graph builder and the memory model use
this function, so memory describes the split that is timed. ``plan.partition`` gives an uneven split instead
(blocks per chunk; a mixed cluster's faster stages take more, :mod:`topotrain.training.balance`).
"""

from __future__ import annotations

from collections.abc import Sequence

from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model


def chunk_of_block(blocks: int, chunks: int, partition: Sequence[int] | None = None) -> list[int]:
    """Chunk index of each of ``blocks`` transformer blocks: Megatron-LM's even cut (``b·chunks // blocks``),
    or ``partition[c]`` consecutive blocks to chunk ``c`` (an uneven partition, training/balance.py)."""
    if partition is None:
        return [(b * chunks) // blocks for b in range(blocks)]
    if len(partition) != chunks or sum(partition) != blocks or min(partition) < 1:
        raise ConfigError("plan.partition", f"{list(partition)} is not a split of {blocks} blocks into {chunks} "
                          "non-empty chunks", f"give {chunks} positive block counts adding up to {blocks}")
    return [c for c, n in enumerate(partition) for _ in range(n)]


def chunk_of_layers(model: Model, chunks: int, partition: Sequence[int] | None = None) -> list[int]:
    """Chunk index of every layer of ``model`` split into ``chunks`` pipeline chunks (module docstring);
    ``partition``: blocks per chunk (:func:`chunk_of_block`)."""
    blocks = model.num_blocks
    if chunks > 1 and blocks < chunks:
        raise ConfigError("plan.pp", f"{model.name} has {blocks} blocks, too few for {chunks} pipeline chunks",
                          "use fewer pipeline stages / virtual stages")
    block_chunk = chunk_of_block(blocks, chunks, partition) if partition is not None else None
    last_block_layer = max((i for i, lay in enumerate(model.layers) if lay.block >= 0), default=-1)
    out: list[int] = []
    current = 0
    for i, lay in enumerate(model.layers):
        if lay.block >= 0:
            current = (lay.block * chunks) // blocks if block_chunk is None else block_chunk[lay.block]
        elif i > last_block_layer >= 0:
            current = chunks - 1
        out.append(current)
    return out


def chunk_ranges(model: Model, chunks: int, partition: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """``[lo, hi)`` layer ranges of the ``chunks`` chunks, in order (contiguous and non-empty)."""
    chunk_of = chunk_of_layers(model, chunks, partition)
    starts = [0] + [i for i in range(1, len(chunk_of)) if chunk_of[i] != chunk_of[i - 1]]
    bounds = starts + [len(chunk_of)]
    out = list(zip(bounds[:-1], bounds[1:], strict=True))
    if len(out) != chunks:
        raise ConfigError("plan.pp", f"{model.name} cannot be cut into {chunks} pipeline chunks",
                          "use fewer pipeline stages / virtual stages")
    return out
