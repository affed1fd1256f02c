"""The tables a placement job reads, checked and keyed: per trace (tensor-parallel width t and
expert-parallel size ep) its layers, the schedules' per-layer latencies, and for selective
recomputation its operators and their latencies. Both placement objectives read them as
`PlaceInputs`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from phaze.errors import PhazeError


def by_trace(tables: dict | None) -> dict | None:
    """A per-trace mapping keyed by tp (ep = 1) or by (tp, ep), keyed by (tp, ep)."""
    if tables is None:
        return None
    return {(k if isinstance(k, tuple) else (k, 1)): v for k, v in tables.items()}


def check_layers(layers: pd.DataFrame, where: str) -> pd.DataFrame:
    need = [
        "layer",
        "kind",
        "signature",
        "param_bytes",
        "activation_bytes",
        "stash_recompute_bytes",
        "boundary_bytes",
        "tensor_parallel",
    ]
    missing = [c for c in need if c not in layers.columns]
    if missing:
        raise PhazeError(f"{where}: layers table lacks columns {missing}")
    if "index" in layers.columns:
        layers = layers.sort_values("index", kind="stable")
    layers = layers.reset_index(drop=True)
    if len(layers) == 0:
        raise PhazeError(f"{where}: layers table is empty")
    for c in ["param_bytes", "activation_bytes", "stash_recompute_bytes", "boundary_bytes"]:
        if (layers[c] < 0).any():
            raise PhazeError(f"{where}: negative {c}")
    return layers


def layer_latencies(schedule: pd.DataFrame, column: str, where: str) -> dict:
    """{(arch, signature, pass): latency_s}"""
    if column not in schedule.columns:
        raise PhazeError(f"{where}: schedule table lacks column {column!r}")
    vals = schedule[column].to_numpy(dtype=float)
    if np.any(~np.isfinite(vals)) or np.any(vals < 0):
        bad = schedule.loc[~np.isfinite(vals) | (vals < 0), ["arch", "signature", "pass"]].head(3)
        raise PhazeError(
            f"{where}: {column} must be finite and >= 0; e.g. {bad.to_dict('records')}"
        )
    return dict(zip(zip(schedule["arch"], schedule["signature"], schedule["pass"]), vals))


@dataclass
class PlaceInputs:
    """The checked tables of one placement job, keyed by (t, ep)."""

    layers: dict  # (t, ep) -> layers table (checked, in model order)
    schedules: dict  # (t, ep) -> schedule table
    lookups: dict  # (t, ep) -> {(arch, signature, pass): latency_s} of `latency_column`
    latency_column: str  # makespan_s (achievable) or a lower bound's column
    ops: dict | None  # (t, ep) -> the trace's ops table (selective recomputation)
    latencies: dict | None  # (t, ep) -> the operators' latencies (selective recomputation)
    archs: set  # the architectures scheduled for every trace

    @classmethod
    def build(
        cls,
        layers_by_t: dict,
        schedules_by_t: dict,
        latency_column: str = "makespan_s",
        ops_by_t: dict | None = None,
        latencies_by_t: dict | None = None,
    ) -> PlaceInputs:
        """Tables keyed by tensor-parallel width t, or by (t, ep) for the traces of a
        mixture-of-experts model at expert-parallel size ep."""
        layers_by_t, schedules_by_t = by_trace(layers_by_t), by_trace(schedules_by_t)
        layers = {
            k: check_layers(df, f"layers (t={k[0]}, ep={k[1]})") for k, df in layers_by_t.items()
        }
        lookups = {
            k: layer_latencies(df, latency_column, f"schedule (t={k[0]}, ep={k[1]})")
            for k, df in schedules_by_t.items()
        }
        arch_sets = [set(df["arch"]) for df in schedules_by_t.values()]
        common = set.intersection(*arch_sets)
        if set.union(*arch_sets) != common:
            odd = sorted(set.union(*arch_sets) - common)[:5]
            raise PhazeError(f"schedules of different t cover different architectures, e.g. {odd}")
        return cls(
            layers=layers,
            schedules=schedules_by_t,
            lookups=lookups,
            latency_column=latency_column,
            ops=by_trace(ops_by_t),
            latencies=by_trace(latencies_by_t),
            archs=common,
        )

    def covered(self, space: pd.DataFrame) -> pd.DataFrame:
        """The rows of the space table scheduled for every trace; an architecture scheduled but
        missing from the space is an error."""
        unknown = sorted(self.archs - set(space["arch"]))
        if unknown:
            raise PhazeError(f"scheduled architectures missing from the space table: {unknown[:5]}")
        return space[space["arch"].isin(self.archs)]
