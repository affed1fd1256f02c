"""Per-layer work of one tensor-parallel rank on a GPU-like preset, from the SHARED trace
(``phaze.trace``) and the SHARED operator cost model (``phaze.estimate``).

A GPU runs one kernel at a time on all SMs (a single stream), so a layer's time is the sum of its
kernels' all-core latencies; the scheduling ILP is not used. What this module adds on top of the
two shared stages, each a statement about how GPU training runs rather than a tuned constant:

* **Kernel fusion** (``fuse_elementwise``): a chain of same-shape element-wise ops, each feeding
  only the next, runs as one kernel whose HBM traffic is only what enters the chain from outside
  and what its last op writes (Megatron's fused bias-GeLU, scale-mask-softmax, bias-dropout-add).
  Its compute is the sum of its ops' compute. Allocation-only producers (``empty_like``) are free.
* **Vocabulary parallelism** comes from the trace (vocab-parallel embedding and LM head, their
  forward / backward all-reduces); added here: the three b·s fp32 all-reduces of Megatron's
  vocab-parallel cross-entropy (max, sum of exp, target logit), which the trace leaves out, and
  the sequence-parallel form of the embedding/head collectives.
* **Sequence parallelism**: the ops outside the tensor-parallel region (the trace's
  ``replicated`` ops: layer norms, dropouts, residual adds, biases after row-parallel GEMMs, a
  mixture-of-experts router and token permutation) run on s/t tokens, so their time is divided by
  t, every all-reduce becomes a reduce-scatter + all-gather of the same tensor (Korthikanti et al.
  2022 §4.2.2), and an expert-parallel all-to-all moves the rank's s/t tokens (Megatron's
  dispatcher: all-to-all of the sequence shard, then an all-gather over the tensor-parallel
  group, which takes the place of the all-reduce's second half).
* **Core attention** (for selective recomputation): the trace's ``attention`` ops — QKᵀ, scale,
  mask, softmax, dropout, ×V. Config ``fidelity.attention`` says how it runs: ``eager`` (the
  trace's kernels, the scores through HBM) or ``fused`` (`fused_attention`: one
  FlashAttention-style kernel per pass, the scores on chip).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.estimate import matmul_cost, vector_cost
from phaze.estimate.model import achievable_hbm_Bps, tc_local_buffer_bytes
from phaze.estimate.stage import cycles_per_element
from phaze.precision import FORMATS, Format, gemm_core


# ---------------------------------------------------------------------------------------------
# what one layer costs on one rank, per microbatch
# ---------------------------------------------------------------------------------------------
@dataclass
class LayerWork:
    fwd_s: float = 0.0  # forward kernels (no communication)
    bwd_s: float = 0.0  # backward kernels
    attention_core_fwd_s: float = 0.0  # forward kernels of core attention (selective recompute)
    attention_core_bwd_s: float = 0.0  # backward kernels of core attention (context parallelism)
    replicated_s: float = 0.0  # fwd + bwd kernels outside the tensor-parallel region, on
    # all s tokens (what sequence parallelism divides by t)
    fwd_flops: float = 0.0  # matmul FLOPs
    bwd_flops: float = 0.0
    attention_fwd_flops: float = 0.0  # of the forward's, core attention's (QKᵀ, ×V)
    fwd_collectives: list = field(default_factory=list)  # (kind, bytes) in execution order
    bwd_collectives: list = field(default_factory=list)
    param_bytes: int = 0
    low_precision_params: float = 0.0  # weights of the GEMMs run in a low precision (FP8)
    low_precision_saved_bytes: float = 0.0  # saved-activation bytes those GEMMs' inputs save
    # less in that precision than in BF16 (with sequence parallelism: the rank's share)
    kernels_fwd: int = 0
    kernels_bwd: int = 0
    bound_s: dict = field(default_factory=dict)  # seconds per bound (compute/glb/hbm)
    fused_attention: bool = False  # core attention as one fused kernel per pass
    attention_saved_bytes: float = 0.0  # what fused attention saves for backward (its
    # softmax statistics) in place of the trace's core-attention tensors


# ---------------------------------------------------------------------------------------------
# device description for the shared cost model
# ---------------------------------------------------------------------------------------------
def gpu_core(preset: dict, cm: dict) -> dict:
    """The preset's core for the cost model; its local buffer is ``cm.tc_local_buffer_bytes``
    when set (as in the space table), else the cost model's sizing rule."""
    arch = preset["arch"]
    core = {k: arch[k] for k in ("tc_width", "tc_depth", "glb_bytes", "freq_hz", "vc_width")}
    if cm.get("tc_local_buffer_bytes") is not None:
        core["tc_local_buffer_bytes"] = float(cm["tc_local_buffer_bytes"])
    return core


