"""The global search against brute force: on random synthetic spaces (tests/search_sim.py) the
best-first refinement returns the answer and the front of evaluating every architecture at the
final tier, its certificate holds for every architecture's optimum drawn inside its bounds, and
it refines fewer components than the brute force."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from search_sim import (
    MODELS,
    brute,
    place_rows,
    random_plan,
    simulate,
    space_rows,
    truth_table,
    with_dominance,
)

from phaze.errors import PhazeError
from phaze.search.global_search import (
    GLOBAL_KEY,
    can_refine,
    front_points,
    front_table,
    global_states,
    global_values,
    open_components,
)
from phaze.search.scores import SearchSettings, components


def _states(comp, plan, s):
    area = plan.set_index("arch")["area_mm2"]
    inside = set(plan.loc[plan["bucket"] >= 0, "arch"])
    values = global_values(comp[comp["arch"].isin(inside)], MODELS)
    states, detail = global_states(values, area, s, comp)
    return values, states.set_index(GLOBAL_KEY).sort_index(), detail


def _true_scores(truth: pd.DataFrame, refs: dict) -> pd.DataFrame:
    """The optimum schedules' score (``t``) per (global search, arch), by each score's
    definition (references as the search's)."""
    t = truth.copy()
    pm = t.groupby(["model", "hbm_capacity_bytes", "devices", "arch"])["t"].max().reset_index()
    out = [pm.assign(strategy="phaze-per-model", common_score="")]
    wide = pm.pivot_table(
        index=["hbm_capacity_bytes", "devices", "arch"], columns="model", values="t", dropna=False
    ).reindex(columns=MODELS)
    mean = wide.mean(axis=1, skipna=False)
    out.append(mean.rename("t").reset_index().assign(strategy="phaze-common", common_score="mean"))
    logs = []
    for m in MODELS:
        ref = np.array([refs.get((m, h, d), np.nan) for h, d, _ in wide.index])
        logs.append(np.log(wide[m].to_numpy(float) / ref))
    rel = pd.Series(np.exp(np.mean(logs, axis=0)), index=wide.index, name="t")
    out.append(rel.reset_index().assign(strategy="phaze-common", common_score="relative"))
    df = pd.concat(out, ignore_index=True)
    df["model"] = df["model"].fillna("*")
    return df


def _refs(comp):
    from phaze.search.scores import model_references

    return model_references(comp)


def _check_against_brute_force(got, want, true, gap):
    """Per global search (``got``: the search's states, ``want``: the brute force's, ``true``:
    :func:`_true_scores`): the answer within the certificate of the brute force's (equal at gap
    0), the certificate holding for every arch's optimum, the search ended at its gap."""
    for key, g in got.iterrows():
        w = want.loc[key]
        if pd.isna(w["arch"]):
            # nothing feasible: no answer either way (a missing arch is None in an object
            # column, NaN in pandas' string column)
            assert pd.isna(g["arch"]) and np.isnan(g["score"])
            continue
        if key[0] == "phaze-per-model" or key[1] == "mean":
            # the brute force's answer is the best final-tier value; the search's is within
            # its certificate (exactly equal at gap 0)
            if gap == 0:
                assert g["score"] == pytest.approx(w["score"], rel=1e-12)
            else:
                assert g["score"] * (1 + gap) >= w["score"] * (1 - 1e-12)
        # the certificate holds for every arch's optimum inside its bounds
        sel = true
        for col, v in zip(GLOBAL_KEY, key, strict=True):
            sel = sel[sel[col] == v]
        top = sel["t"].max()
        if np.isfinite(top):
            assert top <= g["score"] * (1 + g["certified_gap"]) * (1 + 1e-9), (key, top, g)
        # the search stops at its gap, unless an arch at the final tier keeps it open
        if g["stuck_gap"] == 0:
            assert g["certified_gap"] <= gap + 1e-12
        assert g["open_gap"] == 0 and g["open_front"] == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n_archs=st.integers(2, 16),
    k=st.integers(1, 4),
    gap=st.sampled_from([0.0, 0.0, 0.02, 0.1]),
    front_gap=st.sampled_from([0.0, 0.05, 0.5, None]),
    deepen=st.booleans(),
    certify=st.booleans(),
)
def test_global_equals_every_arch_at_the_final_tier(
    seed, n_archs, k, gap, front_gap, deepen, certify
):
    rng = np.random.default_rng(seed)
    truth = truth_table(rng, n_archs)
    plan = random_plan(rng, n_archs, round_buckets=2)
    s = SearchSettings(
        mode="global",
        gap=gap,
        front_gap=front_gap,
        round_archs=k,
        patience=3,
        deepen_node_limit=1000 if deepen else 0,
        certify_split_nodes=16 if certify else 0,
    )
    run = simulate(truth, plan, s)
    values, got, _ = _states(run.comp, plan, s)
    everything = brute(truth, s)
    _, want, _ = _states(everything, plan, s)
    assert list(got.index) == list(want.index)
    _check_against_brute_force(got, want, _true_scores(truth, _refs(run.comp)), gap)
    # the front: with front_gap 0, every point of the brute force's front is found
    if front_gap == 0 and gap == 0:
        area = plan.set_index("arch")["area_mm2"]
        f_got = front_table(values, area)
        f_want = front_table(global_values(everything, MODELS), area)
        for key, grp in f_want[f_want["strategy"] == "phaze-per-model"].groupby(GLOBAL_KEY):
            mine = f_got
            for col, v in zip(GLOBAL_KEY, key, strict=True):
                mine = mine[mine[col] == v]
            np.testing.assert_allclose(
                np.sort(mine["throughput_seq_s"].to_numpy()),
                np.sort(grp["throughput_seq_s"].to_numpy()),
            )
    assert run.n_bound <= len(truth) * (run.rounds + 1)


