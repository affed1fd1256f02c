"""The paper artifact from a finished `config/paper.yaml` run: run.json, comparison.csv, figures.

Reads a results directory after

    /usr/bin/time -v -o TIME bash scripts/run.sh --configfile config/paper.yaml -j 2

and writes into --out (default docs/paper/):

- run.json: CPU seconds per rule (the jobs' `benchmark:` files), the Snakemake process's own
  (TIME's user + sys, which include every child, minus the jobs'), `cpu_s_total`, wall time,
  architectures visited per search, ILP instances solved and avoided, the largest certified gap;
- comparison.csv: one row per model x strategy x HBM size (the chosen architecture's parameters,
  its placement and every speedup), sorted, so its hash identifies the result;
- claims.json: the figures docs/paper.md sets beside the paper's claims (mean speedups per
  strategy, baseline and HBM; throughput per HBM size; the chosen buffers and vector cores);
- the report's figures (phaze/report/plots.py) for the chosen HBM size as PNG.

A re-run with a changed config (say `--config place.model=upstream`) re-runs only what depends on
the change; --since EPOCH counts only the benchmark files written after that moment, and --name
picks the output names (run_NAME.json, comparison_NAME.csv, claims_NAME.json, figures) so both
runs sit side by side.

    .venv/bin/python benchmarks/paper.py --results results --time TIME [--start EPOCH]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phaze.units import GIB
from phaze.workflow.sweep import SOLVE_TIERS

COMPARISON_COLUMNS = [
    "model",
    "strategy",
    "hbm_gib",
    "throughput_seq_s",
    "speedup_vs_tpuv4_expert",
    "speedup_vs_tpuv4_phaze",
    "speedup_vs_placement_blind",
    "speedup_vs_tpuv4_upstream_expert",
    "certified_gap",
    "arch",
    "area_mm2",
    "n_tc",
    "tc_width",
    "tc_depth",
    "n_vc",
    "vc_width",
    "glb_mib",
    "microbatch",
    "tp",
    "pp",
    "dp",
    "interleave",
    "recompute",
    "sequence_parallel",
    "distributed_optimizer",
    "ddp",
    "mfu",
    "archs_visited",
]


#: the ILP solves of a round (rules/search.smk's ``{solve}``, the Sweep's): their jobs are
#: schedule_ilp, place_ilp and search_prune
ILP_SOLVES = tuple(SOLVE_TIERS)


def rule_of(path: Path) -> str:
    """The rule whose `benchmark:` file this is (the paths of rules/*.smk)."""
    parts, stem = path.parts, path.stem
    stage = parts[0]
    if stage == "schedule":
        ilp = {solve: "schedule_ilp" for solve in ILP_SOLVES}
        return {"bounds": "schedule_bounds", **ilp}.get(
            parts[-2], "schedule_blind" if stem == "blind" else "schedule"
        )
    if stage == "estimate":
        if re.fullmatch(r"r\d+_c\d+", stem):
            return "estimate_round"
        return "estimate_blind" if stem == "blind" else "estimate"
    if stage == "place":
        for tail, rule in (
            ("bounds", "bounds"),
            ("blind", "blind"),
            *((s, "ilp") for s in ILP_SOLVES),
        ):
            if stem.endswith(f"_{tail}"):
                return f"place_{rule}"
        return "place"
    if stage == "search":
        if len(parts) > 2 and parts[1] == "space":
            return "space_bounds"
        if len(parts) > 2 and parts[1] == "tier":
            return "search_tier"
        if stem.startswith("blind_"):
            return "search_blind"
        m = re.fullmatch(rf"r\d+_(?:(?:{'|'.join(ILP_SOLVES)})_)?(prune|select)", stem)
        return f"search_{m.group(1)}" if m else f"search_{stem}"
    if stage == "report":
        return "report_plots"
    return stage


def job_cpu(
    results: Path, since: float = 0.0, until: float = float("inf")
) -> tuple[Counter, Counter]:
    """(CPU seconds, jobs) per rule from the benchmark files written in [since, until)."""
    cpu, jobs = Counter(), Counter()
    root = results / "benchmarks"
    for f in sorted(root.rglob("*.tsv")):
        if not since <= f.stat().st_mtime < until:
            continue
        rule = rule_of(f.relative_to(root))
        cpu[rule] += float(pd.read_csv(f, sep="\t").iloc[-1]["cpu_time"])
        jobs[rule] += 1
    return cpu, jobs


def gnu_time(path: Path) -> dict:
    """:func:`gnu_time_report` of a file holding `/usr/bin/time -v`'s report."""
    return gnu_time_report(path.read_text(), str(path))


def gnu_time_report(text: str, source: str) -> dict:
    """user + sys CPU seconds, wall seconds, peak RSS and exit status from `/usr/bin/time -v`'s
    report in ``text`` (``source`` names it in an error). The other benchmarks use it too."""

    def field(name):
        m = re.search(rf"{re.escape(name)}: (.+)", text)
        if not m:
            raise SystemExit(f"{source}: no '{name}' line (not a /usr/bin/time -v report)")
        return m.group(1).strip()

    wall = 0.0
    for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":"):
        wall = wall * 60 + float(part)
    return {
        "cpu_s": float(field("User time (seconds)")) + float(field("System time (seconds)")),
        "wall_s": wall,
        "max_rss_kib": int(field("Maximum resident set size (kbytes)")),
        "exit_status": int(field("Exit status")),
    }


def invocations(results: Path, specs: list[str]) -> list[dict]:
    """One entry per Snakemake invocation of a run that was interrupted and resumed:
    ``START,END,WHAT`` (epoch seconds; WHAT = the invocation's /usr/bin/time -v report, or the
    Snakemake process's own CPU seconds measured otherwise, e.g. with ps). The jobs whose
    benchmark files were written in [START, END) belong to it."""
    out = []
    for spec in specs:
        start, end, what = spec.split(",", 2)
        cpu, _jobs = job_cpu(results, float(start), float(end))
        jobs = sum(cpu.values())
        entry = {"start": float(start), "end": float(end), "cpu_s_jobs": round(jobs, 2)}
        if Path(what).is_file():
            t = gnu_time(Path(what))
            entry.update(
                wall_s=round(t["wall_s"], 1),
                cpu_s_snakemake=round(t["cpu_s"] - jobs, 2),
                snakemake_exit_status=t["exit_status"],
            )
        else:
            entry.update(wall_s=round(float(end) - float(start), 1), cpu_s_snakemake=float(what))
        entry["cpu_s_total"] = round(entry["cpu_s_jobs"] + entry["cpu_s_snakemake"], 2)
        out.append(entry)
    return out


def searches(best: pd.DataFrame) -> list[dict]:
    """Every search's answer in the configured mode beside the early stop's (upstream's rule, from
    the same tables): architecture, area, throughput (Phaze-Common: its score), the ratio of the
    two, and each answer's certificate with what it covers (the whole space, or the buckets the
    early stop visited) and how many architectures it refined or visited."""
    keys = ["strategy", "common_score", "model", "hbm_capacity_bytes", "devices"]
    best = best.copy()
    best["common_score"] = best["common_score"].fillna("")
    # Phaze-Common's answer has one row per model (one arch); its search is model "*"
    common = best["strategy"] == "phaze-common"
    best.loc[common, "model"] = "*"
    best = best.drop_duplicates(keys + ["mode"])
    modes = sorted(set(best["mode"]) - {"early_stop"})
    out = []
    for key, grp in best.groupby(keys, sort=True):
        by_mode = grp.set_index("mode")
        row = {
            "strategy": key[0],
            "common_score": key[1] or None,
            "model": key[2],
            "hbm_gib": key[3] / GIB,
            "devices": int(key[4]),
        }
        for mode in modes + ["early_stop"]:
            if mode not in by_mode.index:
                continue
            r = by_mode.loc[mode]
            row[mode] = {
                "arch": r["arch"],
                "area_mm2": round(float(r["area_mm2"]), 3),
                "score": float(r["search_score"]),
                "certified_gap": float(r["certified_gap"]),
                "space_gap": float(r["space_gap"]),
                "archs_refined": int(r["archs_refined"]),
                "archs_visited": int(r["archs_visited"]),
            }
        if modes and modes[0] in row and "early_stop" in row:
            row["ratio"] = row[modes[0]]["score"] / row["early_stop"]["score"]
        out.append(row)
    return out


def comparison_table(cmp: pd.DataFrame) -> pd.DataFrame:
    cmp = cmp[cmp["devices"] == cmp["devices"].max()].copy()
    cmp["hbm_gib"] = cmp["hbm_capacity_bytes"] / GIB
    cmp["glb_mib"] = cmp["glb_bytes"] / 2**20
    missing = [c for c in COMPARISON_COLUMNS if c not in cmp.columns]
    if missing:
        raise SystemExit(f"comparison.parquet lacks {missing}")
    return (
        cmp[COMPARISON_COLUMNS]
        .sort_values(["model", "strategy", "hbm_gib"], kind="stable")
        .reset_index(drop=True)
    )


def _means(values) -> dict:
    from phaze.report.plots import speedup_means

    geo, arith = speedup_means(values)
    return {"geo_mean": round(geo, 4), "arith_mean": round(arith, 4)}


def claims(table: pd.DataFrame) -> dict:
    """The figures the paper's claims are compared with (docs/paper.md), from comparison.csv's
    rows: mean speedups per strategy x baseline x HBM, the throughput each Phaze strategy loses
    at each HBM size against the largest, and the chosen architectures' buffers and cores."""
    out = {"speedups": {}, "hbm": {}, "chosen": {}}
    phaze = table[table["strategy"].str.startswith("phaze-")]
    for (strategy, hbm), grp in phaze.groupby(["strategy", "hbm_gib"]):
        out["speedups"][f"{strategy} @ {hbm:g} GiB"] = {
            base: _means(grp[f"speedup_vs_{base}"])
            for base in ("tpuv4_expert", "tpuv4_phaze", "placement_blind", "tpuv4_upstream_expert")
        }
    top = phaze["hbm_gib"].max()
    for strategy, grp in phaze.groupby("strategy"):
        thr = grp.pivot_table(index="model", columns="hbm_gib", values="throughput_seq_s")
        out["hbm"][strategy] = {
            f"{h:g} GiB": _means(thr[h] / thr[top]) for h in sorted(thr.columns)
        }
    for (strategy, hbm), grp in phaze.groupby(["strategy", "hbm_gib"]):
        archs = grp.drop_duplicates("arch")
        out["chosen"][f"{strategy} @ {hbm:g} GiB"] = {
            "archs": len(archs),
            "glb_mib": sorted({float(v) for v in archs["glb_mib"]}),
            "n_vc": sorted({int(v) for v in archs["n_vc"]}),
            "n_tc": sorted({int(v) for v in archs["n_tc"]}),
            "tc_array": sorted(
                {f"{int(w)}x{int(d)}" for w, d in zip(archs["tc_width"], archs["tc_depth"])}
            ),
        }
    tpu = table[table["strategy"] == "tpuv4-expert"].drop_duplicates("arch")
    out["tpuv4"] = {
        "glb_mib": sorted({float(v) for v in tpu["glb_mib"]}),
        "n_vc": sorted({int(v) for v in tpu["n_vc"]}),
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=REPO / "results")
    ap.add_argument("--time", type=Path, help="the run's /usr/bin/time -v report")
    ap.add_argument(
        "--invocation",
        action="append",
        default=[],
        metavar="START,END,TIME_OR_CPU_S",
        help="a resumed run: one per Snakemake invocation (instead of --time; see invocations())",
    )
    ap.add_argument("--since", type=float, default=0.0, help="count benchmark files after this")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "paper")
    ap.add_argument("--name", default="", help="suffix of the output names (a variant's run)")
    ap.add_argument("--config", default="config/paper.yaml", help="recorded in run.json")
    ap.add_argument(
        "--commit", help="recorded in run.json (default: HEAD of the results' tree, if a checkout)"
    )
    ap.add_argument("--hbm-gib", type=float, help="HBM size of the per-HBM figures (default: max)")
    ap.add_argument("--no-figures", action="store_true")
    args = ap.parse_args()

    from phaze.io import read_table

    summary = args.results / "summary"
    best = read_table(summary / "best.parquet", "best", nonempty=True)
    cmp = read_table(summary / "comparison.parquet", "comparison", nonempty=True)
    explored = read_table(summary / "explored.parquet", "explored", nonempty=True)
    stats = json.loads((summary / "search_stats.json").read_text())
    cpu, jobs = job_cpu(args.results, args.since)
    cpu_jobs = sum(cpu.values())
    run = {
        "config": args.config,
        "commit": args.commit
        or subprocess.run(
            ["git", "-C", str(args.results.parent), "rev-parse", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "cpu_s_per_rule": {k: round(cpu[k], 2) for k in sorted(cpu)},
        "jobs_per_rule": {k: jobs[k] for k in sorted(jobs)},
        "cpu_s_jobs": round(cpu_jobs, 2),
    }
    if args.invocation:
        inv = invocations(args.results, args.invocation)
        run.update(
            invocations=inv,
            cpu_s_snakemake=round(sum(i["cpu_s_snakemake"] for i in inv), 2),
            cpu_s_total=round(sum(i["cpu_s_total"] for i in inv), 2),
            wall_s=round(sum(i["wall_s"] for i in inv), 1),
        )
    elif args.time:
        t = gnu_time(args.time)
        run.update(
            cpu_s_snakemake=round(t["cpu_s"] - cpu_jobs, 2),
            cpu_s_total=round(t["cpu_s"], 2),
            wall_s=round(t["wall_s"], 1),
            snakemake_exit_status=t["exit_status"],
        )
    else:
        run["cpu_s_total"] = round(cpu_jobs, 2)
    run["cpu_h_total"] = round(run["cpu_s_total"] / 3600, 3)
    run.update(
        ilp_instances_solved=stats["ilp_instances"],
        ilp_instances_avoided=stats["ilp_instances_avoided_by_pruning"],
        ilp_instances_deepened=stats.get("ilp_instances_deepened"),
        archs_deepened=stats.get("archs_deepened"),
        components_deep=stats.get("components_deep"),
        archs_certified=stats.get("archs_certified"),
        components_certified=stats.get("components_certified"),
        archs_in_space=stats["archs_in_space"],
        archs_refined=stats["archs_refined"],
        archs_with_ilp=stats["archs_with_ilp"],
        components_in_space=stats["components_in_space"],
        components_refined=stats["components_refined"],
        components_ilp=stats["components_ilp"],
        rounds_computed=stats["rounds_computed"],
        certified_gap_max=stats.get("certified_gap_max"),
        space_gap_max=stats.get("space_gap_max"),
        front_gap_max=stats.get("front_gap_max"),
        no_answer=stats.get("no_answer"),
        searches=searches(best),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"_{args.name}" if args.name else ""
    (args.out / f"run{suffix}.json").write_text(json.dumps(run, indent=1) + "\n")
    table = comparison_table(cmp)
    table.to_csv(args.out / f"comparison{suffix}.csv", index=False)
    (args.out / f"claims{suffix}.json").write_text(json.dumps(claims(table), indent=1) + "\n")
    mode = stats["settings"]["mode"]  # the configured search mode, beside the early stop
    if not args.no_figures:
        import matplotlib.pyplot as plt

        from phaze.report.plots import make_figures

        front = read_table(summary / "front.parquet", "front")
        certified = read_table(summary / "certified.parquet", "certified")
        figs = make_figures(best, cmp, explored, front, certified, mode, args.hbm_gib)
        for name, fig in figs.items():
            fig.savefig(args.out / f"{name}{suffix}.png", dpi=110, bbox_inches="tight")
            plt.close(fig)
    keys = ["cpu_s_total", "cpu_h_total", "wall_s", "ilp_instances_solved", "certified_gap_max"]
    print(json.dumps({k: run.get(k) for k in keys}))
    for row in run["searches"]:
        if mode == "early_stop" or mode not in row:
            continue
        a, e = row[mode], row.get("early_stop")
        name = row["model"] + (f" ({row['common_score']})" if row["common_score"] else "")
        line = (
            f"{row['strategy']:<16}{name:<24}{row['hbm_gib']:>4g} GiB  {mode}: {a['arch']} "
            f"{a['area_mm2']:7.1f} mm2 {a['score']:12.6g} (cert {100 * a['certified_gap']:.2f} %)"
        )
        if e is not None:
            line += (
                f"  early_stop: {e['arch']} {e['area_mm2']:7.1f} mm2 {e['score']:12.6g}"
                f"  ratio {row['ratio']:.4f}"
            )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
