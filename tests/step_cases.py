"""Shared by the step-model tests: random chains and networks, and an independent reference
implementation of the step model (explicit rank lists, the network's own collectives and sends,
plain loops) that `phaze.step.model.price` is checked against."""

from __future__ import annotations

import json
from pathlib import Path

from phaze.network import HierarchicalNetwork, LinkLevel, Network, TorusNetwork
from phaze.step.layers import ChainCost, LayerCost
from phaze.step.model import StepConstants
from phaze.step.strategy import Strategy
from phaze.trace.models import ModelSpec

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
#: sequence length of the tiny GPT models
TINY_SEQ = 256


def tiny_gpt(layers=8, hidden=256, heads=8, vocab=1024, activation: str | None = None) -> ModelSpec:
    """A small GPT-2 model spec (FFN 4 × hidden, sequence TINY_SEQ); `activation` sets the Hugging
    Face `activation_function` (None: GPT-2's default)."""
    kw = {
        "n_layer": layers,
        "n_embd": hidden,
        "n_head": heads,
        "n_inner": 4 * hidden,
        "vocab_size": vocab,
        "n_positions": TINY_SEQ,
    }
    if activation is not None:
        kw["activation_function"] = activation
    return ModelSpec(
        "tiny-gpt", "gpt2", layers, hidden, heads, 4 * hidden, vocab, TINY_SEQ, heads, kw
    )


def write_tiny_gpt2_config(
    path: Path, n_layer: int, n_embd: int = 128, n_head: int = 4, vocab: int = 512, seq: int = 128
) -> Path:
    """A GPT-2 Hugging Face config.json for the `--hf-config` CLI tests."""
    cfg = {
        "model_type": "gpt2",
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "vocab_size": vocab,
        "n_positions": seq,
    }
    path.write_text(json.dumps(cfg))
    return path


def random_network(rng) -> HierarchicalNetwork:
    """1–8 devices per node (awkward sizes included), levels in either order of speed."""
    dpn = int(rng.choice([1, 2, 3, 4, 6, 8]))
    level = lambda: LinkLevel(
        float(rng.uniform(0.5, 4.0)), float(rng.uniform(0.0, 0.05)), float(rng.uniform(0.5, 1))
    )
    return HierarchicalNetwork(dpn, level(), level())


def random_torus(rng, devices: int) -> TorusNetwork:
    """A torus of exactly `devices` chips: a random factorisation into three axes, each axis
    wrapping or not."""
    dims = [1, 1, 1]
    rest = devices
    for f in range(2, devices + 1):
        while rest % f == 0:
            dims[int(rng.integers(0, 3))] *= f
            rest //= f
    link = LinkLevel(float(rng.uniform(0.5, 4.0)), float(rng.uniform(0.0, 0.05)))
    wraps = tuple(bool(rng.random() < 0.5) for _ in range(3))
    return TorusNetwork(tuple(dims), wraps, link)


def random_layer(rng, *, block: bool, tp: int, tied: bool = False) -> LayerCost:
    colls = lambda: tuple(
        (str(rng.choice(KINDS)), float(rng.uniform(0, 2)))
        for _ in range(int(rng.integers(0, 3)) if tp > 1 else 0)
    )
    fwd = float(rng.uniform(0.2, 2.0))
    act = float(rng.uniform(0.0, 3.0))
    flops = float(rng.uniform(0, 10))
    return LayerCost(
        fwd_s=fwd,
        bwd_s=float(rng.uniform(0.4, 4.0)),
        params=float(rng.uniform(0.0, 2.0)),
        activation_bytes=act,
        fwd_collectives=colls(),
        bwd_collectives=colls(),
        attention_fwd_s=float(rng.uniform(0, fwd)) if block else 0.0,
        attention_activation_bytes=float(rng.uniform(0, act)) if block else 0.0,
        input_bytes=float(rng.uniform(0, act)) if block else 0.0,
        tied_params=float(rng.uniform(0.1, 1.0)) if tied else 0.0,
        fwd_matmul_flops=flops,
        attention_matmul_flops=float(rng.uniform(0, flops)) if block else 0.0,
    )


