"""A parallel training strategy as Megatron-LM runs it, its pipeline schedule and its rank layout.

A strategy is ``tp · cp · pp · dp = devices`` ranks (Megatron's layout, tensor-parallel innermost,
then context-parallel, data-parallel, pipeline outermost: ``rank = tp_rank + tp·(cp_rank +
cp·(dp_rank + dp·pp_rank))``, pipeline rank 0 = the first stage; cp = 1 without context
parallelism, whose cp ranks split every sequence and share the weights, so gradients are reduced
over dp·cp ranks), ``ep`` expert-parallel ranks inside each data-parallel group (Megatron's
expert-model parallelism, order ``tp-cp-ep-dp-pp`` with the experts' tensor-parallel size equal to
tp: ``dp_rank = ep_rank + ep·edp_rank``, so an expert-parallel group is ep ranks tp apart and the
expert data-parallel group, over which expert gradients are reduced, dp/ep ranks tp·ep apart;
ep must divide dp). With ``etp = 1`` (Megatron's ``--expert-tensor-parallel-size 1``, "parallel
folding") the experts are not split over the tensor-parallel ranks: the expert generator is then
``rank = ep_rank + ep·(edp_rank + edp·pp_rank)`` with ``edp = tp·dp/ep`` (ep must divide tp·dp), so
an expert-parallel group is ep consecutive ranks and the expert data-parallel group tp·dp/ep
ranks ep apart; at tp = 1 both layouts are the same. ``microbatch · dp`` sequences per microbatch round (it must divide the global
batch: ``m = global_batch / (microbatch · dp)`` microbatches per pipeline), V model chunks per
pipeline rank (interleaved 1F1B when V > 1), a recomputation mode, sequence parallelism, the
distributed optimizer (ZeRO-1), the data-parallel gradient reduction overlapped with backward or
after it, and the blocks each pipeline stage holds.

Stages (``stages[j]`` = transformer blocks on pipeline rank j; the first stage also holds the
layers before the first block, the last those after the last block). Without explicit stages
Megatron's even split is used (``blocks / pp`` each). With V > 1 the blocks of stage j form V
chunks of ``stages[j] / V`` blocks, placed round-robin as Megatron does (chunk v of rank j is
model chunk ``v·pp + j``); every stage then needs a positive multiple of V blocks. With V = 1 a
first or last stage may hold no block (only the embedding or the head: Megatron's
``--pipeline-model-parallel-layout``), a middle stage needs at least one. A layout may instead
give the blocks of every model chunk (``chunks``, pp·V entries in Megatron's layout order: entry
v·pp + j is chunk v of rank j; any count >= 0, as ``--pipeline-model-parallel-layout`` allows):
rank j then holds the sum of its V chunks, and the schedule below prices its rank times as if
its chunks were equal (the fill and drain steps of unequal chunks are not told apart).

Schedules (Narayanan et al. 2021 §2.2; Megatron-LM ``megatron/core/pipeline_parallel/
schedules.py``), for pipeline-rank times T_j of one microbatch (forward + backward):

    pipeline time = m · max_j T_j + (Σ_j T_j − max_j T_j) / V

the slowest rank sets the steady state; filling and draining cost the other ranks' shares once,
divided by V because with interleaving each fill/drain step is one chunk. For identical stages
this is m·T + (p−1)·T/V, a bubble of (p−1)/(V·m). Activations in flight on rank j at the peak
(units: one microbatch through the rank's blocks): 1F1B ``min(p − j, m)``; interleaved Megatron's
warm-up ``2(p − j − 1) + (V − 1)·p`` chunk forwards plus the one running, ``min(·, m·V) / V``.
Interleaving needs pp > 1 and m divisible by pp (Megatron asserts both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from phaze.errors import PhazeError

RECOMPUTE_MODES = ("none", "selective", "full")
DDP_MODES = ("overlap", "after")


def schedule_reason(stages: int, chunks: int, microbatches: int) -> str:
    """'' when Megatron can run 1F1B (chunks = 1) or interleaved 1F1B with these sizes, else why
    not (one line)."""
    for name, value in (("stages", stages), ("chunks", chunks), ("microbatches", microbatches)):
        if value < 1:
            return f"pipeline {name} must be >= 1, got {value}"
    if chunks > 1:
        if stages == 1:
            return "interleaving (interleave > 1) needs pipeline parallelism (pp > 1)"
        if microbatches % stages:
            return (
                f"the interleaved schedule needs the microbatches per pipeline "
                f"({microbatches}) divisible by pp ({stages})"
            )
    return ""


@dataclass(frozen=True)
class PipelineSchedule:
    stages: int  # p: pipeline ranks
    chunks: int  # V: model chunks per rank (1 = plain 1F1B)
    microbatches: int  # m: microbatches per pipeline per iteration

    def reason(self) -> str:
        """'' when Megatron can run this schedule, else why not (one line)."""
        return schedule_reason(self.stages, self.chunks, self.microbatches)

    def __post_init__(self) -> None:
        why = self.reason()
        if why:
            raise PhazeError(why)

    def iteration_time(self, stage_times_s: Sequence[float]) -> tuple[float, float]:
        """(pipeline time, bubble time) for per-rank times of one microbatch (fwd + bwd)."""
        if len(stage_times_s) != self.stages:
            raise AssertionError(f"expected {self.stages} stage times, got {len(stage_times_s)}")
        t_max = max(stage_times_s)
        bubble = (sum(stage_times_s) - t_max) / self.chunks
        return self.microbatches * t_max + bubble, bubble

    def sends(self, rank: int) -> tuple[int, int]:
        """(activation sends to the next rank, gradient sends to the previous rank) per
        microbatch: V each, less the one that would leave the model (the last rank's last chunk
        has no successor, the first rank's first chunk no predecessor). The next rank of the last
        is the first (interleaving wraps around)."""
        if self.stages == 1:
            return 0, 0
        v = self.chunks
        return v - (rank == self.stages - 1), v - (rank == 0)

    def sends_all(self) -> np.ndarray:
        """`sends` of every rank, (p, 2)."""
        p, v = self.stages, self.chunks
        if p == 1:
            return np.zeros((1, 2))
        rank = np.arange(p)
        return np.stack([v - (rank == p - 1), v - (rank == 0)], axis=1).astype(float)

    def inflight_all(self) -> np.ndarray:
        """`inflight` of every rank, (p,)."""
        p, v, m = self.stages, self.chunks, self.microbatches
        rank = np.arange(p)
        if v == 1:
            return np.minimum(p - rank, m).astype(float)
        return np.minimum(2 * (p - rank - 1) + (v - 1) * p + 1, m * v) / v

    def inflight(self, rank: int) -> float:
        """Microbatches whose activations rank `rank` (0 = first) holds at the peak, in units of
        one microbatch through all the rank's blocks."""
        p, v, m = self.stages, self.chunks, self.microbatches
        if not 0 <= rank < p:
            raise AssertionError(f"rank {rank} outside a pipeline of {p} stages")
        if v == 1:
            return float(min(p - rank, m))
        return min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v) / v


