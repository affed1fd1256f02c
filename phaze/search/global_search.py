"""The global search: the best architecture of the whole space, certified over every architecture,
and the certified area–throughput front.

One global search per Phaze-Per-Model setting (model × HBM × cluster size, the best over
microbatch, tensor-parallel width and placement) and per Phaze-Common setting (HBM × cluster size
× common score). Every architecture of the space has a proven upper bound ``hi`` on its score
from the first round on (the space bound, then whatever tier it has been refined to); the best
achievable score known is the incumbent ``W``.

*Certificate*: ``certified_gap = max(0, max over every arch of the space of hi / W − 1)``. No
architecture — refined, pruned or never refined — can beat the answer by more than it, whatever
its optimum schedules are: each ``hi`` is a proven upper bound on that arch's best score.

*Front*: with ``F(x)`` the best achievable score among refined archs of area ≤ x, the front is
the refined archs no other refined arch beats in both area and score; its certificate is
``max over every arch a of hi(a) / F(area(a)) − 1``: no architecture beats the front at its own
area (or less) by more than that. Each front point carries its own certificate, over the archs
of area at most its own.

*Refinement*, best-first: an arch is *open* when ``hi > W·(1 + search.gap)`` (the certificate) or
``hi > F(area)·(1 + search.front_gap)`` (the front; ``front_gap: null``: never) and it can still
be refined (a component not yet at the final tier, or with ``search.certify_split_nodes``, one at
the final tier the certify solve has not taken yet). Each round refines, per search, the
``search.round_archs`` open archs with the largest ``hi`` (certificate) and the same number from
the optimistic front of the archs open for the front (those with the largest ``hi / F`` that no
other open arch dominates in area and bound), archs that no open arch dominates as hardware
(docs/search.md, "Dominance") first; a component of an open arch is refined when its own bound
can matter: above the search's threshold (per model), or above its model's best value on that
arch by more than the gap (common). The search ends when nothing is open: every certificate is
then at most its gap, or stuck at an arch whose final tier leaves its bounds apart (reported).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.search.scores import (
    COMMON_SCORES,
    VALUE_COLUMNS,
    SearchSettings,
    aggregate,
    certified_gap,
    model_references,
    model_values,
)

GLOBAL_KEY = ["strategy", "common_score", "model", "hbm_capacity_bytes", "devices"]
PER_MODEL = "phaze-per-model"
COMMON = "phaze-common"


def global_values(
    comp: pd.DataFrame,
    models: list[str],
    kinds=COMMON_SCORES,
    refs: dict | None = None,
    values: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every global search's values per arch: ``GLOBAL_KEY`` + arch + ``VALUE_COLUMNS``
    (``values``: :func:`phaze.search.scores.model_values` of ``comp``, if computed)."""
    values = model_values(comp) if values is None else values
    refs = model_references(comp) if refs is None else refs
    pm = values.assign(strategy=PER_MODEL, common_score="")
    frames = [pm]
    for kind in kinds:
        c = aggregate(values, models, kind, refs)
        frames.append(c.assign(strategy=COMMON, common_score=kind, model="*"))
    out = pd.concat(frames, ignore_index=True)
    return out[GLOBAL_KEY + ["arch", *VALUE_COLUMNS]]


def _front_levels(area: np.ndarray, ach: np.ndarray) -> np.ndarray:
    """F(area_i): the best of ``ach`` (NaN = not refined / infeasible) over archs of area ≤
    area_i; −inf where none."""
    order = np.argsort(area, kind="stable")
    a, v = area[order], np.where(np.isnan(ach[order]), -np.inf, ach[order])
    run = np.maximum.accumulate(v) if len(v) else v
    # ties in area: every arch of one area sees the whole group
    last = np.searchsorted(a, a, side="right") - 1
    out = np.empty_like(run)
    out[order] = run[last]
    return out


def front_points(area: np.ndarray, ach: np.ndarray) -> np.ndarray:
    """Indices of the refined archs no other refined arch beats in both area (≤) and score (≥,
    one of them strictly): the Pareto front, smallest area first. Ties in both: the first in
    input order."""
    ok = np.flatnonzero(~np.isnan(ach))
    order = ok[np.lexsort((ok, -ach[ok], area[ok]))]
    out, best = [], -np.inf
    for i in order:
        if ach[i] > best:
            out.append(i)
            best = ach[i]
    return np.asarray(out, dtype=np.int64)


