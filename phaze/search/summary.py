"""The summary tables: ``best``, ``comparison``, ``explored``, ``front``, ``certified``
(docs/design.md, "Summary tables")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.search.baselines import best_row
from phaze.search.dominance import edges_of
from phaze.search.global_search import (
    COMMON,
    GLOBAL_KEY,
    PER_MODEL,
    front_table,
    global_states,
    global_values,
)
from phaze.search.scores import (
    ACHIEVABLE,
    COMPONENT_KEY,
    SEARCH_KEY,
    SearchSettings,
    all_scores,
    certified_gap,
    components,
    model_values,
)
from phaze.search.walk import walk_answers, walk_states, with_plan

#: the placement axes a chosen placement carries (docs/step.md), in place rows and summaries
AXES = ["interleave", "recompute", "sequence_parallel", "distributed_optimizer", "ddp"]
ARCH_COLS = [
    "n_tc",
    "n_vc",
    "tc_width",
    "tc_depth",
    "vc_width",
    "glb_bytes",
    "freq_hz",
    "area_mm2",
    "peak_flops",
]
STRATEGIES = [
    "phaze-per-model",
    "phaze-common",
    "tpuv4-expert",
    "tpuv4-phaze",
    "tpuv4-upstream-expert",
    "tpuv4-upstream-phaze",
    "placement-blind",
]
#: the baselines each Phaze strategy's speedup is reported against (speedup_vs_<name> columns)
SPEEDUP_BASELINES = ("tpuv4-expert", "tpuv4-phaze", "tpuv4-upstream-expert", "placement-blind")
BASELINE_STRATEGIES = tuple(s for s in STRATEGIES if not s.startswith("phaze-"))
ANSWER_KEY = ["strategy", "common_score", "mode", "model", "hbm_capacity_bytes", "devices"]


def _feasible(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if "feasible" in out.columns:
        out.loc[~out["feasible"].astype(bool), "throughput_seq_s"] = np.nan
    return out


def detail_rows(place: pd.DataFrame) -> pd.DataFrame:
    """The best-known placement per component: the best of the real schedules (a deeper ILP's is
    never worse by construction; ties: the deeper tier)."""
    p = _feasible(place[place["tier"].isin(ACHIEVABLE)])
    rank = {t: i for i, t in enumerate(reversed(ACHIEVABLE))}
    p = p.assign(_t=p["throughput_seq_s"].fillna(-np.inf), _rank=p["tier"].map(rank))
    p = p.sort_values(["_t", "_rank"], ascending=[False, True]).drop_duplicates(COMPONENT_KEY)
    return p.drop(columns=["_t", "_rank"])


def _strategy_rows(strategy: str, model: str, cands: pd.DataFrame, expert: bool = False) -> dict:
    col = "expert_throughput_seq_s" if expert else "throughput_seq_s"
    c = cands.copy()
    if expert:
        c.loc[~c["expert_feasible"].astype(bool), col] = np.nan
    row = best_row(c, col)
    base = {"model": model, "strategy": strategy}
    if row is None:
        return {
            **base,
            "arch": cands["arch"].iloc[0] if len(cands) else "",
            "throughput_seq_s": np.nan,
        }
    pre = "expert_" if expert else ""
    out = {
        **base,
        "arch": row["arch"],
        "microbatch": int(row["microbatch"]),
        "throughput_seq_s": float(row[col]),
        "place_model": row.get("place_model", ""),
    }
    for k in ("pp", "tp", "dp", "ep", "etp", "time_per_batch_s", "mfu", *AXES):
        out[k] = row.get(pre + k, np.nan)
    for k in ("stages", "stage_mem_bytes"):
        out[k] = "" if expert else row.get(k, "")
    return out


def _answer_rows(answers: pd.DataFrame, detail: pd.DataFrame) -> list[dict]:
    """One best-table row per (answer, model): the answer's arch with each model's best known
    placement over microbatch."""
    by_key = {
        k: g for k, g in detail.groupby(["hbm_capacity_bytes", "devices", "arch"], sort=False)
    }
    rows = []
    for rec in answers.itertuples(index=False):
        if not isinstance(rec.arch, str):
            continue
        sel = by_key.get((rec.hbm_capacity_bytes, rec.devices, rec.arch))
        if sel is None:
            continue
        if rec.strategy == PER_MODEL:
            sel = sel[sel["model"] == rec.model]
        for model, grp in sel.groupby("model"):
            row = _strategy_rows(rec.strategy, model, grp)
            row.update(
                common_score=rec.common_score,
                mode=rec.mode,
                hbm_capacity_bytes=int(rec.hbm_capacity_bytes),
                devices=int(rec.devices),
                search_score=float(rec.score),
                last_bucket=int(rec.last_bucket),
                archs_visited=int(rec.archs_visited),
                archs_refined=int(rec.archs_refined),
                exact=bool(rec.exact),
                search_upper_bound=float(rec.upper_bound),
                certified_gap=float(rec.certified_gap),
                space_gap=float(rec.space_gap),
            )
            rows.append(row)
    return rows


def _walk_best(scores, plan, states, settings, refined) -> pd.DataFrame:
    """The walk's answers, a per-model one taken over its microbatch searches: its certificate
    the largest upper bound of any of them against the best score."""
    ans = walk_answers(scores, plan, states, settings)
    ans["archs_refined"] = ans.merge(refined, on=SEARCH_KEY, how="left")["n"].fillna(0).to_numpy()
    key = ["strategy", "common_score", "mode", "model", "hbm_capacity_bytes", "devices"]
    out = []
    for _, grp in ans.groupby(key, sort=True):
        ok = grp[grp["score"].notna()]
        if ok.empty:
            out.append(grp.iloc[0])
            continue
        best = ok.sort_values(["score", "microbatch"], ascending=[False, True]).iloc[0].copy()
        best["certified_gap"] = certified_gap(float(grp["upper_bound"].max()), best["score"])
        best["space_gap"] = certified_gap(float(grp["space_upper_bound"].max()), best["score"])
        best["archs_visited"] = int(grp["archs_visited"].max())
        best["archs_refined"] = int(grp["archs_refined"].max())
        out.append(best)
    return pd.DataFrame(out).reset_index(drop=True)


def _global_best(gstates: pd.DataFrame, values: pd.DataFrame) -> pd.DataFrame:
    refined = values[values["level"] >= 1].groupby(GLOBAL_KEY)["arch"].nunique()
    total = values.groupby(GLOBAL_KEY)["arch"].nunique()
    out = gstates.copy()
    idx = pd.MultiIndex.from_frame(out[GLOBAL_KEY])
    out["archs_refined"] = refined.reindex(idx).fillna(0).to_numpy()
    out["archs_visited"] = total.reindex(idx).fillna(0).to_numpy()
    out["mode"] = "global"
    out["last_bucket"] = -1
    out["space_gap"] = out["certified_gap"]
    out["microbatch"] = -1
    return out


def summarize(
    plan: pd.DataFrame,
    space: pd.DataFrame,
    place: pd.DataFrame,
    bounds: pd.DataFrame,
    blind_place: pd.DataFrame,
    blind_choice: pd.DataFrame,
    models: list[str],
    settings: SearchSettings,
    last_round: int,
    baseline_preset: str = "tpuv4",
    upstream_baseline_preset: str | None = "tpuv4-upstream",
    edges: pd.DataFrame | None = None,
) -> dict:
    """Build the summary tables from every placement result and the space bounds (``edges``:
    their dominance steps, :func:`phaze.search.dominance.edges_of`, if taken out already)."""
    edges = edges_of(bounds) if edges is None else edges
    comp = components(place, settings.final_tier, bounds, edges)
    del edges
    per_model = model_values(comp)
    scores = all_scores(comp, models, values=per_model)
    states = walk_states(scores, plan, last_round, settings)
    refined_walk = (
        with_plan(scores[scores["level"] >= 1], plan).groupby(SEARCH_KEY)["arch"].nunique()
    )
    refined_walk = refined_walk.rename("n").reset_index()
    frames = [_walk_best(scores, plan, states, settings, refined_walk)]
    area = plan.set_index("arch")["area_mm2"]
    inside = set(plan.loc[plan["bucket"] >= 0, "arch"])
    values = global_values(comp, models, values=per_model[per_model["arch"].isin(inside)])
    gstates, _ = global_states(values, area, settings, comp)
    if settings.mode == "global":
        frames.append(_global_best(gstates, values))
    answers = pd.concat(frames, ignore_index=True)
    no_answer = [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
        for r in answers.loc[answers["arch"].isna(), ANSWER_KEY].to_dict("records")
    ]
    detail = detail_rows(place)
    best = pd.DataFrame(_answer_rows(answers, detail))
    if len(best):
        best = best.sort_values(ANSWER_KEY).reset_index(drop=True)

    # --- baselines ---------------------------------------------------------------------------
    presets = space.get("preset", pd.Series("", index=space.index))
    baselines = [("tpuv4", set(space.loc[presets == baseline_preset, "arch"]))]
    if upstream_baseline_preset:
        baselines.append(
            ("tpuv4-upstream", set(space.loc[presets == upstream_baseline_preset, "arch"]))
        )
    base_rows = []
    keys = detail[["model", "hbm_capacity_bytes", "devices"]].drop_duplicates()
    blind_detail = detail_rows(blind_place) if len(blind_place) else blind_place
    for k in keys.itertuples(index=False):
        grp = detail[
            (detail["model"] == k.model)
            & (detail["hbm_capacity_bytes"] == k.hbm_capacity_bytes)
            & (detail["devices"] == k.devices)
        ]
        extra = {
            "hbm_capacity_bytes": int(k.hbm_capacity_bytes),
            "devices": int(k.devices),
            "mode": "",
        }
        extra["common_score"] = ""
        for name, archs in baselines:
            tpu = grp[grp["arch"].isin(archs)]
            if len(tpu):
                expert = _strategy_rows(f"{name}-expert", k.model, tpu, expert=True)
                base_rows.append({**expert, **extra})
                base_rows.append({**_strategy_rows(f"{name}-phaze", k.model, tpu), **extra})
        if len(blind_detail):
            arch = blind_choice.loc[blind_choice["model"] == k.model, "arch"]
            b = blind_detail[
                (blind_detail["model"] == k.model)
                & (blind_detail["arch"].isin(set(arch)))
                & (blind_detail["hbm_capacity_bytes"] == k.hbm_capacity_bytes)
                & (blind_detail["devices"] == k.devices)
            ]
            if len(b):
                base_rows.append({**_strategy_rows("placement-blind", k.model, b), **extra})
    # the comparison: the configured mode's answers, Phaze-Common by the configured score
    chosen = best
    if len(best):
        mine = best["mode"] == settings.mode
        common_ok = (best["strategy"] != COMMON) | (best["common_score"] == settings.common_score)
        chosen = best[mine & common_ok]
    comparison = pd.concat([chosen, pd.DataFrame(base_rows)], ignore_index=True)
    comparison = _with_speedups(comparison)
    cols = ["arch"] + [c for c in ARCH_COLS if c in space.columns]
    comparison = comparison.merge(space[cols], on="arch", how="left")
    best = _with_speedups_from(best, comparison).merge(space[cols], on="arch", how="left")

    explored = _explored(scores, plan, states, settings)
    front = front_table(values, area)
    certified = values.merge(plan[["arch", "area_mm2", "bucket"]], on="arch", how="left")
    certified = certified.rename(
        columns={"hi": "throughput_upper_seq_s", "ach": "throughput_seq_s"}
    )
    counts = {
        "components_refined": int((comp["level"] >= 1).sum()),
        "components_ilp": int((comp["level"] >= 2).sum()),
        "components_deep": int((comp["level"] >= 3).sum()),
        "components_certified": int(comp["has_certify"].astype(bool).sum()),
        "archs_with_ilp": int(comp.loc[comp["level"] >= 2, "arch"].nunique()),
    }
    return {
        "best": best,
        "comparison": comparison,
        "explored": explored,
        "front": front,
        "certified": certified,
        "states": states,
        "global_states": gstates,
        "searches": {"walk": len(states), "global": len(gstates)},
        "counts": counts,
        "no_answer": no_answer,
    }


def _with_speedups(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for base in SPEEDUP_BASELINES:
        ref = df[df["strategy"] == base].set_index(["model", "hbm_capacity_bytes", "devices"])[
            "throughput_seq_s"
        ]
        idx = pd.MultiIndex.from_frame(df[["model", "hbm_capacity_bytes", "devices"]])
        denom = ref.reindex(idx).to_numpy(dtype=float)
        df[f"speedup_vs_{base.replace('-', '_')}"] = df["throughput_seq_s"].to_numpy(float) / denom
    order = {s: i for i, s in enumerate(STRATEGIES)}
    df["_o"] = df["strategy"].map(order)
    df = df.sort_values(["model", "hbm_capacity_bytes", "devices", "_o"]).drop(columns="_o")
    for col in ("microbatch", "pp", "tp", "dp", "ep", "etp"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(-1).astype(np.int64)
    df["interleave"] = pd.to_numeric(df["interleave"], errors="coerce").fillna(-1).astype(np.int64)
    for col in ("sequence_parallel", "distributed_optimizer"):
        df[col] = df[col].fillna(False).astype(bool)
    for col in (
        "stages",
        "stage_mem_bytes",
        "mode",
        "recompute",
        "ddp",
        "place_model",
        "common_score",
    ):
        df[col] = df[col].fillna("").astype(str)
    return df.reset_index(drop=True)


def _with_speedups_from(best: pd.DataFrame, comparison: pd.DataFrame) -> pd.DataFrame:
    if best.empty:
        return comparison.iloc[0:0]
    base = comparison[comparison["strategy"].isin(BASELINE_STRATEGIES)]
    # the caller merges the architecture columns afterwards: drop the copies the baselines carry
    base = base.drop(columns=[c for c in ARCH_COLS if c in base.columns])
    return (
        _with_speedups(pd.concat([best, base], ignore_index=True))
        .query("strategy in ['phaze-per-model', 'phaze-common']")
        .reset_index(drop=True)
    )


def _explored(scores, plan, states, settings) -> pd.DataFrame:
    """One row per (walk search, refined arch): bounds, values, whether the ILP ran, and whether
    the arch lies within the buckets the walk visited."""
    df = with_plan(scores[scores["level"] >= 1], plan)
    df = df.merge(states[SEARCH_KEY + ["stop_bucket", "buckets_done"]], on=SEARCH_KEY, how="left")
    stopped = df["stop_bucket"] >= 0
    last = np.where(stopped & settings.walk_stops, df["stop_bucket"], df["buckets_done"] - 1)
    df["visited"] = df["bucket"] <= last
    # pruned: inside the visited buckets, settled by bounds without the final tier
    df["pruned"] = df["visited"] & ~df["has_ilp"] & ~df["exact"]
    df = df.rename(columns={"hi": "throughput_upper_seq_s", "ach": "throughput_seq_s"})
    df = df.drop(columns=["stop_bucket", "buckets_done"])
    return df.sort_values(SEARCH_KEY + ["bucket", "arch"]).reset_index(drop=True)
