"""Tables mode: from the trace, schedule and space tables to one placement row per architecture
and cluster size, in seconds and bytes, under the placement model of config ``place.model``.

``megatron`` (the default): the step model of docs/step.md (phaze/step), searched exactly by
phaze/place/megatron.py over tp, the pipeline depth, the split of the blocks and the axes of
config ``place`` (interleave, recompute, sequence_parallel, distributed_optimizer, ddp); chains
from the tables by phaze/place/chains.py; every device used and microbatch·dp dividing the
global batch. The network: the preset's ``network:`` section, else config ``place.network``,
else one flat link (``costmodel.link_bandwidth_Bps`` / ``link_latency_s``; a preset may
override them).

``upstream``: Phaze's own objective (phaze/place/dp.py), per recompute mode none / full of
``place.recompute`` (the best one reported):
* link transfers cost ``link_latency_s + bytes / link_bandwidth_Bps`` — unless a two-level
  network is configured: then pipeline transfers and the data-parallel all-reduce are costed on
  the level they cross in Megatron's rank layout (phaze.place.network), and every stage holds t
  devices;
* parameter state per parameter: sgd 4 B, adam 16 B (``place.optimizer``), i.e.
  ``state / bytes_per_element`` times ``param_bytes``; a free optimizer step;
* the data-parallel all-reduce is a ring over the largest stage's per-device gradients
  (``param_bytes``): ``2 (d−1)/d · P / bw + 2 (d−1) · latency``.

The expert placement (config ``place.expert``: pp, dp, tp) is evaluated with the same model,
reported on its own, never a filter; under ``megatron`` at its best over the other axes.
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
from phaze.place.megatron import Axes
from phaze.place.network import PlaceNetwork

STATE_BYTES_PER_PARAM = {"sgd": 4.0, "adam": 16.0}
GIB = 2**30


def hbm_bytes_of(gib: float) -> int:
    """An HBM capacity in GiB (config ``place.hbm_gib``, ``--hbm-gib``) in bytes, as every
    placement table and the space bounds key it."""
    return round(float(gib) * GIB)


#: the recompute modes of the upstream model (its DP knows recompute on / off only)
UPSTREAM_RECOMPUTE = ("none", "full")


@dataclass
class PlaceSettings:
    model: str
    hbm_bytes: int
    microbatch: int
    global_batch: int
    place_model: str  # "megatron" or "upstream" (config place.model)
    axes: Axes  # the placement axes of config place (recompute modes among them)
    step: dict  # config section step (the step model's accounting)
    optimizer: str  # upstream: parameter state
    bytes_per_element: int  # upstream
    dp_must_divide_batch: bool  # upstream
    dp_must_divide_devices: bool  # upstream
    expert: dict | None  # {"pp", "dp", "tp"[, "ep"]} or None
    network: dict | None  # config place.network (two levels) or None = flat link
    preset_networks: bool  # a preset's own network: section wins for its architecture

    @classmethod
    def from_config(
        cls, config: dict, model: str, hbm_bytes: int, microbatch: int
    ) -> PlaceSettings:
        """The settings of one placement job: the outer axes given, the rest from the validated
        config (phaze.config.load_config fills its defaults)."""
        place = config["place"]
        return cls(
            model=model,
            hbm_bytes=int(hbm_bytes),
            microbatch=int(microbatch),
            global_batch=place["global_batch"],
            place_model=place["model"],
            axes=Axes(
                interleave=tuple(place["interleave"]),
                recompute=tuple(place["recompute"]),
                sequence_parallel=tuple(place["sequence_parallel"]),
                distributed_optimizer=tuple(place["distributed_optimizer"]),
                ddp=tuple(place["ddp"]),
            ),
            step=dict(config["step"]),
            optimizer=place["optimizer"],
            bytes_per_element=place["bytes_per_element"],
            dp_must_divide_batch=place["dp_must_divide_batch"],
            dp_must_divide_devices=place["dp_must_divide_devices"],
            expert=place["expert"].get(model),
            network=place["network"],
            preset_networks=place["preset_networks"],
        )

    @property
    def scatter_gather(self) -> bool:
        return bool(self.step["scatter_gather"])

    @property
    def upstream_recompute(self) -> list[str]:
        """The recompute modes the upstream model searches (selective is not one of its)."""
        modes = [m for m in self.axes.recompute if m in UPSTREAM_RECOMPUTE]
        if not modes:
            raise PhazeError(
                "place.model upstream knows recompute none and full only; "
                f"place.recompute lists {list(self.axes.recompute)}"
            )
        return modes

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


#: the placement axes of a row, with the value a model without that axis has
AXIS_DEFAULTS = {
    "interleave": 1,
    "recompute": "none",
    "sequence_parallel": False,
    "distributed_optimizer": False,
    "ddp": "after",
}


def _stage_json(p: Placement, names: list[str]) -> str:
    return json.dumps(
        [
            {"first": names[s[0]], "last": names[s[-1]], "layers": len(s), "devices": int(a)}
            for s, a in zip(p.stages, p.devices_per_stage)
        ]
    )


def _empty_columns(prefix: str) -> dict:
    return {
        f"{prefix}throughput_seq_s": math.nan,
        f"{prefix}time_per_batch_s": math.nan,
        f"{prefix}mfu": math.nan,
        f"{prefix}pp": 0,
        f"{prefix}tp": 0,
        f"{prefix}dp": 0,
        f"{prefix}ep": 0,
        **{f"{prefix}{k}": v for k, v in AXIS_DEFAULTS.items()},
        f"{prefix}stages": "[]",
        f"{prefix}stage_mem_bytes": "[]",
        f"{prefix}devices_used": 0,
        f"{prefix}max_stage_load_s": math.nan,
        f"{prefix}allreduce_s": math.nan,
        f"{prefix}optimizer_s": math.nan,
    }


def _result_columns(
    prefix: str, p: Placement | None, names, settings, devices, peak, flops_seq, recompute: str
):
    """Columns of an upstream-model placement (recompute `recompute`)."""
    if p is None:
        return _empty_columns(prefix)
    t = p.time_per_batch
    return {
        f"{prefix}throughput_seq_s": settings.global_batch / t,
        f"{prefix}time_per_batch_s": t,
        f"{prefix}mfu": flops_seq * settings.global_batch / (t * devices * peak),
        f"{prefix}pp": p.pp,
        f"{prefix}tp": p.t,
        f"{prefix}dp": p.d,
        f"{prefix}ep": 1,  # the upstream model places ep = 1 traces (every expert on a rank)
        **{f"{prefix}{k}": v for k, v in AXIS_DEFAULTS.items()},
        f"{prefix}recompute": recompute,
        f"{prefix}stages": _stage_json(p, names),
        f"{prefix}stage_mem_bytes": json.dumps([round(m) for m in p.stage_mem]),
        f"{prefix}devices_used": p.devices_used,
        f"{prefix}max_stage_load_s": p.max_load,
        # the data-parallel gradient all-reduce's share of the time per batch
        f"{prefix}allreduce_s": p.extra.get("allreduce_s", math.nan),
        f"{prefix}optimizer_s": 0.0,  # upstream's optimizer step is free
    }


def megatron_stage_json(stages, interleave: int, tp: int, blocks_total: int) -> str:
    """Per stage: its layers and blocks, and the first / last layer it holds in model order
    (chunk v of rank j is model chunk v·pp + j)."""
    pp = len(stages)
    start, pos = {}, 0
    for v in range(interleave):
        for j in range(pp):
            start[(v, j)] = pos
            pos += stages[j] // interleave
    if pos != blocks_total:
        raise AssertionError("stage sizes do not add up to the blocks")
    out = []
    for j, n in enumerate(stages):
        chunk = n // interleave
        first = "embedding" if j == 0 else (f"block.{start[(0, j)]}" if n else "head")
        if j == pp - 1:
            last = "head"
        else:
            last = f"block.{start[(interleave - 1, j)] + chunk - 1}" if n else "embedding"
        layers = n + (j == 0) + (j == pp - 1)
        out.append({"first": first, "last": last, "layers": layers, "blocks": n, "devices": tp})
    return json.dumps(out)


def _megatron_columns(prefix: str, strategy, priced: dict | None, settings, blocks: int) -> dict:
    if priced is None:
        return _empty_columns(prefix)
    s, t = strategy, priced["iteration_time_s"]
    stages = s.check_layers(blocks)
    return {
        f"{prefix}throughput_seq_s": settings.global_batch / t,
        f"{prefix}time_per_batch_s": t,
        f"{prefix}mfu": priced["mfu"],
        f"{prefix}pp": s.pp,
        f"{prefix}tp": s.tp,
        f"{prefix}dp": s.dp,
        f"{prefix}ep": s.ep,
        f"{prefix}interleave": s.interleave,
        f"{prefix}recompute": s.recompute,
        f"{prefix}sequence_parallel": s.sequence_parallel,
        f"{prefix}distributed_optimizer": s.distributed_optimizer,
        f"{prefix}ddp": s.ddp,
        f"{prefix}stages": megatron_stage_json(stages, s.interleave, s.tp, blocks),
        f"{prefix}stage_mem_bytes": json.dumps(
            [round(x["memory_bytes"]) for x in priced["per_stage"]]
        ),
        f"{prefix}devices_used": s.devices,
        f"{prefix}max_stage_load_s": max(x["per_microbatch_s"] for x in priced["per_stage"]),
        f"{prefix}allreduce_s": priced["breakdown"]["data_parallel_comm_s"],
        f"{prefix}optimizer_s": priced["breakdown"]["optimizer_s"],
    }


def arch_costmodel(costmodel: dict, preset_name: str | None) -> dict:
    """The config's costmodel with the architecture's preset overrides."""
    cm = dict(costmodel)
    if preset_name:
        from phaze.arch.presets import load_preset

        cm.update(load_preset(preset_name).get("costmodel") or {})
    return cm


def link_parameters(costmodel: dict, preset_name: str | None) -> tuple[float, float]:
    cm = arch_costmodel(costmodel, preset_name)
    try:
        bw, lat = float(cm["link_bandwidth_Bps"]), float(cm["link_latency_s"])
    except KeyError as exc:
        raise PhazeError(f"costmodel lacks {exc.args[0]}") from None
    if bw <= 0 or lat < 0:
        raise PhazeError("costmodel: link_bandwidth_Bps must be > 0 and link_latency_s >= 0")
    return bw, lat


def network_for(settings: PlaceSettings, preset_name: str | None, costmodel: dict, devices: int):
    """The network an architecture is placed on (a `phaze.network` network, None = the flat
    costmodel link) and its label for the output, for a job of `devices` devices, as
    `phaze.network.network_for_architecture` chooses it for every stage: the preset's
    ``network:`` section, else ``place.network``, else the flat link."""
    from phaze.arch.presets import load_preset
    from phaze.network import network_for_architecture

    preset_net = load_preset(preset_name).get("network") if preset_name else None
    net, label = network_for_architecture(
        preset_net,
        settings.network,
        settings.preset_networks,
        costmodel,
        devices,
        preset_name or "",
    )
    return (None if label == "flat" else net), label


def upstream_network(settings: PlaceSettings, preset_name, costmodel, devices):
    """The upstream model's network: Phaze's DP prices two-level networks only, so an
    architecture on a torus (tpuv4) is placed on its flat costmodel link (``flat:torus``)."""
    from phaze.network import HierarchicalNetwork

    net, label = network_for(settings, preset_name, costmodel, devices)
    if net is None:
        return None, label
    if not isinstance(net, HierarchicalNetwork):
        return None, "flat:torus"
    return PlaceNetwork(net, settings.scatter_gather), label


def _by_trace(tables: dict | None) -> dict | None:
    """A per-trace mapping keyed by tp (ep = 1) or by (tp, ep), keyed by (tp, ep)."""
    if tables is None:
        return None
    return {(k if isinstance(k, tuple) else (k, 1)): v for k, v in tables.items()}


def place_architectures(
    settings: PlaceSettings,
    layers_by_t: dict,
    schedules_by_t: dict,
    space: pd.DataFrame,
    costmodel: dict,
    devices_list: list[int],
    latency_column: str = "makespan_s",
    ops_by_t: dict | None = None,
    latencies_by_t: dict | None = None,
) -> pd.DataFrame:
    """One row per architecture (those scheduled for every trace) × cluster size. The tables are
    keyed by tensor-parallel width t, or by (t, ep) for the traces of a mixture-of-experts model at
    expert-parallel size ep (the megatron model searches ep; the upstream model places the ep = 1
    traces). `ops_by_t` (the traces' ops) and `latencies_by_t` (the operators' latencies) are
    needed when the megatron model searches selective recomputation."""
    layers_by_t, schedules_by_t = _by_trace(layers_by_t), _by_trace(schedules_by_t)
    ops_by_t, latencies_by_t = _by_trace(ops_by_t), _by_trace(latencies_by_t)
    layers_by_t = {
        k: check_layers(df, f"layers (t={k[0]}, ep={k[1]})") for k, df in layers_by_t.items()
    }
    lookups = {
        k: layer_latencies(df, latency_column, f"schedule (t={k[0]}, ep={k[1]})")
        for k, df in schedules_by_t.items()
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
    if settings.place_model == "upstream":
        dense = {t: df for (t, ep), df in layers_by_t.items() if ep == 1}
        if not dense:
            raise PhazeError("place.model upstream places the ep = 1 traces; none was given")
        context = _upstream_context(
            settings, dense, {t: lookups[(t, ep)] for t, ep in layers_by_t if ep == 1}
        )
        place = _upstream_rows
    else:
        context = _megatron_context(
            settings, layers_by_t, schedules_by_t, lookups, latency_column, ops_by_t, latencies_by_t
        )
        place = _megatron_rows
    rows = []
    for _, arch_row in space.sort_values("arch").iterrows():
        preset = arch_row.get("preset") if "preset" in arch_row.index else None
        preset = preset if isinstance(preset, str) and preset else None
        base = {
            "arch": arch_row["arch"],
            "model": settings.model,
            "hbm_bytes": int(settings.hbm_bytes),
            "microbatch": settings.microbatch,
            "place_model": settings.place_model,
        }
        for row in place(settings, context, arch_row, preset, costmodel, devices_list):
            rows.append({**base, **row})
    return pd.DataFrame(rows)


def _upstream_context(settings, layers_by_t, lookups) -> dict:
    return {
        "layers_by_t": layers_by_t,
        "lookups": lookups,
        "flops_seq": model_flops_per_sequence(layers_by_t, settings.microbatch),
        "names": {t: list(df["layer"]) for t, df in layers_by_t.items()},
    }


def _upstream_rows(settings, context, arch_row, preset, costmodel, devices_list):
    """Phaze's objective (phaze/place/dp.py), the best of the recompute modes none / full."""
    arch = arch_row["arch"]
    layers_by_t, lookups = context["layers_by_t"], context["lookups"]
    flops_seq, names = context["flops_seq"], context["names"]
    M = settings.microbatches
    bw, lat = link_parameters(costmodel, preset)
    net, net_label = upstream_network(settings, preset, costmodel, max(devices_list))
    graphs = {t: arch_layer_graph(layers_by_t[t], lookups[t], arch, f"t={t}") for t in layers_by_t}
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
                memory_capacity=float(settings.hbm_bytes),
                max_positions=int(devices),
            )
            p = solve(graphs, rule, devices, M, d_values, ar)
            if p is not None and (best is None or p.time_per_batch < best[0].time_per_batch):
                best = (p, mode)
            ep, why = evaluate_expert(settings, layers_by_t, graphs, rule, ar, devices, M)
            if ep is not None and (expert is None or ep.time_per_batch < expert[0].time_per_batch):
                expert = (ep, mode)
            expert_reason = expert_reason or why
        reason = ""
        if best is None:
            reason = f"no placement fits in {settings.hbm_bytes / GIB:g} GiB per device on {devices} devices"
            if unplaceable:
                reason += "; " + "; ".join(unplaceable.values())
        row = {"devices": int(devices), "feasible": best is not None, "reason": reason}
        row["network"] = net_label
        p, mode = best if best else (None, "none")
        row.update(
            _result_columns(
                "", p, names[p.t] if p else [], settings, devices, peak, flops_seq, mode
            )
        )
        ep, emode = expert if expert else (None, "none")
        row["expert_feasible"] = ep is not None
        row["expert_reason"] = "" if ep is not None else expert_reason
        row.update(
            _result_columns(
                "expert_", ep, names[ep.t] if ep else [], settings, devices, peak, flops_seq, emode
            )
        )
        yield row


