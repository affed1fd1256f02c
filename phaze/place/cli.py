"""`python -m phaze place`: pipeline/data/tensor-parallel placement.

Two modes:
* tables (the workflow's): ``--model --tp T.. [--ep E..] --trace-dirs D.. --schedules S..
  [--latencies L..] --space F --hbm-gib H --microbatch B --out place.parquet`` — one trace dir
  per tp (per (tp, ep) for a mixture-of-experts model traced at expert-parallel sizes ep); one
  row per architecture × cluster size, under config ``place.model`` (megatron: the step model, searching the placement
  axes of config ``place``; upstream: Phaze's objective); ``--export-instance FILE.json`` instead
  writes upstream's instance format for one architecture (``--archs ID``).
* ``--instance FILE.json`` — solve an instance in upstream's format with upstream's semantics and
  print the result JSON (exit 0 also when nothing fits: the time is null and a reason is given).

The network: one flat link (config ``costmodel``) unless the architecture's preset has a
``network:`` section or config ``place.network`` is set (phaze/place/network.py); ``--instance``
is always flat, as upstream.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from phaze.config import add_config_argument, load_config
from phaze.errors import PhazeError
from phaze.io import read_table, write_json_atomic, write_table
from phaze.io.atomic import write_text_atomic
from phaze.io.checks import count, finite
from phaze.io.select import arch_ids
from phaze.io.tables import check_values
from phaze.place.inputs import check_trace_flags, trace_record, trace_shapes
from phaze.place.settings import MAX_HBM_GIB, PlaceSettings, hbm_capacity_bytes_of
from phaze.place.tables import place_architectures
from phaze.place.upstream import dumps_result, export_instance, load_instance, solve_instance


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance", help="solve an upstream-format placement instance (JSON)")
    parser.add_argument("--model", help="model name (recorded in the output)")
    parser.add_argument(
        "--tp", type=count, nargs="+", help="tensor-parallel widths, one per trace dir"
    )
    parser.add_argument(
        "--ep",
        type=count,
        nargs="+",
        help="expert-parallel size of each trace dir (a mixture-of-experts model; default 1 each)",
    )
    parser.add_argument(
        "--etp",
        type=count,
        nargs="+",
        help="the experts' tensor-parallel size of each trace dir: its tp, or 1 for whole "
        "experts (default: its tp each)",
    )
    parser.add_argument(
        "--trace-dirs", nargs="+", help="trace output dir per tp (holds layers.parquet)"
    )
    parser.add_argument(
        "--schedules",
        nargs="+",
        help="schedule table(s) per tp; comma-join several chunk files of one tp",
    )
    parser.add_argument("--space", help="architecture space (space.parquet)")
    parser.add_argument(
        "--archs", help="comma-separated arch ids to place (default: all scheduled)"
    )
    parser.add_argument("--hbm-gib", type=finite, help="HBM capacity per device, GiB")
    parser.add_argument("--microbatch", type=count, help="microbatch size (sequences)")
    parser.add_argument(
        "--latencies",
        nargs="+",
        help="operator latency table(s) per tp (the estimate stage's; comma-join several chunk "
        "files): the megatron model's selective recomputation needs them",
    )
    parser.add_argument("--recompute", help=argparse.SUPPRESS)  # replaced by config place.recompute
    parser.add_argument(
        "--latency-column",
        default="makespan_s",
        choices=["makespan_s", "lower_bound_s"],
        help="schedule column used as layer latency (lower_bound_s gives a throughput upper bound)",
    )
    parser.add_argument(
        "--devices", type=count, nargs="+", help="cluster sizes (default: config place.devices)"
    )
    add_config_argument(parser)
    parser.add_argument(
        "--export-instance",
        metavar="FILE",
        help="write upstream's instance JSON for one architecture instead of solving",
    )
    parser.add_argument(
        "--out", help="output: place.parquet (tables mode) or result JSON (--instance)"
    )


def run(args: argparse.Namespace) -> int:
    if args.instance:
        return _run_instance(args)
    return _run_tables(args)


def _run_instance(args) -> int:
    out = solve_instance(load_instance(args.instance))
    text = dumps_result(out)
    if args.out:
        write_text_atomic(args.out, text + "\n")
    print(text)
    return 0


def _require(args, *names):
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) in (None, [])]
    if missing:
        raise PhazeError(f"tables mode needs {', '.join(missing)} (or use --instance FILE)")


def _run_tables(args) -> int:
    if args.recompute is not None:
        raise PhazeError(
            "--recompute is gone: the placement searches the modes of config place.recompute "
            "(none, selective, full)"
        )
    _require(args, "model", "tp", "trace_dirs", "schedules", "space", "hbm_gib", "microbatch")
    if not args.out and not args.export_instance:
        raise PhazeError("give --out (placement table) or --export-instance FILE")
    if len(args.tp) != len(args.trace_dirs) or len(args.tp) != len(args.schedules):
        raise PhazeError(
            f"--tp ({len(args.tp)}), --trace-dirs ({len(args.trace_dirs)}) and "
            f"--schedules ({len(args.schedules)}) need one entry per tp"
        )
    if args.latencies is not None and len(args.latencies) != len(args.tp):
        raise PhazeError(
            f"--latencies ({len(args.latencies)}) needs one entry per tp ({len(args.tp)})"
        )
    traces = trace_shapes(args.tp, args.ep, args.etp)
    wanted = arch_ids(args.archs)
    if not math.isfinite(args.hbm_gib) or not 0 < args.hbm_gib <= MAX_HBM_GIB:
        raise PhazeError(
            f"--hbm-gib must be a finite number > 0 and <= {MAX_HBM_GIB} (1 PiB), "
            f"got {args.hbm_gib}"
        )
    if args.microbatch < 1:
        raise PhazeError(f"--microbatch must be >= 1, got {args.microbatch}")

    config = load_config(args.config)
    pc = config["place"]
    settings = PlaceSettings.from_config(
        config, args.model, hbm_capacity_bytes_of(args.hbm_gib), args.microbatch
    )
    devices_list = args.devices or list(pc["devices"])
    if any(d < 1 for d in devices_list):
        raise PhazeError(f"cluster sizes must be >= 1, got {devices_list}")
    twice = sorted({d for d in devices_list if devices_list.count(d) > 1})
    if twice:
        raise PhazeError(f"--devices lists {twice[0]} twice (each cluster size is one row)")

    layers_by_t, schedules_by_t, ops_by_t, latencies_by_t = {}, {}, {}, {}

    def tables(text: str, schema: str, what: str, t: int) -> pd.DataFrame:
        files = [f for f in text.split(",") if f]
        if not files:
            raise PhazeError(f"no {what} file given for tp={t}")
        return pd.concat([read_table(f, schema) for f in files], ignore_index=True)

    latencies = args.latencies or [None] * len(args.tp)
    records: dict = {}  # trace dir -> what it was made with (model, microbatch, seq, ...)
    # keyed by (tp, ep, etp) (phaze.place.inputs.trace_key)
    for (t, e, x), trace_dir, sched, lat in zip(traces, args.trace_dirs, args.schedules, latencies):
        if t < 1:
            raise PhazeError(f"tensor-parallel width must be >= 1, got {t}")
        layers = read_table(Path(trace_dir) / "layers.parquet", "layers", nonempty=True)
        traced = sorted(set(layers["tp"])) if "tp" in layers.columns else [t]
        if traced != [t]:
            raise PhazeError(f"--tp {t} but {trace_dir} is a trace at tp {traced}")
        traced = sorted(set(layers["ep"])) if "ep" in layers.columns else [1]
        if traced != [e]:
            raise PhazeError(f"--ep {e} but {trace_dir} is a trace at ep {traced}")
        whole = sorted(set(layers["etp1"])) if "etp1" in layers.columns else [False]
        if whole != [x != t]:
            raise PhazeError(
                f"--etp {x} but {trace_dir} is a trace "
                + ("with whole experts (etp 1)" if whole == [True] else f"at etp {t}")
            )
        k = (t, e, x)
        layers_by_t[k] = layers
        records[trace_dir] = trace_record(trace_dir, layers)
        check_trace_flags(records, {"model": args.model, "microbatch": args.microbatch})
        schedules = tables(sched, "schedule", "schedule", t)
        check_values(schedules, "schedule", f"schedules for tp={t} ({sched})")
        schedules_by_t[k] = schedules
        if lat is not None:
            latencies_by_t[k] = tables(lat, "latency", "latency", t)
            ops_by_t[k] = read_table(Path(trace_dir) / "ops.parquet", "ops")
    space = read_table(args.space, "space")
    if wanted is not None:
        unknown = sorted(set(wanted) - set(space["arch"]))
        if unknown:
            raise PhazeError(f"arch ids not in {args.space}: {unknown[:5]}")
        space = space[space["arch"].isin(wanted)]
        schedules_by_t = {t: df[df["arch"].isin(wanted)] for t, df in schedules_by_t.items()}
    costmodel = config["costmodel"]

    if args.export_instance:
        if any(e > 1 or x != t for t, e, x in traces):
            raise PhazeError(
                "--export-instance writes upstream's format: give ep = 1 traces (etp = tp) only"
            )
        dense_layers = {t: df for (t, _, _), df in layers_by_t.items()}
        dense_schedules = {t: df for (t, _, _), df in schedules_by_t.items()}
        archs = sorted(
            set(space["arch"])
            & set.intersection(*[set(df["arch"]) for df in schedules_by_t.values()])
        )
        if len(archs) != 1:
            raise PhazeError(
                f"--export-instance needs exactly one scheduled architecture "
                f"(use --archs ID); found {len(archs)}"
            )
        row = space[space["arch"] == archs[0]].iloc[0]
        preset = (
            row["preset"]
            if "preset" in row.index and isinstance(row["preset"], str) and row["preset"]
            else None
        )
        inst = export_instance(
            settings,
            dense_layers,
            dense_schedules,
            archs[0],
            costmodel,
            preset,
            devices_list[0],
            args.latency_column,
        )
        write_json_atomic(args.export_instance, inst)
        print(
            f"wrote {args.export_instance} (arch {archs[0]}, t in {sorted(dense_layers)})",
            file=sys.stderr,
        )
        if not args.out:
            return 0

    df = place_architectures(
        settings,
        layers_by_t,
        schedules_by_t,
        space,
        costmodel,
        devices_list,
        args.latency_column,
        ops_by_t or None,
        latencies_by_t or None,
    )
    if df.empty:
        raise PhazeError("no architecture is scheduled for every t in the given schedule files")
    write_table(df, args.out, "place")
    return 0
