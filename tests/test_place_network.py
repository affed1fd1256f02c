"""Placement on a hierarchical network: the DP against brute force that costs every transfer and
all-reduce from explicit rank lists (Megatron's order, stages numbered from the last) with
phaze.network, the flat link as the special case of equal levels, a hand-computed case."""

import functools
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.network import HierarchicalNetwork, LinkLevel
from phaze.place import (
    AllReduce,
    StageRule,
    chain_graph,
    data_parallel_degrees,
    solve,
    solve_width,
    time_placement,
)
from phaze.place.network import INTER, INTRA, MIXED, PlaceNetwork

# ---------- independent brute force: explicit ranks, fidelity's network primitives ----------


def rank(k, r, pos, t, d):
    """tensor rank k, replica r, stage at position pos from the end (1 = last stage)."""
    return k + t * (r + d * (pos - 1))


def boundary_time(net: HierarchicalNetwork, nbytes, t, d, pos_from, pos_to, sg):
    """Slowest replica's transfer from the stage at pos_from to the one at pos_to."""
    worst = 0.0
    for r in range(d):
        src = [rank(k, r, pos_from, t, d) for k in range(t)]
        dst = [rank(k, r, pos_to, t, d) for k in range(t)]
        c = net.stage_transfer(nbytes, src, dst, scatter_gather=False)
        if sg:
            c = min(c, net.stage_transfer(nbytes, src, dst, scatter_gather=True))
        # a boundary that exists costs at least its latency even with 0 bytes (as the flat link)
        if nbytes <= 0:
            level = net.intra if net.node_of(src[0]) == net.node_of(dst[0]) else net.inter
            c = level.latency_s
        worst = max(worst, c)
    return worst


