"""Trace one model configuration into the ops / edges / layers tables (imports torch).

A ONE-block model is traced and its block replicated to the model's block count; a TWO-block
trace checks that this is sound (both blocks and the one-block trace's block must have the same
op graph, parameters and activation bytes) instead of assuming it. A model whose first blocks are
dense (DeepSeek-V3) is traced with one dense and one MoE block, each replicated to its count, and
checked by a trace with two of each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from phaze.errors import PhazeError
from phaze.trace.capture import Capture, capture
from phaze.trace.graph import op_graph_rows, signature, to_frames
from phaze.trace.models import ModelSpec
from phaze.trace.moe import rank_tokens_per_expert
from phaze.trace.sizes import check_tensor_sizes


@dataclass
class Trace:
    ops: pd.DataFrame
    edges: pd.DataFrame
    layers: pd.DataFrame
    recorded_ops: int = 0  # operators the one-block trace recorded (views excluded)
    collapsed_views: int = 0  # view/reshape operators it folded into edges
    moe: dict | None = None  # the MoE layer and its stated token distribution (trace.json)


def _layer_kind(name: str) -> str:
    return "block" if name.startswith("block.") else name


def _graphs(cap: Capture, fuse: bool) -> dict[str, tuple[list, list, str]]:
    by_layer: dict[str, list] = {n: [] for n in cap.layer_names}
    for op in cap.ops:
        by_layer[op.layer].append(op)
    out = {}
    for name, ops in by_layer.items():
        op_rows, edge_rows = op_graph_rows(ops, name, fuse)
        sig = signature(op_rows, edge_rows, {"kind": _layer_kind(name)})
        out[name] = (op_rows, edge_rows, sig)
    return out


def _block_facts(cap: Capture, graphs, name: str) -> tuple:
    return (
        graphs[name][2],
        cap.param_bytes[name],
        cap.activation_bytes[name],
        cap.attention_bytes[name],
        cap.replicated_bytes[name],
        cap.input_bytes[name],
        cap.output_bytes[name],
        cap.tied_param_bytes[name],
        cap.expert_param_bytes[name],
    )


def trace_model(
    spec: ModelSpec,
    microbatch: int,
    tp: int = 1,
    seq: int | None = None,
    fuse: bool = True,
    verify: bool = True,
    moe_imbalance: float = 1.0,
    ep: int = 1,
    etp: int | None = None,
) -> Trace:
    """One configuration's trace (one rank's); ``moe_imbalance`` is the stated token
    distribution's factor for a mixture-of-experts model (phaze.trace.moe.tokens_per_expert;
    ignored by dense models), ``ep`` its expert-parallel size (1 for a dense model) and ``etp``
    its experts' tensor-parallel size (tp, the default, or 1)."""
    if microbatch < 1:
        raise PhazeError(f"microbatch must be >= 1 (got {microbatch})")
    seq = seq or spec.seq
    if seq < 2:
        raise PhazeError(f"sequence length must be >= 2 (got {seq})")
    spec.check_tp(tp)
    spec.check_ep(ep)
    spec.check_etp(etp, tp, seq)
    check_tensor_sizes(spec, microbatch, seq)
    etp = tp if etp is None else etp
    if spec.moe is not None:
        spec.moe.check_imbalance(moe_imbalance, spec.name)
    # one block of each kind: (dense first block,) block; verified by two of each
    kinds = 2 if spec.dense_blocks else 1
    cap = capture(spec, kinds, microbatch, seq, tp, moe_imbalance, ep, etp, kinds - 1)
    graphs = _graphs(cap, fuse)
    if verify:
        cap2 = capture(
            spec, 2 * kinds, microbatch, seq, tp, moe_imbalance, ep, etp, 2 * (kinds - 1)
        )
        graphs2 = _graphs(cap2, fuse)
        for i in range(2 * kinds):
            ref = f"block.{i // 2}"
            reference = _block_facts(cap, graphs, ref)
            got = _block_facts(cap2, graphs2, f"block.{i}")
            if got != reference:
                raise PhazeError(
                    f"{spec.name}: block.{i} of a {2 * kinds}-block trace differs from {ref} of "
                    f"the {kinds}-block trace (signature; param, activation, attention, "
                    "replicated, input, output, tied, "
                    f"expert param bytes: {got} vs {reference}); "
                    "its blocks are not identical, so replicating one block would be wrong"
                )

    op_rows, edge_rows = [], []
    for name in cap.layer_names:
        rows, erows, sig = graphs[name]
        for r in rows:
            r["signature"] = sig
        for r in erows:
            r["signature"] = sig
        op_rows += rows
        edge_rows += erows
    ops, edges = to_frames(op_rows, edge_rows)
    layers = _layers_table(spec, cap, graphs, microbatch, seq, tp, ep, etp)
    moe = None
    if spec.moe is not None:
        moe = {
            **dataclasses.asdict(spec.moe),
            "imbalance": float(moe_imbalance),
            "ep": ep,
            "etp": etp,
            # token rows of each of the rank's routed experts per block and microbatch (expert 0
            # the busiest): the m of its GEMMs; at etp = 1 each rank routes its 1/tp shard
            "tokens_per_expert": rank_tokens_per_expert(
                microbatch * seq // (tp // etp), spec.moe.experts, spec.moe.top_k, moe_imbalance, ep
            ),
        }
    return Trace(ops, edges, layers, len(cap.ops), cap.collapsed_views, moe)


