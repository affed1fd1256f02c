"""The chosen architecture and the TPUv4 baselines against the interconnect's link bandwidth.

    .venv/bin/python benchmarks/network_study.py --workdir DIR \
        [--models opt-350m llama2-7b gpt3-175b] [--link-gbps 4 16 45 100] [--hbm-gib 32] [--jobs 2]
        [--seed RUN_TREE]

For each link bandwidth, a copy of the committed tree (``git archive HEAD``, .venv linked) runs
the paper sweep on TPU v4's torus (`config/paper.yaml` + `config/paper-ici.yaml`) with that
bandwidth per link and direction, the given models and HBM size, and everything else unchanged:
a new global search at every point, so the architecture may change with the network. A point
whose `results/summary/` exists is not run again (re-running the script resumes). Then
`DIR/network_study.csv` (one row per point, model and strategy: throughput, MFU, architecture,
placement) and `DIR/network_study.png` (per model, Phaze-Per-Model's and the TPUv4 baselines'
throughput against the link bandwidth, the flat 4 GiB/s link of upstream's config marked), and
each point's CPU time from its jobs' `benchmark:` files (those written since the point started)
and, from `/usr/bin/time -v` around its last invocation, the Snakemake process's too.

Every point after the first takes the schedule solutions of the points before it (and of
--seed's run) where its layers equal theirs (config ``schedule.reuse``, docs/schedule.md): the
link bandwidth changes only the layers' collectives, so most layer segments are not solved again.

--seed names a finished run's tree (say a `config/paper.yaml` run): each new point starts from a
copy of its `results/` (but `results/summary/`) and its Snakemake metadata, so the jobs the link
bandwidth does not reach (trace, estimate, schedule: their rules' params hold no network) are
reused where the point's search asks for the same ones, and Snakemake re-runs every job whose
config section, code or inputs differ, as in any incremental run.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: the strategies the figure draws, and how
STRATEGIES = {
    "phaze-per-model": ("Phaze-Per-Model (re-searched)", "C0", "o-"),
    "tpuv4-phaze": ("TPUv4, our placement", "k", "s--"),
    "tpuv4-expert": ("TPUv4, expert placement", "0.5", "D:"),
}
COLUMNS = [
    "link_GBps",
    "model",
    "strategy",
    "throughput_seq_s",
    "mfu",
    "arch",
    "area_mm2",
    "pp",
    "tp",
    "dp",
    "microbatch",
    "certified_gap",
]


def overlay(
    models: list[str], hbm_gib: list[float], link_Bps: float, reuse: list[Path] = ()
) -> dict:
    """The config overlay of one point: config/paper-ici.yaml's torus at ``link_Bps``; the
    schedule solutions of the finished runs' results ``reuse`` are taken where they apply."""
    ici = yaml.safe_load((REPO / "config" / "paper-ici.yaml").read_text())
    net = ici["place"]["network"]
    net["link"] = {**net["link"], "bandwidth_Bps": float(link_Bps)}
    cfg = {"models": list(models), "place": {"hbm_gib": list(hbm_gib), "network": net}}
    if reuse:
        # each directory once (a --seed that is also a point is named by both)
        cfg["schedule"] = {"reuse": list(dict.fromkeys(str(Path(r).resolve()) for r in reuse))}
    return cfg


def seed(run: Path, dest: Path) -> None:
    """``run``'s results (but its summary) and Snakemake metadata copied into ``dest``, times
    kept, so Snakemake takes the copied outputs as its own."""
    if not (run / "results").is_dir() or not (run / ".snakemake" / "metadata").is_dir():
        raise SystemExit(f"network_study: {run} holds no finished run (results/, .snakemake/)")
    shutil.copytree(
        run / "results",
        dest / "results",
        ignore=lambda d, names: ["summary"] if Path(d) == run / "results" else [],
        dirs_exist_ok=True,
    )
    shutil.copytree(run / ".snakemake" / "metadata", dest / ".snakemake" / "metadata")


