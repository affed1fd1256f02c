"""`python -m phaze trace`: one model configuration -> ops / edges / layers Parquet tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from phaze.config import add_config_argument, load_config
from phaze.errors import PhazeError
from phaze.io.checks import count
from phaze.trace.models import get_model_spec
from phaze.trace.sizes import check_tensor_sizes
from phaze.trace.write import write_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="registry name (see phaze/trace/models.py) or path to a HF config.json",
    )
    parser.add_argument("--microbatch", type=count, required=True, help="microbatch size b")
    parser.add_argument("--tp", type=count, default=1, help="tensor-parallel width tp (1, 2, 4, 8)")
    parser.add_argument(
        "--ep",
        type=count,
        default=1,
        help="expert-parallel size ep (a mixture-of-experts model: the rank holds E/ep experts)",
    )
    parser.add_argument(
        "--etp",
        type=count,
        help="the experts' tensor-parallel size: tp (the default) or 1 (a mixture-of-experts "
        "model: whole experts on the rank's sequence-parallel shard, Megatron's "
        "--expert-tensor-parallel-size 1)",
    )
    parser.add_argument(
        "--seq",
        type=count,
        help="sequence length (default: config trace.seq[model], else the model's)",
    )
    add_config_argument(parser)
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the 2-block check that the traced block is representative",
    )
    parser.add_argument("--out", required=True, help="output directory")


def run(args: argparse.Namespace) -> int:
    _check_positive(args.microbatch, "--microbatch")
    if args.seq is not None:
        _check_positive(args.seq, "--seq")

    trace_cfg = load_config(args.config)["trace"]
    spec = get_model_spec(args.model)
    spec.check_tp(args.tp)  # fail fast, before importing torch
    spec.check_ep(args.ep)
    if spec.moe is not None:
        spec.moe.check_imbalance(trace_cfg["moe_imbalance"], spec.name)
    seq = args.seq or trace_cfg["seq"].get(args.model) or spec.seq
    spec.check_etp(args.etp, args.tp, seq)
    check_tensor_sizes(spec, args.microbatch, seq)

    from phaze.trace.tracer import trace_model  # deferred: pulls torch (after the checks above)

    trace = trace_model(
        spec,
        args.microbatch,
        args.tp,
        seq=seq,
        fuse=trace_cfg["fuse"],
        verify=not args.no_verify,
        moe_imbalance=trace_cfg["moe_imbalance"],
        ep=args.ep,
        etp=args.etp,
    )
    write_trace(trace, Path(args.out), spec)
    return 0


def _check_positive(value: int, what: str) -> None:
    if value < 1:
        raise PhazeError(f"{what} must be >= 1 (got {value})")
