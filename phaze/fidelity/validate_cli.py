"""`python -m phaze validate`: predicted vs published iteration times of Megatron-LM's Table 1."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print rows, mean_abs_error, max_abs_error, spearman as JSON",
    )
    parser.add_argument("--reference", help="reference CSV (default: the packaged Table 1)")
    parser.add_argument("--config", help="workflow config (YAML, or the workflow's JSON snapshot)")


def run(args: argparse.Namespace) -> int:
    from phaze.fidelity._config import load
    from phaze.fidelity.validate import REFERENCE, format_table, validate

    report = validate(load(args.config), args.reference or REFERENCE)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
    return 0
