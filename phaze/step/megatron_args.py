"""The Megatron-LM command-line arguments that run a strategy (megatron/training/arguments.py and
megatron/core/transformer/transformer_config.py of NVIDIA/Megatron-LM), and the blocks per model
chunk of a ``--pipeline-model-parallel-layout`` read back (`parse_pipeline_layout`).

* parallelism: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size`` (the data-parallel
  size is what remains of the world size), ``--micro-batch-size``, ``--global-batch-size``;
  ``--context-parallel-size``, ``--expert-model-parallel-size`` and, for whole experts,
  ``--expert-tensor-parallel-size 1``;
* stages: Megatron's even split needs no argument; interleaving over an even split is
  ``--num-layers-per-virtual-pipeline-stage``; any other split is
  ``--pipeline-model-parallel-layout``, one ``|``-separated segment per model chunk in layer order
  (chunk v of pipeline rank j is segment v·pp + j), ``E`` the embedding, ``t`` a transformer
  layer, ``L`` the loss (the vpp size follows from the segment count);
* ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (every
  layer recomputed from its input) or ``--recompute-granularity selective`` (default module:
  core attention);
* ``--sequence-parallel``, ``--use-distributed-optimizer``, ``--overlap-grad-reduce`` (DDP overlap;
  Megatron's DDP reduces after backward without it).
"""

from __future__ import annotations

import re

from phaze.errors import PhazeError
from phaze.step.strategy import Strategy

#: the layer symbols of a layout (Megatron-LM megatron/core/transformer/
#: pipeline_parallel_layer_layout.py): the embedding, a transformer block, a multi-token
#: prediction layer, the loss (output layer)
LAYOUT_SYMBOLS = "EtmL"


def pipeline_layout(stages: tuple[int, ...], interleave: int, chunks=None) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` string for blocks per stage (or per model
    chunk, `chunks`, in layout order)."""
    pp = len(stages)
    if chunks is None:
        chunks = [stages[j] // interleave for v in range(interleave) for j in range(pp)]
    segments = [f"t*{n}" if n > 1 else "t" * n for n in chunks]
    segments[0] = "E" + segments[0]
    segments[-1] = segments[-1] + "L"
    return "|".join(segments)


def parse_pipeline_layout(
    layout: str, pp: int, interleave: int, blocks: int, folded: int = 0
) -> tuple[int, ...]:
    """The blocks per model chunk (layout order, pp·interleave entries) of a Megatron-LM
    ``--pipeline-model-parallel-layout`` string, as Megatron-LM reads one: commas ignored,
    ``(...)*n`` and ``x*n`` repeated, ``|`` between model chunks (chunk v of rank j is segment
    v·pp + j), ``E`` only in the first, ``L`` only in the last. The model has `blocks`
    transformer blocks after its first `folded` (dense first blocks the step model prices with
    the embedding on the first rank); ``m`` (multi-token prediction) is not priced. PhazeError
    (one line) when the layout is malformed or does not hold the model's blocks."""
    text = layout.replace(",", "").replace(" ", "")
    for pattern in (r"\(([^()]*)\)\*(\d+)", r"([^()|*])\*(\d+)"):
        while re.search(pattern, text):
            text = re.sub(pattern, lambda g: g.group(1) * int(g.group(2)), text)
    bad = sorted(set(text) - set(LAYOUT_SYMBOLS) - {"|"})
    if bad:
        raise PhazeError(
            f"pipeline layout {layout!r}: unknown symbol(s) {''.join(bad)!r} "
            f"(Megatron-LM's layout has {', '.join(LAYOUT_SYMBOLS)}, '|', '(...)*n', 'x*n')"
        )
    segments = text.split("|")
    if len(segments) != pp * interleave:
        raise PhazeError(
            f"pipeline layout {layout!r} has {len(segments)} model chunks, pp·interleave = "
            f"{pp}·{interleave} = {pp * interleave}"
        )
    if text.count("E") != 1 or "E" not in segments[0]:
        raise PhazeError(f"pipeline layout {layout!r}: the embedding E must be once, in chunk 0")
    if text.count("L") != 1 or "L" not in segments[-1]:
        raise PhazeError(f"pipeline layout {layout!r}: the loss L must be once, in the last chunk")
    if text.count("t") != blocks + folded:
        raise PhazeError(
            f"pipeline layout {layout!r} holds {text.count('t')} transformer blocks, the model "
            f"has {blocks + folded}"
        )
    chunks, skip = [], folded
    for seg in segments:
        n = seg.count("t")
        drop = min(n, skip)
        skip -= drop
        chunks.append(n - drop)
    return tuple(chunks)


def megatron_arguments(strategy: Strategy, blocks: int) -> list[str]:
    s = strategy
    stages = s.check_layers(blocks)
    args = [
        f"--tensor-model-parallel-size {s.tp}",
        f"--pipeline-model-parallel-size {s.pp}",
        f"--micro-batch-size {s.microbatch}",
        f"--global-batch-size {s.global_batch}",
    ]
    if s.cp > 1:
        args.append(f"--context-parallel-size {s.cp}")
    if s.ep > 1:
        args.append(f"--expert-model-parallel-size {s.ep}")
    if s.expert_tp != s.tp:
        args.append(f"--expert-tensor-parallel-size {s.expert_tp}")
    even = len(set(stages)) == 1 and (s.chunks is None or len(set(s.chunks)) == 1)
    if not even:
        layout = pipeline_layout(stages, s.interleave, s.chunks)
        args.append(f"--pipeline-model-parallel-layout {layout}")
    elif s.interleave > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {stages[0] // s.interleave}")
    if s.recompute == "full":
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    elif s.recompute == "selective":
        args.append("--recompute-granularity selective")
    if s.sequence_parallel:
        args.append("--sequence-parallel")
    if s.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if s.ddp == "overlap":
        args.append("--overlap-grad-reduce")
    return args
