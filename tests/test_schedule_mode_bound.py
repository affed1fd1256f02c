"""The mode-aware bound (intra-op time + single-core time before / at / after every op) against
brute force: never above the optimum, and above the cheap bounds where precedence and mode choice
interact."""

from __future__ import annotations

import random

import pytest

from phaze.schedule.bounds import lower_bound
from phaze.schedule.ilp import _dual_bound, _scip, mode_bound_model
from phaze.schedule.instance import make_instance
from phaze.schedule.listsched import best_list_schedule
from tests.test_schedule import _bf, random_instance


def _mode_bound(inst, ub):
    res, status = _scip(mode_bound_model(inst, ub, 0.0), 30, 0.0, 1, 0, 0, False)
    assert status == "optimal"
    return min(_dual_bound(res, ub), ub)


def test_mode_bound_never_exceeds_the_optimum():
    rng = random.Random(20250301)
    stronger = 0
    for _ in range(60):
        inst = random_instance(rng, n_max=6)
        opt = _bf(inst)
        ub = best_list_schedule(inst).makespan(inst)
        mb = _mode_bound(inst, ub)
        assert mb <= opt * (1 + 1e-9), (inst, mb, opt)
        stronger += mb > lower_bound(inst, ub)[0] * (1 + 1e-6)
    assert stronger >= 3  # it is not just the cheap bounds again


def test_mode_bound_sees_modes_and_overlap_together():
    # two independent vector ops on 2 vector cores: side by side 7, or op 1 intra-op (3.5, alone)
    # then op 0 (3) = 6.5. The energy bound credits op 1 with 7 / 2 AND lets op 0 overlap: 5.
    ops = [
        {"id": 0, "core": "vc", "latency_1core_s": 3.0, "latency_allcores_s": 3.0},
        {"id": 1, "core": "vc", "latency_1core_s": 7.0, "latency_allcores_s": 3.5},
    ]
    inst = make_instance(1, 2, ops, [])
    assert _bf(inst) == pytest.approx(6.5)
    assert lower_bound(inst, 7.0)[0] == pytest.approx(5.0)
    assert _mode_bound(inst, 7.0) == pytest.approx(6.5)
