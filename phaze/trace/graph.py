"""Turn recorded operators into the ops / edges tables of one layer (pure Python + pandas).

Per (layer, pass): operators get ids 0..n-1 in execution order; an edge joins a producer and a
consumer in the same layer and pass (tensors from other layers or from the forward pass are the
layer's inputs, not edges). Classification: ``matmul`` (ops torch.utils.flop_counter counts),
``collective`` (phaze::all_reduce, phaze::all_to_all), ``nop`` (allocation only), ``vector``
(everything else).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict

import pandas as pd

from phaze.trace.recorder import COLLECTIVE_OPS, NOP_OPS, RawOp

OP_COLUMNS = [
    "layer",
    "pass",
    "op",
    "aten",
    "kind",
    "m",
    "n",
    "k",
    "batch",
    "elements",
    "flops",
    "bytes_in",
    "bytes_out",
    "weight_bytes",
    "fused_into",
    "core",
    "collective",
    "group_size",
    "in_shapes",
    "out_shapes",
    "attention",
    "replicated",
    "moe_role",
    "expert",
]
#: the mixture-of-experts columns: in a layer's signature only when the layer has a MoE op, so a
#: dense layer's signature is what it was before they existed
MOE_COLUMNS = ("moe_role", "expert")
EDGE_COLUMNS = ["layer", "pass", "src", "dst", "bytes"]


def classify(op: RawOp) -> str:
    if op.aten in COLLECTIVE_OPS:
        return "collective"
    if op.flops > 0 or op.mnkb != (0, 0, 0, 0):
        return "matmul"
    if op.aten in NOP_OPS:
        return "nop"
    return "vector"


def _shapes(shapes) -> str:
    return ";".join("x".join(str(d) for d in s) if s else "scalar" for s in shapes)


def op_graph_rows(ops: list[RawOp], layer: str, fuse: bool) -> tuple[list[dict], list[dict]]:
    """ops and edges rows for one layer (both passes), ``layer`` column set to ``layer``."""
    op_rows, edge_rows = [], []
    for pass_ in ("fwd", "bwd"):
        mine = [o for o in ops if o.pass_ == pass_]
        local = {o.index: i for i, o in enumerate(mine)}
        edges: dict[tuple[int, int], int] = defaultdict(int)
        rows = []
        for i, o in enumerate(mine):
            kind = classify(o)
            m, n, k, batch = o.mnkb
            rows.append(
                {
                    "layer": layer,
                    "pass": pass_,
                    "op": i,
                    "aten": o.aten,
                    "kind": kind,
                    "m": m,
                    "n": n,
                    "k": k,
                    "batch": batch,
                    "elements": o.elements,
                    # matmuls: flop_counter's count; other ops: one operation per output element
                    "flops": o.flops
                    if kind == "matmul"
                    else float(o.elements if kind == "vector" else 0),
                    "bytes_in": sum(x.bytes for x in o.inputs),
                    "bytes_out": o.bytes_out,
                    "weight_bytes": sum(x.bytes for x in o.inputs if x.param is not None),
                    "fused_into": -1,
                    "core": "tc" if kind == "matmul" else "vc",
                    "collective": COLLECTIVE_OPS.get(o.aten, ""),
                    "group_size": o.group_size,
                    "in_shapes": _shapes(x.shape for x in o.inputs),
                    "out_shapes": _shapes(o.out_shapes),
                    "attention": o.attention,
                    "replicated": o.replicated,
                    "moe_role": o.moe_role,
                    "expert": o.expert,
                    "_pointwise": o.pointwise,
                }
            )
            for x in o.inputs:
                if x.src in local:
                    edges[(local[x.src], i)] += x.bytes
        if fuse:
            _fuse(rows, edges)
        for r in rows:
            del r["_pointwise"]
        op_rows += rows
        edge_rows += [
            {"layer": layer, "pass": pass_, "src": s, "dst": d, "bytes": b}
            for (s, d), b in sorted(edges.items())
        ]
    return op_rows, edge_rows


def _fuse(rows: list[dict], edges: dict[tuple[int, int], int]) -> None:
    """Mark each matmul whose output has exactly one consumer, an element-wise op, as fused with
    it (upstream fuses these pairs into one tensor-core task). Nothing is deleted: the consumer
    keeps its row with ``fused_into`` = the matmul's id, the matmul gets ``core = fused``."""
    consumers: dict[int, set[int]] = defaultdict(set)
    for s, d in edges:
        consumers[s].add(d)
    for r in rows:
        if r["kind"] != "matmul":
            continue
        outs = consumers.get(r["op"], set())
        if len(outs) != 1:
            continue
        c = rows[next(iter(outs))]
        if c["kind"] == "vector" and c["_pointwise"] and c["fused_into"] < 0:
            c["fused_into"] = r["op"]
            r["core"] = "fused"


def signature(op_rows: list[dict], edge_rows: list[dict], extra: dict | None = None) -> str:
    """Hash of a layer's op graph: every column except the layer name, plus the edges. Shapes are
    included, so the same block at another t or microbatch gets another signature."""
    moe = any(r["moe_role"] for r in op_rows)
    columns = [c for c in OP_COLUMNS if c != "layer" and (moe or c not in MOE_COLUMNS)]
    payload = {
        "ops": [[r[c] for c in columns] for r in op_rows],
        "edges": [[r[c] for c in EDGE_COLUMNS if c != "layer"] for r in edge_rows],
        "extra": extra or {},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def to_frames(op_rows: list[dict], edge_rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    ops = pd.DataFrame(
        op_rows,
        columns=OP_COLUMNS + (["signature"] if op_rows and "signature" in op_rows[0] else []),
    )
    edges = pd.DataFrame(
        edge_rows,
        columns=EDGE_COLUMNS + (["signature"] if edge_rows and "signature" in edge_rows[0] else []),
    )
    return ops, edges
