"""The layer graph a placement partitions, and the table of every candidate pipeline stage.

A pipeline stage is a *contiguous* set of layers: the difference of two nested downsets, where a
downset here is a set closed under successors (what remains to be placed after the first stages).
On a chain the downsets are the L+1 suffixes, and the stage table is built for all O(L²) ranges at
once from prefix sums; on any other DAG the downsets are enumerated (bounded) and each stage is
costed by walking its layers.

Stage rules (shared by our mode and upstream's ``--instance`` mode; parameters in `StageRule`):

* Forward: the stage's layers run one after another on the stage's devices; a layer starts when
  the previous one finished and its inputs arrived (inputs from outside the stage start
  transferring at time 0). Backward the same in reverse, waiting for the gradient of every output
  that leaves the stage. This is upstream's finishing-time rule; on a chain it is
  ``in-transfer + Σ fw + out-transfer + Σ bw``.
* With activation recomputation, every stage but the last (position from the end s > 1) first
  re-runs its forward from its stashed input (no transfer), overlapped with the arrival of the
  output gradient: ``fw + max(Σ fw, out-transfer) + Σ bw``.
* Memory of a device at position s from the end under 1F1B:
  ``param_state_factor · params + activations + (s − 1) · stash`` where stash is all activations
  without recompute and the stage's input boundary with it. `max_position` is the largest feasible s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from phaze.errors import PhazeError
from phaze.network import p2p_seconds

#: Enumerating downsets of a wide DAG explodes; upstream stops at the same order of magnitude.
MAX_DOWNSETS = 40_000


@dataclass(frozen=True)
class StageRule:
    """How a stage's time and memory are computed (units are whatever the caller uses
    consistently: seconds and bytes in our mode, the instance's own units in --instance mode)."""

    bandwidth: float  # bytes per time unit of one accelerator link
    latency: float  # per-transfer latency (0 in upstream's model)
    param_state_factor: float  # memory per parameter byte: weights + gradients + optimizer state
    recompute: bool
    hbm_capacity_bytes: float  # bytes per device
    max_positions: int  # cap on the feasible position from the end (upstream: maxDevices)
    strict_upstream: bool = False  # upstream fails on layers that are not connected in order

    def transfer(self, nbytes):
        return p2p_seconds(nbytes, self.bandwidth, self.latency)


@dataclass
class LayerGraph:
    """Layers in a topological order (index = position) with per-layer costs for ONE tensor-
    parallel width t. `ids` are the caller's names for the layers (upstream node ids, layer names)."""

    fw: np.ndarray  # forward latency per layer
    bw: np.ndarray  # backward latency per layer
    params: np.ndarray  # parameter bytes per device
    acts: np.ndarray  # activation bytes kept for backward (one microbatch)
    ext_stash: np.ndarray  # recompute stash of inputs that come from outside the graph
    tp: np.ndarray  # bool: layer is tensor-parallel (stage needs t devices)
    src: np.ndarray  # edges, in topological numbering
    dst: np.ndarray
    edge_bytes: np.ndarray
    ids: list = field(default_factory=list)

    def __post_init__(self):
        n = len(self.fw)
        for name in ("bw", "params", "acts", "ext_stash", "tp"):
            if len(getattr(self, name)) != n:
                raise PhazeError(
                    f"layer graph: {name} has {len(getattr(self, name))} entries, expected {n}"
                )
        if n == 0:
            raise PhazeError("layer graph has no layers")
        if np.any(self.src >= self.dst):
            raise PhazeError("layer graph edges must go forward in the topological numbering")
        if not self.ids:
            self.ids = list(range(n))

    @property
    def n(self) -> int:
        return len(self.fw)

    def is_chain(self) -> bool:
        n = self.n
        return (
            len(self.src) == n - 1
            and np.array_equal(np.sort(self.src), np.arange(n - 1))
            and np.array_equal(self.dst[np.argsort(self.src)], np.arange(1, n))
        )


