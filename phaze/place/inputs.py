"""The tables a placement job reads, checked and keyed: per trace (tensor-parallel width t,
expert-parallel size ep, the experts' tensor-parallel size etp: t or 1) its layers, the schedules' per-layer latencies, and for selective
recomputation its operators and their latencies. Both placement objectives read them as
`PlaceInputs`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from phaze.errors import PhazeError

# what a trace was made with: flag -> (layers column, trace.json key)
_RECORDED = {
    "model": ("model", "model"),
    "microbatch": ("microbatch", "microbatch"),
    "seq": ("seq_len", "seq_len"),
    "tp": ("tp", "tp"),
    "ep": ("ep", "ep"),
}


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


def trace_record(trace_dir, layers: pd.DataFrame) -> dict:
    """What the trace in ``trace_dir`` was made with — model, microbatch, seq, tp, ep, etp — from
    its layers table's columns and its ``trace.json`` (where present; None = not recorded). The
    two records and the layers' rows must agree with each other."""
    trace_dir = Path(trace_dir)
    record: dict = {}
    for flag, (column, _) in _RECORDED.items():
        if column in layers.columns:
            values = sorted(set(layers[column].tolist()), key=str)
            if len(values) > 1:
                raise PhazeError(f"{trace_dir}: its layers mix {column} {values}")
            record[flag] = values[0] if values else None
    if "etp1" in layers.columns and record.get("tp") is not None:
        whole = set(layers["etp1"].tolist())
        if len(whole) == 1:
            record["etp"] = 1 if whole == {True} else record["tp"]
    meta_path = trace_dir / "trace.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PhazeError(f"{meta_path} is not valid JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise PhazeError(f"{meta_path} must hold a JSON object")
        for flag, (column, key) in _RECORDED.items():
            if meta.get(key) is None:
                continue
            if record.get(flag) is not None and record[flag] != meta[key]:
                raise PhazeError(
                    f"{trace_dir}: trace.json says {key} {meta[key]!r} but its layers table "
                    f"says {record[flag]!r}"
                )
            record[flag] = meta[key]
    return record


def check_trace_flags(records: dict, flags: dict) -> None:
    """Every trace directory's record (``trace_record``, keyed by directory) against the flags of
    the command line that restate it (``{flag: value or None}``; a list gives one value per
    directory, in order), and the directories against each other (one model, microbatch and
    sequence length): a PhazeError naming both values at the first disagreement."""
    dirs = list(records)
    for flag, value in flags.items():
        if value is None:
            continue
        values = list(value) if isinstance(value, (list, tuple)) else [value] * len(dirs)
        for d, v in zip(dirs, values):
            recorded = records[d].get(flag)
            if recorded is not None and recorded != v:
                raise PhazeError(
                    f"--{flag} {v} but {d} is a trace of {_RECORDED[flag][0] if flag in _RECORDED else flag} "
                    f"{recorded} (trace.json and its layers table)"
                )
    for flag in ("model", "microbatch", "seq"):
        seen = {records[d][flag]: d for d in dirs if records[d].get(flag) is not None}
        if len(seen) > 1:
            (a, da), (b, db) = list(seen.items())[:2]
            raise PhazeError(
                f"the traces disagree: {da} is a trace of {_RECORDED[flag][0]} {a!r}, {db} of {b!r}"
            )


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
