"""The area-ordered walk: upstream's search, with its early stop and exact pruning.

Upstream visits architectures in area buckets, the largest first, and stops once the best score
stopped improving (:mod:`phaze.search.stop`). The workflow visits ``search.round_buckets``
buckets per round (``round`` in the plan, :mod:`phaze.search.plan`). One walk search per model ×
HBM × microbatch × cluster size (Phaze-Per-Model) and per HBM × cluster size × common score
(Phaze-Common), as upstream runs one search per outer setting. ``search.mode: early_stop`` is
this walk alone; ``exhaustive`` walks every bucket; ``global`` runs it beside the global search
(:mod:`phaze.search.global_search`) and reports its answer too, from the same tables.

Exact pruning
-------------
For an arch in bucket j, let ``B_{≤j}`` be the best *achievable* score among architectures in
buckets 0…j computed so far. The arch needs refining only if its upper bound ``hi > B_{≤j}``:
otherwise it can neither beat the answer nor change the running best ``R_j`` the stop test
reads. The arch attaining ``B`` is itself either refined (``hi > B``) or already exact, so the
reported best is always a final-tier (or bound-tight) value: the answer and the stop point equal
those of solving every architecture at the final tier. The space bound (tier ``space``) lets an
arch skip even the bound tier when ``hi ≤ B`` is known before its bucket is visited; the bound
tier's and the ILP tier's values tighten ``hi`` and raise ``B`` in turn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from phaze.errors import PhazeError
from phaze.search.scores import SEARCH_KEY, SearchSettings, certified_gap, upper_bound
from phaze.search.stop import stop_bucket

PLAN_COLUMNS = ["arch", "bucket", "round", "area_mm2", "preset"]


def plan_positions(scores: pd.DataFrame, plan: pd.DataFrame) -> np.ndarray:
    """Each score row's position in the plan (by arch; no merge: the scores may hold every
    component of the space). Looked up in Arrow: pandas' ``get_indexer`` on the string column
    holds a transient of ~85 B per row."""
    value_set = pa.array(plan["arch"].reset_index(drop=True), type=pa.string())
    arch = pa.array(scores["arch"].reset_index(drop=True), type=pa.string())
    at = pc.index_in(arch, value_set=value_set).fill_null(-1).to_numpy().astype(np.int64)
    if (at < 0).any():
        raise PhazeError("placement results hold archs that are not in the search plan")
    return at


def with_plan(
    scores: pd.DataFrame,
    plan: pd.DataFrame,
    columns: list[str] | None = None,
    upto_round: int | None = None,
) -> pd.DataFrame:
    """Scores (``columns`` of them, default all) with each arch's bucket, round, area and
    preset; baselines outside the area budget (bucket −1: computed for the comparison, never
    searched) dropped, and with ``upto_round`` the archs of later plan rounds too (both before
    any copy). The index is each kept row's position in ``scores``."""
    at = plan_positions(scores, plan)
    keep = plan["bucket"].to_numpy()[at] >= 0
    if upto_round is not None:
        keep &= plan["round"].to_numpy()[at] <= upto_round
    at = at[keep]
    df = scores.loc[keep, list(scores.columns) if columns is None else columns]
    df = df.set_axis(np.flatnonzero(keep))
    for col in PLAN_COLUMNS[1:]:
        df[col] = plan[col].to_numpy()[at]
    return df


def complete_buckets(plan: pd.DataFrame, upto_round: int) -> int:
    """Number of leading buckets whose every arch the walk has visited by round ``upto_round``."""
    last_round = plan[plan["bucket"] >= 0].groupby("bucket")["round"].max().sort_index()
    done = (last_round <= upto_round).to_numpy()
    return int(len(done) if done.all() else np.argmin(done))


def bucket_best(
    group: np.ndarray, bucket: np.ndarray, ach: np.ndarray, n_groups: int, n_buckets: int
) -> np.ndarray:
    """m_j per search: ``[g, j]`` the best achievable score (``ach``, NaN = none) of search
    ``g``'s rows in bucket ``j``, for the first ``n_buckets`` buckets; −inf where none."""
    best = np.full((n_groups, n_buckets), -np.inf)
    ok = (bucket < n_buckets) & ~np.isnan(ach)
    np.maximum.at(best, (group[ok], bucket[ok]), ach[ok])
    return best


def walk_states(
    scores: pd.DataFrame, plan: pd.DataFrame, upto_round: int, settings: SearchSettings
) -> pd.DataFrame:
    """One row per walk search: ``stop_bucket`` (−1 while running), ``buckets_done``, and whether
    it still walks after ``upto_round`` (``running``). ``upto_round`` = −1: before the walk."""
    bucket = plan["bucket"].to_numpy()[plan_positions(scores, plan)]
    inside = bucket >= 0
    nb = complete_buckets(plan, upto_round) if upto_round >= 0 else 0
    total = int(plan["bucket"].max()) + 1
    # every search's best per complete bucket in one pass over the rows
    groups = scores.loc[inside, SEARCH_KEY].groupby(SEARCH_KEY, sort=True)
    searches = groups.size().index
    ach = scores["ach"].to_numpy(float)[inside]
    best = bucket_best(groups.ngroup().to_numpy(), bucket[inside], ach, len(searches), nb)
    rows = []
    for i, key in enumerate(searches):
        j = stop_bucket(best[i], settings.patience, settings.stop_rule)
        stopped = j is not None
        running = nb < total and (not settings.walk_stops or not stopped)
        rows.append((*key, -1 if j is None else j, nb, running))
    return pd.DataFrame(rows, columns=SEARCH_KEY + ["stop_bucket", "buckets_done", "running"])


