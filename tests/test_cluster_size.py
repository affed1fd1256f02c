"""Cluster size free: the network figures of a layout without listing its ranks.

The step model's `Layout` and the placement's `PlaceNetwork.boundary_classes` price a layout from
one replica of each class and from closed forms over evenly spaced groups
(`HierarchicalNetwork.progression_ring_params` / `progression_a2a_params`). The references here
are the implementations they replaced, which list every rank of the cluster: the figures must be
the same value for value (==, not isclose), for every network kind and group layout.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.network import HierarchicalNetwork, LinkLevel, TorusNetwork
from phaze.place.network import INTER, INTRA, MIXED, PlaceNetwork
from phaze.step.model import Layout
from tests.step_cases import random_torus


# ---------------------------------------------------------------------------------------------
# the rank-enumerating references (the code before cluster-size-free layouts)
# ---------------------------------------------------------------------------------------------
def ring_params_by_ranks(net: HierarchicalNetwork, ranks):
    """(bottleneck bytes/s, per-step latency) of a ring over each row of `ranks` (each row
    increasing), by counting every row's members per node."""
    nodes = np.asarray(ranks) // net.devices_per_node
    groups, g = nodes.shape
    intra, inter = net.intra, net.inter
    if g == 1:
        return np.full(groups, intra.effective_Bps), np.full(groups, intra.latency_s)
    change = nodes[:, 1:] != nodes[:, :-1]
    spans = change.any(axis=1)
    starts = np.concatenate([np.ones((groups, 1), dtype=bool), change], axis=1)
    run = np.cumsum(starts, axis=1) - 1
    counts = np.bincount((np.arange(groups)[:, None] * g + run).ravel(), minlength=groups * g)
    fewest = np.where(counts > 0, counts, g + 1).reshape(groups, g).min(axis=1)
    bw = np.where(
        spans, np.minimum(intra.effective_Bps, fewest * inter.effective_Bps), intra.effective_Bps
    )
    lat = np.where(spans, max(intra.latency_s, inter.latency_s), intra.latency_s)
    return bw, lat


def _ring(net, rows):
    if isinstance(net, TorusNetwork):
        return net.ring_params(rows)
    return ring_params_by_ranks(net, rows)


def _a2a(net, rows):
    if isinstance(net, TorusNetwork):
        return net.a2a_params(rows)
    out = [net._a2a([int(r) for r in row]) for row in rows]
    return np.array([b for b, _ in out]), np.array([x for _, x in out])


def layout_by_ranks(net, t, p, d, ep=1) -> dict:
    """`Layout.build` as it was: every rank of the cluster in an array of shape (t, d, p)."""
    k = np.arange(t)[:, None, None]
    r = np.arange(d)[None, :, None]
    j = np.arange(p)[None, None, :]
    rank = k + t * (r + d * j)
    tp_bw, tp_lat = _ring(net, rank.transpose(1, 2, 0).reshape(d * p, t))
    dp_bw, dp_lat = _ring(net, rank.transpose(0, 2, 1).reshape(t * p, d))
    dp_bw, dp_lat = dp_bw.reshape(t, p).min(axis=0), dp_lat.reshape(t, p).max(axis=0)
    out = {"tp_group": (tp_bw.reshape(d, p), tp_lat.reshape(d, p))}
    out["dp"] = (dp_bw, dp_lat)
    out["ep"], out["edp"] = None, (dp_bw, dp_lat)
    if ep > 1:
        e = d // ep
        split = rank.reshape(t, e, ep, p)
        a2a_bw, a2a_lat = _a2a(net, split.transpose(0, 1, 3, 2).reshape(-1, ep))
        out["ep"] = np.unique(np.stack([a2a_bw, a2a_lat], axis=1), axis=0)
        edp_bw, edp_lat = _ring(net, split.transpose(0, 2, 3, 1).reshape(-1, e))
        out["edp"] = (
            edp_bw.reshape(t * ep, p).min(axis=0),
            edp_lat.reshape(t * ep, p).max(axis=0),
        )
    for name, step in (("next", 1), ("prev", -1)):
        other = np.roll(rank, -step, axis=2)
        bw, lat = net.p2p_params(rank, other)
        out[name] = (bw, lat, net.crosses_nodes(rank, other).any(axis=0))
    if p > 1:
        pair = np.stack([rank[:, :, 0], rank[:, :, p - 1]], axis=-1).reshape(t * d, 2)
        bw, lat = _ring(net, pair)
        out["tied"] = (float(bw.min()), float(lat.max()))
    return out


