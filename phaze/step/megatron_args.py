"""The Megatron-LM command-line arguments that run a strategy (megatron/training/arguments.py and
megatron/core/transformer/transformer_config.py of NVIDIA/Megatron-LM).

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

from phaze.step.strategy import Strategy


def pipeline_layout(stages: tuple[int, ...], interleave: int) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` string for blocks per stage."""
    pp = len(stages)
    segments = []
    for v in range(interleave):
        for j in range(pp):
            n = stages[j] // interleave
            segments.append(f"t*{n}" if n > 1 else "t" * n)
    segments[0] = "E" + segments[0]
    segments[-1] = segments[-1] + "L"
    return "|".join(segments)


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
    even = len(set(stages)) == 1
    if not even:
        args.append(f"--pipeline-model-parallel-layout {pipeline_layout(stages, s.interleave)}")
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
