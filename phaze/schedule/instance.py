"""One scheduling instance: a layer's operator DAG on one accelerator's cores.

The resource model (upstream Phaze's, made explicit):

* an op of core type ``tc`` needs one tensor core, ``vc`` one vector core, ``fused`` (a matmul
  carrying its element-wise consumer) a tensor core *and* a vector core, for ``latency_1core_s``;
* or it runs intra-op parallel (flag ``y``) on all cores of its type for ``latency_allcores_s``,
  and then it runs alone on the chip (nothing else overlaps it);
* collectives are ``vc`` ops with equal 1-core and all-core latency.

Ops are re-indexed 0..n-1 in a topological order; ``ids`` keeps the caller's op ids. Comparability
(ancestor/descendant) is kept as Python-int bitsets, which makes the ordering-pair enumeration and
the articulation test cheap.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from functools import cached_property

from phaze.errors import PhazeError

CORE_TYPES = ("tc", "vc", "fused")


@dataclass(frozen=True)
class Instance:
    n_tc: int
    n_vc: int
    core: tuple[str, ...]  # per op: tc | vc | fused
    l1: tuple[float, ...]  # latency on one core of its type, s
    la: tuple[float, ...]  # latency intra-op parallel on all cores of its type, s
    edges: tuple[tuple[int, int], ...]  # (src, dst) over indices 0..n-1, src topologically first
    ids: tuple[int, ...] = field(default=())  # caller's op ids, per index

    @property
    def n(self) -> int:
        return len(self.core)

    # ---- graph structure ------------------------------------------------------------------
    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        p: list[list[int]] = [[] for _ in range(self.n)]
        for a, b in self.edges:
            p[b].append(a)
        return tuple(tuple(sorted(x)) for x in p)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        s: list[list[int]] = [[] for _ in range(self.n)]
        for a, b in self.edges:
            s[a].append(b)
        return tuple(tuple(sorted(x)) for x in s)

    @cached_property
    def ancestors(self) -> tuple[int, ...]:
        """Bitset of strict ancestors per op (indices are topological, so one forward pass)."""
        anc = [0] * self.n
        for j in range(self.n):
            m = 0
            for i in self.preds[j]:
                m |= anc[i] | (1 << i)
            anc[j] = m
        return tuple(anc)

    @cached_property
    def descendants(self) -> tuple[int, ...]:
        desc = [0] * self.n
        for i in reversed(range(self.n)):
            m = 0
            for j in self.succs[i]:
                m |= desc[j] | (1 << j)
            desc[i] = m
        return tuple(desc)

    def comparable(self, i: int, j: int) -> bool:
        return bool((self.ancestors[j] >> i) & 1 or (self.ancestors[i] >> j) & 1)

    @cached_property
    def incomparable_pairs(self) -> tuple[tuple[int, int], ...]:
        out = []
        for i in range(self.n):
            rel = self.ancestors[i] | self.descendants[i]
            for j in range(i + 1, self.n):
                if not (rel >> j) & 1:
                    out.append((i, j))
        return tuple(out)

    @cached_property
    def reduced_edges(self) -> tuple[tuple[int, int], ...]:
        """Transitive reduction: the precedence constraints the ILP actually needs."""
        out = []
        for a, b in self.edges:
            # a->b is redundant if some other predecessor of b descends from a
            if not any(c != a and (self.ancestors[c] >> a) & 1 for c in self.preds[b]):
                out.append((a, b))
        return tuple(sorted(set(out)))

    def is_chain(self) -> bool:
        """Every pair comparable: the ops run one after another whatever the schedule."""
        return not self.incomparable_pairs

    # ---- per-op resource facts ------------------------------------------------------------
    def uses(self, i: int, kind: str) -> bool:
        c = self.core[i]
        return c == kind or c == "fused"

    def n_cores(self, kind: str) -> int:
        return self.n_tc if kind == "tc" else self.n_vc

    @cached_property
    def q(self) -> tuple[float, ...]:
        """Shortest possible latency of each op (best of its two modes)."""
        return tuple(min(a, b) for a, b in zip(self.l1, self.la))

    # ---- identity for the cache -----------------------------------------------------------
    def cache_key(self, digits: int = 6) -> tuple[str, float]:
        """(key, scale): instances equal up to a common latency scale share a key.

        Latencies are divided by the largest one and rounded to ``digits`` significant digits
        (far below any solver gap), so an instance whose latencies all scale by one factor (e.g.
        two architectures differing only in clock, all ops compute-bound) re-uses the schedule.
        """
        scale = max(max(self.l1), max(self.la)) or 1.0

        def r(v: float) -> str:
            return f"{v / scale:.{digits}e}"

        h = hashlib.sha256()
        h.update(f"{self.n_tc},{self.n_vc};".encode())
        h.update(",".join(self.core).encode())
        h.update(repr(self.edges).encode())
        h.update(",".join(r(v) for v in self.l1 + self.la).encode())
        return h.hexdigest(), scale

    def subinstance(self, members: list[int]) -> Instance:
        """Induced sub-DAG on ``members`` (kept in topological order)."""
        members = sorted(members)
        pos = {m: k for k, m in enumerate(members)}
        edges = tuple((pos[a], pos[b]) for a, b in self.edges if a in pos and b in pos)
        return Instance(
            self.n_tc,
            self.n_vc,
            tuple(self.core[m] for m in members),
            tuple(self.l1[m] for m in members),
            tuple(self.la[m] for m in members),
            edges,
            tuple(self.ids[m] for m in members) if self.ids else tuple(members),
        )


def make_instance(n_tc: int, n_vc: int, ops: list[dict], edges: list) -> Instance:
    """Validate and build an Instance from caller ids (any order); ops are dicts with ``id``,
    ``core``, ``latency_1core_s``, ``latency_allcores_s``."""
    if int(n_tc) < 1 or int(n_vc) < 1:
        raise PhazeError(f"core counts must be >= 1, got n_tc={n_tc}, n_vc={n_vc}")
    if not ops:
        raise PhazeError("instance has no ops")
    ids = []
    for op in ops:
        for key in ("id", "core", "latency_1core_s", "latency_allcores_s"):
            if key not in op:
                raise PhazeError(f"op {op!r} lacks {key!r}")
        if op["core"] not in CORE_TYPES:
            raise PhazeError(f"op {op['id']}: core must be one of {CORE_TYPES}, got {op['core']!r}")
        for key in ("latency_1core_s", "latency_allcores_s"):
            v = float(op[key])
            if not math.isfinite(v) or v < 0:
                raise PhazeError(f"op {op['id']}: {key} must be finite and >= 0, got {op[key]!r}")
        ids.append(int(op["id"]))
    if len(set(ids)) != len(ids):
        raise PhazeError("duplicate op ids")
    idset = set(ids)
    succ: dict[int, set[int]] = {i: set() for i in ids}
    indeg = {i: 0 for i in ids}
    for e in edges:
        if len(e) != 2:
            raise PhazeError(f"edge {e!r} is not a [src, dst] pair")
        a, b = int(e[0]), int(e[1])
        if a not in idset or b not in idset:
            raise PhazeError(f"edge [{a}, {b}] names an unknown op")
        if a == b:
            raise PhazeError(f"edge [{a}, {b}] is a self-loop")
        if b not in succ[a]:
            succ[a].add(b)
            indeg[b] += 1
    # Kahn's algorithm, smallest id first, so the index order is deterministic.
    ready = [i for i in ids if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(ids):
        raise PhazeError("the op graph has a cycle")
    pos = {i: k for k, i in enumerate(order)}
    by_id = {int(op["id"]): op for op in ops}
    return Instance(
        int(n_tc),
        int(n_vc),
        tuple(str(by_id[i]["core"]) for i in order),
        tuple(float(by_id[i]["latency_1core_s"]) for i in order),
        tuple(float(by_id[i]["latency_allcores_s"]) for i in order),
        tuple(sorted((pos[a], pos[b]) for a in succ for b in succ[a])),
        tuple(order),
    )