def preset_costmodel(preset: dict, costmodel: dict) -> dict:
    """The config's costmodel with the preset's overrides (as the estimate stage applies them)."""
    cm = dict(costmodel)
    unknown = sorted(set(preset.get("costmodel") or {}) - set(cm))
    if unknown:
        raise PhazeError(f"preset overrides unknown costmodel keys {unknown}")
    cm.update(preset.get("costmodel") or {})
    return cm


# ---------------------------------------------------------------------------------------------
# kernels: fusion groups and their latencies
# ---------------------------------------------------------------------------------------------
def fusion_groups(ops: pd.DataFrame, edges: pd.DataFrame, fuse: bool) -> np.ndarray:
    """Group id per op row (ops of one layer+pass, row order = op id). Vector ops join their
    sole consumer's group when it is a vector op over the same number of elements."""
    n = len(ops)
    group = np.arange(n)
    if not fuse or n == 0:
        return group
    kind = ops["kind"].to_numpy()
    elements = ops["elements"].to_numpy()
    consumers: dict[int, list[int]] = {}
    for s, d in zip(edges["src"].to_numpy(), edges["dst"].to_numpy()):
        consumers.setdefault(int(s), []).append(int(d))
    # ops are in execution order, so a producer always precedes its consumer
    for u in range(n):
        outs = consumers.get(u, [])
        if kind[u] != "vector" or len(outs) != 1:
            continue
        v = outs[0]
        if kind[v] == "vector" and elements[v] == elements[u]:
            group[v] = group[u]
    return group


#: the GEMMs of a linear layer (fprop, dgrad, wgrad: two-dimensional); core attention's are
#: batched (``aten.bmm``)
LINEAR_GEMM_ATEN = frozenset({"aten.mm.default", "aten.addmm.default"})


def low_precision_gemms(ops: pd.DataFrame, fmt: Format) -> np.ndarray:
    """Which matmul rows of `ops` run in `fmt` (all False for BF16): Transformer Engine's FP8
    GEMMs are a transformer block's linear layers — its two-dimensional GEMMs, forward and both
    backward ones — but not a mixture-of-experts router; the embedding, the LM head and core
    attention's batched GEMMs stay BF16 (`phaze.precision`)."""
    if not fmt.low_precision or ops.empty:
        return np.zeros(len(ops), dtype=bool)
    return (
        (ops["kind"].to_numpy() == "matmul")
        & ops["aten"].isin(LINEAR_GEMM_ATEN).to_numpy()
        & (ops["moe_role"].to_numpy() != "router")
        & ops["layer"].astype(str).str.startswith("block").to_numpy()
    )


