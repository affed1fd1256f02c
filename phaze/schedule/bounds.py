"""Cheap, proven lower bounds on the makespan (microseconds to compute).

* critical path — the longest path with every op at its fastest mode;
* energy per core type c — intra-op ops run alone on the chip and single-core ops of type c
  share n_c cores, so T >= sum over ops using c of min(L_all, L_1 / n_c) (the ILP carries the
  mode-dependent version of the same cut);
* forced-mode energy — ops whose single-core latency cannot fit below a makespan T must run
  intra-op (alone) in any schedule shorter than T; the fixed point of that energy is a bound;
* windowed energy — the same on every window [head threshold, T - tail threshold];
* heads/tails — earliest start and minimum remaining time per op, used for variable bounds and
  per-pair big-M in the ILP;
* antichain width — single-core ops that overlap in time are pairwise incomparable, so at most
  min(n_c, width of the type-c ops) of them run at once: the energy divides by that, not n_c;
* energy heads/tails — an op starts no earlier than the energy of its ancestors (they all run
  before it), nor than r_j + q_j + energy(ops between j and it) for every ancestor j; tails alike.
  They replace the critical-path heads/tails in the window and forced-mode bounds;
* op exclusion — op i either runs on one core (nothing comparable overlaps it: r_i + L1_i + d_i)
  or intra-op, alone (L_all_i + the energy of every other op); the smaller of the two bounds T;
* path flow (``pathflow.py``) — intra-op time plus single-core time, the latter at least a
  convex combination of chains' single-core latencies and the energies, modes forced below T.
"""

from __future__ import annotations

from phaze.schedule.budget import NO_DEADLINE, Deadline, OutOfTime
from phaze.schedule.instance import Instance
from phaze.schedule.pathflow import path_flow_bound


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


def comparability_matching(
    inst: Instance, members: list[int], deadline: Deadline = NO_DEADLINE
) -> list[int]:
    """A maximum matching of the comparability relation among ``members`` (augmenting paths;
    n <= ~100): ``match[v] = u`` (positions in ``members``) when v follows u, ancestor before
    descendant, in one chain of a least chain cover (Dilworth); -1 where v starts a chain."""
    pos = {m: k for k, m in enumerate(members)}
    adj = [[pos[j] for j in members if (inst.descendants[i] >> j) & 1] for i in members]
    match = [-1] * len(members)

    def augment(u: int, seen: set[int]) -> bool:
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                if match[v] < 0 or augment(match[v], seen):
                    match[v] = u
                    return True
        return False

    for u in range(len(members)):
        deadline.check()
        augment(u, set())
    return match


def antichain_width(inst: Instance, members: list[int], deadline: Deadline = NO_DEADLINE) -> int:
    """Largest set of pairwise incomparable ops among ``members`` (Dilworth: |members| minus a
    maximum matching of the comparability relation)."""
    match = comparability_matching(inst, members, deadline)
    return len(members) - sum(1 for u in match if u >= 0)


def core_limits(inst: Instance, deadline: Deadline = NO_DEADLINE) -> dict[str, int]:
    """Most single-core ops of each type that can ever run at once: min(n_c, antichain width of
    the ops holding a type-c core; zero-length ops hold none)."""
    out = {}
    for c in ("tc", "vc"):
        mem = [i for i in range(inst.n) if inst.uses(i, c) and inst.l1[i] > 0]
        out[c] = (
            max(1, min(inst.n_cores(c), antichain_width(inst, mem, deadline)))
            if mem
            else inst.n_cores(c)
        )
    return out


def _weights(inst: Instance, k: dict[str, int]) -> dict[str, list[float]]:
    """Least time per op that a set's execution must cover, per core type: min(L_all, L_1 / k_c)
    for ops holding a type-c core, else 0 (they may run beside type-c work)."""
    return {
        c: [min(inst.la[i], inst.l1[i] / k[c]) if inst.uses(i, c) else 0.0 for i in range(inst.n)]
        for c in ("tc", "vc")
    }


def _bits(m: int):
    while m:
        b = m & -m
        yield b.bit_length() - 1
        m ^= b


def _energy_heads(inst: Instance, before, after, order, w, deadline=NO_DEADLINE) -> list[float]:
    """Lower bounds on each op's start (or, mirrored, on the time after its end): ``before`` /
    ``after`` are ancestor / descendant bitsets (swapped for tails)."""

    def e(m: int) -> float:
        return max(sum(w[c][j] for j in _bits(m)) for c in w) if m else 0.0

    r = [0.0] * inst.n
    for i in order:
        deadline.check()
        v = e(before[i])  # every ancestor runs before i starts
        for j in _bits(before[i]):  # j, then the ops between j and i, then i
            v = max(v, r[j] + inst.q[j] + e(after[j] & before[i]))
        r[i] = v
    return r


def energy_heads_tails(
    inst: Instance, k: dict[str, int] | None = None, deadline: Deadline = NO_DEADLINE
) -> tuple[list[float], list[float]]:
    """(r, d): r_i <= start of op i and d_i <= makespan - end of op i in every schedule; at least
    the critical-path heads/tails."""
    w = _weights(inst, k or core_limits(inst))
    r = _energy_heads(inst, inst.ancestors, inst.descendants, range(inst.n), w, deadline)
    d = _energy_heads(inst, inst.descendants, inst.ancestors, reversed(range(inst.n)), w, deadline)
    return r, d


