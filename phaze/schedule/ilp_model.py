"""The operator-scheduling ILP's model (upstream Phaze's formulation, strengthened), as Pyomo
models; phaze/schedule/ilp.py solves them with SCIP, phaze/schedule/ilp_worker.py runs the solves
in a worker process.

Variables (time in units of the warm start's makespan UB, so SCIP's absolute tolerances are
relative ones): start t_i, intra-op flag y_i, ordering binaries o_ij / o_ji for *incomparable*
pairs only (precedence already orders the others), makespan T; minimise T.

* p_i = L1_i + (LA_i - L1_i) y_i; precedence on the transitive reduction; T >= t_i + p_i + tail_i.
* o_ij = 1  =>  t_j >= t_i + p_i, with a per-pair big-M = UB - tail_i - head_j (not a global M).
* intra-op ops run alone: o_ij + o_ji >= y_i and >= y_j; o_ij + o_ji <= 1.
* pairs sharing a core type with one core of it must be ordered: o_ij + o_ji = 1.
* energy cut per core type c: T >= sum_i y_i LA_i + sum_{i uses c} (1 - y_i) L1_i / n_c, and
  the same on late and early windows (ops with head >= h: T >= h + their energy; tails alike).
* t_i within [head_i, UB - tail_i - q_i]; y_i fixed to 0 where LA_i >= L1_i (dominated), to 1
  where head_i + L1_i + tail_i > UB (no schedule shorter than UB runs it on one core).
* mode-aware time cuts (``add_mode_cuts``): intra-op ops run alone, so the makespan is their
  total LA plus the time during which single-core ops run; that time is at least, for every op
  j, the single-core time before j starts (S_j: a longest path of single-core latencies and the
  single-core energy of j's ancestors) + j's own single-core latency + the single-core time after
  j ends (G_j, mirrored). These see precedence and mode choice together (the energy and
  critical-path cuts each see one of them); they are also solved alone as a small MIP
  (``mode_bound_model``: only the y binaries), a bound before the full model is tried.
* segment cuts (``add_segment_cuts``, in the mode bound only): a long single-core op's run is one
  interval that no intra-op op overlaps, so ops between two ops that overlap it lie inside it on
  one core; the single-core time outside the run then bounds the rest.
* lazily, per core type whose solution over-subscribes its cores (upstream's scheme): core
  assignment z_ik with sum_k z_ik = 1 - y_i, o_ij + o_ji >= z_ik + z_jk - 1, and the standard
  symmetry breaking z_ik = 0 for k > rank of i among that type's ops (the warm start's cores are
  relabelled to satisfy it, since a start that violates it would be discarded by SCIP).

The dual bound of a model without some z is still a valid lower bound (it is a relaxation).
"""

from __future__ import annotations

from phaze.schedule.bounds import (
    _bits,
    antichain_width,
    core_limits,
    forced_intra,
    heads,
    tails,
)
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import Schedule, assign_cores

_EPS = 1e-9


