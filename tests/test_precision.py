"""Number formats (phaze/precision.py): FP8 GEMMs, casts, cast weights and FP8-saved inputs
against hand-computed values; BF16 stays the default and changes nothing; FP8 on a preset without
an FP8 peak is one line, exit 2."""

import copy
import math
from functools import cache

import numpy as np
import pytest

from phaze.arch.presets import load_preset, preset_peak_flops
from phaze.config import validate_config
from phaze.errors import PhazeError
from phaze.estimate import matmul_cost
from phaze.estimate.model import achievable_hbm_Bps, tc_local_buffer_bytes
from phaze.fidelity.compute import (
    gpu_core,
    layer_works,
    low_precision_casts,
    low_precision_gemms,
    preset_costmodel,
)
from phaze.fidelity.evaluate import evaluate_strategy, gpu_chains, trace_for
from phaze.precision import FORMATS, fp8_peak_flops, gemm_core
from phaze.step.strategy import Strategy
from phaze.trace.models import get_model_spec
from tests.step_cases import TINY_SEQ, tiny_gpt, write_tiny_gpt2_config

H100 = load_preset("h100-sxm")
BF16 = validate_config({})
FP8 = validate_config({"fidelity": {"precision": "fp8"}})
B, S, H = 2, TINY_SEQ, 256  # tiny_gpt: hidden 256, ffn 4h, 8 blocks, fused QKV (GPT-2's c_attn)


def _core_and_cm(**cm):
    """A 4 × 4 array at 1 Hz with nothing but its cycles in the way (GLB and HBM unbounded)."""
    costmodel = {
        **BF16["costmodel"],
        "matmul_clock_fraction": 1.0,
        "matmul_mainloop_fraction": 1.0,
        "weight_load_overlapped": True,
        "output_tile_overlapped": True,
        "glb_bandwidth_Bps": 1e30,
        "hbm_bandwidth_Bps": 1e30,
        "op_issue_s": 0.0,
        **cm,
    }
    core = {"tc_width": 4, "tc_depth": 4, "glb_bytes": 2**30, "freq_hz": 1.0}
    core["tc_local_buffer_bytes"] = 2.0**20
    return core, costmodel


def test_an_fp8_gemm_runs_twice_the_multiply_adds_per_cycle_on_one_byte_operands():
    """C[64×4] = A[64×16]·B[16×4] on one 4 × 4 array, by hand: BF16 streams 64 rows through
    ⌈16/4⌉ = 4 weight tiles (4·64 cycles) plus the fill/drain skew w + d − 2 = 6: 262 cycles; FP8
    packs two multiply-adds per PE along k, an 8 × 4 array: ⌈16/8⌉·64 + (8 + 4 − 2) = 138. HBM
    bytes: A and B once at 2 B (BF16) or 1 B (FP8), C once at 2 B: 2688 and 1600. (Mutations
    tried: a rate of 1 for FP8, one-byte outputs — each fails here.)"""
    core, cm = _core_and_cm()
    args = (64.0, 4.0, 16.0, 1.0)
    bf16 = matmul_cost(*args, core, cm, 1)
    fcore, fcm = gemm_core(core, cm, FORMATS["fp8"], float(tc_local_buffer_bytes(core)))
    fp8 = matmul_cost(*args, fcore, fcm, 1)
    assert float(bf16["compute_s"]) == 262.0
    assert float(fp8["compute_s"]) == 138.0
    assert float(bf16["hbm_traffic_bytes"]) == 64 * 16 * 2 + 16 * 4 * 2 + 64 * 4 * 2
    assert float(fp8["hbm_traffic_bytes"]) == 64 * 16 + 16 * 4 + 64 * 4 * 2
    # BF16 leaves the core and the cost model as they are
    assert gemm_core(core, cm, FORMATS["bf16"], 1.0) == (core, cm)
    # the FP8 array keeps the BF16 array's local buffer (the sizing rule would double it)
    assert fcore["tc_local_buffer_bytes"] == core["tc_local_buffer_bytes"]


