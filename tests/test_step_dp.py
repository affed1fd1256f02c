"""The exact placement under the step model (phaze/place/megatron.py) against brute force: every
split of small chains × every (t, b, p, d, ep) × V × recompute × sequence parallelism ×
distributed optimizer × DDP mode, each priced by the model."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.errors import PhazeError
from phaze.place.megatron import Axes, chain_key, fill, optimize
from phaze.step.model import Layout, PlacedChain, StageTerms, iteration_time, price
from phaze.step.strategy import Strategy
from tests.step_cases import (
    moe_variant,
    random_chain,
    random_constants,
    random_network,
    sequence_parallel_variant,
    tensor_parallel_variant,
)


def compositions(total, parts):
    """Every tuple of `parts` integers >= 0 summing to `total`."""
    for cuts in itertools.combinations_with_replacement(range(total + 1), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def brute_force(chains, net, consts, devices, global_batch, hbm, axes):
    """min over every strategy Strategy() accepts and every split, of the priced time."""
    best = math.inf
    for key, chain in chains.items():
        t, b, sp, ep, etp = chain_key(key)
        if sp not in axes.sequence_parallel:
            continue
        for p in range(1, devices + 1):
            if devices % (t * p):
                continue
            for v, rc, zero, ddp in itertools.product(
                axes.interleave, axes.recompute, axes.distributed_optimizer, axes.ddp
            ):
                kw = {
                    "devices": devices,
                    "tp": t,
                    "pp": p,
                    "microbatch": b,
                    "global_batch": global_batch,
                    "interleave": v,
                    "recompute": rc,
                    "sequence_parallel": sp,
                    "distributed_optimizer": zero,
                    "ddp": ddp,
                    "ep": ep,
                    "etp": etp,
                }
                try:
                    s = Strategy(**kw)
                    s.check_experts(chain.experts)
                except PhazeError:
                    continue
                layout = Layout.build(net, t, p, s.dp, ep, etp)
                terms = StageTerms(PlacedChain(chain, layout, consts), s.schedule, rc, zero, ddp)
                for stages in compositions(chain.blocks, p):
                    if Strategy(**kw, stages=stages).layers_reason(chain.blocks):
                        continue
                    n = np.asarray(stages, dtype=float)
                    if (terms.memory(n) > hbm).any():
                        continue
                    best = min(best, iteration_time(terms, stages, s.schedule))
    return best


def draw(seed):
    rng = np.random.default_rng(seed)
    blocks = int(rng.choice([1, 2, 3, 4, 4, 6, 6]))
    tps = [1] + sorted({int(rng.choice([2, 4]))} if rng.random() < 0.8 else set())
    microbatches = [1, 2] if rng.random() < 0.4 else [1]
    chains = {}
    for b in microbatches:
        base = random_chain(rng, blocks, 1, b, False)
        for t in tps:
            chains[(t, b, False)] = tensor_parallel_variant(rng, base, t) if t > 1 else base
            if t > 1:
                chains[(t, b, True)] = sequence_parallel_variant(rng, chains[(t, b, False)])
    # a third of the cases: a mixture-of-experts model, one chain per ep dividing its experts
    # (the same experts and all-to-all sizes at every ep of one (t, b, sp))
    if seed % 3 == 2:
        experts = int(rng.choice([2, 4]))
        dense = chains
        chains = {}
        for k, (key, chain) in enumerate(sorted(dense.items())):
            for ep in (e for e in (1, 2, 4) if experts % e == 0):
                sub = np.random.default_rng(seed * 100 + k)
                chains[(*key, ep)] = moe_variant(sub, chain, ep, experts)
                if key[0] > 1:  # the experts whole on each rank (etp = 1): ep may exceed dp
                    sub = np.random.default_rng(seed * 100 + k)
                    chains[(*key, ep, 1)] = moe_variant(sub, chain, ep, experts, etp=1)
    net = random_network(rng)
    consts = random_constants(rng)
    devices = int(rng.choice([1, 2, 4, 6, 8, 12]))
    global_batch = int(rng.choice([4, 8, 12, 24]))

    # from "little fits" to "everything fits": scaled by one device's memory for the whole
    # model without (or with full) recomputation
    def whole(rc):
        return max(
            price(
                c,
                Strategy(
                    devices=t,
                    tp=t,
                    pp=1,
                    microbatch=b,
                    global_batch=b,
                    recompute=rc,
                    sequence_parallel=sp,
                ),
                net,
                consts,
                1.0,
            )["peak_memory_bytes"]
            for key, c in chains.items()
            for t, b, sp in [key[:3]]
            if (len(key) == 3 or key[3:] == (1,)) and sp == (c.experts > 0 and t > 1)
        )

    if rng.random() < 0.6:
        hbm = float(rng.uniform(0.1, 1.5) * whole("none"))
    else:
        hbm = float(rng.uniform(0.3, 1.1) * whole("full"))

    def subset(values):
        """All values, or (as config lists may) a random non-empty part of them."""
        if rng.random() < 0.5:
            return tuple(values)
        keep = [x for x in values if rng.random() < 0.5]
        return tuple(keep) or (values[int(rng.integers(len(values)))],)

    axes = Axes(
        interleave=subset((1, 2, 3)),
        recompute=subset(("none", "selective", "full")),
        sequence_parallel=subset((False, True)),
        distributed_optimizer=subset((False, True)),
        ddp=subset(("overlap", "after")),
    )
    return chains, net, consts, devices, global_batch, hbm, axes


@pytest.mark.parametrize("seed", range(60))
def test_optimize_equals_brute_force(seed):
    chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
    got = optimize(chains, net, consts, devices, global_batch, hbm, axes)
    want = brute_force(chains, net, consts, devices, global_batch, hbm, axes)
    if math.isinf(want):
        assert got.strategy is None
        return
    assert got.strategy is not None
    assert got.time_s == pytest.approx(want, rel=1e-9)
    # what it returns is what it claims, priced from scratch
    s = got.strategy
    chain = {chain_key(k): c for k, c in chains.items()}[
        (s.tp, s.microbatch, s.sequence_parallel, s.ep, s.expert_tp)
    ]
    again = price(chain, s, net, consts, 1.0, hbm)
    assert again["iteration_time_s"] == pytest.approx(got.time_s, rel=1e-9)
    assert again["fits_memory"]


def test_brute_force_cases_bind_and_cover_the_axes():
    """Not vacuous: memory binds in some cases, nothing fits in others, and the optima use
    interleaving, every recompute mode, SP, the distributed optimizer, uneven stages."""
    seen, infeasible = set(), 0
    for seed in range(60):
        chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
        got = optimize(chains, net, consts, devices, global_batch, hbm, axes)
        if got.strategy is None:
            infeasible += 1
            continue
        s = got.strategy
        seen |= {f"rc:{s.recompute}", f"ddp:{s.ddp}", f"v{s.interleave}"}
        seen |= {"sp"} if s.sequence_parallel else set()
        seen |= {"zero"} if s.distributed_optimizer else set()
        seen |= {"pp"} if s.pp > 1 else set()
        seen |= {"uneven"} if len(set(s.stages)) > 1 else set()
        seen |= {f"moe ep{s.ep}"} if seed % 3 == 2 else set()
        seen |= {"moe etp1"} if seed % 3 == 2 and s.tp > 1 and s.expert_tp == 1 else set()
    assert 2 <= infeasible <= 40
    want = {"rc:none", "rc:selective", "rc:full", "ddp:overlap", "ddp:after", "v2", "v3"}
    assert want | {"sp", "zero", "pp", "uneven", "moe ep1", "moe ep2", "moe etp1"} <= seen


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    zero=st.booleans(),
    ddp=st.sampled_from(["overlap", "after"]),
    rc=st.sampled_from(["none", "selective", "full"]),
)
def test_each_ranks_tail_has_interval_sublevel_sets(seed, zero, ddp, rc):
    """What the split solver relies on: for every rank, {n : tail(n) <= x} is an interval of
    block counts for every x (the tail is quasi-convex in n), memory is non-decreasing in n."""
    rng = np.random.default_rng(seed)
    t = int(rng.choice([1, 2]))
    p, d = int(rng.integers(1, 4)), int(rng.integers(2, 5))
    # half the cases a mixture-of-experts chain (ep = 2 when it divides d)
    moe = bool(rng.random() < 0.5)
    ep = 2 if moe and d % 2 == 0 else 1
    chain = random_chain(rng, 12, t, 1, moe and t > 1, ep, 4 if moe else 0)
    net = random_network(rng)
    consts = random_constants(rng)
    s = Strategy(
        devices=t * p * d,
        tp=t,
        pp=p,
        microbatch=1,
        global_batch=d * p * 2,
        recompute=rc,
        distributed_optimizer=zero,
        ddp=ddp,
        stages=None,
        sequence_parallel=moe and t > 1,
        ep=ep,
    )
    terms = StageTerms(
        PlacedChain(chain, Layout.build(net, t, p, d, ep), consts), s.schedule, rc, zero, ddp
    )
    n = np.broadcast_to(np.arange(13.0), (p, 13))
    tail, mem = terms.tail(n), terms.memory(n)
    assert (np.diff(mem, axis=1) >= -1e-12 * np.abs(mem[:, 1:])).all()
    for j in range(p):
        for x in np.unique(tail[j]):
            # n >= 1: an interval; n = 0 may stand apart (no expert gradients to reduce there;
            # `fill` handles that piece on its own)
            ok = np.flatnonzero(tail[j, 1:] <= x * (1 + 1e-12))
            assert (np.diff(ok) == 1).all(), (j, tail[j])
            if not chain.experts:
                ok = np.flatnonzero(tail[j] <= x * (1 + 1e-12))
                assert (np.diff(ok) == 1).all(), (j, tail[j])


@pytest.mark.parametrize("gaps", [False, True], ids=["intervals", "with gaps"])
def test_fill_is_the_min_max_split(gaps):
    """The greedy fill against enumeration on random interval masks, and on masks of an interval
    and the point 0 apart, or any random mask (rows split into their runs)."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        p, K = int(rng.integers(1, 5)), int(rng.integers(0, 7))
        a, c = rng.uniform(0, 3, p), float(rng.uniform(0.1, 2))
        T = a[:, None] + c * np.arange(K + 1)[None, :]
        lo = rng.integers(0, K + 1, p)
        hi = np.minimum(K, lo + rng.integers(0, K + 1, p))
        allowed = (np.arange(K + 1) >= lo[:, None]) & (np.arange(K + 1) <= hi[:, None])
        if gaps:
            allowed[:, 0] |= rng.random(p) < 0.5
            if rng.random() < 0.3:
                allowed = rng.random((p, K + 1)) < 0.6
        want = min(
            (
                max(T[j, k[j]] for j in range(p))
                for k in itertools.product(range(K + 1), repeat=p)
                if sum(k) == K and all(allowed[j, k[j]] for j in range(p))
            ),
            default=None,
        )
        got = fill(T, allowed, K)
        if want is None:
            assert got is None
            continue
        M, k = got
        assert M == pytest.approx(want) and k.sum() == K
        assert allowed[np.arange(p), k].all() and T[np.arange(p), k].max() == pytest.approx(M)


