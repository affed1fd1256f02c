"""The model registry: the paper's eight workloads and today's GQA and MoE models by name, or any
Hugging Face ``config.json``.

A :class:`ModelSpec` is plain data (sizes, valid tensor-parallel widths) so the CLI and the
Snakefile can use it without importing torch; ``spec.hf_config(num_blocks)`` and
``spec.model_class()`` import transformers lazily. Models are always built from a config object on
the meta device: no weights, no hub (``HF_HUB_OFFLINE=1`` is set before transformers is imported).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from phaze.errors import PhazeError
from phaze.io import checks
from phaze.trace.moe import MoESpec, moe_layout

# Tensor-parallel widths the workflow considers (Megatron within a node).
TP_CANDIDATES = (1, 2, 4, 8)

# Families we know how to slice tensor-parallel (see phaze/trace/tensor_parallel.py) and which
# HF classes build them. `causal` picks labels = input ids shifted (HF does the shift) vs MLM.
FAMILIES: dict[str, dict] = {
    "bert": {"config": "BertConfig", "model": "BertForMaskedLM"},
    "megatron-bert": {"config": "MegatronBertConfig", "model": "MegatronBertForMaskedLM"},
    "gpt2": {"config": "GPT2Config", "model": "GPT2LMHeadModel"},
    "opt": {"config": "OPTConfig", "model": "OPTForCausalLM"},
    "llama": {"config": "LlamaConfig", "model": "LlamaForCausalLM"},
    # mixture-of-experts families: attention as Llama's, the MoE layer phaze's own
    # (phaze/trace/moe_layer.py)
    "mixtral": {"config": "MixtralConfig", "model": "MixtralForCausalLM"},
    "qwen2_moe": {"config": "Qwen2MoeConfig", "model": "Qwen2MoeForCausalLM"},
    # Qwen3: Llama's module names, per-head q/k RMSNorm, head_dim independent of hidden/heads
    "qwen3": {"config": "Qwen3Config", "model": "Qwen3ForCausalLM"},
    "qwen3_moe": {"config": "Qwen3MoeConfig", "model": "Qwen3MoeForCausalLM"},
    # multi-head latent attention, a grouped sigmoid router, a shared expert, dense first blocks
    "deepseek_v3": {"config": "DeepseekV3Config", "model": "DeepseekV3ForCausalLM"},
}
# HF `model_type` -> our family (whose tensor-parallel rules apply: same module names)
MODEL_TYPES = {
    "bert": "bert",
    "megatron-bert": "megatron-bert",
    "gpt2": "gpt2",
    "opt": "opt",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v3": "deepseek_v3",
}


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a rank-``q_rank`` latent
    (0: a direct projection), keys and values through one rank-``kv_rank`` latent, each head's
    query/key = a ``nope``-wide part from the latent and a ``rope``-wide rotary part (the key's
    shared by all heads), values ``v_dim`` wide."""

    q_rank: int
    kv_rank: int
    nope: int
    rope: int
    v_dim: int


def latent_attention(raw: dict, where: str) -> LatentAttention | None:
    """The latent attention of a DeepSeek-V3 config (None for any other type); PhazeError naming
    the field when its sizes are inconsistent."""
    if raw.get("model_type") != "deepseek_v3":
        return None

    def size(key: str, low: int = 1) -> int:
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PhazeError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
        return value

    q_rank = raw.get("q_lora_rank")
    q_rank = 0 if q_rank is None else size("q_lora_rank")
    mla = LatentAttention(
        q_rank,
        size("kv_lora_rank"),
        size("qk_nope_head_dim"),
        size("qk_rope_head_dim", 2),
        size("v_head_dim"),
    )
    if mla.rope % 2:
        raise PhazeError(
            f"{where}: qk_rope_head_dim = {mla.rope} must be even (rotary embedding rotates pairs)"
        )
    qk = raw.get("qk_head_dim")
    if qk is not None and qk != mla.nope + mla.rope:
        raise PhazeError(
            f"{where}: qk_head_dim = {qk} must equal qk_nope_head_dim + qk_rope_head_dim = "
            f"{mla.nope} + {mla.rope}"
        )
    heads = raw.get("num_attention_heads")
    kv = raw.get("num_key_value_heads", heads)
    if kv != heads:
        raise PhazeError(
            f"{where}: num_key_value_heads = {kv} must equal num_attention_heads = {heads}: "
            "latent attention expands the latent into keys and values for every head"
        )
    return mla


