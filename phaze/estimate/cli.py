"""`python -m phaze estimate`: per-operator latency on each selected architecture.

``--matmul M N K --arch PRESET [--batch B] [--json]`` instead costs one GEMM on one preset.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from phaze.config import add_config_argument, load_config
from phaze.errors import PhazeError
from phaze.estimate.matmul import matmul_report
from phaze.estimate.stage import estimate
from phaze.io.select import add_arch_selection_arguments, select_archs
from phaze.io.tables import read_table, write_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="trace directory holding ops.parquet")
    add_arch_selection_arguments(parser)
    add_config_argument(parser)
    parser.add_argument("--out", required=True, help="output latency.parquet")
    single = parser.add_argument_group(
        "one GEMM instead of a trace (needs no --trace/--space/--out)"
    )
    single.add_argument(
        "--matmul", nargs="+", metavar="M N K", help="cost one [batch x] (MxK)·(KxN) GEMM"
    )
    single.add_argument("--arch", help="preset to cost it on (config/presets/NAME.yaml)")
    single.add_argument("--batch", default="1", help="independent GEMM instances (default 1)")
    single.add_argument("--json", action="store_true", help="print the result as JSON")
    # --trace/--space/--out are required unless --matmul; run() checks which mode it is in, so a
    # missing argument is one line on stderr like every other input error
    for action in parser._actions:
        if action.dest in ("trace", "space", "out"):
            action.required = False


def _positive_ints(values: list[str], what: str) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise PhazeError(f"{what} needs positive integers, got {' '.join(values)}") from None


def run_matmul(args: argparse.Namespace, config: dict) -> int:
    extra = [f"--{a}" for a in ("trace", "space", "out", "chunks", "archs") if getattr(args, a)]
    if extra or args.chunk is not None:
        raise PhazeError(f"--matmul costs one GEMM on --arch; it takes no {extra or ['--chunk']}")
    if len(args.matmul) != 3:
        raise PhazeError(f"--matmul needs three integers M N K, got {len(args.matmul)} values")
    if not args.arch:
        raise PhazeError("--matmul needs --arch PRESET (config/presets/NAME.yaml)")
    m, n, k = _positive_ints(args.matmul, "--matmul")
    (batch,) = _positive_ints([args.batch], "--batch")
    report = matmul_report(m, n, k, batch, args.arch, config)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{args.arch}: {batch} x {m}x{k}·{k}x{n} in {report['latency_s'] * 1e6:.2f} us, "
            f"{report['flops_per_s'] / 1e12:.1f} TFLOP/s ({report['utilization']:.1%} of peak), "
            f"{report['bound']}-bound"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.matmul is not None:
        return run_matmul(args, config)
    single = [f"--{a}" for a in ("arch", "json") if getattr(args, a)]
    if single or args.batch != "1":
        raise PhazeError(f"{single or ['--batch']} belong to --matmul mode")
    missing = [f"--{a}" for a in ("trace", "space", "out") if not getattr(args, a)]
    if missing:
        raise PhazeError(f"estimate needs {missing} (or --matmul M N K --arch PRESET)")
    trace = Path(args.trace)
    if not trace.is_dir():
        raise PhazeError(f"trace directory not found: {trace}")
    ops = read_table(trace / "ops.parquet", "ops", nonempty=True)
    space = select_archs(args)
    latency = estimate(ops, space, config["costmodel"], config["place"])
    write_table(latency, args.out, "latency")
    print(f"phaze estimate: {len(ops)} ops x {len(space)} archs -> {args.out}")
    return 0
