"""Enumerate the architecture space: config grid × area filter + named presets.

Every point gets ``arch`` = a stable hash of its parameters (and of any cost-model constants a
preset overrides), so an id means the same hardware in every run and on every machine. The table is
sorted by ``area_mm2`` descending because the search visits the largest area first.
"""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pandas as pd

from phaze.arch import area as am
from phaze.arch.presets import ARCH_KEYS, load_preset
from phaze.errors import PhazeError

MiB = 2**20
# relative slack so the reference point itself (area == A_max) is never lost to rounding
_AREA_RTOL = 1e-9


def arch_id(params: dict, costmodel_overrides: dict | None = None) -> str:
    """Stable 12-hex-digit id of an architecture (ints as ints, frequency as a float)."""
    canon = {k: (float(params[k]) if k == "freq_hz" else int(params[k])) for k in ARCH_KEYS}
    if costmodel_overrides:
        canon["costmodel"] = {k: costmodel_overrides[k] for k in sorted(costmodel_overrides)}
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _grid(arch_cfg: dict) -> pd.DataFrame:
    tied = arch_cfg["vc_width"] == "tc_width"
    axes = {
        "n_tc": arch_cfg["n_tc"],
        "n_vc": arch_cfg["n_vc"],
        "tc_width": arch_cfg["tc_width"],
        "tc_depth": arch_cfg["tc_depth"],
        "vc_width": [0] if tied else arch_cfg["vc_width"],
        "glb_bytes": [round(m * MiB) for m in arch_cfg["glb_mib"]],
        "freq_hz": [float(f) for f in arch_cfg["freq_hz"]],
    }
    axes = {k: sorted(set(v)) for k, v in axes.items()}
    rows = np.array(list(itertools.product(*axes.values())), dtype=np.float64)
    df = pd.DataFrame(rows, columns=list(axes))
    for key in ARCH_KEYS[:-1]:
        df[key] = df[key].astype(np.int64)
    if tied:
        df["vc_width"] = df["tc_width"]
    return df


def _with_model_columns(df: pd.DataFrame, area_cfg: dict) -> pd.DataFrame:
    df = df.copy()
    df["area_mm2"] = am.accelerator_area_mm2(
        df.n_tc.values,
        df.n_vc.values,
        df.tc_width.values,
        df.tc_depth.values,
        df.vc_width.values,
        df.glb_bytes.values,
        area_cfg,
    )
    df["peak_flops"] = am.peak_flops(
        df.n_tc.values, df.tc_width.values, df.tc_depth.values, df.freq_hz.values
    )
    df["tc_local_buffer_bytes"] = am.local_buffer_bytes(
        df.tc_width.values, df.tc_depth.values, area_cfg
    )
    df["vc_local_buffer_bytes"] = am.local_buffer_bytes(df.vc_width.values, 1, area_cfg)
    return df


def preset_rows(names: list[str], costmodel_cfg: dict) -> pd.DataFrame:
    rows = []
    for name in names:
        preset = load_preset(name)
        unknown = sorted(set(preset["costmodel"]) - set(costmodel_cfg))
        if unknown:
            raise PhazeError(f"preset {name!r} overrides unknown costmodel keys {unknown}")
        # only overrides that differ from the config matter (and go into the id)
        overrides = {k: v for k, v in preset["costmodel"].items() if costmodel_cfg[k] != v}
        row = dict(preset["arch"])
        row["preset"] = name
        row["costmodel_overrides"] = json.dumps(overrides, sort_keys=True) if overrides else ""
        row["arch"] = arch_id(preset["arch"], overrides)
        rows.append(row)
    return pd.DataFrame(rows)


def area_budget_mm2(arch_cfg: dict) -> float:
    ref = load_preset(arch_cfg["area_budget"]["reference_preset"])["arch"]
    a_ref = float(
        am.accelerator_area_mm2(
            ref["n_tc"],
            ref["n_vc"],
            ref["tc_width"],
            ref["tc_depth"],
            ref["vc_width"],
            ref["glb_bytes"],
            arch_cfg["area"],
        )
    )
    return a_ref * arch_cfg["area_budget"]["max_fraction"]


def build_space(config: dict) -> tuple[pd.DataFrame, dict]:
    """The space table and a summary dict (grid size, kept, budget)."""
    arch_cfg, area_cfg = config["arch"], config["arch"]["area"]
    budget = arch_cfg["area_budget"]
    a_max = area_budget_mm2(arch_cfg)
    a_min = a_max * budget["min_fraction"] / budget["max_fraction"]

    grid = _with_model_columns(_grid(arch_cfg), area_cfg)
    lower_ok = grid.area_mm2 >= a_min * (1 - _AREA_RTOL)
    if budget["waive_min_when_single_core"]:
        lower_ok |= (grid.n_tc == 1) | (grid.n_vc == 1)
    kept = grid[lower_ok & (grid.area_mm2 <= a_max * (1 + _AREA_RTOL))].copy()
    kept["preset"] = ""
    kept["costmodel_overrides"] = ""
    kept["arch"] = [arch_id(r) for r in kept[list(ARCH_KEYS)].to_dict("records")]

    presets = preset_rows(list(dict.fromkeys(arch_cfg["presets"])), config["costmodel"])
    if not presets.empty:
        presets = _with_model_columns(presets, area_cfg)
        # a preset with a documented local buffer (costmodel override) keeps it
        presets["tc_local_buffer_bytes"] = [
            float(
                am.tc_local_buffer_bytes(
                    r.tc_width,
                    r.tc_depth,
                    area_cfg,
                    {**config["costmodel"], **json.loads(r.costmodel_overrides or "{}")},
                )
            )
            for r in presets.itertuples()
        ]
        # a preset identical to a grid point replaces it (same id), keeping its name
        kept = kept[~kept.arch.isin(set(presets.arch))]
        presets = presets.drop_duplicates("arch")
        kept = pd.concat([kept, presets[kept.columns]], ignore_index=True)

    columns = [
        "arch",
        *ARCH_KEYS,
        "area_mm2",
        "peak_flops",
        "preset",
        "costmodel_overrides",
        "tc_local_buffer_bytes",
        "vc_local_buffer_bytes",
    ]
    space = (
        kept[columns]
        .sort_values(["area_mm2", "arch"], ascending=[False, True])
        .reset_index(drop=True)
    )
    summary = {
        "grid_points": len(grid),
        "kept": len(space),
        "area_budget_mm2": a_max,
        "area_min_mm2": a_min,
        "presets": list(presets.preset) if not presets.empty else [],
    }
    return space, summary
