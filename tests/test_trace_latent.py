"""Trace stage, fine-grained experts and latent attention: dense Qwen3 (head_dim independent of
hidden / heads, per-head q/k norms), Qwen3-MoE (128 experts, top-8, no shared expert) and
DeepSeek-V3 (multi-head latent attention, 256 routed experts top-8 in 8 groups, one shared
expert, three dense first blocks).

The closed forms are written from the architectures (Qwen3 technical report arXiv 2505.09388;
DeepSeek-V3 arXiv 2412.19437 §2.1), not from the tracer: a linear layer n_in -> n_out on T tokens
is 2·T·n_in·n_out FLOPs forward and twice that backward; core attention is QKᵀ over the query/key
width and ×V over the value width, on the rank's a/t heads. Sequences are short (the FLOPs are
closed forms in s) and DeepSeek-V3 is traced at expert-parallel size 32 (8 experts per rank) so
the file stays fast; its balanced FLOPs equal those at ep = 1.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from phaze.trace.models import get_model_spec

REPO = Path(__file__).resolve().parents[1]
S = 64  # sequence length of the traces (the registry's is 4096; FLOPs are closed forms in s)

# The public configs (Hugging Face config.json of Qwen/Qwen3-32B, Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B,
# deepseek-ai/DeepSeek-V3; docs/trace.md): blocks, hidden, heads, kv heads, head_dim, FFN (a
# routed expert's for MoE), vocab, experts, top-k, shared FFN, dense blocks, dense FFN.
PUBLIC = {
    "qwen3-32b": (64, 5120, 64, 8, 128, 25600, 151936, 0, 0, 0, 0, 0),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 128, 768, 151936, 128, 8, 0, 0, 0),
    "qwen3-235b-a22b": (94, 4096, 64, 4, 128, 1536, 151936, 128, 8, 0, 0, 0),
    "deepseek-v3": (61, 7168, 128, 128, 0, 2048, 129280, 256, 8, 2048, 3, 18432),
}
# DeepSeek-V3's latent attention: q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim
MLA = (1536, 512, 128, 64, 128)


@functools.cache
def _trace(model: str, tp: int = 1, ep: int = 1, b: int = 1, verify: bool = False):
    from phaze.trace.tracer import trace_model

    return trace_model(get_model_spec(model), b, tp, seq=S, ep=ep, verify=verify)


def _ops(trace, layer: str, pass_=None, kind=None):
    ops = trace.ops[trace.ops["layer"] == layer]
    if pass_:
        ops = ops[ops["pass"] == pass_]
    if kind:
        ops = ops[ops["kind"] == kind]
    return ops


def qwen3_fwd_flops(name: str, b: int, s: int, t: int) -> float:
    """One rank's forward matmul FLOPs of a Qwen3(-MoE) block: Q, K, V, O with head_dim d
    (Q and O are h <-> a·d, not h <-> h), core attention, then the SwiGLU MLP or router + k
    routed experts per token."""
    _, h, a, g, d, f, _, E, k, _, _, _ = PUBLIC[name]
    T = b * s
    flops = 2 * T * (2 * h * a * d + 2 * h * g * d) / t  # Q, O; K, V
    flops += 2 * 2 * b * (a // t) * s * s * d  # QKᵀ, ×V
    if E == 0:
        return flops + 2 * T * 3 * h * f / t
    return flops + 2 * T * h * E + 2 * T * k * 3 * h * f / t  # router (replicated), experts


def deepseek_fwd_flops(b: int, s: int, t: int, dense: bool) -> dict[str, float]:
    """One rank's forward matmul FLOPs of a DeepSeek-V3 block, by part."""
    _, h, a, _, _, f, _, E, k, fs, _, fd = PUBLIC["deepseek-v3"]
    qr, kvr, nope, rope, v = MLA
    T = b * s
    parts = {
        # down-projections to the latents: replicated on every rank
        "latent down-projections": 2 * T * h * (qr + kvr + rope),
        # up-projections from the latents (column-parallel) and the output (row-parallel)
        "up/out projections": 2
        * T
        * (qr * a * (nope + rope) + kvr * a * (nope + v) + a * v * h)
        / t,
        # QKᵀ over nope + rope, ×V over v, on a/t heads
        "core attention": 2 * b * (a // t) * s * s * (nope + rope + v),
    }
    if dense:
        parts["MLP"] = 2 * T * 3 * h * fd / t
    else:
        parts["router"] = 2 * T * h * E
        parts["routed experts"] = 2 * T * k * 3 * h * f / t
        parts["shared expert"] = 2 * T * 3 * h * fs / t
    return parts


def deepseek_block_params(t: int, dense: bool, ep: int = 1) -> int:
    """One rank's block parameters (elements): replicated latent down-projections and their
    RMSNorms, sliced up-projections and output, two block RMSNorms; then the MLP, or the router,
    E/ep routed experts and the shared expert."""
    _, h, a, _, _, f, _, E, _, fs, _, fd = PUBLIC["deepseek-v3"]
    qr, kvr, nope, rope, v = MLA
    p = h * (qr + kvr + rope) + qr + kvr + 2 * h
    p += (qr * a * (nope + rope) + kvr * a * (nope + v) + a * v * h) // t
    if dense:
        return p + 3 * h * fd // t
    return p + E * h + (E // ep) * 3 * h * f // t + 3 * h * fs // t


# --- registry -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PUBLIC))
def test_registry_holds_the_public_configs(name):
    blocks, h, a, g, d, f, vocab, E, k, fs, nd, fd = PUBLIC[name]
    spec = get_model_spec(name)
    assert (spec.num_blocks, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.vocab) == (
        blocks,
        h,
        a,
        g,
        f,
        vocab,
    )
    assert spec.seq == 4096 and spec.dense_blocks == nd and spec.repeated_blocks == blocks - nd
    config = spec.hf_config()
    if d:
        assert config.head_dim == d and d * a != h  # head_dim is not hidden / heads
    if E == 0:
        assert spec.moe is None and spec.valid_tp == (1, 2, 4, 8)
        return
    assert (spec.moe.experts, spec.moe.top_k, spec.moe.shared_ffn) == (E, k, fs)
    from phaze.trace.moe import moe_layout

    assert moe_layout(config.to_dict(), name) == spec.moe  # HF's object says what the dict says
    if name == "deepseek-v3":
        assert (spec.moe.groups, spec.moe.topk_groups, spec.moe.dense_ffn) == (8, 4, fd)
        assert spec.moe.score == "sigmoid" and not spec.moe.shared_gate
        mla = spec.mla
        assert (mla.q_rank, mla.kv_rank, mla.nope, mla.rope, mla.v_dim) == MLA
        assert config.first_k_dense_replace == nd and spec.valid_tp == (1, 2, 4, 8)
    else:
        assert spec.moe.norm_topk and spec.valid_tp == (1, 2, 4)  # 4 key/value heads


def test_closed_forms_total_the_published_parameter_counts():
    """The block closed forms the traces are checked against (below) add up to the published
    sizes: DeepSeek-V3 671B total, 37B activated per token (arXiv 2412.19437, abstract; its
    multi-token-prediction module not included); Qwen3-30B-A3B 30.5B total, 3.3B activated
    (its model card), Qwen3-235B-A22B 235B total, 22B activated (its name and model card), to
    the published digits."""
    _, h, _, _, _, f, vocab, E, k, _, nd, _ = PUBLIC["deepseek-v3"]
    edges = 2 * vocab * h + h  # embedding, LM head, final norm
    dense, moe = deepseek_block_params(1, True), deepseek_block_params(1, False)
    total = edges + nd * dense + (61 - nd) * moe
    active = edges + nd * dense + (61 - nd) * (moe - (E - k) * 3 * h * f)
    assert int(total / 1e9) == 671 and int(active / 1e9) == 37  # 671.03B, 37.55B
    for name, (total_b, active_b) in (
        ("qwen3-30b-a3b", (30.5, 3.3)),
        ("qwen3-235b-a22b", (235, 22)),
    ):
        blocks, h, a, g, d, f, vocab, E, k, *_ = PUBLIC[name]
        attention = 2 * h * a * d + 2 * h * g * d + 2 * h + 2 * d
        total = 2 * vocab * h + h + blocks * (attention + E * h + E * 3 * h * f)
        active = 2 * vocab * h + h + blocks * (attention + E * h + k * 3 * h * f)
        # 30.53B / 3.35B; 235.09B / 22.19B
        digits = 10 if total_b < 100 else 1
        assert int(total / 1e9 * digits) == int(total_b * digits)
        assert int(active / 1e9 * digits) == int(active_b * digits)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "deepseek-v3"])
