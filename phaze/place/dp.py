"""The exact pipeline/data-parallel dynamic program for one tensor-parallel width t.

State: ``dp[q, s, c]`` = the smallest possible maximum stage load when downset q is split into
exactly s stages of which c are of the *tracked* kind. A stage needs ``a = t`` devices when it
holds a tensor-parallel layer and 1 otherwise, so a pipeline's device count is
``a_untracked·(s − c) + a_tracked·c``; tracking the rarer kind (usually the 1-device embedding or
head stages) replaces upstream's dimension "at most k devices" (k ≤ 1,024) by c ≤ 2 without
losing exactness: "at most k devices" is the minimum over the c whose device count fits in k.
A stage at position s from the end must be memory-feasible there (1F1B keeps s microbatches in
flight) and, with recompute, re-runs its forward unless s = 1.

Final round, for every data-parallel degree d: ``K = devices // d`` devices per pipeline,
``ceil(microbatches / d)`` microbatches per pipeline, and

    time per batch = max stage load · (microbatches per pipeline + stages − 1) + all-reduce(d, P)

where P is the first stage's parameters (upstream) or the largest stage's (ours). The latter is a
second bottleneck, handled exactly by `solve_width`: the DP is re-run with stages limited to
P ≤ π for distinct stage-parameter values π, largest first, jumping straight below the largest
stage of the concrete solutions found and stopping when a lower bound (smallest possible largest
stage for s stages, `min_max_stage_params`) shows no smaller π can win; typically one to three
DP runs per t.

On a hierarchical network (``AllReduce.network``, phaze.place.network) the pipeline transfers
are priced on the level each boundary crosses, which depends on the stage's position s and, for
``t·d < devices_per_node``, on d: the DP (whose loads may depend on s anyway) then runs once for
all d with ``t·d ≥ devices_per_node`` (every boundary crosses nodes) and once per smaller d with
that d's per-position loads. The all-reduce stays a function of (d, stages, largest stage).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from phaze.errors import PhazeError
from phaze.network import ring_seconds
from phaze.place.graph import LayerGraph, StageRule, StageTable, build_stage_table, stage_costs
from phaze.place.network import PlaceNetwork
from phaze.units import GIB

INF = math.inf


@dataclass(frozen=True)
class AllReduce:
    """Data-parallel gradient synchronisation after each batch.

    mode ``first`` (upstream): ``4 (d−1) P_first / (bandwidth · d)``.
    mode ``max`` (ours): ring all-reduce of the largest stage's gradients (2 bytes per parameter
    byte ratio folded into `grad_factor`): ``2 (d−1)/d · grad_factor · P_max / bandwidth +
    2 (d−1) · latency``.

    With a hierarchical `network` (mode ``max`` only) the ring runs on the two-level network
    and the pipeline transfers too (see phaze.place.network); `bandwidth` / `latency` are then
    unused. `t` is the tensor-parallel width the network costs are for (`for_width`)."""

    mode: str
    bandwidth: float
    latency: float = 0.0
    grad_factor: float = 1.0
    network: PlaceNetwork | None = None
    t: int = 1

    def __post_init__(self):
        if self.network is not None and self.mode != "max":
            raise PhazeError(
                "a hierarchical network needs the all-reduce mode 'max' (ours); "
                "upstream's mode 'first' is flat by definition"
            )

    def for_width(self, t: int) -> AllReduce:
        return self if t == self.t else replace(self, t=int(t))

    def __call__(self, d: np.ndarray, params: np.ndarray, stages=None) -> np.ndarray:
        """(len(d), len(params)) seconds; `stages` (aligned with params) = the pipeline's stage
        count, needed on a hierarchical network (which ring is the worst depends on it)."""
        if self.network is not None:
            if stages is None:
                raise RuntimeError("hierarchical all-reduce needs the stage counts")
            p = self.grad_factor * np.asarray(params, dtype=float)
            st = np.broadcast_to(np.asarray(stages, dtype=np.int64), p.shape)
            return self.network.all_reduce(self.t, d, p, st)
        d = np.asarray(d, dtype=float)[:, None]
        p = np.asarray(params, dtype=float)[None, :]
        if self.mode == "first":
            # upstream's formula (device_placement.cpp), kept verbatim for bit-identical results
            return 4.0 * (d - 1) * p / self.bandwidth / d
        return ring_seconds("all_reduce", self.grad_factor * p, d, self.bandwidth, self.latency)


@dataclass
class Placement:
    t: int
    d: int
    stages: list  # layer positions of each stage, first stage first
    devices_per_stage: list
    time_per_batch: float
    max_load: float
    stage_loads: list
    stage_mem: list
    stage_params: list
    microbatches_per_pipeline: int
    extra: dict = field(default_factory=dict)

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def devices_used(self) -> int:
        return int(sum(self.devices_per_stage)) * self.d


def data_parallel_degrees(
    devices: int, microbatches: int, divide_batch: bool, divide_devices: bool
):
    d = np.arange(1, min(devices, microbatches) + 1)
    if divide_batch:
        d = d[microbatches % d == 0]
    if divide_devices:
        d = d[devices % d == 0]
    return d


class _WidthDP:
    """DP tables for one t (and one parameter cap π)."""

    def __init__(
        self,
        table: StageTable,
        t: int,
        recompute: bool,
        bound_s: int,
        allowed: np.ndarray,
        n_tp_layers: int,
        n_layers: int,
        track_path: bool = False,
        pos_loads: np.ndarray | None = None,
        uniform_width: bool = False,
    ):
        self.table, self.t, self.recompute, self.S = table, t, recompute, bound_s
        self.allowed = allowed
        # pos_loads (pairs, S): the load of each stage at positions 1..S when transfer costs
        # depend on the position (hierarchical network); None = the table's flat loads
        self.pos_loads = pos_loads
        if uniform_width:
            # Megatron's layout: every stage on t devices, whatever its layers
            n_tp_layers = n_layers
        # track_path: remember each state's argmin pair and the largest stage parameters along
        # that path (our all-reduce needs the concrete solution's largest stage)
        self.a = (np.full(len(table.tp), t) if uniform_width else np.where(table.tp, t, 1)).astype(
            np.int64
        )
        n_plain = n_layers - n_tp_layers
        if t == 1 or n_tp_layers == 0 or n_plain == 0:
            self.C = 0
            self.tracked = np.zeros(len(table.sub), dtype=bool)
            a0 = t if (t > 1 and n_plain == 0) else 1
            self.a_tracked, self.a_untracked = a0, a0
        elif n_tp_layers <= n_plain:
            self.C = min(n_tp_layers, bound_s)
            self.tracked = table.tp.copy()
            self.a_tracked, self.a_untracked = t, 1
        else:
            self.C = min(n_plain, bound_s)
            self.tracked = ~table.tp
            self.a_tracked, self.a_untracked = 1, t
        s = np.arange(bound_s + 1)[:, None]
        c = np.arange(self.C + 1)[None, :]
        # devices of a pipeline with s stages, c of them tracked (c > s never occurs: dp is inf)
        self.devs = self.a_untracked * (s - c) + self.a_tracked * c
        self.svec = np.arange(1, bound_s + 1)
        self.track_path = track_path
        self.dp = self._run()

    def _loads(self, k: np.ndarray) -> np.ndarray:
        """(n, S) stage load at positions s = 1..S, inf where memory does not allow s."""
        tb = self.table
        if self.pos_loads is not None:
            load = self.pos_loads[k]
        else:
            load = np.repeat(tb.load_plain[k][:, None], self.S, axis=1)
            if self.recompute and self.S > 1:
                load[:, 1:] = tb.load_recompute[k][:, None]
        return np.where(self.svec[None, :] <= tb.max_position[k][:, None], load, INF)

    def load_at(self, k: int, position: int) -> float:
        """Load of stage k at `position` from the end (no memory check)."""
        if self.pos_loads is not None:
            return float(self.pos_loads[k, position - 1])
        tb = self.table
        return float(
            tb.load_recompute[k] if (self.recompute and position > 1) else tb.load_plain[k]
        )

    def _pairs(self, q: int) -> np.ndarray:
        k = np.arange(self.table.offsets[q], self.table.offsets[q + 1])
        return k[self.allowed[k]]

    def _prev(self, k: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
        """dp of each pair's sub-downset at s-1 = 0..S-1, shifted along c for tracked stages."""
        src = self.dp if table is None else table
        prev = src[self.table.sub[k], : self.S, :]
        if self.C:
            shifted = np.full_like(prev, INF)
            shifted[..., 1:] = prev[..., :-1]
            prev = np.where(self.tracked[k][:, None, None], shifted, prev)
        return prev

    def _run(self) -> np.ndarray:
        tb = self.table
        shape = (tb.n_downsets, self.S + 1, self.C + 1)
        dp = np.full(shape, INF)
        dp[0, 0, 0] = 0.0
        self.dp = dp
        if self.track_path:
            self.path_params = np.full(shape, INF)
            self.path_params[0, 0, 0] = 0.0
            self.path_pair = np.full(shape, -1, dtype=np.int64)
        for q in tb.order:
            if q == tb.full:
                continue  # the first stage is placed by the final round
            k = self._pairs(q)
            if len(k) == 0:
                continue
            cand = np.maximum(self._prev(k), self._loads(k)[:, :, None])
            if not self.track_path:
                dp[q, 1:, :] = cand.min(axis=0)
                continue
            arg = cand.argmin(axis=0)[None]  # (1, S, C+1)
            dp[q, 1:, :] = np.take_along_axis(cand, arg, 0)[0]
            pp = np.maximum(self._prev(k, self.path_params), tb.params[k][:, None, None])
            self.path_params[q, 1:, :] = np.take_along_axis(pp, arg, 0)[0]
            self.path_pair[q, 1:, :] = k[arg[0]]
        return dp

    def best_within(self, q: int, s: int, budget: int) -> float:
        """Smallest max load of downset q in s stages on at most `budget` devices."""
        if s < 0 or budget < 0:
            return INF
        row = self.dp[q, s]
        ok = self.devs[s] <= budget
        return float(row[ok].min()) if ok.any() else INF

    def first_stage_loads(self):
        """For the full set's pairs k (allowed) and s = 1..S: the pipeline's max load when pair
        k is the first stage, for each distinct budget K. Returns (k, a, loads(n,S), fn(K))."""
        k = self._pairs(self.table.full)
        loads = self._loads(k)
        prev = self.dp[self.table.sub[k], : self.S, :]  # s-1 stages for the rest
        a = self.a[k]
        devs_rest = self.devs[: self.S]  # (S, C+1) devices of the rest at s-1

        def max_load(K: int, with_params: bool = False):
            budget = (K - a)[:, None, None]
            masked = np.where(devs_rest[None, :, :] <= budget, prev, INF)
            c = masked.argmin(axis=2)[..., None]  # (n, S, 1)
            rest = np.take_along_axis(masked, c, 2)[..., 0]
            m = np.maximum(rest, loads)
            m[a > K] = INF
            if not with_params:
                return m
            rest_p = np.take_along_axis(self.path_params[self.table.sub[k], : self.S, :], c, 2)[
                ..., 0
            ]
            return m, np.maximum(rest_p, self.table.params[k][:, None]), c[..., 0]

        return k, a, max_load

    def reconstruct_path(self, k_first: int, s: int, c_rest: int) -> list[int]:
        """Follow the remembered argmin pairs (track_path DP) from the first stage."""
        stages = [int(k_first)]
        cur, cur_s, c = int(self.table.sub[k_first]), s - 1, int(c_rest)
        while cur != 0:
            k = int(self.path_pair[cur, cur_s, c])
            if k < 0:
                raise RuntimeError("placement DP path is broken")
            stages.append(k)
            c -= int(self.tracked[k])
            cur, cur_s = int(self.table.sub[k]), cur_s - 1
        if cur_s != 0 or c != 0:
            raise RuntimeError("placement DP path left stages over")
        return stages

    def reconstruct(self, k_first: int, s: int, K: int) -> list[int]:
        """Pair indices of the stages, first stage first, realising the DP value (upstream's walk:
        at each step the first pair in enumeration order that attains it)."""
        tb = self.table
        stages = [int(k_first)]
        cur, cur_s, budget = int(tb.sub[k_first]), s - 1, K - int(self.a[k_first])
        while cur != 0:
            target = self.best_within(cur, cur_s, budget)
            found = False
            for k in self._pairs(cur):
                a = int(self.a[k])
                if a > budget or cur_s > tb.max_position[k]:
                    continue
                load = self.load_at(int(k), cur_s)
                if max(self.best_within(int(tb.sub[k]), cur_s - 1, budget - a), load) == target:
                    stages.append(int(k))
                    cur, cur_s, budget = int(tb.sub[k]), cur_s - 1, budget - a
                    found = True
                    break
            if not found:
                raise RuntimeError("placement DP reconstruction found no stage")
        if cur_s != 0:
            raise RuntimeError("placement DP reconstruction left stages over")
        return stages


