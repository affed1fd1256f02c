"""List scheduling, replay and verification (pure Python, no solver).

* ``serial_sgs`` — the serial schedule-generation scheme with insertion: ops in a given
  precedence-feasible order, each at the earliest time its predecessors are done and its cores
  are free for its whole duration. Over all orders and modes it reaches every active schedule,
  so it is also how a solver's answer is *replayed*: in the order of the solver's start times it
  never starts an op later than the solver did (see ``replay``).
* ``assign_cores`` — concrete core ids per op (greedy in start order; optimal for intervals).
* ``verify`` — independent check of a finished schedule: precedence, one op per core at a time,
  intra-op ops alone on the chip. The ILP path raises if its replayed schedule fails this.
* ``adaptive_sgs`` — the serial SGS choosing each op's mode while placing it (earliest finish).
* ``best_list_schedule`` — several mode choices × priority rules, then a local search flipping
  each op's intra-op flag, then adaptive-mode runs (forward and on the reversed graph): the upper
  bound, the warm start, and the cheap tier's answer. It stops at a deadline or when its work
  allowance (``LIST_WORK``, op placements) is spent, keeping the best schedule so far.
* ``kick_modes`` — a seeded descent that flips several ops' modes at once (the ILP tier runs it
  when the list schedule is not proven within the gap).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from phaze.schedule.budget import NO_DEADLINE, Deadline, OutOfTime
from phaze.schedule.instance import Instance

# Work allowance of one list-schedule search, in op placements (one serial-SGS run of an n-op
# instance = n). Measured on the schedule benchmark's block instances (up to 71 ops): the full
# search places at most 0.15 M ops there (llama2-7b backward), so the allowance never binds on
# real layers; it caps a 300-op DAG's search at ~6,700 SGS runs whatever the clock says (a node
# limit for the heuristic: the same answer on every machine when it binds).
LIST_WORK = 2_000_000


@dataclass
class Schedule:
    start: list[float]
    y: list[int]  # 1 = intra-op parallel on all cores of its type
    cores: list[tuple[tuple[int, ...], tuple[int, ...]]] | None = None  # (tc ids, vc ids)

    def duration(self, inst: Instance, i: int) -> float:
        return inst.la[i] if self.y[i] else inst.l1[i]

    def end(self, inst: Instance, i: int) -> float:
        return self.start[i] + self.duration(inst, i)

    def makespan(self, inst: Instance) -> float:
        return max((self.end(inst, i) for i in range(inst.n)), default=0.0)


def _usage(inst: Instance, i: int, yi: int) -> tuple[int, int, bool]:
    """(tensor cores, vector cores, exclusive) op i holds in mode yi."""
    tc = inst.uses(i, "tc")
    vc = inst.uses(i, "vc")
    if yi:
        return (inst.n_tc if tc else 0), (inst.n_vc if vc else 0), True
    return int(tc), int(vc), False


def serial_sgs(
    inst: Instance, order: list[int], y: list[int], deadline: Deadline = NO_DEADLINE
) -> Schedule:
    """Place ops in ``order`` (precedence-feasible) at their earliest feasible start (raises
    ``OutOfTime`` if the deadline passes first)."""
    n = inst.n
    start = [0.0] * n
    end = [0.0] * n
    placed: list[tuple[float, float, int, int, bool]] = []
    for i in order:
        deadline.check()
        p = inst.la[i] if y[i] else inst.l1[i]
        tc, vc, excl = _usage(inst, i, y[i])
        est = max((end[k] for k in inst.preds[i]), default=0.0)
        if p <= 0.0:
            start[i] = est
            end[i] = est
            continue
        s = _earliest_fit(inst, placed, est, p, tc, vc, excl)
        f = s + p
        start[i] = s
        end[i] = f
        placed.append((s, f, tc, vc, excl))
    return Schedule(start, list(y))


def _earliest_fit(
    inst: Instance, placed, est: float, p: float, tc: int, vc: int, excl: bool
) -> float:
    """Earliest start >= est at which an op holding (tc, vc, excl) for p fits beside ``placed``
    (candidate starts: est and every placed end after it; the last one always fits)."""
    live = [iv for iv in placed if iv[1] > est]  # no other can overlap a start >= est
    for s in sorted({est} | {iv[1] for iv in live}):
        f = s + p
        over = [iv for iv in live if iv[0] < f and iv[1] > s]
        if _fits(over, s, tc, vc, excl, inst.n_tc, inst.n_vc):
            return s
    raise AssertionError("unreachable: after every placed op ends, any op fits")


def adaptive_sgs(
    inst: Instance, order: list[int], bias: float = 0.0, deadline: Deadline = NO_DEADLINE
) -> Schedule:
    """Serial SGS that picks each op's mode as it places it (the multi-mode RCPSP rule): the
    mode that finishes earlier, intra-op only if it ends more than a fraction ``bias`` earlier
    (bias < 0 favours intra-op). Unlike a fixed mode vector, an op on the critical chain can
    stay on one core when others are free to run beside it, and go intra-op where nothing can."""
    n = inst.n
    start, end, y = [0.0] * n, [0.0] * n, [0] * n
    placed: list[tuple[float, float, int, int, bool]] = []
    for i in order:
        deadline.check()
        est = max((end[k] for k in inst.preds[i]), default=0.0)
        best = None
        for yi in (0, 1) if inst.la[i] != inst.l1[i] else (0,):
            p = inst.la[i] if yi else inst.l1[i]
            tc, vc, excl = _usage(inst, i, yi)
            s = est if p <= 0.0 else _earliest_fit(inst, placed, est, p, tc, vc, excl)
            score = (s + p) * (1 + bias) if yi else s + p
            if best is None or score < best[0]:
                best = (score, yi, s, s + p, tc, vc, excl)
        _, yi, s, f, tc, vc, excl = best
        start[i], end[i], y[i] = s, f, yi
        if f > s:
            placed.append((s, f, tc, vc, excl))
    return Schedule(start, y)


def _fits(over, s, tc, vc, excl, n_tc, n_vc) -> bool:
    if not over:
        return True
    if excl:
        return False
    for iv in over:
        if iv[4]:
            return False
    # usage is piecewise constant; its maximum over [s, f) is attained at s or at a start inside
    points = [s] + [iv[0] for iv in over if iv[0] > s]
    for t in points:
        u_tc = tc
        u_vc = vc
        for a, b, c, d, _ in over:
            if a <= t < b:
                u_tc += c
                u_vc += d
        if u_tc > n_tc or u_vc > n_vc:
            return False
    return True


def assign_cores(inst: Instance, sched: Schedule, tol: float = 0.0) -> Schedule:
    """Give each op concrete core ids: in start order, release ops that ended (within ``tol``),
    then take the lowest free ids. Interval graphs are perfect, so this never needs more cores
    than the peak concurrency; if the schedule over-subscribes, an id >= n shows it (``verify``
    reports it)."""
    order = sorted(
        (i for i in range(inst.n) if sched.duration(inst, i) > 0), key=lambda i: (sched.start[i], i)
    )
    free = {"tc": [], "vc": []}
    nxt = {"tc": 0, "vc": 0}
    active: list[tuple[float, int, list[int], list[int]]] = []
    cores: list = [((), ())] * inst.n

    def take(kind: str, k: int) -> list[int]:
        free[kind].sort()
        got = free[kind][:k]
        del free[kind][:k]
        while len(got) < k:
            got.append(nxt[kind])
            nxt[kind] += 1
        return got

    for i in order:
        s0 = sched.start[i]
        still = []
        for e, j, ctc, cvc in active:
            if e <= s0 + tol:
                free["tc"].extend(ctc)
                free["vc"].extend(cvc)
            else:
                still.append((e, j, ctc, cvc))
        active = still
        tc, vc, _ = _usage(inst, i, sched.y[i])
        ctc, cvc = take("tc", tc), take("vc", vc)
        cores[i] = (tuple(ctc), tuple(cvc))
        active.append((sched.end(inst, i), i, ctc, cvc))
    return Schedule(list(sched.start), list(sched.y), cores)


def verify(inst: Instance, sched: Schedule, tol: float) -> list[str]:
    """Violations of a schedule with core ids (empty list = valid). ``tol`` is absolute, s."""
    bad = []
    n = inst.n
    if sched.cores is None:
        sched = assign_cores(inst, sched, tol)
    for i in range(n):
        if sched.start[i] < -tol:
            bad.append(f"op {i} starts before 0")
        for k in inst.preds[i]:
            if sched.start[i] < sched.end(inst, k) - tol:
                bad.append(f"op {i} starts before its predecessor {k} ends")
        tc, vc, _ = _usage(inst, i, sched.y[i])
        ctc, cvc = sched.cores[i]
        if sched.duration(inst, i) > 0 and (len(ctc) != tc or len(cvc) != vc):
            bad.append(f"op {i} holds {len(ctc)} tc / {len(cvc)} vc, needs {tc} / {vc}")
        if any(c >= inst.n_tc for c in ctc) or any(c >= inst.n_vc for c in cvc):
            bad.append(f"op {i} uses a core id beyond n_tc={inst.n_tc}, n_vc={inst.n_vc}")
    for i in range(n):
        di = sched.duration(inst, i)
        if di <= 0:
            continue
        for j in range(i + 1, n):
            dj = sched.duration(inst, j)
            if dj <= 0:
                continue
            overlap = min(sched.start[i] + di, sched.start[j] + dj) - max(
                sched.start[i], sched.start[j]
            )
            if overlap <= tol:
                continue
            if sched.y[i] or sched.y[j]:
                bad.append(f"intra-op op overlaps another: ops {i}, {j}")
            elif set(sched.cores[i][0]) & set(sched.cores[j][0]) or set(sched.cores[i][1]) & set(
                sched.cores[j][1]
            ):
                bad.append(f"ops {i} and {j} share a core while overlapping")
    return bad


# ---- heuristics ---------------------------------------------------------------------------
def _tails(inst: Instance, dur: list[float]) -> list[float]:
    """Longest path from each op's start to the end of the DAG (the op included)."""
    tail = [0.0] * inst.n
    for i in reversed(range(inst.n)):
        tail[i] = dur[i] + max((tail[j] for j in inst.succs[i]), default=0.0)
    return tail


