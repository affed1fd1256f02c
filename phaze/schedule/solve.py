"""Solve one layer instance: exact decomposition, chain path, cache, list schedule, ILP.

Pipeline for an instance (each step measured to pay, see docs/schedule.md):

1. Decompose at *articulation ops* (ops comparable to every other op): everything else is
   entirely before or after them, so the layer splits into independent segments whose
   makespans add; articulation ops take their fastest mode.
2. A segment that is a chain (all ops comparable) or a single op needs no solver.
3. Otherwise: cheap lower bound (critical path, energy) and the best list schedule (upper bound).
   If they meet, the list schedule is optimal. The ``bounds`` tier stops here.
4. ``ilp`` tier, in the watchdog-guarded worker: the mode bound (``ilp.mode_bound_model``),
   then mode kicks on the list schedule (``listsched.kick_modes``), then the ILP warm-started
   from the best schedule so far (each step skipped once the gap is met); its answer is replayed as an earliest-start schedule and verified (a failure is a bug and
   raises); the result is the better of replay and list schedule, the lower bound the max of
   SCIP's dual bound and the cheap bounds.

Identical segments (same structure, core counts and latencies up to a common scale) are solved
once per ``Scheduler`` (one per job); the last solutions on the same structure seed the list
scheduler of the next architecture (a neighbouring architecture's schedule, re-timed).

Bounded work: ``time_limit_s`` is the wall-clock budget of one ``Scheduler.solve`` call (one layer
instance), shared by its segments and by every step inside them (``budget.Deadline``); a core
count above the number of ops is clamped to it first (extra cores can never be busy, and nothing
is allocated per core).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from phaze.config import from_section, schema_defaults
from phaze.errors import PhazeError
from phaze.schedule.bnb import BNB_UNLIMITED, branch_and_bound
from phaze.schedule.bounds import lower_bound
from phaze.schedule.budget import NO_DEADLINE, Deadline
from phaze.schedule.energetic import energetic_bound
from phaze.schedule.ilp import ilp_fits
from phaze.schedule.ilp_worker import SolverWorker
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import (
    KICKS,
    Schedule,
    assign_cores,
    best_list_schedule,
    priority_order,
    replay,
    verify,
)
from phaze.schedule.lns import large_neighbourhood_search
from phaze.schedule.split import Side, split_op, split_search

_DEFAULT = schema_defaults()["schedule"]

# The solver pipeline's shares of a segment's time left at each step (a step returns what it
# does not use): the energetic bound, a short branch and bound (at most _BNB_PROBE_NODES
# nodes), the worker's mode bound and kicks, the large-neighbourhood search, the branch and
# bound from the best schedule, the full ILP with the rest.
_ENERGETIC_SHARE = 0.25
# Trials of the energetic bound in a solve: the gap target only (up to energetic.PASSES passes).
# Bisection steps after it raised no solve's final bound on the measured blocks once the
# path-flow bound is among the cheap bounds (benchmarks/README.md), at 1-5 s each.
_ENERGETIC_TRIALS = 1
_BNB_PROBE_SHARE = 0.02
_BNB_PROBE_NODES = 5_000
_SOLVER_SHARE = 0.6
_LNS_SHARE = 0.4
_BNB_SHARE = 0.6

# Severity order used when segments with different statuses are combined.
_SEVERITY = {
    "chain": 0,
    "optimal": 1,
    "gap_limit": 2,
    "bounds": 3,
    "node_limit": 4,
    "time_limit": 4,
    "no_solution": 5,
    "watchdog": 6,
    "solver_died": 7,
}


@dataclass
class Options:
    """Solver settings; the defaults of the config keys are config/schema.yaml's (``schedule``)."""

    tier: str = "ilp"  # ilp | bounds (a CLI choice, not a config key)
    time_limit_s: float = _DEFAULT["time_limit_s"]  # wall-clock budget of one solve() call
    mip_gap: float = _DEFAULT["mip_gap"]  # the relative gap every solve stops at
    threads: int = _DEFAULT["threads"]
    cache: bool = _DEFAULT["cache"]
    watchdog_s: float = _DEFAULT["watchdog_s"]
    decompose: bool = _DEFAULT["decompose"]
    local_search: bool = True
    bnb: bool = True  # run bnb.py's branch and bound and lns.py's search (off: ablations)
    node_limit: int = _DEFAULT["node_limit"]  # SCIP branch-and-bound nodes per solve; 0 = none
    bnb_node_limit: int = _DEFAULT["bnb_node_limit"]  # nodes of bnb.py's search; 0 = none
    split_nodes: int = _DEFAULT["split_nodes"]  # nodes of split.py's search; 0 = no split
    energetic: bool = True  # the energetic bound (energetic.py) in the ilp tier (off: ablations)

    @property
    def work_bound(self) -> bool:
        """Both node limits set: every step of a solve ends on its own work allowance (nodes,
        op placements, kicks), and ``time_limit_s`` is only a safety net; without them the
        steps share the clock (docs/schedule.md, "Bounded work")."""
        return self.node_limit > 0 and self.bnb_node_limit > 0

    @classmethod
    def from_config(cls, schedule: dict, tier: str) -> Options:
        """From a validated config section ``schedule`` (phaze.config.load_config)."""
        return from_section(
            cls,
            schedule,
            given={"tier": tier},
            not_keys=("local_search", "bnb", "energetic"),
            convert=True,
        )


