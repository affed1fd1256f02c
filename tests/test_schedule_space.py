"""The per-layer bounds of a whole space (phaze/schedule/space.py): architecture by architecture
equal to the scalar bounds of phaze.schedule.bounds composed as the scheduler decomposes, never
above the brute-force optimum, and ``serial_s`` the makespan of a real schedule."""

from __future__ import annotations

import random

import numpy as np
import pytest

from phaze.schedule import bounds
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import serial_sgs, verify
from phaze.schedule.solve import articulation_ops
from phaze.schedule.space import layer_bounds, layer_plan
from phaze.schedule.tables import OpGraph
from tests.test_schedule import _bf, random_instance


def _scalar_lower(inst: Instance) -> float:
    """The scheduler's decomposition with the cheap bounds, one architecture: per segment the
    critical path, the energy per core type, the exclusion bound and the forced-mode energy
    (capped by the serial schedule), the last two on critical-path heads and tails."""
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
        # the width over every op of a type, zero-length or not (as the space bound takes it)
        k = {}
        for c in ("tc", "vc"):
            mine = [i for i in range(sub.n) if sub.uses(i, c)]
            k[c] = max(1, min(sub.n_cores(c), bounds.antichain_width(sub, mine))) if mine else 1
        hd, tl = bounds.heads(sub), bounds.tails(sub)
        total += max(
            bounds.critical_path(sub),
            bounds.energy(sub, "tc", k),
            bounds.energy(sub, "vc", k),
            bounds.exclusion_bound(sub, hd, tl, k),
            bounds.forced_energy(sub, sum(sub.q), hd, tl, k),
        )
    return total


def _space(rng: random.Random, inst: Instance, n_archs: int):
    """The instance's graph with ``n_archs`` random latency sets and core counts."""
    graph = OpGraph("sig", "bwd", list(range(inst.n)), inst.core, inst.edges)
    row_of = {("sig", "bwd", i): i for i in range(inst.n)}
    plan = layer_plan(graph, row_of)
    l1 = np.array([[rng.randint(1, 9) * 1e-5 for _ in range(inst.n)] for _ in range(n_archs)])
    la = np.minimum(l1, np.array([[rng.randint(1, 9) * 1e-5 for _ in range(inst.n)] for _ in l1]))
    la = np.where(np.array([[rng.random() < 0.3 for _ in range(inst.n)] for _ in l1]), l1, la)
    n_tc = np.array([rng.randint(1, 3) for _ in l1])
    n_vc = np.array([rng.randint(1, 3) for _ in l1])
    return plan, l1, la, n_tc, n_vc


def _instance(inst: Instance, l1, la, n_tc, n_vc) -> Instance:
    return Instance(
        int(n_tc), int(n_vc), inst.core, tuple(map(float, l1)), tuple(map(float, la)), inst.edges
    )


@pytest.mark.parametrize("seed", range(40))
def test_each_architecture_gets_the_scalar_bounds(seed):
    rng = random.Random(seed)
    inst = random_instance(rng, n_max=9)
    plan, l1, la, n_tc, n_vc = _space(rng, inst, 6)
    lower, serial = layer_bounds(plan, l1, la, n_tc, n_vc)
    for a in range(len(l1)):
        one = _instance(inst, l1[a], la[a], n_tc[a], n_vc[a])
        assert lower[a] == pytest.approx(_scalar_lower(one), rel=1e-12)
        assert serial[a] == pytest.approx(sum(one.q), rel=1e-12)


@pytest.mark.parametrize("seed", range(25))
def test_never_above_the_optimum_and_serial_is_a_real_schedule(seed):
    rng = random.Random(1000 + seed)
    inst = random_instance(rng, n_max=6)
    plan, l1, la, n_tc, n_vc = _space(rng, inst, 3)
    lower, serial = layer_bounds(plan, l1, la, n_tc, n_vc)
    for a in range(len(l1)):
        one = _instance(inst, l1[a], la[a], n_tc[a], n_vc[a])
        assert lower[a] <= _bf(one) * (1 + 1e-12)
        # ops one after another in a topological order, each at its faster mode
        y = [1 if one.la[i] < one.l1[i] else 0 for i in range(one.n)]
        sched = serial_sgs(one, list(range(one.n)), y)
        assert verify(one, sched, 1e-12) == []
        assert sched.makespan(one) <= serial[a] * (1 + 1e-12)
        assert _bf(one) <= serial[a] * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_tied_thresholds_get_the_scalar_bounds(seed):
    """Latencies of few distinct values: operators share their head + L1 + tail, so the
    forced-mode energy meets thresholds several operators reach at once (all of them are forced
    there, as in the scalar bound)."""
    rng = random.Random(5000 + seed)
    inst = random_instance(rng, n_max=9)
    graph = OpGraph("sig", "bwd", list(range(inst.n)), inst.core, inst.edges)
    plan = layer_plan(graph, {("sig", "bwd", i): i for i in range(inst.n)})
    archs = 30
    l1 = np.array([[rng.choice([2, 4, 6]) * 1e-5 for _ in range(inst.n)] for _ in range(archs)])
    la = np.minimum(l1, np.array([[rng.choice([1, 2]) * 1e-5 for _ in range(inst.n)]] * archs))
    n_tc = np.array([rng.randint(1, 4) for _ in range(archs)])
    n_vc = np.array([rng.randint(1, 4) for _ in range(archs)])
    lower, _ = layer_bounds(plan, l1, la, n_tc, n_vc)
    for a in range(archs):
        one = _instance(inst, l1[a], la[a], n_tc[a], n_vc[a])
        assert lower[a] == pytest.approx(_scalar_lower(one), rel=1e-12)
