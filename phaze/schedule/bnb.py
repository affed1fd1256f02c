"""Exact branch and bound over schedules: the proofs SCIP's models do not reach.

The ILP's relaxations see precedence and mode choice only through cuts, so on backward blocks with
2-4 cores per type (a dgrad chain plus long weight-gradient leaves) its bound stalls far below the
optimum. This search enumerates schedules directly, in time order, and proves a gap target by
exhausting every schedule that could beat it.

**Search space.** At an event time t (0, or when a running op ends) every eligible op (its
predecessors done) is decided in turn: start it now on one core, start it now intra-op (only when
nothing runs), or leave it for a later event. When nothing is left to decide, time advances to the
next end. Every schedule in which each op starts at 0 or at another op's end is reached, and some
optimal schedule is of that kind (left-shift any schedule), so the enumeration is complete.

**Dominance** (each prunes only schedules another branch reaches with no larger makespan):

* left shift: an op started at t that could have started at an earlier event time, its
  predecessors done and its cores free (and, intra-op, the chip empty) from there on, every other
  op unchanged, is pruned: moving it earlier frees resources later and delays nothing;
* an empty chip with every eligible op left for later is pruned (idle time, shifts left);
* states seen before: after an advance, a state whose subtree has been explored is remembered
  (its time, its running ops' ends and modes, per set of started ops); a later state with the
  same started ops, no earlier, whose ops still running include every op of the remembered one
  that runs past its time (same mode, ending no earlier), is dominated: its future, started at
  the same times from the remembered state, is valid there. Remembering only finished subtrees
  keeps a state from being judged by its own ancestor;
* ops of zero latency start as soon as they are eligible (they hold no core).

**Bounds at every node**, for the target ``(1 - mip_gap) x incumbent`` (so a branch is pruned as soon
as it cannot beat the target):

* earliest finish along precedence from the node's state: an unstarted op ends no earlier than
  its start + L1, or, intra-op, no earlier than every running op's end + L_all (an intra-op op
  runs alone), plus its tail (longest fastest-mode path after it);
* forced modes: an op whose earliest start + L1 + tail reaches the target must run intra-op, so it
  takes the whole chip for L_all;
* energy: from t, the forced ops' L_all plus the larger of the tensor- and vector-core work left
  (running ops' remaining time, others' min(L_all, L1 / n_c)); the same for the ops whose earliest
  start is at least h (from h), and for the ops whose tail is at least tau (plus tau).

**Tiny ops.** Ops whose fastest latency is below ``TINY`` x the incumbent's makespan are searched
as zero-latency ops: shortening latencies can only shorten the optimum, so the proven bound stays
valid (it moves by at most their sum, < 0.1 % on 100 ops), and no branching is spent on
nanosecond ops. A schedule found is replayed with the real latencies before it is used.

Bounded work: the search stops at its deadline or after ``work`` nodes, whichever comes first;
only a search that ran to the end proves anything (``complete``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from phaze.schedule.bounds import tails
from phaze.schedule.budget import NO_DEADLINE, Deadline
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import Schedule, replay

# Node allowance meaning "none" (schedule.bnb_node_limit = 0: the deadline alone stops it).
BNB_UNLIMITED = 1 << 62

# Ops whose fastest latency is at most this fraction of the incumbent's makespan are searched as
# zero-latency ops (see the module docstring).
TINY = 1e-5

_INF = float("inf")
_EPS = 1e-12  # time tolerance, in units of the incumbent's makespan


@dataclass
class BnbOutcome:
    schedule: Schedule | None  # a schedule shorter than the incumbent (real latencies), or None
    lower_bound_s: float  # proven lower bound on the optimum (0 unless ``complete``)
    complete: bool  # the search ran to the end: no schedule shorter than the target exists
    nodes: int


# States remembered per set of started ops (the first ones explored).
_MEMO_PER_SET = 16


def _dominates(ta: float, ea: dict, tb: float, eb: dict) -> bool:
    """State A (time ``ta``, running ops -> (end, mode) ``ea``) dominates state B with the same
    started ops if it is no later and every op still running in A after ``tb`` runs in B too,
    in the same mode, ending no earlier: B's future, started at the same times from A, is a
    valid schedule there (A's resources are never busier)."""
    if ta > tb + _EPS:
        return False
    for i, (e, m) in ea.items():
        if e <= tb + _EPS:
            continue
        other = eb.get(i)
        if other is None or e > other[0] + _EPS or m != other[1]:
            return False
    return True


class _Stop(Exception):
    pass


@lru_cache(maxsize=1 << 16)
def _bits(m: int) -> tuple[int, ...]:
    """The set bits of ``m``, lowest first (cached: the search meets the same sets again)."""
    out = []
    while m:
        b = m & -m
        out.append(b.bit_length() - 1)
        m ^= b
    return tuple(out)


class _Search:
    def __init__(self, inst: Instance, ub: float, mip_gap: float, deadline: Deadline, work: int):
        n = self.n = inst.n
        s = 1.0 / ub  # time in units of the incumbent's makespan
        tiny = TINY
        # the faster real mode of each op (what a zero-latency op is replayed with)
        self.fast = [1 if inst.la[i] < inst.l1[i] else 0 for i in range(n)]
        self.l1 = [v * s for v in inst.l1]
        self.la = [v * s for v in inst.la]
        for i in range(n):
            if min(self.l1[i], self.la[i]) <= tiny:
                self.l1[i] = self.la[i] = 0.0
        self.q = [min(a, b) for a, b in zip(self.l1, self.la)]
        self.free = [self.la[i] < self.l1[i] for i in range(n)]
        self.zero = [self.q[i] <= 0.0 for i in range(n)]
        self.tc = [1 if inst.uses(i, "tc") else 0 for i in range(n)]
        self.vc = [1 if inst.uses(i, "vc") else 0 for i in range(n)]
        self.ntc, self.nvc = inst.n_tc, inst.n_vc
        self.preds = inst.preds
        self.pmask = [sum(1 << p for p in inst.preds[j]) for j in range(n)]
        relaxed = Instance(
            inst.n_tc, inst.n_vc, inst.core, tuple(self.l1), tuple(self.la), inst.edges
        )
        self.tail = tails(relaxed)
        self.wtc = [min(self.la[i], self.l1[i] / self.ntc) if self.tc[i] else 0.0 for i in range(n)]
        self.wvc = [min(self.la[i], self.l1[i] / self.nvc) if self.vc[i] else 0.0 for i in range(n)]
        self.before = [0] * n
        anc = inst.ancestors
        for a in range(n):
            for b in range(n):
                if (
                    a != b
                    and not inst.succs[a]
                    and not inst.succs[b]
                    and inst.core[a] == inst.core[b]
                    and self.l1[a] == self.l1[b]
                    and self.la[a] == self.la[b]
                    and anc[a] & ~anc[b] == 0
                    and (anc[a] != anc[b] or a < b)
                ):
                    self.before[b] |= 1 << a
        # decision order: priority, and among twins the one that must start first is decided first
        self.by_tail = sorted(range(n), key=lambda i: -self.tail[i])
        # branching order among eligible ops: longest single-core run first
        self.prio = [self.l1[i] + 1e-3 * self.tail[i] for i in range(n)]
        self.order_key = [(self.prio[i], -self.before[i].bit_count()) for i in range(n)]
        self.full = (1 << n) - 1
        self.mip_gap = mip_gap
        self.inc = 1.0  # incumbent makespan (scaled), real or of the relaxed instance
        self.thr = 1.0 - mip_gap
        self.found: tuple[list[float], list[int]] | None = None
        self.minpruned = _INF
        self.nodes = 0
        self.work = work
        self.deadline = deadline
        self.memo: dict = {}
        self.hist: list[tuple[float, float, int, int, bool]] = []  # (from, to, tc, vc, excl)
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.mode = [0] * n

    # ---- bound ------------------------------------------------------------------------------
    def bound(self, t, done, started, running, delayed, nxt) -> float:
        l1, la, q, tail, free = self.l1, self.la, self.q, self.tail, self.free
        wtc, wvc, preds, pmask = self.wtc, self.wvc, self.preds, self.pmask
        thr = self.thr
        lb = t
        etc = evc = alone = 0.0
        ends = {}
        eall = t
        for e, i, m in running:
            ends[i] = e
            if e > eall:
                eall = e
            v = e + tail[i]
            if v > lb:
                lb = v
            if m:
                alone += e - t
            else:
                if self.tc[i]:
                    etc += e - t
                if self.vc[i]:
                    evc += e - t
        rest = ~started & self.full
        # the next event: the first end among running ops and ops still to decide now
        for j in _bits(rest & ~delayed):
            if not pmask[j] & ~done:
                v = t + q[j]
                if v < nxt:
                    nxt = v
        est = {}
        fin = {}
        forced = 0
        ftc = fvc = 0.0
        for j in _bits(rest):
            s = nxt if (delayed >> j) & 1 else t
            for p in preds[j]:
                if not (done >> p) & 1:
                    v = ends[p] if p in ends else fin[p]
                    if v > s:
                        s = v
            f = s + l1[j]
            if free[j]:
                f2 = (s if s >= eall else eall) + la[j]
                if f2 < f:
                    f = f2
                if s + l1[j] + tail[j] >= thr:
                    forced |= 1 << j
                    alone += la[j]
                else:
                    ftc += wtc[j]
                    fvc += wvc[j]
            else:
                ftc += wtc[j]
                fvc += wvc[j]
            fin[j] = f
            est[j] = s
            v = f + tail[j]
            if v > lb:
                lb = v
        a = etc / self.ntc + ftc
        b = evc / self.nvc + fvc
        v = t + alone + (a if a > b else b)
        if v > lb:
            lb = v
        if lb >= thr:
            return lb
        # energy on windows: ops starting no earlier than h, and ops with a tail of at least tau
        acc_a = acc_t = acc_v = 0.0
        for j in sorted(est, key=est.__getitem__, reverse=True):
            if (forced >> j) & 1:
                acc_a += la[j]
            else:
                acc_t += wtc[j]
                acc_v += wvc[j]
            v = est[j] + acc_a + (acc_t if acc_t > acc_v else acc_v)
            if v > lb:
                lb = v
        acc_a = acc_t = acc_v = 0.0
        for j in self.by_tail:
            if (started >> j) & 1:
                continue
            if (forced >> j) & 1:
                acc_a += la[j]
            else:
                acc_t += wtc[j]
                acc_v += wvc[j]
            v = t + acc_a + (acc_t if acc_t > acc_v else acc_v) + tail[j]
            if v > lb:
                lb = v
        return lb

    # ---- left-shift dominance -----------------------------------------------------------------
    def could_start_earlier(self, i: int, m: int, d: float, t: float) -> bool:
        """Op i (mode m, duration d) starting at t could start at an earlier event time with every
        other op unchanged: its predecessors done there and its cores (intra-op: the chip) free
        from there until t or its end."""
        r = 0.0
        for p in self.preds[i]:
            if self.end[p] > r:
                r = self.end[p]
        if r >= t - _EPS:
            return False
        hist = self.hist
        k = len(hist) - 1
        while k >= 0 and hist[k][0] > r - _EPS:
            k -= 1
        lo = max(k, 0)
        ti, vi, ntc, nvc = self.tc[i], self.vc[i], self.ntc, self.nvc
        cands = [r] + [hist[j][0] for j in range(k + 1, len(hist)) if hist[j][0] > r + _EPS]
        for e in cands:
            if e >= t - _EPS:
                break
            stop = min(t, e + d)
            for j in range(lo, len(hist)):
                a, b, tcu, vcu, ex = hist[j]
                if b <= e + _EPS or a >= stop - _EPS:
                    continue
                if ex or (tcu or vcu if m else tcu + ti > ntc or vcu + vi > nvc):
                    break
            else:
                return True
        return False

    # ---- the search ---------------------------------------------------------------------------
    def node(self, t, done, started, running, delayed) -> None:
        self.nodes += 1
        if self.nodes >= self.work or (self.nodes & 255 == 0 and self.deadline.expired()):
            raise _Stop
        if started == self.full and not running:
            if t < self.inc:
                self.inc = t
                self.thr = t * (1 - self.mip_gap)
                self.found = (list(self.start), list(self.mode))
            return
        nxt = min((e for e, _, _ in running), default=_INF)
        lb = self.bound(t, done, started, running, delayed, nxt)
        if lb >= self.thr - _EPS:
            if lb < self.minpruned:
                self.minpruned = lb
            return
        excl = False
        tcu = vcu = 0
        for _, i, m in running:
            excl |= bool(m)
            tcu += self.tc[i]
            vcu += self.vc[i]
        elig = []
        if not excl:
            pmask = self.pmask
            for j in _bits(~started & ~delayed & self.full):
                if not pmask[j] & ~done:
                    if self.zero[j]:  # no core, no time: start it at once
                        self.start[j] = self.end[j] = t
                        self.mode[j] = self.fast[j]
                        self.node(t, done | (1 << j), started | (1 << j), running, delayed)
                        return
                    elig.append(j)
        # ops with no way to start now (no free core, chip not empty for intra-op, or dominated
        # by an earlier start) are left for later without a node of their own
        elig.sort(key=self.order_key.__getitem__)
        while elig:
            i = elig[-1]
            if self.before[i] & ~started:
                elig.pop()
                delayed |= 1 << i
                continue
            intra = (
                self.free[i] and not running and not self.could_start_earlier(i, 1, self.la[i], t)
            )
            single = (
                self.tc[i] + tcu <= self.ntc
                and self.vc[i] + vcu <= self.nvc
                and not self.could_start_earlier(i, 0, self.l1[i], t)
            )
            if intra or single:
                break
            elig.pop()
            delayed |= 1 << i
        if not elig:
            if running:
                self._advance(t, done, started, running, nxt, (t, nxt, tcu, vcu, excl))
            return  # (an empty chip with everything left for later: idle time)
        # intra-op first (it ends soonest), then one core, then later
        if intra:
            self._start(i, 1, t, done, started, running, delayed)
        if single:
            self._start(i, 0, t, done, started, running, delayed)
        if running or len(elig) > 1:
            self.node(t, done, started, running, delayed | (1 << i))

    def _advance(self, t, done, started, running, t2, segment) -> None:
        """Move to the next end ``t2``, unless a remembered state dominates the new one."""
        d2, r2 = done, []
        for e, i, m in running:
            if e <= t2 + _EPS:
                d2 |= 1 << i
            else:
                r2.append((e, i, m))
        ends = {i: (e, m) for e, i, m in r2}
        seen = self.memo.get(started)
        if seen is None:
            seen = self.memo[started] = []
        elif any(_dominates(ta, ea, t2, ends) for ta, ea in seen):
            return
        self.hist.append(segment)
        self.node(t2, d2, started, r2, 0)
        self.hist.pop()
        if len(seen) < _MEMO_PER_SET:  # remembered once its subtree is explored
            seen.append((t2, ends))

    def _start(self, i, m, t, done, started, running, delayed) -> None:
        d = self.la[i] if m else self.l1[i]
        self.start[i] = t
        self.end[i] = t + d
        self.mode[i] = m
        self.node(t, done, started | (1 << i), running + [(t + d, i, m)], delayed)


def branch_and_bound(
    inst: Instance,
    incumbent: Schedule,
    mip_gap: float,
    deadline: Deadline = NO_DEADLINE,
    work: int = BNB_UNLIMITED,
) -> BnbOutcome:
    """Search for a schedule shorter than ``(1 - mip_gap)`` x the incumbent's makespan. A complete
    search proves the bound it returns (at least that target, or the shortest schedule found
    below it); a schedule found is returned (replayed with the real latencies) if it beats the
    incumbent. Stops at ``deadline`` or after ``work`` nodes (then ``complete`` is False and the
    bound is 0)."""
    ub = incumbent.makespan(inst)
    if ub <= 0.0:
        return BnbOutcome(None, 0.0, True, 0)
    srch = _Search(inst, ub, mip_gap, deadline, work)
    try:
        srch.node(0.0, 0, 0, [], 0)
        complete = True
    except _Stop:
        complete = False
    except RecursionError:  # deeper than the interpreter allows: nothing proven
        complete = False
    sched = None
    if srch.found is not None:
        start, mode = srch.found
        cand = replay(inst, [v * ub for v in start], mode)
        if cand.makespan(inst) < ub * (1 - 1e-12):
            sched = cand
    lower = min(srch.minpruned, srch.inc) * ub if complete else 0.0
    return BnbOutcome(sched, lower, complete, srch.nodes)