@dataclass
class Result:
    makespan_s: float
    lower_bound_s: float
    upper_bound_s: float  # best list schedule
    status: str
    method: str  # chain | list | bnb | ilp | split
    solve_s: float
    schedule: Schedule
    cache_hit: bool = False
    nodes: int = 0  # SCIP branch-and-bound nodes spent on it (all segments; 0 for a cache hit)
    lp_iterations: int = 0  # SCIP simplex iterations spent on it
    bnb_nodes: int = 0  # nodes of phaze's own branch and bound (bnb.py) spent on it
    energetic_passes: int = 0  # propagation passes of the energetic bound (energetic.py)

    @property
    def mip_gap(self) -> float:
        if self.makespan_s <= 0:
            return 0.0
        return max(0.0, (self.makespan_s - self.lower_bound_s) / self.makespan_s)


def segment_buckets(inst: Instance, arts) -> dict[int, list[int]]:
    """The ops between consecutive articulation ops `arts` (a segment each), keyed by the
    number of articulation ops before them; the segments run one after another."""
    artset = set(arts)
    buckets: dict[int, list[int]] = {}
    for i in range(inst.n):
        if i not in artset:
            b = sum(1 for a in arts if (inst.ancestors[i] >> a) & 1)
            buckets.setdefault(b, []).append(i)
    return buckets


def articulation_ops(inst: Instance) -> list[int]:
    full = (1 << inst.n) - 1
    return [
        i for i in range(inst.n) if (inst.ancestors[i] | inst.descendants[i] | (1 << i)) == full
    ]


def peak_cores(inst: Instance, sched: Schedule) -> tuple[int, int]:
    """Most tensor / vector cores busy at once (intra-op ops hold all cores of their type)."""
    peaks = []
    for c in ("tc", "vc"):
        ev = []
        for i in range(inst.n):
            d = sched.duration(inst, i)
            if d <= 0 or not inst.uses(i, c):
                continue
            k = inst.n_cores(c) if sched.y[i] else 1
            ev.append((sched.start[i] + d, -k))
            ev.append((sched.start[i], k))
        ev.sort()
        cur = peak = 0
        for _, dlt in ev:
            cur += dlt
            peak = max(peak, cur)
        peaks.append(peak)
    return peaks[0], peaks[1]