def step_network(net, bw: float, lat: float, devices: int):
    """The step model's network: the architecture's own (two-level or torus), or the flat link
    as one 'node' of all devices (every collective and send on that one level)."""
    from phaze.network import HierarchicalNetwork, LinkLevel

    if net is not None:
        return net
    return HierarchicalNetwork.flat(LinkLevel(bw, lat, 1.0), devices)


def _megatron_context(
    settings, layers_by_t, schedules_by_t, lookups, latency_column, ops_by_t, latencies_by_t
) -> dict:
    """What every architecture of a megatron-model job shares: the chain tables per tp, core
    attention's op latencies (selective recomputation), the DDP windows of a bound tier."""
    from phaze.place.chains import ChainTables, attention_seconds

    if "selective" in settings.axes.recompute and not (ops_by_t and latencies_by_t):
        raise PhazeError(
            "selective recomputation needs the traces' ops and the operators' latencies of "
            "every tp (--latencies); or leave selective out of place.recompute"
        )
    tables = {
        (t, ep): ChainTables(
            layers_by_t[(t, ep)],
            ops_by_t.get((t, ep)) if ops_by_t else None,
            t,
            settings.microbatch,
            settings.step["weight_bytes_per_param"],
            f"tp={t}" + (f", ep={ep}" if ep > 1 else ""),
            ep,
        )
        for t, ep in layers_by_t
    }
    attention = None
    if "selective" in settings.axes.recompute:
        attention = {k: attention_seconds(ops_by_t[k], latencies_by_t[k]) for k in layers_by_t}
    windows = None
    if latency_column != "makespan_s":  # a bound: the achievable times hide the reduction
        windows = {
            k: layer_latencies(df, "makespan_s", f"schedule (t={k[0]}, ep={k[1]})")
            for k, df in schedules_by_t.items()
        }
    return {"tables": tables, "attention": attention, "windows": windows, "lookups": lookups}


