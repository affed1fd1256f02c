"""The space bound of one model and microbatch: a proven throughput upper bound of every
architecture of the space, for every HBM size and cluster size (``phaze search bounds``; rule
``space_bounds``; docs/search.md, "Bounds over the whole space").

For each tensor-parallel width traced: the operators' latencies of every architecture
(:func:`phaze.estimate.stage.latency_arrays`), each layer's makespan bounds
(:mod:`phaze.schedule.space`), then the placement relaxed over every configuration
(:mod:`phaze.place.bound`) under the placement model of config ``place.model``, on each
architecture's network and with its own cost-model constants (a preset's overrides), exactly as
``phaze place`` prices it. Architectures are taken in blocks, so memory stays bounded whatever
the size of the space.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.estimate.model import achievable_hbm_Bps
from phaze.estimate.stage import latency_arrays
from phaze.io.tables import read_table
from phaze.place.bound import (
    LOWER,
    SpaceChain,
    time_lower_bounds,
    upstream_time_lower_bounds,
)
from phaze.place.chains import ChainTables
from phaze.place.dp import data_parallel_degrees
from phaze.place.inputs import check_layers, trace_shapes
from phaze.place.objective_megatron import step_network
from phaze.place.objective_upstream import upstream_network
from phaze.place.settings import (
    PlaceSettings,
    arch_costmodel,
    hbm_capacity_bytes_of,
    link_parameters,
    network_for,
)
from phaze.schedule.space import attention_seconds, layer_bounds, layer_plans
from phaze.search.dominance import candidate_steps, families, joined, verified
from phaze.step.model import StepConstants

#: architectures per block: (archs × ops) latency arrays of ~100 ops stay a few tens of MB
BLOCK_ARCHS = 16384


class TraceBounds(NamedTuple):
    """One width's bounds over a block of architectures."""

    layers: dict  # (signature, pass) -> (lower bound, serial time) per arch
    attention: dict  # block signature -> core attention's forward per arch
    latencies: list  # the latency arrays (archs × ops): on one core, on all cores


class Trace:
    """One rank shape's trace (tensor-parallel width tp, expert-parallel size ep, the experts'
    tensor-parallel size etp: tp or 1): layers, ops, the layer graphs' structure, the chain
    tables."""

    def __init__(
        self,
        trace_dir: str,
        tp: int,
        microbatch: int,
        weight_bytes: float,
        ep: int = 1,
        etp: int | None = None,
    ):
        d = Path(trace_dir)
        self.tp, self.ep, self.etp = tp, ep, tp if etp is None else etp
        self.layers = check_layers(read_table(d / "layers.parquet", "layers"), f"{d}")
        self.ops = read_table(d / "ops.parquet", "ops").reset_index(drop=True)
        self.plans = layer_plans(d, self.ops)
        self.tables = ChainTables(
            self.layers, self.ops, tp, microbatch, weight_bytes, f"{d}", ep=ep, etp=self.etp
        )

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.tp, self.ep, self.etp)

    def bounds(self, space: pd.DataFrame, config: dict) -> TraceBounds:
        """The layers' bounds, core attention and the latency arrays over ``space``."""
        lat = latency_arrays(self.ops, space, config["costmodel"], config["place"])
        l1, la = lat["latency_1core_s"], lat["latency_allcores_s"]
        n_tc, n_vc = space["n_tc"].to_numpy(float), space["n_vc"].to_numpy(float)
        out = {(p.signature, p.pass_): layer_bounds(p, l1, la, n_tc, n_vc) for p in self.plans}
        return TraceBounds(out, attention_seconds(self.ops, l1, la), [l1, la])

    def space_chain(self, bounds: dict, attention: dict, n: int) -> SpaceChain:
        zero = np.zeros(n)

        def get(name, ps, which):
            sig = self.tables.rows[name]["signature"]
            got = bounds.get((sig, ps))  # no graph: nothing in that pass takes time
            out = got[which] if got is not None else zero
            if name == "first" and self.tables.dense:  # dense first blocks: priced with it
                dense = bounds.get((self.tables.rows["dense"]["signature"], ps))
                if dense is not None:
                    out = out + self.tables.dense * dense[which]
            return out

        lower = {k: get(k.split("_")[0], k.split("_")[1], 0) for k in LOWER}
        window = {k: get(k.split("_")[0], k.split("_")[1], 1) for k in LOWER}
        sig = self.tables.rows["block"]["signature"]
        skeleton = {
            sp: self.tables.skeleton(sp) for sp in ((False, True) if self.tp > 1 else (False,))
        }
        return SpaceChain(skeleton, lower, window, attention.get(sig, zero))

    def total_lower(self, bounds: dict, n: int) -> np.ndarray:
        """Forward + backward lower bounds summed over every layer (upstream's objective)."""
        total = np.zeros(n)
        for sig in self.layers["signature"]:
            for ps in ("fwd", "bwd"):
                if (sig, ps) in bounds:
                    total = total + bounds[(sig, ps)][0]
        return total


def _groups(space: pd.DataFrame):
    """Architectures that share cost-model constants and network (a preset's own): index lists."""
    keys = [
        space.get("costmodel_overrides", pd.Series("", index=space.index)).fillna(""),
        space.get("preset", pd.Series("", index=space.index)).fillna(""),
    ]
    for (overrides, preset), grp in space.groupby(keys, sort=False):
        yield (preset or None), grp.index.to_numpy()


