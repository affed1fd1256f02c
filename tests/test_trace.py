"""Trace stage: registry, FLOP identities, tensor-parallel slicing, memory, tables, CLI.

Each (model, microbatch, t, seq) is traced once per session (``_trace`` is cached); tracing on
the meta device is independent of tensor sizes, so the paper's real sequence lengths are used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phaze.cli import main
from phaze.errors import PhazeError
from phaze.io import read_table
from phaze.trace.models import get_model_spec, list_models

DATA = Path(__file__).parent / "data"
PAPER = [
    "bert-large",
    "gpt2-xl",
    "opt-350m",
    "llama2-7b",
    "megatron-bert",
    "megatron-gpt-2.5b",
    "megatron-gpt-8.3b",
    "gpt3-175b",
]
# docs/design.md's workload table: blocks, hidden, heads, FFN, vocab, seq, valid t
DESIGN_TABLE = {
    "bert-large": (24, 1024, 16, 4096, 30522, 512, (1, 2, 4, 8)),
    "gpt2-xl": (48, 1600, 25, 6400, 50257, 1024, (1,)),
    "opt-350m": (24, 1024, 16, 4096, 50272, 2048, (1, 2, 4, 8)),
    "llama2-7b": (32, 4096, 32, 11008, 32000, 4096, (1, 2, 4, 8)),
    "megatron-bert": (24, 1024, 16, 4096, 30522, 512, (1, 2, 4, 8)),
    "megatron-gpt-2.5b": (54, 1920, 20, 7680, 50257, 1024, (1, 2, 4)),
    "megatron-gpt-8.3b": (72, 3072, 24, 12288, 50257, 1024, (1, 2, 4, 8)),
    "gpt3-175b": (96, 12288, 96, 49152, 50257, 2048, (1, 2, 4, 8)),
}
TP_CASES = [(m, t) for m in PAPER for t in DESIGN_TABLE[m][6] if t > 1]
VIEW_OPS = {
    "aten.view.default",
    "aten.t.default",
    "aten.transpose.int",
    "aten.expand.default",
    "aten._unsafe_view.default",
    "aten.permute.default",
    "aten.unsqueeze.default",
    "aten.slice.Tensor",
    "aten.split.Tensor",
    "aten.detach.default",
    "aten.alias.default",
}


@functools.cache
def _trace(model: str, microbatch: int = 1, tp: int = 1, seq: int | None = None, fuse: bool = True):
    from phaze.trace.tracer import trace_model

    return trace_model(get_model_spec(model), microbatch, tp, seq=seq, fuse=fuse)


def _block(trace, pass_=None, kind=None):
    ops = trace.ops[trace.ops["layer"] == "block.0"]
    if pass_:
        ops = ops[ops["pass"] == pass_]
    if kind:
        ops = ops[ops["kind"] == kind]
    return ops


def _block_row(trace):
    return trace.layers[trace.layers["layer"] == "block.0"].iloc[0]


def _weight_matrix_params(spec) -> int:
    """P of the FLOP identity: parameters of the block's weight matrices (no biases/norms)."""
    h, f = spec.hidden, spec.ffn
    return 4 * h * h + (3 if spec.family == "llama" else 2) * h * f


def _block_params_per_rank(spec, t: int) -> int:
    """Closed form of one rank's block parameters. GPT-2 / BERT / OPT: QKV + out + FC1 + FC2
    with biases and two LayerNorms (= 12h^2 + 13h when f = 4h); Llama: no biases, SwiGLU,
    two RMSNorms. Column-parallel weights and biases /t, row-parallel biases and norms whole."""
    h, f = spec.hidden, spec.ffn
    if spec.family == "llama":
        return (4 * h * h + 3 * h * f) // t + 2 * h
    return (4 * h * h + 2 * h * f) // t + (3 * h + f) // t + 2 * h + 4 * h


