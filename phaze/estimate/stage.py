"""The estimate stage: every operator of a trace × every selected architecture -> latency table.

Work is deduplicated before the model runs: unique GEMM shapes × unique tensor-core configurations
(width, depth, local buffer, clock, core count), unique GLB sizes for HBM traffic, unique vector
workloads × unique vector-core configurations. Architectures whose preset overrides cost-model
constants are estimated with those constants.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from phaze.arch.presets import load_preset
from phaze.config import schema_defaults
from phaze.errors import PhazeError
from phaze.estimate import model
from phaze.network import Network, network_for_architecture

OPS_COLUMNS = (
    "signature",
    "layer",
    "pass",
    "op",
    "aten",
    "kind",
    "core",
    "m",
    "n",
    "k",
    "batch",
    "elements",
    "bytes_in",
    "bytes_out",
    "fused_into",
    "collective",
    "group_size",
)
KINDS = ("matmul", "vector", "collective", "nop")


def op_base_name(aten: str) -> str:
    """``aten._softmax.default`` / ``aten::_softmax`` -> ``_softmax``."""
    name = str(aten)
    for prefix in ("aten::", "aten."):
        name = name.removeprefix(prefix)
    return name.split(".")[0]


def with_overrides(costmodel: dict, overrides: dict, source: str) -> dict:
    """The costmodel with an architecture's own constants (a preset's ``costmodel:``) applied."""
    unknown = sorted(set(overrides) - set(costmodel))
    if unknown:
        raise PhazeError(f"{source} overrides unknown costmodel keys {unknown}")
    return {**costmodel, **overrides}


def cycles_per_element(aten: pd.Series, costmodel: dict) -> np.ndarray:
    table = costmodel["vector_cycles_per_element"]
    default = table.get("default", 1.0)
    return np.array([table.get(op_base_name(a), default) for a in aten], dtype=np.float64)


def check_ops(ops: pd.DataFrame, source: str = "ops table") -> pd.DataFrame:
    missing = [c for c in OPS_COLUMNS if c not in ops.columns]
    if missing:
        raise PhazeError(f"{source} is missing columns {missing}")
    bad_kind = sorted(set(ops["kind"]) - set(KINDS))
    if bad_kind:
        raise PhazeError(f"{source} has unknown op kinds {bad_kind}; known: {list(KINDS)}")
    mm = ops[ops["kind"] == "matmul"]
    dims = mm[["m", "n", "k", "batch"]]
    bad = dims.isna().any(axis=1) | (dims[["m", "n", "k"]] < 0).any(axis=1) | (dims["batch"] < 1)
    if bad.any():
        raise PhazeError(
            f"{source}: matmul ops need m, n, k >= 0 and batch >= 1 "
            f"(bad ops {list(zip(mm.loc[bad, 'pass'], mm.loc[bad, 'op']))[:5]})"
        )
    vec = ops[ops["kind"] == "vector"]
    if vec[["elements", "bytes_in", "bytes_out"]].isna().any().any():
        raise PhazeError(f"{source}: vector ops need elements, bytes_in, bytes_out")
    if ops.duplicated(["signature", "pass", "op"]).any():
        raise PhazeError(f"{source}: (signature, pass, op) is not unique")
    return ops


def _unique(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Unique rows and, for every row, the index of its unique row."""
    keys = list(frame.columns)
    codes = frame.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    # groups are numbered in order of first appearance, as drop_duplicates keeps them
    return frame.drop_duplicates(keys).reset_index(drop=True), codes


def tensor_parallel_width(ops: pd.DataFrame) -> int:
    """The tensor-parallel width of a trace: the group of its tensor-parallel collectives (every
    trace at tp > 1 has them: the vocab-parallel embedding's all-reduce at least), else 1."""
    coll = ops[(ops["kind"] == "collective") & (ops["collective"].fillna("") != "all_to_all")]
    return int(coll["group_size"].max()) if len(coll) else 1