def test_a_front_not_refined_for_costs_no_more_and_keeps_the_answer():
    rng = np.random.default_rng(11)
    truth = truth_table(rng, 30)
    plan = random_plan(rng, 30, round_buckets=2)
    runs = {}
    for fg in (0.0, None):
        s = SearchSettings(mode="global", gap=0.0, front_gap=fg, round_archs=2, patience=2)
        runs[fg] = (simulate(truth, plan, s), s)
    (full, s0), (lean, s1) = runs[0.0], runs[None]
    assert lean.n_bound < full.n_bound
    _, a, _ = _states(full.comp, plan, s0)
    _, b, _ = _states(lean.comp, plan, s1)
    pd.testing.assert_series_equal(a["score"], b["score"])
    assert (b["front_gap"] >= a["front_gap"]).all() and (b["open_front"] == 0).all()


def test_the_search_refines_less_than_everything_when_bounds_are_tight():
    rng = np.random.default_rng(1)
    n = 60
    truth = truth_table(rng, n, infeasible_frac=0.0, space_slack=0.0)
    for col in ("v", "t", "dv", "dhi"):
        truth[col] = 100.0 - truth["arch"].str[1:].astype(int)
    truth["lo"], truth["hi"], truth["ihi"] = truth["v"] * 0.999, truth["v"] * 1.002, truth["v"]
    truth["sb"] = truth["hi"] * 1.001
    plan = random_plan(rng, n, round_buckets=2)
    s = SearchSettings(mode="global", gap=0.01, front_gap=0.5, round_archs=4, patience=2)
    run = simulate(truth, plan, s)
    assert run.n_bound < len(truth) / 3
    _, got, _ = _states(run.comp, plan, s)
    assert (got["certified_gap"] <= 0.01).all()
    pm = got.xs("phaze-per-model", level="strategy")
    assert (pm["arch"] == "a0").all()


def test_front_points_and_levels_by_hand():
    area = np.array([3.0, 1.0, 2.0, 2.0, 4.0])
    ach = np.array([5.0, 2.0, np.nan, 4.0, 5.0])
    # by area: 1 -> 2.0, 2 -> 4.0, 3 -> 5.0 (4 has 5.0 too: beaten in area)
    assert list(front_points(area, ach)) == [1, 3, 0]
    s = SearchSettings(mode="global", gap=0.0, front_gap=0.1)
    grp = pd.DataFrame(
        {
            "arch": list("abcde"),
            "hi": [5.0, 2.1, 4.6, 4.0, 5.0],
            "ach": ach,
            "exact": [True, False, False, True, True],
        }
    )
    from phaze.search.global_search import search_state

    st_ = search_state(grp, pd.Series(area, index=list("abcde")), s)
    assert st_["winner"] == "a"  # 5.0 at area 3 beats 5.0 at area 4: the cheaper chip
    np.testing.assert_allclose(st_["F"], [5.0, 2.0, 4.0, 4.0, 5.0])
    # c (area 2, hi 4.6) is above F = 4.0 by 15 % > 10 %; b within 5 %
    assert list(st_["above_front"]) == [False, False, True, False, False]
    assert st_["front_gap"] == pytest.approx(4.6 / 4.0 - 1)


def test_settings_reject_bad_gaps_and_modes():
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(PhazeError, match="search.gap"):
            SearchSettings(gap=bad)
        with pytest.raises(PhazeError, match="search.front_gap"):
            SearchSettings(front_gap=bad)
    with pytest.raises(PhazeError, match="search.gap"):
        SearchSettings(gap=None)
    SearchSettings(front_gap=None)  # the front reported, not refined for
    with pytest.raises(PhazeError, match="search.mode"):
        SearchSettings(mode="nope")
    with pytest.raises(PhazeError, match="common_score"):
        SearchSettings(common_score="max")