class Scheduler:
    """Solves instances; holds the per-job cache, neighbour seeds and the solver worker."""

    def __init__(self, opts: Options, prior: dict | None = None):
        """``prior``: solutions of earlier jobs (phaze.schedule.reuse.load_solutions, key ->
        (result, latency scale)), taken as cache hits; used only with ``opts.cache``."""
        if opts.tier not in ("ilp", "bounds"):
            raise PhazeError(f"--tier must be ilp or bounds, got {opts.tier!r}")
        self.opts = opts
        self.cache: dict[str, tuple[Result, float]] = {}  # key -> (result, latency scale)
        self.prior = prior or {}
        self.prior_hits = 0  # whole instances taken from ``prior``
        self.prior_segment_hits = 0
        self.seeds: dict[str, list[tuple[list[int], list[int]]]] = {}
        self.lookups = 0
        self.hits = 0
        self.segment_hits = 0
        self.ilp_solves = 0
        self._worker: SolverWorker | None = None
        self._deadline = NO_DEADLINE  # of the segment being solved
        self._splitting = False  # solving one side of a split (no split inside it)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- public entry point ---------------------------------------------------------------
    def solve(self, inst: Instance) -> Result:
        """Solve one layer instance within ``time_limit_s`` (whole-instance cache hits are
        counted in ``hits``). With core counts above the op count the instance is solved with
        them clamped (same schedules); the result's core ids are then those of the clamped
        instance, and ``peak_cores`` on the given instance still reports every core busy."""
        t0 = time.perf_counter()
        self._deadline = Deadline(self.opts.time_limit_s)
        res = self._cached(clamp_cores(inst), self._solve_whole, top=True)
        res.solve_s = time.perf_counter() - t0
        return res

    def _cached(self, inst: Instance, fn, top: bool) -> Result:
        if not self.opts.cache:
            return fn(inst)
        key, scale = inst.cache_key()
        key = ("top:" if top else "seg:") + key
        if top:
            self.lookups += 1
        hit = self.cache.get(key)
        if hit is not None:
            if top:
                self.hits += 1
            else:
                self.segment_hits += 1
            return _retime(inst, hit[0], scale / hit[1])
        hit = self.prior.get(key)
        if hit is not None:
            if top:
                self.prior_hits += 1
            else:
                self.prior_segment_hits += 1
            res = _retime(inst, hit[0], scale / hit[1])
        else:
            res = fn(inst)
        self.cache[key] = (res, scale)
        return res

    def _solve_whole(self, inst: Instance) -> Result:
        """One instance: decomposed at articulation ops (``decompose``) or as one segment."""
        if self.opts.decompose:
            return self._solve_decomposed(inst)
        return self._solve_segment(inst)

    # ---- decomposition --------------------------------------------------------------------
    def _solve_decomposed(self, inst: Instance) -> Result:
        arts = articulation_ops(inst)
        if len(arts) == inst.n or not arts:
            return self._solve_segment(inst)
        buckets = segment_buckets(inst, arts)
        start = [0.0] * inst.n
        y = [0] * inst.n
        t = 0.0
        lb = ub = 0.0
        nodes = iters = bnb_nodes = passes = 0
        statuses, methods = [], []
        whole = self._deadline
        for b in range(len(arts) + 1):
            if b in buckets:
                seg = buckets[b]
                sub = inst.subinstance(seg)
                # each segment left gets an equal share of the time left (chains and cache
                # hits take none, so later segments inherit it)
                self._deadline = self._share(whole, 1 / sum(1 for c in buckets if c >= b))
                r = self._cached(sub, self._solve_segment, top=False)
                self._deadline = whole
                for k, i in enumerate(seg):
                    start[i] = t + r.schedule.start[k]
                    y[i] = r.schedule.y[k]
                t += r.makespan_s
                lb += r.lower_bound_s
                ub += r.upper_bound_s
                nodes += r.nodes
                iters += r.lp_iterations
                bnb_nodes += r.bnb_nodes
                passes += r.energetic_passes
                statuses.append(r.status)
                methods.append(r.method)
            if b < len(arts):
                a = arts[b]
                y[a] = 1 if inst.la[a] < inst.l1[a] else 0
                start[a] = t
                d = inst.q[a]
                t += d
                lb += d
                ub += d
        # replaying the composed schedule gives exact, consistent times (never later: see replay)
        sched = assign_cores(inst, replay(inst, start, y))
        _check(inst, sched, t)
        t = sched.makespan(inst)
        status = max(statuses, key=_SEVERITY.__getitem__) if statuses else "chain"
        method = next((m for m in ("ilp", "split", "bnb", "list") if m in methods), "chain")
        return Result(
            t,
            min(lb, t),
            ub,
            status,
            method,
            0.0,
            sched,
            nodes=nodes,
            lp_iterations=iters,
            bnb_nodes=bnb_nodes,
            energetic_passes=passes,
        )

    # ---- one segment ----------------------------------------------------------------------
    def _solve_segment(self, inst: Instance) -> Result:
        if inst.n == 1 or inst.is_chain():
            y = [1 if inst.la[i] < inst.l1[i] else 0 for i in range(inst.n)]
            sched = assign_cores(inst, replay(inst, _chain_starts(inst, y), y))
            ms = sched.makespan(inst)
            return Result(ms, ms, ms, "chain", "chain", 0.0, sched)

        skey = _structure_key(inst)
        seeds = self.seeds.get(skey, [])
        deadline = self._deadline
        # the cheap tier skips the mode-flip local search (10x faster, same median gap); the
        # list search may take half the time left, the rest is the bounds' and the solver's
        best = best_list_schedule(
            inst,
            local_search=self.opts.local_search and self.opts.tier == "ilp",
            extra=seeds,
            deadline=self._share(deadline, 0.5),
        )
        ub = best.makespan(inst)
        lb, _which = lower_bound(inst, ub, deadline)
        best = assign_cores(inst, best)
        _check(inst, best, ub)
        if ub <= lb * (1 + 1e-9):
            return Result(ub, ub, ub, "optimal", "list", 0.0, best)
        if self.opts.tier == "bounds":
            return Result(ub, lb, ub, "bounds", "list", 0.0, best)
        passes = 0
        if self.opts.energetic and ub - lb > self.opts.mip_gap * ub:
            # the energetic bound (energetic.py): a fixed count of trials and passes; if the
            # safety net cuts it short it returns the bound it had proven, never more
            en = energetic_bound(
                inst,
                lb,
                ub,
                self.opts.mip_gap,
                steps=_ENERGETIC_TRIALS,
                deadline=self._share(deadline, _ENERGETIC_SHARE),
            )
            lb, passes = max(lb, en.bound_s), en.passes
            if ub <= lb * (1 + 1e-9):
                return Result(ub, ub, ub, "optimal", "list", 0.0, best, energetic_passes=passes)
        if ub - lb <= self.opts.mip_gap * ub:
            # the list schedule already meets the gap target: SCIP would stop at once
            return Result(ub, lb, ub, "gap_limit", "list", 0.0, best, energetic_passes=passes)
        # the solver pipeline: a short branch and bound, the mode bound and the mode kicks, the
        # large-neighbourhood search, the branch and bound from the best schedule, then the full
        # ILP (each skipped once the gap is proven)
        run = _Run(best, ub, lb, ub, self.opts.bnb_node_limit or BNB_UNLIMITED)
        if self.opts.bnb:
            self._bnb(inst, run, self._share(deadline, _BNB_PROBE_SHARE), _BNB_PROBE_NODES)
        if not self._proven(run):
            self._worker_stage(inst, run, self._share(deadline, _SOLVER_SHARE), full=False)
        if self.opts.bnb and not self._proven(run):
            self._lns(inst, run, self._share(deadline, _LNS_SHARE))
        if self.opts.bnb and not self._proven(run):
            self._bnb(inst, run, self._share(deadline, _BNB_SHARE), BNB_UNLIMITED)
        if not self._proven(run) and run.status not in _WORKER_LOST:
            self._worker_stage(inst, run, deadline, full=True)
        if self.opts.split_nodes > 0 and not self._splitting and not self._proven(run):
            self._split(inst, run)
        ms, lb = run.ub, run.lb
        if lb > ms * (1 + 1e-6):
            raise RuntimeError(
                f"lower bound {lb:.9g} s exceeds a valid schedule's makespan {ms:.9g} s: "
                "scheduling bug"
            )
        lb = min(lb, ms)
        status = run.status
        if ms - lb <= 1e-6 * ms:  # proven up to SCIP's own numerical tolerances
            status = "optimal"
        elif self._proven(run):
            status = "gap_limit"
        if status != "optimal" and self.opts.work_bound and deadline.expired():
            # the safety net cut a step short: this answer depends on the machine's speed
            status = "time_limit"
        self._remember(skey, seeds, inst, run.best)
        return Result(
            ms,
            lb,
            run.list_ub,
            status,
            run.method,
            run.solve_s,
            run.best,
            nodes=run.nodes,
            lp_iterations=run.lp_iterations,
            bnb_nodes=run.bnb_nodes,
            energetic_passes=passes,
        )

    def _share(self, deadline: Deadline, fraction: float) -> Deadline:
        """A step's deadline: ``fraction`` of the time left, or (``work_bound``) the whole
        safety net, the step's own work allowance ending it."""
        return deadline if self.opts.work_bound else deadline.share(fraction)

    def _proven(self, run: _Run) -> bool:
        return run.ub - run.lb <= self.opts.mip_gap * run.ub

    def _bnb(self, inst: Instance, run: _Run, deadline: Deadline, nodes: int) -> None:
        """The branch and bound (bnb.py) from the best schedule so far, within ``deadline`` and
        ``nodes`` (and what is left of the solve's node limit)."""
        work = min(nodes, run.bnb_left)
        if work <= 0:
            return
        found = branch_and_bound(inst, run.best, self.opts.mip_gap, deadline, work)
        run.bnb_nodes += found.nodes
        run.bnb_left -= found.nodes
        if found.schedule is not None:
            run.improve(inst, assign_cores(inst, found.schedule), "bnb")
        if found.complete:
            run.lb = max(run.lb, min(found.lower_bound_s, run.ub))

    def _split(self, inst: Instance, run: _Run) -> None:
        """The split at an op that runs alone in every schedule shorter than the best one
        (split.py): each side solved by this pipeline (without a split of its own), at most
        ``split_nodes`` side pairs; raises the bound, and a leaf's schedule may be shorter."""
        j = split_op(inst, run.ub)
        if j is None:
            return

        def solve_side(members: list[int]) -> Side:
            r = self._cached(clamp_cores(inst.subinstance(members)), self._solve_whole, top=False)
            run.nodes += r.nodes
            run.lp_iterations += r.lp_iterations
            run.bnb_nodes += r.bnb_nodes
            return Side.of(r)

        self._splitting = True
        try:
            out = split_search(
                inst, j, solve_side, run.ub * (1 - self.opts.mip_gap), self.opts.split_nodes
            )
        finally:
            self._splitting = False
        # j runs alone only in schedules shorter than run.ub: the bound holds up to it
        run.lb = max(run.lb, min(out.lower_bound_s, run.ub))
        if out.start is not None:
            run.improve(inst, assign_cores(inst, replay(inst, out.start, out.y)), "split")

    def _lns(self, inst: Instance, run: _Run, deadline: Deadline) -> None:
        """Shorten the best schedule by re-solving windows of it (lns.py)."""
        if run.bnb_left <= 0:
            return
        sched, spent = large_neighbourhood_search(inst, run.best, deadline, run.bnb_left)
        run.bnb_nodes += spent
        run.bnb_left -= spent
        if sched is not run.best:  # (it returns the schedule it was given if nothing is shorter)
            run.improve(inst, assign_cores(inst, sched), "bnb")

    def _worker_stage(self, inst: Instance, run: _Run, deadline: Deadline, full: bool) -> None:
        """One call of the solver worker: the mode bound and the mode kicks (``full`` False), or
        the full ILP warm-started from the best schedule so far (``full`` True)."""
        remaining = deadline.remaining()
        # work-bound: the test reads the configured limit, not the clock, so it decides the same
        # on every machine
        fit_s = self.opts.time_limit_s if self.opts.work_bound else None
        if not ilp_fits(inst, remaining if fit_s is None else fit_s):
            # not even the model would be built and handed to SCIP in the time left
            return
        if self._worker is None:
            self._worker = SolverWorker()
        self.ilp_solves += 1
        stages = {"mode_bound": not full, "kicks": 0 if full else KICKS, "full": full}
        stages["fit_s"] = fit_s
        out = self._worker.solve(
            inst,
            run.best,
            run.lb,
            remaining,
            self.opts.mip_gap,
            self.opts.threads,
            self.opts.watchdog_s,
            self.opts.node_limit,
            **stages,
        )
        run.lb = max(run.lb, out.bound_s)
        run.nodes += out.nodes
        run.lp_iterations += out.lp_iterations
        run.solve_s += out.solve_s
        if out.status != "open":
            run.status = out.status
        if out.start is None:
            return
        ub = run.ub
        rep = assign_cores(inst, replay(inst, out.start, out.y))
        rms = rep.makespan(inst)
        tol = 1e-6 * ub * (inst.n + 1)
        if rms > out.objective_s + tol and not _feasible_within(inst, out.start, out.y, tol):
            raise RuntimeError(
                f"replayed ILP schedule ({rms:.9g} s) is longer than the solver's "
                f"makespan ({out.objective_s:.9g} s): scheduling bug"
            )
        # (an answer feasible only within the solver's tolerances that no replay order recovers
        # still replays to a valid schedule; it is kept only if it is shorter)
        run.improve(inst, rep, out.method)

    def _remember(self, skey: str, seeds: list, inst: Instance, sched: Schedule) -> None:
        """Keep a solution as a seed for the next architecture with the same structure."""
        order = priority_order(inst, [-t for t in sched.start])
        self.seeds[skey] = ([(order, list(sched.y))] + seeds)[:3]


