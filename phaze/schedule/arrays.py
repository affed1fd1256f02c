"""Per-layer makespans of a block of architectures at once: a feasible schedule of every
(architecture, layer, pass) and a proven lower bound, in numpy arrays (the array tier).

The layer graph is the same for every architecture; only the operators' latencies (archs ×
operators, :func:`phaze.estimate.stage.latency_arrays`) and the core counts differ. So:

* **achieved** — a serial schedule-generation scheme without insertion, run for every
  architecture of the block together (:func:`sgs`): per architecture and core type an array of
  core free times (padded with +inf where an architecture has fewer cores); operators in a
  precedence-feasible priority order, each one at the latest of its predecessors' ends and
  either the earliest free core of each type it needs (one core) or every core's free time
  (intra-op, alone on the chip). Each run is a concrete schedule (:func:`schedule_of` rebuilds
  one architecture's start times, modes and core ids; tests check them with the independent
  :func:`phaze.schedule.listsched.verify`). Several priority rules × mode rules are run
  (:data:`RUNS`) and the shortest kept per architecture.
* **lower bound** — the space bound's per-layer bound (:func:`phaze.schedule.space.layer_bounds`:
  articulation segments, critical path, energy with antichain widths, exclusion, forced-mode
  energy), its exclusion and forced-mode energy bounds also on the scheduler's energy heads and
  tails (:func:`phaze.schedule.bounds.energy_heads_tails`, larger than critical-path ones): the
  scalar bounds of :mod:`phaze.schedule.bounds` written over an architecture axis
  (:func:`layer_lower`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from phaze.schedule import bounds
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import Schedule
from phaze.schedule.space import LayerPlan, Segment, _exclusion, _forced_energy, layer_bounds
from phaze.schedule.tables import OpGraph

#: (priority rule, mode rule) of each SGS run. Priority rules (each key is nondecreasing along
#: every edge, ties broken by the topological index, so the sorted order is precedence-feasible):
#: ``tail`` the longest path from the operator to the end first (critical path first), ``head``
#: the earliest start first, ``desc`` the most descendants first, ``first`` at every step the
#: operator that can start first given the cores' free times, ties critical path first (the
#: parallel scheme's choice, made inside the serial one). Mode rules: ``slack`` only operators
#: on a path within 5 % of the critical one at their faster mode (listsched's slack rule),
#: ``single`` every operator on one core, ``adaptive`` the mode that finishes first when the
#: operator is placed (the multi-mode rule of :func:`phaze.schedule.listsched.adaptive_sgs`;
#: ``adaptive0.02``: intra-op only if it ends more than 2 % earlier, listsched's bias). The runs
#: kept are those that alone gave the shortest schedule of some layer of bert-large or llama2-7b
#: on random architectures of the paper grid; each operator at its faster mode, the -2 % bias
#: and the other combinations never did (or by at most 0.5 %).
RUNS = (
    ("first", "adaptive"),
    ("first", "adaptive0.02"),
    ("first", "slack"),
    ("first", "single"),
    ("head", "adaptive"),
    ("head", "adaptive0.02"),
    ("desc", "adaptive"),
    ("desc", "adaptive0.02"),
    ("tail", "adaptive0.02"),
)
#: the slack threshold of the ``slack`` mode rule (one of listsched's `initial_modes` values)
SLACK = 0.05


@dataclass(frozen=True)
class LayerArrays:
    """A layer graph's structure as index arrays: predecessors and successors padded with
    ``n`` (a column that is always 0), the core types each operator holds, descendant counts,
    and per core type the antichain width of its operators (no schedule runs more of them at
    once, so no more cores are kept)."""

    plan: LayerPlan
    n: int
    preds: np.ndarray  # (n, P) int
    succs: np.ndarray  # (n, S) int
    uses_tc: np.ndarray  # (n,) bool
    uses_vc: np.ndarray  # (n,) bool
    ndesc: np.ndarray  # (n,) float
    width_tc: int
    width_vc: int
    instance: Instance  # the structure (unit latencies, one core of each type)


def _padded(lists, n: int) -> np.ndarray:
    width = max((len(x) for x in lists), default=0) or 1
    out = np.full((len(lists), width), n, dtype=np.int64)
    for i, x in enumerate(lists):
        out[i, : len(x)] = x
    return out


def layer_arrays(graph: OpGraph, plan: LayerPlan) -> LayerArrays:
    """The arrays of one layer graph (``plan``: its :func:`phaze.schedule.space.layer_plan`)."""
    n = len(graph.ids)
    inst = Instance(1, 1, graph.core, (1.0,) * n, (1.0,) * n, graph.edges, tuple(graph.ids))
    widths = {}
    for c in ("tc", "vc"):
        mine = [i for i in range(n) if inst.uses(i, c)]
        widths[c] = max(1, bounds.antichain_width(inst, mine)) if mine else 1
    return LayerArrays(
        plan,
        n,
        _padded(inst.preds, n),
        _padded(inst.succs, n),
        np.array([inst.uses(i, "tc") for i in range(n)], dtype=bool),
        np.array([inst.uses(i, "vc") for i in range(n)], dtype=bool),
        np.array([float(d.bit_count()) for d in inst.descendants]),
        widths["tc"],
        widths["vc"],
        inst,
    )


def _heads(lay: LayerArrays, dur: np.ndarray) -> np.ndarray:
    A = dur.shape[0]
    h = np.zeros((A, lay.n + 1))
    ext = np.concatenate([dur, np.zeros((A, 1))], axis=1)
    for j in range(lay.n):
        p = lay.preds[j]
        h[:, j] = (h[:, p] + ext[:, p]).max(axis=1)
    return h[:, : lay.n]


def _tails(lay: LayerArrays, dur: np.ndarray) -> np.ndarray:
    """Longest path from each operator's start to the end (the operator included)."""
    A = dur.shape[0]
    t = np.zeros((A, lay.n + 1))
    for i in reversed(range(lay.n)):
        t[:, i] = dur[:, i] + t[:, lay.succs[i]].max(axis=1)
    return t[:, : lay.n]


