"""One function per figure; each takes the summary tables and returns a matplotlib Figure.

Units are converted only here (mm², GiB, sequences/s stay as they are; bytes -> GiB for memory)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from phaze.report import FIGURES
from phaze.units import GIB

BASELINES = [
    ("tpuv4_expert", "TPUv4 + expert placement"),
    ("tpuv4_phaze", "TPUv4 + our placement"),
    ("tpuv4_upstream_expert", "TPUv4 (upstream's numbers) + expert"),
    ("placement_blind", "placement-blind arch + our placement"),
]
PHAZE = [
    ("phaze-per-model", "Phaze-Per-Model", "#1f77b4"),
    ("phaze-common", "Phaze-Common", "#ff7f0e"),
]


def pick_hbm(df: pd.DataFrame, hbm_gib: float | None) -> int:
    hbms = sorted(df["hbm_capacity_bytes"].unique())
    if hbm_gib is None:
        return int(hbms[-1])
    want = round(hbm_gib * GIB)
    return int(min(hbms, key=lambda h: abs(h - want)))


def _one_devices(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["devices"] == df["devices"].max()]


def _panels(n: int, per_row: int = 4):
    """A figure with one panel per model, ``per_row`` to a row; the unused panels hidden."""
    n = max(1, n)
    rows, cols = -(-n // per_row), min(n, per_row)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def speedup_means(values) -> tuple[float, float]:
    """(geometric mean, arithmetic mean) of the finite speedups; NaN, NaN when there are none."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return float("nan"), float("nan")
    return float(np.exp(np.log(v).mean())), float(v.mean())


