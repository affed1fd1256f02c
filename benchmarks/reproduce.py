"""Reproducibility check: the same sweep twice from empty result directories, summaries compared
byte for byte.

    .venv/bin/python benchmarks/reproduce.py [--configfile config/paper.yaml config/reproduce.yaml]
        [--jobs 1] [--workdir DIR] [--sequential]

Two copies of the committed tree (``git archive HEAD``, so what is measured is the commit it
names; uncommitted edits are not in it) are made under --workdir, each with the checkout's
.venv linked, and each runs ``scripts/run.sh --configfile ... -j JOBS`` from an empty
``results/``. By default both run at once, so their solves see different machine load: a result
that depends on a clock (a time limit reached, a deadline in a heuristic) differs between them.
Then every file of ``results/summary/`` is compared by SHA-256, and the tables also row by row
(benchmarks/compare_summaries.py) so a difference says where it is. Prints one line per file,
each run's wall and CPU time, and exits 0 when the summaries are identical, 1 when they differ,
2 when a run fails.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "compare_summaries", REPO / "benchmarks" / "compare_summaries.py"
)
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def checkout(dest: Path) -> None:
    """The committed tree at HEAD in ``dest`` (no results, no .snakemake), .venv linked."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    os.symlink(REPO / ".venv", dest / ".venv")


def digests(summary: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(summary.iterdir())
        if p.is_file()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configfile",
        nargs="+",
        default=["config/paper.yaml", "config/reproduce.yaml"],
        help="config files, merged in order as Snakemake does",
    )
    ap.add_argument("--jobs", type=int, default=1, help="Snakemake cores per run")
    ap.add_argument("--workdir", type=Path, help="where the two copies go (default: a temp dir)")
    ap.add_argument("--sequential", action="store_true", help="one run after the other")
    ap.add_argument("--keep", action="store_true", help="keep the copies and their results")
    args = ap.parse_args(argv)
    for cfg in args.configfile:
        if not (REPO / cfg).is_file():
            print(f"reproduce: no config file {cfg}", file=sys.stderr)
            return 2
    if not (REPO / ".venv").exists():
        print("reproduce: no .venv in the checkout (run scripts/setup.sh first)", file=sys.stderr)
        return 2
    commit = _git("rev-parse", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no"):
        print(f"reproduce: uncommitted changes are not measured; running {commit[:12]}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="phaze-reproduce-"))
    runs = {name: work / name for name in ("a", "b")}
    for d in runs.values():
        if d.exists():
            print(f"reproduce: {d} exists; give an empty --workdir", file=sys.stderr)
            return 2
        checkout(d)
    cmd = ["bash", "scripts/run.sh", "--configfile", *args.configfile, "-j", str(args.jobs)]
    procs, started, logs = {}, {}, {}
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = ru0.ru_utime + ru0.ru_stime
    walls, codes = {}, {}
    for name, d in runs.items():
        logs[name] = open(d / "run.log", "w")  # noqa: SIM115 (closed below)
        started[name] = time.monotonic()
        procs[name] = subprocess.Popen(cmd, cwd=d, stdout=logs[name], stderr=subprocess.STDOUT)
        if args.sequential:
            codes[name] = procs[name].wait()
            walls[name] = time.monotonic() - started[name]
    for name, p in procs.items():
        if name not in codes:
            codes[name] = p.wait()
            walls[name] = time.monotonic() - started[name]
        logs[name].close()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru1.ru_utime + ru1.ru_stime - cpu0
    print(f"commit {commit}; config {' + '.join(args.configfile)}; -j {args.jobs} per run")
    mode = "one after the other" if args.sequential else "at once"
    print(f"two runs {mode}: wall {walls['a']:.0f} s and {walls['b']:.0f} s, {cpu:.0f} CPU-s")
    failed = [n for n, c in codes.items() if c != 0]
    if failed:
        for n in failed:
            print(f"run {n} failed (exit {codes[n]}); log: {runs[n] / 'run.log'}", file=sys.stderr)
        return 2
    sa, sb = (runs[n] / "results" / "summary" for n in ("a", "b"))
    da, db = digests(sa), digests(sb)
    same = True
    for name in sorted(set(da) | set(db)):
        if da.get(name) == db.get(name):
            print(f"{name}: identical ({da[name][:16]})")
        else:
            same = False
            print(
                f"{name}: DIFFERENT ({(da.get(name) or '-')[:16]} vs {(db.get(name) or '-')[:16]})"
            )
    if not same:
        for name, problems in compare.compare_dirs(sa, sb, 0.0).items():
            for p in problems:
                print(f"  {name}: {p}")
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"copies kept in {work}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
