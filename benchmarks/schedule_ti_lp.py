"""Measure a time-indexed LP lower bound on schedule instances (an experiment; not used by the
solver: on the benchmark's hard backward blocks it was weaker than the bound the solver already
proves, and each LP took seconds to minutes: benchmarks/README.md, Schedule).

Grid of width delta = UB / periods; every duration, head and tail rounded DOWN to whole periods.
A schedule of makespan T maps (start s -> floor(s / delta)) to a discrete schedule that keeps
precedence (floor(a + b) >= floor(a) + floor(b)), ends by floor(T / delta), and whose ops active in
period t all run at the instant just before t + 1 in the real schedule (so the per-period
capacities hold; an intra-op op takes all cores of both types). The feasibility LP at horizon h
(cumulative start variables X_{j,mode,t}, disaggregated precedence, per-period capacity with a
penalised overload) is infeasible => OPT >= (h + 1) delta; infeasibility is certified by a
weak-duality bound computed from SCIP's (SoPlex's) row duals over the [0, 1] column boxes, valid
whatever the LP solver's tolerances or time limit. Binary search over h.

    .venv/bin/python benchmarks/schedule_ti_lp.py INSTANCE.json --ub US --lb US [--periods 150]
        [--round floor|nearest] [--lp-time-limit-s 60]

``--round nearest`` is NOT a valid bound: it estimates the value the LP approaches as the grid
is refined (floor rounding is below it, ceiling rounding above).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phaze.schedule.bounds import core_limits, energy_heads_tails
from phaze.schedule.instance import Instance
from phaze.schedule.tables import instance_from_json


def _floor(v: float) -> int:
    # floor(v), with v = p / delta: valid for durations inflated by at most 1e-9 relative
    return max(0, math.floor(v * (1 + 1e-9)))


def build_feas(inst: Instance, delta: float, h: int, k=None, r=None, d=None, rnd=None):
    """Feasibility LP at horizon h periods: every op ends by h; min total overload."""
    n = inst.n
    if k is None:
        k = core_limits(inst)
    if r is None or d is None:
        r, d = energy_heads_tails(inst, k)
    cap = {c: k[c] for c in ("tc", "vc")}
    modes = []
    for j in range(n):
        ms = []
        cands = [(0, inst.l1[j])]
        if inst.la[j] < inst.l1[j]:
            cands.append((1, inst.la[j]))
        e = _floor(r[j] / delta)
        dj = _floor(d[j] / delta)
        for m, p in cands:
            pp = (rnd or _floor)(p / delta)
            late = h - pp - dj
            if late >= e:
                ms.append((m, pp, e, late))
        if not ms:
            return None
        modes.append(ms)
    col_lo, col_e, col_l = {}, {}, {}
    ncol = 0
    for j in range(n):
        for m, pp, e, late in modes[j]:
            col_lo[j, m] = ncol
            col_e[j, m] = e
            col_l[j, m] = late
            ncol += late - e + 1

    def cum(j, m, t):
        e = col_e[j, m]
        if t < e:
            return None
        return col_lo[j, m] + (min(t, col_l[j, m]) - e)

    rows, lhs, rhs = [], [], []
    inf = 1e20

    def add(entries, lo, hi):
        rows.append(entries)
        lhs.append(lo)
        rhs.append(hi)

    for j in range(n):
        add([(col_lo[j, m] + col_l[j, m] - col_e[j, m], 1.0) for m, *_ in modes[j]], 1.0, 1.0)
    for j in range(n):
        for m, pp, e, late in modes[j]:
            base = col_lo[j, m]
            for t in range(1, late - e + 1):
                add([(base + t, 1.0), (base + t - 1, -1.0)], 0.0, inf)
    for a, b in inst.reduced_edges:
        lo_t = min(col_e[b, m] for m, *_ in modes[b])
        hi_t = max(col_l[b, m] for m, *_ in modes[b])
        for t in range(lo_t, hi_t + 1):
            ent = {}
            for m, *_ in modes[b]:
                c = cum(b, m, t)
                if c is not None:
                    ent[c] = ent.get(c, 0.0) + 1.0
            if not ent:
                continue
            done = True
            for m, pp, e, late in modes[a]:
                c = cum(a, m, t - pp)
                if c is None or t - pp < late:
                    done = False
                if c is not None:
                    ent[c] = ent.get(c, 0.0) - 1.0
            if done:
                continue
            add([(c, v) for c, v in ent.items() if v != 0.0], -inf, 0.0)
    nslack = 0
    res_rows = []
    for c in ("tc", "vc"):
        for t in range(h):
            ent = {}
            for j in range(n):
                for m, pp, e, late in modes[j]:
                    if pp == 0:
                        continue
                    if m == 1:
                        a = cap[c]
                    elif inst.uses(j, c):
                        a = 1.0
                    else:
                        continue
                    if t < e or t - pp >= late:
                        continue
                    c1 = cum(j, m, t)
                    c0 = cum(j, m, t - pp)
                    if c1 is not None:
                        ent[c1] = ent.get(c1, 0.0) + a
                    if c0 is not None:
                        ent[c0] = ent.get(c0, 0.0) - a
            ent = [(q, v) for q, v in ent.items() if v != 0.0]
            if ent:
                res_rows.append(len(rows))
                ent.append((ncol + nslack, -1.0))
                nslack += 1
                add(ent, -inf, float(cap[c]))
    ntot = ncol + nslack
    obj = np.zeros(ntot)
    obj[ncol:] = 1.0
    ub = np.ones(ntot)
    ub[ncol:] = float(max(cap.values())) * 2 + 1  # overload never exceeds the column sum
    return {
        "ncol": ntot,
        "obj": obj,
        "lb": np.zeros(ntot),
        "ub": ub,
        "rows": rows,
        "lhs": np.array(lhs),
        "rhs": np.array(rhs),
        "hmax": 0.0,
    }


def safe_bound(mdl, y):
    """Weak-duality bound from any row duals y (box-bounded columns)."""
    lhs, rhs = mdl["lhs"], mdl["rhs"]
    y = np.asarray(y, dtype=float)
    fin_l = lhs > -1e19
    fin_r = rhs < 1e19
    yp = np.where(fin_l, np.maximum(y, 0.0), 0.0)
    yn = np.where(fin_r, np.minimum(y, 0.0), 0.0)
    yy = yp + yn
    val = float(np.dot(yp, np.where(fin_l, lhs, 0.0)) + np.dot(yn, np.where(fin_r, rhs, 0.0)))
    aty = np.zeros(mdl["ncol"])
    for i, ent in enumerate(mdl["rows"]):
        w = yy[i]
        if w != 0.0:
            for c, v in ent:
                aty[c] += v * w
    rc = mdl["obj"] - aty
    val += float(np.sum(np.where(rc < 0, rc * mdl["ub"], rc * mdl["lb"])))
    return val + mdl["hmax"]


def _solve(mdl, time_limit=1e9):
    from pyscipopt import LP
    from pyscipopt.scip import PY_SCIP_LPPARAM

    lp = LP(sense="minimize")
    lp.addCols([[] for _ in range(mdl["ncol"])], list(mdl["obj"]), list(mdl["lb"]), list(mdl["ub"]))
    lp.addRows(mdl["rows"], list(mdl["lhs"]), list(mdl["rhs"]))
    lp.setRealParam(PY_SCIP_LPPARAM.LPTILIM, max(0.05, time_limit))
    lp.solve(dual=True)
    return lp.getObjVal(), safe_bound(mdl, lp.getDual()), lp.getNIterations()


def destructive_bound(inst, lb, ub, periods, rnd=None, lp_time_limit=60.0, lo_frac=0.8):
    """(bound, whether the LP proved anything above lo_frac * lb, per-LP seconds)."""
    delta = ub / periods
    k = core_limits(inst)
    r, d = energy_heads_tails(inst, k)
    a, b = _floor(lo_frac * lb / delta), _floor(ub / delta * (1 + 1e-9))
    best, times = None, []
    while a < b:
        h = (a + b) // 2
        t0 = time.perf_counter()
        mdl = build_feas(inst, delta, h, k, r, d, rnd)
        infeasible = True if mdl is None else _solve(mdl, lp_time_limit)[1] > 1e-7
        times.append(time.perf_counter() - t0)
        if infeasible:
            best, a = (h + 1) * delta, h + 1
        else:
            b = h
    return (best if best is not None else lo_frac * lb), best is not None, times


def check_brute_force(mutate: bool, n: int = 60) -> int:
    """The bound against tests/test_schedule.py's brute force on random DAGs of <= 6 ops, on a grid
    (0.3e-5 s) that divides no latency; ``mutate`` rounds durations UP (must exceed the optimum).
    Returns the number of instances where the bound exceeds the optimum."""
    import random

    from tests.test_schedule import _bf, random_instance

    rng = random.Random(1)
    bad = 0
    for _ in range(n):
        inst = random_instance(rng, 6)
        opt = _bf(inst)
        periods = math.ceil(opt * 1.5 / 0.3e-5)
        rnd = (lambda v: math.ceil(v - 1e-9)) if mutate else None
        b, _, _ = destructive_bound(inst, 0.0, periods * 0.3e-5, periods, rnd, lo_frac=0.0)
        bad += b > opt * (1 + 1e-9)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    if sys.argv[1:2] == ["--check-brute-force"]:
        for mutate in (False, True):
            print(
                f"round {'up (mutation)' if mutate else 'down'}: bound > optimum on "
                f"{check_brute_force(mutate)} of 60 random DAGs"
            )
        return 0
    ap.add_argument("instance", type=Path)
    ap.add_argument("--ub", type=float, required=True, help="a schedule's makespan, us")
    ap.add_argument("--lb", type=float, required=True, help="a proven lower bound, us")
    ap.add_argument("--periods", type=int, default=150)
    ap.add_argument("--round", choices=["floor", "nearest"], default="floor")
    ap.add_argument("--lp-time-limit-s", type=float, default=60.0)
    args = ap.parse_args()
    inst = instance_from_json(json.loads(args.instance.read_text()))[0]
    rnd = (lambda v: math.floor(v + 0.5)) if args.round == "nearest" else None
    ub, lb = args.ub * 1e-6, args.lb * 1e-6
    t0 = time.perf_counter()
    b, proved, times = destructive_bound(inst, lb, ub, args.periods, rnd, args.lp_time_limit_s)
    print(
        f"{args.instance.name}: LP ({args.round}, {args.periods} periods) "
        f"{'' if proved else '< '}{b * 1e6:.2f} us, gap {(ub - b) / ub * 100:.2f} % "
        f"(given lb: {(ub - lb) / ub * 100:.2f} %); {len(times)} LPs, "
        f"{time.perf_counter() - t0:.1f} s, slowest {max(times, default=0):.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
