"""The Snakemake process's own CPU per job, with each job selector (`--scheduler`).

Builds a scratch workflow of N independent two-job chains (a job writing a file, a job sleeping
--sleep seconds and copying it: 2N jobs, N ready at once, like a search round's chunks), runs the
Snakemake of this checkout on it with `--cores` jobs at a time under `/usr/bin/time`, and prints
per scheduler the process's CPU seconds (user + sys, the jobs' shells included; they are a few
milliseconds each), CPU per job and wall time. Whatever the jobs do, this is what each costs the
submitting process.

    .venv/bin/python benchmarks/snakemake_overhead.py [--chains 300] [--sleep 0.3] [--cores 2]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"

sys.path.insert(0, str(REPO / "benchmarks"))

# the /usr/bin/time -v reader of benchmarks/paper.py, beside this script
from paper import gnu_time_report

SNAKEFILE = """
rule all:
    input: expand("out/{{i}}.txt", i=range({n}))
rule work:
    input: "in/{{i}}.txt"
    output: "out/{{i}}.txt"
    shell: "sleep {sleep}; cp {{input}} {{output}}"
rule make:
    output: "in/{{i}}.txt"
    shell: "echo {{wildcards.i}} > {{output}}"
"""


def measure(work: Path, scheduler: str, cores: int) -> tuple[float, float]:
    for d in ("in", "out", ".snakemake"):
        shutil.rmtree(work / d, ignore_errors=True)
    out = subprocess.run(
        ["/usr/bin/time", "-v", str(SNAKEMAKE), "--cores", str(cores), "-q"]
        + ["--scheduler", scheduler],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"snakemake --scheduler {scheduler} failed:\n{out.stderr[-2000:]}")
    t = gnu_time_report(out.stderr, f"snakemake --scheduler {scheduler}")
    return t["cpu_s"], t["wall_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", type=int, default=300)
    ap.add_argument("--sleep", type=float, default=0.3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--schedulers", nargs="+", default=["ilp", "greedy"])
    args = ap.parse_args()
    jobs = 2 * args.chains + 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "Snakefile").write_text(SNAKEFILE.format(n=args.chains, sleep=args.sleep))
        print(f"{jobs} jobs ({args.chains} chains, sleep {args.sleep} s), --cores {args.cores}")
        for scheduler in args.schedulers:
            cpu, wall = measure(work, scheduler, args.cores)
            print(
                f"--scheduler {scheduler:6s}: Snakemake process {cpu:7.1f} CPU-s "
                f"({1000 * cpu / jobs:5.1f} ms per job), wall {wall:6.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
