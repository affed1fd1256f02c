"""The path-flow and energetic bounds on real blocks: each block solved under node limits without
and with them (the bound before and after, the schedule, the gap, the work per solve).

    .venv/bin/python benchmarks/schedule_energetic.py [--work DIR] [--passes fwd bwd]
        [--shards mixtral-8x7b:2:8:1 llama2-7b:1 ...] [--archs fa6d61f60680 e3f19f9f6369]
        [--config config/moe.yaml] [--node-limit 100] [--bnb-node-limit 200000] [--bounds-only]

A shard is ``MODEL:TP[:EP[:ETP]]``, traced with ``phaze trace`` under --work (cached); the
architectures are those of ``phaze arch`` on the config (config/moe.yaml's grid; the ids are
its space's), latencies from the config's cost model (``phaze estimate``'s). Every block layer
(fwd / bwd) of each shard on each architecture is solved by the full pipeline
(``cache`` off, safety net 3,000 s) three times: ``before`` without the path-flow and energetic
bounds, ``pathflow`` with the path-flow bound among the cheap bounds, ``after`` with both (the
default). Columns: the cheap bounds (docs/schedule.md step 3) without and with the path-flow
bound, the energetic bound alone (ten trials) over the best list schedule, each solve's bound,
schedule, gap and CPU seconds (this process and the solver worker), and the energetic bound's
propagation passes in ``after``. ``--bounds-only``: the bounds, no solves.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from schedule import _cpu_s

from phaze.config import load_config
from phaze.estimate.stage import estimate
from phaze.schedule import bounds
from phaze.schedule.bounds import lower_bound
from phaze.schedule.energetic import energetic_bound
from phaze.schedule.listsched import best_list_schedule
from phaze.schedule.solve import Options, Scheduler, clamp_cores
from phaze.schedule.tables import build_instance, load_op_graphs, op_latencies


def _run(args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "phaze", *args], check=True, cwd=ROOT)


def trace(work: Path, shard: str, config: str) -> Path:
    model, tp, *rest = shard.split(":")
    d = (
        work
        / "trace"
        / model
        / (f"tp{tp}" + "".join(f"_{k}{v}" for k, v in zip(("ep", "etp"), rest)))
    )
    if not (d / "layers.parquet").exists():
        extra = [a for k, v in zip(("--ep", "--etp"), rest) for a in (k, v)]
        _run(
            ["trace", "--model", model, "--microbatch", "1", "--tp", tp, *extra]
            + ["--config", config, "--out", str(d)]
        )
    return d


# before: without the path-flow and energetic bounds (the cheap bounds of before them);
# pathflow: with the path-flow bound among the cheap bounds; after: with both (the default)
SETTINGS = ("before", "pathflow", "after")


@contextlib.contextmanager
def _path_flow(on: bool):
    """The path-flow bound in ``bounds.lower_bound`` (on), or 0 in its place (off)."""
    saved = bounds.path_flow_bound
    if not on:
        bounds.path_flow_bound = lambda *a, **k: 0.0
    try:
        yield
    finally:
        bounds.path_flow_bound = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / "results" / "bench" / "energetic")
    ap.add_argument("--config", default=str(ROOT / "config" / "moe.yaml"))
    ap.add_argument("--shards", nargs="+", default=["mixtral-8x7b:2:8:1", "llama2-7b:1"])
    ap.add_argument("--archs", nargs="+", default=["fa6d61f60680", "e3f19f9f6369"])
    ap.add_argument("--passes", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--node-limit", type=int, default=100)
    ap.add_argument("--bnb-node-limit", type=int, default=200_000)
    ap.add_argument("--csv", type=Path)
    ap.add_argument(
        "--bounds-only", action="store_true", help="the cheap and energetic bounds, no solves"
    )
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    space_f = args.work / "space.parquet"
    if not space_f.exists():
        _run(["arch", "--config", args.config, "--out", str(space_f)])
    space = pd.read_parquet(space_f)
    space = space[space["arch"].isin(args.archs)]
    sched = {
        **dict(cfg["schedule"]),
        "node_limit": args.node_limit,
        "bnb_node_limit": args.bnb_node_limit,
        "time_limit_s": 3000.0,
        "cache": False,
    }
    rows = []
    for shard in args.shards:
        d = trace(args.work, shard, args.config)
        lat = op_latencies(estimate(pd.read_parquet(d / "ops.parquet"), space, cfg["costmodel"]))
        layers = pd.read_parquet(d / "layers.parquet")
        blocks = set(layers.loc[layers["kind"] == "block", "signature"])
        for g in load_op_graphs(d):
            if g.signature not in blocks or g.pass_ not in args.passes:
                continue
            for a in space.itertuples(index=False):
                inst = build_instance(g, lat[(a.arch, g.signature, g.pass_)], a.n_tc, a.n_vc, "")
                c = clamp_cores(inst)
                ub = best_list_schedule(c).makespan(c)
                with _path_flow(False):
                    cheap_before, _ = lower_bound(c, ub)
                cheap, _ = lower_bound(c, ub)
                t0 = time.process_time()
                alone = energetic_bound(c, cheap, ub)
                alone_s = time.process_time() - t0
                row = {
                    "shard": shard,
                    "signature": g.signature,
                    "pass": g.pass_,
                    "cores": f"{a.n_tc}x{a.n_vc}",
                    "n_ops": inst.n,
                    "list_ms": ub * 1e3,
                    "cheap_before_ms": cheap_before * 1e3,
                    "cheap_ms": cheap * 1e3,
                    "energetic_alone_ms": alone.bound_s * 1e3,
                    "energetic_alone_cpu_s": alone_s,
                }
                for tag in SETTINGS if not args.bounds_only else ():
                    opts = Options.from_config(sched, "ilp")
                    opts.energetic = tag == "after"
                    with Scheduler(opts) as sch, _path_flow(tag != "before"):
                        c0 = _cpu_s(sch)
                        r = sch.solve(inst)
                        cpu = _cpu_s(sch) - c0
                    row.update(
                        {
                            f"bound_{tag}_ms": r.lower_bound_s * 1e3,
                            f"makespan_{tag}_ms": r.makespan_s * 1e3,
                            f"gap_{tag}": r.mip_gap,
                            f"status_{tag}": r.status,
                            f"cpu_{tag}_s": cpu,
                        }
                    )
                rows.append(row)
                x = row
                if args.bounds_only:
                    print(
                        f"{shard:20s} {g.pass_} {x['cores']:>5s} n={inst.n:3d} list "
                        f"{x['list_ms']:8.4f} cheap {cheap_before * 1e3:8.4f} -> "
                        f"{x['cheap_ms']:8.4f} energetic {x['energetic_alone_ms']:8.4f} "
                        f"({alone_s:4.1f} s)",
                        flush=True,
                    )
                    continue
                row["energetic_passes"] = r.energetic_passes
                print(
                    f"{shard:20s} {g.pass_} {x['cores']:>5s} n={inst.n:3d} list "
                    f"{x['list_ms']:8.4f} cheap {x['cheap_ms']:8.4f} energetic "
                    f"{x['energetic_alone_ms']:8.4f} ({alone_s:4.1f} s) | bound "
                    + " / ".join(f"{x[f'bound_{t}_ms']:8.4f}" for t in SETTINGS)
                    + " ms, makespan "
                    + " / ".join(f"{x[f'makespan_{t}_ms']:8.4f}" for t in SETTINGS)
                    + " ms, gap "
                    + " / ".join(f"{x[f'gap_{t}']:6.2%}" for t in SETTINGS)
                    + ", cpu "
                    + " / ".join(f"{x[f'cpu_{t}_s']:5.1f}" for t in SETTINGS)
                    + f" s, {x['energetic_passes']} passes",
                    flush=True,
                )
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
    for t in SETTINGS if len(df) and not args.bounds_only else ():
        print(
            f"{len(df)} blocks, {t}: gap median {df[f'gap_{t}'].median():.2%} max "
            f"{df[f'gap_{t}'].max():.2%}, CPU {df[f'cpu_{t}_s'].sum():.1f} s (max "
            f"{df[f'cpu_{t}_s'].max():.1f} s per solve)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
