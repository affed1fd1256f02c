"""The table readers reject what no stage may compute with: NaN, inf, negative sizes, wrong
types, repeated keys, truncated files — naming the file, the column and the row."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from phaze.errors import PhazeError
from phaze.io.tables import (
    CHOICES,
    JSON_LISTS,
    KEYS,
    SCHEMAS,
    VALUES,
    check_values,
    read_table,
    write_table,
)
from tests.test_estimate import fixture_ops, small_space


def _write_raw(df: pd.DataFrame, path) -> str:
    df.to_parquet(path, index=False)  # no schema check: a bad file is the point
    return str(path)


def test_valid_tables_read_back_cast_to_the_schema(tmp_path):
    space = small_space()
    write_table(space, tmp_path / "s.parquet", "space")
    got = read_table(tmp_path / "s.parquet", "space", nonempty=True)
    assert got["n_tc"].dtype == "int64" and list(got["arch"]) == list(space["arch"])
    # integral floats are cast back to the schema's integers
    f = _write_raw(space.astype({"n_tc": float}), tmp_path / "f.parquet")
    assert read_table(f, "space")["n_tc"].dtype == "int64"
    # and numbers written as text (pandas' stored dtypes must not undo the cast)
    t = _write_raw(space.astype({"n_tc": str, "freq_hz": str}), tmp_path / "t.parquet")
    got = read_table(t, "space")
    assert got["n_tc"].dtype == "int64" and got["freq_hz"].dtype == "float64"
    assert list(got["n_tc"]) == list(space["n_tc"])


@pytest.mark.parametrize(
    "column,value,needle",
    [
        ("freq_hz", math.nan, "'freq_hz' must be finite and > 0 (row 1"),
        ("freq_hz", math.inf, "'freq_hz' must be finite and > 0"),
        ("freq_hz", 0.0, "'freq_hz' must be finite and > 0"),
        ("n_tc", -8, "'n_tc' must be finite and >= 1"),
        ("n_tc", 0, "'n_tc' must be finite and >= 1"),
        ("glb_bytes", 0.5, "'glb_bytes' is not int64"),
        ("peak_flops", -1.0, "'peak_flops' must be finite and > 0"),
    ],
)
def test_bad_space_values_are_errors_naming_column_and_row(tmp_path, column, value, needle):
    space = small_space()
    space[column] = space[column].astype(float if isinstance(value, float) else space[column].dtype)
    space.loc[1, column] = value
    path = _write_raw(space, tmp_path / "s.parquet")
    with pytest.raises(PhazeError, match="s.parquet") as err:
        read_table(path, "space")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_wrong_type_and_repeated_key_and_nullable_columns(tmp_path):
    space = small_space()
    bad = _write_raw(space.assign(n_tc=["x"] * len(space)), tmp_path / "t.parquet")
    with pytest.raises(PhazeError, match="'n_tc' is not int64"):
        read_table(bad, "space")
    missing = _write_raw(space.assign(arch=["a", None, "c"]), tmp_path / "m.parquet")
    with pytest.raises(PhazeError, match="column 'arch' has a missing value .row 1"):
        read_table(missing, "space")
    dup = _write_raw(pd.concat([space, space.iloc[[0]]]), tmp_path / "d.parquet")
    with pytest.raises(PhazeError, match=r"2 rows repeat the key \{'arch': 'a'\}"):
        read_table(dup, "space")
    # GEMM sizes may be missing for a non-GEMM op (the hand-made fixture leaves them empty) ...
    ops = fixture_ops()
    assert ops["m"].isna().any()
    read_table(_write_raw(ops, tmp_path / "ops.parquet"), "ops")
    # ... but a byte count may not
    ops.loc[0, "bytes_in"] = math.nan
    with pytest.raises(PhazeError, match="'bytes_in' must be finite and >= 0 .row 0"):
        read_table(_write_raw(ops, tmp_path / "ops2.parquet"), "ops")


def test_empty_truncated_directory_and_missing_inputs(tmp_path):
    space = small_space()
    empty = _write_raw(space.iloc[:0], tmp_path / "e.parquet")
    assert read_table(empty, "space").empty
    with pytest.raises(PhazeError, match="has no rows"):
        read_table(empty, "space", nonempty=True)
    full = tmp_path / "s.parquet"
    write_table(space, full, "space")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(full.read_bytes()[:-10])
    with pytest.raises(PhazeError, match="cannot read Parquet table"):
        read_table(cut, "space")
    with pytest.raises(PhazeError, match="is a directory"):
        read_table(tmp_path, "space")
    with pytest.raises(PhazeError, match="not found"):
        read_table(tmp_path / "nope.parquet", "space")


def test_checks_name_only_schema_columns_and_keys_apply_after_concatenation():
    for name in (*VALUES, *KEYS, *CHOICES, *JSON_LISTS):
        cols = set(SCHEMAS[name].names)
        keys = {c for key in KEYS.get(name, ()) for c in key}
        named = {*VALUES.get(name, {}), *CHOICES.get(name, {}), *JSON_LISTS.get(name, ())}
        assert named <= cols and keys <= cols, name
    sched = pd.DataFrame(
        {"arch": ["a", "a"], "signature": ["s", "s"], "pass": ["fwd", "fwd"], "makespan_s": [1, 1]}
    )
    with pytest.raises(PhazeError, match="chunk files: 2 rows repeat the key"):
        check_values(sched, "schedule", "chunk files")
    check_values(sched.assign(**{"pass": ["fwd", "bwd"]}), "schedule", "chunk files")


@pytest.mark.parametrize(
    "column,value,needle",
    [
        ("recompute", "True", "'recompute' must be one of none|selective|full (row 1: 'True')"),
        ("expert_recompute", "on", "'expert_recompute' must be one of none|selective|full"),
        ("ddp", "torch", "'ddp' must be one of overlap|after (row 1: 'torch')"),
        ("place_model", "", "'place_model' must be one of megatron|upstream"),
        ("interleave", 0, "'interleave' must be finite and >= 1 (row 1: 0)"),
        ("tp", -1, "'tp' must be finite and >= 0"),
        ("stages", "[{", "'stages' must hold a JSON list (row 1)"),
        ("stage_mem_bytes", "3", "'stage_mem_bytes' must hold a JSON list (row 1)"),
    ],
)
def test_placement_axes_and_stage_lists_are_checked(column, value, needle):
    rows = pd.DataFrame(
        {
            "place_model": ["megatron", "upstream"],
            "recompute": ["selective", "full"],
            "expert_recompute": ["none", "full"],
            "ddp": ["overlap", "after"],
            "interleave": [2, 1],
            "tp": [8, 0],  # 0 where nothing fits
            "stages": ['[{"first": "embedding", "layers": 3}]', "[]"],
            "stage_mem_bytes": ["[1, 2]", "[]"],
        }
    )
    check_values(rows, "place", "p.parquet")
    rows.loc[1, column] = value
    with pytest.raises(PhazeError, match="p.parquet") as err:
        check_values(rows, "place", "p.parquet")
    assert needle in str(err.value) and "\n" not in str(err.value)