def _estimate_group(
    ops: pd.DataFrame, space: pd.DataFrame, cm: dict, net: Network, detail: bool = True
) -> dict[str, np.ndarray]:
    """Arrays of shape (archs, ops) for one cost-model variant on one network; without
    ``detail`` only the two latencies (no bound names, no HBM bytes)."""
    n_arch, n_ops = len(space), len(ops)
    lat_all = np.zeros((n_arch, n_ops))
    lat_one = np.zeros((n_arch, n_ops))
    # the bound names are object arrays: only where they are written out
    shape = (n_arch, n_ops) if detail else (1, 1)
    bound_all = np.full(shape, "none", dtype=object)
    bound_one = np.full(shape, "none", dtype=object)
    hbm_traffic_bytes = np.zeros(shape)
    kind = ops["kind"].to_numpy()

    # --- vector ops (also needed for fused element-wise work) --------------------------------
    is_vec = kind == "vector"
    vec_compute_all = np.zeros((n_arch, n_ops))
    vec_compute_one = np.zeros((n_arch, n_ops))
    if is_vec.any():
        v = ops.loc[is_vec]
        work = pd.DataFrame(
            {
                "elements": v["elements"].to_numpy(np.float64),
                "bytes": (v["bytes_in"] + v["bytes_out"]).to_numpy(np.float64),
                "cpe": cycles_per_element(v["aten"], cm),
            }
        )
        uw, w_idx = _unique(work)
        vc, vc_idx = _unique(space[["vc_width", "freq_hz", "n_vc"]])
        for n_cores, lat, bnd, comp_out in (
            (vc["n_vc"].to_numpy()[:, None], lat_all, bound_all, vec_compute_all),
            (1, lat_one, bound_one, vec_compute_one),
        ):
            cost = model.vector_cost(
                uw["elements"].to_numpy()[None, :],
                uw["bytes"].to_numpy()[None, :],
                uw["cpe"].to_numpy()[None, :],
                {
                    "vc_width": vc["vc_width"].to_numpy()[:, None],
                    "freq_hz": vc["freq_hz"].to_numpy()[:, None],
                },
                cm,
                n_cores,
            )
            sel = np.ix_(vc_idx, w_idx)
            cols = np.flatnonzero(is_vec)
            lat[:, cols] = cost["latency_s"][sel]
            if detail:
                bnd[:, cols] = cost["bound"][sel]
            comp_out[:, cols] = cost["compute_s"][sel]
        if detail:
            hbm_traffic_bytes[:, is_vec] = work["bytes"].to_numpy()[None, :]

    # --- matmuls -------------------------------------------------------------------------------
    is_mm = kind == "matmul"
    if is_mm.any():
        shapes, s_idx = _unique(ops.loc[is_mm, ["m", "n", "k", "batch"]].astype(np.float64))
        sm, sn, sk, sb = (shapes[c].to_numpy()[None, :] for c in ("m", "n", "k", "batch"))
        tc, tc_idx = _unique(
            space[["tc_width", "tc_depth", "tc_local_buffer_bytes", "freq_hz", "n_tc"]]
        )
        glb, glb_idx = _unique(space[["glb_bytes"]])
        traffic = model.hbm_traffic_bytes(sm, sn, sk, sb, glb["glb_bytes"].to_numpy()[:, None], cm)
        hbm_s = traffic / model.achievable_hbm_Bps(cm)
        cols = np.flatnonzero(is_mm)
        tcp = {c: tc[c].to_numpy()[:, None] for c in tc.columns}
        for n_cores, lat, bnd in ((tcp["n_tc"], lat_all, bound_all), (1, lat_one, bound_one)):
            _, comp_s, glb_s = model.core_time(
                sm,
                sn,
                sk,
                sb,
                tcp["tc_width"],
                tcp["tc_depth"],
                tcp["tc_local_buffer_bytes"],
                tcp["freq_hz"],
                cm,
                n_cores,
            )
            c = comp_s[np.ix_(tc_idx, s_idx)]
            g = glb_s[np.ix_(tc_idx, s_idx)]
            h = hbm_s[np.ix_(glb_idx, s_idx)]
            issue = np.where(h > 0, cm["op_issue_s"], 0.0)
            latency, bound = model.combine_terms(c, g, h, issue)
            lat[:, cols] = latency
            if detail:
                bnd[:, cols] = bound
        if detail:
            hbm_traffic_bytes[:, cols] = traffic[np.ix_(glb_idx, s_idx)]

    # --- fused element-wise consumers: their compute is added to the matmul carrying them -----
    fused_into = ops["fused_into"].fillna(-1).astype(np.int64).to_numpy()
    fused = fused_into >= 0
    if fused.any():
        key = pd.MultiIndex.from_arrays([ops["signature"], ops["pass"], ops["op"]])
        target = pd.MultiIndex.from_arrays(
            [ops["signature"][fused], ops["pass"][fused], fused_into[fused]]
        )
        pos = key.get_indexer(target)
        if (pos < 0).any():
            raise PhazeError(
                "ops table: fused_into names op ids that are not in the same layer+pass"
            )
        if not is_mm[pos].all():
            raise PhazeError("ops table: fused_into must name a matmul op")
        src = np.flatnonzero(fused)
        for lat, comp, bnd in (
            (lat_all, vec_compute_all, bound_all),
            (lat_one, vec_compute_one, bound_one),
        ):
            np.add.at(lat.T, pos, comp[:, src].T)  # matmul pays the element-wise compute too
            lat[:, src] = 0.0
            if detail:
                bnd[:, src] = "fused"
        if detail:
            hbm_traffic_bytes[:, src] = 0.0

    # --- collectives ---------------------------------------------------------------------------
    is_coll = kind == "collective"
    if is_coll.any():
        c = ops.loc[is_coll]
        secs = np.zeros(len(c))
        kinds = c["collective"].fillna("all_reduce").replace("", "all_reduce")
        tp = tensor_parallel_width(ops)
        for i, (name, size, out, group, replicated) in enumerate(
            zip(kinds, c["bytes_in"], c["bytes_out"], c["group_size"], c["replicated"])
        ):
            if int(group) <= 1:
                continue  # one rank sends nothing (an expert-parallel group of 1)
            if name == "all_to_all":
                # the expert-parallel group (Megatron's expert generator, docs/step.md): ep ranks
                # tp apart when every tensor-parallel rank exchanges the block's tokens (experts
                # split over tp: the all-to-all is replicated), ep consecutive ranks when each
                # exchanges its own shard (etp = 1); the larger side of send/receive decides
                stride = tp if bool(replicated) else 1
                ranks, size = range(0, stride * int(group), stride), max(size, out)
            else:
                # the tensor-parallel group is ranks 0..g-1 (consecutive, as Megatron places them)
                ranks = range(int(group))
            secs[i] = net.collective(str(name), float(size), ranks)
        cols = np.flatnonzero(is_coll)
        lat_all[:, cols] = secs[None, :]
        lat_one[:, cols] = secs[None, :]
        if detail:
            bound_all[:, cols] = "link"
            bound_one[:, cols] = "link"
    return {
        "latency_allcores_s": lat_all,
        "latency_1core_s": lat_one,
        "bound": bound_all,
        "bound_1core": bound_one,
        "hbm_traffic_bytes": hbm_traffic_bytes,
    }


