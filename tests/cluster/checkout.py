"""A throwaway copy of the checkout, for workflow runs that must not touch its results/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_checkout(dst: Path) -> Path:
    """Copy the checkout's files (tracked and untracked-but-not-ignored, as in the working tree)
    to dst, so a run there neither reads nor writes the checkout's results/."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode == 0:
        for rel in filter(None, listed.stdout.split("\0")):
            src = REPO / rel
            if src.is_file():  # deleted-but-tracked files are skipped
                (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst / rel)
    else:  # not a git checkout (e.g. an unpacked release)
        shutil.copytree(
            REPO,
            dst,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "results", ".snakemake", "__pycache__", "*.egg-info", ".*_cache"
            ),
        )
    assert (dst / "Snakefile").is_file(), f"copy of {REPO} in {dst} has no Snakefile"
    return dst