def build_model(inst: Instance, ub: float, lb: float, z_types=(), warm: Schedule | None = None):
    import pyomo.environ as pyo  # deferred: pyomo is heavy (light commands never solve)

    n = inst.n
    head, tail = heads(inst), tails(inst)
    s = 1.0 / ub
    l1 = [v * s for v in inst.l1]
    la = [v * s for v in inst.la]
    hd = [v * s for v in head]
    tl = [v * s for v in tail]
    q = [v * s for v in inst.q]
    t_max = 1.0 + _EPS

    m = pyo.ConcreteModel()
    m.N = pyo.RangeSet(0, n - 1)
    m.t = pyo.Var(m.N, bounds=lambda _m, i: (hd[i], max(hd[i], t_max - tl[i] - q[i])))
    m.y = pyo.Var(m.N, domain=pyo.Binary)
    for i in range(n):
        if la[i] >= l1[i]:
            m.y[i].fix(0)
    for i in forced_intra(inst, ub):  # cannot fit on one core below UB (the warm start has y=1)
        if warm is None or warm.y[i]:
            m.y[i].fix(1)
    m.T = pyo.Var(bounds=(min(lb * s, 1.0), t_max))

    def p(i):
        return l1[i] + (la[i] - l1[i]) * m.y[i]

    m.prec = pyo.Constraint(list(inst.reduced_edges), rule=lambda _m, i, j: m.t[j] >= m.t[i] + p(i))
    m.mk = pyo.Constraint(m.N, rule=lambda _m, i: m.T >= m.t[i] + p(i) + tl[i])

    pairs = list(inst.incomparable_pairs)
    arcs = pairs + [(j, i) for i, j in pairs]
    m.o = pyo.Var(arcs, domain=pyo.Binary)
    bigm = {(i, j): max(0.0, t_max - tl[i] - hd[j]) for i, j in arcs}
    m.disj = pyo.Constraint(
        arcs, rule=lambda _m, i, j: m.t[j] >= m.t[i] + p(i) - bigm[i, j] * (1 - m.o[i, j])
    )
    m.atmost1 = pyo.Constraint(pairs, rule=lambda _m, i, j: m.o[i, j] + m.o[j, i] <= 1)
    m.alone_i = pyo.Constraint(pairs, rule=lambda _m, i, j: m.o[i, j] + m.o[j, i] >= m.y[i])
    m.alone_j = pyo.Constraint(pairs, rule=lambda _m, i, j: m.o[i, j] + m.o[j, i] >= m.y[j])

    def must_order(i, j):
        return any(
            inst.uses(i, c) and inst.uses(j, c) and inst.n_cores(c) == 1 for c in ("tc", "vc")
        )

    forced = [(i, j) for i, j in pairs if must_order(i, j)]
    m.forced = pyo.Constraint(forced, rule=lambda _m, i, j: m.o[i, j] + m.o[j, i] == 1)
    # two cores of a type: of any three pairwise incomparable ops holding it, some pair is
    # ordered (intervals that pairwise overlap share a point, so this is exactly "at most two at
    # once"; no core assignment needed for that type)
    triples = triples_two_cores(inst)
    m.two_cores = pyo.Constraint(
        triples,
        rule=lambda _m, i, j, k: (
            m.o[i, j] + m.o[j, i] + m.o[i, k] + m.o[k, i] + m.o[j, k] + m.o[k, j] >= 1
        ),
    )

    kinds = ("tc", "vc")
    m.energy = pyo.Constraint(
        kinds,
        rule=lambda _m, c: (
            m.T
            >= sum(la[i] * m.y[i] for i in range(n))
            + sum(l1[i] / inst.n_cores(c) * (1 - m.y[i]) for i in range(n) if inst.uses(i, c))
        ),
    )
    # the energy cut on late / early windows: ops with head >= h (tail >= tau) all run after h
    # (end before T - tau), intra-op ops of any type take the whole chip while they run
    win = []
    for c in kinds:
        mem = [i for i in range(n) if inst.uses(i, c)]
        for h in sorted({hd[i] for i in mem} - {0.0}):
            win.append((c, "head", h))
        for tau in sorted({tl[i] for i in mem} - {0.0}):
            win.append((c, "tail", tau))

    def window_rule(_m, c, side, v):
        sel = [i for i in range(n) if (hd[i] if side == "head" else tl[i]) >= v]
        return m.T >= v + sum(la[i] * m.y[i] for i in sel) + sum(
            l1[i] / inst.n_cores(c) * (1 - m.y[i]) for i in sel if inst.uses(i, c)
        )

    m.window = pyo.Constraint(win, rule=window_rule)
    add_mode_cuts(m, inst, s)
    m.obj = pyo.Objective(expr=m.T, sense=pyo.minimize)

    # lazy core assignment
    zkeys, zpairs, rank = [], [], {}
    for c in z_types:
        # zero-length ops hold no core
        members = [i for i in range(n) if inst.uses(i, c) and inst.l1[i] > 0]
        for r, i in enumerate(members):
            rank[c, i] = r
            for k in range(min(r + 1, inst.n_cores(c))):  # symmetry breaking: k <= rank
                zkeys.append((c, i, k))
        for i, j in pairs:
            if (c, i) in rank and (c, j) in rank and inst.n_cores(c) > 1:
                for k in range(min(rank[c, i], rank[c, j], inst.n_cores(c) - 1) + 1):
                    zpairs.append((c, i, j, k))
    m.z = pyo.Var(zkeys, domain=pyo.Binary)
    zsets = {}
    for c, i, k in zkeys:
        zsets.setdefault((c, i), []).append(k)
    m.assign = pyo.Constraint(
        list(zsets), rule=lambda _m, c, i: sum(m.z[c, i, k] for k in zsets[c, i]) == 1 - m.y[i]
    )
    m.samecore = pyo.Constraint(
        zpairs, rule=lambda _m, c, i, j, k: m.o[i, j] + m.o[j, i] >= m.z[c, i, k] + m.z[c, j, k] - 1
    )

    if warm is not None:
        _set_warm(m, inst, warm, s, z_types, pairs)
    return m


