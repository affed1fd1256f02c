"""Trace stage, today's workloads: grouped-query attention (Llama 3) and mixture-of-experts blocks
(Mixtral 8x7B, Qwen1.5-MoE-A2.7B).

The closed forms below are written from first principles — a linear layer of n_in -> n_out on T
tokens is 2·T·n_in·n_out FLOPs forward and twice that backward (input and weight gradients); core
attention is QKᵀ and ×V over the a query heads, 2·b·s²·h each — not from the tracer's code. Every
model is traced at its registry sequence length (on the meta device sizes cost nothing).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

from phaze.errors import PhazeError
from phaze.trace.models import get_model_spec
from phaze.trace.moe import MoESpec, rank_tokens_per_expert, tokens_per_expert
from tests.test_trace import _block

REPO = Path(__file__).resolve().parents[1]
TODAY = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"]

# The public configs (Hugging Face config.json of meta-llama/Meta-Llama-3-8B, -70B,
# mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen1.5-MoE-A2.7B; docs/trace.md): blocks, hidden, heads,
# key/value heads, FFN (a routed expert's for MoE), vocab, seq, experts, top-k, shared FFN.
PUBLIC = {
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192, 0, 0, 0),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, 8192, 0, 0, 0),
    "mixtral-8x7b": (32, 4096, 32, 8, 14336, 32000, 4096, 8, 2, 0),
    "qwen1.5-moe-a2.7b": (24, 2048, 16, 16, 1408, 151936, 8192, 60, 4, 5632),
}


@functools.cache
def _trace(
    model: str,
    microbatch: int = 1,
    tp: int = 1,
    seq: int | None = None,
    imb: float = 1.0,
    ep: int = 1,
    etp: int | None = None,
):
    from phaze.trace.tracer import trace_model

    return trace_model(
        get_model_spec(model), microbatch, tp, seq=seq, moe_imbalance=imb, ep=ep, etp=etp
    )


def _row(trace):
    return trace.layers.set_index("layer").loc["block.0"]


def _sizes(name):
    _blocks, h, a, g, f, _vocab, s, e, k, fs = PUBLIC[name]
    return {"h": h, "a": a, "g": g, "d": h // a, "f": f, "E": e, "k": k, "fs": fs, "s": s}


def closed_form_fwd_flops(name: str, b: int, s: int, t: int) -> dict[str, float]:
    """One rank's forward matmul FLOPs of one block, by part (tensor-parallel width t)."""
    z = _sizes(name)
    h, a, g, d, f, E, k, fs = (z[x] for x in ("h", "a", "g", "d", "f", "E", "k", "fs"))
    T = b * s
    parts = {
        # Q and O: h -> a·d = h; K and V: h -> g·d each; column/row-parallel: / t
        "attention projections": 2 * T * (2 * h * h + 2 * h * g * d) / t,
        # QKᵀ and ×V over a/t query heads of size d: 2·b·(a/t)·s²·d each
        "core attention": 2 * 2 * b * (a // t) * s * s * d,
    }
    if E == 0:
        parts["MLP (SwiGLU)"] = 2 * T * 3 * h * f / t
        return parts
    # router h -> E on every token, replicated on every rank
    parts["router"] = 2 * T * h * E
    # T·k token-expert assignments, each through gate+up (h -> 2f/t) and down (f/t -> h)
    parts["routed experts"] = 2 * T * k * 3 * h * f / t
    if fs:
        # shared expert (dense SwiGLU, sliced) and its gate h -> 1 (replicated)
        parts["shared expert"] = 2 * T * 3 * h * fs / t
        parts["shared gate"] = 2 * T * h
    return parts


# --- registry -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TODAY)
def test_registry_holds_the_public_configs(name):
    spec = get_model_spec(name)
    blocks, h, a, g, f, v, s, e, k, fs = PUBLIC[name]
    assert (spec.num_blocks, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.vocab) == (
        blocks,
        h,
        a,
        g,
        f,
        v,
    )
    assert spec.seq == s and spec.valid_tp == (1, 2, 4, 8)
    config = spec.hf_config()
    assert config.num_key_value_heads == g and config.vocab_size == v
    if e == 0:
        assert spec.moe is None and config.intermediate_size == f
        assert config.rope_parameters["rope_theta"] == 500000.0
        return
    assert (spec.moe.experts, spec.moe.top_k, spec.moe.expert_ffn, spec.moe.shared_ffn) == (
        e,
        k,
        f,
        fs,
    )
    assert config.num_experts_per_tok == k
    # what phaze reads from the registry's dict is what HF's config object says
    from phaze.trace.moe import moe_layout

    assert moe_layout(config.to_dict(), name) == spec.moe
    assert config.output_router_logits is False  # the aux loss is the MoE layer's own, per block


@pytest.mark.parametrize("name", TODAY[2:])
def test_exported_moe_config_traces_by_path_as_by_name(tmp_path, name):
    """The registry's config.json-style spec, exported by HF and read back as a path: the same
    MoE layout and the same trace (HF's defaults agree with the registry's fields)."""
    from phaze.trace.tracer import trace_model

    get_model_spec(name).hf_config().to_json_file(tmp_path / "config.json")
    by_path = get_model_spec(str(tmp_path / "config.json"))
    assert by_path.moe == get_model_spec(name).moe and by_path.family == get_model_spec(name).family
    a, b = trace_model(by_path, 1, 2, seq=64), _trace(name, 1, 2, 64)
    for table in ("ops", "edges"):
        assert getattr(a, table).equals(getattr(b, table))


# --- grouped-query attention ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name,t", [("llama3-8b", 1), ("llama3-8b", 8), ("llama3-70b", 8), ("mixtral-8x7b", 4)]
)
def test_gqa_key_value_projections_are_exact(name, t):
    """K and V project h -> kv_heads·head_dim, sliced by t (Megatron: each rank holds
    kv_heads/t whole key/value heads); Q keeps a/t heads; core attention runs over a/t heads."""
    z = _sizes(name)
    h, a, g, d, f, s = z["h"], z["a"], z["g"], z["d"], z["f"], z["s"]
    fwd = _block(_trace(name, 1, t), "fwd", "matmul")
    # the weight GEMMs outside a MoE layer, as (k, n): Q, K, V, O (and a dense SwiGLU MLP)
    weighted = fwd[(fwd["weight_bytes"] > 0) & (fwd["moe_role"] == "")]
    want = [(h, a * d // t), (h, g * d // t), (h, g * d // t), (a * d // t, h)]
    if z["E"] == 0:
        want += [(h, f // t), (h, f // t), (f // t, h)]
    assert sorted(zip(weighted["k"], weighted["n"])) == sorted(want)
    assert (weighted["m"] == s).all()
    assert (weighted["weight_bytes"] == 2 * weighted["k"] * weighted["n"]).all()
    kv = weighted[weighted["n"] == g * d // t]
    assert len(kv) == 2 and (kv["weight_bytes"] == 2 * h * g * d // t).all()  # K and V
    core = fwd[fwd["weight_bytes"] == 0]
    assert sorted(core["k"]) == sorted([d, s]) and (core["batch"] == a // t).all()
    row = _row(_trace(name, 1, t))
    assert row["attention_activation_bytes"] == 2 * (a // t) * s * s  # the softmax output


@pytest.mark.parametrize("name,t", [("llama3-8b", 1), ("llama3-8b", 4), ("llama3-70b", 8)])
def test_gqa_block_params_closed_form(name, t):
    z = _sizes(name)
    h, g, d, f = z["h"], z["g"], z["d"], z["f"]
    per_rank = (2 * h * h + 2 * h * g * d + 3 * h * f) // t + 2 * h  # + two RMSNorm weights
    assert _row(_trace(name, 1, t))["param_bytes"] == 2 * per_rank


def test_tp_must_divide_the_key_value_heads():
    """Megatron-LM slices key/value heads whole (num_query_groups % tp == 0): a width above the
    key/value heads is refused, naming them."""
    from phaze.trace.models import ModelSpec

    two_kv = ModelSpec("gqa2", "llama", 32, 4096, 32, 14336, 128256, 8192, 2)
    assert two_kv.valid_tp == (1, 2)
    with pytest.raises(PhazeError, match="its 2 key/value heads"):
        two_kv.check_tp(4)


# --- FLOPs against the closed forms --------------------------------------------------------


FLOP_CASES = [
    ("llama3-8b", 1, 1),
    ("llama3-8b", 2, 1),
    ("llama3-8b", 1, 8),
    ("llama3-70b", 1, 1),
    ("llama3-70b", 1, 8),
    ("mixtral-8x7b", 1, 1),
    ("mixtral-8x7b", 2, 1),
    ("mixtral-8x7b", 1, 8),
    ("qwen1.5-moe-a2.7b", 1, 1),
    ("qwen1.5-moe-a2.7b", 1, 8),
]


@pytest.mark.parametrize("name,b,t", FLOP_CASES)
def test_block_flops_equal_the_closed_form(name, b, t):
    s = PUBLIC[name][6]
    trace = _trace(name, b, t)
    closed = sum(closed_form_fwd_flops(name, b, s, t).values())
    fwd = _block(trace, "fwd", "matmul")["flops"].sum()
    bwd = _block(trace, "bwd", "matmul")["flops"].sum()
    assert fwd == closed  # exact: every GEMM is in the closed form, nothing else is a GEMM
    assert bwd == 2 * closed
    row = _row(trace)
    assert row["fwd_matmul_flops"] == fwd and row["bwd_matmul_flops"] == bwd


@pytest.mark.parametrize("name", TODAY[2:])
def test_moe_flops_by_part_and_imbalance(name):
    """Each part of the MoE layer by its role column, against its own closed form; the
    imbalance moves tokens between experts, not FLOPs."""
    s, t = 256, 2
    parts = closed_form_fwd_flops(name, 1, s, t)
    fwd = _block(_trace(name, 1, t, s), "fwd", "matmul")
    by_role = fwd.groupby("moe_role")["flops"].sum()
    assert by_role["router"] == parts["router"]
    assert by_role["expert"] == parts["routed experts"]
    shared = parts.get("shared expert", 0) + parts.get("shared gate", 0)
    assert by_role.get("shared_expert", 0) == shared
    assert by_role[""] == parts["attention projections"] + parts["core attention"]
    spec = get_model_spec(name)
    skewed = _block(_trace(name, 1, t, s, spec.moe.max_imbalance), "fwd", "matmul")
    assert skewed["flops"].sum() == fwd["flops"].sum()


# --- the MoE layer --------------------------------------------------------------------------


def test_token_distribution():
    """Balanced: each expert T·k/E (whole tokens, spread evenly); the busiest gets
    ceil(factor·T·k/E), at most T; the counts always sum to T·k."""
    assert tokens_per_expert(4096, 8, 2) == [1024] * 8
    assert tokens_per_expert(8192, 60, 4) == [547] * 8 + [546] * 52  # 32768 = 60·546 + 8
    assert tokens_per_expert(4096, 8, 2, 2.0) == [2048] + [878] * 5 + [877] * 2
    assert tokens_per_expert(4096, 8, 2, 4.0) == [4096, 586] + [585] * 6
    for T, E, k in ((1, 1, 1), (7, 60, 4), (4096, 8, 2), (8192, 60, 4), (3, 5, 5), (10, 4, 1)):
        for factor in (1.0, min(1.25, E / k), (1 + E / k) / 2, E / k):
            counts = tokens_per_expert(T, E, k, factor)
            assert len(counts) == E and sum(counts) == T * k
            assert counts[0] == max(counts) <= T
            assert counts[0] == min(T, max(math.ceil(factor * T * k / E), -(-T * k // E)))
            assert max(counts[1:], default=0) - min(counts[1:], default=0) <= 1
    with pytest.raises(PhazeError):
        tokens_per_expert(8, 8, 2, 4.5)
    with pytest.raises(PhazeError):
        tokens_per_expert(8, 8, 9)


@pytest.mark.parametrize("name,t,imb", [("mixtral-8x7b", 1, 1.0), ("mixtral-8x7b", 4, 3.0)])
def test_expert_gemms_use_the_stated_token_counts(name, t, imb):
    """Expert e's two forward GEMMs (gate+up, down) run on its stated token count, read its own
    weights (expert-parameter bytes per op) and have four backward GEMMs tagged with it."""
    z = _sizes(name)
    h, f, E, k = z["h"], z["f"], z["E"], z["k"]
    s = 512
    trace = _trace(name, 1, t, s, imb)
    counts = tokens_per_expert(s, E, k, imb)
    assert trace.moe["tokens_per_expert"] == counts and trace.moe["imbalance"] == imb
    fwd = _block(trace, "fwd", "matmul")
    bwd = _block(trace, "bwd", "matmul")
    for e in range(E):
        mine = fwd[fwd["expert"] == e].sort_values("op")
        assert (mine["moe_role"] == "expert").all()
        assert list(zip(mine["m"], mine["k"], mine["n"])) == [
            (counts[e], h, 2 * f // t),
            (counts[e], f // t, h),
        ]
        assert list(mine["weight_bytes"]) == [2 * 2 * f // t * h, 2 * h * f // t]
        grads = bwd[bwd["expert"] == e]
        assert len(grads) == 4 and grads["flops"].sum() == 2 * mine["flops"].sum()
    tagged = _block(trace)
    assert ((tagged["expert"] >= 0) == (tagged["moe_role"] == "expert")).all()
    row = _row(trace)
    assert row["experts"] == E
    assert row["expert_param_bytes"] == 2 * E * 3 * h * f // t


@pytest.mark.parametrize(
    "name,t", [("mixtral-8x7b", 1), ("mixtral-8x7b", 2), ("qwen1.5-moe-a2.7b", 4)]
)
def test_dispatch_and_combine_are_all_to_alls(name, t):
    """One all-to-all dispatches and one combines the b·s·k token rows in each pass (group 1 at
    trace time: the expert-parallel size is the step model's); the tensor-parallel all-reduces
    are Megatron's: attention's b·s·h, the experts' on the dispatched b·s·k·h rows, the shared
    expert's b·s·h."""
    z = _sizes(name)
    h, k = z["h"], z["k"]
    b, s = 1, 128
    trace = _trace(name, b, t, s)
    rows = b * s * k * h * 2
    for pass_ in ("fwd", "bwd"):
        coll = _block(trace, pass_, "collective").sort_values("op")
        a2a = coll[coll["collective"] == "all_to_all"]
        assert list(a2a["moe_role"]) == (
            ["dispatch", "combine"] if pass_ == "fwd" else ["combine", "dispatch"]
        )
        assert (a2a["group_size"] == 1).all() and (a2a["bytes_in"] == rows).all()
        assert (a2a["bytes_out"] == rows).all() and (
            a2a["aten"] == "phaze.all_to_all.default"
        ).all()
        ar = coll[coll["collective"] == "all_reduce"]
        if t == 1:
            assert ar.empty
            continue
        want = {"": b * s * h * 2, "shared_expert": b * s * h * 2}
        want["combine" if pass_ == "fwd" else "dispatch"] = rows
        if not z["fs"]:
            del want["shared_expert"]
        assert dict(zip(ar["moe_role"], ar["bytes_in"])) == want
        assert (ar["group_size"] == t).all()


@pytest.mark.parametrize(
    "name,t,ep,s",
    [("mixtral-8x7b", 1, 8, 128), ("mixtral-8x7b", 2, 4, 128), ("qwen1.5-moe-a2.7b", 1, 6, 120)],
)
def test_expert_parallel_rank_holds_its_experts_and_exchanges_its_tokens(name, t, ep, s):
    """At expert-parallel size ep a rank holds E/ep whole experts (expert parameter bytes / ep),
    each on ep·b·s·k/E token rows (the group's tokens, balanced); the all-to-alls run on ep ranks
    and send and receive the rank's b·s·k rows; the block's matmul FLOPs equal those at ep = 1
    (balanced: every rank computes its own tokens' share) — its dense part untouched. (s: the
    group's b·s·k·ep assignments divide evenly over the E experts.)"""
    z = _sizes(name)
    h, f, E, k = z["h"], z["f"], z["E"], z["k"]
    b = 1
    one, par = _trace(name, b, t, s), _trace(name, b, t, s, 1.0, ep)
    assert par.moe["ep"] == ep
    assert par.moe["tokens_per_expert"] == [ep * b * s * k // E] * (E // ep)
    fwd = _block(par, "fwd", "matmul")
    assert sorted(set(fwd.loc[fwd["expert"] >= 0, "expert"])) == list(range(E // ep))
    row, row1 = _row(par), _row(one)
    assert row["ep"] == ep and row1["ep"] == 1 and row["experts"] == E
    assert row["expert_param_bytes"] * ep == row1["expert_param_bytes"]
    assert row["param_bytes"] - row["expert_param_bytes"] == (
        row1["param_bytes"] - row1["expert_param_bytes"]
    )
    assert row["expert_param_bytes"] == 2 * (E // ep) * 3 * h * f // t
    for pass_ in ("fwd", "bwd"):
        flops = _block(par, pass_, "matmul")["flops"].sum()
        assert flops == pytest.approx(_block(one, pass_, "matmul")["flops"].sum(), rel=1e-12)
        a2a = _block(par, pass_, "collective")
        a2a = a2a[a2a["collective"] == "all_to_all"]
        assert len(a2a) == 2 and (a2a["group_size"] == ep).all()
        assert (a2a["bytes_in"] == b * s * k * h * 2).all()
        assert (a2a["bytes_out"] == b * s * k * h * 2).all()


@pytest.mark.parametrize(
    "name,t,ep,s",
    [("mixtral-8x7b", 2, 1, 128), ("mixtral-8x7b", 4, 8, 128), ("qwen1.5-moe-a2.7b", 2, 6, 120)],
)
def test_whole_experts_run_on_the_ranks_shard(name, t, ep, s):
    """etp = 1 (Megatron's --expert-tensor-parallel-size 1) at tp = t: the router, the
    all-to-alls and E/ep whole experts (fc1 h -> 2f, fc2 f -> h, unsliced weights: expert
    parameter bytes t times those at etp = t) run on the rank's b·s/t tokens, each expert on
    ep·b·s·k/(t·E) rows; the all-to-alls carry b·s·k/t rows inside the tensor-parallel region
    (not replicated), and no tensor-parallel collective runs in the routed path. The block's
    matmul FLOPs: those at etp = t, less the router's (t − 1)/t on the tokens other ranks route
    (balanced). Free sp_split/sp_gather bracket the path."""
    z = _sizes(name)
    h, f, E, k = z["h"], z["f"], z["E"], z["k"]
    b = 1
    split, whole = _trace(name, b, t, s, 1.0, ep), _trace(name, b, t, s, 1.0, ep, 1)
    assert whole.moe["etp"] == 1 and split.moe["etp"] == t
    assert whole.moe["tokens_per_expert"] == [ep * b * s * k // (t * E)] * (E // ep)
    row, row_split = _row(whole), _row(split)
    assert bool(row["etp1"]) and not bool(row_split["etp1"])
    assert row["expert_param_bytes"] == 2 * (E // ep) * 3 * h * f
    assert row["expert_param_bytes"] == t * row_split["expert_param_bytes"]
    fwd = _block(whole, "fwd", "matmul")
    experts = fwd[fwd["expert"] >= 0].sort_values("op")
    rows = ep * b * s * k // (t * E)
    assert set(zip(experts["m"], experts["k"], experts["n"])) == {(rows, h, 2 * f), (rows, f, h)}
    router = fwd[fwd["moe_role"] == "router"]
    assert (router["m"] == b * s // t).all() and not router["replicated"].any()
    for pass_ in ("fwd", "bwd"):
        flops = _block(whole, pass_, "matmul")["flops"].sum()
        router_flops = 2 * b * s * h * E * (1 if pass_ == "fwd" else 2)
        less = router_flops * (t - 1) / t  # (its input and weight gradients alike)
        assert flops == _block(split, pass_, "matmul")["flops"].sum() - less
        coll = _block(whole, pass_, "collective")
        a2a = coll[coll["collective"] == "all_to_all"]
        assert len(a2a) == 2 and (a2a["group_size"] == ep).all()
        assert (a2a["bytes_in"] == b * s * k * h * 2 // t).all() and not a2a["replicated"].any()
        routed = coll[coll["moe_role"].isin(["dispatch", "expert", "combine"])]
        assert set(routed["collective"]) == {"all_to_all"}
        nops = _block(whole, pass_)
        nops = nops[nops["aten"].isin(["phaze.sp_split.default", "phaze.sp_gather.default"])]
        assert len(nops) >= 2 and (nops["kind"] == "nop").all()


def test_whole_experts_are_checked():
    """etp other than tp or 1, etp = 1 for a dense model, and a sequence the tp ranks cannot
    split evenly are errors naming the problem."""
    mixtral, llama = get_model_spec("mixtral-8x7b"), get_model_spec("llama3-8b")
    with pytest.raises(PhazeError, match="must be tp \\(4\\) or 1"):
        mixtral.check_etp(2, 4)
    with pytest.raises(PhazeError, match="needs a mixture-of-experts model"):
        llama.check_etp(1, 2)
    with pytest.raises(PhazeError, match="divisible by tp = 4"):
        mixtral.check_etp(1, 4, 4098)
    mixtral.check_etp(1, 4, 4096)
    mixtral.check_etp(None, 4)
    llama.check_etp(2, 2)


def test_rank_token_counts_under_imbalance():
    """The busiest rank of an expert-parallel group holds the busiest expert: its experts' rows
    are the first E/ep of the group's distribution; it then receives more rows than it sends."""
    assert rank_tokens_per_expert(128, 8, 2, 1.0, 4) == [128] * 2
    got = rank_tokens_per_expert(128, 8, 2, 2.0, 4)
    group = tokens_per_expert(4 * 128, 8, 2, 2.0)
    assert got == group[:2] and got[0] == 256 and sum(got) > 128 * 2
    with pytest.raises(PhazeError, match="must divide the 8 experts"):
        rank_tokens_per_expert(128, 8, 2, 1.0, 3)


def test_expert_parallel_imbalance_reaches_the_busiest_rank():
    name, s, ep = "mixtral-8x7b", 64, 4
    trace = _trace(name, 1, 1, s, 2.0, ep)
    fwd = _block(trace, "fwd", "matmul")
    up = fwd[(fwd["expert"] == 0)].sort_values("op").iloc[0]
    assert up["m"] == rank_tokens_per_expert(s, 8, 2, 2.0, ep)[0] == 2 * ep * s * 2 // 8
    a2a = _block(trace, "fwd", "collective")
    dispatch = a2a[a2a["moe_role"] == "dispatch"].iloc[0]
    assert dispatch["bytes_in"] == s * 2 * 4096 * 2
    assert dispatch["bytes_out"] == sum(rank_tokens_per_expert(s, 8, 2, 2.0, ep)) * 4096 * 2


def test_router_aux_loss_and_shared_expert_structure():
    """The router's gate GEMM h -> E on every token, replicated at t > 1 (sequence parallelism
    splits it); the auxiliary loss in forward and its gradient in backward; the shared expert's
    gate h -> 1; the routed experts inside the tensor-parallel region."""
    name, t, s = "qwen1.5-moe-a2.7b", 2, 64
    z = _sizes(name)
    trace = _trace(name, 1, t, s)
    fwd, bwd = _block(trace, "fwd"), _block(trace, "bwd")
    router = fwd[(fwd["moe_role"] == "router") & (fwd["kind"] == "matmul")]
    assert list(zip(router["m"], router["k"], router["n"])) == [(s, z["h"], z["E"])]
    assert router["replicated"].all()
    assert (fwd[fwd["moe_role"] == "aux_loss"]["aten"].str.contains("_softmax")).any()
    assert (bwd[bwd["moe_role"] == "aux_loss"]["aten"] == "aten.ones_like.default").sum() == 1
    gate = fwd[(fwd["moe_role"] == "shared_expert") & (fwd["n"] == 1)]
    assert len(gate) == 1 and gate["replicated"].all()
    assert not fwd[fwd["moe_role"] == "expert"]["replicated"].any()
    assert not fwd["attention"][fwd["moe_role"] != ""].any()


@pytest.mark.parametrize(
    "name,t", [("mixtral-8x7b", 1), ("mixtral-8x7b", 8), ("qwen1.5-moe-a2.7b", 2)]
)
def test_moe_block_params_closed_form(name, t):
    z = _sizes(name)
    h, g, d, f, E, fs = (z[x] for x in ("h", "g", "d", "f", "E", "fs"))
    attention = (2 * h * h + 2 * h * g * d) // t
    if name.startswith("qwen"):
        attention += (h + 2 * g * d) // t  # Q, K, V biases (qkv_bias), column-parallel
    shared = 3 * h * fs // t + h if fs else 0  # shared expert + its gate (replicated)
    per_rank = attention + E * h + E * 3 * h * f // t + shared + 2 * h
    row = _row(_trace(name, 1, t, 64))
    assert row["param_bytes"] == 2 * per_rank
    assert row["expert_param_bytes"] == 2 * E * 3 * h * f // t
    layers = _trace(name, 1, t, 64).layers
    assert (layers[layers["kind"] != "block"]["expert_param_bytes"] == 0).all()


def test_no_aux_loss_without_its_coefficient(tmp_path):
    from phaze.trace.tracer import trace_model

    raw = get_model_spec("mixtral-8x7b").hf_config(2).to_dict()
    raw.update(router_aux_loss_coef=0.0, hidden_size=256, intermediate_size=512)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    spec = get_model_spec(str(tmp_path))
    assert spec.moe.aux_loss_coef == 0
    ops = trace_model(spec, 1, 1, seq=32).ops
    assert not (ops["moe_role"] == "aux_loss").any()
    assert (ops["moe_role"] == "router").any()


def test_dense_traces_carry_no_moe_marks():
    ops = _trace("llama3-8b", 1, 2, 64).ops
    assert (ops["moe_role"] == "").all() and (ops["expert"] == -1).all()
    assert set(ops.loc[ops["kind"] == "collective", "collective"]) == {"all_reduce"}
    assert (
        (_trace("llama3-8b", 1, 2, 64).layers[["experts", "expert_param_bytes"]] == 0).all().all()
    )


def test_moe_spec_checks_its_imbalance():
    spec = MoESpec("mixtral", 8, 2, 64, 0, True, 0.0)
    spec.check_imbalance(4.0, "m")
    for bad in (0.99, 4.01, float("nan")):
        with pytest.raises(PhazeError, match="moe_imbalance"):
            spec.check_imbalance(bad, "m")


# --- bad input through the CLI: exit 2, one line -------------------------------------------


def _config_json(tmp_path, name, **changes) -> str:
    raw = get_model_spec(name).hf_config().to_dict()
    raw.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return str(tmp_path / "config.json")


def _dense_json(tmp_path, model_type, **fields) -> str:
    raw = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 32,
        "vocab_size": 100,
        **fields,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return str(tmp_path / "config.json")


BAD_INPUTS = {
    # an MoE architecture phaze does not trace: refused, naming the field
    "unknown MoE layout": (
        lambda p: ["--model", _dense_json(p, "olmoe", num_experts=8, num_experts_per_tok=2)],
        "num_experts = 8",
    ),
    # a dense family carrying an MoE field HF would silently ignore
    "MoE field on a dense model": (
        lambda p: ["--model", _dense_json(p, "llama", num_local_experts=8)],
        "num_local_experts = 8",
    ),
    "unknown router": (
        lambda p: ["--model", _config_json(p, "qwen1.5-moe-a2.7b", scoring_func="sigmoid")],
        "scoring_func = 'sigmoid'",
    ),
    "router jitter": (
        lambda p: ["--model", _config_json(p, "mixtral-8x7b", router_jitter_noise=0.01)],
        "router_jitter_noise = 0.01",
    ),
    "dense blocks between MoE blocks": (
        lambda p: ["--model", _config_json(p, "qwen1.5-moe-a2.7b", decoder_sparse_step=2)],
        "decoder_sparse_step = 2",
    ),
    "listed dense blocks": (
        lambda p: ["--model", _config_json(p, "qwen1.5-moe-a2.7b", mlp_only_layers=[0])],
        "mlp_only_layers = [0]",
    ),
    "top-k above the experts": (
        lambda p: ["--model", _config_json(p, "mixtral-8x7b", num_experts_per_tok=9)],
        "num_experts_per_tok = 9 exceeds the 8 routed experts",
    ),
    "kv heads not dividing the heads": (
        lambda p: ["--model", _dense_json(p, "llama", num_key_value_heads=3)],
        "num_key_value_heads = 3 must divide num_attention_heads = 4",
    ),
    "tp above the kv heads": (
        lambda p: ["--model", _dense_json(p, "llama", num_key_value_heads=2), "--tp", "4"],
        "its 2 key/value heads",
    ),
    "imbalance below 1": (
        lambda p: ["--model", "mixtral-8x7b", "--config", _yaml(p, 0.5)],
        "moe_imbalance: 0.5 is less than the minimum of 1",
    ),
    "ep not dividing the experts": (
        lambda p: ["--model", "mixtral-8x7b", "--ep", "3"],
        "ep = 3 must divide the 8 routed experts",
    ),
    "ep on a dense model": (
        lambda p: ["--model", "llama3-8b", "--ep", "2"],
        "expert parallelism (ep = 2) needs a mixture-of-experts model",
    ),
    "etp neither tp nor 1": (
        lambda p: ["--model", "mixtral-8x7b", "--tp", "4", "--etp", "2"],
        "etp must be tp (4) or 1 (got 2)",
    ),
    "etp 1 on a dense model": (
        lambda p: ["--model", "llama3-8b", "--tp", "2", "--etp", "1"],
        "etp = 1 (experts without tensor parallelism) needs a mixture-of-experts model",
    ),
    "etp 1 with a sequence tp cannot split": (
        lambda p: ["--model", "mixtral-8x7b", "--tp", "4", "--etp", "1", "--seq", "4098"],
        "the sequence length 4098 must be divisible by tp = 4",
    ),
    "imbalance above E/k": (
        lambda p: ["--model", "mixtral-8x7b", "--config", _yaml(p, 4.5)],
        "trace.moe_imbalance = 4.5 must lie in [1, E/k = 8/2 = 4]",
    ),
}


def _yaml(tmp_path, factor) -> str:
    (tmp_path / "c.yaml").write_text(f"trace:\n  moe_imbalance: {factor}\n")
    return str(tmp_path / "c.yaml")


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    """In process (`phaze.cli.main`, what `python -m phaze` runs): exit 2, one line naming the
    field, no output directory."""
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


# --- the tables ------------------------------------------------------------------------------


def test_moe_columns_are_checked_and_default_for_dense_tables(tmp_path):
    """A trace's MoE columns are schema columns: checked on read; a table without them (written
    before they existed, or by hand) is a dense model's: no MoE role, no expert, no experts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from phaze.io.tables import read_table, write_table

    trace = _trace("mixtral-8x7b", 1, 2, 64)
    write_table(trace.ops, tmp_path / "ops.parquet", "ops")
    back = read_table(tmp_path / "ops.parquet", "ops")
    assert back["expert"].max() == 7 and set(back["moe_role"]) >= {"dispatch", "combine"}
    dense = trace.ops[trace.ops["moe_role"] == ""].drop(columns=["moe_role", "expert"])
    pq.write_table(pa.Table.from_pandas(dense, preserve_index=False), tmp_path / "old.parquet")
    old = read_table(tmp_path / "old.parquet", "ops")
    assert (old["moe_role"] == "").all() and (old["expert"] == -1).all()
    layers = trace.layers.drop(columns=["expert_param_bytes", "experts"])
    write_table(layers, tmp_path / "layers.parquet", "layers")
    assert (read_table(tmp_path / "layers.parquet", "layers")["experts"] == 0).all()
    for column, value, needle in (
        ("expert", -2, "'expert' must be finite and >= -1"),
        ("moe_role", "gate", "'moe_role' must be one of"),
    ):
        bad = trace.ops.copy()
        bad.loc[bad.index[0], column] = value
        write_table(bad, tmp_path / "bad.parquet", "ops")
        with pytest.raises(PhazeError, match=needle):
            read_table(tmp_path / "bad.parquet", "ops")
