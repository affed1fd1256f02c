"""Large-neighbourhood search: shorten a schedule by re-solving windows of it exactly.

The list scheduler and the mode kicks place ops by priority rules; on the 69-71-op backward
blocks they leave 0.5-7 % on the table (a long weight-gradient leaf run on one core beside the
right stretch of the dgrad chain, a few small vector ops side by side). This search keeps the
best schedule and repeatedly frees a *window* of it — ``w`` ops consecutive in start order —
while every other op keeps its mode and its order relative to the other fixed ops (an op that
ends before another starts stays before it). The branch and bound (``bnb.py``, gap 0) then
searches that restricted instance for a strictly shorter schedule within a node allowance; one
found is valid for the real instance (the restriction only adds precedence and removes modes)
and replaces the best. Windows slide by ``w / 2``; a pass that improves nothing moves to the
next, larger window size (variable neighbourhood), and the search stops after the largest size
fails, at its deadline or when its node allowance is spent.
"""

from __future__ import annotations

from phaze.schedule.bnb import branch_and_bound
from phaze.schedule.budget import NO_DEADLINE, Deadline
from phaze.schedule.instance import Instance, make_instance
from phaze.schedule.listsched import Schedule, verify

# (ops per window, branch-and-bound nodes per window), tried in this order. Measured on the
# schedule benchmark's llama2-7b backward blocks (69-71 ops): windows of 8 ops and 2,000 nodes
# take 1.5-5 s a pass sequence and find most of the gain; 12 and 16 ops find the rest (the
# (4,4) blocks gain another 5 % there) at 2-3x the time.
SIZES = ((8, 2_000), (12, 3_000), (16, 5_000))


def restrict(inst: Instance, sched: Schedule, window: set[int]) -> Instance:
    """The instance in which the ops outside ``window`` keep ``sched``'s mode (an intra-op op's
    single-core latency made prohibitive, a single-core op's intra-op latency made equal) and
    their order among themselves (an edge a -> b wherever a ends before b starts). Op ids are
    ``inst``'s indices."""
    n = inst.n
    big = 10.0 * sched.makespan(inst) + 1.0
    l1, la = list(inst.l1), list(inst.la)
    fixed = [i for i in range(n) if i not in window]
    for i in fixed:
        if sched.y[i]:
            l1[i] = big + la[i]
        else:
            la[i] = l1[i]
    edges = {(a, b) for a, b in inst.edges}
    by_end = sorted(fixed, key=lambda i: sched.end(inst, i))
    by_start = sorted(fixed, key=lambda i: sched.start[i])
    k = 0
    before: list[int] = []  # fixed ops (with time) ended by the current start
    for b in by_start:
        while k < len(by_end) and sched.end(inst, by_end[k]) <= sched.start[b]:
            a = by_end[k]
            if sched.duration(inst, a) > 0:
                before.append(a)
            k += 1
        for a in before:
            if a != b:
                edges.add((a, b))
    ops = [
        {"id": i, "core": inst.core[i], "latency_1core_s": l1[i], "latency_allcores_s": la[i]}
        for i in range(n)
    ]
    return make_instance(inst.n_tc, inst.n_vc, ops, [list(e) for e in edges])


def large_neighbourhood_search(
    inst: Instance,
    sched: Schedule,
    deadline: Deadline = NO_DEADLINE,
    work: int = 1 << 62,
) -> tuple[Schedule, int]:
    """(best schedule, branch-and-bound nodes spent): never longer than ``sched``; stops at
    ``deadline``, after ``work`` nodes, or when the largest window size improves nothing."""
    best = sched
    spent = 0
    for size, nodes in SIZES:
        size = min(inst.n, size)
        improved = True
        while improved:
            improved = False
            order = sorted(range(inst.n), key=lambda i: (best.start[i], i))
            for k in range(0, max(1, inst.n - size // 2), max(1, size // 2)):
                allowance = min(nodes, work - spent)
                if allowance <= 0 or deadline.expired():
                    return best, spent
                found = _repair(inst, best, set(order[k : k + size]), deadline, allowance)
                spent += found[1]
                if found[0] is not None:
                    best, improved = found[0], True
        if size == inst.n:
            break
    return best, spent


def into_restriction(r: Instance, sched: Schedule) -> Schedule:
    """``sched`` (indexed as the original instance) indexed as its restriction ``r``, whose op
    ids are the original indices."""
    return Schedule([sched.start[i] for i in r.ids], [sched.y[i] for i in r.ids])


def out_of_restriction(r: Instance, sched: Schedule) -> Schedule:
    """A schedule of the restriction ``r`` indexed as the original instance."""
    pos = {i: j for j, i in enumerate(r.ids)}
    return Schedule(
        [sched.start[pos[i]] for i in range(r.n)], [sched.y[pos[i]] for i in range(r.n)]
    )


def _repair(inst, best, window, deadline, nodes) -> tuple[Schedule | None, int]:
    """A schedule strictly shorter than ``best`` that moves only ``window``, or None."""
    r = restrict(inst, best, window)
    out = branch_and_bound(r, into_restriction(r, best), 0.0, deadline, nodes)
    if out.schedule is None:
        return None, out.nodes
    s = out_of_restriction(r, out.schedule)
    ms = best.makespan(inst)
    if verify(inst, s, 1e-9 * ms) or s.makespan(inst) >= ms:
        return None, out.nodes
    return s, out.nodes