#: model types whose Hugging Face attention derives each head's size as hidden / heads (a
#: ``head_dim`` field would be ignored); Llama-like types read ``head_dim`` (any size)
DERIVED_HEAD_DIM = ("gpt2", "opt", "bert", "megatron-bert")
#: model types whose config defaults ``head_dim`` to a size of its own (Qwen3: 128), not h/a
OWN_HEAD_DIM = ("qwen3", "qwen3_moe")


def check_head_dim(raw: dict, where: str) -> None:
    """Attention widths that must agree: a ``head_dim`` must be a positive integer; where the
    model derives the head size (GPT-2, OPT, BERT) a given ``head_dim`` must be hidden / heads,
    and without a ``head_dim`` the heads must split the hidden size evenly (not for Qwen3, whose
    default is its own, nor DeepSeek-V3, whose sizes are the latent attention's)."""
    model_type = raw.get("model_type")
    heads = raw.get("num_attention_heads", raw.get("n_head"))
    hidden = raw.get("hidden_size", raw.get("n_embd"))
    if model_type == "deepseek_v3" or not isinstance(heads, int) or not isinstance(hidden, int):
        return  # latent_attention checks DeepSeek-V3; missing sizes are reported where read
    if heads < 1:
        return
    head_dim = raw.get("head_dim")
    if head_dim is None:
        if model_type not in OWN_HEAD_DIM and hidden % heads:
            raise PhazeError(
                f"{where}: hidden_size = {hidden} must be divisible by num_attention_heads = "
                f"{heads} (no head_dim given: each head is hidden/heads wide)"
            )
    elif isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise PhazeError(f"{where}: head_dim must be an integer >= 1, got {head_dim!r}")
    elif model_type in DERIVED_HEAD_DIM and head_dim * heads != hidden:
        raise PhazeError(
            f"{where}: head_dim = {head_dim} times num_attention_heads = {heads} must equal "
            f"hidden_size = {hidden}: model_type {model_type!r} sizes each head hidden/heads "
            "and would ignore head_dim"
        )


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # key of FAMILIES, or "hf:<model_type>" for an unknown HF architecture
    num_blocks: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int  # default sequence length (the paper's)
    kv_heads: int
    config_kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    config_path: str | None = None
    moe: MoESpec | None = None  # the mixture-of-experts layer of every block (ffn = an expert's)
    mla: LatentAttention | None = None  # multi-head latent attention (DeepSeek-V3)

    def __post_init__(self) -> None:
        # Grouped-query attention: every key/value head serves heads/kv_heads query heads.
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise PhazeError(
                f"{self.name}: num_key_value_heads = {self.kv_heads} must divide "
                f"num_attention_heads = {self.heads} (grouped-query attention: each key/value "
                "head serves a whole group of query heads)"
            )

    def _widths(self) -> list[tuple[int, str]]:
        """What tensor parallelism slices, with how the error names it."""
        widths = [(self.heads, f"its {self.heads} attention heads")]
        if self.kv_heads != self.heads:
            widths.append((self.kv_heads, f"its {self.kv_heads} key/value heads"))
        if self.moe is None:
            widths.append((self.ffn, f"its FFN width {self.ffn}"))
        else:
            widths.append((self.ffn, f"its expert FFN width {self.ffn}"))
            if self.moe.shared_ffn:
                widths.append(
                    (self.moe.shared_ffn, f"its shared-expert FFN width {self.moe.shared_ffn}")
                )
            if self.moe.dense_blocks:
                widths.append(
                    (self.moe.dense_ffn, f"its dense blocks' FFN width {self.moe.dense_ffn}")
                )
        return widths

    @property
    def dense_blocks(self) -> int:
        """The first blocks that are dense in a mixture-of-experts model (DeepSeek-V3: 3)."""
        return self.moe.dense_blocks if self.moe is not None else 0

    @property
    def repeated_blocks(self) -> int:
        """The blocks after the dense first ones: the step model's chain of identical blocks
        (the dense ones are priced with the embedding, docs/fidelity.md)."""
        return self.num_blocks - self.dense_blocks

    @property
    def valid_tp(self) -> tuple[int, ...]:
        """Powers of two <= 8 that divide the head count, the key/value heads (Megatron-LM
        requires ``num_query_groups % tensor_model_parallel_size == 0``: each rank holds whole
        key/value heads) and the FFN widths (an expert's and the shared expert's: Megatron's
        expert tensor parallelism slices each expert like a dense MLP); only 1 for architectures
        we cannot slice."""
        if self.family not in FAMILIES:
            return (1,)
        return tuple(t for t in TP_CANDIDATES if all(n % t == 0 for n, _ in self._widths()))

    def check_ep(self, ep: int) -> None:
        """Expert parallelism needs routed experts, and ep must divide their count."""
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
            raise PhazeError(f"the expert-parallel size ep must be an integer >= 1 (got {ep!r})")
        if self.moe is None:
            if ep != 1:
                raise PhazeError(
                    f"{self.name}: expert parallelism (ep = {ep}) needs a mixture-of-experts "
                    "model; this one is dense (ep = 1)"
                )
            return
        self.moe.check_ep(ep, self.name)

    def whole_experts(self, tp: int, seq: int) -> bool:
        """Whether etp = 1 is a trace of its own at width tp: a mixture-of-experts model at
        tp > 1 whose sequence of ``seq`` tokens the tp ranks split evenly (`check_etp`)."""
        return self.moe is not None and tp > 1 and seq % tp == 0

    def check_etp(self, etp: int | None, tp: int, seq: int | None = None) -> None:
        """The experts' tensor-parallel size: tp (None, Megatron's default) or 1 (Megatron's
        ``--expert-tensor-parallel-size 1``), the latter for a mixture-of-experts model whose
        sequence splits evenly over the tp ranks (its experts run on the rank's shard)."""
        if etp is None or etp == tp:
            return
        if isinstance(etp, bool) or etp != 1:
            raise PhazeError(
                f"the experts' tensor-parallel size etp must be tp ({tp}) or 1 (got {etp!r})"
            )
        if self.moe is None:
            raise PhazeError(
                f"{self.name}: etp = 1 (experts without tensor parallelism) needs a "
                "mixture-of-experts model"
            )
        if seq is not None and seq % tp:
            raise PhazeError(
                f"{self.name}: etp = 1 runs the experts on the rank's sequence-parallel shard, so "
                f"the sequence length {seq} must be divisible by tp = {tp}"
            )

    def check_tp(self, tp: int) -> None:
        if tp in self.valid_tp:
            return
        if tp not in TP_CANDIDATES:
            raise PhazeError(
                f"tensor-parallel width {tp} not supported (choose from "
                f"{list(TP_CANDIDATES)}; valid for {self.name}: {list(self.valid_tp)})"
            )
        if self.family not in FAMILIES:
            raise PhazeError(
                f"{self.name}: tensor-parallel slicing of model_type "
                f"{self.family.removeprefix('hf:')!r} is not supported; only t=1"
            )
        reasons = [why for n, why in self._widths() if n % tp]
        raise PhazeError(
            f"tensor-parallel width t={tp} must divide {' and '.join(reasons)} "
            f"for {self.name} (valid t: {list(self.valid_tp)})"
        )

    def hf_config(
        self, num_blocks: int | None = None, seq: int | None = None, dense_blocks: int | None = None
    ):
        """A transformers config for this model with ``num_blocks`` blocks (default: all), of
        them ``dense_blocks`` dense first blocks (a model with dense first blocks; default: the
        model's own count)."""
        _hf_offline()
        import transformers  # deferred: transformers

        if self.config_path is not None:
            config = _load_hf_config(Path(self.config_path))
        else:
            cls = getattr(transformers, FAMILIES[self.family]["config"])
            try:
                config = cls(**self.config_kwargs)
            except Exception as exc:  # transformers validates configs with many exception types
                raise PhazeError(f"{self.name}: invalid {cls.__name__}: {exc}") from exc
        config.num_hidden_layers = num_blocks if num_blocks is not None else self.num_blocks
        if self.dense_blocks:
            config.first_k_dense_replace = (
                self.dense_blocks if dense_blocks is None else dense_blocks
            )
        types = getattr(config, "layer_types", None)
        if types is not None:  # Qwen3: one attention type per block
            if len(set(types)) != 1:
                raise PhazeError(
                    f"{self.name}: layer_types mixes {sorted(set(types))}: blocks with "
                    "different attention differ, and phaze replicates one traced block"
                )
            config.layer_types = [types[0]] * config.num_hidden_layers
        # Training graph: no KV cache (its concatenations are inference work).
        config.use_cache = False
        if self.moe is not None:
            # the MoE layer computes its own auxiliary loss per block (phaze/trace/moe_layer.py),
            # as Megatron does; HF's would run once over all blocks' router logits in the head
            config.output_router_logits = False
        # Explicit matmul/softmax/dropout ops: SDPA on the meta device lowers to a math fallback
        # whose op mix depends on the backend, and the scheduler wants the attention ops anyway.
        config._attn_implementation = "eager"
        seq = seq or self.seq
        for pos_key in ("max_position_embeddings", "n_positions"):
            if pos_key in config.to_dict() and getattr(config, pos_key) < seq:
                setattr(config, pos_key, seq)
        return config

    def model_class(self):
        """The transformers class that trains this model (a causal- or masked-LM head).

        A registry model uses its family's class. A config by path uses its model type's
        masked-LM class for an encoder (``is_decoder`` false and a masked-LM class exists: BERT's
        ``BertForMaskedLM``, as the registry builds) and its causal-LM class otherwise. A config
        whose ``architectures`` names the other of the two is contradictory and an error.
        """
        _hf_offline()
        import transformers  # deferred: transformers

        if self.config_path is None:
            return getattr(transformers, FAMILIES[self.family]["model"])
        config = self.hf_config(1)
        causal, masked = _lm_classes(config)
        if causal is None and masked is None:
            raise PhazeError(
                f"{self.name}: model_type {config.model_type!r} has no causal-LM or "
                "masked-LM class in transformers; cannot build a training graph"
            )
        decoder = bool(getattr(config, "is_decoder", False))
        cls = masked if masked is not None and (causal is None or not decoder) else causal
        other = masked if cls is causal else causal
        if other is not None and other.__name__ in (config.architectures or ()):
            raise PhazeError(
                f"{self.name}: architectures names {other.__name__} but is_decoder is "
                f"{str(decoder).lower()}, which builds {cls.__name__}; set is_decoder to "
                f"{str(not decoder).lower()} or fix architectures"
            )
        return cls

    @property
    def causal(self) -> bool:
        """Decoder (causal LM) vs encoder (masked LM): decides inputs and mask."""
        causal, _ = _lm_classes(self.hf_config(1))
        return self.model_class() is causal


