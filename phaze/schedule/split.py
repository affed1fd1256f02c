"""The split at an op that runs alone: a lower bound (and schedules) from the two sides of it.

An op ``j`` that no schedule shorter than ``ub`` can run on one core (``bounds.forced_intra``)
runs intra-op in every such schedule, and then nothing overlaps it: every other op lies wholly
before it (its ancestors, and some of the ops incomparable to it) or wholly after it (its
descendants and the rest). So a schedule of makespan ``T < ub`` with *pre* set ``P`` and *post*
set ``Q`` holds a schedule of each side, and

    T >= OPT(P) + L_all(j) + OPT(Q).

A pre set is closed under ancestors, a post set under descendants. The search below branches on
the side of each incomparable op (an op put before ``j`` takes its incomparable ancestors with
it; put after, its incomparable descendants) and bounds a node by the sides it has fixed alone —
OPT of a subset of ops is at most OPT of the whole set (drop ops from a schedule: precedence
through them is only relaxed by ``Instance.subinstance``), so the bound of a node holds for every
assignment below it, and a child's bound is kept at least its parent's. Every assignment
consistent with the precedence lies below one of a node's children, hence the smallest bound
over the nodes where the search ends (a leaf, a node whose bound reaches the target, or a node
left when the node allowance runs out) bounds every schedule shorter than ``ub``: the makespan
is at least ``min(ub, that)``. Each side's bound comes from the
full solver on that side (``solve_side``), which on a few dozen ops often proves what it cannot
prove on the whole layer (docs/schedule.md, "Split at an op that runs alone").

A leaf (every op placed) also gives a schedule: the pre side's, then ``j`` on all its cores, then
the post side's.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from phaze.schedule.bounds import _bits, forced_intra
from phaze.schedule.instance import Instance


@dataclass
class Side:
    """One side's solve: a lower bound on its optimum, and a schedule of it (start times and
    modes, in the order of the side's members) with its makespan."""

    lower_bound_s: float
    makespan_s: float
    start: list[float]
    y: list[int]

    @classmethod
    def of(cls, result) -> Side:
        """From a solve's result (``solve.Result``: bounds and its schedule)."""
        return cls(
            result.lower_bound_s,
            result.makespan_s,
            list(result.schedule.start),
            list(result.schedule.y),
        )


@dataclass
class SplitOutcome:
    op: int  # the op split at
    lower_bound_s: float  # valid for every schedule shorter than the ub the op was forced at
    nodes: int
    complete: bool  # the search ended by bounds, not by its node allowance
    start: list[float] | None = None  # the best leaf's schedule (start times, modes), if any
    y: list[int] | None = None
    makespan_s: float | None = None


def split_op(inst: Instance, ub: float) -> int | None:
    """The op to split at: one forced intra-op below ``ub`` with ops before or after it and the
    fewest ops incomparable to it (the fewest to branch on); ties: the longest intra-op latency,
    then the lowest index. None if no op is forced."""
    best, key = None, None
    for j in forced_intra(inst, ub):
        before, after = inst.ancestors[j], inst.descendants[j]
        if not before and not after:
            continue
        free = inst.n - 1 - before.bit_count() - after.bit_count()
        k = (free, -inst.la[j], j)
        if key is None or k < key:
            best, key = j, k
    return best


def split_search(
    inst: Instance,
    j: int,
    solve_side: Callable[[list[int]], Side],
    target: float,
    max_nodes: int,
) -> SplitOutcome:
    """Branch on the side of each op incomparable to ``j`` (largest single-core latency first).
    ``solve_side(members)`` returns a valid lower bound (and a schedule) of the sub-instance on
    ``members`` (``Instance.subinstance``). Best first: the node of the smallest bound is
    branched until that bound reaches ``target``, is a leaf's, or ``max_nodes`` nodes have
    been evaluated; the outcome's bound is then that smallest bound. The caller must know ``j``
    runs intra-op in every schedule it bounds (forced below its ``ub``); the outcome's bound
    holds for those schedules only."""
    A, D = frozenset(_bits(inst.ancestors[j])), frozenset(_bits(inst.descendants[j]))
    free = [i for i in range(inst.n) if i != j and i not in A and i not in D]
    free.sort(key=lambda i: (-inst.l1[i], i))
    fset = frozenset(free)
    up = {i: frozenset(_bits(inst.ancestors[i])) & fset for i in free}
    down = {i: frozenset(_bits(inst.descendants[i])) & fset for i in free}
    sides: dict[frozenset, Side] = {}

    def side(members: frozenset) -> Side:
        if not members:
            return Side(0.0, 0.0, [], [])
        if members not in sides:
            sides[members] = solve_side(sorted(members))
        return sides[members]

    out = SplitOutcome(j, float("inf"), 0, True)
    tie = itertools.count()

    def node(P: frozenset, Q: frozenset, floor: float = 0.0):
        pre, post = side(A | P), side(D | Q)
        out.nodes += 1
        rest = [i for i in free if i not in P and i not in Q]
        if not rest:  # a leaf: a whole schedule
            ms = pre.makespan_s + inst.la[j] + post.makespan_s
            if out.makespan_s is None or ms < out.makespan_s:
                out.start, out.y, out.makespan_s = _compose(inst, j, A | P, pre, D | Q, post)
        # a parent's bound holds for its whole subtree: a side's solver may prove less on
        # more ops (a search that completes on a part need not on the whole)
        bound = max(floor, pre.lower_bound_s + inst.la[j] + post.lower_bound_s)
        return (bound, next(tie), P, Q, rest)

    # best first: the smallest bound of the nodes left is the search's bound at every moment
    heap = [node(frozenset(), frozenset())]
    while heap:
        bound, _, P, Q, rest = heap[0]
        if bound >= target or not rest or out.nodes + 2 > max_nodes:
            out.complete = bound >= target or not rest
            break
        heapq.heappop(heap)
        i = rest[0]
        if not (up[i] & Q):  # i before j, with its incomparable ancestors
            heapq.heappush(heap, node(P | {i} | up[i], Q, bound))
        if not (down[i] & P):  # i after j, with its incomparable descendants
            heapq.heappush(heap, node(P, Q | {i} | down[i], bound))
    out.lower_bound_s = heap[0][0] if heap else float("inf")
    return out


def _compose(inst: Instance, j: int, pre_ops, pre: Side, post_ops, post: Side):
    """The whole schedule of a leaf: the pre side from 0, ``j`` intra-op at the pre side's
    makespan, the post side after it. Returns (start, y, makespan)."""
    start = [0.0] * inst.n
    y = [0] * inst.n
    for k, i in enumerate(sorted(pre_ops)):
        start[i], y[i] = pre.start[k], pre.y[k]
    t = pre.makespan_s
    start[j], y[j] = t, 1
    t += inst.la[j]
    for k, i in enumerate(sorted(post_ops)):
        start[i], y[i] = t + post.start[k], post.y[k]
    return start, y, t + post.makespan_s