def kernel_latencies(
    ops: pd.DataFrame,
    edges: pd.DataFrame,
    core: dict,
    cm: dict,
    n_tc: int,
    n_vc: int,
    fuse: bool,
    fmt: Format = FORMATS["bf16"],
) -> pd.DataFrame:
    """One row per kernel of one layer+pass: ``group`` (first op id), ``latency_s``, ``bound``,
    ``ops`` (op ids). Matmuls via ``phaze.estimate.matmul_cost`` (those `low_precision_gemms`
    picks in format `fmt`: ``phaze.precision.gemm_core``), element-wise kernels via
    ``phaze.estimate.vector_cost``; collectives and allocations are not kernels here."""
    ops = ops.reset_index(drop=True)
    if not (ops["op"].to_numpy() == np.arange(len(ops))).all():
        raise PhazeError("ops of a layer+pass must be numbered 0..n-1 in execution order")
    group = fusion_groups(ops, edges, fuse)
    kind = ops["kind"].to_numpy()
    rows = []

    low = low_precision_gemms(ops, fmt)
    low_core, low_cm = gemm_core(core, cm, fmt, float(tc_local_buffer_bytes(core)))
    for mm, (c, m) in (
        (np.flatnonzero((kind == "matmul") & ~low), (core, cm)),
        (np.flatnonzero(low), (low_core, low_cm)),
    ):
        if not len(mm):
            continue
        sub = ops.iloc[mm]
        cost = matmul_cost(
            sub["m"].to_numpy(float),
            sub["n"].to_numpy(float),
            sub["k"].to_numpy(float),
            np.maximum(sub["batch"].to_numpy(float), 1.0),
            c,
            m,
            n_tc,
        )
        for j, i in enumerate(mm):
            rows.append((i, float(cost["latency_s"][j]), str(cost["bound"][j]), [i]))

    vec = np.flatnonzero(kind == "vector")
    if len(vec):
        sub = ops.iloc[vec]
        cpe = cycles_per_element(sub["aten"], cm)
        comp = vector_cost(sub["elements"].to_numpy(float), 0.0, cpe, core, cm, n_vc)["compute_s"]
        comp = dict(zip(vec, np.asarray(comp, dtype=float)))
        # bytes that stay on chip inside a fused kernel: edges between members of one group
        nop = set(np.flatnonzero(kind == "nop"))
        internal_in = np.zeros(len(ops))
        consumed_outside = np.zeros(len(ops), dtype=bool)
        has_consumer = np.zeros(len(ops), dtype=bool)
        for s, d, b in zip(
            edges["src"].to_numpy(), edges["dst"].to_numpy(), edges["bytes"].to_numpy()
        ):
            s, d = int(s), int(d)
            has_consumer[s] = True
            if group[s] == group[d] or s in nop:
                internal_in[d] += b
            else:
                consumed_outside[s] = True
        bytes_in = ops["bytes_in"].to_numpy(float)
        bytes_out = ops["bytes_out"].to_numpy(float)
        members: dict[int, list[int]] = {}
        for i in vec:
            members.setdefault(int(group[i]), []).append(int(i))
        for g, mem in members.items():
            moved = sum(max(bytes_in[i] - internal_in[i], 0.0) for i in mem)
            # an op's result leaves the kernel unless its only consumers are in the kernel
            moved += sum(bytes_out[i] for i in mem if consumed_outside[i] or not has_consumer[i])
            compute = sum(comp[i] for i in mem)
            cost = vector_cost(1.0, moved, 0.0, core, cm, n_vc)
            terms = {"compute": compute, "glb": float(cost["glb_s"]), "hbm": float(cost["hbm_s"])}
            bound = max(terms, key=terms.get)
            rows.append((g, terms[bound], bound, mem))
    out = pd.DataFrame(rows, columns=["group", "latency_s", "bound", "ops"])
    return out.sort_values("group").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# a whole layer
