"""Notebook 07's model of an allreduce over nodes of 8 GPUs. NCCL runs one ring channel per network adapter
("rails"), so a flat ring uses all g adapters of a node: it has the hierarchy's network bandwidth term (to within
m/(m-1)) and loses by latency, 2(gm-1) steps against 2(m-1) + 2(g-1). Only the leaders-only scheme squeezes
the message through one adapter. An earlier model ran the flat ring through one adapter per node (g times the
bytes per adapter); these tests fail on it."""
import math

import pytest

from ddlcourse import hardware, runtimes
from ddlcourse.perfmodel import Link

FLAT, LEADERS, RS = runtimes.SCHEMES
G = 8
NODES = [2, 4, 8, 16, 32, 64]


def test_links_come_from_the_hardware_table():
    assert runtimes.H100_NVLINK.bandwidth == hardware.GPUS["H100-SXM"].nvlink == 450e9
    assert runtimes.NDR_PER_GPU.bandwidth == hardware.LINKS["NDR IB"].per_direction == 50e9


@pytest.mark.parametrize("m", NODES)
def test_flat_ring_has_the_hierarchys_bandwidth_term(m):
    n = 1e9
    t = runtimes.hierarchy_terms(n, m, G)
    p = G * m
    assert t[FLAT]["adapters_per_node"] == t[RS]["adapters_per_node"] == G and t[LEADERS]["adapters_per_node"] == 1
    assert t[FLAT]["adapter_bytes"] == pytest.approx(2 * (p - 1) / p * n / G)
    assert t[RS]["adapter_bytes"] <= t[FLAT]["adapter_bytes"] <= t[RS]["adapter_bytes"] * m / (m - 1)
    assert t[LEADERS]["adapter_bytes"] == pytest.approx(G * t[RS]["adapter_bytes"])
    # the times, with no latency and an NVLink fast enough not to matter: bytes per adapter x beta
    nic, nvl = Link(0.0, 50e9), Link(0.0, 1e18)
    tm = runtimes.hierarchy_model(n, m, G, intra=nvl, nic=nic)
    for way in runtimes.SCHEMES:
        assert tm[way] == pytest.approx(t[way]["adapter_bytes"] / 50e9, rel=1e-6)


@pytest.mark.parametrize("m", NODES)
def test_hierarchy_wins_by_latency(m):
    t = runtimes.hierarchy_terms(1e6, m, G)
    assert t[FLAT]["network_steps"] == 2 * (G * m - 1)
    assert (t[RS]["network_steps"], t[RS]["nvlink_steps"]) == (2 * (m - 1), 2 * (G - 1))
    # with unbounded bandwidth only the alphas are left; a flat-ring step waits for its slowest hop
    nvl, nic = Link(10e-6, 1e18), Link(5e-6, 1e18)
    tm = runtimes.hierarchy_model(1e6, m, G, intra=nvl, nic=nic)
    assert tm[FLAT] == pytest.approx(2 * (G * m - 1) * 10e-6)
    assert tm[RS] == pytest.approx(2 * (G - 1) * 10e-6 + 2 * (m - 1) * 5e-6)
    # with the course's links: small messages favour the hierarchy on every node count
    small = runtimes.hierarchy_model(1e6, m, G)
    assert small[RS] < small[FLAT]


def test_large_messages_do_not_favour_the_hierarchy_by_the_adapter_count():
    big = runtimes.hierarchy_model(1e9, 2, G)
    assert big[FLAT] < big[RS]                           # the NVLink phases come on top of the same network time
    for m in NODES:
        big = runtimes.hierarchy_model(1e9, m, G)
        assert max(big, key=big.get) == LEADERS          # one adapter per node: the scheme that loses bandwidth
        assert big[FLAT] < 2 * big[RS]                   # never the adapter count (8x) behind


def test_one_node_has_no_network():
    one = runtimes.hierarchy_model(100e6, 1, G)
    assert one[FLAT] == pytest.approx(one[RS])
    assert one[LEADERS] == pytest.approx(2 * one[RS])
    t = runtimes.hierarchy_terms(100e6, 1, G)
    assert all(v["network_steps"] == 0 and v["adapter_bytes"] == 0 for v in t.values())
    with pytest.raises(ValueError, match="nodes"):
        runtimes.hierarchy_terms(1e6, 0, G)
    assert all(math.isfinite(v) for v in runtimes.hierarchy_model(1e6, 64, G).values())