def _order(key: np.ndarray) -> np.ndarray:
    """Operators by ascending ``key`` per architecture, ties by topological index (stable)."""
    return np.argsort(key, axis=1, kind="stable")


def _modes(lay: LayerArrays, l1: np.ndarray, la: np.ndarray, rule: str) -> np.ndarray | None:
    fast = la < l1
    if rule.startswith("adaptive"):
        return None
    if rule == "single":
        return np.zeros_like(fast)
    theta = float(rule[len("slack") :] or SLACK)
    q = np.minimum(l1, la)
    path = _heads(lay, q) + _tails(lay, q)
    cp = path.max(axis=1, keepdims=True)
    return fast & (cp - path <= theta * cp)


def _rank(order: np.ndarray) -> np.ndarray:
    """Each operator's position in ``order`` (archs × n)."""
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None, :], axis=1)
    return rank


def _priority(lay: LayerArrays, dur: np.ndarray, rule: str) -> np.ndarray:
    if rule == "tail":
        return _order(-_tails(lay, dur))
    if rule == "head":
        return _order(_heads(lay, dur))
    return _order(np.broadcast_to(-lay.ndesc, dur.shape))


def _take_core(free, core, sel, rows, op, s, f) -> None:
    """Operators ``op`` on one core of a type for the architectures ``sel``: each takes the free
    core (``free``: per architecture its cores' free times) that became free last at or before
    its start ``s``, busy until ``f``; ``core`` (None: not recorded) keeps the id taken."""
    if not sel.any():
        return
    c = np.where(free <= s[:, None], free, -np.inf).argmax(axis=1)
    free[rows[sel], c[sel]] = f[sel]
    if core is not None:
        core[rows[sel], op[sel]] = c[sel]