def test_a_space_where_nothing_fits_has_no_answer_and_no_work():
    rng = np.random.default_rng(5)
    truth = truth_table(rng, 6, infeasible_frac=1.0)
    plan = random_plan(rng, 6, round_buckets=2)
    s = SearchSettings(mode="global", round_archs=2, patience=2)
    run = simulate(truth, plan, s)
    assert run.n_ilp == 0
    _, got, _ = _states(run.comp, plan, s)
    assert got["arch"].isna().all() and got["score"].isna().all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n_archs=st.integers(2, 14),
    k=st.integers(1, 3),
    gap=st.sampled_from([0.0, 0.02]),
    p_edge=st.sampled_from([0.2, 0.6]),
)
@example(seed=322, n_archs=9, k=1, gap=0.0, p_edge=0.6)  # a model with no feasible arch
def test_global_with_dominance_keeps_the_answer_and_the_certificate(seed, n_archs, k, gap, p_edge):
    """With dominance steps (bounds closed over dominating archs, led archs refined last), the
    answer is the brute force's within the certificate, and the certificate holds for every
    arch's optimum."""
    rng = np.random.default_rng(seed)
    truth = with_dominance(truth_table(rng, n_archs), rng, p_edge)
    plan = random_plan(rng, n_archs, round_buckets=2)
    s = SearchSettings(mode="global", gap=gap, front_gap=0.5, round_archs=k, patience=3)
    run = simulate(truth, plan, s)
    _, got, _ = _states(run.comp, plan, s)
    _, want, _ = _states(brute(truth, s), plan, s)
    _check_against_brute_force(got, want, _true_scores(truth, _refs(run.comp)), gap)


def test_dominance_spares_refinement_and_a_false_step_is_caught():
    """On a chain where each arch dominates the one below, the search refines less with the
    steps than without; a step the truth contradicts stops the search with an error."""
    rng = np.random.default_rng(3)
    n = 24
    truth = truth_table(rng, n, infeasible_frac=0.0, space_slack=0.0)
    for col in ("v", "t", "dv", "dhi", "lo", "hi", "ihi"):
        truth[col] = 10.0 + truth["arch"].str[1:].astype(int) * 0.01
    truth["hi"] = truth["t"] * 1.05  # the ILP tier is exact, the bound tier 5 % above
    truth["sb"] = truth["hi"] * 1.1
    plan = random_plan(rng, n, round_buckets=2)
    s = SearchSettings(mode="global", gap=0.01, front_gap=0.5, round_archs=2, patience=2)
    plain = simulate(truth, plan, s)
    chain = truth.assign(dominated_by=truth["arch"].map({f"a{i}": f"a{i + 1}" for i in range(n)}))
    chain.loc[chain["arch"] == f"a{n - 1}", "dominated_by"] = ""
    dom = simulate(chain, plan, s)
    assert dom.n_bound < plain.n_bound
    _, got, _ = _states(dom.comp, plan, s)
    assert (got.xs("phaze-per-model", level="strategy")["arch"] == f"a{n - 1}").all()
    # mutation: a step the truth contradicts (a0 faster than the arch said to dominate it),
    # caught when a0 is refined (here a pinned baseline: round 0)
    pinned = random_plan(rng, n, round_buckets=2, presets=["tpuv4"] + [""] * (n - 1))
    false = chain.copy()
    false.loc[false["arch"] == "a0", "dominated_by"] = "a1"
    for col in ("v", "t", "dv", "lo"):
        false.loc[false["arch"] == "a0", col] = 20.0
    false.loc[false["arch"] == "a0", ["hi", "ihi", "dhi", "sb"]] = 21.0
    with pytest.raises(PhazeError, match="dominance contradicted"):
        simulate(false, pinned, s, pinned=("tpuv4",))


