"""Upstream's placement instances (msr-fiddle/phaze, Solver/device_placement/device_placement.cpp):
read, solve with upstream's semantics, and write them from our tables.

Semantics reproduced (our own code; units are whatever the file uses — upstream mixed ms and s):
* nodes renumbered in upstream's topological order (its stack-based Kahn order);
* stage load: the finishing-time rule of `phaze.place.graph` with transfer = bytes / bandwidth,
  no latency; recompute re-runs the forward on every stage but the last;
* memory: 2 × parameters (+ 1 × parameters for ``Adam``) + all activations +
  (position from the end − 1) × stash, stash = activations, or with recompute the bytes on the
  stage's incoming edges; feasible positions capped at maxDevices;
* d = 1 … min(maxDevices, mbsInBatch), neither required to divide anything; devices per pipeline
  ⌊maxDevices / d⌋, microbatches per pipeline ⌈mbsInBatch / d⌉; a stage with a tensor-parallel
  node takes t devices, otherwise 1; at most min(maxDevices, nodes) stages;
* time per batch = max load · (microbatches per pipeline + stages − 1) + 4 (d − 1) P_first / (bandwidth · d);
* the fixed strategy: ⌈numTransformerLayers / p⌉ consecutive (renumbered) nodes per stage, every
  node numbered ≥ numTransformerLayers in the last stage, t devices per stage.
Where upstream aborts (memory of the fixed strategy, nothing feasible) we report ``null`` and a
reason instead; the searched result does not depend on the fixed strategy.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from phaze.errors import PhazeError
from phaze.io import checks
from phaze.place.dp import AllReduce, Placement, data_parallel_degrees, solve
from phaze.place.graph import LayerGraph, StageRule, _max_position, stage_costs
from phaze.place.inputs import check_layers, layer_latencies
from phaze.place.objective_upstream import arch_layer_graph
from phaze.place.settings import PlaceSettings, link_parameters

REQUIRED = (
    "maxMemoryPerDevice",
    "maxDevices",
    "bandwidth",
    "mbsInBatch",
    "nodes",
    "edges",
    "activationRecomputation",
    "optimizerAlgorithm",
    "fixedPP",
    "fixedTMPC",
    "fixedDP",
    "numTransformerLayers",
)
NODE_FIELDS = (
    "id",
    "parameterSize",
    "activationSize",
    "optimalLatencyFw",
    "optimalLatencyBw",
    "isTensorParallelized",
)
DEVICES_LIMIT = 10_000


def load_instance(path: str | Path) -> dict:
    """The instance in ``path``, checked and with every value in its canonical type."""
    path = Path(path)
    if not path.is_file():
        raise PhazeError(f"instance file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PhazeError(f"instance {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PhazeError(f"instance {path} must hold a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise PhazeError(f"instance {path} is missing fields {missing}")
    return check_instance(data)


def check_instance(ins: dict) -> dict:
    """Upstream's input checks, as errors naming the problem; returns the instance with every
    value checked (type, finite, range) and converted (ints, floats, bools)."""

    def bad(msg):
        raise PhazeError(f"instance: {msg}")

    out = dict(ins)
    out["maxDevices"] = checks.integer(ins["maxDevices"], "instance: maxDevices", 1, DEVICES_LIMIT)
    for key in ("bandwidth", "maxMemoryPerDevice"):
        out[key] = checks.number(ins[key], f"instance: {key}", 0.0, strict=True)
    out["mbsInBatch"] = checks.integer(ins["mbsInBatch"], "instance: mbsInBatch", 1)
    for key in ("fixedPP", "fixedTMPC", "fixedDP"):
        out[key] = checks.integer(ins[key], f"instance: {key}", 1)
    out["numTransformerLayers"] = checks.integer(
        ins["numTransformerLayers"], "instance: numTransformerLayers", 0
    )
    out["activationRecomputation"] = checks.boolean(
        ins["activationRecomputation"], "instance: activationRecomputation"
    )
    if ins["optimizerAlgorithm"] not in ("SGD", "Adam"):
        bad("optimizerAlgorithm must be SGD or Adam")
    nodes = checks.mapping(ins["nodes"], "instance: nodes")
    edges = checks.mapping(ins["edges"], "instance: edges")
    if not nodes:
        bad("nodes must map TMPC widths to node lists")
    if set(edges) != set(nodes):
        bad("nodes and edges must have the same TMPC widths")
    out["nodes"], out["edges"] = {}, {}
    ids_ref = None
    edges_ref = None
    for key in nodes:
        try:
            t = int(key)
        except ValueError:
            bad(f"TMPC width {key!r} is not an integer")
        if not 1 <= t <= DEVICES_LIMIT:
            bad(f"TMPC width {t} out of range")
        ids = []
        out["nodes"][key] = []
        for n in checks.sequence(nodes[key], f"instance: nodes[{key!r}]"):
            checks.mapping(n, f"instance: a node of width {t}")
            miss = [f for f in NODE_FIELDS if f not in n]
            if miss:
                bad(f"a node of width {t} lacks {miss}")
            node = {**n, "id": checks.integer(n["id"], f"instance: a node id of width {t}")}
            where = f"instance: node {node['id']} (t={t})"
            for f in ("parameterSize", "activationSize", "optimalLatencyFw", "optimalLatencyBw"):
                node[f] = checks.number(n[f], f"{where} {f}")
            node["isTensorParallelized"] = checks.boolean(
                n["isTensorParallelized"], f"{where} isTensorParallelized"
            )
            if t == 1 and node["isTensorParallelized"]:
                bad(f"node {node['id']} is tensor-parallel at TMPC width 1")
            ids.append(node["id"])
            out["nodes"][key].append(node)
        if not ids:
            bad(f"width {t} has no nodes")
        if len(set(ids)) != len(ids):
            bad(f"node ids are not unique at width {t}")
        if ids_ref is None:
            ids_ref = set(ids)
        elif set(ids) != ids_ref:
            bad("node ids differ between TMPC widths")
        pairs = []
        out["edges"][key] = []
        for e in checks.sequence(edges[key], f"instance: edges[{key!r}]"):
            checks.mapping(e, f"instance: an edge of width {t}")
            miss = [f for f in ("sourceId", "destId", "communicationCost") if f not in e]
            if miss:
                bad(f"an edge of width {t} lacks {miss}")
            s = checks.integer(e["sourceId"], f"instance: an edge's sourceId (t={t})")
            d = checks.integer(e["destId"], f"instance: an edge's destId (t={t})")
            c = checks.number(e["communicationCost"], f"instance: edge {s}->{d} communicationCost")
            if s not in ids_ref or d not in ids_ref:
                bad(f"edge {s}->{d} names an unknown node")
            if s == d:
                bad(f"self-loop on node {s}")
            pairs.append((s, d))
            out["edges"][key].append({**e, "sourceId": s, "destId": d, "communicationCost": c})
        if len(set(pairs)) != len(pairs):
            bad("parallel edges")
        if edges_ref is None:
            edges_ref = set(pairs)
        elif set(pairs) != edges_ref:
            bad("edges differ between TMPC widths")
    return out


def topological_order(node_ids: list[int], edges: list[tuple[int, int]]) -> list[int]:
    """Upstream's order: Kahn's algorithm with a stack (last pushed first), sources pushed in
    node-list order, successors in edge-list order."""
    indeg = {v: 0 for v in node_ids}
    out = {v: [] for v in node_ids}
    for s, d in edges:
        indeg[d] += 1
        out[s].append(d)
    stack = [v for v in node_ids if indeg[v] == 0]
    order = []
    while stack:
        v = stack.pop()
        order.append(v)
        for w in out[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    if len(order) != len(node_ids):
        raise PhazeError("instance: the layer graph is not a DAG")
    return order


def instance_graphs(ins: dict) -> tuple[dict[int, LayerGraph], list[int]]:
    """LayerGraph per t in upstream's renumbering; also the old id of each new number."""
    first = next(iter(ins["nodes"]))
    node_ids = [int(n["id"]) for n in ins["nodes"][first]]
    edge_pairs = [(int(e["sourceId"]), int(e["destId"])) for e in ins["edges"][first]]
    old = topological_order(node_ids, edge_pairs)
    new = {v: i for i, v in enumerate(old)}
    graphs = {}
    for key, nodes in ins["nodes"].items():
        t = int(key)
        by_new = sorted(nodes, key=lambda n: new[int(n["id"])])
        es = [
            (new[int(e["sourceId"])], new[int(e["destId"])], float(e["communicationCost"]))
            for e in ins["edges"][key]
        ]
        graphs[t] = LayerGraph(
            fw=np.array([float(n["optimalLatencyFw"]) for n in by_new]),
            bw=np.array([float(n["optimalLatencyBw"]) for n in by_new]),
            params=np.array([float(n["parameterSize"]) for n in by_new]),
            acts=np.array([float(n["activationSize"]) for n in by_new]),
            ext_stash=np.zeros(len(by_new)),
            tp=np.array([bool(n["isTensorParallelized"]) for n in by_new]),
            src=np.array([e[0] for e in es], dtype=np.int64),
            dst=np.array([e[1] for e in es], dtype=np.int64),
            edge_bytes=np.array([e[2] for e in es]),
            ids=old,
        )
    return graphs, old


