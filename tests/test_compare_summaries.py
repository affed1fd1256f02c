"""benchmarks/compare_summaries.py: equal summaries compare equal (whatever the row order, with
the tensor-parallel column under its old name), and every kind of difference is reported."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_summaries.py"
spec = importlib.util.spec_from_file_location("compare_summaries", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


@pytest.fixture
def two_dirs(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    df = pd.DataFrame(
        {
            "model": ["m1", "m2", "m3"],
            "tp": [1, 2, 4],
            "throughput_seq_s": [1.5, np.nan, 3.25],
            "stages": ["1,2", "", "3"],
        }
    )
    for name in compare.TABLES:
        df.to_parquet(a / f"{name}.parquet")
    (a / "search_stats.json").write_text(json.dumps({"rounds_computed": 2}))
    b = tmp_path / "b"
    shutil.copytree(a, b)
    return a, b, df


def test_equal_summaries(two_dirs, capsys):
    a, b, df = two_dirs
    df.iloc[::-1].rename(columns={"tp": "tmp"}).to_parquet(b / "best.parquet")
    df.assign(hbm_capacity_bytes=7).to_parquet(a / "front.parquet")
    df.assign(hbm_bytes=7).to_parquet(b / "front.parquet")  # the capacity's earlier name
    assert compare.main([str(a), str(b)]) == 0
    assert capsys.readouterr().out.count(": equal") == len(compare.TABLES) + 1


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda df: df.assign(throughput_seq_s=[1.5, np.nan, 3.2500000001]), "throughput_seq_s"),
        (lambda df: df.assign(throughput_seq_s=[1.5, 0.0, 3.25]), "throughput_seq_s"),
        (lambda df: df.assign(extra=1), "only in B ['extra']"),
        (lambda df: df.iloc[:2], "3 rows in A, 2 in B"),
        (lambda df: df.assign(tp=df["tp"].astype(float)), "dtype"),
        (lambda df: df.assign(stages=["1,2", "", "4"]), "stages"),
    ],
)
def test_differences_are_reported(two_dirs, capsys, edit, needle):
    a, b, df = two_dirs
    edit(df).to_parquet(b / "explored.parquet")
    assert compare.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "explored.parquet: DIFFERENT" in out and needle in out


def test_tolerance_and_stats(two_dirs, capsys):
    a, b, df = two_dirs
    df.assign(throughput_seq_s=[1.5, np.nan, 3.25 * (1 + 1e-12)]).to_parquet(b / "best.parquet")
    assert compare.main([str(a), str(b), "--rtol", "1e-9"]) == 0
    (b / "search_stats.json").write_text(json.dumps({"rounds_computed": 3}))
    assert compare.main([str(a), str(b), "--rtol", "1e-9"]) == 1
    assert "search_stats.json: DIFFERENT" in capsys.readouterr().out