def search_state(grp: pd.DataFrame, area: pd.Series, settings: SearchSettings) -> dict:
    """One global search's answer, certificates and per-arch thresholds.

    ``grp`` holds the search's values per arch (every arch of the space); ``area`` maps arch ->
    area. Returns a dict: ``winner`` (arch or None), ``score``, ``exact``, ``upper_bound``,
    ``certified_gap``, ``front`` (indices into grp), ``front_gap``, and arrays over grp's rows:
    ``threshold`` (the score an arch's ``hi`` must not exceed), ``above_gap`` / ``above_front``
    (which condition it violates), ``ratio`` (hi / F), ``F`` (the front level at its area)."""
    hi = grp["hi"].to_numpy(dtype=float)
    ach = grp["ach"].to_numpy(dtype=float)
    a = grp["arch"].map(area).to_numpy(dtype=float)
    out: dict = {"winner": None, "score": np.nan, "exact": False}
    ok = np.flatnonzero(~np.isnan(ach))
    if len(ok):
        # the best score; ties: the smaller area (the cheaper chip), then the arch id
        i = ok[np.lexsort((grp["arch"].to_numpy()[ok], a[ok], -ach[ok]))[0]]
        out.update(
            winner=grp["arch"].iloc[i], score=float(ach[i]), exact=bool(grp["exact"].iloc[i])
        )
    top = float(np.nanmax(hi)) if np.any(~np.isnan(hi)) else np.nan
    w = out["score"]
    out["upper_bound"] = top
    out["certified_gap"] = certified_gap(top, w)
    F = _front_levels(a, ach)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isnan(hi), 0.0, hi / F)
    ratio = np.where(np.isnan(hi), 0.0, np.where(F > 0, ratio, np.inf))
    out["F"] = F
    out["front"] = front_points(a, ach)
    out["front_gap"] = max(0.0, float(ratio.max()) - 1.0) if len(ratio) else np.nan
    w_thr = w * (1 + settings.gap) if np.isfinite(w) else -np.inf
    if settings.front_gap is None:  # the front is reported, not refined for
        f_thr = np.full(len(F), np.inf)
    else:
        f_thr = np.where(F > -np.inf, F * (1 + settings.front_gap), -np.inf)
    feasible = ~np.isnan(hi)
    out["above_gap"] = feasible & (hi > w_thr)
    out["above_front"] = feasible & (hi > f_thr)
    out["threshold"] = np.minimum(w_thr, f_thr)
    out["ratio"] = ratio
    return out


def global_states(
    values: pd.DataFrame, area: pd.Series, settings: SearchSettings, comp: pd.DataFrame
):
    """(states, detail): one row per global search (answer, certificates, how many archs are
    open or stuck), and one per (search, arch) with its threshold and whether it is above it
    (``above_gap`` / ``above_front``) and can still be refined (``open_gap`` / ``open_front``:
    it has an open component, :func:`open_components`, found by :func:`can_refine` without
    listing them)."""
    details = []
    answers = {}
    for key, grp in values.groupby(GLOBAL_KEY, sort=True):
        grp = grp.reset_index(drop=True)
        s = search_state(grp, area, settings)
        d = grp[GLOBAL_KEY + ["arch", "hi", "ach", "level", "exact", "led"]].copy()
        d["threshold"] = s["threshold"]
        d["above_gap"] = s["above_gap"]
        d["above_front"] = s["above_front"]
        d["ratio"] = s["ratio"]
        d["front_level"] = s["F"]
        details.append(d)
        answers[key] = s
    detail = pd.concat(details, ignore_index=True) if details else pd.DataFrame()
    if len(detail):
        can = can_refine(comp, detail, settings)
        detail["open_gap"] = detail["above_gap"].to_numpy(bool) & can
        detail["open_front"] = detail["above_front"].to_numpy(bool) & can
    counts = {}
    if len(detail):
        flags = pd.DataFrame(
            {
                "open_gap": detail["open_gap"],
                "open_front": detail["open_front"] & ~detail["open_gap"],
                "stuck_gap": detail["above_gap"] & ~detail["open_gap"],
                "stuck_front": detail["above_front"] & ~detail["above_gap"] & ~detail["open_front"],
            }
        )
        counts = flags.groupby([detail[k] for k in GLOBAL_KEY], sort=False).sum()
        counts = {k: tuple(int(x) for x in v) for k, v in zip(counts.index, counts.to_numpy())}
    rows = []
    for key, s in answers.items():
        rows.append(
            (
                *key,
                s["winner"],
                s["score"],
                s["exact"],
                s["upper_bound"],
                s["certified_gap"],
                s["front_gap"],
                len(s["front"]),
                *counts.get(key, (0, 0, 0, 0)),
            )
        )
    cols = GLOBAL_KEY + [
        "arch",
        "score",
        "exact",
        "upper_bound",
        "certified_gap",
        "front_gap",
        "front_points",
        "open_gap",
        "open_front",
        "stuck_gap",
        "stuck_front",
    ]
    return pd.DataFrame(rows, columns=cols), detail


