"""One line per search round, for a person watching a long run.

Before each round the ``search_select`` checkpoint records where the run stands (``progress`` in
``results/search/r{round}/state.json``) and prints it: the round and what it refines, the
architectures refined so far and how many (model, microbatch, arch) triples were given the ILP
(and the deep ILP), the area walk's searches running and stopped, the global searches' largest
certificate and front certificate and how many are still open, the CPU seconds of the jobs so
far (the ``cpu_time`` column of Snakemake's ``benchmark:`` files) and each model's best
throughput so far.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

#: the column of a Snakemake benchmark file holding the job's CPU seconds (user + system)
BENCH_CPU_COLUMN = "cpu_time"


def jobs_cpu_seconds(bench_dir: str | Path | None) -> float | None:
    """Sum of ``cpu_time`` over every ``*.tsv`` benchmark file under ``bench_dir`` (None when no
    directory is given). A file being written or without the column counts as 0."""
    if bench_dir is None:
        return None
    total = 0.0
    for path in sorted(Path(bench_dir).rglob("*.tsv")):
        try:
            df = pd.read_csv(path, sep="\t")
        except (OSError, ValueError, pd.errors.EmptyDataError):
            continue
        if BENCH_CPU_COLUMN in df.columns:
            col = pd.to_numeric(df[BENCH_CPU_COLUMN], errors="coerce")
            total += float(col[np.isfinite(col)].sum())
    return total


def round_progress(
    comp: pd.DataFrame,
    picture: dict,
    walk: pd.DataFrame,
    selection: pd.DataFrame,
    round_: int,
    settings,
) -> dict:
    """Where the run stands before round ``round_`` (:func:`phaze.search.commands.select_round`).

    ``comp``: every component known (:func:`phaze.search.scores.components`, space bounds
    included); ``picture``: :func:`phaze.search.rounds.search_picture`; ``walk``: the walk's
    states; ``selection``: the components the round refines."""
    refined = comp[comp["level"] >= 1]
    triples = refined[["model", "microbatch", "arch"]].drop_duplicates()
    ilp = comp[comp["level"] >= 2][["model", "microbatch", "arch"]].drop_duplicates()
    deep = comp[comp["level"] >= 3][["model", "microbatch", "arch"]].drop_duplicates()
    certified = comp[comp["has_certify"].astype(bool)][["model", "microbatch", "arch"]]
    certified = certified.drop_duplicates()
    best, gaps = {}, {}
    states = picture.get("global_states")
    if states is not None and len(states):
        pm = states[states["strategy"] == "phaze-per-model"]
        for model, grp in pm.groupby("model", sort=True):
            score = grp["score"].to_numpy(dtype=float)
            best[str(model)] = float(np.nanmax(score)) if np.isfinite(score).any() else None
        gaps = {
            "certified_gap_max": _finite_max(states["certified_gap"]),
            "front_gap_max": _finite_max(states["front_gap"]),
            "searches_open": int(((states["open_gap"] + states["open_front"]) > 0).sum()),
            "searches": len(states),
        }
    else:
        pm = comp[comp["ach"].notna()]
        for model, grp in pm.groupby("model", sort=True):
            best[str(model)] = float(grp["ach"].max())
    return {
        "round": int(round_),
        "mode": settings.mode,
        "walk_running": int(walk["running"].sum()) if len(walk) else 0,
        "walk_stopped": int((walk["stop_bucket"] >= 0).sum()) if len(walk) else 0,
        "walk_searches": len(walk),
        "archs_refined": int(triples["arch"].nunique()),
        "components_refined": len(triples),
        "components_ilp": len(ilp),
        "components_deep": len(deep),
        "components_certified": len(certified),
        "components_this_round": len(selection),
        "archs_this_round": int(selection["arch"].nunique()) if len(selection) else 0,
        "best_throughput_seq_s": best,
        **gaps,
    }


def _finite_max(col: pd.Series) -> float | None:
    v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)
    v = v[~np.isnan(v)]
    return float(v.max()) if len(v) else None


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.4g}"


def progress_line(doc: dict) -> str:
    """The one-line form of :func:`round_progress`'s dict, with ``jobs_cpu_s`` added (None: not
    known)."""
    best = ", ".join(f"{m} {_fmt(v)}" for m, v in doc["best_throughput_seq_s"].items())
    cpu = "-" if doc.get("jobs_cpu_s") is None else f"{doc['jobs_cpu_s']:.0f}"
    cert = ""
    if "searches" in doc:
        cert = (
            f"; certificate {_pct(doc.get('certified_gap_max'))}, front "
            f"{_pct(doc.get('front_gap_max'))}, {doc['searches_open']}/{doc['searches']} "
            "global searches open"
        )
    return (
        f"phaze search: round {doc['round']}: refining {doc['components_this_round']} "
        f"(model, microbatch, arch) of {doc['archs_this_round']} archs; so far "
        f"{doc['archs_refined']} archs refined, ILP for {doc['components_ilp']} "
        f"({doc['components_deep']} deepened, {doc['components_certified']} certified); "
        f"walk {doc['walk_running']} running, {doc['walk_stopped']}/{doc['walk_searches']} "
        f"stopped{cert}; jobs {cpu} CPU-s; "
        f"best seq/s: {best or '-'}"
    )


def _pct(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{100 * x:.2f} %"