def context_parallel_reason(seq: int, cp: int) -> str:
    """'' when Megatron-LM can split a sequence of `seq` tokens over `cp` context-parallel ranks,
    else why not: each rank holds two of 2·cp equal chunks (the causal load balancing of
    ``get_batch_on_this_cp_rank``, megatron/training/utils.py, which views the sequence as
    2·cp chunks), so 2·cp must divide the sequence."""
    if int(cp) != cp or cp < 1:
        return f"the context-parallel size cp must be an integer >= 1, got {cp}"
    if cp > 1 and seq % (2 * cp):
        return (
            f"the context-parallel size cp ({cp}) must split the sequence of {seq} tokens into "
            f"2·cp = {2 * cp} equal chunks (Megatron-LM gives each rank two)"
        )
    return ""


def check_context_parallel(seq: int, cp: int) -> None:
    why = context_parallel_reason(seq, cp)
    if why:
        raise PhazeError(why)


def stages_reason(stages: Sequence[int], blocks: int, interleave: int) -> str:
    """'' when `stages` is a valid split of `blocks` blocks for V = `interleave`, else why not."""
    p = len(stages)
    if p < 1:
        return "a pipeline needs at least one stage"
    if any(int(n) != n or n < 0 for n in stages):
        return f"blocks per stage must be integers >= 0, got {list(stages)}"
    if sum(stages) != blocks:
        return f"the stages hold {sum(stages)} blocks, the model has {blocks}"
    if interleave > 1:
        for j, n in enumerate(stages):
            if n < interleave or n % interleave:
                return (
                    f"interleave {interleave} does not divide the {n} blocks of stage {j} "
                    f"(each of its {interleave} model chunks needs a whole number >= 1 of blocks)"
                )
    else:
        for j, n in enumerate(stages[1:-1], 1):
            if n < 1:
                return f"middle stage {j} holds no block"
    return ""