def collate(points: dict[float, Path]) -> pd.DataFrame:
    """One row per (link bandwidth, model, strategy) from each point's comparison table (the
    largest cluster size)."""
    frames = []
    for gbps, summary in sorted(points.items()):
        cmp = pd.read_parquet(summary / "comparison.parquet")
        cmp = cmp[cmp["devices"] == cmp["devices"].max()]
        cmp = cmp[cmp["strategy"].isin(list(STRATEGIES))].copy()
        cmp.insert(0, "link_GBps", gbps)
        frames.append(cmp)
    if not frames:
        raise SystemExit("network_study: no finished point")
    out = pd.concat(frames, ignore_index=True)
    return out[COLUMNS].sort_values(["model", "strategy", "link_GBps"]).reset_index(drop=True)


def figure(table: pd.DataFrame, flat_GBps: float | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = table[table["model"] == model]
        for strategy, (label, color, style) in STRATEGIES.items():
            s = mine[mine["strategy"] == strategy].sort_values("link_GBps")
            if len(s):
                ax.plot(s["link_GBps"], s["throughput_seq_s"], style, color=color, label=label)
        if flat_GBps is not None:
            ax.axvline(flat_GBps, color="C3", lw=0.8, ls=":", label="upstream's flat link")
        ax.set_xscale("log")
        # the points' bandwidths as plain numbers, not powers of ten
        ax.set_xticks(sorted(set(mine["link_GBps"])))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("ICI link bandwidth per direction (GB/s)")
        ax.set_ylabel("throughput (seq/s)")
        ax.set_title(model)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle("1,024 accelerators on TPU v4's 3D torus: throughput against link bandwidth")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["opt-350m", "llama2-7b", "gpt3-175b"])
    ap.add_argument("--link-gbps", nargs="+", type=float, default=[4.0, 16.0, 45.0, 100.0])
    ap.add_argument("--hbm-gib", nargs="+", type=float, default=[32.0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=Path, help="a finished run's tree each new point starts from")
    args = ap.parse_args(argv)
    if any(b <= 0 for b in args.link_gbps):
        print("network_study: --link-gbps must be positive", file=sys.stderr)
        return 2
    reproduce = _load("reproduce")
    paper = _load("paper")
    points = {}
    # the schedule solutions of the seed and of every point before (config schedule.reuse)
    reuse = [args.seed / "results"] if args.seed is not None else []
    for gbps in args.link_gbps:
        d = args.workdir / f"link_{gbps:g}GBps"
        summary = d / "results" / "summary"
        if not (summary / "comparison.parquet").is_file():
            if not d.exists():  # made aside, then renamed: a failed copy is not taken for a point
                tmp = d.with_name(d.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                reproduce.checkout(tmp)
                if args.seed is not None:
                    seed(args.seed, tmp)
                (tmp / "started").write_text(f"{time.time():.3f}\n")
                tmp.rename(d)
            cfg = overlay(args.models, args.hbm_gib, gbps * 1e9, reuse)
            (d / "config" / "network-study.yaml").write_text(yaml.safe_dump(cfg))
            cmd = ["/usr/bin/time", "-v", "-o", "time.txt", "bash", "scripts/run.sh"]
            cmd += ["--configfile", "config/paper.yaml"]
            cmd += ["config/network-study.yaml", "-j", str(args.jobs)]
            with open(d / "run.log", "a") as log:
                proc = subprocess.run(cmd, check=False, cwd=d, stdout=log, stderr=subprocess.STDOUT)
            rc = proc.returncode
            if rc != 0:
                where = d / "run.log"
                print(
                    f"network_study: the run at {gbps:g} GB/s failed; log: {where}", file=sys.stderr
                )
                return 2
        started = float((d / "started").read_text()) if (d / "started").is_file() else 0.0
        cpu, _jobs = paper.job_cpu(d / "results", started)
        line = f"{gbps:g} GB/s: {sum(cpu.values()):.0f} CPU-s of jobs"
        if (d / "time.txt").is_file():
            t = paper.gnu_time(d / "time.txt")
            line += f"; last invocation {t['cpu_s']:.0f} CPU-s, {t['wall_s']:.0f} s wall"
        print(line)
        points[gbps] = summary
        reuse.append(d / "results")
    table = collate(points)
    args.workdir.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.workdir / "network_study.csv", index=False)
    flat = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["costmodel"]
    fig = figure(table, flat["link_bandwidth_Bps"] / 1e9)
    fig.savefig(args.workdir / "network_study.png", dpi=110, bbox_inches="tight")
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
