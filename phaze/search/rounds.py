"""What each search round computes: the components to refine, then those given the ILP.

A round (one set of Snakemake checkpoints) refines a set of components (model, microbatch, arch):

1. ``select``: from everything known before the round (the space bounds and every earlier
   round's placements), the components to bring to the bound tier (list schedules and the
   schedule stage's lower bounds, then placement on both): what the area-ordered walk needs in
   this round's buckets (:mod:`phaze.search.walk`), what the global search's best-first
   refinement picks (:mod:`phaze.search.global_search`, mode ``global``), and in round 0 the
   pinned baselines. A component selected again (the walk reaching an arch the global search had
   refined without the ILP, or a deep tier for one solved before) repeats the bound tier, so that
   the round's ILP jobs read the round's own tables.
2. ``ilp`` (and ``deep``): among the round's components, those whose bounds still matter after
   the bound tier (respectively after the ILP tier) under the same rules — no per-round limit —
   and the pinned baselines.

The round loop ends when ``select`` finds nothing: every walk has stopped (or walked every
bucket) and nothing is open for the global search.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.search.global_search import (
    COMMON,
    GLOBAL_KEY,
    awaiting_certify,
    chosen_archs,
    global_states,
    global_values,
    open_components,
)
from phaze.search.scores import LEVEL, SearchSettings, all_scores, model_values
from phaze.search.walk import walk_needs, walk_states

COMPONENT_COLUMNS = ["model", "microbatch", "arch"]


def _walk_components(needs: pd.DataFrame, comp: pd.DataFrame) -> pd.DataFrame:
    """Walk needs (per search, per arch) -> the non-exact components they concern: a per-model
    search its own (model, microbatch); Phaze-Common every model and microbatch of the arch."""
    if needs.empty:
        return pd.DataFrame(columns=COMPONENT_COLUMNS)
    # the needs' archs first: at round 0 every component is live
    comp = comp[comp["arch"].isin(needs["arch"].unique()).to_numpy(bool)]
    live = comp[~comp["exact"].to_numpy(bool)]
    pm = needs[needs["strategy"] != COMMON]
    parts = [
        live.merge(
            pm[["model", "hbm_capacity_bytes", "microbatch", "devices", "arch"]].drop_duplicates(),
            on=["model", "hbm_capacity_bytes", "microbatch", "devices", "arch"],
        )[COMPONENT_COLUMNS]
    ]
    cm = needs[needs["strategy"] == COMMON]
    if len(cm):
        parts.append(
            live.merge(
                cm[["hbm_capacity_bytes", "devices", "arch"]].drop_duplicates(),
                on=["hbm_capacity_bytes", "devices", "arch"],
            )[COMPONENT_COLUMNS]
        )
    return pd.concat(parts, ignore_index=True).drop_duplicates()


def _components(opened: pd.DataFrame) -> pd.DataFrame:
    """Open components (:func:`phaze.search.global_search.open_components`) as (model,
    microbatch, arch)."""
    return opened.rename(columns={"model": "search_model", "comp_model": "model"})[
        COMPONENT_COLUMNS
    ].drop_duplicates()


def _pinned(comp: pd.DataFrame, plan: pd.DataFrame, pinned: tuple[str, ...]) -> pd.DataFrame:
    archs = set(plan.loc[plan["preset"].isin(pinned), "arch"])
    return comp.loc[comp["arch"].isin(archs), COMPONENT_COLUMNS].drop_duplicates()


def _union(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Components of every source, with the sources that asked for each ('walk', 'gap', ...)."""
    frames = [
        p[COMPONENT_COLUMNS].drop_duplicates().assign(why=name)
        for name, p in parts.items()
        if len(p)
    ]
    if not frames:
        return pd.DataFrame(columns=COMPONENT_COLUMNS + ["why"])
    df = pd.concat(frames, ignore_index=True)
    df["microbatch"] = df["microbatch"].astype("int64")
    return (
        df.groupby(COMPONENT_COLUMNS, as_index=False)["why"]
        .agg(lambda s: ",".join(sorted(set(s))))
        .sort_values(COMPONENT_COLUMNS)
        .reset_index(drop=True)
    )


def search_picture(comp: pd.DataFrame, plan: pd.DataFrame, models, settings: SearchSettings):
    """Everything a round decision reads: the walk's scores and the global searches' values,
    states and per-arch detail (global mode only)."""
    per_model = model_values(comp)
    scores = all_scores(comp, models, values=per_model)
    pic = {"scores": scores}
    if settings.mode == "global":
        area = plan.set_index("arch")["area_mm2"]
        inside = set(plan.loc[plan["bucket"] >= 0, "arch"])
        values = global_values(comp, models, values=per_model[per_model["arch"].isin(inside)])
        states, detail = global_states(values, area, settings, comp)
        pic.update(values=values, global_states=states, detail=detail, area=area)
    return pic


def walk_cursor(scores: pd.DataFrame, plan: pd.DataFrame, settings: SearchSettings, completed: int):
    """Where the area walk goes next: ``(visit, completed, states, needs)`` — the plan round it
    visits in this workflow round (None once every walk search has stopped or walked every
    bucket), the plan rounds completed before it (−1: none), the walk's states then, and what it
    needs refined in ``visit``. A plan round whose archs the bounds already settle (nothing to
    refine) is completed on the way, so no workflow round is spent on it."""
    last = int(plan["round"].max())
    states = walk_states(scores, plan, completed, settings)
    visit = completed + 1
    while visit <= last and states["running"].any():
        needs = walk_needs(scores, plan, visit, settings, states)
        if len(needs):
            return visit, completed, states, needs
        completed = visit
        states = walk_states(scores, plan, completed, settings)
        visit += 1
    return None, completed, states, walk_needs(scores.iloc[:0], plan, 0, settings, None)


