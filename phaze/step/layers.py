"""What the step model needs to know about each layer: per tensor-parallel rank and per microbatch.

A model is a chain ``first, block × L, last`` (the trace's embedding, identical transformer
blocks and head); a `ChainCost` holds the three layers for one (tensor-parallel width t,
microbatch b, sequence parallelism on/off). Where the numbers come from is the caller's
business: GPU presets sum kernel latencies (phaze/fidelity), the search takes layer schedules
(phaze/place). Units: seconds, bytes, parameters (elements), FLOPs.

Activation memory per block and microbatch, from autograd's saved tensors (the trace's
``saved_tensors_hooks``), for each recomputation mode (Korthikanti et al. 2022 §4):

* ``none``: everything the block saves for backward (``activation_bytes``);
* ``selective``: the same without what core attention saves (QKᵀ result, softmax, its dropout
  mask and output: ``attention_activation_bytes``), recomputed from Q, K, V in backward;
* ``full``: only the block's input (``input_bytes``); the block's forward re-runs in backward.

With fused attention (``fused_attention``: FlashAttention-style kernels, config
``fidelity.attention: fused``) core attention saves only its softmax statistics (no
``attention_activation_bytes``) and its backward kernel recomputes the scores, so ``selective``
equals ``none``.

While a block's backward runs, what it recomputed is live as well (``working_bytes``): the core
attention's tensors for selective, everything but the input for full. Recomputation applies to the
blocks; the first and last layer keep their activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

#: the tensor-parallel collectives, and the all-to-all of expert parallelism (its own group)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True)
class LayerCost:
    fwd_s: float  # forward computation (no communication)
    bwd_s: float  # backward computation
    params: float  # parameters this rank holds (elements)
    activation_bytes: float  # saved for backward, no recomputation
    fwd_collectives: tuple = ()  # tensor-parallel collectives (kind, bytes), forward
    bwd_collectives: tuple = ()  # ... backward
    attention_fwd_s: float = 0.0  # forward computation of core attention (selective recompute)
    attention_activation_bytes: float = 0.0  # part of activation_bytes core attention saves
    input_bytes: float = 0.0  # the layer's input (what full recomputation keeps)
    tied_params: float = 0.0  # parameters it reads that another layer owns (a tied LM head)
    fwd_matmul_flops: float = 0.0  # this rank's forward matmul FLOPs
    attention_matmul_flops: float = 0.0  # of which core attention (QKᵀ, ×V)
    expert_params: float = 0.0  # of `params`, the routed experts' (expert data-parallel group)
    mean_fwd_matmul_flops: float | None = None  # the mean rank's (None: fwd_matmul_flops)
    # of `params`, the weights whose GEMMs run in a low precision (FP8): each keeps a cast copy
    # and is cast once per step (phaze.precision; 0 in BF16)
    low_precision_params: float = 0.0
    attention_bwd_s: float = 0.0  # backward computation of core attention (of bwd_s)
    kv_bytes: float = 0.0  # the keys and values of the rank's tokens (context parallelism's ring)
    # core attention runs as one fused kernel per pass (FlashAttention-style): its backward
    # recomputes the scores itself (in attention_bwd_s) and it saves no s × s tensor, so
    # selective recomputation re-runs nothing of it
    fused_attention: bool = False

    def __post_init__(self) -> None:
        for name in (
            "fwd_s",
            "bwd_s",
            "params",
            "activation_bytes",
            "attention_fwd_s",
            "attention_activation_bytes",
            "input_bytes",
            "tied_params",
            "fwd_matmul_flops",
            "attention_matmul_flops",
            "expert_params",
            "low_precision_params",
            "attention_bwd_s",
            "kv_bytes",
        ):
            value = getattr(self, name)
            if not value >= 0:  # also rejects NaN
                raise AssertionError(f"layer cost {name} must be >= 0, got {value}")
        if self.expert_params > self.params:
            raise AssertionError("expert parameters exceed the layer's parameters")
        if self.low_precision_params > self.params:
            raise AssertionError("low-precision parameters exceed the layer's parameters")
        if self.mean_fwd_matmul_flops is not None and not self.mean_fwd_matmul_flops >= 0:
            raise AssertionError("mean forward matmul FLOPs must be >= 0")
        for kind, size in (*self.fwd_collectives, *self.bwd_collectives):
            if kind not in COLLECTIVES or not size >= 0:
                raise AssertionError(f"bad collective ({kind!r}, {size})")
        if self.attention_activation_bytes > self.activation_bytes:
            raise AssertionError("core-attention activations exceed the layer's activations")

    def context_parallel(self, cp: int) -> LayerCost:
        """This layer, costed on seq/cp tokens, as one of cp context-parallel ranks runs it
        (Megatron-LM ``--context-parallel-size``, TransformerEngine's ring attention,
        ``AttnFuncWithCPAndKVP2P``): everything outside core attention works on the rank's
        seq/cp tokens as costed, and core attention computes the rank's queries against the
        keys of all cp chunks, one (seq/cp)² block per ring step — cp blocks, so core
        attention's computation, matmul FLOPs and saved scores are cp times those of the
        seq/cp costing (the same s²/cp share of the s × s attention every rank gets under the
        causal load balancing, phaze counting attention unmasked as everywhere). cp = 1 returns
        the layer unchanged."""
        if cp == 1:
            return self
        extra = cp - 1
        mean = self.mean_fwd_matmul_flops
        return replace(
            self,
            fwd_s=self.fwd_s + extra * self.attention_fwd_s,
            bwd_s=self.bwd_s + extra * self.attention_bwd_s,
            attention_fwd_s=cp * self.attention_fwd_s,
            attention_bwd_s=cp * self.attention_bwd_s,
            fwd_matmul_flops=self.fwd_matmul_flops + extra * self.attention_matmul_flops,
            attention_matmul_flops=cp * self.attention_matmul_flops,
            mean_fwd_matmul_flops=None
            if mean is None
            else mean + extra * self.attention_matmul_flops,
            activation_bytes=self.activation_bytes + extra * self.attention_activation_bytes,
            attention_activation_bytes=cp * self.attention_activation_bytes,
        )

    def recompute_s(self, mode: str) -> float:
        """Computation re-run in backward under `mode` (collectives are counted by the model)."""
        selective = 0.0 if self.fused_attention else self.attention_fwd_s
        return {"none": 0.0, "selective": selective, "full": self.fwd_s}[mode]

    def stash_bytes(self, mode: str) -> float:
        """Bytes kept per microbatch between its forward and its backward."""
        return {
            "none": self.activation_bytes,
            "selective": self.activation_bytes - self.attention_activation_bytes,
            "full": self.input_bytes,
        }[mode]

    def working_bytes(self, mode: str) -> float:
        """Recomputed bytes live during the layer's backward."""
        return self.activation_bytes - self.stash_bytes(mode)

    @property
    def untimed(self) -> LayerCost:
        """This layer without its computation times: what does not depend on the device."""
        return replace(self, fwd_s=0.0, bwd_s=0.0, attention_fwd_s=0.0, attention_bwd_s=0.0)

    @property
    def model_matmul_flops(self) -> float:
        """Forward matmul FLOPs of the mean rank (what model FLOPs count)."""
        if self.mean_fwd_matmul_flops is None:
            return self.fwd_matmul_flops
        return self.mean_fwd_matmul_flops

    def recompute_matmul_flops(self, mode: str) -> float:
        """Matmul FLOPs re-run under `mode` (the mean rank's)."""
        return {
            "none": 0.0,
            "selective": self.attention_matmul_flops,
            "full": self.model_matmul_flops,
        }[mode]


