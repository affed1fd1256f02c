"""A training iteration on a GPU-shaped preset: the per-layer work of one tensor-parallel rank
summed from kernels (`phaze.fidelity.compute`, over the shared trace and cost model), priced by the
step model (`phaze.step`, docs/step.md) — the one model the placement search also optimises.

What is GPU-specific lives here: a layer's time is the sum of its kernels' latencies (one kernel at
a time on all SMs), element-wise chains fused, Megatron's fp32 cross-entropy in place of the
trace's loss kernels; the tensor-parallel collectives are priced by the step model on the preset's
network (two-level, or `tpuv4`'s ICI torus). Memory comes from the trace's saved tensors
(``activation_bytes`` and its core-attention and outside-the-region parts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import lru_cache

from phaze.arch.presets import preset_peak_flops
from phaze.errors import PhazeError
from phaze.estimate.model import achievable_hbm_Bps
from phaze.fidelity.compute import (
    LayerWork,
    gpu_core,
    layer_works,
    megatron_cross_entropy,
    megatron_edge_collectives,
    preset_costmodel,
)
from phaze.network import Network, network_from_section
from phaze.place.chains import fold_dense_blocks
from phaze.place.megatron import Axes, optimize
from phaze.precision import Format, fp8_peak_flops, get_format
from phaze.step.layers import ChainCost, LayerCost
from phaze.step.model import StepConstants, price
from phaze.step.strategy import Strategy, check_context_parallel

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
def _trace_cached(
    key: str, microbatch: int, tp: int, seq: int, ep: int, imbalance: float, etp: int
):
    from phaze.trace.tracer import trace_model  # deferred: pulls torch

    # fuse=False: the GPU kernel fusion is modelled here (compute.py), not upstream's pairing;
    # verify=False: blocks of these models are identical (the trace stage's tests check that).
    return trace_model(
        _SPECS[key],
        microbatch,
        tp,
        seq,
        fuse=False,
        verify=False,
        moe_imbalance=imbalance,
        ep=ep,
        etp=etp,
    )


def trace_for(
    spec,
    microbatch: int,
    tp: int,
    seq: int,
    ep: int = 1,
    imbalance: float = 1.0,
    etp: int | None = None,
):
    """The trace of one rank at (microbatch, tp, ep, etp) (cached per block shape); a
    mixture-of-experts model routes its tokens by the stated distribution of `imbalance`."""
    key = _spec_key(spec)
    _SPECS[key] = spec
    return _trace_cached(key, microbatch, tp, seq, ep, float(imbalance), tp if etp is None else etp)


# ---------------------------------------------------------------------------------------------
# the chain of one (t, b): layer costs from kernels and the trace
# ---------------------------------------------------------------------------------------------
def _layer_cost(
    work: LayerWork, row, tp: int, sp: bool, tied_bytes: float = 0.0, kv_bytes: float = 0.0
) -> LayerCost:
    split = tp if sp else 1
    # with sequence parallelism what lies outside the tensor-parallel region is split by t
    outside = float(row["replicated_activation_bytes"]) * (1 - 1 / split)
    mean = row.get("mean_fwd_matmul_flops")
    # a low-precision linear layer saves its input in that precision (phaze.precision)
    activation = float(row["activation_bytes"]) - outside - work.low_precision_saved_bytes
    attention = float(row["attention_activation_bytes"])
    if work.fused_attention:  # the softmax statistics in place of the trace's s × s tensors
        activation += work.attention_saved_bytes - attention
        attention = 0.0
    return LayerCost(
        fwd_s=work.fwd_s,
        bwd_s=work.bwd_s,
        params=work.param_bytes / ELEM_BYTES,
        activation_bytes=activation,
        fwd_collectives=tuple(work.fwd_collectives),
        bwd_collectives=tuple(work.bwd_collectives),
        attention_fwd_s=work.attention_core_fwd_s,
        attention_activation_bytes=attention,
        input_bytes=float(row["stash_recompute_bytes"]) / split,
        tied_params=tied_bytes / ELEM_BYTES,
        fwd_matmul_flops=work.fwd_flops,
        attention_matmul_flops=work.attention_fwd_flops,
        expert_params=float(row.get("expert_param_bytes", 0.0)) / ELEM_BYTES,
        mean_fwd_matmul_flops=None if mean is None else float(mean),
        low_precision_params=work.low_precision_params,
        attention_bwd_s=work.attention_core_bwd_s,
        kv_bytes=kv_bytes,
        fused_attention=work.fused_attention,
    )


_CHAINS: dict[tuple, dict[bool, ChainCost]] = {}


def gpu_chains(
    spec,
    tp: int,
    microbatch: int,
    seq: int,
    preset: dict,
    config: dict,
    ep: int = 1,
    etp: int | None = None,
    cp: int = 1,
):
    """{sequence_parallel: ChainCost} of the model at (tp, microbatch, ep, etp, cp) on a GPU
    preset (both settings for tp > 1, from one costing of the kernels); cached per process. A
    mixture-of-experts model routes its tokens by config ``trace.moe_imbalance``. With context
    parallelism (cp > 1) every layer is costed on the rank's seq/cp tokens and its core
    attention as cp ring steps (`LayerCost.context_parallel`)."""
    etp = tp if etp is None else etp
    check_context_parallel(seq, cp)
    local_seq = seq // cp  # the tokens of one context-parallel rank
    spec.check_etp(etp, tp, local_seq)
    moe = getattr(spec, "moe", None)
    if ep > 1 and moe is None:
        raise PhazeError(f"expert parallelism (ep = {ep}) needs a mixture-of-experts model")
    if moe is not None and moe.experts % ep:
        raise PhazeError(
            f"the expert-parallel size ep ({ep}) must divide the {moe.experts} experts"
        )
    imbalance = float(config["trace"].get("moe_imbalance", 1.0)) if moe is not None else 1.0
    key = (
        _spec_key(spec),
        tp,
        microbatch,
        seq,
        ep,
        etp,
        imbalance,
        cp,
        json.dumps(preset, sort_keys=True, default=str),
        json.dumps([config["costmodel"], config["fidelity"]], sort_keys=True),
    )
    if key in _CHAINS:
        return _CHAINS[key]
    spec.check_tp(tp)
    trace = trace_for(spec, microbatch, tp, local_seq, ep, imbalance, etp)
    layers = trace.layers.set_index("layer")
    cm = preset_costmodel(preset, config["costmodel"])
    common = {
        "core": gpu_core(preset, cm),
        "cm": cm,
        "n_tc": int(preset["arch"]["n_tc"]),
        "n_vc": int(preset["arch"]["n_vc"]),
        "fuse": bool(config["fidelity"]["fuse_elementwise"]),
        "tp": tp,
        "fmt": run_format(preset, config),
        # config fidelity.attention: the trace's eager kernels or one fused kernel per pass
        "attention": config["fidelity"].get("attention", "eager"),
        "causal": spec.causal,
    }
    # a model with dense first blocks (DeepSeek-V3): the chain's block is the repeated MoE block;
    # the dense blocks are priced with the embedding, as the first layer (fold_dense_blocks)
    dense = spec.dense_blocks
    rep = f"block.{dense}" if dense else "block.0"
    names = ("embedding", "block.0", rep, "head") if dense else ("embedding", rep, "head")
    # the ops and edges tables hold each distinct layer once, under its signature
    sig = {name: layers.loc[name, "signature"] for name in names}
    works = {
        name: layer_works(
            trace.ops[trace.ops["signature"] == sig[name]],
            trace.edges[trace.edges["signature"] == sig[name]],
            param_bytes=int(layers.loc[name, "param_bytes"]),
            **common,
        )
        for name in names
    }
    # a tied LM head (GPT-2's) is counted once, in the embedding; a last pipeline stage without
    # the embedding keeps its own copy (the trace's tied_param_bytes), as Megatron does
    tied = float(layers.loc["head", "tied_param_bytes"])
    # the keys and values of the rank's tokens (its kv_heads/tp heads): what one step of the
    # context-parallel ring passes on (TransformerEngine's ring attention)
    head_dim = getattr(spec, "head_dim", None) or spec.hidden // spec.heads
    kv = 2.0 * microbatch * local_seq * (spec.kv_heads // tp) * head_dim * ELEM_BYTES
    chains = {}
    for sp in works[rep]:
        emb, blk, head = (works[n][sp] for n in ("embedding", rep, "head"))
        megatron_edge_collectives(
            emb, head, tp=tp, microbatch=microbatch, seq=local_seq, sequence_parallel=sp
        )
        megatron_cross_entropy(head, trace.ops[trace.ops["layer"] == "head"], cm)
        first = _layer_cost(emb, layers.loc["embedding"], tp, sp).context_parallel(cp)
        if dense:
            dense_cost = _layer_cost(
                works["block.0"][sp], layers.loc["block.0"], tp, sp, kv_bytes=kv
            ).context_parallel(cp)
            first = fold_dense_blocks(first, dense_cost, dense)
        chains[sp] = ChainCost(
            first=first,
            block=_layer_cost(blk, layers.loc[rep], tp, sp, kv_bytes=kv).context_parallel(cp),
            last=_layer_cost(head, layers.loc["head"], tp, sp, tied).context_parallel(cp),
            blocks=spec.repeated_blocks,
            tp=tp,
            microbatch=microbatch,
            sequence_parallel=sp,
            boundary_bytes=float(microbatch * local_seq * spec.hidden * ELEM_BYTES),
            meta={"block_kernel_bounds_s": dict(sorted(blk.bound_s.items()))},
            ep=ep,
            experts=moe.experts if moe is not None else 0,
            etp=etp,
            cp=cp,
        )
    _CHAINS[key] = chains
    return chains


# ---------------------------------------------------------------------------------------------
# one strategy
# ---------------------------------------------------------------------------------------------
def preset_network(preset: dict, name: str, devices: int) -> Network:
    """The preset's ``network:`` section for a job of `devices` devices."""
    if "network" not in preset:
        raise PhazeError(
            f"preset {name!r} has no `network:` section (devices_per_node, intra_node, "
            "inter_node; or topology: torus3d); evaluate and optimize need one (e.g. a100-80gb, "
            "h100-sxm or tpuv4)"
        )
    return network_from_section(preset["network"], devices, f"preset {name} network")


