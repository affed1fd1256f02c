"""CPU cost of the search, measured on a finished run, and its extrapolation to config/paper.yaml.

Reads a results directory of a completed run (default: the repo's results/ after
`bash scripts/run.sh`): the CPU time of every job (Snakemake `benchmark:` files), the work units
each stage did (architecture × trace for estimate/schedule, architecture × placement setting for
place), the ILP instances solved and avoided by pruning. Then scales the per-unit costs to the
paper's sweep: all eight models, their microbatch sizes and valid t, HBM sizes, the full
architecture grid — for an exhaustive search and for early stops that visit a given share of it.

    .venv/bin/python benchmarks/search.py [--results results] [--paper config/paper.yaml]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from paper import rule_of  # the rule of each benchmark file: one mapping for both scripts


def _cpu(results: Path) -> Counter:
    """CPU seconds per stage/tier from the benchmark files (rules named by paper.py's rule_of;
    the deep solve counts with the ILP tier, as its jobs are ILP solves at deeper limits)."""
    cpu = Counter()
    root = results / "benchmarks"
    for f in root.rglob("*.tsv"):
        cpu[tier_of(rule_of(f.relative_to(root)))] += float(
            pd.read_csv(f, sep="\t").iloc[-1]["cpu_time"]
        )
    return cpu


def tier_of(rule: str) -> str:
    """The key of a rule's per-unit cost below: a tiered rule's own name (schedule_ilp, ...), the
    untiered schedule / place / estimate rules' tier, else the stage (search, trace, ...)."""
    untiered = {
        "schedule": "schedule_bounds",
        "place": "place_bounds",
        "estimate": "estimate_chunks",
    }
    if rule in untiered:
        return untiered[rule]
    return rule if rule.startswith(("schedule_", "place_", "estimate_")) else rule.split("_")[0]


def _schedule_tables(results: Path) -> list[Path]:
    """The schedule tables (not the solutions files beside them, phaze.schedule.reuse)."""
    return [
        f
        for f in sorted((results / "schedule").rglob("*.parquet"))
        if not f.name.endswith(".solutions.parquet")
    ]


def _units(results: Path) -> Counter:
    u = Counter()
    for f in _schedule_tables(results):
        archs = pd.read_parquet(f, columns=["arch"])["arch"].nunique()
        tier = (
            "ilp"
            if f.parent.name in ("ilp", "deep")
            else "blind"
            if f.name == "blind.parquet"
            else "bounds"
        )
        u[f"schedule_{tier}"] += archs
        if tier == "bounds":
            u["estimate_chunks"] += archs  # same arch x trace units
    for f in (results / "place").rglob("*.parquet"):
        rows = len(pd.read_parquet(f, columns=["arch"]))
        tier = (
            "ilp"
            if f.stem.endswith(("_ilp", "_deep"))
            else "blind"
            if f.stem == "blind"
            else "bounds"
        )
        u[f"place_{tier}"] += rows  # arch x setting (x cluster size); bounds = ub + lo files
    u["trace"] = sum(1 for _ in (results / "trace").rglob("layers.parquet"))
    return u


def _ilp_time_limited(results: Path) -> tuple[int, int, float]:
    n = limited = 0
    solve = 0.0
    for f in _schedule_tables(results):
        if f.parent.name != "ilp":
            continue
        df = pd.read_parquet(f, columns=["status", "solve_s"])
        n += len(df)
        limited += int((df["status"] == "time_limit").sum())
        solve += float(df["solve_s"].sum())
    return n, limited, solve


