"""The step model's placement objective (``place.model: megatron``, the default): the step model of
docs/step.md (phaze/step), searched exactly by phaze/place/megatron.py over tp, ep, the pipeline
depth, the split of the blocks and the axes of config ``place`` (interleave, recompute,
sequence_parallel, distributed_optimizer, ddp); chains from the tables by phaze/place/chains.py;
every device used and microbatch·dp dividing the global batch. The network: the preset's
``network:`` section, else config ``place.network``, else one flat link
(``costmodel.link_bandwidth_Bps`` / ``link_latency_s``; a preset may override them). The expert
placement (config ``place.expert``) is priced at its best over the other axes, reported on its
own, never a filter.
"""

from __future__ import annotations

import json

from phaze.errors import PhazeError
from phaze.estimate.model import achievable_hbm_Bps
from phaze.network import HierarchicalNetwork, LinkLevel
from phaze.place.chains import ChainTables, attention_seconds
from phaze.place.columns import empty_columns
from phaze.place.inputs import PlaceInputs, layer_latencies, trace_label
from phaze.place.megatron import best_fixed, optimize
from phaze.place.settings import PlaceSettings, arch_costmodel, link_parameters, network_for
from phaze.step.model import StepConstants, price
from phaze.units import GIB


class MegatronObjective:
    """`phaze.place.objective.Objective` for ``place.model: megatron``."""

    def __init__(self, settings: PlaceSettings, inputs: PlaceInputs) -> None:
        """What every architecture of a job shares: the chain tables per (tp, ep, etp), core
        attention's op latencies (selective recomputation), the DDP windows of a bound tier."""
        ops, lats = inputs.ops, inputs.latencies
        if "selective" in settings.axes.recompute and not (ops and lats):
            raise PhazeError(
                "selective recomputation needs the traces' ops and the operators' latencies of "
                "every tp (--latencies); or leave selective out of place.recompute"
            )
        self.settings = settings
        self.shared = {}  # `phaze.place.megatron.Setting`s: what the architectures share
        self.lookups = inputs.lookups
        self.tables = {
            (t, ep, etp): ChainTables(
                inputs.layers[(t, ep, etp)],
                ops.get((t, ep, etp)) if ops else None,
                t,
                settings.microbatch,
                settings.step["weight_bytes_per_param"],
                trace_label((t, ep, etp)),
                ep,
                etp,
            )
            for t, ep, etp in inputs.layers
        }
        self.attention = None
        if "selective" in settings.axes.recompute:
            self.attention = {k: attention_seconds(ops[k], lats[k]) for k in inputs.layers}
        self.windows = None
        if (
            inputs.latency_column != "makespan_s"
        ):  # a bound: the achievable times hide the reduction
            self.windows = {
                k: layer_latencies(df, "makespan_s", f"schedule ({trace_label(k)})")
                for k, df in inputs.schedules.items()
            }

    def rows(self, arch_row, preset, costmodel, devices_list):
        """The step model (docs/step.md), searched exactly by phaze/place/megatron.py."""
        settings = self.settings
        arch, b = arch_row["arch"], settings.microbatch
        tables, attention, windows = self.tables, self.attention, self.windows
        chains = {}
        for k, table in tables.items():
            t, ep, etp = k
            got = table.chains(
                arch,
                self.lookups[k],
                attention[k] if attention else None,
                windows[k] if windows else None,
            )
            for sp, chain in got.items():
                chains[(t, b, sp, ep, etp)] = chain
        blocks = next(iter(tables.values())).blocks
        cm = arch_costmodel(costmodel, preset)
        bw, lat = link_parameters(costmodel, preset)
        consts = StepConstants.from_config(settings.step, float(achievable_hbm_Bps(cm)))
        peak = float(arch_row["peak_flops"])
        hbm = float(settings.hbm_capacity_bytes)
        for devices in devices_list:
            placed_net, net_label = network_for(settings, preset, costmodel, devices)
            net = step_network(placed_net, bw, lat, devices)
            # what the search and the expert placement are priced on
            on = (chains, net, consts, devices, settings.global_batch, hbm, settings.axes)
            found = optimize(*on, self.shared)
            row = {"devices": int(devices), "feasible": found.strategy is not None, "reason": ""}
            row["network"] = net_label
            priced = None
            if found.strategy is not None:
                s = found.strategy
                priced = price(
                    chains[(s.tp, b, s.sequence_parallel, s.ep, s.expert_tp)],
                    s,
                    net,
                    consts,
                    peak,
                    hbm,
                )
            else:
                skipped = "; ".join(f"{r} ({n})" for r, n in sorted(found.skipped.items()))
                row["reason"] = (
                    f"no placement fits in {settings.hbm_capacity_bytes / GIB:g} GiB per device on "
                    f"{devices} devices" + (f"; skipped: {skipped}" if skipped else "")
                )
            row.update(megatron_columns("", found.strategy, priced, settings, blocks))
            e = settings.expert
            es, epriced, ereason = None, None, ""
            e_ep = int((e or {}).get("ep", 1))
            e_etp = int((e or {}).get("etp") or (e or {}).get("tp", 1))
            if not e:
                ereason = f"no expert placement configured for {settings.model}"
            elif (int(e["tp"]), e_ep, e_etp) not in tables:
                ereason = (
                    f"no trace for the expert's tensor-parallel width t={e['tp']}"
                    + (f" at expert-parallel size {e_ep}" if e_ep > 1 else "")
                    + (" with whole experts (etp = 1)" if e_etp != int(e["tp"]) else "")
                )
            elif int(e["pp"]) * int(e["dp"]) * int(e["tp"]) != devices:
                ereason = (
                    f"the step model uses every device: pp·dp·tp = "
                    f"{int(e['pp']) * int(e['dp']) * int(e['tp'])}, not {devices}"
                )
            else:
                split = expert_split(blocks, int(e["pp"]))
                es, _, ereason = best_fixed(
                    *on,
                    tp=int(e["tp"]),
                    pp=int(e["pp"]),
                    stages=split,
                    ep=e_ep,
                    etp=e_etp,
                )
                if es is not None:
                    key = (es.tp, b, es.sequence_parallel, es.ep, es.expert_tp)
                    epriced = price(chains[key], es, net, consts, peak, hbm)
            row["expert_feasible"] = es is not None
            row["expert_reason"] = ereason
            row.update(megatron_columns("expert_", es, epriced, settings, blocks))
            yield row


def step_network(net, bw: float, lat: float, devices: int):
    """The step model's network: the architecture's own (two-level or torus), or the flat link
    as one 'node' of all devices (every collective and send on that one level)."""
    if net is not None:
        return net
    return HierarchicalNetwork.flat(LinkLevel(bw, lat, 1.0), devices)


def expert_split(blocks: int, pp: int) -> tuple[int, ...]:
    """Blocks per stage of the expert placement: as evenly as possible, the first stages taking
    the extra block (as `expert_stages`)."""
    if pp < 1 or pp > blocks:
        raise PhazeError(f"expert pipeline depth {pp} is not in 1..{blocks} blocks")
    base, extra = divmod(blocks, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


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


def megatron_columns(prefix: str, strategy, priced: dict | None, settings, blocks: int) -> dict:
    if priced is None:
        return empty_columns(prefix)
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
        f"{prefix}etp": s.expert_tp,
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
