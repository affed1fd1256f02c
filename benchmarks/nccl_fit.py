"""The a100-80gb preset's intra-node ring constants, re-derived from a published measurement.

    python benchmarks/nccl_fit.py

nccl-tests all_reduce (in place) bus bandwidth on one node of 8 A100-SXM4-80GB on NVSwitch (Azure
ND A100 v4; Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md). nccl-tests reports
busbw = 2(g−1)/g · S / t, so the measured time is t = 2(g−1)/g · S / busbw. The ring model of
phaze/network.py is t = 2(g−1)/g · S / (B · efficiency) + 2(g−1) · L with B = 300 GB/s (NVLink 3
per direction); a least-squares fit in relative time over the messages where NCCL runs its ring
with the Simple protocol (64 MiB and up) gives the preset's efficiency and per-step latency.
Prints both, and the measured and modelled bus bandwidth per size.
"""

from __future__ import annotations

import numpy as np

GPUS = 8
NVLINK_BPS = 300e9
MIB = 2**20
#: message bytes -> bus bandwidth, GB/s
BUS_GBPS = {
    1 * MIB: 36.22,
    2 * MIB: 53.54,
    4 * MIB: 71.43,
    8 * MIB: 89.99,
    16 * MIB: 109.22,
    32 * MIB: 132.77,
    64 * MIB: 166.63,
    128 * MIB: 174.18,
    256 * MIB: 213.87,
    512 * MIB: 221.58,
    1024 * MIB: 228.10,
    2048 * MIB: 230.22,
    4096 * MIB: 230.48,
    8192 * MIB: 231.58,
}
SIMPLE_PROTOCOL_FROM = 64 * MIB


def fit(sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(efficiency, per-step latency s) of t = a·S + b, least squares in t's relative error."""
    design = np.stack([sizes, np.ones_like(sizes)], axis=1) / seconds[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(sizes), rcond=None)
    ring = 2.0 * (GPUS - 1) / GPUS
    return ring / (a * NVLINK_BPS), b / (2.0 * (GPUS - 1))


def main() -> int:
    sizes = np.array(list(BUS_GBPS), dtype=np.float64)
    bus = np.array(list(BUS_GBPS.values())) * 1e9
    ring = 2.0 * (GPUS - 1) / GPUS
    seconds = ring * sizes / bus
    used = sizes >= SIMPLE_PROTOCOL_FROM
    efficiency, latency = fit(sizes[used], seconds[used])
    print(f"efficiency {efficiency:.4f}   per-step latency {latency * 1e6:.1f} us")
    print("| message | measured busbw | model busbw |")
    print("|---|---|---|")
    for s, b, u in zip(sizes, bus, used):
        t = ring * s / (NVLINK_BPS * efficiency) + 2 * (GPUS - 1) * latency
        mark = "" if u else " (not fitted)"
        print(f"| {s / MIB:.0f} MiB | {b / 1e9:.1f} GB/s | {ring * s / t / 1e9:.1f} GB/s{mark} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
