"""`phaze optimize` wall time and peak memory against the device count (cluster size free).

Each point is one `python -m phaze optimize --model M --arch A --devices N --global-batch N` in a
fresh interpreter (imports, tracing the model, the search, evaluating the answer), its peak
resident memory and CPU time read from the kernel's rusage of that child alone (`os.wait4`), under an
address-space limit (`--limit-gib`, like `ulimit -v`). Devices 10^3 … 10^7 by default, for
gpt3-175b and megatron-gpt-8.3b on h100-sxm (a two-level network) and tpuv4 (an ICI torus: one
pod is 4,096 chips, larger slices are refused). Prints a Markdown table.

    .venv/bin/python benchmarks/cluster_size.py [--exponents 3 4 5 6 7] [--limit-gib 6]
        [--source DIR]   # the checkout to measure (default: this one), e.g. an exported main
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_point(source: Path, model: str, arch: str, devices: int, limit_gib: float, timeout: float):
    """(wall seconds, CPU seconds, peak RSS bytes, exit code, the line that says what happened) of
    one optimize run."""
    argv = [sys.executable, "-m", "phaze", "optimize", "--model", model, "--arch", arch]
    argv += ["--devices", str(devices), "--global-batch", str(devices)]
    # `ulimit -v` in a shell that then becomes the run (exec: the same process, its rusage)
    limit_kib = int(limit_gib * 2**20)
    argv = ["/bin/sh", "-c", f'ulimit -v {limit_kib} && exec "$@"', "sh", *argv]
    env = {**os.environ, "PYTHONPATH": str(source)}
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.strip()]
    if not lines:
        lines = ["(no output)"]
    # the first line: the answer, or the error (a traceback's last line says what failed)
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss * 1024, proc.returncode, line


def summary(code: int, line: str) -> str:
    if code == 0:
        # "<model> on N x <arch>: T s per iteration, MFU u, peak memory M GiB"
        return line.split(": ", 1)[1] if ": " in line else line
    if code == 2 and "error: " in line:
        return "exit 2: " + line.split("error: ", 1)[1][:90]
    return f"fails (exit {code}): {line[:90]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exponents", type=int, nargs="+", default=[3, 4, 5, 6, 7])
    parser.add_argument("--models", nargs="+", default=["megatron-gpt-8.3b", "gpt3-175b"])
    parser.add_argument("--archs", nargs="+", default=["h100-sxm", "tpuv4"])
    parser.add_argument("--limit-gib", type=float, default=6.0, help="address-space limit")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--source", type=Path, default=REPO, help="checkout to measure")
    args = parser.parse_args()
    print(f"source: {args.source}; address space limited to {args.limit_gib:g} GiB")
    print("| model | arch | devices | wall s | CPU s | peak RSS MiB | result |")
    print("|---|---|---:|---:|---:|---:|---|")
    for model in args.models:
        for arch in args.archs:
            for e in args.exponents:
                wall, cpu, peak, code, line = run_point(
                    args.source, model, arch, 10**e, args.limit_gib, args.timeout
                )
                print(
                    f"| {model} | {arch} | 10^{e} | {wall:.1f} | {cpu:.1f} | {peak / 2**20:.0f} | "
                    f"{summary(code, line)} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
