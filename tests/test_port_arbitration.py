"""Per-port arbitration (``arbitration: port``): hand-computed parking lots, cases where it agrees with max-min
per flow, the fallback step, the flow network and the scenario setting."""

from __future__ import annotations

import numpy as np
import pytest

from topotrain.network import FlowModel, FlowNetwork
from topotrain.network.maxmin import max_min_rates_numpy
from topotrain.network.params import NetworkParams
from topotrain.network.port_arbitration import definition_gap, port_fair_rates, port_links
from topotrain.scenario.cluster import cluster_from_dict
from topotrain.topology import Topology
from topotrain.util.errors import ConfigError

C = 16e9  # a power of two times 1e9: the halvings below are exact in floating point


def parking_lot(k: int, kind: str = "pcie") -> tuple[Topology, list[tuple[int, ...]]]:
    """A chain of ``k`` PCIe switches ``s1 … sk`` (``si → s(i+1)``, then ``sk → host``), GPU ``gi`` on switch ``si``,
    every link of capacity C and ``kind``; flow ``i`` goes ``gi → si → … → sk → host`` (it joins the trunk at
    switch ``i``). Returns the topology and the flows' paths (link ids)."""
    t = Topology("parking-lot")
    t.add_node("host", "cpu", transit=False)
    for i in range(1, k + 1):
        t.add_node(f"s{i}", "pcie")
        t.add_node(f"g{i}", "gpu")
        t.add_link(f"g{i}", f"s{i}", C, 0.0, kind=kind)
    for i in range(1, k):
        t.add_link(f"s{i}", f"s{i + 1}", C, 0.0, kind=kind)
    t.add_link(f"s{k}", "host", C, 0.0, kind=kind)
    t.freeze()
    paths = []
    for i in range(1, k + 1):
        hops = [f"g{i}"] + [f"s{j}" for j in range(i, k + 1)] + ["host"]
        paths.append(tuple(t.link_id(a, b) for a, b in zip(hops, hops[1:], strict=False)))
    return t, paths


def test_parking_lot_by_hand() -> None:
    """Four PCIe switches in a chain, one flow joining at each, all bound for the host behind the last one.

    Per input port (round robin at every egress): the last link ``s4 → host`` has two input ports, ``g4``'s
    link and the trunk from ``s3``: 1/2 each, so flow 4 gets C/2. The trunk's half is split at ``s3``'s egress
    between ``g3`` and the trunk from ``s2``: flow 3 gets C/4; the remaining C/4 is split at ``s2`` between
    ``g2`` and the link from ``s1`` (which carries flow 1 alone): flows 2 and 1 get C/8 each.
    Sum C/2 + C/4 + C/8 + C/8 = C: the last link is full, the others are not.
    Per flow (max-min): the last link carries four flows and is everyone's bottleneck: C/4 each.
    """
    topo, paths = parking_lot(4)
    port = port_links(topo.link_kinds())
    assert port.all()
    stats: dict[str, int] = {}
    got = port_fair_rates(paths, np.ones(4), topo.capacity_bytes_per_s, port, stats)
    assert got.tolist() == [C / 8, C / 8, C / 4, C / 2]  # exact: halvings of a power of two
    assert stats == {"rounds": 1, "bound_steps": 0, "fallback_steps": 0}  # one bottleneck link, one round
    flat = port_fair_rates(paths, np.ones(4), topo.capacity_bytes_per_s, np.zeros(topo.num_links, dtype=bool))
    assert flat.tolist() == [C / 4] * 4


def test_parking_lot_in_the_flow_network() -> None:
    """The same chain in the flow network. Rates as above; with equal sizes S the phase ends at 4S/C either way
    (the last link stays full until the last byte: arbitration decides the order, not the makespan). Per port:
    flow 4 ends at 2S/C (rate C/2), when flow 3 has sent S/2 and flows 1, 2 S/4 each; the trunk is then the last
    link's only port, and at s3 flow 3 and the trunk from s2 get C/2 each: flow 3 ends at 2S/C + (S/2)/(C/2) =
    3S/C, flows 1 and 2 (C/4 each meanwhile) have sent S/2 each; then C/2 each: they end at 3S/C + S/C = 4S/C.
    Per flow, all four end at 4S/C. (No per-message overhead, so the times are the fluid ones.)"""
    topo, paths = parking_lot(4)
    size = 8e9
    ends = {}
    for arb in ("flow", "port"):
        net = FlowNetwork(topo, overhead_s=0.0, arbitration=arb)
        ids = [net.start(p, size, 0.0, tag=i) for i, p in enumerate(paths)]
        rates = [net.flow_rate(f) for f in ids]
        assert rates == ([C / 8, C / 8, C / 4, C / 2] if arb == "port" else [C / 4] * 4)
        ends[arb] = dict((tag, t) for t, tag in net.run())
    assert ends["flow"] == pytest.approx({i: 4 * size / C for i in range(4)}, rel=1e-12)
    assert ends["port"] == pytest.approx({3: 2 * size / C, 2: 3 * size / C, 1: 4 * size / C, 0: 4 * size / C},
                                         rel=1e-12)


