"""The array tier of one model and microbatch: the bound tier's two placement tables (``ub``: a
proven throughput upper bound, ``lo``: an achieved throughput) for a block of architectures at
once (``phaze search tier``; docs/search.md, "The array tier").

Per tensor-parallel width traced and block of architectures: the operators' latencies
(:func:`phaze.estimate.stage.latency_arrays`), each layer's achieved makespan and lower bound
(:mod:`phaze.schedule.arrays`), then per cluster size the placement on both: the relaxed
placement on the lower bounds with the achieved makespans as DDP windows
(:func:`phaze.place.arrays.upper_times`: relaxed, solved exactly where the interval is wide; a
proven bound) and a concrete configuration and
split timed by the step model on the achieved makespans (:mod:`phaze.place.arrays`).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.estimate.model import achievable_hbm_Bps
from phaze.estimate.stage import latency_arrays
from phaze.io.atomic import atomic_path
from phaze.io.select import arch_ids
from phaze.io.tables import read_table, write_table
from phaze.place.arrays import achieved_times, upper_times
from phaze.place.columns import empty_columns
from phaze.place.inputs import trace_shapes
from phaze.place.megatron import Axes
from phaze.place.objective_megatron import megatron_stage_json, step_network
from phaze.place.settings import (
    PlaceSettings,
    arch_costmodel,
    hbm_capacity_bytes_of,
    link_parameters,
    network_for,
)
from phaze.schedule.arrays import layer_arrays, layer_values
from phaze.schedule.space import attention_seconds
from phaze.schedule.tables import load_op_graphs
from phaze.search.space_bounds import Trace, _groups
from phaze.step.model import StepConstants

#: architectures per block: the SGS keeps (archs × operators) arrays of a layer (~100 operators)
#: and the latency arrays of every operator of a trace, a few tens of MB at this size
BLOCK_ARCHS = 4096


class TierTrace(Trace):
    """A width's trace with its layer graphs as index arrays (:mod:`phaze.schedule.arrays`)."""

    def __init__(self, trace_dir: str, *args, **kwargs):
        super().__init__(trace_dir, *args, **kwargs)
        graphs = [g for g in load_op_graphs(trace_dir) if g.ids]
        self.arrays = [layer_arrays(g, p) for g, p in zip(graphs, self.plans)]

    def values(self, block: pd.DataFrame, config: dict) -> tuple[dict, dict]:
        """({(signature, pass): layer_values}, core attention per block signature)."""
        lat = latency_arrays(self.ops, block, config["costmodel"], config["place"])
        l1, la = lat["latency_1core_s"], lat["latency_allcores_s"]
        n_tc, n_vc = block["n_tc"].to_numpy(float), block["n_vc"].to_numpy(float)
        out = {
            (a.plan.signature, a.plan.pass_): layer_values(a, l1, la, n_tc, n_vc)
            for a in self.arrays
        }
        return out, attention_seconds(self.ops, l1, la)


def _rows(arch, base, time, settings, h, devices, got=None, peak=None) -> list[dict]:
    """Placement rows (the ``place`` table's columns) of the architectures ``arch`` with step
    times ``time``; ``got`` (an `Achieved`) fills the strategy columns of the achieved side, and
    its MFU on the architectures' peaks ``peak`` (FLOP/s; the step model's definition: model
    FLOPs of the global batch over devices × time × peak)."""
    out = []
    for a, name in enumerate(arch):
        row = {**base, "arch": name, "devices": int(devices), **empty_columns("")}
        row.update(empty_columns("expert_"))
        row["expert_feasible"] = False
        row["expert_reason"] = "not placed by the array tier"
        t = float(time[a])
        row["feasible"] = bool(np.isfinite(t))
        row["reason"] = "" if np.isfinite(t) else "does not fit in memory"
        if np.isfinite(t):
            row["throughput_seq_s"] = settings.global_batch / t
            row["time_per_batch_s"] = t
            if got is not None and got.config[h, a] >= 0:
                cfg = got.configs[got.config[h, a]]
                lay = cfg.placed.layout
                stages = got.splits[h][a]
                mem = got.memory(h, a)
                row.update(
                    pp=lay.pp,
                    tp=lay.tp,
                    dp=lay.dp,
                    ep=lay.ep,
                    etp=lay.expert_tp,
                    interleave=cfg.schedule.chunks,
                    recompute=cfg.recompute,
                    sequence_parallel=cfg.sequence_parallel,
                    distributed_optimizer=cfg.distributed_optimizer,
                    ddp=cfg.ddp,
                    stages=megatron_stage_json(
                        stages, cfg.schedule.chunks, lay.tp, cfg.placed.chain.blocks
                    ),
                    stage_mem_bytes=json.dumps([round(float(x)) for x in mem]),
                    devices_used=int(devices),
                )
                if peak is not None:
                    flops = cfg.placed.chain.model_flops_per_microbatch() * (
                        settings.global_batch / cfg.placed.chain.microbatch
                    )
                    row["mfu"] = flops / (int(devices) * t * float(peak[a]))
        out.append(row)
    return out


