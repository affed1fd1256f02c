"""Schedule stage CLI: --instance JSON, the table path (trace + latency + space -> schedule table),
graph contraction of fused and nop ops, and error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from phaze.cli import build_parser, main
from phaze.io.tables import read_table, write_table
from phaze.schedule.instance import make_instance
from phaze.schedule.tables import instance_from_json
from tests.test_schedule import brute_force

DATA = Path(__file__).parent / "data"
TEST_CONFIG = str(Path(__file__).parents[1] / "config" / "test.yaml")


def test_instance_json_matches_brute_force(capsys):
    assert main(["schedule", "--instance", str(DATA / "schedule_instance.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    inst, _ = instance_from_json(json.loads((DATA / "schedule_instance.json").read_text()))
    opt = brute_force(inst.n_tc, inst.n_vc, inst.core, inst.l1, inst.la, inst.edges)
    assert out["makespan_s"] == pytest.approx(opt, rel=1e-6)
    assert out["status"] == "optimal" and out["mip_gap"] == 0.0
    assert {"lower_bound_s", "upper_bound_s", "method", "solve_s", "peak_tc", "peak_vc"} <= set(out)
    sched = {s["id"]: s for s in out["schedule"]}
    assert set(sched) == set(range(7))
    for a, b in json.loads((DATA / "schedule_instance.json").read_text())["edges"]:
        assert sched[b]["start_s"] >= sched[a]["end_s"] - 1e-15
    for s in sched.values():  # an intra-op op holds all cores of its type(s)
        if s["intra_op"] and s["tc_cores"]:
            assert len(s["tc_cores"]) == 2


@pytest.mark.parametrize(
    "obj, msg",
    [
        ({"n_tc": 1, "ops": []}, "lacks 'n_vc'"),
        (
            {"n_tc": 1, "n_vc": 1, "ops": [{"id": 0, "core": "tc", "latency_1core_s": 1}]},
            "latency_allcores_s",
        ),
        (
            {
                "n_tc": 1,
                "n_vc": 1,
                "ops": [{"id": 0, "core": "tc", "latency_1core_s": 1, "latency_allcores_s": 1}],
                "edges": [[0, 0]],
            },
            "self-loop",
        ),
        (
            {
                "n_tc": 1,
                "n_vc": 1,
                "mip_gap": -1,
                "ops": [{"id": 0, "core": "tc", "latency_1core_s": 1, "latency_allcores_s": 1}],
            },
            "mip_gap",
        ),
        (
            {
                "n_tc": 1,
                "n_vc": 1,
                "gap": 0.01,
                "ops": [{"id": 0, "core": "tc", "latency_1core_s": 1, "latency_allcores_s": 1}],
            },
            "'gap' was renamed: write 'mip_gap'",
        ),
    ],
)
def test_instance_json_errors(tmp_path, capsys, obj, msg):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(obj))
    assert main(["schedule", "--instance", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("phaze schedule: error:") and msg in err


def test_deep_tier_takes_the_search_limits_and_needs_them(capsys):
    from phaze.schedule.cli import _options

    args = build_parser().parse_args(["schedule", "--tier", "deep", "--config", TEST_CONFIG])
    opts = _options(args)
    assert (opts.tier, opts.node_limit, opts.time_limit_s) == ("ilp", 2000, 600)
    assert _options(args, {"time_limit_s": 5.0}).time_limit_s == 5.0  # an instance's own limit
    inst = str(DATA / "schedule_instance.json")
    assert main(["schedule", "--instance", inst, "--tier", "deep", "--config", TEST_CONFIG]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "optimal"
    assert main(["schedule", "--instance", inst, "--tier", "deep"]) == 2  # config.yaml: no deep
    assert "search.deepen_node_limit" in capsys.readouterr().err


def test_missing_arguments_are_named(capsys):
    assert main(["schedule", "--trace", "x"]) == 2
    assert "--latency" in capsys.readouterr().err


def _write_trace(d: Path) -> None:
    """One layer, fwd: ln(vc) -> mm_a(fused, carries gelu) and mm_b(tc) in parallel -> nop -> add(vc).
    gelu (op 3) is fused into mm_a (op 1); op 5 is a nop."""
    ops = pd.DataFrame(
        {
            "layer": "block.0",
            "pass": "fwd",
            "op": [0, 1, 2, 3, 4, 5],
            "aten": ["ln", "mm", "mm", "gelu", "add", "empty"],
            "kind": ["vector", "matmul", "matmul", "vector", "vector", "nop"],
            "m": 0,
            "n": 0,
            "k": 0,
            "batch": 1,
            "elements": 0,
            "flops": 0.0,
            "bytes_in": 0,
            "bytes_out": 0,
            "weight_bytes": 0,
            "fused_into": [-1, -1, -1, 1, -1, -1],
            "core": ["vc", "fused", "tc", "vc", "vc", "vc"],
            "collective": "",
            "group_size": 1,
            "signature": "sigA",
            "attention": False,
            "replicated": False,
        }
    )
    edges = pd.DataFrame(
        {
            "layer": "block.0",
            "pass": "fwd",
            "src": [0, 0, 1, 3, 2, 5],
            "dst": [1, 2, 3, 5, 5, 4],
            "bytes": 1,
            "signature": "sigA",
        }
    )
    write_table(ops, d / "ops.parquet", "ops")
    write_table(edges, d / "edges.parquet", "edges")


def test_table_path_end_to_end(tmp_path, capsys, space_table):
    trace = tmp_path / "trace"
    _write_trace(trace)
    space = space_table(["a1", "a2", "a3"], n_tc=[1, 2, 2], n_vc=[1, 1, 1])
    write_table(space, tmp_path / "space.parquet", "space")
    lat_by_op = {
        0: (1e-6, 1e-6),
        1: (4e-6, 2e-6),
        2: (4e-6, 2e-6),
        3: (0.0, 0.0),
        4: (1e-6, 1e-6),
        5: (0.0, 0.0),
    }
    rows = []
    for arch, f in (("a1", 1.0), ("a2", 1.0), ("a3", 2.0)):  # a3: every latency doubled
        for op, (l1, la) in lat_by_op.items():
            rows.append(
                {
                    "arch": arch,
                    "signature": "sigA",
                    "pass": "fwd",
                    "op": op,
                    "core": "vc",
                    "latency_1core_s": l1 * f,
                    "latency_allcores_s": la * f,
                    "bound": "compute",
                }
            )
    write_table(pd.DataFrame(rows), tmp_path / "lat.parquet", "latency")
    out = tmp_path / "sched.parquet"
    rc = main(
        [
            "schedule",
            "--trace",
            str(trace),
            "--latency",
            str(tmp_path / "lat.parquet"),
            "--space",
            str(tmp_path / "space.parquet"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    df = read_table(out, "schedule").set_index("arch")
    assert list(df["n_ops"]) == [4, 4, 4]  # gelu merged into mm_a, nop contracted
    # 1 tc core: ln, both matmuls (1 core each = 4 us, or intra-op 2 us each alone), add
    assert df.loc["a1", "makespan_s"] == pytest.approx(1e-6 + 2e-6 + 2e-6 + 1e-6)
    # 2 tc cores but mm_a is fused and holds the only vector core: same answer
    assert df.loc["a2", "makespan_s"] == pytest.approx(6e-6)
    assert df.loc["a3", "makespan_s"] == pytest.approx(12e-6)
    assert (df["lower_bound_s"] <= df["makespan_s"] * (1 + 1e-12)).all()
    assert set(df["status"]) <= {"optimal", "chain"}
    assert "ILP solves" in capsys.readouterr().err
    # the bounds tier writes the same columns and never a worse lower bound than makespan
    out2 = tmp_path / "bounds.parquet"
    assert (
        main(
            [
                "schedule",
                "--tier",
                "bounds",
                "--trace",
                str(trace),
                "--latency",
                str(tmp_path / "lat.parquet"),
                "--space",
                str(tmp_path / "space.parquet"),
                "--archs",
                "a2",
                "--out",
                str(out2),
            ]
        )
        == 0
    )
    b = read_table(out2, "schedule")
    assert len(b) == 1 and b["makespan_s"].iloc[0] >= df.loc["a2", "makespan_s"] * (1 - 1e-12)


def test_table_path_reports_missing_latency(tmp_path, capsys, space_table):
    trace = tmp_path / "trace"
    _write_trace(trace)
    space = space_table(["a1"], n_tc=[1], n_vc=[1], area_mm2=1.0)
    write_table(space, tmp_path / "space.parquet", "space")
    lat = pd.DataFrame(
        {
            "arch": "a1",
            "signature": "sigA",
            "pass": "fwd",
            "op": [0, 1],
            "core": "vc",
            "latency_1core_s": 1e-6,
            "latency_allcores_s": 1e-6,
            "bound": "compute",
        }
    )
    write_table(lat, tmp_path / "lat.parquet", "latency")
    rc = main(
        [
            "schedule",
            "--trace",
            str(trace),
            "--latency",
            str(tmp_path / "lat.parquet"),
            "--space",
            str(tmp_path / "space.parquet"),
            "--out",
            str(tmp_path / "o.parquet"),
        ]
    )
    assert rc == 2
    assert "lacks ops" in capsys.readouterr().err


def test_make_instance_orders_topologically():
    ops = [
        {"id": i, "core": "vc", "latency_1core_s": 1.0, "latency_allcores_s": 1.0}
        for i in (7, 3, 5)
    ]
    inst = make_instance(1, 1, ops, [(7, 3), (5, 7)])
    assert inst.ids == (5, 7, 3)
    assert all(a < b for a, b in inst.edges)