def priority_order(inst: Instance, prio: list[float]) -> list[int]:
    """Precedence-feasible list: repeatedly the eligible op with the highest priority."""
    return keyed_order(inst, [-p for p in prio])


def _orders(inst: Instance, y: list[int]) -> list[list[int]]:
    dur = [inst.la[i] if y[i] else inst.l1[i] for i in range(inst.n)]
    tail = _tails(inst, dur)
    ndesc = [(d).bit_count() for d in inst.descendants]
    rules = [
        tail,  # critical path first
        [tail[i] + 1e-3 * dur[i] for i in range(inst.n)],  # ... ties to longer ops
        dur,  # longest first
        [float(x) for x in ndesc],  # most successors first
        [-float(i) for i in range(inst.n)],  # topological index
    ]
    seen, out = set(), []
    for r in rules:
        o = tuple(priority_order(inst, r))
        if o not in seen:
            seen.add(o)
            out.append(list(o))
    return out


def initial_modes(inst: Instance) -> list[list[int]]:
    """Mode vectors to start from. Besides all-single-core and each-op-at-its-fastest, the
    slack rules: with every op at its fastest, ops within a fraction theta of the critical
    path's length from being critical go intra-op, the rest stay single-core so they can overlap.
    (Single flips cannot leave all-intra-op: one op alone on one core gains nothing.)"""
    n = inst.n
    fast = [1 if inst.la[i] < inst.l1[i] else 0 for i in range(n)]
    modes = [
        [0] * n,  # all on one core
        fast,  # each op at its fastest
        [
            1
            if inst.la[i] * inst.n_cores("tc" if inst.core[i] != "vc" else "vc") <= inst.l1[i]
            else 0
            for i in range(n)
        ],  # split only if it scales
    ]
    dur = [min(inst.la[i], inst.l1[i]) for i in range(n)]
    head = [0.0] * n
    for j in range(n):
        head[j] = max((head[i] + dur[i] for i in inst.preds[j]), default=0.0)
    tail = _tails(inst, dur)  # includes the op itself
    cp = max((head[i] + tail[i] for i in range(n)), default=0.0)
    for theta in (0.0, 0.02, 0.05, 0.1, 0.2, 0.35):
        modes.append([fast[i] if cp - (head[i] + tail[i]) <= theta * cp else 0 for i in range(n)])
    uniq = []
    for m in modes:
        if m not in uniq:
            uniq.append(m)
    return uniq


