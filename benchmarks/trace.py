"""Wall time (including imports) and peak RSS of tracing one configuration.

Runs `python -m phaze trace` in a fresh subprocess so the time includes interpreter start-up and
the torch/transformers imports, exactly what a Snakemake job pays; peak RSS is the child's
ru_maxrss. Default: gpt3-175b, microbatch 1, seq 2048, t 8 (targets: <= 30 s, <= 2 GB).

    .venv/bin/python benchmarks/trace.py [--model M --microbatch B --seq S --tp T --repeat N]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S, TARGET_BYTES = 30.0, 2 * 1024**3


def run_once(args) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "phaze",
            "trace",
            "--model",
            args.model,
            "--microbatch",
            str(args.microbatch),
            "--tp",
            str(args.tp),
            "--seq",
            str(args.seq),
            "--out",
            out,
        ]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"trace failed ({proc.returncode}): {proc.stderr.strip()}")
        # children's max RSS so far (KiB on Linux); each run is a new child, so take the max
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        return wall, peak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt3-175b")
    p.add_argument("--microbatch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    walls, peak = [], 0
    for _ in range(args.repeat):
        wall, peak = run_once(args)
        walls.append(wall)
    best, worst = min(walls), max(walls)
    print(
        f"trace {args.model} b{args.microbatch} s{args.seq} t{args.tp}: wall "
        f"{best:.2f} s best / {worst:.2f} s worst of {args.repeat} (incl. imports, target "
        f"<= {TARGET_S:.0f} s); peak RSS {peak / 2**20:.0f} MiB (target <= 2048 MiB); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    return 0 if worst <= TARGET_S and peak <= TARGET_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
