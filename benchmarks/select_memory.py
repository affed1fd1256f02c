"""Peak memory of one search round step (`phaze search select`, `prune` or `summarize`), and where
it is reached: the step runs in this process while a thread samples its resident set size (from
/proc/self/statm) and the phaze frames on the main thread's stack every 0.1 s.

    .venv/bin/python benchmarks/select_memory.py search select --plan results/arch/chunks.parquet \
        --round 0 --manifest results/logs/search/r0_select.log.manifest.json \
        --config results/.config/HASH.json --benchmarks results/benchmarks --out-dir /tmp/sel

(the arguments are those of the rule's command, from its log's manifest). Prints the step's own
output, then the peak RSS, the wall time and, per phaze call site, the largest RSS seen while it
ran (the top ``--top`` of them): the phases a columnar rework has to shrink.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

REPO_MARK = "/phaze/"


def _rss_mib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 // 2**20


def _site(frame) -> str:
    """The innermost phaze frames of a stack, as ``function:line <- ...``."""
    stack = [s for s in traceback.extract_stack(frame)[::-1] if REPO_MARK in s.filename]
    return " <- ".join(f"{s.name}:{s.lineno}" for s in stack[:4])


def main(argv: list[str]) -> int:
    top = 10
    if argv[:1] == ["--top"]:
        top, argv = int(argv[1]), argv[2:]
    if not argv:
        raise SystemExit(__doc__)
    main_id = threading.get_ident()
    peaks: dict[str, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            frame = sys._current_frames().get(main_id)
            site = _site(frame) if frame is not None else ""
            peaks[site] = max(peaks.get(site, 0), _rss_mib())
            time.sleep(0.1)

    threading.Thread(target=sample, daemon=True).start()
    from phaze.cli import main as phaze_main

    t0 = time.perf_counter()
    rc = phaze_main(argv)
    wall = time.perf_counter() - t0
    done.set()
    print(f"exit {rc}, wall {wall:.1f} s, peak RSS {max(peaks.values(), default=0)} MiB")
    for site, mib in sorted(peaks.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{mib:7d} MiB  {site or '(outside phaze)'}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
