"""Per-layer makespan bounds of every architecture of a space at once (the search's space bound).

For one trace, each layer graph (signature, pass) as the scheduler sees it
(:func:`phaze.schedule.tables.load_op_graphs`: fused and no-op operators contracted) and the
operators' latencies of every architecture as arrays (architectures × operators,
:func:`phaze.estimate.stage.latency_arrays`):

* ``lower_bound_s`` — no schedule of the layer is shorter. The graph is cut at its articulation
  operators (:func:`phaze.schedule.solve.articulation_ops`: every other operator is an ancestor or
  a descendant of each, so the parts between them run one after another; the scheduler solves
  the same segments); an articulation operator takes at least its faster mode; a segment at least
  the larger of its critical path (every operator at its faster mode,
  :func:`phaze.schedule.bounds.critical_path`) and, per core type, its energy bound: each
  operator using that type needs ``min(L_all, L_1 / k)`` of the chip's time, with k the cores of
  that type that can run at once, at most the antichain width of the operators using it
  (:func:`phaze.schedule.bounds.core_limits`; the width is taken over all of them, zero-length
  or not, which can only make k larger and the bound weaker); and the exclusion and forced-mode
  energy bounds (:func:`phaze.schedule.bounds.exclusion_bound`, :func:`~phaze.schedule.bounds.
  forced_energy`, the latter capped by ``serial_s``) on critical-path heads and tails, which are
  never above the energy heads and tails the scheduler uses: the same bounds on weaker inputs.
* ``serial_s`` — the operators one after another, each at its faster mode: the makespan of a real
  schedule, so at least the optimal makespan (the search's DDP-overlap window bound).

Both are the scalar bounds of :mod:`phaze.schedule.bounds` written over an architecture axis
(tests/test_schedule_space.py checks them architecture by architecture).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.schedule import bounds
from phaze.schedule.instance import Instance
from phaze.schedule.solve import articulation_ops, segment_buckets
from phaze.schedule.tables import OpGraph, load_op_graphs


@dataclass(frozen=True)
class Segment:
    """Operators between two articulation operators: their indices in the layer graph, each
    one's predecessors inside the segment (local indices), and per core type the operators
    using it with the antichain width of that set."""

    members: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]
    uses: dict  # core type -> (local indices, antichain width)


@dataclass(frozen=True)
class LayerPlan:
    signature: str
    pass_: str
    columns: np.ndarray  # each graph operator's row in the ops table
    articulation: tuple[int, ...]
    segments: tuple[Segment, ...]


def _structure(graph: OpGraph) -> Instance:
    n = len(graph.ids)
    return Instance(1, 1, graph.core, (1.0,) * n, (1.0,) * n, graph.edges, tuple(graph.ids))


def _segments(inst: Instance) -> tuple[tuple[int, ...], list[list[int]]]:
    """The scheduler's decomposition (phaze.schedule.solve.Scheduler._solve_decomposed)."""
    arts = articulation_ops(inst)
    if not arts or len(arts) == inst.n:
        return (), [list(range(inst.n))]
    buckets = segment_buckets(inst, arts)
    return tuple(arts), [buckets[b] for b in sorted(buckets)]


def layer_plan(graph: OpGraph, row_of: dict[tuple[str, str, int], int]) -> LayerPlan:
    """The structure of one layer graph the bounds need (independent of latencies)."""
    inst = _structure(graph)
    arts, groups = _segments(inst)
    segments = []
    for members in groups:
        sub = inst.subinstance(members)
        uses = {}
        for c in ("tc", "vc"):
            mine = [k for k in range(sub.n) if sub.uses(k, c)]
            if mine:
                uses[c] = (tuple(mine), bounds.antichain_width(sub, mine))
        segments.append(Segment(tuple(members), sub.preds, uses))
    try:
        columns = np.array([row_of[(graph.signature, graph.pass_, i)] for i in graph.ids])
    except KeyError as exc:
        raise PhazeError(f"layer {graph.signature} {graph.pass_}: op {exc} not in ops") from None
    return LayerPlan(graph.signature, graph.pass_, columns, arts, tuple(segments))


def layer_plans(trace_dir: str | Path, ops: pd.DataFrame) -> list[LayerPlan]:
    """Every layer graph of a trace with the row of each operator in ``ops`` (the ops table the
    latency arrays were computed from, in its row order)."""
    row_of = {
        (s, p, int(o)): i
        for i, (s, p, o) in enumerate(zip(ops["signature"], ops["pass"], ops["op"]))
    }
    return [layer_plan(g, row_of) for g in load_op_graphs(trace_dir) if g.ids]