def boundary_classes_by_ranks(net: PlaceNetwork, t, d, stages):
    n = net.devices_per_node
    cls = np.full(stages + 1, INTRA, dtype=np.int64)
    if stages < 2:
        return cls
    s = np.arange(1, stages)[:, None]
    r = np.arange(d)[None, :]
    behind = t * (r + d * (s - 1))
    crosses = (behind // n) != ((behind + t * d) // n)
    cls[1:stages] = np.where(
        crosses.all(axis=1), INTER, np.where(crosses.any(axis=1), MIXED, INTRA)
    )
    return cls


# ---------------------------------------------------------------------------------------------
# networks
# ---------------------------------------------------------------------------------------------
levels = st.builds(
    LinkLevel,
    st.floats(0.5, 4.0),
    st.floats(0.0, 0.05),
    st.floats(0.5, 1.0),
)


@st.composite
def two_level(draw):
    """Any node size (1: every rank a node; huge: the flat link as one node), levels in either
    order of speed or equal."""
    intra = draw(levels)
    inter = draw(st.one_of(levels, st.just(intra)))
    return HierarchicalNetwork(
        draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 1000])), intra, inter
    )


def _replica_rows(layout: Layout, j: int) -> set:
    """Everything the step model reads of each replica (class) at stage j."""
    rows = set()
    for r in range(layout.tp_group_bw.shape[0]):
        row = [float(layout.tp_group_bw[r, j]), float(layout.tp_group_lat[r, j])]
        for name in ("next", "prev"):
            bw, lat, crosses = layout.sends[name]
            row += [tuple(bw[:, r, j].tolist()), tuple(lat[:, r, j].tolist()), bool(crosses[r, j])]
        rows.add(tuple(row))
    return rows


def _reference_rows(ref: dict, j: int) -> set:
    bw_all, lat_all = ref["tp_group"]
    rows = set()
    for r in range(bw_all.shape[0]):
        row = [float(bw_all[r, j]), float(lat_all[r, j])]
        for name in ("next", "prev"):
            bw, lat, crosses = ref[name]
            row += [tuple(bw[:, r, j].tolist()), tuple(lat[:, r, j].tolist()), bool(crosses[r, j])]
        rows.add(tuple(row))
    return rows


def assert_layout_equals_reference(net, t, p, d, ep):
    layout = Layout.build(net, t, p, d, ep)
    ref = layout_by_ranks(net, t, p, d, ep)
    # every replica class the closed forms keep is one of the cluster's, and none is missing
    for j in range(p):
        assert _replica_rows(layout, j) == _reference_rows(ref, j)
    assert layout.tp_bw == float(ref["tp_group"][0].min())
    assert layout.tp_lat == float(ref["tp_group"][1].max())
    assert np.array_equal(layout.dp_bw, ref["dp"][0])
    assert np.array_equal(layout.dp_lat, ref["dp"][1])
    assert np.array_equal(layout.edp_bw, ref["edp"][0])
    assert np.array_equal(layout.edp_lat, ref["edp"][1])
    if ep > 1:
        assert np.array_equal(np.stack([layout.ep_bw, layout.ep_lat], axis=1), ref["ep"])
    if p > 1:
        assert (layout.tied_bw, layout.tied_lat) == ref["tied"]
    # and what the step model derives from them: each stage's slowest send
    for name in ("next", "prev"):
        for sp, sg in ((False, False), (False, True), (True, True)):
            got = layout.send_s(3.0, name, sp, sg).max(axis=0)
            ref_layout = Layout.build(net, t, p, d, ep)
            ref_layout.tp_group_bw, ref_layout.tp_group_lat = ref["tp_group"]
            ref_layout.sends = {k: ref[k] for k in ("next", "prev")}
            assert np.array_equal(got, ref_layout.send_s(3.0, name, sp, sg).max(axis=0))


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    net=two_level(),
    first=st.integers(0, 200),
    stride=st.integers(1, 40),
    g=st.integers(1, 60),
)
def test_evenly_spaced_groups_equal_counting_their_members(net, first, stride, g):
    """tp groups (stride 1), dp / ep groups (stride tp), expert data-parallel groups (stride
    tp·ep), tied pairs (stride tp·dp·(pp − 1)): ring and all-to-all figures as by member."""
    ranks = first + stride * np.arange(g)
    per_node = np.unique(ranks // net.devices_per_node, return_counts=True)[1]
    spans, fewest, most = net._occupancy(np.array([first]), stride, g)
    assert (bool(spans[0]), int(fewest[0]), int(most[0])) == (
        len(per_node) > 1,
        per_node.min(),
        per_node.max(),
    )
    firsts = np.array([first, first + 7, first + net.devices_per_node])
    bw, lat = net.progression_ring_params(firsts, stride, g)
    ref_bw, ref_lat = ring_params_by_ranks(net, firsts[:, None] + stride * np.arange(g))
    assert np.array_equal(bw, ref_bw) and np.array_equal(lat, ref_lat)
    a_bw, a_lat = net.progression_a2a_params(np.array([first]), stride, g)
    if g > 1:
        assert (float(a_bw[0]), float(a_lat[0])) == net._a2a(ranks.tolist())
    else:
        assert (float(a_bw[0]), float(a_lat[0])) == (net.intra.effective_Bps, net.intra.latency_s)


@settings(max_examples=150, deadline=None)
@given(
    net=two_level(),
    t=st.sampled_from([1, 2, 3, 4, 8]),
    p=st.integers(1, 6),
    d_per_ep=st.integers(1, 12),
    ep=st.sampled_from([1, 1, 2, 3, 4]),
)
def test_two_level_layout_equals_listing_every_rank(net, t, p, d_per_ep, ep):
    assert_layout_equals_reference(net, t, p, d_per_ep * ep, ep)


@pytest.mark.parametrize(
    "n, t, p, d, ep", [(3, 1, 1, 4, 2), (4, 1, 1, 6, 3), (5, 1, 2, 8, 4), (3, 1, 2, 8, 4)]
)
def test_every_expert_parallel_class_counts(n, t, p, d, ep):
    """Layouts whose last class of expert-parallel groups has an all-to-all figure of its own
    (an inter-node level faster than the intra-node one makes the node counts matter)."""
    net = HierarchicalNetwork(n, LinkLevel(1.0, 0.0), LinkLevel(3.0, 0.5))
    assert_layout_equals_reference(net, t, p, d, ep)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 40),
    step=st.integers(1, 64),
    count=st.integers(1, 200),
    extra=st.integers(0, 5000),
)
def test_rank_classes_cover_every_position_on_the_nodes(n, step, count, extra):
    """The first `rank_classes` offsets reach every position in a node that all `count` reach
    (none fewer would), or all offsets are on one node."""
    net = HierarchicalNetwork(n, LinkLevel(1.0, 0.0), LinkLevel(1.0, 0.0))
    total = step * count + extra
    kept = net.rank_classes(step, count, total)
    if total <= n:
        assert kept == 1
        return
    every = {step * i % n for i in range(count)}
    assert {step * i % n for i in range(kept)} == every
    assert len(every) == kept


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.sampled_from([1, 2, 4]),
    p=st.integers(1, 4),
    d=st.sampled_from([1, 2, 3, 4, 6]),
    ep=st.sampled_from([1, 2]),
)
def test_torus_layout_equals_listing_every_rank(seed, t, p, d, ep):
    if d % ep:
        d *= ep
    net = random_torus(np.random.default_rng(seed), t * p * d)
    assert_layout_equals_reference(net, t, p, d, ep)


