"""Mode kicks (``kick_modes``): a descent that flips several ops' modes at once."""

from __future__ import annotations

import random

import pytest

from phaze.schedule.budget import Deadline
from phaze.schedule.instance import make_instance
from phaze.schedule.listsched import assign_cores, best_list_schedule, kick_modes, verify
from tests.test_schedule import _bf, random_instance


def _paired():
    """2 + 2 cores, intra-op = half the single-core latency: ops 1 and 2 on one tensor core each
    beside the vector-core op 3 on one core beat every schedule one flip away from the list
    search's (12.9); brute force: 12.0."""
    ops = [
        {"id": 0, "core": "tc", "latency_1core_s": 2.0, "latency_allcores_s": 1.0},
        {"id": 1, "core": "tc", "latency_1core_s": 7.0, "latency_allcores_s": 3.5},
        {"id": 2, "core": "tc", "latency_1core_s": 6.0, "latency_allcores_s": 3.0},
        {"id": 3, "core": "vc", "latency_1core_s": 9.0, "latency_allcores_s": 5.4},
    ]
    return make_instance(2, 2, ops, [[0, 1], [2, 3]])


def test_kicks_reach_the_optimum_that_single_flips_miss():
    inst = _paired()
    listed = best_list_schedule(inst)
    assert listed.makespan(inst) == pytest.approx(12.9)
    kicked = kick_modes(inst, listed)
    assert _bf(inst) == pytest.approx(12.0)
    assert kicked.makespan(inst) == pytest.approx(12.0)
    assert verify(inst, assign_cores(inst, kicked), 1e-12) == []


def test_kicks_never_worsen_never_beat_brute_force_and_are_reproducible():
    rng = random.Random(20261202)
    better = 0
    for _ in range(150):
        inst = random_instance(rng)
        listed = best_list_schedule(inst)
        kicked = kick_modes(inst, listed, kicks=60)
        ms = kicked.makespan(inst)
        assert ms <= listed.makespan(inst)
        assert ms >= _bf(inst) * (1 - 1e-9)
        assert verify(inst, assign_cores(inst, kicked), 1e-12 * ms) == []
        assert kick_modes(inst, listed, kicks=60).start == kicked.start  # seeded
        better += ms < listed.makespan(inst) * (1 - 1e-9)
    assert better >= 3


def test_kicks_stop_at_their_work_allowance_and_deadline():
    inst = _paired()
    listed = best_list_schedule(inst)
    assert kick_modes(inst, listed).makespan(inst) < listed.makespan(inst)
    assert kick_modes(inst, listed, work=0) is listed
    assert kick_modes(inst, listed, deadline=Deadline(0.0)) is listed
