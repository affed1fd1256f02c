"""Bounded work: ``time_limit_s`` bounds the whole solve of an instance, the list search stops at
its deadline or work allowance, and a core count far above the op count costs no memory."""

from __future__ import annotations

import json
import random
import time
import tracemalloc

import pytest

from phaze.cli import main
from phaze.schedule.budget import Deadline
from phaze.schedule.instance import make_instance
from phaze.schedule.listsched import assign_cores, best_list_schedule, verify
from phaze.schedule.solve import Options, Scheduler


def random_dag(n: int, seed: int, n_tc: int = 4, n_vc: int = 4):
    """n ops, each with up to 3 predecessors among the 20 before it: wide enough that the list
    search's flips and the ILP's ordering pairs (~38 k at n = 300) are far beyond 2 s of work."""
    rng = random.Random(seed)
    edges = []
    for b in range(1, n):
        for a in rng.sample(range(max(0, b - 20), b), min(b, rng.randint(0, 3))):
            edges.append((a, b))
    ops = []
    for i in range(n):
        l1 = rng.uniform(1, 10) * 1e-5
        ops.append(
            {
                "id": i,
                "core": rng.choice(["tc", "tc", "vc", "fused"]),
                "latency_1core_s": l1,
                "latency_allcores_s": l1 * rng.uniform(0.2, 1.0),
            }
        )
    return make_instance(n_tc, n_vc, ops, edges)


def test_time_limit_bounds_the_whole_solve():
    # before: the list scheduler's flip search alone ran 321 s on such a DAG under a 2 s limit
    inst = random_dag(300, seed=1)
    with Scheduler(Options(time_limit_s=2.0, decompose=False)) as sch:
        t0 = time.monotonic()
        r = sch.solve(inst)
        wall = time.monotonic() - t0
    assert wall < 3 * 2.0, wall  # a generous bound for a loaded 2-core machine
    assert r.status == "time_limit"
    assert verify(inst, r.schedule, 1e-12) == []
    assert r.lower_bound_s <= r.makespan_s


def test_list_search_stops_at_its_deadline_and_its_work_allowance():
    inst = random_dag(120, seed=2)
    t0 = time.monotonic()
    s = best_list_schedule(inst, deadline=Deadline(0.3))
    assert time.monotonic() - t0 < 3 * 0.3 + 0.5  # one SGS run of 120 ops is ~20 ms
    assert verify(inst, assign_cores(inst, s), 1e-12) == []
    # a work allowance binds at the same point on every machine: same schedule twice, and more
    # work never gives a longer one
    small = [best_list_schedule(inst, work=40 * inst.n) for _ in range(2)]
    assert small[0].start == small[1].start and small[0].y == small[1].y
    assert verify(inst, assign_cores(inst, small[0]), 1e-12) == []
    more = best_list_schedule(inst, work=400 * inst.n)
    assert more.makespan(inst) <= small[0].makespan(inst)
    # nothing fits: the sequential schedule (valid, one op at a time)
    none = best_list_schedule(inst, work=0)
    assert verify(inst, assign_cores(inst, none), 1e-12) == []
    assert none.makespan(inst) == pytest.approx(sum(inst.q))