# ---------------------------------------------------------------------------------------------
def layer_works(
    ops: pd.DataFrame,
    edges: pd.DataFrame,
    *,
    core: dict,
    cm: dict,
    n_tc: int,
    n_vc: int,
    fuse: bool,
    tp: int,
    param_bytes: int,
    fmt: Format = FORMATS["bf16"],
    attention: str = "eager",
    causal: bool = True,
) -> dict[bool, LayerWork]:
    """Per-microbatch work of one layer on one tensor-parallel rank (ops/edges of that layer),
    without and (t > 1) with sequence parallelism: {sequence_parallel: LayerWork}. The kernels
    are costed once; sequence parallelism divides the replicated ones (the trace's ``replicated``
    ops) by t and swaps each all-reduce for a reduce-scatter + all-gather. Core attention = the
    kernels of the trace's ``attention`` ops. In a low-precision format `fmt` the linear layers'
    GEMMs run in it and its casts are added (`low_precision_casts`). With ``attention="fused"``
    core attention's kernels are replaced by one fused kernel per pass (`fused_attention`;
    `causal`: the model's attention is masked causally, a decoder's)."""
    if attention not in ATTENTION_MODES:
        raise PhazeError(f"unknown attention {attention!r}: choose one of {list(ATTENTION_MODES)}")
    variants = (False, True) if tp > 1 else (False,)
    works = {sp: LayerWork(param_bytes=int(param_bytes)) for sp in variants}
    fused = attention == "fused"
    fused_fwd = None  # the fused forward kernel's terms (`fused_attention`)
    casts = low_precision_casts(
        ops[ops["pass"] == "fwd"].sort_values("op").reset_index(drop=True),
        edges[edges["pass"] == "fwd"],
        fmt,
        tp,
    )
    for sp, work in works.items():
        work.low_precision_params = casts["params"]
        work.low_precision_saved_bytes = casts["saved_bytes"][sp]
    scores: set = set()  # the (heads, s, s) shapes of core attention's forward tensors
    for pass_ in ("fwd", "bwd"):
        o = ops[ops["pass"] == pass_].sort_values("op").reset_index(drop=True)
        e = edges[edges["pass"] == pass_]
        if o.empty:
            continue
        kernels = kernel_latencies(o, e, core, cm, n_tc, n_vc, fuse, fmt)
        vector = (o["kind"] == "vector").to_numpy(bool)
        replicated = o["replicated"].to_numpy(bool) & vector
        attention = o["attention"].to_numpy(bool)
        if pass_ == "fwd":
            for i in np.flatnonzero(attention):
                scores |= _score_shapes(o.at[i, "out_shapes"])
        else:  # the trace marks forward ops only: core attention's backward touches its scores
            attention = np.array(
                [
                    bool(scores & _score_shapes(f"{a};{b}"))
                    for a, b in zip(o["in_shapes"], o["out_shapes"])
                ],
                dtype=bool,
            )
        aten = o["aten"].to_numpy()
        flops = float(o.loc[o["kind"] == "matmul", "flops"].sum())
        attention_flops = float(o.loc[(o["kind"] == "matmul") & attention, "flops"].sum())
        fused_s, term = 0.0, None
        if fused and attention.any():
            if pass_ == "fwd":
                fused_fwd = fused_attention(o, e, attention, core, cm, n_tc, n_vc, causal)
                term = fused_fwd
            else:
                term = fused_attention_backward(fused_fwd, o, attention, core, cm, n_vc)
            fused_s = term["latency_s"]
            flops += term["flops"] - attention_flops
            attention_flops = term["flops"]
            # the trace's core-attention kernels give way to the fused one
            keep = [not all(attention[i] for i in k) for k in kernels["ops"]]
            kernels = kernels[keep].reset_index(drop=True)
        colls = [
            (c["collective"] or "all_reduce", collective_bytes(c), bool(c["replicated"]))
            for _, c in o[o["kind"] == "collective"].iterrows()
            if int(c["group_size"]) > 1 or c["collective"] == "all_to_all"
        ]
        for sp, work in works.items():
            total = attention_s = 0.0
            for _, k in kernels.iterrows():
                if all(aten[i] in LOSS_ATEN for i in k["ops"]):
                    continue  # costed as Megatron computes it (megatron_cross_entropy)
                lat = k["latency_s"]
                if all(replicated[i] for i in k["ops"]):
                    work.replicated_s += lat
                    if sp:
                        lat /= tp  # runs on s/t tokens
                total += lat
                work.bound_s[k["bound"]] = work.bound_s.get(k["bound"], 0.0) + lat
                if all(attention[i] for i in k["ops"]):
                    attention_s += lat
            if fused_s:
                total += fused_s
                attention_s += fused_s
                bound = term["bound"]
                work.bound_s[bound] = work.bound_s.get(bound, 0.0) + fused_s
                work.fused_attention = True
                work.attention_saved_bytes = fused_fwd["saved_bytes"]
            for moved in casts[pass_][sp]:  # HBM-bound cast(+transpose) kernels
                cost = vector_cost(1.0, moved, 0.0, core, cm, n_vc)
                terms = {"glb": float(cost["glb_s"]), "hbm": float(cost["hbm_s"])}
                terms["issue"] = float(cost["issue_s"])
                bound = max(terms, key=terms.get)
                total += terms[bound]
                work.bound_s[bound] = work.bound_s.get(bound, 0.0) + terms[bound]
            coll = [
                sequence_parallel_form(kind, size, tp, replicated) if sp else [(kind, size)]
                for kind, size, replicated in colls
            ]
            coll = [x for parts in coll for x in parts]
            n_kernels = len(kernels) + (1 if fused_s else 0)
            if pass_ == "fwd":
                work.fwd_s, work.attention_core_fwd_s, work.fwd_flops = total, attention_s, flops
                work.attention_fwd_flops = attention_flops
                work.fwd_collectives, work.kernels_fwd = coll, n_kernels
            else:
                work.bwd_s, work.bwd_flops, work.bwd_collectives = total, flops, coll
                work.attention_core_bwd_s = attention_s
                work.kernels_bwd = n_kernels
    return works


