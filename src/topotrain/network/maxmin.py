"""Max-min fair rates of flows over shared links, by progressive filling.

Progressive filling (Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5.2): every flow that is not yet
frozen grows its rate at the same pace from zero; when a link becomes saturated, every flow crossing it
freezes at the current rate; the others keep growing until every flow is frozen. The result is the
unique max-min fair allocation: no flow can get more without taking from a flow that has no more.

Since all unfrozen flows share one rate (the *level*), a link ``l`` carrying frozen load ``F_l`` and
``n_l`` unfrozen flows saturates at level ``(C_l - F_l) / n_l``. Each iteration jumps straight to the
lowest such level, so the number of iterations is the number of distinct bottleneck levels (one for a
symmetric collective phase), and each costs a few ``numpy.bincount`` passes over the remaining
(flow, link) entries.

A weight ``w_f`` makes flow ``f`` stand for ``w_f`` identical flows on the same path (they provably get
equal max-min rates); the rate returned is that of one of them. This is how the flow network prices
thousands of identical-path flows at the cost of one.
"""

from __future__ import annotations

import numpy as np

from topotrain.errors import ConfigError

#: Links whose saturation level is within this relative distance of the current level saturate together.
#: They all freeze at the (lower) current level, so no link is ever driven over its capacity.
REL_EPS = 1e-9


def max_min_rates(entry_flow: np.ndarray, entry_link: np.ndarray, num_flows: int,
                  capacity_bytes_per_s: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate (bytes/s) of every flow.

    ``entry_flow[e]`` / ``entry_link[e]`` say that flow ``entry_flow[e]`` crosses directed link
    ``entry_link[e]`` (an incidence list: one entry per flow and link of its path). ``capacity_bytes_per_s``
    is indexed by link id. ``weight[f] > 0`` is the multiplicity of flow ``f`` (default 1); the returned
    rate is per single flow. Flows with no entries get rate ``inf`` (nothing limits them).
    """
    ef = np.ascontiguousarray(entry_flow, dtype=np.int64)
    el = np.ascontiguousarray(entry_link, dtype=np.int64)
    if ef.shape != el.shape or ef.ndim != 1:
        raise ConfigError("entry_flow", f"entry_flow {ef.shape} and entry_link {el.shape} differ",
                          "give two 1-D arrays of equal length")
    rate = np.full(num_flows, np.inf)
    if ef.size == 0:
        return rate
    cap_all = np.asarray(capacity_bytes_per_s, dtype=np.float64)
    if int(ef.min()) < 0 or int(ef.max()) >= num_flows:
        raise ConfigError("entry_flow", f"flow ids must lie in 0..{num_flows - 1}",
                          "pass the right num_flows")
    if int(el.min()) < 0 or int(el.max()) >= cap_all.shape[0]:
        raise ConfigError("entry_link", f"link ids must lie in 0..{cap_all.shape[0] - 1}",
                          "pass the capacity of every link")
    if weight is None:
        w_e = np.ones(ef.shape[0])
    else:
        w = np.asarray(weight, dtype=np.float64)
        if w.shape != (num_flows,):
            raise ConfigError("weight", f"weight has shape {w.shape}, expected ({num_flows},)",
                              "give one multiplicity per flow")
        w_e = w[ef]
        if not bool(np.all(w_e > 0)):
            raise ConfigError("weight", "a flow that crosses links has weight <= 0",
                              "give every flow a positive multiplicity, or leave it out")
    # Work on compact ids of the flows and links present (one pass; later passes touch only these).
    f_used = np.flatnonzero(np.bincount(ef, minlength=num_flows))
    f_map = np.zeros(num_flows, dtype=np.int64)
    f_map[f_used] = np.arange(f_used.shape[0])
    ef_c = f_map[ef]
    l_used = np.flatnonzero(np.bincount(el, minlength=cap_all.shape[0]))
    l_map = np.zeros(cap_all.shape[0], dtype=np.int64)
    l_map[l_used] = np.arange(l_used.shape[0])
    el_c = l_map[el]
    cap = cap_all[l_used]
    num_links = l_used.shape[0]
    num_used = f_used.shape[0]
    rate_c = np.empty(num_used)
    frozen_load = np.zeros(num_links)
    while ef_c.size:
        n = np.bincount(el_c, weights=w_e, minlength=num_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            sat = np.where(n > 0, np.maximum(cap - frozen_load, 0.0) / n, np.inf)
        level = float(sat.min())
        tight = sat <= level * (1.0 + REL_EPS)
        newly = np.zeros(num_used, dtype=bool)
        newly[ef_c[tight[el_c]]] = True
        rate_c[newly] = level
        e_new = newly[ef_c]
        frozen_load += np.bincount(el_c[e_new], weights=w_e[e_new] * level, minlength=num_links)
        keep = ~e_new
        ef_c, el_c, w_e = ef_c[keep], el_c[keep], w_e[keep]
    rate[f_used] = rate_c
    return rate
