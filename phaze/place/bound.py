"""A lower bound on the step time of every architecture of a space at once (the search's space
bound), under the step model (`place.model: megatron`) or upstream's objective (`upstream`).

Inputs per tensor-parallel width t and microbatch b: the chain's architecture-independent part
(`phaze.place.chains.ChainTables.skeleton`: parameters, activations, collectives, sends) and, per
architecture (arrays), each layer's forward / backward lower bound, the serial upper bound of
each layer's makespan (the DDP overlap's window) and core attention's forward time
(`phaze.schedule.space`).

Why the bound holds (docs/search.md, "Bounds over the whole space"). For one configuration
(`phaze.place.megatron.configurations`) and one split of the blocks the step model's time is

    (m − 1/V)·M + S/V + X,   M = max_j T_j,  S = Σ_j T_j,  X = max_j tail_j

(`phaze.place.megatron`), nondecreasing in every layer time and nonincreasing in the window; the
splits that fit in memory do not depend on layer times (`allowed_blocks`). So with every layer
time at its lower bound and the window at its upper bound the time is at most the true one. `S`
is the same for every split, and ``max_j a_j + max_j b_j ≥ max_j (a_j + b_j)`` gives

    time ≥ S/V + min over splits of max_j [(m − 1/V)·T_j(n_j) + tail_j(n_j)]

Rank j's term is a function of its block count n: ``(m − 1/V)·T_j`` is affine and nondecreasing;
the tail is ``max(reduction − window, last bucket) + after`` with DDP overlap (``reduction +
after`` without), the reduction, window, last bucket and the rest affine or min-of-affine in n
(collectives are affine in their size). So the ranks' sublevel sets are intervals of n, and a
split below a level exists exactly when every rank's interval meets its allowed counts and the
intervals can add up to the blocks: the min-max is found by bisection on the level, for every
architecture at once, keeping the lower end of the bracket (a level at which no split was shown
to exist), and every rounding widens the intervals — so the result can only be lower than the
exact min-max. The coefficients are read off the step model (`StageTerms` of the skeleton chain,
evaluated at n = 1 and 2), not written again here.

The bound of an architecture is the smallest over configurations. `ddp: after` is skipped when
`overlap` is searched: for the same split its tail is the reduction in full, never less than the
overlap's ``max(reduction − window, last bucket)`` (the last bucket is part of the reduction).
Configurations are bounded cheaply first (``M ≥ S/p``, ``X ≥ 0``); the min-max is solved only for
the architectures whose cheap bound is below their best bound so far.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from phaze.network import Network, ring_seconds
from phaze.place.inputs import trace_key
from phaze.place.megatron import Axes, allowed_blocks, configurations, tail_floor
from phaze.step.layers import ChainCost
from phaze.step.model import StageTerms, StepConstants

#: the per-architecture arrays of one (t, b): each layer pass's lower bound and the makespan of
#: a real schedule of it (an upper bound of the optimum: the DDP window, and an achievable time)
LOWER = ("first_fwd", "first_bwd", "block_fwd", "block_bwd", "last_fwd", "last_bwd")
BISECTION_STEPS = 48
BIG = 1e18


@dataclass
class SpaceChain:
    """One (t, b[, ep]) of every architecture: the skeleton chains per sequence-parallel setting, and
    arrays over architectures: ``lower`` (each layer pass's lower bound, keys `LOWER`),
    ``window`` (serial upper bounds, same keys), ``attention`` (core attention's forward)."""

    skeleton: dict[bool, ChainCost]
    lower: dict[str, np.ndarray]
    window: dict[str, np.ndarray]
    attention: np.ndarray

    @property
    def n_archs(self) -> int:
        return len(self.attention)

    def take(self, idx: np.ndarray) -> SpaceChain:
        return SpaceChain(
            self.skeleton,
            {k: v[idx] for k, v in self.lower.items()},
            {k: v[idx] for k, v in self.window.items()},
            self.attention[idx],
        )


def _affine(f, n_ranks: int, at_zero: bool) -> tuple[np.ndarray, np.ndarray]:
    """(c0, c1) with c0 + c1·n ≤ f(n) for every n ≥ 0 (exact for n ≥ 1): f is affine in n for
    n ≥ 1; at n = 0 a zero-size collective costs nothing, so c0 is lowered to f(0) there."""
    one, two = (np.asarray(f(np.full(n_ranks, x)), dtype=float) for x in (1.0, 2.0))
    c1 = two - one
    c0 = one - c1
    if at_zero:
        c0 = np.minimum(c0, np.asarray(f(np.zeros(n_ranks)), dtype=float))
    return c0, c1


class _Ranks:
    """A configuration's architecture-independent per-rank coefficients, grouped into classes of
    identical ranks (their memory caps apart)."""

    def __init__(self, terms: StageTerms, lo: np.ndarray, hi: np.ndarray):
        """``lo`` / ``hi``: each rank's fewest and most units of V blocks."""
        p = terms.p
        zero = lo <= 0
        self.time0, self.time1 = _affine(terms.time, p, zero.any())
        self.bwd0, self.bwd1 = _affine(terms.backward, p, zero.any())
        self.red0, self.red1 = _affine(terms.reduction, p, zero.any())
        # the last bucket is min(full bucket, all gradients): the full bucket's reduction is a
        # constant per rank, the gradients' is the reduction itself
        self.bucket = np.asarray(terms.bucket_reduction(np.ones(p)), dtype=float)

        def rest(n):
            return terms.after_reduction(n) + terms.optimizer(n)

        self.rest0, self.rest1 = _affine(rest, p, zero.any())
        first = np.arange(p) == 0
        last = np.arange(p) == p - 1
        keys = {}
        for j in range(p):
            key = (
                bool(first[j]),
                bool(last[j]),
                float(lo[j]),
                *(
                    float(x[j])
                    for x in (
                        self.time0,
                        self.time1,
                        self.bwd0,
                        self.bwd1,
                        self.red0,
                        self.red1,
                        self.bucket,
                        self.rest0,
                        self.rest1,
                    )
                ),
            )
            keys.setdefault(key, []).append(j)
        self.classes = []
        for js in keys.values():
            caps = np.sort(hi[js].astype(float))
            self.classes.append(
                (js[0], bool(first[js[0]]), bool(last[js[0]]), float(lo[js[0]]), caps)
            )


def _floor_count(c0, c1, level):
    """Largest integer k ≥ 0 with c0 + c1·k ≤ level (c1 ≥ 0), −1 if none, BIG if all; rounded
    up (widening the sublevel set)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.floor((level - c0) / c1 * (1 + 1e-12) + 1e-9)
    k = np.where(c1 > 0, k, np.where(c0 <= level * (1 + 1e-12), BIG, -1.0))
    return np.where(k < 0, -1.0, k)


def _interval(c0, c1, level):
    """{k ≥ 0: c0 + c1·k ≤ level} as (kmin, kmax), c1 of any sign; widened against rounding."""
    slack = 1e-12 * np.abs(level) + 1e-300
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (level + slack - c0) / c1
    pos, neg = c1 > 0, c1 < 0
    kmax = np.where(pos, np.floor(x + 1e-9), np.where(neg | (c0 <= level + slack), BIG, -1.0))
    kmin = np.where(neg, np.maximum(np.ceil(x - 1e-9), 0.0), 0.0)
    return kmin, kmax


def config_time_bound(
    terms: StageTerms,
    allowed: np.ndarray,
    v: int,
    m: int,
    chain: SpaceChain,
    recompute: str,
    ddp: str,
) -> np.ndarray:
    """A lower bound on this configuration's time over every split, per architecture of
    ``chain`` (module docstring); ``allowed``: `phaze.place.megatron.allowed_blocks`."""
    p = terms.p
    ks = np.arange(allowed.shape[1])
    lo = np.array([ks[allowed[j]].min() for j in range(p)], dtype=float)
    hi = np.array([ks[allowed[j]].max() for j in range(p)], dtype=float)
    K = allowed.shape[1] - 1
    A = chain.n_archs
    if lo.sum() > K or hi.sum() < K:
        return np.full(A, np.inf)
    ranks = _Ranks(terms, lo, hi)
    low, win = chain.lower, chain.window
    redo = {"none": 0.0, "selective": chain.attention, "full": low["block_fwd"]}[recompute]
    win_redo = {"none": 0.0, "selective": chain.attention, "full": win["block_fwd"]}[recompute]
    block = low["block_fwd"] + low["block_bwd"] + redo  # per block, on top of time1
    first = low["first_fwd"] + low["first_bwd"]
    last = low["last_fwd"] + low["last_bwd"]
    w_block = win["block_bwd"] + win_redo
    alpha = m - 1.0 / v
    L = K * v
    # S = Σ_j T_j for any split: the slope is the same on every rank
    S = ranks.time0.sum() + float(ranks.time1[0]) * L + first + last + block * L

    def pieces(j, is_first, is_last):
        """Affine pieces (in units of V blocks) of rank j's g = alpha·T + tail, per arch."""
        t0 = ranks.time0[j] + (first if is_first else 0.0) + (last if is_last else 0.0)
        t1 = (ranks.time1[j] + block) * v
        base0, base1 = alpha * t0, alpha * t1
        r0, r1 = ranks.rest0[j], ranks.rest1[j] * v
        red0, red1 = ranks.red0[j], ranks.red1[j] * v
        if ddp == "after":
            return [("and", base0 + red0 + r0, base1 + red1 + r1)]
        w0 = (
            ranks.bwd0[j]
            + (win["first_bwd"] if is_first else 0.0)
            + (win["last_bwd"] if is_last else 0.0)
        )
        w1 = (ranks.bwd1[j] + w_block) * v
        exposed = ("and", base0 + red0 - w0 + r0, base1 + red1 - w1 + r1)
        # the last bucket: min(bucket, gradients) reduced = min of two affine functions
        lb_full = (base0 + ranks.bucket[j] + r0, base1 + r1)
        lb_grads = (base0 + red0 + r0, base1 + red1 + r1)
        return [exposed, ("or", lb_full, lb_grads)]

    classes = [(c, pieces(c[0], c[1], c[2])) for c in ranks.classes]

    def value(pcs, k):
        out = None
        for kind, a, b in pcs:
            if kind == "and":
                x = a + b * k
            else:
                x = np.minimum(a[0] + a[1] * k, b[0] + b[1] * k)
            out = x if out is None else np.maximum(out, x)
        return out + np.zeros(A)

    # the level lies between the largest of the ranks' least values (every rank holds an
    # allowed count; its function is quasi-convex, so its least value on [lo, cap] is at an end
    # or below both: the class's lower end at 0 is a floor) and the largest of their greatest
    top = np.zeros(A)
    for (_, _, _, klo, caps), pcs in classes:
        top = np.maximum(top, np.maximum(value(pcs, klo), value(pcs, caps[-1])))
    bottom = np.zeros(A)
    for _ in range(BISECTION_STEPS):
        level = 0.5 * (bottom + top)
        smin, smax = np.zeros(A), np.zeros(A)
        ok = np.ones(A, dtype=bool)
        for (_, _, _, klo, caps), pcs in classes:
            kmin, kmax = np.full(A, klo), np.full(A, BIG)
            for kind, a, b in pcs:
                if kind == "and":
                    x0, x1 = _interval(a, b, level)
                    kmin, kmax = np.maximum(kmin, x0), np.minimum(kmax, x1)
                else:
                    kmax = np.minimum(
                        kmax,
                        np.maximum(
                            _floor_count(a[0], a[1], level), _floor_count(b[0], b[1], level)
                        ),
                    )
            ok &= (kmin <= caps[0]) & (kmin <= kmax)
            y = np.minimum(kmax, caps[-1])
            held = np.searchsorted(caps, y, side="right")
            prefix = np.concatenate([[0.0], np.cumsum(caps)])
            smax += prefix[held] + np.maximum(y, 0.0) * (len(caps) - held)
            smin += kmin * len(caps)
        feasible = ok & (smin <= K) & (smax >= K)
        top = np.where(feasible, level, top)
        bottom = np.where(feasible, bottom, level)
    return S / v + bottom


def _cheap_bound(
    terms: StageTerms, v: int, m: int, chain: SpaceChain, recompute: str, L: int, tail: float
) -> np.ndarray:
    """M ≥ S/p, X ≥ ``tail`` (`phaze.place.megatron.tail_floor`): a bound of every split, cheap
    to take for every architecture."""
    low = chain.lower
    redo = {"none": 0.0, "selective": chain.attention, "full": low["block_fwd"]}[recompute]
    S = (
        float(np.sum(terms.intercept))
        + float(terms.slope) * L
        + low["first_fwd"]
        + low["first_bwd"]
        + low["last_fwd"]
        + low["last_bwd"]
        + (low["block_fwd"] + low["block_bwd"] + redo) * L
    )
    return (m - 1.0 / v) * S / terms.p + S / v + tail


def _space_key(key: tuple) -> tuple[int, int, int, int]:
    """(tp, microbatch, ep, etp) of a `time_lower_bounds` key: (t, b) means ep = 1, and a key
    without etp the experts split over tp (etp = t), as `phaze.place.inputs.trace_key`."""
    t, b, *shape = key
    return (t, b, *trace_key((t, *shape))[1:])


def _jobs(chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes) -> list[tuple]:
    """Every configuration to bound, most promising first: (configuration, its terms, allowed
    splits, the capacities with those allowed splits, its chain, its cheap bound per arch)."""
    chains = {_space_key(k): sc for k, sc in chains.items()}
    skeletons = {
        (t, b, sp, ep, etp): chain
        for (t, b, ep, etp), sc in chains.items()
        for sp, chain in sc.skeleton.items()
    }
    configs = configurations(skeletons, net, consts, devices, global_batch, axes, Counter())
    jobs = []
    for cfg in configs:
        if cfg.ddp == "after" and "overlap" in axes.ddp:
            continue  # never faster than overlap for the same split (module docstring)
        terms = cfg.terms()
        layout = cfg.placed.layout
        chain = chains[(layout.tp, cfg.placed.chain.microbatch, layout.ep, layout.expert_tp)]
        sched = cfg.schedule
        by_allowed: dict[bytes, tuple] = {}
        for h, hbm in enumerate(hbm_capacity_bytes):
            got = allowed_blocks(terms, sched, cfg.placed.chain.blocks, float(hbm))
            if got is None:
                continue
            key = got[1].tobytes() + repr(got[1].shape).encode()
            if key in by_allowed:
                by_allowed[key][1].append(h)
            else:
                by_allowed[key] = (got[1], [h])
        for allowed, hs in by_allowed.values():
            tail = tail_floor(terms, allowed, sched.chunks)
            cheap = _cheap_bound(
                terms,
                sched.chunks,
                sched.microbatches,
                chain,
                cfg.recompute,
                cfg.placed.chain.blocks,
                tail,
            )
            jobs.append((cfg, terms, allowed, hs, chain, cheap))
    # a low bound early prunes the rest
    jobs.sort(key=lambda j: float(np.median(j[5])))
    return jobs


def time_lower_bounds(
    chains: dict[tuple, SpaceChain],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    hbm_capacity_bytes: list[float],
    axes: Axes,
) -> np.ndarray:
    """Per HBM capacity and architecture (shape (len(hbm_capacity_bytes), archs)), a lower bound on the
    step time of every placement the exact search (`phaze.place.megatron.optimize`) allows over
    the (tp, microbatch[, ep]) keys of `chains` (a key without ep means ep = 1), on
    every layer time at or above its lower bound: inf where nothing fits. A configuration whose
    allowed splits are the same at several capacities is bounded once for all of them."""
    return relaxed_bounds(chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes)[1]


def relaxed_bounds(
    chains: dict[tuple, SpaceChain],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    hbm_capacity_bytes: list[float],
    axes: Axes,
    per_config: bool = False,
) -> tuple[list, np.ndarray, np.ndarray | None]:
    """(the configurations' jobs, `time_lower_bounds`' values, and with ``per_config`` each
    job's own bound per HBM capacity and architecture, shape (jobs, capacities, archs): its
    relaxed bound where it was computed, else its cheap bound)."""
    A = next(iter(chains.values())).n_archs
    jobs = _jobs(chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes)
    best = np.full((len(hbm_capacity_bytes), A), np.inf)
    lb = np.full((len(jobs), len(hbm_capacity_bytes), A), np.inf) if per_config else None
    for c, (cfg, terms, allowed, hs, chain, cheap) in enumerate(jobs):
        if per_config:
            lb[c, hs] = cheap
        idx = np.flatnonzero((cheap[None, :] < best[hs]).any(axis=0))
        if not len(idx):
            continue
        sub = chain.take(idx) if len(idx) < A else chain
        sched = cfg.schedule
        t = config_time_bound(
            terms, allowed, sched.chunks, sched.microbatches, sub, cfg.recompute, cfg.ddp
        )
        for h in hs:
            if per_config:
                lb[c, h, idx] = np.maximum(cheap[idx], t)
            best[h, idx] = np.minimum(best[h, idx], t)
    return jobs, best, lb


def upstream_time_lower_bounds(
    totals: dict[int, np.ndarray],
    param_bytes: dict[int, float],
    n_layers: int,
    d_values: np.ndarray,
    devices: int,
    microbatches: int,
    bandwidth_Bps: float | None,
    latency_s: float,
) -> np.ndarray:
    """A lower bound on upstream's time per batch (`phaze.place.dp`: max stage load ×
    (⌈M/d⌉ + stages − 1) + the all-reduce of the largest stage's gradients) for every
    architecture: ``totals[t]`` = each architecture's forward + backward lower bounds summed over
    the layers of the width-t trace, ``param_bytes[t]`` = its layers' parameter bytes per device.

    With s stages the largest load is at least the total over s (transfers and recomputation only
    add to it) and the largest stage's parameters at least the total over s, so the time is at
    least ``tot·(⌈M/d⌉ − 1)/s + tot + allreduce(d, P/s)`` — decreasing in s: taken at the most
    stages a pipeline of ``devices // d`` devices can have (at most one per layer). The memory
    limits and the stage rules are dropped (a relaxation). ``bandwidth_Bps`` None (a two-level
    network): the all-reduce is dropped too."""
    A = len(next(iter(totals.values())))
    best = np.full(A, np.inf)
    for t, tot in totals.items():
        for d in np.asarray(d_values, dtype=int):
            stages = min(n_layers, devices // int(d))
            if stages < 1:
                continue
            rounds = math.ceil(microbatches / int(d))
            alpha = (rounds - 1) / stages + 1.0
            beta = 0.0
            if bandwidth_Bps is not None:
                beta = float(
                    ring_seconds(
                        "all_reduce", param_bytes[t] / stages, int(d), bandwidth_Bps, latency_s
                    )
                )
            np.minimum(best, alpha * tot + beta, out=best)
    return best