def _prepared(ops: pd.DataFrame, space: pd.DataFrame, place: dict | None):
    if place is None:
        place = schema_defaults()["place"]
    ops = check_ops(ops).reset_index(drop=True)
    space = space.reset_index(drop=True)
    if "costmodel_overrides" not in space.columns:
        space = space.assign(costmodel_overrides="")
    if "preset" not in space.columns:
        space = space.assign(preset="")
    if "tc_local_buffer_bytes" not in space.columns:
        space = space.assign(
            tc_local_buffer_bytes=model.tc_local_buffer_bytes(
                {"tc_width": space.tc_width.to_numpy(), "tc_depth": space.tc_depth.to_numpy()}
            )
        )
    return ops, space, place


def _arrays(
    ops: pd.DataFrame, space: pd.DataFrame, costmodel: dict, place: dict, detail: bool
) -> dict[str, np.ndarray]:
    """(archs × ops) arrays per quantity, every architecture with its own cost-model constants
    (a preset's overrides) and network."""
    arrays: dict[str, np.ndarray] = {}
    devices = max(place["devices"])
    keys = [space["costmodel_overrides"].fillna(""), space["preset"].fillna("")]
    for (overrides, preset), grp in space.groupby(keys, sort=False):
        extra = json.loads(overrides) if overrides else {}
        cm = with_overrides(costmodel, extra, "space table")
        preset_net = load_preset(preset).get("network") if preset else None
        net, _ = network_for_architecture(
            preset_net, place["network"], place["preset_networks"], cm, devices, preset
        )
        part = _estimate_group(ops, grp.reset_index(drop=True), cm, net, detail)
        for name, arr in part.items():
            if arr.shape[0] != len(grp):  # a quantity not asked for (detail off)
                continue
            if name not in arrays:
                arrays[name] = np.empty((len(space), len(ops)), dtype=arr.dtype)
            arrays[name][grp.index.to_numpy()] = arr
    return arrays