# Types with exactly two cores get the triple constraints instead of a core assignment, up to
# this many triples (a 28-op block at 2x2 cores has a few hundred to a few thousand).
_MAX_TRIPLES = 20000


def triples_two_cores(inst: Instance) -> list[tuple[int, int, int]]:
    """(i, j, k), i < j < k, pairwise incomparable ops that all hold a core of a type with
    exactly two cores (zero-length ops hold none); [] if that would exceed ``_MAX_TRIPLES``."""
    out: set[tuple[int, int, int]] = set()
    for c in ("tc", "vc"):
        if inst.n_cores(c) != 2:
            continue
        mem = [i for i in range(inst.n) if inst.uses(i, c) and inst.l1[i] > 0]
        rel = {i: inst.ancestors[i] | inst.descendants[i] for i in mem}
        for a, i in enumerate(mem):
            for b, j in enumerate(mem[a + 1 :], a + 1):
                if (rel[i] >> j) & 1:
                    continue
                for k in mem[b + 1 :]:
                    if not (rel[i] >> k) & 1 and not (rel[j] >> k) & 1:
                        out.add((i, j, k))
                        if len(out) > _MAX_TRIPLES:
                            return []
    return sorted(out)


def two_core_types(inst: Instance) -> tuple[str, ...]:
    """Core types whose capacity the triple constraints already enforce."""
    if not triples_two_cores(inst):
        return ()
    return tuple(c for c in ("tc", "vc") if inst.n_cores(c) == 2)


# Core types with at most this many cores (and more than two) get the core assignment from the
# first solve when their ops can over-subscribe them: the assignment is small there (<= 4 z per
# op), and a first solve without it spends its whole budget on a relaxation whose incumbents
# are then rejected (measured on the schedule benchmark's 4x4 backward blocks).
_EAGER_Z_CORES = 4


def eager_z_types(inst: Instance) -> tuple[str, ...]:
    k = core_limits(inst)
    out = []
    for c in ("tc", "vc"):
        n_c = inst.n_cores(c)
        if 2 < n_c <= _EAGER_Z_CORES and k[c] == n_c:
            mem = [i for i in range(inst.n) if inst.uses(i, c) and inst.l1[i] > 0]
            if antichain_width(inst, mem) > n_c:
                out.append(c)
    return tuple(out)


def add_mode_cuts(m, inst: Instance, s: float) -> None:
    """Add S_j, G_j and the cuts T >= sum_i LA_i y_i + S_j + L1_j (1 - y_j) + G_j to a model with
    binaries ``m.y`` and makespan ``m.T`` (time scaled by ``s``).

    Valid because intra-op ops overlap nothing: the makespan splits into their total LA and the
    time R when single-core ops run, and R >= (R before j starts) + (j's single-core time) + (R
    after j ends). R before j is at least S_i + L1_i (1 - y_i) for a predecessor i (both lie before
    j, i's single-core run inside), and at least the single-core work of type c among j's
    ancestors / k_c (at most k_c of them run at once, k_c = ``core_limits``); G_j alike."""
    import pyomo.environ as pyo  # deferred: pyomo is heavy (light commands never solve)

    n = inst.n
    k = core_limits(inst)
    l1 = [v * s for v in inst.l1]
    la = [v * s for v in inst.la]

    def single(i):
        return l1[i] * (1 - m.y[i])

    m.S = pyo.Var(range(n), bounds=(0.0, None))
    m.G = pyo.Var(range(n), bounds=(0.0, None))
    m.mode_cuts = pyo.ConstraintList()
    for a, b in inst.reduced_edges:
        m.mode_cuts.add(m.S[b] >= m.S[a] + single(a))
        m.mode_cuts.add(m.G[a] >= m.G[b] + single(b))
    for j in range(n):
        for c in ("tc", "vc"):
            anc = [i for i in _bits(inst.ancestors[j]) if inst.uses(i, c)]
            desc = [i for i in _bits(inst.descendants[j]) if inst.uses(i, c)]
            if anc:
                m.mode_cuts.add(m.S[j] >= sum(single(i) for i in anc) / k[c])
            if desc:
                m.mode_cuts.add(m.G[j] >= sum(single(i) for i in desc) / k[c])
    alone = sum(la[i] * m.y[i] for i in range(n))
    for j in range(n):
        m.mode_cuts.add(m.T >= alone + m.S[j] + single(j) + m.G[j])
    for c in ("tc", "vc"):
        mem = [i for i in range(n) if inst.uses(i, c)]
        m.mode_cuts.add(m.T >= alone + sum(single(i) for i in mem) / k[c])


