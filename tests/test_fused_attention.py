"""Fused (FlashAttention-style) core attention, config ``fidelity.attention: fused``: its FLOPs,
HBM bytes, time and memory against hand-computed values on a small GPT; eager stays the default
and changes nothing."""

import numpy as np
import pytest

from phaze.arch.presets import load_preset
from phaze.config import validate_config
from phaze.errors import PhazeError
from phaze.estimate import matmul_cost, vector_cost
from phaze.estimate.model import achievable_hbm_Bps
from phaze.estimate.stage import cycles_per_element
from phaze.fidelity.compute import (
    causal_fraction,
    fused_attention,
    gpu_core,
    layer_works,
    preset_costmodel,
)
from phaze.fidelity.evaluate import gpu_chains, trace_for
from tests.step_cases import TINY_SEQ, tiny_gpt

H100 = load_preset("h100-sxm")
EAGER = validate_config({})
FUSED = validate_config({"fidelity": {"attention": "fused"}})
B, S, H, HEADS = 2, TINY_SEQ, 256, 8  # tiny_gpt: hidden 256, 8 heads of 32


def _block():
    """The tiny GPT's block ops and edges at microbatch B, tp 1, and the H100's core."""
    spec = tiny_gpt()
    trace = trace_for(spec, B, 1, S)
    sig = trace.layers.set_index("layer").loc["block.0", "signature"]
    ops = trace.ops[trace.ops["signature"] == sig]
    edges = trace.edges[trace.edges["signature"] == sig]
    cm = preset_costmodel(H100, EAGER["costmodel"])
    common = {
        "core": gpu_core(H100, cm),
        "cm": cm,
        "n_tc": int(H100["arch"]["n_tc"]),
        "n_vc": int(H100["arch"]["n_vc"]),
        "fuse": True,
        "tp": 1,
        "param_bytes": 0,
    }
    return ops, edges, common


def test_a_causal_kernel_computes_the_blocks_on_or_below_the_diagonal():
    """n = ⌈s/128⌉ blocks per side, n(n+1)/2 of n² computed: s = 256 -> 3/4; 4096 -> 33/64;
    one block (s ≤ 128) -> all of it."""
    assert causal_fraction(256) == 0.75
    assert causal_fraction(4096) == 33 / 64
    assert causal_fraction(128) == causal_fraction(100) == 1.0


def test_fused_attention_flops_bytes_and_time_by_hand():
    """Tiny GPT (B 2, s 256, h 256 = 8 heads × 32), causal: the eager GEMMs QKᵀ and ×V are
    2·B·s²·h FLOPs each; fused computes 3/4 of the blocks (s = 256: 2 × 2 of 128), so forward
    0.75 · 4·B·s²·h and backward 2.5 times that (5 GEMMs for 2: the scores recomputed). Its HBM
    traffic is Q, K, V in and O out, 4·B·s·h·2 bytes (no s × s tensor); its time
    max(0.75 · (GEMM compute + element-wise compute), HBM, issue). The layer swaps the eager
    attention kernels for it. (Mutations tried: the GEMMs' HBM terms kept — the scores written —
    and a backward of 2 GEMMs for 2, no recomputation: each fails here.)"""
    ops, edges, common = _block()
    eager = layer_works(ops, edges, **common)[False]
    fused = layer_works(ops, edges, **common, attention="fused")[False]
    full = 4.0 * B * S**2 * H  # QKᵀ + ×V, unmasked
    assert eager.attention_fwd_flops == pytest.approx(full)
    assert fused.attention_fwd_flops == pytest.approx(0.75 * full)
    assert fused.fwd_flops == pytest.approx(eager.fwd_flops - full + 0.75 * full)
    # eager backward: dV, dP, dQ, dK (4 GEMMs = 2 × the forward's); fused: 5 at the causal share
    assert fused.bwd_flops == pytest.approx(eager.bwd_flops - 2 * full + 2.5 * 0.75 * full)

    fwd = ops[ops["pass"] == "fwd"].sort_values("op").reset_index(drop=True)
    fe = edges[edges["pass"] == "fwd"]
    attention = fwd["attention"].to_numpy(bool)
    term = fused_attention(fwd, fe, attention, common["core"], common["cm"], 132, 132)
    assert term["hbm_bytes"] == 4 * B * S * H * 2
    core, cm = common["core"], common["cm"]
    d = H // HEADS
    gemm = matmul_cost(
        np.array([S, S], float),
        np.array([S, d], float),
        np.array([d, S], float),
        np.array([B * HEADS] * 2, float),
        core,
        cm,
        int(H100["arch"]["n_tc"]),
    )["compute_s"]
    vec = fwd[attention & (fwd["kind"] == "vector").to_numpy()]
    assert len(vec) >= 3 and (vec["elements"] == B * HEADS * S * S).all()  # scale, mask, softmax…
    cpe = cycles_per_element(vec["aten"], cm)
    vec_s = vector_cost(vec["elements"].to_numpy(float), 0.0, cpe, core, cm, 132)["compute_s"]
    compute = 0.75 * (float(np.sum(gemm)) + float(np.sum(vec_s)))
    hbm = 4 * B * S * H * 2 / float(achievable_hbm_Bps(cm))
    assert term["latency_s"] == pytest.approx(max(compute, hbm, cm["op_issue_s"]), rel=1e-12)
    assert fused.attention_core_fwd_s == pytest.approx(term["latency_s"], rel=1e-12)
    # the rest of the layer is the eager layer's
    assert fused.fwd_s - fused.attention_core_fwd_s == pytest.approx(
        eager.fwd_s - eager.attention_core_fwd_s, rel=1e-12
    )
    assert fused.bwd_s - fused.attention_core_bwd_s == pytest.approx(
        eager.bwd_s - eager.attention_core_bwd_s, rel=1e-12
    )
    # the backward kernel: 5 GEMMs at the causal share, the recomputed softmax and its gradient
    assert fused.attention_core_bwd_s > 2.5 * 0.75 * float(np.sum(gemm))
    assert fused.attention_core_fwd_s < eager.attention_core_fwd_s
    assert fused.kernels_fwd < eager.kernels_fwd