# --- registry -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAPER)
def test_registry_matches_design_table(name):
    spec = get_model_spec(name)
    blocks, hidden, heads, ffn, vocab, seq, valid = DESIGN_TABLE[name]
    assert (spec.num_blocks, spec.hidden, spec.heads, spec.ffn, spec.vocab, spec.seq) == (
        blocks,
        hidden,
        heads,
        ffn,
        vocab,
        seq,
    )
    assert spec.valid_tp == valid
    config = spec.hf_config()
    assert config.num_hidden_layers == blocks and config.hidden_size == hidden
    assert config.num_attention_heads == heads and config.vocab_size == vocab


def test_registry_lists_the_paper_workloads():
    # then today's GQA and MoE workloads (tests/test_trace_moe.py), fine-grained experts and
    # latent attention (tests/test_trace_latent.py)
    today = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"]
    latent = ["qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"]
    assert list_models() == PAPER + today + latent
    assert get_model_spec("opt-350m").hf_config().word_embed_proj_dim == 512


# --- FLOPs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAPER)
def test_forward_matmul_flops_equal_flop_counter_mode(name):
    from torch.utils.flop_counter import FlopCounterMode

    from phaze.trace.capture import build_model, model_inputs

    spec = get_model_spec(name)
    model, blocks = build_model(spec, 1, 1, spec.seq)
    path = next(n for n, m in model.named_modules() if m is blocks[0])
    with FlopCounterMode(display=False) as counter:
        model(**model_inputs(spec, 1, spec.seq))
    expected = sum(counter.get_flop_counts()[f"{type(model).__name__}.{path}"].values())
    got = _block(_trace(name), "fwd", "matmul")["flops"].sum()
    assert got == expected


@pytest.mark.parametrize("name", PAPER)
@pytest.mark.parametrize("microbatch", [1, 2])
def test_block_flops_closed_form(name, microbatch):
    spec = get_model_spec(name)
    trace = _trace(name, microbatch)
    b, s, h = microbatch, spec.seq, spec.hidden
    closed = 2 * _weight_matrix_params(spec) * b * s + 4 * b * s * s * h
    fwd = _block(trace, "fwd", "matmul")["flops"].sum()
    bwd = _block(trace, "bwd", "matmul")["flops"].sum()
    assert abs(fwd - closed) <= 0.005 * closed
    assert bwd == 2 * fwd
    row = _block_row(trace)
    assert row["fwd_matmul_flops"] == fwd and row["bwd_matmul_flops"] == bwd


# --- tensor-parallel slicing ----------------------------------------------------------------


@pytest.mark.parametrize("name,t", TP_CASES)
def test_tensor_parallel_slicing(name, t):
    spec = get_model_spec(name)
    base, sliced = _trace(name, 1, 1), _trace(name, 1, t)
    for pass_ in ("fwd", "bwd"):
        full = _block(base, pass_, "matmul")["flops"].sum()
        assert _block(sliced, pass_, "matmul")["flops"].sum() * t == full
    # The matmuls read 1/t of the weight matrices (and of the column-parallel biases, which
    # addmm reads); row-parallel biases are added after the all-reduce, outside the matmul.
    h, f = spec.hidden, spec.ffn
    col_bias = 0 if spec.family == "llama" else 3 * h + f
    row_bias = 0 if spec.family == "llama" else 2 * h
    w = _weight_matrix_params(spec)
    assert _block(base, "fwd", "matmul")["weight_bytes"].sum() == 2 * (w + col_bias + row_bias)
    assert _block(sliced, "fwd", "matmul")["weight_bytes"].sum() == 2 * (w + col_bias) // t
    assert _block_row(sliced)["param_bytes"] == 2 * _block_params_per_rank(spec, t)
    assert bool(_block_row(sliced)["tensor_parallel"])
    # 2 all-reduces forward (after attention-out and FC2) + 2 backward (QKV and FC1 inputs)
    bsh_bytes = 1 * spec.seq * spec.hidden * 2
    for pass_ in ("fwd", "bwd"):
        coll = _block(sliced, pass_, "collective")
        assert len(coll) == 2
        assert (coll["collective"] == "all_reduce").all() and (coll["group_size"] == t).all()
        assert (coll["bytes_in"] == bsh_bytes).all() and (coll["bytes_out"] == bsh_bytes).all()
        assert (coll["core"] == "vc").all()
    assert _block(base, kind="collective").empty
    # the forward all-reduce directly consumes a row-parallel matmul output
    fwd = _block(sliced, "fwd")
    edges = sliced.edges[(sliced.edges["layer"] == "block.0") & (sliced.edges["pass"] == "fwd")]
    for op in _block(sliced, "fwd", "collective")["op"]:
        producers = edges[edges["dst"] == op]["src"]
        assert list(fwd.set_index("op").loc[producers, "kind"]) == ["matmul"]


