"""Bounded work: one wall-clock deadline per solve, checked by every loop of the solver.

``Scheduler.solve`` opens a ``Deadline`` of ``time_limit_s`` for the whole instance; the list
scheduler, the bounds and the solver worker each take their share of what is left and stop when
it is spent, returning the best valid answer found so far. The deterministic limits (SCIP's node
limit, the list scheduler's work allowance, the branch-and-bound's node limit) bound the same
loops in units that do not depend on the machine's speed, so a run whose deterministic limits
bind first gives the same answer on every machine.
"""

from __future__ import annotations

import math
import time


class OutOfTime(Exception):
    """Raised inside a loop whose deadline passed; caught by the caller that owns a fallback."""


class Deadline:
    """A point on the monotonic clock (``end``); ``inf`` seconds = no deadline."""

    __slots__ = ("end",)

    def __init__(self, seconds: float = math.inf):
        self.end = time.monotonic() + seconds if math.isfinite(seconds) else math.inf

    @classmethod
    def at(cls, end: float) -> Deadline:
        d = cls()
        d.end = end
        return d

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def check(self) -> None:
        if time.monotonic() >= self.end:
            raise OutOfTime

    def share(self, fraction: float) -> Deadline:
        """A deadline ``fraction`` of the way from now to this one."""
        if not math.isfinite(self.end):
            return Deadline()
        return Deadline.at(time.monotonic() + fraction * self.remaining())


NO_DEADLINE = Deadline()
