"""Path-flow bound: a schedule's makespan is its intra-op time plus its single-core time, and the
single-core time is at least every chain's single-core latency and every core type's energy.

In any schedule with single-core set S, intra-op ops run alone, so T >= sum over i not in S of
L_all_i + R, R = the time some single-core op runs. R >= sum over i in S on a path P of L1_i (ops
of a path are comparable: they never overlap), and R >= sum over i in S of L1_i u_ic / k_c (at
most k_c single-core ops hold a type-c core at once). For any convex combination — weights mu_P
on paths (a node flow x of value F through the DAG, x_i = sum of mu_P over paths through i) and
beta, gamma on the two energies, F + beta + gamma = 1 —

    T >= sum_i min(L_all_i, L1_i x_i + beta a_i + gamma b_i),   a_i = L1_i u_i,tc / k_tc,
                                                                  b_i = L1_i u_i,vc / k_vc,

the minimum taken op by op (whichever side of S it is on). Every such (x, beta, gamma) gives a
valid bound; the flow is built greedily (``INCREMENTS`` longest paths by marginal gain) for each
(beta, gamma) on a grid. Ops that cannot run on one core below a makespan T (head + L1 + tail >
T) are intra-op in every schedule shorter than T: with them fixed the value g(T) does not grow
with T, and g(T) > T proves OPT > T (else OPT <= T and g(OPT) >= g(T) > T >= OPT, yet OPT >=
g(OPT)); bisection finds the largest such T.
"""

from __future__ import annotations

from phaze.schedule.budget import NO_DEADLINE, Deadline
from phaze.schedule.instance import Instance

# Grid of the energy weights (beta, gamma) in steps of 1/GRID over the simplex, and the flow's
# increments per grid point: counts, so the bound is the same on every machine.
GRID = 5
INCREMENTS = 8
BISECTION_STEPS = 12


def path_flow_value(inst: Instance, k: dict[str, int], forced: list[bool]) -> float:
    """max over the grid of sum_i min(L_all_i, L1_i x_i + beta a_i + gamma b_i) with a greedy
    flow x (ops in ``forced`` count L_all whatever their flow): a lower bound on every schedule
    in which the ``forced`` ops run intra-op."""
    n = inst.n
    la, l1, preds = inst.la, inst.l1, inst.preds
    a = [l1[i] / k["tc"] if inst.uses(i, "tc") else 0.0 for i in range(n)]
    b = [l1[i] / k["vc"] if inst.uses(i, "vc") else 0.0 for i in range(n)]
    best = 0.0
    for bi in range(GRID + 1):
        for gi in range(GRID + 1 - bi):
            beta, gamma = bi / GRID, gi / GRID
            flow = 1.0 - beta - gamma
            c = [beta * a[i] + gamma * b[i] for i in range(n)]

            def val(i: int, xi: float) -> float:
                return la[i] if forced[i] else min(la[i], l1[i] * xi + c[i])  # noqa: B023

            x = [0.0] * n
            if flow > 1e-12:
                step = flow / INCREMENTS
                for _ in range(INCREMENTS):
                    # the longest path by the marginal gain of ``step`` more flow through it
                    length = [0.0] * n
                    back = [-1] * n
                    for j in range(n):
                        bp, bv = -1, 0.0
                        for p in preds[j]:
                            if length[p] > bv:
                                bp, bv = p, length[p]
                        length[j] = val(j, x[j] + step) - val(j, x[j]) + bv
                        back[j] = bp
                    j = max(range(n), key=length.__getitem__)
                    if length[j] <= 0.0:
                        break
                    while j >= 0:
                        x[j] += step
                        j = back[j]
            best = max(best, sum(val(i, x[i]) for i in range(n)))
    return best


def path_flow_bound(
    inst: Instance,
    ub: float | None,
    r,
    d,
    k: dict[str, int],
    steps: int = BISECTION_STEPS,
    deadline: Deadline = NO_DEADLINE,
) -> float:
    """The path-flow bound with modes forced below a trial makespan (``r``, ``d``: valid heads
    and tails), by bisection over [no modes forced, ``ub``]; without ``ub`` the bound with no
    modes forced. Never above ``ub``. Raises ``OutOfTime`` between evaluations once
    ``deadline`` has passed."""
    deadline.check()
    free = path_flow_value(inst, k, [False] * inst.n)
    if ub is None:
        return free
    bp = [r[i] + inst.l1[i] + d[i] if inst.la[i] < inst.l1[i] else 0.0 for i in range(inst.n)]
    lo, hi = min(free, ub), ub
    for _ in range(steps):
        if hi - lo <= 1e-6 * ub:
            break
        deadline.check()
        mid = 0.5 * (lo + hi)
        if path_flow_value(inst, k, [v > mid * (1 + 1e-12) for v in bp]) > mid:
            lo = mid
        else:
            hi = mid
    return lo