def run_format(preset: dict, config: dict, name: str = "preset") -> Format:
    """The training precision (config ``fidelity.precision``) the preset can run: FP8 needs the
    preset's FP8 peak (`phaze.precision.fp8_peak_flops`; PhazeError otherwise)."""
    fmt = get_format(config["fidelity"]["precision"])
    if fmt.low_precision:
        fp8_peak_flops(preset, name, preset_peak_flops(preset))
    return fmt


def run_peak_flops(preset: dict, config: dict, name: str = "preset") -> float:
    """One device's dense peak in the training precision (the denominator of MFU)."""
    if run_format(preset, config, name).low_precision:
        return fp8_peak_flops(preset, name, preset_peak_flops(preset))
    return preset_peak_flops(preset)


def step_constants(preset: dict, config: dict) -> StepConstants:
    """The step accounting of config ``step`` on the preset's achievable HBM bandwidth (every
    HBM-bound term: optimizer step, gradient accumulation), with the training precision's cast
    weights (`phaze.precision`)."""
    hbm = float(achievable_hbm_Bps(preset_costmodel(preset, config["costmodel"])))
    consts = StepConstants.from_config(config["step"], hbm)
    fmt = get_format(config["fidelity"]["precision"])
    if not fmt.low_precision:
        return consts
    return dataclasses.replace(
        consts,
        low_precision_weight_bytes_per_param=fmt.weight_copy_bytes_per_param,
        weight_cast_bytes_per_param=fmt.cast_bytes_per_element,
    )


