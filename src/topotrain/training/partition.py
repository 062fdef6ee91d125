"""The one pipeline partition: which model chunk every layer belongs to, for the timing and the memory model.

Megatron-LM cuts the transformer layers evenly over the ``pp · v`` model chunks (``--num-layers`` divided
by the pipeline size, ``get_num_layers_to_build``; Narayanan et al., SC'21 §2.2): block ``b`` of ``B``
goes to chunk ``b·chunks // B``. Layers outside the blocks go with their neighbours: those before the
first block (the embedding) to chunk 0, those after the last (final norm, head, loss) to the last chunk,
and any in between stay with the preceding layer. Both the task-graph builder and the memory model use
this function, so memory describes the split that is timed.
"""

from __future__ import annotations

from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Model


def chunk_of_layers(model: Model, chunks: int) -> list[int]:
    """Chunk index of every layer of ``model`` split into ``chunks`` pipeline chunks (module docstring)."""
    blocks = model.num_blocks
    if chunks > 1 and blocks < chunks:
        raise ConfigError("plan.pp", f"{model.name} has {blocks} blocks, too few for {chunks} pipeline chunks",
                          "use fewer pipeline stages / virtual stages")
    last_block_layer = max((i for i, lay in enumerate(model.layers) if lay.block >= 0), default=-1)
    out: list[int] = []
    current = 0
    for i, lay in enumerate(model.layers):
        if lay.block >= 0:
            current = (lay.block * chunks) // blocks
        elif i > last_block_layer >= 0:
            current = chunks - 1
        out.append(current)
    return out


def chunk_ranges(model: Model, chunks: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` layer ranges of the ``chunks`` chunks, in order (contiguous and non-empty)."""
    chunk_of = chunk_of_layers(model, chunks)
    starts = [0] + [i for i in range(1, len(chunk_of)) if chunk_of[i] != chunk_of[i - 1]]
    bounds = starts + [len(chunk_of)]
    out = list(zip(bounds[:-1], bounds[1:], strict=True))
    if len(out) != chunks:
        raise ConfigError("plan.pp", f"{model.name} cannot be cut into {chunks} pipeline chunks",
                          "use fewer pipeline stages / virtual stages")
    return out
