"""The MoE layer phaze traces: Megatron-LM's, on one tensor-parallel rank (imports torch).

Each block's Hugging Face sparse-MoE module is replaced by :class:`MoELayer`, which keeps HF's
router (and shared expert) modules and parameters and runs what Megatron-LM's ``MoELayer`` with the
all-to-all token dispatcher runs (``megatron/core/transformer/moe/``: ``router.py``,
``token_dispatcher.py`` — "permute -> A2A(EP) -> AG(TP) -> ... experts ... -> RS(TP) -> A2A(EP) ->
unpermute" —, ``experts.py``'s SequentialMLP, ``shared_experts.py``), with the number of tokens
each expert receives set by the stated distribution (``phaze.trace.moe.tokens_per_expert``)
instead of the data-dependent one:

* **router** (HF's module): gate linear h -> E, softmax, top-k (Mixtral, Qwen3-MoE: the k weights
  renormalised; DeepSeek-V3: sigmoid scores plus the balancing bias, the best topk_group of
  n_group expert groups, top-k within them, renormalised and scaled); replicated on every
  tensor-parallel rank (Megatron runs it on the rank's tokens);
* **aux_loss**: Megatron's ``switch_load_balancing_loss_func`` on a second softmax of the logits
  and the routing map's token counts, attached to the routing weights by ``MoEAuxLossAutoScaler``
  (its gradient, ``ones_like(loss)``, enters backward there); absent when the coefficient is 0;
* **dispatch**: the local permutation into expert-major order (an index argsort — the stand-in for
  Megatron's ``masked_select`` of the routing map, whose size is data-dependent — and an
  ``index_select`` of the b·s·k token rows), then ``phaze::all_to_all`` over the ep ranks of the
  expert-parallel group (the rank sends its b·s·k assignment rows and receives the rows of its
  E/ep experts from every rank of the group), then Megatron's ``f`` for tp > 1 (identity forward,
  all-reduce of the gradient: the non-sequence-parallel form of the AG(TP)), then the split into
  per-expert chunks of the stated sizes;
* **expert** e (one module per routed expert of the rank — E/ep of them, those of the busiest
  rank —, its own weights as Megatron's SequentialMLP):
  fc1 h -> 2f/tp (gate and up, column-parallel), act(gate)·up, fc2 f/tp -> h (row-parallel,
  partial sums);
* **combine**: concatenation of the expert outputs, ``g`` for tp > 1 (all-reduce forward: the
  non-sequence-parallel form of the RS(TP)), ``phaze::all_to_all`` back, multiplication by the
  routing weights and the scatter-add into the b·s token rows (Megatron's ``unpermute``), plus
  the shared expert's output;
* **shared_expert** (Qwen2-MoE, DeepSeek-V3): HF's dense MLP of width f_s, sliced by tp as a dense
  MLP with its own ``f``/``g`` (Megatron's SharedExpertMLP), times ``sigmoid(x·w_gate)`` for
  Qwen2-MoE (the gate replicated); DeepSeek-V3's is ungated.

**Experts without tensor parallelism** (``etp = 1``, Megatron's ``--expert-tensor-parallel-size
1``) at tp > 1: Megatron's MoE layer then runs on the rank's own sequence-parallel shard of the
tokens (b·s/tp of them, which MoE training with tp > 1 always has) and skips the AG(TP)/RS(TP):
"permute -> A2A(EP) -> experts -> A2A(EP) -> unpermute". The trace keeps the rest of the block in
its usual form (the block's replicated tokens) and brackets the routed path with two free
stand-ins, ``phaze::sp_split`` (the rank's b·s/tp rows) and ``phaze::sp_gather`` (back to b·s
rows), which the recorder counts as entering and leaving the tensor-parallel region: the router,
dispatch, experts and combine are then the rank's own work on its shard (never split again by
sequence parallelism), each expert is whole (fc1 h -> 2f, fc2 f -> h, its weights not sliced),
the all-to-alls carry the shard's b·s·k/tp rows on a group of ep consecutive ranks, and no
``f``/``g`` runs around the experts. The shared expert stays a tensor-parallel dense MLP on the
block's tokens, as in Megatron.

Every op the layer runs is tagged with its role (and expert index) through module hooks the
tracer installs (``ROLE_ATTR``/``EXPERT_ATTR``); expert weights carry ``EXPERT_PARAM``.
"""

