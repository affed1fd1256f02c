"""The step-time model: one training iteration of a strategy, from per-layer quantities.

For pipeline rank j (0 = first) holding n_j blocks, per microbatch:

    T_j = n_j·(f_B + b_B + r_B + C_B) + [j = 0]·(f_E + b_E + C_E) + [j = p−1]·(f_H + b_H + C_H)
          + s⁺_j·X⁺_j + s⁻_j·X⁻_j + (m − 1)/m · P_j · A / HBM

f, b = forward / backward computation of the first layer E, a block B, the last layer H;
r_B = the block's recomputation (0, core attention's forward, or the whole forward); C = the
layer's tensor-parallel collectives on its tensor-parallel group (Megatron does not overlap them;
full recomputation runs the forward ones twice); s⁺_j, s⁻_j = activation and gradient sends per
microbatch (`PipelineSchedule.sends`), X± = one send to the next / previous rank; the last term
adds each microbatch's weight gradients but the first into the stored ones (P_j parameters, A =
``grad_accumulation_bytes_per_param`` of HBM traffic each, spread over the m microbatches). The
iteration:

    time = m · max_j T_j + (Σ_j T_j − max_j T_j) / V + max_j (D_j + O_j)

D_j = rank j's exposed data-parallel traffic: the gradients (2 B/parameter) all-reduced over its
data-parallel group, or with the distributed optimizer reduce-scattered, then the updated weights
all-gathered; with DDP overlap the reduction runs bucket by bucket during the last microbatch's
backward, so only ``max(reduction − that backward, the last bucket's reduction)`` is exposed (the
weights' all-gather is not overlapped); plus the all-reduce of a tied word embedding's gradient
between the first and the last rank. O_j = the optimizer step, HBM-bound: optimizer bytes per
parameter / HBM bandwidth, on 1/dp of the parameters with the distributed optimizer.

Expert parallelism (ep > 1, a mixture-of-experts chain): a block's ``all_to_all`` collectives (the
token dispatch and combine) run on its expert-parallel group (ep ranks tp apart, the slowest of
the layout) and count in C_B; the routed experts' gradients are reduced (and with the
distributed optimizer their state sharded and their weights all-gathered) over the expert
data-parallel group of d/ep ranks, the other parameters' over the data-parallel group, one after
the other; with DDP overlap the exposed part is ``max(both reductions − that backward, the last
bucket)``, the last bucket being one full bucket on the slower of the two groups, or all the
gradients when they are fewer.

Context parallelism (cp > 1, a chain costed on seq/cp tokens: `LayerCost.context_parallel`): the
weights are replicated over the cp ranks, so the gradient group and the distributed optimizer's
shards are dp·cp ranks (the layout without context parallelism with dp·cp replicas); each block
adds the exposed part of its key/value ring (`StageTerms.cp_exposed`) on the slowest neighbour
pair of the layout's rings.

Memory of rank j: ``params_j · state + inflight_j · n_j · stash + working + [j = 0]·inflight_j·
act_E + [j = p−1]·act_H`` with ``state`` bytes per parameter (the optimizer-state part divided by
dp under the distributed optimizer — by d/ep for expert parameters: Megatron's ``6 + 12/d``
accounting with our 2-byte gradients),
`stash` / `working` from `phaze.step.layers` for the recompute mode, `inflight` from the schedule.

Network: every collective is a ring on the network (`phaze.network`: the two-level
`HierarchicalNetwork`, or a `TorusNetwork`, whose collectives over a box are written in the same
ring form), in Megatron's rank layout (`phaze.step.strategy`). The pipeline of replica r runs on its own ranks;
replicas synchronise at the gradient reduction, so each rank's terms are taken at the slowest
replica (exact whenever the replicas sit alike in the nodes, as for every t·d that is a multiple or
a divisor of the devices per node). Tensor-parallel collectives are priced on the slowest
tensor-parallel group of the layout (all groups alike when t divides the devices per node).
A send between stages: t rank pairs at once; across nodes (never on a torus) with Megatron's
scatter/gather each
rank sends 1/t and the receivers all-gather (where that is faster than the plain send); with
sequence parallelism every rank holds 1/t of the activation and sends only that.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from phaze.config import from_section
from phaze.errors import PhazeError
from phaze.network import Network, collective_seconds, p2p_seconds
from phaze.step.layers import ChainCost
from phaze.step.strategy import PipelineSchedule, Strategy


@dataclass(frozen=True)
class StepConstants:
    """Per-parameter accounting of the training step (bytes) and the device's achievable HBM
    bandwidth (what a streaming kernel reaches: `phaze.estimate.model.achievable_hbm_Bps`)."""

    state_bytes_per_param: float  # resident: weights + gradients + optimizer state
    optimizer_state_bytes_per_param: float  # the part the distributed optimizer shards
    grad_bytes_per_param: float  # what the gradient reduction moves
    weight_bytes_per_param: float  # what the distributed optimizer's all-gather moves
    optimizer_bytes_per_param: float  # HBM traffic of the optimizer step
    grad_accumulation_bytes_per_param: float  # HBM traffic of adding a microbatch's gradients
    ddp_bucket_bytes: float  # DDP gradient bucket: the last one is never hidden
    hbm_bandwidth_Bps: float
    scatter_gather: bool  # Megatron's scatter/gather of inter-node stage transfers, where faster
    # a low-precision (FP8) run (phaze.precision; 0 in BF16, not config keys): resident bytes of
    # the cached cast weight per low-precision parameter, and HBM bytes of casting it (once per
    # step, on the first microbatch)
    low_precision_weight_bytes_per_param: float = 0.0
    weight_cast_bytes_per_param: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.optimizer_state_bytes_per_param <= self.state_bytes_per_param:
            raise PhazeError("optimizer-state bytes per parameter must be in [0, state bytes]")
        if not self.hbm_bandwidth_Bps > 0:
            raise PhazeError("HBM bandwidth must be > 0 B/s")

    @classmethod
    def from_config(cls, step: dict, hbm_bandwidth_Bps: float) -> StepConstants:
        """From the validated config section ``step`` and the device's HBM bandwidth."""
        return from_section(
            cls,
            step,
            given={"hbm_bandwidth_Bps": hbm_bandwidth_Bps},
            not_keys=("low_precision_weight_bytes_per_param", "weight_cast_bytes_per_param"),
            convert=True,
        )

    def state_bytes(self, distributed_optimizer: bool, dp: int) -> float:
        if not distributed_optimizer:
            return self.state_bytes_per_param
        shard = self.optimizer_state_bytes_per_param
        return self.state_bytes_per_param - shard + shard / dp


