"""Unit tests of phaze.search on synthetic tables: buckets, the stop test, exact pruning vs
solving every ILP (brute force), Phaze-Common scoring."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from search_sim import MBS, MODELS, brute, random_plan, simulate, truth_table

from phaze.errors import PhazeError
from phaze.search.plan import bucket_of, make_plan
from phaze.search.scores import (
    COMPONENT_KEY,
    SEARCH_KEY,
    SearchSettings,
    all_scores,
    certified_gap,
    components,
    upper_bound,
)
from phaze.search.stop import stop_bucket
from phaze.search.walk import bucket_best, walk_answers, walk_states

# ---------------------------------------------------------------------------------------------
# buckets and plan


def test_bucket_of_floor_with_float_tolerance():
    assert list(bucket_of(np.array([0.3, 0.0099, 0.01, 278.8]), 0.01)) == [30, 0, 1, 27880]
    with pytest.raises(PhazeError):
        bucket_of(np.array([1.0]), 0.0)


def _space(areas, presets=None):
    n = len(areas)
    return pd.DataFrame(
        {"arch": [f"a{i}" for i in range(n)], "area_mm2": areas, "preset": presets or [""] * n}
    )


def test_plan_orders_buckets_largest_first_and_chunks_within_rounds():
    areas = [10.004, 10.001, 9.5, 9.499, 8.0, 7.0, 6.0, 279.0]
    plan = make_plan(_space(areas, [""] * 7 + ["tpuv4"]), 0.01, round_buckets=2, chunk_archs=2)
    b = dict(zip(plan["arch"], plan["bucket"]))
    assert b["a7"] == 0 and b["a0"] == b["a1"] == 1 and b["a2"] == 2 and b["a3"] == 3
    assert b["a4"] == 4 and b["a6"] == 6
    # buckets never increase in area
    order = plan.sort_values("bucket")
    assert (np.diff(order["bucket_area_mm2"].to_numpy()) <= 0).all()
    assert (plan["round"] == plan["bucket"] // 2).all()
    # chunks: never straddle rounds, at most 2 archs each, ids contiguous
    for c, grp in plan.groupby("chunk"):
        assert grp["round"].nunique() == 1 and len(grp) <= 2
    assert sorted(plan["chunk"].unique()) == list(range(plan["chunk"].max() + 1))


def test_plan_pins_baseline_preset_to_round_zero_but_keeps_its_bucket():
    plan = make_plan(_space([50.0, 40.0, 30.0, 20.0], ["", "", "", "tpuv4"]), 1.0, 1, 10)
    row = plan.set_index("arch").loc["a3"]
    assert row["round"] == 0 and row["bucket"] == 3


def test_a_baseline_outside_the_area_budget_is_computed_but_never_searched():
    # the faithful tpuv4 is a little larger than the budget (upstream's TPUv4 point): it is
    # computed in round 0 for the comparison but belongs to no bucket of the search
    areas = [50.0, 40.0, 30.0, 20.0, 51.0]
    plan = make_plan(_space(areas, ["", "", "", "", "tpuv4"]), 1.0, 1, 10, ("tpuv4",), 50.0)
    row = plan.set_index("arch").loc["a4"]
    assert row["round"] == 0 and row["bucket"] == -1
    assert sorted(plan.loc[plan["arch"] != "a4", "bucket"]) == [0, 1, 2, 3]
    # within the budget it is an ordinary candidate
    inside = make_plan(_space(areas, ["", "", "", "", "tpuv4"]), 1.0, 1, 10, ("tpuv4",), 60.0)
    assert inside.set_index("arch").loc["a4", "bucket"] == 0
    # the search: the baseline is the best architecture by far, but no answer picks it
    truth = truth_table(np.random.default_rng(3), 5, infeasible_frac=0.0)
    truth.loc[truth["arch"] == "a4", ["v", "lo", "hi", "ihi", "t", "sb", "dv", "dhi"]] = 1e3
    for mode in ("exhaustive", "global"):
        s = SearchSettings(patience=2, stop_rule="running_best", mode=mode, prune=True)
        run = simulate(truth, plan, s, pinned=("tpuv4",))
        got, _ = _walk(run.comp, plan, s, run.walk_completed)
        assert len(got) and "a4" not in set(got["arch"])
        # the comparison still gets its ILP
        a4 = run.comp[run.comp["arch"] == "a4"]
        assert (a4["level"] >= 2).all()
    with pytest.raises(PhazeError, match="area budget"):
        make_plan(_space([51.0], ["tpuv4"]), 1.0, 1, 10, ("tpuv4",), 50.0)


def test_plan_rejects_duplicates_and_empty():
    with pytest.raises(PhazeError):
        make_plan(pd.DataFrame({"arch": ["x", "x"], "area_mm2": [1.0, 2.0]}), 0.01, 1, 1)
    with pytest.raises(PhazeError):
        make_plan(pd.DataFrame({"arch": [], "area_mm2": []}), 0.01, 1, 1)


# ---------------------------------------------------------------------------------------------
# the stop test


def test_stop_bucket_upstream_rule_examples():
    # non-increasing over the last 5 bucket bests (4 comparisons)
    assert stop_bucket([10, 9, 8, 7, 6], 5, "bucket_best") == 4
    assert stop_bucket([10, 9, 8, 7], 5, "bucket_best") is None  # needs 5 buckets
    assert stop_bucket([1, 10, 9, 8, 7, 7], 5, "bucket_best") == 5
    assert stop_bucket([10, 1, 2, 3, 4, 5], 5, "bucket_best") is None
    # a bucket with nothing feasible counts as -inf (upstream: -1)
    assert stop_bucket([5, np.nan, np.nan, np.nan, np.nan], 5, "bucket_best") == 4


def test_stop_bucket_running_best_examples():
    # no improvement on the running best over the last 4 buckets
    assert stop_bucket([10, 1, 2, 3, 4], 5, "running_best") == 4
    assert stop_bucket([1, 10, 9, 8, 7], 5, "running_best") is None
    assert stop_bucket([1, 10, 9, 8, 7, 11, 1, 1, 1, 1], 5, "running_best") == 9
    with pytest.raises(PhazeError):
        stop_bucket([1, 2], 1)
    with pytest.raises(PhazeError):
        stop_bucket([1, 2], 5, "nope")


@given(
    st.lists(st.one_of(st.floats(0, 100), st.just(float("nan"))), max_size=25),
    st.integers(2, 6),
    st.sampled_from(["running_best", "bucket_best"]),
)
def test_stop_bucket_matches_definition(values, patience, rule):
    m = [(-np.inf if np.isnan(v) else v) for v in values]
    seq = list(itertools.accumulate(m, max)) if rule == "running_best" else m
    expect = None
    for j in range(len(seq)):
        w = seq[max(0, j - patience + 1) : j + 1]
        if len(w) == patience and all(a >= b for a, b in itertools.pairwise(w)):
            expect = j
            break
    assert stop_bucket(values, patience, rule) == expect


# ---------------------------------------------------------------------------------------------
# exact pruning vs solving every ILP (the area walk; the global search: test_search_global.py)


def _walk(comp, plan, s, upto_round):
    scores = all_scores(comp, MODELS)
    states = walk_states(scores, plan, upto_round, s)
    return walk_answers(scores, plan, states, s), states


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n_archs=st.integers(2, 14),
    k=st.integers(1, 4),
    patience=st.integers(2, 4),
    mode=st.sampled_from(["early_stop", "exhaustive", "global"]),
    deepen=st.booleans(),
)
def test_pruned_walk_equals_solving_every_ilp(seed, n_archs, k, patience, mode, deepen):
    rng = np.random.default_rng(seed)
    truth = truth_table(rng, n_archs)
    presets = ["tpuv4"] + [""] * (n_archs - 1)
    plan = random_plan(rng, n_archs, k, presets)
    s = SearchSettings(
        patience=patience, mode=mode, deepen_node_limit=1000 if deepen else 0, round_archs=2
    )
    run = simulate(truth, plan, s, pinned=("tpuv4",))
    rounds = int(plan["round"].max())
    got, _ = _walk(run.comp, plan, s, run.walk_completed)
    want, _ = _walk(brute(truth, s), plan, s, rounds)
    key = SEARCH_KEY + ["mode"]
    g = got.set_index(key).sort_index()
    w = want.set_index(key).sort_index()
    # identical stop bucket and best score for every search (the relative score's values
    # depend on its reference, the best value known per model: its answer and stop alike)
    assert list(g.index) == list(w.index)
    rel = g.index.get_level_values("common_score") == "relative"
    np.testing.assert_allclose(
        g.loc[~rel, "score"].to_numpy(dtype=float), w.loc[~rel, "score"].to_numpy(dtype=float)
    )
    assert list(g.loc[rel, "arch"].fillna("")) == list(w.loc[rel, "arch"].fillna(""))
    assert (g["last_bucket"] == w["last_bucket"]).all()
    # the reported best value is exactly known (a final-tier value or bounds that meet)
    assert g.loc[g["arch"].notna(), "exact"].all()
    # the certificate over the visited buckets: pruning leaves it unchanged (a pruned arch's
    # bound is below the answer), and no visited arch's optimum schedule beats the answer by more
    np.testing.assert_allclose(
        g["certified_gap"].to_numpy(dtype=float), w["certified_gap"].to_numpy(dtype=float)
    )
    _assert_certificate_holds(got, truth, plan)


def _true_scores(truth: pd.DataFrame) -> pd.DataFrame:
    """The optimum schedules' score per (walk search, arch), Phaze-Common's mean by its
    definition (the relative score ranks alike: test_search_global.py)."""
    pm = truth.assign(strategy="phaze-per-model", common_score="")[SEARCH_KEY + ["arch", "t"]]
    best = (
        truth.groupby(["hbm_capacity_bytes", "devices", "arch", "model"])["t"]
        .max()
        .unstack("model")
    )
    common = best.reindex(columns=MODELS).mean(axis=1, skipna=False).rename("t").reset_index()
    common = common.assign(strategy="phaze-common", common_score="mean", model="*", microbatch=-1)
    return pd.concat([pm, common[SEARCH_KEY + ["arch", "t"]]], ignore_index=True)


def _assert_certificate_holds(ans: pd.DataFrame, truth: pd.DataFrame, plan: pd.DataFrame):
    true = _true_scores(truth).merge(plan[["arch", "bucket"]], on="arch")
    for rec in ans[ans["arch"].notna()].itertuples(index=False):
        if rec.common_score == "relative":
            continue
        sel = true
        for k in SEARCH_KEY:
            sel = sel[sel[k] == getattr(rec, k)]
        top = sel.loc[sel["bucket"] <= rec.last_bucket, "t"].max()
        assert rec.certified_gap >= 0
        assert top <= rec.score * (1 + rec.certified_gap) * (1 + 1e-12), (rec, top)
        # over the whole space (space_gap): every arch, visited or not
        everywhere = sel.loc[sel["bucket"] >= 0, "t"].max()
        assert everywhere <= rec.score * (1 + rec.space_gap) * (1 + 1e-12), (rec, everywhere)


def test_certified_gap_examples_and_the_ilp_bound_tightens_hi():
    gap = lambda bounds, winner: certified_gap(upper_bound(np.array(bounds)), winner)
    assert gap([10.0, 12.0, np.nan], 10.0) == pytest.approx(0.2)
    assert gap([9.0, 8.0], 10.0) == 0.0  # a bound below the winner: 0
    assert gap([np.nan], 10.0) == 0.0  # nothing else feasible
    assert np.isnan(gap([1.0], np.nan))
    place = pd.DataFrame(
        [
            ("m", 2**30, 1, 64, "a", tier, v)
            for tier, v in (("ub", 12.0), ("lo", 9.0), ("ilp", 10.0), ("ilp_ub", 10.5))
        ]
        + [("m", 2**30, 1, 64, "b", t, v) for t, v in (("ub", 11.0), ("lo", 8.0))],
        columns=COMPONENT_KEY + ["tier", "throughput_seq_s"],
    )
    comp = components(place).set_index("arch")
    assert comp.loc["a", "hi"] == 10.5 and comp.loc["b", "hi"] == 11.0
    # an ILP bound looser than the bound tier's leaves the tighter one
    looser = place.assign(
        throughput_seq_s=place["throughput_seq_s"].where(place["tier"] != "ilp_ub", 13.0)
    )
    assert components(looser).set_index("arch").loc["a", "hi"] == 12.0


def test_pruning_saves_ilps_when_bounds_are_tight():
    rng = np.random.default_rng(1)
    truth = truth_table(rng, 30, infeasible_frac=0.0)
    # tight bounds: hi within 1% of v, decreasing with bucket so most archs are dominated
    truth["v"] = 100.0 - truth["arch"].str[1:].astype(int)
    truth["lo"], truth["hi"], truth["sb"] = truth["v"] * 0.999, truth["v"] * 1.001, np.inf
    truth["ihi"] = truth["t"] = truth["dv"] = truth["dhi"] = truth["v"]
    plan = make_plan(
        pd.DataFrame({"arch": [f"a{i}" for i in range(30)], "area_mm2": 300.0 - np.arange(30)}),
        0.01,
        30,
        100,
    )
    pruned = simulate(truth, plan, SearchSettings(mode="exhaustive")).n_ilp
    full = simulate(truth, plan, SearchSettings(mode="exhaustive", prune=False)).n_ilp
    assert full == 30 * len(MODELS) * len(MBS)
    assert pruned < full / 5
    # with the space bounds tight too, a bucket after the first skips even the bound tier of
    # the archs the bounds already settle (one bucket per round)
    truth["sb"] = truth["hi"]
    one = plan.assign(round=plan["bucket"])
    bound = simulate(truth, one, SearchSettings(mode="exhaustive")).n_bound
    assert bound == len(MODELS) * len(MBS)  # the first arch only


def test_bucket_best_rule_disables_pruning():
    assert not SearchSettings(stop_rule="bucket_best").pruning
    assert SearchSettings().pruning


def test_common_score_is_mean_of_per_model_best_and_drops_infeasible():
    place = pd.DataFrame(
        [
            {
                "model": m,
                "hbm_capacity_bytes": 1,
                "microbatch": b,
                "devices": 8,
                "arch": a,
                "tier": "ilp",
                "throughput_seq_s": t,
                "feasible": not np.isnan(t),
            }
            for m, b, a, t in [
                ("m1", 1, "x", 4.0),
                ("m1", 2, "x", 6.0),
                ("m2", 1, "x", 2.0),
                ("m2", 2, "x", 1.0),
                ("m1", 1, "y", 9.0),
                ("m2", 1, "y", np.nan),
                ("m2", 2, "y", np.nan),
            ]
        ]
    )
    comp = components(place)
    sc = all_scores(comp, ["m1", "m2"])
    common = sc[sc["strategy"] == "phaze-common"].set_index(["common_score", "arch"])
    assert common.loc[("mean", "x"), "ach"] == pytest.approx((6.0 + 2.0) / 2)
    assert np.isnan(common.loc[("mean", "y"), "ach"])
    # relative: each model against its best known value (m1: 9 on y, m2: 2 on x)
    assert common.loc[("relative", "x"), "ach"] == pytest.approx(np.sqrt(6.0 / 9.0 * 2.0 / 2.0))
    assert np.isnan(common.loc[("relative", "y"), "ach"])


def test_bucket_best_uses_achievable_max():
    got = bucket_best(np.zeros(3, int), np.array([0, 0, 2]), np.array([1.0, 3.0, 2.0]), 1, 3)
    assert got.tolist() == [[3.0, -np.inf, 2.0]]


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2), st.integers(0, 5), st.one_of(st.floats(0, 9), st.just(np.nan))
        ),
        max_size=30,
    ),
    st.integers(0, 6),
)
def test_bucket_best_is_each_searchs_max_per_bucket(rows, n_buckets):
    g = np.array([r[0] for r in rows], dtype=int)
    b = np.array([r[1] for r in rows], dtype=int)
    a = np.array([r[2] for r in rows], dtype=float)
    got = bucket_best(g, b, a, 3, n_buckets)
    for gi in range(3):
        for j in range(n_buckets):
            vals = [x for x, gg, bb in zip(a, g, b, strict=True) if gg == gi and bb == j]
            vals = [x for x in vals if not np.isnan(x)]
            assert got[gi, j] == (max(vals) if vals else -np.inf)


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_plan_and_errors(tmp_path, capsys, space_table):
    from phaze.cli import main
    from phaze.io import read_table, write_table

    space = space_table(
        ["a", "b", "c"],
        n_tc=1,
        n_vc=1,
        tc_width=2,
        tc_depth=2,
        vc_width=2,
        glb_bytes=2**21,
        area_mm2=[3.0, 2.0, 1.0],
        peak_flops=1e12,
        preset=["", "", "tpuv4"],
    )
    write_table(space, tmp_path / "space.parquet", "space")
    assert (
        main(
            [
                "search",
                "plan",
                "--space",
                str(tmp_path / "space.parquet"),
                "--out",
                str(tmp_path / "chunks.parquet"),
            ]
        )
        == 0
    )
    plan = read_table(tmp_path / "chunks.parquet", "chunks")
    assert list(plan.sort_values("bucket")["arch"]) == ["a", "b", "c"]
    assert plan.set_index("arch").loc["c", "round"] == 0  # the pinned baseline
    # no placement results: a clear error, exit code 2
    empty = tmp_path / "empty.json"
    empty.write_text('{"place": []}')
    assert (
        main(
            [
                "search",
                "summarize",
                "--plan",
                str(tmp_path / "chunks.parquet"),
                "--space",
                str(tmp_path / "space.parquet"),
                "--manifest",
                str(empty),
                "--state",
                str(tmp_path / "state.json"),
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "no placement files" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    entry = {"model": "m", "microbatch": 1, "round": 0, "tier": "ub"}
    missing.write_text(json.dumps({"place": [{"path": str(tmp_path / "nope.parquet"), **entry}]}))
    select = ["search", "select", "--plan", str(tmp_path / "chunks.parquet"), "--round", "0"]
    assert main([*select, "--manifest", str(missing), "--out-dir", str(tmp_path / "r0")]) == 2
    assert "not found" in capsys.readouterr().err
    # no space bounds: nothing to search over
    assert main([*select, "--manifest", str(empty), "--out-dir", str(tmp_path / "r0")]) == 2
    assert "no space bounds" in capsys.readouterr().err


def test_batch_runs_commands_in_process_and_stops_at_failure(tmp_path, capsys):
    from phaze.cli import main

    space = tmp_path / "space.parquet"
    ok = f"search plan --space {space} --out {tmp_path / 'x.parquet'}"
    assert main(["search", "batch", ok]) == 2  # space missing: the first command fails
    assert "not found" in capsys.readouterr().err
    assert main(["search", "batch", "search batch 'x'"]) == 2


# ---------------------------------------------------------------------------------------------
# placement-blind baseline


def test_single_accelerator_latency_counts_layers_and_takes_faster_core_choice():
    from phaze.search.baselines import placement_blind_choice, single_accelerator_latency

    lat = pd.DataFrame(
        [
            # arch, signature, pass, op, 1-core, all-cores
            ("x", "emb", "fwd", 0, 1.0, 0.5),
            ("x", "blk", "fwd", 0, 2.0, 3.0),
            ("x", "blk", "bwd", 0, 4.0, 1.0),
            ("x", "head", "fwd", 0, 1.0, 1.0),
            ("y", "emb", "fwd", 0, 0.1, 0.1),
            ("y", "blk", "fwd", 0, 1.0, 1.0),
            ("y", "blk", "bwd", 0, 1.0, 1.0),
            ("y", "head", "fwd", 0, 9.0, 9.0),
        ],
        columns=["arch", "signature", "pass", "op", "latency_1core_s", "latency_allcores_s"],
    )
    layers = pd.DataFrame(
        {
            "layer": ["embedding", "block.0", "block.1", "block.2", "head"],
            "signature": ["emb", "blk", "blk", "blk", "head"],
        }
    )
    got = single_accelerator_latency(lat, layers).set_index("arch")["latency_s"]
    assert got["x"] == pytest.approx(0.5 + 3 * (2.0 + 1.0) + 1.0)
    assert got["y"] == pytest.approx(0.1 + 3 * 2.0 + 9.0)
    space = pd.DataFrame({"arch": ["x", "y"], "area_mm2": [1.0, 2.0]})
    assert placement_blind_choice(got.reset_index(), space)["arch"].item() == "x"
    with pytest.raises(PhazeError):
        single_accelerator_latency(lat[lat["signature"] != "head"], layers)
