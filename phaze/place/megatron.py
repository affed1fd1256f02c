"""Exact placement under the step model (`phaze.step`, ``place.model: megatron``).

The search space: tensor-parallel width t, microbatch b, expert-parallel size ep and the
experts' tensor-parallel size etp (t, or 1: whole experts) (one `ChainCost` each, with and without
sequence parallelism; a dense model has ep = 1 and etp = t only), every pipeline depth p with
``t·p·d = devices`` and ``b·d`` dividing the global batch (Megatron's rules), every ep of the
chains dividing d (t·d at etp = 1), and for each the listed interleave V, recompute mode,
sequence parallelism, distributed optimizer and DDP mode — and every split of the L blocks into
p stages (`phaze.step.strategy.stages_reason`). Impossible combinations are skipped with a
reason (counted in `Result.skipped`).

Why the split can be solved exactly and fast. Every chain is ``first, L identical blocks, last``,
so a stage is its block count n and each rank's terms are functions of n alone
(`phaze.step.model.StageTerms`): T_j(n) = a_j + c·n with the same c on every rank, memory
non-decreasing in n, and the tail D_j + O_j either non-decreasing in n (``after``) or the
maximum of an affine function and a non-decreasing one (``overlap``: reduction − backward, last
bucket). The objective

    m·max_j T_j + (Σ_j T_j − max_j T_j)/V + max_j tail_j = (m − 1/V)·M + S/V + X

has S = Σ_j a_j + c·L constant over splits, so only M = max T and X = max tail vary. For a cap x
on the tail, the blocks rank j may take form an interval of the lattice V·ℕ (memory: a prefix;
tail ≤ x: an interval, as the tail is quasi-convex; the lower bound: 1 block per middle rank, V
with interleaving) — for a mixture-of-experts chain possibly with the point n = 0 apart (a first or
last rank without blocks has no expert gradients to reduce, so its tail drops by the expert
reduction's latency there; `fill` tries either piece). Minimising M over intervals with Σ n_j = L
is a greedy fill: every rank starts
at its lower end and the remaining L − Σ lo blocks go, V at a time, to the increments with the
smallest resulting T — the R-th smallest increment sets M. The cap then descends over the
distinct tail values: a solution with M*(x) and tail X(x) ≤ x beats every split whose tail lies in
[X(x), x], so the next cap is the largest value below X(x), until ``(m − 1/V)·M*(x) + S/V +
X_lb`` (X_lb: the smallest tail any split can have) cannot beat the best. Configurations are
solved best-first by a lower bound (``M ≥ max(S/p, max_j T_j(lo_j))``, the tail at least
`tail_floor`) and the search stops when the next bound cannot beat the best found; a
configuration in which no split fits in memory is never solved. The brute-force tests
(tests/test_step_dp.py) enumerate every split of small chains.

What the architectures of a job share. Memory, communication and the stage rules do not depend
on the layer times (`ChainCost.shape`), so the configurations, which splits fit
(`allowed_blocks`), the tail's floor and the tail's untimed parts are computed once per `Setting`
(network, constants, devices, batch, capacity, axes, chain shapes), when a search first reaches
the configuration, and each architecture only re-times its terms (`StageTerms.retimed`): the
same answer, tested against fresh searches.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from phaze.errors import PhazeError
from phaze.network import Network
from phaze.place.inputs import trace_key
from phaze.step.layers import ChainCost
from phaze.step.model import (
    Layout,
    PlacedChain,
    StageTerms,
    StepConstants,
    check_chain,
    iteration_time,
)
from phaze.step.strategy import (
    DDP_MODES,
    RECOMPUTE_MODES,
    PipelineSchedule,
    Strategy,
    schedule_reason,
)

INF = math.inf
#: `Setting`s a caller's dict keeps (one per cluster size and HBM capacity of a job, typically)
SETTINGS_KEPT = 16


@dataclass(frozen=True)
class Axes:
    """The values of each placement axis the search may choose (config lists in ``place:``)."""

    interleave: tuple[int, ...] = (1,)
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    sequence_parallel: tuple[bool, ...] = (False, True)
    distributed_optimizer: tuple[bool, ...] = (False, True)
    ddp: tuple[str, ...] = DDP_MODES

    @classmethod
    def from_config(cls, place: dict) -> Axes:
        """The axes of a validated config section ``place`` (each a list there)."""
        return cls(**{f.name: tuple(place[f.name]) for f in fields(cls)})

    def __post_init__(self) -> None:
        if not self.interleave or any(int(v) != v or v < 1 for v in self.interleave):
            raise AssertionError(f"interleave values must be integers >= 1: {self.interleave}")
        if not set(self.recompute) <= set(RECOMPUTE_MODES) or not self.recompute:
            raise AssertionError(f"recompute modes: {self.recompute}")
        if not set(self.ddp) <= set(DDP_MODES) or not self.ddp:
            raise AssertionError(f"ddp modes: {self.ddp}")
        if not self.sequence_parallel or not self.distributed_optimizer:
            raise AssertionError("every axis needs at least one value")


@dataclass
class Result:
    strategy: Strategy | None
    time_s: float
    skipped: Counter = field(default_factory=Counter)  # reason -> configurations skipped
    configurations: int = 0  # well-formed configurations (before bounding)
    solved: int = 0  # configurations whose split was optimised
    infeasible: Counter = field(default_factory=Counter)  # why solved ones had no split


def lower_ends(p: int, v: int, blocks: int) -> np.ndarray:
    """Fewest blocks each rank may hold, in units of V (`stages_reason`'s rules)."""
    if p == 1:
        return np.array([blocks // v])
    if v > 1:
        return np.ones(p, dtype=np.int64)
    lo = np.ones(p, dtype=np.int64)
    lo[0] = lo[-1] = 0
    return lo


def fill(T: np.ndarray, allowed: np.ndarray, K: int):
    """min over k (k_j allowed, Σ k_j = K) of max_j T[j, k_j], with T increasing along each row.
    A row whose allowed values are not one interval is split into its first run and the rest,
    each solved (exact for any rows; the search's have at most one gap, after n = 0). Returns
    (M, k) or None when no split exists."""
    if not allowed.any(axis=1).all():
        return None
    runs = np.diff(allowed.astype(np.int8), axis=1) == 1  # a False -> True step
    split = np.flatnonzero(runs.sum(axis=1) - (~allowed[:, 0]).astype(int) > 0)
    if len(split):
        j = int(split[0])
        row = allowed[j]
        end = int(np.argmin(row[int(np.argmax(row)) :])) + int(np.argmax(row))  # first run ends
        best = None
        for piece in (np.arange(allowed.shape[1]) < end, np.arange(allowed.shape[1]) >= end):
            part = allowed.copy()
            part[j] &= piece
            found = fill(T, part, K)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        return best
    return _fill_intervals(T, allowed, K)


def _fill_intervals(T: np.ndarray, allowed: np.ndarray, K: int):
    """`fill` for rows whose allowed values are intervals: the greedy fill."""
    cols = allowed.shape[1]
    lo = allowed.argmax(axis=1)
    hi = cols - 1 - allowed[:, ::-1].argmax(axis=1)
    if lo.sum() > K or hi.sum() < K:
        return None
    rows = np.arange(len(lo))
    base = float(T[rows, lo].max())
    R = int(K - lo.sum())
    if R == 0:
        return base, lo
    ks = np.arange(cols)[None, :]
    inc = np.where((ks > lo[:, None]) & (ks <= hi[:, None]), T, INF).ravel()
    pick = np.argpartition(inc, R - 1)[:R]
    M = max(base, float(inc[pick].max()))
    return M, lo + np.bincount(pick // cols, minlength=len(lo))


def allowed_blocks(
    terms: StageTerms, schedule: PipelineSchedule, blocks: int, hbm_capacity_bytes: float
):
    """(n, allowed): the block counts each rank may hold — ``n`` (p, K+1) in blocks, K = blocks
    / V, and which of them meet the stage rules (`lower_ends`) and fit `hbm_capacity_bytes` — or None when
    some rank has none. Memory does not depend on layer times: every architecture shares it."""
    p, v = terms.p, schedule.chunks
    K = blocks // v
    lo = lower_ends(p, v, blocks)
    ks = np.arange(K + 1)
    n = np.broadcast_to((ks * v).astype(float), (p, K + 1))  # a read-only view
    hi = K - (lo.sum() - lo)
    shape_ok = (ks[None, :] >= lo[:, None]) & (ks[None, :] <= hi[:, None])
    fits = terms.memory(n) <= hbm_capacity_bytes
    allowed = shape_ok & fits
    if not allowed.any(axis=1).all() or (shape_ok & ~fits).all(axis=1).any():
        return None
    return n, allowed


def tail_floor(terms: StageTerms, allowed: np.ndarray, v: int, parts: tuple | None = None) -> float:
    """A lower bound on X = max_j tail_j over every split, whatever the layer times: every rank
    holds some allowed count, and one holds at least ⌈K/p⌉ units; the tail is at least its part
    that no overlap hides — the last bucket (at most the reduction) and what follows — or the
    whole reduction without overlap (then the floor is the tail itself). `parts`:
    `StageTerms.untimed_tail` on the lattice, when the caller has it."""
    p, K = allowed.shape[0], allowed.shape[1] - 1
    after_ddp = terms.ddp == "after"
    if parts is None:  # only the parts the floor reads
        n = np.broadcast_to((np.arange(K + 1) * v).astype(float), allowed.shape)
        parts = (
            terms.reduction(n) if after_ddp else None,
            None if after_ddp else terms.last_bucket(n),
            terms.after_reduction(n),
            terms.optimizer(n),
        )
    reduction, last_bucket, after, optimizer = parts
    floor = after + optimizer
    floor = floor + (reduction if after_ddp else last_bucket)
    floor = np.where(allowed, floor, np.inf)
    every = float(floor.min(axis=1).max())
    heavy = -(-K // p)
    busiest = float(floor[:, heavy:].min()) if heavy <= K else np.inf
    return max(every, busiest if np.isfinite(busiest) else every)


def solve_split(
    terms: StageTerms,
    schedule: PipelineSchedule,
    blocks: int,
    hbm_capacity_bytes: float,
    fit: tuple | None = None,
    tail_parts: tuple | None = None,
):
    """The best split of `blocks` blocks for one configuration: (time, blocks per stage) or
    (None, reason). `fit`: `allowed_blocks` of these terms at `hbm_capacity_bytes`, and
    `tail_parts`: `StageTerms.untimed_tail` on its lattice, when the caller has them."""
    p, v = terms.p, schedule.chunks
    K = blocks // v
    got = fit if fit is not None else allowed_blocks(terms, schedule, blocks, hbm_capacity_bytes)
    if got is None:
        return None, "does not fit in memory"
    n, allowed = got
    T = terms.time(n)
    X = np.where(allowed, terms.tail(n, tail_parts), INF)
    x_floor = float(X.min(axis=1).max())  # every rank holds some allowed n
    values = np.unique(X[allowed])
    best, best_k = INF, None
    cap = INF
    while True:
        found = fill(T, allowed & (X <= cap), K)
        if found is None:
            break
        M, k = found
        stages = k * v
        rows = np.arange(p)
        x_sol = float(X[rows, k].max())
        pipe, _ = schedule.iteration_time(list(T[rows, k]))
        total = pipe + x_sol
        if total < best:
            best, best_k = total, stages
        S = float(T[rows, k].sum())  # the same for every split (c is common to all ranks)
        bound = schedule.microbatches * M + (S - M) / v + x_floor
        if bound >= best:
            break
        below = np.searchsorted(values, min(x_sol, cap), side="left") - 1
        if below < 0:
            break
        cap = float(values[below])
    if best_k is None:
        return None, "does not fit in memory"
    return best, tuple(int(x) for x in best_k)


def _divisors(n: int) -> list[int]:
    """Every divisor of n, increasing, from its prime factors (not by trying 1..n: a cluster of
    10^7 devices has 64 divisors)."""
    divisors = [1]
    for prime, power in Counter(_prime_factors(n)).items():
        divisors = [d * prime**e for d in divisors for e in range(power + 1)]
    return sorted(divisors)


def _is_prime(n: int) -> bool:
    """Miller–Rabin with the first 12 primes as bases: exact below 3.3·10^24."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _prime_factors(n: int) -> list[int]:
    """The prime factors of n >= 1 with multiplicity: trial division by small primes, then
    Pollard's rho on what is left."""
    factors = []
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        while n % p == 0:
            factors.append(p)
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            factors.append(m)
            continue
        f = _rho(m)
        stack += [f, m // f]
    return sorted(factors)


def _rho(n: int) -> int:
    """A nontrivial factor of the composite n (no factor below 41)."""
    c = 1
    while True:
        x = y = 2
        f = 1
        while f == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            f = math.gcd(abs(x - y), n)
        if f != n:
            return f
        c += 1


@dataclass
class _Config:
    order: int
    placed: PlacedChain
    schedule: PipelineSchedule
    recompute: str
    sequence_parallel: bool
    distributed_optimizer: bool
    ddp: str

    def terms(self) -> StageTerms:
        return StageTerms(
            self.placed, self.schedule, self.recompute, self.distributed_optimizer, self.ddp
        )


def chain_key(key) -> tuple[int, int, bool, int, int]:
    """(tp, microbatch, sequence_parallel, ep, etp) of a `chains` key: (t, b, sp) means ep = 1,
    and a key without etp means the experts split over the tensor-parallel ranks (etp = t);
    the trace part by `phaze.place.inputs.trace_key`. `setting_of` adds the context-parallel
    size."""
    return setting_of(key)[:5]


def setting_of(key) -> tuple[int, int, bool, int, int, int]:
    """(tp, microbatch, sequence_parallel, ep, etp, cp) of a `chains` key (`chain_key`; a key
    without a sixth entry cp means no context parallelism, cp = 1)."""
    t, b, sp, *shape = key
    cp = shape[2] if len(shape) == 3 else 1
    return (t, b, sp, *trace_key((t, *shape[:2]))[1:], cp)


def configurations(
    chains: Mapping[tuple, ChainCost],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    axes: Axes,
    skipped: Counter,
) -> list[_Config]:
    """Every well-formed configuration of `chains` (keyed by (tp, microbatch, sequence
    parallelism[, ep[, etp]]); a key without ep means ep = 1, without etp etp = tp) on
    `devices`, in the search's tie-breaking order; each skipped combination is counted in
    `skipped` under its reason. Chains of one (t, b, sp, ep, etp) share their placed chain."""
    chains = {setting_of(k): c for k, c in chains.items()}
    for (t, b, sp, ep, etp, cp), c in chains.items():
        got = (c.tp, c.microbatch, c.sequence_parallel, c.ep, c.expert_tp, c.cp)
        if got != (t, b, sp, ep, etp, cp):
            raise AssertionError(
                f"chain built for another setting than its key {(t, b, sp, ep, etp, cp)}"
            )
    blocks = {c.blocks for c in chains.values()}
    if len(blocks) != 1:
        raise AssertionError("chains of different block counts")
    L = blocks.pop()
    configs: list[_Config] = []
    layouts: dict[tuple, Layout] = {}
    placed: dict[tuple, PlacedChain] = {}
    eps_of: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # (t, b) -> (ep, etp, cp)
    for t, b, _, ep, etp, cp in chains:
        eps_of.setdefault((t, b), [])
        if (ep, etp, cp) not in eps_of[(t, b)]:
            eps_of[(t, b)].append((ep, etp, cp))
    order = 0
    for t, b in sorted(eps_of):
        if devices % t:
            skipped[f"tp {t} does not divide the {devices} devices"] += 1
            continue
        cps = sorted({cp for _, _, cp in eps_of[(t, b)]})
        for p in _divisors(devices // t):
            for cp in cps:
                if (devices // (t * p)) % cp:
                    skipped["cp does not divide the devices over tp·pp"] += 1
                    continue
                d = devices // (t * p * cp)
                if global_batch % (b * d):
                    skipped["microbatch·dp does not divide the global batch"] += 1
                    continue
                if p > L + 2 or (p > 2 and p - 2 > L):
                    skipped["more pipeline stages than the layers allow"] += 1
                    continue
                m = global_batch // (b * d)
                # ep ascending; for each, the experts split over tp (etp = t) before whole
                # (etp = 1)
                pairs = sorted(
                    ((e, x) for e, x, c in eps_of[(t, b)] if c == cp),
                    key=lambda x: (x[0], -x[1]),
                )
                for ep, etp, sp in (
                    (ep, etp, sp) for ep, etp in pairs for sp in axes.sequence_parallel
                ):
                    if etp == t and (cp * d) % ep:
                        skipped["ep does not divide dp"] += 1
                        continue
                    if etp != t and (t * cp * d) % ep:
                        skipped["ep does not divide tp·dp (etp = 1)"] += 1
                        continue
                    if sp and t == 1:
                        skipped["sequence parallelism needs tp > 1"] += 1
                        continue
                    chain = chains.get((t, b, sp, ep, etp, cp))
                    if chain is None:
                        skipped["no layer costs for this sequence-parallel setting"] += 1
                        continue
                    if chain.experts and t > 1 and not sp:
                        skipped["mixture of experts with tp > 1 needs sequence parallelism"] += 1
                        continue
                    for v in axes.interleave:
                        why = ""
                        if v > 1 and p == 1:
                            why = "interleaving needs pp > 1"
                        elif schedule_reason(p, v, m):
                            why = "interleaving needs the microbatches per pipeline divisible by pp"
                        elif v > 1 and (L % v or p * v > L):
                            why = "the interleave does not divide the blocks of every stage"
                        if why:
                            skipped[why] += 1
                            continue
                        schedule = PipelineSchedule(p, v, m)
                        key = (t, b, p, d, sp, ep, etp, cp)
                        if key not in placed:
                            lk = (t, p, d, ep, etp, cp)
                            if lk not in layouts:
                                layouts[lk] = Layout.build(net, t, p, cp * d, ep, etp, cp)
                            placed[key] = PlacedChain(chain, layouts[lk], consts)
                        for rc in axes.recompute:
                            for zero in axes.distributed_optimizer:
                                if zero and cp * d == 1:
                                    skipped["the distributed optimizer needs dp > 1"] += 1
                                    continue
                                for ddp in axes.ddp:
                                    configs.append(
                                        _Config(
                                            order,
                                            placed[key],
                                            schedule,
                                            rc,
                                            sp,
                                            zero,
                                            ddp,
                                        )
                                    )
                                    order += 1
    return configs


@dataclass
class _Fit:
    """One configuration's part that no layer time changes: its terms (on the layer times of
    the chain it was built with; `StageTerms.retimed` for another) and, once a search first
    reaches it, the blocks each rank may hold (`allowed_blocks`; None: no split fits), the
    floor of its tail (`tail_floor`) and the tail's untimed parts on the lattice."""

    terms: StageTerms
    reached: bool = False
    allowed: tuple | None = None
    tail_floor: float = 0.0
    tail_parts: tuple | None = None

    def reach(self, schedule: PipelineSchedule, blocks: int, hbm_capacity_bytes: float) -> None:
        """Take the memory check, the tail's untimed parts (kept for every solve of the job's
        architectures) and the tail's floor taken from them; ``allowed`` None: no split fits."""
        self.reached = True
        self.allowed = allowed_blocks(self.terms, schedule, blocks, hbm_capacity_bytes)
        if self.allowed is not None:
            self.tail_parts = self.terms.untimed_tail(self.allowed[0])
            self.tail_floor = tail_floor(
                self.terms, self.allowed[1], schedule.chunks, self.tail_parts
            )


@dataclass
class Setting:
    """What every architecture of a placement job shares at one setting (network, constants,
    devices, global batch, HBM capacity, axes and the chains' shapes): the configurations, the
    combinations skipped, and per configuration its `_Fit`, filled in as searches reach it.
    Memory and communication do not depend on the layer times (`ChainCost.shape`)."""

    configs: list[_Config]
    skipped: Counter
    fits: list[_Fit]
    blocks: int

    @classmethod
    def build(cls, chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes):
        skipped = Counter()
        configs = configurations(chains, net, consts, devices, global_batch, axes, skipped)
        L = next(iter(chains.values())).blocks
        return cls(configs, skipped, [_Fit(cfg.terms()) for cfg in configs], L)


def setting_key(chains, net, consts, devices, global_batch, hbm_capacity_bytes, axes) -> tuple:
    """The key of a `Setting`: equal keys, equal settings."""
    shapes = tuple(sorted((setting_of(k), c.shape) for k, c in chains.items()))
    return (net, consts, devices, global_batch, float(hbm_capacity_bytes), axes, shapes)


def optimize(
    chains: Mapping[tuple[int, int, bool], ChainCost],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    hbm_capacity_bytes: float,
    axes: Axes,
    settings: dict | None = None,
) -> Result:
    """The fastest strategy that fits `hbm_capacity_bytes` per device. `chains` maps (tp, microbatch,
    sequence_parallel) to the chain at that setting (the t and b values searched are its keys).
    `settings`: a dict the caller keeps across architectures (`Setting`s by `setting_key`), so
    what they share is computed once."""
    chains = {setting_of(k): c for k, c in chains.items()}
    args = (chains, net, consts, devices, global_batch, float(hbm_capacity_bytes), axes)
    key = setting_key(*args) if settings is not None else None
    setting = settings.get(key) if settings is not None else None
    if setting is None:
        setting = Setting.build(*args)
        if settings is not None:
            if len(settings) >= SETTINGS_KEPT:
                settings.clear()
            settings[key] = setting
    result = Result(None, INF, skipped=Counter(setting.skipped))
    result.configurations = len(setting.configs)
    L = setting.blocks
    todo = []
    for cfg, fit in zip(setting.configs, setting.fits):
        if fit.reached and fit.allowed is None:
            result.infeasible["does not fit in memory"] += 1
            continue
        c = cfg.placed.chain
        chain = chains[(c.tp, c.microbatch, c.sequence_parallel, c.ep, c.expert_tp, c.cp)]
        intercept, slope = fit.terms.line(chain)[:2]
        # the tail's floor (0 until a search has reached the configuration) bounds apart
        bound = _lower_bound(intercept, slope, cfg.schedule, L)
        todo.append((bound + fit.tail_floor, cfg.order, bound, cfg, fit, chain))
    todo.sort(key=lambda x: (x[0], x[1]))
    best_key = (INF, INF)
    for key, order, bound, cfg, fit, chain in todo:
        if key > best_key[0]:
            break
        if not fit.reached:
            fit.reach(cfg.schedule, L, hbm_capacity_bytes)
            if fit.allowed is None:
                result.infeasible["does not fit in memory"] += 1
                continue
            if bound + fit.tail_floor > best_key[0]:
                continue  # the floor it now has: no split of it can beat the best
        result.solved += 1
        terms = fit.terms.retimed(chain)
        time_s, stages = solve_split(
            terms, cfg.schedule, L, hbm_capacity_bytes, fit.allowed, fit.tail_parts
        )
        if time_s is None:
            result.infeasible[stages] += 1
            continue
        if (time_s, order) < best_key:
            best_key = (time_s, order)
            result.time_s = time_s
            result.strategy = Strategy(
                devices=devices,
                tp=cfg.placed.layout.tp,
                pp=cfg.placed.layout.pp,
                microbatch=cfg.placed.chain.microbatch,
                global_batch=global_batch,
                interleave=cfg.schedule.chunks,
                recompute=cfg.recompute,
                sequence_parallel=cfg.sequence_parallel,
                distributed_optimizer=cfg.distributed_optimizer,
                ddp=cfg.ddp,
                stages=stages,
                ep=cfg.placed.layout.ep,
                etp=cfg.placed.layout.expert_tp,
                cp=cfg.placed.layout.cp,
            )
    return result


def _lower_bound(intercept, slope: float, schedule: PipelineSchedule, blocks: int) -> float:
    """No split of a configuration whose ranks take T_j = intercept_j + slope·n has a faster
    pipeline: M ≥ the mean stage time and ≥ every rank's time at its fewest blocks (the tail is
    bounded apart, `tail_floor`)."""
    p, v = len(intercept), schedule.chunks
    lo = lower_ends(p, v, blocks) * v
    S = float(intercept.sum() + slope * blocks)
    M = max(S / p, float((intercept + lo.astype(float) * slope).max()))
    return schedule.microbatches * M + (S - M) / v


def best_fixed(
    chains: Mapping[tuple, ChainCost],
    net: Network,
    consts: StepConstants,
    devices: int,
    global_batch: int,
    hbm_capacity_bytes: float,
    axes: Axes,
    *,
    tp: int,
    pp: int,
    stages: tuple[int, ...],
    ep: int = 1,
    etp: int | None = None,
    cp: int = 1,
) -> tuple[Strategy | None, float, str]:
    """A fixed placement (tp, pp, ep, etp (None: tp), split; dp = devices / (tp·pp)) at its best
    over the other
    axes (the microbatches of `chains`, interleave, recompute, sequence parallelism, distributed
    optimizer, DDP). Returns (strategy, time, '') or (None, inf, why not)."""
    if devices % (tp * pp * cp):
        what = "tp·pp" if cp == 1 else "tp·cp·pp"
        return (
            None,
            INF,
            (
                f"the step model uses every device: {what} = {tp * pp * cp} does not divide "
                f"{devices}"
            ),
        )
    best: tuple[float, Strategy] | None = None
    why = Counter()
    chains = {setting_of(k): c for k, c in chains.items()}
    etp = tp if etp is None else etp
    if not any(t == tp and e == ep and x == etp and c == cp for t, _, _, e, x, c in chains):
        what = f"tp {tp}, ep {ep} and etp {etp}" + (f", cp {cp}" if cp > 1 else "")
        return None, INF, f"no layer costs for {what}"
    layout = None  # every strategy here has the same (tp, pp, dp, ep, etp)
    for (t, b, sp, e, x, c), chain in sorted(chains.items()):
        if t != tp or e != ep or x != etp or c != cp or sp not in axes.sequence_parallel:
            continue
        placed = None
        for v in axes.interleave:
            for rc in axes.recompute:
                for zero in axes.distributed_optimizer:
                    for ddp in axes.ddp:
                        try:
                            s = Strategy(
                                devices=devices,
                                tp=tp,
                                pp=pp,
                                microbatch=b,
                                global_batch=global_batch,
                                interleave=v,
                                recompute=rc,
                                sequence_parallel=sp,
                                distributed_optimizer=zero,
                                ddp=ddp,
                                stages=tuple(stages),
                                ep=ep,
                                etp=etp,
                                cp=cp,
                            )
                            s.check_layers(chain.blocks)
                            s.check_experts(chain.experts)
                        except PhazeError as exc:
                            why[str(exc)] += 1
                            continue
                        check_chain(chain, s)
                        if layout is None:
                            layout = Layout.build(net, tp, pp, s.cdp, ep, etp, cp)
                        if placed is None:
                            placed = PlacedChain(chain, layout, consts)
                        terms = StageTerms(placed, s.schedule, rc, zero, ddp)
                        n = np.asarray(stages, dtype=float)
                        if (terms.memory(n) > hbm_capacity_bytes).any():
                            why["does not fit in memory"] += 1
                            continue
                        time_s = iteration_time(terms, n, s.schedule)
                        if best is None or time_s < best[0]:
                            best = (time_s, s)
    if best is None:
        reason = "; ".join(r for r, _ in why.most_common(2)) or f"no layer costs for tp {tp}"
        return None, INF, reason
    return best[1], best[0], ""