@pytest.mark.parametrize(
    "name,t", [("gpt3-175b", 8), ("llama2-7b", 4), ("gpt2-xl", 1), ("megatron-gpt-2.5b", 4)]
)
def test_vocab_parallel_embedding_and_head(name, t):
    """Word embedding and LM head hold ceil(V/t) rows per rank; one forward all-reduce of the
    embedding output, one backward all-reduce of the head's input gradient."""
    spec = get_model_spec(name)
    trace = _trace(name, 2, t)
    b, s, h, rows = 2, spec.seq, spec.hidden, -(-spec.vocab // t)
    ops, layers = trace.ops, trace.layers.set_index("layer")
    head_mm = ops[(ops["layer"] == "head") & (ops["kind"] == "matmul")]
    assert head_mm[head_mm["pass"] == "fwd"]["flops"].sum() == 2 * b * s * h * rows
    assert head_mm[head_mm["pass"] == "bwd"]["flops"].sum() == 4 * b * s * h * rows
    positions = spec.seq * h if spec.family == "gpt2" else 0  # learned positions, replicated
    assert layers.loc["embedding", "param_bytes"] == 2 * (rows * h + positions)
    head_weight = layers.loc["head", "tied_param_bytes" if spec.family == "gpt2" else "param_bytes"]
    assert head_weight >= 2 * rows * h
    coll = ops[ops["kind"] == "collective"]
    outside = coll[coll["layer"] != "block.0"]
    if t == 1:
        assert coll.empty
    else:
        assert sorted(zip(outside["layer"], outside["pass"])) == [
            ("embedding", "fwd"),
            ("head", "bwd"),
        ]
        assert (outside["bytes_in"] == b * s * h * 2).all()
        assert layers["tensor_parallel"].all()


def test_bad_tensor_parallel_width_says_why():
    with pytest.raises(PhazeError, match="25 attention heads"):
        get_model_spec("gpt2-xl").check_tp(2)
    with pytest.raises(PhazeError, match="divide"):
        get_model_spec("megatron-gpt-2.5b").check_tp(8)  # 20 heads
    with pytest.raises(PhazeError, match="not supported"):
        get_model_spec("opt-350m").check_tp(3)


# --- memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAPER)
def test_block_param_bytes_closed_form(name):
    spec = get_model_spec(name)
    assert _block_row(_trace(name))["param_bytes"] == 2 * _block_params_per_rank(spec, 1)


@pytest.mark.parametrize(
    "name", ["gpt2-xl", "megatron-gpt-2.5b", "gpt3-175b", "bert-large", "megatron-bert"]
)
def test_block_activation_bytes_match_korthikanti(name):
    """Saved-for-backward bytes of a GPT/BERT block with dropout = Korthikanti et al. (2022)
    s*b*h*(10 + 24/t + 5*a*s/(h*t)) (16-bit activations, 1-byte dropout masks, no sequence
    parallelism), plus the two LayerNorms' mean/rstd (4*s*b 16-bit values), which it omits."""
    spec = get_model_spec(name)
    s, h, a = spec.seq, spec.hidden, spec.heads
    for t in spec.valid_tp:
        for b in (1, 2) if t == 1 else (1,):
            expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + 4 * s * b * 2
            row = _block_row(_trace(name, b, t))
            assert row["activation_bytes"] == pytest.approx(expected, abs=0.5)


@pytest.mark.parametrize(
    "name", ["gpt2-xl", "megatron-gpt-2.5b", "gpt3-175b", "bert-large", "megatron-bert"]
)
def test_activation_bytes_per_recompute_mode_and_sequence_parallelism_match_korthikanti(name):
    """What the step model keeps per block (phaze/step/layers.py), from the trace's saved
    tensors, against Korthikanti et al. (2022) §4 for GPT/BERT blocks, per rank: without
    recomputation s·b·h·(10 + 24/t + 5as/(ht)), selective s·b·h·(10 + 24/t), full 2·s·b·h
    (the block input); with sequence parallelism the 10·s·b·h outside the tensor-parallel region
    and the input are split by t (their Eqs. (4)–(6): 34·s·b·h/t selective). The trace adds the
    LayerNorms' mean/rstd (4·s·b values, outside the region)."""
    spec = get_model_spec(name)
    s, h, a = spec.seq, spec.hidden, spec.heads
    for t in spec.valid_tp:
        row = _block_row(_trace(name, 1, t))
        sbh, stats = s * h, 8 * s
        core = 5 * a * s * s / t
        assert row["attention_activation_bytes"] == core
        none, selective = row["activation_bytes"], row["activation_bytes"] - core
        assert none == sbh * (10 + 24 / t) + core + stats
        assert selective == sbh * (10 + 24 / t) + stats
        assert row["stash_recompute_bytes"] == 2 * sbh  # full recomputation keeps the input
        if t == 1:
            assert row["replicated_activation_bytes"] == 0  # no region without tensor parallelism
            continue
        outside = row["replicated_activation_bytes"]
        assert outside == 10 * sbh + stats
        # sequence parallelism: what lies outside the region, and the input, split by t
        assert none - outside * (1 - 1 / t) == sbh * 34 / t + core + stats / t
        assert selective - outside * (1 - 1 / t) == sbh * 34 / t + stats / t
        assert row["stash_recompute_bytes"] / t == 2 * sbh / t


@pytest.mark.parametrize("name,t", [("gpt2-xl", 1), ("bert-large", 4), ("opt-350m", 2)])
def test_core_attention_and_replicated_ops_are_found_by_data_flow(name, t):
    """Core attention: QKᵀ, scale, mask, softmax, dropout, ×V (forward only). Replicated ops
    (t > 1): outside the tensor-parallel region, each producing the full activation (b·s·h
    elements, or b·s for a norm's statistics); every matmul of a block is inside."""
    spec = get_model_spec(name)
    fwd = _block(_trace(name, 1, t), "fwd")
    att = fwd[fwd["attention"]]
    names = [x.removeprefix("aten.").split(".")[0] for x in att["aten"]]
    assert names[0] == names[-1] == "bmm" and "_softmax" in names
    assert (att["kind"] != "collective").all() and len(att) < len(fwd) / 2
    assert not _block(_trace(name, 1, t), "bwd")["attention"].any()
    rep = fwd[fwd["replicated"]]
    if t == 1:
        assert rep.empty
        return
    assert (rep["kind"] != "matmul").all() and len(rep) > 0
    first = rep["out_shapes"].str.split(";").str[0].str.split("x")
    numel = first.map(lambda dims: int(np.prod([int(x) for x in dims])))
    assert set(numel) <= {spec.seq * spec.hidden, spec.seq}  # b = 1
    assert not (fwd["attention"] & fwd["replicated"]).any()


def test_a_replicated_matmul_before_the_blocks_stays_outside_the_region():
    """OPT-350m projects its 512-wide embedding to 1,024 with a replicated matmul before the
    blocks: the block input stays outside the tensor-parallel region, so the block keeps
    10·s·b·h + 8·s·b bytes outside it, as a GPT block (the region is found from sliced weights,
    not from matmuls)."""
    spec = get_model_spec("opt-350m")
    for t in (2, 4):
        row = _block_row(_trace("opt-350m", 1, t))
        assert row["replicated_activation_bytes"] == 10 * spec.seq * spec.hidden + 8 * spec.seq


def test_core_attention_is_not_found_by_shape_alone():
    """A block whose per-rank width equals the sequence length (h/t = s): the attention output
    (b, s, h/t) looks s×s but is not core attention, and the counts stay exact."""
    from phaze.trace.models import ModelSpec
    from phaze.trace.tracer import trace_model

    h, a, s = 1024, 16, 512
    kw = {
        "n_layer": 1,
        "n_embd": h,
        "n_head": a,
        "n_inner": 4 * h,
        "vocab_size": 1024,
        "n_positions": s,
        "activation_function": "gelu_pytorch_tanh",
    }
    spec = ModelSpec("g", "gpt2", 1, h, a, 4 * h, 1024, s, a, kw)
    for t in (2, 8):  # h/t = s, then the FFN width per rank 4h/t = s
        row = trace_model(spec, 1, t, verify=False).layers.set_index("layer").loc["block.0"]
        assert row["attention_activation_bytes"] == 5 * a * s * s / t


@pytest.mark.parametrize("name", PAPER)
def test_layer_boundaries(name):
    spec = get_model_spec(name)
    layers = _trace(name).layers
    bsh = spec.seq * spec.hidden * 2
    assert list(layers["layer"]) == ["embedding"] + [
        f"block.{i}" for i in range(spec.num_blocks)
    ] + ["head"]
    assert list(layers["index"]) == list(range(spec.num_blocks + 2))
    blocks = layers[layers["kind"] == "block"]
    assert (blocks["boundary_bytes"] == bsh).all() and (
        blocks["stash_recompute_bytes"] == bsh
    ).all()
    assert blocks["signature"].nunique() == 1
    assert layers.iloc[0]["boundary_bytes"] == bsh and layers.iloc[-1]["boundary_bytes"] == 0
    # embedding and head hold the rest of the parameters (tied embeddings counted once)
    assert layers["param_bytes"].min() > 0


def test_tied_embedding_is_counted_once():
    spec = get_model_spec("gpt2-xl")
    layers = _trace("gpt2-xl").layers
    h, v = spec.hidden, spec.vocab
    total = layers["param_bytes"].sum() // 2
    expected = (v * h + 1024 * h) + spec.num_blocks * _block_params_per_rank(spec, 1) + 2 * h
    assert total == expected  # 1.56e9: wte + wpe + blocks + final LayerNorm, no second vocab matrix
    tied = layers.set_index("layer")["tied_param_bytes"]
    assert tied["head"] == 2 * v * h and tied.drop("head").eq(0).all()
    assert (_trace("llama2-7b").layers["tied_param_bytes"] == 0).all()  # untied


# --- graph and tables -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,t", [("gpt2-xl", 1), ("llama2-7b", 4), ("bert-large", 2), ("opt-350m", 8)]
)
def test_graph_integrity(name, t):
    trace = _trace(name, 1, t)
    ops, edges = trace.ops, trace.edges
    assert set(ops["kind"]) <= {"matmul", "vector", "collective", "nop"}
    assert not set(ops["aten"]) & VIEW_OPS, "views must be collapsed"
    assert set(ops["layer"]) == {"embedding", "block.0", "head"}
    for (sig, pass_), group in ops.groupby(["signature", "pass"]):
        assert list(group["op"]) == list(range(len(group)))
        e = edges[(edges["signature"] == sig) & (edges["pass"] == pass_)]
        assert (e["src"] < e["dst"]).all()  # execution order is a topological order
        assert e["dst"].isin(group["op"]).all() and (e["bytes"] > 0).all()
        assert not e.duplicated(["src", "dst"]).any()
        fused = group[group["fused_into"] >= 0]
        by_id = group.set_index("op")
        assert (by_id.loc[fused["fused_into"], "core"] == "fused").all()
        for _, r in fused.iterrows():  # a fused op is its matmul's only consumer
            assert list(e[e["src"] == r["fused_into"]]["dst"]) == [r["op"]]
    mm = ops[ops["kind"] == "matmul"]
    assert (mm["m"] * mm["n"] * mm["k"] * mm["batch"] * 2 == mm["flops"]).all()
    assert (ops.loc[ops["kind"] != "matmul", "m"] == 0).all()
    assert ops["pass"].isin(["fwd", "bwd"]).all()