def _optimistic_front(area: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Indices no other index dominates in (area ≤, hi ≥): the archs whose refinement can move
    the front."""
    order = np.lexsort((-hi, area))
    keep, best = [], -np.inf
    for i in order:
        if hi[i] > best:
            keep.append(i)
            best = hi[i]
    return np.asarray(keep, dtype=np.int64)


def awaiting_certify(comp: pd.DataFrame, settings: SearchSettings) -> np.ndarray:
    """Which components are at the final tier and not yet taken by the certify solve (none
    without one configured)."""
    if not settings.certifies:
        return np.zeros(len(comp), dtype=bool)
    at_final = comp["level"].to_numpy() >= settings.final_level
    return at_final & ~comp["has_certify"].to_numpy(bool)


def refinable(comp: pd.DataFrame, settings: SearchSettings) -> np.ndarray:
    """Which components more work can still tighten: those not yet exact (at the final tier,
    bounds met, or infeasible), and those :func:`awaiting_certify` (the split may raise their
    proven bound)."""
    return ~comp["exact"].to_numpy(bool) | awaiting_certify(comp, settings)


def _live(comp: pd.DataFrame, settings: SearchSettings) -> pd.DataFrame:
    """The components more work can tighten and that something fits (``hi`` not NaN)."""
    return comp[refinable(comp, settings) & ~np.isnan(comp["hi"].to_numpy(float))]


def _common_factor(rows: pd.DataFrame, settings: SearchSettings) -> np.ndarray:
    """Per common-search detail row: the factor over its model's best value on the arch that a
    component's bound must exceed (``1 + gap`` above the certificate's threshold, else
    ``1 + front_gap``)."""
    return np.where(rows["above_gap"], 1 + settings.gap, 1 + (settings.front_gap or 0.0))


#: a model's values on an arch (the best over microbatch): the key a common search compares on
MODEL_ARCH = ["model", "hbm_capacity_bytes", "devices", "arch"]


def _model_best(comp: pd.DataFrame, keys: pd.MultiIndex) -> np.ndarray:
    """Per ``keys`` (``MODEL_ARCH``): the model's best achievable value on the arch, −inf where
    none is known (a common search's reference for that model's components)."""
    best = comp.groupby(MODEL_ARCH, observed=True)["ach"].max()
    ref = best.reindex(keys).to_numpy(dtype=float)
    return np.where(np.isnan(ref), -np.inf, ref)


def _model_arch_maxima(comp: pd.DataFrame, settings: SearchSettings):
    """Per ``MODEL_ARCH`` group of ``comp`` (index): the largest ``hi`` of its live components
    (:func:`_live`; NaN where none) and the model's best achievable value on the arch (−inf where
    none is known: a common search's reference for that model's components). One grouping of
    every component, no copy of them."""
    grouper = comp.groupby(MODEL_ARCH, sort=False, observed=True)
    gid = grouper.ngroup().to_numpy()
    keys = grouper.size().index
    hi = comp["hi"].to_numpy(float)
    live = refinable(comp, settings) & ~np.isnan(hi)
    top = np.full(len(keys), np.nan)
    np.fmax.at(top, gid[live], hi[live])
    best = np.full(len(keys), np.nan)
    np.fmax.at(best, gid, comp["ach"].to_numpy(float))
    return pd.Series(top, index=keys), np.where(np.isnan(best), -np.inf, best)


def can_refine(comp: pd.DataFrame, detail: pd.DataFrame, settings: SearchSettings) -> np.ndarray:
    """Per row of ``detail``: whether :func:`open_components` would list a component for it,
    from per-group maxima instead of the (search, component) pairs (which number several
    times the components in the first rounds, when every arch is above its threshold).

    A per-model row has one iff the largest ``hi`` of its live components exceeds its
    threshold; a common row iff, for some model, the largest ``hi`` of that model's live
    components on the arch exceeds the model's best value there times the row's factor — the
    same comparisons, on the maxima."""
    can = np.zeros(len(detail), dtype=bool)
    above = (detail["above_gap"] | detail["above_front"]).to_numpy(bool)
    if not above.any() or not len(comp):
        return can
    top, ref = _model_arch_maxima(comp, settings)
    pm = above & (detail["strategy"] == PER_MODEL).to_numpy(bool)
    if pm.any():
        rows = detail.loc[pm, MODEL_ARCH + ["threshold"]]
        m = top.reindex(pd.MultiIndex.from_frame(rows[MODEL_ARCH])).to_numpy(float)
        with np.errstate(invalid="ignore"):
            can[pm] = m > rows["threshold"].to_numpy(float)
    cm = above & (detail["strategy"] == COMMON).to_numpy(bool)
    if cm.any():
        rows = detail.loc[cm, ["hbm_capacity_bytes", "devices", "arch", "above_gap"]]
        factor = _common_factor(rows, settings)
        akey = ["hbm_capacity_bytes", "devices", "arch"]
        at = top.index.droplevel("model")
        out = np.zeros(len(rows), dtype=bool)
        for f in np.unique(factor):
            need = pd.Series(top.to_numpy(float) > ref * f, index=at)
            anym = need.groupby(level=akey, sort=False).any()
            got = anym.reindex(pd.MultiIndex.from_frame(rows[akey])).to_numpy()
            mine = factor == f
            out[mine] = pd.array(got[mine], dtype="boolean").fillna(False).to_numpy(bool)
        can[cm] = out
    return can


def open_components(
    comp: pd.DataFrame, detail: pd.DataFrame, settings: SearchSettings
) -> pd.DataFrame:
    """The components whose bounds can still matter to an arch above its search's threshold:
    those more work can tighten (:func:`refinable`). A per-model search's component
    matters when its ``hi`` exceeds the arch's threshold; a common search's when it exceeds its
    model's best value on that arch by more than the gap (if no model's does, the arch's common
    bound is within the gap of its own score, itself at most the incumbent). Columns: the search
    key, arch, ``comp_model`` and microbatch of the component."""
    cols = GLOBAL_KEY + ["arch", "comp_model", "microbatch"]
    above = detail[detail["above_gap"] | detail["above_front"]]
    # a row's components and its models' best values are its arch's: nothing else is read
    comp = comp[comp["arch"].isin(above["arch"].unique())]
    live = _live(comp, settings)
    out = []
    pm = above[above["strategy"] == PER_MODEL]
    if len(pm) and len(live):
        j = live[["model", "hbm_capacity_bytes", "devices", "arch", "microbatch", "hi"]].merge(
            pm[GLOBAL_KEY + ["arch", "threshold"]],
            on=["model", "hbm_capacity_bytes", "devices", "arch"],
        )
        j = j[j["hi"].to_numpy(float) > j["threshold"].to_numpy(float)]
        out.append(j.assign(comp_model=j["model"])[cols])
    cm = above[above["strategy"] == COMMON]
    if len(cm) and len(live):
        cm = cm.assign(factor=_common_factor(cm, settings))[GLOBAL_KEY + ["arch", "factor"]]
        j = live[["model", "hbm_capacity_bytes", "devices", "arch", "microbatch", "hi"]].rename(
            columns={"model": "comp_model"}
        )
        j = j.merge(cm, on=["hbm_capacity_bytes", "devices", "arch"])
        key = pd.MultiIndex.from_arrays(
            [j["comp_model"], j["hbm_capacity_bytes"], j["devices"], j["arch"]]
        )
        ref = _model_best(comp, key)
        need = j["hi"].to_numpy(float) > ref * j["factor"].to_numpy(float)
        out.append(j.loc[need, cols])
    if not out:
        return pd.DataFrame(columns=cols)
    return pd.concat(out, ignore_index=True).reset_index(drop=True)


def _leaders(g: pd.DataFrame, ups: pd.DataFrame | None) -> pd.DataFrame:
    """The rows of ``g`` (open archs of one search) that no other open arch of ``g`` dominates
    and whose bound is their own, if any; else all of ``g``. A dominating arch's bound caps its
    dominated archs' (docs/search.md, "Dominance"): refining it first can settle them without
    refining them, and a ``led`` arch's bound is a dominating arch's already. ``ups``: the
    search's steps (arch, up)."""
    own = g[~g["led"].to_numpy(bool)]
    if ups is not None and len(ups) and len(own):
        above = ups[ups["up"].isin(set(g["arch"]))]
        own = own[~own["arch"].isin(set(above["arch"]))]
    return own if len(own) else g


