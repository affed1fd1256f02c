"""`evaluate` / `optimize` of a model with dense first blocks (DeepSeek-V3): the step model's chain
prices the dense blocks with the embedding as its first layer, its blocks are the MoE blocks,
and `optimize`'s Megatron arguments place the dense blocks in the first pipeline segment.
DeepSeek-V3 is traced at a short sequence and expert-parallel size 64 (4 experts per rank)."""

from __future__ import annotations

import dataclasses

import pytest

from phaze.arch.presets import load_preset
from phaze.config import validate_config
from phaze.fidelity.evaluate import evaluate_strategy, gpu_chains, trace_for
from phaze.fidelity.optimize_cli import _megatron_args
from phaze.place.chains import fold_dense_blocks
from phaze.step.layers import LayerCost
from phaze.step.strategy import Strategy
from phaze.trace.models import get_model_spec

SEQ = 128
CFG = validate_config({})
H100 = load_preset("h100-sxm")


def test_folding_adds_the_dense_blocks_to_the_first_layer():
    """Times, parameters, activations, FLOPs and collectives add up n times; the input (what
    full recomputation would keep) and the tied parameters stay the first layer's."""
    first = LayerCost(1.0, 2.0, 10.0, 100.0, (("all_reduce", 5.0),), (), 0.0, 0.0, 7.0, 3.0, 40.0)
    dense = LayerCost(
        0.5,
        1.0,
        4.0,
        50.0,
        (("all_reduce", 2.0),),
        (("all_reduce", 1.0),),
        0.1,
        20.0,
        9.0,
        0.0,
        8.0,
        2.0,
    )
    got = fold_dense_blocks(first, dense, 3)
    assert (got.fwd_s, got.bwd_s, got.params, got.activation_bytes) == (2.5, 5.0, 22.0, 250.0)
    assert got.fwd_collectives == (("all_reduce", 5.0),) + (("all_reduce", 2.0),) * 3
    assert got.bwd_collectives == (("all_reduce", 1.0),) * 3
    assert (got.attention_fwd_s, got.attention_activation_bytes) == pytest.approx((0.3, 60.0))
    assert (got.input_bytes, got.tied_params) == (7.0, 3.0)
    assert (got.fwd_matmul_flops, got.attention_matmul_flops) == (64.0, 6.0)
    assert got.mean_fwd_matmul_flops is None
    assert fold_dense_blocks(first, dense, 0) == first


def test_deepseek_chain_prices_dense_blocks_first_and_moe_blocks_as_the_chain():
    spec = get_model_spec("deepseek-v3")
    tp, ep = 2, 64
    chain = gpu_chains(spec, tp, 1, SEQ, H100, CFG, ep)[True]
    layers = trace_for(spec, 1, tp, SEQ, ep).layers.set_index("layer")
    assert chain.blocks == 58 == spec.repeated_blocks
    assert chain.experts == 256 and chain.ep == ep
    # the first layer: embedding + 3 dense blocks; the block: the MoE block (block.3 on)
    emb, dense, moe = (layers.loc[n] for n in ("embedding", "block.0", "block.3"))
    assert chain.first.fwd_matmul_flops == emb["fwd_matmul_flops"] + 3 * dense["fwd_matmul_flops"]
    assert chain.block.fwd_matmul_flops == moe["fwd_matmul_flops"]
    assert chain.first.params == (emb["param_bytes"] + 3 * dense["param_bytes"]) / 2
    assert chain.block.expert_params == moe["expert_param_bytes"] / 2 > 0
    assert chain.first.expert_params == 0
    # the MoE block's kernels are priced (its ops are found by signature, not by layer name:
    # by name, block.3 has none and would cost nothing)
    assert chain.block.fwd_s > 0 and chain.block.bwd_s > chain.block.fwd_s
    assert chain.meta["block_kernel_bounds_s"]


