"""The branch and bound over schedules (phaze/schedule/bnb.py) against brute force and SCIP: the
optimum and the proven bound equal the optimum at gap 0, the bound never exceeds it at any gap,
every schedule found is valid, the limits stop it, and its dominance rules keep every optimum."""

from __future__ import annotations

import random

import pytest

from phaze.schedule.bnb import TINY, _dominates, branch_and_bound
from phaze.schedule.budget import Deadline
from phaze.schedule.ilp import solve_once
from phaze.schedule.instance import Instance, make_instance
from phaze.schedule.listsched import best_list_schedule, serial_sgs, verify
from tests.test_schedule import _bf, random_instance


def _serial(inst: Instance):
    """A deliberately poor incumbent: one op at a time, single-core."""
    return serial_sgs(inst, list(range(inst.n)), [0] * inst.n)


def _backward_like(rng: random.Random, n: int) -> Instance:
    """A chain with leaves hanging off it (the backward pass's shape): chain ops alternate tensor
    and vector work, leaves are long tensor-core ops; intra-op latency L1 / n_c (perfect scaling)
    or a bit more, some vector ops do not scale, a few ops take no time."""
    nc = rng.choice([2, 2, 3, 4])
    ops, edges, chain = [], [], []
    for i in range(n):
        leaf = chain and rng.random() < 0.4
        core = "tc" if leaf else rng.choice(["tc", "vc", "fused"])
        l1 = float(rng.randint(0, 9)) * nc
        la = rng.choice([l1 / nc, l1 / nc + 1, l1]) if core != "vc" else rng.choice([l1 / nc, l1])
        ops.append(
            {"id": i, "core": core, "latency_1core_s": l1 * 1e-6, "latency_allcores_s": la * 1e-6}
        )
        if leaf:
            edges.append([rng.choice(chain), i])
        else:
            if chain:
                edges.append([chain[-1], i])
            chain.append(i)
    return make_instance(nc, nc, ops, edges)


def _many_core(rng: random.Random, n: int) -> Instance:
    r = random_instance(rng, n_max=n)
    nc = rng.choice([3, 4])
    la = tuple(rng.choice([a / nc, a, 0.0, a / 2]) for a in r.l1)
    return Instance(nc, rng.choice([2, nc]), r.core, r.l1, la, r.edges, r.ids)


def _generators():
    return (random_instance, lambda rng: _backward_like(rng, 7), lambda rng: _many_core(rng, 7))


@pytest.mark.parametrize("which", range(3))
def test_optimum_and_bound_equal_brute_force(which):
    rng = random.Random(1000 + which)
    gen = _generators()[which]
    improved = 0
    for _ in range(40):
        inst = gen(rng)
        opt = _bf(inst)
        inc = _serial(inst)
        out = branch_and_bound(inst, inc, 0.0)
        assert out.complete
        best = out.schedule if out.schedule is not None else inc
        assert verify(inst, best, 1e-12) == []
        assert best.makespan(inst) == pytest.approx(opt, rel=1e-9), inst
        assert out.lower_bound_s == pytest.approx(opt, rel=1e-9), inst
        improved += out.schedule is not None
    assert improved >= 10  # it does search: the serial incumbent is beaten often


def test_bound_at_a_gap_is_valid_and_meets_the_target():
    rng = random.Random(77)
    for _ in range(60):
        inst = rng.choice(_generators())(rng)
        opt = _bf(inst)
        inc = best_list_schedule(inst)
        gap = rng.choice([0.01, 0.05, 0.2])
        out = branch_and_bound(inst, inc, gap)
        assert out.complete
        best = (out.schedule or inc).makespan(inst)
        assert out.lower_bound_s <= opt * (1 + 1e-9)
        assert best - out.lower_bound_s <= gap * best * (1 + 1e-9)


def test_equals_scip_on_larger_instances():
    # 9-11 ops: beyond brute force; SCIP's ILP at gap 0 is the reference
    rng = random.Random(5150)
    checked = 0
    while checked < 6:
        inst = _backward_like(rng, rng.randint(9, 11))
        if inst.is_chain():
            continue
        inc = _serial(inst)
        out = branch_and_bound(inst, inc, 0.0)
        assert out.complete
        scip = solve_once(inst, inc, 0.0, time_limit_s=60, mip_gap=0.0, threads=1, mode_bound=False)
        assert scip.status == "optimal"
        best = (out.schedule or inc).makespan(inst)
        assert best == pytest.approx(scip.objective_s, rel=1e-6), inst
        assert out.lower_bound_s == pytest.approx(scip.objective_s, rel=1e-6)
        checked += 1


