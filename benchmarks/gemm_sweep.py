"""GEMM throughput of the cost model over shapes, on the a100-80gb, h100-sxm and tpuv4 presets.

    python benchmarks/gemm_sweep.py [--out docs/gemm_sweep.png] [--config FILE]

Prints (1) the two MAMF shapes (the largest matmul throughput measured on A100 / H100 SXM, bf16,
CUDA 12.1, S. Bekman, ml-engineering, "Maximum Achievable Matmul FLOPS" table) against the
model, (2) a table of small and skinny shapes, and plots docs/gemm_sweep.png: square GEMMs
128…16384 (every multiple of 128, so tile and wave steps show), skinny GEMMs (m = 1…16384 with
n = k = 8192) and the GEMMs of the Megatron Table 1 models (the validation rows' blocks, forward
and backward, at their published microbatch and tensor-parallel width). Solid lines include the
per-operator issue floor (``op_issue_s``, a kernel launch on the GPUs); dashed lines are the
device time alone. Reference points are measurements, not inputs of the model, except He's 8192³ pair (randn vs
zero inputs), from which the A100's main-loop and power-limited clock fractions come.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRESETS = ("a100-80gb", "h100-sxm", "tpuv4")
# measured TFLOP/s (not used by the model): (preset, m, n, k, TFLOP/s, label)
# MAMF: the finder ran torch.mm(A[M x N], B[N x K]) and printed MxNxK, so its middle number is
# the reduction (k here). Azure: cuBLASLt fp16, random inputs, CUDA 12.5, on ND A100 v4 (8x
# A100-SXM4-80GB), Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md.
MEASURED = (
    ("a100-80gb", 6912, 2048, 16384, 267.9, "MAMF (Bekman)"),
    ("h100-sxm", 6144, 2816, 17920, 792.1, "MAMF (Bekman)"),
    ("a100-80gb", 8192, 8192, 8192, 257.0, "randn 8192³ (He)"),
    ("a100-80gb", 1024, 1024, 1024, 119.4, "cuBLASLt (Azure)"),
    ("a100-80gb", 2048, 2048, 2048, 221.8, "cuBLASLt (Azure)"),
    ("a100-80gb", 4096, 4096, 4096, 228.0, "cuBLASLt (Azure)"),
    ("a100-80gb", 8192, 8192, 8192, 253.7, "cuBLASLt (Azure)"),
    ("a100-80gb", 16384, 16384, 16384, 256.5, "cuBLASLt (Azure)"),
    ("a100-80gb", 1024, 2145, 1024, 132.8, "cuBLASLt (Azure)"),
    ("a100-80gb", 6144, 12288, 12288, 250.8, "cuBLASLt (Azure)"),
    ("a100-80gb", 802816, 192, 768, 157.8, "cuBLASLt (Azure)"),
)


def costs(preset: str, config: dict, m, n, k, batch=1):
    """(TFLOP/s with the issue floor, TFLOP/s of the device time alone, peak) over arrays."""
    from phaze.estimate.matmul import peak_flops_per_s, preset_core
    from phaze.estimate.model import matmul_cost

    core, cm = preset_core(preset, config)
    c = matmul_cost(m, n, k, batch, core, cm, core["n_tc"])
    flops = 2.0 * np.asarray(m, float) * n * k * batch
    device = np.maximum(np.maximum(c["compute_s"], c["glb_s"]), c["hbm_s"])
    return flops / c["latency_s"] / 1e12, flops / device / 1e12, peak_flops_per_s(core) / 1e12


def table1_gemms() -> list[tuple[int, int, int, int, float]]:
    """Unique (m, n, k, batch) of the Table 1 rows' blocks with their FLOP share (forward +
    backward, the block counted once per row)."""
    from phaze.fidelity.validate import SEQ, gpt_spec, read_reference
    from phaze.trace.tracer import trace_model

    shapes: dict[tuple[int, int, int, int], float] = {}
    for ref in read_reference():
        tr = trace_model(
            gpt_spec(ref), ref["microbatch"], ref["tensor_parallel"], SEQ, False, False
        )
        mm = tr.ops[(tr.ops.layer == "block.0") & (tr.ops.kind == "matmul")]
        for row in mm.itertuples():
            key = (int(row.m), int(row.n), int(row.k), int(row.batch))
            shapes[key] = shapes.get(key, 0.0) + float(row.flops)
    return [(*key, flops) for key, flops in sorted(shapes.items())]


def main() -> int:
    from phaze.config import load_config, validate_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "gemm_sweep.png"))
    ap.add_argument("--config", help="config whose costmodel section applies; default: schema's")
    args = ap.parse_args()
    config = load_config(args.config) if args.config else validate_config({})

    print("measured GEMMs against the model (m x n x k, k = reduction):")
    for preset, m, n, k, measured, label in MEASURED:
        t, _, _ = costs(preset, config, m, n, k)
        print(
            f"  {preset:10s} {label:18s} m={m} n={n} k={k}: measured {measured:6.1f}, "
            f"model {float(t):6.1f} TFLOP/s ({float(t) / measured - 1:+.1%})"
        )
    print()
    small = [(s, s, s) for s in (128, 256, 512, 1024, 2048, 4096, 8192)] + [
        (m, 8192, 8192) for m in (1, 16, 128, 1024)
    ]
    print("| shape m×n×k | " + " | ".join(f"{p} TFLOP/s (% peak; device only)" for p in PRESETS))
    print("|---|" + "---|" * len(PRESETS))
    for m, n, k in small:
        cells = []
        for preset in PRESETS:
            t, dev, peak = (float(x) for x in costs(preset, config, m, n, k))
            cells.append(f"{t:.1f} ({t / peak:.0%}; {dev / peak:.0%})")
        print(f"| {m}×{n}×{k} | " + " | ".join(cells) + " |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from phaze.io.atomic import atomic_path

    square = np.arange(128, 16384 + 1, 128)
    skinny = np.unique(np.round(np.logspace(0, np.log2(16384), 160, base=2)).astype(int))
    gemms = table1_gemms()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    colors = dict(zip(PRESETS, ("tab:green", "tab:blue", "tab:orange")))
    for preset in PRESETS:
        col = colors[preset]
        for ax, (x, shape) in zip(
            axes[:2], ((square, (square, square, square)), (skinny, (skinny, 8192, 8192)))
        ):
            t, dev, peak = costs(preset, config, *shape)
            ax.plot(x, 100 * t / peak, color=col, lw=1.2, label=preset)
            ax.plot(x, 100 * dev / peak, color=col, lw=0.8, ls="--")
        ms, ns, ks, bs, fl = (np.array(v, float) for v in zip(*gemms))
        t, _, peak = costs(preset, config, ms, ns, ks, bs)
        axes[2].scatter(fl / 1e9, 100 * t / peak, s=14, color=col, label=preset)
    for preset, m, n, k, measured, label in MEASURED:
        _, _, peak = costs(preset, config, m, n, k)
        if m == n == k:
            marker = "+" if "Azure" in label else "x"
            axes[0].scatter([m], [100 * measured / peak], marker=marker, color="k", s=50)
            if m == 8192:
                axes[0].annotate(
                    label,
                    (m, 100 * measured / peak),
                    fontsize=7,
                    xytext=(-70, 6 if "He" in label else -12),
                    textcoords="offset points",
                )
        else:
            mamf = "MAMF" in label
            axes[2].scatter(
                [2 * m * n * k / 1e9],
                [100 * measured / peak],
                marker="x" if mamf else "+",
                color="k",
                s=60,
            )
            if mamf:
                axes[2].annotate(
                    f"{label} {preset}",
                    (2 * m * n * k / 1e9, 100 * measured / peak),
                    fontsize=7,
                    xytext=(-60, 8 if preset == "a100-80gb" else -14),
                    textcoords="offset points",
                )
    axes[0].set(
        xscale="log",
        xlabel="m = n = k (+: cuBLASLt on A100, Azure; x: randn 8192³, He)",
        title="square GEMMs (every multiple of 128)",
    )
    axes[1].set(xscale="log", xlabel="m (n = k = 8192)", title="skinny GEMMs")
    axes[2].set(
        xscale="log",
        xlabel="GFLOP per GEMM (x: measured MAMF; +: cuBLASLt on A100, Azure)",
        title="GEMMs of the Table 1 blocks (fwd + bwd)",
    )
    for ax in axes:
        ax.set_ylabel("% of peak (solid: with issue floor, dashed: device only)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    with atomic_path(args.out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    print(f"\nplot -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
