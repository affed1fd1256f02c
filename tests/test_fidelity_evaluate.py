"""Evaluate a given strategy: per-layer GPU work from the shared trace + cost model, sequence
parallelism, recomputation modes, DDP modes, the CLIs, and the Megatron validation targets."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from phaze.arch.presets import load_preset
from phaze.config import validate_config
from phaze.errors import PhazeError
from phaze.fidelity.compute import gpu_core, layer_works, preset_costmodel
from phaze.fidelity.evaluate import evaluate_strategy, gpu_chains, trace_for
from phaze.step.strategy import Strategy
from tests.step_cases import TINY_SEQ, tiny_gpt, write_tiny_gpt2_config

SEQ = TINY_SEQ
CFG = validate_config({})
REPO = Path(__file__).resolve().parents[1]
A100 = load_preset("a100-80gb")


def run(spec, **kw):
    base = {"devices": 16, "tp": 2, "pp": 2, "microbatch": 2, "global_batch": 32, "ddp": "after"}
    base.update(kw)
    return evaluate_strategy(spec, Strategy(**base), A100, seq=SEQ, config=CFG)


def chains(spec, tp=2, microbatch=2):
    """{sequence_parallel: ChainCost} of the model on the A100 preset."""
    return gpu_chains(spec, tp, microbatch, SEQ, A100, CFG)


def block_works(spec, tp):
    """{sequence_parallel: LayerWork} of one block (the kernel sums before pricing)."""
    trace = trace_for(spec, 2, tp, SEQ)
    layers = trace.layers.set_index("layer")
    return layer_works(
        trace.ops[trace.ops["layer"] == "block.0"],
        trace.edges[trace.edges["layer"] == "block.0"],
        core=gpu_core(A100, preset_costmodel(A100, CFG["costmodel"])),
        cm=preset_costmodel(A100, CFG["costmodel"]),
        n_tc=A100["arch"]["n_tc"],
        n_vc=A100["arch"]["n_vc"],
        fuse=True,
        tp=tp,
        param_bytes=int(layers.loc["block.0", "param_bytes"]),
    )


def test_sequence_parallel_keeps_flops_divides_replicated_work_and_swaps_collectives():
    spec = tiny_gpt()
    for t in (2, 4):
        works = block_works(spec, t)
        plain, sp = works[False], works[True]
        assert sp.fwd_flops == plain.fwd_flops and sp.bwd_flops == plain.bwd_flops
        # every all-reduce of b·s·h becomes a reduce-scatter + all-gather of the same tensor
        assert [k for k, _ in plain.fwd_collectives] == ["all_reduce"] * 2
        assert [k for k, _ in plain.bwd_collectives] == ["all_reduce"] * 2
        for coll_plain, coll_sp in (
            (plain.fwd_collectives, sp.fwd_collectives),
            (plain.bwd_collectives, sp.bwd_collectives),
        ):
            expected = [
                x
                for _, size in coll_plain
                for x in (("reduce_scatter", size), ("all_gather", size))
            ]
            assert coll_sp == expected
        # layer-norm / dropout / residual kernels: time / t; everything else unchanged
        saved = plain.fwd_s - sp.fwd_s + plain.bwd_s - sp.bwd_s
        assert saved > 0
        assert math.isclose(saved, plain.replicated_s * (1 - 1 / t), rel_tol=1e-9)


def test_core_attention_is_part_of_forward_and_selective_recompute_is_cheaper_than_full():
    spec = tiny_gpt()
    blk = chains(spec)[False].block
    assert 0 < blk.attention_fwd_s < blk.fwd_s
    full = run(spec, recompute="full")
    selective = run(spec, recompute="selective")
    none = run(spec, recompute="none")
    assert none["breakdown"]["recompute_s"] == 0
    assert 0 < selective["breakdown"]["recompute_s"] < full["breakdown"]["recompute_s"]
    assert none["iteration_time_s"] < selective["iteration_time_s"] < full["iteration_time_s"]
    assert none["peak_memory_bytes"] > selective["peak_memory_bytes"] > full["peak_memory_bytes"]


def test_breakdown_sums_to_iteration_time_and_flops_follow_eq3():
    spec = tiny_gpt()
    r = run(spec, interleave=2, recompute="full")
    assert math.isclose(sum(r["breakdown"].values()), r["iteration_time_s"], rel_tol=1e-12)
    B, s, l, h, V = 32, SEQ, 8, 256, 1024
    # Narayanan et al.'s Eq. (3) counts what runs under full recomputation (hardware FLOPs);
    # model FLOPs (MFU, PaLM's convention) are 3 passes: Eq. (3) without the recomputed forward
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert math.isclose(r["hardware_flops"], eq3, rel_tol=1e-9)
    assert math.isclose(r["model_flops"], eq3 - B * l * (24 * s * h * h + 4 * s * s * h))
    assert math.isclose(
        r["mfu"], r["model_flops"] / (16 * r["iteration_time_s"] * 312e12), rel_tol=1e-3
    )
    assert 0 < r["mfu"] < r["hfu"] < 1


def test_ddp_overlap_hides_gradient_all_reduce():
    spec = tiny_gpt(hidden=1024)  # ~100 M parameters: gradients span several 25 MiB buckets
    after = run(spec, devices=32, tp=1, pp=1, microbatch=1, global_batch=32, ddp="after")
    overlap = run(spec, devices=32, tp=1, pp=1, microbatch=1, global_batch=32, ddp="overlap")
    assert (
        after["breakdown"]["data_parallel_comm_s"]
        > overlap["breakdown"]["data_parallel_comm_s"]
        > 0
    )
    assert overlap["iteration_time_s"] < after["iteration_time_s"]


def test_interleaving_shrinks_the_bubble_and_adds_traffic():
    spec = tiny_gpt()
    one = run(spec, pp=4, devices=16, tp=2, global_batch=32, interleave=1)
    two = run(spec, pp=4, devices=16, tp=2, global_batch=32, interleave=2)
    assert two["breakdown"]["pipeline_bubble_s"] < one["breakdown"]["pipeline_bubble_s"]
    assert two["breakdown"]["pipeline_comm_s"] > one["breakdown"]["pipeline_comm_s"]


def test_evaluate_rejects_invalid_interleaving_and_unknown_network():
    spec = tiny_gpt(layers=6)
    with pytest.raises(PhazeError, match="interleave 2 does not divide the 3 blocks"):
        run(spec, pp=2, interleave=2)  # 6 blocks: 3 per stage, not 2 chunks of whole blocks
    with pytest.raises(PhazeError, match="network"):
        evaluate_strategy(
            spec, Strategy(8, 1, 1, 1, 8), load_preset("tpuv4-upstream"), seq=SEQ, config=CFG
        )


def test_evaluate_cli_prints_the_contract(tmp_path, phaze_cli):
    cfg = write_tiny_gpt2_config(tmp_path / "config.json", 4)
    out = phaze_cli(
        "evaluate",
        "--hf-config",
        str(cfg),
        "--arch",
        "a100-80gb",
        "--devices",
        "8",
        "--tp",
        "2",
        "--pp",
        "2",
        "--microbatch",
        "1",
        "--global-batch",
        "8",
        "--recompute",
        "selective",
        "--sequence-parallel",
        "--ddp",
        "after",
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    for key in ("iteration_time_s", "model_flops", "hardware_flops", "mfu", "hfu"):
        assert r[key] > 0
    assert r["peak_memory_bytes"] > 0 and r["fits_memory"] is True
    assert set(r["strategy"]) == {
        "tp",
        "pp",
        "dp",
        "ep",
        "etp",
        "microbatch",
        "interleave",
        "recompute",
        "sequence_parallel",
        "distributed_optimizer",
        "ddp",
        "stages",
    }
    assert r["strategy"]["stages"] == [2, 2] and r["strategy"]["ddp"] == "after"
    assert set(r["breakdown"]) == {
        "compute_s",
        "recompute_s",
        "tensor_parallel_comm_s",
        "expert_parallel_comm_s",
        "pipeline_comm_s",
        "grad_accumulation_s",
        "weight_cast_s",
        "pipeline_bubble_s",
        "data_parallel_comm_s",
        "optimizer_s",
    }
    bad = phaze_cli(
        "evaluate",
        "--hf-config",
        str(cfg),
        "--arch",
        "a100-80gb",
        "--devices",
        "8",
        "--tp",
        "2",
        "--pp",
        "2",
        "--microbatch",
        "1",
        "--global-batch",
        "6",
        "--interleave",
        "2",
    )
    assert bad.returncode == 2
    assert "phaze evaluate: error:" in bad.stderr and "divisible" in bad.stderr


@pytest.mark.xfail(
    strict=True,
    reason="not met: every Table 1 row is predicted 4-12 % fast (mean 7.9 %, max 12.0 %); "
    "docs/fidelity.md#validate says why no sourced effect closes it",
)
def test_validate_meets_the_targets_without_a_flat_efficiency():
    """The Megatron Table 1 check (python -m phaze validate): mean |error| <= 3 %, max <= 6 %,
    Spearman >= 0.7, and the predicted TFLOP/s per GPU are not one flat number."""
    from phaze.fidelity.validate import validate

    report = validate(CFG)
    assert len(report["rows"]) == 10
    assert report["mean_abs_error"] <= 0.03
    assert report["max_abs_error"] <= 0.06
    assert report["spearman"] >= 0.7
    # every published run ran, so each must fit in the A100's 80 GiB
    assert all(r["fits_memory"] for r in report["rows"])
    predicted = [r["predicted_tflops_per_gpu"] for r in report["rows"]]
    assert max(predicted) - min(predicted) > 15  # the published rows span 135-163


def test_reference_with_mfu_selective_recompute_and_sequence_parallelism(tmp_path):
    """A reference row giving mfu_percent, recompute and sequence_parallel (the packaged
    Korthikanti et al. 2022 table's 22B run): the published time is the model FLOPs over
    gpus x 312 TFLOP/s x MFU, and the prediction is evaluate's time of exactly that strategy."""
    from phaze.fidelity.validate import (
        SEQ,
        VOCAB,
        gpt_spec,
        model_flops,
        published_strategy,
        read_reference,
        validate,
    )

    packaged = REPO / "phaze" / "fidelity" / "data" / "megatron_korthikanti2022.csv"
    rows = read_reference(packaged)
    assert [r["params_billion"] for r in rows] == [22, 175, 530, 1000]
    assert all(r["recompute"] == "selective" and r["sequence_parallel"] for r in rows)
    lines = [ln for ln in packaged.read_text().splitlines() if not ln.startswith("#")]
    (tmp_path / "ref.csv").write_text("\n".join(lines[:2]) + "\n")  # header + the 22B run
    (row,) = read_reference(tmp_path / "ref.csv")
    strategy = published_strategy(row)
    assert (strategy.recompute, strategy.sequence_parallel) == ("selective", True)
    report = validate(CFG, tmp_path / "ref.csv")
    (r,) = report["rows"]
    flops = model_flops(4, SEQ, 48, 6144, VOCAB)
    assert math.isclose(flops, 72 * 4 * 2048 * 48 * 6144**2 * (1 + 2048 / 36864 + 51200 / 3538944))
    assert math.isclose(r["published_time_s"], flops / (8 * 312e12 * 0.415))
    want = evaluate_strategy(gpt_spec(row), strategy, A100, seq=SEQ, config=CFG)
    assert math.isclose(r["predicted_time_s"], want["iteration_time_s"])
    # selective recomputation is not full recomputation: the row's own setting is used
    full = evaluate_strategy(
        gpt_spec(row),
        dataclasses.replace(strategy, recompute="full"),
        A100,
        seq=SEQ,
        config=CFG,
    )
    assert full["iteration_time_s"] > r["predicted_time_s"] * 1.05
    assert r["recompute"] == "selective" and r["sequence_parallel"] is True


def test_spearman_handles_ties():
    from phaze.fidelity.validate import spearman

    assert math.isclose(spearman([1, 2, 3, 4], [10, 20, 30, 40]), 1.0)
    assert math.isclose(spearman([1, 2, 3, 4], [4, 3, 2, 1]), -1.0)
    assert math.isclose(spearman([1, 2, 2, 3], [1, 2, 2, 3]), 1.0)


def test_embedding_and_head_follow_megatron():
    spec = tiny_gpt()
    plain, sp = chains(spec)[False], chains(spec)[True]
    act = 2 * SEQ * 256 * 2  # b·s·h fp16
    # trace: vocab-parallel embedding all-reduce (fwd), head-input gradient all-reduce (bwd);
    # here: + the cross-entropy's three b·s fp32 all-reduces
    assert plain.first.fwd_collectives == (("all_reduce", act),)
    assert plain.last.bwd_collectives == (("all_reduce", act),)
    assert plain.last.fwd_collectives == (("all_reduce", 2 * SEQ * 4),) * 3
    # sequence parallelism: reduce-scatter into / all-gather out of the sequence-parallel region
    assert sp.first.fwd_collectives == (("reduce_scatter", act),)
    assert sp.last.fwd_collectives[0] == ("all_gather", act)
    assert sp.last.bwd_collectives == (("reduce_scatter", act),)
    # GPT-2 ties the LM head to the word embedding: the last stage keeps a copy (V/t rows)
    assert plain.tied and plain.last.tied_params == 1024 // 2 * 256
    r = run(spec, tp=2, pp=2)
    first, last = r["per_stage"]
    blocks = 4 * plain.block.params
    assert math.isclose(last["params"], blocks + plain.last.params + 1024 // 2 * 256)
    assert math.isclose(first["params"], blocks + plain.first.params)


def test_head_costs_megatrons_fp32_cross_entropy():
    from phaze.estimate.model import achievable_hbm_Bps
    from phaze.fidelity.compute import CROSS_ENTROPY_BYTES_PER_LOGIT, LOSS_ATEN, kernel_latencies

    spec = tiny_gpt()
    head_cost = chains(spec, tp=2)[False].last
    cm = preset_costmodel(A100, CFG["costmodel"])
    trace = trace_for(spec, 2, 2, SEQ)
    head = trace.ops[trace.ops["layer"] == "head"]
    logits = 2 * SEQ * 1024 // 2  # b·s·V/t fp32 logits on one rank
    bw = float(achievable_hbm_Bps(cm))
    # per logit: cast 2+4, max 4, subtract 4+4, exp 4+4, sum 4, divide 4+4 (forward); scale 4+4,
    # the cast's backward 4+2 (backward)
    assert CROSS_ENTROPY_BYTES_PER_LOGIT == {"fwd": 38.0, "bwd": 14.0}
    for pass_, attr in (("fwd", "fwd_s"), ("bwd", "bwd_s")):
        o = head[head["pass"] == pass_].sort_values("op").reset_index(drop=True)
        e = trace.edges[(trace.edges["layer"] == "head") & (trace.edges["pass"] == pass_)]
        k = kernel_latencies(o, e, gpu_core(A100, cm), cm, 108, 432, True)
        kept = sum(
            lat
            for lat, ids in zip(k["latency_s"], k["ops"])
            if not all(o.loc[i, "aten"] in LOSS_ATEN for i in ids)
        )
        # the trace's log-softmax/NLL kernels are replaced by Megatron's 38 + 14 B per logit
        assert getattr(head_cost, attr) == pytest.approx(
            kept + logits * CROSS_ENTROPY_BYTES_PER_LOGIT[pass_] / bw, rel=1e-12
        )


def test_gradient_accumulation_is_paid_by_every_microbatch_but_the_first():
    from phaze.estimate.model import achievable_hbm_Bps

    spec = tiny_gpt()
    bw = float(achievable_hbm_Bps(preset_costmodel(A100, CFG["costmodel"])))
    r = run(spec)  # 32 sequences, dp 4, microbatch 2: m = 4
    crit = r["per_stage"][r["critical_stage"]]
    per_param = CFG["step"]["grad_accumulation_bytes_per_param"]
    assert per_param == 6
    assert r["breakdown"]["grad_accumulation_s"] == pytest.approx(
        3 * crit["params"] * per_param / bw, rel=1e-12
    )
    # one microbatch per iteration: nothing to add
    assert run(spec, global_batch=8)["breakdown"]["grad_accumulation_s"] == 0
    fused_cfg = {**CFG, "step": {**CFG["step"], "grad_accumulation_bytes_per_param": 0}}
    s = Strategy(devices=16, tp=2, pp=2, microbatch=2, global_batch=32, ddp="after")
    fused = evaluate_strategy(spec, s, A100, seq=SEQ, config=fused_cfg)
    assert fused["breakdown"]["grad_accumulation_s"] == 0
    assert fused["iteration_time_s"] < r["iteration_time_s"]


def test_presets_carry_sources_and_h100_beats_a100():
    from phaze.arch.presets import preset_peak_flops as peak_flops

    h100 = load_preset("h100-sxm")
    assert math.isclose(peak_flops(A100), 312e12, rel_tol=0.001)
    assert math.isclose(peak_flops(h100), 989.4e12, rel_tol=0.001)
    for preset in (A100, h100):
        for key in list(preset["arch"]) + list(preset["costmodel"]):
            assert key in preset["sources"], f"no source for {key}"
        assert "network" in preset and "devices_per_node" in preset["network"]
    spec = tiny_gpt(hidden=512)
    s = Strategy(devices=16, tp=2, pp=2, microbatch=2, global_batch=32)
    a = evaluate_strategy(spec, s, A100, seq=SEQ, config=CFG)
    h = evaluate_strategy(spec, s, h100, seq=SEQ, config=CFG)
    assert h["iteration_time_s"] < a["iteration_time_s"]


def test_memory_capacity_is_checked():
    small = run(tiny_gpt())
    assert small["fits_memory"] is True and small["hbm_capacity_bytes"] == 80 * 2**30
    # 6.4 B parameters x 16 B of Adam state on one device cannot fit in 80 GiB
    big = tiny_gpt(layers=32, hidden=4096, heads=32)
    r = run(big, devices=1, tp=1, pp=1, microbatch=1, global_batch=1)
    assert r["peak_memory_bytes"] > 16 * 12 * 4096**2 * 32
    assert r["fits_memory"] is False


def test_a_table_of_runs_validates_a_mixture_of_experts_run(tmp_path):
    """The packaged Mixtral 8x7B release-test run (a table of runs: registry model, preset, every
    setting, the measured iteration time): the prediction is evaluate's time of exactly that
    strategy, expert parallelism included, and the published TFLOP/s per GPU come out of phaze's
    own model-FLOP count at the source's logged figure (414.8, Megatron-LM's count, which counts
    attention unmasked, as phaze's eager reading does) — two counts of the same matmuls agreeing,
    not a fit. The packaged row runs fused attention (the run's FlashAttention), whose causal
    share lowers phaze's count."""
    from phaze.fidelity.validate import read_runs, run_strategy, validate
    from phaze.trace.models import get_model_spec

    packaged = REPO / "phaze" / "fidelity" / "data" / "megatron_mixtral_release.csv"
    (row,) = read_runs(packaged)
    strategy = run_strategy(row)
    assert (strategy.tp, strategy.pp, strategy.dp, strategy.ep) == (1, 4, 16, 8)
    report = validate(CFG, packaged)
    (r,) = report["rows"]
    assert r["published_time_s"] == 3.275 and r["ep"] == 8
    h100 = load_preset("h100-sxm")
    fused = {**CFG, "fidelity": {**CFG["fidelity"], "attention": "fused"}}
    want = evaluate_strategy(
        get_model_spec("mixtral-8x7b"), strategy, h100, seq=4096, config=fused, name="h100-sxm"
    )
    assert math.isclose(r["predicted_time_s"], want["iteration_time_s"])
    assert r["attention"] == "fused" and r["fits_memory"]
    assert r["published_tflops_per_gpu"] < 414.8
    assert r["breakdown"]["expert_parallel_comm_s"] > 0
    assert abs(r["error"]) < 0.25  # the measured run, not a fitted one: docs/fidelity.md
    eager = tmp_path / "eager.csv"
    eager.write_text(packaged.read_text().replace(",fused,none,", ",eager,selective,"))
    (e,) = validate(CFG, eager)["rows"]
    assert e["attention"] == "eager"
    assert e["published_tflops_per_gpu"] == pytest.approx(414.8, rel=0.01)


RUN_HEADER = (
    "model,preset,gpus,seq,global_batch,microbatch,tensor_parallel,pipeline_parallel,interleave,"
    "expert_parallel,recompute,sequence_parallel,distributed_optimizer,ddp,iteration_time_s"
)


@pytest.mark.parametrize(
    "line,needle",
    [
        ("mixtral-8x7b,h100-sxm,64,4096,256,1,1,4,8,3,none,0,1,overlap,3.2", "ep (3) must divide"),
        ("llama3-8b,h100-sxm,64,4096,256,1,1,4,8,2,none,0,1,overlap,3.2", "needs a mixture"),
        ("mixtral-8x7b,h100-sxm,64,4096,256,1,1,4,8,8,none,2,1,overlap,3.2", "must be 0 or 1"),
        ("mixtral-8x7b,h100-sxm,64,4096,256,1,1,4,8,8,none,0,1,torch,3.2", "overlap or after"),
        ("mixtral-8x7b,h100-sxm,64,4096,256,1,1,4,8,8,none,0,1,overlap,-1", "iteration_time_s"),
    ],
)
def test_a_bad_run_row_exits_2_with_one_line(tmp_path, phaze_cli, line, needle):
    (tmp_path / "runs.csv").write_text(RUN_HEADER + "\n" + line + "\n")
    bad = phaze_cli("validate", "--reference", str(tmp_path / "runs.csv"))
    assert bad.returncode == 2, bad.stderr
    (msg,) = bad.stderr.strip().splitlines()
    assert msg.startswith("phaze validate: error:") and needle in msg
