"""`python -m phaze search <action>`: the search's steps, as the workflow runs them.

* ``plan``      space.parquet → chunks.parquet (area bucket, walk round, chunk per arch)
* ``bounds``    the traces of one model and microbatch → a proven throughput upper bound of every
                architecture of the space (the space bound), per HBM size and cluster size
* ``select``    the space bounds and the placements of the rounds so far → round r's components
                to refine (select.parquet) and the search's state before it (state.json)
* ``prune``     round r's placements → which of its components the round's ILP solve takes (one
                chunk table per model × microbatch); ``--solve deep``: with the ILP tier in, which of
                them get the deeper ILP
* ``tier``      the traces of one model and microbatch → the array tier: each architecture's
                achieved and bound throughput (the round's lo / ub placement tables) for a
                block of architectures at once
* ``blind``     the whole space's t = 1 single-accelerator latencies → the placement-blind arch
* ``manifest``  the workflow's manifest of a select, prune or summarize step (its job builds it)
* ``batch``     several ``phaze`` commands in one process (the workflow's placement jobs)
* ``summarize`` everything → results/summary/{best,comparison,explored,front,certified}.parquet
"""

from __future__ import annotations

import argparse

from phaze.config import add_config_argument
from phaze.io.checks import count
from phaze.search import commands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("plan", help="area buckets, rounds and chunks of the architecture space")
    p.add_argument("--space", required=True)
    add_config_argument(p)
    p.add_argument("--out", required=True, help="chunks.parquet")

    for name, help_text in (
        ("select", "the components a search round refines"),
        ("prune", "the components of a round the ILP solves"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--plan", required=True, help="chunks.parquet")
        p.add_argument("--round", type=count, required=True)
        p.add_argument(
            "--manifest",
            required=True,
            help="JSON manifest (phaze.io.manifest) of kinds 'space' (the space bounds of every "
            "model and microbatch) and 'place' (every placement table of the rounds so far with "
            "its model, microbatch, round and tier); a paper sweep's file list exceeds the 128 "
            "KiB limit of one command-line argument",
        )
        add_build_manifest_argument(p)
        add_config_argument(p)
        if name == "select":
            p.add_argument(
                "--previous-state",
                help="round r-1's state.json (where the area walk stands); none for round 0",
            )
            p.add_argument(
                "--out-dir", required=True, help="directory for select.parquet and state.json"
            )
            p.add_argument(
                "--benchmarks",
                help="directory of the jobs' Snakemake benchmark files: the progress line's "
                "CPU seconds so far (omitted: not reported)",
            )
        else:
            p.add_argument("--select", required=True, help="the round's select.parquet")
            p.add_argument("--state", required=True, help="the round's state.json")
            p.add_argument("--out", required=True, help="output directory")
            p.add_argument(
                "--solve",
                choices=("ilp", "deep", "certify"),
                default="ilp",
                help="ilp: after the bound tier; deep: after the ilp tier, the components still "
                "worth a deeper ILP (config search.deepen_node_limit); certify: after the last, "
                "the global searches' components whose bounds keep a certificate above its gap "
                "(config search.certify_split_nodes)",
            )

    p = sub.add_parser(
        "bounds",
        help="a proven throughput upper bound of every architecture of the space (the space "
        "bound), for one model and microbatch, every HBM size and cluster size",
    )
    _trace_arguments(p)
    add_config_argument(p)
    p.add_argument("--out", required=True, help="bounds table (parquet)")

    p = sub.add_parser(
        "tier",
        help="the array tier: the lo (achieved) and ub (bound) placement tables of a block of "
        "architectures, for one model and microbatch",
    )
    _trace_arguments(p)
    p.add_argument("--archs", help="comma-separated architecture ids (default: the whole space)")
    add_config_argument(p)
    p.add_argument("--ub", nargs="+", required=True, help="ub table per HBM size of the config")
    p.add_argument("--lo", nargs="+", required=True, help="lo table per HBM size of the config")
    p.add_argument("--layers", help="optional: each (arch, tp, layer, pass)'s makespan and bound")

    p = sub.add_parser("blind", help="placement-blind baseline: min single-accelerator latency")
    p.add_argument("--model", required=True)
    p.add_argument(
        "--trace", required=True, help="t = 1 trace directory (ops.parquet, layers.parquet)"
    )
    p.add_argument("--space", required=True, help="space.parquet (every architecture is costed)")
    add_config_argument(p)
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

    p = sub.add_parser(
        "manifest",
        help="the manifest of a select, prune or summarize step of the workflow, from the "
        "config and the search checkpoints' outputs under results/ (the step's job builds it)",
    )
    p.add_argument("--step", required=True, choices=("select", "prune", "summary"))
    p.add_argument("--round", type=count, help="the round (select, prune)")
    p.add_argument(
        "--solve", choices=("ilp", "deep", "certify"), default="ilp", help="prune's ILP solve"
    )
    add_config_argument(p)
    p.add_argument("--out", required=True, help="manifest JSON")

    p = sub.add_parser("summarize", help="best / comparison / explored / front / certified")
    p.add_argument("--plan", required=True)
    p.add_argument(
        "--state",
        help="the final round's state.json (nothing to do); default: the manifest's 'state'",
    )
    p.add_argument("--space", required=True)
    p.add_argument(
        "--manifest",
        required=True,
        help="JSON manifest of the summary's inputs: state (the final state.json), space "
        "(model, microbatch: the space "
        "bounds), place (model, microbatch, round, tier), blind_place (model, microbatch, tier), "
        "blind (model: the baseline's choice) and schedules (model, microbatch, tp, tier bounds "
        "| ilp | deep | blind: the ILP counts)",
    )
    add_build_manifest_argument(p)
    add_config_argument(p)
    p.add_argument("--out-dir", required=True)


def _trace_arguments(p: argparse.ArgumentParser) -> None:
    """The traces of one model and microbatch and the space (``bounds``, ``tier``)."""
    p.add_argument("--model", required=True, help="model key (as in the trace directories)")
    p.add_argument("--microbatch", type=count, required=True)
    p.add_argument("--tp", type=count, nargs="+", required=True, help="tensor-parallel widths")
    p.add_argument(
        "--ep",
        type=count,
        nargs="+",
        help="expert-parallel size of each trace dir (a mixture-of-experts model; default 1 each)",
    )
    p.add_argument(
        "--etp",
        type=count,
        nargs="+",
        help="the experts' tensor-parallel size of each trace dir: its tp, or 1 for whole "
        "experts (default: its tp each)",
    )
    p.add_argument(
        "--trace-dirs", nargs="+", required=True, help="one trace directory per width of --tp"
    )
    p.add_argument("--space", required=True, help="space.parquet")


def add_build_manifest_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--build-manifest",
        action="store_true",
        help="first write --manifest from the config and the search checkpoints' outputs under "
        "results/ (what `search manifest` writes; the workflow's jobs do this)",
    )


def run(args: argparse.Namespace) -> int:
    action = {"select": "select_round"}.get(args.action, args.action)
    return getattr(commands, action)(args)
