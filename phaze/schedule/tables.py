"""Build scheduling instances from the trace and estimate stages' tables.

One layer graph per (signature, pass) from ``ops.parquet``/``edges.parquet``: element-wise ops
fused into a matmul (``fused_into`` >= 0) are merged into it (the estimate stage charges their
compute to the matmul and gives them zero latency) and ``nop`` ops (allocations) are contracted,
their predecessors linked to their successors, so the instance holds only ops that take time.
Latencies per architecture come from ``latency.parquet``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.io import checks
from phaze.io.tables import read_table
from phaze.schedule.instance import CORE_TYPES, Instance, make_instance


@dataclass
class OpGraph:
    """The operator DAG of one layer signature and pass, as the scheduler sees it (fused and
    no-op operators contracted); the latencies come per architecture from the estimate stage."""

    signature: str
    pass_: str
    ids: list[int]  # op ids kept, in the instance's index order
    core: tuple[str, ...]
    edges: tuple[tuple[int, int], ...]  # over indices


def load_op_graphs(trace_dir: str | Path) -> list[OpGraph]:
    trace_dir = Path(trace_dir)
    ops = read_table(trace_dir / "ops.parquet", "ops")
    edges = read_table(trace_dir / "edges.parquet", "edges")
    for col in ("signature", "core", "fused_into"):
        if col not in ops.columns:
            raise PhazeError(
                f"{trace_dir}/ops.parquet lacks the column {col!r} the schedule stage needs"
            )
    if "signature" not in edges.columns:
        raise PhazeError(f"{trace_dir}/edges.parquet lacks the column 'signature'")
    bad = sorted(set(ops["core"]) - set(CORE_TYPES))
    if bad:
        raise PhazeError(f"{trace_dir}/ops.parquet: unknown core types {bad}")
    graphs = []
    egroups = {k: g for k, g in edges.groupby(["signature", "pass"], sort=False)}
    for (sig, ps), g in ops.groupby(["signature", "pass"], sort=True):
        e = egroups.get((sig, ps))
        pairs = list(zip(e["src"].astype(int), e["dst"].astype(int))) if e is not None else []
        graphs.append(_contract(sig, ps, g, pairs))
    if not graphs:
        raise PhazeError(f"{trace_dir}/ops.parquet has no ops")
    return graphs


def _contract(sig: str, ps: str, g: pd.DataFrame, pairs: list[tuple[int, int]]) -> OpGraph:
    fused = dict(zip(g["op"].astype(int), g["fused_into"].fillna(-1).astype(int)))
    kind = dict(zip(g["op"].astype(int), g["kind"]))
    core = dict(zip(g["op"].astype(int), g["core"]))
    rep = {o: (f if f >= 0 else o) for o, f in fused.items()}
    for o, f in fused.items():
        if f >= 0 and f not in fused:
            raise PhazeError(f"layer {sig} {ps}: op {o} is fused into unknown op {f}")
    succ: dict[int, set[int]] = {o: set() for o in rep.values()}
    for a, b in pairs:
        if a not in rep or b not in rep:
            raise PhazeError(f"layer {sig} {ps}: edge {a}->{b} names an unknown op")
        ra, rb = rep[a], rep[b]
        if ra != rb:
            succ[ra].add(rb)
    # contract nops: link every predecessor to every successor
    for o in [o for o in succ if kind[o] == "nop"]:
        preds = [p for p, s in succ.items() if o in s]
        for p in preds:
            succ[p].discard(o)
            succ[p] |= succ[o] - {p}
        del succ[o]
    if not succ:  # nothing that takes time
        return OpGraph(sig, ps, [], (), ())
    ops = [
        {"id": o, "core": core[o], "latency_1core_s": 1.0, "latency_allcores_s": 1.0}
        for o in sorted(succ)
    ]
    inst = make_instance(1, 1, ops, [(a, b) for a in succ for b in succ[a]])  # validates; orders
    return OpGraph(sig, ps, list(inst.ids), inst.core, inst.edges)


def op_latencies(lat: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """(arch, signature, pass) -> frame indexed by op."""
    for col in ("arch", "signature", "pass", "op", "latency_1core_s", "latency_allcores_s"):
        if col not in lat.columns:
            raise PhazeError(f"latency table lacks column {col!r}")
    return {k: g.set_index("op") for k, g in lat.groupby(["arch", "signature", "pass"], sort=False)}


def build_instance(
    graph: OpGraph, lat_rows: pd.DataFrame, n_tc: int, n_vc: int, where: str
) -> Instance:
    try:
        rows = lat_rows.loc[graph.ids]
    except KeyError as exc:
        raise PhazeError(f"{where}: latency table lacks ops {exc}") from exc
    l1 = rows["latency_1core_s"].to_numpy(np.float64)
    la = rows["latency_allcores_s"].to_numpy(np.float64)
    if not (np.isfinite(l1).all() and np.isfinite(la).all()) or (l1 < 0).any() or (la < 0).any():
        raise PhazeError(f"{where}: latencies must be finite and >= 0")
    if int(n_tc) < 1 or int(n_vc) < 1:
        raise PhazeError(f"{where}: core counts must be >= 1")
    return Instance(
        int(n_tc),
        int(n_vc),
        graph.core,
        tuple(l1.tolist()),
        tuple(la.tolist()),
        graph.edges,
        tuple(graph.ids),
    )


def instance_from_json(obj: dict) -> tuple[Instance, dict]:
    """The ``--instance`` format: n_tc, n_vc, ops [{id, core, latency_1core_s,
    latency_allcores_s}], edges [[src, dst]], optional time_limit_s, gap. Every value is checked
    (type, finite, range) before the instance is built."""
    if not isinstance(obj, dict):
        raise PhazeError("instance JSON must be an object")
    for key in ("n_tc", "n_vc", "ops"):
        if key not in obj:
            raise PhazeError(f"instance JSON lacks {key!r}")
    n_tc, n_vc = (checks.integer(obj[k], f"instance JSON: {k}", 1) for k in ("n_tc", "n_vc"))
    ops = []
    for op in checks.sequence(obj["ops"], "instance JSON: 'ops'"):
        checks.mapping(op, "instance JSON: an op")
        missing = [
            k for k in ("id", "core", "latency_1core_s", "latency_allcores_s") if k not in op
        ]
        if missing:
            raise PhazeError(f"op {op!r} lacks {missing[0]!r}")
        i = checks.integer(op["id"], "instance JSON: an op id")
        if not isinstance(op["core"], str):
            raise PhazeError(f"op {i}: core must be one of {CORE_TYPES}, got {op['core']!r}")
        lat = {
            k: checks.number(op[k], f"op {i}: {k}")
            for k in ("latency_1core_s", "latency_allcores_s")
        }
        ops.append({**op, "id": i, **lat})
    edges = []
    for e in checks.sequence(obj.get("edges", []), "instance JSON: 'edges'"):
        if not isinstance(e, list) or len(e) != 2:
            raise PhazeError(f"edge {e!r} is not a [src, dst] pair")
        edges.append(tuple(checks.integer(v, f"instance JSON: edge {e!r}") for v in e))
    inst = make_instance(n_tc, n_vc, ops, edges)
    if "gap" in obj:
        raise PhazeError("instance JSON: 'gap' was renamed: write 'mip_gap'")
    overrides = {
        k: checks.number(obj[k], f"instance JSON: {k}")
        for k in ("time_limit_s", "mip_gap")
        if k in obj
    }
    return inst, overrides
