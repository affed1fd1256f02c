"""``python -m phaze schedule``: per-layer operator scheduling for a chunk of architectures, or one
instance given as JSON (``--instance``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from phaze.config import add_config_argument, load_config
from phaze.errors import PhazeError
from phaze.io.atomic import write_text_atomic
from phaze.io.checks import count
from phaze.schedule.solve import Options, Scheduler, peak_cores
from phaze.schedule.stage import schedule_tables
from phaze.schedule.tables import instance_from_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--instance",
        help="solve one instance given as JSON (see docs/schedule.md); prints the result as JSON",
    )
    parser.add_argument("--trace", help="trace directory (ops.parquet, edges.parquet)")
    parser.add_argument("--latency", help="latency table from the estimate stage")
    # the architecture selection of phaze.io.select, with --space optional for --instance
    parser.add_argument("--space", help="architecture space (space.parquet): n_tc, n_vc")
    parser.add_argument("--chunks", help="chunk table (columns arch, chunk); default: one chunk")
    parser.add_argument("--chunk", type=count, help="chunk index to work on (needs --chunks)")
    parser.add_argument("--archs", help="comma-separated arch ids (alternative to --chunk)")
    parser.add_argument(
        "--tier",
        choices=("ilp", "bounds", "deep", "certify"),
        default="ilp",
        help="ilp: exact ILP within the limits (default); bounds: list-schedule "
        "upper bound and cheap lower bounds only, no solver; deep: the ILP with the search's "
        "deep limits (config search.deepen_node_limit, search.deepen_time_limit_s); certify: "
        "the search's final tier (ilp, or deep) with the split (search.certify_split_nodes)",
    )
    add_config_argument(parser)  # section `schedule`
    parser.add_argument("--out", help="output table (schedule schema)")
    parser.add_argument(
        "--solutions",
        help="also write the job's solutions here, for later runs' schedule.reuse "
        "(the workflow writes <out stem>.solutions.parquet; default: none)",
    )


def _options(args, overrides: dict | None = None):
    config = load_config(args.config)
    cfg = dict(config["schedule"])
    tier = args.tier
    search = config["search"]
    if tier == "certify":  # the final tier's solve, with the split
        if search["certify_split_nodes"] <= 0:
            raise PhazeError("--tier certify needs search.certify_split_nodes > 0 in the config")
        cfg.update(split_nodes=search["certify_split_nodes"])
        tier = "deep" if search["deepen_node_limit"] > 0 else "ilp"
    if tier == "deep":  # the ILP with the search's deep limits
        if search["deepen_node_limit"] <= 0:
            raise PhazeError("--tier deep needs search.deepen_node_limit > 0 in the config")
        cfg.update(
            node_limit=search["deepen_node_limit"], time_limit_s=search["deepen_time_limit_s"]
        )
        tier = "ilp"
    # an --instance file's own time_limit_s / gap come last
    return Options.from_config({**cfg, **(overrides or {})}, tier)


def run(args: argparse.Namespace) -> int:
    if args.instance:
        return _run_instance(args)
    missing = [f"--{k}" for k in ("trace", "latency", "space", "out") if not getattr(args, k)]
    if missing:
        raise PhazeError(f"missing {', '.join(missing)} (or give --instance FILE.json)")

    t0 = time.perf_counter()
    reuse = load_config(args.config)["schedule"]["reuse"]
    stats = schedule_tables(args, _options(args), reuse)
    print(
        f"phaze schedule: {stats['rows']} rows, {stats['instances']} instances, "
        f"{stats['ilp_solves']} ILP solves, cache hits {stats['hits']}/{stats['lookups']} "
        f"(+{stats['segment_hits']} segment hits), reused {stats['prior_hits']} instances "
        f"(+{stats['prior_segment_hits']} segments) of {stats['prior']} earlier solutions, "
        f"{time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


def _run_instance(args) -> int:
    try:
        with open(args.instance) as fh:
            obj = json.load(fh)
    except FileNotFoundError as exc:
        raise PhazeError(f"instance file not found: {args.instance}") from exc
    except json.JSONDecodeError as exc:
        raise PhazeError(f"instance file {args.instance} is not valid JSON: {exc}") from exc
    inst, overrides = instance_from_json(obj)
    with Scheduler(_options(args, overrides)) as sch:
        r = sch.solve(inst)
    s = r.schedule
    peak_tc, peak_vc = peak_cores(inst, s)
    out = {
        "makespan_s": r.makespan_s,
        "lower_bound_s": r.lower_bound_s,
        "upper_bound_s": r.upper_bound_s,
        "mip_gap": r.mip_gap,
        "status": r.status,
        "method": r.method,
        "solve_s": r.solve_s,
        "peak_tc": peak_tc,
        "peak_vc": peak_vc,
        "schedule": [
            {
                "id": inst.ids[i],
                "start_s": s.start[i],
                "end_s": s.end(inst, i),
                "intra_op": bool(s.y[i]),
                "tc_cores": list(s.cores[i][0]),
                "vc_cores": list(s.cores[i][1]),
            }
            for i in sorted(range(inst.n), key=lambda i: (s.start[i], i))
        ],
    }
    text = json.dumps(out, indent=2) + "\n"
    if args.out:
        write_text_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0
