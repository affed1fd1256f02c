"""A SCIP node limit ends solves at the same point on every run (reproducible artifacts)."""

import random

from phaze.schedule.bounds import lower_bound
from phaze.schedule.ilp import solve_once
from phaze.schedule.instance import make_instance
from phaze.schedule.listsched import serial_sgs


def _wide_instance(seed: int):
    """Twelve independent ops of random latencies on 3 + 3 cores: many incomparable pairs, so a
    one-node limit stops SCIP before it proves optimality."""
    rng = random.Random(seed)
    ops = []
    for i in range(12):
        l1 = rng.uniform(1, 9) * 1e-5
        ops.append(
            {
                "id": i,
                "core": rng.choice(["tc", "vc", "fused"]),
                "latency_1core_s": l1,
                "latency_allcores_s": l1 * rng.uniform(0.3, 1.0),
            }
        )
    return make_instance(3, 3, ops, [(0, 1), (2, 3)])


def test_node_limit_is_reported_and_repeatable():
    inst = _wide_instance(3)
    warm = serial_sgs(inst, list(range(inst.n)), [0] * inst.n)
    lb, _ = lower_bound(inst)
    runs = [
        solve_once(inst, warm, lb, time_limit_s=120, mip_gap=0.0, threads=1, node_limit=1)
        for _ in range(2)
    ]
    assert runs[0].status == "node_limit"
    assert runs[0].status == runs[1].status
    assert runs[0].objective_s == runs[1].objective_s
    assert runs[0].bound_s == runs[1].bound_s
    assert runs[0].start == runs[1].start
    # without the limit SCIP may only get better, never worse
    free = solve_once(inst, warm, lb, time_limit_s=120, mip_gap=0.0, threads=1)
    assert free.objective_s <= runs[0].objective_s * (1 + 1e-9)


def test_a_work_bound_call_gives_no_step_a_share_of_the_clock(monkeypatch):
    # fit_s set (schedule.node_limit and bnb_node_limit both on): the mode-bound MIP and the mode
    # kicks run under the whole time limit, so their node limit / kick count ends them on every
    # machine; without fit_s they take 30 % and 20 % of the time left
    import time

    from phaze.schedule import ilp

    inst = _wide_instance(3)
    warm = serial_sgs(inst, list(range(inst.n)), [0] * inst.n)
    lb, _ = lower_bound(inst)
    seen = {}
    scip, kick = ilp._scip, ilp.kick_modes

    def spy_scip(m, time_limit, *args):
        seen.setdefault("scip", []).append(time_limit)
        return scip(m, time_limit, *args)

    def spy_kick(inst_, warm_, kicks, seed, deadline):
        seen.setdefault("kicks", []).append(deadline.end - time.monotonic())
        return kick(inst_, warm_, kicks, seed, deadline)

    monkeypatch.setattr(ilp, "_scip", spy_scip)
    monkeypatch.setattr(ilp, "kick_modes", spy_kick)
    limit = 100.0
    for fit_s, low, high in ((limit, 0.9 * limit, limit), (None, 0.0, 0.31 * limit)):
        seen.clear()
        solve_once(inst, warm, lb, limit, 0.0, 1, node_limit=1, fit_s=fit_s)
        assert low <= seen["scip"][0] <= high  # the mode bound
        assert seen["kicks"] and low <= seen["kicks"][0] <= high  # the kicks