def _scaled(chain, factor):
    """The chain with every computation time multiplied by `factor` (collectives kept)."""
    from dataclasses import replace

    def layer(x):
        return replace(
            x,
            fwd_s=x.fwd_s * factor,
            bwd_s=x.bwd_s * factor,
            attention_fwd_s=x.attention_fwd_s * factor,
        )

    return replace(
        chain, first=layer(chain.first), block=layer(chain.block), last=layer(chain.last)
    )


@pytest.mark.parametrize("seed", range(30))
def test_a_lower_bound_chain_with_an_achievable_window_prices_a_lower_bound(seed):
    """What the search's bound tier relies on: layer latencies below the achievable ones, with
    the achievable ones as the DDP overlap's window, never price a strategy — nor the optimum —
    above the achievable chain's time."""
    from dataclasses import replace

    chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
    rng = np.random.default_rng(seed)
    factor = float(rng.uniform(0.3, 1.0))
    low = {k: replace(_scaled(c, factor), window=c) for k, c in chains.items()}
    got = optimize(low, net, consts, devices, global_batch, hbm, axes)
    real = optimize(chains, net, consts, devices, global_batch, hbm, axes)
    assert (got.strategy is None) == (real.strategy is None)  # memory does not depend on time
    if real.strategy is None:
        return
    assert got.time_s <= real.time_s * (1 + 1e-12)
    s = real.strategy
    low = {chain_key(k): c for k, c in low.items()}
    key = (s.tp, s.microbatch, s.sequence_parallel, s.ep, s.expert_tp)
    assert price(low[key], s, net, consts, 1.0)["iteration_time_s"] <= real.time_s * (1 + 1e-12)


