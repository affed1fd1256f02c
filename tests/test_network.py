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


# --- the 3D torus (TPU v4 ICI) ---------------------------------------------------------------
ICI = {"bandwidth_Bps": 45e9, "latency_s": 1e-6}
TPU = {"topology": "torus3d", "cube": [4, 4, 4], "pod": [16, 16, 16], "link": ICI}
B, L, S = 45e9, 1e-6, 8e6


def torus(devices):
    from phaze.network import network_from_section

    return network_from_section(TPU, devices)


def test_torus_slices_are_whole_cubes_with_wraparound():
    from phaze.network import TorusNetwork

    # 16 cubes as cube-like as possible: 2 x 2 x 4 of them; whole cubes wrap on every axis
    assert torus(1024) == TorusNetwork((8, 8, 16), (True, True, True), LinkLevel(B, L))
    assert torus(64).dims == (4, 4, 4) and all(torus(64).wraps)
    assert torus(4096).dims == (16, 16, 16) and torus(128).dims == (4, 4, 8)
    # below a cube: the most cube-like box, no wraparound
    assert torus(8) == TorusNetwork((2, 2, 2), (False, False, False), LinkLevel(B, L))
    assert torus(16).dims == (2, 2, 4) and not any(torus(16).wraps)
    assert torus(1024).coords(0) == (0, 0, 0) and torus(1024).coords(8 + 64) == (0, 1, 1)
    for bad, needle in ((5000, "exceed one pod"), (0, "at least one chip")):
        with pytest.raises(PhazeError, match=needle):
            torus(bad)
    with pytest.raises(PhazeError, match="unknown topology"):
        from phaze.network import network_from_section

        network_from_section({**TPU, "topology": "hypercube"}, 8)
    with pytest.raises(PhazeError, match="missing key 'cube'"):
        from phaze.network import network_from_section

        network_from_section({"topology": "torus3d", "pod": [4, 4, 4], "link": ICI}, 8)


def test_torus_collectives_by_hand():
    t = torus(1024)  # 8 x 8 x 16, wraparound everywhere
    # the whole x axis (8 chips, a closed ring): both directions of every link, 4 hops
    assert t.all_gather(S, range(8)) == pytest.approx(7 / 8 * S / (2 * B) + 4 * L)
    assert t.all_reduce(S, range(8)) == pytest.approx(2 * (7 / 8 * S / (2 * B) + 4 * L))
    # half of the x axis is a line: exactly the flat ring on one link
    line = 2 * (3 / 4 * S / B + 3 * L)
    assert t.all_reduce(S, range(4)) == pytest.approx(line)
    assert t.all_reduce(S, range(4)) == pytest.approx(flat_ring_all_reduce(S, 4, LinkLevel(B, L)))
    # two chips: one link both ways, one hop
    assert t.reduce_scatter(S, [0, 1]) == pytest.approx(S / 2 / B + L)
    # an x-y plane (64 chips): two closed rings at once, 4 B of bandwidth, 4 + 4 hops
    assert t.all_gather(S, range(64)) == pytest.approx(63 / 64 * S / (4 * B) + 8 * L)
    # a data-parallel group of stride 8 over two planes: y closed (2 B) + a 2-chip line on z (B)
    dp = [8 * i for i in range(16)]
    assert t.all_reduce(S, dp) == pytest.approx(2 * (15 / 16 * S / (3 * B) + (4 + 1) * L))
    # not a box of neighbours (every other chip): one ring, each step 2 hops, one link
    assert t.all_gather(S, [0, 2]) == pytest.approx(S / 2 / B + 2 * L)
    # no wraparound (2 x 2 x 2): three 2-chip lines, B each, 3 hops
    assert torus(8).all_gather(S, range(8)) == pytest.approx(7 / 8 * S / (3 * B) + 3 * L)
    # one rank or no bytes is free
    assert t.all_reduce(S, [5]) == 0 and t.all_reduce(0, range(8)) == 0


def test_torus_point_to_point_takes_the_shortest_way_round():
    t = torus(1024)
    assert t.p2p(S, 0, 7) == pytest.approx(S / B + L)  # x wraps: 7 -> 0 is one hop
    assert t.p2p(S, 0, 4 + 8 * 4 + 64 * 8) == pytest.approx(S / B + (4 + 4 + 8) * L)
    assert t.p2p(S, 3, 3) == 0
    # a pipeline hand-off of a tensor-parallel group: every pair at once over its own links
    src, dst = list(range(8)), [r + 128 for r in range(8)]  # two planes further along z
    assert t.stage_transfer(S, src, dst) == pytest.approx(S / B + 2 * L)
    no_wrap = torus(8)
    assert no_wrap.p2p(S, 0, 1) == pytest.approx(S / B + L)
    assert no_wrap.hops(0, 7) == 3