def test_flat_link_as_one_node_and_tpuv4_slices_equal_listing_every_rank():
    """The two extreme node sizes the code builds (`HierarchicalNetwork.flat` over all devices,
    and one rank per node) and TPU v4 slices with and without wraparound."""
    level = LinkLevel(2.0, 0.01, 0.9)
    for t, p, d, ep in ((2, 3, 8, 2), (4, 2, 6, 3), (1, 5, 12, 4)):
        assert_layout_equals_reference(HierarchicalNetwork.flat(level, t * p * d), t, p, d, ep)
        assert_layout_equals_reference(HierarchicalNetwork.flat(level, 1), t, p, d, ep)
    tpu = {
        "cube": [4, 4, 4],
        "pod": [16, 16, 16],
        "link": {"bandwidth_Bps": 4.5e10, "latency_s": 1e-6},
    }
    for devices, t, p, ep in ((64, 4, 2, 2), (128, 2, 4, 4), (24, 2, 3, 2)):
        net = TorusNetwork.for_devices(tpu, devices, "tpu")
        assert_layout_equals_reference(net, t, p, devices // (t * p), ep)


@settings(max_examples=200, deadline=None)
@given(
    n=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 64]),
    t=st.sampled_from([1, 2, 3, 4, 8]),
    d=st.integers(1, 40),
    stages=st.integers(1, 12),
)
def test_boundary_classes_equal_listing_every_replica(n, t, d, stages):
    level = LinkLevel(1.0, 0.0)
    net = PlaceNetwork(HierarchicalNetwork(n, level, LinkLevel(0.5, 0.1)))
    assert np.array_equal(
        net.boundary_classes(t, d, stages), boundary_classes_by_ranks(net, t, d, stages)
    )


