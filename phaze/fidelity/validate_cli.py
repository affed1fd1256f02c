"""`python -m phaze validate`: predicted vs published iteration times of Megatron-LM's Table 1."""

from __future__ import annotations

import argparse
import json

from phaze.config import add_config_argument, load_config
from phaze.fidelity.evaluate_cli import add_setting_arguments, apply_settings
from phaze.fidelity.validate import REFERENCE, format_table, validate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print rows, mean_abs_error, max_abs_error, spearman as JSON",
    )
    parser.add_argument("--reference", help="reference CSV (default: the packaged Table 1)")
    add_setting_arguments(parser)
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = apply_settings(load_config(args.config), args)
    report = validate(config, args.reference or REFERENCE)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
    return 0