def test_exported_config_reads_back_as_the_registry_model(tmp_path, name):
    """The registry's config, exported by Hugging Face and read back as a path: the same MoE
    layout, latent attention and dense blocks (HF's field names, e.g. num_local_experts, agree
    with the published ones); DeepSeek-V3's trace is the same."""
    spec = get_model_spec(name)
    spec.hf_config().to_json_file(tmp_path / "config.json")
    by_path = get_model_spec(str(tmp_path / "config.json"))
    assert (by_path.moe, by_path.mla, by_path.family) == (spec.moe, spec.mla, spec.family)
    if name == "deepseek-v3":
        from phaze.trace.tracer import trace_model

        a = trace_model(by_path, 1, 2, seq=S, ep=128)
        assert a.ops.equals(_trace(name, 2, 128).ops)


# --- FLOPs against the closed forms --------------------------------------------------------


@pytest.mark.parametrize(
    "name,t,b",
    [
        ("qwen3-32b", 1, 1),
        ("qwen3-32b", 8, 2),
        ("qwen3-30b-a3b", 1, 1),
        ("qwen3-30b-a3b", 4, 1),
        ("qwen3-235b-a22b", 1, 1),
        ("qwen3-235b-a22b", 4, 1),
    ],
)
def test_qwen3_block_flops_equal_the_closed_form(name, t, b):
    trace = _trace(name, t, b=b)
    closed = qwen3_fwd_flops(name, b, S, t)
    fwd = _ops(trace, "block.0", "fwd", "matmul")["flops"].sum()
    bwd = _ops(trace, "block.0", "bwd", "matmul")["flops"].sum()
    assert fwd == closed and bwd == 2 * closed