def _d_groups(d_values, devices, microbatches):
    """Consecutive runs of d (ascending) sharing K = devices // d: (K, ds, microbatches per pipeline)."""
    K_all = devices // d_values
    mp_all = -(-microbatches // d_values)
    start = 0
    while start < len(d_values):
        stop = start
        while stop < len(d_values) and K_all[stop] == K_all[start]:
            stop += 1
        yield int(K_all[start]), d_values[start:stop], mp_all[start:stop]
        start = stop


def pipeline_time_s(max_load_s, microbatches_per_pipeline, stages, sync_s):
    """The time per batch of a placement under upstream's objective, the one formula of this
    module: ``max_load · (m + S − 1) + sync`` (sync: the data-parallel all-reduce after the
    pipeline). Element-wise on arrays; a scalar when every argument is one."""
    steps = np.asarray(microbatches_per_pipeline, dtype=float) + np.asarray(stages) - 1
    return max_load_s * steps + sync_s


def _placement(t, d, stages, devices_per_stage, loads, mems, params, microbatches, allreduce):
    """The Placement of a chosen split: per stage its layers, devices, load, memory and parameter
    bytes; d pipelines; timed by `pipeline_time_s`."""
    pp = len(loads)
    mp = -(-microbatches // d)
    p_sync = params[0] if allreduce.mode == "first" else max(params)
    max_load = max(loads)
    sync_s = float(allreduce(np.array([d]), np.array([p_sync]), [pp])[0, 0])
    return Placement(
        t=t,
        d=d,
        stages=stages,
        devices_per_stage=devices_per_stage,
        time_per_batch=float(pipeline_time_s(max_load, mp, pp, sync_s)),
        max_load=max_load,
        stage_loads=loads,
        stage_mem=mems,
        stage_params=params,
        microbatches_per_pipeline=mp,
        extra={"allreduce_s": sync_s},
    )


def _final_round(w: _WidthDP, d_values, devices, microbatches, allreduce: AllReduce):
    """Upstream's objective (first stage's parameters synchronised): best (time, d, k_first, s,
    K) with upstream's preference on ties: smaller d, then shorter first stage, then fewer stages."""
    if len(d_values) == 0:
        return None
    k, _a, max_load = w.first_stage_loads()
    if len(k) == 0:
        return None
    params = w.table.params[k]
    best = None
    for K, ds, mp in _d_groups(d_values, devices, microbatches):
        m = max_load(K)  # (n_pairs, S)
        if not np.isfinite(m).any():
            continue
        total = pipeline_time_s(
            m[None, :, :],
            mp[:, None, None],
            w.svec[None, None, :],
            allreduce(ds, params)[:, :, None],
        )
        di, ki, si = np.unravel_index(int(np.argmin(total)), total.shape)
        value = float(total[di, ki, si])
        if math.isfinite(value) and (best is None or value < best[0]):
            best = (value, int(ds[di]), int(k[ki]), int(si) + 1, K)
    return best


def _final_round_max(
    w: _WidthDP,
    d_values,
    devices,
    microbatches,
    allreduce: AllReduce,
    params_floor: np.ndarray,
    incumbent: float,
):
    """Our objective (largest stage synchronised) at the current parameter cap.

    For every (d, s) the DP gives the optimal max load L and a concrete solution with largest
    stage P; its true time is L·steps + AR_d(P). Returns (best, limit): best = (time, d,
    k_first, s, c_rest) or None; limit = the largest P over the (d, s) that a smaller cap could
    still improve (L·steps + AR_d(smallest possible P for s stages) < best time), or -inf.
    A solution better than the best must, for its (d, s), have a largest stage < that (d, s)'s
    P (otherwise the concrete solution is at least as good), so caps in [limit, current) change
    nothing and the next cap is the largest candidate below `limit`."""
    k, _a, max_load = w.first_stage_loads()
    if len(k) == 0 or len(d_values) == 0:
        return None, -INF
    best = None
    groups = []
    for K, ds, mp in _d_groups(d_values, devices, microbatches):
        m, p, c = max_load(K, with_params=True)  # (n_pairs, S) each
        arg = m.argmin(axis=0)
        cols = np.arange(w.S)
        mmin, pbest = m[arg, cols], p[arg, cols]
        if not np.isfinite(mmin).any():
            continue
        finite = np.isfinite(mmin)
        total = np.where(
            finite[None, :],
            pipeline_time_s(
                mmin[None, :],
                mp[:, None],
                w.svec[None, :],
                allreduce(ds, np.where(finite, pbest, 0.0), w.svec),
            ),
            INF,
        )
        di, si = np.unravel_index(int(np.argmin(total)), total.shape)
        value = float(total[di, si])
        if math.isfinite(value) and (best is None or value < best[0]):
            best = (value, int(ds[di]), int(k[arg[si]]), int(si) + 1, int(c[arg[si], si]))
        groups.append((ds, mp, mmin, pbest, finite))
    bound = min(incumbent, best[0] if best else INF)
    limit = -INF
    for ds, mp, mmin, pbest, finite in groups:
        floor_s = allreduce(ds, params_floor, w.svec)
        lower = np.where(
            finite[None, :],
            pipeline_time_s(mmin[None, :], mp[:, None], w.svec[None, :], floor_s),
            INF,
        )
        alive = (lower < bound) & finite[None, :]
        if alive.any():
            limit = max(limit, float(np.max(np.where(alive, pbest[None, :], -INF))))
    return best, limit


def min_max_stage_params(table: StageTable, bound_s: int) -> np.ndarray:
    """p[s-1] = the smallest possible largest-stage parameter bytes over all splits of the
    whole graph into s contiguous stages (ignoring memory and devices): a lower bound on the
    all-reduce volume of any s-stage placement."""
    dp = np.full((table.n_downsets, bound_s + 1), INF)
    dp[0, 0] = 0.0
    for q in table.order:
        k = np.arange(table.offsets[q], table.offsets[q + 1])
        if len(k):
            cand = np.maximum(dp[table.sub[k], :bound_s], table.params[k][:, None])
            dp[q, 1:] = cand.min(axis=0)
    return dp[table.full, 1:]


def time_placement(
    g: LayerGraph,
    rule: StageRule,
    t: int,
    stages: list,
    d: int,
    devices: int,
    microbatches: int,
    allreduce: AllReduce,
) -> tuple[Placement | None, str]:
    """Time and memory of a given placement by walking its stages (the reference the DP is
    checked against, also used for fixed expert placements). Returns (placement, '') or
    (None, reason)."""
    stages = [np.asarray(s, dtype=np.int64) for s in stages]
    pp = len(stages)
    where = np.full(g.n, -1)
    for i, nodes in enumerate(stages):
        if len(nodes) == 0:
            return None, f"stage {i} is empty"
        if np.any(where[nodes] != -1):
            return None, "a layer is placed in two stages"
        where[nodes] = i
    if np.any(where < 0):
        return None, "a layer is in no stage"
    if np.any(where[g.src] > where[g.dst]):
        return None, "stages are not contiguous (an edge goes backwards)"
    if d < 1 or d > min(devices, microbatches):
        return (
            None,
            f"data-parallel degree {d} outside 1..min(devices {devices}, microbatches {microbatches})",
        )
    allreduce = allreduce.for_width(t)
    net = allreduce.network
    if net is None:
        costs = [stage_costs(g, rule, nodes) for nodes in stages]
        a = [t if c[5] else 1 for c in costs]
    else:
        reason = net.width_reason(t)
        if reason:
            return None, reason
        if not g.is_chain():
            raise PhazeError("a hierarchical network is costed for layer chains only")
        # the level each boundary crosses depends on the stage positions (phaze.place.network)
        cls = net.boundary_classes(t, d, pp)
        price = lambda c, k: float(net.transfer_times(np.array([c]), t)[k, 0])
        costs = []
        for i, nodes in enumerate(stages):
            pos = pp - i
            costs.append(
                stage_costs(
                    g,
                    rule,
                    nodes,
                    transfer_in=lambda c, k=cls[pos]: price(c, k),
                    transfer_out=lambda c, k=cls[pos - 1]: price(c, k),
                )
            )
        a = [t] * pp  # Megatron's layout: every stage on t devices
    if sum(a) * d > devices:
        return None, f"needs {sum(a) * d} devices, more than the {devices} available"
    loads, mems = [], []
    for i, c in enumerate(costs):
        pos = pp - i
        mem = c[3] + (pos - 1) * c[4]
        mems.append(mem)
        if mem > rule.hbm_capacity_bytes:
            return None, (
                f"stage {i} needs {mem / GIB:.2f} GiB per device, more than "
                f"{rule.hbm_capacity_bytes / GIB:.2f} GiB"
            )
        loads.append(c[1] if (rule.recompute and pos > 1) else c[0])
    params = [c[2] for c in costs]
    stage_layers = [s.tolist() for s in stages]
    return _placement(t, d, stage_layers, a, loads, mems, params, microbatches, allreduce), ""


def position_loads(
    table: StageTable, net: PlaceNetwork, t: int, classes: np.ndarray, bound_s: int, recompute: bool
) -> np.ndarray:
    """(pairs, S) load of every chain stage at positions 1..S when boundary s (between the
    stages at positions s+1 and s) is of class classes[s] (phaze.place.network)."""
    if table.edge_in_bytes is None:
        raise PhazeError("a hierarchical network is costed for layer chains only")
    n = len(table.edge_in_bytes) - 1
    times = net.transfer_times(table.edge_in_bytes, t)  # (3, n+1): into layer i
    times[:, 0] = 0.0  # nothing enters the first layer ...
    times[:, n] = 0.0  # ... and no gradient comes back after the last
    i, j = table.first_layer, table.end_layer
    t_in = times[classes[1 : bound_s + 1]][:, i].T  # activation from the stage in front
    t_out = times[classes[:bound_s]][:, j].T  # gradient from the stage behind
    f, b = table.sum_fw[:, None], table.sum_bw[:, None]
    load = t_in + f + t_out + b
    if recompute and bound_s > 1:
        load[:, 1:] = (t_in + f + np.maximum(f, t_out) + b)[:, 1:]
    return load


def _regimes(net: PlaceNetwork | None, t: int, d_values: np.ndarray, bound_s: int):
    """(d values, boundary classes or None = the flat table) groups that share one DP. On a
    hierarchical network the d with t·d ≥ devices_per_node come first (one DP for all of them;
    on large clusters the optimum is usually there and prunes the rest), then each smaller d."""
    if net is None:
        return [(d_values, None)]
    out = []
    large = d_values[t * d_values >= net.devices_per_node]
    if len(large):
        cls = np.full(bound_s + 1, 1, dtype=np.int64)  # INTER everywhere
        cls[0] = cls[bound_s] = 0
        out.append((large, cls))
    for d in d_values[t * d_values < net.devices_per_node]:
        out.append((np.array([d]), net.boundary_classes(t, int(d), bound_s)))
    return out


def _regime_lower_bound(
    g: LayerGraph, ds: np.ndarray, t: int, devices: int, microbatches: int, bound_s: int
) -> float:
    """No placement with d in ds beats this: with S stages the largest load is at least the
    average, Σ(fw + bw)/S (transfers, recomputation and the all-reduce only add), so time ≥
    Σ(fw + bw) · (⌈M/d⌉ + S − 1)/S, smallest at the most stages that fit (t devices each)."""
    work = float(g.fw.sum() + g.bw.sum())
    best = INF
    for d in ds:
        s_max = min(bound_s, (devices // int(d)) // t)
        if s_max < 1:
            continue
        mp = -(-microbatches // int(d))
        best = min(best, float(pipeline_time_s(work, mp, s_max, 0.0)) / s_max)
    return best


def solve_width(
    g: LayerGraph,
    rule: StageRule,
    t: int,
    devices: int,
    microbatches: int,
    d_values: np.ndarray,
    allreduce: AllReduce,
    table: StageTable | None = None,
) -> Placement | None:
    """The optimal placement for one t, or None when nothing fits (or, on a hierarchical
    network, when t does not divide the devices per node)."""
    table = table if table is not None else build_stage_table(g, rule)
    bound_s = min(devices, g.n)
    n_tp = int(np.count_nonzero(g.tp))
    if t == 1 and n_tp:
        raise PhazeError("tensor-parallel width 1 but a layer is marked tensor-parallel")
    allreduce = allreduce.for_width(t)
    net = allreduce.network
    if net is not None and net.width_reason(t):
        return None

    def dp_for(allowed, track_path=False, pos_loads=None):
        return _WidthDP(
            table,
            t,
            rule.recompute,
            bound_s,
            allowed,
            n_tp,
            g.n,
            track_path,
            pos_loads=pos_loads,
            uniform_width=net is not None,
        )

    if allreduce.mode == "first":
        w = dp_for(np.ones(len(table.sub), dtype=bool))
        found = _final_round(w, d_values, devices, microbatches, allreduce)
        if found is None:
            return None
        _, d, k_first, s, K = found
        pairs = w.reconstruct(k_first, s, K)
        return _placement_from_pairs(
            g, rule, t, table, pairs, d, devices, microbatches, allreduce, w
        )

    # mode max: exact over the largest stage's parameters by descending caps (see _final_round_max)
    caps = np.unique(table.params[table.max_position > 0])
    params_floor = min_max_stage_params(table, bound_s)
    best, best_time = None, INF
    for ds, classes in _regimes(net, t, np.asarray(d_values), bound_s):
        if (
            classes is not None
            and _regime_lower_bound(g, ds, t, devices, microbatches, bound_s) >= best_time
        ):
            continue
        pos = (
            None
            if classes is None
            else position_loads(table, net, t, classes, bound_s, rule.recompute)
        )
        cap_index = len(caps) - 1
        while cap_index >= 0:
            w = dp_for(table.params <= caps[cap_index], track_path=True, pos_loads=pos)
            found, limit = _final_round_max(
                w, ds, devices, microbatches, allreduce, params_floor, best_time
            )
            if found is not None and found[0] < best_time:
                _, d, k_first, s, c_rest = found
                pairs = w.reconstruct_path(k_first, s, c_rest)
                best = _placement_from_pairs(
                    g, rule, t, table, pairs, d, devices, microbatches, allreduce, w
                )
                if not math.isclose(best.time_per_batch, found[0], rel_tol=1e-9):
                    raise RuntimeError("placement DP path does not reproduce its value")
                best_time = found[0]
            if found is None or not math.isfinite(limit):
                break
            cap_index = min(cap_index - 1, int(np.searchsorted(caps, limit, side="left")) - 1)
    return best


def _placement_from_pairs(g, rule, t, table, pairs, d, devices, microbatches, allreduce, w):
    """Turn reconstructed pairs into a Placement, using the stage table's numbers (the DP's)."""
    pp = len(pairs)
    loads, mems = [], []
    for i, k in enumerate(pairs):
        pos = pp - i
        loads.append(w.load_at(int(k), pos))
        mems.append(table.stage_memory(k, pos))
    params = [float(table.params[k]) for k in pairs]
    stage_layers = [table.members(k).tolist() for k in pairs]
    devices_per_stage = [int(w.a[k]) for k in pairs]
    return _placement(
        t, d, stage_layers, devices_per_stage, loads, mems, params, microbatches, allreduce
    )


def solve(
    graphs: dict[int, LayerGraph],
    rule: StageRule,
    devices: int,
    microbatches: int,
    d_values: np.ndarray,
    allreduce: AllReduce,
    on_width: Callable[[int, Placement | None], None] | None = None,
) -> Placement | None:
    """Best placement over the tensor-parallel widths (ascending t; a tie keeps the smaller t)."""
    best = None
    for t in sorted(graphs):
        p = solve_width(graphs[t], rule, t, devices, microbatches, d_values, allreduce)
        if on_width:
            on_width(t, p)
        if p is not None and (best is None or p.time_per_batch < best.time_per_batch):
            best = p
    return best
