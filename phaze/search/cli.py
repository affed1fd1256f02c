"""`python -m phaze search <action>`: the search's steps, as the workflow runs them.

* ``plan``      space.parquet → chunks.parquet (bucket, round, chunk per arch)
* ``prune``     bound-tier placements of round r → which archs get the ILP (one chunk table per
                model × microbatch, for ``phaze schedule --chunks``); ``--stage deep``: with
                the ILP tier in, which of them get the deeper ILP
* ``state``     all placements so far → the early-stop state after round r (JSON)
* ``blind``     t = 1 latencies of the whole space → the placement-blind baseline's arch
* ``batch``     several ``phaze`` commands in one process (the workflow's placement jobs)
* ``summarize`` everything → results/summary/{best,comparison,explored}.parquet
"""

from __future__ import annotations

import argparse

from phaze.config import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("plan", help="area buckets, rounds and chunks of the architecture space")
    p.add_argument("--space", required=True)
    add_config_argument(p)
    p.add_argument("--out", required=True, help="chunks.parquet")

    for name, help_text in (
        ("prune", "choose the archs of a round that need the ILP"),
        ("state", "early-stop state after a round"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--plan", required=True, help="chunks.parquet")
        p.add_argument("--round", type=int, required=True)
        p.add_argument(
            "--manifest",
            required=True,
            help="JSON manifest (phaze.io.manifest) of kind 'place': every placement table of the "
            "rounds so far with its model, microbatch, round and tier (ub | lo | ilp); a paper "
            "sweep's file list exceeds the 128 KiB limit of one command-line argument",
        )
        add_config_argument(p)
        p.add_argument(
            "--out", required=True, help="prune: output directory; state: state JSON file"
        )
        if name == "prune":
            p.add_argument(
                "--stage",
                choices=("ilp", "deep"),
                default="ilp",
                help="ilp: after the bound tiers; deep: after the ilp tier, the archs still "
                "worth a deeper ILP (config search.deepen_node_limit)",
            )
        if name == "state":
            p.add_argument(
                "--benchmarks",
                help="directory of the jobs' Snakemake benchmark files: the progress line's "
                "CPU seconds so far (omitted: not reported)",
            )

    p = sub.add_parser("blind", help="placement-blind baseline: min single-accelerator latency")
    p.add_argument("--model", required=True)
    p.add_argument("--trace", required=True, help="t = 1 trace directory (layers.parquet)")
    p.add_argument("--latency", nargs="+", required=True, help="latency tables of the whole space")
    p.add_argument("--space", required=True)
    p.add_argument("--out", required=True, help="chunk table (arch, chunk = 0) of the chosen arch")

    p = sub.add_parser(
        "batch",
        help="run several phaze commands in one process (one job, one "
        "interpreter start-up: the workflow batches its many small placements)",
    )
    p.add_argument(
        "--config",
        help="config file given to every command that names none (the workflow's snapshot)",
    )
    p.add_argument(
        "commands", nargs="+", help="each a quoted `phaze` command line, e.g. 'place ...'"
    )

    p = sub.add_parser("summarize", help="best / comparison / explored tables")
    p.add_argument("--plan", required=True)
    p.add_argument("--space", required=True)
    p.add_argument(
        "--manifest",
        required=True,
        help="JSON manifest of the summary's inputs: place (model, microbatch, round, tier), "
        "blind_place (model, microbatch, tier), blind (model: the baseline's choice) and "
        "schedules (model, microbatch, tp, tier bounds | ilp | blind: the ILP counts)",
    )
    add_config_argument(p)
    p.add_argument("--out-dir", required=True)


def run(args: argparse.Namespace) -> int:
    from phaze.search import commands

    return getattr(commands, args.action)(args)