def random_chain(
    rng,
    blocks: int,
    tp: int,
    microbatch: int,
    sp: bool,
    ep: int = 1,
    experts: int = 0,
    etp: int | None = None,
) -> ChainCost:
    """A random chain; with `experts` > 0 a mixture-of-experts chain at expert-parallel size
    `ep` and experts' tensor-parallel size `etp` (`moe_variant`)."""
    tied = bool(rng.random() < 0.5)
    if experts:
        chain = random_chain(rng, blocks, tp, microbatch, sp)
        return moe_variant(rng, chain, ep, experts, etp)
    return ChainCost(
        first=random_layer(rng, block=False, tp=tp),
        block=random_layer(rng, block=True, tp=tp),
        last=random_layer(rng, block=False, tp=tp, tied=tied),
        blocks=blocks,
        tp=tp,
        microbatch=microbatch,
        sequence_parallel=sp,
        boundary_bytes=float(rng.uniform(0, 2)),
    )


def moe_variant(rng, chain: ChainCost, ep: int, experts: int, etp: int | None = None) -> ChainCost:
    """The chain as a mixture-of-experts model at expert-parallel size `ep`: the block holds
    experts/ep experts of a random share of its parameters (the rest dense), a dispatch and a
    combine all-to-all each way (sizes random, one per pass direction), and its mean rank's
    matmul FLOPs at most the traced rank's."""
    from dataclasses import replace

    B = chain.block
    share = float(rng.uniform(0.3, 0.95))
    expert_all = B.params * share * 3  # all experts of the block, over ep ranks
    size = float(rng.uniform(0.1, 2))
    a2a = (("all_to_all", size), ("all_to_all", size * float(rng.uniform(1, 1.3))))
    block = replace(
        B,
        params=B.params * (1 - share) + expert_all / ep,
        expert_params=expert_all / ep,
        fwd_collectives=(*B.fwd_collectives, *a2a),
        bwd_collectives=(*a2a, *B.bwd_collectives),
        mean_fwd_matmul_flops=B.fwd_matmul_flops * float(rng.uniform(0.7, 1.0)),
    )
    return replace(chain, block=block, ep=ep, experts=experts, etp=etp)


def tensor_parallel_variant(rng, chain: ChainCost, tp: int) -> ChainCost:
    """The t = 1 chain split over `tp` ranks: computation, parameters and most activations
    divided by t (each with some inefficiency), tensor-parallel collectives added."""
    from dataclasses import replace

    def split(layer: LayerCost) -> LayerCost:
        slow = float(rng.uniform(1.0, 1.4)) / tp
        keep = float(rng.uniform(1.0 / tp, 1.0))
        colls = lambda: tuple(
            (str(rng.choice(KINDS)), float(rng.uniform(0, 1))) for _ in range(rng.integers(1, 3))
        )
        return replace(
            layer,
            fwd_s=layer.fwd_s * slow,
            bwd_s=layer.bwd_s * slow,
            attention_fwd_s=layer.attention_fwd_s * slow,
            params=layer.params / tp,
            tied_params=layer.tied_params / tp,
            activation_bytes=layer.activation_bytes * keep,
            attention_activation_bytes=layer.attention_activation_bytes / tp,
            fwd_collectives=colls(),
            bwd_collectives=colls(),
            fwd_matmul_flops=layer.fwd_matmul_flops / tp,
            attention_matmul_flops=layer.attention_matmul_flops / tp,
        )

    return replace(
        chain, first=split(chain.first), block=split(chain.block), last=split(chain.last), tp=tp
    )