# ---------------------------------------------------------------------------------------------
# the layout on the network
# ---------------------------------------------------------------------------------------------
@dataclass
class Layout:
    """Where Megatron's layout puts the groups of (t, p, d, ep) on the network."""

    tp: int
    pp: int
    dp: int
    net: Network
    tp_bw: float  # slowest tensor-parallel group of the layout
    tp_lat: float
    tp_group_bw: np.ndarray  # (reps, p): the group of replica class r at stage j (a replica
    # class: the replicas a shift by whole nodes maps onto each other, `rank_classes`)
    tp_group_lat: np.ndarray
    dp_bw: np.ndarray  # (p,): slowest data-parallel group of stage j
    dp_lat: np.ndarray
    tied_bw: float  # first-last stage pair (tied embedding); unused for p = 1
    tied_lat: float
    # "next"/"prev" -> (bytes/s, latency) of each pair (t, reps, p), and (reps, p): does any pair
    # of the tensor-parallel group leave its node (scatter/gather applies)
    sends: dict
    ep: int = 1
    etp: int | None = None  # the experts' tensor-parallel size: tp (None) or 1
    ep_bw: np.ndarray | None = None  # the expert-parallel groups' all-to-all (a2a_params), one
    ep_lat: np.ndarray | None = None  # entry per distinct group shape; unused at ep 1
    edp_bw: np.ndarray | None = None  # (p,): slowest expert data-parallel group of stage j
    edp_lat: np.ndarray | None = None
    cp: int = 1  # context-parallel ranks (dp above counts dp·cp: the ranks of one gradient)
    cp_bw: float = 0.0  # the slowest neighbour pair of the layout's context-parallel rings
    cp_lat: float = 0.0

    @classmethod
    def build(
        cls,
        net: Network,
        t: int,
        p: int,
        d: int,
        ep: int = 1,
        etp: int | None = None,
        cp: int = 1,
    ) -> Layout:
        """The layout of (t, p, d, ep, etp, cp), d = dp·cp: the ranks that hold the same
        parameters. Megatron's order tp-cp-ep-dp-pp puts rank ``k + t·(c + cp·r + d·j)`` at
        tensor-parallel rank k, context-parallel rank c, data-parallel rank r, stage j, so every
        group but the context-parallel ring is the one of the layout without context
        parallelism with d = dp·cp (the gradient group with context parallelism: dp·cp ranks t
        apart; the experts' generator over the t·dp·cp ranks of a stage)."""
        etp = t if etp is None else etp
        if etp not in (1, t) or ep < 1 or (t * d) % (etp * ep) or (etp == t and d % ep):
            raise AssertionError(f"ep {ep} with etp {etp} does not fit tp {t}, dp {d}")
        if cp < 1 or d % cp:
            raise AssertionError(f"cp {cp} does not divide dp·cp {d}")
        # replicas (and expert data-parallel ranks) that sit alike on the network share every
        # figure: one of each class stands for them all (`rank_classes`: on a two-level network
        # at most devices_per_node of them, so nothing here grows with the device count)
        total = t * p * d
        reps = net.rank_classes(t, d, total)
        k = np.arange(t)[:, None, None]
        r = np.arange(reps)[None, :, None]
        j = np.arange(p)[None, None, :]
        rank = k + t * (r + d * j)  # (t, reps, p)
        tp_bw, tp_lat = net.progression_ring_params(rank[0], 1, t)  # (reps, p)
        dp_bw, dp_lat = net.progression_ring_params(k[:, 0] + t * d * j[0], t, d)  # (t, p)
        dp_bw, dp_lat = dp_bw.min(axis=0), dp_lat.max(axis=0)
        ep_bw, ep_lat, edp_bw, edp_lat = None, None, dp_bw, dp_lat
        if ep > 1 or etp != t:
            # Megatron's expert generator: rank = etp_rank + etp·(ep_rank + ep·(edp_rank +
            # edp·pp_rank)); etp = t gives dp_rank = ep_rank + ep·edp_rank, etp = 1 puts ep
            # consecutive ranks in a group (and at ep = 1 replicates the experts over the t·d
            # ranks of a stage, whose gradients are then reduced over all of them)
            e = t * d // (etp * ep)
            kk = np.arange(etp)[:, None, None]
            if ep > 1:
                es = np.arange(net.rank_classes(etp * ep, e, total))[None, :, None]
                a2a_bw, a2a_lat = net.progression_a2a_params(
                    kk + etp * (ep * es) + t * d * j, etp, ep
                )  # (etp, edp_rank, p): the group of ep ranks etp apart at each
                shapes = np.unique(np.stack([a2a_bw.ravel(), a2a_lat.ravel()], axis=1), axis=0)
                ep_bw, ep_lat = shapes[:, 0], shapes[:, 1]
            i = np.arange(ep)[None, :, None]
            edp_bw, edp_lat = net.progression_ring_params(kk + etp * i + t * d * j, etp * ep, e)
            edp_bw = edp_bw.reshape(etp * ep, p).min(axis=0)
            edp_lat = edp_lat.reshape(etp * ep, p).max(axis=0)
        sends = {}
        for name, step in (("next", 1), ("prev", -1)):
            other = np.roll(rank, -step, axis=2)  # the counterpart at stage j ± 1
            bw, lat = net.p2p_params(rank, other)
            sends[name] = (bw, lat, net.crosses_nodes(rank, other).any(axis=0))
        cp_bw, cp_lat = 0.0, 0.0
        if cp > 1:
            # each rank sends its keys and values to the next of its ring (c -> c + 1 mod cp) at
            # every step, all at once: a step lasts as long as the slowest pair of the layout.
            # The rings whose first ranks differ by whole nodes are alike (`rank_classes`).
            c = np.arange(cp)[None, :, None, None]
            rr = np.arange(net.rank_classes(t * cp, d // cp, total))[None, None, :, None]
            jj = np.arange(p)[None, None, None, :]
            kk = np.arange(t)[:, None, None, None]
            src = kk + t * (c + cp * rr) + t * d * jj
            dst = kk + t * ((c + 1) % cp + cp * rr) + t * d * jj
            bw, lat = net.p2p_params(src, dst)
            cp_bw, cp_lat = float(np.min(bw)), float(np.max(lat))
        if p > 1:  # each rank of the first stage with its counterpart on the last
            tied_bw, tied_lat = net.progression_ring_params(rank[:, :, 0], t * d * (p - 1), 2)
            tbw, tlat = float(tied_bw.min()), float(tied_lat.max())
        else:  # no first-last pair: unused
            tbw, tlat = (float(x[0]) for x in net.progression_ring_params(np.zeros(1), 1, 1))
        return cls(
            tp=t,
            pp=p,
            dp=d,
            net=net,
            tp_bw=float(tp_bw.min()),
            tp_lat=float(tp_lat.max()),
            tp_group_bw=tp_bw,
            tp_group_lat=tp_lat,
            dp_bw=dp_bw,
            dp_lat=dp_lat,
            tied_bw=tbw,
            tied_lat=tlat,
            sends=sends,
            ep=ep,
            etp=etp,
            ep_bw=ep_bw,
            ep_lat=ep_lat,
            edp_bw=edp_bw,
            edp_lat=edp_lat,
            cp=cp,
            cp_bw=cp_bw,
            cp_lat=cp_lat,
        )

    def ring_step_s(self, nbytes: float) -> float:
        """One step of the context-parallel ring: every rank sends `nbytes` to the next (the
        slowest pair of the layout); 0 without context parallelism."""
        if self.cp == 1 or nbytes <= 0:
            return 0.0
        return float(p2p_seconds(nbytes, self.cp_bw, self.cp_lat))

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel size of the layout (tp unless built with etp = 1)."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        return self.tp * self.dp // (self.expert_tp * self.ep)

    def collectives_s(self, collectives) -> float:
        """Time of a layer's tensor-parallel collectives on the slowest group (its all-to-alls
        on the slowest expert-parallel group)."""
        return self.tensor_parallel_s(collectives) + self.expert_parallel_s(collectives)

    def tensor_parallel_s(self, collectives) -> float:
        return sum(
            float(collective_seconds(kind, size, self.tp, self.tp_bw, self.tp_lat))
            for kind, size in collectives
            if kind != "all_to_all"
        )

    def expert_parallel_s(self, collectives) -> float:
        """A layer's all-to-alls on the slowest expert-parallel group (the group whose sum is the
        largest: with a two-level network or a torus the slowest group can depend on the size)."""
        sizes = [size for kind, size in collectives if kind == "all_to_all"]
        if not sizes or self.ep == 1:
            return 0.0
        total = sum(
            collective_seconds("all_to_all", size, self.ep, self.ep_bw, self.ep_lat)
            for size in sizes
        )
        return float(np.max(total))

    def send_s(self, nbytes: float, direction: str, sequence_parallel: bool, sg: bool):
        """(reps, p) seconds for one send of an activation (or its gradient) of `nbytes` (the full
        tensor) from each stage of each replica class to the next / previous stage."""
        t, p = self.tp, self.pp
        bw, lat, crosses = self.sends[direction]
        if nbytes <= 0 or p == 1:
            return np.zeros(self.tp_group_bw.shape)

        def p2p(size):  # the t pairs at once, each on its own links
            return p2p_seconds(size, bw, lat).max(axis=0)

        if sequence_parallel:
            per_replica = p2p(nbytes / t)
        elif sg and t > 1:
            dst = 1 if direction == "next" else -1
            gather = collective_seconds(
                "all_gather",
                nbytes,
                t,
                np.roll(self.tp_group_bw, -dst, axis=1),
                np.roll(self.tp_group_lat, -dst, axis=1),
            )
            plain = p2p(nbytes)
            per_replica = np.where(crosses, np.minimum(plain, p2p(nbytes / t) + gather), plain)
        else:
            per_replica = p2p(nbytes)
        return per_replica


# ---------------------------------------------------------------------------------------------
# per-stage terms as functions of the blocks a stage holds
# ---------------------------------------------------------------------------------------------
class PlacedChain:
    """A chain on a layout: the collective and send times every (V, recompute, distributed
    optimizer, ddp) setting of the same (t, b, sequence parallelism, p, d) shares."""

    def __init__(self, chain: ChainCost, layout: Layout, consts: StepConstants):
        if (chain.tp, chain.ep, chain.expert_tp, chain.cp) != (
            layout.tp,
            layout.ep,
            layout.expert_tp,
            layout.cp,
        ):
            raise AssertionError(
                "the chain was built for another tp, ep, etp or cp than the layout's"
            )
        self.chain, self.layout, self.consts = chain, layout, consts
        coll = layout.collectives_s
        self.coll = {
            name: (coll(layer.fwd_collectives), coll(layer.bwd_collectives))
            for name, layer in (
                ("first", chain.first),
                ("block", chain.block),
                ("last", chain.last),
            )
        }
        # the block's all-to-alls (part of coll["block"]): reported on their own
        self.block_a2a = (
            layout.expert_parallel_s(chain.block.fwd_collectives),
            layout.expert_parallel_s(chain.block.bwd_collectives),
        )
        # context parallelism's ring (TransformerEngine ``AttnFuncWithCPAndKVP2P``): one
        # transfer of the keys and values, and one of them with their gradients dK, dV (as many
        # bytes again; `StageTerms.cp_exposed`)
        kv = chain.block.kv_bytes
        self.cp_step = (layout.ring_step_s(kv), layout.ring_step_s(2.0 * kv))
        sp, sg = chain.sequence_parallel, consts.scatter_gather
        self.x_next = layout.send_s(chain.boundary_bytes, "next", sp, sg)  # (reps, p)
        self.x_prev = layout.send_s(chain.boundary_bytes, "prev", sp, sg)
        self.tied_s = 0.0
        if layout.pp > 1 and chain.tied:
            size = chain.last.tied_params * consts.grad_bytes_per_param
            self.tied_s = float(
                collective_seconds("all_reduce", size, 2, layout.tied_bw, layout.tied_lat)
            )


class StageTerms:
    """The terms of every pipeline rank of one (placed chain, schedule, recompute, distributed
    optimizer, ddp) as affine (or max-of-affine) functions of its block count n. Methods take n
    of shape (p,) (one value per rank) or (p, K) (a lattice per rank) and return that shape."""

    def __init__(
        self,
        placed: PlacedChain,
        schedule: PipelineSchedule,
        recompute: str,
        distributed_optimizer: bool,
        ddp: str,
    ):
        chain, layout, consts = placed.chain, placed.layout, placed.consts
        p = layout.pp
        if schedule.stages != p:
            raise AssertionError("schedule and layout disagree on pp")
        self.p, self.d = p, layout.dp
        self.ddp, self.zero, self.recompute = ddp, distributed_optimizer, recompute
        self.consts = consts
        self.cp, self.cp_step = layout.cp, placed.cp_step
        first = np.arange(p) == 0
        last = np.arange(p) == p - 1
        self._first, self._last = first, last
        B, E, H = chain.block, chain.first, chain.last
        full = recompute == "full"
        bf, bb = placed.coll["block"]
        # communication per block
        af, ab = placed.block_a2a
        self.ep_per_block = af * (2 if full else 1) + ab
        self.tp_per_block = bf * (2 if full else 1) + bb - self.ep_per_block
        # the backward's collectives (the DDP overlap hides the reduction behind them too)
        self._bwd_comm = (bb, bf if full else 0.0)
        (ef, eb), (hf, hb) = placed.coll["first"], placed.coll["last"]
        self.tp_0 = np.where(first, ef + eb, 0.0) + np.where(last, hf + hb, 0.0)
        self._bwd_comm_0 = (eb, hb)
        sends = schedule.sends_all()
        # at the slowest replica
        self.pp_comm = (sends[:, 0] * placed.x_next + sends[:, 1] * placed.x_prev).max(axis=0)
        # parameters (a last stage with a tied LM head keeps its own copy of the embedding); of
        # them the routed experts' (only blocks hold experts)
        self.param_slope = B.params
        self.expert_slope = B.expert_params
        tied_copy = H.tied_params if p > 1 else 0.0
        self.param_intercept = np.where(first, E.params, 0.0) + np.where(
            last, H.params + tied_copy, 0.0
        )
        # adding each microbatch's weight gradients into the stored ones, every microbatch but
        # the first: one HBM pass per parameter, spread evenly over the m microbatches
        m = schedule.microbatches
        per_param = consts.grad_accumulation_bytes_per_param / consts.hbm_bandwidth_Bps
        self.accumulate_per_param = per_param * (m - 1) / m
        # casting the low-precision weights once per step, spread evenly over the m microbatches
        self.low_precision_slope = B.low_precision_params
        self.low_precision_intercept = np.where(first, E.low_precision_params, 0.0) + np.where(
            last, H.low_precision_params, 0.0
        )
        self.cast_per_param = consts.weight_cast_bytes_per_param / consts.hbm_bandwidth_Bps / m
        self.dp_bw, self.dp_lat = layout.dp_bw, layout.dp_lat
        self.edp, self.edp_bw, self.edp_lat = layout.edp, layout.edp_bw, layout.edp_lat
        self.tied_s = np.where(first | last, placed.tied_s, 0.0)
        # memory
        self.inflight = schedule.inflight_all()
        self.state = consts.state_bytes(distributed_optimizer, layout.dp)
        self.expert_state = consts.state_bytes(distributed_optimizer, layout.edp)
        self.stash = B.stash_bytes(recompute)
        self.working = B.working_bytes(recompute)
        self.mem_intercept = np.where(first, self.inflight * E.activation_bytes, 0.0) + np.where(
            last, H.activation_bytes, 0.0
        )
        self._time(chain)

    def cp_exposed(self, block) -> tuple[float, float]:
        """(forward, backward) exposed ring time of one block (`block`'s computation times).
        TransformerEngine's ``AttnFuncWithCPAndKVP2P`` overlaps each transfer with one step of
        core attention (a cp-th of its time): forward, cp − 1 transfers of the keys and values;
        backward, cp transfers — the keys and values first, then keys and values with the
        gradients dK, dV gathered so far (twice the bytes) cp − 2 times, then dK, dV alone. Each
        exposes what it takes beyond its step; full recomputation runs the forward ring again.
        0 at cp = 1."""
        if self.cp == 1:
            return 0.0, 0.0
        one, two = self.cp_step
        fwd = (self.cp - 1) * max(0.0, one - block.attention_fwd_s / self.cp)
        window = (
            block.attention_bwd_s
            + (block.recompute_s("selective") if self.recompute == "selective" else 0.0)
        ) / self.cp
        bwd = 2 * max(0.0, one - window) + (self.cp - 2) * max(0.0, two - window)
        return fwd * (2 if self.recompute == "full" else 1), bwd

    def line(self, chain: ChainCost) -> tuple:
        """(intercept, slope) of T_j = intercept_j + slope·n with the computation times of
        `chain` (a chain of this shape), then the block's computation, its recomputation and
        the first and last layers' computation per rank: what `retimed` sets, without a copy."""
        B, E, H = chain.block, chain.first, chain.last
        rc = B.recompute_s(self.recompute)
        compute_per_block = B.fwd_s + B.bwd_s
        slope = compute_per_block + rc + self.tp_per_block + self.ep_per_block
        if self.cp > 1:
            slope += sum(self.cp_exposed(B))
        slope += self.param_slope * self.accumulate_per_param
        slope += self.low_precision_slope * self.cast_per_param
        compute_0 = np.where(self._first, E.fwd_s + E.bwd_s, 0.0) + np.where(
            self._last, H.fwd_s + H.bwd_s, 0.0
        )
        intercept = compute_0 + self.tp_0 + self.pp_comm
        intercept = intercept + self.param_intercept * self.accumulate_per_param
        intercept = intercept + self.low_precision_intercept * self.cast_per_param
        return intercept, slope, compute_per_block, rc, compute_0

    def _time(self, chain: ChainCost) -> None:
        """The terms that depend on the layers' computation times (`chain`'s)."""
        first, last = self._first, self._last
        line = self.line(chain)
        self.intercept, self.slope, self.compute_per_block, self.recompute_per_block = line[:4]
        self.compute_0 = line[4]
        self.cp_per_block = sum(self.cp_exposed(chain.block)) if self.cp > 1 else 0.0
        # the backward the DDP overlap hides behind (ChainCost.window)
        win = chain.overlap_window
        bb, bf = self._bwd_comm
        self.bwd_slope = win.block.bwd_s + win.block.recompute_s(self.recompute) + bb
        self.bwd_slope += bf
        if self.cp > 1:
            self.bwd_slope += self.cp_exposed(win.block)[1]
        eb, hb = self._bwd_comm_0
        self.bwd_intercept = np.where(first, win.first.bwd_s + eb, 0.0) + np.where(
            last, win.last.bwd_s + hb, 0.0
        )

    def retimed(self, chain: ChainCost) -> StageTerms:
        """These terms with the computation times of `chain`: a chain of the same shape
        (`ChainCost.shape`, e.g. the same layers on another architecture). Communication,
        parameters and memory do not depend on computation times, so they are taken as they
        are; the caller vouches for the shape."""
        out = copy.copy(self)
        out._time(chain)
        return out

    @staticmethod
    def _col(x, n):
        x = np.asarray(x, dtype=float)
        return x[:, None] if np.ndim(n) == 2 and x.ndim == 1 else x

    def time(self, n):
        """T_j: one microbatch's forward + backward on rank j, communication included."""
        return self._col(self.intercept, n) + n * self.slope

    def params(self, n):
        return self._col(self.param_intercept, n) + n * self.param_slope

    def expert_params(self, n):
        return np.asarray(n, dtype=float) * self.expert_slope

    def low_precision_params(self, n):
        return self._col(self.low_precision_intercept, n) + n * self.low_precision_slope

    def backward(self, n):
        """The backward part of T_j (what a DDP overlap can hide the reduction behind)."""
        return self._col(self.bwd_intercept, n) + n * self.bwd_slope

    def _groups(self, n):
        """(parameters, group size, bandwidth, latency) of the dense part and, with routed
        experts, of the expert part (reduced over the expert data-parallel group)."""
        expert = self.expert_params(n)
        dense = (self.params(n) - expert, self.d, self.dp_bw, self.dp_lat)
        if self.expert_slope == 0:
            return (dense,)
        return dense, (expert, self.edp, self.edp_bw, self.edp_lat)

    def reduction(self, n):
        """The gradient reduction over rank j's data-parallel group (all-reduce, or
        reduce-scatter with the distributed optimizer), before any overlap; the experts' over
        their own group, after the dense one."""
        grad = self.consts.grad_bytes_per_param
        return sum(
            collective_seconds(
                self._reduce_kind, params * grad, d, self._col(bw, n), self._col(lat, n)
            )
            for params, d, bw, lat in self._groups(n)
        )

    def bucket_reduction(self, n):
        """The reduction of one full DDP bucket over rank j's data-parallel group (the slower of
        the dense and the expert group)."""
        bucket = np.full(np.shape(n), float(self.consts.ddp_bucket_bytes))
        return np.max(
            [
                collective_seconds(
                    self._reduce_kind, bucket, d, self._col(bw, n), self._col(lat, n)
                )
                for _, d, bw, lat in self._groups(n)
            ],
            axis=0,
        )

    def last_bucket(self, n):
        """The reduction of the last DDP bucket (a full bucket, or all the gradients when they
        are fewer): never hidden by the overlap. A collective's time grows with its size, so
        this is the smaller of the two reductions."""
        return np.minimum(self.bucket_reduction(n), self.reduction(n))

    def after_reduction(self, n):
        """What follows the reduction, never overlapped: the distributed optimizer's all-gather
        of the updated weights (each part over its group) and the tied embedding's all-reduce."""
        out = self._col(self.tied_s, n) + np.zeros(np.shape(n))
        if self.zero:
            w = self.consts.weight_bytes_per_param
            for params, d, bw, lat in self._groups(n):
                out = out + collective_seconds(
                    "all_gather", params * w, d, self._col(bw, n), self._col(lat, n)
                )
        return out

    @property
    def _reduce_kind(self) -> str:
        return "reduce_scatter" if self.zero else "all_reduce"

    def untimed_tail(self, n) -> tuple:
        """The parts of the tail that no layer time changes, for `tail(n, parts)`: the
        reduction, the last bucket (None without DDP overlap), what follows the reduction, and
        the optimizer step."""
        last = self.last_bucket(n) if self.ddp == "overlap" else None
        return self.reduction(n), last, self.after_reduction(n), self.optimizer(n)

    def data_parallel(self, n, parts: tuple | None = None):
        """D_j: exposed data-parallel traffic after the pipeline (tied embedding included).
        `parts`: `untimed_tail(n)`, when the caller has it."""
        reduce, last, after, _ = parts if parts is not None else self.untimed_tail(n)
        if self.ddp == "overlap":
            reduce = np.maximum(reduce - self.backward(n), last)
        return reduce + after

    def optimizer(self, n):
        c = self.consts
        return sum(
            params * c.optimizer_bytes_per_param / (c.hbm_bandwidth_Bps * (d if self.zero else 1))
            for params, d, _, _ in self._groups(n)
        )

    def tail(self, n, parts: tuple | None = None):
        """D_j + O_j (`parts`: as for `data_parallel`)."""
        parts = parts if parts is not None else self.untimed_tail(n)
        return self.data_parallel(n, parts) + parts[3]

    def memory(self, n):
        blocks_held = np.asarray(n, dtype=float) > 0
        expert = self.expert_params(n)
        return (
            (self.params(n) - expert) * self.state
            + expert * self.expert_state
            + self._col(self.inflight, n) * n * self.stash
            + np.where(blocks_held, self.working, 0.0)
            + self._col(self.mem_intercept, n)
            + self.low_precision_params(n) * self.consts.low_precision_weight_bytes_per_param
        )


# ---------------------------------------------------------------------------------------------
# one strategy
# ---------------------------------------------------------------------------------------------
def check_chain(chain: ChainCost, strategy: Strategy) -> None:
    """The chain fits the strategy's (tp, microbatch, sequence parallelism, ep); a strategy the
    model cannot run (ep for a dense model, ep not dividing the experts, ...) is a PhazeError."""
    strategy.check_experts(chain.experts)
    if chain.tp != strategy.tp or chain.microbatch != strategy.microbatch:
        raise AssertionError("the chain was built for another tp or microbatch")
    if chain.sequence_parallel != strategy.sequence_parallel:
        raise AssertionError("the chain was built for the other sequence-parallel setting")
    if chain.ep != strategy.ep or chain.expert_tp != strategy.expert_tp:
        raise AssertionError("the chain was built for another expert-parallel size or etp")
    if chain.cp != strategy.cp:
        raise AssertionError("the chain was built for another context-parallel size")


def stage_terms(
    chain: ChainCost, strategy: Strategy, net: Network, consts: StepConstants
) -> StageTerms:
    check_chain(chain, strategy)
    layout = Layout.build(
        net, strategy.tp, strategy.pp, strategy.cdp, strategy.ep, strategy.expert_tp, strategy.cp
    )
    return StageTerms(
        PlacedChain(chain, layout, consts),
        strategy.schedule,
        strategy.recompute,
        strategy.distributed_optimizer,
        strategy.ddp,
    )


def iteration_time(terms: StageTerms, stages, schedule: PipelineSchedule) -> float:
    n = np.asarray(stages, dtype=float)
    pipe, _ = schedule.iteration_time(list(terms.time(n)))
    return pipe + float(terms.tail(n).max())


def price(
    chain: ChainCost,
    strategy: Strategy,
    net: Network,
    consts: StepConstants,
    peak_flops: float,
    hbm_capacity_bytes: float | None = None,
) -> dict:
    """Iteration time, breakdown, memory, FLOPs and utilisation of one strategy.

    `peak_flops` = one device's peak (dense, the training precision); `hbm_capacity_bytes` = its memory
    capacity (None: `fits_memory` is None). The breakdown holds the terms of the slowest rank
    (compute, recompute, tensor-parallel, expert-parallel and pipeline communication, m times each;
    the bubble) and
    of the rank with the largest tail (data-parallel communication, optimizer step): it sums to
    the iteration time."""
    stages = strategy.check_layers(chain.blocks)
    terms = stage_terms(chain, strategy, net, consts)
    sched = strategy.schedule
    n = np.asarray(stages, dtype=float)
    per_mb = terms.time(n)
    pipe, bubble = sched.iteration_time(list(per_mb))
    dp_s, opt_s = terms.data_parallel(n), terms.optimizer(n)
    tail = dp_s + opt_s
    crit, tail_j = int(np.argmax(per_mb)), int(np.argmax(tail))
    iteration = pipe + float(tail[tail_j])
    m = sched.microbatches
    c = crit
    breakdown = {
        "compute_s": m * (n[c] * terms.compute_per_block + terms.compute_0[c]),
        "recompute_s": m * n[c] * terms.recompute_per_block,
        "tensor_parallel_comm_s": m * (n[c] * terms.tp_per_block + terms.tp_0[c]),
        "expert_parallel_comm_s": m * n[c] * terms.ep_per_block,
        "pipeline_comm_s": m * terms.pp_comm[c],
        "grad_accumulation_s": m * float(terms.params(n)[c]) * terms.accumulate_per_param,
        "weight_cast_s": m * float(terms.low_precision_params(n)[c]) * terms.cast_per_param,
        "pipeline_bubble_s": bubble,
        "data_parallel_comm_s": float(dp_s[tail_j]),
        "optimizer_s": float(opt_s[tail_j]),
    }
    if strategy.cp > 1:  # the exposed key/value ring (only with context parallelism)
        breakdown["context_parallel_comm_s"] = m * n[c] * terms.cp_per_block
    memory = terms.memory(n)
    params = terms.params(n)
    sequences = strategy.global_batch
    rounds = sequences / strategy.microbatch
    model_flops = rounds * chain.model_flops_per_microbatch()
    hardware_flops = rounds * chain.hardware_flops_per_microbatch(strategy.recompute)
    devices = strategy.devices
    peak_memory = float(memory.max())
    return {
        "iteration_time_s": iteration,
        "model_flops": model_flops,
        "mfu": model_flops / (devices * iteration * peak_flops),
        "hardware_flops": hardware_flops,
        "hfu": hardware_flops / (devices * iteration * peak_flops),
        "peak_memory_bytes": peak_memory,
        "hbm_capacity_bytes": hbm_capacity_bytes,
        "fits_memory": None
        if hbm_capacity_bytes is None
        else bool(peak_memory <= hbm_capacity_bytes),
        "breakdown": breakdown,
        "strategy": strategy.as_dict(chain.blocks),
        "critical_stage": crit,
        "per_stage": [
            {
                "stage": j,
                "blocks": int(n[j]),
                "per_microbatch_s": float(per_mb[j]),
                "tail_s": float(tail[j]),
                "memory_bytes": float(memory[j]),
                "params": float(params[j]),
                "expert_params": float(terms.expert_params(n)[j]),
            }
            for j in range(strategy.pp)
        ],
    }
