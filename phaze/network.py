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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from phaze.errors import PhazeError

#: ring steps (phases of g − 1 transfers of S/g bytes) per collective
RING_STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


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


@dataclass(frozen=True)
class GroupShape:
    """How a communicator's ranks sit in the hierarchy: ``per_node`` ranks on each of ``nodes``."""

    size: int
    per_node: int
    nodes: int


@dataclass(frozen=True)
class HierarchicalNetwork:
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
        """One level only: every device in one 'node'."""
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

    def ring_params(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bottleneck bytes/s, per-step latency) of a ring over each row of `nodes` (the node of
        every member, each row non-decreasing): `_ring` of the row's `shape`, for many groups
        at once."""
        nodes = np.asarray(nodes)
        groups, g = nodes.shape
        intra, inter = self.intra, self.inter
        if g == 1:
            return np.full(groups, intra.effective_Bps), np.full(groups, intra.latency_s)
        change = nodes[:, 1:] != nodes[:, :-1]
        spans = change.any(axis=1)
        starts = np.concatenate([np.ones((groups, 1), dtype=bool), change], axis=1)
        run = np.cumsum(starts, axis=1) - 1  # which node of its row a member is on
        counts = np.bincount((np.arange(groups)[:, None] * g + run).ravel(), minlength=groups * g)
        fewest = np.where(counts > 0, counts, g + 1).reshape(groups, g).min(axis=1)
        bw = np.where(
            spans,
            np.minimum(intra.effective_Bps, fewest * inter.effective_Bps),
            intra.effective_Bps,
        )
        lat = np.where(spans, max(intra.latency_s, inter.latency_s), intra.latency_s)
        return bw, lat

    def collective(self, kind: str, size_bytes: float, ranks: Sequence[int]) -> float:
        """Seconds of a ring collective over these ranks (empty messages are free)."""
        shape = self.shape(ranks)
        if shape.size == 1:
            return 0.0
        bw, lat = self._ring(shape)
        return float(collective_seconds(kind, size_bytes, shape.size, bw, lat))

    def reduce_scatter(self, size_bytes: float, ranks: Sequence[int]) -> float:
        return self.collective("reduce_scatter", size_bytes, ranks)

    def all_gather(self, size_bytes: float, ranks: Sequence[int]) -> float:
        # the ring all-gather is the reduce-scatter run backwards: same steps, same bytes
        return self.collective("all_gather", size_bytes, ranks)

    def all_reduce(self, size_bytes: float, ranks: Sequence[int]) -> float:
        # reduce-scatter then all-gather
        return self.collective("all_reduce", size_bytes, ranks)

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
        src_group, dst_group = list(src_group), list(dst_group)
        if len(src_group) != len(dst_group):
            raise PhazeError("stage transfer between tensor-parallel groups of different sizes")
        t = len(src_group)
        crosses = any(self.node_of(a) != self.node_of(b) for a, b in zip(src_group, dst_group))
        if not scatter_gather or t == 1 or not crosses:
            # the t pairs send concurrently, each on its own link
            return max(self.p2p(size_bytes, a, b) for a, b in zip(src_group, dst_group))
        scatter = max(self.p2p(size_bytes / t, a, b) for a, b in zip(src_group, dst_group))
        return scatter + self.all_gather(size_bytes, dst_group)