def test_without_the_window_a_faster_backward_can_price_a_step_slower():
    """Why `ChainCost.window` exists: with interleaving, rank 0 critical through communication
    and rank 1 holding many blocks, halving the latencies shortens rank 1's backward, exposes
    more of its gradient all-reduce than the pipeline gains. The window restores the bound."""
    from dataclasses import replace

    from phaze.network import HierarchicalNetwork, LinkLevel
    from phaze.step.layers import ChainCost, LayerCost
    from phaze.step.model import StepConstants

    level = LinkLevel(1.0, 0.0, 1.0)
    net = HierarchicalNetwork(8, level, level)
    heavy_comm = LayerCost(0.0, 0.0, 0.0, 0.0, fwd_collectives=(("all_reduce", 10.0),))
    block = LayerCost(fwd_s=0.0, bwd_s=1.0, params=4.0, activation_bytes=0.0)
    last = LayerCost(0.0, 0.0, 0.0, 0.0)
    real = ChainCost(heavy_comm, block, last, 12, 2, 1, False, boundary_bytes=0.0)
    consts = StepConstants(16, 12, 2, 2, 0, 0, 1e-6, 1e12, True)
    s = Strategy(devices=8, tp=2, pp=2, microbatch=1, global_batch=4, interleave=2, stages=(2, 10))
    t_real = price(real, s, net, consts, 1.0)["iteration_time_s"]
    low = _scaled(real, 0.5)
    assert price(low, s, net, consts, 1.0)["iteration_time_s"] > t_real
    assert price(replace(low, window=real), s, net, consts, 1.0)["iteration_time_s"] <= t_real


