"""`python -m phaze evaluate`: one training iteration of a given parallel strategy -> JSON."""

from __future__ import annotations

import argparse
import json

from phaze.config import add_config_argument
from phaze.errors import PhazeError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="registry name (phaze/trace/models.py)")
    model.add_argument("--hf-config", help="path to a Hugging Face config.json")
    parser.add_argument(
        "--arch",
        required=True,
        help="preset with a `network:` section (config/presets/NAME.yaml), e.g. a100-80gb",
    )
    parser.add_argument("--devices", type=int, required=True, help="number of devices N")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel width tp")
    parser.add_argument("--pp", type=int, required=True, help="pipeline stages p")
    parser.add_argument("--microbatch", type=int, required=True, help="microbatch size b")
    parser.add_argument("--global-batch", type=int, required=True, help="sequences per iteration")
    parser.add_argument(
        "--interleave",
        type=int,
        default=1,
        help="model chunks per device V (interleaved 1F1B when > 1)",
    )
    parser.add_argument(
        "--recompute",
        choices=["full", "selective", "none"],
        default="none",
        help="activation recomputation (selective = core attention only)",
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="Megatron sequence parallelism (needs --tp > 1)",
    )
    parser.add_argument(
        "--ddp",
        choices=["overlap", "after"],
        default="overlap",
        help="data-parallel all-reduce overlapped with backward (PyTorch DDP) "
        "or after it (Megatron local DDP)",
    )
    parser.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    from phaze.arch.presets import load_preset
    from phaze.config import load_config
    from phaze.fidelity.strategy import Strategy
    from phaze.trace.models import get_model_spec

    if args.seq is not None and args.seq < 2:
        raise PhazeError(f"--seq must be >= 2 (got {args.seq})")
    # the strategy first: its errors need no model, config or heavy import
    strategy = Strategy(
        devices=args.devices,
        tp=args.tp,
        pp=args.pp,
        microbatch=args.microbatch,
        global_batch=args.global_batch,
        interleave=args.interleave,
        recompute=args.recompute,
        sequence_parallel=args.sequence_parallel,
        ddp=args.ddp,
    )
    config = load_config(args.config)
    spec = get_model_spec(args.model if args.model else args.hf_config)
    spec.check_tp(strategy.tp)
    strategy.schedule.check_layers(spec.num_blocks)
    preset = load_preset(args.arch)
    if "network" not in preset:
        raise PhazeError(
            f"preset {args.arch!r} has no `network:` section; evaluate needs one "
            "(e.g. --arch a100-80gb or h100-sxm)"
        )

    from phaze.fidelity.evaluate import evaluate_strategy

    result = evaluate_strategy(
        spec,
        strategy,
        preset,
        seq=args.seq or spec.seq,
        costmodel=config["costmodel"],
        fidelity=config["fidelity"],
    )
    result = {"model": spec.name, "arch": args.arch, **result}
    print(json.dumps(result, indent=2))
    return 0