def _works(fmt, preset=H100, tp=1):
    trace = trace_for(tiny_gpt(), B, tp, S)
    layers = trace.layers.set_index("layer")
    cm = preset_costmodel(preset, BF16["costmodel"])
    return layer_works(
        trace.ops[trace.ops["layer"] == "block.0"],
        trace.edges[trace.edges["layer"] == "block.0"],
        core=gpu_core(preset, cm),
        cm=cm,
        n_tc=preset["arch"]["n_tc"],
        n_vc=preset["arch"]["n_vc"],
        fuse=True,
        tp=tp,
        param_bytes=int(layers.loc["block.0", "param_bytes"]),
        fmt=FORMATS[fmt],
    )


def _no_launch_floor():
    preset = copy.deepcopy(H100)
    preset["costmodel"]["op_issue_s"] = 0.0
    return preset


def test_fp8_block_time_is_its_fp8_linear_gemms_plus_the_casts_by_hand():
    """A tiny GPT block (b 2, s 256, h 256, ffn 4h, t 1) on h100-sxm without the launch floor:
    FP8 - BF16 forward time = the four linear GEMMs (QKV, projection, fc1, fc2) re-costed in FP8
    + the casts of their four distinct inputs (b·s·h three times, b·s·4h once) at 4 B per element
    over the achievable HBM bandwidth; backward = the linear layers' dgrad and wgrad GEMMs in FP8
    + the casts of the four output gradients (b·s·3h, b·s·h, b·s·4h, b·s·h). Core attention's
    batched GEMMs stay BF16. (Mutations tried: attention's bmm in FP8, 3 cast bytes per element,
    no backward casts — each fails here.)"""
    preset = _no_launch_floor()
    bf16, fp8 = _works("bf16", preset)[False], _works("fp8", preset)[False]
    trace = trace_for(tiny_gpt(), B, 1, S)
    cm = preset_costmodel(preset, BF16["costmodel"])
    core = gpu_core(preset, cm)
    fcore, fcm = gemm_core(core, cm, FORMATS["fp8"], float(tc_local_buffer_bytes(core)))
    hbm = float(achievable_hbm_Bps(cm))
    bsh = B * S * H
    casts = {"fwd": 4 * (3 * bsh + 4 * bsh), "bwd": 4 * (3 * bsh + bsh + 4 * bsh + bsh)}
    for pass_, got_bf16, got_fp8 in (
        ("fwd", bf16.fwd_s, fp8.fwd_s),
        ("bwd", bf16.bwd_s, fp8.bwd_s),
    ):
        ops = trace.ops[(trace.ops["layer"] == "block.0") & (trace.ops["pass"] == pass_)]
        linear = ops[ops["aten"].isin(["aten.mm.default", "aten.addmm.default"])]
        assert len(linear) == (4 if pass_ == "fwd" else 8)
        shape = [linear[c].to_numpy(float) for c in ("m", "n", "k")] + [np.ones(len(linear))]
        gemm = float(np.sum(matmul_cost(*shape, fcore, fcm, preset["arch"]["n_tc"])["latency_s"]))
        gemm -= float(np.sum(matmul_cost(*shape, core, cm, preset["arch"]["n_tc"])["latency_s"]))
        assert gemm < 0  # faster in FP8
        assert math.isclose(got_fp8 - got_bf16, gemm + casts[pass_] / hbm, rel_tol=1e-9)
    assert fp8.attention_core_fwd_s == bf16.attention_core_fwd_s