def layer_bounds(
    plan: LayerPlan, l1: np.ndarray, la: np.ndarray, n_tc: np.ndarray, n_vc: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(lower_bound_s, serial_s) of one layer for every architecture: ``l1`` / ``la`` are the
    (archs × ops) latency arrays, ``n_tc`` / ``n_vc`` the core counts per architecture."""
    L1, LA = l1[:, plan.columns], la[:, plan.columns]
    q = np.minimum(L1, LA)
    lower = q[:, list(plan.articulation)].sum(axis=1) if plan.articulation else 0.0
    cores = {"tc": np.asarray(n_tc, dtype=float), "vc": np.asarray(n_vc, dtype=float)}
    for seg in plan.segments:
        idx = list(seg.members)
        qs, l1, la = q[:, idx], L1[:, idx], LA[:, idx]
        head, tail = np.zeros_like(qs), np.zeros_like(qs)
        for j, preds in enumerate(seg.preds):
            for i in preds:
                np.maximum(head[:, j], head[:, i] + qs[:, i], out=head[:, j])
        for j in reversed(range(len(idx))):  # operators are in topological order
            for i in seg.preds[j]:
                np.maximum(tail[:, i], tail[:, j] + qs[:, j], out=tail[:, i])
        best = (head + qs).max(axis=1)
        weights = []  # per core type: each operator's least share of the chip's time
        for c, (mine, width) in seg.uses.items():
            k = np.minimum(cores[c], float(width))
            w = np.zeros_like(qs)
            w[:, list(mine)] = np.minimum(la[:, list(mine)], l1[:, list(mine)] / k[:, None])
            weights.append(w)
            np.maximum(best, w.sum(axis=1), out=best)  # the energy bound
        np.maximum(best, _exclusion(head, tail, l1, la, weights), out=best)
        np.maximum(best, _forced_energy(head, tail, l1, la, weights, qs.sum(axis=1)), out=best)
        lower = lower + best
    return np.asarray(lower, dtype=float) + np.zeros(len(q)), q.sum(axis=1)


def _exclusion(head, tail, l1, la, weights) -> np.ndarray:
    """`phaze.schedule.bounds.exclusion_bound` on critical-path heads and tails, for every
    architecture (rows): each operator on one core has nothing comparable beside it (head + L1
    + tail); intra-op, nothing at all (head + L_all + tail, and L_all + the others' energy)."""
    single = head + l1 + tail
    others = np.zeros_like(l1)
    for w in weights:
        np.maximum(others, w.sum(axis=1, keepdims=True) - w, out=others)
    intra = np.maximum(head + la + tail, la + others)
    return np.where(la < l1, np.minimum(single, intra), single).max(axis=1)


def _forced_energy(head, tail, l1, la, weights, ub) -> np.ndarray:
    """`phaze.schedule.bounds.forced_energy` on critical-path heads and tails with ``ub`` (a real
    schedule's makespan), for every architecture (rows). An operator whose single-core latency
    cannot fit below T (head + L1 + tail > T, intra-op faster) runs intra-op, alone, in every
    schedule shorter than T; g(T) = their L_all + the largest energy of the others per core type
    does not increase with T and the optimum has OPT >= g(OPT): the first threshold (the
    operators' head + L1 + tail values in (0, ub), then ub) at which g is at most the threshold
    gives the bound, at least the threshold before it, at most ub."""
    A = l1.shape[0]
    bp = np.where(la < l1, head + l1 + tail, 0.0)
    order = np.argsort(bp, axis=1, kind="stable")
    sbp = np.take_along_axis(bp, order, axis=1)

    def suffix(x):  # sums over the operators from each sorted position on
        s = np.take_along_axis(x, order, axis=1)
        return np.cumsum(s[:, ::-1], axis=1)[:, ::-1]

    def g(forced_la, forced_w):
        rest = np.zeros_like(forced_la)
        for w, fw in zip(weights, forced_w):
            np.maximum(rest, w.sum(axis=1, keepdims=True) - fw, out=rest)
        return forced_la + rest

    ubc = ub[:, None]
    # a threshold several operators reach is tried once per operator: past the first, the set
    # lacks the earlier ones, so g is no larger there and any answer found is that threshold,
    # as the scalar bound's next step would give
    valid = (sbp > 0.0) & (sbp < ubc)
    at_sorted = g(suffix(la), [suffix(w) for w in weights])
    forced = bp >= ubc
    at_ub = g(
        (la * forced).sum(axis=1, keepdims=True),
        [(w * forced).sum(axis=1, keepdims=True) for w in weights],
    )
    thr = np.concatenate([np.where(valid, sbp, np.inf), ubc], axis=1)
    val = np.concatenate([at_sorted, at_ub], axis=1)
    ok = np.concatenate([valid, np.ones((A, 1), dtype=bool)], axis=1) & (val <= thr)
    # the threshold before each: thresholds rise along the row, so a running maximum
    before = np.maximum.accumulate(np.where(np.isfinite(thr), thr, 0.0), axis=1)
    before = np.concatenate([np.zeros((A, 1)), before[:, :-1]], axis=1)
    j = ok.argmax(axis=1)
    rows = np.arange(A)
    got = np.minimum(np.maximum(before[rows, j], val[rows, j]), ub)
    return np.where(ok.any(axis=1), got, ub)


def attention_seconds(ops: pd.DataFrame, l1: np.ndarray, la: np.ndarray) -> dict[str, np.ndarray]:
    """{block signature: core attention's forward for every architecture}: its operators one
    after another, each at its faster mode (as :func:`phaze.place.chains.attention_seconds`)."""
    att = (ops["pass"] == "fwd").to_numpy() & ops["attention"].astype(bool).to_numpy()
    out = {}
    for sig in pd.unique(ops.loc[att, "signature"]):
        cols = np.flatnonzero(att & (ops["signature"] == sig).to_numpy())
        out[str(sig)] = np.minimum(l1[:, cols], la[:, cols]).sum(axis=1)
    return out
