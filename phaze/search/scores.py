"""Search state from placement results: values per search, early stop, exact pruning, answers.

Vocabulary
----------
*component*: one placement result, keyed by ``COMPONENT_KEY`` (model, HBM, microbatch, cluster
size, arch); the placement axes (recompute, interleave, ...) are chosen inside it. Each component
can be known at three tiers:

* ``ub`` — placement on per-layer *lower bounds* of the makespans: a throughput upper bound,
  ``hi`` (the placement's time is at most that of any latencies above the bounds — with the
  achievable makespans as the DDP overlap's window, docs/step.md — and memory does not depend on
  them);
* ``lo`` — placement on list-schedule makespans (a real schedule): an achievable throughput;
* ``ilp`` — placement on the ILP's makespans (what solving every ILP would report);
* ``ilp_ub`` — placement on the ILP's proven lower bounds: a second throughput upper bound, so
  ``hi`` is the smaller of the two once the ILP ran;
* ``deep``, ``deep_ub`` — the same on a deeper ILP (a larger node limit, config
  ``search.deepen_node_limit``), run only for the archs whose interval [``ach``, ``hi``] still
  reaches above the incumbent once the ILP tier is in (see below). More nodes never lengthen the
  schedule nor lower the bound, so each tier's interval nests in the previous one's.

The *final* tier (``deep`` when deepening is configured, else ``ilp``) is the reference: the
answer and stop point are those of solving every architecture at that tier, and a component is
``exact`` once its final-tier value (or bounds that meet) is known.

*certificate*: a search's ``certified_gap`` = (largest ``hi`` over the architectures it visited)
/ (the winner's score) − 1, floored at 0: no visited architecture, pruned or solved, can beat the
reported winner by more than this, whatever the exact schedules are.

*search*: Phaze-Per-Model has one search per (model, HBM, microbatch, devices), its score the
component's throughput. Phaze-Common has one search per (HBM, devices), its score for an arch
the mean over models of that model's best throughput over microbatch
(software choices stay free per model; an arch infeasible for any model scores nothing, as
upstream drops it).

Exact pruning
-------------
For an arch in bucket j, let ``B_{≤j}`` be the best *achievable* score among architectures in
buckets 0…j computed so far. The ILP is needed only if ``hi > B_{≤j}``: otherwise the arch can
neither beat the answer nor change the running best ``R_j`` the stop test reads (see
:mod:`phaze.search.stop`). The arch attaining ``B`` is itself either selected (``hi > B``) or
already exact (``hi == lo``), so the reported best is always an ILP (or bound-tight) value: the
answer and the stop point equal those of solving every ILP.

Deepening applies the same rule once more inside the round: with the ILP tier's values in,
``B`` and ``hi`` are tighter, and only the archs still above ``B`` (and not exact) get the deep
tier. An arch left out has ``hi ≤ B``, so its deep value cannot beat the answer or move the
running best either: the answer and stop point equal those of solving every arch deeply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from phaze.config import schema_defaults
from phaze.errors import PhazeError
from phaze.search.stop import stop_bucket

COMPONENT_KEY = ["model", "hbm_bytes", "microbatch", "devices", "arch"]
PER_MODEL_KEY = ["model", "hbm_bytes", "microbatch", "devices"]
COMMON_KEY = ["hbm_bytes", "devices"]
TIERS = ("ub", "lo", "ilp", "ilp_ub", "deep", "deep_ub")
#: tiers that hold a schedule's value (achievable) and the final tiers the ``exact`` flag reads
ACHIEVABLE = ("lo", "ilp", "deep")
FINAL_TIERS = ("ilp", "deep")


_DEFAULT = schema_defaults()["search"]


@dataclass(frozen=True)
class SearchSettings:
    """The search's rules; the defaults are config/schema.yaml's (section ``search``)."""

    patience: int = _DEFAULT["patience"]
    stop_rule: str = _DEFAULT["stop_rule"]
    mode: str = _DEFAULT["mode"]  # early_stop | exhaustive
    prune: bool = _DEFAULT["prune"]
    deepen_node_limit: int = _DEFAULT["deepen_node_limit"]  # 0: no deep tier

    @classmethod
    def from_config(cls, search_cfg: dict) -> SearchSettings:
        """From a validated config section ``search`` (phaze.config.load_config)."""
        s = cls(
            patience=search_cfg["patience"],
            stop_rule=search_cfg["stop_rule"],
            mode=search_cfg["mode"],
            prune=search_cfg["prune"],
            deepen_node_limit=search_cfg["deepen_node_limit"],
        )
        if s.mode not in ("early_stop", "exhaustive"):
            raise PhazeError(f"search.mode must be early_stop or exhaustive, got {s.mode!r}")
        return s

    @property
    def final_tier(self) -> str:
        """The tier whose values are the reference (``exact``): ``deep`` when deepening."""
        return "deep" if self.deepen_node_limit > 0 else "ilp"

    @property
    def pruning(self) -> bool:
        # upstream's per-bucket rule needs every bucket's own best exactly: no pruning under it
        return self.prune and self.stop_rule == "running_best"


def components(place: pd.DataFrame, final: str = "ilp") -> pd.DataFrame:
    """Wide table, one row per component: ``hi``, ``lo``, ``ilp`` throughputs (NaN = unknown or
    infeasible), ``ach`` = best achievable known, ``exact`` = value known at the ``final`` tier
    (``ilp``, or ``deep`` when the search deepens).

    ``place`` is the concatenation of place tables with an added ``tier`` column."""
    if final not in FINAL_TIERS:
        raise AssertionError(f"final tier must be one of {FINAL_TIERS}, got {final!r}")
    missing = [c for c in COMPONENT_KEY + ["tier", "throughput_seq_s"] if c not in place.columns]
    if missing:
        raise PhazeError(f"placement results lack columns {missing}")
    df = place[COMPONENT_KEY + ["tier", "throughput_seq_s"]].copy()
    if "feasible" in place.columns:
        df.loc[~place["feasible"].astype(bool).to_numpy(), "throughput_seq_s"] = np.nan
    bad = sorted(set(df["tier"]) - set(TIERS))
    if bad:
        raise PhazeError(f"unknown placement tiers {bad}")
    wide = df.pivot_table(
        index=COMPONENT_KEY, columns="tier", values="throughput_seq_s", aggfunc="max", dropna=False
    )
    wide = wide.reindex(columns=list(TIERS))
    wide.columns.name = None
    wide = wide.reset_index()
    wide["hi"] = np.fmin(np.fmin(wide.pop("ub"), wide.pop("ilp_ub")), wide.pop("deep_ub"))
    wide["ach"] = wide[list(ACHIEVABLE)].max(axis=1, skipna=True)
    wide["has_ilp"] = wide["ilp"].notna() | wide["deep"].notna()
    wide["has_deep"] = wide["deep"].notna()
    # Exactly known: a final-tier value, bounds that meet, or infeasible (NaN upper bound: memory
    # does not depend on latencies, so no schedule can make it fit).
    wide["exact"] = (
        wide[final].notna() | (wide["hi"] <= wide["ach"]).fillna(False) | wide["hi"].isna()
    )
    return wide


def per_model_scores(comp: pd.DataFrame) -> pd.DataFrame:
    out = comp[PER_MODEL_KEY + ["arch", "hi", "ach", "exact", "has_ilp", "has_deep"]].copy()
    out.insert(0, "strategy", "phaze-per-model")
    return out


def common_scores(comp: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    """Phaze-Common score per (HBM, devices, arch): mean over ``models`` of each model's best
    over microbatch; NaN unless every model has a feasible value."""
    g = comp.groupby(["hbm_bytes", "devices", "arch", "model"], sort=False)
    per_model = g.agg(
        hi=("hi", "max"),
        ach=("ach", "max"),
        exact=("exact", "all"),
        has_ilp=("has_ilp", "all"),
        has_deep=("has_deep", "all"),
    ).reset_index()
    rows = []
    for (hbm, dev, arch), grp in per_model.groupby(["hbm_bytes", "devices", "arch"], sort=False):
        grp = grp.set_index("model").reindex(models)
        hi = grp["hi"].mean(skipna=False) if grp["hi"].notna().all() else np.nan
        ach = grp["ach"].mean(skipna=False) if grp["ach"].notna().all() else np.nan
        rows.append(
            (
                hbm,
                dev,
                arch,
                hi,
                ach,
                bool(grp["exact"].fillna(False).all()),
                bool(grp["has_ilp"].fillna(False).all()),
                bool(grp["has_deep"].fillna(False).all()),
            )
        )
    out = pd.DataFrame(
        rows,
        columns=["hbm_bytes", "devices", "arch", "hi", "ach", "exact", "has_ilp", "has_deep"],
    )
    out["exact"] |= (out["hi"] <= out["ach"]).fillna(False) | out["hi"].isna()
    out.insert(0, "strategy", "phaze-common")
    out["model"], out["microbatch"] = "*", -1
    return out


SEARCH_KEY = ["strategy", "model", "hbm_bytes", "microbatch", "devices"]


def all_scores(comp: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    scores = pd.concat([per_model_scores(comp), common_scores(comp, models)], ignore_index=True)
    return scores[SEARCH_KEY + ["arch", "hi", "ach", "exact", "has_ilp", "has_deep"]]


def _with_plan(scores: pd.DataFrame, plan: pd.DataFrame) -> pd.DataFrame:
    df = scores.merge(
        plan[["arch", "bucket", "round", "area_mm2", "preset"]], on="arch", how="left"
    )
    if df["bucket"].isna().any():
        raise PhazeError("placement results hold archs that are not in the search plan")
    # bucket −1: a baseline outside the area budget, computed for the comparison, never searched
    return df[df["bucket"] >= 0]


def complete_buckets(plan: pd.DataFrame, upto_round: int) -> int:
    """Number of leading buckets whose every arch has been computed by round ``upto_round``."""
    last_round = plan[plan["bucket"] >= 0].groupby("bucket")["round"].max().sort_index()
    done = (last_round <= upto_round).to_numpy()
    return int(len(done) if done.all() else np.argmin(done))


def bucket_best(df: pd.DataFrame, n_buckets: int) -> np.ndarray:
    """m_j: best achievable score inside each of the first ``n_buckets`` buckets."""
    best = np.full(n_buckets, -np.inf)
    sub = df[(df["bucket"] < n_buckets) & df["ach"].notna()]
    if len(sub):
        mx = sub.groupby("bucket")["ach"].max()
        best[mx.index.to_numpy(dtype=int)] = mx.to_numpy()
    return best


def search_states(
    scores: pd.DataFrame, plan: pd.DataFrame, upto_round: int, settings: SearchSettings
) -> pd.DataFrame:
    """One row per search: ``stop_bucket`` (−1 while running), ``buckets_done``, and whether it
    still needs work after ``upto_round`` (``running``)."""
    df = _with_plan(scores, plan)
    nb = complete_buckets(plan, upto_round)
    total = int(plan["bucket"].max()) + 1
    rows = []
    for key, grp in df.groupby(SEARCH_KEY, sort=True):
        j = stop_bucket(bucket_best(grp, nb), settings.patience, settings.stop_rule)
        stopped = j is not None
        more = nb < total
        running = more and (settings.mode == "exhaustive" or not stopped)
        rows.append((*key, -1 if j is None else j, nb, running))
    return pd.DataFrame(rows, columns=SEARCH_KEY + ["stop_bucket", "buckets_done", "running"])


def select_for_ilp(
    scores: pd.DataFrame,
    plan: pd.DataFrame,
    round_: int,
    settings: SearchSettings,
    prior_states: pd.DataFrame | None,
) -> pd.DataFrame:
    """Which archs of round ``round_`` each search needs the ILP for.

    ``scores`` holds all scores known once round ``round_``'s bound tiers are in (earlier rounds
    complete). ``prior_states`` is :func:`search_states` after round ``round_ − 1`` (None for
    round 0). Returns rows (search key, arch, bucket, hi, threshold) of archs to solve.
    """
    df = _with_plan(scores, plan)
    df = df[df["round"] <= round_]
    if prior_states is not None and len(prior_states):
        live = prior_states[prior_states["running"]][SEARCH_KEY]
        df = df.merge(live, on=SEARCH_KEY, how="inner")
    picked = []
    for _, grp in df.groupby(SEARCH_KEY, sort=False):
        grp = grp.sort_values("bucket")
        ach = grp["ach"].fillna(-np.inf).to_numpy()
        # B_{<=j}: best achievable over buckets 0..j (whole bucket j included)
        per_bucket = pd.Series(ach).groupby(grp["bucket"].to_numpy()).max()
        cum = per_bucket.cummax()
        thr = cum.reindex(grp["bucket"].to_numpy()).to_numpy()
        if not settings.pruning:
            thr = np.full(len(grp), -np.inf)
        cur = (grp["round"] == round_).to_numpy()
        hi = grp["hi"].to_numpy()
        # hi NaN = infeasible under any latencies: never worth an ILP
        need = cur & ~grp["exact"].to_numpy() & ~np.isnan(hi) & (hi > thr)
        sel = grp[need].copy()
        sel["threshold"] = thr[need]
        picked.append(sel)
    cols = SEARCH_KEY + ["arch", "bucket", "hi", "threshold"]
    if not picked:
        return pd.DataFrame(columns=cols)
    return pd.concat(picked, ignore_index=True)[cols]


def ilp_requests(
    selected: pd.DataFrame,
    plan: pd.DataFrame,
    round_: int,
    model_microbatches: list[tuple[str, int]],
    pinned_presets: tuple[str, ...] = ("tpuv4",),
) -> pd.DataFrame:
    """(model, microbatch, arch) triples whose layers get the ILP in round ``round_``.

    A per-model search needs its own (model, microbatch); Phaze-Common needs every pair (its
    score takes each model's best over microbatches). Pinned baseline archs always get it."""
    rows = set()
    for rec in selected.itertuples(index=False):
        if rec.strategy == "phaze-common":
            rows.update((m, b, rec.arch) for m, b in model_microbatches)
        else:
            rows.add((rec.model, int(rec.microbatch), rec.arch))
    pinned = plan[(plan["round"] == round_) & plan["preset"].isin(pinned_presets)]["arch"]
    for arch in pinned:
        rows.update((m, b, arch) for m, b in model_microbatches)
    out = pd.DataFrame(sorted(rows), columns=["model", "microbatch", "arch"])
    return out.merge(plan[["arch", "chunk"]], on="arch", how="left")


def needed_pairs(
    states: pd.DataFrame, model_microbatches: list[tuple[str, int]]
) -> list[tuple[str, int]]:
    """(model, microbatch) pairs some running search still needs in the next round."""
    live = states[states["running"]]
    if (live["strategy"] == "phaze-common").any():
        return sorted(model_microbatches)
    pairs = {(r.model, int(r.microbatch)) for r in live.itertuples(index=False)}
    return sorted(p for p in model_microbatches if p in pairs)


def answers(
    scores: pd.DataFrame, plan: pd.DataFrame, states: pd.DataFrame, settings: SearchSettings
) -> pd.DataFrame:
    """The answer of each search: the arch with the best achievable score in the buckets it
    visited (up to its stop bucket, or all complete buckets). Rows carry ``mode`` = early_stop,
    and also ``exhaustive`` when every bucket was computed."""
    df = _with_plan(scores, plan)
    total = int(plan["bucket"].max()) + 1
    out = []
    st = states.set_index(SEARCH_KEY)
    for key, grp in df.groupby(SEARCH_KEY, sort=True):
        s = st.loc[key]
        done = int(s["buckets_done"])
        stop = int(s["stop_bucket"])
        limits = [("early_stop", stop if stop >= 0 else done - 1)]
        if settings.mode == "exhaustive" and done == total:
            limits.append(("exhaustive", total - 1))
        for mode, last in limits:
            seen = grp[grp["bucket"] <= last]
            vis = seen[seen["ach"].notna()]
            if vis.empty:
                out.append((*key, mode, None, np.nan, False, last, len(seen), np.nan, np.nan))
                continue
            best = vis.sort_values(["ach", "bucket", "arch"], ascending=[False, True, True]).iloc[0]
            top = upper_bound(seen["hi"].to_numpy(dtype=float))
            out.append(
                (
                    *key,
                    mode,
                    best["arch"],
                    float(best["ach"]),
                    bool(best["exact"]),
                    last,
                    len(seen),
                    top,
                    certified_gap(top, float(best["ach"])),
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
    ]
    return pd.DataFrame(out, columns=SEARCH_KEY + cols)


def upper_bound(upper_bounds: np.ndarray) -> float:
    """The largest proven upper bound among visited architectures; NaN bounds are infeasible
    architectures (no schedule makes them fit) and count as none (NaN if all are)."""
    finite = upper_bounds[np.isfinite(upper_bounds)]
    return float(finite.max()) if len(finite) else np.nan


def certified_gap(top: float, winner: float) -> float:
    """``top`` (:func:`upper_bound` of the visited architectures; NaN: none feasible) / winner − 1,
    floored at 0."""
    if not np.isfinite(winner) or winner <= 0:
        return np.nan
    return max(0.0, (top if np.isfinite(top) else winner) / winner - 1.0)