@pytest.mark.parametrize("devices_per_node", [8, 72])
def test_a_layout_of_ten_billion_devices_is_as_small_as_one_node(devices_per_node):
    """The figures of a layout keep one replica per class (at most devices_per_node of them)
    and closed forms over the data-parallel groups: ten billion devices take what a thousand
    take (listing them would need 80 GB of ranks)."""
    intra, inter = LinkLevel(4.5e11, 2e-6, 0.78), LinkLevel(5e10, 5e-6, 0.94)
    net = HierarchicalNetwork(devices_per_node, intra, inter)
    start = time.perf_counter()
    layout = Layout.build(net, 2, 40, 125_000_000, ep=8)
    assert time.perf_counter() - start < 1.0
    assert layout.tp_group_bw.shape == (devices_per_node // 2, 40)
    assert layout.sends["next"][0].shape == (2, devices_per_node // 2, 40)
    if devices_per_node == 8:  # every data-parallel ring fills its nodes, 4 ranks on each
        bw = min(intra.effective_Bps, 4 * inter.effective_Bps)
        assert np.array_equal(layout.dp_bw, np.full(40, bw))
    # a small cluster whose stages sit alike on the nodes has the same replica classes
    d_small = 125_000_000 % devices_per_node + devices_per_node
    small = Layout.build(net, 2, 40, d_small, ep=8)
    for j in range(40):
        assert _replica_rows(layout, j) == _replica_rows(small, j)
    classes = PlaceNetwork(net).boundary_classes(2, 125_000_000, 40)
    assert set(classes[1:40].tolist()) == {INTER}


@settings(max_examples=200, deadline=None)
@given(
    n=st.sampled_from([1, 3, 8, 72]),
    stride=st.integers(1, 100),
    g=st.integers(1, 50),
    slack=st.integers(0, 10),
)
def test_groups_at_the_top_of_int64_count_without_wrapping(n, stride, g, slack):
    """The last rank of a group of 2^63 − 1 devices: no intermediate exceeds it (NumPy's int64
    would wrap silently)."""
    first = 2**63 - 1 - slack - stride * (g - 1)
    net = HierarchicalNetwork(n, LinkLevel(1.0, 0.0), LinkLevel(1.0, 0.0))
    counts: dict[int, int] = {}
    for i in range(g):
        counts[(first + stride * i) // n] = counts.get((first + stride * i) // n, 0) + 1
    spans, fewest, most = net._occupancy(np.array([first]), stride, g)
    assert (bool(spans[0]), int(fewest[0]), int(most[0])) == (
        len(counts) > 1,
        min(counts.values()),
        max(counts.values()),
    )


def test_divisors_from_prime_factors():
    from phaze.place.megatron import _divisors

    for n in range(1, 2000):
        assert _divisors(n) == [k for k in range(1, n + 1) if n % k == 0]
    start = time.perf_counter()
    # 2^63 − 1 = 7^2·73·127·337·92737·649657; a prime; a product of two primes near 2^31.5
    assert len(_divisors(2**63 - 1)) == 3 * 2**5
    assert _divisors(9223372036854775783) == [1, 9223372036854775783]
    assert _divisors(3037000493 * 3037000453) == [
        1,
        3037000453,
        3037000493,
        3037000493 * 3037000453,
    ]
    assert _divisors(10**7)[-3:] == [2_500_000, 5_000_000, 10_000_000]
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "stage, flag, value",
    [
        ("optimize", "--devices", "1" + "0" * 30),
        ("optimize", "--global-batch", str(2**63)),
        ("evaluate", "--devices", str(2**64)),
    ],
)
def test_a_count_too_large_to_represent_exits_2_with_one_line(stage, flag, value, capsys):
    """In process (`phaze.cli.main`, what `python -m phaze` runs)."""
    from phaze.cli import main

    args = {"--devices": "8", "--global-batch": "8", flag: value}
    argv = [stage, "--model", "megatron-gpt-8.3b", "--arch", "h100-sxm"]
    argv += [x for kv in args.items() for x in kv]
    if stage == "evaluate":
        argv += ["--tp", "1", "--pp", "1", "--microbatch", "1"]
    start = time.perf_counter()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"argument {flag}: {value} is too large to represent" in err
    assert "2^63 - 1" in err
    assert time.perf_counter() - start < 5.0


def test_the_largest_representable_cluster_is_searched(capsys):
    """2^63 − 1 devices (7^2·73·127·337·92737·649657: tp 1 only, 96 pipeline depths to try):
    the search runs, prices the answer on one replica per class and prints it."""
    from phaze.cli import main

    n = str(2**63 - 1)
    argv = ["optimize", "--model", "megatron-gpt-8.3b", "--arch", "h100-sxm", "--json"]
    code = main([*argv, "--devices", n, "--global-batch", n, "--microbatch", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    import json

    result = json.loads(out)
    s = result["strategy"]
    assert s["tp"] * s["pp"] * s["dp"] == 2**63 - 1
    assert result["search"]["skipped"]["more pipeline stages than the layers allow"] > 0
