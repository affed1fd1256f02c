"""Fixtures shared between test files.

* ``copy_checkout(dst, results_from=None)`` — a throwaway copy of the checkout for workflow runs
  that must not touch its results/ (or, with ``results_from``, a copy of an earlier copy with its
  results and Snakemake metadata);
* ``snakemake_env`` — the environment a test's `snakemake` runs in (no PYTHONPATH from outside:
  the Snakefile puts its own checkout first); ``snakemake(workdir, *args, timeout=300)`` runs it
  there and returns the CompletedProcess (output captured, exit code not checked);
* ``trace_cli(out, model, ...)`` — `phaze trace` through the CLI, asserting exit code 0;
* ``space_table(archs, **columns)`` — an architecture space table (TPUv4-like columns unless
  overridden) as `phaze arch` writes it.

The suite runs on two workers (pytest-xdist, one test file per worker at a time: module fixtures
stay in one process). The files holding end-to-end runs (marked ``cluster`` or ``slow``) are
collected first, so the workers start on them and the many short files fill in around them
instead of one long run starting last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
LONG_MARKS = ("cluster", "slow")


def pytest_collection_modifyitems(session, config, items):
    """Files with end-to-end runs first (cluster, then slow), every file's tests kept together
    and in their order; the sort is stable, so the rest keep the collection order."""

    by_module: dict = {}
    for item in items:
        by_module.setdefault(item.module, []).append(item)

    def rank(mod) -> int:
        marks = {m.name for item in by_module[mod] for m in item.iter_markers()}
        return next((i for i, m in enumerate(LONG_MARKS) if m in marks), len(LONG_MARKS))

    order = sorted(by_module, key=rank)
    items[:] = [item for mod in order for item in by_module[mod]]


def _copy_checkout(dst: Path, results_from: Path | None = None) -> Path:
    if results_from is not None:
        # the earlier copy's code AND its results/.snakemake: the code must be the one that made
        # the results, even while the repository is being edited; copy2 keeps mtimes, so
        # Snakemake sees the same state
        shutil.copytree(
            results_from,
            dst,
            ignore=shutil.ignore_patterns("locks", "__pycache__", "*.pyc"),
            dirs_exist_ok=True,
        )
        return dst
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode == 0:  # tracked and untracked-but-not-ignored, as in the working tree
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


@pytest.fixture(scope="session")
def copy_checkout():
    return _copy_checkout


@pytest.fixture(scope="session")
def snakemake_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="session")
def snakemake(snakemake_env):
    def run(workdir, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [SNAKEMAKE, *args],
            cwd=workdir,
            capture_output=True,
            text=True,
            env=snakemake_env,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture(scope="session")
def phaze_cli():
    """`python -m phaze ARGS` in a fresh interpreter (what a user's shell runs: exit code, stdout
    and stderr as they would see them)."""

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "phaze", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture(scope="session")
def trace_cli():
    from phaze.cli import main

    def run(out, model, microbatch=1, tp=1, seq=None, config=None) -> Path:
        argv = ["trace", "--model", model, "--microbatch", str(microbatch), "--tp", str(tp)]
        if seq is not None:
            argv += ["--seq", str(seq)]
        if config is not None:
            argv += ["--config", str(config)]
        assert main([*argv, "--out", str(out)]) == 0
        return Path(out)

    return run


_ARCH_COLUMNS = {
    "n_tc": 8,
    "n_vc": 2,
    "tc_width": 128,
    "tc_depth": 128,
    "vc_width": 128,
    "glb_bytes": 2**27,
    "freq_hz": 1e9,
    "area_mm2": 100.0,
    "peak_flops": 1e14,
}


@pytest.fixture(scope="session")
def space_table():
    def make(archs, **columns) -> pd.DataFrame:
        return pd.DataFrame({"arch": list(archs), **_ARCH_COLUMNS, **columns})

    return make
