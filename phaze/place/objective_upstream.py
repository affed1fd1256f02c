"""Phaze's own placement objective (``place.model: upstream``): phaze/place/dp.py per recompute
mode none / full of ``place.recompute``, the best one reported.

* link transfers cost ``link_latency_s + bytes / link_bandwidth_Bps`` — unless a two-level
  network is configured: then pipeline transfers and the data-parallel all-reduce are costed on
  the level they cross in Megatron's rank layout (phaze.place.network), and every stage holds t
  devices;
* parameter state per parameter: sgd 4 B, adam 16 B (``place.optimizer``), i.e.
  ``state / bytes_per_element`` times ``param_bytes``; a free optimizer step;
* the data-parallel all-reduce is a ring over the largest stage's per-device gradients
  (``param_bytes``): ``2 (d−1)/d · P / bw + 2 (d−1) · latency``.

It places the ep = 1 traces (a mixture-of-experts model with every expert on a rank). The expert
placement (config ``place.expert``: pp, dp, tp) is priced by the same objective, reported on its
own, never a filter.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.network import HierarchicalNetwork
from phaze.place.columns import AXIS_DEFAULTS, empty_columns
from phaze.place.dp import AllReduce, Placement, data_parallel_degrees, solve, time_placement
from phaze.place.graph import LayerGraph, StageRule, chain_graph
from phaze.place.inputs import PlaceInputs
from phaze.place.network import PlaceNetwork
from phaze.place.settings import PlaceSettings, link_parameters, network_for
from phaze.units import GIB


class UpstreamObjective:
    """`phaze.place.objective.Objective` for ``place.model: upstream``."""

    def __init__(self, settings: PlaceSettings, inputs: PlaceInputs) -> None:
        dense = {t: df for (t, ep, etp), df in inputs.layers.items() if ep == 1 and etp == t}
        if not dense:
            raise PhazeError("place.model upstream places the ep = 1 traces; none was given")
        self.settings = settings
        self.layers_by_t = dense
        self.lookups = {t: inputs.lookups[(t, 1, t)] for t in dense}
        self.flops_seq = model_flops_per_sequence(dense, settings.microbatch)
        self.names = {t: list(df["layer"]) for t, df in dense.items()}

    def rows(self, arch_row, preset, costmodel, devices_list):
        """Phaze's objective (phaze/place/dp.py), the best of the recompute modes none / full."""
        arch = arch_row["arch"]
        settings, layers_by_t, lookups = self.settings, self.layers_by_t, self.lookups
        flops_seq, names = self.flops_seq, self.names
        M = settings.microbatches
        bw, lat = link_parameters(costmodel, preset)
        net, net_label = upstream_network(settings, preset, costmodel, max(devices_list))
        graphs = {
            t: arch_layer_graph(layers_by_t[t], lookups[t], arch, f"t={t}") for t in layers_by_t
        }
        unplaceable = {t: net.width_reason(t) for t in graphs if net and net.width_reason(t)}
        peak = float(arch_row["peak_flops"])
        for devices in devices_list:
            ar = AllReduce(mode="max", bandwidth=bw, latency=lat, network=net)
            d_values = data_parallel_degrees(
                devices, M, settings.dp_must_divide_batch, settings.dp_must_divide_devices
            )
            best = expert = None
            expert_reason = ""
            for mode in settings.upstream_recompute:
                rule = StageRule(
                    bandwidth=bw,
                    latency=lat,
                    param_state_factor=settings.param_state_factor,
                    recompute=mode == "full",
                    hbm_capacity_bytes=float(settings.hbm_capacity_bytes),
                    max_positions=int(devices),
                )
                p = solve(graphs, rule, devices, M, d_values, ar)
                if p is not None and (best is None or p.time_per_batch < best[0].time_per_batch):
                    best = (p, mode)
                ep, why = evaluate_expert(settings, layers_by_t, graphs, rule, ar, devices, M)
                if ep is not None and (
                    expert is None or ep.time_per_batch < expert[0].time_per_batch
                ):
                    expert = (ep, mode)
                expert_reason = expert_reason or why
            reason = ""
            if best is None:
                reason = f"no placement fits in {settings.hbm_capacity_bytes / GIB:g} GiB per device on {devices} devices"
                if unplaceable:
                    reason += "; " + "; ".join(unplaceable.values())
            row = {"devices": int(devices), "feasible": best is not None, "reason": reason}
            row["network"] = net_label
            p, mode = best if best else (None, "none")
            row.update(
                result_columns(
                    "", p, names[p.t] if p else [], settings, devices, peak, flops_seq, mode
                )
            )
            ep, emode = expert if expert else (None, "none")
            row["expert_feasible"] = ep is not None
            row["expert_reason"] = "" if ep is not None else expert_reason
            row.update(
                result_columns(
                    "expert_",
                    ep,
                    names[ep.t] if ep else [],
                    settings,
                    devices,
                    peak,
                    flops_seq,
                    emode,
                )
            )
            yield row


