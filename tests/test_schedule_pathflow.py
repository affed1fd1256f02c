"""The path-flow bound (phaze/schedule/pathflow.py) against brute force: never above the optimum
with or without forced modes, stronger than the other cheap bounds on some instances (and on a
backward-like block where the energy and the critical path are both loose), deterministic.

Mutations each tried and caught here (then reverted): the single-core time counted once per path
*and* per energy (F + beta + gamma = 2: ``flow = 2.0 - beta - gamma``), the energies over k_c - 1
cores, modes forced at 0.9 x the trial makespan, and a path's gain taken with L_all in place of
L1 (a chain of single-core ops counted at its intra-op latency).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaze.schedule.bounds import (
    core_limits,
    critical_path,
    energy_heads_tails,
    exclusion_bound,
    forced_energy,
    lower_bound,
    windowed_energy,
)
from phaze.schedule.budget import Deadline, OutOfTime
from phaze.schedule.instance import make_instance
from phaze.schedule.listsched import best_list_schedule
from phaze.schedule.pathflow import path_flow_bound, path_flow_value
from tests.test_schedule import _bf, random_instance
from tests.test_schedule_bnb import _backward_like, _many_core


def _both(inst, ub):
    k = core_limits(inst)
    r, d = energy_heads_tails(inst, k)
    return path_flow_value(inst, k, [False] * inst.n), path_flow_bound(inst, ub, r, d, k)


@pytest.mark.parametrize("which", range(3))
def test_the_bound_never_exceeds_the_brute_force_optimum(which):
    gen = (
        lambda rng: random_instance(rng, n_max=7),
        lambda rng: _backward_like(rng, 7),
        lambda rng: _many_core(rng, 7),
    )[which]
    rng = random.Random(8000 + which)
    checked = stronger = 0
    for _ in range(50):
        inst = gen(rng)
        if inst.is_chain():
            continue
        opt = _bf(inst)
        ub = best_list_schedule(inst).makespan(inst)
        free, forced = _both(inst, ub)
        assert free <= opt * (1 + 1e-9), (inst, opt, free)
        assert forced <= opt * (1 + 1e-9), (inst, opt, forced)
        assert forced <= ub
        lb, _ = lower_bound(inst, ub)
        assert lb <= opt * (1 + 1e-9)
        k = core_limits(inst)
        r, d = energy_heads_tails(inst, k)
        others = max(
            critical_path(inst),
            forced_energy(inst, ub, r, d, k),
            exclusion_bound(inst, r, d, k),
            windowed_energy(inst, "tc", r, d, k),
            windowed_energy(inst, "vc", r, d, k),
        )
        stronger += max(free, forced) > others * (1 + 1e-6)
        checked += 1
    assert checked >= 30
    assert stronger >= 1


def test_it_beats_the_energy_and_the_critical_path_on_a_vector_chain_beside_tensor_leaves():
    # a chain of vector ops that barely scale (L_all = L1 / 2 on 4 cores) and tensor-core leaves
    # that scale perfectly: the energy lets the vector ops share 4 cores, the critical path
    # ignores the leaves; the optimum runs the leaves intra-op and the chain one op after another
    ops = [
        {"id": i, "core": "vc", "latency_1core_s": 2.0, "latency_allcores_s": 1.0} for i in range(4)
    ]
    ops += [
        {"id": 4 + i, "core": "tc", "latency_1core_s": 8.0, "latency_allcores_s": 2.0}
        for i in range(2)
    ]
    edges = [[0, 1], [1, 2], [2, 3], [0, 4], [1, 5]]
    inst = make_instance(4, 4, ops, edges)
    opt = _bf(inst)
    ub = best_list_schedule(inst).makespan(inst)
    free, forced = _both(inst, ub)
    assert opt == pytest.approx(8.0)
    assert max(free, forced) == pytest.approx(8.0)
    k = core_limits(inst)
    energy = max(
        sum(min(inst.la[i], inst.l1[i] / k[c]) for i in range(inst.n) if inst.uses(i, c))
        for c in ("tc", "vc")
    )
    assert energy < 8.0 and sum(inst.q[:4]) < 8.0


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
def test_property_the_bound_never_exceeds_the_optimum(n_tc, n_vc, ops, edge_bits):
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
    ub = best_list_schedule(inst).makespan(inst)
    free, forced = _both(inst, ub)
    assert free <= opt * (1 + 1e-9) + 1e-12
    assert forced <= min(opt * (1 + 1e-9) + 1e-12, ub)


def test_the_same_instance_gives_the_same_bound():
    rng = random.Random(4)
    inst = _backward_like(rng, 7)
    ub = best_list_schedule(inst).makespan(inst)
    assert _both(inst, ub) == _both(inst, ub)


def test_a_passed_deadline_drops_the_path_flow_bound_and_keeps_the_others():
    rng = random.Random(6)
    inst = _backward_like(rng, 7)
    while inst.is_chain():
        inst = _backward_like(rng, 7)
    ub = best_list_schedule(inst).makespan(inst)
    k = core_limits(inst)
    r, d = energy_heads_tails(inst, k)
    with pytest.raises(OutOfTime):
        path_flow_bound(inst, ub, r, d, k, deadline=Deadline(0.0))
    lb, _ = lower_bound(inst, ub, Deadline(0.0))
    assert lb >= critical_path(inst)