def exclusion_bound(inst: Instance, r=None, d=None, k=None) -> float:
    """max over ops i of min(single-core bound, intra-op bound): on one core nothing comparable
    overlaps i (r_i + L1_i + d_i); intra-op nothing at all overlaps it (L_all_i + energy of the
    rest, and r_i + L_all_i + d_i)."""
    k = k or core_limits(inst)
    if r is None or d is None:
        r, d = energy_heads_tails(inst, k)
    w = _weights(inst, k)
    total = {c: sum(w[c]) for c in w}
    best = 0.0
    for i in range(inst.n):
        single = r[i] + inst.l1[i] + d[i]
        if inst.la[i] < inst.l1[i]:
            intra = max(r[i] + inst.la[i] + d[i], inst.la[i] + max(total[c] - w[c][i] for c in w))
            single = min(single, intra)
        best = max(best, single)
    return best


def energy(inst: Instance, kind: str, k: dict[str, int] | None = None) -> float:
    n = (k or core_limits(inst))[kind]
    return sum(min(inst.la[i], inst.l1[i] / n) for i in range(inst.n) if inst.uses(i, kind))


def windowed_energy(
    inst: Instance, kind: str, r=None, d=None, k=None, deadline: Deadline = NO_DEADLINE
) -> float:
    """Energy bound on time windows: the ops that cannot start before h and cannot end later than
    tau before the end must fit between, so T >= h + sum of their min core-time / n_c + tau, for
    every pair of thresholds (h, tau) taken from the ops' heads and tails. Catches the backward
    pass's weight-gradient leaves, which all come late."""
    n_c = (k or core_limits(inst))[kind]
    hd, tl = (r, d) if r is not None else (heads(inst), tails(inst))
    mem = [i for i in range(inst.n) if inst.uses(i, kind)]
    w = {i: min(inst.la[i], inst.l1[i] / n_c) for i in mem}
    best = 0.0
    for h in sorted({hd[i] for i in mem}):
        deadline.check()
        sub = [i for i in mem if hd[i] >= h]
        for tau in sorted({tl[i] for i in sub}):
            best = max(best, h + sum(w[i] for i in sub if tl[i] >= tau) + tau)
    return best


def forced_intra(inst: Instance, t: float) -> list[int]:
    """Ops that cannot run on one core in any schedule shorter than ``t``: head + L_1 + tail > t
    (and intra-op is faster). In every schedule of makespan < t they are intra-op, alone."""
    hd, tl = heads(inst), tails(inst)
    return [
        i
        for i in range(inst.n)
        if inst.la[i] < inst.l1[i] and hd[i] + inst.l1[i] + tl[i] > t * (1 + 1e-12)
    ]


def forced_energy(inst: Instance, ub: float, r=None, d=None, k=None) -> float:
    """The energy bound once modes are forced: g(T) = sum of L_all over ops forced at T (they
    take the whole chip) + the energy of the other ops of type c. g does not increase with T and
    the optimum satisfies OPT >= g(OPT), so min{T : T >= g(T)} is a lower bound (capped at the
    known upper bound ``ub``). Large when single-core latencies are long (many cores).
    ``r``, ``d`` (start / end-to-finish bounds) default to the critical-path heads and tails,
    ``k`` (concurrent single-core limits) to the core counts."""
    hd, tl = (r, d) if r is not None else (heads(inst), tails(inst))
    k = k or {"tc": inst.n_tc, "vc": inst.n_vc}
    n = inst.n
    bp = [hd[i] + inst.l1[i] + tl[i] if inst.la[i] < inst.l1[i] else 0.0 for i in range(n)]

    def g(forced: set[int]) -> float:
        base = sum(inst.la[i] for i in forced)
        out = base
        for c in ("tc", "vc"):
            n_c = k[c]
            out = max(
                out,
                base
                + sum(
                    min(inst.la[i], inst.l1[i] / n_c)
                    for i in range(n)
                    if i not in forced and inst.uses(i, c)
                ),
            )
        return out

    lo = 0.0
    for b in sorted({v for v in bp if 0.0 < v < ub} | {ub}):
        val = g({i for i in range(n) if bp[i] >= b})  # g on [lo, b): forced = bp >= b
        if val <= b:
            return min(max(lo, val), ub)
        lo = b
    return ub


def lower_bound(
    inst: Instance, ub: float | None = None, deadline: Deadline = NO_DEADLINE
) -> tuple[float, str]:
    """(best cheap bound, which one). With ``ub`` (a known schedule's makespan) also the
    forced-mode energy bound. If ``deadline`` passes, the best of the bounds finished so far
    (critical path and plain energy always are: they are linear)."""
    plain = {"tc": inst.n_tc, "vc": inst.n_vc}
    cands = [
        (critical_path(inst), "critical_path"),
        (energy(inst, "tc", plain), "energy_tc"),
        (energy(inst, "vc", plain), "energy_vc"),
    ]
    try:
        k = core_limits(inst, deadline)
        cands += [(energy(inst, "tc", k), "energy_tc"), (energy(inst, "vc", k), "energy_vc")]
        r, d = energy_heads_tails(inst, k, deadline)
        cands += [
            (exclusion_bound(inst, r, d, k), "exclusion"),
            (windowed_energy(inst, "tc", r, d, k, deadline), "window_tc"),
            (windowed_energy(inst, "vc", r, d, k, deadline), "window_vc"),
        ]
        if ub is not None:
            cands.append((forced_energy(inst, ub, r, d, k), "forced_energy"))
        deadline.check()
        cands.append((path_flow_bound(inst, ub, r, d, k, deadline=deadline), "path_flow"))
    except OutOfTime:
        pass
    return max(cands)