def _blocks(space: pd.DataFrame) -> list[np.ndarray]:
    """Row positions of ``space`` in blocks of at most ``BLOCK_ARCHS`` archs made of whole
    dominance families (a family larger than a block is split: its steps across the split are
    then not recorded, which loses tightness, never validity)."""
    fam = families(space)
    order = np.argsort(fam, kind="stable")
    cuts = np.flatnonzero(np.r_[True, fam[order][1:] != fam[order][:-1]])
    groups = np.split(order, cuts[1:])
    out, cur = [], []
    for g in groups:
        for piece in np.array_split(g, -(-len(g) // BLOCK_ARCHS)):
            if sum(map(len, cur)) + len(piece) > BLOCK_ARCHS:
                out.append(np.concatenate(cur))
                cur = []
            cur.append(piece)
    if cur:
        out.append(np.concatenate(cur))
    return out


def _dominated_by(block: pd.DataFrame, latencies: list[np.ndarray]) -> list[list[str]]:
    """Per arch of ``block``: the archs one step larger on one axis whose every latency of every
    traced width is no larger (:mod:`phaze.search.dominance`)."""
    x, y = candidate_steps(block)
    counts = {c: block[c].to_numpy(float) for c in ("n_tc", "n_vc")}
    ok = verified(x, y, latencies, counts)
    ups: list[list[str]] = [[] for _ in range(len(block))]
    arch = block["arch"].to_numpy()
    for i, j in zip(x[ok], y[ok]):
        ups[i].append(arch[j])
    return ups


def bounds_table(args, config: dict) -> pd.DataFrame:
    """The ``bounds`` table of one model and microbatch (module docstring)."""
    if len(args.tp) != len(args.trace_dirs):
        raise PhazeError("--tp and --trace-dirs need one trace directory per width")
    shapes = trace_shapes(args.tp, args.ep, args.etp)
    space = read_table(args.space, "space", nonempty=True).reset_index(drop=True)
    place = config["place"]
    model, b = args.model, int(args.microbatch)
    hbm_all = [hbm_capacity_bytes_of(h) for h in place["hbm_gib"]]
    settings = PlaceSettings.from_config(config, model, hbm_all[0], b)
    traces = [
        Trace(d, int(t), b, config["step"]["weight_bytes_per_param"], int(e), int(x))
        for (t, e, x), d in zip(shapes, args.trace_dirs)
    ]
    if len({tr.tables.blocks for tr in traces}) != 1:
        raise PhazeError(f"{model}: the traces of the widths have different block counts")
    out = np.full((len(place["devices"]), len(hbm_all), len(space)), np.nan)
    ups: list[str] = [""] * len(space)
    for positions in _blocks(space):
        block = space.iloc[positions].reset_index(drop=True)
        bounds = {tr.key: tr.bounds(block, config) for tr in traces}
        latencies = [lat for tr in traces for lat in bounds[tr.key].latencies]
        for r, u in zip(positions, joined(_dominated_by(block, latencies))):
            ups[r] = u
        for preset, idx in _groups(block):
            for i, devices in enumerate(place["devices"]):
                time = _times(
                    settings, traces, bounds, idx, len(block), preset, devices, hbm_all, config
                )
                with np.errstate(divide="ignore"):
                    thr = np.where(np.isfinite(time), settings.global_batch / time, np.nan)
                out[i][:, positions[idx]] = thr
    rows = [
        pd.DataFrame(
            {
                "arch": space["arch"].to_numpy(),
                "model": model,
                "microbatch": b,
                "hbm_capacity_bytes": int(hbm),
                "devices": int(devices),
                "throughput_upper_seq_s": out[i, h],
                "dominated_by": ups,
            }
        )
        for i, devices in enumerate(place["devices"])
        for h, hbm in enumerate(hbm_all)
    ]
    return pd.concat(rows, ignore_index=True)


def _times(settings, traces, bounds, idx, size, preset, devices, hbm_all, config) -> np.ndarray:
    """The step-time lower bounds, shape (len(hbm_all), len(idx)), of the architectures ``idx``
    of a block of ``size`` (one group of shared constants and network)."""
    cm = arch_costmodel(config["costmodel"], preset)
    bw, lat = link_parameters(config["costmodel"], preset)
    if settings.place_model == "upstream":
        if any(tr.ep > 1 or tr.etp != tr.tp for tr in traces):
            raise PhazeError(
                "place.model upstream places every expert on each rank: ep = 1, etp = tp only"
            )
        totals = {tr.tp: tr.total_lower(bounds[tr.key].layers, size)[idx] for tr in traces}
        params = {tr.tp: float(tr.layers["param_bytes"].sum()) for tr in traces}
        net, _label = upstream_network(settings, preset, config["costmodel"], devices)
        M = settings.microbatches
        d_values = data_parallel_degrees(
            devices, M, settings.dp_must_divide_batch, settings.dp_must_divide_devices
        )
        n_layers = len(traces[0].layers)
        flat_bw = None if net is not None else bw
        time = upstream_time_lower_bounds(
            totals, params, n_layers, d_values, devices, M, flat_bw, lat
        )
        return np.broadcast_to(time, (len(hbm_all), len(time)))  # memory limits dropped
    chains = {
        (tr.tp, settings.microbatch, tr.ep, tr.etp): tr.space_chain(
            bounds[tr.key].layers, bounds[tr.key].attention, size
        ).take(idx)
        for tr in traces
    }
    consts = StepConstants.from_config(settings.step, float(achievable_hbm_Bps(cm)))
    placed_net, _label = network_for(settings, preset, config["costmodel"], devices)
    net = step_network(placed_net, bw, lat, devices)
    return time_lower_bounds(
        chains, net, consts, devices, settings.global_batch, hbm_all, settings.axes
    )
