"""The array tier (`phaze search tier`) on a real grid: its cost per (architecture, model,
microbatch), and its intervals beside today's bound tier's on the same architectures.

For each model × microbatch given: builds the space (`phaze arch`) and the traces (`phaze trace`)
of a config into a scratch directory (or reuses them); then

* cost: `phaze search tier` on ``--archs`` random architectures of the space, under
  `/usr/bin/time -v` (the whole command: start-up, traces, latencies, schedules, bounds and both
  placements, every HBM size and cluster size of the config), in CPU seconds per architecture;
* intervals: on ``--compare`` random grid architectures, today's bound tier as the workflow runs
  it (`phaze estimate`, `phaze schedule --tier bounds` per width, `phaze place` on the lower
  bounds (ub) and on the makespans (lo) at the first HBM size) beside the array tier's values
  of the same architectures: per (architecture, width, layer, pass) the array tier's makespan
  over the bound tier's, the bound tier's lower bound over the array tier's, and each tier's
  interval (makespan / lower bound); per architecture the same of the placements' throughputs.
  Ratios above 1 are where the array tier is looser. Also the bound tier's CPU seconds.

    .venv/bin/python benchmarks/array_tier.py [--config config/paper.yaml] \\
        [--pairs bert-large:1] [--archs 2000] [--compare 40] [--work /tmp/array_tier]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PY = str(REPO / ".venv" / "bin" / "python")
sys.path.insert(0, str(REPO / "benchmarks"))

# the /usr/bin/time -v reader of benchmarks/paper.py, beside this script
from paper import gnu_time_report


def run(cmd: list[str]) -> dict:
    """Run a phaze command under /usr/bin/time -v: CPU seconds, wall, peak RSS."""
    out = subprocess.run(
        ["/usr/bin/time", "-v", PY, "-m", "phaze", *cmd],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    t = gnu_time_report(out.stderr, " ".join(cmd))
    return {"cpu_s": t["cpu_s"], "wall_s": t["wall_s"], "max_rss_mib": t["max_rss_kib"] / 1024}


def summary(x: pd.Series) -> dict:
    x = x.replace([np.inf, -np.inf], np.nan).dropna()
    return {
        "n": len(x),
        "median": round(float(x.median()), 4),
        "p90": round(float(x.quantile(0.9)), 4),
        "max": round(float(x.max()), 4),
    }


def tier(args, config, model, b, tps, dirs, space_path, archs, tag) -> tuple[dict, list, list]:
    hbm = config["place"]["hbm_gib"]
    ub = [str(args.work / f"{tag}_ub_h{h}.parquet") for h in hbm]
    lo = [str(args.work / f"{tag}_lo_h{h}.parquet") for h in hbm]
    layers = str(args.work / f"{tag}_layers.parquet")
    cost = run(
        ["search", "tier", "--model", model, "--microbatch", str(b), "--tp", *map(str, tps)]
        + ["--trace-dirs", *dirs, "--space", str(space_path), "--archs", ",".join(archs)]
        + ["--config", args.config, "--ub", *ub, "--lo", *lo, "--layers", layers]
    )
    return cost, [ub[0], lo[0]], layers


def bound_tier(args, config, model, b, tps, dirs, space_path, archs) -> tuple[float, dict]:
    """Today's bound tier on ``archs``: CPU seconds, and its ub / lo placement at the first HBM
    size and its schedules (one table per width)."""
    cpu = 0.0
    ids = ",".join(archs)
    scheds, lats = [], []
    for t, d in zip(tps, dirs):
        lat = str(args.work / f"{model}_b{b}_t{t}_lat.parquet")
        sch = str(args.work / f"{model}_b{b}_t{t}_sched.parquet")
        sol = str(args.work / f"{model}_b{b}_t{t}_sol.parquet")
        common = ["--config", args.config, "--trace", d, "--space", str(space_path)]
        cpu += run(["estimate", *common, "--archs", ids, "--out", lat])["cpu_s"]
        cpu += run(
            ["schedule", "--tier", "bounds", *common, "--latency", lat, "--archs", ids]
            + ["--out", sch, "--solutions", sol]
        )["cpu_s"]
        scheds.append(sch)
        lats.append(lat)
    out = {"schedules": scheds}
    h = str(config["place"]["hbm_gib"][0])
    for name, column in (("ub", "lower_bound_s"), ("lo", "makespan_s")):
        path = str(args.work / f"{model}_b{b}_{name}.parquet")
        cpu += run(
            ["place", "--model", model, "--tp", *map(str, tps), "--trace-dirs", *dirs]
            + ["--schedules", *scheds, "--latencies", *lats, "--space", str(space_path)]
            + ["--archs", ids, "--microbatch", str(b), "--hbm-gib", h]
            + ["--latency-column", column, "--config", args.config, "--out", path]
        )["cpu_s"]
        out[name] = path
    return cpu, out


def main() -> int:
    from phaze.config import load_config
    from phaze.trace.models import get_model_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/paper.yaml")
    ap.add_argument("--pairs", nargs="+", default=["bert-large:1"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/array_tier"))
    ap.add_argument("--archs", type=int, default=2000, help="architectures of the cost run")
    ap.add_argument("--compare", type=int, default=40, help="architectures beside the bound tier")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    config = load_config(args.config)
    args.work.mkdir(parents=True, exist_ok=True)
    space_path = args.work / "space.parquet"
    if not space_path.exists():
        run(["arch", "--config", args.config, "--out", str(space_path)])
    space = pd.read_parquet(space_path)
    print(f"{len(space)} architectures ({args.config})")
    rng = np.random.default_rng(args.seed)
    for pair in args.pairs:
        model, b = pair.split(":")
        b = int(b)
        spec = get_model_spec(model)
        tps = [t for t in config["trace"]["tp"] if t in spec.valid_tp]
        dirs = []
        for t in tps:
            d = args.work / "trace" / model / f"b{b}_tp{t}"
            if not (d / "layers.parquet").exists():
                cmd = ["trace", "--model", model, "--microbatch", str(b), "--tp", str(t)]
                run([*cmd, "--config", args.config, "--out", str(d)])
            dirs.append(str(d))
        dirs = [str(d) for d in dirs]
        # cost
        archs = list(space["arch"].to_numpy()[rng.choice(len(space), args.archs, replace=False)])
        cost, _, _ = tier(args, config, model, b, tps, dirs, space_path, archs, f"{model}_b{b}")
        per = cost["cpu_s"] / len(archs)
        print(
            json.dumps(
                {
                    "model": model,
                    "microbatch": b,
                    "archs": len(archs),
                    **{k: round(v, 2) for k, v in cost.items()},
                    "cpu_ms_per_arch": round(1e3 * per, 2),
                }
            )
        )
        # intervals beside the bound tier
        grid = space[space["preset"].fillna("") == ""]
        cmp_archs = list(
            grid["arch"].to_numpy()[rng.choice(len(grid), args.compare, replace=False)]
        )
        _, (aub, alo), alayers = tier(
            args, config, model, b, tps, dirs, space_path, cmp_archs, f"{model}_b{b}_cmp"
        )
        today_cpu, today = bound_tier(args, config, model, b, tps, dirs, space_path, cmp_archs)
        print(
            json.dumps(
                {
                    "bound_tier_cpu_s": round(today_cpu, 2),
                    "bound_tier_cpu_ms_per_arch": round(1e3 * today_cpu / len(cmp_archs), 1),
                    "note": "its placement at one HBM size only",
                }
            )
        )
        mine = pd.read_parquet(alayers)
        theirs = pd.concat(
            [pd.read_parquet(s).assign(tp=t) for t, s in zip(tps, today["schedules"])],
            ignore_index=True,
        )
        key = ["arch", "tp", "signature", "pass"]
        j = mine.merge(theirs[key + ["makespan_s", "lower_bound_s"]], on=key, suffixes=("", "_b"))
        rows = {
            "achieved: array / bound tier": j["makespan_s"] / j["makespan_s_b"],
            "bound: bound tier / array": j["lower_bound_s_b"] / j["lower_bound_s"],
            "interval, array (makespan / bound)": j["makespan_s"] / j["lower_bound_s"],
            "interval, bound tier": j["makespan_s_b"] / j["lower_bound_s_b"],
        }
        print(f"(architecture, width, layer, pass) pairs: {len(j)}")
        for name, x in rows.items():
            print(json.dumps({"layers": name, **summary(x)}))
        thr = {}
        for name, path in (
            ("array_ub", aub),
            ("array_lo", alo),
            ("ub", today["ub"]),
            ("lo", today["lo"]),
        ):
            df = pd.read_parquet(path)
            df = df[df["devices"] == config["place"]["devices"][0]]
            thr[name] = df.set_index("arch")["throughput_seq_s"].reindex(cmp_archs)
        prow = {
            "achieved: bound tier / array": thr["lo"] / thr["array_lo"],
            "bound: array / bound tier": thr["array_ub"] / thr["ub"],
            "interval, array (ub / lo)": thr["array_ub"] / thr["array_lo"],
            "interval, bound tier": thr["ub"] / thr["lo"],
        }
        print(f"placements (architectures, first HBM size and cluster size): {len(cmp_archs)}")
        for name, x in prow.items():
            print(json.dumps({"placement": name, **summary(x)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