def _lm_classes(config) -> tuple:
    """(causal-LM class, masked-LM class) transformers has for ``config``'s type, None if none."""
    import transformers  # deferred: transformers

    return tuple(
        auto._model_mapping.get(type(config), None)
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM)
    )


def _hf_offline() -> None:
    # Never touch the hub: every config is local.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _gpt2_style(name, blocks, hidden, heads, ffn, seq, vocab=50257) -> ModelSpec:
    # GELU with the tanh approximation as ONE kernel (gelu_pytorch_tanh): the same function as
    # GPT-2's gelu_new, which HF evaluates as 8 separate element-wise ops; real training (and
    # Megatron's fused bias-GeLU) runs one, and saves only its input for backward.
    kwargs = {
        "n_layer": blocks,
        "n_embd": hidden,
        "n_head": heads,
        "n_inner": ffn,
        "vocab_size": vocab,
        "n_positions": seq,
        "activation_function": "gelu_pytorch_tanh",
    }
    return ModelSpec(name, "gpt2", blocks, hidden, heads, ffn, vocab, seq, heads, kwargs)


def _bert_style(name, family) -> ModelSpec:
    kwargs = {
        "num_hidden_layers": 24,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "vocab_size": 30522,
        "max_position_embeddings": 512,
    }
    return ModelSpec(name, family, 24, 1024, 16, 4096, 30522, 512, 16, kwargs)