# Worker outcomes after which the pipeline does not call the worker again for the segment (a
# fresh worker pays the Pyomo import; the watchdog already spent the time).
_WORKER_LOST = ("watchdog", "solver_died")


@dataclass
class _Run:
    """The state of one segment's solver pipeline: the best schedule and the bounds so far."""

    best: Schedule
    ub: float
    lb: float
    list_ub: float
    bnb_left: int  # nodes left of the branch and bound's limit
    method: str = "list"
    status: str = "time_limit"  # if no stage proves the gap
    solve_s: float = 0.0  # time inside the solver worker
    nodes: int = 0
    lp_iterations: int = 0
    bnb_nodes: int = 0

    def improve(self, inst: Instance, sched: Schedule, method: str) -> None:
        ms = sched.makespan(inst)
        _check(inst, sched, ms)
        if ms < self.ub:
            self.best, self.ub, self.method = sched, ms, method


def clamp_cores(inst: Instance) -> Instance:
    """The instance with n_tc, n_vc capped at its op count: at most n ops are ever busy, and an
    op's intra-op latency is an input, so every schedule (and makespan) stays the same."""
    if inst.n_tc <= inst.n and inst.n_vc <= inst.n:
        return inst
    return Instance(
        min(inst.n_tc, inst.n),
        min(inst.n_vc, inst.n),
        inst.core,
        inst.l1,
        inst.la,
        inst.edges,
        inst.ids,
    )


