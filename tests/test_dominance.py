"""Dominance between architectures (phaze/search/dominance.py): the steps found, their check
against latencies, the theorem they rest on (brute-force schedules), the closure of bounds
against reachability by brute force, and the check that catches a false step."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schedule import brute_force

from phaze.errors import PhazeError
from phaze.search.dominance import (
    candidate_steps,
    check_closed,
    close_bounds,
    edges_of,
    families,
    joined,
    scope_edges,
    verified,
)
from phaze.search.space_bounds import _blocks, _dominated_by


def _grid(shapes=((128, 128), (256, 64))) -> pd.DataFrame:
    rows = []
    for (w, d), n_tc, n_vc, glb in itertools.product(shapes, (1, 2, 4), (1, 2), (16, 32)):
        rows.append(
            {
                "arch": f"{w}x{d}-{n_tc}-{n_vc}-{glb}",
                "n_tc": n_tc,
                "n_vc": n_vc,
                "tc_width": w,
                "tc_depth": d,
                "glb_bytes": glb << 20,
                "preset": "",
                "area_mm2": float(n_tc * w * d / 1000 + n_vc + glb),
                "peak_flops": float(n_tc * w * d),
            }
        )
    return pd.DataFrame(rows)


def test_steps_go_to_the_next_larger_value_of_one_axis_inside_a_family():
    space = _grid()
    x, y = candidate_steps(space)
    got = {(space["arch"][i], space["arch"][j]) for i, j in zip(x, y)}
    want = set()
    arch = dict(zip(space["arch"], space.index))
    for a in space["arch"]:
        w, n_tc, n_vc, glb = a.split("-")
        up = {"n_tc": {"1": "2", "2": "4"}, "n_vc": {"1": "2"}, "glb": {"16": "32"}}
        if n_tc in up["n_tc"]:
            want.add((a, f"{w}-{up['n_tc'][n_tc]}-{n_vc}-{glb}"))
        if n_vc in up["n_vc"]:
            want.add((a, f"{w}-{n_tc}-{up['n_vc'][n_vc]}-{glb}"))
        if glb in up["glb"]:
            want.add((a, f"{w}-{n_tc}-{n_vc}-{up['glb'][glb]}"))
    assert got == want
    assert all(b in arch for _, b in got)
    # one family per array shape; a preset is a family of its own
    assert len(set(families(space))) == 2
    space.loc[0, "preset"] = "tpuv4"
    assert len(set(families(space))) == 3
    x2, _ = candidate_steps(space)
    assert 0 not in set(x2) and len(x2) < len(x)


def test_a_step_with_a_slower_operator_or_fewer_cores_is_not_recorded():
    space = _grid(((128, 128),))
    x, y = candidate_steps(space)
    n = len(space)
    rng = np.random.default_rng(0)
    base = rng.uniform(1, 2, (1, 5))
    # latencies shrink with every resource: every step holds
    speed = (space["n_tc"] * space["n_vc"] * space["glb_bytes"] / 2**20).to_numpy(float)
    lat = base / speed[:, None]
    counts = {c: space[c].to_numpy(float) for c in ("n_tc", "n_vc")}
    assert verified(x, y, [lat, lat * 2], counts).all()
    assert verified(x, y, [np.ones((n, 5))], counts).all()  # equal latencies: a step
    # mutation: one operator one ulp slower on one larger arch drops exactly the steps into it
    bad = lat.copy()
    j = y[0]
    bad[j, 3] = np.nextafter(lat[x[y == j]][:, 3].max(), np.inf)
    ok = verified(x, y, [lat, bad], counts)
    assert not ok[y == j].any() and ok[y != j].all()
    # fewer cores on the larger side is never a step, whatever the latencies
    fewer = dict(counts, n_tc=counts["n_tc"][::-1].copy())
    assert not verified(x, y, [lat], fewer)[counts["n_tc"][y] > counts["n_tc"][x]].any()
    # the recorded text: sorted, comma-joined, per arch
    ups = _dominated_by(space, [lat])
    assert len(ups) == n and joined([["b", "a"], []]) == ["a,b", ""]


def test_blocks_keep_families_whole(monkeypatch):
    import phaze.search.space_bounds as sb

    space = _grid(((128, 128), (256, 64), (64, 256)))
    monkeypatch.setattr(sb, "BLOCK_ARCHS", 30)
    blocks = _blocks(space)
    fam = families(space)
    assert sorted(np.concatenate(blocks)) == list(range(len(space)))
    assert all(len(b) <= 30 for b in blocks)
    for b in blocks:  # 12 archs per family: two families per block, none split
        assert all(set(np.flatnonzero(fam == f)) <= set(b) for f in set(fam[b]))
    monkeypatch.setattr(sb, "BLOCK_ARCHS", 5)  # a family larger than a block is split
    blocks = _blocks(space)
    assert sorted(np.concatenate(blocks)) == list(range(len(space)))
    assert all(len(b) <= 5 for b in blocks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 4),
    more_tc=st.integers(0, 1),
    more_vc=st.integers(0, 1),
)
def test_more_cores_and_no_slower_operators_never_lengthen_the_optimum(seed, n, more_tc, more_vc):
    """The theorem dominance rests on, against the brute-force scheduler: shrink any operator's
    latencies (one core and all cores) and add cores, and the optimal makespan does not grow."""
    rng = np.random.default_rng(seed)
    core = tuple(rng.choice(["tc", "vc", "fused"], n))
    l1 = tuple(float(v) for v in np.round(rng.uniform(1, 5, n), 1))
    la = tuple(float(min(a, b)) for a, b in zip(l1, np.round(rng.uniform(0.5, 5, n), 1)))
    edges = tuple((i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.3)
    shrink = rng.uniform(0.5, 1.0, n)
    l1y = tuple(float(a * s) for a, s in zip(l1, shrink))
    lay = tuple(float(min(a * s, b)) for a, s, b in zip(la, rng.uniform(0.5, 1.0, n), l1y))
    x = brute_force(1, 1, core, l1, la, edges)
    y = brute_force(1 + more_tc, 1 + more_vc, core, l1y, lay, edges)
    assert y <= x + 1e-9


def _reachable_min(hi: np.ndarray, ups: dict[int, list[int]]) -> np.ndarray:
    """Brute force: the smallest bound over every architecture reachable by steps (itself
    included), NaN kept where the own bound is NaN."""
    out = hi.copy()
    for x in range(len(hi)):
        if np.isnan(hi[x]):
            continue
        seen, todo = {x}, [x]
        while todo:
            for y in ups.get(todo.pop(), []):
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        out[x] = np.nanmin(hi[list(seen)])
    return out


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 14), p_edge=st.floats(0, 0.6))
def test_closure_is_the_smallest_bound_over_every_dominating_chain(seed, n, p_edge):
    rng = np.random.default_rng(seed)
    # steps go to larger ids (dominance is acyclic), per microbatch; four blocks of components
    # (two HBM sizes x two microbatches) share the arch ids, in shuffled rows: a step never
    # leaves its block
    blocks = [(h, b) for h in (1, 2) for b in (1, 2)]
    ups = {
        b: {x: [y for y in range(x + 1, n) if rng.random() < p_edge] for x in range(n)}
        for b in (1, 2)
    }
    hi = np.round(rng.uniform(1, 10, 4 * n), 1)
    hi[rng.random(4 * n) < 0.15] = np.nan
    hi[rng.random(4 * n) < 0.1] = np.inf
    wide = pd.DataFrame(
        {
            "model": "m",
            "hbm_capacity_bytes": np.repeat([h for h, _ in blocks], n),
            "microbatch": np.repeat([b for _, b in blocks], n),
            "devices": 8,
            "arch": [f"a{i}" for i in range(n)] * 4,
        }
    )
    edges = pd.DataFrame(
        [("m", b, f"a{x}", f"a{y}") for b in (1, 2) for x, ys in ups[b].items() for y in ys]
        # a step to an arch the rows lack, and one of another model: nothing to take
        + [("m", 1, "a0", "zz"), ("m2", 1, "a0", f"a{n - 1}")],
        columns=["model", "microbatch", "arch", "up"],
    )
    perm = rng.permutation(4 * n)
    got = np.empty(4 * n)
    got[perm] = close_bounds(wide.iloc[perm].reset_index(drop=True), edges, hi[perm])
    for k, (_, b) in enumerate(blocks):
        want = _reachable_min(hi[k * n : (k + 1) * n], ups[b])
        np.testing.assert_array_equal(got[k * n : (k + 1) * n], want)
    # mutation: a closure that also took steps downwards would lower a dominating arch's bound
    # to the smaller one below it (a NaN stays NaN)
    if n >= 2 and ups[1][0] and np.isfinite(hi[0]) and np.all(~(hi[1:n] <= hi[0])):
        assert not got[ups[1][0][0]] <= hi[0]


def test_edges_are_read_per_model_and_microbatch_from_the_space_bounds():
    bounds = pd.DataFrame(
        {
            "arch": ["a", "a", "b", "a"],
            "model": ["m", "m", "m", "m"],
            "microbatch": [1, 1, 1, 2],
            "hbm_capacity_bytes": [1, 2, 1, 1],
            "devices": 8,
            "throughput_upper_seq_s": 1.0,
            "dominated_by": ["b,c", "b,c", "", "c"],
        }
    )
    e = edges_of(bounds)
    assert sorted(map(tuple, e.to_numpy().tolist())) == [
        ("m", 1, "a", "b"),
        ("m", 1, "a", "c"),
        ("m", 2, "a", "c"),
    ]
    assert edges_of(bounds.drop(columns="dominated_by")).empty


def test_an_achieved_value_above_a_dominating_bound_is_an_error():
    wide = pd.DataFrame(
        {
            "model": ["m"],
            "microbatch": [2],
            "arch": ["a"],
            "hbm_capacity_bytes": [1],
            "devices": [8],
        }
    )
    check_closed(wide, np.array([10.0]), np.array([10.0]))
    check_closed(wide, np.array([10.0]), np.array([np.nan]))
    with pytest.raises(PhazeError, match="dominance contradicted: m b2 arch a"):
        check_closed(wide, np.array([10.0]), np.array([10.001]))


def test_a_search_uses_the_steps_that_hold_for_all_its_microbatches_and_models():
    edges = pd.DataFrame(
        [
            ("m1", 1, "a", "b"),
            ("m1", 2, "a", "b"),
            ("m1", 1, "a", "c"),  # not at microbatch 2: not m1's
            ("m2", 1, "a", "b"),
            ("m2", 1, "b", "c"),
        ],
        columns=["model", "microbatch", "arch", "up"],
    )
    got = {tuple(r) for r in scope_edges(edges).to_numpy().tolist()}
    assert got == {("m1", "a", "b"), ("m2", "a", "b"), ("m2", "b", "c"), ("*", "a", "b")}
    assert scope_edges(edges.iloc[:0]).empty


def test_the_refinement_takes_a_dominating_open_arch_before_the_archs_it_dominates():
    from phaze.search.global_search import GLOBAL_KEY, chosen_archs

    detail = pd.DataFrame(
        {
            "strategy": "phaze-per-model",
            "common_score": "",
            "model": "m",
            "hbm_capacity_bytes": 1,
            "devices": 8,
            "arch": ["a", "b", "c", "d"],
            "hi": [10.0, 9.0, 8.0, 7.0],
            "led": [False, False, False, False],
            "open_gap": [True, True, True, True],
            "open_front": False,
            "ratio": 1.0,
        }
    )
    area = pd.Series([1.0, 2.0, 3.0, 4.0], index=list("abcd"))
    ups = pd.DataFrame({"scope": ["m", "m"], "arch": ["a", "c"], "up": ["b", "d"]})
    # without the steps: the largest bounds; with them: b and d first (they dominate a and c)
    assert list(chosen_archs(detail, area, 2)["arch"]) == ["a", "b"]
    assert list(chosen_archs(detail, area, 2, ups)["arch"]) == ["b", "d"]
    # a step of another search does not count
    other = ups.assign(scope="*")
    assert list(chosen_archs(detail, area, 2, other)["arch"]) == ["a", "b"]
    # once the dominating archs are closed, the others come
    closed = detail.assign(open_gap=[True, False, True, False])
    assert list(chosen_archs(closed, area, 2, ups)["arch"]) == ["a", "c"]
    assert set(GLOBAL_KEY) <= set(detail.columns)
