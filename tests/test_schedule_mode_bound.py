"""The mode-aware bound (intra-op time + single-core time before / at / after every op) against
brute force: never above the optimum, and above the cheap bounds where precedence and mode choice
interact."""

from __future__ import annotations

import random

import pytest

from phaze.schedule.bounds import energy, lower_bound
from phaze.schedule.ilp import _dual_bound, _scip
from phaze.schedule.ilp_model import _SEGMENT_OPS, mode_bound_model, segment_ops
from phaze.schedule.instance import make_instance
from phaze.schedule.listsched import best_list_schedule
from tests.test_schedule import _bf, random_instance


def _bound(inst, ub, segment_k=_SEGMENT_OPS):
    """The mode bound (solved to optimality) with the segment cuts of ``segment_k`` ops."""
    res, status = _scip(mode_bound_model(inst, ub, 0.0, segment_k), 30, 0.0, 1, 0, 0, False)
    assert status == "optimal"
    return min(_dual_bound(res, ub), ub)


def test_mode_bound_never_exceeds_the_optimum():
    rng = random.Random(20250301)
    stronger = 0
    for _ in range(60):
        inst = random_instance(rng, n_max=6)
        opt = _bf(inst)
        ub = best_list_schedule(inst).makespan(inst)
        mb = _bound(inst, ub)
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
    assert energy(inst, "vc") == pytest.approx(5.0)
    # (the path-flow bound among the cheap bounds comes close too: 6.4995 on its grid)
    assert 5.0 < lower_bound(inst, 7.0)[0] <= 6.5
    assert _bound(inst, 7.0) == pytest.approx(6.5)


# ---- segment cuts: a long single-core op's run is one interval that no intra-op op overlaps ----
def _many_core_instance(rng: random.Random):
    """Random DAGs of 3-6 ops on 3-4 cores per type with mixed intra-op scaling (LA from L1 / n
    to L1, sometimes 0), where single-core runs are long and some ops hide beside them."""
    n, nc = rng.randint(3, 6), rng.choice([3, 4])
    p_edge = rng.choice([0.3, 0.5, 0.7])
    edges = [[a, b] for a in range(n) for b in range(a + 1, n) if rng.random() < p_edge]
    ops = []
    for i in range(n):
        l1 = float(rng.randint(1, 9))
        la = min(l1, l1 / nc * rng.choice([1.0, 1.5, 2.5, 3.5]))
        if rng.random() < 0.15:  # an op that takes no time intra-op (a view, a reshape)
            la = 0.0
        core = rng.choice(["tc", "vc", "fused"])
        ops.append({"id": i, "core": core, "latency_1core_s": l1, "latency_allcores_s": la})
    return make_instance(nc, nc, ops, edges)


def test_segment_cuts_never_exceed_the_optimum():
    rng = random.Random(20250302)
    stronger = 0
    for _ in range(300):
        inst = _many_core_instance(rng)
        ub = best_list_schedule(inst).makespan(inst)
        plain = _bound(inst, ub, 0)
        every = _bound(inst, ub, inst.n)  # segment cuts for every eligible op: the strongest
        if every > plain * (1 + 1e-6):
            stronger += 1
        opt = _bf(inst)
        assert every <= opt * (1 + 1e-9), (inst, every, opt)
    assert stronger >= 3


def _leaf_beside_chain(la_x: float):
    """A leaf (tc, 4 on one core, 1 intra-op) beside the chain a -> x -> b (a, b: vc, scaling
    badly; x: tc, 4 on one core, ``la_x`` intra-op), 4 cores per type."""
    lat = [(4.0, 1.0), (2.0, 1.9), (4.0, la_x), (2.0, 1.9)]
    ops = [
        {"id": i, "core": "vc" if i % 2 else "tc", "latency_1core_s": l1, "latency_allcores_s": la}
        for i, (l1, la) in enumerate(lat)
    ]
    return make_instance(4, 4, ops, [[1, 2], [2, 3]])


def test_segment_cuts_see_that_a_long_run_cannot_hold_an_intra_op_op():
    # The mode cuts let a and b hide beside the leaf's single-core run with x intra-op (5.0);
    # but x lies between a and b, so it would have to run inside that run too. Optimum 5.8.
    inst = _leaf_beside_chain(1.0)
    assert _bf(inst) == pytest.approx(5.8)
    assert _bound(inst, 5.8, 0) == pytest.approx(5.0)
    assert segment_ops(inst, 1) == [0]
    assert _bound(inst, 5.8, 1) == pytest.approx(5.8)


def test_segment_cuts_let_a_zero_time_op_sit_inside_the_run():
    # x takes no time intra-op: a, x (intra-op, at a point) and b all fit beside the leaf's
    # single-core run. Optimum 4.0; a bound that forced x inside the run onto one core would
    # give 4.8 (with the loose upper bound 10, so that x is not fixed intra-op).
    inst = _leaf_beside_chain(0.0)
    assert _bf(inst) == pytest.approx(4.0)
    assert _bound(inst, 10.0, inst.n) == pytest.approx(4.0)


def test_segment_ops_add_the_incumbents_single_core_ops():
    ops = [
        {"id": i, "core": "tc", "latency_1core_s": float(9 - i), "latency_allcores_s": 0.5}
        for i in range(5)
    ]
    inst = make_instance(4, 4, ops, [])
    assert segment_ops(inst, 2) == [0, 1]
    assert segment_ops(inst, 2, [1, 1, 1, 0, 0], 1) == [0, 1, 3]
    assert segment_ops(inst, 2, [0, 1, 1, 1, 0], 2) == [0, 1, 4]
