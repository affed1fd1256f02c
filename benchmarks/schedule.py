"""Benchmark the schedule stage on the paper's workloads.

For every paper workload at every valid tensor-parallel width t: trace it (``phaze trace``, cached
under --work), estimate its operators with the real cost model on the tpuv4-upstream preset (upstream Phaze's
TPUv4 numbers, kept fixed so figures stay comparable) with the core counts replaced by (1,1), (2,2), (4,4), (8,8), (16,16), (8,2), and schedule the block layer's
forward and backward graphs. Prints per instance: makespan, lower bound, gap, status, solve time;
then median / 95th-percentile gap and solve time. Finally the cache hit rate the stage would see
over the default config's architectures (instance keys only, no solving).

    .venv/bin/python benchmarks/schedule.py [--time-limit-s 10] [--models ...] [--work DIR]
        [--csv FILE] [--dump DIR]

``--dump DIR`` writes every instance in the ``schedule --instance`` JSON format (one file per
model, t, pass, core counts), so hard ones can be re-run alone. ``cpu_s`` per instance is the CPU
time of this process plus the solver worker's (from /proc), a measure that load does not inflate.
"""

from __future__ import annotations

import argparse
import os
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


def _current_trace(d: Path) -> bool:
    """A trace directory with every table the current trace writes, each with all its columns
    (a directory made by an older version is traced again)."""
    import pyarrow.parquet as pq

    from phaze.io.tables import SCHEMAS

    for name in ("ops", "edges", "layers"):
        f = d / f"{name}.parquet"
        if not f.exists() or set(SCHEMAS[name].names) - set(pq.read_schema(f).names):
            return False
    return True


def trace_dir(work: Path, model: str, t: int, microbatch: int = 1) -> Path:
    spec = get_model_spec(model)
    d = work / "trace" / model / f"b{microbatch}_s{spec.seq}_tp{t}"
    if not _current_trace(d):
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


PRESET = "tpuv4-upstream"


def _cpu_s(sch: Scheduler) -> float:
    """CPU seconds of this process, of its reaped children (e.g. a solver worker killed by the
    watchdog) and of the scheduler's running solver worker."""
    import resource

    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() + ch.ru_utime + ch.ru_stime
    w = sch._worker
    proc = getattr(w, "_proc", None) if w is not None else None
    if proc is not None and proc.poll() is None:
        try:
            f = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return cpu


def tpuv4_space(cores) -> tuple[pd.DataFrame, dict]:
    preset = load_preset(PRESET)
    rows = []
    for n_tc, n_vc in cores:
        r = dict(preset["arch"])
        r.update(arch=f"{PRESET}_tc{n_tc}_vc{n_vc}", n_tc=n_tc, n_vc=n_vc)
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
        mip_gap=args.gap,
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
                        if args.dump:
                            _dump(args.dump, model, t, g.pass_, inst, args)
                        c0 = _cpu_s(sch)
                        t0 = time.perf_counter()
                        r = sch.solve(inst)
                        wall = time.perf_counter() - t0
                        cpu = _cpu_s(sch) - c0
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
                                "gap": r.mip_gap,
                                "status": r.status,
                                "method": r.method,
                                "solve_s": wall,
                                "cpu_s": cpu,
                                "scip_nodes": r.nodes,
                                "scip_lp_iterations": r.lp_iterations,
                                "bnb_nodes": r.bnb_nodes,
                                "cache_hit": r.cache_hit,
                            }
                        )
                        x = rows[-1]
                        print(
                            f"{model:18s} t={t} {g.pass_} ({a.n_tc:2d},{a.n_vc:2d}) n={inst.n:2d} "
                            f"makespan {x['makespan_s'] * 1e6:10.2f} us  lb {x['lower_bound_s'] * 1e6:10.2f} us  "
                            f"list {x['list_s'] * 1e6:10.2f} us  gap {x['gap'] * 100:6.2f} %  "
                            f"{x['status']:10s} {x['method']:5s} {wall:6.2f} s (cpu {cpu:6.2f} s, "
                            f"{r.nodes} nodes, {r.lp_iterations} LP it., {r.bnb_nodes} bnb nodes)"
                            f"{'  (cache hit)' if r.cache_hit else ''}",
                            flush=True,
                        )
        print(
            f"ILP solves: {sch.ilp_solves}; cache hits {sch.hits}/{sch.lookups}, "
            f"segment hits {sch.segment_hits}"
        )
    return pd.DataFrame(rows)


def _dump(out: Path, model: str, t: int, pass_: str, inst, args) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    obj = {
        "n_tc": inst.n_tc,
        "n_vc": inst.n_vc,
        "ops": [
            {
                "id": inst.ids[i],
                "core": inst.core[i],
                "latency_1core_s": inst.l1[i],
                "latency_allcores_s": inst.la[i],
            }
            for i in range(inst.n)
        ],
        "edges": [[inst.ids[a], inst.ids[b]] for a, b in inst.edges],
        "time_limit_s": args.time_limit_s,
        "mip_gap": args.gap,
    }
    name = f"{model}_t{t}_{pass_}_tc{inst.n_tc}_vc{inst.n_vc}.json"
    (out / name).write_text(json.dumps(obj, indent=1) + "\n")


def summarize(df: pd.DataFrame, gap: float) -> None:
    def stats(sub, label):
        if sub.empty:
            return
        g, s = sub["gap"].to_numpy() * 100, sub["solve_s"].to_numpy()
        c = sub["cpu_s"].to_numpy()
        print(
            f"{label:10s} n={len(sub):4d}  gap median {np.median(g):6.3f} %  p95 "
            f"{np.percentile(g, 95):6.3f} %  max {g.max():6.2f} %  | solve median "
            f"{np.median(s):6.3f} s  p95 {np.percentile(s, 95):6.3f} s  max {s.max():6.2f} s  "
            f"| cpu median {np.median(c):6.3f} s  p95 {np.percentile(c, 95):6.3f} s  "
            f"| SCIP nodes {int(sub['scip_nodes'].sum())}, LP it. "
            f"{int(sub['scip_lp_iterations'].sum())}, bnb nodes {int(sub['bnb_nodes'].sum())} "
            f"| list excess mean {((sub['list_s'] / sub['makespan_s'] - 1) * 100).mean():5.2f} %"
        )

    print("\nsummary (gap = (makespan - lower bound) / makespan)")
    stats(df, "all")
    for p in ("fwd", "bwd"):
        stats(df[df["pass_"] == p], p)
    print("status counts:", df["status"].value_counts().to_dict())
    bwd = df[df["pass_"] == "bwd"]
    print("backward gap by core counts (median / p95 / max, %):")
    for (tc, vc), sub in bwd.groupby(["n_tc", "n_vc"]):
        g = sub["gap"].to_numpy() * 100
        print(
            f"  ({tc:2d},{vc:2d}): {np.median(g):6.2f} / {np.percentile(g, 95):6.2f} / "
            f"{g.max():6.2f}"
        )
    above = df[df["gap"] > gap]
    print(f"instances above the gap target ({len(above)}):")
    for x in above.itertuples(index=False):
        print(
            f"  {x.model} t={x.t} {x.pass_} ({x.n_tc},{x.n_vc}) n={x.n_ops}: gap "
            f"{x.gap * 100:.2f} %, {x.status}"
        )


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
    ap.add_argument("--dump", type=Path, help="write every instance as --instance JSON here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    df = run_instances(args)
    summarize(df, args.gap)
    if args.csv:
        df.to_csv(args.csv, index=False)
    if not args.skip_hit_rate:
        cache_hit_rate(args.work)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (2-core machine shared with other jobs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