def sgs(
    lay: LayerArrays,
    l1: np.ndarray,
    la: np.ndarray,
    n_tc: np.ndarray,
    n_vc: np.ndarray,
    order: np.ndarray | None,
    y: np.ndarray | None,
    record: bool = False,
    bias: float = 0.0,
    rank: np.ndarray | None = None,
):
    """One serial SGS run for every architecture (rows): ``l1`` / ``la`` (archs × n) the layer's
    latencies, ``order`` (archs × n) a precedence-feasible order per architecture (None: at
    each step the unplaced operator whose predecessors are all placed that can start first,
    ties to the lowest ``rank`` (archs × n) — the parallel scheme's choice in a serial one),
    ``y`` the intra-op flags (None: each operator's mode chosen as it is placed, the one that
    ends first).
    Returns the makespans, and with ``record`` also (start, intra-op flag, tc core, vc core) per
    (architecture, operator) (core -1: none; an intra-op operator holds every core of its types).

    Why it is feasible: an operator starts no earlier than its predecessors' ends; a one-core
    operator takes a core whose free time is at most its start and moves that time to its end,
    so the operators of one core never overlap; an intra-op operator starts at the latest free
    time of every core (no placed operator runs after it) and moves every core's free time to
    its end (no operator placed later starts before it ends)."""
    A, n = l1.shape
    rows = np.arange(A)
    ct = max(1, min(lay.width_tc, int(np.max(n_tc))))
    cv = max(1, min(lay.width_vc, int(np.max(n_vc))))
    free_tc = np.where(np.arange(ct)[None, :] < np.asarray(n_tc)[:, None], 0.0, np.inf)
    free_vc = np.where(np.arange(cv)[None, :] < np.asarray(n_vc)[:, None], 0.0, np.inf)
    end = np.zeros((A, n + 1))
    horizon = np.zeros(A)
    if record:
        start = np.zeros((A, n))
        intra_of = np.zeros((A, n), dtype=bool)
        core_tc = np.full((A, n), -1, dtype=np.int64)
        core_vc = np.full((A, n), -1, dtype=np.int64)
    if order is None:  # the operator that can start first (ties: lowest rank) at every step
        succ = np.zeros((n, n), dtype=bool)
        for i in range(n):
            succ[i, lay.succs[i][lay.succs[i] < n]] = True
        left = np.broadcast_to(np.array([np.sum(p < n) for p in lay.preds]), (A, n)).copy()
        ready = np.zeros((A, n))
        done = np.zeros((A, n), dtype=bool)
    for k in range(n):
        if order is None:
            mt, mv = free_tc.min(axis=1)[:, None], free_vc.min(axis=1)[:, None]
            c1 = np.maximum(
                ready, np.maximum(np.where(lay.uses_tc, mt, 0.0), np.where(lay.uses_vc, mv, 0.0))
            )
            ca = np.maximum(ready, horizon[:, None])
            cand = (
                np.where((ca + la) * (1 + bias) < c1 + l1, ca, c1)
                if y is None
                else np.where(y, ca, c1)
            )
            cand = np.where(done | (left > 0), np.inf, cand)
            first = cand <= cand.min(axis=1, keepdims=True)
            op = np.where(first, rank, n).argmin(axis=1)
        else:
            op = order[:, k]
        est = end[rows[:, None], lay.preds[op]].max(axis=1)
        ut, uv = lay.uses_tc[op], lay.uses_vc[op]
        s1 = np.maximum(
            est,
            np.maximum(
                np.where(ut, free_tc.min(axis=1), 0.0), np.where(uv, free_vc.min(axis=1), 0.0)
            ),
        )
        p1, pa = l1[rows, op], la[rows, op]
        sa = np.maximum(est, horizon)
        intra = ((sa + pa) * (1 + bias) < s1 + p1) if y is None else y[rows, op]
        p = np.where(intra, pa, p1)
        s = np.where(intra, sa, s1)
        busy = p > 0.0
        s = np.where(busy, s, est)
        f = s + p
        one = busy & ~intra
        _take_core(free_tc, core_tc if record else None, one & ut, rows, op, s, f)
        _take_core(free_vc, core_vc if record else None, one & uv, rows, op, s, f)
        sel = busy & intra
        if sel.any():
            free_tc[sel] = np.maximum(free_tc[sel], f[sel, None])
            free_vc[sel] = np.maximum(free_vc[sel], f[sel, None])
        horizon = np.where(busy, np.maximum(horizon, f), horizon)
        end[rows, op] = f
        if order is None:
            done[rows, op] = True
            hit = succ[op]
            left -= hit
            ready = np.where(hit, np.maximum(ready, f[:, None]), ready)
        if record:
            start[rows, op] = s
            intra_of[rows, op] = intra
    makespan = end[:, :n].max(axis=1) if n else np.zeros(A)
    if record:
        return makespan, (start, intra_of, core_tc, core_vc)
    return makespan


def _run(lay, l1, la, n_tc, n_vc, prio: str, mode: str, record: bool = False):
    """One run of :data:`RUNS` (tests check each run's schedules)."""
    y = _modes(lay, l1, la, mode)
    dur = np.minimum(l1, la) if y is None else np.where(y, la, l1)
    bias = float(mode[len("adaptive") :] or 0.0) if y is None else 0.0
    if prio == "first":
        rank = _rank(_priority(lay, dur, "tail"))
        return sgs(lay, l1, la, n_tc, n_vc, None, y, record, bias, rank)
    return sgs(lay, l1, la, n_tc, n_vc, _priority(lay, dur, prio), y, record, bias)


