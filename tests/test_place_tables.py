"""Tables mode (the workflow's): layers + schedules + space -> one row per arch x cluster size,
under the upstream model (Phaze's objective, the first part) and the megatron model (the step
model of docs/step.md, the second part)."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from phaze.cli import main
from phaze.io import read_table, write_table
from phaze.place.objective_upstream import expert_stages
from phaze.place.upstream import load_instance, solve_instance

BLOCKS = 6
PEAK = {"fast": 4e14, "slow": 1e14}


def layers_frame(t):
    rows = [
        {
            "layer": "embedding",
            "kind": "embedding",
            "signature": "emb",
            "param_bytes": int(2e8),
            "activation_bytes": int(1e7),
            "stash_recompute_bytes": 4096,
            "boundary_bytes": int(1e7),
            "fwd_flops": 1e9,
            "bwd_flops": 2e9,
            "fwd_matmul_flops": 0.0,
            "attention_activation_bytes": 0,
            "replicated_activation_bytes": int(1e7) if t > 1 else 0,
            "tied_param_bytes": 0,
        }
    ]
    for b in range(BLOCKS):
        rows.append(
            {
                "layer": f"block.{b}",
                "kind": "block",
                "signature": f"blk{t}",
                "param_bytes": int(1.2e9 / t),
                "activation_bytes": int(5e8 / t),
                "stash_recompute_bytes": int(1e7),
                "boundary_bytes": int(1e7),
                "fwd_flops": 2e12 / t,
                "bwd_flops": 4e12 / t,
                "fwd_matmul_flops": 1.9e12 / t,
                "attention_activation_bytes": int(2e8 / t),
                "replicated_activation_bytes": int(1e8) if t > 1 else 0,
                "tied_param_bytes": 0,
            }
        )
    rows.append(
        {
            "layer": "head",
            "kind": "head",
            "signature": "head",
            "param_bytes": int(2e8),
            "activation_bytes": int(5e7),
            "stash_recompute_bytes": int(1e7),
            "boundary_bytes": 0,
            "fwd_flops": 4e11,
            "bwd_flops": 8e11,
            "fwd_matmul_flops": 3.9e11,
            "attention_activation_bytes": 0,
            "replicated_activation_bytes": int(1e7) if t > 1 else 0,
            "tied_param_bytes": 0,
        }
    )
    df = pd.DataFrame(rows)
    # as the trace has it: blocks, and the vocab-parallel embedding and head, split over t
    df["tensor_parallel"] = t > 1
    df.loc[df["kind"] != "block", "fwd_matmul_flops"] /= t
    df["index"] = np.arange(len(df))
    return df


def schedule_frame(t, archs=("fast", "slow"), drop=None):
    rows = []
    lay = layers_frame(t).drop_duplicates("signature")
    for arch in archs:
        for _, r in lay.iterrows():
            for p, col in (("fwd", "fwd_flops"), ("bwd", "bwd_flops")):
                if drop == (arch, r["signature"], p):
                    continue
                lat = r[col] / (0.5 * PEAK[arch]) + 1e-5
                rows.append(
                    dict(
                        arch=arch,
                        signature=r["signature"],
                        **{"pass": p},
                        makespan_s=lat,
                        lower_bound_s=0.8 * lat,
                        mip_gap=0.2,
                        status="ok",
                        solve_s=0.0,
                        peak_tc=1,
                        peak_vc=1,
                        upper_bound_s=lat,
                        method="chain",
                    )
                )
    return pd.DataFrame(rows)


@pytest.fixture
def inputs(tmp_path, space_table):
    args = {"trace": [], "sched": []}
    for t in (1, 2):
        d = tmp_path / f"trace_t{t}"
        write_table(layers_frame(t), d / "layers.parquet", "layers")
        write_table(schedule_frame(t), tmp_path / f"sched_t{t}.parquet", "schedule")
        args["trace"].append(str(d))
        args["sched"].append(str(tmp_path / f"sched_t{t}.parquet"))
    space = space_table(["fast", "slow"], peak_flops=[PEAK["fast"], PEAK["slow"]], preset="")
    write_table(space, tmp_path / "space.parquet", "space")
    cfg = {
        "models": ["tiny"],
        "place": {
            "model": "upstream",
            "recompute": ["full"],
            "devices": [64, 16],
            "global_batch": 256,
            "expert": {"tiny": {"pp": 2, "dp": 16, "tp": 2}},
        },
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path, args


def run_place(tmp_path, args, *extra, hbm="32", out="place.parquet", config="cfg.yaml"):
    argv = [
        "place",
        "--model",
        "tiny",
        "--tp",
        "1",
        "2",
        "--trace-dirs",
        *args["trace"],
        "--schedules",
        *args["sched"],
        "--space",
        str(tmp_path / "space.parquet"),
        "--hbm-gib",
        hbm,
        "--microbatch",
        "2",
        "--config",
        str(tmp_path / config),
        "--out",
        str(tmp_path / out),
        *extra,
    ]
    return main(argv)


def test_rows_per_arch_and_cluster_size(inputs):
    tmp_path, args = inputs
    assert run_place(tmp_path, args) == 0
    df = read_table(tmp_path / "place.parquet", "place")
    assert sorted(zip(df["arch"], df["devices"])) == [
        ("fast", 16),
        ("fast", 64),
        ("slow", 16),
        ("slow", 64),
    ]
    assert df["feasible"].all()
    for _, r in df.iterrows():
        assert r["throughput_seq_s"] == pytest.approx(256 / r["time_per_batch_s"])
        # time = largest load x (microbatches per pipeline + stages - 1) + all-reduce
        steps = -(-128 // r["dp"]) + r["pp"] - 1
        assert r["time_per_batch_s"] == pytest.approx(
            r["max_stage_load_s"] * steps + r["allreduce_s"]
        )
        assert (r["allreduce_s"] == 0) == (r["dp"] == 1)
        assert r["pp"] * r["dp"] <= r["devices"] and r["devices_used"] <= r["devices"]
        stages = json.loads(r["stages"])
        assert stages[0]["first"] == "embedding" and stages[-1]["last"] == "head"
        assert sum(s["layers"] for s in stages) == BLOCKS + 2 and len(stages) == r["pp"]
        assert max(json.loads(r["stage_mem_bytes"])) <= 32 * 2**30
        flops_seq = 3 * layers_frame(1)["fwd_matmul_flops"].sum() / 2  # PaLM's 3 passes
        assert r["mfu"] == pytest.approx(
            flops_seq * 256 / (r["time_per_batch_s"] * r["devices"] * PEAK[r["arch"]])
        )
        if r["expert_feasible"]:
            # the expert placement is one of the candidates the DP searched
            assert r["time_per_batch_s"] <= r["expert_time_per_batch_s"] * (1 + 1e-12)
    big = df[df["devices"] == 64].set_index("arch")
    assert big.loc["fast", "throughput_seq_s"] > big.loc["slow", "throughput_seq_s"]
    assert (
        big["expert_feasible"].all()
        and (big["expert_pp"] == 2).all()
        and (big["expert_tp"] == 2).all()
    )
    small = df[df["devices"] == 16]
    assert not small["expert_feasible"].any()
    assert small["expert_reason"].str.contains("64 devices").all()
    assert small["expert_throughput_seq_s"].isna().all()


def test_expert_infeasible_memory_never_discards_the_architecture(inputs, tmp_path):
    tmp_path, args = inputs
    cfg = {
        "models": ["tiny"],
        "place": {
            "model": "upstream",
            "recompute": ["full"],
            "devices": [64],
            "global_batch": 256,
            "expert": {"tiny": {"pp": 1, "dp": 64, "tp": 1}},
        },
    }
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(cfg))
    assert run_place(tmp_path, args, hbm="8", config="one.yaml") == 0
    df = read_table(tmp_path / "place.parquet", "place")
    assert df["feasible"].all() and (df["pp"] > 1).all()
    assert not df["expert_feasible"].any()
    assert df["expert_reason"].str.contains("GiB").all()


def test_nothing_fits_is_a_row_with_a_reason(inputs):
    tmp_path, args = inputs
    assert run_place(tmp_path, args, hbm="0.05") == 0
    df = read_table(tmp_path / "place.parquet", "place")
    assert len(df) == 4 and not df["feasible"].any()
    assert df["reason"].str.contains("no placement fits").all()
    assert df["throughput_seq_s"].isna().all() and (df["pp"] == 0).all()


def test_lower_bound_latencies_give_a_throughput_upper_bound(inputs):
    tmp_path, args = inputs
    assert run_place(tmp_path, args) == 0
    assert run_place(tmp_path, args, "--latency-column", "lower_bound_s", out="ub.parquet") == 0
    a = read_table(tmp_path / "place.parquet").sort_values(["arch", "devices"])
    b = read_table(tmp_path / "ub.parquet").sort_values(["arch", "devices"])
    assert (b["throughput_seq_s"].to_numpy() >= a["throughput_seq_s"].to_numpy()).all()


def test_inconsistent_inputs_are_errors(inputs, capsys):
    tmp_path, args = inputs
    write_table(schedule_frame(2, archs=("fast",)), tmp_path / "odd.parquet", "schedule")
    bad = dict(args, sched=[args["sched"][0], str(tmp_path / "odd.parquet")])
    assert run_place(tmp_path, bad) == 2
    assert "different architectures" in capsys.readouterr().err
    write_table(
        schedule_frame(2, drop=("slow", "blk2", "bwd")), tmp_path / "hole.parquet", "schedule"
    )
    bad = dict(args, sched=[args["sched"][0], str(tmp_path / "hole.parquet")])
    assert run_place(tmp_path, bad) == 2
    assert "no schedule for arch slow signature blk2 pass bwd" in capsys.readouterr().err
    assert main(["place", "--model", "tiny"]) == 2
    assert "--tp" in capsys.readouterr().err


def test_comma_joined_schedule_chunks(inputs):
    tmp_path, args = inputs
    joined = []
    for t, path in zip((1, 2), args["sched"]):
        df = read_table(path)
        for arch in ("fast", "slow"):
            write_table(df[df["arch"] == arch], tmp_path / f"c_{t}_{arch}.parquet", "schedule")
        joined.append(f"{tmp_path}/c_{t}_fast.parquet,{tmp_path}/c_{t}_slow.parquet")
    assert run_place(tmp_path, dict(args, sched=joined), out="joined.parquet") == 0
    assert run_place(tmp_path, args) == 0
    a = read_table(tmp_path / "joined.parquet").sort_values(["arch", "devices"])
    b = read_table(tmp_path / "place.parquet").sort_values(["arch", "devices"])
    assert np.allclose(a["time_per_batch_s"], b["time_per_batch_s"])


def test_export_instance_round_trip(inputs):
    tmp_path, args = inputs
    path = tmp_path / "inst.json"
    argv = [
        "place",
        "--model",
        "tiny",
        "--tp",
        "1",
        "2",
        "--trace-dirs",
        *args["trace"],
        "--schedules",
        *args["sched"],
        "--space",
        str(tmp_path / "space.parquet"),
        "--hbm-gib",
        "32",
        "--microbatch",
        "2",
        "--archs",
        "fast",
        "--config",
        str(tmp_path / "cfg.yaml"),
        "--export-instance",
        str(path),
    ]
    assert main(argv) == 0
    ins = load_instance(path)
    assert ins["numTransformerLayers"] == BLOCKS and ins["mbsInBatch"] == 128
    assert ins["optimizerAlgorithm"] == "Adam" and ins["activationRecomputation"] is True
    assert set(ins["nodes"]) == {"1", "2"} and len(ins["nodes"]["2"]) == BLOCKS + 2
    assert ins["maxMemoryPerDevice"] == 32 * 2**30 and ins["maxDevices"] == 64
    out = solve_instance(ins)
    assert out["finalTimePerBatch"] is not None and out["fixedStrategyTimePerBatch"] is not None
    # several architectures: refuse rather than guess
    argv = [a for a in argv if a not in ("--archs", "fast")]
    assert main(argv) == 2


def test_expert_split_is_even_with_first_stages_taking_the_extra_block():
    layers = layers_frame(1)
    st = expert_stages(layers, 4)  # 6 blocks over 4 stages: 2, 2, 1, 1
    assert [len(s) for s in st] == [3, 2, 1, 2]
    assert st[0][0] == 0 and st[-1][-1] == BLOCKS + 1


# ---------- the two-level network (config place.network, a preset's network: section) ----------


def _with_place(tmp_path, name, **place):
    cfg = {
        "models": ["tiny"],
        "place": {
            "model": "upstream",
            "recompute": ["full"],
            "devices": [64, 16],
            "global_batch": 256,
            "expert": {"tiny": {"pp": 2, "dp": 16, "tp": 2}},
            **place,
        },
    }
    (tmp_path / name).write_text(yaml.safe_dump(cfg))
    return name


def _level(bw, lat, eff=1.0):
    return {"bandwidth_Bps": bw, "latency_s": lat, "efficiency": eff}


def test_network_with_equal_levels_gives_the_flat_rows(inputs):
    tmp_path, args = inputs
    assert run_place(tmp_path, args) == 0
    # the flat link is the costmodel default (44.8 GB/s, 1 us): the same on both levels
    cfg = _with_place(
        tmp_path,
        "eq.yaml",
        network={
            "devices_per_node": 4,
            "intra_node": _level(44.8e9, 1e-6),
            "inter_node": _level(44.8e9, 1e-6),
        },
    )
    assert run_place(tmp_path, args, out="eq.parquet", config=cfg) == 0
    a = read_table(tmp_path / "place.parquet").sort_values(["arch", "devices"])
    b = read_table(tmp_path / "eq.parquet").sort_values(["arch", "devices"])
    assert (a["network"] == "flat").all() and (b["network"] == "config").all()
    assert np.allclose(a["time_per_batch_s"], b["time_per_batch_s"], rtol=1e-12)
    assert np.allclose(
        a["expert_time_per_batch_s"], b["expert_time_per_batch_s"], rtol=1e-12, equal_nan=True
    )


def test_slow_inter_node_level_costs_time_and_bounds_tensor_width(inputs):
    tmp_path, args = inputs
    assert run_place(tmp_path, args) == 0
    cfg = _with_place(
        tmp_path,
        "slow.yaml",
        network={
            "devices_per_node": 2,
            "intra_node": _level(44.8e9, 1e-6),
            "inter_node": _level(1e9, 5e-6, 0.9),
        },
    )
    assert run_place(tmp_path, args, out="slow.parquet", config=cfg) == 0
    a = read_table(tmp_path / "place.parquet").sort_values(["arch", "devices"])
    b = read_table(tmp_path / "slow.parquet").sort_values(["arch", "devices"])
    assert b["feasible"].all()
    # a slower inter-node level can only make every candidate slower
    assert (
        b["time_per_batch_s"].to_numpy() >= a["time_per_batch_s"].to_numpy() * (1 - 1e-12)
    ).all()
    assert (b["time_per_batch_s"].to_numpy() > a["time_per_batch_s"].to_numpy()).any()
    # one device per node: t = 2 no longer fits in a node, only t = 1 is placed, and the expert
    # placement (tp 2) is reported infeasible with the reason
    cfg = _with_place(
        tmp_path,
        "one.yaml",
        network={
            "devices_per_node": 1,
            "intra_node": _level(44.8e9, 1e-6),
            "inter_node": _level(1e9, 5e-6),
        },
    )
    assert run_place(tmp_path, args, out="one.parquet", config=cfg) == 0
    c = read_table(tmp_path / "one.parquet")
    assert c["feasible"].all() and (c["tp"] == 1).all()
    big = c[c["devices"] == 64]
    assert (~c["expert_feasible"]).all() and big["expert_reason"].str.contains(
        "devices per node"
    ).all()


def test_a_presets_network_is_used_for_its_architecture(inputs):
    tmp_path, args = inputs
    space = read_table(tmp_path / "space.parquet", "space")
    space.loc[space["arch"] == "fast", "preset"] = "a100-80gb"
    write_table(space, tmp_path / "space.parquet", "space")
    assert run_place(tmp_path, args) == 0
    df = read_table(tmp_path / "place.parquet").set_index(["arch", "devices"])
    assert df.loc[("fast", 64), "network"] == "preset:a100-80gb"
    assert df.loc[("slow", 64), "network"] == "flat"
    cfg = _with_place(tmp_path, "nopreset.yaml", preset_networks=False)
    assert run_place(tmp_path, args, out="flat.parquet", config=cfg) == 0
    flat = read_table(tmp_path / "flat.parquet").set_index(["arch", "devices"])
    assert (flat["network"] == "flat").all()
    # the slow architecture never sees the preset's network
    assert flat.loc[("slow", 64), "time_per_batch_s"] == df.loc[("slow", 64), "time_per_batch_s"]


@pytest.mark.parametrize(
    "network, named",
    [
        ({"topology": "torus3d", "cube": [4, 4, 4], "pod": [16, 16, 16]}, "link"),
        ({"topology": "mesh", "devices_per_node": 8}, "mesh"),
        (
            {"topology": "torus3d", "cube": [4, 4, 4], "pod": [16, 16, 16], "devices_per_node": 8}
            | {"link": _level(4.5e10, 1e-6)},
            "devices_per_node",
        ),
        (
            {"topology": "torus3d", "cube": [4, 4], "pod": [16, 16, 16]}
            | {"link": _level(4.5e10, 1e-6)},
            "cube",
        ),
    ],
)
def test_a_bad_torus_place_network_is_one_line(inputs, capsys, network, named):
    tmp_path, args = inputs
    cfg = _with_place(tmp_path, "badtorus.yaml", network=network)
    assert run_place(tmp_path, args, out="badtorus.parquet", config=cfg) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "place/network" in err, err
    assert not (tmp_path / "badtorus.parquet").exists()


def test_invalid_network_config_is_an_error(inputs, capsys):
    tmp_path, args = inputs
    cfg = _with_place(
        tmp_path, "bad.yaml", network={"devices_per_node": 8, "intra_node": _level(3e11, 2e-6)}
    )
    assert run_place(tmp_path, args, out="bad.parquet", config=cfg) == 2
    assert "inter_node" in capsys.readouterr().err


# ---------- the megatron model (config place.model: megatron, the default) ----------


def _megatron_cfg(tmp_path, name="meg.yaml", **place):
    cfg = {
        "models": ["tiny"],
        "place": {
            "devices": [64, 16],
            "global_batch": 256,
            "recompute": ["none", "full"],
            "interleave": [1, 2, 3],
            "expert": {"tiny": {"pp": 2, "dp": 16, "tp": 2}},
            **place,
        },
    }
    (tmp_path / name).write_text(yaml.safe_dump(cfg))
    return name


def _hand_chain(t, sp, arch, column="makespan_s", attention_s=0.0):
    """The chain the megatron rows price, built from the synthetic frames by hand."""
    from phaze.step.layers import ChainCost, LayerCost

    lay = layers_frame(t).drop_duplicates("signature").set_index("kind")
    sched = schedule_frame(t).set_index(["arch", "signature", "pass"])[column]

    def layer(kind, att=0.0):
        r = lay.loc[kind]
        split = t if sp else 1
        return LayerCost(
            fwd_s=sched[(arch, r["signature"], "fwd")],
            bwd_s=sched[(arch, r["signature"], "bwd")],
            params=r["param_bytes"] / 2,
            activation_bytes=r["activation_bytes"]
            - r["replicated_activation_bytes"] * (1 - 1 / split),
            attention_fwd_s=att,
            attention_activation_bytes=r["attention_activation_bytes"],
            input_bytes=r["stash_recompute_bytes"] / split,
            fwd_matmul_flops=r["fwd_matmul_flops"],
        )

    return ChainCost(
        layer("embedding"),
        layer("block", attention_s),
        layer("head"),
        BLOCKS,
        t,
        2,
        sp,
        boundary_bytes=1e7,
    )


def _row_strategy(r, prefix=""):
    from phaze.step.strategy import Strategy

    stages = tuple(s["blocks"] for s in json.loads(r[prefix + "stages"]))
    return Strategy(
        devices=int(r["devices"]),
        tp=int(r[prefix + "tp"]),
        pp=int(r[prefix + "pp"]),
        microbatch=2,
        global_batch=256,
        interleave=int(r[prefix + "interleave"]),
        recompute=r[prefix + "recompute"],
        sequence_parallel=bool(r[prefix + "sequence_parallel"]),
        distributed_optimizer=bool(r[prefix + "distributed_optimizer"]),
        ddp=r[prefix + "ddp"],
        stages=stages,
    )


def _flat_and_consts():
    from phaze.config import schema_defaults
    from phaze.network import HierarchicalNetwork, LinkLevel
    from phaze.step.model import StepConstants

    cfg = schema_defaults()
    cm = cfg["costmodel"]
    net = HierarchicalNetwork.flat(LinkLevel(cm["link_bandwidth_Bps"], cm["link_latency_s"]), 64)
    return net, StepConstants.from_config(cfg["step"], cm["hbm_bandwidth_Bps"])


def test_a_torus_place_network_is_the_presets_torus_for_grid_points(inputs):
    """place.network with topology torus3d puts every grid point on that torus: the same rows as
    the tpuv4 preset's own network gives the architecture that carries the preset's name."""
    from phaze.arch.presets import load_preset

    tmp_path, args = inputs
    torus = load_preset("tpuv4")["network"]
    space = read_table(tmp_path / "space.parquet", "space")
    space.loc[space["arch"] == "fast", "preset"] = "tpuv4"
    write_table(space, tmp_path / "space.parquet", "space")
    assert run_place(tmp_path, args, config=_megatron_cfg(tmp_path), out="own.parquet") == 0
    own = read_table(tmp_path / "own.parquet").set_index(["arch", "devices"])
    cfg = _megatron_cfg(tmp_path, "torus.yaml", network=torus, preset_networks=False)
    assert run_place(tmp_path, args, out="torus.parquet", config=cfg) == 0
    grid = read_table(tmp_path / "torus.parquet").set_index(["arch", "devices"])
    assert (grid["network"] == "config").all()
    assert own.loc[("fast", 64), "network"] == "preset:tpuv4"
    assert own.loc[("slow", 64), "network"] == "flat"
    cols = ["time_per_batch_s", "pp", "tp", "dp", "microbatch"]
    pd.testing.assert_frame_equal(own.loc[["fast"], cols], grid.loc[["fast"], cols])
    # the other architecture moved from the flat link onto the torus
    assert not np.allclose(
        own.loc["slow", "time_per_batch_s"].to_numpy(), grid.loc["slow", "time_per_batch_s"]
    )


def test_megatron_rows_price_their_strategy_and_beat_the_expert(inputs):
    from phaze.step.model import price

    tmp_path, args = inputs
    cfg = _megatron_cfg(tmp_path)
    assert run_place(tmp_path, args, config=cfg, out="meg.parquet") == 0
    df = read_table(tmp_path / "meg.parquet", "place")
    assert (df["place_model"] == "megatron").all() and df["feasible"].all()
    net, consts = _flat_and_consts()
    for _, r in df.iterrows():
        s = _row_strategy(r)
        assert s.tp * s.pp * s.dp == r["devices"] == r["devices_used"]  # every device
        assert 256 % (2 * s.dp) == 0  # microbatch·dp divides the global batch
        chain = _hand_chain(s.tp, s.sequence_parallel, r["arch"])
        want = price(chain, s, net, consts, PEAK[r["arch"]], 32 * 2**30)
        assert r["time_per_batch_s"] == pytest.approx(want["iteration_time_s"], rel=1e-12)
        assert r["mfu"] == pytest.approx(want["mfu"], rel=1e-12)
        stages = json.loads(r["stages"])
        assert stages[0]["first"] == "embedding" and stages[-1]["last"] == "head"
        assert sum(x["layers"] for x in stages) == BLOCKS + 2
        assert max(json.loads(r["stage_mem_bytes"])) <= 32 * 2**30
        if r["expert_feasible"]:
            e = _row_strategy(r, "expert_")
            assert (e.pp, e.dp, e.tp, e.stages) == (2, 16, 2, (3, 3))
            assert r["time_per_batch_s"] <= r["expert_time_per_batch_s"] * (1 + 1e-12)
    small = df[df["devices"] == 16]
    assert not small["expert_feasible"].any()
    assert small["expert_reason"].str.contains("uses every device").all()
    assert df[df["devices"] == 64]["expert_feasible"].all()
    # the model FLOPs of MFU: 3 passes over the forward matmuls (per rank x t), per sequence
    r = df.iloc[0]
    flops = 3 * layers_frame(1)["fwd_matmul_flops"].sum() / 2 * 256
    assert r["mfu"] == pytest.approx(
        flops / (r["time_per_batch_s"] * r["devices"] * PEAK[r["arch"]])
    )


def test_megatron_bound_tier_gives_a_throughput_upper_bound(inputs):
    tmp_path, args = inputs
    cfg = _megatron_cfg(tmp_path)
    assert run_place(tmp_path, args, config=cfg, out="lo.parquet") == 0
    extra = ("--latency-column", "lower_bound_s")
    assert run_place(tmp_path, args, *extra, config=cfg, out="ub.parquet") == 0
    a = read_table(tmp_path / "lo.parquet").sort_values(["arch", "devices"])
    b = read_table(tmp_path / "ub.parquet").sort_values(["arch", "devices"])
    assert (b["throughput_seq_s"].to_numpy() >= a["throughput_seq_s"].to_numpy()).all()
    assert (b["throughput_seq_s"].to_numpy() > a["throughput_seq_s"].to_numpy()).any()


def _ops_and_latencies(tmp_path, t):
    """Minimal ops (the block's forward: two attention ops, one other) and their latencies."""
    from phaze.io.tables import SCHEMAS

    rows = []
    for op, attention in ((0, True), (1, True), (2, False)):
        row = {f.name: 0 for f in SCHEMAS["ops"]}
        row.update(
            layer="block.0",
            signature=f"blk{t}",
            op=op,
            aten="aten.bmm.default",
            kind="matmul" if op == 0 else "vector",
            core="tc",
            collective="",
            group_size=1,  # no collective: the group of one rank
            attention=attention,
            replicated=False,
            moe_role="",  # a dense model's ops: no mixture-of-experts role, no expert
            expert=-1,
            flops=1e9 if op == 0 else 0.0,
            **{"pass": "fwd"},
        )
        rows.append(row)
    write_table(pd.DataFrame(rows), tmp_path / f"trace_t{t}" / "ops.parquet", "ops")
    lat = []
    for arch in ("fast", "slow"):
        for op in (0, 1, 2):
            lat.append(
                dict(
                    arch=arch,
                    signature=f"blk{t}",
                    op=op,
                    core="tc",
                    latency_1core_s=0.02 * (op + 1),
                    latency_allcores_s=0.01 * (op + 1),
                    bound="compute",
                    **{"pass": "fwd"},
                )
            )
    path = tmp_path / f"lat_t{t}.parquet"
    write_table(pd.DataFrame(lat), path, "latency")
    return str(path)


def test_selective_recompute_costs_core_attentions_ops(inputs, capsys):
    from phaze.step.model import price

    tmp_path, args = inputs
    cfg = _megatron_cfg(tmp_path, "sel.yaml", recompute=["selective"], devices=[64])
    assert run_place(tmp_path, args, config=cfg, out="sel.parquet") == 2
    assert "selective recomputation needs" in capsys.readouterr().err
    lats = [_ops_and_latencies(tmp_path, t) for t in (1, 2)]
    assert run_place(tmp_path, args, "--latencies", *lats, config=cfg, out="sel.parquet") == 0
    df = read_table(tmp_path / "sel.parquet", "place")
    assert (df["recompute"] == "selective").all()
    net, consts = _flat_and_consts()
    for _, r in df.iterrows():
        s = _row_strategy(r)
        # core attention = ops 0 and 1, each on its faster core set: 0.01 + 0.02 s
        chain = _hand_chain(s.tp, s.sequence_parallel, r["arch"], attention_s=0.03)
        want = price(chain, s, net, consts, PEAK[r["arch"]], 32 * 2**30)
        assert r["time_per_batch_s"] == pytest.approx(want["iteration_time_s"], rel=1e-12)


def test_old_recompute_forms_are_errors_naming_the_new_one(inputs, capsys):
    tmp_path, args = inputs
    assert run_place(tmp_path, args, "--recompute", "on") == 2
    assert "config place.recompute" in capsys.readouterr().err
    bad = {"models": ["tiny"], "place": {"recompute": [False, True]}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(bad))
    assert run_place(tmp_path, args, config="old.yaml") == 2
    err = capsys.readouterr().err
    assert "[none, selective, full]" in err and len(err.strip().splitlines()) == 1


def test_megatron_needs_a_chain_of_identical_blocks(inputs, capsys):
    tmp_path, args = inputs
    odd = layers_frame(2)
    odd.loc[3, "activation_bytes"] += 1
    write_table(odd, tmp_path / "trace_t2" / "layers.parquet", "layers")
    assert run_place(tmp_path, args, config=_megatron_cfg(tmp_path), out="x.parquet") == 2
    assert "identical blocks" in capsys.readouterr().err
