"""One line per search round, for a person watching a long run.

After each round the ``search_state`` checkpoint records where the run stands (``progress`` in
``results/search/r{round}/state.json``) and prints it: the round, how many searches still run and
how many stopped, the architectures visited so far, how many (model, microbatch, arch) triples
were given the ILP (and of them, the deep ILP) and how many the bounds settled without it, the
CPU seconds of the jobs so far
(the ``cpu_time`` column of Snakemake's ``benchmark:`` files) and each model's best throughput so
far (over its Phaze-Per-Model searches).
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
    scores: pd.DataFrame,
    states: pd.DataFrame,
    round_: int,
    rounds_total: int,
) -> dict:
    """Where the run stands after ``round_``.

    ``scores`` are :func:`phaze.search.scores.all_scores` of every placement so far (columns
    ``strategy``, ``model``, ``microbatch``, ``arch``, ``ach``, ``has_ilp``), ``states`` the
    :func:`phaze.search.scores.search_states` after the round."""
    per_model = scores[scores["strategy"] == "phaze-per-model"]
    triples = per_model[["model", "microbatch", "arch", "has_ilp", "has_deep"]]
    by_triple = triples.groupby(["model", "microbatch", "arch"])
    solved, deepened = by_triple["has_ilp"].any(), by_triple["has_deep"].any()
    best = {}
    for model, grp in per_model.groupby("model", sort=True):
        ach = grp["ach"].to_numpy(dtype=float)
        ach = ach[np.isfinite(ach)]
        best[str(model)] = float(ach.max()) if len(ach) else None
    return {
        "round": int(round_),
        "rounds_total": int(rounds_total),
        "searches_running": int(states["running"].sum()),
        "searches_stopped": int((states["stop_bucket"] >= 0).sum()),
        "searches": len(states),
        "archs_visited": int(per_model["arch"].nunique()),
        "ilp_solved": int(solved.sum()),
        "ilp_avoided": int((~solved).sum()),
        "ilp_deepened": int(deepened.sum()),
        "best_throughput_seq_s": best,
    }


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.4g}"


def progress_line(doc: dict) -> str:
    """The one-line form of :func:`round_progress`'s dict, with ``jobs_cpu_s`` added (None: not
    known)."""
    best = ", ".join(f"{m} {_fmt(v)}" for m, v in doc["best_throughput_seq_s"].items())
    cpu = "-" if doc.get("jobs_cpu_s") is None else f"{doc['jobs_cpu_s']:.0f}"
    return (
        f"phaze search: round {doc['round'] + 1}/{doc['rounds_total']}: "
        f"{doc['searches_running']} searches running, {doc['searches_stopped']}/{doc['searches']} "
        f"stopped; {doc['archs_visited']} archs visited; ILP for {doc['ilp_solved']} "
        f"(model, microbatch, arch) ({doc['ilp_deepened']} deepened), "
        f"{doc['ilp_avoided']} settled by bounds; jobs {cpu} CPU-s; "
        f"best seq/s: {best or '-'}"
    )