def instance_rule(ins: dict) -> tuple[StageRule, AllReduce]:
    rule = StageRule(
        bandwidth=float(ins["bandwidth"]),
        latency=0.0,
        param_state_factor=3.0 if ins["optimizerAlgorithm"] == "Adam" else 2.0,
        recompute=bool(ins["activationRecomputation"]),
        hbm_capacity_bytes=float(ins["maxMemoryPerDevice"]),
        max_positions=int(ins["maxDevices"]),
        strict_upstream=True,
    )
    return rule, AllReduce(mode="first", bandwidth=float(ins["bandwidth"]))


def fixed_strategy_stages(ins: dict, n_nodes: int) -> list[list[int]]:
    """Upstream's manual partition, in renumbered ids."""
    p, n_tl = int(ins["fixedPP"]), int(ins["numTransformerLayers"])
    if p < 1:
        raise PhazeError("instance: fixedPP must be >= 1")
    per = -(-n_tl // p)
    stages = [[] for _ in range(p)]
    for i in range(min(n_tl, n_nodes)):
        if i // per < p:
            stages[i // per].append(i)
    stages[-1].extend(range(max(n_tl, 0), n_nodes))
    return stages


def solve_instance(ins: dict) -> dict:
    """Upstream's output JSON (stages with original node ids), plus `reason` / timing fields."""
    graphs, old = instance_graphs(ins)
    rule, allreduce = instance_rule(ins)
    devices, mbs = int(ins["maxDevices"]), int(ins["mbsInBatch"])
    d_values = data_parallel_degrees(devices, mbs, divide_batch=False, divide_devices=False)
    t0 = time.perf_counter()
    best = solve(graphs, rule, devices, mbs, d_values, allreduce)
    solve_s = time.perf_counter() - t0
    out: dict = {}
    if best is None:
        out.update(
            finalTimePerBatch=None,
            stages=[],
            dataParallelDegree=None,
            tensorParallelDegree=None,
            reason="no placement fits in maxMemoryPerDevice for any TMPC width",
        )
    else:
        out.update(
            finalTimePerBatch=best.time_per_batch,
            stages=[
                {"nodes": [old[v] for v in st], "devicesForStage": a}
                for st, a in zip(best.stages, best.devices_per_stage)
            ],
            dataParallelDegree=best.d,
            tensorParallelDegree=best.t,
        )
    fixed, reason = fixed_strategy(ins, graphs, rule, allreduce)
    out["fixedStrategyTimePerBatch"] = fixed.time_per_batch if fixed else None
    if fixed is None:
        out["fixedStrategyReason"] = reason
    out["solveSeconds"] = solve_s
    return out


def fixed_strategy(ins, graphs, rule, allreduce) -> tuple[Placement | None, str]:
    """Upstream's fixed (expert) strategy evaluated like its getTimePerBatchForResult: t devices
    for every stage, empty stages allowed (load 0), first stage's parameters synchronised."""
    t, d = int(ins["fixedTMPC"]), int(ins["fixedDP"])
    if t not in graphs:
        return None, f"fixedTMPC {t} has no graph in the instance"
    g = graphs[t]
    stages = fixed_strategy_stages(ins, g.n)
    devices, mbs = int(ins["maxDevices"]), int(ins["mbsInBatch"])
    pp = len(stages)
    where = np.full(g.n, -1)
    for i, st in enumerate(stages):
        where[st] = i
    if np.any(where < 0):
        return None, "fixed strategy leaves a node in no stage"
    if np.any(where[g.src] > where[g.dst]):
        return None, "fixed strategy stages are not contiguous (an edge goes backwards)"
    if not 1 <= d <= min(devices, mbs):
        return None, f"fixedDP {d} outside 1..min(maxDevices, mbsInBatch)"
    if pp * t * d > devices:
        return None, f"fixed strategy needs {pp * t * d} devices, more than maxDevices {devices}"
    loads, mems, params = [], [], []
    for i, st in enumerate(stages):
        pos = pp - i
        if not st:
            loads.append(0.0)
            mems.append(0.0)
            params.append(0.0)
            continue
        try:
            c = stage_costs(g, rule, np.asarray(st, dtype=np.int64))
        except PhazeError as exc:
            return None, str(exc)
        if (
            pos
            > _max_position(
                np.array([c[3]]), np.array([c[4]]), rule.hbm_capacity_bytes, rule.max_positions
            )[0]
        ):
            return None, (
                f"stage {i} (position {pos} from the end) needs "
                f"{c[3] + (pos - 1) * c[4]:.6g} > maxMemoryPerDevice"
            )
        loads.append(c[1] if (rule.recompute and pos > 1) else c[0])
        mems.append(c[3] + (pos - 1) * c[4])
        params.append(c[2])
    mp = -(-mbs // d)
    max_load = max(loads)
    tpb = max_load * (mp + pp - 1) + float(allreduce(np.array([d]), np.array([params[0]]))[0, 0])
    return Placement(
        t=t,
        d=d,
        stages=stages,
        devices_per_stage=[t] * pp,
        time_per_batch=tpb,
        max_load=max_load,
        stage_loads=loads,
        stage_mem=mems,
        stage_params=params,
        microbatches_per_pipeline=mp,
    ), ""


def dumps_result(out: dict) -> str:
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        return x

    return json.dumps({k: clean(v) for k, v in out.items()}, indent=2)


def export_instance(
    settings: PlaceSettings,
    layers_by_t,
    schedules_by_t,
    arch: str,
    costmodel: dict,
    preset: str | None,
    devices: int,
    latency_column: str = "makespan_s",
) -> dict:
    """Upstream's instance format from our tables for one architecture (seconds and bytes)."""
    bw, _ = link_parameters(costmodel, preset)
    nodes, edges = {}, {}
    n_blocks = None
    for t, layers in sorted(layers_by_t.items()):
        layers = check_layers(layers, f"layers (t={t})")
        lookup = layer_latencies(schedules_by_t[t], latency_column, f"schedule (t={t})")
        g = arch_layer_graph(layers, lookup, arch, f"t={t}")
        nodes[str(t)] = [
            {
                "id": i,
                "parameterSize": float(g.params[i]),
                "activationSize": float(g.acts[i]),
                "optimalLatencyFw": float(g.fw[i]),
                "optimalLatencyBw": float(g.bw[i]),
                "isTensorParallelized": bool(g.tp[i]),
            }
            for i in range(g.n)
        ]
        edges[str(t)] = [
            {"sourceId": int(s), "destId": int(d), "communicationCost": float(c)}
            for s, d, c in zip(g.src, g.dst, g.edge_bytes)
        ]
        n_blocks = int((layers["kind"] == "block").sum())
    e = settings.expert or {}
    return {
        "maxMemoryPerDevice": float(settings.hbm_capacity_bytes),
        "maxDevices": int(devices),
        "bandwidth": bw,
        "mbsInBatch": settings.microbatches,
        "nodes": nodes,
        "edges": edges,
        "activationRecomputation": "full" in settings.axes.recompute,
        "optimizerAlgorithm": "Adam" if settings.optimizer == "adam" else "SGD",
        "fixedPP": int(e.get("pp", 1)),
        "fixedTMPC": int(e.get("tp", min(layers_by_t))),
        "fixedDP": int(e.get("dp", 1)),
        "numTransformerLayers": n_blocks,
    }
