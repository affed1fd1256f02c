"""`python -m phaze optimize`: the fastest parallel strategy of a model on a GPU preset under the
step model (docs/step.md), with the Megatron-LM arguments that run it.

Searched: tp from ``--tp`` or config ``trace.tp`` (those the model admits and that divide the
devices), microbatch from ``--microbatch`` or config ``trace.microbatch``, for a mixture-of-experts
model the expert-parallel size from ``--ep`` (default every divisor of its experts), the
context-parallel sizes of ``--cp`` (default 1), the placement axes of
config ``place`` (interleave, recompute, sequence_parallel, distributed_optimizer, ddp), every
pipeline depth with tp·pp·dp = devices and microbatch·dp dividing the global batch, every split
of the blocks over the stages. ``strategy`` is the object `phaze evaluate` prints: evaluating it
(``--distributed-optimizer``, ``--stages``) gives the same iteration time.
"""

from __future__ import annotations

import argparse
import json
import math

from phaze.errors import PhazeError
from phaze.fidelity.evaluate import optimize_strategy
from phaze.fidelity.evaluate_cli import add_run_arguments, load_run
from phaze.io.checks import count, finite
from phaze.place.settings import MAX_HBM_GIB
from phaze.step.megatron_args import megatron_arguments, pipeline_layout
from phaze.step.strategy import check_context_parallel
from phaze.units import GIB


def _megatron_args(strategy, spec) -> list[str]:
    """Megatron-LM's arguments for the strategy found. A model with dense first blocks
    (DeepSeek-V3) gets them on the first pipeline stage, with the embedding, as the step model
    prices them: ``--moe-layer-freq`` marks them dense and the pipeline layout puts them in the
    first segment."""
    dense = spec.dense_blocks
    args = megatron_arguments(strategy, spec.repeated_blocks)
    if not dense:
        return args
    stages = strategy.check_layers(spec.repeated_blocks)
    args = [
        a
        for a in args
        if not a.startswith(("--pipeline-model-parallel-layout", "--num-layers-per-virtual"))
    ]
    args.append(f"--moe-layer-freq ([0]*{dense}+[1]*{spec.repeated_blocks})")
    if strategy.pp > 1 or strategy.interleave > 1:
        segments = pipeline_layout(stages, strategy.interleave).split("|")
        n = stages[0] // strategy.interleave + dense
        segments[0] = "E" + (f"t*{n}" if n > 1 else "t" * n) + ("L" if len(segments) == 1 else "")
        args.append(f"--pipeline-model-parallel-layout {'|'.join(segments)}")
    return args