def chain_graph(fw, bw, params, acts, boundary_bytes, tp, ext_stash=None, ids=None) -> LayerGraph:
    """A chain: layer i feeds layer i+1 with boundary_bytes[i] (the last entry is unused)."""
    n = len(fw)
    f = lambda x: np.asarray(x, dtype=float)
    return LayerGraph(
        fw=f(fw),
        bw=f(bw),
        params=f(params),
        acts=f(acts),
        ext_stash=f(ext_stash) if ext_stash is not None else np.zeros(n),
        tp=np.asarray(tp, dtype=bool),
        src=np.arange(n - 1),
        dst=np.arange(1, n),
        edge_bytes=f(boundary_bytes)[: n - 1],
        ids=list(ids) if ids is not None else [],
    )


@dataclass
class StageTable:
    """Every candidate stage, grouped by the downset it starts (CSR): stage k of downset q is
    ``downset[q] minus downset[sub[k]]`` for k in ``offsets[q]:offsets[q+1]``. Downset 0 is empty,
    `full` is the whole graph; `order` lists the non-empty downsets smallest first (DP order)."""

    n_downsets: int
    full: int
    order: np.ndarray
    offsets: np.ndarray
    sub: np.ndarray
    load_plain: np.ndarray  # fw + bw (last stage, or no recompute)
    load_recompute: np.ndarray  # with forward recomputation (non-last stages)
    tp: np.ndarray  # stage holds a tensor-parallel layer
    max_position: np.ndarray  # largest memory-feasible position from the end (0 = none)
    params: np.ndarray  # parameter bytes per device
    const_mem: np.ndarray  # memory at position 1
    stash: np.ndarray  # extra memory per further in-flight microbatch
    members: object  # callable (pair index) -> array of layer positions
    # chain tables only (None otherwise): the stage's layer range i..j-1, Σ fw, Σ bw and the
    # bytes entering each layer from its predecessor (edge_in[0] = 0), so that transfer costs
    # can be re-priced per network level (phaze.place.network)
    first_layer: np.ndarray | None = None
    end_layer: np.ndarray | None = None
    sum_fw: np.ndarray | None = None
    sum_bw: np.ndarray | None = None
    edge_in_bytes: np.ndarray | None = None

    def stage_memory(self, k: int, position: int) -> float:
        return float(self.const_mem[k] + (position - 1) * self.stash[k])


def _max_position(const, stash, capacity, cap):
    """Largest s with const + (s-1)·stash <= capacity, clamped to [0, cap] (upstream's rule)."""
    const = np.asarray(const, dtype=float)
    stash = np.asarray(stash, dtype=float)
    out = np.zeros(const.shape, dtype=np.int64)
    fits_all = const + (cap - 1) * stash <= capacity
    none = const > capacity
    mid = ~fits_all & ~none
    with np.errstate(divide="ignore", invalid="ignore"):
        out[mid] = 1 + np.floor((capacity - const[mid]) / stash[mid]).astype(np.int64)
    out[fits_all] = cap
    return np.minimum(out, cap)


