"""The tables a placement job reads, checked and keyed: per trace (tensor-parallel width t,
expert-parallel size ep, the experts' tensor-parallel size etp: t or 1) its layers, the schedules' per-layer latencies, and for selective
recomputation its operators and their latencies. Both placement objectives read them as
`PlaceInputs`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from phaze.errors import PhazeError


def trace_key(k) -> tuple[int, int, int]:
    """(tp, ep, etp) of a per-trace key: tp alone (ep = 1), (tp, ep) (the experts split over tp,
    etp = tp) or (tp, ep, etp)."""
    k = k if isinstance(k, tuple) else (k,)
    if len(k) == 1:
        k = (*k, 1)
    return k if len(k) == 3 else (*k, k[0])


def trace_shapes(tps, eps, etps) -> list[tuple[int, int, int]]:
    """(tp, ep, etp) of each trace directory of a command line: ``--tp``, ``--ep`` (default 1
    each) and ``--etp`` (default its tp each), one entry per directory, each shape once."""
    eps = list(eps) if eps else [1] * len(tps)
    etps = list(etps) if etps else list(tps)
    for flag, values in (("--ep", eps), ("--etp", etps)):
        if len(values) != len(tps):
            raise PhazeError(f"{flag} ({len(values)}) needs one entry per tp ({len(tps)})")
    if any(e < 1 for e in eps):
        raise PhazeError(f"expert-parallel sizes must be >= 1, got {eps}")
    if any(x not in (1, t) for t, x in zip(tps, etps)):
        raise PhazeError(f"--etp sizes must be their tp or 1, got {etps} for --tp {list(tps)}")
    shapes = list(zip(tps, eps, etps))
    if len(set(shapes)) != len(shapes):
        raise PhazeError(f"--tp/--ep/--etp list a trace twice: {shapes}")
    return shapes


def trace_label(k) -> str:
    """How messages name a trace: tp, then ep and whole experts where they apply."""
    t, ep, etp = trace_key(k)
    return f"t={t}" + (f", ep={ep}" if ep > 1 else "") + (", etp=1" if etp != t else "")


def by_trace(tables: dict | None) -> dict | None:
    """A per-trace mapping keyed by tp, (tp, ep) or (tp, ep, etp), keyed by (tp, ep, etp)."""
    if tables is None:
        return None
    return {trace_key(k): v for k, v in tables.items()}


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
    """The checked tables of one placement job, keyed by (t, ep, etp)."""

    layers: dict  # (t, ep, etp) -> layers table (checked, in model order)
    schedules: dict  # (t, ep, etp) -> schedule table
    lookups: dict  # (t, ep, etp) -> {(arch, signature, pass): latency_s} of `latency_column`
    latency_column: str  # makespan_s (achievable) or a lower bound's column
    ops: dict | None  # (t, ep, etp) -> the trace's ops table (selective recomputation)
    latencies: dict | None  # (t, ep, etp) -> the operators' latencies (selective recomputation)
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
        """Tables keyed by tensor-parallel width t, or by (t, ep) or (t, ep, etp) for the traces
        of a mixture-of-experts model at expert-parallel size ep (and whole experts, etp = 1)."""
        layers_by_t, schedules_by_t = by_trace(layers_by_t), by_trace(schedules_by_t)
        layers = {
            k: check_layers(df, f"layers ({trace_label(k)})") for k, df in layers_by_t.items()
        }
        lookups = {
            k: layer_latencies(df, latency_column, f"schedule ({trace_label(k)})")
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