def test_agrees_where_ports_carry_one_flow_each_and_on_other_links() -> None:
    """Two GPUs on one PCIe switch sending to the host: each input port carries one flow, C/2 each under both
    rules. The parking lot built of Ethernet links: only PCIe arbitrates per port, so ``port`` is max-min per
    flow there."""
    topo, paths = parking_lot(2)
    for arb in ("flow", "port"):
        net = FlowNetwork(topo, arbitration=arb)
        ids = [net.start(p, 1e9, 0.0) for p in paths]
        assert [net.flow_rate(f) for f in ids] == [C / 2, C / 2]
    topo, paths = parking_lot(4, kind="ethernet")
    net = FlowNetwork(topo, arbitration="port")
    ids = [net.start(p, 1e9, 0.0) for p in paths]
    assert [net.flow_rate(f) for f in ids] == [C / 4] * 4


def test_port_share_passes_to_the_flows_of_a_port_limited_elsewhere() -> None:
    """Link 0 (capacity 12) fed by two ports: link 1 carries flow f, link 2 carries flows g1 and g2; f also
    crosses link 3 (capacity 4), its bottleneck. Hand answer: f = 4 (link 3); at link 0 the port of f takes 4,
    less than its half (6), so the other port gets 12 − 4 = 8 and g1 = g2 = 4. A fixed weight per port (f's
    port 1/2, g's 1/4 each) would give g1 = g2 = 4 too; with f limited to 1 it would give g = 3.5 each instead of
    the port's 11/2 = 5.5 (checked below)."""
    cap = np.array([12.0, 100.0, 100.0, 4.0])
    port = np.array([True, True, True, False])
    paths = [(3, 1, 0), (2, 0), (2, 0)]  # f: link 3 then 1 then 0; g1, g2: link 2 then 0
    assert port_fair_rates(paths, np.ones(3), cap, port).tolist() == [4.0, 4.0, 4.0]
    cap[3] = 1.0
    assert port_fair_rates(paths, np.ones(3), cap, port).tolist() == [1.0, 5.5, 5.5]
    # identical flows of a group (multiplicity 2) are the two g flows
    assert port_fair_rates(paths[:2], np.array([1.0, 2.0]), cap, port).tolist() == [1.0, 5.5]


def test_bounds_where_an_ethernet_link_downstream_is_tighter() -> None:
    """The shared-NIC shape: a PCIe link of 12 fed by two ports, one carrying flow a, the other flows b1, b2
    (offers there 6, 3, 3), then an Ethernet link shared per flow.
    Ethernet 7.5: offers 2.5 each, everyone's lowest: Ethernet is every flow's bottleneck, one round, 2.5 each.
    Ethernet 10.5: offers 3.5 each; a's lowest offer is on Ethernet (3.5 < 6), b's on PCIe (3 < 3.5), so
    neither link is the bottleneck of all its flows. Bounds: a ≥ 3.5, b ≥ 3; with the others at those, a can
    have at most 10.5 − 6 = 4.5 (Ethernet), b at most 10.5 − 6.5 = 4; with the others at these upper bounds every
    flow gets at least 3.5 (Ethernet splits 10.5 three ways, all wanting more than 3.5; PCIe gives b's port
    12 − 4.5); with the others at 3.5, a gets at most 10.5 − 7 = 3.5: bounds meet, 3.5 each. PCIe carries
    10.5 < 12 and never fills: its port rule never binds."""
    port = np.array([True, True, True, False])
    paths = [(1, 0, 3), (2, 0, 3), (2, 0, 3)]
    for eth, want, bound_steps in ((7.5, [2.5] * 3, 0), (10.5, [3.5] * 3, 1)):
        cap = np.array([12.0, 100.0, 100.0, eth])
        stats: dict[str, int] = {}
        assert port_fair_rates(paths, np.ones(3), cap, port, stats).tolist() == want
        assert (stats["bound_steps"], stats["fallback_steps"]) == (bound_steps, 0)


def test_fallback_on_a_cycle_of_preferences() -> None:
    """Two PCIe links A and B of capacity 12. At A, flow f has a port of its own and g, g' share the other; at B,
    g has a port of its own and f, f' share the other. Offers: f 6 at A, 3 at B; g 3 at A, 6 at B; g', f' 3.
    Every flow's lowest offer is 3, but at A f is offered 6 and at B g is: no link is the bottleneck of all its
    flows, and the bounds cycle (3 and 6: with f at 6, g and g' get 3; with f at 3, they get 4.5 — and back).
    By hand, by symmetry f = g = x and f' = g' = y; g' is bottlenecked at A inside its port (g' ≥ g: y ≥ x),
    f' at B likewise (y ≥ x); f at B in the port it shares with f' (x ≥ y): x = y, and B full: 3x = 12, 4 each.
    The step of progressive filling gives it: everyone rises together until A and B fill at 4."""
    cap = np.array([12.0, 12.0, 100.0, 100.0, 100.0, 100.0])
    port = np.array([True, True, False, False, False, False])
    paths = [(2, 0, 4, 1), (3, 0, 5, 1), (3, 0), (4, 1)]  # f, g, g', f' (A = link 0, B = link 1)
    stats: dict[str, int] = {}
    assert port_fair_rates(paths, np.ones(4), cap, port, stats).tolist() == [4.0] * 4
    assert stats["fallback_steps"] == 1