def _spec_from_config_dict(name: str, seq: int, raw: dict) -> ModelSpec:
    """A registry model written as its Hugging Face ``config.json`` (``raw``, with
    ``model_type``): sizes read from the config's own keys, the MoE layer by ``moe_layout``."""
    moe = moe_layout(raw, name)
    check_head_dim(raw, name)
    heads = raw["num_attention_heads"]
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    return ModelSpec(
        name,
        MODEL_TYPES[raw["model_type"]],
        raw["num_hidden_layers"],
        raw["hidden_size"],
        heads,
        moe.expert_ffn if moe else raw["intermediate_size"],
        raw["vocab_size"],
        seq,
        raw.get("num_key_value_heads", heads),
        kwargs,
        moe=moe,
        mla=latent_attention(raw, name),
    )


# Today's workloads, each a public config.json's fields (model type, sizes, the fields that change
# the graph); docs/trace.md names the sources. seq = the length each was trained at.
_LLAMA3_COMMON = {
    "model_type": "llama",
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
LLAMA3_8B = {
    **_LLAMA3_COMMON,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 14336,
}
LLAMA3_70B = {
    **_LLAMA3_COMMON,
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "intermediate_size": 28672,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "sliding_window": None,
    "router_aux_loss_coef": 0.02,
    "router_jitter_noise": 0.0,
    "tie_word_embeddings": False,
}
QWEN15_MOE_A27B = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "qkv_bias": True,
    "use_sliding_window": False,
    "router_aux_loss_coef": 0.001,
    "tie_word_embeddings": False,
}

