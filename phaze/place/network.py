"""Placement on a two-level (node / cluster) network: which level each pipeline transfer and each
data-parallel all-reduce crosses, in the rank layout the placement implies.

Rank layout (Megatron's order: tensor-parallel innermost, then data-parallel, then pipeline;
Megatron-LM ``megatron/core/parallel_state.py: initialize_model_parallel(order="tp-cp-ep-dp-pp")``
(the default, innermost first) gives, with no context or expert parallelism,
``rank = tp_rank + t · (dp_rank + d · pp_rank)``). The DP below counts pipeline positions from
the END (position s = 1 is the last stage; 1F1B memory depends on it), so the layout numbers
the stages from the last one:

    rank(tensor rank k, replica r, stage at position s) = k + t · (r + d · (s − 1))

This is Megatron's numbering mirrored; the two put the same groups on the same nodes whenever the
pipeline's ``stages · t · d`` devices fill whole nodes (every large configuration), and otherwise
differ only in which end holds the partly filled node. Devices are grouped into nodes of
``devices_per_node`` consecutive ranks; t must divide ``devices_per_node`` (tensor parallelism
stays inside a node, as Megatron places it), and every stage occupies t devices per replica
(Megatron's layout: a stage of layers that are not tensor-parallel runs on its t devices too).

Consequences (all derived from that layout, nothing is a free choice):

* Pipeline transfer between the stages at positions s+1 and s: replica r's counterparts are
  ``t·d`` ranks apart. With ``t·d ≥ devices_per_node`` every pair is on different nodes (the
  inter-node level); with smaller ``t·d`` it depends on s: pairs on one node use the intra-node
  level, pairs that straddle a node boundary the inter-node level, and the stage waits for the
  slowest replica (class ``mixed`` = the slower of both).
* An inter-node transfer of a tensor-parallel stage (t > 1) uses Megatron's scatter/gather when
  it is faster than the plain send (Megatron's default turns it on): each of the t ranks sends 1/t
  over its own NIC, then the receivers all-gather inside their node.
* The data-parallel all-reduce of a stage is a ring over its d replicas (stride t in the stage's
  block of ``t·d`` ranks), costed with `phaze.network.HierarchicalNetwork`'s two-level
  ring. The rings of all stages run concurrently and the batch waits for the slowest; the
  placement costs it as the largest stage's gradients on the pipeline's worst-placed ring
  (positions 1 … stages). That is exact whenever the ring's shape does not depend on the position
  (``t·d`` a multiple or a divisor of ``devices_per_node``) and an upper bound otherwise; it keeps
  the all-reduce a function of (d, stages, largest stage) so the DP stays exact for it.

When both levels are equal, every cost here equals the flat link's (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from phaze.network import HierarchicalNetwork, LinkLevel, p2p_seconds, ring_seconds

#: boundary classes: all replica pairs on one node / all across nodes / some of each
INTRA, INTER, MIXED = 0, 1, 2


@dataclass(frozen=True)
class PlaceNetwork:
    """A hierarchical network as the placement uses it."""

    net: HierarchicalNetwork
    scatter_gather: bool = True

    @property
    def devices_per_node(self) -> int:
        return self.net.devices_per_node

    @classmethod
    def from_dict(cls, network: dict, where: str, scatter_gather: bool = True) -> PlaceNetwork:
        return cls(HierarchicalNetwork.from_preset(network, where), scatter_gather)

    @classmethod
    def flat_equivalent(
        cls, bandwidth_Bps: float, latency_s: float, devices_per_node: int
    ) -> PlaceNetwork:
        """Both levels equal to one flat link (for checking that the hierarchy reduces to it)."""
        level = LinkLevel(bandwidth_Bps, latency_s, 1.0)
        return cls(HierarchicalNetwork(devices_per_node, level, level))

    def width_reason(self, t: int) -> str:
        """'' when tensor width t can be placed (t divides devices_per_node), else why not."""
        n = self.devices_per_node
        if n % t:
            return (
                f"tensor-parallel width {t} does not divide the {n} devices per node "
                "(tensor parallelism stays inside a node)"
            )
        return ""

    # --- pipeline transfers ------------------------------------------------------------------
    def transfer_times(self, nbytes: np.ndarray, t: int) -> np.ndarray:
        """(3, n) seconds to move each boundary between two stages, per class INTRA/INTER/MIXED."""
        b = np.asarray(nbytes, dtype=float)
        intra, inter = self.net.intra, self.net.inter
        t_intra = p2p_seconds(b, intra.effective_Bps, intra.latency_s)
        t_inter = p2p_seconds(b, inter.effective_Bps, inter.latency_s)
        if t > 1 and self.scatter_gather:
            # 1/t per rank over its own NIC, then a ring all-gather of the whole tensor in the node
            sg = p2p_seconds(b / t, inter.effective_Bps, inter.latency_s) + ring_seconds(
                "all_gather", b, t, intra.effective_Bps, intra.latency_s
            )
            t_inter = np.minimum(t_inter, sg)
        return np.stack([t_intra, t_inter, np.maximum(t_intra, t_inter)])

    def boundary_classes(self, t: int, d: int, stages: int) -> np.ndarray:
        """cls[s] for s = 0..stages: the class of the boundary between positions s+1 and s
        (entries 0 and `stages` have no boundary and are INTRA)."""
        n = self.devices_per_node
        cls = np.full(stages + 1, INTRA, dtype=np.int64)
        if stages < 2:
            return cls
        s = np.arange(1, stages)[:, None]
        # replicas a shift by whole nodes maps onto each other cross alike: one of each class
        r = np.arange(self.net.rank_classes(t, d, t * d * stages))[None, :]
        behind = t * (r + d * (s - 1))  # replica r of the stage at position s
        ahead = behind + t * d  # its counterpart at position s + 1
        crosses = (behind // n) != (ahead // n)
        cls[1:stages] = np.where(
            crosses.all(axis=1), INTER, np.where(crosses.any(axis=1), MIXED, INTRA)
        )
        return cls

    # --- data-parallel all-reduce --------------------------------------------------------------
    def ring_worst(
        self, t: int, d: np.ndarray, stages: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(bandwidth B/s, per-step latency s) of the worst data-parallel ring over positions
        1..stages, for every pair (d[i], stages[j]); arrays of shape (len(d), len(stages))."""
        n = self.devices_per_node
        d = np.asarray(d, dtype=np.int64)
        stages = np.asarray(stages, dtype=np.int64)
        s_max = int(stages.max()) if stages.size else 0
        intra, inter = self.net.intra, self.net.inter
        pos = np.arange(1, s_max + 1)[None, :]
        first = t * d[:, None] * (pos - 1)  # the stage block's first rank
        end = first + t * d[:, None]  # one past its last rank
        n_first, n_last = first // n, (end - 1) // n
        spans = n_last > n_first
        # ranks of the ring on the block's first and last node (stride t; t divides n)
        in_first = ((n_first + 1) * n - first) // t
        in_last = (end - n_last * n) // t
        per_node = np.minimum(in_first, in_last)
        per_node = np.where(n_last - n_first >= 2, np.minimum(per_node, n // t), per_node)
        bw = np.where(
            spans,
            np.minimum(intra.effective_Bps, per_node * inter.effective_Bps),
            intra.effective_Bps,
        )
        lat = np.where(spans, max(intra.latency_s, inter.latency_s), intra.latency_s)
        # worst over positions 1..S: running minimum of the bandwidth, maximum of the latency
        bw_run = np.minimum.accumulate(bw, axis=1)
        lat_run = np.maximum.accumulate(lat, axis=1)
        idx = np.clip(stages - 1, 0, max(s_max - 1, 0))
        return bw_run[:, idx], lat_run[:, idx]

    def all_reduce(self, t: int, d, params, stages) -> np.ndarray:
        """(len(d), len(params)) seconds: ring all-reduce of `params` bytes over d replicas on the
        worst ring of a pipeline with `stages[j]` stages (params[j] and stages[j] aligned)."""
        d = np.asarray(d, dtype=np.int64)
        params = np.asarray(params, dtype=float)
        stages = np.asarray(stages, dtype=np.int64)
        if params.shape != stages.shape:
            raise RuntimeError("all-reduce parameters and stage counts differ in shape")
        if d.size == 0 or params.size == 0:
            return np.zeros((d.size, params.size))
        bw, lat = self.ring_worst(t, d, stages)
        return ring_seconds("all_reduce", params[None, :], d[:, None], bw, lat)
