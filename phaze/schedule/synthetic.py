"""Synthetic GPT-block operator graphs and a stand-in roofline cost, for tests and benchmarks.

Not used by the workflow (which reads the trace and estimate stages' tables); it exists so the
scheduler can be tested and benchmarked on realistic layer shapes independently of those stages.
The forward graph follows a Megatron block with tensor parallelism t (separate Q/K/V projections,
attention, row-parallel output projection and FC2 followed by an all-reduce when t > 1, FC1 fused
with GeLU). The backward graph is derived mechanically: every forward op gets an input-gradient op
(edges reversed), every weight matmul also a weight-gradient matmul and, where it has a bias, a
bias-gradient reduction (both leaves), and a gradient-accumulation add where a forward tensor
fans out; Megatron's backward all-reduce sits at the column-parallel inputs.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SynOp:
    id: int
    name: str
    core: str            # tc | vc | fused
    flops: float
    bytes: float         # bytes moved to/from HBM (inputs + outputs + weights)
    elements: float      # element-wise work (vector ops)
    collective: bool = False


def gpt_block(hidden: int, heads: int, ffn: int, seq: int, microbatch: int = 1, tmp: int = 1,
              elem_bytes: int = 2):
    """(fwd_ops, fwd_edges, bwd_ops, bwd_edges) for one transformer block."""
    h, f, s, b, t = hidden, ffn, seq, microbatch, tmp
    tok = b * s
    hd = h // t          # this device's share of the hidden (attention) width
    ft = f // t
    nh = heads // t
    act = tok * h * elem_bytes
    ops: list[SynOp] = []
    edges: list[tuple[int, int]] = []

    def add(name, core, flops=0.0, nbytes=0.0, elements=0.0, collective=False, after=()):
        op = SynOp(len(ops), name, core, float(flops), float(nbytes), float(elements), collective)
        ops.append(op)
        for a in after:
            edges.append((a, op.id))
        return op.id

    def mm(name, m, n, k, after, fused=False, weight=True, batch=1):
        nbytes = batch * (m * k + m * n) * elem_bytes + (k * n * elem_bytes if weight else batch * k * n * elem_bytes)
        return add(name, "fused" if fused else "tc", 2.0 * m * n * k * batch, nbytes,
                   m * n * batch if fused else 0, after=after)

    ln1 = add("ln1", "vc", 0, 2 * act, 8 * tok * h)
    q = mm("q_proj", tok, hd, h, [ln1])
    k = mm("k_proj", tok, hd, h, [ln1])
    v = mm("v_proj", tok, hd, h, [ln1])
    sc = mm("scores", s, s, h // heads, [q, k], weight=False, batch=b * nh)
    sm = add("softmax", "vc", 0, 2 * b * nh * s * s * elem_bytes, 6 * b * nh * s * s, after=[sc])
    dr = add("attn_dropout", "vc", 0, 2 * b * nh * s * s * elem_bytes, b * nh * s * s, after=[sm])
    ctx = mm("context", s, h // heads, s, [dr, v], weight=False, batch=b * nh)
    proj = mm("out_proj", tok, h, hd, [ctx])
    last = proj
    if t > 1:
        last = add("all_reduce_attn", "vc", 0, act, 0, collective=True, after=[proj])
    res1 = add("residual1", "vc", 0, 3 * act, 2 * tok * h, after=[last])
    ln2 = add("ln2", "vc", 0, 2 * act, 8 * tok * h, after=[res1])
    fc1 = mm("fc1_gelu", tok, ft, h, [ln2], fused=True)
    fc2 = mm("fc2", tok, h, ft, [fc1])
    last = fc2
    if t > 1:
        last = add("all_reduce_mlp", "vc", 0, act, 0, collective=True, after=[fc2])
    add("residual2", "vc", 0, 3 * act, 2 * tok * h, after=[last, res1])
    fwd_ops, fwd_edges = ops, edges

    # ---- backward, derived from the forward graph ----
    bops: list[SynOp] = []
    bedges: list[tuple[int, int]] = []
    succ = {o.id: [d for (a, d) in fwd_edges if a == o.id] for o in fwd_ops}
    grad_of: dict[int, int] = {}   # fwd op id -> bwd op producing the gradient of its output

    def badd(name, core, flops=0.0, nbytes=0.0, elements=0.0, collective=False, after=()):
        op = SynOp(len(bops), name, core, float(flops), float(nbytes), float(elements), collective)
        bops.append(op)
        for a in after:
            bedges.append((a, op.id))
        return op.id

    weighted = {"q_proj", "k_proj", "v_proj", "out_proj", "fc1_gelu", "fc2", "ln1", "ln2"}
    column_parallel_inputs = {"ln1", "ln2"}   # Megatron: all-reduce of the grads entering them
    for o in reversed(fwd_ops):
        outs = [grad_of[d] for d in succ[o.id]]
        if len(outs) > 1:   # fan-out in forward: gradients add up
            acc = badd(f"grad_acc_{o.name}", "vc", 0, 3 * act, tok * h, after=outs)
            outs = [acc]
        if t > 1 and o.name in column_parallel_inputs and outs:
            outs = [badd(f"all_reduce_d{o.name}", "vc", 0, act, 0, collective=True, after=outs)]
        if o.core in ("tc", "fused"):
            dx = badd(f"d_{o.name}", o.core, o.flops, o.bytes, o.elements, after=outs)
            if o.name in weighted:
                badd(f"dW_{o.name}", "tc", o.flops, o.bytes, 0, after=outs)
                badd(f"db_{o.name}", "vc", 0, act, tok * (o.flops / (2 * tok * max(1, h))), after=outs)
            elif o.name in ("scores", "context"):   # batched matmul: grads of both operands
                dx2 = badd(f"d2_{o.name}", "tc", o.flops, o.bytes, 0, after=outs)
                # both operand gradients feed the producers: a zero-cost join stands for them
                grad_of[o.id] = badd(f"join_{o.name}", "vc", 0, 0, 0, after=[dx, dx2])
                continue
        elif o.collective:
            dx = badd(f"d_{o.name}", "vc", 0, 0, 0, after=outs)  # backward of fwd all-reduce: identity
        else:
            dx = badd(f"d_{o.name}", "vc", 0, o.bytes, o.elements * 1.5, after=outs)
            if o.name in weighted:
                badd(f"dW_{o.name}", "vc", 0, act, 2 * tok * h, after=outs)
        grad_of[o.id] = dx
    return fwd_ops, fwd_edges, bops, bedges


def standin_latency(op: SynOp, n_tc: int, n_vc: int, tc_width=128, tc_depth=128, vc_width=128,
                    freq_hz=1.05e9, hbm_bandwidth_Bps=1.2e12, link_bandwidth_Bps=4.5e10,
                    link_latency_s=1e-6, tmp: int = 1) -> tuple[float, float]:
    """(latency_1core_s, latency_allcores_s): a roofline stand-in for the estimate stage.

    One tensor core does 2·width·depth FLOP/cycle; a vector core width elements/cycle; HBM
    bandwidth is shared by the chip (one op alone gets all of it). Intra-op parallelism divides
    compute by the core count but pays a 5 % split overhead per doubling, so it does not always win.
    A ring all-reduce over t devices moves 2(t-1)/t of the bytes over one link.
    """
    import math
    if op.collective:
        lat = 2 * (tmp - 1) / tmp * op.bytes / link_bandwidth_Bps + 2 * (tmp - 1) * link_latency_s
        return lat, lat
    mem = op.bytes / hbm_bandwidth_Bps
    if op.core in ("tc", "fused"):
        n = n_tc
        comp1 = op.flops / (2.0 * tc_width * tc_depth * freq_hz)
        if op.core == "fused":
            comp1 += op.elements / (vc_width * freq_hz)
    else:
        n = n_vc
        comp1 = op.elements / (vc_width * freq_hz)
    if comp1 == 0 and mem == 0:
        return 0.0, 0.0
    overhead = 1.0 + 0.05 * math.log2(n) if n > 1 else 1.0
    return max(comp1, mem), max(comp1 / n * overhead, mem)
