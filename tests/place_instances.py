"""Synthetic placement instances in upstream's format (a fixture of tests/test_place_upstream.py
and benchmarks/place.py).

`gpt3_like_instance` sizes a GPT-3 175B chain (embedding, 96 blocks, head; h = 12288, seq 2048,
microbatch 1, bf16) with textbook formulas, in seconds and bytes: block parameters 12 h² · 2 B,
forward FLOPs 24 s h² + 4 s² h at 50 % of a 275 TFLOP/s device, backward twice the forward,
Megatron-style activation bytes s h (34 + 5 a s / h) per block; tensor-parallel blocks divide
parameters, FLOPs and activations by t. The numbers are plausible, not measured: the instance
exists to time the solver on the paper's problem size.
"""

from __future__ import annotations


def gpt3_like_instance(
    widths=(4, 8),
    devices=1024,
    microbatches=4096,
    recompute=True,
    memory_gib=32.0,
    bandwidth_Bps=44.8e9,
    optimizer="Adam",
) -> dict:
    h, s, heads, vocab, blocks = 12288, 2048, 96, 50257, 96
    flops_per_s = 0.5 * 275e12
    block_params = 12 * h * h * 2.0
    block_fw_flops = 24 * s * h * h + 4 * s * s * h
    block_acts = s * h * (34 + 5 * heads * s / h)
    boundary = s * h * 2.0
    emb_params = vocab * h * 2.0
    head_fw_flops = 2 * s * h * vocab
    nodes, edges = {}, {}
    for t in widths:
        tp = t > 1
        layer = []
        layer.append(
            {
                "id": 0,
                "parameterSize": emb_params,
                "activationSize": boundary,
                "optimalLatencyFw": s * h * 2.0 / 1.2e12,
                "optimalLatencyBw": 2 * s * h * 2.0 / 1.2e12,
                "isTensorParallelized": False,
            }
        )
        for b in range(blocks):
            fw = block_fw_flops / t / flops_per_s
            layer.append(
                {
                    "id": 1 + b,
                    "parameterSize": block_params / t,
                    "activationSize": block_acts / t,
                    "optimalLatencyFw": fw,
                    "optimalLatencyBw": 2 * fw,
                    "isTensorParallelized": tp,
                }
            )
        fw = head_fw_flops / flops_per_s
        layer.append(
            {
                "id": blocks + 1,
                "parameterSize": emb_params,
                "activationSize": s * vocab * 4.0,
                "optimalLatencyFw": fw,
                "optimalLatencyBw": 2 * fw,
                "isTensorParallelized": False,
            }
        )
        nodes[str(t)] = layer
        edges[str(t)] = [
            {"sourceId": i, "destId": i + 1, "communicationCost": boundary}
            for i in range(blocks + 1)
        ]
    return {
        "maxMemoryPerDevice": memory_gib * 2**30,
        "maxDevices": devices,
        "bandwidth": bandwidth_Bps,
        "mbsInBatch": microbatches,
        "nodes": nodes,
        "edges": edges,
        "activationRecomputation": recompute,
        "optimizerAlgorithm": optimizer,
        "fixedPP": 32,
        "fixedTMPC": 4,
        "fixedDP": 8,
        "numTransformerLayers": blocks,
    }
