"""Select the architectures a job works on: all of space.parquet, or one chunk of it.

Chunks are how the workflow splits per-architecture work into Snakemake jobs. A chunk table
(columns ``arch``, ``chunk``) is written by the workflow; ``--chunk N`` selects its rows.
"""

from __future__ import annotations

import argparse

import pandas as pd

from phaze.errors import PhazeError
from phaze.io.checks import count
from phaze.io.tables import read_table


def add_arch_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--space", required=True, help="architecture space (space.parquet)")
    parser.add_argument("--chunks", help="chunk table (columns arch, chunk); default: one chunk")
    parser.add_argument("--chunk", type=count, help="chunk index to work on (needs --chunks)")
    parser.add_argument("--archs", help="comma-separated arch ids (alternative to --chunk)")


def arch_ids(text: str | None) -> list[str] | None:
    """The ids of an ``--archs ID,ID`` argument (None when not given): an empty list, an empty
    entry or an id given twice is an error, not "every architecture" or "none"."""
    if text is None:
        return None
    ids = [a.strip() for a in text.split(",")]
    if "" in ids:
        raise PhazeError(f"--archs takes architecture ids separated by commas, got {text!r}")
    twice = sorted({a for a in ids if ids.count(a) > 1})
    if twice:
        raise PhazeError(f"--archs lists {twice[0]} twice")
    return ids


def select_archs(args: argparse.Namespace) -> pd.DataFrame:
    """Rows of the space table selected by --chunks/--chunk or --archs (all rows by default)."""
    wanted = arch_ids(getattr(args, "archs", None))
    if wanted is not None and (getattr(args, "chunks", None) or args.chunk is not None):
        raise PhazeError("--archs and --chunks/--chunk both select architectures: give one")
    space = read_table(args.space, "space", nonempty=True)
    if wanted is not None:
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