def _megatron_rows(settings, context, arch_row, preset, costmodel, devices_list):
    """The step model (docs/step.md), searched exactly by phaze/place/megatron.py."""
    from phaze.estimate.model import achievable_hbm_Bps
    from phaze.place.megatron import best_fixed, optimize
    from phaze.step.model import StepConstants, price

    arch, b = arch_row["arch"], settings.microbatch
    tables, attention, windows = context["tables"], context["attention"], context["windows"]
    chains = {}
    for (t, ep), table in tables.items():
        got = table.chains(
            arch,
            context["lookups"][(t, ep)],
            attention[(t, ep)] if attention else None,
            windows[(t, ep)] if windows else None,
        )
        for sp, chain in got.items():
            chains[(t, b, sp, ep)] = chain
    blocks = next(iter(tables.values())).blocks
    cm = arch_costmodel(costmodel, preset)
    bw, lat = link_parameters(costmodel, preset)
    consts = StepConstants.from_config(settings.step, float(achievable_hbm_Bps(cm)))
    peak = float(arch_row["peak_flops"])
    hbm = float(settings.hbm_bytes)
    for devices in devices_list:
        placed_net, net_label = network_for(settings, preset, costmodel, devices)
        net = step_network(placed_net, bw, lat, devices)
        found = optimize(chains, net, consts, devices, settings.global_batch, hbm, settings.axes)
        row = {"devices": int(devices), "feasible": found.strategy is not None, "reason": ""}
        row["network"] = net_label
        priced = None
        if found.strategy is not None:
            s = found.strategy
            priced = price(chains[(s.tp, b, s.sequence_parallel, s.ep)], s, net, consts, peak, hbm)
        else:
            skipped = "; ".join(f"{r} ({n})" for r, n in sorted(found.skipped.items()))
            row["reason"] = (
                f"no placement fits in {settings.hbm_bytes / GIB:g} GiB per device on "
                f"{devices} devices" + (f"; skipped: {skipped}" if skipped else "")
            )
        row.update(_megatron_columns("", found.strategy, priced, settings, blocks))
        e = settings.expert
        es, epriced, ereason = None, None, ""
        e_ep = int((e or {}).get("ep", 1))
        if not e:
            ereason = f"no expert placement configured for {settings.model}"
        elif (int(e["tp"]), e_ep) not in tables:
            ereason = f"no trace for the expert's tensor-parallel width t={e['tp']}" + (
                f" at expert-parallel size {e_ep}" if e_ep > 1 else ""
            )
        elif int(e["pp"]) * int(e["dp"]) * int(e["tp"]) != devices:
            ereason = (
                f"the step model uses every device: pp·dp·tp = "
                f"{int(e['pp']) * int(e['dp']) * int(e['tp'])}, not {devices}"
            )
        else:
            split = expert_split(blocks, int(e["pp"]))
            es, _, ereason = best_fixed(
                chains,
                net,
                consts,
                devices,
                settings.global_batch,
                hbm,
                settings.axes,
                tp=int(e["tp"]),
                pp=int(e["pp"]),
                stages=split,
                ep=e_ep,
            )
            if es is not None:
                epriced = price(
                    chains[(es.tp, b, es.sequence_parallel, es.ep)], es, net, consts, peak, hbm
                )
        row["expert_feasible"] = es is not None
        row["expert_reason"] = ereason
        row.update(_megatron_columns("expert_", es, epriced, settings, blocks))
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


def expert_split(blocks: int, pp: int) -> tuple[int, ...]:
    """Blocks per stage of the expert placement: as evenly as possible, the first stages taking
    the extra block (as `expert_stages`)."""
    if pp < 1 or pp > blocks:
        raise PhazeError(f"expert pipeline depth {pp} is not in 1..{blocks} blocks")
    base, extra = divmod(blocks, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


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
        "activationRecomputation": "full" in settings.axes.recompute,
        "optimizerAlgorithm": "Adam" if settings.optimizer == "adam" else "SGD",
        "fixedPP": int(e.get("pp", 1)),
        "fixedTMPC": int(e.get("tp", min(layers_by_t))),
        "fixedDP": int(e.get("dp", 1)),
        "numTransformerLayers": n_blocks,
    }