def _justify(lay, l1, la, n_tc, n_vc, intra, end, record: bool = False):
    """Double justification (listsched's `justify`) of schedules with intra-op flags ``intra``
    and operator ends ``end`` (archs × n): an SGS on the reversed graph in order of latest end
    (ties: later index first), then the forward SGS in order of the reversed schedule's latest
    end (ties: topological index). Both orders are precedence-feasible: an operator never ends
    after a successor does."""
    idx = np.broadcast_to(np.arange(lay.n), end.shape)
    rev = replace(lay, preds=lay.succs, succs=lay.preds)
    back = np.lexsort((-idx, -end), axis=-1)
    _, (rstart, _, _, _) = sgs(rev, l1, la, n_tc, n_vc, back, intra, record=True)
    rend = rstart + np.where(intra, la, l1)
    fwd = np.lexsort((idx, -rend), axis=-1)
    return sgs(lay, l1, la, n_tc, n_vc, fwd, intra, record)


def achieved(lay: LayerArrays, l1: np.ndarray, la: np.ndarray, n_tc: np.ndarray, n_vc: np.ndarray):
    """(makespan, (start, intra-op flag, tc core, vc core)) per architecture: the shortest of
    the runs of :data:`RUNS`, then the best double-justified where shorter. ``l1`` / ``la``:
    (archs × n) latencies of this layer's operators. Each row depends on its own architecture
    only. (A pass flipping each operator's mode on the best order, where the interval is open,
    gained 0.1 % at the 90th percentile of bert-large's layers for twice the cost on
    llama2-7b's: not run.)"""
    A = l1.shape[0]
    best = np.full(A, np.inf)
    rec = [np.zeros(l1.shape), np.zeros(l1.shape, dtype=bool)]
    rec += [np.full(l1.shape, -1, dtype=np.int64) for _ in range(2)]

    def keep(ms, got):
        better = ms < best
        best[better] = ms[better]
        for r, g in zip(rec, got):
            r[better] = g[better]

    for prio, mode in RUNS:
        keep(*_run(lay, l1, la, n_tc, n_vc, prio, mode, record=True))
    end = rec[0] + np.where(rec[1], la, l1)
    keep(*_justify(lay, l1, la, n_tc, n_vc, rec[1], end, True))
    return best, tuple(rec)


def schedule_of(
    lay: LayerArrays, l1: np.ndarray, la: np.ndarray, n_tc: int, n_vc: int
) -> tuple[Instance, Schedule]:
    """One architecture's achieved schedule (its start times, modes and core ids, as
    :func:`achieved` finds it) and its instance: what :func:`phaze.schedule.listsched.verify`
    checks. ``l1`` / ``la``: (n,)."""
    _, (start, intra, ctc, cvc) = achieved(
        lay, l1[None, :], la[None, :], np.array([n_tc]), np.array([n_vc])
    )
    return _schedule(lay, l1, la, n_tc, n_vc, start[0], intra[0], ctc[0], cvc[0])


def _schedule(lay, l1, la, n_tc, n_vc, start, intra, ctc, cvc) -> tuple[Instance, Schedule]:
    """An instance and a schedule with core ids from one row of an SGS record."""
    inst = Instance(
        int(n_tc),
        int(n_vc),
        lay.instance.core,
        tuple(float(x) for x in l1),
        tuple(float(x) for x in la),
        lay.instance.edges,
        lay.instance.ids,
    )
    cores = []
    for i in range(lay.n):
        if intra[i]:
            cores.append(
                (
                    tuple(range(int(n_tc))) if lay.uses_tc[i] else (),
                    tuple(range(int(n_vc))) if lay.uses_vc[i] else (),
                )
            )
        else:
            cores.append(
                (
                    (int(ctc[i]),) if ctc[i] >= 0 else (),
                    (int(cvc[i]),) if cvc[i] >= 0 else (),
                )
            )
    return inst, Schedule([float(x) for x in start], [int(x) for x in intra], cores)