def test_certify_closes_a_certificate_the_final_tier_leaves_open():
    """Archs whose final tier leaves a wide interval keep a certificate above the gap; the
    certify solve takes just the components that do (at the final tier, above their search's
    threshold), closes it where its bound is tight, and leaves every achieved value and answer
    as it was."""
    rng = np.random.default_rng(3)
    n = 40
    truth = truth_table(rng, n, infeasible_frac=0.0, space_slack=0.0)
    ids = truth["arch"].str[1:].astype(int)
    for col in ("v", "t", "dv", "dhi", "chi"):
        truth[col] = 100.0 - ids
    truth["cv"] = truth["v"] + 0.5  # a marker: the certify solve's makespans are never scored
    truth["lo"], truth["hi"], truth["ihi"] = truth["v"] * 0.999, truth["v"] * 1.002, truth["v"]
    # a1, a2 and a5: the ILP proves only 4 % above its schedule (the certify solve proves it);
    # a5's 95 * 1.04 stays under the answer's 100 * 1.01 without it
    wide = truth["arch"].isin(["a1", "a2", "a5"])
    truth.loc[wide, "ihi"] = truth.loc[wide, "v"] * 1.04
    truth.loc[wide, "hi"] = truth.loc[wide, "v"] * 1.05
    truth["sb"] = truth["hi"] * 1.001
    # a7 is a pinned baseline: the ILP always, the certify solve never
    plan = random_plan(
        rng, n, round_buckets=2, presets=["tpuv4" if i == 7 else "" for i in range(n)]
    )
    out = {}
    for nodes in (0, 16):
        s = SearchSettings(
            mode="global", gap=0.01, front_gap=None, round_archs=4, certify_split_nodes=nodes
        )
        run = simulate(truth, plan, s, pinned=("tpuv4",))
        out[nodes] = (run, _states(run.comp, plan, s)[1])
    (plain, before), (cert, after) = out[0], out[16]
    pm = ("phaze-per-model", "")
    assert (before.loc[pm, "certified_gap"] > 0.01).all()
    assert (before.loc[pm, "stuck_gap"] > 0).all()
    assert (after["certified_gap"] <= 0.01).all() and (after["stuck_gap"] == 0).all()
    pd.testing.assert_series_equal(before["score"], after["score"])
    pd.testing.assert_series_equal(before["arch"], after["arch"])
    # only the components that keep a certificate open, each once, each at the final tier first
    took = cert.comp[cert.comp["has_certify"]]
    assert set(took["arch"]) == {"a1", "a2"}
    assert cert.n_certify == len(took[["model", "microbatch", "arch"]].drop_duplicates())
    assert (took["level"] >= 2).all()
    assert (cert.comp.loc[cert.comp["arch"] == "a7", "level"] >= 2).all()
    assert plain.n_certify == 0
    # achieved values are the final tier's: the certify solve's makespans are not scored
    key = ["model", "hbm_capacity_bytes", "microbatch", "arch"]
    v = took[key].merge(truth[key + ["v"]], on=key)["v"]
    np.testing.assert_array_equal(took["ach"].to_numpy(), v.to_numpy())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n_archs=st.integers(1, 10),
    n_hbm=st.integers(1, 2),
    gap=st.sampled_from([0.0, 0.02, 0.3]),
    front_gap=st.sampled_from([0.0, 0.05, None]),
    certify=st.booleans(),
)
def test_can_refine_is_whether_an_open_component_exists(
    seed, n_archs, n_hbm, gap, front_gap, certify
):
    """``can_refine`` (per-group maxima) against :func:`open_components` (every (search,
    component) pair) on components refined to random tiers."""
    rng = np.random.default_rng(seed)
    truth = truth_table(rng, n_archs, n_hbm=n_hbm)
    tiers = [["ub", "lo"], ["ub", "lo", "ilp", "ilp_ub"]]
    tiers.append(tiers[1] + ["certify", "certify_ub"])
    parts = []
    for i in range(len(truth)):
        got = rng.integers(0, 4)  # 0: the space bound only
        for t in tiers[got - 1] if got else []:
            parts.append(place_rows(truth.iloc[[i]], t))
    place = pd.concat(parts, ignore_index=True) if parts else place_rows(truth.iloc[:0], "ub")
    comp = components(place, "ilp", space_rows(truth))
    s = SearchSettings(
        mode="global", gap=gap, front_gap=front_gap, certify_split_nodes=16 if certify else 0
    )
    plan = random_plan(rng, n_archs, round_buckets=2)
    area = plan.set_index("arch")["area_mm2"]
    values = global_values(comp, MODELS)
    _, detail = global_states(values, area, s, comp)
    listed = open_components(comp, detail, s)
    has = pd.MultiIndex.from_frame(detail[GLOBAL_KEY + ["arch"]]).isin(
        pd.MultiIndex.from_frame(listed[GLOBAL_KEY + ["arch"]])
    )
    np.testing.assert_array_equal(can_refine(comp, detail, s), has)
    # every open row names its open components whatever other rows come with it
    for i in np.flatnonzero(has)[:3]:
        alone = open_components(comp, detail.iloc[[i]], s)
        mine = listed.merge(detail.iloc[[i]][GLOBAL_KEY + ["arch"]], on=GLOBAL_KEY + ["arch"])
        key = GLOBAL_KEY + ["arch", "comp_model", "microbatch"]
        pd.testing.assert_frame_equal(
            alone.sort_values(key).reset_index(drop=True)[key],
            mine.sort_values(key).reset_index(drop=True)[key],
            check_dtype=False,
        )