def test_tiny_ops_keep_the_bound_valid_and_the_schedule_real():
    # ops far below TINY x makespan are searched as zero-latency ops; the schedule returned is
    # replayed with their real latencies and the bound stays below the optimum
    rng = random.Random(3)
    seen = 0
    for _ in range(40):
        r = _backward_like(rng, 7)
        ms = _serial(r).makespan(r)
        small = TINY * ms / 10
        l1 = tuple(small if k % 3 == 0 else v for k, v in enumerate(r.l1))
        la = tuple(small / 2 if k % 3 == 0 else v for k, v in enumerate(r.la))
        inst = Instance(r.n_tc, r.n_vc, r.core, l1, la, r.edges, r.ids)
        opt = _bf(inst)
        out = branch_and_bound(inst, _serial(inst), 0.0)
        assert out.complete
        assert out.lower_bound_s <= opt * (1 + 1e-9)
        assert out.lower_bound_s >= opt - inst.n * TINY * ms
        if out.schedule is not None:
            assert verify(inst, out.schedule, 1e-15) == []
            seen += 1
    assert seen >= 5


def test_the_found_schedule_is_the_best_one_and_never_worse_than_the_incumbent():
    rng = random.Random(11)
    for _ in range(30):
        inst = _backward_like(rng, 7)
        inc = best_list_schedule(inst)
        out = branch_and_bound(inst, inc, 0.0)
        if out.schedule is not None:
            assert out.schedule.makespan(inst) < inc.makespan(inst)


def test_limits_stop_it_and_the_node_limit_is_deterministic():
    rng = random.Random(2)
    inst = _backward_like(rng, 40)
    inc = _serial(inst)
    a = branch_and_bound(inst, inc, 0.0, work=500)
    b = branch_and_bound(inst, inc, 0.0, work=500)
    assert not a.complete and a.nodes == 500 and a.lower_bound_s == 0.0
    assert a.nodes == b.nodes
    assert (a.schedule is None) == (b.schedule is None)
    if a.schedule is not None:
        assert a.schedule.start == b.schedule.start and a.schedule.y == b.schedule.y
        assert verify(inst, a.schedule, 1e-12) == []
    # the deadline is checked every 256 nodes
    c = branch_and_bound(inst, inc, 0.0, Deadline(0.0))
    assert not c.complete and c.lower_bound_s == 0.0 and c.nodes == 256


def test_state_dominance():
    # A: op 3 runs until 5 (one core); B, same ops started, later, op 3 until 6: A dominates B
    assert _dominates(1.0, {3: (5.0, 0)}, 2.0, {3: (6.0, 0)})
    # ... not if op 3 runs intra-op in A (it blocks the chip), nor if it ends later in A
    assert not _dominates(1.0, {3: (5.0, 1)}, 2.0, {3: (6.0, 0)})
    assert not _dominates(1.0, {3: (7.0, 0)}, 2.0, {3: (6.0, 0)})
    # an op that has ended in A by B's time does not matter; one running in A but done in B does
    assert _dominates(1.0, {3: (1.5, 1)}, 2.0, {})
    assert not _dominates(1.0, {3: (2.5, 0)}, 2.0, {})
    # a later state never dominates an earlier one
    assert not _dominates(3.0, {}, 2.0, {})


def test_waiting_for_a_running_op_is_not_judged_by_its_own_ancestor():
    # A (4 on one core, no intra-op gain) and B (1) start at 0; C needs B and only pays off
    # intra-op (100 on one core, 1 intra-op), so the optimum waits from 1 to 4 with nothing new
    # started, then runs C: 5. The state at 4 has the same started ops as its ancestor at 1 and
    # must not be pruned by it (remembering a state before its subtree is explored would)
    ops = [
        {"id": 0, "core": "tc", "latency_1core_s": 4.0, "latency_allcores_s": 4.0},
        {"id": 1, "core": "tc", "latency_1core_s": 1.0, "latency_allcores_s": 1.0},
        {"id": 2, "core": "tc", "latency_1core_s": 100.0, "latency_allcores_s": 1.0},
    ]
    inst = make_instance(2, 1, ops, [[1, 2]])
    assert _bf(inst) == pytest.approx(5.0)
    out = branch_and_bound(inst, _serial(inst), 0.0)
    assert out.complete and out.lower_bound_s == pytest.approx(5.0)
    assert out.schedule.makespan(inst) == pytest.approx(5.0)