def sequence_parallel_variant(rng, chain: ChainCost) -> ChainCost:
    """The chain with sequence parallelism: the same layers with fewer activations (the part
    outside the tensor-parallel region divided by t) and replicated kernels on s/t tokens."""
    from dataclasses import replace

    def shrink(layer: LayerCost) -> LayerCost:
        keep = float(rng.uniform(0.4, 1.0))
        speed = float(rng.uniform(0.85, 1.0))
        attention = min(layer.attention_activation_bytes, layer.activation_bytes * keep)
        return replace(
            layer,
            fwd_s=layer.fwd_s * speed,
            bwd_s=layer.bwd_s * speed,
            attention_fwd_s=layer.attention_fwd_s * speed,
            activation_bytes=layer.activation_bytes * keep,
            attention_activation_bytes=attention,
            input_bytes=layer.input_bytes / chain.tp,
        )

    return replace(
        chain,
        first=shrink(chain.first),
        block=shrink(chain.block),
        last=shrink(chain.last),
        sequence_parallel=True,
    )


def random_constants(rng) -> StepConstants:
    state = float(rng.uniform(2, 20))
    return StepConstants(
        state_bytes_per_param=state,
        optimizer_state_bytes_per_param=float(rng.uniform(0, state)),
        grad_bytes_per_param=float(rng.uniform(0.5, 4)),
        weight_bytes_per_param=float(rng.uniform(0.5, 4)),
        optimizer_bytes_per_param=float(rng.uniform(0, 60)),
        grad_accumulation_bytes_per_param=float(rng.uniform(0, 8)),
        ddp_bucket_bytes=float(rng.uniform(0.05, 3)),
        hbm_bandwidth_Bps=float(rng.uniform(5, 50)),
        scatter_gather=bool(rng.random() < 0.7),
    )


# ---------------------------------------------------------------------------------------------
# the reference: the model's definition, written as loops over explicit ranks
# ---------------------------------------------------------------------------------------------
def _colls(net, colls, ranks) -> float:
    total = 0.0
    for kind, size in colls:
        total += {
            "all_reduce": net.all_reduce,
            "reduce_scatter": net.reduce_scatter,
            "all_gather": net.all_gather,
            "all_to_all": net.all_to_all,
        }[kind](size, ranks)
    return total


