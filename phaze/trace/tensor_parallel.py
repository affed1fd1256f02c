"""Megatron tensor-model parallelism as a rewrite of the model's shapes (imported lazily: torch).

For width ``t`` every block is rewritten into what ONE rank of a Megatron tensor-parallel group
holds and executes, and is then traced like any model, so autograd (not hand-written rules) still
produces the backward graph:

* column-parallel linears (QKV or Q/K/V, FC1, gate/up) keep 1/t of their output features (and of
  their bias); the attention module keeps 1/t of its heads;
* row-parallel linears (attention-out, FC2/down) keep 1/t of their input features, compute the
  partial product, all-reduce it (Megatron's ``g``: all-reduce forward, identity backward) and
  only then add the full bias, as Megatron's RowParallelLinear does;
* the input of each column-parallel group goes through Megatron's ``f`` (identity forward,
  all-reduce of the input gradient backward). It is applied once per module that owns the group
  (attention, MLP), so Q, K and V share ONE backward all-reduce, as with Megatron's fused QKV;
  latent attention's groups start at the replicated down-projections' outputs
  (:func:`latent_attention_rules`).

* the word embedding and the LM head are vocab-parallel (Megatron's VocabParallelEmbedding and
  column-parallel output layer): each rank holds ceil(V/t) rows (the vocabulary padded to a
  multiple of t; Megatron pads further, to a multiple of 128·t), looks up only its rows, zeroes
  the others and all-reduces the embedding output in forward; the head's input gets ``f`` (one
  backward all-reduce) and the loss runs on the rank's V/t logits. Megatron's vocab-parallel
  cross-entropy adds three all-reduces of b·s scalars (max, sum of exp, target logit) that are
  not modelled: each is 1/h of a block all-reduce.

The collective is a custom op ``phaze::all_reduce(x, group_size)`` so the recorder sees it as one
operator at the right place in the graph.
"""

from __future__ import annotations

import torch
from torch import nn

from phaze.errors import PhazeError


@torch.library.custom_op("phaze::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Sum over the tensor-parallel group (a single-process stand-in: the shape is what matters)."""
    return x.clone()


@all_reduce.register_fake
def _all_reduce_fake(x: torch.Tensor, group_size: int) -> torch.Tensor:
    return torch.empty_like(x)


ALL_REDUCE_OP = "phaze.all_reduce.default"


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group_size):
        ctx.group_size = group_size
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group_size), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group_size):
        return all_reduce(x, group_size)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# Per family, relative to one block: modules whose input enters a column-parallel group (gets
# `f`), the column-parallel and row-parallel linears, and the attention module (heads divided).
TP_RULES: dict[str, dict[str, list[str]]] = {
    "gpt2": {
        "group_inputs": ["attn", "mlp"],
        "column": ["attn.c_attn", "mlp.c_fc"],
        "row": ["attn.c_proj", "mlp.c_proj"],
        "attention": ["attn"],
    },
    "bert": {
        "group_inputs": ["attention.self", "intermediate"],
        "column": [
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "intermediate.dense",
        ],
        "row": ["attention.output.dense", "output.dense"],
        "attention": ["attention.self"],
    },
    "opt": {
        "group_inputs": ["self_attn", "fc1"],
        "column": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "fc1"],
        "row": ["self_attn.out_proj", "fc2"],
        "attention": ["self_attn"],
    },
    "llama": {
        "group_inputs": ["self_attn", "mlp"],
        "column": [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ],
        "row": ["self_attn.o_proj", "mlp.down_proj"],
        "attention": ["self_attn"],
    },
}
TP_RULES["megatron-bert"] = TP_RULES["bert"]
# Mixture-of-experts blocks: attention as Llama's (grouped-query heads sliced with the query
# heads); the routed experts are sliced by phaze.trace.moe_layer itself (Megatron's expert tensor
# parallelism: each expert's FFN like a dense MLP); Qwen2-MoE's shared expert is a dense MLP with
# its own f and g, as Megatron's SharedExpertMLP (its sigmoid gate stays replicated).
_ATTENTION_ONLY = {
    "group_inputs": ["self_attn"],
    "column": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    "row": ["self_attn.o_proj"],
    "attention": ["self_attn"],
}
TP_RULES["mixtral"] = _ATTENTION_ONLY
_SHARED = "mlp.shared_expert.mlp"
TP_RULES["qwen2_moe"] = {
    "group_inputs": [*_ATTENTION_ONLY["group_inputs"], _SHARED],
    "column": [*_ATTENTION_ONLY["column"], f"{_SHARED}.gate_proj", f"{_SHARED}.up_proj"],
    "row": [*_ATTENTION_ONLY["row"], f"{_SHARED}.down_proj"],
    "attention": ["self_attn"],
}