def reversed_instance(inst: Instance) -> Instance:
    """The same ops with every edge reversed (index k <-> n-1-k keeps indices topological)."""
    n = inst.n
    r = lambda i: n - 1 - i
    return Instance(
        inst.n_tc,
        inst.n_vc,
        inst.core[::-1],
        inst.l1[::-1],
        inst.la[::-1],
        tuple(sorted((r(b), r(a)) for a, b in inst.edges)),
        inst.ids[::-1],
    )


def justify(
    inst: Instance, sched: Schedule, rev: Instance | None = None, deadline: Deadline = NO_DEADLINE
) -> Schedule:
    """Double justification (forward-backward improvement): right-justify the schedule (an SGS
    on the reversed graph in order of latest end), then left-justify it again (SGS in order of
    earliest start). Never worse than the input in practice; kept only if it improves."""
    n = inst.n
    rev = rev or reversed_instance(inst)
    ends = [sched.end(inst, i) for i in range(n)]
    ry = list(reversed(sched.y))
    back = serial_sgs(rev, priority_order(rev, [ends[n - 1 - k] for k in range(n)]), ry, deadline)
    # reversed-time starts -> forward priority: ops that end last in reverse start first
    rend = [back.end(rev, k) for k in range(n)]
    fwd = serial_sgs(
        inst, priority_order(inst, [rend[n - 1 - i] for i in range(n)]), sched.y, deadline
    )
    return fwd if fwd.makespan(inst) < sched.makespan(inst) else sched


