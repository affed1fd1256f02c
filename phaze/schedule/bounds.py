"""Cheap, proven lower bounds on the makespan (microseconds to compute).

* critical path — the longest path with every op at its fastest mode;
* energy per core type c — intra-op ops run alone on the chip and single-core ops of type c
  share n_c cores, so T >= sum over ops using c of min(L_all, L_1 / n_c) (the ILP carries the
  mode-dependent version of the same cut);
* windowed energy — the same on every window [head threshold, T - tail threshold];
* heads/tails — earliest start and minimum remaining time per op, used for variable bounds and
  per-pair big-M in the ILP.
"""
from __future__ import annotations

from phaze.schedule.instance import Instance


def heads(inst: Instance) -> list[float]:
    """Earliest possible start of each op (longest fastest-mode path to it)."""
    h = [0.0] * inst.n
    for j in range(inst.n):
        h[j] = max((h[i] + inst.q[i] for i in inst.preds[j]), default=0.0)
    return h


def tails(inst: Instance) -> list[float]:
    """Least time that must pass after each op ends (longest fastest-mode path after it)."""
    t = [0.0] * inst.n
    for i in reversed(range(inst.n)):
        t[i] = max((inst.q[j] + t[j] for j in inst.succs[i]), default=0.0)
    return t


def critical_path(inst: Instance) -> float:
    h = heads(inst)
    return max((h[i] + inst.q[i] for i in range(inst.n)), default=0.0)


def energy(inst: Instance, kind: str) -> float:
    n = inst.n_cores(kind)
    return sum(min(inst.la[i], inst.l1[i] / n) for i in range(inst.n) if inst.uses(i, kind))


def windowed_energy(inst: Instance, kind: str) -> float:
    """Energy bound on time windows: the ops that cannot start before h and cannot end later than
    tau before the end must fit between, so T >= h + sum of their min core-time / n_c + tau, for
    every pair of thresholds (h, tau) taken from the ops' heads and tails. Catches the backward
    pass's weight-gradient leaves, which all come late."""
    n_c = inst.n_cores(kind)
    hd, tl = heads(inst), tails(inst)
    mem = [i for i in range(inst.n) if inst.uses(i, kind)]
    w = {i: min(inst.la[i], inst.l1[i] / n_c) for i in mem}
    best = 0.0
    for h in sorted({hd[i] for i in mem}):
        sub = [i for i in mem if hd[i] >= h]
        for tau in sorted({tl[i] for i in sub}):
            best = max(best, h + sum(w[i] for i in sub if tl[i] >= tau) + tau)
    return best


def lower_bound(inst: Instance) -> tuple[float, str]:
    """(best cheap bound, which one)."""
    cands = [(critical_path(inst), "critical_path"), (energy(inst, "tc"), "energy_tc"),
             (energy(inst, "vc"), "energy_vc"), (windowed_energy(inst, "tc"), "window_tc"),
             (windowed_energy(inst, "vc"), "window_vc")]
    return max(cands)
