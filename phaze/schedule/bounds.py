"""Cheap, proven lower bounds on the makespan (microseconds to compute).

* critical path — the longest path with every op at its fastest mode;
* energy per core type c — intra-op ops run alone on the chip and single-core ops of type c
  share n_c cores, so T >= sum over ops using c of min(L_all, L_1 / n_c) (the ILP carries the
  mode-dependent version of the same cut);
* forced-mode energy — ops whose single-core latency cannot fit below a makespan T must run
  intra-op (alone) in any schedule shorter than T; the fixed point of that energy is a bound;
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


def forced_intra(inst: Instance, t: float) -> list[int]:
    """Ops that cannot run on one core in any schedule shorter than ``t``: head + L_1 + tail > t
    (and intra-op is faster). In every schedule of makespan < t they are intra-op, alone."""
    hd, tl = heads(inst), tails(inst)
    return [i for i in range(inst.n)
            if inst.la[i] < inst.l1[i] and hd[i] + inst.l1[i] + tl[i] > t * (1 + 1e-12)]


def forced_energy(inst: Instance, ub: float) -> float:
    """The energy bound once modes are forced: g(T) = sum of L_all over ops forced at T (they
    take the whole chip) + the energy of the other ops of type c. g does not increase with T and
    the optimum satisfies OPT >= g(OPT), so min{T : T >= g(T)} is a lower bound (capped at the
    known upper bound ``ub``). Large when single-core latencies are long (many cores)."""
    hd, tl = heads(inst), tails(inst)
    n = inst.n
    bp = [hd[i] + inst.l1[i] + tl[i] if inst.la[i] < inst.l1[i] else 0.0 for i in range(n)]

    def g(forced: set[int]) -> float:
        base = sum(inst.la[i] for i in forced)
        out = base
        for c in ("tc", "vc"):
            n_c = inst.n_cores(c)
            out = max(out, base + sum(min(inst.la[i], inst.l1[i] / n_c)
                                      for i in range(n) if i not in forced and inst.uses(i, c)))
        return out

    lo = 0.0
    for b in sorted({v for v in bp if 0.0 < v < ub} | {ub}):
        val = g({i for i in range(n) if bp[i] >= b})   # g on [lo, b): forced = bp >= b
        if val <= b:
            return min(max(lo, val), ub)
        lo = b
    return ub


def lower_bound(inst: Instance, ub: float | None = None) -> tuple[float, str]:
    """(best cheap bound, which one). With ``ub`` (a known schedule's makespan) also the
    forced-mode energy bound."""
    cands = [(critical_path(inst), "critical_path"), (energy(inst, "tc"), "energy_tc"),
             (energy(inst, "vc"), "energy_vc"), (windowed_energy(inst, "tc"), "window_tc"),
             (windowed_energy(inst, "vc"), "window_vc")]
    if ub is not None:
        cands.append((forced_energy(inst, ub), "forced_energy"))
    return max(cands)
