"""Pipeline schedules: 1F1B (PipeDream-Flush) and Megatron's interleaved 1F1B with V chunks.

Closed forms (Narayanan et al. 2021 §2.2; Korthikanti et al. 2022 §4.2), for p stages (devices),
V model chunks per device and m microbatches per pipeline per iteration:

* ideal time m·t (t = one microbatch's forward + backward on one device), bubble (p−1)·t/V, i.e.
  (p−1)/(V·m) of the ideal time;
* point-to-point traffic V× that of 1F1B (every chunk boundary is crossed by every microbatch);
* first-device activations: 1F1B holds p microbatches of its L/p layers; interleaving holds
  p·(1 + (p−1)/(p·V)) microbatch-stages (its warm-up runs 2(p−1) + (V−1)·p chunk forwards).

Interleaving needs m divisible by p and the layer count divisible by p·V (Megatron asserts both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from phaze.errors import PhazeError


@dataclass(frozen=True)
class PipelineSchedule:
    stages: int  # p: devices in a pipeline
    chunks: int  # V: model chunks per device (1 = plain 1F1B)
    microbatches: int  # m: microbatches per pipeline per iteration

    def __post_init__(self) -> None:
        for name in ("stages", "chunks", "microbatches"):
            if getattr(self, name) < 1:
                raise PhazeError(f"pipeline {name} must be >= 1, got {getattr(self, name)}")
        if self.chunks > 1:
            if self.stages == 1:
                raise PhazeError("interleaving (V > 1) needs pipeline parallelism (pp > 1)")
            if self.microbatches % self.stages:
                raise PhazeError(
                    f"interleaved schedule needs the microbatch count ({self.microbatches}) "
                    f"divisible by the pipeline stages ({self.stages})"
                )

    @property
    def interleaved(self) -> bool:
        return self.chunks > 1

    def check_layers(self, layers: int) -> None:
        """Megatron's uniform split: layers divisible by p (1F1B) or by p·V (interleaved)."""
        need = self.stages * self.chunks
        if layers % need:
            what = (
                f"pp·V = {self.stages}·{self.chunks}" if self.interleaved else f"pp = {self.stages}"
            )
            raise PhazeError(
                f"{layers} layers cannot be split evenly over {what} = {need} model chunks"
            )

    # --- time ---------------------------------------------------------------------------------
    @property
    def bubble_fraction(self) -> float:
        """Bubble time as a fraction of the ideal (bubble-free) time, for identical stages."""
        return (self.stages - 1) / (self.chunks * self.microbatches)

    def iteration_time(self, stage_times_s: Sequence[float]) -> tuple[float, float]:
        """(pipeline time, bubble time) for per-device times of one microbatch (fwd + bwd).

        The slowest device sets the steady state (m of its microbatches back to back); filling
        and draining cost the other devices' shares once, divided by V because with interleaving
        each fill/drain step is one chunk (1/V of a device's work). For identical stages this is
        m·t + (p−1)·t/V, the closed form above.
        """
        if len(stage_times_s) != self.stages:
            raise PhazeError(f"expected {self.stages} stage times, got {len(stage_times_s)}")
        t_max = max(stage_times_s)
        bubble = (sum(stage_times_s) - t_max) / self.chunks
        return self.microbatches * t_max + bubble, bubble

    # --- traffic ------------------------------------------------------------------------------
    def transfers_per_microbatch(self) -> int:
        """Activation sends (and as many gradient sends) a device makes per microbatch."""
        return 0 if self.stages == 1 else self.chunks

    # --- memory -------------------------------------------------------------------------------
    def inflight_microbatch_stages(self, device: int = 0) -> float:
        """Activations held at the peak, in units of (one microbatch × one device's L/p layers).

        1F1B: device d (0 = first) runs p − d warm-up forwards before its first backward.
        Interleaved: Megatron's warm-up on device d is 2(p−d−1) + (V−1)·p chunk forwards, plus the
        one in flight, each chunk being 1/V of the device's layers.
        """
        p, v, m = self.stages, self.chunks, self.microbatches
        if not 0 <= device < p:
            raise PhazeError(f"device {device} outside a pipeline of {p} stages")
        if v == 1:
            return float(min(p - device, m))
        chunk_forwards = min(2 * (p - device - 1) + (v - 1) * p + 1, m * v)
        return chunk_forwards / v