def build_chain_table(g: LayerGraph, rule: StageRule) -> StageTable:
    """All O(L²) contiguous ranges of a chain, vectorised with prefix sums.

    Downset q is the suffix of the last q layers; its sub-downsets are listed largest first
    (shortest stage first), which is the order upstream's enumeration visits them."""
    n = g.n
    cum = lambda x: np.concatenate(([0.0], np.cumsum(x)))
    F, B, P, A, X = cum(g.fw), cum(g.bw), cum(g.params), cum(g.acts), cum(g.ext_stash)
    T = np.concatenate(([0], np.cumsum(g.tp.astype(np.int64))))
    eb = np.zeros(n + 1)  # eb[i] = bytes entering layer i from layer i-1 (0 for i = 0, n)
    eb[g.src + 1] = g.edge_bytes  # edges may come in any order
    t_in = np.where(np.arange(n + 1) > 0, rule.transfer(eb), 0.0)
    t_in[0] = 0.0
    t_in[n] = 0.0
    # Pairs (i, j): stage = layers i..j-1. Row for downset q = n - i lists j = i+1..n.
    ii, jj = [], []
    for q in range(1, n + 1):
        i = n - q
        ii.append(np.full(q, i))
        jj.append(np.arange(i + 1, n + 1))
    i = np.concatenate(ii)
    j = np.concatenate(jj)
    sum_fw = F[j] - F[i]
    sum_bw = B[j] - B[i]
    fw_pass = t_in[i] + sum_fw
    out_xfer = t_in[j]  # transfer of the gradient of layer j-1's output (0 for the last stage)
    load_plain = fw_pass + (out_xfer + sum_bw)
    load_rc = fw_pass + (np.maximum(sum_fw, out_xfer) + sum_bw)
    params = P[j] - P[i]
    acts = A[j] - A[i]
    const = rule.param_state_factor * params + acts
    if rule.recompute:
        stash = eb[i] + (X[j] - X[i])
    else:
        stash = acts
    offsets = np.concatenate(([0], np.cumsum(np.arange(0, n + 1))))
    return StageTable(
        n_downsets=n + 1,
        full=n,
        order=np.arange(1, n + 1),
        offsets=offsets,
        sub=n - j,
        load_plain=load_plain,
        load_recompute=load_rc,
        tp=(T[j] - T[i]) > 0,
        max_position=_max_position(const, stash, rule.hbm_capacity_bytes, rule.max_positions),
        params=params,
        const_mem=const,
        stash=stash,
        members=lambda k, i=i, j=j: np.arange(i[k], j[k]),
        first_layer=i,
        end_layer=j,
        sum_fw=sum_fw,
        sum_bw=sum_bw,
        edge_in_bytes=eb,
    )


def _enumerate_downsets(g: LayerGraph):
    """Successor-closed sets as bitmasks, in upstream's discovery order (depth first, trying
    layers in index order), with each one's immediate sub-downsets in discovery order."""
    n = g.n
    succ_mask = [0] * n
    for s, d in zip(g.src.tolist(), g.dst.tolist()):
        succ_mask[s] |= 1 << d
    ids = {0: 0}
    masks = [0]
    immediate = [[]]
    # explicit stack of (mask, id, next layer to try) instead of recursion
    stack = [(0, 0, 0)]
    while stack:
        mask, my_id, v = stack.pop()
        while v < n:
            if not (mask >> v) & 1 and (succ_mask[v] & ~mask) == 0:
                new = mask | (1 << v)
                if new not in ids:
                    ids[new] = len(masks)
                    masks.append(new)
                    immediate.append([])
                    if len(masks) > MAX_DOWNSETS:
                        raise PhazeError(
                            f"the layer graph has more than {MAX_DOWNSETS} downsets; "
                            "its pipeline partitions cannot be enumerated"
                        )
                    immediate[ids[new]].append(my_id)
                    stack.append((mask, my_id, v + 1))  # resume here after the child
                    stack.append((new, ids[new], 0))
                    break
                immediate[ids[new]].append(my_id)
            v += 1
    return masks, immediate


def _closure_order(immediate, q):
    """All proper sub-downsets of q, in the order a depth-first walk of immediate subsets meets them."""
    out, seen, stack = [], {q}, [q]
    while stack:
        x = stack.pop()
        if x != q:
            out.append(x)
        for y in immediate[x]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return out


