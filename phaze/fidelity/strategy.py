"""A given parallel training strategy (what `phaze evaluate` is asked about) and its rank layout.

Megatron's layout: tensor-parallel ranks are consecutive (so a tensor-parallel group stays inside
a node when t ≤ devices per node), data-parallel next, pipeline outermost:
``rank = tp_rank + t·(dp_rank + d·pp_rank)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from phaze.errors import PhazeError
from phaze.fidelity.pipeline import PipelineSchedule

RECOMPUTE_MODES = ("full", "selective", "none")
DDP_MODES = ("overlap", "after")


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
    ddp: str = "after"

    def __post_init__(self) -> None:
        for name in ("devices", "tp", "pp", "microbatch", "global_batch", "interleave"):
            if getattr(self, name) < 1:
                raise PhazeError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.recompute not in RECOMPUTE_MODES:
            raise PhazeError(f"recompute must be one of {RECOMPUTE_MODES}, got {self.recompute!r}")
        if self.ddp not in DDP_MODES:
            raise PhazeError(f"ddp must be one of {DDP_MODES}, got {self.ddp!r}")
        if self.devices % (self.tp * self.pp):
            raise PhazeError(
                f"devices ({self.devices}) must be divisible by tp·pp = "
                f"{self.tp}·{self.pp} = {self.tp * self.pp}"
            )
        if self.global_batch % (self.microbatch * self.dp):
            raise PhazeError(
                f"global batch ({self.global_batch}) must be divisible by microbatch·dp = "
                f"{self.microbatch}·{self.dp} = {self.microbatch * self.dp}"
            )
        if self.sequence_parallel and self.tp == 1:
            raise PhazeError("sequence parallelism needs tensor parallelism (tp > 1)")
        _ = self.schedule  # validates interleaving against the microbatch count

    @property
    def dp(self) -> int:
        return self.devices // (self.tp * self.pp)

    @property
    def microbatches(self) -> int:
        """Microbatches per pipeline per iteration (m)."""
        return self.global_batch // (self.microbatch * self.dp)

    @property
    def schedule(self) -> PipelineSchedule:
        return PipelineSchedule(self.pp, self.interleave, self.microbatches)

    # --- rank layout --------------------------------------------------------------------------
    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def tp_group(self, dp_rank: int = 0, pp_rank: int = 0) -> list[int]:
        return [self.rank(i, dp_rank, pp_rank) for i in range(self.tp)]

    def dp_group(self, tp_rank: int = 0, pp_rank: int = 0) -> list[int]:
        return [self.rank(tp_rank, i, pp_rank) for i in range(self.dp)]