def speedup_bars(comparison: pd.DataFrame, hbm_capacity_bytes: int):
    """Per model and, as the last two groups, their geometric and arithmetic means."""
    cmp = _one_devices(comparison[comparison["hbm_capacity_bytes"] == hbm_capacity_bytes])
    models = sorted(cmp["model"].unique())
    groups = [*models, "geo. mean", "arith. mean"]
    # many models: the four baselines in two rows of two
    cols = len(BASELINES) if len(groups) <= 6 else 2
    rows = -(-len(BASELINES) // cols)
    width = max(4.2, 0.6 * len(groups))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 3.8 * rows), squeeze=False)
    axes = axes.ravel()
    x = np.arange(len(groups))
    w = 0.38
    for ax, (base, title) in zip(axes, BASELINES):
        col = f"speedup_vs_{base}"
        for i, (strategy, label, color) in enumerate(PHAZE):
            vals = [
                cmp.loc[(cmp["model"] == m) & (cmp["strategy"] == strategy), col].max()
                for m in models
            ]
            vals += list(speedup_means(vals))
            bars = ax.bar(x + (i - 0.5) * w, vals, w, label=label, color=color)
            for b, v in zip(bars, vals):
                if np.isfinite(v):
                    ax.annotate(
                        f"{v:.2f}",
                        (b.get_x() + b.get_width() / 2, v),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.axvline(len(models) - 0.5, color="0.5", lw=0.8)
        ax.set_xticks(x, groups, rotation=30, ha="right", fontsize=7)
        ax.set_title(f"vs {title}", fontsize=9)
        ax.set_ylabel("throughput speedup")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"Speedup per model, HBM {hbm_capacity_bytes / GIB:g} GiB, "
        f"{int(cmp['devices'].max()) if len(cmp) else 0} accelerators",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def convergence(explored: pd.DataFrame, best: pd.DataFrame, hbm_capacity_bytes: int):
    """The area walk's best throughput per bucket visited, per model and microbatch (dotted: its
    early stop), and the global search's answer (dashed) where the run has one."""
    ex = _one_devices(explored[explored["hbm_capacity_bytes"] == hbm_capacity_bytes])
    ex = ex[(ex["strategy"] == "phaze-per-model") & ex["visited"]]
    glob = _one_devices(
        best[
            (best["hbm_capacity_bytes"] == hbm_capacity_bytes)
            & (best["mode"] == "global")
            & (best["strategy"] == "phaze-per-model")
        ]
    )
    models = sorted(ex["model"].unique())
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models):
        g = glob[glob["model"] == model]
        if len(g):
            ax.axhline(
                float(g["throughput_seq_s"].max()),
                color="k",
                ls="--",
                lw=0.8,
                label="global answer",
            )
        sub = ex[ex["model"] == model]
        for b, grp in sub.groupby("microbatch"):
            per_bucket = (
                grp.groupby("bucket")
                .agg(area=("area_mm2", "max"), best=("throughput_seq_s", "max"))
                .sort_index()
            )
            running = per_bucket["best"].fillna(-np.inf).cummax().replace(-np.inf, np.nan)
            (line,) = ax.plot(
                per_bucket.index,
                running,
                marker=".",
                lw=1,
                label=f"b={b}",
            )
            ax.axvline(per_bucket.index.max(), color=line.get_color(), ls=":", lw=1)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("area bucket visited (0 = largest area)")
        ax.set_ylabel("best throughput so far (seq/s)")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Search convergence (dotted: early stop), HBM {hbm_capacity_bytes / GIB:g} GiB",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def area_throughput(
    certified: pd.DataFrame,
    front: pd.DataFrame,
    best: pd.DataFrame,
    comparison: pd.DataFrame,
    hbm_capacity_bytes: int,
    mode: str,
):
    """Per model (its Phaze-Per-Model global search): every architecture's proven upper bound
    (faint), the refined architectures' achieved throughput, the certified front, the TPUv4
    baselines and the chosen design."""
    cert = _one_devices(certified[certified["hbm_capacity_bytes"] == hbm_capacity_bytes])
    cert = cert[cert["strategy"] == "phaze-per-model"]
    fr = _one_devices(front[front["hbm_capacity_bytes"] == hbm_capacity_bytes])
    models = sorted(cert["model"].unique())
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models):
        mine = cert[cert["model"] == model]
        ax.scatter(
            mine["area_mm2"],
            mine["throughput_upper_seq_s"],
            s=2,
            color="0.85",
            rasterized=True,
            label="upper bound, every arch",
        )
        got = mine[mine["throughput_seq_s"].notna()]
        ax.scatter(got["area_mm2"], got["throughput_seq_s"], s=8, color="0.4", label="refined")
        f = fr[(fr["model"] == model) & (fr["strategy"] == "phaze-per-model")]
        f = f.sort_values("area_mm2")
        if len(f):
            gap = float(f["certified_gap"].max())
            ax.step(
                f["area_mm2"],
                f["throughput_seq_s"],
                where="post",
                color="C3",
                lw=1.2,
                # each point's certificate covers the archs of area up to its own; below the
                # smallest point nothing is refined, so the front is stated from there
                label=f"front from {f['area_mm2'].iloc[0]:.0f} mm² "
                f"(certified within {100 * gap:.2g} %)",
            )
        tpu = _one_devices(
            comparison[
                (comparison["hbm_capacity_bytes"] == hbm_capacity_bytes)
                & (comparison["model"] == model)
                & comparison["strategy"].isin(["tpuv4-phaze", "tpuv4-upstream-phaze"])
            ]
        )
        for r, marker in zip(tpu.itertuples(index=False), ("s", "D")):
            ax.scatter(
                r.area_mm2, r.throughput_seq_s, marker=marker, color="k", s=25, label=r.strategy
            )
        chosen = _one_devices(
            best[
                (best["model"] == model)
                & (best["strategy"] == "phaze-per-model")
                & (best["hbm_capacity_bytes"] == hbm_capacity_bytes)
                & (best["mode"] == mode)
            ]
        )
        if len(chosen):
            ax.scatter(
                chosen["area_mm2"],
                chosen["throughput_seq_s"],
                marker="*",
                s=120,
                color="C0",
                label="Phaze-Per-Model",
                zorder=3,
            )
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("accelerator area (mm²)")
        ax.set_ylabel("throughput (seq/s)")
        ax.legend(fontsize=6)
    fig.suptitle(f"Area vs throughput, HBM {hbm_capacity_bytes / GIB:g} GiB", fontsize=10)
    fig.tight_layout()
    return fig


def arch_table(best: pd.DataFrame, comparison: pd.DataFrame, hbm_capacity_bytes: int, mode: str):
    chosen = comparison[comparison["strategy"].str.startswith("phaze-")]
    rows = _one_devices(chosen[chosen["hbm_capacity_bytes"] == hbm_capacity_bytes])
    tpu = _one_devices(
        comparison[
            (comparison["hbm_capacity_bytes"] == hbm_capacity_bytes)
            & (comparison["strategy"] == "tpuv4-phaze")
        ]
    )
    rows = pd.concat([rows, tpu], ignore_index=True)
    header = [
        "model",
        "strategy",
        "TCs",
        "array",
        "VCs",
        "GLB MiB",
        "area mm²",
        "mb",
        "recomp",
        "pp/tp/dp",
        "seq/s",
        "× TPUv4-exp",
    ]
    cells = []
    for r in rows.sort_values(["model", "strategy"]).itertuples(index=False):
        cells.append(
            [
                r.model,
                r.strategy,
                f"{r.n_tc:g}",
                f"{r.tc_width:g}×{r.tc_depth:g}",
                f"{r.n_vc:g}",
                f"{r.glb_bytes / 2**20:g}",
                f"{r.area_mm2:.1f}",
                f"{r.microbatch}",
                f"{r.recompute}{' SP' if r.sequence_parallel else ''}",
                f"{r.pp}/{r.tp}/{r.dp}",
                f"{r.throughput_seq_s:.4g}",
                f"{r.speedup_vs_tpuv4_expert:.2f}",
            ]
        )
    fig, ax = plt.subplots(figsize=(11, 0.6 + 0.28 * (len(cells) + 1)))
    ax.axis("off")
    if cells:
        table = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="center")
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        table.scale(1, 1.2)
    ax.set_title(f"Chosen architectures, HBM {hbm_capacity_bytes / GIB:g} GiB", fontsize=10)
    fig.tight_layout()
    return fig


