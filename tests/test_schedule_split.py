"""The split at an op that runs alone (phaze/schedule/split.py) against brute force: with exact
sides its bound is the optimum, with any sides it never exceeds it, and the scheduler's bound
with the split stays below the optimum."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schedule import brute_force

from phaze.schedule.bounds import _bits, forced_intra
from phaze.schedule.instance import Instance, make_instance
from phaze.schedule.listsched import assign_cores, best_list_schedule, replay, verify
from phaze.schedule.solve import Options, Scheduler, clamp_cores
from phaze.schedule.split import Side, split_op, split_search

EPS = 1e-12


def _bf(inst: Instance) -> float:
    return brute_force(inst.n_tc, inst.n_vc, inst.core, inst.l1, inst.la, inst.edges)


def instance_with_long_op(seed: int) -> Instance:
    """A random DAG of 5–7 ops in which one middle op is long on one core and short on all of
    them (as a softmax backward on a long sequence), so that it is forced intra-op below any
    reasonable schedule, with ops before, after and beside it."""
    rng = random.Random(seed)
    n = rng.randint(5, 7)
    j = rng.randint(1, n - 2)
    edges = {(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.3}
    edges |= {(rng.randint(0, j - 1), j), (j, rng.randint(j + 1, n - 1))}
    ops = []
    for i in range(n):
        core = rng.choice(["tc", "tc", "vc", "fused"])
        l1 = float(rng.randint(1, 9))
        la = float(rng.choice([l1, max(1, int(l1) // 2), l1 / 4]))
        if i == j:
            core, l1, la = "vc", 60.0, float(rng.randint(2, 6))
        ops.append(
            {"id": i, "core": core, "latency_1core_s": l1 * 1e-5, "latency_allcores_s": la * 1e-5}
        )
    return make_instance(rng.randint(1, 2), rng.randint(1, 2), ops, sorted(edges))


def _exact_side(inst: Instance):
    """A side solver that proves each side's optimum (the ILP at gap 0, itself checked against
    brute force in test_schedule.py); counts its calls."""
    opts = Options(tier="ilp", time_limit_s=60, mip_gap=0.0, threads=1, cache=False, split_nodes=0)
    sch = Scheduler(opts)
    calls = []

    def solve(members: list[int]) -> Side:
        r = sch.solve(clamp_cores(inst.subinstance(members)))
        assert r.status in ("optimal", "chain"), r.status
        calls.append(members)
        return Side.of(r)

    return sch, solve, calls


def _forced_case(seed: int, above_opt: bool = True):
    """(instance, ub, split op at ub). ``above_opt``: ub just above the optimum (the bound must
    then be the optimum itself); else a list schedule's makespan, as the scheduler uses."""
    inst = instance_with_long_op(seed)
    ub = _bf(inst) * (1 + 1e-6) if above_opt else best_list_schedule(inst).makespan(inst)
    j = split_op(inst, ub)
    return inst, ub, j


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6))
def test_with_exact_sides_the_split_bound_is_the_optimum(seed):
    inst, ub, j = _forced_case(seed)
    assert j is not None  # the long op is forced just above the optimum
    opt = _bf(inst)
    sch, solve, _ = _exact_side(inst)
    with sch:
        out = split_search(inst, j, solve, float("inf"), 10**6)
    assert out.complete
    # valid below ub: every schedule shorter than ub runs j alone
    assert min(out.lower_bound_s, ub) <= opt * (1 + 1e-9)
    if opt < ub * (1 - 1e-9):
        # the optimum runs j intra-op, so the best split is the optimum, and its leaf schedule too
        assert out.lower_bound_s == pytest.approx(opt, rel=1e-9)
        assert out.makespan_s == pytest.approx(opt, rel=1e-9)
        assert verify(inst, _leaf_schedule(inst, out), 1e-9 * opt) == []


def _leaf_schedule(inst: Instance, out):
    sched = assign_cores(inst, replay(inst, out.start, out.y))
    assert sched.makespan(inst) <= out.makespan_s * (1 + 1e-9)
    return sched


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(1, 6))
def test_any_node_allowance_and_target_give_a_valid_bound(seed, nodes):
    inst, ub, j = _forced_case(seed, above_opt=False)
    if j is None:
        return
    opt = _bf(inst)
    sch, solve, calls = _exact_side(inst)
    with sch:
        out = split_search(inst, j, solve, opt * 0.97, nodes)
    assert out.nodes <= max(nodes, 1)
    assert min(out.lower_bound_s, ub) <= opt * (1 + 1e-9)
    # the root (ancestors and descendants alone) is a floor: the search only raises it
    root = solve(sorted(_bits(inst.ancestors[j]))).lower_bound_s + inst.la[j]
    root += solve(sorted(_bits(inst.descendants[j]))).lower_bound_s
    assert out.lower_bound_s >= root * (1 - 1e-9)
    assert calls


def test_split_op_only_names_an_op_forced_below_ub():
    for seed in range(40):
        inst, ub, j = _forced_case(seed, above_opt=False)
        if j is not None:
            assert j in forced_intra(inst, ub)
            assert inst.ancestors[j] or inst.descendants[j]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6))
def test_the_scheduler_with_the_split_stays_within_the_optimum(seed):
    inst = instance_with_long_op(seed)
    opt = _bf(inst)
    opts = Options(
        tier="ilp",
        time_limit_s=60,
        mip_gap=0.0,
        threads=1,
        node_limit=1,
        bnb_node_limit=1,
        split_nodes=8,
        cache=True,
    )
    with Scheduler(opts) as sch:
        r = sch.solve(inst)
    assert r.lower_bound_s <= opt * (1 + 1e-9) + EPS
    assert r.makespan_s >= opt * (1 - 1e-9) - EPS
    assert verify(inst, r.schedule, 1e-9 * opt) == []


def test_ops_beside_the_long_op_keep_their_order_across_it():
    """s -> j -> t, and a -> i beside j, on one tensor and one vector core. Putting i before j
    and a after it would let each side overlap its two ops (12 + 5 + 10 = 27 us), but a must
    precede i: the optimum is 37 us, and the split must not report less."""
    us = 1e-6
    ops = [
        {"id": 0, "core": "tc", "latency_1core_s": 10 * us, "latency_allcores_s": 10 * us},  # s
        {"id": 1, "core": "tc", "latency_1core_s": 10 * us, "latency_allcores_s": 10 * us},  # a
        {"id": 2, "core": "vc", "latency_1core_s": 12 * us, "latency_allcores_s": 12 * us},  # i
        {"id": 3, "core": "vc", "latency_1core_s": 100 * us, "latency_allcores_s": 5 * us},  # j
        {"id": 4, "core": "vc", "latency_1core_s": 10 * us, "latency_allcores_s": 10 * us},  # t
    ]
    inst = make_instance(1, 1, ops, [(0, 3), (3, 4), (1, 2)])
    opt = _bf(inst)
    j = split_op(inst, opt * (1 + 1e-6))
    assert j == 3
    sch, solve, _ = _exact_side(inst)
    with sch:
        out = split_search(inst, j, solve, float("inf"), 100)
    assert out.lower_bound_s == pytest.approx(opt, rel=1e-9)
    assert opt > 30 * us