TP_RULES["qwen3"] = TP_RULES["llama"]  # Qwen3's per-head q/k norms stay whole (head_dim wide)
TP_RULES["qwen3_moe"] = _ATTENTION_ONLY


def latent_attention_rules(block: nn.Module) -> dict[str, list[str]]:
    """Megatron-LM's slicing of a DeepSeek-V3 block (``MLASelfAttention``): the down-projections
    to the latents (q_a_proj, kv_a_proj_with_mqa: ``linear_q_down_proj``,
    ``linear_kv_down_proj``, 'duplicated') and the latents' RMSNorms are replicated; the
    up-projections from the latents (q_b_proj, kv_b_proj: ``linear_q_up_proj``,
    ``linear_kv_up_proj``) are column-parallel, each rank keeping its heads, and the output
    projection is row-parallel. The column-parallel group starts at the latents, so ``f`` (the
    backward all-reduce) sits on each down-projection's output, b·s·q_rank and
    b·s·(kv_rank + rope) wide: the rope key part is shared by every head, its gradient summed
    over the ranks' heads, as Megatron's sequence-parallel gather of ``k_pos_emb`` does. Without
    a query latent (q_lora_rank null) the query projection is column-parallel on the block's
    input. The MLP: a dense block's as Llama's; a MoE block's shared expert a dense MLP with its
    own f/g (Megatron's SharedExpertMLP), the routed experts sliced by phaze.trace.moe_layer."""
    attn = block.get_submodule("self_attn")
    column, group_inputs, group_outputs = (
        ["self_attn.kv_b_proj"],
        [],
        ["self_attn.kv_a_proj_with_mqa"],
    )
    if getattr(attn, "q_proj", None) is not None:
        column.append("self_attn.q_proj")
        group_inputs.append("self_attn.q_proj")
    else:
        column.append("self_attn.q_b_proj")
        group_outputs.append("self_attn.q_a_proj")
    row = ["self_attn.o_proj"]
    mlp = block.get_submodule("mlp")
    prefix = "mlp.shared_expert.mlp" if hasattr(mlp, "shared_expert") else "mlp"
    if prefix == "mlp" or mlp.shared_expert is not None:
        group_inputs.append(prefix)
        column += [f"{prefix}.gate_proj", f"{prefix}.up_proj"]
        row.append(f"{prefix}.down_proj")
    return {
        "group_inputs": group_inputs,
        "group_outputs": group_outputs,
        "column": column,
        "row": row,
        "attention": ["self_attn"],
    }


# Attention attributes that count heads or per-rank widths (divided by t when present).
_HEAD_ATTRS = (
    "num_heads",
    "num_attention_heads",
    "num_key_value_heads",
    "all_head_size",
    "split_size",
)


def _is_conv1d(module: nn.Module) -> bool:
    # GPT-2's Conv1D stores its weight as [in, out] (transposed w.r.t. nn.Linear).
    return type(module).__name__ == "Conv1D"


#: attribute set on every parameter the rewrite slices (column- and row-parallel weights, their
#: sliced biases, vocab-parallel embedding and head): the recorder finds the tensor-parallel
#: region from them (phaze.trace.recorder)
SLICED = "_phaze_tensor_parallel"


def _new_param(shape) -> nn.Parameter:
    p = nn.Parameter(torch.empty(shape, device="meta"))
    setattr(p, SLICED, True)
    return p


def _slice_column(module: nn.Module, t: int) -> None:
    w = module.weight
    if _is_conv1d(module):
        module.weight = _new_param((w.shape[0], _div(w.shape[1], t, module)))
        module.nf = module.weight.shape[1]
    else:
        module.weight = _new_param((_div(w.shape[0], t, module), w.shape[1]))
        module.out_features = module.weight.shape[0]
    if getattr(module, "bias", None) is not None:
        module.bias = _new_param((_div(module.bias.shape[0], t, module),))


