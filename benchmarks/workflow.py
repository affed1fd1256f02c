"""Fresh run of the workflow (default: config/config.yaml) in a temporary copy of the repo.

Prints the wall time, the summed CPU time of all jobs (Snakemake `benchmark:` files), the number
of jobs per rule, and the search's counts (rounds, archs computed, ILP instances).

    .venv/bin/python benchmarks/workflow.py [--configfile config/config.yaml] [--cores 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
COPY = ("Snakefile", "rules", "config", "phaze", "report", "environment.yml")


def cpu_by_rule(results: Path) -> tuple[Counter, Counter, float]:
    cpu, jobs = Counter(), Counter()
    for f in (results / "benchmarks").rglob("*.tsv"):
        rule = f.relative_to(results / "benchmarks").parts[0]
        row = pd.read_csv(f, sep="\t").iloc[-1]
        cpu[rule] += float(row["cpu_time"])
        jobs[rule] += 1
    return cpu, jobs, sum(cpu.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", default="config/config.yaml")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--keep", help="run in this directory (kept) instead of a temporary one")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="phaze-wf-"))
    if (work / "results").exists():
        sys.exit(f"{work}/results exists: this benchmark measures a FRESH run")
    work.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, work / name)
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "--cores",
        str(args.cores),
        "--rerun-incomplete",
        "--configfile",
        args.configfile,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    (work / "snakemake.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    results = work / "results"
    cpu, jobs, total = cpu_by_rule(results)
    stats = json.loads((results / "summary" / "search_stats.json").read_text())
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    print(f"config: {args.configfile}, cores: {args.cores}, load average after: {' '.join(load)}")
    print(
        f"wall time: {wall:.1f} s for {sum(jobs.values())} jobs; CPU time of all jobs: {total:.1f} s"
    )
    print(f"{'rule':<16}{'jobs':>6}{'cpu_s':>10}")
    for rule in sorted(cpu, key=cpu.get, reverse=True):
        print(f"{rule:<16}{jobs[rule]:>6}{cpu[rule]:>10.1f}")
    keys = (
        "rounds_computed",
        "archs_in_space",
        "archs_refined",
        "archs_with_ilp",
        "ilp_instances",
        "ilp_instances_avoided_by_pruning",
        "searches",
        "certified_gap_max",
        "space_gap_max",
    )
    for k in keys:
        print(f"{k}: {stats.get(k)}")
    out = {
        "wall_s": wall,
        "cpu_s": total,
        "jobs": dict(jobs),
        "cpu_by_rule_s": dict(cpu),
        "search": stats,
        "workdir": str(work),
    }
    (REPO / "benchmarks" / "out").mkdir(parents=True, exist_ok=True)
    (REPO / "benchmarks" / "out" / "workflow.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
