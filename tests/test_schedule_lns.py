"""The large-neighbourhood search (phaze/schedule/lns.py): a window's restriction keeps the
incumbent and only schedules valid for the real instance; the search never lengthens a schedule,
never beats brute force, stops at its limits, and finds what the list search and kicks miss."""

from __future__ import annotations

import random

import pytest

from phaze.schedule.bnb import branch_and_bound
from phaze.schedule.budget import Deadline
from phaze.schedule.listsched import best_list_schedule, serial_sgs, verify
from phaze.schedule.lns import (
    into_restriction,
    large_neighbourhood_search,
    out_of_restriction,
    restrict,
)
from tests.test_schedule import _bf, random_instance
from tests.test_schedule_bnb import _backward_like


def test_a_restriction_keeps_the_incumbent_and_its_schedules_are_real():
    rng = random.Random(8)
    for _ in range(60):
        inst = rng.choice((random_instance, lambda g: _backward_like(g, 7)))(rng)
        sched = best_list_schedule(inst)
        window = set(rng.sample(range(inst.n), rng.randint(0, inst.n)))
        r = restrict(inst, sched, window)
        inc = into_restriction(r, sched)
        # the incumbent is a schedule of the restriction, with the same makespan
        assert verify(r, inc, 1e-12) == []
        assert inc.makespan(r) == pytest.approx(sched.makespan(inst))
        # the restriction's optimum, mapped back, is valid and no better than the real optimum
        out = branch_and_bound(r, inc, 0.0)
        best = out.schedule or inc
        back = out_of_restriction(r, best)
        assert verify(inst, back, 1e-12) == []
        assert back.makespan(inst) >= _bf(inst) * (1 - 1e-9)
        # a window of every op is the whole problem
        if len(window) == inst.n:
            assert back.makespan(inst) == pytest.approx(_bf(inst))


def test_it_never_lengthens_and_reaches_what_the_list_search_misses():
    rng = random.Random(21)
    gained = 0
    for _ in range(25):
        inst = _backward_like(rng, rng.randint(9, 14))
        start = serial_sgs(inst, list(range(inst.n)), [0] * inst.n)
        best, spent = large_neighbourhood_search(inst, start)
        assert verify(inst, best, 1e-12) == []
        assert best.makespan(inst) <= start.makespan(inst)
        assert best.makespan(inst) >= branch_and_bound(inst, start, 0.0).lower_bound_s * (1 - 1e-9)
        gained += best.makespan(inst) < best_list_schedule(inst).makespan(inst) * (1 - 1e-9)
        assert spent > 0
    assert gained >= 3


def test_limits_stop_it_and_the_node_limit_is_deterministic():
    rng = random.Random(4)
    inst = _backward_like(rng, 40)
    start = serial_sgs(inst, list(range(inst.n)), [0] * inst.n)
    a, spent_a = large_neighbourhood_search(inst, start, work=3000)
    b, spent_b = large_neighbourhood_search(inst, start, work=3000)
    assert spent_a == spent_b <= 3000
    assert a.start == b.start and a.y == b.y
    c, spent_c = large_neighbourhood_search(inst, start, Deadline(0.0))
    assert spent_c == 0 and c is start
