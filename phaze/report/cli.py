"""`python -m phaze report`: the plots from results/summary/*.parquet (PNG + PDF), or with
``--table`` the run's closing table (phaze/report/closing.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from phaze.config import add_config_argument, load_config
from phaze.errors import PhazeError
from phaze.io import atomic_path, read_table
from phaze.report.closing import closing_note


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--summary",
        required=True,
        help="directory with best/comparison/explored/front/certified.parquet",
    )
    add_config_argument(parser)
    parser.add_argument("--out-dir", help="plot directory (with --table: default DIR/../plots)")
    parser.add_argument(
        "--table",
        action="store_true",
        help="print the answers and where the tables, plots and report are; write nothing",
    )


def run(args: argparse.Namespace) -> int:
    if args.table:
        results = Path(args.summary).parent
        plots = Path(args.out_dir) if args.out_dir else results / "plots"
        print(closing_note(Path(args.summary), plots, results / "report.html"))
        return 0
    if args.out_dir is None:
        raise PhazeError(
            "--out-dir is required to write the plots (or --table to print the answers)"
        )
    import matplotlib.pyplot as plt  # deferred: matplotlib

    from phaze.report.plots import make_figures  # deferred: pulls matplotlib

    config = load_config(args.config)
    cfg = config["report"]
    d = Path(args.summary)
    best = read_table(d / "best.parquet", "best", nonempty=True)
    comparison = read_table(d / "comparison.parquet", "comparison", nonempty=True)
    explored = read_table(d / "explored.parquet", "explored")
    front = read_table(d / "front.parquet", "front")
    certified = read_table(d / "certified.parquet", "certified")
    mode = config["search"]["mode"]
    figs = make_figures(best, comparison, explored, front, certified, mode, cfg["hbm_gib"])
    out = Path(args.out_dir)
    for name, fig in figs.items():
        for fmt in cfg["formats"]:
            with atomic_path(out / f"{name}.{fmt}") as tmp:
                fig.savefig(tmp, format=fmt, dpi=cfg["dpi"], bbox_inches="tight")
        plt.close(fig)
    print(f"phaze report: {len(figs)} figures x {cfg['formats']} -> {out}")
    return 0
