"""An achieved placement of every architecture of a block at once: a concrete configuration and
split per architecture and its step time under the step model (the array tier's achieved side).

Input: per (t, b[, ep]) a :class:`phaze.place.bound.SpaceChain` whose ``lower`` and ``window``
arrays are both the layers' achieved makespans (a real schedule of each layer). For a
configuration (`phaze.place.megatron.configurations`) and a split n (blocks per rank) the step
model's time is ``m·max_j T_j + (Σ_j T_j − max_j T_j)/V + max_j tail_j``
(`phaze.step.strategy.PipelineSchedule.iteration_time` plus the largest tail,
`phaze.step.model.iteration_time`), with every term of `phaze.step.model.StageTerms` of the
skeleton chain (its layer times 0) plus the layers' computation, which enters the step model
linearly: the rank's time gains its first / last layer's forward + backward and n times the
block's (with its recomputation), its backward window the same of the window chain
(:func:`step_times`; tests/test_place_arrays.py checks it against
`phaze.step.model.iteration_time` on the architectures' own chains).

Splits: per configuration, the exact best split (`phaze.place.megatron.solve_split`) of a few
representative architectures of the block (the smallest, median and largest block time), each
then timed for every architecture; the configurations are visited best-first by the step
model's cheap bound (`phaze.place.bound`) and skipped for the architectures whose bound cannot
beat their best time so far. Every value is the step model's time of a split that meets the
stage rules and fits in memory (`phaze.place.megatron.allowed_blocks`), so a throughput that a
real placement reaches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from phaze.network import Network
from phaze.place.bound import SpaceChain, _jobs, relaxed_bounds
from phaze.place.megatron import Axes, solve_split
from phaze.step.layers import ChainCost
from phaze.step.model import StageTerms, StepConstants

#: quantiles of the block time whose architectures' exact splits are tried for every one
REPRESENTATIVES = (0.0, 0.5, 1.0)
#: `upper_times` solves the placement bound exactly where the achieved time exceeds the relaxed
#: bound by more than this fraction: a tenth of the paper config's certificate gap (1 %), below
#: which a tighter bound hardly changes what the search can certify
TIGHTEN_ABOVE = 1e-3


@dataclass
class Achieved:
    """Per HBM capacity and architecture: the step time (inf: nothing fits), the configuration
    (index into ``configs``) and the split (blocks per rank) that reach it."""

    time_s: np.ndarray  # (H, A)
    config: np.ndarray  # (H, A) int, -1: none
    splits: list  # [H][A] tuple of blocks per rank, or None
    configs: list  # the _Config of each index
    terms: list  # the skeleton StageTerms of each index

    def memory(self, h: int, a: int) -> np.ndarray:
        """Each rank's memory (bytes) in architecture ``a``'s placement at HBM index ``h``."""
        return self.terms[self.config[h, a]].memory(np.asarray(self.splits[h][a], dtype=float))


def _redo(chain: SpaceChain, recompute: str, which: dict) -> np.ndarray | float:
    return {"none": 0.0, "selective": chain.attention, "full": which["block_fwd"]}[recompute]


def step_times(
    terms: StageTerms, chain: SpaceChain, n: np.ndarray, m: int, v: int, recompute: str
) -> np.ndarray:
    """The step model's time of the split ``n`` (blocks per rank, shape (p,)) of this
    configuration (``terms``: the skeleton chain's) for every architecture of ``chain``."""
    n = np.asarray(n, dtype=float)
    p = len(n)
    low, win = chain.lower, chain.window
    first = (np.arange(p) == 0)[None, :]
    last = (np.arange(p) == p - 1)[None, :]
    col = lambda x: np.asarray(x, dtype=float)[:, None]
    block = col(low["block_fwd"] + low["block_bwd"] + _redo(chain, recompute, low))
    T = (
        terms.time(n)[None, :]
        + first * col(low["first_fwd"] + low["first_bwd"])
        + last * col(low["last_fwd"] + low["last_bwd"])
        + n[None, :] * block
    )
    reduction, last_bucket, after, optimizer = terms.untimed_tail(n)
    if terms.ddp == "overlap":
        backward = (
            terms.backward(n)[None, :]
            + first * col(win["first_bwd"])
            + last * col(win["last_bwd"])
            + n[None, :] * col(win["block_bwd"] + _redo(chain, recompute, win))
        )
        reduce = np.maximum(reduction[None, :] - backward, last_bucket[None, :])
    else:
        reduce = np.broadcast_to(reduction[None, :], T.shape)
    tail = reduce + after[None, :] + optimizer[None, :]
    M = T.max(axis=1)
    return m * M + (T.sum(axis=1) - M) / v + tail.max(axis=1)


def arch_chain(skeleton: ChainCost, chain: SpaceChain, a: int) -> ChainCost:
    """The step model's chain of architecture ``a`` of ``chain`` (window: its ``window``
    times, None when they equal its ``lower`` times)."""

    def build(times):
        return replace(
            skeleton,
            first=replace(
                skeleton.first,
                fwd_s=float(times["first_fwd"][a]),
                bwd_s=float(times["first_bwd"][a]),
            ),
            block=replace(
                skeleton.block,
                fwd_s=float(times["block_fwd"][a]),
                bwd_s=float(times["block_bwd"][a]),
                attention_fwd_s=float(chain.attention[a]),
            ),
            last=replace(
                skeleton.last,
                fwd_s=float(times["last_fwd"][a]),
                bwd_s=float(times["last_bwd"][a]),
            ),
            window=None,
        )

    same = all(chain.lower[k][a] == chain.window[k][a] for k in chain.lower)
    return replace(build(chain.lower), window=None if same else build(chain.window))


def achieved_times(
    chains: dict[tuple, SpaceChain],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    hbm_capacity_bytes: list[float],
    axes: Axes,
) -> Achieved:
    """The best of the tried (configuration, split) pairs per HBM capacity and architecture
    (module docstring); ``chains`` as for `phaze.place.bound.time_lower_bounds`."""
    A = next(iter(chains.values())).n_archs
    H = len(hbm_capacity_bytes)
    best = np.full((H, A), np.inf)
    which = np.full((H, A), -1, dtype=np.int64)
    splits: list[list] = [[None] * A for _ in range(H)]
    configs, all_terms = [], []
    for cfg, terms, allowed, hs, chain, cheap in _jobs(
        chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes
    ):
        idx = np.flatnonzero((cheap[None, :] < best[hs]).any(axis=0))
        if not len(idx):
            continue
        sched = cfg.schedule
        v, m, L = sched.chunks, sched.microbatches, cfg.placed.chain.blocks
        K = allowed.shape[1] - 1
        lattice = np.broadcast_to((np.arange(K + 1) * v).astype(float), allowed.shape)
        fit = (lattice, allowed)
        parts = terms.untimed_tail(lattice)  # what no layer time changes: once per configuration
        low = chain.lower
        size = low["block_fwd"][idx] + low["block_bwd"][idx]
        order = idx[np.argsort(size, kind="stable")]
        reps = sorted({int(order[round(q * (len(order) - 1))]) for q in REPRESENTATIVES})
        tried = set()
        configs.append(cfg)
        all_terms.append(terms)
        c = len(configs) - 1
        sub = chain.take(idx)
        for r in reps:
            own = terms.retimed(arch_chain(cfg.placed.chain, chain, r))
            t_rep, stages = solve_split(own, sched, L, hbm_capacity_bytes[hs[0]], fit, parts)
            if t_rep is None or stages in tried:
                continue
            tried.add(stages)
            t = step_times(terms, sub, np.array(stages), m, v, cfg.recompute)
            for h in hs:
                better = t < best[h, idx]
                best[h, idx[better]] = t[better]
                which[h, idx[better]] = c
                for a in idx[better]:
                    splits[h][a] = stages
    return Achieved(best, which, splits, configs, all_terms)


def upper_times(
    chains: dict[tuple, SpaceChain],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    hbm_capacity_bytes: list[float],
    axes: Axes,
    achieved_s: np.ndarray,
    tighten_above: float = TIGHTEN_ABOVE,
) -> np.ndarray:
    """Per HBM capacity and architecture, a lower bound on the step time of every placement on
    layer times at or above ``chains``' ``lower`` (windows at most its ``window``): the relaxed
    bound of `phaze.place.bound.time_lower_bounds` (the same configurations, pruning and values),
    then, where the achieved time ``achieved_s`` (H, A) exceeds it by more than
    ``tighten_above``, the exact one: the configurations in ascending order of their own bound
    (relaxed where computed, else the cheap one), each solved exactly on the architecture's
    chain (`phaze.place.megatron.solve_split`, the exact search's split), until the next
    configuration's bound is not below the best exact time — every configuration left is then
    no faster, so that time is the minimum over all of them."""
    H = len(hbm_capacity_bytes)
    jobs, best, lb = relaxed_bounds(
        chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes, per_config=True
    )
    fits = {}
    for h in range(H):
        loose = np.isfinite(best[h]) & (achieved_s[h] > best[h] * (1 + tighten_above))
        for a in np.flatnonzero(loose):
            exact = np.inf
            for c in np.argsort(lb[:, h, a], kind="stable"):
                if lb[c, h, a] >= exact:
                    break
                cfg, terms, allowed, _, chain, _ = jobs[c]
                if c not in fits:
                    K = allowed.shape[1] - 1
                    v = cfg.schedule.chunks
                    lattice = np.broadcast_to((np.arange(K + 1) * v).astype(float), allowed.shape)
                    fits[c] = ((lattice, allowed), terms.untimed_tail(lattice))
                own = terms.retimed(arch_chain(cfg.placed.chain, chain, a))
                t, _ = solve_split(
                    own, cfg.schedule, cfg.placed.chain.blocks, hbm_capacity_bytes[h], *fits[c]
                )
                if t is not None:
                    exact = min(exact, t)
            if np.isfinite(exact):
                best[h, a] = max(best[h, a], exact)
    return best
