"""Benchmark the schedule stage on the paper's workloads.

For every paper workload at every valid tensor-parallel width t: trace it (``phaze trace``, cached
under --work), estimate its operators with the real cost model on the tpuv4 preset with the core
counts replaced by (1,1), (2,2), (4,4), (8,8), (16,16), (8,2), and schedule the block layer's
forward and backward graphs. Prints per instance: makespan, lower bound, gap, status, solve time;
then median / 95th-percentile gap and solve time. Finally the cache hit rate the stage would see
over the default config's architectures (instance keys only, no solving).

    .venv/bin/python benchmarks/schedule.py [--time-limit-s 10] [--models ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phaze.arch.presets import load_preset
from phaze.config import load_config
from phaze.estimate.stage import estimate
from phaze.schedule.solve import Options, Scheduler
from phaze.schedule.tables import build_instance, load_op_graphs, op_latencies
from phaze.trace.models import get_model_spec

PAPER_MODELS = [
    "bert-large",
    "gpt2-xl",
    "opt-350m",
    "llama2-7b",
    "megatron-bert",
    "megatron-gpt-2.5b",
    "megatron-gpt-8.3b",
    "gpt3-175b",
]
CORES = [(1, 1), (2, 2), (4, 4), (8, 8), (16, 16), (8, 2)]


def trace_dir(work: Path, model: str, t: int, microbatch: int = 1) -> Path:
    spec = get_model_spec(model)
    d = work / "trace" / model / f"b{microbatch}_s{spec.seq}_tp{t}"
    if not (d / "ops.parquet").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "phaze",
                "trace",
                "--model",
                model,
                "--microbatch",
                str(microbatch),
                "--tp",
                str(t),
                "--out",
                str(d),
            ],
            check=True,
            cwd=ROOT,
        )
    return d


def tpuv4_space(cores) -> tuple[pd.DataFrame, dict]:
    preset = load_preset("tpuv4")
    rows = []
    for n_tc, n_vc in cores:
        r = dict(preset["arch"])
        r.update(arch=f"tpuv4_tc{n_tc}_vc{n_vc}", n_tc=n_tc, n_vc=n_vc)
        rows.append(r)
    cm = dict(load_config(ROOT / "config" / "config.yaml")["costmodel"])
    cm.update(preset.get("costmodel", {}))
    return pd.DataFrame(rows), cm


def block_signatures(d: Path) -> set[str]:
    layers = pd.read_parquet(d / "layers.parquet")
    return set(layers.loc[layers["kind"] == "block", "signature"])


def run_instances(args) -> pd.DataFrame:
    space, cm = tpuv4_space(CORES)
    opts = Options(
        time_limit_s=args.time_limit_s,
        gap=args.gap,
        threads=1,
        cache=not args.no_cache,
        decompose=not args.no_decompose,
    )
    rows = []
    with Scheduler(opts) as sch:
        for model in args.models:
            for t in get_model_spec(model).valid_tp:
                d = trace_dir(args.work, model, t)
                ops = pd.read_parquet(d / "ops.parquet")
                lat = op_latencies(estimate(ops, space, cm))
                blocks = block_signatures(d)
                for g in load_op_graphs(d):
                    if g.signature not in blocks:
                        continue
                    for a in space.itertuples(index=False):
                        inst = build_instance(
                            g, lat[(a.arch, g.signature, g.pass_)], a.n_tc, a.n_vc, ""
                        )
                        t0 = time.perf_counter()
                        r = sch.solve(inst)
                        wall = time.perf_counter() - t0
                        rows.append(
                            {
                                "model": model,
                                "t": t,
                                "pass_": g.pass_,
                                "n_tc": a.n_tc,
                                "n_vc": a.n_vc,
                                "n_ops": inst.n,
                                "pairs": len(inst.incomparable_pairs),
                                "makespan_s": r.makespan_s,
                                "lower_bound_s": r.lower_bound_s,
                                "list_s": r.upper_bound_s,
                                "gap": r.gap,
                                "status": r.status,
                                "method": r.method,
                                "solve_s": wall,
                                "cache_hit": r.cache_hit,
                            }
                        )
                        x = rows[-1]
                        print(
                            f"{model:18s} t={t} {g.pass_} ({a.n_tc:2d},{a.n_vc:2d}) n={inst.n:2d} "
                            f"makespan {x['makespan_s'] * 1e6:10.2f} us  lb {x['lower_bound_s'] * 1e6:10.2f} us  "
                            f"list {x['list_s'] * 1e6:10.2f} us  gap {x['gap'] * 100:6.2f} %  "
                            f"{x['status']:10s} {x['method']:5s} {wall:6.2f} s"
                            f"{'  (cache hit)' if r.cache_hit else ''}",
                            flush=True,
                        )
        print(
            f"ILP solves: {sch.ilp_solves}; cache hits {sch.hits}/{sch.lookups}, "
            f"segment hits {sch.segment_hits}"
        )
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> None:
    def stats(sub, label):
        if sub.empty:
            return
        g, s = sub["gap"].to_numpy() * 100, sub["solve_s"].to_numpy()
        print(
            f"{label:10s} n={len(sub):4d}  gap median {np.median(g):6.3f} %  p95 "
            f"{np.percentile(g, 95):6.3f} %  max {g.max():6.2f} %  | solve median "
            f"{np.median(s):6.3f} s  p95 {np.percentile(s, 95):6.3f} s  max {s.max():6.2f} s  "
            f"| list excess mean {((sub['list_s'] / sub['makespan_s'] - 1) * 100).mean():5.2f} %"
        )

    print("\nsummary (gap = (makespan - lower bound) / makespan)")
    stats(df, "all")
    for p in ("fwd", "bwd"):
        stats(df[df["pass_"] == p], p)
    print("status counts:", df["status"].value_counts().to_dict())


def cache_hit_rate(work: Path) -> None:
    """Whole-instance and segment cache keys over the default config's architectures."""
    from phaze.arch.space import build_space
    from phaze.schedule.solve import articulation_ops

    cfg = load_config(ROOT / "config" / "config.yaml")
    space, _ = build_space(cfg)
    cm = cfg["costmodel"]
    micros = list(cfg["trace"]["microbatch"])
    print(
        f"\ncache hit rate over the default config's {len(space)} architectures "
        f"(models {cfg['models']}, microbatch {micros}, t {cfg['trace']['tp']} where valid; "
        f"one job = all archs of one trace):"
    )
    tot_inst = tot_hit = 0
    for model in cfg["models"]:
        for micro, t in [
            (b, t)
            for b in micros
            for t in get_model_spec(model).valid_tp
            if t in cfg["trace"]["tp"]
        ]:
            d = trace_dir(work, model, t, micro)
            ops = pd.read_parquet(d / "ops.parquet")
            lat = estimate(ops, space, cm)
            lookup = op_latencies(lat)
            graphs = load_op_graphs(d)
            keys, seg_keys, n_inst, n_seg = set(), set(), 0, 0
            for a in space.itertuples(index=False):
                for g in graphs:
                    if not g.ids:
                        continue
                    inst = build_instance(
                        g, lookup[(a.arch, g.signature, g.pass_)], a.n_tc, a.n_vc, ""
                    )
                    keys.add(inst.cache_key()[0])
                    n_inst += 1
                    arts = set(articulation_ops(inst))
                    if arts and len(arts) < inst.n:
                        for seg in _segments(inst, arts):
                            seg_keys.add(inst.subinstance(seg).cache_key()[0])
                            n_seg += 1
            tot_inst += n_inst
            tot_hit += n_inst - len(keys)
            print(
                f"  {model} b={micro} t={t}: {n_inst} instances, {len(keys)} distinct -> hit rate "
                f"{1 - len(keys) / n_inst:.1%}; segments {n_seg}, distinct {len(seg_keys)} -> "
                f"{(1 - len(seg_keys) / n_seg) if n_seg else 0:.1%}",
                flush=True,
            )
    print(
        f"  overall whole-layer hit rate {tot_hit / max(tot_inst, 1):.1%} of {tot_inst} instances"
    )


def _segments(inst, arts):
    arts = sorted(arts)
    buckets = {}
    for i in range(inst.n):
        if i not in arts:
            b = sum(1 for a in arts if (inst.ancestors[i] >> a) & 1)
            buckets.setdefault(b, []).append(i)
    return list(buckets.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit-s", type=float, default=10.0)
    ap.add_argument("--gap", type=float, default=0.01)
    ap.add_argument("--models", nargs="+", default=PAPER_MODELS)
    ap.add_argument("--work", type=Path, default=ROOT / "results" / "bench" / "schedule")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--no-decompose", action="store_true")
    ap.add_argument("--skip-hit-rate", action="store_true")
    ap.add_argument("--csv", type=Path, help="also write the per-instance table here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    df = run_instances(args)
    summarize(df)
    if args.csv:
        df.to_csv(args.csv, index=False)
    if not args.skip_hit_rate:
        cache_hit_rate(args.work)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (2-core machine shared with other jobs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