def _thresholds(grp: pd.DataFrame, settings: SearchSettings) -> np.ndarray:
    """B_{≤j} per row of one search's table (bucket j of each row), −inf without pruning."""
    if not settings.pruning:
        return np.full(len(grp), -np.inf)
    ach = grp["ach"].fillna(-np.inf).to_numpy()
    per_bucket = pd.Series(ach).groupby(grp["bucket"].to_numpy()).max().sort_index()
    return per_bucket.cummax().reindex(grp["bucket"].to_numpy()).to_numpy()


def walk_needs(
    scores: pd.DataFrame,
    plan: pd.DataFrame,
    round_: int,
    settings: SearchSettings,
    states: pd.DataFrame | None,
) -> pd.DataFrame:
    """The archs of round ``round_``'s buckets each running walk search must know better:
    ``hi > B_{≤j}`` and not exact. Before the round's bound tier (``scores`` of the rounds
    before) it names the archs to refine; after it, those that need the ILP (or the deep
    tier). ``states``: :func:`walk_states` after round ``round_ − 1`` (None: before round 0).
    Rows: search key, arch, bucket, hi, threshold."""
    cols = SEARCH_KEY + ["arch", "bucket", "hi", "threshold"]
    df = with_plan(scores, plan, SEARCH_KEY + ["arch", "hi", "ach", "exact"], upto_round=round_)
    if states is not None and len(states):
        live = states[states["running"]][SEARCH_KEY]
        df = df.merge(live, on=SEARCH_KEY, how="inner")
    picked = []
    for _, grp in df.groupby(SEARCH_KEY, sort=False):
        grp = grp.sort_values("bucket")
        thr = _thresholds(grp, settings)
        cur = (grp["round"] == round_).to_numpy()
        hi = grp["hi"].to_numpy(dtype=float)
        # hi NaN = infeasible under any latencies: never worth refining
        need = cur & ~grp["exact"].to_numpy(bool) & ~np.isnan(hi) & (hi > thr)
        sel = grp[need].copy()
        sel["threshold"] = thr[need]
        picked.append(sel)
    if not picked:
        return pd.DataFrame(columns=cols)
    return pd.concat(picked, ignore_index=True)[cols]


def walk_answers(
    scores: pd.DataFrame, plan: pd.DataFrame, states: pd.DataFrame, settings: SearchSettings
) -> pd.DataFrame:
    """The walk's answer per search: the arch with the best achievable score in the buckets it
    visited (up to its stop bucket, or every complete bucket); mode ``early_stop``, or
    ``exhaustive`` in that mode. ``certified_gap`` is over the visited buckets (upstream's
    question); ``space_gap`` over the whole space (every arch's proven upper bound)."""
    df = with_plan(scores, plan)
    mode = "exhaustive" if settings.mode == "exhaustive" else "early_stop"
    out = []
    st = states.set_index(SEARCH_KEY)
    for key, grp in df.groupby(SEARCH_KEY, sort=True):
        s = st.loc[key]
        done = int(s["buckets_done"])
        stop = int(s["stop_bucket"])
        last = stop if stop >= 0 and settings.walk_stops else done - 1
        seen = grp[grp["bucket"] <= last]
        vis = seen[seen["ach"].notna()]
        space_top = upper_bound(grp["hi"].to_numpy(dtype=float))
        if vis.empty:
            out.append(
                (
                    *key,
                    mode,
                    None,
                    np.nan,
                    False,
                    last,
                    len(seen),
                    np.nan,
                    np.nan,
                    space_top,
                    np.nan,
                )
            )
            continue
        best = vis.sort_values(["ach", "bucket", "arch"], ascending=[False, True, True]).iloc[0]
        top = upper_bound(seen["hi"].to_numpy(dtype=float))
        w = float(best["ach"])
        out.append(
            (
                *key,
                mode,
                best["arch"],
                w,
                bool(best["exact"]),
                last,
                len(seen),
                top,
                certified_gap(top, w),
                space_top,
                certified_gap(space_top, w),
            )
        )
    cols = [
        "mode",
        "arch",
        "score",
        "exact",
        "last_bucket",
        "archs_visited",
        "upper_bound",
        "certified_gap",
        "space_upper_bound",
        "space_gap",
    ]
    return pd.DataFrame(out, columns=SEARCH_KEY + cols)