def test_fused_attention_saves_only_the_softmax_statistics():
    """Under fused attention a block saves no s × s tensor: the eager block's activations minus
    core attention's, plus one fp32 log-sum-exp per query row and head (4·B·heads·s bytes);
    selective recomputation then re-runs nothing (its backward kernel recomputes the scores) and
    keeps what `none` keeps."""
    spec = tiny_gpt()
    eager = gpu_chains(spec, 1, B, S, H100, EAGER)[False].block
    fused = gpu_chains(spec, 1, B, S, H100, FUSED)[False].block
    assert eager.attention_activation_bytes >= B * HEADS * S * S * 2  # the softmax, at least
    assert fused.attention_activation_bytes == 0.0
    assert fused.activation_bytes == pytest.approx(
        eager.activation_bytes - eager.attention_activation_bytes + 4.0 * B * HEADS * S
    )
    assert fused.recompute_s("selective") == 0.0 < eager.recompute_s("selective")
    assert fused.stash_bytes("selective") == fused.stash_bytes("none")
    assert fused.working_bytes("selective") == 0.0


def test_eager_attention_is_the_default_and_unchanged():
    """Config ``fidelity.attention`` defaults to eager; a layer costed without the setting is
    the eager one, every attention kernel of the trace kept."""
    assert EAGER["fidelity"]["attention"] == "eager"
    ops, edges, common = _block()
    default = layer_works(ops, edges, **common)[False]
    assert default == layer_works(ops, edges, **common, attention="eager")[False]
    assert not default.fused_attention
    spec = tiny_gpt()
    block = gpu_chains(spec, 1, B, S, H100, EAGER)[False].block
    assert not block.fused_attention
    assert block.recompute_s("selective") == block.attention_fwd_s > 0
    with pytest.raises(PhazeError, match="unknown attention 'flash'"):
        layer_works(ops, edges, **common, attention="flash")


def test_a_table_of_runs_with_an_unknown_attention_exits_2_with_one_line(tmp_path, phaze_cli):
    table = tmp_path / "runs.csv"
    table.write_text(
        "model,preset,gpus,seq,global_batch,microbatch,tensor_parallel,pipeline_parallel,"
        "interleave,expert_parallel,recompute,sequence_parallel,distributed_optimizer,ddp,"
        "iteration_time_s,attention\n"
        "llama3-8b,h100-sxm,8,8192,128,1,1,1,1,1,none,0,1,overlap,10.0,flash\n"
    )
    out = phaze_cli("validate", "--reference", str(table))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "attention must be one of eager, fused" in lines[0]


def test_evaluate_attention_fused_prices_what_the_config_setting_prices(tmp_path, phaze_cli):
    """``evaluate --attention fused`` on a tiny GPT-2 config: the iteration time of
    `evaluate_strategy` under config ``fidelity.attention: fused``, below the eager one."""
    import json

    from phaze.fidelity.evaluate import evaluate_strategy
    from phaze.step.strategy import Strategy
    from phaze.trace.models import get_model_spec
    from tests.step_cases import write_tiny_gpt2_config

    cfg = write_tiny_gpt2_config(tmp_path / "config.json", 2, seq=256)
    args = ["--hf-config", str(cfg), "--arch", "h100-sxm", "--devices", "1", "--global-batch"]
    args += ["2", "--tp", "1", "--pp", "1", "--microbatch", "2", "--attention", "fused"]
    out = phaze_cli("evaluate", *args)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["iteration_time_s"]
    spec = get_model_spec(str(cfg))
    strategy = Strategy(1, 1, 1, 2, 2)
    fused = evaluate_strategy(spec, strategy, H100, seq=256, config=FUSED, name="h100-sxm")
    eager = evaluate_strategy(spec, strategy, H100, seq=256, config=EAGER, name="h100-sxm")
    assert got == pytest.approx(fused["iteration_time_s"], rel=1e-9)
    assert fused["iteration_time_s"] < eager["iteration_time_s"]


def test_optimize_attention_fused_prints_the_flash_backend(tmp_path, phaze_cli):
    """``optimize --attention fused --json``: Megatron-LM's ``--attention-backend flash`` among
    the printed arguments; eager prints no attention flag."""
    import json

    from tests.step_cases import write_tiny_gpt2_config

    cfg = write_tiny_gpt2_config(tmp_path / "config.json", 2, seq=256)
    args = ["--hf-config", str(cfg), "--arch", "h100-sxm", "--devices", "1", "--global-batch"]
    args += ["2", "--tp", "1", "--microbatch", "1", "--json"]
    fused = json.loads(phaze_cli("optimize", *args, "--attention", "fused").stdout)
    assert fused["megatron_args"][-2:] == ["--attention-backend", "flash"]
    eager = json.loads(phaze_cli("optimize", *args).stdout)
    assert not any("attention-backend" in a for a in eager["megatron_args"])
