"""The one place that owns every stage's table schema (the contract between stages).

Column names carry their unit (seconds, bytes, FLOPs, Hz, mm²). ``write_table`` checks a frame
against its schema (missing columns and non-castable types are errors), casts, and writes
atomically; ``read_table`` checks what it reads. Extra columns are allowed and kept: a stage may
record more than the contract requires.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from phaze.errors import PhazeError
from phaze.io.atomic import atomic_path
from phaze.step.strategy import DDP_MODES, RECOMPUTE_MODES
from phaze.trace.moe import ROLES as MOE_ROLES

i64, f64, s, b = pa.int64(), pa.float64(), pa.string(), pa.bool_()


#: a chosen placement strategy's columns (best and comparison tables)
_STRATEGY = (
    ("recompute", s),
    ("interleave", i64),
    ("sequence_parallel", b),
    ("distributed_optimizer", b),
    ("ddp", s),
    ("pp", i64),
    ("tp", i64),
    ("dp", i64),
    # expert-parallel size inside dp (1: a dense model; -1 when unknown)
    ("ep", i64),
    # the experts' tensor-parallel size: tp, or 1 for whole experts (Megatron's
    # --expert-tensor-parallel-size; -1 when unknown)
    ("etp", i64),
)


#: a global search (strategy, common score, model, HBM, cluster size) and one architecture of it
_SEARCH_ARCH = (
    ("strategy", s),
    ("common_score", s),
    ("model", s),
    ("hbm_capacity_bytes", i64),
    ("devices", i64),
    ("arch", s),
    ("area_mm2", f64),
)


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in fields])


SCHEMAS: dict[str, pa.Schema] = {
    # --- trace -------------------------------------------------------------------------------
    "ops": _schema(
        ("layer", s),
        ("pass", s),
        ("op", i64),
        ("aten", s),
        ("kind", s),
        ("m", i64),
        ("n", i64),
        ("k", i64),
        ("batch", i64),
        ("elements", i64),
        ("flops", f64),
        ("bytes_in", i64),
        ("bytes_out", i64),
        ("weight_bytes", i64),
        # agreed extras (interfaces): graph signature, fusion, core class, collectives
        ("signature", s),
        ("fused_into", i64),
        ("core", s),
        ("collective", s),
        ("group_size", i64),
        # core attention (forward) / outside the tensor-parallel region (phaze.trace.recorder)
        ("attention", b),
        ("replicated", b),
        # mixture-of-experts layers (phaze.trace.moe_layer): the op's role ("" outside one) and
        # its routed expert (-1 for none); absent from a table: DEFAULTS (a dense table)
        ("moe_role", s),
        ("expert", i64),
    ),
    "edges": _schema(
        ("layer", s),
        ("pass", s),
        ("src", i64),
        ("dst", i64),
        ("bytes", i64),
        ("signature", s),
    ),
    "layers": _schema(
        ("layer", s),
        ("kind", s),
        ("signature", s),
        ("param_bytes", i64),
        ("activation_bytes", i64),
        ("attention_activation_bytes", i64),
        ("replicated_activation_bytes", i64),
        ("stash_recompute_bytes", i64),
        ("boundary_bytes", i64),
        ("tensor_parallel", b),
        ("index", i64),
        ("fwd_flops", f64),
        ("bwd_flops", f64),
        # of param_bytes, the routed experts' (what expert parallelism divides), and their count
        ("expert_param_bytes", i64),
        ("experts", i64),
        # the expert-parallel size the trace is one rank of (1 for a dense model)
        ("ep", i64),
        # etp = 1: the routed experts are whole on each rank, not split over the tensor-parallel
        # ranks (Megatron's --expert-tensor-parallel-size 1); false: etp = tp
        ("etp1", b),
    ),
    # --- arch --------------------------------------------------------------------------------
    "space": _schema(
        ("arch", s),
        ("n_tc", i64),
        ("n_vc", i64),
        ("tc_width", i64),
        ("tc_depth", i64),
        ("vc_width", i64),
        ("glb_bytes", i64),
        ("freq_hz", f64),
        ("area_mm2", f64),
        ("peak_flops", f64),
    ),
    # --- estimate ----------------------------------------------------------------------------
    "latency": _schema(
        ("arch", s),
        ("signature", s),
        ("pass", s),
        ("op", i64),
        ("core", s),
        ("latency_1core_s", f64),
        ("latency_allcores_s", f64),
        ("bound", s),
    ),
    # --- schedule ----------------------------------------------------------------------------
    "schedule": _schema(
        ("arch", s),
        ("signature", s),
        ("pass", s),
        ("makespan_s", f64),
        ("lower_bound_s", f64),
        ("mip_gap", f64),
        ("status", s),
        ("solve_s", f64),
        ("peak_tc", i64),
        ("peak_vc", i64),
        ("upper_bound_s", f64),
        ("method", s),
    ),
    # --- place -------------------------------------------------------------------------------
    "place": _schema(
        ("arch", s),
        ("model", s),
        ("devices", i64),
        ("hbm_capacity_bytes", i64),
        ("microbatch", i64),
        ("place_model", s),
        ("feasible", b),
        ("throughput_seq_s", f64),
        ("time_per_batch_s", f64),
        ("mfu", f64),
        ("pp", i64),
        ("tp", i64),
        ("dp", i64),
        # expert-parallel size (inside dp; 1 for a dense model, 0 where nothing fits)
        ("ep", i64),
        # the experts' tensor-parallel size (tp, or 1: whole experts; 0 where nothing fits)
        ("etp", i64),
        # the placement axes (docs/step.md)
        ("interleave", i64),
        ("recompute", s),
        ("sequence_parallel", b),
        ("distributed_optimizer", b),
        ("ddp", s),
        ("stages", s),
        ("stage_mem_bytes", s),
        ("expert_feasible", b),
        ("expert_reason", s),
        ("expert_throughput_seq_s", f64),
        ("expert_time_per_batch_s", f64),
        ("expert_mfu", f64),
        ("expert_pp", i64),
        ("expert_tp", i64),
        ("expert_dp", i64),
        ("expert_ep", i64),
        ("expert_etp", i64),
        ("expert_interleave", i64),
        ("expert_recompute", s),
        ("expert_sequence_parallel", b),
        ("expert_distributed_optimizer", b),
        ("expert_ddp", s),
        # reason = why nothing fits (empty when feasible); expert stage layout as for `stages`
        ("reason", s),
        ("expert_stages", s),
        ("expert_stage_mem_bytes", s),
    ),
    # --- search / summary --------------------------------------------------------------------
    "comparison": _schema(
        ("model", s),
        ("strategy", s),
        # phaze-common: the score it was searched by (relative | mean); '' otherwise
        ("common_score", s),
        ("arch", s),
        ("hbm_capacity_bytes", i64),
        ("microbatch", i64),
        *_STRATEGY,
        ("throughput_seq_s", f64),
        ("speedup_vs_tpuv4_expert", f64),
        ("devices", i64),
        ("speedup_vs_tpuv4_phaze", f64),
        ("speedup_vs_tpuv4_upstream_expert", f64),
        ("speedup_vs_placement_blind", f64),
        # phaze strategies: how far the winner can be from the best arch it certifies (NaN:
        # baselines)
        ("certified_gap", f64),
    ),
    # chosen designs of the searches (mode = global | early_stop | exhaustive)
    "best": _schema(
        ("model", s),
        ("strategy", s),
        ("common_score", s),
        ("mode", s),
        ("arch", s),
        ("hbm_capacity_bytes", i64),
        ("devices", i64),
        ("microbatch", i64),
        *_STRATEGY,
        ("throughput_seq_s", f64),
        ("speedup_vs_tpuv4_expert", f64),
        ("speedup_vs_tpuv4_upstream_expert", f64),
        ("search_score", f64),
        # the walk's last bucket (-1: the global search, which has none)
        ("last_bucket", i64),
        # archs the answer covers (the walk's visited buckets; the whole space for global) and
        # of them those refined beyond the space bound
        ("archs_visited", i64),
        ("archs_refined", i64),
        # (largest proven upper bound of an arch it covers) / its score - 1: visited buckets
        # for early_stop, the whole space for global and exhaustive (phaze.search.scores)
        ("certified_gap", f64),
        # the same over the whole space, for every mode
        ("space_gap", f64),
    ),
    # one row per (walk search, refined arch); model = "*" for Phaze-Common's searches
    "explored": _schema(
        ("strategy", s),
        ("common_score", s),
        ("model", s),
        ("hbm_capacity_bytes", i64),
        ("microbatch", i64),
        ("devices", i64),
        ("arch", s),
        ("bucket", i64),
        ("round", i64),
        ("area_mm2", f64),
        ("throughput_upper_seq_s", f64),
        ("throughput_seq_s", f64),
        ("level", i64),
        ("exact", b),
        ("has_ilp", b),
        ("pruned", b),
        ("visited", b),
    ),
    # every architecture of the space per global search: its proven upper bound and its best
    # achievable score known (NaN: not refined), how far it was refined (0 = space bound only)
    "certified": _schema(
        *_SEARCH_ARCH,
        ("bucket", i64),
        ("throughput_upper_seq_s", f64),
        ("throughput_seq_s", f64),
        ("level", i64),
        ("exact", b),
    ),
    # arch -> chunk (the workflow's job split; search plan adds bucket/round/area columns)
    "chunks": _schema(("arch", s), ("chunk", i64)),
    # the space bound: a proven throughput upper bound of every architecture (NaN: nothing fits)
    "bounds": _schema(
        ("arch", s),
        ("model", s),
        ("microbatch", i64),
        ("hbm_capacity_bytes", i64),
        ("devices", i64),
        ("throughput_upper_seq_s", f64),
        # the archs one step larger on one resource that dominate this one for the model and
        # microbatch (comma-joined; phaze/search/dominance.py)
        ("dominated_by", s),
    ),
    # one search round's components to refine: (model, microbatch, arch), its job chunk, and
    # which search asked (walk | gap | front | baseline, comma-joined)
    "select": _schema(("model", s), ("microbatch", i64), ("arch", s), ("chunk", i64), ("why", s)),
    # the area-throughput front of each global search: its points, smallest area first
    "front": _schema(
        *_SEARCH_ARCH,
        ("throughput_seq_s", f64),
        ("throughput_upper_seq_s", f64),
        ("exact", b),
        # no arch of area at most the point's beats it by more than this
        ("certified_gap", f64),
    ),
}


# ---- what the readers accept ------------------------------------------------------------------
# Every stage reads its inputs through ``read_table(path, name)``: a value of the wrong type, NaN,
# inf, a negative size, count, FLOP count or time, or a repeated key is an error there, naming
# the file, the column and the first bad row, so no stage computes with it.
GE0, GT0, GE1, GE_NEG1 = ">= 0", "> 0", ">= 1", ">= -1"
VALUES: dict[str, dict[str, str]] = {
    "ops": {
        **dict.fromkeys(("m", "n", "k", "batch", "elements", "flops"), GE0),
        **dict.fromkeys(("bytes_in", "bytes_out", "weight_bytes"), GE0),
        "group_size": GE1,
        "fused_into": GE_NEG1,  # the op this one is fused into, -1 for none
        "expert": GE_NEG1,  # the routed expert, -1 for none
    },
    "edges": {"bytes": GE0},
    "layers": dict.fromkeys(
        (
            "param_bytes",
            "activation_bytes",
            "attention_activation_bytes",
            "replicated_activation_bytes",
            "stash_recompute_bytes",
            "boundary_bytes",
            "fwd_flops",
            "bwd_flops",
            "index",
            "expert_param_bytes",
            "experts",
        ),
        GE0,
    )
    | {"ep": GE1},
    "space": {
        **dict.fromkeys(("n_tc", "n_vc", "tc_width", "tc_depth", "vc_width", "glb_bytes"), GE1),
        "freq_hz": GT0,
        "area_mm2": GE0,
        "peak_flops": GT0,
    },
    "latency": {"latency_1core_s": GE0, "latency_allcores_s": GE0},
    "schedule": dict.fromkeys(
        (
            "makespan_s",
            "lower_bound_s",
            "upper_bound_s",
            "mip_gap",
            "solve_s",
            "peak_tc",
            "peak_vc",
        ),
        GE0,
    ),
    "place": {
        **dict.fromkeys(("devices", "hbm_capacity_bytes", "microbatch"), GE1),
        **dict.fromkeys(("throughput_seq_s", "time_per_batch_s", "mfu"), GE0),
        **dict.fromkeys(("expert_throughput_seq_s", "expert_time_per_batch_s", "expert_mfu"), GE0),
        # 0 where nothing fits
        **dict.fromkeys(("pp", "tp", "dp", "expert_pp", "expert_tp", "expert_dp"), GE0),
        **dict.fromkeys(("ep", "expert_ep", "etp", "expert_etp"), GE0),
        **dict.fromkeys(("interleave", "expert_interleave"), GE1),
    },
    "chunks": {"chunk": GE0},
    "bounds": {
        **dict.fromkeys(("microbatch", "hbm_capacity_bytes", "devices"), GE1),
        "throughput_upper_seq_s": GE0,
    },
    "select": {"microbatch": GE1, "chunk": GE0},
    "front": {
        **dict.fromkeys(("hbm_capacity_bytes", "devices"), GE1),
        **dict.fromkeys(("area_mm2", "throughput_seq_s", "throughput_upper_seq_s"), GE0),
        "certified_gap": GE0,
    },
}
# text columns that name one of a few values (the placement axes; place_model = config/schema.yaml
# place.model), and text columns holding a JSON list (per pipeline stage)
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    # an op's role in a mixture-of-experts layer ("" outside one; phaze.trace.moe_layer)
    "ops": {
        "moe_role": ("", *MOE_ROLES),
    },
    "place": {
        "place_model": ("megatron", "upstream"),
        **dict.fromkeys(("recompute", "expert_recompute"), RECOMPUTE_MODES),
        **dict.fromkeys(("ddp", "expert_ddp"), DDP_MODES),
    },
}
JSON_LISTS: dict[str, tuple[str, ...]] = {
    "place": ("stages", "stage_mem_bytes", "expert_stages", "expert_stage_mem_bytes"),
}
# columns that may be null/NaN where the value does not apply: GEMM sizes of a non-GEMM op in a
# hand-made table; the result of a placement where nothing fits
NULLABLE: dict[str, frozenset[str]] = {
    "ops": frozenset(("m", "n", "k", "batch")),
    "bounds": frozenset(("throughput_upper_seq_s",)),
    "place": frozenset(
        (
            "throughput_seq_s",
            "time_per_batch_s",
            "mfu",
            "expert_throughput_seq_s",
            "expert_time_per_batch_s",
            "expert_mfu",
        )
    ),
}
# columns a table may lack, and the value they then have: a trace without the mixture-of-experts
# columns (written before they existed, or made by hand) is a dense model's, whose ops belong to no
# MoE layer and whose layers hold no experts
DEFAULTS: dict[str, dict[str, object]] = {
    "ops": {"moe_role": "", "expert": -1},
    "layers": {"expert_param_bytes": 0, "experts": 0, "ep": 1, "etp1": False},
}
# the column sets that identify a row (a table may have several): a key column may not be
# missing and a repeated key is an error (the row would be counted twice)
KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "ops": (("signature", "pass", "op"),),
    "edges": (("signature", "pass", "src", "dst"),),
    "layers": (("layer",), ("index",)),
    "space": (("arch",),),
    "latency": (("arch", "signature", "pass", "op"),),
    "schedule": (("arch", "signature", "pass"),),
    # one row per architecture: the placement axes (recompute, interleave, ...) are chosen in it
    "place": (("arch", "model", "devices", "hbm_capacity_bytes", "microbatch"),),
    "chunks": (("arch",),),
    "bounds": (("arch", "model", "microbatch", "hbm_capacity_bytes", "devices"),),
    "select": (("model", "microbatch", "arch"),),
    "front": (("strategy", "common_score", "model", "hbm_capacity_bytes", "devices", "arch"),),
}


def check_values(df: pd.DataFrame, name: str, source: str) -> None:
    """Raise PhazeError unless every VALUES column of ``df`` is finite and in range (or null where
    NULLABLE allows it), every CHOICES column holds one of its values, every JSON_LISTS column a
    JSON list, and its KEYS are unique; ``source`` names the input in the message."""
    nullable = NULLABLE.get(name, frozenset())
    for col, rule in VALUES.get(name, {}).items():
        if col not in df.columns:
            continue
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        null = df[col].isna().to_numpy()
        if col in nullable:
            v = np.where(null, 0.0 if rule != GT0 else 1.0, v)
        low = {GE0: v >= 0, GT0: v > 0, GE1: v >= 1, GE_NEG1: v >= -1}[rule]
        bad = ~(np.isfinite(v) & low)
        if bad.any():
            i = int(np.argmax(bad))
            value = df[col].iloc[i]
            value = value.item() if hasattr(value, "item") else value  # numpy scalar -> Python
            raise PhazeError(
                f"{source}: column {col!r} must be finite and {rule} (row {i}: {value!r})"
            )
    for col, allowed in CHOICES.get(name, {}).items():
        if col in df.columns:
            bad = ~df[col].isin(allowed).to_numpy()
            if bad.any():
                i = int(np.argmax(bad))
                raise PhazeError(
                    f"{source}: column {col!r} must be one of {'|'.join(allowed)} "
                    f"(row {i}: {df[col].iloc[i]!r})"
                )
    for col in JSON_LISTS.get(name, ()):
        if col in df.columns:
            for i, text in enumerate(df[col]):
                if not _is_json_list(text):
                    raise PhazeError(f"{source}: column {col!r} must hold a JSON list (row {i})")
    for key in KEYS.get(name, ()):
        present = [c for c in key if c in df.columns]
        for col in present:
            null = df[col].isna().to_numpy()
            if null.any():
                raise PhazeError(
                    f"{source}: column {col!r} has a missing value (row {int(null.argmax())})"
                )
        if len(present) == len(key):
            dup = df.duplicated(list(key), keep=False)
            if dup.any():
                row = df.loc[dup, list(key)].iloc[0].to_dict()
                raise PhazeError(f"{source}: {int(dup.sum())} rows repeat the key {row}")


def _is_json_list(text) -> bool:
    try:
        return isinstance(json.loads(text), list)
    except (TypeError, ValueError):
        return False


def _check(df: pd.DataFrame, name: str) -> pa.Table:
    if name not in SCHEMAS:
        raise ValueError(f"unknown table schema {name!r} (known: {sorted(SCHEMAS)})")
    schema = SCHEMAS[name]
    absent = {c: v for c, v in DEFAULTS.get(name, {}).items() if c not in df.columns}
    if absent:
        df = df.assign(**absent)
    missing = [f.name for f in schema if f.name not in df.columns]
    if missing:
        raise PhazeError(f"table {name!r} is missing columns {missing}")
    table = pa.Table.from_pandas(df, preserve_index=False)
    fields = []
    for field in table.schema:
        want = schema.field(field.name).type if field.name in schema.names else field.type
        fields.append(pa.field(field.name, want))
    try:
        return table.cast(pa.schema(fields))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise PhazeError(f"table {name!r} does not match its schema: {exc}") from exc


def write_table(df: pd.DataFrame, path: str | os.PathLike, name: str) -> None:
    """Validate ``df`` against schema ``name`` (absent DEFAULTS columns filled) and write it to
    ``path`` atomically."""
    table = _check(df, name)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_table(
    path: str | os.PathLike, name: str | None = None, nonempty: bool = False
) -> pd.DataFrame:
    """Read a Parquet table. With a schema ``name``: its columns must be present (a DEFAULTS
    column may be absent: it gets its value) and castable to the schema's types (they are cast),
    and its values and keys valid (``check_values``);
    ``nonempty`` makes a table without rows an error too."""
    path = Path(path)
    if not path.exists():
        raise PhazeError(f"input table not found: {path}")
    if path.is_dir():
        raise PhazeError(f"{path} is a directory, not a Parquet table")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise PhazeError(f"cannot read Parquet table {path}: {exc}") from exc
    if name is None:
        return table.to_pandas()
    schema = SCHEMAS[name]
    for col, value in DEFAULTS.get(name, {}).items():
        if col not in table.column_names:
            column = pa.array([value] * table.num_rows, type=schema.field(col).type)
            table = table.append_column(pa.field(col, column.type), column)
    missing = [f for f in schema.names if f not in table.column_names]
    if missing:
        raise PhazeError(f"{path} is not a {name!r} table: missing columns {missing}")
    cast = False
    for i, field in enumerate(table.schema):
        if field.name in schema.names and field.type != schema.field(field.name).type:
            want = schema.field(field.name).type
            try:
                table = table.set_column(i, field.name, table.column(i).cast(want))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise PhazeError(f"{path}: column {field.name!r} is not {want}: {first}") from exc
            cast = True
    if cast:  # pandas' stored dtypes would undo the cast
        meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != b"pandas"}
        table = table.replace_schema_metadata(meta)
    df = table.to_pandas()
    check_values(df, name, str(path))
    if nonempty and df.empty:
        raise PhazeError(f"{path}: the {name!r} table has no rows")
    return df
