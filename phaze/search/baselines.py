"""Baselines on the same cost model.

* ``tpuv4-expert``: the ``tpuv4`` preset with the fixed expert (pp, dp, tp) placement — the
  ``expert_*`` columns of its placement rows;
* ``tpuv4-phaze``: the ``tpuv4`` preset with our placement;
* ``placement-blind`` (in the spirit of Spotlight): the architecture that minimises the
  single-accelerator latency of one training step of the model's layers — each op run alone at its
  faster of one core / all cores, summed over every layer of the model, forward and backward — over
  the whole space (the same area budget as the search), then our placement on it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.estimate.stage import arch_op_rows, latency_arrays

#: op x architecture rows of the latency table held at once by
#: :func:`space_single_accelerator_latency` (~100 B a row in the long table and its group-by:
#: a few hundred MB, whatever the size of the space)
BLOCK_ROWS = 1 << 20


def single_accelerator_latency(latency: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """Per arch: ``latency_s`` of one microbatch's forward + backward through every layer, ops
    executed one at a time (no operator scheduling, no device placement: what a placement-blind
    accelerator search optimises). ``layers`` gives each layer's signature (t = 1 trace)."""
    need = {"arch", "signature", "pass", "latency_1core_s", "latency_allcores_s"}
    if not need <= set(latency.columns):
        raise PhazeError(f"latency table lacks {sorted(need - set(latency.columns))}")
    per_op = np.minimum(
        latency["latency_1core_s"].to_numpy(), latency["latency_allcores_s"].to_numpy()
    )
    per_sig = (
        pd.DataFrame({"arch": latency["arch"], "signature": latency["signature"], "s": per_op})
        .groupby(["arch", "signature"], sort=False)["s"]
        .sum()
        .reset_index()
    )
    counts = layers["signature"].value_counts().rename("count").reset_index()
    missing = set(counts["signature"]) - set(per_sig["signature"])
    if missing:
        raise PhazeError(f"latency table has no ops for layer signatures {sorted(missing)[:3]}")
    per_sig = per_sig.merge(counts, on="signature", how="inner")
    per_sig["s"] *= per_sig["count"]
    return per_sig.groupby("arch", sort=False)["s"].sum().rename("latency_s").reset_index()


def space_single_accelerator_latency(
    ops: pd.DataFrame,
    layers: pd.DataFrame,
    space: pd.DataFrame,
    costmodel: dict,
    place: dict | None = None,
    block_rows: int = BLOCK_ROWS,
) -> pd.DataFrame:
    """:func:`single_accelerator_latency` of every architecture of ``space``, estimated and
    reduced a block of architectures at a time so that only ``block_rows`` latency rows exist at
    once. An architecture's value depends on its own rows alone, in the same order in a block as
    in the whole table, so the values are the whole table's bit for bit."""
    if block_rows < 1:
        raise PhazeError(f"block_rows must be positive, got {block_rows}")
    step = max(1, block_rows // max(1, len(ops)))
    parts = []
    for start in range(0, len(space), step):
        block = space.iloc[start : start + step]
        arrays = latency_arrays(ops, block, costmodel, place)
        latency = pd.DataFrame(
            arch_op_rows(ops, block["arch"], ("signature", "pass"))
            | {name: a.reshape(-1) for name, a in arrays.items()}
        )
        parts.append(single_accelerator_latency(latency, layers))
    if not parts:
        raise PhazeError("the space has no architectures for the placement-blind baseline")
    return pd.concat(parts, ignore_index=True)


def placement_blind_choice(per_arch: pd.DataFrame, space: pd.DataFrame) -> pd.DataFrame:
    """The arch with the lowest single-accelerator latency (``per_arch``: arch, latency_s, as
    :func:`single_accelerator_latency` gives it; ties: larger area, then id)."""
    lat = per_arch[["arch", "latency_s"]].merge(space[["arch", "area_mm2"]], on="arch", how="inner")
    if lat.empty:
        raise PhazeError("no architecture has latencies for the placement-blind baseline")
    lat = lat.sort_values(["latency_s", "area_mm2", "arch"], ascending=[True, False, True])
    return lat.iloc[[0]].reset_index(drop=True)


def best_row(rows: pd.DataFrame, column: str = "throughput_seq_s") -> pd.Series | None:
    """The row with the highest finite ``column`` (ties: the smaller microbatch)."""
    ok = rows[np.isfinite(rows[column].astype(float))]
    if ok.empty:
        return None
    keys = [column] + [c for c in ("microbatch",) if c in ok.columns]
    asc = [False] + [True] * (len(keys) - 1)
    return ok.sort_values(keys, ascending=asc).iloc[0]
