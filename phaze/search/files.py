"""Reading the workflow's placement files and writing the search's own files."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from phaze.errors import PhazeError
from phaze.io.tables import read_table

_TIER = re.compile(r"(?:^|_)(ub|lo|ilp)$")


def tier_of(path: str | Path) -> str:
    """Placement files are named ``r{round}_{tier}.parquet`` (tier ub|lo|ilp); baseline files
    (``blind.parquet``) hold ILP-tier results."""
    stem = Path(path).stem
    m = _TIER.search(stem)
    if m:
        return m.group(1)
    if stem == "blind":
        return "ilp"
    raise PhazeError(f"cannot tell the placement tier from the file name {path}")


def load_place(paths: list[str]) -> pd.DataFrame:
    frames = []
    for p in paths:
        df = read_table(p, "place")
        frames.append(df.assign(tier=tier_of(p), source=str(p)))
    if not frames:
        return pd.DataFrame(columns=["tier"])
    return pd.concat(frames, ignore_index=True)
