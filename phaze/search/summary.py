"""The summary tables: ``best``, ``comparison``, ``explored`` (docs/design.md, "Summary tables")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.search.baselines import best_row
from phaze.search.scores import (
    ACHIEVABLE,
    COMPONENT_KEY,
    SEARCH_KEY,
    SearchSettings,
    all_scores,
    answers,
    certified_gap,
    components,
    search_states,
)

DETAIL = [
    "throughput_seq_s",
    "time_per_batch_s",
    "mfu",
    "pp",
    "tp",
    "dp",
    "stages",
    "stage_mem_bytes",
]
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


def _feasible(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if "feasible" in out.columns:
        out.loc[~out["feasible"].astype(bool), "throughput_seq_s"] = np.nan
    return out


def detail_rows(place: pd.DataFrame) -> pd.DataFrame:
    """The best-known placement per component: the deepest ILP tier solved, else the list tier."""
    p = _feasible(place[place["tier"].isin(ACHIEVABLE)])
    # the best of the real schedules (a deeper ILP's is never worse by construction; ties: the
    # deeper tier)
    rank = {t: i for i, t in enumerate(reversed(ACHIEVABLE))}
    p = p.assign(_t=p["throughput_seq_s"].fillna(-np.inf), _rank=p["tier"].map(rank))
    p = p.sort_values(["_t", "_rank"], ascending=[False, True]).drop_duplicates(COMPONENT_KEY)
    p = p.drop(columns=["_t", "_rank"])
    return p


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
    for k in ("pp", "tp", "dp", "time_per_batch_s", "mfu", *AXES):
        out[k] = row.get(pre + k, np.nan)
    for k in ("stages", "stage_mem_bytes"):
        out[k] = "" if expert else row.get(k, "")
    return out


def summarize(
    plan: pd.DataFrame,
    space: pd.DataFrame,
    place: pd.DataFrame,
    blind_place: pd.DataFrame,
    blind_choice: pd.DataFrame,
    models: list[str],
    settings: SearchSettings,
    last_round: int,
    baseline_preset: str = "tpuv4",
    upstream_baseline_preset: str | None = "tpuv4-upstream",
) -> dict[str, pd.DataFrame]:
    """Build ``best``, ``comparison`` and ``explored`` from every placement result."""
    comp = components(place, settings.final_tier)
    scores = all_scores(comp, models)
    states = search_states(scores, plan, last_round, settings)
    ans = answers(scores, plan, states, settings)
    detail = detail_rows(place)

    # --- best: per (strategy, mode, model, hbm, devices), the best over microbatch -----------
    best_rows = []
    for rec in ans.itertuples(index=False):
        if rec.arch is None or (isinstance(rec.arch, float) and np.isnan(rec.arch)):
            continue
        if rec.strategy == "phaze-per-model":
            sel = detail[
                (detail["model"] == rec.model)
                & (detail["hbm_bytes"] == rec.hbm_bytes)
                & (detail["microbatch"] == rec.microbatch)
                & (detail["devices"] == rec.devices)
                & (detail["arch"] == rec.arch)
            ]
        else:
            sel = detail[
                (detail["hbm_bytes"] == rec.hbm_bytes)
                & (detail["devices"] == rec.devices)
                & (detail["arch"] == rec.arch)
            ]
        for model, grp in sel.groupby("model"):
            row = _strategy_rows(rec.strategy, model, grp)
            row.update(
                mode=rec.mode,
                hbm_bytes=int(rec.hbm_bytes),
                devices=int(rec.devices),
                search_score=float(rec.score),
                last_bucket=int(rec.last_bucket),
                archs_visited=int(rec.archs_visited),
                exact=bool(rec.exact),
                search_upper_bound=float(rec.upper_bound),
                certified_gap=float(rec.certified_gap),
            )
            best_rows.append(row)
    best = pd.DataFrame(best_rows)
    if len(best):
        answer = ["strategy", "mode", "model", "hbm_bytes", "devices"]
        # a per-model answer is the best over its microbatch searches: its certificate is the
        # largest upper bound of any of them against the answer's throughput
        per_model = best["strategy"] == "phaze-per-model"
        top = best.groupby(answer)["search_upper_bound"].transform("max")
        best.loc[per_model, "_top"] = top[per_model]
        best = (
            best.sort_values(["throughput_seq_s", "microbatch"], ascending=[False, True])
            .drop_duplicates(answer)
            .sort_values(answer)
        )
        pm = best["strategy"] == "phaze-per-model"
        best.loc[pm, "certified_gap"] = [
            certified_gap(u, t)
            for u, t in zip(best.loc[pm, "_top"], best.loc[pm, "throughput_seq_s"])
        ]
        best = best.drop(columns=["_top"])
    # Phaze-Common keeps ONE arch per (mode, hbm, devices): the search's answer; the
    # per-search candidates above share that arch by construction.

    # --- baselines ---------------------------------------------------------------------------
    presets = space.get("preset", pd.Series("", index=space.index))
    baselines = [("tpuv4", set(space.loc[presets == baseline_preset, "arch"]))]
    if upstream_baseline_preset:
        baselines.append(
            ("tpuv4-upstream", set(space.loc[presets == upstream_baseline_preset, "arch"]))
        )
    base_rows = []
    keys = detail[["model", "hbm_bytes", "devices"]].drop_duplicates()
    blind_detail = detail_rows(blind_place) if len(blind_place) else blind_place
    for k in keys.itertuples(index=False):
        grp = detail[
            (detail["model"] == k.model)
            & (detail["hbm_bytes"] == k.hbm_bytes)
            & (detail["devices"] == k.devices)
        ]
        extra = {"hbm_bytes": int(k.hbm_bytes), "devices": int(k.devices), "mode": ""}
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
                & (blind_detail["hbm_bytes"] == k.hbm_bytes)
                & (blind_detail["devices"] == k.devices)
            ]
            if len(b):
                base_rows.append({**_strategy_rows("placement-blind", k.model, b), **extra})
    early = best[best["mode"] == "early_stop"] if len(best) else best
    comparison = pd.concat([early, pd.DataFrame(base_rows)], ignore_index=True)
    comparison = _with_speedups(comparison)
    comparison = comparison.merge(
        space[["arch"] + [c for c in ARCH_COLS if c in space.columns]], on="arch", how="left"
    )
    best = _with_speedups_from(best, comparison).merge(
        space[["arch"] + [c for c in ARCH_COLS if c in space.columns]], on="arch", how="left"
    )

    explored = _explored(scores, plan, states, settings, last_round)
    return {"best": best, "comparison": comparison, "explored": explored, "states": states}


def _with_speedups(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for base in SPEEDUP_BASELINES:
        ref = df[df["strategy"] == base].set_index(["model", "hbm_bytes", "devices"])[
            "throughput_seq_s"
        ]
        idx = pd.MultiIndex.from_frame(df[["model", "hbm_bytes", "devices"]])
        denom = ref.reindex(idx).to_numpy(dtype=float)
        df[f"speedup_vs_{base.replace('-', '_')}"] = df["throughput_seq_s"].to_numpy(float) / denom
    order = {s: i for i, s in enumerate(STRATEGIES)}
    df["_o"] = df["strategy"].map(order)
    df = df.sort_values(["model", "hbm_bytes", "devices", "_o"]).drop(columns="_o")
    for col in ("microbatch", "pp", "tp", "dp"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(-1).astype(np.int64)
    df["interleave"] = pd.to_numeric(df["interleave"], errors="coerce").fillna(-1).astype(np.int64)
    for col in ("sequence_parallel", "distributed_optimizer"):
        df[col] = df[col].fillna(False).astype(bool)
    for col in ("stages", "stage_mem_bytes", "mode", "recompute", "ddp", "place_model"):
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


def _explored(scores, plan, states, settings, last_round) -> pd.DataFrame:
    """One row per (search, computed arch): bounds, values, whether the ILP ran, pruned, and
    whether the arch lies within the buckets the early-stopped search visited."""
    df = scores.merge(plan[["arch", "bucket", "round", "area_mm2", "preset"]], on="arch")
    df = df.merge(states[SEARCH_KEY + ["stop_bucket"]], on=SEARCH_KEY, how="left")
    df["visited"] = ((df["stop_bucket"] < 0) | (df["bucket"] <= df["stop_bucket"])) & (
        df["bucket"] >= 0
    )
    # pruned: the bound tier showed it could not beat the best proven so far, so no ILP ran
    df["pruned"] = ~df["has_ilp"] & ~df["exact"]
    df = df.rename(columns={"hi": "throughput_upper_seq_s", "ach": "throughput_seq_s"})
    return df.sort_values(SEARCH_KEY + ["bucket", "arch"]).reset_index(drop=True)
