"""The visiting order of the search: area buckets, rounds and chunks.

Upstream visits architectures in buckets of area (``int(area / width)``, 0.01 mm² wide), the
largest bucket first. The workflow groups ``round_buckets`` consecutive buckets into a *round*
(one Snakemake checkpoint per round, the early-stop test between rounds) and splits each round into
chunks of at most ``chunk_archs`` architectures (one estimate/schedule job per chunk and trace).
Chunks never straddle rounds, so a stop after round r means no job of round r+1 is ever created.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.errors import PhazeError

PLAN_COLUMNS = ["arch", "area_mm2", "bucket", "bucket_area_mm2", "round", "chunk", "preset"]


def bucket_of(area_mm2: np.ndarray | pd.Series, width_mm2: float) -> np.ndarray:
    """Integer bucket key of each area (``floor(area / width)``, upstream's ``int(a / w)``)."""
    if not width_mm2 > 0:
        raise PhazeError(f"search.bucket_width_mm2 must be > 0, got {width_mm2}")
    # A tiny relative tolerance so that 0.3 / 0.01 (= 29.999999999999996) lands in bucket 30.
    return np.floor(np.asarray(area_mm2, dtype=float) / width_mm2 * (1 + 1e-12)).astype(np.int64)


def make_plan(
    space: pd.DataFrame,
    width_mm2: float,
    round_buckets: int,
    chunk_archs: int,
    pinned_presets: tuple[str, ...] = ("tpuv4",),
    budget_mm2: float | None = None,
) -> pd.DataFrame:
    """Assign each architecture its bucket (0 = largest area), round and chunk.

    ``bucket`` numbers the non-empty area buckets in visiting order. Architectures whose
    ``preset`` is in ``pinned_presets`` (the baselines) are computed in round 0 whatever their area
    — they are needed by the comparison even if the search stops earlier — but keep their own
    bucket, so the search only counts them once it reaches that bucket. A preset larger than
    ``budget_mm2`` (the area budget, e.g. the faithful tpuv4 next to upstream's budget point) is
    not a candidate of the search: its bucket is −1 (computed for the comparison only).
    """
    if round_buckets < 1 or chunk_archs < 1:
        raise PhazeError("search.round_buckets and search.chunk_archs must be >= 1")
    if space.empty:
        raise PhazeError("the architecture space is empty")
    if space["arch"].duplicated().any():
        raise PhazeError("duplicate arch ids in the architecture space")
    df = pd.DataFrame(
        {
            "arch": space["arch"].astype(str).to_numpy(),
            "area_mm2": space["area_mm2"].astype(float).to_numpy(),
            "preset": (
                space["preset"].fillna("").astype(str).to_numpy()
                if "preset" in space.columns
                else np.full(len(space), "", dtype=object)
            ),
        }
    )
    key = bucket_of(df["area_mm2"], width_mm2)
    outside = np.zeros(len(df), dtype=bool)
    if budget_mm2 is not None:
        outside = (df["preset"] != "").to_numpy() & (
            df["area_mm2"].to_numpy() > budget_mm2 * (1 + 1e-9)
        )
    keys_desc = np.unique(key[~outside])[::-1]
    order = {k: i for i, k in enumerate(keys_desc)}
    df["bucket"] = np.array(
        [-1 if out else order[k] for k, out in zip(key, outside)], dtype=np.int64
    )
    df["bucket_area_mm2"] = key * width_mm2  # lower edge of the bucket
    if (df["bucket"] < 0).all():
        raise PhazeError("no architecture of the space lies within the area budget")
    df["round"] = np.maximum(df["bucket"], 0) // round_buckets
    df.loc[df["preset"].isin(pinned_presets), "round"] = 0
    # Deterministic order inside a round: bucket, then larger area, then id.
    df = df.sort_values(
        ["round", "bucket", "area_mm2", "arch"], ascending=[True, True, False, True]
    )
    df = df.reset_index(drop=True)
    chunk = np.empty(len(df), dtype=np.int64)
    next_chunk = 0
    for idx in df.groupby("round", sort=True).indices.values():
        n = len(idx)
        chunk[idx] = next_chunk + np.arange(n) // chunk_archs
        next_chunk += -(-n // chunk_archs)
    df["chunk"] = chunk
    return df[PLAN_COLUMNS]


def n_rounds(plan: pd.DataFrame) -> int:
    return int(plan["round"].max()) + 1
