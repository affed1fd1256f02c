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


# ---------------------------------------------------------------------------------------------
# the all-to-all (expert parallelism's dispatch and combine)
# ---------------------------------------------------------------------------------------------
def direct_exchange_by_rank(net, size, ranks):
    """The two-level all-to-all from explicit rank lists: each rank sends S/g to every other
    member, over the intra-node link when the member shares its node, else over its NIC, both at
    once; the slowest rank sets the time, plus g − 1 message latencies of the slowest level."""
    g = len(ranks)
    nodes = [net.node_of(r) for r in ranks]
    worst = 0.0
    for q in range(g):
        local = sum(1 for x in range(g) if x != q and nodes[x] == nodes[q])
        remote = g - 1 - local
        worst = max(
            worst,
            local * size / g / net.intra.effective_Bps,
            remote * size / g / net.inter.effective_Bps,
        )
    spans = len(set(nodes)) > 1
    lat = max(net.intra.latency_s, net.inter.latency_s) if spans else net.intra.latency_s
    return worst + (g - 1) * lat


@settings(max_examples=80, deadline=None)
@given(
    dpn=st.sampled_from([1, 2, 3, 4, 6, 8]),
    ranks=st.lists(st.integers(0, 47), min_size=2, max_size=16, unique=True),
    bw=st.tuples(st.floats(1.0, 100.0), st.floats(1.0, 100.0)),
    lat=st.tuples(st.floats(0, 0.1), st.floats(0, 0.1)),
    eff=st.tuples(st.floats(0.3, 1.0), st.floats(0.3, 1.0)),
    size=st.floats(1e-3, 1e3),
)
def test_two_level_all_to_all_equals_the_per_rank_count(dpn, ranks, bw, lat, eff, size):
    """Any group (uneven over nodes included), either level the faster: `all_to_all` and the
    ring form of `a2a_params` (what the step model prices) equal the per-rank byte count."""
    import numpy as np

    from phaze.network import collective_seconds

    net = HierarchicalNetwork(dpn, *(LinkLevel(b, x, e) for b, x, e in zip(bw, lat, eff)))
    want = direct_exchange_by_rank(net, size, ranks)
    assert net.all_to_all(size, ranks) == pytest.approx(want, rel=1e-12)
    b, x = net.a2a_params(np.array([sorted(ranks)]))
    got = collective_seconds("all_to_all", size, len(ranks), b[0], x[0])
    assert got == pytest.approx(want, rel=1e-12)


def test_two_level_all_to_all_by_hand():
    level = LinkLevel(2.0, 0.1)
    flat = HierarchicalNetwork(64, level, level)
    # one level: pairwise exchange's (g − 1)/g · S/B + (g − 1)·α, the ring form of one step
    assert flat.all_to_all(8.0, range(8)) == pytest.approx(7 / 8 * 8 / 2 + 7 * 0.1)
    # two DGX nodes of 8: 7 blocks over NVLink, 8 over the own NIC, at once; NIC-bound
    S = 1e9
    t = DGX.all_to_all(S, range(16))
    bw_term = max(7 / 16 * S / NVLINK.effective_Bps, 8 / 16 * S / IB.effective_Bps)
    assert t == pytest.approx(bw_term + 15 * IB.latency_s)
    assert bw_term == 8 / 16 * S / IB.effective_Bps
    # inside a node: NVLink only
    assert DGX.all_to_all(S, range(8)) == pytest.approx(7 / 8 * S / NVLINK.effective_Bps + 7 * 2e-6)
    # one member per node (stride 8): every block on a NIC
    assert DGX.all_to_all(S, [0, 8, 16, 24]) == pytest.approx(
        3 / 4 * S / IB.effective_Bps + 3 * 5e-6
    )
    assert DGX.all_to_all(S, [3]) == 0.0 and DGX.all_to_all(0, range(8)) == 0.0


def routed_box(t, origin, span):
    """The ranks of a box of the torus `t`: `span` chips along each axis from `origin`."""
    import itertools

    x, y, _ = t.dims
    pts = itertools.product(*(range(o, o + n) for o, n in zip(origin, span)))
    return [(p[0] % t.dims[0]) + x * ((p[1] % t.dims[1]) + y * (p[2] % t.dims[2])) for p in pts]


def test_torus_all_to_all_closed_form_equals_routing_every_pair():
    """Boxes of random tori (whole axes with and without wraparound, runs of an axis, runs across
    the wraparound): the closed form λ·S/B + L·Σ hops equals routing every pair
    dimension-ordered and taking the busiest link."""
    import numpy as np

    from phaze.network import TorusNetwork

    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(120):
        dims = tuple(int(rng.choice([1, 2, 3, 4, 5, 6, 8])) for _ in range(3))
        wraps = tuple(bool(rng.random() < 0.6) for _ in range(3))
        t = TorusNetwork(dims, wraps, LinkLevel(float(rng.uniform(1, 4)), 0.01))
        span = tuple(int(rng.integers(1, n + 1)) for n in dims)
        origin = tuple(
            int(rng.integers(0, n)) if w else int(rng.integers(0, n - s + 1))
            for n, s, w in zip(dims, span, wraps)
        )
        ranks = routed_box(t, origin, span)
        if len(ranks) < 2:
            continue
        closed = t._a2a_shape(ranks)
        routed = t._a2a_routed(ranks)
        direct = all(s == n or not w or 2 * (s - 1) < n for s, n, w in zip(span, dims, wraps))
        if t._box_axes(ranks) is not None and direct:
            checked += 1
        assert closed[0] == pytest.approx(routed[0], rel=1e-12) and closed[1] == routed[1]
        S = 3.0
        want = routed[0] * S / t.link.effective_Bps + routed[1] * t.link.latency_s
        assert t.all_to_all(S, ranks) == pytest.approx(want, rel=1e-12)
        b, x = t.a2a_params(np.array([ranks]))
        from phaze.network import collective_seconds

        got = collective_seconds("all_to_all", S, len(ranks), b[0], x[0])
        assert got == pytest.approx(want, rel=1e-12)
    assert checked >= 60  # most of them through the closed form


def test_torus_all_to_all_by_hand():
    t = torus(1024)  # 8 x 8 x 16, wraparound everywhere
    # a closed ring of 8: λ = ⌊64/4⌋/16 = 1 = n/8, i.e. scaling-book's AllToAll on a
    # bidirectional ring, V/(4·W_ici) for the array V = 8·S over W_ici = 2B; 4 hops
    assert t.all_to_all(S, range(8)) == pytest.approx(S / B + 4 * L)
    assert t.all_to_all(S, range(8)) - 4 * L == pytest.approx(8 * S / (4 * 2 * B))
    # half the x axis is a line: the middle link carries 2·2/4 S
    assert t.all_to_all(S, range(4)) == pytest.approx(S / B + 3 * L)
    # an 8 x 8 plane: both axes closed rings, λ = 1 each, 8 hops
    assert t.all_to_all(S, range(64)) == pytest.approx(S / B + 8 * L)
    # a pair: S/2 over its one link
    assert t.all_to_all(S, [0, 1]) == pytest.approx(S / 2 / B + L)