def _layers_table(spec, cap: Capture, graphs, microbatch, seq, tp, ep, etp) -> pd.DataFrame:
    def flops(name, pass_, matmul_only=False):
        return float(
            sum(
                r["flops"]
                for r in graphs[name][0]
                if r["pass"] == pass_ and (not matmul_only or r["kind"] == "matmul")
            )
        )

    rows = []
    order = ["embedding"] + [f"block.{i}" for i in range(spec.num_blocks)] + ["head"]
    dense = spec.dense_blocks
    for index, name in enumerate(order):
        src = name  # the traced representative: block.0 (dense first blocks: block.0 dense)
        if name.startswith("block."):
            src = "block.1" if dense and int(name.split(".")[1]) >= dense else "block.0"
        kind = _layer_kind(name)
        sparse = spec.moe is not None and kind == "block" and not (dense and src == "block.0")
        rows.append(
            {
                "layer": name,
                "kind": kind,
                "signature": graphs[src][2],
                "param_bytes": cap.param_bytes[src],
                # tied weights (GPT-2's LM head = word embedding): counted once, in param_bytes of
                # the layer that uses them first; a pipeline stage holding this layer WITHOUT that
                # one needs its own copy (as Megatron keeps on the last stage)
                "tied_param_bytes": cap.tied_param_bytes[src],
                # of param_bytes, the routed experts' weights (what expert parallelism divides
                # by its size; the router, shared expert and attention are not divided)
                "expert_param_bytes": cap.expert_param_bytes[src],
                # routed experts in the layer (0: dense)
                "experts": spec.moe.experts if sparse else 0,
                # the expert-parallel size the trace is one rank of, and its experts' tensor-
                # parallel size (tp, or 1: experts whole, on the rank's shard of the tokens)
                "ep": ep,
                "etp1": etp == 1 and tp > 1,
                "activation_bytes": cap.activation_bytes[src],
                # of which core attention saves (what selective recomputation drops) and what
                # lies outside the tensor-parallel region (what sequence parallelism splits; t > 1)
                "attention_activation_bytes": cap.attention_bytes[src],
                "replicated_activation_bytes": cap.replicated_bytes[src],
                "stash_recompute_bytes": cap.input_bytes[src],
                "boundary_bytes": cap.output_bytes[src],
                # blocks, and the vocab-parallel word embedding / LM head, are split over t ranks
                "tensor_parallel": tp > 1,
                "index": index,
                "block": int(name.split(".")[1]) if kind == "block" else -1,
                "fwd_flops": flops(src, "fwd"),
                "bwd_flops": flops(src, "bwd"),
                "fwd_matmul_flops": flops(src, "fwd", True),
                "bwd_matmul_flops": flops(src, "bwd", True),
                "model": spec.name,
                "microbatch": microbatch,
                "seq_len": seq,
                "tp": tp,
            }
        )
    return pd.DataFrame(rows)