def evaluate_strategy(
    spec, strategy: Strategy, preset: dict, *, seq: int, config: dict, name: str = "preset"
) -> dict:
    """`phaze.step.model.price` of `strategy` for model `spec` on a GPU preset, plus the GPU
    detail (the block's kernel time by bound, the device's peak)."""
    net = preset_network(preset, name, strategy.devices)
    peak = run_peak_flops(preset, config, name)
    spec.check_tp(strategy.tp)
    strategy.check_layers(spec.repeated_blocks)
    moe = getattr(spec, "moe", None)
    strategy.check_experts(moe.experts if moe is not None else 0)
    chain = gpu_chains(
        spec,
        strategy.tp,
        strategy.microbatch,
        seq,
        preset,
        config,
        strategy.ep,
        strategy.expert_tp,
        strategy.cp,
    )[strategy.sequence_parallel]
    capacity = (preset.get("gpu") or {}).get("hbm_capacity_bytes")
    result = price(chain, strategy, net, step_constants(preset, config), peak, capacity)
    result["devices"] = strategy.devices
    result["global_batch"] = strategy.global_batch
    result["microbatches"] = strategy.microbatches
    result["seq"] = seq
    result["block_kernel_bounds_s"] = chain.meta["block_kernel_bounds_s"]
    result["peak_flops_per_device"] = peak
    result["precision"] = config["fidelity"]["precision"]
    return result


# ---------------------------------------------------------------------------------------------
# the best strategy
# ---------------------------------------------------------------------------------------------
def optimize_strategy(
    spec,
    preset: dict,
    *,
    devices: int,
    global_batch: int,
    seq: int,
    hbm_capacity_bytes: float,
    config: dict,
    microbatches,
    tps,
    name: str = "preset",
    eps=(1,),
    etps=(None,),
    cps=(1,),
):
    """The fastest strategy that fits `hbm_capacity_bytes` per device under the step model (the exact
    search of phaze.place.megatron over the tp, microbatch, ep, etp and cp values given — etp
    None is the experts split over tp, 1 whole experts, where the model has experts and tp > 1;
    cp each context-parallel size, the caller's to check against the sequence — and the axes of
    config ``place``). Returns (evaluate_strategy's dict of it or None, the search's Result)."""
    net = preset_network(preset, name, devices)
    run_format(preset, config, name)
    chains = {}
    for t in tps:
        for b in microbatches:
            for cp in cps:
                for ep in eps:
                    for etp in sorted({t if x is None else x for x in etps}, reverse=True):
                        if etp != t and not spec.whole_experts(t, seq // cp):
                            continue
                        got = gpu_chains(spec, t, b, seq, preset, config, ep, etp, cp)
                        for sp, chain in got.items():
                            chains[(t, b, sp, ep, etp, cp)] = chain
    found = optimize(
        chains,
        net,
        step_constants(preset, config),
        devices,
        global_batch,
        hbm_capacity_bytes,
        Axes.from_config(config["place"]),
    )
    if found.strategy is None:
        return None, found
    result = evaluate_strategy(spec, found.strategy, preset, seq=seq, config=config, name=name)
    return result, found