def _chain_starts(inst: Instance, y: list[int]) -> list[float]:
    start, t = [0.0] * inst.n, 0.0
    for i in range(inst.n):  # indices are topological, and a chain has one topological order
        start[i] = t
        t += inst.la[i] if y[i] else inst.l1[i]
    return start


def _structure_key(inst: Instance) -> str:
    h = hashlib.sha256()
    h.update(f"{inst.n_tc},{inst.n_vc};{','.join(inst.core)};{inst.edges!r}".encode())
    return h.hexdigest()


def _feasible_within(inst: Instance, start, y, tol: float) -> bool:
    """Whether a solver answer is a valid schedule up to ``tol`` seconds (precedence, one op per
    core, intra-op ops alone): what tells the solver's numerical tolerance from a model bug."""
    return not verify(inst, Schedule(list(start), list(y)), tol)


def _check(inst: Instance, sched: Schedule, makespan: float) -> None:
    bad = verify(inst, sched, tol=1e-9 * max(makespan, 1e-300))
    if bad:
        raise RuntimeError(f"invalid schedule produced (bug): {bad[:3]}")


def _retime(inst: Instance, res: Result, f: float) -> Result:
    """A cached result for an instance equal up to scale ``f`` (and rounding): replay its
    schedule on this instance's exact latencies, so the answer is a valid schedule here."""
    s = res.schedule
    sched = assign_cores(inst, replay(inst, [t * f for t in s.start], list(s.y)))
    ms = sched.makespan(inst)
    _check(inst, sched, ms)
    return Result(
        ms,
        min(res.lower_bound_s * f, ms),
        res.upper_bound_s * f,
        res.status,
        res.method,
        0.0,
        sched,
        cache_hit=True,
    )
