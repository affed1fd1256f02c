"""Tables mode: from the trace, schedule and space tables to one placement row per architecture
and cluster size, in seconds and bytes, under the placement objective of config ``place.model``
(`phaze.place.objective`): ``megatron`` (phaze/place/objective_megatron.py, the default) or
``upstream`` (phaze/place/objective_upstream.py). This module writes the rows; the objectives
place and price.
"""

from __future__ import annotations

import pandas as pd

from phaze.place.inputs import PlaceInputs
from phaze.place.objective import Objective
from phaze.place.objective_megatron import MegatronObjective
from phaze.place.objective_upstream import UpstreamObjective
from phaze.place.settings import PlaceSettings

#: config ``place.model`` -> its objective
OBJECTIVES: dict[str, type[Objective]] = {
    "megatron": MegatronObjective,
    "upstream": UpstreamObjective,
}


def place_architectures(
    settings: PlaceSettings,
    layers_by_t: dict,
    schedules_by_t: dict,
    space: pd.DataFrame,
    costmodel: dict,
    devices_list: list[int],
    latency_column: str = "makespan_s",
    ops_by_t: dict | None = None,
    latencies_by_t: dict | None = None,
) -> pd.DataFrame:
    """One row per architecture (those scheduled for every trace) × cluster size. The tables are
    keyed by tensor-parallel width t, or by (t, ep) for the traces of a mixture-of-experts model at
    expert-parallel size ep (the megatron model searches ep; the upstream model places the ep = 1
    traces). `ops_by_t` (the traces' ops) and `latencies_by_t` (the operators' latencies) are
    needed when the megatron model searches selective recomputation."""
    inputs = PlaceInputs.build(
        layers_by_t, schedules_by_t, latency_column, ops_by_t, latencies_by_t
    )
    space = inputs.covered(space)
    objective = OBJECTIVES[settings.place_model](settings, inputs)
    rows = []
    for _, arch_row in space.sort_values("arch").iterrows():
        preset = arch_row.get("preset") if "preset" in arch_row.index else None
        preset = preset if isinstance(preset, str) and preset else None
        base = {
            "arch": arch_row["arch"],
            "model": settings.model,
            "hbm_capacity_bytes": int(settings.hbm_capacity_bytes),
            "microbatch": settings.microbatch,
            "place_model": settings.place_model,
        }
        for row in objective.rows(arch_row, preset, costmodel, devices_list):
            rows.append({**base, **row})
    return pd.DataFrame(rows)
