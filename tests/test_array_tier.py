"""The array tier's layer values (phaze.schedule.arrays) on random small instances: its bound is
never above the optimum (brute force), its makespan never below it, and every makespan is that
of a schedule the independent checker (phaze.schedule.listsched.verify) accepts; the block's
values are those of a loop over its architectures one at a time."""

from __future__ import annotations

import random

import pytest

from phaze.schedule import arrays, bounds
from phaze.schedule.listsched import verify
from phaze.schedule.solve import articulation_ops
from phaze.schedule.space import layer_plan
from phaze.schedule.tables import OpGraph
from tests.test_schedule import _bf, random_instance
from tests.test_schedule_space import _instance, _scalar_lower, _space


def _layer(inst):
    graph = OpGraph("sig", "bwd", list(range(inst.n)), inst.core, inst.edges)
    plan = layer_plan(graph, {("sig", "bwd", i): i for i in range(inst.n)})
    return arrays.layer_arrays(graph, plan)


def _block(seed: int, n_max: int, archs: int):
    rng = random.Random(seed)
    inst = random_instance(rng, n_max=n_max)
    _, l1, la, n_tc, n_vc = _space(rng, inst, archs)
    return inst, _layer(inst), l1, la, n_tc, n_vc


@pytest.mark.parametrize("seed", range(30))
def test_bound_below_the_optimum_below_a_verified_achieved_schedule(seed):
    """Mutation checks (tried, each fails here): the bound scaled by 1.01 rises above the
    optimum on some seed; a one-core operator that takes its core without moving the core's free
    time makes the checker reject a schedule."""
    inst, lay, l1, la, n_tc, n_vc = _block(7000 + seed, 6, 4)
    got = arrays.layer_values(lay, l1, la, n_tc, n_vc)
    for a in range(len(l1)):
        one = _instance(inst, l1[a], la[a], n_tc[a], n_vc[a])
        opt = _bf(one)
        assert got["lower_bound_s"][a] <= opt * (1 + 1e-12)
        assert opt <= got["makespan_s"][a] * (1 + 1e-12)
        check, sched = arrays.schedule_of(lay, l1[a], la[a], int(n_tc[a]), int(n_vc[a]))
        assert verify(check, sched, 1e-12) == []
        assert sched.makespan(check) == pytest.approx(got["makespan_s"][a], rel=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_every_run_is_a_feasible_schedule(seed):
    """Each priority × mode rule, not only the best one, gives a schedule the checker accepts,
    never shorter than the best the block reports; so does the achieved one (the best
    double-justified where shorter). Mutation check
    (tried, fails here): the reversed pass ordered by earliest end (not latest) breaks
    precedence."""
    _, lay, l1, la, n_tc, n_vc = _block(8000 + seed, 9, 3)
    best, _ = arrays.achieved(lay, l1, la, n_tc, n_vc)
    for prio, mode in arrays.RUNS:
        ms, rec = arrays._run(lay, l1, la, n_tc, n_vc, prio, mode, record=True)
        for a in range(len(l1)):
            row = [r[a] for r in rec]
            check, sched = arrays._schedule(lay, l1[a], la[a], n_tc[a], n_vc[a], *row)
            assert verify(check, sched, 1e-12) == [], (prio, mode)
            assert sched.makespan(check) == pytest.approx(ms[a], rel=1e-12)
            assert ms[a] >= best[a] * (1 - 1e-12)
    for a in range(len(l1)):
        check, sched = arrays.schedule_of(lay, l1[a], la[a], int(n_tc[a]), int(n_vc[a]))
        assert verify(check, sched, 1e-12) == []
        assert sched.makespan(check) == pytest.approx(best[a], rel=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_the_block_equals_a_loop_over_its_architectures(seed):
    """Mutation check (tried, fails here): the SGS reading each architecture's core counts from
    its neighbour in the block (``np.roll(n_tc, 1)``: a row dropped and the rest shifted)."""
    _, lay, l1, la, n_tc, n_vc = _block(9000 + seed, 12, 8)
    got = arrays.layer_values(lay, l1, la, n_tc, n_vc)
    for a in range(len(l1)):
        one = arrays.layer_values(
            lay, l1[a : a + 1], la[a : a + 1], n_tc[a : a + 1], n_vc[a : a + 1]
        )
        assert one["makespan_s"][0] == got["makespan_s"][a]
        # the bound's sums run over another number of rows: equal up to rounding
        assert one["lower_bound_s"][0] == pytest.approx(got["lower_bound_s"][a], rel=1e-12)


def _scalar_energy_lower(inst) -> float:
    """tests/test_schedule_space.py's scalar reference with the exclusion and forced-mode
    bounds on the scheduler's energy heads and tails (phaze.schedule.bounds)."""
    arts = articulation_ops(inst)
    if not arts or len(arts) == inst.n:
        groups, arts = [list(range(inst.n))], []
    else:
        buckets = {}
        for i in range(inst.n):
            if i not in arts:
                b = sum(1 for a in arts if (inst.ancestors[i] >> a) & 1)
                buckets.setdefault(b, []).append(i)
        groups = [buckets[b] for b in sorted(buckets)]
    total = sum(inst.q[a] for a in arts)
    for g in groups:
        sub = inst.subinstance(g)
        k = {}
        for c in ("tc", "vc"):
            mine = [i for i in range(sub.n) if sub.uses(i, c)]
            k[c] = max(1, min(sub.n_cores(c), bounds.antichain_width(sub, mine))) if mine else 1
        r, d = bounds.energy_heads_tails(sub, k)
        total += max(
            bounds.critical_path(sub),
            bounds.energy(sub, "tc", k),
            bounds.energy(sub, "vc", k),
            bounds.exclusion_bound(sub, r, d, k),
            bounds.forced_energy(sub, sum(sub.q), r, d, k),
        )
    return total


@pytest.mark.parametrize("seed", range(20))
def test_the_bound_is_the_scalar_bounds_architecture_by_architecture(seed):
    """The bound is the scheduler's cheap bounds on energy heads and tails of each
    architecture's own instance, never below the space bound's. Mutation check (tried, fails
    here): the bound scaled by 0.99."""
    inst, lay, l1, la, n_tc, n_vc = _block(9500 + seed, 9, 5)
    got = arrays.layer_values(lay, l1, la, n_tc, n_vc)
    for a in range(len(l1)):
        one = _instance(inst, l1[a], la[a], n_tc[a], n_vc[a])
        want = max(_scalar_lower(one), _scalar_energy_lower(one))
        assert got["lower_bound_s"][a] == pytest.approx(want, rel=1e-12)
        assert got["lower_bound_s"][a] >= _scalar_lower(one) * (1 - 1e-12)
