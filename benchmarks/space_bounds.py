"""The space bound on a real grid: its cost per job and how close it is to the exact placement.

For each model × microbatch given: builds the space (`phaze arch`) and the traces (`phaze trace`)
of a config into a scratch directory (or reuses them), runs `phaze search bounds` as the workflow
does and reports its CPU seconds and peak memory (`/usr/bin/time -v`); then, for the
architectures with the largest bounds and a random sample, compares the bound with the exact
placement search (`phaze.place.megatron.optimize`, as `phaze place` runs it) on the same per-layer
lower bounds and windows: the bound must never be below it (violations: must be 0) and is
reported relative to it.

    .venv/bin/python benchmarks/space_bounds.py [--config config/paper.yaml] \\
        [--pairs bert-large:1 gpt3-175b:1 llama2-7b:1] [--work /tmp/space_bounds] [--top 25]
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


def exact_check(trace_dirs, tps, model, b, space, config, bounds, top, sample, seed=0):
    """Bound / exact placement on the same layer bounds, for the top and a random sample."""
    from phaze.estimate.model import achievable_hbm_Bps
    from phaze.place.megatron import optimize
    from phaze.place.objective_megatron import step_network
    from phaze.place.settings import PlaceSettings, hbm_capacity_bytes_of
    from phaze.search.space_bounds import Trace
    from phaze.step.model import StepConstants

    place = config["place"]
    hbm = hbm_capacity_bytes_of(place["hbm_gib"][0])
    devices = place["devices"][0]
    settings = PlaceSettings.from_config(config, model, hbm, b)
    grid = space[space["preset"].fillna("") == ""].reset_index(drop=True)
    mine = bounds[(bounds["hbm_capacity_bytes"] == hbm) & (bounds["devices"] == devices)]
    mine = mine.set_index("arch")["throughput_upper_seq_s"].reindex(grid["arch"]).to_numpy()
    order = np.argsort(-np.nan_to_num(mine, nan=-1.0))
    rng = np.random.default_rng(seed)
    picks = list(order[:top]) + list(rng.choice(len(grid), sample, replace=False))
    traces = [
        Trace(d, int(t), b, config["step"]["weight_bytes_per_param"])
        for t, d in zip(tps, trace_dirs)
    ]
    sub = grid.iloc[picks].reset_index(drop=True)
    per_t = {tr.tp: tr.bounds(sub, config) for tr in traces}
    consts = StepConstants.from_config(
        settings.step, float(achievable_hbm_Bps(config["costmodel"]))
    )
    cm = config["costmodel"]
    net = step_network(None, cm["link_bandwidth_Bps"], cm["link_latency_s"], devices)
    rows = []
    for i, _arch in enumerate(sub["arch"]):
        chains = {}
        for tr in traces:
            bounds_t, attention = per_t[tr.tp].layers, per_t[tr.tp].attention
            lk = {("x", s, p): float(v[0][i]) for (s, p), v in bounds_t.items()}
            wk = {("x", s, p): float(v[1][i]) for (s, p), v in bounds_t.items()}
            att = {("x", s): float(v[i]) for s, v in attention.items()}
            for sp, c in tr.tables.chains("x", lk, att, wk).items():
                chains[(tr.tp, b, sp)] = c
        r = optimize(chains, net, consts, devices, settings.global_batch, hbm, settings.axes)
        exact = settings.global_batch / r.time_s if r.strategy is not None else np.nan
        rows.append((i < top, exact, mine[picks[i]]))
    df = pd.DataFrame(rows, columns=["top", "exact", "bound"])
    df["excess"] = df["bound"] / df["exact"] - 1
    return df


def main() -> int:
    from phaze.config import load_config
    from phaze.trace.models import get_model_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/paper.yaml")
    ap.add_argument("--pairs", nargs="+", default=["bert-large:1", "gpt3-175b:1", "llama2-7b:1"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/space_bounds"))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sample", type=int, default=25)
    args = ap.parse_args()
    config = load_config(args.config)
    args.work.mkdir(parents=True, exist_ok=True)
    space_path = args.work / "space.parquet"
    if not space_path.exists():
        run(["arch", "--config", args.config, "--out", str(space_path)])
    space = pd.read_parquet(space_path)
    print(f"{len(space)} architectures ({args.config})")
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
        out = args.work / f"{model}_b{b}.parquet"
        cost = run(
            [
                "search",
                "bounds",
                "--model",
                model,
                "--microbatch",
                str(b),
                "--tp",
                *map(str, tps),
                "--trace-dirs",
                *dirs,
                "--space",
                str(space_path),
                "--config",
                args.config,
                "--out",
                str(out),
            ]
        )
        bounds = pd.read_parquet(out)
        check = exact_check(dirs, tps, model, b, space, config, bounds, args.top, args.sample)
        ok = check.dropna()
        report = {
            "model": model,
            "microbatch": b,
            **{k: round(v, 2) for k, v in cost.items()},
            "top_excess_max": float(ok.loc[ok["top"], "excess"].max()),
            "top_excess_median": float(ok.loc[ok["top"], "excess"].median()),
            "sample_excess_max": float(ok.loc[~ok["top"], "excess"].max()),
            "sample_excess_median": float(ok.loc[~ok["top"], "excess"].median()),
            "violations": int((ok["excess"] < -1e-9).sum()),
        }
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
