"""Mixture-of-experts layouts phaze traces, and the token distribution it states (no torch).

A MoE block's routing is data-dependent: which tokens go to which expert is decided by the
router's top-k on real activations, which the meta device does not have. phaze therefore traces
every operator of the layer (router, auxiliary loss, dispatch, expert MLPs, combine, shared
expert) with the per-expert token counts set by a STATED distribution
(:func:`tokens_per_expert`): balanced top-k by default, with an imbalance factor as a knob.

Layouts (:func:`moe_layout`) are read from a Hugging Face config per ``model_type``; a config
whose MoE layer phaze cannot represent faithfully (an unknown MoE model type, a field that
changes the router or which blocks are sparse) is an error naming the field, never a dense trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from phaze.errors import PhazeError

#: the roles of a MoE layer's ops (the ops table's ``moe_role``; "" outside a MoE layer)
ROLES = ("router", "aux_loss", "dispatch", "expert", "combine", "shared_expert")

#: model types whose MoE layer phaze traces (phaze.trace.moe_layer), and HF's classes for them
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")

#: config fields that announce a mixture-of-experts layer in some Hugging Face architecture: a
#: config of any other model type with one of them set is refused (HF would build something phaze
#: does not trace, or silently ignore the field and build a dense model)
MOE_FIELDS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "moe_layer_freq",
    "first_k_dense_replace",
    "moe_topk",
)

#: DeepSeek-V3's own layout and router fields (HF's DeepseekV3 builds them): not foreign to it
DEEPSEEK_FIELDS = (
    "scoring_func",
    "topk_method",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "aux_loss_alpha",
    "seq_aux",
)

#: fields of other MoE architectures' routers and layouts (DeepSeek's grouped / sigmoid routers,
#: dense first layers, Megatron-style router options): HF's Mixtral and Qwen-MoE ignore them, so
#: a config of a supported type that sets one describes a router or layout phaze would not trace
FOREIGN_ROUTER_FIELDS = DEEPSEEK_FIELDS + (
    "router_type",
    "moe_router_score_function",
    "moe_router_topk",
    "capacity_factor",
    "moe_expert_capacity_factor",
)


@dataclass(frozen=True)
class MoESpec:
    """One MoE layer (every block has one, but the ``dense_blocks`` first, which have a dense MLP
    of width ``dense_ffn``; phaze replicates one traced block of each kind)."""

    model_type: str
    experts: int  # routed experts E
    top_k: int  # experts per token k
    expert_ffn: int  # FFN width of one routed expert
    shared_ffn: int  # FFN width of the shared expert, 0 if none
    norm_topk: bool  # renormalise the k routing weights to sum to 1
    aux_loss_coef: float  # load-balancing loss coefficient; 0: no auxiliary loss
    score: str = "softmax"  # the router's scoring function: softmax or sigmoid (DeepSeek-V3)
    groups: int = 1  # expert groups of group-limited routing (DeepSeek-V3's n_group)
    topk_groups: int = 1  # groups each token may route to (topk_group)
    shared_gate: bool = True  # the shared expert's output is scaled by a sigmoid gate (Qwen)
    dense_blocks: int = 0  # the first blocks are dense (DeepSeek-V3's first_k_dense_replace)
    dense_ffn: int = 0  # their MLP's FFN width

    @property
    def max_imbalance(self) -> float:
        """E/k: the busiest expert can receive each token at most once (top-k picks k distinct
        experts), so its share b·s is E/k times the balanced share b·s·k/E."""
        return self.experts / self.top_k

    def check_ep(self, ep: int, name: str) -> None:
        """Megatron-LM shards the routed experts evenly: ep must divide their count."""
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or self.experts % ep:
            raise PhazeError(
                f"{name}: the expert-parallel size ep = {ep} must divide the {self.experts} "
                "routed experts (each rank holds E/ep whole experts)"
            )

    def check_imbalance(self, factor: float, name: str) -> None:
        if not (isinstance(factor, (int, float)) and math.isfinite(factor)):
            raise PhazeError(f"{name}: trace.moe_imbalance must be a finite number, got {factor!r}")
        if factor < 1 or Fraction(factor) > Fraction(self.experts, self.top_k):
            raise PhazeError(
                f"{name}: trace.moe_imbalance = {factor:g} must lie in [1, E/k = "
                f"{self.experts}/{self.top_k} = {self.max_imbalance:g}] (1 = balanced; the "
                "busiest expert cannot receive more than every token once)"
            )


def rank_tokens_per_expert(
    tokens: int, experts: int, top_k: int, imbalance: float = 1.0, ep: int = 1
) -> list[int]:
    """The token rows each routed expert of the busiest rank of an expert-parallel group of
    ``ep`` ranks receives, each rank routing ``tokens`` tokens: the group's ep·tokens tokens are
    distributed by :func:`tokens_per_expert` and the rank holds experts 0 .. E/ep − 1 (the
    busiest expert among them). Balanced, each of its E/ep experts gets ep·tokens·k/E rows: the
    rank receives as many rows as it sends (tokens·k)."""
    if ep < 1 or experts % ep:
        raise PhazeError(f"the expert-parallel size ep = {ep} must divide the {experts} experts")
    return tokens_per_expert(ep * tokens, experts, top_k, imbalance)[: experts // ep]


def tokens_per_expert(tokens: int, experts: int, top_k: int, imbalance: float = 1.0) -> list[int]:
    """Token-expert assignments per expert for ``tokens`` tokens routed top-``top_k``.

    The ``tokens·k`` assignments are split so that expert 0, the busiest, gets
    ``ceil(imbalance · tokens·k/E)`` (at most ``tokens``: top-k never picks an expert twice for
    one token) and the other E − 1 experts share the rest as evenly as whole tokens allow (the
    first ones one more). ``imbalance = 1`` is the balanced distribution: every expert gets
    ``tokens·k/E``, rounded. The counts sum to ``tokens·k`` and none exceeds the busiest one.
    """
    if tokens < 1 or experts < 1 or not 1 <= top_k <= experts:
        raise PhazeError(
            f"cannot route {tokens} tokens top-{top_k} over {experts} experts "
            "(need tokens >= 1 and 1 <= k <= E)"
        )
    if not 1 <= imbalance or Fraction(imbalance) > Fraction(experts, top_k):
        raise PhazeError(f"imbalance {imbalance:g} outside [1, E/k = {experts / top_k:g}]")
    assignments = tokens * top_k
    # exact arithmetic: imbalance · assignments / E as a fraction, then rounded up
    busiest = min(tokens, math.ceil(Fraction(imbalance) * assignments / experts))
    busiest = max(busiest, -(-assignments // experts))  # never below the balanced maximum
    if experts == 1:
        return [assignments]
    rest, others = assignments - busiest, experts - 1
    base, extra = divmod(rest, others)
    return [busiest] + [base + (1 if i < extra else 0) for i in range(others)]


def _present(raw: dict, key: str) -> bool:
    value = raw.get(key)
    return value not in (None, False, 0, [], {}, "")


def _integer(raw: dict, key: str, where: str, low: int = 1) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PhazeError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
    return value


def moe_layout(raw: dict, where: str) -> MoESpec | None:
    """The MoE layer of a config (its ``to_dict()``, defaults included, or the config.json's
    fields), None for a dense model; PhazeError naming the field for anything phaze cannot trace
    faithfully. ``where`` names the model in messages."""
    model_type = raw.get("model_type")
    if model_type not in MOE_TYPES:
        for key in MOE_FIELDS:
            if _present(raw, key):
                raise PhazeError(
                    f"{where}: {key} = {raw[key]!r} describes a mixture-of-experts layer, but "
                    f"phaze traces MoE layers only for model_type {' and '.join(MOE_TYPES)} "
                    f"(this is {model_type!r}); refusing a trace that would not route tokens"
                )
        return None
    own = DEEPSEEK_FIELDS if model_type == "deepseek_v3" else ()
    for key in FOREIGN_ROUTER_FIELDS:
        if key not in own and key in raw and raw[key] is not None:
            raise PhazeError(
                f"{where}: {key} = {raw[key]!r} is not part of the {model_type} router/layout "
                "that Hugging Face builds and phaze traces (softmax top-k over every block); "
                "refusing to trace a different router than the config describes"
            )
    if model_type == "mixtral":
        experts = _integer(raw, "num_local_experts", where)
        top_k = _integer(raw, "num_experts_per_tok", where)
        ffn = _integer(raw, "intermediate_size", where)
        shared, norm = 0, True  # HF Mixtral renormalises the top-k weights
        jitter = raw.get("router_jitter_noise") or 0.0
        if jitter:
            raise PhazeError(
                f"{where}: router_jitter_noise = {jitter!r}: the router's multiplicative input "
                "noise is not traced; set it to 0"
            )
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        # the published config.json says num_experts; transformers' to_dict() of a Qwen3-MoE
        # config says num_local_experts (its attribute map)
        key = "num_experts" if raw.get("num_experts") is not None else "num_local_experts"
        experts = _integer(raw, key, where)
        top_k = _integer(raw, "num_experts_per_tok", where)
        ffn = _integer(raw, "moe_intermediate_size", where)
        shared = (
            _integer(raw, "shared_expert_intermediate_size", where)
            if model_type == "qwen2_moe"
            else 0
        )
        norm = bool(raw.get("norm_topk_prob", False))
        step = raw.get("decoder_sparse_step", 1)
        if step != 1:
            raise PhazeError(
                f"{where}: decoder_sparse_step = {step!r}: only every {step}-th block is a MoE "
                "block, but phaze replicates one traced block; it needs 1 (every block sparse)"
            )
        dense = raw.get("mlp_only_layers") or []
        if dense:
            raise PhazeError(
                f"{where}: mlp_only_layers = {dense!r}: those blocks are dense, but phaze "
                "replicates one traced block; it needs every block sparse (an empty list)"
            )
    else:  # deepseek_v3
        return _deepseek_layout(raw, where)
    _check_top_k(top_k, experts, where)
    coef = raw.get("router_aux_loss_coef", 0.0) or 0.0
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0:
        raise PhazeError(f"{where}: router_aux_loss_coef must be a number >= 0, got {coef!r}")
    return MoESpec(model_type, experts, top_k, ffn, shared, norm, float(coef))


def _check_top_k(top_k: int, experts: int, where: str) -> None:
    if top_k > experts:
        raise PhazeError(
            f"{where}: num_experts_per_tok = {top_k} exceeds the {experts} routed experts "
            "(top-k picks k distinct experts per token)"
        )


def _deepseek_layout(raw: dict, where: str) -> MoESpec:
    """DeepSeek-V3's MoE layer (HF's DeepseekV3MoE): sigmoid scores, group-limited top-k
    (``n_group`` groups, the best ``topk_group`` of them by their two best scores), the k weights
    renormalised and scaled by ``routed_scaling_factor``, ``n_shared_experts`` shared experts as
    one ungated MLP of width n_shared·moe_intermediate_size, and the first
    ``first_k_dense_replace`` blocks dense (MLP width ``intermediate_size``)."""
    key = "n_routed_experts" if raw.get("n_routed_experts") is not None else "num_local_experts"
    experts = _integer(raw, key, where)
    top_k = _integer(raw, "num_experts_per_tok", where)
    ffn = _integer(raw, "moe_intermediate_size", where)
    shared = _integer(raw, "n_shared_experts", where, 0) * ffn
    dense_ffn = _integer(raw, "intermediate_size", where)
    first_dense = _integer(raw, "first_k_dense_replace", where, 0)
    layers = _integer(raw, "num_hidden_layers", where)
    if first_dense >= layers:
        raise PhazeError(
            f"{where}: first_k_dense_replace = {first_dense} leaves none of the {layers} blocks "
            "a MoE block; it must be below num_hidden_layers"
        )
    freq = raw.get("moe_layer_freq", 1)
    if freq != 1:
        raise PhazeError(
            f"{where}: moe_layer_freq = {freq!r}: Hugging Face's DeepseekV3 makes every block "
            "after the dense ones sparse; phaze needs 1"
        )
    score = raw.get("scoring_func", "sigmoid")
    if score != "sigmoid":
        raise PhazeError(
            f"{where}: scoring_func = {score!r}: Hugging Face's DeepseekV3 router (and phaze's "
            "trace of it) scores with a sigmoid"
        )
    method = raw.get("topk_method", "noaux_tc")
    if method != "noaux_tc":
        raise PhazeError(
            f"{where}: topk_method = {method!r}: Hugging Face's DeepseekV3 router (and phaze's "
            "trace of it) is the bias-corrected group-limited top-k, noaux_tc"
        )
    groups = _integer(raw, "n_group", where)
    topk_groups = _integer(raw, "topk_group", where)
    if experts % groups:
        raise PhazeError(
            f"{where}: n_group = {groups} must divide the {experts} routed experts "
            "(group-limited routing splits them into equal groups)"
        )
    if topk_groups > groups:
        raise PhazeError(
            f"{where}: topk_group = {topk_groups} exceeds n_group = {groups} (a token routes to "
            "at most all groups)"
        )
    if experts // groups < 2:
        raise PhazeError(
            f"{where}: each of the n_group = {groups} groups has {experts // groups} expert(s); "
            "the router ranks groups by their two best scores, so a group needs at least 2"
        )
    _check_top_k(top_k, experts, where)
    if top_k > topk_groups * (experts // groups):
        raise PhazeError(
            f"{where}: num_experts_per_tok = {top_k} exceeds the {topk_groups * (experts // groups)}"
            f" experts of the topk_group = {topk_groups} groups a token may use"
        )
    scale = raw.get("routed_scaling_factor", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise PhazeError(f"{where}: routed_scaling_factor must be a number > 0, got {scale!r}")
    # DeepSeek-V3 balances load without an auxiliary loss (the bias of noaux_tc); its
    # complementary sequence-wise loss (aux_loss_alpha, seq_aux) is not traced: coefficient 0
    return MoESpec(
        "deepseek_v3",
        experts,
        top_k,
        ffn,
        shared,
        bool(raw.get("norm_topk_prob", True)),
        0.0,
        score="sigmoid",
        groups=groups,
        topk_groups=topk_groups,
        shared_gate=False,
        dense_blocks=first_dense,
        dense_ffn=dense_ffn,
    )