#: how core attention runs (config ``fidelity.attention``): the trace's eager kernels, or one
#: fused (FlashAttention-style) kernel per pass
ATTENTION_MODES = ("eager", "fused")
#: the fused kernel's tile of queries and of keys: FlashAttention-3 (Shah et al. 2024, arXiv
#: 2407.08608, §3 and its H100 kernels for head dimension 128) works on 128 × 128 blocks of the
#: score matrix; under a causal mask the blocks above the diagonal are skipped
FLASH_BLOCK = 128
#: backward matmul FLOPs of the fused kernel per forward matmul FLOP: FlashAttention-2 (Dao
#: 2023, arXiv 2307.08691, §3.2) runs 2 GEMMs forward (S = QKᵀ, O = PV) and 5 backward (S
#: recomputed, dV = PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀQ)
FUSED_BACKWARD_GEMMS = 5 / 2
#: HBM traffic of the fused backward per byte of the forward's: the forward reads Q, K, V and
#: writes O (four tensors of one shape); the backward reads Q, K, V, O, dO and writes dQ, dK, dV
#: (eight; FlashAttention-2, Algorithm 2)
FUSED_BACKWARD_TRAFFIC = 8 / 4


def causal_fraction(seq: int, block: int = FLASH_BLOCK) -> float:
    """The share of a causal s × s score matrix a block-tiled kernel computes: of the n(n+1)/2
    blocks on or below the diagonal (n = ⌈s / block⌉), out of n²; 1 for one block."""
    n = max(1, -(-int(seq) // int(block)))
    return (n + 1) / (2 * n)


def _vector_compute_s(ops: pd.DataFrame, vec: np.ndarray, core: dict, cm: dict, n_vc: int) -> float:
    """The compute time of the element-wise ops ``vec`` (positions in ``ops``) on the vector
    units, their HBM traffic left out (a fused kernel keeps their data on chip)."""
    if not len(vec):
        return 0.0
    vs = ops.iloc[vec]
    cpe = cycles_per_element(vs["aten"], cm)
    return float(
        np.sum(vector_cost(vs["elements"].to_numpy(float), 0.0, cpe, core, cm, n_vc)["compute_s"])
    )


def fused_attention(
    ops: pd.DataFrame,
    edges: pd.DataFrame,
    attention: np.ndarray,
    core: dict,
    cm: dict,
    n_tc: int,
    n_vc: int,
    causal: bool = True,
) -> dict:
    """Core attention's forward as one fused kernel (Transformer Engine's fused attention,
    FlashAttention-2/3): QKᵀ, the softmax and ×V per 128 × 128 block on chip. Its terms, from
    the trace's eager ops of the pass (`attention` marks them):

    * compute: the two batched GEMMs at the core's GEMM rate (``matmul_cost``'s compute term,
      their HBM terms dropped: the scores never leave the chip) plus the element-wise ops'
      compute (scale, mask, softmax, dropout over the scores, on the vector units), both times
      the block share a causal mask leaves (`causal_fraction`; 1 for an encoder, `causal`
      false);
    * HBM: only what enters the ops from outside (Q, K, V) and what leaves them (O);
    * ``saved_bytes``: the softmax statistics kept for backward, one fp32 log-sum-exp per query
      row and head (FlashAttention-2, Algorithm 1) — no s × s tensor;
    * ``flops``: the GEMMs' FLOPs times the causal share.

    The kernel takes max(compute, HBM, one kernel issue)."""
    idx = np.flatnonzero(attention)
    kind = ops["kind"].to_numpy()
    mm = idx[kind[idx] == "matmul"]
    vec = idx[kind[idx] == "vector"]
    sub = ops.iloc[mm]
    seq = int(sub["m"].max()) if len(sub) else 1
    share = causal_fraction(seq) if causal else 1.0
    gemm = matmul_cost(
        sub["m"].to_numpy(float),
        sub["n"].to_numpy(float),
        sub["k"].to_numpy(float),
        np.maximum(sub["batch"].to_numpy(float), 1.0),
        core,
        cm,
        n_tc,
    )
    gemm_s = float(np.sum(gemm["compute_s"]))
    vector_s = _vector_compute_s(ops, vec, core, cm, n_vc)
    inside = {int(i) for i in idx}
    moved = 0.0
    leaves = np.zeros(len(ops), dtype=bool)
    for s_, d, b in zip(
        edges["src"].to_numpy(), edges["dst"].to_numpy(), edges["bytes"].to_numpy()
    ):
        s_, d = int(s_), int(d)
        if d in inside and s_ not in inside:
            moved += float(b)  # Q, K, V (and a mask) read from HBM
        if s_ in inside and d not in inside:
            leaves[s_] = True
    moved += float(ops["bytes_out"].to_numpy(float)[np.flatnonzero(leaves)].sum())  # O
    hbm_s = float(vector_cost(1.0, moved, 0.0, core, cm, n_vc)["hbm_s"])
    compute_s = share * (gemm_s + vector_s)
    heads = float(np.max(np.maximum(sub["batch"].to_numpy(float), 1.0))) if len(sub) else 0.0
    return {
        "compute_s": compute_s,
        "vector_s": share * vector_s,
        "gemm_s": share * gemm_s,
        "hbm_s": hbm_s,
        "hbm_bytes": moved,
        "latency_s": max(compute_s, hbm_s, float(cm["op_issue_s"])),
        "bound": "compute" if compute_s >= hbm_s else "hbm",
        "flops": share * float(sub["flops"].sum()),
        "saved_bytes": 4.0 * heads * seq,
        "share": share,
    }


def fused_attention_backward(
    fwd: dict, ops: pd.DataFrame, attention: np.ndarray, core: dict, cm: dict, n_vc: int
) -> dict:
    """Core attention's backward as one fused kernel (FlashAttention-2, Algorithm 2): the
    scores recomputed from Q, K and the saved statistics, five GEMMs for the forward's two
    (`FUSED_BACKWARD_GEMMS`), the forward's element-wise work again (the recomputed softmax)
    and the eager backward's element-wise ops (the softmax and dropout gradients, marked by
    `attention` on this pass) on chip, times the causal share; HBM: Q, K, V, O, dO read and
    dQ, dK, dV written (`FUSED_BACKWARD_TRAFFIC` × the forward's)."""
    if fwd is None:
        raise PhazeError("a fused attention backward needs its forward pass")
    kind = ops["kind"].to_numpy()
    vector_s = _vector_compute_s(
        ops, np.flatnonzero(attention & (kind == "vector")), core, cm, n_vc
    )
    compute_s = FUSED_BACKWARD_GEMMS * fwd["gemm_s"] + fwd["vector_s"] + fwd["share"] * vector_s
    hbm_s = FUSED_BACKWARD_TRAFFIC * fwd["hbm_s"]
    return {
        "latency_s": max(compute_s, hbm_s, float(cm["op_issue_s"])),
        "bound": "compute" if compute_s >= hbm_s else "hbm",
        "flops": FUSED_BACKWARD_GEMMS * fwd["flops"],
    }


def low_precision_casts(ops: pd.DataFrame, edges: pd.DataFrame, fmt: Format, tp: int) -> dict:
    """What a low-precision format adds to a layer, from its forward ops and edges (one rank,
    one microbatch; `phaze.precision` has the sources):

    * ``fwd``: {sequence_parallel: [HBM bytes of each input cast]} — one cast(+transpose) kernel
      per distinct input of the `low_precision_gemms` (the op feeding it, per expert: Llama's
      q, k, v projections or an expert's gate and up projections share theirs), of
      ``fmt.cast_bytes_per_element`` per element; an input from outside the tensor-parallel
      region (a norm's output) is cast on the rank's s/t shard under sequence parallelism;
    * ``bwd``: {sequence_parallel: [HBM bytes of each output-gradient cast]} — one per GEMM, on
      its m × n output gradient;
    * ``params``: the weights of those GEMMs (k × n each; cast once per step, cached);
    * ``saved_bytes``: {sequence_parallel: bytes} the distinct inputs save less than in BF16
      (``2 − fmt.saved_input_bytes_per_element`` per element; the rank's share under sequence
      parallelism, as the trace splits what lies outside the region).
    BF16: nothing."""
    variants = (False, True) if tp > 1 else (False,)
    out = {
        "fwd": {sp: [] for sp in variants},
        "bwd": {sp: [] for sp in variants},
        "params": 0.0,
        "saved_bytes": {sp: 0.0 for sp in variants},
    }
    low = low_precision_gemms(ops, fmt)
    if not low.any():
        return out
    kind = ops["kind"].to_numpy()
    replicated = ops["replicated"].to_numpy(bool)
    per_element = fmt.cast_bytes_per_element
    saved_less = 2.0 - fmt.saved_input_bytes_per_element
    source = {}  # GEMM op -> the op producing its activation input
    for src, dst in zip(edges["src"].to_numpy(), edges["dst"].to_numpy()):
        if low[int(dst)] and kind[int(src)] != "nop":
            source[int(dst)] = int(src)
    seen = set()
    for i in np.flatnonzero(low):
        row = ops.iloc[i]
        m, n, k = float(row["m"]), float(row["n"]), float(row["k"])
        out["params"] += k * n
        for sp in variants:
            out["bwd"][sp].append(per_element * m * n)
        src = source.get(int(i), -1 - int(i))
        if (src, int(row["expert"])) in seen:
            continue
        seen.add((src, int(row["expert"])))
        outside = src >= 0 and bool(replicated[src])
        for sp in variants:
            share = 1.0 / tp if sp and outside else 1.0
            out["fwd"][sp].append(per_element * m * k * share)
            out["saved_bytes"][sp] += saved_less * m * k * share
    return out


def _score_shapes(shapes: str) -> set:
    """The (leading elements, s, s) form of each shape of ``shapes`` (the trace's ``a;b``
    notation, dims joined by ``x``) with at least three dims whose last two are equal: core
    attention's scores (batch × heads × s × s, or its bmm form). A backward op is core attention's
    when it touches a forward score shape: the batch × heads product tells them from an s × s
    weight gradient."""
    out = set()
    for shape in str(shapes).split(";"):
        dims = [int(x) for x in shape.split("x") if x.strip().isdigit()]
        if len(dims) >= 3 and dims[-1] == dims[-2]:
            out.add((int(np.prod(dims[:-2])), dims[-1]))
    return out


def collective_bytes(op) -> float:
    """The size a collective op is priced at: its input (an all-reduce's buffer); an all-to-all's
    larger side (what the rank sends or what it receives, which differ when the token
    distribution is imbalanced)."""
    if op["collective"] == "all_to_all":
        return float(max(op["bytes_in"], op["bytes_out"]))
    return float(op["bytes_in"])


def sequence_parallel_form(
    kind: str, size: float, tp: int, replicated: bool = True
) -> list[tuple[str, float]]:
    """A collective as sequence parallelism runs it: an all-reduce as a reduce-scatter and an
    all-gather of the same tensor, an all-to-all of the rank's 1/tp of the tokens (one traced
    on the block's replicated tokens; at etp = 1 it already carries the rank's shard)."""
    if kind == "all_to_all":
        return [("all_to_all", size / tp if replicated else size)]
    if kind == "all_reduce":
        return [("reduce_scatter", size), ("all_gather", size)]
    return [(kind, size)]


#: the trace's loss kernels (PyTorch's fused log-softmax + NLL), replaced by Megatron's
#: vocab-parallel cross-entropy
LOSS_ATEN = frozenset(
    {
        "aten._log_softmax.default",
        "aten.nll_loss_forward.default",
        "aten.nll_loss_backward.default",
        "aten._log_softmax_backward_data.default",
    }
)

#: HBM bytes per logit of Megatron-LM's vocab-parallel cross-entropy on fp32 logits
#: (megatron/mpu/cross_entropy.py; the logits are cast with ``.float()`` unless
#: --fp16-lm-cross-entropy): forward = cast fp16->fp32 (read 2, write 4) + max (read 4) +
#: subtract the max in place (read 4, write 4) + exp in place (4 + 4) + sum (4) + divide by the
#: sum in place, kept for backward (4 + 4); backward = scale the kept softmax by the incoming
#: gradient in place (4 + 4) + the cast's backward to fp16 (read 4, write 2). Per-token work
#: (target gather, log of the sums) is negligible.
CROSS_ENTROPY_BYTES_PER_LOGIT = {"fwd": 38.0, "bwd": 14.0}


def megatron_cross_entropy(head: LayerWork, ops: pd.DataFrame, cm: dict) -> None:
    """Add Megatron's fp32 vocab-parallel cross-entropy kernels to the head (HBM-bound), in place
    of the trace's loss kernels, over the logits of one rank (the log-softmax's elements)."""
    logits = ops.loc[(ops["pass"] == "fwd") & (ops["aten"] == "aten._log_softmax.default")]
    elements = float(logits["elements"].sum())
    bw = float(achievable_hbm_Bps(cm))
    for pass_, per_logit in CROSS_ENTROPY_BYTES_PER_LOGIT.items():
        seconds = elements * per_logit / bw
        if pass_ == "fwd":
            head.fwd_s += seconds
        else:
            head.bwd_s += seconds
        head.bound_s["hbm"] = head.bound_s.get("hbm", 0.0) + seconds


def megatron_edge_collectives(
    embedding: LayerWork,
    head: LayerWork,
    *,
    tp: int,
    microbatch: int,
    seq: int,
    sequence_parallel: bool,
) -> None:
    """Embedding/head communication as Megatron runs it, on top of the trace's vocab-parallel
    all-reduces (embedding output in forward, head-input gradient in backward)."""
    if tp == 1:
        return
    if sequence_parallel:
        # the embedding output is reduce-scattered into the sequence-parallel region; the head
        # all-gathers its input in forward and reduce-scatters the input gradient in backward
        embedding.fwd_collectives = [
            ("reduce_scatter", size) for _, size in embedding.fwd_collectives[::2]
        ]
        head.bwd_collectives = [("reduce_scatter", size) for _, size in head.bwd_collectives[::2]]
        head.fwd_collectives = [("all_gather", size) for _, size in head.bwd_collectives]
    # vocab-parallel cross-entropy: max, sum of exp, target logit (fp32 per token)
    head.fwd_collectives = head.fwd_collectives + [("all_reduce", float(microbatch * seq * 4))] * 3