@pytest.mark.parametrize("t", [1, 8])
def test_deepseek_blocks_flops_equal_the_closed_form(t):
    """The dense first block and the MoE block, each against its closed form, by part."""
    trace = _trace("deepseek-v3", t, 32)
    for layer, dense in (("block.0", True), ("block.1", False)):
        parts = deepseek_fwd_flops(1, S, t, dense)
        fwd = _ops(trace, layer, "fwd", "matmul")
        assert fwd["flops"].sum() == sum(parts.values())
        assert _ops(trace, layer, "bwd", "matmul")["flops"].sum() == 2 * sum(parts.values())
        if dense:
            continue
        by_role = fwd.groupby("moe_role")["flops"].sum()
        assert by_role["router"] == parts["router"]
        assert by_role["expert"] == parts["routed experts"]
        assert by_role["shared_expert"] == parts["shared expert"]


def test_deepseek_expert_parallelism_keeps_the_balanced_flops():
    """At ep = 32 and ep = 64 a rank holds 8 and 4 experts; balanced, its block FLOPs are the same."""
    a, b = _trace("deepseek-v3", 1, 32), _trace("deepseek-v3", 1, 64)
    for trace, ep in ((a, 32), (b, 64)):
        fwd = _ops(trace, "block.1", "fwd", "matmul")
        assert sorted(set(fwd.loc[fwd["expert"] >= 0, "expert"])) == list(range(256 // ep))
    assert (
        _ops(a, "block.1", "fwd", "matmul")["flops"].sum()
        == _ops(b, "block.1", "fwd", "matmul")["flops"].sum()
    )


# --- structure ------------------------------------------------------------------------------


def test_qwen3_projections_use_head_dim_and_norm_each_head():
    """Q projects h -> a·d/t (8192/t for Qwen3-32B, not h/t), K and V h -> g·d/t, O a·d/t -> h;
    the per-head q/k RMSNorms are whole on every rank (d wide)."""
    _, h, a, g, d, f, *_ = PUBLIC["qwen3-32b"]
    t = 4
    trace = _trace("qwen3-32b", t)
    fwd = _ops(trace, "block.0", "fwd", "matmul")
    weighted = fwd[fwd["weight_bytes"] > 0]
    want = [(h, a * d // t), (h, g * d // t), (h, g * d // t), (a * d // t, h)]
    want += [(h, f // t), (h, f // t), (f // t, h)]
    assert sorted(zip(weighted["k"], weighted["n"])) == sorted(want)
    row = trace.layers.set_index("layer").loc["block.0"]
    # + two block RMSNorms (h) and the q/k norms (d each), replicated
    assert row["param_bytes"] == 2 * (
        (2 * h * a * d + 2 * h * g * d + 3 * h * f) // t + 2 * h + 2 * d
    )


def test_deepseek_dense_first_blocks_have_their_own_signature():
    """Blocks 0-2 are the dense block's signature, 3-60 the MoE block's; parameters of each by
    its closed form; the two-block-per-kind trace verifies both."""
    t, ep = 2, 32
    trace = _trace("deepseek-v3", t, ep)
    layers = trace.layers[trace.layers["kind"] == "block"].set_index("block")
    assert len(layers) == 61
    dense, sparse = layers.loc[:2], layers.loc[3:]
    assert dense["signature"].nunique() == 1 and sparse["signature"].nunique() == 1
    assert dense["signature"].iloc[0] != sparse["signature"].iloc[0]
    assert (dense["experts"] == 0).all() and (sparse["experts"] == 256).all()
    assert (dense["param_bytes"] == 2 * deepseek_block_params(t, True)).all()
    assert (sparse["param_bytes"] == 2 * deepseek_block_params(t, False, ep)).all()
    assert (dense["expert_param_bytes"] == 0).all()
    assert (sparse["expert_param_bytes"] == 2 * (256 // ep) * 3 * 7168 * 2048 // t).all()
    # the ops table holds each kind once
    assert set(trace.ops.loc[trace.ops["layer"].str.startswith("block"), "layer"]) == {
        "block.0",
        "block.1",
    }
    verified = _trace("deepseek-v3", t, 128, verify=True)  # 2 experts per rank: fast
    assert verified.layers["signature"].nunique() == 4  # embedding, dense, MoE, head


def test_latent_attention_is_sliced_as_megatron_slices_it():
    """q_a_proj and kv_a_proj_with_mqa (the down-projections) are whole on every rank and
    replicated; q_b_proj, kv_b_proj (column) and o_proj (row) keep a/t heads. Backward
    all-reduces: one at each latent (b·s·q_rank and b·s·(kv_rank + rope)), the MLP's input; forward:
    the output projection's and the MLP's b·s·h. (Mutation tried: without the f on
    kv_a_proj_with_mqa's output the backward all-reduce of the key/value latent is missing and
    this test fails.)"""
    _, h, a, *_ = PUBLIC["deepseek-v3"]
    qr, kvr, nope, rope, v = MLA
    t = 8
    trace = _trace("deepseek-v3", t, 32)
    fwd = _ops(trace, "block.0", "fwd", "matmul")
    attn = fwd[(fwd["weight_bytes"] > 0)]
    shapes = dict(zip(zip(attn["k"], attn["n"]), attn["replicated"]))
    assert shapes[(h, qr)] and shapes[(h, kvr + rope)]  # replicated down-projections
    assert not shapes[(qr, a * (nope + rope) // t)] and not shapes[(kvr, a * (nope + v) // t)]
    assert not shapes[(a * v // t, h)]
    core = fwd[fwd["weight_bytes"] == 0]
    assert sorted(core["k"]) == sorted([nope + rope, S]) and (core["batch"] == a // t).all()
    for pass_, want in (
        ("fwd", [S * h * 2, S * h * 2]),
        ("bwd", sorted([S * qr * 2, S * (kvr + rope) * 2, S * h * 2])),
    ):
        coll = _ops(trace, "block.0", pass_, "collective")
        assert sorted(coll["bytes_in"]) == sorted(want) and (coll["group_size"] == t).all()


def test_deepseek_router_is_sigmoid_grouped_without_aux_loss_and_shared_expert_ungated():
    trace = _trace("deepseek-v3", 2, 32)
    fwd = _ops(trace, "block.1", "fwd")
    router = fwd[fwd["moe_role"] == "router"]
    assert (router["aten"] == "aten.sigmoid.default").any()
    assert (router["aten"] == "aten.topk.default").sum() == 3  # in-group, groups, experts
    assert not (trace.ops["moe_role"] == "aux_loss").any()
    shared = fwd[(fwd["moe_role"] == "shared_expert") & (fwd["kind"] == "matmul")]
    assert len(shared) == 3 and not (shared["n"] == 1).any()  # no gate h -> 1


# --- bad input through the CLI: exit 2, one line -------------------------------------------


def _config_json(tmp_path, name, **changes) -> str:
    raw = {
        "model_type": get_model_spec(name).hf_config().model_type,
        **get_model_spec(name).config_kwargs,
    }
    raw.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return str(tmp_path / "config.json")


BAD_INPUTS = {
    "top-k above the experts": (
        lambda p: ["--model", _config_json(p, "qwen3-30b-a3b", num_experts_per_tok=129)],
        "num_experts_per_tok = 129 exceeds the 128 routed experts",
    ),
    "top-k above the experts of the allowed groups": (
        lambda p: ["--model", _config_json(p, "deepseek-v3", topk_group=1, num_experts_per_tok=33)],
        "num_experts_per_tok = 33 exceeds the 32 experts of the topk_group = 1 groups",
    ),
    "groups not dividing the experts": (
        lambda p: ["--model", _config_json(p, "deepseek-v3", n_group=7)],
        "n_group = 7 must divide the 256 routed experts",
    ),
    "more groups chosen than exist": (
        lambda p: ["--model", _config_json(p, "deepseek-v3", topk_group=9)],
        "topk_group = 9 exceeds n_group = 8",
    ),
    "kv_lora_rank not positive": (
        lambda p: ["--model", _config_json(p, "deepseek-v3", kv_lora_rank=0)],
        "kv_lora_rank must be an integer >= 1, got 0",
    ),
    "qk_head_dim not nope + rope": (
        lambda p: ["--model", _config_json(p, "deepseek-v3", qk_head_dim=128)],
        "qk_head_dim = 128 must equal qk_nope_head_dim + qk_rope_head_dim = 128 + 64",
    ),
    "dense blocks leaving no MoE block": (
        lambda p: ["--model", _config_json(p, "deepseek-v3", first_k_dense_replace=61)],
        "first_k_dense_replace = 61 leaves none of the 61 blocks",
    ),
    "heads not divisible by tp": (
        lambda p: ["--model", "qwen3-30b-a3b", "--tp", "8"],
        "its 4 key/value heads",
    ),
    "head_dim·heads not the hidden size where it must be": (
        lambda p: ["--model", _config_json(p, "opt-350m", head_dim=32)],
        "head_dim = 32 times num_attention_heads = 16 must equal hidden_size = 1024",
    ),
    "head_dim not a positive integer": (
        lambda p: ["--model", _config_json(p, "qwen3-32b", head_dim=0)],
        "head_dim must be an integer >= 1, got 0",
    ),
    "hidden not divisible by heads without head_dim": (
        lambda p: [
            "--model",
            _config_json(p, "llama3-8b", num_attention_heads=24, num_key_value_heads=8),
        ],
        "hidden_size = 4096 must be divisible by num_attention_heads = 24",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    from phaze.cli import main

    argv, needle = BAD_INPUTS[case]
    out = tmp_path / "out"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(REPO)
    code = main(["trace", "--microbatch", "1", *argv(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("phaze trace: error:"), err
    assert needle in lines[0] and "Traceback" not in err
    assert not out.exists()


def test_deepseek_whole_experts_keep_the_shared_expert_sliced():
    """etp = 1 at tp = 2: the rank's 2 routed experts (ep = 128) are whole (expert bytes
    2·(E/ep)·3·h·f), the shared expert and attention stay sliced by tp (the block's other
    parameters as at etp = tp)."""
    from phaze.trace.tracer import trace_model

    _, h, _, _, _, f, *_ = PUBLIC["deepseek-v3"]
    whole = trace_model(get_model_spec("deepseek-v3"), 1, 2, seq=S, ep=128, etp=1, verify=False)
    split = _trace("deepseek-v3", 2, 128)
    w, p = (t.layers.set_index("layer").loc["block.3"] for t in (whole, split))
    assert bool(w["etp1"]) and w["expert_param_bytes"] == 2 * 2 * 3 * h * f
    assert w["expert_param_bytes"] == 2 * p["expert_param_bytes"]
    assert w["param_bytes"] - w["expert_param_bytes"] == p["param_bytes"] - p["expert_param_bytes"]
