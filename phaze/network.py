"""The network model every stage shares: ring collectives, point-to-point sends, and a two-level
(node / cluster) network.

The formulas are written once, here, and used by the cost model (collectives inside a
tensor-parallel layer, phaze.estimate), the placement (pipeline transfers and the data-parallel
all-reduce, phaze.place) and the training-step evaluation (phaze.fidelity):

* ``ring_seconds(kind, S, g, B, L)``: a ring collective over g ranks, S bytes, links of B bytes/s
  and L s per step: ``steps · ((g − 1)/g · S/B + (g − 1) · L)`` with 1 step for a
  reduce-scatter or an all-gather and 2 for an all-reduce (reduce-scatter then all-gather);
  g ≤ 1 costs nothing;
* ``p2p_seconds(S, B, L)``: one send, ``S/B + L``.

The all-to-all (expert parallelism's token dispatch and combine, Megatron's ``all_to_all_single``
over the expert-parallel group): every rank holds S bytes, S/g for each member, and sends its
g − 1 blocks to their owners. Each network states its algorithm and writes its time in the ring
form of one step, ``(g − 1)/g · S/B' + (g − 1) · L'``, with the group's own (B', L')
(``a2a_params``), so the step model prices it like any collective:

* two-level network, **direct exchange** (NCCL's all-to-all: grouped sends to every peer at
  once): a rank's blocks to the r − 1 members on its node cross the intra-node link, its blocks
  to the g − r others its own NIC, both levels at once; time = the slower level,
  ``max((r_max − 1)·S/(g·B_intra), (g − r_min)·S/(g·B_inter))`` (r_max / r_min: the most / fewest
  members on one node), plus ``(g − 1)`` message latencies of the slowest level used (the α term
  of pairwise exchange, Thakur, Rabenseifner & Gropp 2005). On one level this is exactly the
  ring form with that level's bandwidth and latency.

A two-level network:

Devices are grouped into nodes of ``devices_per_node``; rank ``r`` lives on node
``r // devices_per_node`` (Megatron's and torchrun's contiguous numbering). Each level has a
per-device, per-direction bandwidth, a per-step latency and an efficiency (achieved fraction of
the nominal bandwidth for large messages, as NCCL reports it).

Collectives follow NCCL's ring algorithm, the one it uses for the large messages of training. A
ring over a group with ``r`` ranks on each of ``n`` nodes threads the ``r`` ranks of a node over
the intra-node links and leaves the node through those ranks' own NICs, one channel per NIC (a
DGX has one NIC per GPU). Every ring step moves S/g bytes over each device's intra-node link and
S/(r·g) over each NIC, so the step is set by the slower of the two: the ring's bottleneck
bandwidth is ``min(B_intra, r · B_inter)`` once the group spans nodes, ``B_intra`` otherwise.
Consequences a user can check by hand:

* a ring that stays in one node costs exactly the flat ring on the intra level;
* when both levels are equal, the two-level ring equals the flat ring (bandwidth AND latency);
* the 8 NICs of a DGX A100 (8 × 25 GB/s) carry a node-spanning all-reduce at ~200 GB/s, the
  figure nccl-tests reports on such clusters.

Sizes are bytes; ``all_reduce(S)`` / ``reduce_scatter(S)`` take S = the full buffer each rank
holds before the collective, ``all_gather(S)`` S = the full buffer after it.

A 3D torus (``TorusNetwork``, a preset's ``network: {topology: torus3d, cube, pod, link}``, the
TPU v4 ICI): the slice a job of N chips gets, its collectives over boxes of the torus (every
spanned axis at once, both directions of a closed ring) and its point-to-point hops; the formulas
are in the class. ``network_from_section`` reads either form, ``network_for_architecture`` picks
the one an architecture's collectives run on (its preset's, config ``place.network``, or the flat
``costmodel.link_*``), for every stage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from phaze.errors import PhazeError

#: ring steps (phases of g − 1 transfers of S/g bytes) per collective; the all-to-all is one
#: phase of its own (bandwidth, latency): ``a2a_params``, not ``ring_params``
RING_STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}


def ring_seconds(kind: str, size_bytes, ranks, bandwidth_Bps, latency_s):
    """Seconds of a ring collective (NCCL's algorithm for large messages) of ``size_bytes``
    (all_reduce / reduce_scatter: the buffer each rank holds before; all_gather: after) over
    ``ranks`` devices whose bottleneck link moves ``bandwidth_Bps`` with ``latency_s`` per step.
    Arguments broadcast as NumPy arrays; ranks <= 1 cost 0."""
    if kind not in RING_STEPS:
        raise ValueError(f"unknown collective {kind!r}; known: {sorted(RING_STEPS)}")
    s, g = np.broadcast_arrays(np.asarray(size_bytes, dtype=np.float64), np.asarray(ranks, float))
    gg = np.maximum(g, 1.0)
    seconds = RING_STEPS[kind] * ((gg - 1.0) / gg * s / bandwidth_Bps + (gg - 1.0) * latency_s)
    return np.where(g > 1, seconds, 0.0)


def collective_seconds(kind: str, size_bytes, ranks, bandwidth_Bps, latency_s):
    """`ring_seconds`, with an empty message free (nothing is sent)."""
    seconds = ring_seconds(kind, size_bytes, ranks, bandwidth_Bps, latency_s)
    return np.where(np.asarray(size_bytes, dtype=np.float64) > 0, seconds, 0.0)


def p2p_seconds(size_bytes, bandwidth_Bps, latency_s):
    """Seconds of one point-to-point send: ``size / bandwidth + latency``."""
    return size_bytes / bandwidth_Bps + latency_s


@dataclass(frozen=True)
class LinkLevel:
    """One level of the hierarchy, per device and per direction."""

    bandwidth_Bps: float
    latency_s: float
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not self.bandwidth_Bps > 0:
            raise PhazeError(f"link bandwidth must be > 0 B/s, got {self.bandwidth_Bps}")
        if self.latency_s < 0:
            raise PhazeError(f"link latency must be >= 0 s, got {self.latency_s}")
        if not 0 < self.efficiency <= 1:
            raise PhazeError(f"link efficiency must be in (0, 1], got {self.efficiency}")

    @property
    def effective_Bps(self) -> float:
        return self.bandwidth_Bps * self.efficiency

    @classmethod
    def from_dict(cls, d: dict, where: str) -> LinkLevel:
        try:
            return cls(
                float(d["bandwidth_Bps"]), float(d["latency_s"]), float(d.get("efficiency", 1.0))
            )
        except KeyError as exc:
            raise PhazeError(
                f"{where}: missing key {exc.args[0]!r} (need bandwidth_Bps, latency_s)"
            ) from None
        except (TypeError, ValueError) as exc:
            raise PhazeError(f"{where}: {exc}") from None


class _Collectives:
    """The named collectives of a network, all through its ``collective(kind, size, ranks)``."""

    def reduce_scatter(self, size_bytes: float, ranks: Sequence[int]) -> float:
        return self.collective("reduce_scatter", size_bytes, ranks)

    def all_gather(self, size_bytes: float, ranks: Sequence[int]) -> float:
        # the ring all-gather is the reduce-scatter run backwards: same steps, same bytes
        return self.collective("all_gather", size_bytes, ranks)

    def all_reduce(self, size_bytes: float, ranks: Sequence[int]) -> float:
        # reduce-scatter then all-gather
        return self.collective("all_reduce", size_bytes, ranks)

    def all_to_all(self, size_bytes: float, ranks: Sequence[int]) -> float:
        # every rank sends S/g to every other member (the network's own algorithm)
        return self.collective("all_to_all", size_bytes, ranks)


def _pairs_of(src_group: Sequence[int], dst_group: Sequence[int]) -> list[tuple[int, int]]:
    """Rank i of one tensor-parallel group with rank i of the next stage's."""
    src_group, dst_group = list(src_group), list(dst_group)
    if len(src_group) != len(dst_group):
        raise PhazeError("stage transfer between tensor-parallel groups of different sizes")
    return list(zip(src_group, dst_group))


@dataclass(frozen=True)
class GroupShape:
    """How a communicator's ranks sit in the hierarchy: ``per_node`` ranks on each of ``nodes``."""

    size: int
    per_node: int
    nodes: int


@dataclass(frozen=True)
class HierarchicalNetwork(_Collectives):
    devices_per_node: int
    intra: LinkLevel
    inter: LinkLevel

    def __post_init__(self) -> None:
        if self.devices_per_node < 1:
            raise PhazeError(f"devices_per_node must be >= 1, got {self.devices_per_node}")

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, network: dict, where: str = "preset network") -> HierarchicalNetwork:
        """``network:`` section of a preset: devices_per_node, intra_node{...}, inter_node{...}."""
        if not isinstance(network, dict):
            raise PhazeError(
                f"{where}: expected a mapping with devices_per_node, intra_node, inter_node"
            )
        for key in ("devices_per_node", "intra_node", "inter_node"):
            if key not in network:
                raise PhazeError(f"{where}: missing key {key!r}")
        return cls(
            int(network["devices_per_node"]),
            LinkLevel.from_dict(network["intra_node"], f"{where}.intra_node"),
            LinkLevel.from_dict(network["inter_node"], f"{where}.inter_node"),
        )

    @classmethod
    def flat(cls, level: LinkLevel, devices: int) -> HierarchicalNetwork:
        """One level only (both levels equal: any group costs the flat ring, see above)."""
        return cls(max(1, devices), level, level)

    # --- placement ----------------------------------------------------------------------------
    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def shape(self, ranks: Sequence[int]) -> GroupShape:
        ranks = list(ranks)
        if not ranks:
            raise PhazeError("a communicator needs at least one rank")
        if len(set(ranks)) != len(ranks):
            raise PhazeError(f"communicator has repeated ranks: {ranks}")
        counts: dict[int, int] = {}
        for r in ranks:
            counts[self.node_of(r)] = counts.get(self.node_of(r), 0) + 1
        per_node = set(counts.values())
        if len(per_node) != 1:
            # NCCL still builds rings here; the node with the fewest ranks has the fewest NICs
            # in use, so it sets the bottleneck.
            return GroupShape(len(ranks), min(per_node), len(counts))
        return GroupShape(len(ranks), per_node.pop(), len(counts))

    # --- ring collectives ---------------------------------------------------------------------
    def _ring(self, shape: GroupShape) -> tuple[float, float]:
        """(bottleneck bytes/s, per-step latency) of a ring over a group of this shape."""
        if shape.nodes <= 1:
            return self.intra.effective_Bps, self.intra.latency_s
        bw = min(self.intra.effective_Bps, shape.per_node * self.inter.effective_Bps)
        return bw, max(self.intra.latency_s, self.inter.latency_s)

    # --- groups of evenly spaced ranks (every group of Megatron's layout is one) --------------
    def rank_classes(self, step: int, count: int, total: int) -> int:
        """How many of the offsets ``step·i`` (i < count) of a layout of ranks [0, total) stand
        for all: a shift by whole nodes changes no figure, so i and i' are alike when
        ``step·(i − i')`` is a multiple of ``devices_per_node`` (the first
        ``devices_per_node / gcd(devices_per_node, step)`` offsets cover every class), and all
        are alike when the layout fits in one node."""
        n = self.devices_per_node
        if total <= n:
            return min(count, 1)
        return min(count, n // math.gcd(n, step))

    def _occupancy(self, first, stride: int, g: int):
        """(spans nodes, fewest, most members on one node) of each group
        ``{first + stride·i : i < g}`` (first: an array), without listing its members: with
        ``stride ≥ devices_per_node`` every member has a node of its own; otherwise the group
        touches every node from its first to its last, and an inner node's count depends only
        on where the group's phase puts it, ``(node·devices_per_node − first) mod stride``,
        which repeats every ``stride / gcd(devices_per_node, stride)`` nodes: the first node,
        that many inner ones and the last cover every count."""
        first = np.asarray(first, dtype=np.int64)
        n = self.devices_per_node
        n0 = first // n
        n1 = (first + stride * (g - 1)) // n
        spans = n1 > n0
        if g == 1 or stride >= n:
            ones = np.ones(first.shape, dtype=np.int64)
            return spans, ones, ones
        period = stride // math.gcd(n, stride)
        node = np.concatenate(
            [n0[..., None] + np.arange(period + 1), n1[..., None]], axis=-1
        )  # the first node, up to `period` inner ones, the last

        real = node <= n1[..., None]
        offset = (first % n)[..., None]

        def below(m):  # members on the nodes before node m; past the last node, all g (nothing
            # here exceeds the group's last rank: int64 arithmetic cannot wrap)
            start = (np.minimum(m, n1[..., None]) - n0[..., None]) * n - offset  # m·n − first
            return np.where(m > n1[..., None], g, np.clip(-(-start // stride), 0, g))

        counts = below(node + 1) - below(node)
        fewest = np.where(real, counts, g + 1).min(axis=-1)
        most = np.where(real, counts, 0).max(axis=-1)
        return spans, fewest, most

    def progression_ring_params(self, first, stride: int, g: int):
        """(bottleneck bytes/s, per-step latency) of a ring over each group
        ``{first + stride·i : i < g}`` (`_ring` of its `shape`, for many groups at once, in the
        form `ring_seconds` takes), in time and memory independent of g."""
        spans, fewest, _ = self._occupancy(first, stride, g)
        intra, inter = self.intra, self.inter
        bw = np.where(
            spans,
            np.minimum(intra.effective_Bps, fewest * inter.effective_Bps),
            intra.effective_Bps,
        )
        lat = np.where(spans, max(intra.latency_s, inter.latency_s), intra.latency_s)
        return bw, lat

    def progression_a2a_params(self, first, stride: int, g: int):
        """(bytes/s, per-step latency) of the all-to-all over each group
        ``{first + stride·i : i < g}`` in the ring form (`_a2a` for many groups at once), in time
        and memory independent of g."""
        spans, fewest, most = self._occupancy(first, stride, g)
        intra, inter = self.intra, self.inter
        worst = np.maximum(
            (most - 1) / intra.effective_Bps, (g - fewest) / inter.effective_Bps
        )  # > 0 wherever the group spans nodes (it then has a member off the fewest's node)
        bw = np.where(spans, (g - 1) / np.where(spans, worst, 1.0), intra.effective_Bps)
        lat = np.where(spans, max(intra.latency_s, inter.latency_s), intra.latency_s)
        return bw, lat

    def _a2a(self, ranks: Sequence[int]) -> tuple[float, float]:
        """(B', L') of the direct-exchange all-to-all over these ranks (module docstring): the
        ring form of one step with g − 1 blocks over the slower of the two levels."""
        counts: dict[int, int] = {}
        for r in ranks:
            counts[self.node_of(r)] = counts.get(self.node_of(r), 0) + 1
        g = len(ranks)
        if len(counts) == 1:
            return self.intra.effective_Bps, self.intra.latency_s
        worst = max(
            (max(counts.values()) - 1) / self.intra.effective_Bps,
            (g - min(counts.values())) / self.inter.effective_Bps,
        )
        return (g - 1) / worst, max(self.intra.latency_s, self.inter.latency_s)

    def a2a_params(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, per-step latency) of the all-to-all over each row of `ranks`, in the form
        `ring_seconds("all_to_all", S, g, ...)` takes (`_a2a` for many groups at once)."""
        ranks = np.asarray(ranks)
        groups, g = ranks.shape
        bw = np.full(groups, self.intra.effective_Bps)
        lat = np.full(groups, self.intra.latency_s)
        if g == 1:
            return bw, lat
        seen: dict[tuple, tuple[float, float]] = {}
        for i, row in enumerate(ranks):
            key = tuple(int(r) for r in row)
            if key not in seen:
                seen[key] = self._a2a(key)
            bw[i], lat[i] = seen[key]
        return bw, lat

    def p2p_params(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, latency) of a send from each rank of `src` to the rank of `dst` at the same
        position (`p2p` for many pairs at once: the intra-node level inside a node)."""
        crosses = self.crosses_nodes(src, dst)
        bw = np.where(crosses, self.inter.effective_Bps, self.intra.effective_Bps)
        return bw, np.where(crosses, self.inter.latency_s, self.intra.latency_s)

    def crosses_nodes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Whether each pair leaves its node (where Megatron's scatter/gather can help)."""
        n = self.devices_per_node
        return np.asarray(src) // n != np.asarray(dst) // n

    def collective(self, kind: str, size_bytes: float, ranks: Sequence[int]) -> float:
        """Seconds of a ring collective (or the direct-exchange all-to-all) over these ranks
        (empty messages are free)."""
        shape = self.shape(ranks)
        if shape.size == 1:
            return 0.0
        bw, lat = self._a2a(list(ranks)) if kind == "all_to_all" else self._ring(shape)
        return float(collective_seconds(kind, size_bytes, shape.size, bw, lat))

    # --- point to point -----------------------------------------------------------------------
    def p2p(self, size_bytes: float, src: int, dst: int) -> float:
        if src == dst or size_bytes <= 0:
            return 0.0
        level = self.intra if self.node_of(src) == self.node_of(dst) else self.inter
        return p2p_seconds(size_bytes, level.effective_Bps, level.latency_s)

    def stage_transfer(
        self,
        size_bytes: float,
        src_group: Sequence[int],
        dst_group: Sequence[int],
        scatter_gather: bool = True,
    ) -> float:
        """Send one activation (or its gradient) from a tensor-parallel group to the next stage's.

        Every rank of a tensor-parallel group holds the same activation. Without the optimisation
        rank i sends the whole tensor to rank i of the next stage. With Megatron's scatter/gather
        (Narayanan et al. 2021, §4.1) each of the t ranks sends 1/t over its own link, and the
        receivers rebuild the tensor with an all-gather inside their node. Used only when the
        stages are on different nodes (inside a node the plain send is already on the fast level).
        """
        pairs = _pairs_of(src_group, dst_group)
        t = len(pairs)
        crosses = any(self.node_of(a) != self.node_of(b) for a, b in pairs)
        if not scatter_gather or t == 1 or not crosses:
            # the t pairs send concurrently, each on its own link
            return max(self.p2p(size_bytes, a, b) for a, b in pairs)
        scatter = max(self.p2p(size_bytes / t, a, b) for a, b in pairs)
        return scatter + self.all_gather(size_bytes, [b for _, b in pairs])


# ---------------------------------------------------------------------------------------------
# a 3D torus (TPU v4 ICI)
# ---------------------------------------------------------------------------------------------
def _balanced_factors(n: int) -> tuple[int, int, int]:
    """(a, b, c), a <= b <= c, a·b·c = n, with the largest factor as small as possible (then the
    smallest as large as possible): the most cube-like box of n unit cells."""
    best = None
    for a in range(1, round(n ** (1 / 3)) + 2):
        if n % a:
            continue
        for b in range(a, int((n // a) ** 0.5) + 1):
            if (n // a) % b:
                continue
            c = n // a // b
            key = (c, -a)
            if best is None or key < best[0]:
                best = (key, (a, b, c))
    if best is None:
        return (1, 1, n)
    return best[1]


@dataclass(frozen=True)
class TorusNetwork(_Collectives):
    """A 3D torus of chips, each with one link per direction to each of its 6 neighbours.

    Ranks fill the slice x fastest, then y, then z (``rank = x + X·(y + Y·z)``), so consecutive
    ranks (a tensor-parallel group) run along x. An axis ``wraps`` when the slice closes it into a
    ring (TPU v4: every axis of a slice made of whole 4x4x4 cubes, through the optical switches;
    no axis of a smaller slice).

    A collective over a group that is a box of the torus (``n_a`` ranks along each axis ``a``,
    contiguous) runs on every axis it spans at once (jax-ml/scaling-book, "How to Think About
    TPUs" / "Sharded Matrices": an AllGather over k axes has k times the bandwidth): a
    reduce-scatter or all-gather of S bytes over g ranks takes

        (g − 1)/g · S / Σ_a W_a  +  L · Σ_a hops_a,

    W_a = 2 · B (both directions, a bidirectional ring) on an axis the group closes into a ring
    of ≥ 3 ranks, else B (a line, or two ranks), with B = bandwidth_Bps · efficiency per link and
    direction; hops_a = ⌊n_a/2⌋ on such a ring, n_a − 1 otherwise; L per hop. An all-reduce is a
    reduce-scatter then an all-gather (twice that). On one axis without wraparound this is
    exactly the flat ring of ``ring_seconds`` on one link. A group that is not such a box runs
    one unidirectional ring through its ranks in rank order, every step as slow as the farthest
    pair of ring neighbours (``hops · L``) on one link's bandwidth. A point-to-point send takes
    ``S / B + hops · L`` over the shortest path (with wraparound where the axis wraps).

    The all-to-all (every chip sends S/g to every other member) is routed dimension-ordered
    (x, then y, then z, each hop along the shortest way round, a tie at half a ring split over
    both directions), every pair at once; its time is set by the busiest directed link,
    ``λ · S / B + L · Σ_a hops_a`` (the farthest pair's path). On a box, the flows of every source
    along an axis carry S/n_a per offset, so the busiest link of axis a carries λ_a·S with

        λ_a = ⌊n_a²/4⌋ / (2 n_a)   on a closed ring (every link alike, both directions),
        λ_a = ⌊n_a/2⌋·⌈n_a/2⌉ / n_a  on a line or pair (the middle link: its bisection),

    and λ = max_a λ_a (the axes' links are disjoint and work at once; scaling-book's "an
    AllToAll on a bidirectional ring costs about a quarter of an AllGather" is λ = n/8). A group
    that is no box, or a run of a wrapping axis long enough for shortest paths to leave it, is
    routed pair by pair (`_a2a_routed`), which the closed form equals on boxes (tested).
    """

    dims: tuple[int, int, int]
    wraps: tuple[bool, bool, bool]
    link: LinkLevel

    def __post_init__(self) -> None:
        if len(self.dims) != 3 or any(int(d) < 1 for d in self.dims):
            raise PhazeError(f"torus dims must be three positive integers, got {self.dims}")

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def for_devices(cls, network: dict, devices: int, where: str) -> TorusNetwork:
        """The slice a job of ``devices`` chips gets: whole ``cube`` blocks arranged as close to a
        cube as possible (wrapping on every axis), or, below one cube or for a device count that
        is not a multiple of it, the most cube-like box without wraparound. At most ``pod``."""
        for key in ("cube", "pod", "link"):
            if key not in network:
                raise PhazeError(f"{where}: missing key {key!r} (a torus needs cube, pod, link)")
        try:
            cube = tuple(int(c) for c in network["cube"])
            pod = tuple(int(c) for c in network["pod"])
        except (TypeError, ValueError) as exc:
            raise PhazeError(f"{where}: cube and pod are three integers each ({exc})") from None
        if len(cube) != 3 or len(pod) != 3:
            raise PhazeError(f"{where}: cube and pod are three integers each")
        link = LinkLevel.from_dict(network["link"], f"{where}.link")
        devices = int(devices)
        if devices < 1:
            raise PhazeError(f"{where}: a slice needs at least one chip, got {devices}")
        capacity = pod[0] * pod[1] * pod[2]
        if devices > capacity:
            raise PhazeError(
                f"{where}: {devices} chips exceed one pod of {capacity} (pods are joined by the "
                "data-center network, which is not modelled)"
            )
        per_cube = cube[0] * cube[1] * cube[2]
        if devices % per_cube == 0:
            a, b, c = _balanced_factors(devices // per_cube)
            dims = tuple(sorted((a * cube[0], b * cube[1], c * cube[2])))
            return cls(dims, (True, True, True), link)
        return cls(_balanced_factors(devices), (False, False, False), link)

    # --- geometry -----------------------------------------------------------------------------
    def coords(self, rank: int) -> tuple[int, int, int]:
        x, y, _ = self.dims
        if not 0 <= rank < x * y * self.dims[2]:
            raise PhazeError(f"rank {rank} is outside the {self.dims} torus")
        return (rank % x, (rank // x) % y, rank // (x * y))

    def hops(self, a: int, b: int) -> int:
        """Links on the shortest path between two ranks."""
        total = 0
        for p, q, n, wrap in zip(self.coords(a), self.coords(b), self.dims, self.wraps):
            d = abs(p - q)
            total += min(d, n - d) if wrap else d
        return total

    def _box_axes(self, ranks: Sequence[int]) -> list[tuple[int, bool]] | None:
        """[(ranks along the axis, closes a ring)] for each axis a box-shaped group spans; None
        if the group is not a box of contiguous coordinates."""
        pts = {self.coords(r) for r in ranks}
        axes = []
        size = 1
        for a in range(3):
            values = sorted({p[a] for p in pts})
            n, dim = len(values), self.dims[a]
            size *= n
            if n == 1:
                continue
            if n == dim:  # the whole axis: a ring if it wraps
                axes.append((n, self.wraps[a] and n >= 3))
                continue
            if self.wraps[a]:  # a run of n neighbours, possibly across the wraparound
                gaps = [(values[(i + 1) % n] - values[i]) % dim for i in range(n)]
                contiguous = gaps.count(1) >= n - 1
            else:
                contiguous = values[-1] - values[0] == n - 1
            if not contiguous:
                return None
            axes.append((n, False))
        if size != len(pts):
            return None
        return axes

    # --- collectives --------------------------------------------------------------------------
    def collective(self, kind: str, size_bytes: float, ranks: Sequence[int]) -> float:
        """Seconds of a collective over these ranks (empty messages and one rank are free)."""
        ranks = list(ranks)
        if len(set(ranks)) != len(ranks):
            raise PhazeError(f"communicator has repeated ranks: {ranks}")
        if kind not in RING_STEPS:
            raise ValueError(f"unknown collective {kind!r}; known: {sorted(RING_STEPS)}")
        g = len(ranks)
        if g <= 1 or size_bytes <= 0:
            return 0.0
        if kind == "all_to_all":
            lam, hops = self._a2a_shape(ranks)
            return lam * size_bytes / self.link.effective_Bps + hops * self.link.latency_s
        width, hops = self._ring_shape(ranks)
        phase = (g - 1) / g * size_bytes / width + hops * self.link.latency_s
        return RING_STEPS[kind] * phase

    def _ring_shape(self, ranks: Sequence[int]) -> tuple[float, int]:
        """(bytes/s of a phase, hops of latency per phase) of a collective over these ranks: a
        box uses every axis it spans, else one ring in rank order at its farthest step."""
        bw = self.link.effective_Bps
        axes = self._box_axes(ranks)
        if axes is None:
            ring = sorted(ranks)
            worst = max(self.hops(a, b) for a, b in zip(ring, ring[1:] + ring[:1]))
            return bw, worst * (len(ring) - 1)
        width = sum((2.0 if closed else 1.0) * bw for _, closed in axes)
        return width, sum((n // 2) if closed else (n - 1) for n, closed in axes)

    # --- all-to-all ---------------------------------------------------------------------------
    def _a2a_shape(self, ranks: Sequence[int]) -> tuple[float, int]:
        """(λ, hops): the busiest directed link carries λ·S, the farthest pair is `hops` away."""
        axes = self._box_axes(ranks)
        if axes is not None:
            spans = [len({self.coords(r)[a] for r in ranks}) for a in range(3)]
            direct = all(
                n == dim or not wrap or 2 * (n - 1) < dim
                for n, dim, wrap in zip(spans, self.dims, self.wraps)
            )
            if direct:
                lam = max(
                    ((n * n // 4) / (2 * n)) if closed else ((n // 2) * (n - n // 2) / n)
                    for n, closed in axes
                )
                return lam, sum((n // 2) if closed else (n - 1) for n, closed in axes)
        return self._a2a_routed(ranks)

    def _a2a_routed(self, ranks: Sequence[int]) -> tuple[float, int]:
        """(λ, hops) by routing every pair dimension-ordered over the torus (class docstring)."""
        ranks = list(ranks)
        g = len(ranks)
        load: dict[tuple, float] = {}
        share = 1.0 / g

        def walk(point, axis, dist, step, amount):
            p = list(point)
            for _ in range(dist):
                key = (axis, tuple(p), step)
                load[key] = load.get(key, 0.0) + amount
                p[axis] = (p[axis] + step) % self.dims[axis]
            return p

        for a in ranks:
            src = self.coords(a)
            for b in ranks:
                if a == b:
                    continue
                dst = self.coords(b)
                routes = [(list(src), share)]
                for axis in range(3):
                    n = self.dims[axis]
                    wrap = self.wraps[axis] and n >= 3  # two chips share one link (a pair)
                    ahead = (dst[axis] - src[axis]) % n if wrap else dst[axis] - src[axis]
                    nxt = []
                    for point, amount in routes:
                        if not wrap:
                            ways = [(abs(ahead), 1 if ahead > 0 else -1, amount)]
                        elif ahead < n - ahead:
                            ways = [(ahead, 1, amount)]
                        elif ahead > n - ahead:
                            ways = [(n - ahead, -1, amount)]
                        else:  # half a ring: both directions, half each
                            ways = [(ahead, 1, amount / 2), (ahead, -1, amount / 2)]
                        for dist, step, part in ways:
                            if part > 0:
                                nxt.append((walk(point, axis, dist, step, part), part))
                    routes = nxt
        lam = max(load.values(), default=0.0)
        hops = max((self.hops(a, b) for a in ranks for b in ranks), default=0)
        return lam, hops

    def a2a_params(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, per-step latency) of the all-to-all over each row of `ranks` in the ring
        form: ``λ·S/B + hops·L`` = ``(g − 1)/g · S/B' + (g − 1)·L'`` with
        ``B' = (g − 1)/(g·λ) · B`` and ``L' = hops·L/(g − 1)``."""

        def form(key: tuple, g: int) -> tuple[float, float]:
            lam, hops = self._a2a_shape(key)
            return (
                (g - 1) / (g * lam) * self.link.effective_Bps,
                hops * self.link.latency_s / (g - 1),
            )

        return self._per_group(ranks, form)

    def ring_params(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, per-step latency) per row of `ranks` such that `ring_seconds` with g = the
        row's length gives `collective`: a phase ``(g − 1)/g · S/W + hops · L`` is the ring form
        with bandwidth W and latency ``hops · L / (g − 1)`` per step."""

        def form(key: tuple, g: int) -> tuple[float, float]:
            width, hops = self._ring_shape(key)
            return width, hops * self.link.latency_s / (g - 1)

        return self._per_group(ranks, form)

    # --- groups of evenly spaced ranks (every group of Megatron's layout is one) --------------
    def rank_classes(self, step: int, count: int, total: int) -> int:
        """How many of the offsets ``step·i`` (i < count) stand for all: on a torus every
        position is its own (a slice has at most one pod of chips, `for_devices`)."""
        return count

    def _progression(self, first, stride: int, g: int, params):
        first = np.asarray(first, dtype=np.int64)
        bw, lat = params(first.reshape(-1, 1) + stride * np.arange(g))
        return bw.reshape(first.shape), lat.reshape(first.shape)

    def progression_ring_params(self, first, stride: int, g: int):
        """`ring_params` of each group ``{first + stride·i : i < g}``."""
        return self._progression(first, stride, g, self.ring_params)

    def progression_a2a_params(self, first, stride: int, g: int):
        """`a2a_params` of each group ``{first + stride·i : i < g}``."""
        return self._progression(first, stride, g, self.a2a_params)

    def _per_group(self, ranks, form) -> tuple[np.ndarray, np.ndarray]:
        """``form(group, g)`` per row of `ranks`, each distinct group computed once; a group of
        one rank keeps the link's own figures (it sends nothing)."""
        ranks = np.asarray(ranks)
        groups, g = ranks.shape
        bw = np.full(groups, self.link.effective_Bps)
        lat = np.full(groups, self.link.latency_s)
        if g == 1:
            return bw, lat
        seen: dict[tuple, tuple[float, float]] = {}
        for i, row in enumerate(ranks):
            key = tuple(int(r) for r in row)
            if key not in seen:
                seen[key] = form(key, g)
            bw[i], lat[i] = seen[key]
        return bw, lat

    def p2p_params(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bytes/s, latency) of a send from each rank of `src` to its counterpart in `dst`
        (`p2p` for many pairs at once)."""
        src, dst = np.broadcast_arrays(np.asarray(src), np.asarray(dst))
        hops = np.array([self.hops(int(a), int(b)) for a, b in zip(src.ravel(), dst.ravel())])
        lat = (hops * self.link.latency_s).reshape(src.shape)
        return np.full(src.shape, self.link.effective_Bps), lat

    def crosses_nodes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """No pair shares a NIC on a torus: scatter/gather never applies (`stage_transfer`)."""
        return np.zeros(np.broadcast(np.asarray(src), np.asarray(dst)).shape, dtype=bool)

    # --- point to point -----------------------------------------------------------------------
    def p2p(self, size_bytes: float, src: int, dst: int) -> float:
        if src == dst or size_bytes <= 0:
            return 0.0
        return p2p_seconds(
            size_bytes, self.link.effective_Bps, self.hops(src, dst) * self.link.latency_s
        )

    def stage_transfer(
        self,
        size_bytes: float,
        src_group: Sequence[int],
        dst_group: Sequence[int],
        scatter_gather: bool = True,
    ) -> float:
        """Every rank of a tensor-parallel group sends the activation to its counterpart in the
        next stage's group over its own links, all pairs at once (the scatter/gather of a GPU
        node's shared NICs has nothing to save on a torus, so ``scatter_gather`` is unused)."""
        return max(self.p2p(size_bytes, a, b) for a, b in _pairs_of(src_group, dst_group))


# ---------------------------------------------------------------------------------------------
# which network an architecture's collectives run on
# ---------------------------------------------------------------------------------------------
Network = HierarchicalNetwork | TorusNetwork


#: the forms of a ``network:`` section (a preset's, or config ``place.network``): each topology
#: and its keys
NETWORK_FORMS = {
    "two_level": ("devices_per_node", "intra_node", "inter_node"),
    "torus3d": ("cube", "pod", "link"),
}


def network_from_section(network: dict, devices: int, where: str = "preset network") -> Network:
    """A preset's (or config place's) ``network:`` section: ``topology: torus3d`` (cube, pod,
    link) for a job of ``devices`` chips, or the default two-level form (devices_per_node,
    intra_node, inter_node)."""
    if not isinstance(network, dict):
        raise PhazeError(f"{where}: expected a mapping")
    topology = network.get("topology", "two_level")
    if topology == "torus3d":
        return TorusNetwork.for_devices(network, devices, where)
    if topology not in NETWORK_FORMS:
        raise PhazeError(f"{where}: unknown topology {topology!r} ({' or '.join(NETWORK_FORMS)})")
    return HierarchicalNetwork.from_preset(
        {k: v for k, v in network.items() if k != "topology"}, where
    )


def network_for_architecture(
    preset_network: dict | None,
    place_network: dict | None,
    preset_networks: bool,
    costmodel: dict,
    devices: int,
    preset_name: str = "",
) -> tuple[Network, str]:
    """The network an architecture's collectives run on, and its label: the preset's own
    ``network:`` section (when ``preset_networks``), else config ``place.network``, else one flat
    link of ``costmodel.link_bandwidth_Bps`` / ``link_latency_s`` (label ``flat``), for a job of
    ``devices`` devices. Every stage that prices a collective of that architecture asks here."""
    if preset_network is not None and preset_networks:
        where = f"preset {preset_name} network"
        return network_from_section(preset_network, devices, where), f"preset:{preset_name}"
    if place_network is not None:
        return network_from_section(place_network, devices, "config place.network"), "config"
    try:
        level = LinkLevel(
            float(costmodel["link_bandwidth_Bps"]), float(costmodel["link_latency_s"])
        )
    except KeyError as exc:
        raise PhazeError(f"costmodel lacks {exc.args[0]}") from None
    return HierarchicalNetwork.flat(level, 1), "flat"
