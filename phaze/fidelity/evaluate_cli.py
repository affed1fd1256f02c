"""`python -m phaze evaluate`: one training iteration of a given parallel strategy -> JSON.

The step model of docs/step.md on a GPU preset (layer times summed from kernels). Impossible
strategies (sequence parallelism with tp = 1, the distributed optimizer with dp = 1, an interleave
that does not divide a stage's blocks, an expert-parallel size that does not divide the experts or
dp or is given for a dense model, a context-parallel size that does not split the sequence into
2·cp chunks or tp·cp·pp not dividing the devices, ...) exit 2 with one line.
"""

from __future__ import annotations

import argparse
import json

from phaze.arch.presets import load_preset
from phaze.config import add_config_argument, load_config
from phaze.errors import PhazeError
from phaze.fidelity.compute import ATTENTION_MODES
from phaze.fidelity.evaluate import evaluate_strategy, preset_network, run_format
from phaze.io.checks import count
from phaze.precision import PRECISIONS
from phaze.step.strategy import Strategy, check_context_parallel
from phaze.trace.models import get_model_spec


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What `evaluate` and `optimize` share: the model, the preset, the cluster, the batch."""
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="registry name (phaze/trace/models.py)")
    model.add_argument("--hf-config", help="path to a Hugging Face config.json")
    parser.add_argument(
        "--arch",
        required=True,
        help="preset with a `network:` section (config/presets/NAME.yaml), e.g. a100-80gb or tpuv4",
    )
    parser.add_argument("--devices", type=count, required=True, help="number of devices N")
    parser.add_argument("--global-batch", type=count, required=True, help="sequences per iteration")
    parser.add_argument("--seq", type=count, help="sequence length (default: the model's)")
    add_setting_arguments(parser)
    add_config_argument(parser)


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """``--precision`` and ``--attention``, what `evaluate`, `optimize` and `validate` share
    (override config ``fidelity.precision`` and ``fidelity.attention``)."""
    parser.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        help="training precision: bf16, or fp8 (Transformer Engine FP8 GEMMs in the linear "
        "layers; needs a preset with an FP8 peak, e.g. h100-sxm). Default: config "
        "fidelity.precision (bf16)",
    )
    parser.add_argument(
        "--attention",
        choices=list(ATTENTION_MODES),
        help="how core attention runs: eager (the trace's kernels, the s x s scores through "
        "HBM) or fused (one FlashAttention-style kernel per pass, as Transformer Engine runs "
        "it). Default: config fidelity.attention (eager)",
    )


def apply_settings(config: dict, args: argparse.Namespace) -> dict:
    """The config with ``--precision`` and ``--attention`` (when given) in its ``fidelity``."""
    for key in ("precision", "attention"):
        value = getattr(args, key, None)
        if value is not None:
            config["fidelity"] = {**config["fidelity"], key: value}
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--tp", type=count, required=True, help="tensor-parallel width tp")
    parser.add_argument("--pp", type=count, required=True, help="pipeline stages p")
    parser.add_argument(
        "--ep",
        type=count,
        default=1,
        help="expert-parallel size (a mixture-of-experts model; must divide its experts and dp, "
        "tp·dp with --etp 1)",
    )
    parser.add_argument(
        "--etp",
        type=count,
        help="the experts' tensor-parallel size: tp (the default) or 1 (whole experts on each "
        "rank, Megatron's --expert-tensor-parallel-size 1)",
    )
    parser.add_argument(
        "--cp",
        type=count,
        default=1,
        help="context-parallel size (Megatron's --context-parallel-size: each rank holds seq/cp "
        "tokens; 2·cp must divide the sequence, tp·cp·pp the devices)",
    )
    parser.add_argument("--microbatch", type=count, required=True, help="microbatch size b")
    parser.add_argument(
        "--interleave",
        type=count,
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
        "--distributed-optimizer",
        action="store_true",
        help="Megatron's distributed optimizer, ZeRO-1 (needs dp > 1)",
    )
    parser.add_argument(
        "--ddp",
        choices=["overlap", "after"],
        default="overlap",
        help="data-parallel gradient reduction overlapped with backward or after it",
    )
    parser.add_argument(
        "--stages",
        help="blocks per pipeline stage, comma-separated (default: Megatron's even split)",
    )


def parse_stages(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        stages = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise PhazeError(f"--stages takes integers separated by commas, got {text!r}") from None
    return stages


def load_run(args) -> tuple:
    """(spec, preset, config, seq) of an evaluate / optimize command line."""
    if args.seq is not None and args.seq < 2:
        raise PhazeError(f"--seq must be >= 2 (got {args.seq})")
    if args.devices < 1 or args.global_batch < 1:
        raise PhazeError("--devices and --global-batch must be >= 1")
    config = apply_settings(load_config(args.config), args)
    spec = get_model_spec(args.model if args.model else args.hf_config)
    preset = load_preset(args.arch)
    preset_network(preset, args.arch, args.devices)
    run_format(preset, config, args.arch)
    return spec, preset, config, args.seq or spec.seq


def run(args: argparse.Namespace) -> int:
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
        distributed_optimizer=args.distributed_optimizer,
        ddp=args.ddp,
        stages=parse_stages(args.stages),
        ep=args.ep,
        etp=args.etp,
        cp=args.cp,
    )
    spec, preset, config, seq = load_run(args)
    check_context_parallel(seq, strategy.cp)
    spec.check_tp(strategy.tp)
    strategy.check_layers(spec.repeated_blocks)
    moe = getattr(spec, "moe", None)
    strategy.check_experts(moe.experts if moe is not None else 0)

    result = evaluate_strategy(spec, strategy, preset, seq=seq, config=config, name=args.arch)
    print(json.dumps({"model": spec.name, "arch": args.arch, **result}, indent=2))
    return 0
