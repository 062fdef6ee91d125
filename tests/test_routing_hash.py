"""ECMP with a seed per switch (``routing: ecmp``) against one shared seed (``ecmp-shared-seed``): hash
polarization on a full fat-tree, closed forms counted over every pair."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from tests.test_routing_dmodk import fat_tree

from topotrain.topology.graph import Topology
from topotrain.topology.routing import _mix64, switch_hash


def cores_used(topo: Topology, nics: list[str]) -> Counter[str]:
    """Flows of all-pairs traffic through each core switch of a fat-tree."""
    seen: Counter[str] = Counter()
    for a, b in itertools.permutations(nics, 2):
        for lid in topo.route(a, b):
            dst = topo.links[lid].dst
            if dst.startswith("sw/core"):
                seen[dst] += 1
    return seen


@pytest.mark.parametrize("k", [4, 8])
def test_per_switch_seeds_spread_all_pairs_over_every_core(k: int) -> None:
    """A full k-ary fat-tree has (k/2)² cores. One shared, affine hash (CRC-32) makes a pair's choice at the
    aggregation tier a function of its choice at the edge: only k/2 cores carry all-pairs traffic (hash
    polarization). A seed per switch makes the two choices independent: every core carries some, and about
    its share (pairs crossing the core tier / (k/2)², within a binomial band)."""
    n = k**3 // 4
    cores = (k // 2) ** 2
    shared, nics = fat_tree(n, k, "ecmp-shared-seed")
    assert len(cores_used(shared, nics)) == k // 2
    seeded, nics = fat_tree(n, k, "ecmp")
    used = cores_used(seeded, nics)
    assert len(used) == cores
    pods = k
    crossing = n * (n - n // pods)  # pairs in different pods go through a core
    share = crossing / cores
    assert sum(used.values()) == crossing
    # each flow picks a core uniformly (k/2 aggregation choices × k/2 core choices, independent): a binomial
    # count; 5 standard deviations either side
    sd = (crossing * (1 / cores) * (1 - 1 / cores)) ** 0.5
    assert all(abs(c - share) < 5 * sd for c in used.values()), (share, sorted(used.values()))


def test_the_default_routing_of_a_topology_is_the_per_switch_hash() -> None:
    default, nics = fat_tree(128, 8, None)
    seeded, _ = fat_tree(128, 8, "ecmp")
    pairs = list(itertools.permutations(nics[::7], 2))
    assert [default.route(a, b) for a, b in pairs] == [seeded.route(a, b) for a, b in pairs]


def test_switch_hash_is_stable_and_decorrelated() -> None:
    """The same flow hashes the same at a switch every run (no Python ``hash`` salt); two switches' low bits
    of the same flows agree about as often as chance (1/2 for a two-way choice), not always (polarization)."""
    assert switch_hash("sw/edge0", "s0/nic", "s9/nic") == switch_hash("sw/edge0", "s0/nic", "s9/nic")
    # splitmix64 (Vigna's reference code) seeded with 0: its first two outputs are the finalizer of 1·γ and 2·γ
    gamma = 0x9E3779B97F4A7C15
    assert _mix64(gamma) == 0xE220A8397B1DCDAF and _mix64(2 * gamma % 2**64) == 0x6E789E6AA1B965F4
    flows = [(f"s{i}/nic", f"s{j}/nic") for i in range(40) for j in range(40) if i != j]
    agree = sum(switch_hash("sw/edge0", a, b) % 2 == switch_hash("sw/agg0", a, b) % 2 for a, b in flows)
    assert 0.45 < agree / len(flows) < 0.55