def test_fusion_is_a_column_not_a_deletion():
    fused, plain = _trace("bert-large", fuse=True), _trace("bert-large", fuse=False)
    cols = ["layer", "pass", "op", "aten", "flops", "bytes_in"]
    pd.testing.assert_frame_equal(fused.ops[cols], plain.ops[cols])
    assert (plain.ops["fused_into"] == -1).all() and "fused" not in set(plain.ops["core"])
    assert (fused.ops["fused_into"] >= 0).sum() > 0


def test_signatures_distinguish_shapes_and_are_deterministic():
    sig = lambda tr: _block_row(tr)["signature"]
    a = _trace("opt-350m", 1, 1)
    assert sig(a) != sig(_trace("opt-350m", 1, 2)) != sig(_trace("opt-350m", 2, 1))
    assert sig(a) != sig(_trace("opt-350m", 1, 1, seq=1024))
    assert sig(a) != sig(_trace("bert-large"))
    from phaze.trace.tracer import trace_model

    again = trace_model(get_model_spec("opt-350m"), 1, 1)
    pd.testing.assert_frame_equal(again.ops, a.ops)
    pd.testing.assert_frame_equal(again.layers, a.layers)


def test_two_block_check_rejects_a_non_representative_block(monkeypatch):
    """The 2-block verification must fail when block.1 differs from the traced block."""
    from phaze.trace import tracer

    real = tracer.capture

    def skewed(spec, num_blocks, *args):
        cap = real(spec, num_blocks, *args)
        if num_blocks == 2:
            cap.activation_bytes["block.1"] += 2
        return cap

    monkeypatch.setattr(tracer, "capture", skewed)
    with pytest.raises(PhazeError, match="not identical"):
        tracer.trace_model(get_model_spec("opt-350m"), 1, 1, seq=64)


