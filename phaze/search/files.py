"""The search's input files: placement and schedule tables listed in a manifest (phaze.io.manifest)
with the round and tier each holds; nothing is read from a file's name."""

from __future__ import annotations

import pandas as pd

from phaze.errors import PhazeError
from phaze.io.manifest import read_manifest
from phaze.io.tables import read_table
from phaze.search.scores import TIERS

#: placement tiers (phaze.search.scores): ub = on lower bounds, lo = on list schedules, ilp = on
#: the ILP's makespans, ilp_ub = on the ILP's proven lower bounds, deep / deep_ub = the same on
#: the deeper ILP (``space``, the space bound, comes in tables of its own: kind "space")
PLACE_TIERS = tuple(t for t in TIERS if t != "space")
#: schedule tiers: bounds (list schedule + lower bound), ilp, deep, blind (the baseline's ILP)
SCHEDULE_TIERS = ("bounds", "ilp", "deep", "blind")

#: kind -> the keys (and types) of each manifest entry, besides its path
MANIFEST_FIELDS = {
    "place": {"model": str, "microbatch": int, "round": int, "tier": str},
    "space": {"model": str, "microbatch": int},
    "blind_place": {"model": str, "microbatch": int, "tier": str},
    "blind": {"model": str},
    "schedules": {"model": str, "microbatch": int, "tp": int, "tier": str},
}


def load_manifest(path: str, kinds: tuple[str, ...]) -> dict[str, list[dict]]:
    """The manifest's entries of ``kinds`` (any other kind in it is an error), tiers checked."""
    doc = read_manifest(path, {k: MANIFEST_FIELDS[k] for k in kinds})
    for kind, entries in doc.items():
        allowed = SCHEDULE_TIERS if kind == "schedules" else PLACE_TIERS
        for e in entries:
            if "tier" in e and e["tier"] not in allowed:
                raise PhazeError(
                    f"manifest {path}: {e['path']} has tier {e['tier']!r} (known: {allowed})"
                )
    return doc


def load_place(entries: list[dict]) -> pd.DataFrame:
    """Placement tables with the manifest's ``tier`` and the file as ``source``."""
    frames = []
    for e in entries:
        df = read_table(e["path"], "place")
        frames.append(df.assign(tier=e["tier"], source=e["path"]))
    if not frames:
        return pd.DataFrame(columns=["tier", "source"])
    return pd.concat(frames, ignore_index=True)


def load_space(entries: list[dict]) -> pd.DataFrame:
    """The space bounds (``phaze search bounds``) of every (model, microbatch) listed."""
    frames = []
    for e in entries:
        df = read_table(e["path"], "bounds")
        bad = (df["model"] != e["model"]) | (df["microbatch"] != e["microbatch"])
        if bad.any():
            raise PhazeError(
                f"{e['path']}: rows of another model or microbatch than the manifest says "
                f"({e['model']}, {e['microbatch']})"
            )
        frames.append(df)
    if not frames:
        return pd.DataFrame(
            columns=[
                "arch",
                "model",
                "microbatch",
                "hbm_capacity_bytes",
                "devices",
                "throughput_upper_seq_s",
                "dominated_by",
            ]
        )
    return pd.concat(frames, ignore_index=True)