def test_a_mixture_of_experts_model_with_tensor_parallelism_needs_sequence_parallelism():
    """Megatron-LM's MoE layer refuses to train with tp > 1 and no sequence parallelism: the
    search skips those configurations (and ep not dividing dp) with their reasons."""
    rng = np.random.default_rng(3)
    base = random_chain(rng, 4, 2, 1, False)
    chains = {
        (2, 1, False, ep): moe_variant(np.random.default_rng(1), base, ep, 4) for ep in (1, 4)
    }
    net, consts = random_network(rng), random_constants(rng)
    axes = Axes(sequence_parallel=(False,))
    got = optimize(chains, net, consts, 8, 8, math.inf, axes)
    assert got.strategy is None
    assert got.skipped["mixture of experts with tp > 1 needs sequence parallelism"] > 0
    assert got.skipped["ep does not divide dp"] > 0  # e.g. p = 2, d = 2 with ep = 4
    sp = {(2, 1, True, ep): moe_variant(np.random.default_rng(1), base, ep, 4) for ep in (1, 4)}
    sp = {k: replace_sp(c) for k, c in sp.items()}
    got = optimize(sp, net, consts, 8, 8, math.inf, Axes())
    assert got.strategy is not None and got.strategy.sequence_parallel


def test_whole_experts_let_the_expert_parallel_size_exceed_dp():
    """etp = 1: the expert-parallel group spans the tensor-parallel ranks, so ep need only
    divide tp·dp (Megatron's parallel folding): 4 devices at tp 4 (dp 1) place ep = 4, and
    with the experts split over tp (etp = tp) the same ep is skipped."""
    rng = np.random.default_rng(4)
    base = replace_sp(random_chain(rng, 4, 4, 1, False))
    whole = {(4, 1, True, 4, 1): moe_variant(np.random.default_rng(2), base, 4, 8, etp=1)}
    net, consts = random_network(rng), random_constants(rng)
    got = optimize(whole, net, consts, 4, 4, math.inf, Axes())
    assert got.strategy is not None
    assert (got.strategy.tp, got.strategy.dp, got.strategy.ep, got.strategy.expert_tp) == (
        4,
        1,
        4,
        1,
    )
    split = {(4, 1, True, 4): moe_variant(np.random.default_rng(2), base, 4, 8)}
    got = optimize(split, net, consts, 4, 4, math.inf, Axes())
    assert got.strategy is None and got.skipped["ep does not divide dp"] > 0


