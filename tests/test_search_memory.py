"""The round steps' memory check: the components counted from the space bounds' metadata, the
memory available read from /proc and the cgroup, and a step that would not fit refused with one
line before anything is loaded."""

from __future__ import annotations

import pandas as pd
import pytest

from phaze.errors import PhazeError
from phaze.search.files import BYTES_PER_COMPONENT, available_memory_bytes, check_memory


def _bounds(path, rows):
    pd.DataFrame({"arch": [f"a{i}" for i in range(rows)], "x": range(rows)}).to_parquet(path)
    return {"path": str(path), "model": "m", "microbatch": 1}


def test_components_are_counted_and_a_step_that_fits_passes(tmp_path):
    entries = [_bounds(tmp_path / "a.parquet", 30), _bounds(tmp_path / "b.parquet", 12)]
    assert check_memory(entries, "search round 0", available=42 * BYTES_PER_COMPONENT) == 42


def test_a_step_that_does_not_fit_is_one_line(tmp_path):
    entries = [_bounds(tmp_path / "a.parquet", 30), _bounds(tmp_path / "b.parquet", 12)]
    with pytest.raises(PhazeError) as exc:
        check_memory(entries, "search round 3", available=42 * BYTES_PER_COMPONENT - 1)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("search round 3:") and "42 components" in msg


def test_a_missing_file_is_left_to_the_reader(tmp_path):
    entries = [_bounds(tmp_path / "a.parquet", 5), {"path": str(tmp_path / "gone.parquet")}]
    assert check_memory(entries, "s", available=10**12) == 5


def _fake_system(tmp_path, meminfo_kb, cgroup_lines, files):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    (proc / "self" / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    root = tmp_path / "cg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return proc, root


@pytest.mark.parametrize(
    "cgroup_lines, files, want",
    [
        # cgroup v2: the job's memory.max below MemAvailable
        (["0::/slurm/job1"], {"slurm/job1/memory.max": "4294967296\n"}, 4294967296),
        # cgroup v2 without a limit: MemAvailable
        (["0::/slurm/job1"], {"slurm/job1/memory.max": "max\n"}, 8 * 2**30),
        # cgroup v1 memory controller with a limit
        (
            ["4:memory:/slurm/job2", "0::/"],
            {"memory/slurm/job2/memory.limit_in_bytes": "2147483648\n"},
            2**31,
        ),
        # cgroup v1 "no limit" (2^63 rounded down to a page)
        (
            ["4:memory:/x"],
            {"memory/x/memory.limit_in_bytes": "9223372036854771712\n"},
            8 * 2**30,
        ),
        # a limit above what is available does not raise the figure
        (["0::/big"], {"big/memory.max": str(64 * 2**30)}, 8 * 2**30),
    ],
)
def test_available_memory_is_the_smaller_of_machine_and_cgroup(tmp_path, cgroup_lines, files, want):
    proc, root = _fake_system(tmp_path, 8 * 2**20, cgroup_lines, files)
    assert available_memory_bytes(proc, root) == want


def test_nothing_readable_means_no_check(tmp_path):
    assert available_memory_bytes(tmp_path / "none", tmp_path / "none") is None


def test_plan_refuses_a_space_the_rounds_cannot_hold(tmp_path, monkeypatch, capsys):
    """`phaze search plan` (the first search job) counts architectures x models x microbatches x
    HBM sizes x cluster sizes of the config and stops the run before any job if a round step
    could not hold them."""
    from phaze.cli import main
    from phaze.config import load_config
    from phaze.io import read_table
    from phaze.search import files

    space = tmp_path / "space.parquet"
    assert main(["arch", "--out", str(space)]) == 0
    cfg = load_config(None)
    n = len(read_table(space, "space")) * len(cfg["models"]) * len(cfg["trace"]["microbatch"])
    n *= len(cfg["place"]["hbm_gib"]) * len(cfg["place"]["devices"])
    args = ["search", "plan", "--space", str(space), "--out", str(tmp_path / "plan.parquet")]
    monkeypatch.setattr(files, "available_memory_bytes", lambda: n * BYTES_PER_COMPONENT)
    assert main(args) == 0
    capsys.readouterr()
    monkeypatch.setattr(files, "available_memory_bytes", lambda: n * BYTES_PER_COMPONENT - 1)
    (tmp_path / "plan.parquet").unlink()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{n:,} components" in err, err
    assert not (tmp_path / "plan.parquet").exists()