# Ops whose single-core run gets its own segment cuts (``add_segment_cuts``): the few with the
# largest l1_j x (single-core latency of the ops incomparable to j). Measured on the schedule
# benchmark's llama2-7b backward blocks: the weight-gradient leaves come first, and three of them
# give nearly all of the gain (t = 2 at 8x8: 12.9 % -> 2.8 % gap; ten: 2.3 %, 3x the solve time).
_SEGMENT_OPS = 3


# ... and up to this many more: the best-scoring of the ops the incumbent runs on one core with
# a free mode. Measured on the benchmark: gpt3-175b t = 8 at 8x8 / 8x2 goes from 1.27 / 1.23 % to
# 0 % with its one such weight-gradient leaf (op 11 of 26); on the llama2-7b blocks the extra
# ops change nothing and cost up to 1.45x the LP iterations.
_SEGMENT_OPS_SINGLE = 2


def segment_ops(
    inst: Instance,
    k: int = _SEGMENT_OPS,
    incumbent_y: list[int] | None = None,
    k_single: int = _SEGMENT_OPS_SINGLE,
) -> list[int]:
    """The ``k`` ops with a free mode (intra-op faster) that most single-core work could hide
    beside: largest l1_j x sum of l1_i over ops i incomparable to j (ties: index); then up to
    ``k_single`` more, in the same order, among those ``incumbent_y`` runs on one core."""
    score = {}
    for j in range(inst.n):
        if inst.la[j] >= inst.l1[j] or inst.l1[j] <= 0:
            continue
        rel = inst.ancestors[j] | inst.descendants[j] | (1 << j)
        score[j] = inst.l1[j] * sum(inst.l1[i] for i in range(inst.n) if not (rel >> i) & 1)
    ranked = sorted((j for j in score if score[j] > 0), key=lambda j: (-score[j], j))
    extra = [j for j in ranked[k:] if incumbent_y is not None and not incumbent_y[j]]
    return ranked[:k] + extra[:k_single]


def add_segment_cuts(m, inst: Instance, s: float, ops: list[int]) -> None:
    """Add, for each op j in ``ops``, cuts on the single-core time R = T - sum_i LA_i y_i that
    see where j's single-core run can lie (model with binaries ``m.y``, makespan ``m.T``, time
    scaled by ``s``).

    The mode cuts let every single-core op hide beside a long single-core op j (a weight-gradient
    leaf, incomparable to most of the graph). But j's run is one interval and no intra-op op
    overlaps it: if ops a < b both overlap j's run, every op x between them (a < x < b) runs
    inside it, so x is single-core. With v_i in [0, 1] for "i overlaps j's run" (i incomparable
    to j; v_i <= 1 - y_i, v_i <= 1 - y_j), b_x >= v of x or any ancestor, a_x >= v of x or any
    descendant, and v_x >= b_p + a_c - 1 for every predecessor p and successor c of x (x of
    positive intra-op latency; an intra-op x with LA_x = 0 could sit inside at a point), the
    single-core time of op i outside j's run is at least o_i = L1_i (1 - y_i - v_i) (L1_i (1 - y_i)
    for ops comparable to j). Those runs are disjoint from j's, so
        R >= L1_j (1 - y_j) + (sum of o_i over ops using type c) / n_c   for each core type c,
        R >= L1_j (1 - y_j) + (sum of o_i along any path)                 (a longest path P).
    v continuous is a relaxation of the 0/1 overlap indicator (same bound on the benchmark,
    a third of the solve time)."""
    import pyomo.environ as pyo  # deferred: pyomo is heavy (light commands never solve)

    n = inst.n
    l1 = [v * s for v in inst.l1]
    alone = sum(inst.la[i] * s * m.y[i] for i in range(n))
    m.seg_cuts = pyo.ConstraintList()
    m.seg = pyo.Block(range(len(ops)))
    for k, j in enumerate(ops):
        b = m.seg[k]
        rel = inst.ancestors[j] | inst.descendants[j] | (1 << j)
        inc = [i for i in range(n) if not (rel >> i) & 1 and inst.l1[i] > 0]
        incs = set(inc)
        b.v = pyo.Var(inc, bounds=(0.0, 1.0))
        b.bef = pyo.Var(inc, bounds=(0.0, 1.0))
        b.aft = pyo.Var(inc, bounds=(0.0, 1.0))
        b.P = pyo.Var(range(n), bounds=(0.0, None))
        cut = m.seg_cuts.add
        for i in inc:
            cut(b.v[i] <= 1 - m.y[i])
            cut(b.v[i] <= 1 - m.y[j])
            cut(b.bef[i] >= b.v[i])
            cut(b.aft[i] >= b.v[i])
        for p, c in inst.reduced_edges:
            if p in incs and c in incs:
                cut(b.bef[c] >= b.bef[p])
                cut(b.aft[p] >= b.aft[c])
        for x in inc:
            if inst.la[x] <= 0:
                continue
            for p in inst.preds[x]:
                if p in incs:
                    for c in inst.succs[x]:
                        if c in incs:
                            cut(b.v[x] >= b.bef[p] + b.aft[c] - 1)

        def outside(i, b=b, incs=incs, j=j):
            if i == j:
                return 0.0
            if i in incs:
                return l1[i] * (1 - m.y[i] - b.v[i])
            return l1[i] * (1 - m.y[i])

        own = l1[j] * (1 - m.y[j])
        for c in ("tc", "vc"):
            mem = [i for i in range(n) if inst.uses(i, c)]
            if mem:
                cut(m.T - alone >= own + sum(outside(i) for i in mem) / inst.n_cores(c))
        for p, c in inst.reduced_edges:
            cut(b.P[c] >= b.P[p] + outside(p))
        for i in range(n):
            if not inst.succs[i]:
                cut(m.T - alone >= own + b.P[i] + outside(i))