#: Megatron-LM's flags of a training precision (phaze.precision): FP8 = Transformer Engine's
#: hybrid format (E4M3 forward, E5M2 gradients) with delayed scaling
PRECISION_ARGUMENTS = {"bf16": [], "fp8": ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"]}
#: Megatron-LM's flag of how core attention runs (config fidelity.attention): fused = the
#: FlashAttention kernel (`--attention-backend flash`); eager prints nothing (as before)
ATTENTION_ARGUMENTS = {"eager": [], "fused": ["--attention-backend", "flash"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument(
        "--hbm-gib",
        type=finite,
        help="memory per device, GiB (default: the preset's gpu.hbm_capacity_bytes)",
    )
    parser.add_argument(
        "--microbatch",
        type=count,
        nargs="+",
        help="microbatch sizes to search (default: config trace.microbatch)",
    )
    parser.add_argument(
        "--tp",
        type=count,
        nargs="+",
        help="tensor-parallel widths to search (default: config trace.tp)",
    )
    parser.add_argument(
        "--ep",
        type=count,
        nargs="+",
        help="expert-parallel sizes to search (a mixture-of-experts model; default: every "
        "divisor of its experts; a dense model: 1)",
    )
    parser.add_argument(
        "--etp",
        nargs="+",
        choices=("tp", "1"),
        help="the experts' tensor-parallel sizes to search: tp (split like the block) and/or 1 "
        "(whole experts; a mixture-of-experts model at tp > 1; default: both for one, tp for a "
        "dense model)",
    )
    parser.add_argument(
        "--cp",
        nargs="+",
        help="context-parallel sizes to search (Megatron's --context-parallel-size; each must "
        "split the sequence into 2·cp chunks and divide the devices), or `all`: every such size "
        "(each costs a trace at seq/cp); default: 1",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def context_parallel_sizes(given, seq: int, devices: int) -> list[int]:
    """The cp values of ``--cp``: the sizes given (checked by the caller), ``all`` (every cp
    dividing the devices whose 2·cp chunks split the sequence), or none given: [1]."""
    if not given:
        return [1]
    if list(given) == ["all"]:
        g = math.gcd(devices, seq // 2)  # cp divides the devices and seq/2 (at most seq/2 values)
        return [c for c in range(1, g + 1) if g % c == 0] if g else [1]
    try:
        return sorted({int(c) for c in given})
    except ValueError:
        raise PhazeError(f"--cp takes integers or `all`, got {' '.join(given)}") from None


def run(args: argparse.Namespace) -> int:
    spec, preset, config, seq = load_run(args)
    if args.hbm_gib is not None:
        if not 0 < args.hbm_gib <= MAX_HBM_GIB:
            raise PhazeError(
                f"--hbm-gib must be > 0 and <= {MAX_HBM_GIB} (1 PiB), got {args.hbm_gib}"
            )
        hbm = args.hbm_gib * GIB
    else:
        hbm = (preset.get("gpu") or {}).get("hbm_capacity_bytes")
        if hbm is None:
            raise PhazeError(f"preset {args.arch!r} has no gpu.hbm_capacity_bytes: give --hbm-gib")
    microbatches = sorted(set(args.microbatch or config["trace"]["microbatch"]))
    if any(b < 1 for b in microbatches):
        raise PhazeError(f"microbatch sizes must be >= 1, got {microbatches}")
    wanted = sorted(set(args.tp or config["trace"]["tp"]))
    tps = [t for t in wanted if t in spec.valid_tp and args.devices % t == 0]
    if not tps:
        raise PhazeError(
            f"no tensor-parallel width of {wanted} fits {spec.name} "
            f"(valid: {list(spec.valid_tp)}) on {args.devices} devices"
        )
    moe = getattr(spec, "moe", None)
    experts = moe.experts if moe is not None else 0
    if args.ep is None:
        eps = [e for e in range(1, experts + 1) if experts % e == 0] if experts else [1]
    else:
        eps = sorted(set(args.ep))
        for e in eps:
            if e < 1:
                raise PhazeError(f"--ep sizes must be >= 1, got {eps}")
            if not experts and e > 1:
                raise PhazeError(f"expert parallelism (ep = {e}) needs a mixture-of-experts model")
            if experts and experts % e:
                raise PhazeError(
                    f"the expert-parallel size ep ({e}) must divide the {experts} experts"
                )
    if args.etp is None:
        etps = (None, 1) if experts else (None,)
    else:
        etps = tuple(None if x == "tp" else 1 for x in dict.fromkeys(args.etp))
        if not experts and 1 in etps:
            raise PhazeError(
                "etp = 1 (experts without tensor parallelism) needs a mixture-of-experts model"
            )
    cps = context_parallel_sizes(args.cp, seq, args.devices)
    for c in cps:
        check_context_parallel(seq, c)
        if args.devices % c:
            raise PhazeError(
                f"the context-parallel size cp ({c}) must divide the {args.devices} devices"
            )
    result, found = optimize_strategy(
        spec,
        preset,
        devices=args.devices,
        global_batch=args.global_batch,
        seq=seq,
        hbm_capacity_bytes=float(hbm),
        config=config,
        microbatches=microbatches,
        tps=tps,
        name=args.arch,
        eps=eps,
        etps=etps,
        cps=cps,
    )
    if result is None:
        why = "; ".join(f"{r} ({n})" for r, n in sorted(found.skipped.items())) or "none"
        raise PhazeError(
            f"no strategy of {spec.name} fits {hbm / GIB:g} GiB per device on {args.devices} "
            f"devices ({found.solved} configurations tried; skipped: {why})"
        )
    out = {
        "model": spec.name,
        "arch": args.arch,
        **result,
        "megatron_args": _megatron_args(found.strategy, spec)
        + PRECISION_ARGUMENTS[config["fidelity"]["precision"]]
        + ATTENTION_ARGUMENTS[config["fidelity"].get("attention", "eager")],
        "search": {
            "tp": tps,
            "ep": eps,
            **({"cp": cps} if cps != [1] else {}),
            "microbatch": microbatches,
            "configurations": found.configurations,
            "solved": found.solved,
            "skipped": dict(sorted(found.skipped.items())),
        },
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    s = out["strategy"]
    print(
        f"{spec.name} on {args.devices} x {args.arch}: {out['iteration_time_s']:.4f} s per "
        f"iteration, MFU {out['mfu']:.3f}, peak memory {out['peak_memory_bytes'] / GIB:.1f} GiB"
    )
    print("strategy: " + ", ".join(f"{k} {v}" for k, v in s.items()))
    print(" ".join(out["megatron_args"]))
    return 0
