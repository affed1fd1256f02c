"""The step model's chains (`phaze.step.layers.ChainCost`) of one architecture, from the stage
tables the search produces: the trace's layers and ops, the layer schedules, the operators'
latencies (docs/step.md).

Per layer and rank (one tensor-parallel width t, one microbatch b):

* forward / backward time = the layer's schedule (``makespan_s``, or ``lower_bound_s`` for a
  throughput upper bound), which already holds its tensor-parallel collectives (priced by the
  estimate stage), so the chain lists none;
* core attention's forward (selective recomputation) = its ops one after another, each on its
  faster core set: Σ min(latency_1core_s, latency_allcores_s) over the trace's ``attention``
  forward ops (the same in every tier, so a bound-tier price stays a bound);
* with sequence parallelism the layer keeps the schedule without it — a valid schedule of the
  sequence-parallel layer, whose replicated ops only get t times shorter (conservative by their
  (1 − 1/t) share) — while its memory (the part outside the tensor-parallel region divided by t),
  its input and its pipeline sends shrink as the model says;
* parameters = ``param_bytes`` / ``step.weight_bytes_per_param``, of them the routed experts'
  ``expert_param_bytes`` (a mixture-of-experts trace at expert-parallel size ep: the rank's E/ep
  experts, whole at etp = 1; its all-to-alls are ops of the layer, in its schedule); memory from
  the trace's saved tensors.

A bound-tier chain (lower-bound latencies) carries the achievable one as its DDP window
(`ChainCost.window`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phaze.errors import PhazeError
from phaze.step.layers import ChainCost, LayerCost

#: the three layer kinds of a chain
LAYERS = ("first", "block", "last")


def dense_first_blocks(blocks: pd.DataFrame) -> int:
    """How many leading blocks are dense before mixture-of-experts blocks (DeepSeek-V3's
    first_k_dense_replace): 0 unless the blocks start dense and every later one has experts."""
    if "experts" not in blocks.columns:
        return 0
    sparse = blocks["experts"].to_numpy() > 0
    n = int(np.argmax(sparse)) if sparse.any() else 0
    return n if n and sparse[n:].all() else 0


def fold_dense_blocks(first: LayerCost, dense: LayerCost, n: int) -> LayerCost:
    """The first layer followed by ``n`` dense blocks, as one layer: times, parameters,
    activations, collectives and FLOPs added; its input stays the first layer's. The step model
    keeps a first layer's activations (no recomputation) and places it on the first pipeline
    stage, so the dense blocks do too (docs/fidelity.md)."""
    mean = first.mean_fwd_matmul_flops, dense.mean_fwd_matmul_flops
    return LayerCost(
        fwd_s=first.fwd_s + n * dense.fwd_s,
        bwd_s=first.bwd_s + n * dense.bwd_s,
        params=first.params + n * dense.params,
        activation_bytes=first.activation_bytes + n * dense.activation_bytes,
        fwd_collectives=tuple(first.fwd_collectives) + tuple(dense.fwd_collectives) * n,
        bwd_collectives=tuple(first.bwd_collectives) + tuple(dense.bwd_collectives) * n,
        attention_fwd_s=first.attention_fwd_s + n * dense.attention_fwd_s,
        attention_activation_bytes=first.attention_activation_bytes
        + n * dense.attention_activation_bytes,
        input_bytes=first.input_bytes,
        tied_params=first.tied_params,
        fwd_matmul_flops=first.fwd_matmul_flops + n * dense.fwd_matmul_flops,
        attention_matmul_flops=first.attention_matmul_flops + n * dense.attention_matmul_flops,
        expert_params=first.expert_params + n * dense.expert_params,
        low_precision_params=first.low_precision_params + n * dense.low_precision_params,
        attention_bwd_s=first.attention_bwd_s + n * dense.attention_bwd_s,
        kv_bytes=first.kv_bytes + n * dense.kv_bytes,
        fused_attention=dense.fused_attention,
        mean_fwd_matmul_flops=None
        if mean == (None, None)
        else (first.model_matmul_flops + n * dense.model_matmul_flops),
    )


def chain_layers(layers: pd.DataFrame, where: str) -> dict[str, pd.Series]:
    """{"first", "block", "last"} rows of a layers table that is a chain of one first layer,
    identical blocks and one last layer (what the step model prices), else PhazeError. Dense
    first blocks before identical MoE blocks (`dense_first_blocks`) add a "dense" row: the
    blocks are then the MoE ones, and the dense ones are priced with the first layer."""
    kinds = list(layers["kind"])
    n_blocks = kinds.count("block")
    if n_blocks < 1 or kinds != ["embedding"] + ["block"] * n_blocks + ["head"]:
        raise PhazeError(
            f"{where}: the step model needs layers embedding, blocks, head in this order "
            f"(got {kinds[:3]}...{kinds[-2:]})"
        )
    blocks = layers.iloc[1:-1]
    dense = dense_first_blocks(blocks)
    cols = [
        c
        for c in (
            "signature",
            "param_bytes",
            "activation_bytes",
            "attention_activation_bytes",
            "replicated_activation_bytes",
            "stash_recompute_bytes",
            "boundary_bytes",
            "fwd_matmul_flops",
            "expert_param_bytes",
        )
        if c in blocks.columns
    ]
    for part in (blocks.iloc[:dense], blocks.iloc[dense:]):
        if (part[cols].nunique() > 1).any():
            raise PhazeError(
                f"{where}: the blocks differ; the step model needs identical blocks (after "
                "any dense first blocks)"
            )
    rows = {"first": layers.iloc[0], "block": blocks.iloc[dense], "last": layers.iloc[-1]}
    if dense:
        rows["dense"] = blocks.iloc[0]
    return rows


def attention_seconds(ops: pd.DataFrame, latency: pd.DataFrame) -> dict[tuple[str, str], float]:
    """{(arch, signature): core attention's forward, its ops one after another at their best}."""
    att = ops[(ops["pass"] == "fwd") & ops["attention"].astype(bool)][["signature", "op"]]
    lat = latency[latency["pass"] == "fwd"]
    best = np.minimum(
        lat["latency_1core_s"].to_numpy(float), lat["latency_allcores_s"].to_numpy(float)
    )
    lat = pd.DataFrame(
        {"arch": lat["arch"], "signature": lat["signature"], "op": lat["op"], "s": best}
    )
    joined = lat.merge(att, on=["signature", "op"], how="inner")
    return joined.groupby(["arch", "signature"])["s"].sum().to_dict()


def _matmul_attention_flops(ops: pd.DataFrame) -> dict[str, float]:
    m = ops[(ops["pass"] == "fwd") & (ops["kind"] == "matmul") & ops["attention"].astype(bool)]
    return m.groupby("signature")["flops"].sum().to_dict()


class ChainTables:
    """The tables of one tensor-parallel width t and one microbatch, ready to build chains."""

    def __init__(
        self,
        layers: pd.DataFrame,
        ops: pd.DataFrame | None,
        tp: int,
        microbatch: int,
        weight_bytes_per_param: float,
        where: str,
        ep: int = 1,
        etp: int | None = None,
    ):
        if tp > 1 and not layers["tensor_parallel"].astype(bool).all():
            raise PhazeError(
                f"{where}: the step model needs every layer split over the {tp} ranks (the "
                "trace's blocks and vocab-parallel embedding and head)"
            )
        self.rows = chain_layers(layers, where)
        # dense first blocks (DeepSeek-V3) are priced with the first layer (fold_dense_blocks)
        self.dense = dense_first_blocks(layers.iloc[1:-1]) if "dense" in self.rows else 0
        self.blocks = int((layers["kind"] == "block").sum()) - self.dense
        self.tp, self.microbatch, self.where = tp, microbatch, where
        block = self.rows["block"]
        self.experts = int(block["experts"]) if "experts" in block.index else 0
        traced_ep = int(block["ep"]) if "ep" in block.index else 1
        if traced_ep != ep:
            raise PhazeError(f"{where}: the trace is at expert-parallel size {traced_ep}, not {ep}")
        if ep > 1 and (not self.experts or self.experts % ep):
            raise PhazeError(
                f"{where}: expert-parallel size {ep} needs a mixture-of-experts trace whose "
                f"experts it divides (the trace has {self.experts})"
            )
        etp = tp if etp is None else etp
        whole = bool(block["etp1"]) if "etp1" in block.index else False
        if whole != (etp != tp):
            traced = "whole experts (etp = 1)" if whole else f"experts split over tp (etp = {tp})"
            raise PhazeError(f"{where}: the trace has {traced}, not etp = {etp}")
        self.ep, self.etp = ep, etp
        self.weight_bytes = float(weight_bytes_per_param)
        self.ops = ops
        self.attention_flops = _matmul_attention_flops(ops) if ops is not None else {}

    def _layer(self, row, fwd: float, bwd: float, attention_s: float, sp: bool) -> LayerCost:
        split = self.tp if sp else 1
        outside = float(row.get("replicated_activation_bytes", 0.0)) * (1 - 1 / split)
        return LayerCost(
            fwd_s=fwd,
            bwd_s=bwd,
            params=float(row["param_bytes"]) / self.weight_bytes,
            activation_bytes=float(row["activation_bytes"]) - outside,
            attention_fwd_s=attention_s,
            attention_activation_bytes=float(row.get("attention_activation_bytes", 0.0)),
            input_bytes=float(row["stash_recompute_bytes"]) / split,
            tied_params=float(row.get("tied_param_bytes", 0.0)) / self.weight_bytes,
            fwd_matmul_flops=float(row.get("fwd_matmul_flops", 0.0)),
            attention_matmul_flops=float(self.attention_flops.get(row["signature"], 0.0)),
            expert_params=float(row.get("expert_param_bytes", 0.0)) / self.weight_bytes,
            mean_fwd_matmul_flops=(
                float(row["mean_fwd_matmul_flops"])
                if "mean_fwd_matmul_flops" in row.index
                else None
            ),
        )

    def skeleton(self, sp: bool) -> ChainCost:
        """The chain without computation (every layer time 0): what a placement's terms are
        when they do not depend on the architecture (memory, communication, parameters)."""
        layers = {n: self._layer(self.rows[n], 0.0, 0.0, 0.0, sp) for n in LAYERS}
        if self.dense:
            dense = self._layer(self.rows["dense"], 0.0, 0.0, 0.0, sp)
            layers["first"] = fold_dense_blocks(layers["first"], dense, self.dense)
        return self._chain(layers, sp)

    def _chain(self, layers: dict, sp: bool, window: ChainCost | None = None) -> ChainCost:
        """The chain of this table's shard from its three layers' costs."""
        return ChainCost(
            **layers,
            blocks=self.blocks,
            tp=self.tp,
            microbatch=self.microbatch,
            sequence_parallel=sp,
            boundary_bytes=float(self.rows["block"]["boundary_bytes"]),
            window=window,
            ep=self.ep,
            experts=self.experts,
            etp=self.etp,
        )

    def chains(
        self, arch: str, lookup: dict, attention: dict | None, window: dict | None = None
    ) -> dict[bool, ChainCost]:
        """{sequence_parallel: ChainCost} of architecture `arch`; `lookup` (arch, signature,
        pass) -> seconds, `window` the same for the DDP window (None: `lookup`'s)."""

        def times(table, name):
            sig = self.rows[name]["signature"]
            try:
                return table[(arch, sig, "fwd")], table[(arch, sig, "bwd")]
            except KeyError as exc:
                raise PhazeError(
                    f"{self.where}: no schedule for arch {arch} signature {sig} "
                    f"pass {exc.args[0][2]}"
                ) from None

        sig = self.rows["block"]["signature"]
        att = 0.0
        if attention is not None:
            if (arch, sig) not in attention:
                raise PhazeError(f"{self.where}: no op latencies for arch {arch} block {sig}")
            att = float(attention[(arch, sig)])

        def build(table, sp):
            layers = {}
            for name in ("first", "block", "last"):
                f, b = times(table, name)
                layers[name] = self._layer(
                    self.rows[name], f, b, att if name == "block" else 0.0, sp
                )
            if self.dense:
                f, b = times(table, "dense")
                dense = self._layer(self.rows["dense"], f, b, 0.0, sp)
                layers["first"] = fold_dense_blocks(layers["first"], dense, self.dense)
            return layers

        out = {}
        for sp in (False, True) if self.tp > 1 else (False,):
            win = None if window is None else self._chain(build(window, sp), sp)
            out[sp] = self._chain(build(lookup, sp), sp, win)
        return out
