"""Placement solver speed on the paper's problem size, in upstream's instance format.

GPT-3-like chain (embedding, 96 blocks, head), t in {4, 8}, 1,024 devices, 4,096 microbatches,
recompute on (tests/place_instances.py: gpt3_like_instance). Prints, separately:
* the solve itself (in-process, after imports, best of --repeat runs), and
* the whole `python -m phaze place --instance FILE` process (interpreter start-up, imports,
  JSON parse, solve, print), and the start-up alone (`python -m phaze place --help`).
Also times our upstream-model objective (largest-stage all-reduce, adam, link latency) on the
same chain for t in {1, 2, 4, 8}, on the flat link and on a two-level network (the a100-80gb
preset's DGX A100 network: 8 devices per node; phaze.place.network).

Then the megatron model's exact search (phaze/place/megatron.py): GPT-3 175B (the real trace:
memory from its saved tensors) on 1,024 devices, global batch 1,536, every axis open — tp in
{1, 2, 4, 8}, interleave in {1, 2, 3, 4, 6, 8}, recompute none / selective / full, sequence
parallelism, distributed optimizer, DDP overlap / after, every pipeline depth and every split —
with the a100-80gb preset's kernel-sum layer times, on its DGX network and on one flat 44.8 GB/s
link (as a grid architecture without a network). CPU seconds per HBM size and microbatch (one
placement job's work for one architecture), chains prepared beforehand.

    .venv/bin/python benchmarks/place.py [--repeat 5] [--skip-upstream] [--skip-megatron]
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
from phaze.units import GIB


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
    ap.add_argument("--skip-upstream", action="store_true")
    ap.add_argument("--skip-megatron", action="store_true")
    args = ap.parse_args()
    if not args.skip_upstream:
        upstream(args)
    if not args.skip_megatron:
        megatron(args)
    return 0


def megatron(args) -> None:
    from phaze.config import load_config
    from phaze.fidelity.evaluate import gpu_chains, step_constants
    from phaze.network import HierarchicalNetwork, LinkLevel
    from phaze.place.megatron import Axes, optimize
    from phaze.trace.models import get_model_spec

    cfg = load_config(None)
    preset = load_preset("a100-80gb")
    spec = get_model_spec("gpt3-175b")
    axes = Axes(interleave=(1, 2, 3, 4, 6, 8))
    t0 = time.perf_counter()
    chains = {}
    for b in (1, 2):
        for t in (1, 2, 4, 8):
            for sp, c in gpu_chains(spec, t, b, spec.seq, preset, cfg).items():
                chains[(t, b, sp)] = c
    print(
        f"megatron model: GPT-3 175B, 1,024 devices, global batch 1,536, tp in 1,2,4,8, V in "
        f"{list(axes.interleave)}, every other axis open (chains: {time.perf_counter() - t0:.1f} s)"
    )
    consts = step_constants(preset, cfg)
    nets = {
        "a100-80gb DGX network": HierarchicalNetwork.from_preset(preset["network"]),
        "flat 44.8 GB/s link": HierarchicalNetwork.flat(LinkLevel(44.8e9, 1e-6), 1024),
    }
    for label, net in nets.items():
        for b in (1, 2):
            sub = {k: v for k, v in chains.items() if k[1] == b}
            for hbm_gib in (32, 64, 80):
                cpu = []
                for _ in range(args.repeat):
                    c0 = time.process_time()
                    r = optimize(sub, net, consts, 1024, 1536, hbm_gib * GIB, axes)
                    cpu.append(time.process_time() - c0)
                s_ = r.strategy
                best = (
                    f"{r.time_s:.3f} s/iteration: tp {s_.tp} pp {s_.pp} dp {s_.dp} V {s_.interleave} "
                    f"{s_.recompute} sp {int(s_.sequence_parallel)} zero "
                    f"{int(s_.distributed_optimizer)} {s_.ddp}"
                    if s_
                    else "nothing fits"
                )
                print(
                    f"  {label}, b {b}, {hbm_gib} GiB: {min(cpu):.3f} s CPU (best of "
                    f"{args.repeat}; {r.configurations} configurations, {r.solved} solved) -> {best}"
                )


def upstream(args) -> None:

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
                hbm_capacity_bytes=hbm_gib * GIB,
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
                hbm_capacity_bytes=hbm_gib * GIB,
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


if __name__ == "__main__":
    sys.exit(main())