def test_core_count_far_above_the_op_count_changes_nothing_and_costs_no_memory(tmp_path):
    base = random_dag(12, seed=3, n_tc=2, n_vc=2)
    ops = [
        {"id": base.ids[i], "core": base.core[i], "latency_1core_s": base.l1[i]}
        | {"latency_allcores_s": base.la[i]}
        for i in range(base.n)
    ]
    edges = [[base.ids[a], base.ids[b]] for a, b in base.edges]
    results = {}
    for n_c in (base.n, 10**9):
        inst = make_instance(n_c, n_c, ops, edges)
        tracemalloc.start()
        with Scheduler(Options(time_limit_s=30, mip_gap=0.0)) as sch:
            r = sch.solve(inst)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 50e6, peak  # before: ~130 MB/s, without end, in assign_cores
        results[n_c] = r
    a, b = results[base.n], results[10**9]
    assert (a.makespan_s, a.lower_bound_s, a.status) == (b.makespan_s, b.lower_bound_s, b.status)
    assert a.schedule.start == b.schedule.start and a.schedule.y == b.schedule.y
    # the --instance path too: the JSON reports every core busy under an intra-op op
    f = tmp_path / "big.json"
    obj = {"n_tc": 1e9, "n_vc": 1e9, "ops": ops, "edges": edges, "time_limit_s": 30, "mip_gap": 0}
    f.write_text(json.dumps(obj))
    out = tmp_path / "out.json"
    assert main(["schedule", "--instance", str(f), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["makespan_s"] == pytest.approx(a.makespan_s, rel=1e-6)
    intra_tc = any(s["intra_op"] and s["tc_cores"] for s in res["schedule"])
    assert intra_tc and res["peak_tc"] == 10**9  # all of them busy, none allocated


class _Spy:
    """Records the deadline (monotonic end) each solver step of a segment is handed; the worker
    is replaced by one that proves nothing and reports ``status``."""

    def __init__(self, monkeypatch, status="open", lns_sleep_s=0.0):
        import phaze.schedule.solve as solve_mod
        from phaze.schedule.ilp import IlpOutcome

        self.ends: dict[str, list[float]] = {}  # the deadline handed to each call of a step
        self.spans: dict[str, list[float]] = {}  # its seconds from the call
        self.fit_s: list = []

        def record(name, deadline):
            self.ends.setdefault(name, []).append(deadline.end)
            self.spans.setdefault(name, []).append(deadline.end - time.monotonic())

        bnb, lns, lists = (
            solve_mod.branch_and_bound,
            solve_mod.large_neighbourhood_search,
            solve_mod.best_list_schedule,
        )

        def spy_bnb(inst, sched, gap, deadline, work):
            record("bnb", deadline)
            return bnb(inst, sched, gap, deadline, work)

        def spy_lns(inst, sched, deadline, work):
            record("lns", deadline)
            time.sleep(lns_sleep_s)
            return lns(inst, sched, deadline, work)

        def spy_list(inst, **kw):
            record("list", kw["deadline"])
            return lists(inst, **kw)

        def spy_worker(_self, inst, warm, lb, time_limit_s, *args, **stages):
            self.ends.setdefault("worker", []).append(time.monotonic() + time_limit_s)
            self.fit_s.append(stages["fit_s"])
            return IlpOutcome(status, None, None, None, 0.0, (), 0.0)

        monkeypatch.setattr(solve_mod, "branch_and_bound", spy_bnb)
        monkeypatch.setattr(solve_mod, "large_neighbourhood_search", spy_lns)
        monkeypatch.setattr(solve_mod, "best_list_schedule", spy_list)
        monkeypatch.setattr(solve_mod.SolverWorker, "solve", spy_worker)


def test_work_bound_solves_give_every_step_the_whole_safety_net(monkeypatch):
    # with both node limits set, each step ends on its own work allowance: no step may get a
    # share of the clock, which on a slower or busier machine would bind before the node limits
    # and change the answer (the defect benchmarks/reproduce.py found)
    inst = random_dag(40, seed=5, n_tc=2, n_vc=2)
    spy = _Spy(monkeypatch)
    limit = 600.0
    t0 = time.monotonic()
    with Scheduler(Options(time_limit_s=limit, node_limit=50, bnb_node_limit=20000)) as sch:
        r = sch.solve(inst)
    assert {"list", "bnb", "lns", "worker"} <= set(spy.ends), spy.ends  # every step ran
    for step, ends in spy.ends.items():
        for end in ends:
            assert end >= t0 + limit - 30, (step, end - t0)  # the whole net, less time spent
    assert spy.fit_s and all(f == limit for f in spy.fit_s)  # the model test reads the config
    assert r.status in ("time_limit", "node_limit", "gap_limit", "optimal")


def test_clock_bound_solves_share_the_time_limit(monkeypatch):
    # the contrast: without node limits the clock is the only budget, and the steps share it
    inst = random_dag(40, seed=5, n_tc=2, n_vc=2)
    spy = _Spy(monkeypatch)
    limit = 2.0
    with Scheduler(Options(time_limit_s=limit, node_limit=0, bnb_node_limit=0)) as sch:
        sch.solve(inst)
    assert spy.spans["list"][0] <= 0.5 * limit + 1e-6  # half of the segment's time
    assert spy.spans["bnb"][0] <= 0.02 * limit + 1e-6  # the short probe's 2 %
    assert spy.spans["lns"][0] <= 0.4 * limit + 1e-6
    assert spy.fit_s and all(f is None for f in spy.fit_s)


def test_a_work_bound_solve_cut_by_the_safety_net_says_so(monkeypatch):
    # the clock cut the large-neighbourhood search short, then the (stub) solver reported its
    # node limit: the answer depends on the machine, and its status must say time_limit
    inst = random_dag(40, seed=5, n_tc=2, n_vc=2)
    spy = _Spy(monkeypatch, status="node_limit", lns_sleep_s=1.2)
    with Scheduler(Options(time_limit_s=1.0, node_limit=50, bnb_node_limit=20000)) as sch:
        r = sch.solve(inst)
    assert "lns" in spy.ends
    assert r.status == "time_limit"
    assert verify(inst, r.schedule, 1e-12) == []
