"""The largest microbatch and sequence length a trace can address: refused before torch is asked
to size a tensor whose storage overflows its 64-bit byte count."""

from __future__ import annotations

from phaze.errors import PhazeError
from phaze.io.checks import MAX_COUNT

#: the widest element a traced tensor holds, bytes (int64 token ids, fp32/fp64 at most)
MAX_ELEMENT_BYTES = 8


def check_tensor_sizes(spec, microbatch: int, seq: int) -> None:
    """Refuse a microbatch and sequence length whose largest tensor cannot be addressed: torch
    sizes a tensor's storage in bytes as a 64-bit integer, and the largest tensor of a block and
    its head holds about b·s·max(vocab, ffn·experts, hidden, heads·s) elements."""
    experts = spec.moe.experts if spec.moe is not None else 1
    width = max(spec.vocab, spec.ffn * experts, spec.hidden, spec.heads * seq)
    if microbatch * seq * width * MAX_ELEMENT_BYTES > MAX_COUNT:
        raise PhazeError(
            f"microbatch {microbatch} x sequence length {seq} is too large to trace: "
            f"{spec.name}'s largest tensor would hold about {microbatch * seq * width:.3g} "
            "elements, beyond the 2^63 - 1 bytes a tensor's storage can have"
        )