class RowParallelLinear(nn.Module):
    """One rank's share of a row-parallel linear: partial product, all-reduce, then the bias."""

    def __init__(self, inner: nn.Module, t: int):
        super().__init__()
        self.group_size = t
        self.transposed = _is_conv1d(inner)
        w = inner.weight
        if self.transposed:
            self.weight = _new_param((_div(w.shape[0], t, inner), w.shape[1]))
        else:
            self.weight = _new_param((w.shape[0], _div(w.shape[1], t, inner)))
        self.bias = inner.bias if getattr(inner, "bias", None) is not None else None

    def forward(self, x):
        partial = x @ self.weight if self.transposed else nn.functional.linear(x, self.weight)
        out = _ReduceFromTensorParallel.apply(partial, self.group_size)
        return out + self.bias if self.bias is not None else out


def _div(n: int, t: int, where) -> int:
    if n % t:
        raise PhazeError(f"cannot slice {n} features of {type(where).__name__} {t} ways")
    return n // t


def _group_input_hook(t: int):
    def hook(module, args, kwargs):
        if args:
            args = (_CopyToTensorParallel.apply(args[0], t),) + tuple(args[1:])
        elif "hidden_states" in kwargs:
            kwargs = dict(
                kwargs, hidden_states=_CopyToTensorParallel.apply(kwargs["hidden_states"], t)
            )
        else:
            raise PhazeError(
                f"cannot find the input of {type(module).__name__} to mark tensor-parallel"
            )
        return args, kwargs

    return hook


def apply_tensor_parallel(block: nn.Module, family: str, t: int) -> None:
    """Rewrite ``block`` in place into one rank's share of a width-``t`` Megatron group."""
    if t == 1:
        return
    if family == "deepseek_v3":
        rules = latent_attention_rules(block)
    elif family in TP_RULES:
        rules = TP_RULES[family]
    else:
        raise PhazeError(f"tensor-parallel slicing is not defined for family {family!r}")
    for path in rules["attention"]:
        attn = block.get_submodule(path)
        for attr in _HEAD_ATTRS:
            value = getattr(attn, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(attn, attr, _div(value, t, attn))
    for path in rules["column"]:
        _slice_column(block.get_submodule(path), t)
    for path in rules["row"]:
        parent_path, _, leaf = path.rpartition(".")
        parent = block.get_submodule(parent_path) if parent_path else block
        setattr(parent, leaf, RowParallelLinear(getattr(parent, leaf), t))
    for path in rules["group_inputs"]:
        block.get_submodule(path).register_forward_pre_hook(_group_input_hook(t), with_kwargs=True)
    for path in rules.get("group_outputs", ()):
        block.get_submodule(path).register_forward_hook(
            lambda module, args, out: _CopyToTensorParallel.apply(out, t)
        )


class VocabParallelEmbedding(nn.Module):
    """One rank's rows of a vocab-parallel word embedding (rank 0: rows [0, rows))."""

    def __init__(self, rows: int, hidden: int, t: int):
        super().__init__()
        self.weight = _new_param((rows, hidden))
        self.rows, self.group_size = rows, t

    def forward(self, ids):
        outside = (ids < 0) | (ids >= self.rows)
        local = ids.masked_fill(outside, 0)
        out = nn.functional.embedding(local, self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return _ReduceFromTensorParallel.apply(out, self.group_size)


def apply_vocab_parallel(model: nn.Module, t: int) -> None:
    """Make the word embedding and the LM head (tied or not) vocab-parallel, in place."""
    if t == 1:
        return
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    vocab, hidden = emb.weight.shape
    rows = -(-vocab // t)
    tied = head is not None and head.weight is emb.weight
    new_emb = VocabParallelEmbedding(rows, hidden, t)
    model.set_input_embeddings(new_emb)
    if head is not None:
        head.weight = new_emb.weight if tied else _new_param((rows, head.weight.shape[1]))
        if getattr(head, "bias", None) is not None:
            head.bias = _new_param((rows,))
        head.out_features = rows
        model.set_output_embeddings(head)  # BERT: also re-points predictions.bias
        head.register_forward_pre_hook(_group_input_hook(t), with_kwargs=True)
    # HF's losses view the logits as (-1, config.vocab_size) — the MoE causal LMs pass their own
    # copy, model.vocab_size: each rank's loss sees its rows.
    model.config.vocab_size = rows
    if isinstance(getattr(model, "vocab_size", None), int):
        model.vocab_size = rows
