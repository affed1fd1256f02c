"""The interface of a placement objective: how one architecture is placed and priced.

An objective is built once per placement job from its `PlaceSettings` and `PlaceInputs` (what every
architecture shares: chain tables, graphs, lookups) and then yields, per architecture and cluster
size, one row of `phaze.place.columns` (the searched placement and the expert placement). Two
implement it — ``megatron`` (the step model of docs/step.md, phaze/place/objective_megatron.py)
and ``upstream`` (Phaze's own objective, phaze/place/objective_upstream.py) — selected by config
``place.model``; phaze/place/tables.py writes their rows as the placement table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import pandas as pd

from phaze.place.inputs import PlaceInputs
from phaze.place.settings import PlaceSettings


class Objective(Protocol):
    def __init__(self, settings: PlaceSettings, inputs: PlaceInputs) -> None: ...

    def rows(
        self, arch_row: pd.Series, preset: str | None, costmodel: dict, devices_list: list[int]
    ) -> Iterator[dict]:
        """Per cluster size: ``devices``, ``feasible``, ``reason``, ``network`` and the result
        columns of the searched and the expert placement."""
        ...
