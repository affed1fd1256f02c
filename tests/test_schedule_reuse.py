"""Solutions reused across runs (config ``schedule.reuse``, phaze/schedule/reuse.py): a job given an
earlier run's results takes the solutions of instances equal to ones solved there and solves the
rest, and every row stays a valid schedule with a proven bound (checked against brute force)."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest
import yaml

from phaze.cli import main
from phaze.io.tables import read_table, write_table
from phaze.schedule.reuse import read_solutions
from phaze.schedule.tables import build_instance, load_op_graphs, op_latencies
from phaze.workflow.provenance import config_section
from tests.test_schedule import brute_force

# Two layer graphs. sigA: 0 -> {1, 2, 3} -> 4, 1 -> 5, {4, 5} -> 6 (mixed cores: the solver
# has choices). sigB: 0 -> {1, 2} -> 3 -> {4, 5} (3 is an articulation op, like a collective).
GRAPHS = {
    "sigA": (
        ["vc", "tc", "tc", "vc", "tc", "vc", "vc"],
        [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4), (1, 5), (4, 6), (5, 6)],
    ),
    "sigB": (
        ["vc", "tc", "tc", "vc", "tc", "tc"],
        [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5)],
    ),
}
ARCHS = {"a1": (1, 1), "a2": (2, 1), "a3": (2, 2)}
MODEL, TAG = "m", "b1_s8_tp1"


def _write_trace(d: Path) -> None:
    ops, edges = [], []
    for sig, (cores, es) in GRAPHS.items():
        for i, c in enumerate(cores):
            ops.append({"layer": f"block.{sig}", "signature": sig, "op": i, "core": c})
        for a, b in es:
            edges.append({"layer": f"block.{sig}", "signature": sig, "src": a, "dst": b})
    ops = pd.DataFrame(ops).assign(
        **{
            "pass": "fwd",
            "aten": "mm",
            "kind": "matmul",
            "m": 0,
            "n": 0,
            "k": 0,
            "batch": 1,
            "elements": 0,
            "flops": 0.0,
            "bytes_in": 0,
            "bytes_out": 0,
            "weight_bytes": 0,
            "fused_into": -1,
            "collective": "",
            "group_size": 1,
            "attention": False,
            "replicated": False,
        }
    )
    edges = pd.DataFrame(edges).assign(**{"pass": "fwd", "bytes": 1})
    write_table(ops, d / "ops.parquet", "ops")
    write_table(edges, d / "edges.parquet", "edges")


def _latencies(seed: int, scale: dict | None = None) -> pd.DataFrame:
    """Random latencies (1-core and all-core) per arch and op; ``scale`` {(arch, sig, op): f}
    multiplies one op's on one arch."""
    rnd = random.Random(seed)
    rows = []
    for arch, (n_tc, n_vc) in ARCHS.items():
        for sig, (cores, _) in GRAPHS.items():
            for i, c in enumerate(cores):
                f = (scale or {}).get((arch, sig, i), 1.0)
                l1 = rnd.uniform(1, 9) * 1e-6
                k = n_tc if c == "tc" else n_vc
                la = l1 / k * rnd.uniform(1.0, 1.6)
                rows.append(
                    {
                        "arch": arch,
                        "signature": sig,
                        "pass": "fwd",
                        "op": i,
                        "core": c,
                        "latency_1core_s": l1 * f,
                        "latency_allcores_s": la * f,
                        "bound": "compute",
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture
def run_root(tmp_path, space_table):
    """A results root with the trace and the space; returns a function that runs one schedule
    job there (its latencies, tier, config) and gives (table, log line)."""
    space = space_table(
        list(ARCHS), n_tc=[v[0] for v in ARCHS.values()], n_vc=[v[1] for v in ARCHS.values()]
    )

    def run(root: Path, lat: pd.DataFrame, capsys, tier="ilp", schedule_cfg=None, rc=0):
        trace = root / "trace" / MODEL / TAG
        if not (trace / "ops.parquet").exists():
            _write_trace(trace)
            write_table(space, root / "arch" / "space.parquet", "space")
        est = root / "estimate" / MODEL / TAG / "r0_c0.parquet"
        write_table(lat, est, "latency")
        cfg = root / "config.yaml"
        cfg.write_text(yaml.safe_dump({"schedule": schedule_cfg or {}}))
        out = root / "schedule" / MODEL / TAG / tier / "r0_c0.parquet"
        got = main(
            [
                "schedule",
                "--tier",
                tier,
                "--trace",
                str(trace),
                "--latency",
                str(est),
                "--space",
                str(root / "arch" / "space.parquet"),
                "--config",
                str(cfg),
                "--out",
                str(out),
                "--solutions",
                str(out.with_name("r0_c0.solutions.parquet")),
            ]
        )
        err = capsys.readouterr().err
        assert got == rc, err
        if rc:
            return None, err
        return read_table(out, "schedule"), err

    return run


_KEY = ["arch", "signature", "pass"]
_SAME = ["makespan_s", "lower_bound_s", "upper_bound_s", "status", "peak_tc", "peak_vc"]


def _brute(root: Path, lat: pd.DataFrame) -> dict:
    graphs = load_op_graphs(root / "trace" / MODEL / TAG)
    lookup = op_latencies(lat)
    out = {}
    for arch, (n_tc, n_vc) in ARCHS.items():
        for g in graphs:
            inst = build_instance(g, lookup[(arch, g.signature, g.pass_)], n_tc, n_vc, "t")
            out[(arch, g.signature)] = brute_force(
                inst.n_tc, inst.n_vc, inst.core, inst.l1, inst.la, inst.edges
            )
    return out


def _check_valid(df: pd.DataFrame, opt: dict) -> None:
    """Every row a schedule no shorter than the optimum and a bound no longer."""
    for r in df.itertuples():
        best = opt[(r.arch, r.signature)]
        assert r.makespan_s >= best * (1 - 1e-9), (r.arch, r.signature)
        assert r.lower_bound_s <= best * (1 + 1e-9), (r.arch, r.signature)


@pytest.mark.parametrize("seed", [1, 2])
def test_an_unchanged_run_is_taken_whole(tmp_path, run_root, capsys, seed):
    lat = _latencies(seed)
    base, _ = run_root(tmp_path / "base", lat, capsys)
    sol = read_solutions(
        tmp_path / "base" / "schedule" / MODEL / TAG / "ilp" / "r0_c0.solutions.parquet"
    )
    assert len(sol) >= len(base) and sol["key"].is_unique
    again, err = run_root(
        tmp_path / "again", lat, capsys, schedule_cfg={"reuse": [str(tmp_path / "base")]}
    )
    assert f"reused {len(base)} instances" in err
    pd.testing.assert_frame_equal(
        base.sort_values(_KEY)[_KEY + _SAME].reset_index(drop=True),
        again.sort_values(_KEY)[_KEY + _SAME].reset_index(drop=True),
    )
    assert again["cache_hit"].all()
    _check_valid(again, _brute(tmp_path / "again", lat))


def test_a_changed_layer_is_solved_again_and_the_rest_reused(tmp_path, run_root, capsys):
    lat = _latencies(3)
    base, _ = run_root(tmp_path / "base", lat, capsys)
    # every op but one of one layer of one arch faster: the old solution's lower bound would
    # be above the new optimum, so taking it would be caught below (scaling a whole layer is a
    # hit: instances equal up to scale share a solution)
    changed = _latencies(3, scale={("a2", "sigA", i): 0.3 for i in range(1, 7)})
    over, err = run_root(
        tmp_path / "over", changed, capsys, schedule_cfg={"reuse": [str(tmp_path / "base")]}
    )
    assert f"reused {len(base) - 1} instances" in err
    _check_valid(over, _brute(tmp_path / "over", changed))
    moved = (over["arch"] == "a2") & (over["signature"] == "sigA")
    assert not over.loc[moved, "cache_hit"].any()
    b = base.set_index(["arch", "signature"])
    o = over.set_index(["arch", "signature"])
    assert o.loc[("a2", "sigA"), "makespan_s"] < b.loc[("a2", "sigA"), "makespan_s"]
    kept = o.drop(index=("a2", "sigA"))
    pd.testing.assert_frame_equal(kept[_SAME], b.loc[kept.index, _SAME])


@pytest.mark.parametrize(
    "base_tier, base_cfg, tier, cfg",
    [
        ("bounds", {}, "ilp", {}),  # the bounds tier's answers are not the ILP's
        ("ilp", {}, "bounds", {}),
        ("ilp", {"mip_gap": 0.2}, "ilp", {}),  # other solver limits
        ("ilp", {"node_limit": 7}, "ilp", {}),
    ],
)
def test_solutions_of_another_context_are_not_taken(
    tmp_path, run_root, capsys, base_tier, base_cfg, tier, cfg
):
    lat = _latencies(4)
    run_root(tmp_path / "base", lat, capsys, tier=base_tier, schedule_cfg=base_cfg)
    _, err = run_root(
        tmp_path / "over",
        lat,
        capsys,
        tier=tier,
        schedule_cfg={**cfg, "reuse": [str(tmp_path / "base")]},
    )
    assert "reused 0 instances (+0 segments) of 0 earlier solutions" in err


def test_reuse_of_a_missing_or_own_directory_is_one_line(tmp_path, run_root, capsys):
    lat = _latencies(5)
    _, err = run_root(
        tmp_path / "a", lat, capsys, schedule_cfg={"reuse": [str(tmp_path / "nope")]}, rc=2
    )
    assert "schedule.reuse" in err and "not a directory" in err and len(err.splitlines()) == 1
    _, err = run_root(
        tmp_path / "b", lat, capsys, schedule_cfg={"reuse": [str(tmp_path / "b")]}, rc=2
    )
    assert "own output" in err and len(err.splitlines()) == 1


def test_reuse_is_no_rerun_trigger_but_the_rest_of_schedule_is():
    a = {"schedule": {"reuse": [], "mip_gap": 0.01}, "place": {"x": 1}}
    b = {"schedule": {"reuse": ["/elsewhere"], "mip_gap": 0.01}, "place": {"x": 1}}
    c = {"schedule": {"reuse": [], "mip_gap": 0.02}, "place": {"x": 1}}
    assert config_section(a, "schedule") == config_section(b, "schedule")
    assert config_section(a, "schedule") != config_section(c, "schedule")
    assert "reuse" not in config_section(b, "schedule")
