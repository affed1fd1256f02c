"""The energetic bound (phaze/schedule/energetic.py) against brute force: never above the
optimum, the optimum itself never proven infeasible, stronger than the cheap bounds on some
instances, bounded by counts, and cut short by a deadline without ever being invalid.

Mutations each tried and caught here (then reverted): the chain count per interval one too small
(``kk - 1``), an op's mandatory overlap taken at its larger shift (``np.maximum`` of the left- and
right-shifted share: energy overcounted), an intra-op op weighing 2 (the chip's capacity is 1),
the adjustment ``t2 - a`` without dividing the free room by the weight, and precedence propagated
with the longest mode instead of the shortest allowed one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaze.schedule.bounds import core_limits, energy_heads_tails, lower_bound
from phaze.schedule.budget import Deadline
from phaze.schedule.energetic import chain_cover, energetic_bound, infeasible
from phaze.schedule.instance import Instance, make_instance
from phaze.schedule.listsched import best_list_schedule
from phaze.schedule.solve import Options, Scheduler
from tests.test_schedule import _bf, random_instance
from tests.test_schedule_bnb import _backward_like, _many_core


def _generators():
    return (
        lambda rng: random_instance(rng, n_max=7),
        lambda rng: _backward_like(rng, 7),
        lambda rng: _many_core(rng, 7),
    )


def _bounds(inst: Instance):
    ub = best_list_schedule(inst).makespan(inst)
    lb, _ = lower_bound(inst, ub)
    return lb, ub


def _proves_optimum_infeasible(inst: Instance, opt: float) -> bool:
    k = core_limits(inst)
    r, d = energy_heads_tails(inst, k)
    return infeasible(inst, opt, np.asarray(r), np.asarray(d), k, passes=50)[0]


@pytest.mark.parametrize("which", range(3))
def test_the_bound_never_exceeds_the_brute_force_optimum_and_sometimes_beats_the_cheap_bounds(
    which,
):
    rng = random.Random(5000 + which)
    gen = _generators()[which]
    checked = stronger = 0
    for _ in range(40):
        inst = gen(rng)
        if inst.is_chain():
            continue
        opt = _bf(inst)
        lb, ub = _bounds(inst)
        en = energetic_bound(inst, lb, ub, steps=20, passes=50)
        assert en.complete
        assert min(lb, ub) <= en.bound_s <= opt * (1 + 1e-9), (inst, opt, lb, en)
        # at the optimum itself (the tightest windows) no propagation may find a contradiction
        assert not _proves_optimum_infeasible(inst, opt), (inst, opt)
        stronger += en.bound_s > lb * (1 + 1e-6)
        checked += 1
    assert checked >= 25
    assert stronger >= 3, stronger


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_tc=st.integers(1, 3),
    n_vc=st.integers(1, 3),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["tc", "vc", "fused"]),
            st.integers(0, 9),
            st.sampled_from(["same", "half", "per_core", "zero"]),
        ),
        min_size=2,
        max_size=5,
    ),
    edge_bits=st.integers(0, 2**10 - 1),
)
def test_property_the_bound_lies_between_the_cheap_bound_and_the_optimum(
    n_tc, n_vc, ops, edge_bits
):
    n = len(ops)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    edges = [list(p) for k, p in enumerate(pairs) if (edge_bits >> k) & 1]
    rows = []
    for i, (core, l1, mode) in enumerate(ops):
        nc = n_tc if core != "vc" else n_vc
        la = {"same": l1, "half": l1 / 2, "per_core": l1 / nc, "zero": 0.0}[mode]
        rows.append({"id": i, "core": core, "latency_1core_s": l1, "latency_allcores_s": la})
    inst = make_instance(n_tc, n_vc, rows, edges)
    opt = _bf(inst)
    lb, ub = _bounds(inst)
    en = energetic_bound(inst, lb, ub, steps=20, passes=50)
    assert min(lb, ub) <= en.bound_s <= opt * (1 + 1e-9) + 1e-12
    assert en.bound_s <= ub


def test_a_found_example_where_the_cheap_bounds_are_loose():
    # two tensor-core ops that do not scale, a vector op between them and a long vector leaf:
    # found by the random search above (seed 5000), kept as a fixed check
    rng = random.Random(5000)
    gen = _generators()[0]
    for _ in range(200):
        inst = gen(rng)
        if inst.is_chain():
            continue
        lb, ub = _bounds(inst)
        en = energetic_bound(inst, lb, ub, steps=30, passes=50)
        if en.bound_s > lb * 1.05:
            opt = _bf(inst)
            assert en.bound_s <= opt * (1 + 1e-9)
            assert (en.bound_s - lb) / (opt - lb) > 0.3  # closes a good part of the gap
            return
    pytest.fail("no instance where the energetic bound gains 5 %")


def test_a_gap_target_is_proven_in_one_trial_when_the_bound_reaches_it():
    rng = random.Random(7)
    for _ in range(300):
        inst = _backward_like(rng, 7)
        if inst.is_chain():
            continue
        lb, ub = _bounds(inst)
        full = energetic_bound(inst, lb, ub, steps=30, passes=50)
        if (ub - full.bound_s) / ub < 0.05 < (ub - lb) / ub:
            at_gap = energetic_bound(inst, lb, ub, gap=0.05, steps=30, passes=50)
            assert at_gap.trials == 1
            assert ub - at_gap.bound_s <= 0.05 * ub
            return
    pytest.fail("no instance whose gap the bound closes to 5 %")


def test_work_is_bounded_by_counts_and_repeats_exactly():
    rng = random.Random(11)
    inst = _many_core(rng, 7)
    while inst.is_chain():
        inst = _many_core(rng, 7)
    lb, ub = _bounds(inst)
    a = energetic_bound(inst, lb, ub, steps=3, passes=2)
    b = energetic_bound(inst, lb, ub, steps=3, passes=2)
    assert a == b
    assert a.trials <= 3 and a.passes <= 6


def test_an_expired_deadline_returns_the_given_bound_marked_incomplete():
    rng = random.Random(3)
    inst = random_instance(rng, 7)
    while inst.is_chain():
        inst = random_instance(rng, 7)
    lb, ub = _bounds(inst)
    out = energetic_bound(inst, lb, ub, deadline=Deadline(0.0))
    assert out.bound_s == lb and not out.complete and out.trials == 0


def test_chain_cover_partitions_into_chains_of_comparable_ops():
    rng = random.Random(2)
    for _ in range(30):
        inst = random_instance(rng, 7)
        members = list(range(inst.n))
        cov = chain_cover(inst, members)
        assert sorted(cov) == members
        for a in members:
            for b in members:
                if a < b and cov[a] == cov[b]:
                    assert inst.comparable(a, b)


def test_the_pipeline_with_the_energetic_bound_stays_below_the_optimum():
    rng = random.Random(99)
    with Scheduler(Options(time_limit_s=30, bnb=False, node_limit=50, bnb_node_limit=100)) as s:
        for _ in range(12):
            inst = _backward_like(rng, 7)
            if inst.is_chain():
                continue
            opt = _bf(inst)
            r = s.solve(inst)
            assert r.lower_bound_s <= opt * (1 + 1e-6) <= r.makespan_s * (1 + 1e-6) + 1e-12