def mode_bound_model(
    inst: Instance,
    ub: float,
    lb: float,
    segment_k: int = _SEGMENT_OPS,
    incumbent_y: list[int] | None = None,
):
    """The mode-aware cuts alone, with the segment cuts of the ops of ``segment_ops`` (``k`` =
    ``segment_k``, the incumbent's modes ``incumbent_y``): binaries y, continuous S, G, T and the
    segment variables (time scaled by 1 / ``ub``). Its optimum (or SCIP's dual bound on it),
    times ``ub``, bounds the makespan of every schedule shorter than ``ub``: y is fixed to 1 where
    an op cannot run on one core below ``ub`` (``forced_intra``) and to 0 where intra-op is not
    faster."""
    import pyomo.environ as pyo  # deferred: pyomo is heavy (light commands never solve)

    s = 1.0 / ub
    m = pyo.ConcreteModel()
    m.y = pyo.Var(range(inst.n), domain=pyo.Binary)
    for i in range(inst.n):
        if inst.la[i] >= inst.l1[i]:
            m.y[i].fix(0)
    for i in forced_intra(inst, ub):
        m.y[i].fix(1)
    m.T = pyo.Var(bounds=(min(lb * s, 1.0), None))
    add_mode_cuts(m, inst, s)
    add_segment_cuts(m, inst, s, segment_ops(inst, segment_k, incumbent_y))
    m.obj = pyo.Objective(expr=m.T, sense=pyo.minimize)
    return m


def _set_warm(m, inst, warm: Schedule, s, z_types, pairs):
    n = inst.n
    for i in range(n):
        if not m.y[i].fixed:
            m.y[i].set_value(warm.y[i])
        m.t[i].set_value(warm.start[i] * s)
    ends = [warm.end(inst, i) for i in range(n)]
    for i, j in pairs:
        before_ij = ends[i] <= warm.start[j] + 1e-12 * (1 / s)
        before_ji = ends[j] <= warm.start[i] + 1e-12 * (1 / s)
        if before_ij and before_ji:  # zero-length op: pick one
            before_ji = False
        m.o[i, j].set_value(int(before_ij))
        m.o[j, i].set_value(int(before_ji))
    m.T.set_value(min(1.0, warm.makespan(inst) * s))
    if z_types:
        sched = warm if warm.cores is not None else assign_cores(inst, warm)
        for c in z_types:
            idx = 0 if c == "tc" else 1
            relabel: dict[int, int] = {}
            for r, i in enumerate(i for i in range(n) if inst.uses(i, c) and inst.l1[i] > 0):
                lab = None
                if not warm.y[i] and sched.cores[i][idx]:
                    core = sched.cores[i][idx][0]
                    lab = relabel.setdefault(core, len(relabel))
                for k in range(min(r + 1, inst.n_cores(c))):
                    m.z[c, i, k].set_value(int(k == lab))


# ---- one solve (runs in the worker) ---------------------------------------------------------
