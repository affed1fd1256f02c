"""The space bound's placement part (phaze/place/bound.py) against the exact search: on random
chains (tests/test_step_dp.py's cases: networks, memory from nothing-fits to everything-fits,
random axis subsets) and random per-architecture layer times, the time bound is never above
`phaze.place.megatron.optimize` on the same times (with the window at its upper bound), and meets
it where the relaxation is exact."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from phaze.place.bound import LOWER, SpaceChain, time_lower_bounds
from phaze.place.megatron import chain_key, optimize
from phaze.step.layers import ChainCost
from tests.test_step_dp import draw


def _zero(chain: ChainCost) -> ChainCost:
    layers = {
        n: replace(getattr(chain, n), fwd_s=0.0, bwd_s=0.0, attention_fwd_s=0.0)
        for n in ("first", "block", "last")
    }
    return replace(chain, **layers, window=None)


def _space(chains, rng, n_archs):
    """(SpaceChain per (t, b, ep, etp), per-arch exact chains): each architecture's layer times
    are the case's times scaled by its own random factors; its window between them and twice
    them."""
    space, exact = {}, [{} for _ in range(n_archs)]
    chains = {chain_key(k): c for k, c in chains.items()}
    for t, b, ep, etp in sorted({(t, b, ep, x) for t, b, _, ep, x in chains}):
        base = chains[(t, b, False, ep, etp)]
        scale = {k: rng.uniform(0.3, 1.5, n_archs) for k in LOWER}
        lower = {
            k: getattr(getattr(base, k.split("_")[0]), k.split("_")[1] + "_s") * scale[k]
            for k in LOWER
        }
        window = {k: lower[k] * rng.uniform(1.0, 2.0, n_archs) for k in LOWER}
        attention = base.block.attention_fwd_s * rng.uniform(0.0, 1.0, n_archs)
        attention = np.minimum(attention, lower["block_fwd"])
        skel = {
            sp: _zero(c)
            for (tt, bb, sp, e, x), c in chains.items()
            if (tt, bb, e, x) == (t, b, ep, etp)
        }
        space[(t, b, ep, etp)] = SpaceChain(skel, lower, window, attention)
        for a in range(n_archs):
            for (tt, bb, sp, e, x), c in chains.items():
                if (tt, bb, e, x) != (t, b, ep, etp):
                    continue

                def layer(name, times, c=c, a=a, lower=lower, attention=attention):
                    lay = getattr(c, name)
                    fwd = times.get(f"{name}_fwd", lower[f"{name}_fwd"])[a]
                    return replace(
                        lay,
                        fwd_s=float(fwd),
                        bwd_s=float(times[f"{name}_bwd"][a]),
                        attention_fwd_s=float(attention[a]) if name == "block" else 0.0,
                    )

                main = {n: layer(n, lower) for n in ("first", "block", "last")}
                win = {n: layer(n, window) for n in ("first", "block", "last")}
                exact[a][(tt, bb, sp, e, x)] = replace(
                    c, **main, window=replace(c, **win, window=None)
                )
    return space, exact


@pytest.mark.parametrize("seed", range(60))
def test_never_above_the_exact_search(seed):
    chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
    rng = np.random.default_rng(seed + 7)
    space, exact = _space(chains, rng, 5)
    got = time_lower_bounds(space, net, consts, devices, global_batch, [hbm], axes)[0]
    for a, ch in enumerate(exact):
        want = optimize(ch, net, consts, devices, global_batch, hbm, axes)
        if want.strategy is None:
            assert math.isinf(got[a]), (a, got[a])
            continue
        assert got[a] <= want.time_s * (1 + 1e-9), (seed, a, got[a], want.time_s)
        # a bound, not a guess: within the relaxation's reach of the exact time
        assert got[a] >= 0.2 * want.time_s, (seed, a, got[a], want.time_s)


def test_exact_with_one_stage_and_no_overlap():
    """pp = 1 only (one device per replica, tp 1), DDP after: M = S, X the whole tail, and the
    min-max over splits has one split: the bound is the exact time."""
    for seed in range(20):
        chains, net, consts, _devices, global_batch, _hbm, axes = draw(seed)
        chains = {k: c for k, c in chains.items() if k[0] == 1}
        axes = replace(axes, ddp=("after",), interleave=(1,))
        rng = np.random.default_rng(seed)
        space, exact = _space(chains, rng, 3)
        got = time_lower_bounds(space, net, consts, 1, global_batch, [math.inf], axes)[0]
        for a, ch in enumerate(exact):
            want = optimize(ch, net, consts, 1, global_batch, math.inf, axes)
            assert got[a] == pytest.approx(want.time_s, rel=1e-9), (seed, a)


def test_tight_at_the_best_configuration_on_the_cases():
    """Over the random cases, the bound reaches the exact time for most architectures (within
    1e-6) — the relaxation is exact whenever the same rank holds both maxima."""
    close = total = 0
    for seed in range(30):
        chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
        rng = np.random.default_rng(seed + 11)
        space, exact = _space(chains, rng, 4)
        got = time_lower_bounds(space, net, consts, devices, global_batch, [hbm], axes)[0]
        for a, ch in enumerate(exact):
            want = optimize(ch, net, consts, devices, global_batch, hbm, axes)
            if want.strategy is None:
                continue
            total += 1
            close += got[a] >= want.time_s * (1 - 1e-6)
    assert total >= 60 and close >= 0.5 * total, (close, total)