def sequential_schedule(inst: Instance) -> Schedule:
    """One op at a time in index (topological) order, each in its faster mode: always valid, O(n);
    the answer when not even one list schedule fits in the deadline."""
    y = [1 if inst.la[i] < inst.l1[i] else 0 for i in range(inst.n)]
    start, t = [0.0] * inst.n, 0.0
    for i in range(inst.n):
        start[i] = t
        t += inst.la[i] if y[i] else inst.l1[i]
    return Schedule(start, y)


class _Spent(Exception):
    """The list search's deadline or work allowance is spent."""


class _Search:
    """The best schedule found so far, and the deadline and work allowance candidates are
    charged to."""

    def __init__(self, inst: Instance, deadline: Deadline, work: int, best: Schedule | None = None):
        self.inst, self.deadline, self.left = inst, deadline, work
        self.rev = reversed_instance(inst)
        self.best = best
        self.best_ms = best.makespan(inst) if best is not None else float("inf")

    def consider(self, make) -> bool:
        """Charge one candidate (its SGS run and the justification's two), build it with
        ``make()``, double-justify it, keep it if it is better."""
        self.left -= 3 * self.inst.n
        if self.left < 0 or self.deadline.expired():
            raise _Spent
        try:
            s = justify(self.inst, make(), self.rev, self.deadline)
        except OutOfTime as exc:
            raise _Spent from exc
        ms = s.makespan(self.inst)
        if ms < self.best_ms * (1 - 1e-12):
            self.best, self.best_ms = s, ms
            return True
        return False

    def sgs(self, o, y):
        return lambda: serial_sgs(self.inst, o, y, self.deadline)


def best_list_schedule(
    inst: Instance,
    local_search: bool = True,
    extra: list[tuple[list[int], list[int]]] | None = None,
    deadline: Deadline = NO_DEADLINE,
    work: int = LIST_WORK,
) -> Schedule:
    """Best schedule over mode heuristics × priority rules (plus ``extra`` (order, y) seeds, e.g.
    a neighbouring architecture's solution), each double-justified; then (``local_search``)
    single intra-op flag flips. Stops when ``deadline`` passes or ``work`` op placements are
    spent, with the best schedule so far (the sequential schedule if none was finished)."""
    search = _Search(inst, deadline, work)
    consider, sgs = search.consider, search.sgs
    flippable = [i for i in range(inst.n) if inst.la[i] != inst.l1[i]]

    def flip_pass():
        for _pass in range(3):
            improved = False
            for i in flippable:
                y2 = list(search.best.y)
                y2[i] = 1 - y2[i]
                for o in _orders(inst, y2)[:2]:
                    if consider(sgs(o, y2)):
                        improved = True
                        break
            if not improved:
                return

    try:
        for y in initial_modes(inst):
            for o in _orders(inst, y):
                consider(sgs(o, y))
        for o, y in extra or []:
            consider(sgs(list(o), list(y)))
        if not local_search:
            for make in _adaptive_candidates(inst, search.rev, deadline):
                consider(make)
            return search.best
        flip_pass()
        # adaptive-mode candidates after the flips, so the flip search's path (and result) from
        # the fixed-mode starts is unchanged and the answer is never worse than without them;
        # every candidate is evaluated (consider() keeps the best of them), no short-circuit
        improved = [consider(make) for make in _adaptive_candidates(inst, search.rev, deadline)]
        if any(improved):
            flip_pass()
    except _Spent:
        pass
    return search.best if search.best is not None else sequential_schedule(inst)


# Mode kicks of ``kick_modes`` per call, and the most ops one kick flips. Measured on the schedule
# benchmark's 2x2 backward blocks (llama2-7b, opt-350m, megatron-gpt-2.5b, gpt3-175b t = 8): the
# kicks find schedules 6-11 % shorter than ``best_list_schedule`` (whose single flips cannot
# pair two tensor-core ops on one core each beside a vector-core op), with improvements still
# arriving after ~280 kicks; 300 kicks cost 0.5-2.5 CPU-s on the 69-71-op blocks.
KICKS = 300
_KICK_FLIPS = 4