def _paper_counts(paper: Path) -> dict:
    from phaze.config import load_config
    from phaze.trace.models import get_model_spec

    cfg = load_config(paper)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "space.parquet"
        subprocess.run(
            [sys.executable, "-m", "phaze", "arch", "--config", str(paper), "--out", str(out)],
            check=True,
            capture_output=True,
            cwd=REPO,
        )
        archs = len(pd.read_parquet(out, columns=["arch"]))
    traces = sum(
        len(cfg["trace"]["microbatch"])
        * len([t for t in cfg["trace"]["tp"] if t in get_model_spec(m).valid_tp])
        for m in cfg["models"]
    )
    settings = (
        len(cfg["models"])
        * len(cfg["trace"]["microbatch"])
        * len(cfg["place"]["hbm_gib"])
        * len(cfg["place"]["devices"])
    )
    return {
        "archs": archs,
        "traces": traces,
        "place_settings": settings,
        "time_limit_s": float(cfg["schedule"]["time_limit_s"]),
        "models": len(cfg["models"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(REPO / "results"))
    ap.add_argument("--paper", default=str(REPO / "config" / "paper.yaml"))
    args = ap.parse_args()
    results = Path(args.results)
    stats = json.loads((results / "summary" / "search_stats.json").read_text())
    cpu, units = _cpu(results), _units(results)
    total = sum(cpu.values())
    print(f"measured run: {results}")
    print(f"  CPU time of all jobs: {total:.1f} s ({total / 3600:.3f} CPU-hours)")
    for k in sorted(cpu, key=cpu.get, reverse=True):
        per = f"{cpu[k] / units[k]:.4f} s per unit ({units[k]} units)" if units.get(k) else ""
        print(f"  {k:<18}{cpu[k]:>9.1f} s  {per}")
    n_ilp, n_limited, solve = _ilp_time_limited(results)
    print(f"  ILP tier: {n_ilp} instances, {n_limited} hit the time limit, {solve:.1f} s in solves")
    print(
        f"  ILP instances solved: {stats['ilp_instances']}, avoided by pruning: "
        f"{stats['ilp_instances_avoided_by_pruning']}; archs refined {stats['archs_refined']} "
        f"of {stats['archs_in_space']}, with ILP {stats['archs_with_ilp']}"
    )

    p = _paper_counts(Path(args.paper))
    arch_trace_cost = sum(cpu[k] for k in ("estimate_chunks", "schedule_bounds")) / max(
        1, units["schedule_bounds"]
    )
    ilp_share = units["schedule_ilp"] / max(1, units["schedule_bounds"])
    ilp_unit = cpu["schedule_ilp"] / max(1, units["schedule_ilp"])
    # worst case for the paper's longer limit: every instance that hit the limit runs to it
    ilp_unit_paper = ilp_unit + (n_limited / max(1, units["schedule_ilp"])) * (
        p["time_limit_s"] - 2.0
    )
    # one bound-tier unit = the ub + lo placements of one arch x setting (two files)
    place_bounds_unit = cpu["place_bounds"] / max(1, units["place_bounds"] / 2)
    place_ilp_unit = cpu["place_ilp"] / max(1, units["place_ilp"])
    per_arch = p["traces"] * (arch_trace_cost + ilp_share * ilp_unit) + p["place_settings"] * (
        place_bounds_unit + ilp_share * place_ilp_unit
    )
    per_arch_paper_limit = per_arch + p["traces"] * ilp_share * (ilp_unit_paper - ilp_unit)
    fixed = cpu["trace"] / max(1, units["trace"]) * p["traces"]
    print(
        f"\npaper sweep ({args.paper}): {p['archs']} archs, {p['traces']} traces, "
        f"{p['place_settings']} placement settings per arch"
    )
    print(
        f"  per visited arch: {per_arch:.1f} CPU-s with the measured ILP cost, "
        f"{per_arch_paper_limit:.1f} CPU-s if every time-limited ILP runs to {p['time_limit_s']:g} s"
    )
    print(f"  fixed (traces): {fixed / 3600:.2f} CPU-hours")
    print(f"  {'visited share':>14}{'archs':>8}{'CPU-h':>10}{'CPU-h (60 s ILPs)':>20}")
    for share in (1.0, 0.1, 0.01, 0.001):
        n = max(1, round(share * p["archs"]))
        print(
            f"  {share:>14.1%}{n:>8}{(fixed + n * per_arch) / 3600:>10.2f}"
            f"{(fixed + n * per_arch_paper_limit) / 3600:>20.2f}"
        )
    budget = 4 * 3600
    print(
        f"  archs affordable within 4 CPU-hours: {int((budget - fixed) / per_arch)} "
        f"({int((budget - fixed) / per_arch_paper_limit)} with 60 s ILPs)"
    )
    print(
        "  assumptions: the paper's models cost per unit what the default's do (same op graphs per"
        " block, larger shapes do not change the op count), and the measured share of archs that"
        " needed the ILP after pruning carries over."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
