"""The array tier's achieved placement (phaze/place/arrays.py) on random chains (tests/test_step_dp.py's
cases): each architecture's time is the step model's own price of the configuration and split it
names (which fit in memory), never below the exact search's optimum on the same layer times, and
the space bound on those times is never above it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from phaze.place.arrays import achieved_times, step_times, upper_times
from phaze.place.bound import SpaceChain, time_lower_bounds
from phaze.place.megatron import optimize
from phaze.step.model import iteration_time, price
from phaze.step.strategy import Strategy
from tests.test_place_bound import _space
from tests.test_step_dp import draw


def _lo(space: dict, exact: list) -> tuple[dict, list]:
    """The lo tier's inputs: the DDP window is the layer times themselves."""
    space = {k: SpaceChain(c.skeleton, c.lower, c.lower, c.attention) for k, c in space.items()}
    exact = [{k: replace(c, window=None) for k, c in ch.items()} for ch in exact]
    return space, exact


@pytest.mark.parametrize("seed", range(40))
def test_achieved_is_the_step_models_price_of_its_placement_and_never_below_the_optimum(seed):
    """Mutation check (tried, fails here): a step time that drops the pipeline bubble
    ((ΣT − max T)/V) disagrees with the step model's price."""
    chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
    rng = np.random.default_rng(seed + 11)
    space, exact = _lo(*_space(chains, rng, 4))
    got = achieved_times(space, net, consts, devices, global_batch, [hbm], axes)
    bound = time_lower_bounds(space, net, consts, devices, global_batch, [hbm], axes)[0]
    priced = placed = 0
    for a, ch in enumerate(exact):
        want = optimize(ch, net, consts, devices, global_batch, hbm, axes)
        if want.strategy is None:
            assert math.isinf(got.time_s[0, a])
            continue
        placed += 1
        assert got.time_s[0, a] >= want.time_s * (1 - 1e-9)
        assert bound[a] <= want.time_s * (1 + 1e-9)
        if not math.isfinite(got.time_s[0, a]):
            continue
        cfg = got.configs[got.config[0, a]]
        lay = cfg.placed.layout
        strategy = Strategy(
            devices=devices,
            tp=lay.tp,
            pp=lay.pp,
            microbatch=cfg.placed.chain.microbatch,
            global_batch=global_batch,
            interleave=cfg.schedule.chunks,
            recompute=cfg.recompute,
            sequence_parallel=cfg.sequence_parallel,
            distributed_optimizer=cfg.distributed_optimizer,
            ddp=cfg.ddp,
            stages=got.splits[0][a],
            ep=lay.ep,
            etp=lay.expert_tp,
        )
        key = (lay.tp, cfg.placed.chain.microbatch, cfg.sequence_parallel, lay.ep, lay.expert_tp)
        out = price(ch[key], strategy, net, consts, 1.0, hbm)
        assert out["fits_memory"]
        assert out["iteration_time_s"] == pytest.approx(got.time_s[0, a], rel=1e-9)
        priced += 1
    assert priced == placed  # wherever a placement exists, the tier finds one


def test_step_times_of_one_split_equal_the_step_model():
    """The vectorised time of a fixed configuration and split, architecture by architecture."""
    chains, net, consts, devices, global_batch, hbm, axes = draw(3)
    rng = np.random.default_rng(5)
    space, exact = _lo(*_space(chains, rng, 6))
    got = achieved_times(space, net, consts, devices, global_batch, [hbm], axes)
    for c, cfg in enumerate(got.configs):
        terms = got.terms[c]
        lay = cfg.placed.layout
        sc = space[(lay.tp, cfg.placed.chain.microbatch, lay.ep, lay.expert_tp)]
        blocks = cfg.placed.chain.blocks
        v = cfg.schedule.chunks
        base, extra = divmod(blocks // v, lay.pp)
        stages = tuple((base + (j < extra)) * v for j in range(lay.pp))
        t = step_times(terms, sc, np.array(stages), cfg.schedule.microbatches, v, cfg.recompute)
        key = (lay.tp, cfg.placed.chain.microbatch, cfg.sequence_parallel, lay.ep, lay.expert_tp)
        for a, ch in enumerate(exact):
            own = terms.retimed(ch[key])
            assert t[a] == pytest.approx(iteration_time(own, stages, cfg.schedule), rel=1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_the_tightened_bound_is_the_exact_searchs_time_and_never_above_it(seed):
    """Solved exactly for every architecture (achieved time +inf), the bound equals the exact
    search on the same lower bounds and windows; solved nowhere, it is the relaxed bound.
    Mutation check (tried, fails here): walking the configurations in reverse job order instead
    of by their bounds (the walk then stops before the best configuration)."""
    chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
    rng = np.random.default_rng(seed + 17)
    space, exact = _space(chains, rng, 4)
    args = (space, net, consts, devices, global_batch, [hbm], axes)
    relaxed = time_lower_bounds(*args)
    none = upper_times(*args, np.zeros((1, 4)))
    assert np.array_equal(none, relaxed)
    got = upper_times(*args, np.full((1, 4), np.inf))[0]
    for a, ch in enumerate(exact):
        want = optimize(ch, net, consts, devices, global_batch, hbm, axes)
        if want.strategy is None:
            assert math.isinf(got[a])
            continue
        assert got[a] == pytest.approx(want.time_s, rel=1e-9)
        assert got[a] >= relaxed[0, a] * (1 - 1e-12)
