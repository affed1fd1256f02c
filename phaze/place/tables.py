"""Our mode: from the trace, schedule and space tables to one placement row per architecture and
cluster size, in seconds and bytes.

Per architecture and tensor-parallel width t the layer chain comes from ``layers.parquet`` (one
row per layer of the whole model, per-device quantities for that t) with each layer's forward and
backward latency = its signature's schedule (``makespan_s``, or ``lower_bound_s`` for a throughput
upper bound). Our rules (see docs/place.md):
* link transfers cost ``link_latency_s + bytes / link_bandwidth_Bps`` (config ``costmodel``; an
  architecture's preset may override them) — unless a two-level network is configured (the
  preset's ``network:`` section, else config ``place.network``): then pipeline transfers and the
  data-parallel all-reduce are costed on the level they cross in Megatron's rank layout
  (phaze.place.network), and every stage holds t devices;
* parameter state per parameter: sgd 4 B, adam 16 B, i.e. ``state / bytes_per_element`` times
  ``param_bytes``;
* the data-parallel all-reduce is a ring over the largest stage's per-device gradients
  (``param_bytes``): ``2 (d−1)/d · P / bw + 2 (d−1) · latency``;
* the expert placement is evaluated with the same rules, reported on its own, never a filter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.place.dp import AllReduce, Placement, data_parallel_degrees, solve, time_placement
from phaze.place.graph import LayerGraph, StageRule, chain_graph
from phaze.place.network import PlaceNetwork

STATE_BYTES_PER_PARAM = {"sgd": 4.0, "adam": 16.0}
GIB = 2**30


@dataclass
class PlaceSettings:
    model: str
    hbm_bytes: int
    microbatch: int
    recompute: bool
    global_batch: int
    optimizer: str
    bytes_per_element: int
    dp_must_divide_batch: bool
    dp_must_divide_devices: bool
    expert: dict | None  # {"pp", "dp", "tp"} or None
    network: dict | None  # config place.network (two levels) or None = flat link
    preset_networks: bool  # a preset's own network: section wins for its architecture
    scatter_gather: bool  # Megatron's scatter/gather for inter-node stage transfers

    @classmethod
    def from_config(
        cls, place: dict, model: str, hbm_bytes: int, microbatch: int, recompute: bool
    ) -> PlaceSettings:
        """The settings of one placement job: the outer axes given, the rest from the validated
        config section ``place`` (phaze.config.load_config fills its defaults)."""
        return cls(
            model=model,
            hbm_bytes=int(hbm_bytes),
            microbatch=int(microbatch),
            recompute=bool(recompute),
            global_batch=place["global_batch"],
            optimizer=place["optimizer"],
            bytes_per_element=place["bytes_per_element"],
            dp_must_divide_batch=place["dp_must_divide_batch"],
            dp_must_divide_devices=place["dp_must_divide_devices"],
            expert=place["expert"].get(model),
            network=place["network"],
            preset_networks=place["preset_networks"],
            scatter_gather=place["scatter_gather"],
        )

    @property
    def microbatches(self) -> int:
        if self.global_batch % self.microbatch:
            raise PhazeError(
                f"global batch {self.global_batch} is not a multiple of the "
                f"microbatch size {self.microbatch}"
            )
        return self.global_batch // self.microbatch

    @property
    def param_state_factor(self) -> float:
        if self.optimizer not in STATE_BYTES_PER_PARAM:
            raise PhazeError(
                f"optimizer must be one of {sorted(STATE_BYTES_PER_PARAM)}, got {self.optimizer!r}"
            )
        return STATE_BYTES_PER_PARAM[self.optimizer] / self.bytes_per_element


def check_layers(layers: pd.DataFrame, where: str) -> pd.DataFrame:
    need = [
        "layer",
        "kind",
        "signature",
        "param_bytes",
        "activation_bytes",
        "stash_recompute_bytes",
        "boundary_bytes",
        "tensor_parallel",
    ]
    missing = [c for c in need if c not in layers.columns]
    if missing:
        raise PhazeError(f"{where}: layers table lacks columns {missing}")
    if "index" in layers.columns:
        layers = layers.sort_values("index", kind="stable")
    layers = layers.reset_index(drop=True)
    if len(layers) == 0:
        raise PhazeError(f"{where}: layers table is empty")
    for c in ["param_bytes", "activation_bytes", "stash_recompute_bytes", "boundary_bytes"]:
        if (layers[c] < 0).any():
            raise PhazeError(f"{where}: negative {c}")
    return layers


def layer_latencies(schedule: pd.DataFrame, column: str, where: str) -> dict:
    """{(arch, signature, pass): latency_s}"""
    if column not in schedule.columns:
        raise PhazeError(f"{where}: schedule table lacks column {column!r}")
    vals = schedule[column].to_numpy(dtype=float)
    if np.any(~np.isfinite(vals)) or np.any(vals < 0):
        bad = schedule.loc[~np.isfinite(vals) | (vals < 0), ["arch", "signature", "pass"]].head(3)
        raise PhazeError(
            f"{where}: {column} must be finite and >= 0; e.g. {bad.to_dict('records')}"
        )
    return dict(zip(zip(schedule["arch"], schedule["signature"], schedule["pass"]), vals))


def arch_layer_graph(layers: pd.DataFrame, lookup: dict, arch: str, where: str) -> LayerGraph:
    fw, bw = [], []
    for sig in layers["signature"]:
        try:
            fw.append(lookup[(arch, sig, "fwd")])
            bw.append(lookup[(arch, sig, "bwd")])
        except KeyError as exc:
            raise PhazeError(
                f"{where}: no schedule for arch {arch} signature {sig} pass {exc.args[0][2]}"
            ) from None
    n = len(layers)
    ext = np.zeros(n)
    ext[0] = float(layers["stash_recompute_bytes"].iloc[0])  # the model input (token ids)
    return chain_graph(
        fw,
        bw,
        layers["param_bytes"],
        layers["activation_bytes"],
        layers["boundary_bytes"],
        layers["tensor_parallel"],
        ext_stash=ext,
        ids=list(layers["layer"]),
    )


def expert_stages(layers: pd.DataFrame, pp: int) -> list[list[int]]:
    """Blocks split as evenly as possible (the first stages take the extra block), the layers
    before the first block in the first stage, those after the last block in the last."""
    blocks = np.flatnonzero(layers["kind"].to_numpy() == "block")
    if len(blocks) == 0:
        raise PhazeError("the model has no layers of kind 'block'")
    if pp < 1 or pp > len(blocks):
        raise PhazeError(f"expert pipeline depth {pp} is not in 1..{len(blocks)} blocks")
    base, extra = divmod(len(blocks), pp)
    sizes = [base + (1 if i < extra else 0) for i in range(pp)]
    stages, start = [], 0
    for size in sizes:
        stages.append(blocks[start : start + size].tolist())
        start += size
    stages[0] = list(range(blocks[0])) + stages[0]
    stages[-1] = stages[-1] + list(range(blocks[-1] + 1, len(layers)))
    return stages


def model_flops_per_sequence(layers_by_t: dict[int, pd.DataFrame], microbatch: int) -> float:
    """Model FLOPs (forward + backward, no recompute) per sequence: from the t = 1 trace when
    present, else the smallest t's per-device FLOPs times t for tensor-parallel layers."""
    t = min(layers_by_t)
    layers = layers_by_t[t]
    if "fwd_flops" not in layers.columns or "bwd_flops" not in layers.columns:
        return math.nan
    per_layer = layers["fwd_flops"].to_numpy(float) + layers["bwd_flops"].to_numpy(float)
    per_layer = per_layer * np.where(layers["tensor_parallel"].to_numpy(bool), t, 1)
    return float(per_layer.sum()) / microbatch