def _energy_heads(seg: Segment, qs: np.ndarray, weights: list, reverse: bool) -> np.ndarray:
    """:func:`phaze.schedule.bounds.energy_heads_tails` of one segment for every architecture
    (rows): an operator starts no earlier than the energy of its ancestors, nor than
    r_j + q_j + the energy of the operators between j and it, for every ancestor j (the energy of
    a set: the largest over core types of its operators' least core-time). ``reverse``: tails
    (the same on the reversed graph)."""
    m = len(seg.members)
    anc = [0] * m
    for j in range(m):
        for i in seg.preds[j]:
            anc[j] |= anc[i] | (1 << i)
    desc = [0] * m
    for j in reversed(range(m)):
        for i in seg.preds[j]:
            desc[i] |= desc[j] | (1 << j)
    before, after = (desc, anc) if reverse else (anc, desc)
    order = list(reversed(range(m))) if reverse else list(range(m))
    bits = lambda x: [k for k in range(m) if (x >> k) & 1]
    # every set the bound sums over, as columns of one 0/1 matrix: each op's `before` set, then
    # the ops between each (j, i) pair
    sets, where = [], {}
    for i in order:
        where[(i, None)] = len(sets)
        sets.append(before[i])
        for j in bits(before[i]):
            where[(i, j)] = len(sets)
            sets.append(after[j] & before[i])
    M = np.zeros((m, len(sets)))
    for c, x in enumerate(sets):
        M[bits(x), c] = 1.0
    E = np.max([w @ M for w in weights], axis=0) if weights else np.zeros((len(qs), len(sets)))
    r = np.zeros_like(qs)
    for i in order:
        v = E[:, where[(i, None)]]
        for j in bits(before[i]):
            v = np.maximum(v, r[:, j] + qs[:, j] + E[:, where[(i, j)]])
        r[:, i] = v
    return r


def layer_lower(plan: LayerPlan, l1_all, la_all, n_tc, n_vc) -> np.ndarray:
    """The space bound's per-layer lower bound (:func:`phaze.schedule.space.layer_bounds`) with
    the exclusion and forced-mode energy bounds on energy heads and tails (never below the
    critical-path heads and tails, so never below the space bound), for every architecture."""
    space_lower, serial = layer_bounds(plan, l1_all, la_all, n_tc, n_vc)
    L1, LA = l1_all[:, plan.columns], la_all[:, plan.columns]
    q = np.minimum(L1, LA)
    lower = q[:, list(plan.articulation)].sum(axis=1) if plan.articulation else np.zeros(len(q))
    cores = {"tc": np.asarray(n_tc, dtype=float), "vc": np.asarray(n_vc, dtype=float)}
    for seg in plan.segments:
        idx = list(seg.members)
        qs, l1, la = q[:, idx], L1[:, idx], LA[:, idx]
        weights = []
        for c, (mine, width) in seg.uses.items():
            k = np.minimum(cores[c], float(width))
            w = np.zeros_like(qs)
            w[:, list(mine)] = np.minimum(la[:, list(mine)], l1[:, list(mine)] / k[:, None])
            weights.append(w)
        head = _energy_heads(seg, qs, weights, False)
        tail = _energy_heads(seg, qs, weights, True)
        best = (head + qs).max(axis=1)
        for w in weights:
            np.maximum(best, w.sum(axis=1), out=best)
        np.maximum(best, _exclusion(head, tail, l1, la, weights), out=best)
        np.maximum(best, _forced_energy(head, tail, l1, la, weights, qs.sum(axis=1)), out=best)
        lower = lower + best
    return np.maximum(lower, space_lower), serial


def layer_values(
    lay: LayerArrays,
    l1_all: np.ndarray,
    la_all: np.ndarray,
    n_tc: np.ndarray,
    n_vc: np.ndarray,
) -> dict[str, np.ndarray]:
    """The array tier's values of one layer for every architecture: ``makespan_s`` (a feasible
    schedule's: :func:`schedule_of` rebuilds it) and ``lower_bound_s`` (proven).
    ``l1_all`` / ``la_all``: the (archs × ops) latency arrays of the whole ops table."""
    cols = lay.plan.columns
    l1, la = l1_all[:, cols], la_all[:, cols]
    lower, serial = layer_lower(lay.plan, l1_all, la_all, n_tc, n_vc)
    ms, _ = achieved(lay, l1, la, n_tc, n_vc)
    return {"makespan_s": ms, "lower_bound_s": lower, "serial_s": serial}
