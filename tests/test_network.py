"""The hierarchical network: ring collectives on the level they cross, Megatron's scatter/gather."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.errors import PhazeError
from phaze.network import HierarchicalNetwork, LinkLevel

NVLINK = LinkLevel(300e9, 2e-6, 0.8)
IB = LinkLevel(25e9, 5e-6, 0.95)
DGX = HierarchicalNetwork(8, NVLINK, IB)


def flat_ring_all_reduce(size, g, level):
    """The textbook ring: 2(g-1)/g · S / B + 2(g-1)·α."""
    return 2 * (g - 1) / g * size / level.effective_Bps + 2 * (g - 1) * level.latency_s


@settings(max_examples=60, deadline=None)
@given(
    per_node=st.integers(1, 8),
    nodes=st.integers(1, 16),
    size=st.floats(1.0, 1e10),
    bw=st.floats(1e9, 1e12),
    lat=st.floats(0, 1e-4),
    eff=st.floats(0.1, 1.0),
)
def test_two_level_equals_flat_when_levels_equal(per_node, nodes, size, bw, lat, eff):
    level = LinkLevel(bw, lat, eff)
    net = HierarchicalNetwork(per_node, level, level)
    ranks = list(range(per_node * nodes))
    g = len(ranks)
    expected = flat_ring_all_reduce(size, g, level) if g > 1 else 0.0
    assert math.isclose(net.all_reduce(size, ranks), expected, rel_tol=1e-12, abs_tol=1e-18)
    # and it equals the same ring on a network with a single (huge) node
    one_node = HierarchicalNetwork.flat(level, g)
    assert math.isclose(
        net.all_reduce(size, ranks), one_node.all_reduce(size, ranks), rel_tol=1e-12
    )


def test_intra_node_group_uses_nvlink_only():
    size = 1e9
    assert math.isclose(DGX.all_reduce(size, range(8)), flat_ring_all_reduce(size, 8, NVLINK))
    # a tensor-parallel group of 4 inside node 1
    assert math.isclose(DGX.all_reduce(size, [8, 9, 10, 11]), flat_ring_all_reduce(size, 4, NVLINK))


def test_node_spanning_ring_is_bottlenecked_by_the_nics_it_uses():
    size = 4e9
    # one rank per node (data-parallel group of a t=8 job): the ring runs on one NIC per rank
    ranks = [0, 8, 16, 24]
    expected = 2 * 3 / 4 * size / IB.effective_Bps + 2 * 3 * max(NVLINK.latency_s, IB.latency_s)
    assert math.isclose(DGX.all_reduce(size, ranks), expected)
    # eight ranks per node over 4 nodes: 8 NICs in parallel = 190 GB/s < NVLink's 240 GB/s
    ranks = list(range(32))
    bw = min(NVLINK.effective_Bps, 8 * IB.effective_Bps)
    expected = 2 * 31 / 32 * size / bw + 2 * 31 * IB.latency_s
    assert math.isclose(DGX.all_reduce(size, ranks), expected)
    # more ranks per node never slow the ring down per byte
    t2 = DGX.all_reduce(size, [0, 1, 8, 9, 16, 17, 24, 25])
    t1 = DGX.all_reduce(size, [0, 8, 16, 24])
    assert t2 < t1


def test_reduce_scatter_plus_all_gather_is_all_reduce():
    for ranks in (range(8), range(32), [0, 8, 16]):
        assert math.isclose(
            DGX.reduce_scatter(1e8, ranks) + DGX.all_gather(1e8, ranks), DGX.all_reduce(1e8, ranks)
        )


def test_single_rank_and_empty_messages_are_free():
    assert DGX.all_reduce(1e9, [3]) == 0.0
    assert DGX.all_reduce(0, range(8)) == 0.0
    assert DGX.p2p(1e9, 5, 5) == 0.0


def test_p2p_level():
    assert math.isclose(DGX.p2p(1e9, 0, 7), 1e9 / NVLINK.effective_Bps + NVLINK.latency_s)
    assert math.isclose(DGX.p2p(1e9, 0, 8), 1e9 / IB.effective_Bps + IB.latency_s)


def test_scatter_gather_sends_one_tth_per_link_then_gathers_in_node():
    size = 8 * 2048 * 12288 * 2  # one activation of b=8, s=2048, h=12288
    src, dst = list(range(8)), list(range(8, 16))
    plain = DGX.stage_transfer(size, src, dst, scatter_gather=False)
    sg = DGX.stage_transfer(size, src, dst, scatter_gather=True)
    assert math.isclose(plain, size / IB.effective_Bps + IB.latency_s)
    expected = size / 8 / IB.effective_Bps + IB.latency_s + DGX.all_gather(size, dst)
    assert math.isclose(sg, expected)
    assert sg < plain / 3
    # stages in the same node: no scatter/gather, plain NVLink send
    assert math.isclose(DGX.stage_transfer(size, [0, 1], [2, 3]), DGX.p2p(size, 0, 2))


def test_bad_network_inputs_are_rejected():
    with pytest.raises(PhazeError, match="bandwidth"):
        LinkLevel(0, 1e-6)
    with pytest.raises(PhazeError, match="efficiency"):
        LinkLevel(1e9, 1e-6, 1.5)
    with pytest.raises(PhazeError, match="inter_node"):
        HierarchicalNetwork.from_preset(
            {"devices_per_node": 8, "intra_node": {"bandwidth_Bps": 1, "latency_s": 0}}
        )
    with pytest.raises(PhazeError, match="repeated"):
        DGX.all_reduce(1.0, [0, 0])