def _stage_json(p: Placement, names: list[str]) -> str:
    return json.dumps(
        [
            {"first": names[s[0]], "last": names[s[-1]], "layers": len(s), "devices": int(a)}
            for s, a in zip(p.stages, p.devices_per_stage)
        ]
    )


def _result_columns(prefix: str, p: Placement | None, names, settings, devices, peak, flops_seq):
    if p is None:
        return {
            f"{prefix}throughput_seq_s": math.nan,
            f"{prefix}time_per_batch_s": math.nan,
            f"{prefix}mfu": math.nan,
            f"{prefix}pp": 0,
            f"{prefix}tp": 0,
            f"{prefix}dp": 0,
            f"{prefix}stages": "[]",
            f"{prefix}stage_mem_bytes": "[]",
            f"{prefix}devices_used": 0,
            f"{prefix}max_stage_load_s": math.nan,
            f"{prefix}allreduce_s": math.nan,
        }
    t = p.time_per_batch
    return {
        f"{prefix}throughput_seq_s": settings.global_batch / t,
        f"{prefix}time_per_batch_s": t,
        f"{prefix}mfu": flops_seq * settings.global_batch / (t * devices * peak),
        f"{prefix}pp": p.pp,
        f"{prefix}tp": p.t,
        f"{prefix}dp": p.d,
        f"{prefix}stages": _stage_json(p, names),
        f"{prefix}stage_mem_bytes": json.dumps([round(m) for m in p.stage_mem]),
        f"{prefix}devices_used": p.devices_used,
        f"{prefix}max_stage_load_s": p.max_load,
        # the data-parallel gradient all-reduce's share of the time per batch
        f"{prefix}allreduce_s": p.extra.get("allreduce_s", math.nan),
    }


