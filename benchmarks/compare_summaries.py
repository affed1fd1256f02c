"""Compare two results/summary directories: the same rows with equal values, or what differs.

    .venv/bin/python benchmarks/compare_summaries.py DIR_A DIR_B [--rtol 0]

Each of ``best.parquet``, ``comparison.parquet``, ``explored.parquet``, ``front.parquet``,
``certified.parquet`` and ``search_stats.json`` must be in both directories. Tables are compared
column by column after sorting their rows on every column (row order is not part of a summary's
contract); a column under an earlier name is read under its current one (``RENAMED``: ``tmp`` is
``tp``, ``hbm_bytes`` is ``hbm_capacity_bytes``; docs/design.md, Glossary), every other
difference in the columns — one missing, one extra, another dtype — is reported. Floats are equal when both are NaN or when
``|a - b| <= rtol * max(|a|, |b|)`` (default rtol 0: bit-identical). Prints one line per file and
exits 0 when everything is equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

TABLES = ("best", "comparison", "explored", "front", "certified")
#: earlier column names -> current ones (docs/design.md, Glossary)
RENAMED = {"tmp": "tp", "hbm_bytes": "hbm_capacity_bytes"}


def _table(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path).rename(columns=RENAMED)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    key = df.astype(str)
    order = key.sort_values(list(df.columns), kind="stable").index
    return df.loc[order].reset_index(drop=True)


def _equal_values(a: pd.Series, b: pd.Series, rtol: float) -> np.ndarray:
    if pd.api.types.is_float_dtype(a) and pd.api.types.is_float_dtype(b):
        x, y = a.to_numpy(float), b.to_numpy(float)
        both_nan = np.isnan(x) & np.isnan(y)
        with np.errstate(invalid="ignore"):
            close = np.abs(x - y) <= rtol * np.maximum(np.abs(x), np.abs(y))
        return both_nan | (x == y) | close
    x, y = a.astype(object).to_numpy(), b.astype(object).to_numpy()
    return np.array([_same(u, v) for u, v in zip(x, y)], dtype=bool)


def _same(u, v) -> bool:
    if isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v):
        return True
    if u is None or v is None or u is pd.NA or v is pd.NA:
        return (u is None or u is pd.NA) and (v is None or v is pd.NA)
    return bool(u == v)


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, rtol: float = 0.0) -> list[str]:
    """Differences between two summary tables, as text lines (empty when equal)."""
    problems = []
    only_a, only_b = (
        sorted(set(a.columns) - set(b.columns)),
        sorted(set(b.columns) - set(a.columns)),
    )
    if only_a or only_b:
        problems.append(f"columns only in A {only_a}, only in B {only_b}")
    if len(a) != len(b):
        return problems + [f"{len(a)} rows in A, {len(b)} in B"]
    cols = [c for c in a.columns if c in b.columns]
    for c in cols:
        if a[c].dtype != b[c].dtype:
            problems.append(f"column {c}: dtype {a[c].dtype} in A, {b[c].dtype} in B")
    sa, sb = _sorted(a[cols]), _sorted(b[cols])
    for c in cols:
        ok = _equal_values(sa[c], sb[c], rtol)
        if not ok.all():
            i = int(np.argmin(ok))
            problems.append(
                f"column {c}: {int((~ok).sum())} of {len(ok)} values differ, "
                f"e.g. {sa[c].iloc[i]!r} vs {sb[c].iloc[i]!r}"
            )
    return problems


def compare_dirs(dir_a: Path, dir_b: Path, rtol: float = 0.0) -> dict[str, list[str]]:
    out = {}
    for name in TABLES:
        fa, fb = dir_a / f"{name}.parquet", dir_b / f"{name}.parquet"
        missing = [str(f) for f in (fa, fb) if not f.is_file()]
        out[fa.name] = (
            [f"missing {missing}"] if missing else compare_tables(_table(fa), _table(fb), rtol)
        )
    sa, sb = dir_a / "search_stats.json", dir_b / "search_stats.json"
    missing = [str(f) for f in (sa, sb) if not f.is_file()]
    if missing:
        out[sa.name] = [f"missing {missing}"]
    else:
        ja, jb = json.loads(sa.read_text()), json.loads(sb.read_text())
        out[sa.name] = [] if ja == jb else [f"A {json.dumps(ja)} != B {json.dumps(jb)}"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir_a", type=Path)
    ap.add_argument("dir_b", type=Path)
    ap.add_argument("--rtol", type=float, default=0.0, help="relative tolerance for floats")
    args = ap.parse_args(argv)
    result = compare_dirs(args.dir_a, args.dir_b, args.rtol)
    for name, problems in result.items():
        if problems:
            print(f"{name}: DIFFERENT")
            for p in problems:
                print(f"  {p}")
        else:
            rows = "" if name.endswith(".json") else f" ({len(_table(args.dir_a / name))} rows)"
            print(f"{name}: equal{rows}")
    return 0 if not any(result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