def _random_case(rng: np.random.Generator, n_links: int, n_flows: int
                 ) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    paths = [tuple(int(x) for x in rng.choice(n_links, size=int(rng.integers(1, 5)), replace=False))
             for _ in range(n_flows)]
    return paths, rng.integers(1, 4, size=n_flows).astype(float), rng.uniform(1.0, 10.0, size=n_links)


def test_flat_trees_are_max_min_per_flow() -> None:
    """With no port-arbitrated link every tree is flat and the rounds are progressive filling's: the same rates
    as the max-min kernel, on random networks (seeded)."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        paths, mult, cap = _random_case(rng, 8, 12)
        ef = np.repeat(np.arange(len(paths)), [len(p) for p in paths])
        el = np.array([lk for p in paths for lk in p])
        want = max_min_rates_numpy(ef, el, len(paths), cap, weight=mult)
        got = port_fair_rates(paths, mult, cap, np.zeros(8, dtype=bool))
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_random_port_networks_are_feasible_efficient_and_deterministic() -> None:
    """Random paths over links of which half arbitrate per port: no link above capacity, every flow positive
    and crossing a full link (nothing could grow alone), and the same input gives the same bits."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        paths, mult, cap = _random_case(rng, 8, 12)
        port = rng.random(8) < 0.5
        got = port_fair_rates(paths, mult, cap, port)
        assert np.array_equal(got, port_fair_rates(paths, mult, cap, port))
        load = np.zeros(8)
        for p, m, r in zip(paths, mult, got, strict=True):
            load[list(p)] += m * r
        assert np.all(load <= cap * (1 + 1e-9))
        assert np.all(got > 0)
        full = load >= cap * (1 - 1e-9)
        assert all(full[list(p)].any() for p in paths)


def test_setting_and_bad_values() -> None:
    net = {"topology": "single-switch", "link": "eth-100g"}
    c = cluster_from_dict({"server": "pcie-shared-nic", "servers": 2, "arbitration": "port", "network": net})
    assert c.network_params.arbitration == "port"
    assert cluster_from_dict({"server": "pcie-shared-nic", "servers": 2, "network": net}
                             ).network_params.arbitration == "flow"
    with pytest.raises(ConfigError) as e:
        cluster_from_dict({"server": "pcie-shared-nic", "servers": 2, "arbitration": "fair", "network": net})
    assert "arbitration" in str(e.value)
    with pytest.raises(ConfigError, match="arbitration"):
        NetworkParams(arbitration="per-port")
    with pytest.raises(ConfigError, match="arbitration"):
        FlowNetwork(parking_lot(2)[0], arbitration="rr")
    assert FlowModel(NetworkParams(arbitration="port")).params.arbitration == "port"


def test_random_answers_meet_the_bottleneck_definition() -> None:
    """On random networks (seeded; half the links per port), wherever no step of progressive filling was needed,
    every flow gets no more than any of its links would give it with the others at their rates, and exactly that
    at one of them (its bottleneck): the definition, checked by ``definition_gap`` (a water-filling written apart
    from the filling's). It catches a wrong answer: the per-flow max-min rates of a parking lot miss it.
    Where the step was needed (3 of the 60) the answer is feasible and efficient (the test above), not always the
    definition's."""
    rng = np.random.default_rng(5)
    exact = fallback_cases = 0
    for _ in range(60):
        paths, mult, cap = _random_case(rng, 8, int(rng.integers(3, 12)))
        port = rng.random(8) < 0.5
        stats: dict[str, int] = {}
        got = port_fair_rates(paths, mult, cap, port, stats)
        if stats["fallback_steps"]:
            fallback_cases += 1
            continue
        exact += 1
        assert definition_gap(paths, mult, cap, port, got) <= 1e-9
    assert exact >= 50 and exact + fallback_cases == 60  # 57 and 3 when written
    topo, paths = parking_lot(4)
    flat = port_fair_rates(paths, np.ones(4), topo.capacity_bytes_per_s, np.zeros(topo.num_links, dtype=bool))
    port = port_links(topo.link_kinds())
    assert definition_gap(paths, np.ones(4), topo.capacity_bytes_per_s, port, flat) == pytest.approx(1.0)
    assert definition_gap(paths, np.ones(4), topo.capacity_bytes_per_s, port,
                          port_fair_rates(paths, np.ones(4), topo.capacity_bytes_per_s, port)) == 0.0
