"""How close the step model's pipeline closed form is to an event simulation of 1F1B.

The model prices m microbatches through p stages of per-microbatch times T_j = f_j + b_j as
``m · max T + (Σ T − max T)`` (`phaze.step.strategy.PipelineSchedule.iteration_time`, V = 1). It is
exact for identical stages; this script measures it on uneven ones against an event simulation
of PipeDream-Flush (`phaze.step.simulate`).

    .venv/bin/python benchmarks/step_schedule.py [--cases 3000] [--seed 0]

Prints the range of (model − simulation) / simulation for three families of stages: identical,
block-structured (n_j blocks of one forward f and backward 2f, n_j within one block of each
other, the embedding on the first stage and the head on the last), and arbitrary (independent
random f_j, b_j).
"""

from __future__ import annotations

import argparse

import numpy as np

from phaze.step.simulate import simulate_1f1b
from phaze.step.strategy import PipelineSchedule


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    def identical(p):
        x = float(rng.uniform(0.5, 2))
        return np.full(p, x), np.full(p, 2 * x)

    def blocks(p):
        n = rng.integers(5, 7, p).astype(float)
        f = n + np.r_[0.2, np.zeros(p - 1)]
        return f, 2 * n + np.r_[np.zeros(p - 1), 0.4]

    def arbitrary(p):
        return rng.uniform(0.2, 2, p), rng.uniform(0.4, 4, p)

    print(f"{'stages':<16}{'cases':>7}{'m >= 2p':>22}{'m < 2p':>22}")
    for name, gen in (
        ("identical", identical),
        ("block-structured", blocks),
        ("arbitrary", arbitrary),
    ):
        err = {True: [], False: []}
        for _ in range(args.cases):
            p, m = int(rng.integers(1, 9)), int(rng.integers(1, 64))
            f, b = gen(p)
            model, _ = PipelineSchedule(p, 1, m).iteration_time(list(f + b))
            sim = simulate_1f1b(f, b, m)
            err[m >= 2 * p].append((model - sim) / sim)
        cells = [
            f"{100 * min(e):+.1f} .. {100 * max(e):+.1f} %" if e else "-"
            for e in (err[True], err[False])
        ]
        print(f"{name:<16}{args.cases:>7}{cells[0]:>22}{cells[1]:>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
