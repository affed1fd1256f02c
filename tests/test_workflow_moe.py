"""End-to-end: a mixture-of-experts model through the whole workflow (trace at every expert-
parallel size, estimate, schedule, the space bound, the global search with its placements, the
baselines, the summary), on a tiny Mixtral-layout config.json and a two-architecture grid."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, copy_checkout, snakemake):
    work = copy_checkout(tmp_path_factory.mktemp("moe") / "repo")
    (work / "models" / "tiny-mixtral").mkdir(parents=True)
    (work / "models" / "tiny-mixtral" / "config.json").write_text(
        (DATA / "tiny-mixtral" / "config.json").read_text()
    )
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    cfg["models"] = ["models/tiny-mixtral/config.json"]
    # tp 2: the all-to-alls run on ranks two apart, and MoE with tp > 1 needs sequence
    # parallelism (the tp 1 trace is the placement-blind baseline's)
    # and whole experts (etp 1) beside experts split over tp
    cfg["trace"] = {"microbatch": [1], "tp": [2], "ep": [1, 2, 3], "etp": ["tp", 1]}
    # one grid point beside the two TPU v4 presets (tpuv4 itself lies above the area budget: a
    # baseline, not an answer)
    cfg["arch"] = {**cfg["arch"], "n_vc": [1], "tc_depth": [128]}
    cfg["place"] = {
        **cfg["place"],
        "devices": [64],
        "global_batch": 64,
        # Megatron's Mixtral recipe's shape (pp, ep) at this size
        "expert": {"tiny-mixtral": {"pp": 2, "dp": 16, "tp": 2, "ep": 2}},
    }
    # small solver limits: the schedules only have to be valid, not tight, for these checks (the
    # clock too: the branch and bound of a MoE block's backward runs to time_limit_s)
    cfg["schedule"] = {
        **cfg["schedule"],
        "node_limit": 20,
        "bnb_node_limit": 500,
        "time_limit_s": 3,
    }
    cfg["search"] = {**cfg["search"], "deepen_node_limit": 0}
    (work / "moe.yaml").write_text(yaml.safe_dump(cfg))
    run = snakemake(work, "--cores", "2", "--configfile", "moe.yaml", timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return work


def test_every_expert_parallel_size_is_traced_and_searched(moe_run):
    """ep 3 does not divide the 4 experts: traced are ep 1 and 2, each with the experts split
    over tp and whole (etp 1), in their own shards (and tp 1 for the placement-blind baseline);
    every placement table carries ep and etp, and the search chose among them, with sequence
    parallelism (tp 2)."""
    traces = sorted(p.name for p in (moe_run / "results" / "trace" / "tiny-mixtral").iterdir())
    assert traces == [
        "b1_s64_tp1",
        "b1_s64_tp2",
        "b1_s64_tp2_ep2",
        "b1_s64_tp2_ep2_etp1",
        "b1_s64_tp2_etp1",
    ]
    whole = pd.read_parquet(
        moe_run / "results/trace/tiny-mixtral/b1_s64_tp2_ep2_etp1/layers.parquet"
    )
    whole = whole[whole["kind"] == "block"].iloc[0]
    layers = pd.read_parquet(moe_run / "results/trace/tiny-mixtral/b1_s64_tp2_ep2/layers.parquet")
    block = layers[layers["kind"] == "block"].iloc[0]
    assert block["ep"] == 2 and block["experts"] == 4
    assert bool(whole["etp1"]) and not bool(block["etp1"])
    assert whole["expert_param_bytes"] == 2 * block["expert_param_bytes"]  # whole, not halves
    # the schedules hold the all-to-alls, priced on the flat link (group of 2)
    lat = pd.read_parquet(
        next((moe_run / "results/estimate/tiny-mixtral/b1_s64_tp2_ep2").glob("r0_c*.parquet"))
    )
    ops = pd.read_parquet(moe_run / "results/trace/tiny-mixtral/b1_s64_tp2_ep2/ops.parquet")
    a2a = ops[ops["collective"] == "all_to_all"][["signature", "pass", "op"]]
    priced = lat.merge(a2a, on=["signature", "pass", "op"])
    assert len(priced) and (priced["latency_allcores_s"] > 0).all()
    place = pd.concat(
        pd.read_parquet(p) for p in (moe_run / "results" / "place").rglob("r0_ilp.parquet")
    )
    feasible = place[place["feasible"]]
    assert len(feasible) and set(feasible["ep"]) <= {1, 2} and set(feasible["etp"]) <= {1, 2}
    width = feasible["dp"] * feasible["tp"].where(feasible["etp"] == 1, 1)
    assert (width % feasible["ep"] == 0).all() and feasible["sequence_parallel"].all()
    expert = place[place["expert_feasible"]]
    assert len(expert) and (expert["expert_ep"] == 2).all() and (expert["expert_pp"] == 2).all()


def test_the_summary_answers_the_moe_model(moe_run):
    best = pd.read_parquet(moe_run / "results" / "summary" / "best.parquet")
    mine = best[best["model"] == "tiny-mixtral"]
    assert len(mine) and (mine["throughput_seq_s"] > 0).all()
    assert set(mine["ep"]) <= {1, 2} and set(mine["etp"]) <= {1, 2}
    # certified over the whole space (the small solver limits may leave it above search.gap)
    assert (mine["certified_gap"] >= 0).all() and mine["certified_gap"].notna().all()
    comparison = pd.read_parquet(moe_run / "results" / "summary" / "comparison.parquet")
    assert {"phaze-per-model", "tpuv4-expert"} <= set(comparison["strategy"])
