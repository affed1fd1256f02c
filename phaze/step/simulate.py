"""An event simulation of 1F1B (PipeDream-Flush): the reference the pipeline closed form of
`phaze.step.strategy.PipelineSchedule` is checked against (tests, benchmarks/step_schedule.py).

Stage s (0 = first) runs min(p − s − 1, m) warm-up forwards, then alternates one forward and one
backward, then the remaining backwards; a forward waits for the previous stage's forward of the
same microbatch, a backward for the next stage's backward (the last stage's for its own forward).
"""

from __future__ import annotations

from collections.abc import Sequence


def simulate_1f1b(fwd_s: Sequence[float], bwd_s: Sequence[float], microbatches: int) -> float:
    """Makespan of `microbatches` microbatches through stages with these forward / backward
    times (seconds per microbatch)."""
    p, m = len(fwd_s), microbatches
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("f", i) for i in range(warm)]
        nf, nb = warm, 0
        while nb < m:
            if nf < m:
                order.append(("f", nf))
                nf += 1
            order.append(("b", nb))
            nb += 1
        orders.append(order)
    done: dict[tuple[str, int, int], float] = {}
    free, pos = [0.0] * p, [0] * p
    remaining = sum(map(len, orders))
    while remaining:
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            if kind == "f":
                need = ("f", s - 1, i) if s > 0 else None
            else:
                need = ("b", s + 1, i) if s < p - 1 else ("f", s, i)
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need] if need else 0.0)
            free[s] = start + (fwd_s[s] if kind == "f" else bwd_s[s])
            done[(kind, s, i)] = free[s]
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError("1F1B simulation deadlocked")
    return max(free)