@dataclass(frozen=True)
class ChainCost:
    """One model at one (t, b, sequence parallelism): first layer, L identical blocks, last."""

    first: LayerCost
    block: LayerCost
    last: LayerCost
    blocks: int
    tp: int
    microbatch: int
    sequence_parallel: bool
    boundary_bytes: float  # the activation between two stages (b·s·h·2: the full tensor)
    ep: int = 1  # expert-parallel size the block was built for (its all-to-alls, its experts)
    experts: int = 0  # routed experts per block (0: a dense model)
    etp: int | None = None  # the experts' tensor-parallel size the block was built for: tp or 1
    cp: int = 1  # context-parallel size the layers were built for (each on seq/cp tokens)
    # The chain whose computation times bound the backward a DDP overlap hides the gradient
    # reduction behind (None = this chain). A placement priced on lower bounds of the layer
    # latencies passes achievable ones here: its time then stays a lower bound of every
    # achievable time (a shorter backward would otherwise hide less and could make it larger).
    window: ChainCost | None = field(default=None, compare=False)
    meta: dict = field(default_factory=dict, compare=False)  # caller's notes (names, sources)

    def __post_init__(self) -> None:
        if self.blocks < 1 or self.tp < 1 or self.microbatch < 1 or self.cp < 1:
            raise AssertionError("a chain needs >= 1 block, tp, cp and microbatch >= 1")
        if self.sequence_parallel and self.tp == 1:
            raise AssertionError("a sequence-parallel chain needs tp > 1")
        if not self.boundary_bytes >= 0:
            raise AssertionError("boundary bytes must be >= 0")
        if (
            self.ep < 1
            or (self.experts == 0 and self.ep > 1)
            or (self.experts and self.experts % self.ep)
        ):
            raise AssertionError(f"ep {self.ep} does not fit {self.experts} experts")
        if self.etp not in (None, 1, self.tp) or (self.experts == 0 and self.expert_tp != self.tp):
            raise AssertionError(
                f"etp {self.etp} does not fit tp {self.tp}, {self.experts} experts"
            )
        if self.experts == 0 and self.block.expert_params > 0:
            raise AssertionError("a dense chain has no expert parameters")
        if self.window is not None:
            w = self.window
            same = (
                w.blocks,
                w.tp,
                w.microbatch,
                w.sequence_parallel,
                w.ep,
                w.experts,
                w.expert_tp,
                w.cp,
            ) == (
                self.blocks,
                self.tp,
                self.microbatch,
                self.sequence_parallel,
                self.ep,
                self.experts,
                self.expert_tp,
                self.cp,
            )
            if not same or w.window is not None:
                raise AssertionError("a window chain must be a plain chain of the same shape")

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def overlap_window(self) -> ChainCost:
        return self.window if self.window is not None else self

    @property
    def tied(self) -> bool:
        return self.last.tied_params > 0

    @property
    def shape(self) -> tuple:
        """Everything of the chain but its layers' computation times (and its window's): chains
        of one shape differ only in what `phaze.step.model.StageTerms.retimed` recomputes."""
        return (
            self.first.untimed,
            self.block.untimed,
            self.last.untimed,
            self.blocks,
            self.tp,
            self.microbatch,
            self.sequence_parallel,
            self.boundary_bytes,
            self.ep,
            self.experts,
            self.expert_tp,
            self.cp,
        )

    def model_flops_per_microbatch(self) -> float:
        """Model FLOPs of one microbatch (all ranks of a tensor- and context-parallel group),
        PaLM's convention (Chowdhery et al. 2022, App. B): three passes over every matmul, forward
        + backward (= 2× forward), no recomputation."""
        per_rank = self.first.model_matmul_flops + self.last.model_matmul_flops
        per_rank = per_rank + self.blocks * self.block.model_matmul_flops
        return 3.0 * self.tp * self.cp * per_rank

    def hardware_flops_per_microbatch(self, recompute: str) -> float:
        """Matmul FLOPs executed for one microbatch, recomputation included."""
        extra = self.blocks * self.block.recompute_matmul_flops(recompute) * self.tp * self.cp
        return self.model_flops_per_microbatch() + extra
