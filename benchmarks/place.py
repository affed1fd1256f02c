"""Placement solver speed on the paper's problem size, in upstream's instance format.

GPT-3-like chain (embedding, 96 blocks, head), t in {4, 8}, 1,024 devices, 4,096 microbatches,
recompute on (tests/place_instances.py: gpt3_like_instance). Prints, separately:
* the solve itself (in-process, after imports, best of --repeat runs), and
* the whole `python -m phaze place --instance FILE` process (interpreter start-up, imports,
  JSON parse, solve, print), and the start-up alone (`python -m phaze place --help`).
Also times our mode's objective (largest-stage all-reduce, adam, link latency) on the same chain
for t in {1, 2, 4, 8}, on the flat link and on a two-level network (the a100-80gb preset's DGX A100
network: 8 devices per node; phaze.place.network).

    .venv/bin/python benchmarks/place.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the synthetic instance is a test fixture

from place_instances import gpt3_like_instance

from phaze.arch.presets import load_preset
from phaze.place import AllReduce, StageRule, data_parallel_degrees, solve
from phaze.place.network import PlaceNetwork
from phaze.place.upstream import instance_graphs, solve_instance


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    ins = gpt3_like_instance()
    solve_s, out = best_of(lambda: solve_instance(ins), args.repeat)
    print(
        f"instance: GPT-3-like, {len(ins['nodes']['4'])} nodes, t in {sorted(map(int, ins['nodes']))}, "
        f"{ins['maxDevices']} devices, {ins['mbsInBatch']} microbatches, recompute on"
    )
    print(
        f"result: time/batch {out['finalTimePerBatch']:.4f} s, d={out['dataParallelDegree']}, "
        f"t={out['tensorParallelDegree']}, stages={len(out['stages'])}; "
        f"fixed (32, 8, 4): {out['fixedStrategyTimePerBatch']:.4f} s"
    )
    print(f"solve (in-process, best of {args.repeat}): {solve_s:.3f} s")

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt3.json"
        path.write_text(json.dumps(ins))
        cmd = [sys.executable, "-m", "phaze", "place", "--instance", str(path)]
        proc_s, _ = best_of(
            lambda: subprocess.run(cmd, check=True, capture_output=True, env=env),
            max(1, args.repeat // 2),
        )
        start_s, _ = best_of(
            lambda: subprocess.run(
                [sys.executable, "-m", "phaze", "place", "--help"],
                check=True,
                capture_output=True,
                env=env,
            ),
            max(1, args.repeat // 2),
        )
    print(f"process `python -m phaze place --instance` (total): {proc_s:.3f} s")
    print(
        f"process start-up alone (`python -m phaze place --help`: interpreter, CLI parser "
        f"of every stage): {start_s:.3f} s"
    )

    ins4 = gpt3_like_instance(widths=(1, 2, 4, 8))
    graphs, _ = instance_graphs(ins4)
    for recompute in (False, True):
        for hbm_gib in (32, 80):
            rule = StageRule(
                bandwidth=44.8e9,
                latency=1e-6,
                param_state_factor=8.0,
                recompute=recompute,
                memory_capacity=hbm_gib * 2**30,
                max_positions=1024,
            )
            ar = AllReduce(mode="max", bandwidth=44.8e9, latency=1e-6)
            d_values = data_parallel_degrees(1024, 4096, False, False)
            s, p = best_of(
                lambda rule=rule, d_values=d_values, ar=ar: solve(
                    graphs, rule, 1024, 4096, d_values, ar
                ),
                args.repeat,
            )
            print(
                f"our mode, t in 1,2,4,8, adam, {hbm_gib} GiB, recompute {'on' if recompute else 'off'}: "
                f"{s:.3f} s -> t={p.t} d={p.d} pp={p.pp} {p.time_per_batch:.4f} s/batch"
            )
    net = PlaceNetwork.from_dict(load_preset("a100-80gb")["network"], "a100-80gb network")
    for recompute in (False, True):
        for hbm_gib in (32, 80):
            rule = StageRule(
                bandwidth=44.8e9,
                latency=1e-6,
                param_state_factor=8.0,
                recompute=recompute,
                memory_capacity=hbm_gib * 2**30,
                max_positions=1024,
            )
            ar = AllReduce(mode="max", bandwidth=44.8e9, latency=1e-6, network=net)
            d_values = data_parallel_degrees(1024, 4096, False, False)
            s, p = best_of(
                lambda rule=rule, d_values=d_values, ar=ar: solve(
                    graphs, rule, 1024, 4096, d_values, ar
                ),
                args.repeat,
            )
            print(
                f"our mode on the a100-80gb two-level network, t in 1,2,4,8, adam, {hbm_gib} GiB, "
                f"recompute {'on' if recompute else 'off'}: {s:.3f} s -> t={p.t} d={p.d} pp={p.pp} "
                f"{p.time_per_batch:.4f} s/batch"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