def pipeline_stages(best: pd.DataFrame, hbm_capacity_bytes: int, mode: str):
    rows = _one_devices(
        best[
            (best["hbm_capacity_bytes"] == hbm_capacity_bytes)
            & (best["mode"] == mode)
            & (best["strategy"] == "phaze-per-model")
        ]
    )
    rows = rows.sort_values("model")
    fig, axes = _panels(len(rows))
    for ax, r in zip(axes, rows.itertuples(index=False)):
        stages = json.loads(r.stages or "[]")
        mem = np.array(json.loads(r.stage_mem_bytes or "[]"), dtype=float) / GIB
        idx = np.arange(len(stages))
        ax.bar(idx, [s["layers"] for s in stages], color="C0", label="layers")
        ax.set_xticks(idx)
        ax.set_xlabel("pipeline stage")
        ax.set_ylabel("layers per stage", color="C0")
        ax2 = ax.twinx()
        if len(mem) == len(stages):
            ax2.plot(idx, mem, "o-", color="C3", label="memory per device")
        ax2.axhline(hbm_capacity_bytes / GIB, color="C3", ls="--", lw=0.8)
        ax2.set_ylabel("memory per device (GiB; dashed: HBM)", color="C3")
        ax2.set_ylim(0, hbm_capacity_bytes / GIB * 1.1)
        ax.set_title(
            f"{r.model}: pp={r.pp} tp={r.tp} dp={r.dp}, b={r.microbatch}, V={r.interleave}, "
            f"recompute {r.recompute}",
            fontsize=8,
        )
    fig.suptitle(f"Phaze-Per-Model placements, HBM {hbm_capacity_bytes / GIB:g} GiB", fontsize=10)
    fig.tight_layout()
    return fig


def hbm_sensitivity(comparison: pd.DataFrame):
    """Throughput of each Phaze strategy at every HBM size, relative to its largest HBM."""
    cmp = _one_devices(comparison)
    hbms = sorted(cmp["hbm_capacity_bytes"].unique())
    models = sorted(cmp["model"].unique())
    fig, axes = plt.subplots(1, len(PHAZE), figsize=(max(4.5, 0.9 * len(models)) * 2, 3.6))
    x = np.arange(len(models))
    w = 0.8 / max(1, len(hbms))
    for ax, (strategy, label, _color) in zip(np.atleast_1d(axes), PHAZE):
        sub = cmp[cmp["strategy"] == strategy]
        thr = sub.groupby(["model", "hbm_capacity_bytes"])["throughput_seq_s"].max()
        for j, h in enumerate(hbms):
            vals = [thr.get((m, h), np.nan) / thr.get((m, hbms[-1]), np.nan) for m in models]
            ax.bar(x + (j - (len(hbms) - 1) / 2) * w, vals, w, label=f"{h / GIB:g} GiB")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(x, models, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"throughput / throughput at {hbms[-1] / GIB:g} GiB")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7, title="HBM", title_fontsize=7)
    fig.suptitle("HBM size sensitivity (each HBM size searched on its own)", fontsize=10)
    fig.tight_layout()
    return fig


def make_figures(best, comparison, explored, front, certified, mode, hbm_gib=None) -> dict:
    """{name: Figure} for every name of FIGURES; ``mode`` = the search mode whose answers the
    comparison holds (config ``search.mode``)."""
    h = pick_hbm(comparison, hbm_gib)
    figs = {
        "speedup": speedup_bars(comparison, h),
        "convergence": convergence(explored, best, h),
        "area_throughput": area_throughput(certified, front, best, comparison, h, mode),
        "arch_table": arch_table(best, comparison, h, mode),
        "pipeline": pipeline_stages(best, h, mode),
        "hbm_sensitivity": hbm_sensitivity(comparison),
    }
    if list(figs) != list(FIGURES):
        raise AssertionError(f"make_figures makes {list(figs)}, FIGURES lists {list(FIGURES)}")
    return figs