def tier_tables(args, config: dict) -> tuple[list[pd.DataFrame], list[pd.DataFrame], pd.DataFrame]:
    """(ub tables, lo tables: one per HBM size of config ``place.hbm_gib``, and the layers'
    values) of the architectures ``args.archs`` (None: the whole space)."""
    if len(args.tp) != len(args.trace_dirs):
        raise PhazeError("--tp and --trace-dirs need one trace directory per width")
    place = config["place"]
    if place["model"] != "megatron":
        raise PhazeError("the array tier places under place.model megatron only")
    shapes = trace_shapes(args.tp, args.ep, args.etp)
    space = read_table(args.space, "space", nonempty=True).reset_index(drop=True)
    want = arch_ids(args.archs)
    if want is not None:
        known = set(space["arch"])
        missing = [a for a in want if a not in known]
        if missing:
            raise PhazeError(f"--archs: {missing[0]} is not in {args.space}")
        space = space[space["arch"].isin(set(want))].reset_index(drop=True)
    model, b = args.model, int(args.microbatch)
    hbm_all = [hbm_capacity_bytes_of(h) for h in place["hbm_gib"]]
    settings = PlaceSettings.from_config(config, model, hbm_all[0], b)
    traces = [
        TierTrace(d, int(t), b, config["step"]["weight_bytes_per_param"], int(e), int(x))
        for (t, e, x), d in zip(shapes, args.trace_dirs)
    ]
    if len({tr.tables.blocks for tr in traces}) != 1:
        raise PhazeError(f"{model}: the traces of the widths have different block counts")
    base = {
        "model": model,
        "microbatch": b,
        "place_model": "megatron",
    }
    ub_rows = [[] for _ in hbm_all]
    lo_rows = [[] for _ in hbm_all]
    layer_rows = []
    for start in range(0, len(space), BLOCK_ARCHS):
        block = space.iloc[start : start + BLOCK_ARCHS].reset_index(drop=True)
        A = len(block)
        ub_chains, lo_chains = {}, {}
        for tr in traces:
            vals, att = tr.values(block, config)
            for (sig, ps), v in vals.items():
                layer_rows.append(
                    pd.DataFrame(
                        {
                            "arch": block["arch"].to_numpy(),
                            "tp": tr.tp,
                            "ep": tr.ep,
                            "signature": sig,
                            "pass": ps,
                            "makespan_s": v["makespan_s"],
                            "lower_bound_s": v["lower_bound_s"],
                        }
                    )
                )
            ub = {k: (v["lower_bound_s"], v["makespan_s"]) for k, v in vals.items()}
            lo = {k: (v["makespan_s"], v["makespan_s"]) for k, v in vals.items()}
            key = (tr.tp, b, tr.ep, tr.etp)
            ub_chains[key] = tr.space_chain(ub, att, A)
            lo_chains[key] = tr.space_chain(lo, att, A)
        for preset, idx in _groups(block):
            cm = arch_costmodel(config["costmodel"], preset)
            bw, lat = link_parameters(config["costmodel"], preset)
            consts = StepConstants.from_config(settings.step, float(achievable_hbm_Bps(cm)))
            ubc = {k: c.take(idx) for k, c in ub_chains.items()}
            loc = {k: c.take(idx) for k, c in lo_chains.items()}
            names = block["arch"].to_numpy()[idx]
            peaks = block["peak_flops"].to_numpy(float)[idx]
            for devices in place["devices"]:
                placed_net, _label = network_for(settings, preset, config["costmodel"], devices)
                net = step_network(placed_net, bw, lat, devices)
                axes = Axes.from_config(place)
                got = achieved_times(
                    loc, net, consts, devices, settings.global_batch, hbm_all, axes
                )
                upper = upper_times(
                    ubc, net, consts, devices, settings.global_batch, hbm_all, axes, got.time_s
                )
                for h, hbm in enumerate(hbm_all):
                    row = {**base, "hbm_capacity_bytes": int(hbm)}
                    ub_rows[h] += _rows(names, row, upper[h], settings, h, devices)
                    lo_rows[h] += _rows(names, row, got.time_s[h], settings, h, devices, got, peaks)
    layers = pd.concat(layer_rows, ignore_index=True) if layer_rows else pd.DataFrame()
    return [pd.DataFrame(r) for r in ub_rows], [pd.DataFrame(r) for r in lo_rows], layers


def run(args, config: dict) -> None:
    """``phaze search tier``: write the ub and lo tables (one per HBM size) and the layers'."""
    hbm = config["place"]["hbm_gib"]
    for flag, outs in (("--ub", args.ub), ("--lo", args.lo)):
        if len(outs) != len(hbm):
            raise PhazeError(f"{flag} needs one table per HBM size of place.hbm_gib ({len(hbm)})")
    ub, lo, layers = tier_tables(args, config)
    for df, path in zip(ub + lo, list(args.ub) + list(args.lo)):
        write_table(df, path, "place")
    if args.layers:
        with atomic_path(args.layers) as tmp:
            layers.to_parquet(tmp, index=False)
    print(
        f"phaze search tier: {args.model} b{args.microbatch}: "
        f"{layers['arch'].nunique() if len(layers) else 0} archs -> {', '.join(args.lo)}"
    )
