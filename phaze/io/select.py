"""Select the architectures a job works on: all of space.parquet, or one chunk of it.

Chunks are how the workflow splits per-architecture work into Snakemake jobs. A chunk table
(columns ``arch``, ``chunk``) is written by the workflow; ``--chunk N`` selects its rows.
"""

from __future__ import annotations

import argparse

import pandas as pd

from phaze.errors import PhazeError
from phaze.io.tables import read_table


def add_arch_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--space", required=True, help="architecture space (space.parquet)")
    parser.add_argument("--chunks", help="chunk table (columns arch, chunk); default: one chunk")
    parser.add_argument("--chunk", type=int, help="chunk index to work on (needs --chunks)")
    parser.add_argument("--archs", help="comma-separated arch ids (alternative to --chunk)")


def select_archs(args: argparse.Namespace) -> pd.DataFrame:
    """Rows of the space table selected by --chunks/--chunk or --archs (all rows by default)."""
    space = read_table(args.space, "space", nonempty=True)
    if getattr(args, "archs", None):
        wanted = [a for a in args.archs.split(",") if a]
        unknown = sorted(set(wanted) - set(space["arch"]))
        if unknown:
            raise PhazeError(f"arch ids not in {args.space}: {unknown[:5]}")
        return space[space["arch"].isin(wanted)].reset_index(drop=True)
    if getattr(args, "chunk", None) is not None:
        if not args.chunks:
            raise PhazeError("--chunk needs --chunks (the chunk table)")
        chunks = read_table(args.chunks)
        if not {"arch", "chunk"} <= set(chunks.columns):
            raise PhazeError(f"{args.chunks} needs columns arch, chunk")
        ids = chunks.loc[chunks["chunk"] == args.chunk, "arch"]
        if ids.empty:
            raise PhazeError(f"chunk {args.chunk} is empty or not in {args.chunks}")
        return space[space["arch"].isin(set(ids))].reset_index(drop=True)
    return space
