"""Activation and parameter-state memory of a transformer block under tensor/sequence parallelism
and the three recomputation modes, after Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", §4), generalised to an FFN width f (they assume
f = 4h) — 16-bit activations, 1-byte dropout masks.

Per block and microbatch (s sequence, b microbatch, h hidden, a heads, f FFN width):

* kept on every tensor-parallel rank (layer-norm inputs, the QKV and FC1 inputs, the two dropout
  masks after the row-parallel projections): ``10·s·b·h``;
* split by t (Q and K, V, the projection input, FC1 output = GELU input, FC2 input):
  ``8·s·b·h + 4·s·b·f``;
* core attention, split by t (softmax output 2·a·s²·b, its dropout mask a·s²·b, dropout output
  2·a·s²·b): ``5·a·s²·b``.

With f = 4h this is s·b·h·(10 + 24/t + 5·a·s/(h·t)), their Eq. (2). Sequence parallelism splits the
first term by t as well; selective recomputation drops the core-attention term; full
recomputation keeps only the block's input, 2·s·b·h (split by t under sequence parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

from phaze.errors import PhazeError


@dataclass(frozen=True)
class BlockShape:
    seq: int
    microbatch: int
    hidden: int
    heads: int
    ffn: int

    @property
    def sbh(self) -> int:
        return self.seq * self.microbatch * self.hidden

    def replicated_bytes(self) -> int:
        return 10 * self.sbh

    def split_bytes(self) -> int:
        return 8 * self.sbh + 4 * self.seq * self.microbatch * self.ffn

    def core_attention_bytes(self) -> int:
        return 5 * self.heads * self.seq * self.seq * self.microbatch


def block_activation_bytes(
    shape: BlockShape, tp: int, sequence_parallel: bool, recompute: str
) -> float:
    """Bytes one block keeps per microbatch for its backward pass, per tensor-parallel rank."""
    rep_div = tp if sequence_parallel else 1
    if recompute == "full":
        return 2 * shape.sbh / rep_div
    if recompute == "selective":
        return shape.replicated_bytes() / rep_div + shape.split_bytes() / tp
    if recompute == "none":
        return (
            shape.replicated_bytes() / rep_div
            + shape.split_bytes() / tp
            + shape.core_attention_bytes() / tp
        )
    raise PhazeError(f"unknown recompute mode {recompute!r}")


def block_working_bytes(
    shape: BlockShape, tp: int, sequence_parallel: bool, recompute: str
) -> float:
    """Extra bytes live while one block's backward runs: with recomputation, the block's
    recomputed activations (all of them for full, the core attention for selective)."""
    full = block_activation_bytes(shape, tp, sequence_parallel, "none")
    if recompute == "none":
        return 0.0
    return full - block_activation_bytes(shape, tp, sequence_parallel, recompute)


def device_peak_bytes(
    *,
    param_count: float,
    state_bytes_per_param: float,
    inflight_microbatch_stages: float,
    layers_on_device: int,
    stash_bytes_per_layer: float,
    working_bytes: float,
    extra_bytes: float = 0.0,
) -> float:
    """Parameter state + activations held by the in-flight microbatches + the transient working
    set of the block in backward + stage-specific extras (embedding output, logits)."""
    return (
        param_count * state_bytes_per_param
        + inflight_microbatch_stages * layers_on_device * stash_bytes_per_layer
        + working_bytes
        + extra_bytes
    )
