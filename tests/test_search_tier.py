"""`phaze search tier` end to end on a small trace (opt-350m, t = 1, config/test.yaml's space):
one ub and one lo row per architecture and cluster size, the achieved throughput never above
the bound, both inside today's bound tier's interval from the other side (an achieved value is
below every valid bound, a bound above every achieved value), and bad input refused in one
line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phaze.cli import main
from phaze.io import read_table

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "config" / "test.yaml")


@pytest.fixture(scope="module")
def tier(tmp_path_factory, trace_cli):
    d = tmp_path_factory.mktemp("tier")
    trace = trace_cli(d / "trace", "opt-350m", microbatch=1, tp=1, seq=128)
    assert main(["arch", "--config", CONFIG, "--out", str(d / "space.parquet")]) == 0
    common = ["--model", "opt-350m", "--microbatch", "1", "--tp", "1"]
    common += ["--trace-dirs", str(trace), "--space", str(d / "space.parquet"), "--config", CONFIG]
    argv = ["search", "tier", *common, "--ub", str(d / "ub.parquet"), "--lo", str(d / "lo.parquet")]
    assert main([*argv, "--layers", str(d / "layers.parquet")]) == 0
    return d, trace, common


def test_one_row_per_architecture_and_the_achieved_below_the_bound(tier):
    d, _, _ = tier
    space = read_table(d / "space.parquet", "space")
    ub = read_table(d / "ub.parquet", "place").set_index("arch")
    lo = read_table(d / "lo.parquet", "place").set_index("arch")
    assert sorted(ub.index) == sorted(space["arch"]) == sorted(lo.index)
    both = ub["feasible"] & lo["feasible"]
    assert both.any()
    assert (lo.loc[both, "throughput_seq_s"] <= ub.loc[both, "throughput_seq_s"] * (1 + 1e-9)).all()
    assert (lo.loc[both, "pp"] >= 1).all() and (lo.loc[both, "stages"] != "[]").all()
    layers = read_table(d / "layers.parquet")
    assert (layers["lower_bound_s"] <= layers["makespan_s"] * (1 + 1e-12)).all()


def test_inside_the_bound_tiers_interval_from_the_other_side(tier, tmp_path):
    """Mutation check (tried, fails here): the achieved placement's time scaled by 0.9 puts the
    array tier's achieved throughput above the bound tier's bound."""
    d, trace, _ = tier
    ids = ",".join(read_table(d / "space.parquet", "space")["arch"])
    lat, sched = tmp_path / "lat.parquet", tmp_path / "sched.parquet"
    base = ["--config", CONFIG, "--trace", str(trace), "--space", str(d / "space.parquet")]
    assert main(["estimate", *base, "--archs", ids, "--out", str(lat)]) == 0
    assert (
        main(
            ["schedule", "--tier", "bounds", *base, "--latency", str(lat), "--archs", ids]
            + ["--out", str(sched), "--solutions", str(tmp_path / "sol.parquet")]
        )
        == 0
    )
    got, tables = {}, {}
    for name, column in (("ub", "lower_bound_s"), ("lo", "makespan_s")):
        out = tmp_path / f"{name}.parquet"
        argv = ["place", "--model", "opt-350m", "--tp", "1", "--trace-dirs", str(trace)]
        argv += ["--schedules", str(sched), "--latencies", str(lat), "--microbatch", "1"]
        argv += ["--space", str(d / "space.parquet"), "--hbm-gib", "32", "--config", CONFIG]
        assert main([*argv, "--latency-column", column, "--out", str(out)]) == 0
        tables[name] = read_table(out, "place").set_index("arch")
        got[name] = tables[name]["throughput_seq_s"]
    ub = read_table(d / "ub.parquet", "place").set_index("arch")["throughput_seq_s"]
    array_lo = read_table(d / "lo.parquet", "place").set_index("arch")
    lo = array_lo["throughput_seq_s"]
    ok = np.isfinite(got["ub"]) & np.isfinite(lo.reindex(got["ub"].index))
    assert ok.any()
    idx = got["ub"].index[ok]
    assert (lo[idx] <= got["ub"][idx] * (1 + 1e-9)).all()
    assert (got["lo"][idx] <= ub[idx] * (1 + 1e-9)).all()
    # MFU is model FLOPs over devices x time x peak: for the same architecture and global batch
    # it is proportional to throughput, so its ratio to throughput is the place stage's
    # (mutation check, tried: MFU left NaN fails here)
    ratio = array_lo.loc[idx, "mfu"] / lo[idx]
    expected = tables["lo"].loc[idx, "mfu"] / got["lo"][idx]
    assert np.isfinite(ratio).all()
    np.testing.assert_allclose(ratio.to_numpy(), expected.to_numpy(), rtol=1e-9)


def test_bad_input_is_one_line(tier, tmp_path, phaze_cli):
    _, _, common = tier
    out = phaze_cli(
        "search", "tier", *common, "--ub", "a.parquet", "b.parquet", "--lo", "c.parquet"
    )
    assert out.returncode == 2 and "one table per HBM size" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = phaze_cli(
        "search",
        "tier",
        *common,
        "--archs",
        "nosuch",
        "--ub",
        str(tmp_path / "u.parquet"),
        "--lo",
        str(tmp_path / "l.parquet"),
    )
    assert out.returncode == 2 and "nosuch" in out.stderr