# --- Hugging Face config.json by path --------------------------------------------------------


def test_config_json_by_path(tmp_path):
    from phaze.trace.tracer import trace_model

    spec = get_model_spec(str(DATA / "tiny-gpt2" / "config.json"))
    assert (spec.name, spec.num_blocks, spec.hidden, spec.heads, spec.valid_tp) == (
        "tiny-gpt2",
        3,
        64,
        4,
        (1, 2, 4),
    )
    trace = trace_model(spec, 2, 2, seq=32)
    assert len(trace.layers) == 5
    assert _block_row(trace)["param_bytes"] == 2 * _block_params_per_rank(spec, 2)
    # an architecture without tensor-parallel rules traces at t = 1 only
    neox = get_model_spec(str(DATA / "tiny-neox"))
    assert neox.valid_tp == (1,)
    assert len(trace_model(neox, 1, 1, seq=16).layers) == 5
    with pytest.raises(PhazeError, match="gpt_neox"):
        neox.check_tp(2)


def test_exported_registry_bert_config_traces_by_path_as_by_name(tmp_path):
    """bert-large's own config, exported: the path builds BertForMaskedLM, as the name does."""
    from phaze.trace.tracer import trace_model

    (tmp_path / "bert-large").mkdir()  # the directory names the model
    get_model_spec("bert-large").hf_config().to_json_file(tmp_path / "bert-large" / "config.json")
    spec = get_model_spec(str(tmp_path / "bert-large" / "config.json"))
    assert spec.model_class().__name__ == "BertForMaskedLM" and not spec.causal
    by_path, by_name = trace_model(spec, 1, 2, seq=64), _trace("bert-large", 1, 2, seq=64)
    for table in ("ops", "edges", "layers"):
        pd.testing.assert_frame_equal(getattr(by_path, table), getattr(by_name, table))