def reference_price(chain: ChainCost, s: Strategy, net: Network, c: StepConstants):
    """(iteration time, per-rank memory) of strategy `s` (stages given or even)."""
    stages = s.check_layers(chain.blocks)
    t, p, d, v = s.tp, s.pp, s.dp, s.interleave
    sched = s.schedule
    E, B, H = chain.first, chain.block, chain.last
    full = s.recompute == "full"
    rc = {"none": 0.0, "selective": B.attention_fwd_s, "full": B.fwd_s}[s.recompute]
    stash = {
        "none": B.activation_bytes,
        "selective": B.activation_bytes - B.attention_activation_bytes,
        "full": B.input_bytes,
    }[s.recompute]
    working = B.activation_bytes - stash
    # tensor-parallel collectives: on the slowest tensor-parallel group of the layout; the
    # all-to-alls on the slowest expert-parallel group
    groups = [s.tp_group(r, j) for r in range(d) for j in range(p)]
    ep_groups = [
        s.ep_group(k, i, j) for k in range(s.expert_tp) for i in range(s.edp) for j in range(p)
    ]

    def tp_time(colls):
        a2a = [c for c in colls if c[0] == "all_to_all"]
        rest = [c for c in colls if c[0] != "all_to_all"]
        return max(_colls(net, rest, g) for g in groups) + (
            max(_colls(net, a2a, g) for g in ep_groups) if a2a else 0.0
        )

    per_mb, bwd_part, params_of, mem = [], [], [], []
    for j in range(p):
        n = stages[j]
        first, last = j == 0, j == p - 1
        t_j = n * (B.fwd_s + B.bwd_s + rc + tp_time(B.fwd_collectives) * (2 if full else 1))
        t_j += n * tp_time(B.bwd_collectives)
        b_j = n * (B.bwd_s + rc + tp_time(B.bwd_collectives))
        b_j += n * tp_time(B.fwd_collectives) if full else 0.0
        for layer, here in ((E, first), (H, last)):
            if here:
                t_j += layer.fwd_s + layer.bwd_s
                t_j += tp_time(layer.fwd_collectives) + tp_time(layer.bwd_collectives)
                b_j += layer.bwd_s + tp_time(layer.bwd_collectives)
        if p > 1:
            n_next, n_prev = sched.sends(j)
            worst = 0.0
            for r in range(d):
                src = s.tp_group(r, j)
                out = []
                for other, count in (((j + 1) % p, n_next), ((j - 1) % p, n_prev)):
                    dst = s.tp_group(r, other)
                    if chain.sequence_parallel:
                        x = max(net.p2p(chain.boundary_bytes / t, a, b) for a, b in zip(src, dst))
                    else:
                        x = net.stage_transfer(chain.boundary_bytes, src, dst, False)
                        if c.scatter_gather:  # where it is faster
                            x = min(x, net.stage_transfer(chain.boundary_bytes, src, dst, True))
                    out.append(count * x)
                worst = max(worst, sum(out))
            t_j += worst
        P = n * B.params + (E.params if first else 0.0)
        if last:
            P += H.params + (H.tied_params if p > 1 else 0.0)
        m = sched.microbatches
        t_j += (m - 1) / m * P * c.grad_accumulation_bytes_per_param / c.hbm_bandwidth_Bps
        per_mb.append(t_j)
        bwd_part.append(b_j)
        params_of.append(P)
        Pe = n * B.expert_params
        state = c.state_bytes_per_param
        expert_state = c.state_bytes_per_param
        if s.distributed_optimizer:
            state += c.optimizer_state_bytes_per_param * (1 / d - 1)
            expert_state += c.optimizer_state_bytes_per_param * (1 / s.edp - 1)
        m_j = (P - Pe) * state + Pe * expert_state
        m_j += sched.inflight(j) * n * stash + (working if n > 0 else 0.0)
        m_j += (sched.inflight(j) * E.activation_bytes if first else 0.0) + (
            H.activation_bytes if last else 0.0
        )
        mem.append(m_j)
    tails = []
    for j in range(p):
        P = params_of[j]
        Pe = stages[j] * B.expert_params
        # (reduction, one full bucket's reduction, weights' all-gather) of the dense parameters
        # on each data-parallel group, of the experts' on each expert data-parallel group; the
        # last bucket is a full bucket on the slower group, or all the gradients if fewer
        parts = []
        kinds = [(P - Pe, [s.dp_group(k, j) for k in range(t)])]
        if chain.experts:
            groups = [s.edp_group(k, e, j) for k in range(s.expert_tp) for e in range(s.ep)]
            kinds.append((Pe, groups))
        for params, group_list in kinds:
            grads = params * c.grad_bytes_per_param
            got = []
            for ranks in group_list:
                if s.distributed_optimizer:
                    red = net.reduce_scatter(grads, ranks)
                    bucket = net.reduce_scatter(c.ddp_bucket_bytes, ranks)
                else:
                    red = net.all_reduce(grads, ranks)
                    bucket = net.all_reduce(c.ddp_bucket_bytes, ranks)
                gather = 0.0
                if s.distributed_optimizer:
                    gather = net.all_gather(params * c.weight_bytes_per_param, ranks)
                got.append((red, bucket, gather))
            parts.append(tuple(max(x[i] for x in got) for i in range(3)))  # the slowest group
        red = sum(x[0] for x in parts)
        last_bucket = min(max(x[1] for x in parts), red)
        x = max(red - bwd_part[j], last_bucket) if s.ddp == "overlap" else red
        worst = x + sum(x[2] for x in parts)
        if p > 1 and chain.tied and j in (0, p - 1):
            worst += max(
                net.all_reduce(
                    H.tied_params * c.grad_bytes_per_param,
                    [s.rank(k, r, 0), s.rank(k, r, p - 1)],
                )
                for k in range(t)
                for r in range(d)
            )
        opt = (P - Pe) * c.optimizer_bytes_per_param / c.hbm_bandwidth_Bps
        opt_e = Pe * c.optimizer_bytes_per_param / c.hbm_bandwidth_Bps
        if s.distributed_optimizer:
            opt, opt_e = opt / d, opt_e / s.edp
        tails.append(worst + opt + opt_e)
    m = sched.microbatches
    pipe = m * max(per_mb) + (sum(per_mb) - max(per_mb)) / v
    return pipe + max(tails), mem