def select(
    comp: pd.DataFrame,
    plan: pd.DataFrame,
    round_: int,
    settings: SearchSettings,
    models: list[str],
    walk_completed: int,
    pinned: tuple[str, ...] = (),
    ups: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, dict]:
    """The components round ``round_`` brings to the bound tier (columns model, microbatch, arch,
    why), from ``comp`` = every component known before the round (space bounds included), and
    the picture of the search then. ``walk_completed``: the plan rounds the walk completed
    before this round (−1 at the start); the picture's ``walk_visit``, ``walk_completed`` and
    ``walk_states`` say where it goes now (:func:`walk_cursor`). ``ups``: the dominance steps
    per search (:func:`phaze.search.dominance.scope_edges`), which order the refinement."""
    pic = search_picture(comp, plan, models, settings)
    visit, completed, states, needs = walk_cursor(pic["scores"], plan, settings, walk_completed)
    pic.update(walk_visit=visit, walk_completed=completed, walk_states=states)
    parts = {"walk": _walk_components(needs, comp)}
    if settings.mode == "global":
        chosen = chosen_archs(pic["detail"], pic["area"], settings.round_archs, ups)
        pic["chosen"] = chosen
        for reason in ("gap", "front"):
            mine = chosen.loc[chosen["reason"] == reason, GLOBAL_KEY + ["arch"]]
            rows = pic["detail"].merge(mine, on=GLOBAL_KEY + ["arch"])
            parts[reason] = _components(open_components(comp, rows, settings))
    if round_ == 0:
        parts["baseline"] = _pinned(comp, plan, pinned)
    sel = _union(parts)
    # only what can still be refined: below the final tier, or (certify) at it and not certified
    level = comp.groupby(COMPONENT_COLUMNS)["level"].max()
    lv = level.reindex(pd.MultiIndex.from_frame(sel[COMPONENT_COLUMNS])).to_numpy()
    keep = (lv < settings.final_level) | sel["why"].str.contains("baseline")
    # a global search's component the certify solve has not taken
    keep |= sel["why"].str.contains("gap|front").to_numpy(bool) & _uncertified(comp, settings, sel)
    return sel[keep].reset_index(drop=True), pic


def _uncertified(comp: pd.DataFrame, settings: SearchSettings, sel: pd.DataFrame) -> np.ndarray:
    """Per row of ``sel``: whether its (model, microbatch, arch) has a component
    :func:`~phaze.search.global_search.awaiting_certify`."""
    flag = pd.Series(awaiting_certify(comp, settings), index=comp.index)
    per = flag.groupby([comp[c] for c in COMPONENT_COLUMNS]).any()
    got = per.reindex(pd.MultiIndex.from_frame(sel[COMPONENT_COLUMNS]))
    return got.fillna(False).to_numpy(bool)


def solve_selection(
    comp: pd.DataFrame,
    plan: pd.DataFrame,
    settings: SearchSettings,
    models: list[str],
    walk_visit: int | None,
    walk_prior: pd.DataFrame | None,
    candidates: pd.DataFrame,
    solve: str,
    pinned: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Which of the round's ``candidates`` (its components that reached the bound tier — or, for
    ``solve='deep'``, the ILP tier; for ``solve='certify'``, the final tier — in this round) the
    ILP solve ``solve`` takes: those the walk (visiting plan round ``walk_visit``, its states
    before the round ``walk_prior``) or the global search still needs with the round's values in
    (``comp``), and the pinned baselines. The certify solve takes only what the global searches
    need, each component once."""
    pic = search_picture(comp, plan, models, settings)
    parts = {}
    if solve != "certify":  # the certify solve serves the global searches' certificates only
        if walk_visit is not None:
            needs = walk_needs(pic["scores"], plan, walk_visit, settings, walk_prior)
            parts["walk"] = _walk_components(needs, comp)
        parts["baseline"] = _pinned(comp, plan, pinned)
    cand = candidates[COMPONENT_COLUMNS].drop_duplicates()
    if settings.mode == "global":
        # only the candidates' archs can give a row of the result (merged with them below)
        detail = pic["detail"][pic["detail"]["arch"].isin(cand["arch"].unique())]
        parts["global"] = _components(open_components(comp, detail, settings))
    sel = _union(parts)
    cand = cand.assign(microbatch=cand["microbatch"].astype("int64"))
    sel = sel.merge(cand, on=COMPONENT_COLUMNS)
    if solve == "certify":  # at the final tier, not yet certified
        return sel[_uncertified(comp, settings, sel)].reset_index(drop=True)
    # only components short of the solve's tier (one selected again for the deep tier has its
    # ILP already)
    target = LEVEL["ilp"] if solve == "ilp" else LEVEL["deep"]
    level = comp.groupby(COMPONENT_COLUMNS)["level"].max()
    lv = level.reindex(pd.MultiIndex.from_frame(sel[COMPONENT_COLUMNS])).to_numpy()
    return sel[lv < target].reset_index(drop=True)


def walk_prior_states(
    comp_before: pd.DataFrame, plan, completed: int, settings: SearchSettings, models
) -> pd.DataFrame:
    """The walk's states with plan rounds up to ``completed`` done, from the components known
    before the round."""
    return walk_states(all_scores(comp_before, models), plan, completed, settings)