def test_fp8_step_memory_and_weight_casts_of_a_small_model_by_hand():
    """Tiny GPT, 8 blocks on one stage (tp 1, pp 1, 4 devices, microbatch 2, 4 microbatches):
    each block's FP8 weights are k·n of QKV, projection, fc1, fc2 = 3h² + h² + 4h² + 4h² = 12h²
    (biases stay BF16); each keeps a 2-byte FP8 copy and transpose, and the block saves its four
    linear inputs (7·b·s·h elements) in 1 byte instead of 2. So peak memory grows by
    8·(12h²·2 − 7·b·s·h·1) bytes (one microbatch in flight), and casting the weights once per step
    costs 8·12h²·4 B over the achievable HBM bandwidth. (Mutations tried: 1-byte weight copies,
    BF16-saved inputs, the weight cast per microbatch — each fails here.)"""
    spec = tiny_gpt()
    chain = {
        p: gpu_chains(spec, 1, B, S, H100, c)[False] for p, c in (("bf16", BF16), ("fp8", FP8))
    }
    assert chain["bf16"].block.low_precision_params == 0
    assert chain["fp8"].block.low_precision_params == 12 * H * H
    assert chain["fp8"].first.low_precision_params == chain["fp8"].last.low_precision_params == 0
    saved = chain["bf16"].block.activation_bytes - chain["fp8"].block.activation_bytes
    assert saved == 7 * B * S * H
    strategy = Strategy(devices=4, tp=1, pp=1, microbatch=B, global_batch=32)
    r = {
        p: evaluate_strategy(spec, strategy, H100, seq=S, config=c)
        for p, c in (("bf16", BF16), ("fp8", FP8))
    }
    grown = r["fp8"]["peak_memory_bytes"] - r["bf16"]["peak_memory_bytes"]
    assert grown == 8 * (12 * H * H * 2 - 7 * B * S * H)
    hbm = float(achievable_hbm_Bps(preset_costmodel(H100, BF16["costmodel"])))
    assert math.isclose(
        r["fp8"]["breakdown"]["weight_cast_s"], 8 * 12 * H * H * 4 / hbm, rel_tol=1e-12
    )
    assert r["bf16"]["breakdown"]["weight_cast_s"] == 0
    for p in r:
        assert math.isclose(
            sum(r[p]["breakdown"].values()), r[p]["iteration_time_s"], rel_tol=1e-12
        )
    # MFU over the training precision's peak: the datasheet's FP8 figure
    assert r["fp8"]["peak_flops_per_device"] == 1.979e15
    assert r["bf16"]["peak_flops_per_device"] == preset_peak_flops(H100)


def test_sequence_parallelism_splits_the_saved_fp8_inputs_from_outside_the_region():
    """t = 2 with sequence parallelism: the norms' outputs (the QKV and fc1 inputs) lie outside
    the tensor-parallel region, so the rank saves and casts s/t of them; the projection and fc2
    inputs are the rank's own: saved less = b·s·h/2·2 + b·s·h/2 + b·s·2h."""
    spec = tiny_gpt()
    plain = gpu_chains(spec, 2, B, S, H100, BF16)
    fp8 = gpu_chains(spec, 2, B, S, H100, FP8)
    bsh = B * S * H
    inside = bsh / 2 + bsh * 4 / 2  # projection input (h/t wide), fc2 input (4h/t wide)
    for sp, outside in ((False, 2 * bsh), (True, 2 * bsh / 2)):
        saved = plain[sp].block.activation_bytes - fp8[sp].block.activation_bytes
        assert saved == inside + outside


@cache
def _mixtral():
    return trace_for(get_model_spec("mixtral-8x7b"), 1, 1, 32)


def test_the_router_embedding_head_and_attention_stay_bf16_and_shared_inputs_are_cast_once():
    """Mixtral (8 experts, top-2), one block: FP8 GEMMs are q, k, v, o and each expert's fused
    w1|w3 and w2 (forward) — not the router, not attention's batched GEMMs, not the LM head.
    q, k, v share one input: 1 + 1 + 8·2 = 18 input casts; one gradient cast per FP8 GEMM,
    4 + 16 = 20. (Mutation tried: casting each GEMM's input, 20 — fails here.)"""
    ops = _mixtral().ops
    fwd = ops[(ops["layer"] == "block.0") & (ops["pass"] == "fwd")].sort_values("op")
    fwd = fwd.reset_index(drop=True)
    low = low_precision_gemms(fwd, FORMATS["fp8"])
    picked = fwd[low]
    assert (picked["moe_role"] != "router").all() and (picked["batch"] <= 1).all()
    assert len(picked) == 4 + 8 * 2
    matmuls = fwd[fwd["kind"] == "matmul"]
    assert set(matmuls[~low[matmuls.index]]["aten"]) == {"aten.bmm.default", "aten.mm.default"}
    assert (
        matmuls[~low[matmuls.index] & (matmuls["aten"] == "aten.mm.default")]["moe_role"]
        == "router"
    ).all()
    head = ops[ops["layer"] == "head"]
    assert not low_precision_gemms(head.reset_index(drop=True), FORMATS["fp8"]).any()
    assert not low_precision_gemms(fwd, FORMATS["bf16"]).any()
    edges = _mixtral().edges
    edges = edges[(edges["layer"] == "block.0") & (edges["pass"] == "fwd")]
    casts = low_precision_casts(fwd, edges, FORMATS["fp8"], 1)
    assert len(casts["fwd"][False]) == 18 and len(casts["bwd"][False]) == 20


