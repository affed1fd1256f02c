"""`python -m phaze arch`: write the architecture space table (space.parquet)."""

from __future__ import annotations

import argparse

from phaze.arch.space import build_space
from phaze.config import add_config_argument, load_config
from phaze.io.tables import write_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, help="output space.parquet")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    space, summary = build_space(config)
    write_table(space, args.out, "space")
    print(
        f"phaze arch: {summary['kept']} of {summary['grid_points']} grid points within "
        f"[{summary['area_min_mm2']:.1f}, {summary['area_budget_mm2']:.1f}] mm2 "
        f"(presets: {', '.join(summary['presets']) or 'none'}) -> {args.out}"
    )
    return 0
