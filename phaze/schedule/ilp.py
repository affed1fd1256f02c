"""The operator-scheduling ILP (upstream Phaze's formulation, strengthened), solved by SCIP through
Pyomo's ``scip_direct`` in a worker process guarded by a wall-clock watchdog.

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

import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from phaze.errors import PhazeError
from phaze.schedule.bounds import (
    _bits,
    antichain_width,
    core_limits,
    forced_intra,
    heads,
    lower_bound,
    tails,
)
from phaze.schedule.budget import Deadline
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import KICKS, Schedule, assign_cores, kick_modes

_EPS = 1e-9


@dataclass
class IlpOutcome:
    status: str  # optimal | gap_limit | time_limit | no_solution | watchdog
    start: list[float] | None
    y: list[int] | None
    objective_s: float | None  # solver's T, seconds
    bound_s: float  # proven lower bound, seconds (0 if none)
    z_types: tuple[str, ...]  # core types that needed explicit core assignment
    solve_s: float
    nodes: int = 0  # SCIP branch-and-bound nodes, all solves of this call
    lp_iterations: int = 0  # SCIP simplex iterations, all solves of this call
    method: str = "ilp"  # list: the returned schedule is the (kicked) warm start, not SCIP's


# ---- model ---------------------------------------------------------------------------------
def build_model(inst: Instance, ub: float, lb: float, z_types=(), warm: Schedule | None = None):
    import pyomo.environ as pyo

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
    import pyomo.environ as pyo

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
    import pyomo.environ as pyo

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
    import pyomo.environ as pyo

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
def _oversubscribed(inst: Instance, start, y, tol) -> list[str]:
    """Core types whose concurrent single-core ops exceed their core count at solver times."""
    out = []
    for c in ("tc", "vc"):
        n_c = inst.n_cores(c)
        ev = []
        for i in range(inst.n):
            if y[i] or not inst.uses(i, c):
                continue
            d = inst.l1[i]
            if d <= 2 * tol:
                continue
            ev.append((start[i] + tol, 1))
            ev.append((start[i] + d - tol, -1))
        ev.sort(key=lambda e: (e[0], e[1]))
        cur = peak = 0
        for _, dlt in ev:
            cur += dlt
            peak = max(peak, cur)
        if peak > n_c:
            out.append(c)
    return out


# Building the Pyomo model and handing it to SCIP (which presolves before it looks at its clock)
# costs about this much per ordering pair; measured here on random DAGs of 100-300 ops (3.6 k-38 k
# pairs): 0.3 ms per pair for build + hand-over + a 0.5 s-limited solve, 2-core machine under load.
_S_PER_PAIR = 3e-4


def ilp_fits(inst: Instance, remaining_s: float) -> bool:
    """Whether the model can plausibly be built and handed to SCIP within half the time left."""
    return len(inst.incomparable_pairs) * _S_PER_PAIR <= 0.5 * remaining_s


_SCIP_STATUS = {
    "optimal": "optimal",
    "gaplimit": "gap_limit",
    "timelimit": "time_limit",
    "totalnodelimit": "node_limit",
    "nodelimit": "node_limit",
}

# Share of the time left that the mode-aware bound MIP may take before the full model (measured
# on the schedule benchmark: it proves optimality of its own small model in 0.1-1 s on blocks of
# <= 33 ops and 1-5 s on the 69-71-op ones).
_MODE_BOUND_SHARE = 0.3

# Share of the time left after the mode bound that the mode kicks (``kick_modes``) may take; they
# usually stop on their kick count first (0.5-2.5 CPU-s on the 69-71-op blocks). Measured on the
# default run's ILP tier (2 s limit, 96 rows): shares of 0.5 (mode bound) and 0.3 (kicks) took
# time the full model needed, 6 rows above 1 % against 4 before; 0.3 and 0.2 gave 4.
_KICK_SHARE = 0.2

# Share of its time limit the mode bound may take in a call that stops after the kicks (the
# scheduler runs its branch and bound between that call and the full model; see solve.py).
_MODE_BOUND_SHARE_ALONE = 0.6


def _scip(m, time_limit, gap, threads, node_limit, seed, warm: bool, work=None):
    """Solve a Pyomo model with SCIP (scip_direct): (results, SCIP's status string); adds the
    nodes and LP iterations spent to ``work`` ([nodes, iterations]) if given."""
    work = work if work is not None else [0, 0]
    from pyomo.contrib.solver.solvers.scip.scip_direct import ScipDirect

    opt = ScipDirect()
    res = opt.solve(
        m,
        time_limit=max(time_limit, 0.01),
        rel_gap=gap,
        threads=threads,
        warmstart_discrete_vars=warm,
        load_solutions=False,
        raise_exception_on_nonoptimal_result=False,
        solver_options={
            "randomization/randomseedshift": seed,
            "display/verblevel": 0,
            # a node limit (0 = none) stops SCIP at the same point on every
            # machine; a wall-clock limit does not (reproducible artifacts)
            **({"limits/totalnodes": int(node_limit)} if node_limit else {}),
        },
    )
    sm = opt._solver_model
    work[0] += sm.getNTotalNodes()
    work[1] += sm.getNLPIterations()
    return res, sm.getStatus()


def _dual_bound(res, ub: float) -> float:
    b = res.objective_bound
    return b * ub if b is not None and b > -1e300 else 0.0


def solve_once(
    inst: Instance,
    warm: Schedule,
    lb: float,
    time_limit_s: float,
    gap: float,
    threads: int,
    node_limit: int = 0,
    seed: int = 0,
    end: float | None = None,
    mode_bound: bool = True,
    kicks: int = KICKS,
    full: bool = True,
) -> IlpOutcome:
    """One ILP solve within ``time_limit_s`` (and before the monotonic time ``end``, if given:
    the caller's deadline, which also covers the worker's start-up). First (``mode_bound``) the
    mode-aware bound MIP: if it proves the warm start within ``gap``, the full model is skipped
    (status gap_limit / optimal, the warm start returned as the solution). If not, ``kicks``
    mode kicks (``kick_modes``) try to shorten the warm start, which is again returned if it is
    then within ``gap`` of the bound; else (``full``) the full model starts from it. Without
    ``full`` the call ends after the kicks: status ``open``, the (kicked) warm start returned
    with the bound, and the mode bound and the kicks split the whole time limit (60 / 40 %)."""
    import pyomo.environ as pyo

    t0 = time.perf_counter()
    stop = time.monotonic() + time_limit_s
    if end is not None:
        stop = min(stop, end)
    ub = warm.makespan(inst)
    z_types = eager_z_types(inst)
    bound = 0.0
    status = "no_solution"
    work = [0, 0]  # SCIP nodes, LP iterations

    def proven():
        return ub - max(bound, lb) <= gap * ub

    def warm_outcome():
        done = "optimal" if ub - max(bound, lb) <= 1e-9 * ub else "gap_limit"
        return IlpOutcome(
            done,
            list(warm.start),
            list(warm.y),
            ub,
            max(bound, lb),
            (),
            time.perf_counter() - t0,
            *work,
            method="list",
        )

    if mode_bound and ilp_fits(inst, stop - time.monotonic()):
        share = _MODE_BOUND_SHARE if full else _MODE_BOUND_SHARE_ALONE
        budget = share * (stop - time.monotonic())
        res, _st = _scip(
            mode_bound_model(inst, ub, lb, incumbent_y=warm.y),
            budget,
            0.0,
            threads,
            node_limit,
            seed,
            False,
            work,
        )
        bound = min(_dual_bound(res, ub), ub)
        if proven():
            return warm_outcome()
        lb = max(lb, bound)
    if kicks:
        kick_deadline = Deadline.at(stop).share(_KICK_SHARE) if full else Deadline.at(stop)
        kicked = kick_modes(inst, warm, kicks, seed, kick_deadline)
        if kicked.makespan(inst) < ub:
            warm, ub = kicked, kicked.makespan(inst)
            # a shorter upper bound forces more ops intra-op in the cheap bounds
            lb = max(lb, lower_bound(inst, ub, Deadline.at(stop))[0])
            if proven():
                return warm_outcome()
    if not full:
        out = warm_outcome()
        out.status = "open"
        return out
    while True:
        if not ilp_fits(inst, stop - time.monotonic()):
            status = "time_limit"
            break
        tb = time.monotonic()
        m = build_model(inst, ub, lb, z_types, warm)
        # the hand-over to SCIP costs about as much as the build and is not interruptible
        remaining = stop - time.monotonic() - (time.monotonic() - tb)
        if remaining <= 0.01:
            status = "time_limit"
            break
        res, scip_status = _scip(m, remaining, gap, threads, node_limit, seed, True, work)
        bound = max(bound, _dual_bound(res, ub))
        if res.incumbent_objective is None:
            status = "no_solution" if scip_status != "timelimit" else "time_limit"
            break
        res.solution_loader.load_vars()
        start = [pyo.value(m.t[i]) * ub for i in range(inst.n)]
        y = [round(pyo.value(m.y[i])) for i in range(inst.n)]
        exact = set(z_types) | set(two_core_types(inst))
        over = [c for c in _oversubscribed(inst, start, y, 1e-6 * ub) if c not in exact]
        if over:
            z_types = tuple(sorted(set(z_types) | set(over)))
            status = "time_limit"  # if the loop runs out of time before a valid answer
            continue
        status = _SCIP_STATUS.get(scip_status, scip_status)
        return IlpOutcome(
            status,
            start,
            y,
            res.incumbent_objective * ub,
            bound,
            z_types,
            time.perf_counter() - t0,
            *work,
        )
    return IlpOutcome(status, None, None, None, bound, z_types, time.perf_counter() - t0, *work)


# ---- worker process + watchdog ---------------------------------------------------------------
def _worker_main(read_fd: int, write_fd: int) -> None:
    from multiprocessing.connection import Connection

    import pyomo.environ  # noqa: F401  (pay the import once per worker)
    from pyomo.contrib.solver.solvers.scip.scip_direct import ScipDirect  # noqa: F401

    rx = Connection(read_fd, writable=False)
    tx = Connection(write_fd, readable=False)
    while True:
        try:
            task = rx.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            *args, stages, end = task
            tx.send(("ok", solve_once(*args, end=end, **stages)))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises
            tx.send(("error", traceback.format_exc()))


class SolverWorker:
    """A long-lived solver process (Pyomo imported once), talking over two private pipes. A solve
    that outlives its wall-clock budget kills the process (SCIP was seen to hang at 0 % CPU); the
    next solve starts a new one. A plain subprocess (not multiprocessing) so that neither the
    caller's ``__main__`` nor its threads are inherited."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._tx = self._rx = None
        self.restarts = 0

    def _ensure(self):
        if self._proc is not None and self._proc.poll() is None:
            return
        from multiprocessing.connection import Connection

        c_read, p_write = os.pipe()
        p_read, c_write = os.pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from phaze.schedule.ilp import _worker_main; _worker_main({c_read}, {c_write})",
            ],
            pass_fds=(c_read, c_write),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None,
        )
        os.close(c_read)
        os.close(c_write)
        self._tx = Connection(p_write, readable=False)
        self._rx = Connection(p_read, writable=False)

    def solve(
        self,
        inst: Instance,
        warm: Schedule,
        lb: float,
        time_limit_s: float,
        gap: float,
        threads: int,
        watchdog_s: float,
        node_limit: int = 0,
        **stages,
    ) -> IlpOutcome:
        """``solve_once`` in the worker; ``stages`` are its ``mode_bound``, ``kicks``, ``full``."""
        self._ensure()
        t0 = time.perf_counter()
        end = time.monotonic() + time_limit_s  # the worker's clock (CLOCK_MONOTONIC) is ours
        try:
            self._tx.send((inst, warm, lb, time_limit_s, gap, threads, node_limit, 0, stages, end))
            # SCIP stops itself at time_limit_s; the watchdog allows watchdog_s more (model
            # building, the worker's first imports) before it declares the solve hung
            if self._rx.poll(time_limit_s + watchdog_s):
                kind, payload = self._rx.recv()
                if kind == "ok":
                    return payload
                raise PhazeError(f"ILP solve failed inside the solver worker:\n{payload}")
            status = "watchdog"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            status = "solver_died"
        self.kill()
        self.restarts += 1
        return IlpOutcome(status, None, None, None, 0.0, (), time.perf_counter() - t0)

    def kill(self):
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)
        for c in (self._tx, self._rx):
            if c is not None:
                c.close()
        self._proc = self._tx = self._rx = None

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._tx.send(None)
                self._proc.wait(5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
