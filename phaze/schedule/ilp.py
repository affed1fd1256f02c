"""The operator-scheduling ILP's solve driver: one solve of an instance (`solve_once`) — the
mode-aware bound MIP, the mode kicks, then the full model of phaze/schedule/ilp_model.py with
core assignment added lazily per over-subscribed core type — by SCIP through Pyomo's
``scip_direct``. phaze/schedule/ilp_worker.py runs it in a worker process under a watchdog.

The dual bound of a model without some core assignment is still a valid lower bound (it is a
relaxation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from phaze.schedule.bounds import lower_bound
from phaze.schedule.budget import Deadline
from phaze.schedule.ilp_model import (
    build_model,
    eager_z_types,
    mode_bound_model,
    two_core_types,
)
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import KICKS, Schedule, kick_modes


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


def _scip(m, time_limit, mip_gap, threads, node_limit, seed, warm: bool, work=None):
    """Solve a Pyomo model with SCIP (scip_direct): (results, SCIP's status string); adds the
    nodes and LP iterations spent to ``work`` ([nodes, iterations]) if given."""
    work = work if work is not None else [0, 0]
    from pyomo.contrib.solver.solvers.scip.scip_direct import ScipDirect  # deferred: heavy

    opt = ScipDirect()
    res = opt.solve(
        m,
        time_limit=max(time_limit, 0.01),
        rel_gap=mip_gap,
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
    mip_gap: float,
    threads: int,
    node_limit: int = 0,
    seed: int = 0,
    end: float | None = None,
    mode_bound: bool = True,
    kicks: int = KICKS,
    full: bool = True,
    fit_s: float | None = None,
) -> IlpOutcome:
    """One ILP solve within ``time_limit_s`` (and before the monotonic time ``end``, if given:
    the caller's deadline, which also covers the worker's start-up). First (``mode_bound``) the
    mode-aware bound MIP: if it proves the warm start within ``mip_gap``, the full model is skipped
    (status gap_limit / optimal, the warm start returned as the solution). If not, ``kicks``
    mode kicks (``kick_modes``) try to shorten the warm start, which is again returned if it is
    then within ``mip_gap`` of the bound; else (``full``) the full model starts from it. Without
    ``full`` the call ends after the kicks: status ``open``, the (kicked) warm start returned
    with the bound, and the mode bound and the kicks split the whole time limit (60 / 40 %).

    ``fit_s`` (a work-bound solve, solve.py ``Options.work_bound``): no step takes a share of the
    clock, each ends on its node limit or kick count, and whether the model is built at all is
    decided against ``fit_s`` seconds (the configured limit), not the time left; the clock
    (``time_limit_s``, ``end``) is only a safety net."""
    import pyomo.environ as pyo  # deferred: pyomo is heavy (light commands never solve)

    t0 = time.perf_counter()
    stop = time.monotonic() + time_limit_s
    if end is not None:
        stop = min(stop, end)
    ub = warm.makespan(inst)
    z_types = eager_z_types(inst)
    bound = 0.0
    status = "no_solution"
    work = [0, 0]  # SCIP nodes, LP iterations

    def time_left():
        return stop - time.monotonic() if fit_s is None else fit_s

    def proven():
        return ub - max(bound, lb) <= mip_gap * ub

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

    if mode_bound and ilp_fits(inst, time_left()):
        share = _MODE_BOUND_SHARE if full else _MODE_BOUND_SHARE_ALONE
        budget = (share if fit_s is None else 1.0) * (stop - time.monotonic())
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
        shared = full and fit_s is None
        kick_deadline = Deadline.at(stop).share(_KICK_SHARE) if shared else Deadline.at(stop)
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
        if not ilp_fits(inst, time_left()):
            status = "time_limit"
            break
        tb = time.monotonic()
        m = build_model(inst, ub, lb, z_types, warm)
        # the hand-over to SCIP costs about as much as the build and is not interruptible
        remaining = stop - time.monotonic() - (time.monotonic() - tb)
        if remaining <= 0.01:
            status = "time_limit"
            break
        res, scip_status = _scip(m, remaining, mip_gap, threads, node_limit, seed, True, work)
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