@pytest.mark.parametrize("name", PAPER)
def test_exported_registry_config_builds_the_registry_class(tmp_path, name):
    get_model_spec(name).hf_config().to_json_file(tmp_path / "config.json")
    by_path, by_name = get_model_spec(str(tmp_path / "config.json")), get_model_spec(name)
    assert by_path.model_class() is by_name.model_class()
    assert by_path.causal == by_name.causal == (name not in ("bert-large", "megatron-bert"))


@pytest.mark.parametrize(
    "extra,cls",
    [
        ({"architectures": ["BertLMHeadModel"], "is_decoder": True}, "BertLMHeadModel"),
        ({"is_decoder": True}, "BertLMHeadModel"),
        ({"architectures": ["BertForSequenceClassification"]}, "BertForMaskedLM"),
        ({"architectures": ["BertForMaskedLM"]}, "BertForMaskedLM"),
        ({"architectures": ["BertLMHeadModel"]}, "is_decoder is false"),
        ({"architectures": ["BertForMaskedLM"], "is_decoder": True}, "is_decoder is true"),
    ],
)
def test_path_model_class_follows_is_decoder_and_rejects_contradictions(tmp_path, extra, cls):
    raw = get_model_spec("bert-large").hf_config().to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**raw, **extra}))
    spec = get_model_spec(str(tmp_path))
    if cls.startswith("is_decoder"):
        with pytest.raises(PhazeError, match=cls):
            spec.model_class()
        return
    assert spec.model_class().__name__ == cls
    assert spec.causal == (cls == "BertLMHeadModel")