def stage_costs(
    g: LayerGraph, rule: StageRule, nodes: np.ndarray, transfer_in=None, transfer_out=None
):
    """(load_plain, load_recompute, params, const_mem, stash, tp) of one stage by walking it.
    `transfer_in` / `transfer_out` (bytes -> seconds) price the activations entering the stage and
    the gradients of its outputs; default `rule.transfer` for both (one flat link)."""
    transfer_in = transfer_in or rule.transfer
    transfer_out = transfer_out or rule.transfer
    members = set(nodes.tolist())
    inc = [[] for _ in range(g.n)]
    out = [[] for _ in range(g.n)]
    for s, d, c in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist()):
        inc[d].append((s, c))
        out[s].append((d, c))
    order = sorted(members)
    # forward (inputs from outside start transferring at time 0)
    finish, prev, fw_pass = {}, -1, 0.0
    for v in order:
        start, seen = 0.0, False
        for u, c in inc[v]:
            if u == prev:
                seen = True
            start = max(start, finish[u] if u in finish else transfer_in(c))
        if prev != -1:
            if rule.strict_upstream and not seen:
                raise PhazeError(
                    "branching in the layer graph: upstream's stage rule needs each "
                    "layer of a stage to consume the previous one (device_placement.cpp fails here too)"
                )
            start = max(start, finish[prev])  # one device runs the stage's layers in order
        finish[v] = start + g.fw[v]
        fw_pass = finish[v]
        prev = v
    # backward
    finish, prev, bw_pass = {}, -1, 0.0
    for v in reversed(order):
        start = finish[prev] if prev != -1 else 0.0
        for w, c in out[v]:
            start = max(start, finish[w] if w in finish else transfer_out(c))
        finish[v] = start + g.bw[v]
        bw_pass = finish[v]
        prev = v
    # recompute: forward from the stash (no transfer), then backward
    finish, prev, fw_only = {}, -1, 0.0
    for v in order:
        start = finish[prev] if prev != -1 else 0.0
        for u, _ in inc[v]:
            if u in finish:
                start = max(start, finish[u])
        finish[v] = start + g.fw[v]
        fw_only = finish[v]
        prev = v
    finish, prev, rc_tail = {}, -1, 0.0
    for v in reversed(order):
        start = max(fw_only, finish[prev]) if prev != -1 else fw_only
        for w, c in out[v]:
            start = max(start, finish[w] if w in finish else transfer_out(c))
        finish[v] = start + g.bw[v]
        rc_tail = finish[v]
        prev = v
    params = float(sum(g.params[v] for v in order))
    acts = float(sum(g.acts[v] for v in order))
    if rule.recompute:
        stash = float(
            sum(c for v in order for u, c in inc[v] if u not in members)
            + sum(g.ext_stash[v] for v in order)
        )
    else:
        stash = acts
    tp = bool(any(g.tp[v] for v in order))
    return (
        fw_pass + bw_pass,
        fw_pass + rc_tail,
        params,
        rule.param_state_factor * params + acts,
        stash,
        tp,
    )


def build_generic_table(g: LayerGraph, rule: StageRule) -> StageTable:
    masks, immediate = _enumerate_downsets(g)
    full_mask = (1 << g.n) - 1
    full = masks.index(full_mask)
    sizes = [(m).bit_count() for m in masks]
    order = np.array(sorted(range(1, len(masks)), key=lambda q: (sizes[q], q)), dtype=np.int64)
    offsets = np.zeros(len(masks) + 1, dtype=np.int64)
    subs, rows = [], []
    by_q = {}
    for q in range(len(masks)):
        s = _closure_order(immediate, q) if q else []
        by_q[q] = s
    for q in range(len(masks)):
        offsets[q + 1] = offsets[q] + len(by_q[q])
        for sq in by_q[q]:
            subs.append(sq)
            diff = masks[q] & ~masks[sq]
            nodes = np.array([v for v in range(g.n) if (diff >> v) & 1], dtype=np.int64)
            rows.append((nodes, stage_costs(g, rule, nodes)))
    cols = list(zip(*[r[1] for r in rows]))
    members = [r[0] for r in rows]
    const = np.array(cols[3])
    stash = np.array(cols[4])
    return StageTable(
        n_downsets=len(masks),
        full=full,
        order=order,
        offsets=offsets,
        sub=np.array(subs, dtype=np.int64),
        load_plain=np.array(cols[0]),
        load_recompute=np.array(cols[1]),
        tp=np.array(cols[5], dtype=bool),
        max_position=_max_position(const, stash, rule.hbm_capacity_bytes, rule.max_positions),
        params=np.array(cols[2]),
        const_mem=const,
        stash=stash,
        members=lambda k: members[k],
    )


def build_stage_table(g: LayerGraph, rule: StageRule) -> StageTable:
    if g.is_chain():
        return build_chain_table(g, rule)
    return build_generic_table(g, rule)