from __future__ import annotations

import torch
from torch import nn

from phaze.errors import PhazeError
from phaze.trace.moe import ROLES, MoESpec, rank_tokens_per_expert
from phaze.trace.tensor_parallel import SLICED, _CopyToTensorParallel, _ReduceFromTensorParallel


@torch.library.custom_op("phaze::all_to_all", mutates_args=())
def all_to_all(x: torch.Tensor, group_size: int, rows: int) -> torch.Tensor:
    """Exchange over the expert-parallel group of `group_size` ranks: the rank sends the rows of
    `x` and receives `rows` rows (a single-process stand-in: the shapes matter)."""
    return x.new_empty((rows, *x.shape[1:]))


@all_to_all.register_fake
def _all_to_all_fake(x: torch.Tensor, group_size: int, rows: int) -> torch.Tensor:
    return x.new_empty((rows, *x.shape[1:]))


ALL_TO_ALL_OP = "phaze.all_to_all.default"


@torch.library.custom_op("phaze::sp_split", mutates_args=())
def sp_split(x: torch.Tensor, parts: int) -> torch.Tensor:
    """The rank's 1/parts of the rows of ``x`` (its sequence-parallel shard): free, since under
    sequence parallelism the rank holds only those rows to begin with."""
    return x.new_empty((x.shape[0] // parts, *x.shape[1:]))


@sp_split.register_fake
def _sp_split_fake(x: torch.Tensor, parts: int) -> torch.Tensor:
    return x.new_empty((x.shape[0] // parts, *x.shape[1:]))


@torch.library.custom_op("phaze::sp_gather", mutates_args=())
def sp_gather(x: torch.Tensor, parts: int) -> torch.Tensor:
    """The shard's rows back in the block's form (parts times as many): free, since under
    sequence parallelism the rest of the block runs on the shard."""
    return x.new_empty((x.shape[0] * parts, *x.shape[1:]))


@sp_gather.register_fake
def _sp_gather_fake(x: torch.Tensor, parts: int) -> torch.Tensor:
    return x.new_empty((x.shape[0] * parts, *x.shape[1:]))


SP_SPLIT_OP = "phaze.sp_split.default"
SP_GATHER_OP = "phaze.sp_gather.default"


class _ToShard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, parts):
        ctx.parts = parts
        return sp_split(x, parts)

    @staticmethod
    def backward(ctx, grad):
        return sp_gather(grad, ctx.parts), None


class _FromShard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, parts):
        ctx.parts = parts
        return sp_gather(x, parts)

    @staticmethod
    def backward(ctx, grad):
        return sp_split(grad, ctx.parts), None


#: module attributes naming an op's MoE role and routed-expert index (read by the tracer's hooks)
ROLE_ATTR = "_phaze_moe_role"
EXPERT_ATTR = "_phaze_expert"
#: attribute on every routed expert's weight (the parameters expert parallelism divides)
EXPERT_PARAM = "_phaze_expert_param"


def _tag(module: nn.Module, role: str, expert: int = -1) -> nn.Module:
    assert role in ROLES, role
    setattr(module, ROLE_ATTR, role)
    setattr(module, EXPERT_ATTR, expert)
    return module


class _AllToAll(torch.autograd.Function):
    """The expert-parallel all-to-all: forward exchanges the tokens, backward their gradients."""

    @staticmethod
    def forward(ctx, x, group_size, rows):
        ctx.group_size, ctx.rows = group_size, x.shape[0]
        return all_to_all(x, group_size, rows)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all(grad, ctx.group_size, ctx.rows), None, None


class _AuxLossScaler(torch.autograd.Function):
    """Megatron's MoEAuxLossAutoScaler: identity on the routing weights; in backward the
    auxiliary loss gets the gradient ``ones_like(loss)`` (no loss scaling in bf16 training)."""

    @staticmethod
    def forward(ctx, output, aux_loss):
        ctx.save_for_backward(aux_loss)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad):
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.ones_like(aux_loss)


def _param(shape, tp: int, expert: bool) -> nn.Parameter:
    p = nn.Parameter(torch.empty(shape, device="meta"))
    if tp > 1:
        setattr(p, SLICED, True)
    if expert:
        setattr(p, EXPERT_PARAM, True)
    return p


class AuxLoss(nn.Module):
    def __init__(self, experts: int, top_k: int, coef: float):
        super().__init__()
        self.experts, self.top_k, self.coef = experts, top_k, coef

    def forward(self, logits, indices, scores):
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        with torch.no_grad():  # the routing map and its token counts carry no gradient
            routing_map = torch.zeros_like(probs, dtype=torch.bool).scatter(1, indices, True)
            counts = routing_map.sum(dim=0)
        tokens = probs.shape[0]
        scale = self.experts * self.coef / (self.top_k * tokens * tokens)
        aux = torch.sum(probs.sum(dim=0) * counts) * scale
        return _AuxLossScaler.apply(scores, aux)


class Dispatch(nn.Module):
    def __init__(self, top_k: int, tp: int, ep: int):
        super().__init__()
        self.top_k, self.tp, self.ep = top_k, tp, ep

    def forward(self, x, indices, scores, counts: list[int]):
        """``counts``: the token rows each of the rank's routed experts receives (from every rank
        of its expert-parallel group)."""
        order = torch.argsort(indices.flatten(), stable=True)  # expert-major assignment order
        token = torch.div(order, self.top_k, rounding_mode="floor")  # each assignment's token
        permuted = x.index_select(0, token)
        permuted_scores = scores.flatten().index_select(0, order)
        out = _AllToAll.apply(permuted, self.ep, sum(counts))
        if self.tp > 1:
            out = _CopyToTensorParallel.apply(out, self.tp)
        return out.split(counts), token, permuted_scores


class Expert(nn.Module):
    """One routed expert of one rank: fc1 (gate and up halves, f/tp rows each), fc2."""

    def __init__(self, hidden: int, ffn: int, tp: int, act):
        super().__init__()
        self.fc1 = _param((2 * (ffn // tp), hidden), tp, True)
        self.fc2 = _param((hidden, ffn // tp), tp, True)
        self.act = act

    def forward(self, x):
        gate, up = nn.functional.linear(x, self.fc1).chunk(2, dim=-1)
        return nn.functional.linear(self.act(gate) * up, self.fc2)


class Combine(nn.Module):
    def __init__(self, tp: int, ep: int):
        super().__init__()
        self.tp, self.ep = tp, ep

    def forward(self, outs, token, permuted_scores, tokens: int, shared=None):
        y = torch.cat(outs, dim=0)
        if self.tp > 1:
            y = _ReduceFromTensorParallel.apply(y, self.tp)
        y = _AllToAll.apply(y, self.ep, token.shape[0])  # back: the rank's b·s·k assignments
        y = y * permuted_scores.unsqueeze(-1)
        out = y.new_zeros((tokens, y.shape[-1])).index_add(0, token, y)
        return out if shared is None else out + shared


class SharedExpert(nn.Module):
    """HF's shared expert MLP (tensor-parallel like a dense MLP), times its sigmoid gate when it
    has one (Qwen2-MoE; DeepSeek-V3's shared experts are ungated)."""

    def __init__(self, mlp: nn.Module, gate: nn.Module | None):
        super().__init__()
        self.mlp, self.gate = mlp, gate

    def forward(self, x):
        y = self.mlp(x)
        return y if self.gate is None else torch.sigmoid(self.gate(x)) * y


def _require(module: nn.Module, attr: str, where: str):
    value = getattr(module, attr, None)
    if value is None:
        raise PhazeError(
            f"{where}: Hugging Face's {type(module).__name__} has no {attr!r}; its MoE layout is "
            "not the one phaze traces"
        )
    return value


class MoELayer(nn.Module):
    """Replaces one block's HF sparse-MoE module (see the module docstring)."""

    def __init__(
        self,
        hf: nn.Module,
        spec: MoESpec,
        hidden: int,
        tp: int,
        imbalance: float,
        where: str,
        ep: int = 1,
        etp: int | None = None,
    ):
        super().__init__()
        gate = _require(hf, "gate", where)
        experts = _require(hf, "experts", where)
        e, f, h = spec.experts, spec.expert_ffn, hidden
        shapes = {
            "gate.weight": (tuple(gate.weight.shape), (e, h)),
            "experts.gate_up_proj": (tuple(experts.gate_up_proj.shape), (e, 2 * f, h)),
            "experts.down_proj": (tuple(experts.down_proj.shape), (e, h, f)),
        }
        for name, (got, want) in shapes.items():
            if got != want:
                raise PhazeError(
                    f"{where}: Hugging Face built {name} of shape {got}, phaze expects {want} "
                    "from the config; its MoE layout is not the one phaze traces"
                )
        spec.check_ep(ep, where)
        etp = tp if etp is None else etp
        if etp not in (1, tp):
            raise PhazeError(f"{where}: the experts' tensor-parallel size etp must be tp or 1")
        self.spec, self.tp, self.imbalance, self.ep = spec, tp, imbalance, ep
        # at etp = 1 (tp > 1) the routed path runs on the rank's shard of 1/tp of the tokens
        self.shard = tp // etp
        self.gate = _tag(gate, "router")
        self.aux_loss = (
            _tag(AuxLoss(e, spec.top_k, spec.aux_loss_coef), "aux_loss")
            if spec.aux_loss_coef > 0
            else None
        )
        self.dispatch = _tag(Dispatch(spec.top_k, etp, ep), "dispatch")
        # the rank's E/ep routed experts (those of the busiest rank: expert 0 is the busiest)
        self.experts = nn.ModuleList(
            _tag(Expert(h, f, etp, experts.act_fn), "expert", i) for i in range(e // ep)
        )
        self.combine = _tag(Combine(etp, ep), "combine")
        self.shared_expert = None
        if spec.shared_ffn:
            mlp = _require(hf, "shared_expert" if spec.shared_gate else "shared_experts", where)
            if tuple(mlp.down_proj.weight.shape) != (h, spec.shared_ffn):
                raise PhazeError(
                    f"{where}: Hugging Face built a shared expert of width "
                    f"{mlp.down_proj.weight.shape[1]}, the config says {spec.shared_ffn}"
                )
            gate = _require(hf, "shared_expert_gate", where) if spec.shared_gate else None
            self.shared_expert = _tag(SharedExpert(mlp, gate), "shared_expert")

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        shared = self.shared_expert(x) if self.shared_expert is not None else None
        if self.shard > 1:
            x = _ToShard.apply(x, self.shard)
            if shared is not None:
                shared = _ToShard.apply(shared, self.shard)
        tokens = x.shape[0]
        logits, scores, indices = self.gate(x)
        if self.aux_loss is not None:
            scores = self.aux_loss(logits, indices, scores)
        counts = rank_tokens_per_expert(
            tokens, self.spec.experts, self.spec.top_k, self.imbalance, self.ep
        )
        chunks, token, permuted_scores = self.dispatch(x, indices, scores, counts)
        outs = [expert(chunk) for expert, chunk in zip(self.experts, chunks)]
        out = self.combine(outs, token, permuted_scores, tokens, shared)
        if self.shard > 1:
            out = _FromShard.apply(out, self.shard)
        return out.view(b, s, h)


def apply_moe(
    block: nn.Module,
    spec: MoESpec,
    hidden: int,
    tp: int,
    imbalance: float,
    where,
    ep: int = 1,
    etp: int | None = None,
):
    """Replace ``block.mlp`` (HF's sparse-MoE module) by one rank's :class:`MoELayer` (expert
    parallelism of size ``ep``, the experts' tensor-parallel size ``etp``: tp or 1)."""
    hf = getattr(block, "mlp", None)
    if hf is None:
        raise PhazeError(f"{where}: the block has no 'mlp' module to replace by the MoE layer")
    block.mlp = MoELayer(hf, spec, hidden, tp, imbalance, where, ep, etp)