def test_decoder_bert_config_traces_by_path(tmp_path):
    from phaze.trace.tracer import trace_model

    raw = get_model_spec("bert-large").hf_config().to_dict()
    raw.update(architectures=["BertLMHeadModel"], is_decoder=True, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    trace = trace_model(get_model_spec(str(tmp_path)), 1, 1, seq=32)
    assert len(trace.layers) == 4  # embedding, 2 blocks, head


# --- CLI ------------------------------------------------------------------------------------


def test_cli_writes_the_three_tables(tmp_path, trace_cli):
    out = trace_cli(
        tmp_path / "trace",
        "opt-350m",
        tp=2,
        seq=64,
        config=DATA.parents[1] / "config" / "test.yaml",
    )
    ops, edges, layers = (read_table(out / f"{n}.parquet", n) for n in ("ops", "edges", "layers"))
    assert len(layers) == 26 and set(ops["signature"]) <= set(layers["signature"])
    assert set(edges["signature"]) <= set(ops["signature"])
    meta = json.loads((out / "trace.json").read_text())
    assert (meta["model"], meta["seq_len"], meta["tp"]) == ("opt-350m", 64, 2)
    assert meta["transformers"] == "5.24.0"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["--model", "gpt2-xl", "--tp", "2"], "25 attention heads"),
        (["--model", "tests/data/missing/config.json"], "not found"),
        (["--model", "opt-350m", "--microbatch", "0"], "--microbatch"),
        (["--model", "opt-350m", "--tp", "3"], "not supported"),
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, needle, tmp_path, capsys):
    argv = ["trace", "--microbatch", "1", *argv, "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("phaze trace: error:") and needle in err[0]
    assert not (tmp_path / "x").exists()


def test_cli_rejects_a_file_that_is_not_a_hf_config(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 8}')
    assert (
        main(["trace", "--model", str(bad), "--microbatch", "1", "--out", str(tmp_path / "x")]) == 2
    )
    assert "no model_type" in capsys.readouterr().err


@pytest.mark.parametrize("name,t", [("gpt2-xl", 1), ("llama2-7b", 2)])
def test_backward_ops_land_in_their_forward_layer(name, t):
    """Backward attribution by autograd sequence numbers puts each gradient op in the layer whose
    forward created it: loss gradients in the head, the embedding gradient in the embedding."""
    ops = _trace(name, 1, t).ops
    bwd = ops[ops["pass"] == "bwd"].groupby("layer")["aten"].apply(list)
    assert "aten.nll_loss_backward.default" in bwd["head"]
    assert "aten._log_softmax_backward_data.default" in bwd["head"]
    assert "aten.embedding_dense_backward.default" in bwd["embedding"]
    assert "aten._softmax_backward_data.default" in bwd["block.0"]
    norm_bwd = {"gpt2": "aten.native_layer_norm_backward.default", "llama": "aten.rsqrt.default"}
    assert norm_bwd[get_model_spec(name).family] in set(ops[ops["layer"] == "block.0"]["aten"])
    for layer in ("embedding", "head"):
        assert not any(a.startswith("aten._softmax_backward") for a in bwd[layer])
    # every backward matmul of the block is a gradient of a forward matmul of the block
    fwd_mm = _block(_trace(name, 1, t), "fwd", "matmul")
    bwd_mm = _block(_trace(name, 1, t), "bwd", "matmul")
    assert len(bwd_mm) == 2 * len(fwd_mm)


# --- property: the identities hold for any block shape, not only the paper's ----------------


def _random_spec(family, heads, head_dim, ffn_mult, kv_div=1):
    from phaze.trace.models import ModelSpec

    h, f = heads * head_dim, heads * head_dim * ffn_mult
    if family == "gpt2":
        kwargs = {
            "n_layer": 3,
            "n_embd": h,
            "n_head": heads,
            "n_inner": f,
            "vocab_size": 97,
            "n_positions": 64,
            "activation_function": "gelu_pytorch_tanh",
        }
        return ModelSpec("rand-gpt2", "gpt2", 3, h, heads, f, 97, 64, heads, kwargs)
    kv = heads // kv_div
    kwargs = {
        "num_hidden_layers": 3,
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": f,
        "vocab_size": 97,
        "max_position_embeddings": 64,
    }
    return ModelSpec("rand-llama", "llama", 3, h, heads, f, 97, 64, kv, kwargs)


def test_identities_hold_for_random_block_shapes():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from phaze.trace.tracer import trace_model

    @settings(max_examples=8, deadline=None, derandomize=True)
    @given(
        family=st.sampled_from(["gpt2", "llama"]),
        heads=st.sampled_from([1, 2, 4, 8]),
        head_dim=st.integers(1, 8).map(lambda x: 2 * x),  # RoPE needs an even head size
        ffn_mult=st.integers(1, 4),
        b=st.integers(1, 3),
        s=st.integers(2, 40),
        t=st.sampled_from([1, 2, 4]),
    )
    def check(family, heads, head_dim, ffn_mult, b, s, t):
        spec = _random_spec(family, heads, head_dim, ffn_mult)
        if t not in spec.valid_tp:
            with pytest.raises(PhazeError):
                spec.check_tp(t)
            return
        trace = trace_model(spec, b, t, seq=s)
        h = spec.hidden
        fwd = _block(trace, "fwd", "matmul")["flops"].sum()
        assert fwd * t == 2 * _weight_matrix_params(spec) * b * s + 4 * b * s * s * h
        assert _block(trace, "bwd", "matmul")["flops"].sum() == 2 * fwd
        assert _block_row(trace)["param_bytes"] == 2 * _block_params_per_rank(spec, t)
        # core attention's saved tensors, tiny shapes included (h, the head size or s may
        # coincide): softmax output, with GPT-2's dropout its 1-byte mask and output too
        per_score = 5 if family == "gpt2" else 2
        attention = per_score * spec.heads * s * s * b / t
        assert _block_row(trace)["attention_activation_bytes"] == attention
        for pass_ in ("fwd", "bwd"):
            assert len(_block(trace, pass_, "collective")) == (2 if t > 1 else 0)
        assert trace.layers["signature"].iloc[1:4].nunique() == 1

    check()