def test_bf16_is_the_default_and_prices_exactly_as_without_a_precision():
    spec = tiny_gpt()
    strategy = Strategy(
        devices=8, tp=2, pp=2, microbatch=1, global_batch=16, sequence_parallel=True
    )
    explicit = validate_config({"fidelity": {"precision": "bf16"}})
    assert BF16["fidelity"]["precision"] == "bf16"
    a = evaluate_strategy(spec, strategy, H100, seq=S, config=BF16)
    b = evaluate_strategy(spec, strategy, H100, seq=S, config=explicit)
    assert a == b and a["precision"] == "bf16"


def test_an_fp8_peak_that_is_not_twice_the_bf16_peak_or_missing_is_an_error():
    bf16 = preset_peak_flops(H100)
    assert fp8_peak_flops(H100, "h100-sxm", bf16) == 1.979e15
    wrong = copy.deepcopy(H100)
    wrong["gpu"]["fp8_peak_flops"] = 1.5e15
    with pytest.raises(PhazeError, match="not 2x"):
        fp8_peak_flops(wrong, "wrong", bf16)
    with pytest.raises(PhazeError, match="no FP8 tensor cores"):
        evaluate_strategy(
            tiny_gpt(), Strategy(4, 1, 1, 1, 4), load_preset("a100-80gb"), seq=S, config=FP8
        )


@pytest.mark.parametrize("command", ["evaluate", "optimize"])
def test_fp8_on_a_preset_without_an_fp8_peak_exits_2_with_one_line(tmp_path, phaze_cli, command):
    cfg = write_tiny_gpt2_config(tmp_path / "config.json", 2)
    args = ["--hf-config", str(cfg), "--arch", "a100-80gb", "--devices", "4", "--global-batch", "4"]
    if command == "evaluate":
        args += ["--tp", "1", "--pp", "1", "--microbatch", "1"]
    out = phaze_cli(command, *args, "--precision", "fp8")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no FP8 tensor cores" in lines[0]


def test_a_table_of_runs_with_an_unknown_precision_exits_2_with_one_line(tmp_path, phaze_cli):
    table = tmp_path / "runs.csv"
    table.write_text(
        "model,preset,gpus,seq,global_batch,microbatch,tensor_parallel,pipeline_parallel,"
        "interleave,expert_parallel,recompute,sequence_parallel,distributed_optimizer,ddp,"
        "iteration_time_s,precision\n"
        "llama3-8b,h100-sxm,8,8192,128,1,1,1,1,1,none,0,1,overlap,10.0,fp4\n"
    )
    out = phaze_cli("validate", "--reference", str(table))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "precision must be one of" in lines[0]


def test_a_table_of_runs_prices_each_row_in_its_own_precision(tmp_path):
    """A `precision` column sets each run's precision; a row without one takes the config's.
    Each row's prediction equals `evaluate` of that run in that precision."""
    from phaze.fidelity.validate import validate

    cfg = write_tiny_gpt2_config(tmp_path / "config.json", 2)
    table = tmp_path / "runs.csv"
    head = (
        "model,preset,gpus,seq,global_batch,microbatch,tensor_parallel,pipeline_parallel,"
        "interleave,expert_parallel,recompute,sequence_parallel,distributed_optimizer,ddp,"
        "iteration_time_s,precision\n"
    )
    rows = [f"{cfg},h100-sxm,4,{S},8,2,1,1,1,1,none,0,1,overlap,0.01,{p}\n" for p in ("fp8", "")]
    table.write_text(head + "".join(rows))
    report = validate(BF16, table)
    assert [r["precision"] for r in report["rows"]] == ["fp8", "bf16"]
    spec = get_model_spec(str(cfg))
    strategy = Strategy(4, 1, 1, 2, 8, distributed_optimizer=True)
    for r, config in zip(report["rows"], (FP8, BF16)):
        want = evaluate_strategy(spec, strategy, H100, seq=S, config=config)
        assert r["predicted_time_s"] == want["iteration_time_s"]