# Qwen/Qwen3-32B and Qwen/Qwen3-30B-A3B config.json (Qwen3 technical report, arXiv 2505.09388,
# Tables 1-2): head_dim 128 is not hidden / heads (5120/64 = 80, 2048/32 = 64)
_QWEN3_COMMON = {
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "head_dim": 128,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
}
QWEN3_32B = {
    **_QWEN3_COMMON,
    "model_type": "qwen3",
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 25600,
}
QWEN3_30B_A3B = {
    **_QWEN3_COMMON,
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001,
}
# Qwen/Qwen3-235B-A22B config.json (Qwen3 technical report, arXiv 2505.09388, Table 2: 94 layers,
# 64 query / 4 key-value heads, 128 experts, 8 activated); the same values in Megatron's
# transcription of it (Ascend/MindSpeed-RL configs/model/qwen3_235b_a22b.yaml: hidden 4096,
# moe_ffn_hidden_size 1536, kv_channels 128, padded_vocab_size 151936).
QWEN3_235B_A22B = {
    **QWEN3_30B_A3B,
    "hidden_size": 4096,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
}
# deepseek-ai/DeepSeek-V3 config.json (DeepSeek-V3 technical report, arXiv 2412.19437, §4.2):
# 61 blocks, the first 3 dense; 256 routed experts (8 groups, top-4 groups, top-8) and 1 shared;
# multi-head latent attention. Its multi-token-prediction module (num_nextn_predict_layers = 1)
# is not built by Hugging Face's DeepseekV3ForCausalLM and not traced.
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}

