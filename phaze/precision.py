"""Number formats of training: what each format changes in a GEMM's cost, a rank's memory and a
device's peak — the one place that defines bytes per element and rate per format.

``bf16``: BF16 operands and outputs, FP32 accumulation (Megatron-LM's mixed precision; every
number of the rest of phaze). ``fp8``: Megatron-LM with NVIDIA Transformer Engine (``--fp8-format
hybrid``, delayed scaling, ``--fp8-recipe delayed``): the GEMMs of the transformer blocks' linear
layers — forward (fprop), input gradient (dgrad) and weight gradient (wgrad) — take FP8 operands
(E4M3 activations and weights, E5M2 gradients) and write BF16; core attention's batched GEMMs,
softmax, norms, a mixture-of-experts router, the embedding and the LM head stay BF16
(Transformer Engine replaces ``Linear``/``LayerNormLinear``/``LayerNormMLP`` and grouped expert
GEMMs; Megatron's output layer is a plain ``ColumnParallelLinear``). What FP8 adds:

* **casts** (HBM-bound kernels, ``cast_transpose`` in Transformer Engine): each distinct input of
  an FP8 GEMM is read once in BF16 (2 B) and written in FP8 twice, row-wise for fprop and
  transposed for wgrad (1 + 1 B); each FP8 GEMM's output gradient likewise (row-wise for dgrad,
  transposed for wgrad); each FP8 weight once per step, on the first microbatch (Transformer
  Engine caches the FP8 weight and its transpose over the microbatches of a step,
  ``is_first_microbatch``). Delayed scaling takes each tensor's amax in the cast kernel itself;
  the amax-history all-reduce (a few scalars per tensor, once per step) is not counted;
* **memory**: the cached FP8 weight and its transpose (2 B per FP8 parameter) on top of the BF16
  weight, its gradient and the FP32 optimizer state, which stay as they are; a linear layer saves
  its input for wgrad in FP8 (the transposed copy, 1 B per element) instead of BF16 (2 B).

Sources: Transformer Engine ``transformer_engine/pytorch/module/linear.py`` (``_Linear.forward``:
``weight_fp8``/``weight_t_fp8`` cached when ``is_first_microbatch``; ``fp8_cast_transpose_fused`` of
the input; the saved ``inputmat_t``), Megatron-LM ``megatron/core/extensions/transformer_engine.py``
(``TELinear``, ``TELayerNormColumnParallelLinear``, ``TEGroupedLinear`` in the blocks;
``TEDotProductAttention`` runs core attention in BF16 unless ``--fp8-dot-product-attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

from phaze.errors import PhazeError

#: the formats a run or an architecture may name (the first is the default)
PRECISIONS = ("bf16", "fp8")

#: the output (and gradient) bytes of every GEMM: BF16, also of an FP8 GEMM (Transformer Engine
#: writes the fprop/dgrad outputs in the activation dtype, BF16)
OUTPUT_BYTES_PER_ELEMENT = 2


@dataclass(frozen=True)
class Format:
    """What one format changes. ``operand_bytes``: bytes per element of a GEMM's inputs;
    ``macs_per_pe_cycle``: multiply-adds a tensor-core PE does per cycle on these operands
    relative to BF16 (NVIDIA's H100: 2 — the FP8 tensor-core rate is twice the FP16/BF16 rate at
    the same clock and SM count, H100 whitepaper 2022 and datasheet: 1,979 vs 989 dense
    TFLOP/s); ``cast_bytes_per_element``: HBM bytes of casting one BF16 element to this format
    with its transpose (read 2, write 1 + 1; 0 for BF16: no cast);
    ``weight_copy_bytes_per_param``: resident bytes per parameter of the cached low-precision
    weight and its transpose (1 + 1; 0 for BF16); ``saved_input_bytes_per_element``: bytes per
    element a linear layer saves of its input for wgrad."""

    name: str
    operand_bytes: int
    macs_per_pe_cycle: int
    cast_bytes_per_element: float
    weight_copy_bytes_per_param: float
    saved_input_bytes_per_element: float

    @property
    def low_precision(self) -> bool:
        """Does a linear layer's GEMM run in another format than BF16?"""
        return self.name != "bf16"


FORMATS = {
    "bf16": Format("bf16", 2, 1, 0.0, 0.0, 2.0),
    "fp8": Format("fp8", 1, 2, 4.0, 2.0, 1.0),
}


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise PhazeError(f"unknown precision {name!r}: choose one of {list(PRECISIONS)}")
    return FORMATS[name]


def gemm_core(core: dict, costmodel: dict, fmt: Format, local_buffer_bytes: float):
    """(core, costmodel) of the cost model for a GEMM in format `fmt` on the array of `core`:
    a ``w × d`` array of PEs doing ``r`` multiply-adds per cycle on `fmt` operands works as a
    ``(r·w) × d`` array (r operand pairs per PE along the reduction), with the same local buffer
    (``local_buffer_bytes``) and accumulators; operands of ``fmt.operand_bytes``, a BF16 output.
    BF16 returns `core` and `costmodel` unchanged."""
    if not fmt.low_precision:
        return core, costmodel
    core = {
        **core,
        "tc_width": core["tc_width"] * fmt.macs_per_pe_cycle,
        "tc_local_buffer_bytes": float(local_buffer_bytes),
    }
    cm = {
        **costmodel,
        "bytes_per_element": fmt.operand_bytes,
        "output_bytes_per_element": OUTPUT_BYTES_PER_ELEMENT,
    }
    return core, cm


def fp8_peak_flops(preset: dict, name: str, bf16_peak_flops: float) -> float:
    """A preset's dense FP8 peak (``gpu.fp8_peak_flops``, the vendor's datasheet figure); a
    preset without one has no FP8 tensor cores: PhazeError (exit 2). The datasheet figure must be
    the BF16 peak times ``FORMATS['fp8'].macs_per_pe_cycle`` within 1 % (the rate the cost model
    uses), or the preset contradicts itself."""
    peak = (preset.get("gpu") or {}).get("fp8_peak_flops")
    if peak is None:
        raise PhazeError(
            f"preset {name!r} has no FP8 tensor cores (no gpu.fp8_peak_flops): use --precision bf16"
        )
    rate = FORMATS["fp8"].macs_per_pe_cycle
    if not abs(float(peak) / (rate * bf16_peak_flops) - 1.0) <= 0.01:
        raise PhazeError(
            f"preset {name!r}: gpu.fp8_peak_flops {float(peak):.4g} is not {rate}x its BF16 peak "
            f"{bf16_peak_flops:.4g} FLOP/s (within 1 %)"
        )
    return float(peak)