def brute_hier(
    fw,
    bw,
    params,
    acts,
    edge,
    ext0,
    *,
    t,
    devices,
    mbs,
    net,
    sg,
    factor,
    capacity,
    recompute,
    d_only=None,
):
    n = len(fw)
    if net.devices_per_node % t:
        return math.inf, None
    best, arg = math.inf, None
    for cuts in itertools.chain.from_iterable(
        itertools.combinations(range(1, n), r) for r in range(n)
    ):
        bounds = [0, *cuts, n]
        stages = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
        pp = len(stages)
        if pp > min(devices, n):
            continue
        mems_ok = True
        for idx, (i, j) in enumerate(stages):
            pos = pp - idx
            a = sum(acts[i:j])
            stash = (edge[i - 1] if i > 0 else ext0) if recompute else a
            if factor * sum(params[i:j]) + a + (pos - 1) * stash > capacity or pos > devices:
                mems_ok = False
        if not mems_ok:
            continue
        p_max = max(sum(params[i:j]) for i, j in stages)
        for d in range(1, min(devices, mbs) + 1):
            if t * pp > devices // d or (d_only is not None and d != d_only):
                continue
            loads = []
            for idx, (i, j) in enumerate(stages):
                pos = pp - idx
                f, b = sum(fw[i:j]), sum(bw[i:j])
                tin = boundary_time(net, edge[i - 1], t, d, pos + 1, pos, sg) if i > 0 else 0.0
                tout = boundary_time(net, edge[j - 1], t, d, pos - 1, pos, sg) if j < n else 0.0
                loads.append(
                    tin + f + max(f, tout) + b if (recompute and pos > 1) else tin + f + tout + b
                )
            ar = max(
                net.all_reduce(p_max, [rank(0, r, q, t, d) for r in range(d)])
                for q in range(1, pp + 1)
            )
            time = max(loads) * (-(-mbs // d) + pp - 1) + ar
            if time < best:
                best, arg = time, (pp, d)
    return best, arg


def random_network(rng, t):
    # devices per node a multiple of t, except now and then (then t cannot be placed)
    npn = (
        int(rng.choice([t, 2 * t, 4 * t, 8])) if rng.random() < 0.9 else int(rng.choice([1, 2, 3]))
    )
    intra = LinkLevel(
        float(rng.uniform(1.0, 8.0)), float(rng.uniform(0, 0.05)), float(rng.uniform(0.5, 1.0))
    )
    # usually a slower inter-node level; sometimes faster, so that the 'mixed' class matters
    inter = LinkLevel(
        float(intra.bandwidth_Bps * rng.uniform(0.05, 1.5)),
        float(rng.uniform(0, 0.1)),
        float(rng.uniform(0.5, 1.0)),
    )
    return HierarchicalNetwork(npn, intra, inter)


def instance(rng, n, t):
    fw = rng.uniform(0.5, 2.0, n)
    bw = rng.uniform(1.0, 4.0, n)
    params = rng.uniform(0.0, 3.0, n)
    acts = rng.uniform(0.0, 3.0, n)
    edge = rng.uniform(0.0, 3.0, n)
    tp = np.full(n, t > 1)
    return fw, bw, params, acts, edge, tp, float(rng.uniform(0, 0.5))


@functools.cache
def hier_case(seed):
    """A random small instance (<= 7 layers, <= 24 devices) and its brute-force optimum."""
    rng = np.random.default_rng(5000 + seed)
    n = int(rng.integers(2, 8))
    t = int(rng.choice([1, 2, 4]))
    devices = int(rng.integers(t, 25))
    mbs = int(rng.integers(1, 25))
    recompute = bool(seed % 2)
    factor = 8.0 if seed % 4 < 2 else 2.0  # adam / sgd state per parameter byte
    net = random_network(rng, t)
    sg = bool(seed % 3)
    fw, bw, params, acts, edge, tp, ext0 = instance(rng, n, t)
    capacity = float(rng.uniform(0.2, 1.1) * (factor * params.sum() + acts.sum()))
    d_values = data_parallel_degrees(devices, mbs, False, False)
    d_only = None
    if seed % 4 == 3:
        # one awkward d (t·d neither a divisor nor a multiple of the node size), where some
        # replicas of a boundary stay in a node and others cross: forces the 'mixed' class
        t, devices, mbs, net = 1, 24, 24, HierarchicalNetwork(8, net.intra, net.inter)
        d_only = int(rng.choice([3, 5, 6]))
        d_values = np.array([d_only])
        fw, bw, params, acts, edge, tp, ext0 = instance(rng, n, t)
        capacity = float(rng.uniform(0.3, 0.9) * (factor * params.sum() + acts.sum()))
    want, arg = brute_hier(
        fw,
        bw,
        params,
        acts,
        edge,
        ext0,
        t=t,
        devices=devices,
        mbs=mbs,
        net=net,
        sg=sg,
        factor=factor,
        capacity=capacity,
        recompute=recompute,
        d_only=d_only,
    )
    g = chain_graph(fw, bw, params, acts, edge, tp, ext_stash=np.r_[ext0, np.zeros(n - 1)])
    rule = StageRule(
        bandwidth=1.0,
        latency=0.0,
        param_state_factor=factor,
        recompute=recompute,
        hbm_capacity_bytes=capacity,
        max_positions=devices,
    )
    ar = AllReduce(mode="max", bandwidth=1.0, network=PlaceNetwork(net, scatter_gather=sg))
    return g, rule, ar, t, devices, mbs, d_values, want, arg


SEEDS = range(48)


@pytest.mark.parametrize("seed", SEEDS)
def test_dp_equals_brute_force_on_a_hierarchical_network(seed):
    g, rule, ar, t, devices, mbs, d_values, want, _ = hier_case(seed)
    got = solve_width(g, rule, t, devices, mbs, d_values, ar)
    if math.isinf(want):
        assert got is None
        return
    assert got is not None
    assert got.time_per_batch == pytest.approx(want, rel=1e-9)
    assert all(a == t for a in got.devices_per_stage)  # Megatron's layout
    again, reason = time_placement(g, rule, t, got.stages, got.d, devices, mbs, ar)
    assert reason == ""
    assert again.time_per_batch == pytest.approx(got.time_per_batch, rel=1e-9)


def test_brute_force_cases_cover_every_boundary_class():
    """The random cases above are not degenerate: most fit, many optima are multi-stage, and
    their boundaries include intra-node, inter-node and mixed ones."""
    feasible, multi, classes = 0, 0, set()
    for seed in SEEDS:
        _g, _rule, ar, t, _devices, _mbs, _, want, arg = hier_case(seed)
        if math.isinf(want):
            continue
        feasible += 1
        pp, d = arg
        multi += pp > 1
        classes |= set(ar.network.boundary_classes(t, d, pp)[1:pp].tolist())
    assert feasible >= 25 and multi >= 18
    assert classes == {INTRA, INTER, MIXED}


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    t=st.sampled_from([1, 2, 4, 8]),
    recompute=st.booleans(),
    npn=st.sampled_from([1, 2, 4, 8, 16]),
)
def test_equal_levels_reduce_to_the_flat_link(seed, t, recompute, npn):
    """Same bandwidth, latency (and efficiency 1) on both levels == the flat costmodel link:
    same time, same p, d (the DP path for the hierarchy is a different code path)."""
    if npn % t:
        npn = t
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    devices = int(rng.integers(t, 65))
    mbs = int(rng.integers(1, 40))
    fw, bw, params, acts, edge, tp, ext0 = instance(rng, n, t)
    bwid, lat = float(rng.uniform(0.5, 5.0)), float(rng.uniform(0, 0.2))
    g = chain_graph(fw, bw, params, acts, edge, tp, ext_stash=np.r_[ext0, np.zeros(n - 1)])
    rule = StageRule(
        bandwidth=bwid,
        latency=lat,
        param_state_factor=8.0,
        recompute=recompute,
        hbm_capacity_bytes=float(rng.uniform(0.3, 2.0) * (8 * params.sum() + acts.sum())),
        max_positions=devices,
    )
    d_values = data_parallel_degrees(devices, mbs, False, False)
    flat = solve_width(g, rule, t, devices, mbs, d_values, AllReduce("max", bwid, lat))
    hier = solve_width(
        g,
        rule,
        t,
        devices,
        mbs,
        d_values,
        AllReduce("max", bwid, lat, network=PlaceNetwork.flat_equivalent(bwid, lat, npn)),
    )
    if flat is None:
        assert hier is None
        return
    assert hier.time_per_batch == pytest.approx(flat.time_per_batch, rel=1e-12)
    assert hier.stage_loads == pytest.approx(flat.stage_loads, rel=1e-12)


def a100_like(npn=8):
    return HierarchicalNetwork(npn, LinkLevel(300e9, 2e-6, 0.78), LinkLevel(25e9, 5e-6, 0.94))


def test_boundary_classes_follow_the_rank_layout():
    net = PlaceNetwork(a100_like())
    # t = 2, d = 2: a stage block is 4 ranks, two stages per node: boundary 2|1 inside node 0,
    # 3|2 crosses from node 1 to node 0, 4|3 inside node 1
    assert list(net.boundary_classes(2, 2, 4)) == [INTRA, INTRA, INTER, INTRA, INTRA]
    # t = 1, d = 3: blocks [0,3) [3,6) [6,9): boundary 2|1 (ranks 3..5 -> 0..2) stays in node 0;
    # 3|2 (6..8 -> 3..5): replica 0, 1 stay in node 0, replica 2 (8 -> 5) crosses
    assert list(net.boundary_classes(1, 3, 3)) == [INTRA, INTRA, MIXED, INTRA]
    # t·d >= devices per node: every boundary crosses
    assert set(net.boundary_classes(8, 1, 5)[1:5]) == {INTER}


def test_hand_computed_two_stage_pipeline_across_nodes():
    """2 layers of a t = 8 model, 2 stages, d = 1 on two DGX-like nodes (8 GPUs each).
    Boundary 1 MB. Intra 300 GB/s x 0.78, 2 us; inter 25 GB/s x 0.94, 5 us."""
    net = PlaceNetwork(a100_like())
    B = 1e6
    plain = B / (25e9 * 0.94) + 5e-6
    sg = B / 8 / (25e9 * 0.94) + 5e-6 + 7 / 8 * B / (300e9 * 0.78) + 7 * 2e-6
    assert sg < plain
    g = chain_graph([1e-3, 1e-3], [2e-3, 2e-3], [1e6, 1e6], [0, 0], [B, 0], [True, True])
    rule = StageRule(
        bandwidth=1.0,
        latency=0.0,
        param_state_factor=8.0,
        recompute=False,
        hbm_capacity_bytes=1e12,
        max_positions=16,
    )
    ar = AllReduce("max", 1.0, network=net)
    p, reason = time_placement(g, rule, 8, [[0], [1]], 1, 16, 4, ar)
    assert reason == ""
    # each stage: in or out transfer (scatter/gather) + 1 ms fw + 2 ms bw
    assert p.stage_loads == pytest.approx([3e-3 + sg, 3e-3 + sg], rel=1e-12)
    assert p.time_per_batch == pytest.approx((3e-3 + sg) * (4 + 2 - 1), rel=1e-12)
    # without scatter/gather the plain send is used
    p2, _ = time_placement(
        g,
        rule,
        8,
        [[0], [1]],
        1,
        16,
        4,
        AllReduce("max", 1.0, network=PlaceNetwork(a100_like(), False)),
    )
    assert p2.stage_loads[0] == pytest.approx(3e-3 + plain, rel=1e-12)
    # d = 2, one stage per replica, 16 GPUs: the ring of 2 replicas with 1 GPU per node runs on
    # the NICs: 2 * (1/2) * 2 MB / 23.5 GB/s + 2 * 5 us
    p3, _ = time_placement(g, rule, 8, [[0, 1]], 2, 16, 4, ar)
    assert p3.time_per_batch == pytest.approx(
        6e-3 * 2 + 2 * 0.5 * 2e6 / (25e9 * 0.94) + 2 * 5e-6, rel=1e-12
    )


def test_tensor_width_must_fit_in_a_node():
    net = PlaceNetwork(a100_like(npn=4))
    g = chain_graph([1.0] * 3, [2.0] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3, [True] * 3)
    rule = StageRule(
        bandwidth=1.0,
        latency=0.0,
        param_state_factor=8.0,
        recompute=False,
        hbm_capacity_bytes=1e9,
        max_positions=64,
    )
    ar = AllReduce("max", 1.0, network=net)
    assert solve_width(g, rule, 8, 64, 8, data_parallel_degrees(64, 8, False, False), ar) is None
    p, reason = time_placement(g, rule, 8, [[0, 1, 2]], 1, 64, 8, ar)
    assert p is None and "devices per node" in reason
    # solve over several widths still finds the ones that fit
    g4 = chain_graph([1.0] * 3, [2.0] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3, [True] * 3)
    best = solve({4: g4, 8: g}, rule, 64, 8, data_parallel_degrees(64, 8, False, False), ar)
    assert best is not None and best.t == 4


def test_upstream_mode_refuses_a_hierarchical_network():
    from phaze.errors import PhazeError

    with pytest.raises(PhazeError, match="flat by definition"):
        AllReduce("first", 1.0, network=PlaceNetwork(a100_like()))


def test_all_reduce_worst_ring_matches_explicit_ranks():
    net = a100_like()
    pn = PlaceNetwork(net)
    for t in (1, 2, 4, 8):
        for d in (1, 2, 3, 5, 8, 12, 85):
            for stages in (1, 2, 3, 7):
                want = max(
                    net.all_reduce(1e9, [rank(0, r, q, t, d) for r in range(d)])
                    for q in range(1, stages + 1)
                )
                got = pn.all_reduce(t, [d], np.array([1e9]), np.array([stages]))[0, 0]
                assert got == pytest.approx(want, rel=1e-12), (t, d, stages)
