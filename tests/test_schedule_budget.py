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