def arch_op_rows(ops: pd.DataFrame, arch: pd.Series, columns: tuple[str, ...]) -> dict:
    """The key columns of a latency table: one row per (architecture, op), architectures outer
    and ops inner — the row order of :func:`latency_arrays`'s (archs × ops) arrays flattened."""
    n_arch = len(arch)
    return {
        "arch": np.repeat(arch.to_numpy(), len(ops)),
        **{c: np.tile(ops[c].to_numpy(), n_arch) for c in columns},
    }


def latency_arrays(
    ops: pd.DataFrame, space: pd.DataFrame, costmodel: dict, place: dict | None = None
) -> dict[str, np.ndarray]:
    """``latency_1core_s`` and ``latency_allcores_s`` as (archs × ops) arrays, architectures in
    the space's row order and ops in the ops table's: :func:`estimate`'s values without its long
    table (the search's space bound reads every architecture at once)."""
    ops, space, place = _prepared(ops, space, place)
    arrays = _arrays(ops, space, costmodel, place, detail=False)
    return {k: arrays[k] for k in ("latency_1core_s", "latency_allcores_s")}


def estimate(
    ops: pd.DataFrame, space: pd.DataFrame, costmodel: dict, place: dict | None = None
) -> pd.DataFrame:
    """Latency table: one row per (arch, signature, pass, op), archs in space order.

    Collectives (the tensor-parallel all-reduces inside a layer) run on the network
    `phaze.network.network_for_architecture` chooses from ``place`` (the config's ``place``
    section: ``network``, ``preset_networks``, ``devices``; None = the schema's defaults): a
    preset's own ``network:`` section, else ``place.network``, else the flat
    ``costmodel.link_*``; a torus is sliced for the largest cluster of ``place.devices``."""
    ops, space, place = _prepared(ops, space, place)
    arrays = _arrays(ops, space, costmodel, place, detail=True)
    n_arch = len(space)
    out = pd.DataFrame(
        arch_op_rows(ops, space["arch"], ("signature", "pass", "op", "kind", "core"))
    )
    out["op"] = out["op"].astype(np.int64)
    for name in (
        "latency_1core_s",
        "latency_allcores_s",
        "bound",
        "bound_1core",
        "hbm_traffic_bytes",
    ):
        out[name] = arrays[name].reshape(-1) if n_arch else np.empty(0)
    out["hbm_traffic_bytes"] = out["hbm_traffic_bytes"].astype(np.int64)
    return out