def evaluate_expert(settings, layers_by_t, graphs, rule, ar, devices, M):
    """The expert placement under the upstream model: (Placement or None, reason)."""
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


def model_flops_per_sequence(layers_by_t: dict[int, pd.DataFrame], microbatch: int) -> float:
    """Model FLOPs per sequence, PaLM's convention (docs/step.md: three passes over every
    matmul, no recomputation): 3 × the forward matmul FLOPs, from the t = 1 trace when present,
    else the smallest t's per-rank FLOPs times t for tensor-parallel layers."""
    t = min(layers_by_t)
    layers = layers_by_t[t]
    if "fwd_matmul_flops" not in layers.columns:
        return math.nan
    per_layer = layers["fwd_matmul_flops"].to_numpy(float)
    per_layer = per_layer * np.where(layers["tensor_parallel"].to_numpy(bool), t, 1)
    return 3.0 * float(per_layer.sum()) / microbatch


def upstream_network(settings: PlaceSettings, preset_name, costmodel, devices):
    """The upstream model's network: Phaze's DP prices two-level networks only, so an
    architecture on a torus (tpuv4) is placed on its flat costmodel link (``flat:torus``)."""
    net, label = network_for(settings, preset_name, costmodel, devices)
    if net is None:
        return None, label
    if not isinstance(net, HierarchicalNetwork):
        return None, "flat:torus"
    return PlaceNetwork(net, settings.scatter_gather), label


def stage_json(p: Placement, names: list[str]) -> str:
    return json.dumps(
        [
            {"first": names[s[0]], "last": names[s[-1]], "layers": len(s), "devices": int(a)}
            for s, a in zip(p.stages, p.devices_per_stage)
        ]
    )


def result_columns(
    prefix: str, p: Placement | None, names, settings, devices, peak, flops_seq, recompute: str
):
    """Columns of an upstream-model placement (recompute `recompute`)."""
    if p is None:
        return empty_columns(prefix)
    t = p.time_per_batch
    return {
        f"{prefix}throughput_seq_s": settings.global_batch / t,
        f"{prefix}time_per_batch_s": t,
        f"{prefix}mfu": flops_seq * settings.global_batch / (t * devices * peak),
        f"{prefix}pp": p.pp,
        f"{prefix}tp": p.t,
        f"{prefix}dp": p.d,
        f"{prefix}ep": 1,  # the upstream model places ep = 1 traces (every expert on a rank)
        f"{prefix}etp": p.t,
        **{f"{prefix}{k}": v for k, v in AXIS_DEFAULTS.items()},
        f"{prefix}recompute": recompute,
        f"{prefix}stages": stage_json(p, names),
        f"{prefix}stage_mem_bytes": json.dumps([round(m) for m in p.stage_mem]),
        f"{prefix}devices_used": p.devices_used,
        f"{prefix}max_stage_load_s": p.max_load,
        # the data-parallel gradient all-reduce's share of the time per batch
        f"{prefix}allreduce_s": p.extra.get("allreduce_s", math.nan),
        f"{prefix}optimizer_s": 0.0,  # upstream's optimizer step is free
    }
