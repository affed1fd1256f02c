"""The round state on integer codes against the string-keyed tables it replaced: a small
reference implementation of each replaced function, compared on random spaces."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from search_sim import place_rows, space_rows, truth_table, with_dominance

from phaze.search.dominance import _codes, _combine, check_closed, close_bounds, edges_of
from phaze.search.scores import (
    ACHIEVABLE,
    COMMON_SCORES,
    COMPONENT_KEY,
    LEVEL,
    SEARCH_KEY,
    TIERS,
    UPPER,
    VALUE_COLUMNS,
    all_scores,
    common_scores,
    components,
)


def reference_components(place, final="ilp", space=None, edges=None) -> pd.DataFrame:
    """The components table as one string-keyed outer merge of the placements' pivot and the
    space bounds (the implementation :func:`phaze.search.scores.components` replaced), without
    its per-tier columns."""
    df = place[COMPONENT_KEY + ["tier", "throughput_seq_s"]].copy()
    if "feasible" in place.columns:
        df.loc[~place["feasible"].astype(bool).to_numpy(), "throughput_seq_s"] = np.nan
    g = df.groupby(COMPONENT_KEY + ["tier"], sort=False)["throughput_seq_s"]
    wide = g.max().unstack("tier").reindex(columns=list(TIERS))
    present = g.size().unstack("tier").reindex(index=wide.index, columns=list(TIERS)).notna()
    level = np.zeros(len(wide), dtype=np.int64)
    for tier in TIERS:
        level = np.maximum(level, np.where(present[tier].to_numpy(), LEVEL[tier], 0))
    wide.columns.name = None
    wide = wide.reset_index()
    wide["level"] = level
    for tier in UPPER:
        wide[f"_has_{tier}"] = present[tier].to_numpy()
    if space is not None and len(space):
        sb = space[COMPONENT_KEY + ["throughput_upper_seq_s"]].rename(
            columns={"throughput_upper_seq_s": "_space"}
        )
        sb["_in_space"] = True
        wide = sb.merge(wide, on=COMPONENT_KEY, how="outer")
        in_space = wide.pop("_in_space").fillna(False).astype(bool).to_numpy()
        wide["space"] = np.fmin(wide["space"], wide.pop("_space"))
        wide["level"] = wide["level"].fillna(0).astype(np.int64)
        for tier in UPPER:
            wide[f"_has_{tier}"] = wide[f"_has_{tier}"].fillna(False).astype(bool)
        wide["_has_space"] |= in_space
    has = np.column_stack([wide[f"_has_{t}"].to_numpy(bool) for t in UPPER])
    upper = wide[list(UPPER)].to_numpy(dtype=float)
    infeasible = (has & np.isnan(upper)).any(axis=1)
    hi = np.where(has & ~np.isnan(upper), upper, np.inf).min(axis=1)
    hi = np.where(infeasible, np.nan, hi)
    certified = wide["_has_certify_ub"].to_numpy(bool)
    wide = wide.drop(columns=[f"_has_{t}" for t in UPPER])
    wide["ach"] = wide[list(ACHIEVABLE)].max(axis=1, skipna=True)
    own = hi
    if edges is not None and len(edges):
        hi = close_bounds(wide, edges, own)
        lowered = hi < own
        check_closed(wide[lowered], hi[lowered], wide["ach"].to_numpy(float)[lowered])
    wide["hi"] = hi
    with np.errstate(invalid="ignore"):
        wide["led"] = hi < own
    wide["has_ilp"] = wide["level"] >= LEVEL["ilp"]
    wide["has_deep"] = wide["level"] >= LEVEL["deep"]
    wide["has_certify"] = certified
    wide["exact"] = (
        wide[final].notna()
        | (wide["hi"] <= wide["ach"]).fillna(False)
        | wide["hi"].isna()
        | (wide["level"] >= LEVEL[final])
    )
    return wide.drop(columns=list(TIERS))


def _random_place(rng, truth: pd.DataFrame) -> pd.DataFrame:
    """Placements of random components at random tiers (a tier's rows may repeat)."""
    parts = [place_rows(truth.iloc[:0], "lo")]
    for tiers in (["ub", "lo"], ["ilp", "ilp_ub"], ["deep", "deep_ub"], ["certify_ub"]):
        pick = truth[rng.random(len(truth)) < 0.3]
        parts += [place_rows(pick, t) for t in tiers]
    place = pd.concat(parts, ignore_index=True)
    return place.sample(frac=1.0, random_state=int(rng.integers(2**31)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    n_hbm=st.sampled_from([1, 2]),
    final=st.sampled_from(["ilp", "deep"]),
    drop=st.sampled_from([0.0, 0.2]),
)
def test_components_equal_the_string_keyed_table(seed, n_hbm, final, drop):
    """Same rows in the same order and the same values as the outer merge it replaced, on
    random spaces: shuffled space rows, dominance steps, placements at every tier, components the
    space bounds lack. Mutations: a component's space row taken one code off (``at + 1``), the
    output rows left in the space's order — each fails."""
    rng = np.random.default_rng(seed)
    truth = with_dominance(truth_table(rng, 5, n_hbm), rng)
    space = space_rows(truth).sample(frac=1.0, random_state=seed % 1000)
    space = space[rng.random(len(space)) >= drop].reset_index(drop=True)
    place = _random_place(rng, truth)
    edges = edges_of(space)
    got = components(place, final, space, edges)
    want = reference_components(place, final, space, edges)
    pd.testing.assert_frame_equal(got, want)
    # without the space bounds: the placements' rows alone
    got = components(place, final)
    want = reference_components(place, final)
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.parametrize("final", ["ilp", "deep"])
def test_components_of_the_space_alone_are_level_zero(final):
    """No placement yet (round 0): every component is the space bound's, closed by dominance."""
    rng = np.random.default_rng(3)
    truth = with_dominance(truth_table(rng, 6, 2), rng)
    space = space_rows(truth)
    got = components(place_rows(truth.iloc[:0], "lo"), final, space, edges_of(space))
    want = reference_components(place_rows(truth.iloc[:0], "lo"), final, space, edges_of(space))
    pd.testing.assert_frame_equal(got, want)
    assert (got["level"] == 0).all() and got["ach"].isna().all() and got["led"].any()


def test_components_keep_the_space_types_when_nothing_is_placed():
    """An empty placements table with untyped columns (a round step's before any placement):
    the keys keep the space bounds' types, as the merge kept them."""
    rng = np.random.default_rng(4)
    truth = truth_table(rng, 4)
    space = space_rows(truth)
    place = pd.DataFrame(columns=COMPONENT_KEY + ["tier", "throughput_seq_s"])
    got = components(place, "ilp", space)
    pd.testing.assert_frame_equal(got, reference_components(place, "ilp", space))
    assert got["arch"].dtype == space["arch"].dtype and got["devices"].dtype == np.int64


def reference_scores(comp: pd.DataFrame, models) -> pd.DataFrame:
    """The walk's scores as the per-model rows' copy and the common rows concatenated, then
    their columns taken (the implementation :func:`all_scores` replaced)."""
    pm = comp[[c for c in SEARCH_KEY if c in comp.columns] + ["arch", *VALUE_COLUMNS]].copy()
    pm.insert(0, "strategy", "phaze-per-model")
    pm.insert(1, "common_score", "")
    common = common_scores(comp, models, COMMON_SCORES)
    return pd.concat([pm, common], ignore_index=True)[SEARCH_KEY + ["arch", *VALUE_COLUMNS]]


@pytest.mark.parametrize("seed", [0, 1])
def test_scores_equal_the_concatenated_table(seed):
    """The walk's scores, column by column, equal the concatenation they replaced (rows, order,
    values and types), with placements and without. Mutation: the per-model rows' constant
    ``common_score`` set to ``"*"`` fails."""
    rng = np.random.default_rng(seed)
    truth = with_dominance(truth_table(rng, 5, 2), rng)
    space = space_rows(truth)
    models = sorted(truth["model"].unique())
    for place in (_random_place(rng, truth), place_rows(truth.iloc[:0], "lo")):
        comp = components(place, "ilp", space, edges_of(space))
        pd.testing.assert_frame_equal(all_scores(comp, models), reference_scores(comp, models))


def _ref_lookup(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position in ``keys`` (unique) of each of ``wanted``; −1 where absent."""
    if len(keys) == 0:
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.minimum(np.searchsorted(keys[order], wanted), len(keys) - 1)
    return np.where(keys[order][pos] == wanted, order[pos], -1)


def reference_close_bounds(wide: pd.DataFrame, edges: pd.DataFrame, hi: np.ndarray) -> np.ndarray:
    """The dominance closure on the list of (row, dominating row) pairs (the implementation
    :func:`close_bounds` replaced)."""
    if edges.empty or wide.empty:
        return hi
    model, e_model = _codes(wide["model"], edges["model"])
    arch, e_arch, e_up = _codes(wide["arch"], edges["arch"], edges["up"])
    mb, e_mb = _codes(wide["microbatch"].astype("int64"), edges["microbatch"].astype("int64"))
    hbm, dev = (_codes(wide[c])[0] for c in ("hbm_capacity_bytes", "devices"))
    # the edges of each row: those of its (model, microbatch, arch)
    both = _combine(np.r_[model, e_model], np.r_[mb, e_mb], np.r_[arch, e_arch])
    step, e_step = both[: len(wide)], both[len(wide) :]
    order = np.argsort(e_step, kind="stable")
    first = np.searchsorted(e_step[order], step, side="left")
    count = np.searchsorted(e_step[order], step, side="right") - first
    rx = np.repeat(np.arange(len(wide)), count)
    ei = order[np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())]
    # the dominating row: same (model, HBM, microbatch, devices), arch = the edge's ``up``
    n_arch = int(arch.max(initial=-1)) + 2  # the codes of wide's archs, and one for others
    group = _combine(model, hbm, mb, dev)
    ry = _ref_lookup(group * n_arch + arch, group[rx] * n_arch + e_up[ei])
    rx, ry = rx[ry >= 0], ry[ry >= 0]
    if len(rx) == 0:
        return hi
    starts = np.flatnonzero(np.r_[True, rx[1:] != rx[:-1]])
    ux = rx[starts]
    # a chain passes through an arch where nothing fits (its NaN lends nothing, as +inf)
    own_nan = np.isnan(hi)
    h = np.where(own_nan, np.inf, hi.astype(float))
    for _ in range(len(wide) + 1):
        new = h.copy()
        new[ux] = np.minimum(h[ux], np.minimum.reduceat(h[ry], starts))
        if np.array_equal(new, h):
            return np.where(own_nan, np.nan, h)
        h = new
    raise AssertionError("dominance closure did not converge (a cycle of strict steps)")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31), n_hbm=st.sampled_from([1, 2]), p_edge=st.sampled_from([0.2, 0.6])
)
@example(seed=429207, n_hbm=2, p_edge=0.2)  # a chain through the missing component
def test_closure_equals_the_pairs_closure(seed, n_hbm, p_edge):
    """The dense closure (cell × architecture) gives the pairs' closure bit for bit on random
    spaces: shuffled rows, NaN bounds, steps to archs no row has, a component missing (a chain
    does not pass through it). Mutations: a step's arch taken one code off (``e_arch + 1``),
    the cells keyed without the HBM size, a missing component lowered like a present one — each
    fails."""
    rng = np.random.default_rng(seed)
    truth = with_dominance(truth_table(rng, 6, n_hbm), rng, p_edge)
    space = space_rows(truth).sample(frac=1.0, random_state=seed % 1000)
    space = space.iloc[1:].reset_index(drop=True)
    edges = edges_of(space)
    extra = edges.iloc[:2].assign(up="nowhere")
    edges = pd.concat([edges, extra], ignore_index=True)
    hi = space["throughput_upper_seq_s"].to_numpy(float)
    got = close_bounds(space, edges, hi)
    want = reference_close_bounds(space, edges, hi)
    np.testing.assert_array_equal(got, want)
