"""Destructive lower bound by energetic reasoning on time windows: a trial makespan T the
propagation proves infeasible bounds the optimum from below; bisection finds the largest such T.

For a trial T every op i gets a window [est_i, lft_i] from its energy head and tail
(``bounds.energy_heads_tails``: valid in every schedule), lft_i = T - tail_i. A *chip resource*
of capacity 1 weighs a single-core op by alpha [uses a tensor core] / k_tc + (1 - alpha)
[uses a vector core] / k_vc (k_c = ``bounds.core_limits``: at most k_c single-core type-c ops
run at once) and an intra-op op by 1 (it runs alone): at every instant the running ops weigh at
most 1, for every alpha in [0, 1]. So over any interval [t1, t2] the ops' *mandatory* weighted
time in it — each op at its cheapest allowed mode, placed as far out of the interval as its
window lets it (left- or right-shifted, whichever leaves less inside) — is at most t2 - t1.
Propagated to a fixed point (bounded by counts):

* a mode is dropped when the op's window cannot hold it, or when the op in that mode, with every
  other op at its mandatory minimum, overloads some interval;
* an op with no mode left, or an overloaded interval, proves T infeasible;
* precedence: est_j >= est_i + (shortest allowed duration of i) for each edge, lft mirrored;
* energetic adjustment: if op i started at est_i in mode m would put more into [t1, t2] than
  the others leave free (a = (t2 - t1 - W_others) / weight), it starts no earlier than t2 - a
  in that mode (its share of the interval, min(that at est_i, t2 - s), only falls below a once
  s >= t2 - a); the new est is the least over its allowed modes. lft mirrored.

Every step only removes (start time, mode) choices that no schedule of makespan <= T has, so
"infeasible" is a proof that OPT > T (docs/schedule.md, "Energetic bound").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from phaze.schedule.bounds import comparability_matching, core_limits, energy_heads_tails
from phaze.schedule.budget import NO_DEADLINE, Deadline, OutOfTime
from phaze.schedule.instance import Instance

# Weights of the chip resource: tensor cores only, an even mix, vector cores only. Each alpha is
# a valid capacity-1 resource; the three cover the three kinds of block (tensor-bound,
# vector-bound, balanced).
ALPHAS = (1.0, 0.5, 0.0)
# Work allowances (counts, not clocks, so a bound is the same on every machine): trials (the gap
# target, then bisection over [lower bound, upper bound]), propagation passes per trial.
BISECTION_STEPS = 10
PASSES = 6
# Interval ends per pass: at most this many distinct starts and ends (so at most POINTS**2
# intervals), evenly spread over the sorted heads and deadlines.
POINTS = 64


@dataclass
class EnergeticBound:
    bound_s: float  # a proven lower bound on the optimum (>= the ``lb`` it was given)
    complete: bool  # False: the deadline cut the bisection short (the bound is what it had)
    trials: int  # trial makespans tested
    passes: int  # propagation passes over all trials (the work)


def chain_cover(inst: Instance, members: list[int]) -> dict[int, int]:
    """A least partition of ``members`` into chains (totally ordered by precedence): chain id per
    member, from a maximum matching of the comparability relation (Dilworth, as
    ``bounds.antichain_width``). Any subset of members meets at most as many chains as it has
    pairwise incomparable ops at once: one per chain."""
    match = comparability_matching(inst, members)  # match[v] = u: v follows u in its chain
    nxt = {u: v for v, u in enumerate(match) if u >= 0}
    chain = {}
    for v in range(len(members)):
        if match[v] < 0:  # a chain's first op
            c, w = len(set(chain.values())), v
            while True:
                chain[members[w]] = c
                if w not in nxt:
                    break
                w = nxt[w]
    return chain


def _thin(points: np.ndarray) -> np.ndarray:
    """At most ``POINTS`` of the sorted ``points``, evenly spread (first and last kept): every
    interval checked is valid, fewer only check less."""
    if len(points) <= POINTS:
        return points
    return points[np.unique(np.linspace(0, len(points) - 1, POINTS).round().astype(int))]


def _min_overlap(est, lft, p, t1, t2):
    """Least time an op of duration ``p`` in window [est, lft] spends inside [t1, t2] (arrays:
    ops along the last axis, intervals along the first)."""
    d = t2 - t1
    return np.maximum(0.0, np.minimum(np.minimum(d, p), np.minimum(est + p - t1, t2 - lft + p)))


def infeasible(
    inst: Instance,
    t: float,
    r: np.ndarray,
    d: np.ndarray,
    k: dict[str, int],
    passes: int = PASSES,
    deadline: Deadline = NO_DEADLINE,
) -> tuple[bool, int]:
    """(proof that no schedule of makespan <= ``t`` exists, passes spent). ``r``, ``d``: valid
    heads and tails (start and time-after-end lower bounds in every schedule)."""
    n = inst.n
    eps = 1e-9 * t * (n + 1)
    l1 = np.asarray(inst.l1, dtype=float)
    la = np.asarray(inst.la, dtype=float)
    u_tc = np.array([inst.uses(i, "tc") for i in range(n)], dtype=float)
    u_vc = np.array([inst.uses(i, "vc") for i in range(n)], dtype=float)
    est = np.array(r, dtype=float)
    lft = t - np.array(d, dtype=float)
    # chains of each type's single-core ops: an interval's concurrency limit is the number of
    # chains that meet the ops that can run single-core in it
    onehot = {}
    for c, u in (("tc", u_tc), ("vc", u_vc)):
        mem = [i for i in range(n) if u[i] and inst.l1[i] > 0]
        cov = chain_cover(inst, mem) if mem else {}
        h = np.zeros((n, max(cov.values(), default=0) + 1))
        for i, ch in cov.items():
            h[i, ch] = 1.0
        onehot[c] = h
    ok1 = np.ones(n, dtype=bool)
    oka = np.ones(n, dtype=bool)
    preds, succs = inst.preds, inst.succs
    spent = 0
    for _ in range(passes):
        deadline.check()
        spent += 1
        # windows and precedence
        ok1 &= est + l1 <= lft + eps
        oka &= est + la <= lft + eps
        if not (ok1 | oka).all():
            return True, spent
        pmin = np.where(ok1, np.where(oka, np.minimum(l1, la), l1), la)
        e, f, q = est.tolist(), lft.tolist(), pmin.tolist()
        for j in range(n):
            e[j] = max([e[j]] + [e[i] + q[i] for i in preds[j]])
        for i in reversed(range(n)):
            f[i] = min([f[i]] + [f[j] - q[j] for j in succs[i]])
        est, lft = np.array(e), np.array(f)
        ok1 &= est + l1 <= lft + eps
        oka &= est + la <= lft + eps
        if not (ok1 | oka).all():
            return True, spent
        # intervals: every (est, lft) pair with t1 < t2
        t1s = _thin(np.unique(est))
        t2s = _thin(np.unique(lft))
        t1g, t2g = np.meshgrid(t1s, t2s, indexing="ij")
        keep = t2g > t1g
        t1v = t1g[keep][:, None]
        t2v = t2g[keep][:, None]
        dv = (t2v - t1v)[:, 0]
        o1 = _min_overlap(est, lft, l1, t1v, t2v)
        oa = _min_overlap(est, lft, la, t1v, t2v)
        # the share of each op when at its earliest / latest (for the adjustments)
        s1_left = np.maximum(0.0, np.minimum(est + l1, t2v) - np.maximum(est, t1v))
        sa_left = np.maximum(0.0, np.minimum(est + la, t2v) - np.maximum(est, t1v))
        s1_right = np.maximum(0.0, np.minimum(lft, t2v) - np.maximum(lft - l1, t1v))
        sa_right = np.maximum(0.0, np.minimum(lft, t2v) - np.maximum(lft - la, t1v))
        inf = np.inf
        # per interval and type: at most that many single-core ops at once
        can = (ok1 & (l1 > 0) & (est < t2v + eps) & (lft > t1v - eps)).astype(float)
        kk = {
            c: np.maximum(1.0, np.minimum(k[c], ((can @ onehot[c]) > 0).sum(axis=1)))[:, None]
            for c in ("tc", "vc")
        }
        # per alpha, the single-core weight of each op in each interval (intra-op weighs 1)
        ws = [a * u_tc / kk["tc"] + (1 - a) * u_vc / kk["vc"] for a in ALPHAS]
        new_est = est.copy()
        new_lft = lft.copy()
        changed = False
        for w in ws:
            e1 = np.where(ok1, w * o1, inf)
            ea = np.where(oka, oa, inf)
            emin = np.minimum(e1, ea)
            tot = emin.sum(axis=1)
            if (tot > dv + eps).any():
                return True, spent
            free = (dv - tot)[:, None] + emin  # what the others leave free, per interval and op
            # mode elimination
            bad1 = ok1 & ((w * o1 > free + eps).any(axis=0))
            bada = oka & ((oa > free + eps).any(axis=0))
            if bad1.any() or bada.any():
                ok1 &= ~bad1
                oka &= ~bada
                changed = True
                if not (ok1 | oka).all():
                    return True, spent
            # energetic adjustments per mode (weight 0: never constrained)
            pos = w > 0
            a1 = np.where(pos, free / np.where(pos, w, 1.0), inf)
            lo1 = np.where(w * s1_left > free + eps, t2v - a1, -inf).max(axis=0)
            loa = np.where(sa_left > free + eps, t2v - free, -inf).max(axis=0)
            hi1 = np.where(w * s1_right > free + eps, t1v + a1, inf).min(axis=0)
            hia = np.where(sa_right > free + eps, t1v + free, inf).min(axis=0)
            lo = np.minimum(
                np.where(ok1, np.maximum(est, lo1), inf), np.where(oka, np.maximum(est, loa), inf)
            )
            hi = np.maximum(
                np.where(ok1, np.minimum(lft, hi1), -inf), np.where(oka, np.minimum(lft, hia), -inf)
            )
            new_est = np.maximum(new_est, lo - eps)
            new_lft = np.minimum(new_lft, hi + eps)
        if (new_est > est + eps).any() or (new_lft < lft - eps).any():
            changed = True
        est = np.maximum(est, new_est)
        lft = np.minimum(lft, new_lft)
        if not changed:
            return False, spent
    return False, spent


def energetic_bound(
    inst: Instance,
    lb: float,
    ub: float,
    gap: float = 0.0,
    steps: int = BISECTION_STEPS,
    passes: int = PASSES,
    deadline: Deadline = NO_DEADLINE,
) -> EnergeticBound:
    """A proven lower bound in [lb, ub]: ``lb`` (a bound the caller proved), ``ub`` a schedule's
    makespan. With ``gap`` > 0 the first trial is ub (1 - gap), which if infeasible proves the
    gap at once; then bisection over [lb, that trial] (``steps`` trials in all, each at most
    ``passes`` propagation passes). Every value returned is ``lb`` or a trial makespan no schedule
    reaches, so it is a lower bound whatever the test's monotonicity. If ``deadline`` passes, the
    best bound proven so far (``complete`` False)."""
    lo, hi = lb, ub
    trials = spent = 0
    try:
        k = core_limits(inst, deadline)
        r, d = energy_heads_tails(inst, k, deadline)
        r, d = np.asarray(r), np.asarray(d)
        for step in range(steps):
            if hi - lo <= 1e-6 * ub:
                break
            # (the first trial just inside the gap target, so that a proof meets it exactly)
            mid = ub - gap * ub * (1 - 1e-9) if step == 0 and gap > 0 else 0.5 * (lo + hi)
            if not lo < mid < hi:
                mid = 0.5 * (lo + hi)
            bad, p = infeasible(inst, mid, r, d, k, passes, deadline)
            trials += 1
            spent += p
            if bad:
                lo = mid
                if step == 0 and gap > 0:
                    break
            else:
                hi = mid
    except OutOfTime:
        return EnergeticBound(min(lo, ub), False, trials, spent)
    return EnergeticBound(min(lo, ub), True, trials, spent)