def link_parameters(costmodel: dict, preset_name: str | None) -> tuple[float, float]:
    cm = dict(costmodel)
    if preset_name:
        from phaze.arch.presets import load_preset

        cm.update(load_preset(preset_name).get("costmodel") or {})
    try:
        bw, lat = float(cm["link_bandwidth_Bps"]), float(cm["link_latency_s"])
    except KeyError as exc:
        raise PhazeError(f"costmodel lacks {exc.args[0]}") from None
    if bw <= 0 or lat < 0:
        raise PhazeError("costmodel: link_bandwidth_Bps must be > 0 and link_latency_s >= 0")
    return bw, lat


def network_for(
    settings: PlaceSettings, preset_name: str | None
) -> tuple[PlaceNetwork | None, str]:
    """The network an architecture is placed on and its label for the output: the preset's
    ``network:`` section, else ``place.network``, else None (the flat costmodel link)."""
    if preset_name and settings.preset_networks:
        from phaze.arch.presets import load_preset

        net = load_preset(preset_name).get("network")
        if net is not None:
            return (
                PlaceNetwork.from_dict(
                    net, f"preset {preset_name} network", settings.scatter_gather
                ),
                f"preset:{preset_name}",
            )
    if settings.network is not None:
        return (
            PlaceNetwork.from_dict(
                settings.network, "config place.network", settings.scatter_gather
            ),
            "config",
        )
    return None, "flat"