def test_deepseek_evaluates_and_megatron_args_put_the_dense_blocks_first():
    spec = get_model_spec("deepseek-v3")
    s = Strategy(
        devices=256,
        tp=2,
        pp=2,
        microbatch=1,
        global_batch=128,
        sequence_parallel=True,
        distributed_optimizer=True,
        ep=64,
        stages=(28, 30),
    )
    result = evaluate_strategy(spec, s, H100, seq=SEQ, config=CFG)
    assert result["iteration_time_s"] > 0 and result["strategy"]["stages"] == [28, 30]
    args = _megatron_args(s, spec)
    assert "--moe-layer-freq ([0]*3+[1]*58)" in args
    assert "--pipeline-model-parallel-layout Et*31|t*30L" in args
    one = dataclasses.replace(s, pp=1, stages=None)
    assert not any(
        a.startswith("--pipeline-model-parallel-layout") for a in _megatron_args(one, spec)
    )


def test_placement_chains_fold_the_dense_blocks_as_evaluate_does():
    """The placement search's chains (`ChainTables`, from schedules by signature): the first
    layer is the embedding's schedule plus 3 times the dense block's, the blocks the 58 MoE
    blocks; a dense block after a MoE block is not a chain and is refused."""
    from phaze.errors import PhazeError
    from phaze.place.chains import ChainTables

    spec = get_model_spec("deepseek-v3")
    trace = trace_for(spec, 1, 2, SEQ, 64)
    layers = trace.layers
    seconds = {sig: float(i + 1) for i, sig in enumerate(layers["signature"].unique())}
    lookup = {
        ("a", sig, p): t * (1 if p == "fwd" else 2)
        for sig, t in seconds.items()
        for p in ("fwd", "bwd")
    }
    tables = ChainTables(layers, trace.ops, 2, 1, 2.0, "ds", 64)
    chain = tables.chains("a", lookup, None)[True]
    rows = layers.set_index("layer")
    emb, dense, moe = (
        seconds[rows.loc[n, "signature"]] for n in ("embedding", "block.0", "block.3")
    )
    assert chain.blocks == 58 and chain.block.fwd_s == moe
    assert chain.first.fwd_s == emb + 3 * dense and chain.first.bwd_s == 2 * (emb + 3 * dense)
    assert (
        chain.first.params
        == (rows.loc["embedding", "param_bytes"] + 3 * rows.loc["block.0", "param_bytes"]) / 2
    )
    assert tables.skeleton(True).first.params == chain.first.params
    shuffled = layers.copy()
    shuffled.iloc[[1, 4]] = shuffled.iloc[[4, 1]].to_numpy()  # a MoE block first, then dense
    with pytest.raises(PhazeError, match="the blocks differ"):
        ChainTables(shuffled, trace.ops, 2, 1, 2.0, "ds", 64)


def test_global_search_bounds_add_the_dense_blocks_to_the_first_layer(tmp_path):
    """The global search's per-layer bounds (`space_bounds.Trace.space_chain`): the first layer's
    lower bound and window are the embedding's plus first_k_dense_replace times the dense
    block's. A tiny DeepSeek-V3 config (2 dense blocks, 8 experts in 2 groups) keeps it fast.
    (Mutation tried: without the dense blocks in the first layer's bound this test fails.)"""
    import json

    import numpy as np

    from phaze.cli import main
    from phaze.search.space_bounds import Trace

    raw = {
        **{k: v for k, v in get_model_spec("deepseek-v3").config_kwargs.items()},
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 2,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
        "vocab_size": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    out = tmp_path / "trace"
    argv = ["trace", "--model", str(tmp_path / "config.json"), "--microbatch", "1", "--tp", "2"]
    assert main([*argv, "--seq", "16", "--out", str(out)]) == 0
    trace = Trace(str(out), 2, 1, 2.0)
    assert trace.tables.dense == 2 and trace.tables.blocks == 3
    sigs = trace.layers.set_index("layer")["signature"]
    value = {
        sigs["embedding"]: 1.0,
        sigs["block.0"]: 10.0,
        sigs["block.2"]: 100.0,
        sigs["head"]: 1000.0,
    }
    bounds = {
        (s, p): (np.array([v]), np.array([2 * v])) for s, v in value.items() for p in ("fwd", "bwd")
    }
    chain = trace.space_chain(bounds, {}, 1)
    assert chain.lower["first_fwd"][0] == 1.0 + 2 * 10.0 and chain.window["first_bwd"][0] == 42.0
    assert chain.lower["block_fwd"][0] == 100.0 and chain.lower["last_fwd"][0] == 1000.0
