"""A synthetic round 0 of the search, to measure a round step's memory without computing a real
space's bounds: a plan and the space bounds of ``--models`` × ``--microbatches`` files over
``--families`` families of 8 × 8 × 8 architectures (tensor cores × vector cores × buffer), each
one step up on one axis dominating the one below, at ``--hbm`` HBM sizes and 1,024 devices.

    .venv/bin/python benchmarks/synthetic_round.py /tmp/synth --families 60 --models 8 \
        --microbatches 4 --hbm 3
    .venv/bin/python benchmarks/select_memory.py search select --plan /tmp/synth/chunks.parquet \
        --round 0 --manifest /tmp/synth/manifest.json --config config/paper.yaml \
        --benchmarks /tmp/synth/bench --out-dir /tmp/synth/out

The bounds are random (seed 0) but grow along every dominance step, as real ones do; 5 % of the
components fit nothing (NaN). 60 families × 8 models × 4 microbatches × 3 HBM sizes is 2,949,120
components, about the paper grid's 2,823,744 with its 96 components per architecture.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from phaze.io import write_table
from phaze.io.manifest import write_manifest
from phaze.search.plan import make_plan

SIDE = 8  # values per axis in a family
HBM_GIB = (32, 64, 80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--families", type=int, default=60)
    ap.add_argument("--models", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--hbm", type=int, default=3, choices=(1, 2, 3))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    keys = list(itertools.product(range(args.families), range(SIDE), range(SIDE), range(SIDE)))
    index = {k: i for i, k in enumerate(keys)}
    n = len(keys)
    archs = np.array([f"{h:012x}" for h in rng.choice(2**47, n, replace=False)])
    area = np.array([10 + 2 * a + 1.5 * b + c + 0.3 * f for f, a, b, c in keys])
    space = pd.DataFrame({"arch": archs, "area_mm2": area, "preset": ""})
    space.loc[0, "preset"] = "tpuv4"
    write_table(make_plan(space, 5.0, 2, 64, ("tpuv4",), 1e9), out / "chunks.parquet", "chunks")
    ups = []
    for f, *axes in keys:
        up = []
        for d in range(3):
            k = list(axes)
            k[d] += 1
            if k[d] < SIDE:
                up.append(archs[index[(f, *k)]])
        ups.append(",".join(sorted(up)))
    ups = np.array(ups, dtype=object)
    base = np.array([1 + a + b + c for _, a, b, c in keys], float)
    entries = []
    for m, mb in itertools.product(range(args.models), range(1, args.microbatches + 1)):
        parts = []
        for gib in HBM_GIB[: args.hbm]:
            t = base * (m + 1) * mb * (1 + gib / 100) * rng.uniform(1, 1.3, n)
            t[rng.random(n) < 0.05] = np.nan
            parts.append(
                pd.DataFrame(
                    {
                        "arch": archs,
                        "model": f"model{m}",
                        "microbatch": mb,
                        "hbm_capacity_bytes": gib * 2**30,
                        "devices": 1024,
                        "throughput_upper_seq_s": t,
                        "dominated_by": ups,
                    }
                )
            )
        path = out / f"bounds_m{m}_b{mb}.parquet"
        write_table(pd.concat(parts, ignore_index=True), path, "bounds")
        entries.append({"path": str(path), "model": f"model{m}", "microbatch": mb})
    write_manifest(out / "manifest.json", {"space": entries, "place": []})
    print(f"{n} architectures, {n * len(entries) * args.hbm} components -> {out}")


if __name__ == "__main__":
    main()