_REGISTRY: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _bert_style("bert-large", "bert"),
        _gpt2_style("gpt2-xl", 48, 1600, 25, 6400, 1024),
        ModelSpec(
            "opt-350m",
            "opt",
            24,
            1024,
            16,
            4096,
            50272,
            2048,
            16,
            {
                "num_hidden_layers": 24,
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "ffn_dim": 4096,
                "vocab_size": 50272,
                "max_position_embeddings": 2048,
                "word_embed_proj_dim": 512,
                "do_layer_norm_before": False,
                "activation_function": "relu",
                "dropout": 0.1,
                "attention_dropout": 0.0,
                "enable_bias": True,
            },
        ),
        ModelSpec(
            "llama2-7b",
            "llama",
            32,
            4096,
            32,
            11008,
            32000,
            4096,
            32,
            {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "intermediate_size": 11008,
                "vocab_size": 32000,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False,
            },
        ),
        _bert_style("megatron-bert", "megatron-bert"),
        _gpt2_style("megatron-gpt-2.5b", 54, 1920, 20, 7680, 1024),
        _gpt2_style("megatron-gpt-8.3b", 72, 3072, 24, 12288, 1024),
        _gpt2_style("gpt3-175b", 96, 12288, 96, 49152, 2048),
        _spec_from_config_dict("llama3-8b", 8192, LLAMA3_8B),
        _spec_from_config_dict("llama3-70b", 8192, LLAMA3_70B),
        _spec_from_config_dict("mixtral-8x7b", 4096, MIXTRAL_8X7B),
        _spec_from_config_dict("qwen1.5-moe-a2.7b", 8192, QWEN15_MOE_A27B),
        # seq: Qwen3's general pre-training stages ran at 4096 tokens (arXiv 2505.09388 §3.2),
        # DeepSeek-V3's pre-training at 4K (arXiv 2412.19437 §4.2)
        _spec_from_config_dict("qwen3-32b", 4096, QWEN3_32B),
        _spec_from_config_dict("qwen3-30b-a3b", 4096, QWEN3_30B_A3B),
        _spec_from_config_dict("qwen3-235b-a22b", 4096, QWEN3_235B_A22B),
        _spec_from_config_dict("deepseek-v3", 4096, DEEPSEEK_V3),
    )
}


def list_models() -> list[str]:
    return list(_REGISTRY)


def get_model_spec(name: str) -> ModelSpec:
    """A registry name, or a path to a Hugging Face ``config.json`` (or a directory holding one)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    looks_like_path = name.endswith(".json") or os.sep in name or Path(name).exists()
    if not looks_like_path:
        raise PhazeError(
            f"unknown model {name!r}: choose one of {', '.join(_REGISTRY)} "
            "or give a path to a Hugging Face config.json"
        )
    return _spec_from_path(Path(name))


def _load_hf_config(path: Path):
    _hf_offline()
    import transformers  # deferred: transformers

    raw = _read_config_json(path)
    model_type = raw.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise PhazeError(f"{path}: model_type {model_type!r} is not known to transformers")
    try:
        return transformers.CONFIG_MAPPING[model_type].from_dict(raw)
    except Exception as exc:  # transformers raises many types for malformed configs
        raise PhazeError(f"{path}: cannot build a {model_type} config: {exc}") from exc


def _read_config_json(path: Path) -> dict:
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PhazeError(f"model config not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PhazeError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise PhazeError(f"{path} is not a Hugging Face config.json (no model_type)")
    return raw


def _spec_from_path(path: Path) -> ModelSpec:
    if path.is_dir():
        path = path / "config.json"
    check_head_dim(_read_config_json(path), str(path))  # before HF's own, less specific check
    config = _load_hf_config(path)

    def first(*keys, default=None) -> int:
        for key in keys:
            value = getattr(config, key, None)
            if value is not None:
                return checks.integer(value, f"{path}: {key}", 1)
        if default is None:
            raise PhazeError(f"{path}: cannot find any of {keys} in the config")
        return default

    raw = config.to_dict()
    moe = moe_layout(raw, str(path))
    mla = latent_attention(raw, str(path))
    check_head_dim(raw, str(path))
    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head")
    ffn = first("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    if moe is not None:
        ffn = moe.expert_ffn
    seq = first("max_position_embeddings", "n_positions", default=2048)
    kv_heads = first("num_key_value_heads", default=heads)
    family = MODEL_TYPES.get(config.model_type, f"hf:{config.model_type}")
    name = path.parent.name if path.name == "config.json" else path.stem
    return ModelSpec(
        name=name,
        family=family,
        num_blocks=first("num_hidden_layers", "n_layer"),
        hidden=hidden,
        heads=heads,
        ffn=ffn,
        vocab=first("vocab_size"),
        seq=seq,
        kv_heads=kv_heads,
        config_path=str(path.resolve()),
        moe=moe,
        mla=mla,
    )
