"""CPU time and peak memory of one placement command (`phaze place ...` or a `phaze search batch`
of them, as a search job runs it), and a digest of every table it writes, so two commits can be
compared on the same job:

    .venv/bin/python benchmarks/place_job.py [--repeat N] -- search batch --config CFG 'place ...'

(the arguments are those of the job's shell command in the Snakemake log, run from the workflow's
directory). Each run is a fresh process; prints per run its user + system CPU seconds and peak
RSS, then the SHA-256 of each output table's rows (pandas, so file metadata does not count).
"""

from __future__ import annotations

import hashlib
import resource
import shlex
import subprocess
import sys


def _outputs(argv: list[str]) -> list[str]:
    """Every ``--out`` path of the command (inside batch arguments too)."""
    words = [w for a in argv for w in (shlex.split(a) if " " in a else [a])]
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--out"]


def _digest(path: str) -> str:
    import pandas as pd

    df = pd.read_parquet(path)
    rows = pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes()
    return hashlib.sha256(rows + ",".join(df.columns).encode()).hexdigest()[:16]


def main(argv: list[str]) -> int:
    repeat = 1
    if argv[:1] == ["--repeat"]:
        repeat, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SystemExit(__doc__)
    for run in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-m", "phaze", *argv], check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        # ru_maxrss of children: the largest of any child so far (KiB on Linux)
        print(
            f"run {run + 1}: exit {done.returncode}, {cpu:.2f} CPU-s "
            f"(user {after.ru_utime - before.ru_utime:.2f}), peak RSS {after.ru_maxrss // 1024} MiB"
        )
        if done.returncode:
            return done.returncode
    for path in _outputs(argv):
        print(f"{path}: {_digest(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
