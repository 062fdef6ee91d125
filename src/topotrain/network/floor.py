"""A lower bound of a schedule's time on a barrier model from the bytes its phases put on each link.

In a phase, every directed link ``l`` must carry the bytes ``B_l`` of the transfers routed over it at no more
than its capacity ``C_l`` (max-min rates are feasible: no link is driven over its capacity), and the transfer
that sends the link's last byte then still pays its tail, the per-message overhead alpha at least (plus its
path's latency). So the flow model's phase, barrier to barrier, lasts at least ``max_l B_l / C_l + alpha``
(for a phase that moves bytes), and the schedule at least the sum over phases; the analytical model charges a
transfer ``alpha + latency + max_{l in P} B_l / C_l``, no less. The sum is scaled by ``1 - FLOOR_MARGIN`` so
that no rounding (of the sum here, or of the simulation's time steps, which may end a flow up to 1e-12
relatively early) can lift it above a time the model gives.

``auto`` (``topotrain collective``, ``dp_algorithm: auto``) times its candidates in the order of their floors and
skips one whose floor is above the best time so far (:func:`topotrain.network.base.fastest`): the answer is the
same, and an algorithm that cannot win on the fabric (a tree's or halving-doubling's long paths on a physical
ring) is not simulated. The phases' paths are those the model routes (:func:`topotrain.collectives.paths.path_cache`,
routed once per pair per process), each (src, dst) pattern counted once; a phase then costs one product (its
busiest link's transfer count times its smallest transfer: a bound still).
"""

from __future__ import annotations

import numpy as np

from topotrain.collectives.paths import path_cache
from topotrain.collectives.schedule import Schedule
from topotrain.network.params import NetworkParams
from topotrain.topology.graph import Topology

#: relative margin below the bound (module docstring)
FLOOR_MARGIN = 1e-6
#: schedules with more phases than this get no link floor (0.0): looking at each phase would cost more than it
#: saves (a ring of 65,536 ranks has 131,070 phases; its overhead floor already sets it apart)
MAX_FLOOR_PHASES = 8192


def link_floor_s(schedule: Schedule, topo: Topology, params: NetworkParams) -> float:
    """A lower bound of the time a barrier model gives ``schedule`` alone on ``topo`` (module docstring); 0.0 on a
    packet fabric (its framing rewrites the phases) and for schedules of more than :data:`MAX_FLOOR_PHASES`
    phases."""
    if not params.fabric.is_cut_through or len(schedule.phases) > MAX_FLOOR_PHASES:
        return 0.0
    cache = path_cache(topo, schedule.ranks)
    inv_cap = 1.0 / topo.capacity_bytes_per_s
    alpha = max(float(params.message_overhead_s), 0.0)
    num_links = topo.num_links
    # per (src, dst) pattern: max_l (transfers crossing l) / C_l, found once per pattern (by its bytes: a tree's
    # pipeline repeats its pairs in new arrays) and once per pair of array objects (the entry holds them, so that
    # no other array takes their ids)
    by_bytes: dict[bytes, float] = {}
    by_ids: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, float]] = {}
    total = 0.0
    for phase in schedule.phases:
        key = (id(phase.src), id(phase.dst))
        hit = by_ids.get(key)
        if hit is None:
            pairs = phase.src.tobytes() + b"|" + phase.dst.tobytes()
            per_unit = by_bytes.get(pairs)
            if per_unit is None:
                links = cache.links_of(phase.src, phase.dst)
                per_unit = by_bytes[pairs] = (float((np.bincount(links, minlength=num_links) * inv_cap).max())
                                              if links.size else 0.0)
            hit = by_ids[key] = (phase.src, phase.dst, per_unit)
        if hit[2] == 0.0:  # nothing crosses a link
            continue
        # every transfer moves at least the smallest size: the busiest link by transfer count, times it (exact
        # when the sizes are equal, a ring's chunks a byte apart lose a byte)
        drain = float(schedule.transfer_bytes(phase).min()) * hit[2]
        if drain > 0.0:
            total += drain + alpha
    return total * (1.0 - FLOOR_MARGIN)
