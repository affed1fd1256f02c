"""Evaluate one training iteration of a given parallel strategy on a GPU-like preset.

Time of one iteration (seconds), for p pipeline devices, V chunks each, m microbatches:

    T = m·max_j T_j + (Σ_j T_j − max_j T_j)/V + max_j (DP_j + OPT_j)

T_j = per-microbatch time of pipeline device j = compute (forward + backward kernels of its
layers) + recomputation + exposed tensor-parallel collectives (Megatron does not overlap them) +
exposed pipeline sends (blocking point-to-point, V per direction with interleaving). DP_j = the
exposed data-parallel gradient all-reduce (all of it for Megatron's local DDP, only what the last
microbatch's backward cannot hide for PyTorch DDP), plus the tied-embedding all-reduce between
the first and last stage; OPT_j = the optimizer step, HBM-bound (bytes per parameter counted per
kernel in config). The breakdown reports the terms of the critical device, summing to T.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache

from phaze.arch.presets import preset_peak_flops
from phaze.errors import PhazeError
from phaze.fidelity.compute import (
    LayerWork,
    gpu_core,
    layer_work,
    megatron_edge_collectives,
    preset_costmodel,
)
from phaze.fidelity.memory import BlockShape, block_activation_bytes, block_working_bytes
from phaze.fidelity.strategy import Strategy
from phaze.network import HierarchicalNetwork

ELEM_BYTES = 2  # fp16/bf16 activations and weights (the trace's convention)


# ---------------------------------------------------------------------------------------------
# trace (cached: one trace per distinct block shape)
# ---------------------------------------------------------------------------------------------
def _spec_key(spec) -> str:
    payload = {
        k: getattr(spec, k)
        for k in (
            "name",
            "family",
            "num_blocks",
            "hidden",
            "heads",
            "ffn",
            "vocab",
            "seq",
            "kv_heads",
        )
    }
    payload["kwargs"] = spec.config_kwargs
    payload["path"] = spec.config_path
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


_SPECS: dict[str, object] = {}


@lru_cache(maxsize=64)
def _trace_cached(key: str, microbatch: int, tp: int, seq: int):
    from phaze.trace.tracer import trace_model

    # fuse=False: the GPU kernel fusion is modelled here (compute.py), not upstream's pairing;
    # verify=False: blocks of these models are identical (the trace stage's tests check that).
    return trace_model(_SPECS[key], microbatch, tp, seq, fuse=False, verify=False)


def trace_for(spec, microbatch: int, tp: int, seq: int):
    key = _spec_key(spec)
    _SPECS[key] = spec
    return _trace_cached(key, microbatch, tp, seq)


# ---------------------------------------------------------------------------------------------
# per-layer work of one rank
# ---------------------------------------------------------------------------------------------
@dataclass
class Workload:
    block: LayerWork
    embedding: LayerWork
    head: LayerWork
    num_blocks: int
    word_embedding_params: int  # one rank's share of a tied word embedding (0 if untied)
    head_activation_bytes: float
    embedding_activation_bytes: float
    tied_embeddings: bool = True  # the head reuses the word embedding (GPT, BERT, OPT)


def build_workload(
    spec, strategy: Strategy, seq: int, preset: dict, costmodel: dict, fidelity: dict
) -> Workload:
    tp, b = strategy.tp, strategy.microbatch
    trace = trace_for(spec, b, tp, seq)
    ops = trace.ops
    layers = trace.layers.set_index("layer")
    core = gpu_core(preset)
    cm = preset_costmodel(preset, costmodel)
    arch = preset["arch"]
    common = {
        "core": core,
        "cm": cm,
        "n_tc": int(arch["n_tc"]),
        "n_vc": int(arch["n_vc"]),
        "fuse": bool(fidelity["fuse_elementwise"]),
        "tp": tp,
        "sequence_parallel": strategy.sequence_parallel,
        "microbatch": b,
        "seq": seq,
        "hidden": spec.hidden,
    }

    def work(name: str) -> LayerWork:
        return layer_work(
            ops[ops["layer"] == name],
            trace.edges[trace.edges["layer"] == name],
            param_bytes=int(layers.loc[name, "param_bytes"]),
            **common,
        )

    block_name = "block.0"
    block, embedding, head = work(block_name), work("embedding"), work("head")
    megatron_edge_collectives(
        embedding, head, tp=tp, microbatch=b, seq=seq, sequence_parallel=strategy.sequence_parallel
    )
    # a tied LM head (GPT-2's) is counted once, in the embedding; a last pipeline stage without
    # the embedding keeps its own copy (the trace's tied_param_bytes), as Megatron does
    tied_bytes = (
        int(layers["tied_param_bytes"].get("head", 0)) if "tied_param_bytes" in layers else 0
    )
    return Workload(
        block,
        embedding,
        head,
        spec.num_blocks,
        tied_bytes // ELEM_BYTES,
        float(layers.loc["head", "activation_bytes"]),
        float(layers.loc["embedding", "activation_bytes"]),
        tied_bytes > 0,
    )


# ---------------------------------------------------------------------------------------------
# the iteration
# ---------------------------------------------------------------------------------------------
def _coll_time(net: HierarchicalNetwork, collectives, ranks) -> float:
    total = 0.0
    for kind, size in collectives:
        if kind == "all_reduce":
            total += net.all_reduce(size, ranks)
        elif kind == "reduce_scatter":
            total += net.reduce_scatter(size, ranks)
        elif kind == "all_gather":
            total += net.all_gather(size, ranks)
        else:
            raise PhazeError(f"unknown collective {kind!r} in the trace")
    return total


def evaluate_strategy(
    spec,
    strategy: Strategy,
    preset: dict,
    *,
    seq: int,
    costmodel: dict,
    fidelity: dict,
    workload: Workload | None = None,
) -> dict:
    if "network" not in preset:
        raise PhazeError(
            "the preset has no `network:` section (devices_per_node, intra_node, "
            "inter_node); `evaluate` needs one"
        )
    net = HierarchicalNetwork.from_preset(preset["network"])
    spec.check_tp(strategy.tp)
    sched = strategy.schedule
    sched.check_layers(spec.num_blocks)
    if workload is None:
        workload = build_workload(spec, strategy, seq, preset, costmodel, fidelity)
    w = workload
    p, v, m, t, b = (
        strategy.pp,
        strategy.interleave,
        strategy.microbatches,
        strategy.tp,
        strategy.microbatch,
    )
    blocks_per_device = spec.num_blocks // p
    cm = preset_costmodel(preset, costmodel)

    blk = w.block
    recompute_s = {"full": blk.fwd_s, "selective": blk.attention_core_fwd_s, "none": 0.0}[
        strategy.recompute
    ]
    # what crosses a stage boundary: b·s·h; with sequence parallelism each rank holds s/t of it
    act_bytes = float(b * seq * spec.hidden * ELEM_BYTES)
    devices = []
    for j in range(p):
        tp_ranks = strategy.tp_group(0, j)
        first, last = j == 0, j == p - 1
        compute = blocks_per_device * (blk.fwd_s + blk.bwd_s)
        tp_comm = blocks_per_device * (
            _coll_time(net, blk.fwd_collectives, tp_ranks)
            * (2 if strategy.recompute == "full" else 1)
            + _coll_time(net, blk.bwd_collectives, tp_ranks)
        )
        bwd_part = blocks_per_device * (
            blk.bwd_s
            + recompute_s
            + _coll_time(net, blk.bwd_collectives, tp_ranks)
            + (
                _coll_time(net, blk.fwd_collectives, tp_ranks)
                if strategy.recompute == "full"
                else 0.0
            )
        )
        for layer, here in ((w.embedding, first), (w.head, last)):
            if here:
                compute += layer.fwd_s + layer.bwd_s
                tp_comm += _coll_time(net, layer.fwd_collectives + layer.bwd_collectives, tp_ranks)
                bwd_part += layer.bwd_s + _coll_time(net, layer.bwd_collectives, tp_ranks)
        pp_comm = 0.0
        if p > 1:
            nxt = strategy.tp_group(0, (j + 1) % p)
            prv = strategy.tp_group(0, (j - 1) % p)
            if strategy.sequence_parallel:

                def send(dst, tp_ranks=tp_ranks):
                    return max(net.p2p(act_bytes / t, a, d) for a, d in zip(tp_ranks, dst))
            else:

                def send(dst, tp_ranks=tp_ranks):
                    return net.stage_transfer(act_bytes, tp_ranks, dst, fidelity["scatter_gather"])

            pp_comm = (v - (1 if last else 0)) * send(nxt) + (v - (1 if first else 0)) * send(prv)
        recompute = blocks_per_device * recompute_s
        per_mb = compute + recompute + tp_comm + pp_comm

        params = blocks_per_device * blk.param_bytes / ELEM_BYTES
        if first:
            params += w.embedding.param_bytes / ELEM_BYTES
        if last:
            # with tied embeddings the last stage keeps its own copy of the word embedding
            params += w.head.param_bytes / ELEM_BYTES + (
                w.word_embedding_params if p > 1 and w.tied_embeddings else 0
            )
        dp_ranks = strategy.dp_group(0, j)
        grads = params * fidelity["grad_bytes_per_param"]
        ar = net.all_reduce(grads, dp_ranks)
        if strategy.ddp == "overlap":
            last_bucket = net.all_reduce(min(float(fidelity["ddp_bucket_bytes"]), grads), dp_ranks)
            dp = max(ar - bwd_part, last_bucket)
        else:
            dp = ar
        if p > 1 and (first or last) and w.tied_embeddings:
            # Megatron all-reduces the tied word-embedding gradient between first and last stage
            dp += net.all_reduce(
                w.word_embedding_params * fidelity["grad_bytes_per_param"],
                [strategy.rank(0, 0, 0), strategy.rank(0, 0, p - 1)],
            )
        opt = params * fidelity["optimizer_bytes_per_param"] / cm["hbm_bandwidth_Bps"]

        # memory
        shape = BlockShape(seq, b, spec.hidden, spec.heads, spec.ffn)
        stash = block_activation_bytes(shape, t, strategy.sequence_parallel, strategy.recompute)
        working = block_working_bytes(shape, t, strategy.sequence_parallel, strategy.recompute)
        inflight = sched.inflight_microbatch_stages(j)
        extra = (inflight * w.embedding_activation_bytes if first else 0.0) + (
            w.head_activation_bytes if last else 0.0
        )
        mem = (
            params * fidelity["state_bytes_per_param"]
            + inflight * blocks_per_device * stash
            + working
            + extra
        )
        devices.append(
            {
                "per_microbatch_s": per_mb,
                "compute_s": compute,
                "recompute_s": recompute,
                "tp_comm_s": tp_comm,
                "pp_comm_s": pp_comm,
                "dp_comm_s": dp,
                "optimizer_s": opt,
                "params": params,
                "memory_bytes": mem,
            }
        )

    pipe, bubble = sched.iteration_time([d["per_microbatch_s"] for d in devices])
    crit = max(range(p), key=lambda j: devices[j]["per_microbatch_s"])
    tail_j = max(range(p), key=lambda j: devices[j]["dp_comm_s"] + devices[j]["optimizer_s"])
    c, tl = devices[crit], devices[tail_j]
    iteration = pipe + tl["dp_comm_s"] + tl["optimizer_s"]
    breakdown = {
        "compute_s": m * c["compute_s"],
        "recompute_s": m * c["recompute_s"],
        "tensor_parallel_comm_s": m * c["tp_comm_s"],
        "pipeline_comm_s": m * c["pp_comm_s"],
        "pipeline_bubble_s": bubble,
        "data_parallel_comm_s": tl["dp_comm_s"],
        "optimizer_s": tl["optimizer_s"],
    }
    # Eq. (3) of Narayanan et al. 2021 generalised through the trace: 4 passes' worth of block
    # matmul FLOPs (forward, backward = 2x, recomputation) and 3 of the logits GEMM.
    sequences = strategy.global_batch
    block_fwd = blk.fwd_flops * t / b
    head_fwd = w.head.fwd_flops * t / b
    model_flops = sequences * (4 * spec.num_blocks * block_fwd + 3 * head_fwd)
    useful_flops = sequences * 3 * (spec.num_blocks * block_fwd + head_fwd)
    peak = preset_peak_flops(preset)
    n = strategy.devices
    peak_memory = max(d["memory_bytes"] for d in devices)
    capacity = (preset.get("gpu") or {}).get("hbm_bytes")
    return {
        "iteration_time_s": iteration,
        "model_flops": model_flops,
        "tflops_per_device": model_flops / (n * iteration) / 1e12,
        "mfu": useful_flops / (n * iteration * peak),
        "peak_memory_bytes": peak_memory,
        "hbm_bytes": capacity,
        "fits_memory": None if capacity is None else bool(peak_memory <= capacity),
        "breakdown": breakdown,
        "strategy": {
            "devices": n,
            "tp": t,
            "pp": p,
            "dp": strategy.dp,
            "microbatch": b,
            "global_batch": strategy.global_batch,
            "microbatches": m,
            "interleave": v,
            "recompute": strategy.recompute,
            "sequence_parallel": strategy.sequence_parallel,
            "ddp": strategy.ddp,
            "seq": seq,
        },
        "critical_stage": crit,
        "per_stage": [
            {
                "stage": j,
                "per_microbatch_s": d["per_microbatch_s"],
                "memory_bytes": d["memory_bytes"],
                "params": d["params"],
            }
            for j, d in enumerate(devices)
        ],
        "block_kernel_bounds_s": dict(sorted(blk.bound_s.items())),
        "peak_flops_per_device": peak,
    }
