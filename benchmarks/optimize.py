"""Narayanan et al. 2021, Table 1: each published strategy and what `phaze optimize` chooses under
the same step model (a100-80gb, 80 GiB, the row's GPUs and global batch).

Searched: tp in {1, 2, 4, 8}, microbatch in {1, 2, 4, 8, 16} (and the row's own), the placement
axes of the default config (interleave 1–4, recompute none / selective / full, sequence
parallelism, distributed optimizer, DDP overlap / after), every pipeline depth with
tp·pp·dp = GPUs and microbatch·dp dividing the batch, every split. Prints per row the published
strategy and its predicted time, the chosen one, its time, MFU and peak memory, and the CPU time
of building the layer costs and of the search, and checks that `evaluate` of the chosen strategy
gives its time back.

    .venv/bin/python benchmarks/optimize.py [--rows 0,4,9]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phaze.arch.presets import load_preset
from phaze.config import load_config
from phaze.fidelity.evaluate import evaluate_strategy, gpu_chains, optimize_strategy
from phaze.fidelity.validate import SEQ, gpt_spec, published_strategy, read_reference
from phaze.step.strategy import Strategy
from phaze.units import GIB


def describe(s: Strategy) -> str:
    stages = s.stages or ()
    split = "even" if len(set(stages)) <= 1 else "/".join(map(str, stages))
    return (
        f"tp {s.tp} pp {s.pp} dp {s.dp} b {s.microbatch} V {s.interleave} {s.recompute}"
        f"{' SP' if s.sequence_parallel else ''}{' ZeRO' if s.distributed_optimizer else ''}"
        f" {s.ddp} {split}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row numbers (default: all)")
    args = ap.parse_args()
    cfg = load_config(None)
    preset = load_preset("a100-80gb")
    hbm = float(preset["gpu"]["hbm_capacity_bytes"])
    rows = read_reference()
    pick = [int(x) for x in args.rows.split(",")] if args.rows else range(len(rows))
    for i in pick:
        row = rows[i]
        spec = gpt_spec(row)
        published = published_strategy(row)
        microbatches = sorted({1, 2, 4, 8, 16, row["microbatch"]})
        c0 = time.process_time()
        for t in (1, 2, 4, 8):
            for b in microbatches:
                gpu_chains(spec, t, b, SEQ, preset, cfg)
        build = time.process_time() - c0
        pub = evaluate_strategy(spec, published, preset, seq=SEQ, config=cfg)
        c1 = time.process_time()
        got, found = optimize_strategy(
            spec,
            preset,
            devices=row["gpus"],
            global_batch=row["global_batch"],
            seq=SEQ,
            hbm_capacity_bytes=hbm,
            config=cfg,
            microbatches=microbatches,
            tps=[1, 2, 4, 8],
        )
        search = time.process_time() - c1
        again = evaluate_strategy(spec, found.strategy, preset, seq=SEQ, config=cfg)
        agree = again["iteration_time_s"] / got["iteration_time_s"] - 1
        print(
            f"{row['params_billion']:>6g}B {row['gpus']:>5} GPUs | published {describe(published)}: "
            f"{pub['iteration_time_s']:.3f} s, MFU {pub['mfu']:.3f} | optimize "
            f"{describe(found.strategy)}: {got['iteration_time_s']:.3f} s "
            f"({got['iteration_time_s'] / pub['iteration_time_s'] - 1:+.1%}), MFU {got['mfu']:.3f}, "
            f"{got['peak_memory_bytes'] / GIB:.1f} GiB | evaluate agrees to {agree:+.1e} | CPU: "
            f"layer costs {build:.1f} s, search {search:.2f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
