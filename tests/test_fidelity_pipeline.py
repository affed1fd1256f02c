"""Pipeline schedules, activation memory and strategy validation: closed forms on small cases."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.errors import PhazeError
from phaze.fidelity.memory import BlockShape, block_activation_bytes, block_working_bytes
from phaze.fidelity.pipeline import PipelineSchedule
from phaze.fidelity.strategy import Strategy


def simulate_1f1b_makespan(p, m, tf, tb):
    """Event simulation of PipeDream-Flush on p identical stages (fwd tf, bwd tb per stage):
    a brute-force check of the closed form m·(tf+tb) + (p-1)·(tf+tb)."""
    # order of work on each stage: warm-up forwards, then 1F1B, then cool-down backwards
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("f", i) for i in range(warm)]
        f_next, b_next = warm, 0
        while b_next < m:
            if f_next < m:
                order.append(("f", f_next))
                f_next += 1
            order.append(("b", b_next))
            b_next += 1
        orders.append(order)
    done = {}
    free = [0.0] * p
    pos = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            if kind == "f":
                dep = done.get(("f", s - 1, i), 0.0) if s > 0 else 0.0
                ready = s == 0 or ("f", s - 1, i) in done
            else:
                dep = done.get(("b", s + 1, i), 0.0) if s < p - 1 else done.get(("f", s, i), None)
                ready = (("b", s + 1, i) in done) if s < p - 1 else (("f", s, i) in done)
            if not ready:
                continue
            start = max(free[s], dep or 0.0)
            free[s] = start + (tf if kind == "f" else tb)
            done[(kind, s, i)] = free[s]
            pos[s] += 1
            remaining -= 1
            progressed = True
        assert progressed, "schedule deadlocked"
    return max(free)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (2, 5), (4, 4), (4, 9), (3, 7)])
def test_1f1b_bubble_matches_closed_form_and_simulation(p, m):
    tf, tb = 1.0, 2.0
    sched = PipelineSchedule(p, 1, m)
    total, bubble = sched.iteration_time([tf + tb] * p)
    ideal = m * (tf + tb)
    assert math.isclose(bubble / ideal, (p - 1) / m)
    assert math.isclose(sched.bubble_fraction, (p - 1) / m)
    assert math.isclose(total, simulate_1f1b_makespan(p, m, tf, tb))


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (8, 2, 16)])
def test_interleaved_bubble_traffic_and_memory_closed_forms(p, v, m):
    t = 3.0
    sched = PipelineSchedule(p, v, m)
    total, bubble = sched.iteration_time([t] * p)
    assert math.isclose(bubble / (m * t), (p - 1) / (v * m))
    assert math.isclose(total, m * t * (1 + (p - 1) / (v * m)))
    assert (
        sched.transfers_per_microbatch() == v * PipelineSchedule(p, 1, m).transfers_per_microbatch()
    )
    one_f_one_b = PipelineSchedule(p, 1, m).inflight_microbatch_stages(0)
    assert one_f_one_b == p
    assert math.isclose(sched.inflight_microbatch_stages(0), one_f_one_b * (1 + (p - 1) / (p * v)))


def test_1f1b_memory_by_stage():
    sched = PipelineSchedule(4, 1, 8)
    assert [sched.inflight_microbatch_stages(d) for d in range(4)] == [4, 3, 2, 1]
    # fewer microbatches than stages: only m are ever in flight
    assert PipelineSchedule(4, 1, 2).inflight_microbatch_stages(0) == 2
    # interleaved with m == p: Megatron runs every chunk forward first (all m·V in flight)
    assert PipelineSchedule(4, 3, 4).inflight_microbatch_stages(0) == 4


def test_unequal_stages_are_set_by_the_slowest():
    total, bubble = PipelineSchedule(3, 1, 10).iteration_time([1.0, 2.0, 1.5])
    assert math.isclose(total, 10 * 2.0 + 2.5)
    assert math.isclose(bubble, 2.5)


def test_invalid_interleaving_is_rejected():
    with pytest.raises(PhazeError, match="divisible by the pipeline stages"):
        PipelineSchedule(4, 2, 6)
    with pytest.raises(PhazeError, match="pp > 1"):
        PipelineSchedule(1, 2, 4)
    with pytest.raises(PhazeError, match="split evenly"):
        PipelineSchedule(4, 3, 8).check_layers(40)  # 40 % 12 != 0
    PipelineSchedule(4, 3, 8).check_layers(60)
    with pytest.raises(PhazeError, match="divisible by the pipeline stages"):
        Strategy(devices=64, tp=8, pp=4, microbatch=1, global_batch=12, interleave=2)


def test_strategy_validation_and_layout():
    s = Strategy(devices=64, tp=8, pp=2, microbatch=2, global_batch=64, interleave=1)
    assert (s.dp, s.microbatches) == (4, 8)
    assert s.tp_group(0, 1) == list(range(32, 40))
    assert s.dp_group(3, 0) == [3, 11, 19, 27]
    with pytest.raises(PhazeError, match="divisible by tp"):
        Strategy(devices=60, tp=8, pp=2, microbatch=1, global_batch=8)
    with pytest.raises(PhazeError, match="global batch"):
        Strategy(devices=64, tp=8, pp=2, microbatch=3, global_batch=64)
    with pytest.raises(PhazeError, match="sequence parallelism"):
        Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=8, sequence_parallel=True)
    with pytest.raises(PhazeError, match="recompute"):
        Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=8, recompute="some")


def test_korthikanti_activation_closed_forms():
    # their Eq. (2) with f = 4h: s·b·h·(10 + 24/t + 5as/(ht))
    shape = BlockShape(seq=2048, microbatch=1, hidden=12288, heads=96, ffn=4 * 12288)
    s, b, h, a = 2048, 1, 12288, 96
    for t in (1, 2, 8):
        expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
        assert math.isclose(block_activation_bytes(shape, t, False, "none"), expected)
        # sequence parallelism divides everything by t (their Eq. (4))
        assert math.isclose(
            block_activation_bytes(shape, t, True, "none"), s * b * h / t * (34 + 5 * a * s / h)
        )
        # selective recompute: s·b·h·34/t with sequence parallelism
        assert math.isclose(block_activation_bytes(shape, t, True, "selective"), 34 * s * b * h / t)
        assert math.isclose(block_activation_bytes(shape, t, False, "full"), 2 * s * b * h)
        assert math.isclose(block_activation_bytes(shape, t, True, "full"), 2 * s * b * h / t)
        assert block_working_bytes(shape, t, False, "none") == 0
        assert math.isclose(
            block_working_bytes(shape, t, False, "selective"), 5 * a * s * s * b / t
        )


@settings(max_examples=40, deadline=None)
@given(t=st.sampled_from([2, 4, 8]), b=st.integers(1, 8), heads_per=st.integers(1, 8))
def test_sequence_parallel_divides_layer_norm_dropout_activations_by_t(t, b, heads_per):
    heads = heads_per * t
    shape = BlockShape(seq=512, microbatch=b, hidden=64 * heads, heads=heads, ffn=256 * heads)
    no_sp = block_activation_bytes(shape, t, False, "none")
    sp = block_activation_bytes(shape, t, True, "none")
    # the difference is exactly the replicated (layer-norm / dropout) part, cut by t
    assert math.isclose(no_sp - sp, shape.replicated_bytes() * (1 - 1 / t))
