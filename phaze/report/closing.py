"""The closing note of a run: what the search found (per model, HBM size and cluster size, each
answer's architecture, area, throughput, speedup over TPUv4 and certificate) and where the
summary tables, plots and HTML report are."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from phaze.arch.space import MiB
from phaze.io import read_table
from phaze.units import GIB

#: the answers the table shows, in this order, with their names in the paper
ANSWERS = {"phaze-per-model": "Per-Model", "phaze-common": "Common"}
HEADER = (
    "model",
    "HBM GiB",
    "devices",
    "answer",
    "arch",
    "tensor cores × array, vector cores × lanes, buffer",
    "area mm²",
    "seq/s",
    "× TPUv4",
    "certified gap",
)
NUMERIC = {"HBM GiB", "devices", "area mm²", "seq/s", "× TPUv4", "certified gap"}
DASH = "—"


def arch_shape(row) -> str:
    """An architecture in one phrase: ``8 TC 128×128, 2 VC ×128, 128 MiB``."""
    return (
        f"{int(row.n_tc)} TC {int(row.tc_width)}×{int(row.tc_depth)}, "
        f"{int(row.n_vc)} VC ×{int(row.vc_width)}, {row.glb_bytes / MiB:g} MiB"
    )


def _number(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else DASH


def answer_cells(comparison: pd.DataFrame) -> list[tuple[str, ...]]:
    """One row of cells per answer (Per-Model, then Common) of each model × HBM × cluster size of
    the comparison table; an answer where nothing fits names no architecture."""
    rows = comparison[comparison["strategy"].isin(list(ANSWERS))].copy()
    rows["_order"] = rows["strategy"].map(list(ANSWERS).index)
    rows = rows.sort_values(["model", "hbm_capacity_bytes", "devices", "_order"])
    cells = []
    for r in rows.itertuples(index=False):
        answer = ANSWERS[r.strategy] + (f" ({r.common_score})" if r.common_score else "")
        head = (r.model, f"{r.hbm_capacity_bytes / GIB:g}", str(int(r.devices)), answer)
        if r.microbatch < 0 or not r.arch:
            cells.append((*head, DASH, "no placement fits any architecture", *[DASH] * 4))
            continue
        cells.append(
            (
                *head,
                r.arch,
                arch_shape(r),
                _number(r.area_mm2, ".1f"),
                _number(r.throughput_seq_s, ",.0f" if r.throughput_seq_s >= 1000 else ".4g"),
                _number(r.speedup_vs_tpuv4_expert, ".2f"),
                _number(100 * r.certified_gap, ".2f")
                + (" %" if math.isfinite(r.certified_gap) else ""),
            )
        )
    return cells


def format_table(header: tuple[str, ...], cells: list[tuple[str, ...]]) -> str:
    """Plain-text columns: text left-aligned, numbers right-aligned."""
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]

    def line(row) -> str:
        return "  ".join(
            cell.rjust(w) if name in NUMERIC else cell.ljust(w)
            for cell, w, name in zip(row, widths, header)
        ).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, cells)])


def _files(directory: Path) -> str:
    by_ext: dict[str, int] = {}
    for path in sorted(directory.glob("*.*")):
        by_ext[path.suffix[1:]] = by_ext.get(path.suffix[1:], 0) + 1
    return ", ".join(f"{n} {ext}" for ext, n in by_ext.items()) or "none yet"


def closing_note(summary_dir: Path, plots_dir: Path, report_html: Path) -> str:
    """The table of the answers in ``summary_dir/comparison.parquet`` and the paths of the
    tables, the plots and the HTML report (``PhazeError`` when the comparison is missing or
    malformed)."""
    summary_dir, plots_dir, report_html = Path(summary_dir), Path(plots_dir), Path(report_html)
    comparison = read_table(summary_dir / "comparison.parquet", "comparison", nonempty=True)
    modes = sorted({m for m in comparison["mode"] if m}) if "mode" in comparison else []
    title = "phaze: the answers" + (f" of search mode {', '.join(modes)}" if modes else "")
    title += (
        " (× TPUv4: throughput over TPUv4 with the expert placement; certified gap: no"
        " architecture the answer covers is faster by more than this)"
    )
    report = (
        f"{report_html}"
        if report_html.exists()
        else f"not built; `.venv/bin/snakemake --report {report_html}` builds it"
    )
    return "\n".join(
        [
            title,
            format_table(HEADER, answer_cells(comparison)),
            (
                f"tables: {summary_dir}/ (best, comparison, front, certified, explored .parquet;"
                " search_stats.json; columns in docs/design.md, 'Summary tables')"
            ),
            f"plots:  {plots_dir}/ ({_files(plots_dir)})",
            f"report: {report}",
        ]
    )
