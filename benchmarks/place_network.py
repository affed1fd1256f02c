"""GPT-3 175B placed on 1,024 A100-80GB GPUs: one flat NVLink-speed link vs the DGX A100
two-level network (8 GPUs per node on NVLink, one 200 Gb/s InfiniBand NIC per GPU).

Per-layer latencies come from the shared trace and cost model the way the fidelity stage runs a
GPU preset (one kernel at a time on all SMs: the sum of the kernels' all-core latencies,
phaze.fidelity.evaluate.gpu_chains), plus the layer's tensor-parallel collectives on the
intra-node level (tensor parallelism stays inside a node in both runs, so both see the same layer
times). Then `phaze.place.tables.place_architectures` places the model twice on the a100-80gb
preset, under the upstream placement model (Phaze's objective, place.model: upstream):
`place.preset_networks: false` (the preset's flat costmodel link, 300 GB/s, 2 us) and true (its
`network:` section). Prints, per recompute setting, time per batch, throughput, MFU, the chosen
p / t / d, and the solve time (DP over t in 1, 2, 4, 8; traces excluded).

    .venv/bin/python benchmarks/place_network.py [--microbatch 1] [--devices 1024] [--hbm-gib 80]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from phaze.arch.presets import load_preset
from phaze.config import load_config
from phaze.fidelity.evaluate import gpu_chains, trace_for
from phaze.network import HierarchicalNetwork
from phaze.place.settings import PlaceSettings
from phaze.place.tables import place_architectures
from phaze.trace.models import get_model_spec
from phaze.units import GIB

PRESET = "a100-80gb"
ARCH = "a100"


def collective_s(net: HierarchicalNetwork, collectives, t: int) -> float:
    ranks = list(range(t))  # one tensor-parallel group, inside a node
    fn = {
        "all_reduce": net.all_reduce,
        "reduce_scatter": net.reduce_scatter,
        "all_gather": net.all_gather,
    }
    return sum(fn[kind](size, ranks) for kind, size in collectives) if t > 1 else 0.0


def tables_for(model: str, widths, microbatch: int, devices: int):
    cfg = load_config(None)
    spec = get_model_spec(model)
    preset = load_preset(PRESET)
    net = HierarchicalNetwork.from_preset(preset["network"])
    layers_by_t, sched_by_t = {}, {}
    for t in widths:
        chain = gpu_chains(spec, t, microbatch, spec.seq, preset, cfg)[False]
        layers = trace_for(spec, microbatch, t, spec.seq).layers.copy()
        rows = []
        for name, w in (("embedding", chain.first), ("block.0", chain.block), ("head", chain.last)):
            sig = layers.loc[layers["layer"] == name, "signature"].iloc[0]
            for pass_, comp, coll in (
                ("fwd", w.fwd_s, w.fwd_collectives),
                ("bwd", w.bwd_s, w.bwd_collectives),
            ):
                lat = comp + collective_s(net, coll, t)
                rows.append(
                    {
                        "arch": ARCH,
                        "signature": sig,
                        "pass": pass_,
                        "makespan_s": lat,
                        "lower_bound_s": lat,
                    }
                )
        layers_by_t[t] = layers
        sched_by_t[t] = pd.DataFrame(rows)
    arch = preset["arch"]
    peak = arch["n_tc"] * arch["tc_width"] * arch["tc_depth"] * 2 * arch["freq_hz"]
    space = pd.DataFrame([{"arch": ARCH, "peak_flops": peak, "preset": PRESET}])
    return layers_by_t, sched_by_t, space, cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--microbatch", type=int, default=1)
    ap.add_argument("--devices", type=int, default=1024)
    ap.add_argument("--hbm-gib", type=float, default=80.0)
    ap.add_argument("--global-batch", type=int, default=4096)
    args = ap.parse_args()
    widths = get_model_spec(args.model).valid_tp
    t0 = time.perf_counter()
    layers_by_t, sched_by_t, space, cfg = tables_for(
        args.model, widths, args.microbatch, args.devices
    )
    print(
        f"{args.model} on {args.devices} x {PRESET}, {args.hbm_gib:g} GiB, microbatch "
        f"{args.microbatch}, global batch {args.global_batch}, {cfg['place']['optimizer']}, "
        f"tp in {list(widths)} "
        f"(traces and layer latencies: {time.perf_counter() - t0:.1f} s)"
    )
    for recompute in (False, True):
        for preset_networks in (False, True):
            place = {
                **cfg["place"],
                "model": "upstream",
                "recompute": ["full" if recompute else "none"],
                "global_batch": args.global_batch,
                "preset_networks": preset_networks,
            }
            settings = PlaceSettings.from_config(
                {**cfg, "place": place}, args.model, int(args.hbm_gib * GIB), args.microbatch
            )
            t1 = time.perf_counter()
            row = place_architectures(
                settings, layers_by_t, sched_by_t, space, cfg["costmodel"], [args.devices]
            ).iloc[0]
            solve_s = time.perf_counter() - t1
            label = "two-level (DGX A100)" if preset_networks else "flat 300 GB/s link  "
            if not row["feasible"]:
                print(
                    f"recompute {'on ' if recompute else 'off'} {label}: infeasible: {row['reason']}"
                )
                continue
            exp = (
                f"expert (p, d, t) = ({row['expert_pp']}, {row['expert_dp']}, {row['expert_tp']}): "
                f"{row['expert_time_per_batch_s']:.2f} s"
                if row["expert_feasible"]
                else f"expert: {row['expert_reason']}"
            )
            print(
                f"recompute {'on ' if recompute else 'off'} {label}: {row['time_per_batch_s']:.2f} s/batch, "
                f"{row['throughput_seq_s']:.1f} seq/s, MFU {row['mfu']:.3f}, p={row['pp']} "
                f"t={row['tp']} d={row['dp']} ({row['devices_used']} GPUs); {exp}; solve {solve_s:.2f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