def chosen_archs(
    detail: pd.DataFrame, area: pd.Series, k: int, ups: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per search, the open archs to refine this round: the ``k`` with the largest ``hi`` among
    those open for the certificate, and the ``k`` with the largest hi / F on the optimistic
    front of those open for the front only (archs no open arch dominates, with their own
    bound, first: :func:`_leaders`; ``ups``: :func:`phaze.search.dominance.scope_edges`).
    Columns: search key, arch, reason."""
    picked = []
    for key, grp in detail.groupby(GLOBAL_KEY, sort=False):
        mine = None
        if ups is not None and len(ups):
            mine = ups[ups["scope"] == key[GLOBAL_KEY.index("model")]]
        g = _leaders(grp[grp["open_gap"]], mine)
        if len(g):
            top = g.sort_values(["hi", "arch"], ascending=[False, True]).head(k)
            picked.append(top.assign(reason="gap"))
        f = _leaders(grp[grp["open_front"] & ~grp["open_gap"]], mine)
        if len(f):
            a = f["arch"].map(area).to_numpy(float)
            idx = _optimistic_front(a, f["hi"].to_numpy(float))
            # the largest hi / F first; where no refined arch is as small (F undefined), the
            # smallest area first: it sets the front's level for every larger one
            cand = f.iloc[idx].assign(_area=a[idx])
            cand = cand.sort_values(["ratio", "_area", "arch"], ascending=[False, True, True])
            picked.append(cand.head(k).drop(columns="_area").assign(reason="front"))
    cols = GLOBAL_KEY + ["arch", "reason"]
    if not picked:
        return pd.DataFrame(columns=cols)
    return pd.concat(picked, ignore_index=True)[cols]


def front_table(values: pd.DataFrame, area: pd.Series) -> pd.DataFrame:
    """Every global search's front: its points (smallest area first) with their score, upper
    bound and certificate (over the archs of area at most the point's)."""
    rows = []
    for key, grp in values.groupby(GLOBAL_KEY, sort=True):
        grp = grp.reset_index(drop=True)
        a = grp["arch"].map(area).to_numpy(dtype=float)
        hi = grp["hi"].to_numpy(dtype=float)
        ach = grp["ach"].to_numpy(dtype=float)
        order = np.argsort(a, kind="stable")
        run = np.fmax.accumulate(np.where(np.isnan(hi[order]), -np.inf, hi[order]))
        for i in front_points(a, ach):
            upto = np.searchsorted(a[order], a[i], side="right") - 1
            top = float(run[upto]) if upto >= 0 else np.nan
            rows.append(
                (
                    *key,
                    grp["arch"].iloc[i],
                    a[i],
                    float(ach[i]),
                    float(hi[i]),
                    bool(grp["exact"].iloc[i]),
                    certified_gap(top, float(ach[i])),
                )
            )
    cols = GLOBAL_KEY + [
        "arch",
        "area_mm2",
        "throughput_seq_s",
        "throughput_upper_seq_s",
        "exact",
        "certified_gap",
    ]
    return pd.DataFrame(rows, columns=cols)