def replace_sp(chain):
    from dataclasses import replace

    return replace(chain, sequence_parallel=True)


def _retime(rng, chain):
    """`chain` with every computation time (its window's too) scaled by its own random factor:
    the same layers on another architecture (`ChainCost.shape` unchanged)."""
    from dataclasses import replace

    def layer(x):
        f = rng.uniform(0.2, 3.0, size=3)
        return replace(
            x,
            fwd_s=x.fwd_s * f[0],
            bwd_s=x.bwd_s * f[1],
            attention_fwd_s=min(x.attention_fwd_s * f[2], x.fwd_s * f[0]),
        )

    out = replace(chain, first=layer(chain.first), block=layer(chain.block), last=layer(chain.last))
    if rng.random() < 0.5:  # a lower-bound chain with an achievable window
        out = replace(out, window=chain)
    assert out.shape == chain.shape
    return out


@pytest.mark.parametrize("seed", range(30))
def test_a_shared_setting_gives_every_architecture_its_own_optimum(seed):
    """`optimize` with the settings dict a placement job keeps across its architectures returns,
    for each, what a fresh search returns; a chain of another shape (here: more parameters, so
    other memory) is not served the first shape's setting."""
    from dataclasses import replace

    chains, net, consts, devices, global_batch, hbm, axes = draw(seed)
    rng = np.random.default_rng(1000 + seed)
    archs = [chains] + [{k: _retime(rng, c) for k, c in chains.items()} for _ in range(3)]
    heavier = {
        k: replace(c, block=replace(c.block, params=c.block.params * 1.7))
        for k, c in chains.items()
    }
    assert {c.shape for c in heavier.values()}.isdisjoint(c.shape for c in chains.values())
    archs.append(heavier)
    shared = {}
    for arch in archs:
        got = optimize(arch, net, consts, devices, global_batch, hbm, axes, shared)
        fresh = optimize(arch, net, consts, devices, global_batch, hbm, axes)
        assert got.strategy == fresh.strategy
        assert got.time_s == fresh.time_s
        assert got.skipped == fresh.skipped and got.configurations == fresh.configurations
    assert len(shared) == 2


@pytest.mark.parametrize("seed", range(20))
def test_retimed_terms_are_the_terms_of_the_other_chain(seed):
    """`StageTerms.retimed` recomputes every term a computation time enters, and only those:
    every attribute equals the terms built on the other chain from scratch."""
    chains, net, consts, *_ = draw(seed)
    rng = np.random.default_rng(2000 + seed)
    for key, chain in sorted(chains.items()):
        t, _, _, ep, etp = chain_key(key)
        other = _retime(rng, chain)
        for p in (1, 2, 3):
            d = 2 * ep
            s = Strategy(
                devices=t * p * d,
                tp=t,
                pp=p,
                microbatch=chain.microbatch,
                global_batch=chain.microbatch * d * p,
                recompute=str(rng.choice(["none", "selective", "full"])),
                sequence_parallel=chain.sequence_parallel,
                ddp=str(rng.choice(["overlap", "after"])),
                ep=ep,
                etp=etp,
            )
            layout = Layout.build(net, t, p, d, ep, etp)
            args = (s.schedule, s.recompute, False, s.ddp)
            built = StageTerms(PlacedChain(chain, layout, consts), *args)
            want = StageTerms(PlacedChain(other, layout, consts), *args)
            got = built.retimed(other)
            assert vars(got).keys() == vars(want).keys()
            for name, value in vars(want).items():
                assert np.array_equal(getattr(got, name), value), name
            # the original is untouched
            again = StageTerms(PlacedChain(chain, layout, consts), *args)
            for name, value in vars(again).items():
                assert np.array_equal(getattr(built, name), value), name