@dataclass(frozen=True)
class Strategy:
    devices: int
    tp: int
    pp: int
    microbatch: int
    global_batch: int
    interleave: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    ddp: str = "overlap"
    stages: tuple[int, ...] | None = None  # blocks per pipeline stage; None = even split
    ep: int = 1  # expert-parallel ranks (inside the data-parallel group); 1 = none
    etp: int | None = None  # the experts' tensor-parallel size: tp (None, Megatron's default) or 1
    cp: int = 1  # context-parallel ranks: each holds seq/cp of every sequence; 1 = none
    # blocks per model chunk, pp·V entries in Megatron's layout order; None = stages / V each
    chunks: tuple[int, ...] | None = None

    def reason(self) -> str:
        """'' when the strategy is well formed (independently of the model), else why not."""
        for name in (
            "devices",
            "tp",
            "pp",
            "microbatch",
            "global_batch",
            "interleave",
            "ep",
            "cp",
        ):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 1:
                return f"{name} must be an integer >= 1, got {getattr(self, name)}"
        if self.recompute not in RECOMPUTE_MODES:
            return f"recompute must be one of {'|'.join(RECOMPUTE_MODES)}, got {self.recompute!r}"
        if self.ddp not in DDP_MODES:
            return f"ddp must be one of {'|'.join(DDP_MODES)}, got {self.ddp!r}"
        if self.cp == 1 and self.devices % (self.tp * self.pp):
            return (
                f"devices ({self.devices}) must be divisible by tp·pp = "
                f"{self.tp}·{self.pp} = {self.tp * self.pp}"
            )
        if self.devices % (self.tp * self.cp * self.pp):
            return (
                f"devices ({self.devices}) must be divisible by tp·cp·pp = "
                f"{self.tp}·{self.cp}·{self.pp} = {self.tp * self.cp * self.pp}"
            )
        if self.global_batch % (self.microbatch * self.dp):
            return (
                f"global batch ({self.global_batch}) must be divisible by microbatch·dp = "
                f"{self.microbatch}·{self.dp} = {self.microbatch * self.dp}"
            )
        if self.etp not in (None, 1, self.tp):
            return (
                f"the experts' tensor-parallel size etp must be tp ({self.tp}) or 1, "
                f"got {self.etp!r}"
            )
        if self.expert_tp == 1 and (self.tp * self.cdp) % self.ep:
            return (
                f"the expert-parallel size ep ({self.ep}) must divide tp·{self._cdp_name} = "
                f"{self.tp}·{self.cdp} = {self.tp * self.cdp} (etp = 1)"
            )
        if self.expert_tp > 1 and self.cdp % self.ep:
            return (
                f"the expert-parallel size ep ({self.ep}) must divide the data-parallel size "
                f"{self._cdp_name} ({self.cdp})"
            )
        if self.sequence_parallel and self.tp == 1:
            return "sequence parallelism needs tensor parallelism (tp > 1)"
        if self.distributed_optimizer and self.cdp == 1:
            return "the distributed optimizer needs data parallelism (dp > 1)"
        if self.stages is not None and len(self.stages) != self.pp:
            return f"{len(self.stages)} stage sizes given for pp = {self.pp}"
        if self.chunks is not None:
            if self.stages is not None:
                return "give the blocks per stage or per model chunk, not both"
            if len(self.chunks) != self.pp * self.interleave:
                return (
                    f"the layout has {len(self.chunks)} model chunks, pp·interleave = "
                    f"{self.pp}·{self.interleave} = {self.pp * self.interleave}"
                )
            if any(int(n) != n or n < 0 for n in self.chunks):
                return f"blocks per model chunk must be integers >= 0, got {list(self.chunks)}"
        return schedule_reason(self.pp, self.interleave, self.microbatches)

    def __post_init__(self) -> None:
        why = self.reason()
        if why:
            raise PhazeError(why)

    def experts_reason(self, experts: int) -> str:
        """'' when the strategy suits a model with `experts` routed experts per block (0: a
        dense model), else why not (Megatron-LM's checks: ``--num-experts`` divisible by
        ``--expert-model-parallel-size``; MoELayer raises in training with tensor parallelism
        and no sequence parallelism)."""
        if experts == 0:
            if self.ep > 1:
                return f"expert parallelism (ep = {self.ep}) needs a mixture-of-experts model"
            if self.expert_tp != self.tp:
                return (
                    "etp = 1 (experts without tensor parallelism) needs a mixture-of-experts model"
                )
            return ""
        if experts % self.ep:
            return f"the expert-parallel size ep ({self.ep}) must divide the {experts} experts"
        if self.tp > 1 and not self.sequence_parallel:
            return (
                "a mixture-of-experts model with tensor parallelism needs sequence parallelism "
                "(Megatron-LM's MoE layer refuses to train without it)"
            )
        return ""

    def check_experts(self, experts: int) -> None:
        why = self.experts_reason(experts)
        if why:
            raise PhazeError(why)

    def layers_reason(self, blocks: int) -> str:
        """'' when the strategy's stages (or the even split) fit a model of `blocks` blocks."""
        if self.chunks is not None:
            if sum(self.chunks) != blocks:
                return f"the model chunks hold {sum(self.chunks)} blocks, the model has {blocks}"
            return ""
        if self.stages is None:
            if blocks % self.pp:
                return (
                    f"{blocks} blocks cannot be split evenly over pp = {self.pp} stages "
                    "(give the blocks per stage)"
                )
            stages = (blocks // self.pp,) * self.pp
        else:
            stages = self.stages
        return stages_reason(stages, blocks, self.interleave)

    def check_layers(self, blocks: int) -> tuple[int, ...]:
        """The blocks per stage for a model of `blocks` blocks (PhazeError when impossible)."""
        why = self.layers_reason(blocks)
        if why:
            raise PhazeError(why)
        if self.chunks is not None:
            return self.chunk_stages
        return self.stages if self.stages is not None else (blocks // self.pp,) * self.pp

    @property
    def chunk_stages(self) -> tuple[int, ...]:
        """The blocks of each pipeline rank under `chunks`: the sum of its V model chunks."""
        p = self.pp
        return tuple(sum(self.chunks[j::p]) for j in range(p))

    @property
    def dp(self) -> int:
        return self.devices // (self.tp * self.cp * self.pp)

    @property
    def cdp(self) -> int:
        """The ranks that hold the same parameters: dp·cp (Megatron replicates the weights over
        the context-parallel ranks and reduces their gradients over the data-parallel group
        with context parallelism, ``get_data_parallel_group(with_context_parallel=True)``)."""
        return self.dp * self.cp

    @property
    def _cdp_name(self) -> str:
        return "dp" if self.cp == 1 else "dp·cp"

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel size (etp): tp unless etp = 1 was given."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """The expert data-parallel size: the ranks one expert's gradients are reduced over
        (tp·dp = etp·ep·edp in every pipeline stage)."""
        return self.tp * self.cdp // (self.expert_tp * self.ep)

    @property
    def microbatches(self) -> int:
        """Microbatches per pipeline per iteration (m)."""
        return self.global_batch // (self.microbatch * self.dp)

    @property
    def schedule(self) -> PipelineSchedule:
        return PipelineSchedule(self.pp, self.interleave, self.microbatches)

    def as_dict(self, blocks: int) -> dict:
        """The strategy object `evaluate` and `optimize` print (``cp`` only with context
        parallelism)."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "etp": self.expert_tp,
            **({"cp": self.cp} if self.cp > 1 else {}),
            "microbatch": self.microbatch,
            "interleave": self.interleave,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "distributed_optimizer": self.distributed_optimizer,
            "ddp": self.ddp,
            "stages": list(self.check_layers(blocks)),
        }

    # --- rank layout --------------------------------------------------------------------------
    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int, cp_rank: int = 0) -> int:
        """Megatron's order tp-cp-ep-dp-pp: ``tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank))``."""
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))

    def tp_group(self, dp_rank: int = 0, pp_rank: int = 0, cp_rank: int = 0) -> list[int]:
        return [self.rank(i, dp_rank, pp_rank, cp_rank) for i in range(self.tp)]

    def dp_group(self, tp_rank: int = 0, pp_rank: int = 0) -> list[int]:
        """The ranks a gradient is reduced over: the data-parallel group with context
        parallelism (dp·cp ranks tp apart)."""
        return [self.rank(tp_rank, i, pp_rank, c) for i in range(self.dp) for c in range(self.cp)]

    def cp_group(self, tp_rank: int = 0, dp_rank: int = 0, pp_rank: int = 0) -> list[int]:
        """The ranks that pass keys and values around the ring (ring order)."""
        return [self.rank(tp_rank, dp_rank, pp_rank, c) for c in range(self.cp)]

    def expert_rank(self, etp_rank: int, ep_rank: int, edp_rank: int, pp_rank: int) -> int:
        """Megatron's expert rank generator (order tp-ep-dp-pp with the experts' own tp size):
        ``etp_rank + etp·(ep_rank + ep·(edp_rank + edp·pp_rank))``."""
        etp = self.expert_tp
        return etp_rank + etp * (ep_rank + self.ep * (edp_rank + self.edp * pp_rank))

    def ep_group(self, etp_rank: int = 0, edp_rank: int = 0, pp_rank: int = 0) -> list[int]:
        """The ranks that exchange tokens (all-to-all) for one expert layer's dispatch."""
        return [self.expert_rank(etp_rank, e, edp_rank, pp_rank) for e in range(self.ep)]

    def edp_group(self, etp_rank: int = 0, ep_rank: int = 0, pp_rank: int = 0) -> list[int]:
        """The ranks holding the same experts: their gradients are reduced over it."""
        return [self.expert_rank(etp_rank, ep_rank, i, pp_rank) for i in range(self.edp)]