def place_architectures(
    settings: PlaceSettings,
    layers_by_t: dict[int, pd.DataFrame],
    schedules_by_t: dict[int, pd.DataFrame],
    space: pd.DataFrame,
    costmodel: dict,
    devices_list: list[int],
    latency_column: str = "makespan_s",
) -> pd.DataFrame:
    """One row per architecture (those scheduled for every t) × cluster size."""
    layers_by_t = {t: check_layers(df, f"layers (t={t})") for t, df in layers_by_t.items()}
    lookups = {
        t: layer_latencies(df, latency_column, f"schedule (t={t})")
        for t, df in schedules_by_t.items()
    }
    arch_sets = [set(df["arch"]) for df in schedules_by_t.values()]
    common = set.intersection(*arch_sets)
    if set.union(*arch_sets) != common:
        odd = sorted(set.union(*arch_sets) - common)[:5]
        raise PhazeError(f"schedules of different t cover different architectures, e.g. {odd}")
    space = space[space["arch"].isin(common)]
    unknown = sorted(common - set(space["arch"]))
    if unknown:
        raise PhazeError(f"scheduled architectures missing from the space table: {unknown[:5]}")
    M = settings.microbatches
    flops_seq = model_flops_per_sequence(layers_by_t, settings.microbatch)
    names = {t: list(df["layer"]) for t, df in layers_by_t.items()}
    rows = []
    for _, arch_row in space.sort_values("arch").iterrows():
        arch = arch_row["arch"]
        preset = arch_row.get("preset") if "preset" in arch_row.index else None
        preset = preset if isinstance(preset, str) and preset else None
        bw, lat = link_parameters(costmodel, preset)
        net, net_label = network_for(settings, preset)
        graphs = {
            t: arch_layer_graph(layers_by_t[t], lookups[t], arch, f"t={t}") for t in layers_by_t
        }
        unplaceable = {t: net.width_reason(t) for t in graphs if net and net.width_reason(t)}
        peak = float(arch_row["peak_flops"])
        for devices in devices_list:
            rule = StageRule(
                bandwidth=bw,
                latency=lat,
                param_state_factor=settings.param_state_factor,
                recompute=settings.recompute,
                memory_capacity=float(settings.hbm_bytes),
                max_positions=int(devices),
            )
            ar = AllReduce(mode="max", bandwidth=bw, latency=lat, network=net)
            d_values = data_parallel_degrees(
                devices, M, settings.dp_must_divide_batch, settings.dp_must_divide_devices
            )
            best = solve(graphs, rule, devices, M, d_values, ar)
            reason = ""
            if best is None:
                reason = f"no placement fits in {settings.hbm_bytes / GIB:g} GiB per device on {devices} devices"
                if unplaceable:
                    reason += "; " + "; ".join(unplaceable.values())
            row = {
                "arch": arch,
                "model": settings.model,
                "devices": int(devices),
                "hbm_bytes": int(settings.hbm_bytes),
                "microbatch": settings.microbatch,
                "recompute": settings.recompute,
                "feasible": best is not None,
                "reason": reason,
                "network": net_label,
            }
            row.update(
                _result_columns(
                    "", best, names[best.t] if best else [], settings, devices, peak, flops_seq
                )
            )
            ep, reason = evaluate_expert(settings, layers_by_t, graphs, rule, ar, devices, M)
            row["expert_feasible"] = ep is not None
            row["expert_reason"] = reason
            row.update(
                _result_columns(
                    "expert_", ep, names[ep.t] if ep else [], settings, devices, peak, flops_seq
                )
            )
            rows.append(row)
    return pd.DataFrame(rows)


def evaluate_expert(settings, layers_by_t, graphs, rule, ar, devices, M):
    e = settings.expert
    if not e:
        return None, f"no expert placement configured for {settings.model}"
    pp, dp, tp = int(e["pp"]), int(e["dp"]), int(e["tp"])
    if tp not in graphs:
        return None, f"no trace for the expert's tensor-parallel width t={tp}"
    try:
        stages = expert_stages(layers_by_t[tp], pp)
    except PhazeError as exc:
        return None, str(exc)
    if pp * tp * dp > devices:
        return None, f"expert placement needs {pp * tp * dp} devices, more than {devices}"
    return time_placement(graphs[tp], rule, tp, stages, dp, devices, M, ar)


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
        "maxMemoryPerDevice": float(settings.hbm_bytes),
        "maxDevices": int(devices),
        "bandwidth": bw,
        "mbsInBatch": settings.microbatches,
        "nodes": nodes,
        "edges": edges,
        "activationRecomputation": settings.recompute,
        "optimizerAlgorithm": "Adam" if settings.optimizer == "adam" else "SGD",
        "fixedPP": int(e.get("pp", 1)),
        "fixedTMPC": int(e.get("tp", min(layers_by_t))),
        "fixedDP": int(e.get("dp", 1)),
        "numTransformerLayers": n_blocks,
    }