def kick_modes(
    inst: Instance,
    sched: Schedule,
    kicks: int = KICKS,
    seed: int = 0,
    deadline: Deadline = NO_DEADLINE,
    work: int = LIST_WORK,
) -> Schedule:
    """Descent over mode vectors from ``sched``: each kick flips the intra-op flag of 1 to
    ``_KICK_FLIPS`` random ops (seeded: reproducible) of the best schedule so far, list-schedules
    the result with every priority rule, double-justified, and keeps it if it is shorter. Stops
    after ``kicks`` kicks, at ``deadline`` or when ``work`` op placements are spent; never
    returns a longer schedule than ``sched``."""
    search = _Search(inst, deadline, work, best=sched)
    flippable = [i for i in range(inst.n) if inst.la[i] != inst.l1[i]]
    if not flippable:
        return sched
    rng = random.Random(seed)
    try:
        for _ in range(kicks):
            y = list(search.best.y)
            for i in rng.sample(flippable, min(len(flippable), rng.randint(1, _KICK_FLIPS))):
                y[i] = 1 - y[i]
            for o in _orders(inst, y):
                search.consider(search.sgs(o, y))
    except _Spent:
        pass
    return search.best


def _adaptive_candidates(inst: Instance, rev: Instance, deadline: Deadline = NO_DEADLINE):
    """Adaptive-mode SGS runs (modes chosen while placing), forward and on the reversed graph
    (converted back by a serial SGS in order of reversed end times): priorities = remaining path
    with single-core / fastest durations, op length, successor count; mode bias 0, ±2 %. Yields
    one zero-argument builder per run (so the caller charges each run before it happens)."""
    n = inst.n
    for g, backward in ((inst, False), (rev, True)):
        ndesc = [float((d).bit_count()) for d in g.descendants]
        for y0 in ([0] * n, [1 if g.la[i] < g.l1[i] else 0 for i in range(n)]):
            dur = [g.la[i] if y0[i] else g.l1[i] for i in range(n)]
            for prio in (_tails(g, dur), dur, ndesc):
                order = priority_order(g, prio)
                for bias in (0.0, 0.02, -0.02):

                    def make(g=g, backward=backward, order=order, bias=bias):
                        s = adaptive_sgs(g, order, bias, deadline)
                        if backward:
                            ends = [s.end(g, k) for k in range(n)]
                            s = serial_sgs(
                                inst,
                                priority_order(inst, [ends[n - 1 - i] for i in range(n)]),
                                list(reversed(s.y)),
                                deadline,
                            )
                        return s

                    yield make


def replay(inst: Instance, start: list[float], y: list[int]) -> Schedule:
    """Earliest-start replay of a solver answer: the serial SGS in order of solver start times.

    If the solver's times are resource-feasible, every op starts no later than the solver said
    (by induction: the ops placed before op i run, at any instant after i's solver start, only
    where they also ran in the solver's schedule), so the replayed makespan is <= the solver's T;
    that holds for any order among equal start times. A solver answer is feasible only up to its
    tolerances, though: an intra-op op shorter than the feasibility tolerance may "start" with a
    long op, and placing the long op first then delays it and everything after it by the long
    op's whole length. So equal starts are also tried shortest-ending first, and the order of the
    ops' midpoints, and the shortest replay is kept (each is a valid schedule).
    """
    dur = [inst.la[i] if y[i] else inst.l1[i] for i in range(inst.n)]
    # a heap-driven order keeps it precedence-feasible even if solver tolerances blur equal times;
    # the later keys are built only if the first replay is longer than the solver's own times
    keys = (
        lambda i: (start[i], i),
        lambda i: (start[i], start[i] + dur[i], i),
        lambda i: (start[i] + 0.5 * dur[i], i),
    )
    claimed = max((start[i] + dur[i] for i in range(inst.n)), default=0.0)
    best = None
    for key in keys:
        sched = serial_sgs(inst, keyed_order(inst, [key(i) for i in range(inst.n)]), y)
        if best is None or sched.makespan(inst) < best.makespan(inst):
            best = sched
        if best.makespan(inst) <= claimed * (1 + 1e-12):
            break  # as short as the solver's own times: the usual case, one pass
    return best


def keyed_order(inst: Instance, key: list) -> list[int]:
    """Precedence-feasible list: repeatedly the eligible op with the smallest ``key``."""
    indeg = [len(p) for p in inst.preds]
    heap = [(key[i], i) for i in range(inst.n) if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for j in inst.succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (key[j], j))
    return order
