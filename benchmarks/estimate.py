"""Speed of the estimate stage and the tpuv4 preset's modelled figures.

    python benchmarks/estimate.py [--trace DIR | --model NAME --microbatch B --tp T] [--config FILE]
    python benchmarks/estimate.py --gemm-utilization [--config FILE]

Times the cost model on every architecture of the space (default: upstream's full grid, i.e. all
unique core configurations) × every operator of one model's trace (its unique layer signatures,
forward and backward), on one core. Without --trace, the model is traced first into a temporary
directory (`python -m phaze trace`). Then prints the tpuv4 table of docs/estimate.md.

With --gemm-utilization: the GEMM utilization of the run's space (default config/config.yaml)
on each of its traces (models × microbatch × tensor-parallel width): FLOPs of all GEMMs (each
layer counted as often as the model has it; traced unfused, so no element-wise work rides on a
GEMM) / (their all-core latency × peak), for the tpuv4
preset and min / median / max over the grid points. It uses only the estimate stage's public
entry point, so the same script run against another checkout (PYTHONPATH) compares models.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the figure promises

import pandas as pd

from phaze.arch.presets import load_preset
from phaze.arch.space import build_space
from phaze.config import load_config, validate_config
from phaze.estimate import matmul_cost
from phaze.estimate.stage import estimate


def trace(model: str, microbatch: int, tp: int, out: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "phaze",
        "trace",
        "--model",
        model,
        "--microbatch",
        str(microbatch),
        "--tp",
        str(tp),
        "--out",
        out,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def tpuv4_table(costmodel: dict, area_mm2: float) -> str:
    a = load_preset("tpuv4")["arch"]
    cm = {**costmodel, **load_preset("tpuv4")["costmodel"]}
    peak = 2.0 * a["n_tc"] * a["tc_width"] * a["tc_depth"] * a["freq_hz"]
    lines = [
        "| quantity | tpuv4 preset (modelled) |",
        "|---|---|",
        f"| peak tensor FLOP/s (bf16) | {peak / 1e12:.1f} T |",
        f"| area (22 nm model) | {area_mm2:.1f} mm² |",
        f"| HBM bandwidth | {cm['hbm_bandwidth_Bps'] / 1e12:.2f} TB/s |",
    ]
    for m, n, k in ((8192, 8192, 8192), (2048, 4096, 1024), (1, 8192, 8192), (16, 8192, 8192)):
        c = matmul_cost(m, n, k, 1, a, cm, a["n_tc"])
        util = 2.0 * m * n * k / float(c["latency_s"]) / peak
        lines.append(
            f"| GEMM {m}×{k}·{k}×{n} on 8 cores | {float(c['latency_s']) * 1e6:.1f} µs, "
            f"{util:.1%} of peak, {c['bound']}-bound |"
        )
    return "\n".join(lines)


def gemm_utilization(config: dict) -> None:
    import numpy as np

    from phaze.trace.models import get_model_spec
    from phaze.trace.tracer import trace_model

    space, _ = build_space(config)
    peak = space.set_index("arch")["peak_flops"]
    tpu = space.loc[space.preset == "tpuv4", "arch"]
    print("| model | b | t | tpuv4 | grid min | grid median | grid max |")
    print("|---|---|---|---|---|---|---|")
    for model in config["models"]:
        spec = get_model_spec(model)
        for b in config["trace"]["microbatch"]:
            for t in config["trace"]["tp"]:
                if spec.heads % t:
                    continue
                tr = trace_model(spec, b, t, None, False, False)  # unfused: GEMMs alone
                times = tr.layers.groupby("signature").size().rename("times")
                ops = tr.ops.join(times, on="signature")
                lat = estimate(tr.ops, space, config["costmodel"])
                mm = lat[lat.kind == "matmul"].merge(
                    ops[["signature", "pass", "op", "flops", "times"]],
                    on=["signature", "pass", "op"],
                )
                mm["work_s"] = mm.latency_allcores_s * mm.times
                mm["work_flops"] = mm.flops * mm.times
                per = mm.groupby("arch")[["work_s", "work_flops"]].sum()
                util = per.work_flops / (per.work_s * peak.loc[per.index])
                grid = util.drop(index=tpu, errors="ignore")
                print(
                    f"| {model} | {b} | {t} | {float(util.loc[tpu].iloc[0]):.1%} | "
                    f"{grid.min():.1%} | {np.median(grid):.1%} | {grid.max():.1%} |"
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="trace directory (ops.parquet); default: trace --model first")
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--microbatch", type=int, default=1)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--config", help="config for the space/costmodel; default: full upstream grid")
    ap.add_argument("--gemm-utilization", action="store_true", help=__doc__.splitlines()[4])
    args = ap.parse_args()
    if args.gemm_utilization:
        gemm_utilization(load_config(args.config))
        return 0
    config = load_config(args.config) if args.config else validate_config({})

    t0 = time.perf_counter()
    space, summary = build_space(config)
    t_space = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmpdir:
        trace_dir = args.trace
        if trace_dir is None:
            trace_dir = os.path.join(tmpdir, "trace")
            t0 = time.perf_counter()
            trace(args.model, args.microbatch, args.tp, trace_dir)
            print(
                f"traced {args.model} b{args.microbatch} t{args.tp} in {time.perf_counter() - t0:.1f} s"
            )
        ops = pd.read_parquet(os.path.join(trace_dir, "ops.parquet"))

    n_tc_cfg = len(
        space[["tc_width", "tc_depth", "n_tc", "freq_hz", "glb_bytes"]].drop_duplicates()
    )
    n_vc_cfg = len(space[["vc_width", "n_vc", "freq_hz"]].drop_duplicates())
    mm = ops[ops.kind == "matmul"]
    print(
        f"space: {summary['kept']} of {summary['grid_points']} grid points in {t_space:.2f} s; "
        f"{n_tc_cfg} tensor-core configs (width, depth, count, clock, GLB), {n_vc_cfg} vector-core configs"
    )
    print(
        f"ops: {len(ops)} operators of {ops.signature.nunique()} unique layer signatures "
        f"(fwd+bwd), {len(mm)} GEMMs with {len(mm[['m', 'n', 'k', 'batch']].drop_duplicates())} unique shapes"
    )
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    out = estimate(ops, space, config["costmodel"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"estimate: {len(out):,} rows (archs x ops) in {wall:.1f} s wall, {cpu:.1f} s CPU")
    tpu_area = (
        float(space.loc[space.preset == "tpuv4", "area_mm2"].iloc[0])
        if (space.preset == "tpuv4").any()
        else float("nan")
    )
    print()
    print(tpuv4_table(config["costmodel"], tpu_area))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
