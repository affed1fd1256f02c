"""`python -m phaze estimate`: per-operator latency on each selected architecture."""

from __future__ import annotations

import argparse

from phaze.config import add_config_argument
from phaze.io.select import add_arch_selection_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace directory holding ops.parquet")
    add_arch_selection_arguments(parser)
    add_config_argument(parser)
    parser.add_argument("--out", required=True, help="output latency.parquet")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from phaze.config import load_config
    from phaze.errors import PhazeError
    from phaze.estimate.stage import estimate
    from phaze.io.select import select_archs
    from phaze.io.tables import read_table, write_table

    config = load_config(args.config)
    trace = Path(args.trace)
    if not trace.is_dir():
        raise PhazeError(f"trace directory not found: {trace}")
    ops = read_table(trace / "ops.parquet", "ops", nonempty=True)
    space = select_archs(args)
    latency = estimate(ops, space, config["costmodel"])
    write_table(latency, args.out, "latency")
    print(f"phaze estimate: {len(ops)} ops x {len(space)} archs -> {args.out}")
    return 0
