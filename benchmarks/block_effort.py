"""One layer instance of a finished run, solved at several work limits: what more solver effort
buys (the schedule and the proven bound, seconds).

    .venv/bin/python benchmarks/block_effort.py --results /work/run/results \
        --shard llama2-7b/b1_s4096_tp1 --round r2 --arch 4cb267847b78 \
        --signature 979ddf5113906522 [--pass bwd] [--config config/paper.yaml] \
        [--limits 100:200000 2000:200000 100:2000000] [--split-nodes 0 16]

Each limit is ``SCIP nodes:branch-and-bound nodes``, run with each ``--split-nodes`` (the split at
an op that runs alone, docs/schedule.md; 0 = off); the other schedule settings are the
config's, with a safety net of 3,000 s, so the node limits end every solve (docs/schedule.md,
"Bounded work"). The instance is built as the schedule stage builds it, from the run's trace,
latency table (``results/estimate/SHARD/ROUND_c0.parquet``) and space.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phaze.config import load_config
from phaze.io.tables import read_table
from phaze.schedule.solve import Options, Scheduler
from phaze.schedule.tables import build_instance, load_op_graphs, op_latencies


def instance(results: Path, shard: str, rnd: str, arch: str, signature: str, pass_: str):
    graphs = load_op_graphs(results / "trace" / shard)
    lat = read_table(results / "estimate" / shard / f"{rnd}_c0.parquet", "latency")
    lat = lat[lat["arch"] == arch]
    space = read_table(results / "arch" / "space.parquet", "space")
    row = space[space["arch"] == arch]
    if row.empty or lat.empty:
        raise SystemExit(f"block_effort: arch {arch} is not in that run's {rnd} tables")
    g = [g for g in graphs if g.signature == signature and g.pass_ == pass_]
    if not g:
        raise SystemExit(f"block_effort: no layer {signature} {pass_} in {shard}")
    a = row.iloc[0]
    part = op_latencies(lat)[(arch, signature, pass_)]
    return build_instance(g[0], part, int(a["n_tc"]), int(a["n_vc"]), f"{arch} {signature}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--shard", required=True, help="MODEL/bMBS_sSEQ_tpTP, as under results/trace")
    ap.add_argument("--round", default="r0")
    ap.add_argument("--arch", required=True)
    ap.add_argument("--signature", required=True)
    ap.add_argument("--pass", dest="pass_", default="bwd", choices=("fwd", "bwd"))
    ap.add_argument("--config", default=str(REPO / "config" / "paper.yaml"))
    ap.add_argument("--limits", nargs="+", default=["100:200000", "2000:200000", "100:2000000"])
    ap.add_argument("--split-nodes", nargs="+", type=int, default=[0])
    args = ap.parse_args(argv)
    inst = instance(args.results, args.shard, args.round, args.arch, args.signature, args.pass_)
    schedule = dict(load_config(args.config)["schedule"])
    print(
        f"{args.arch} {args.signature} {args.pass_}: {inst.n} ops, {inst.n_tc} tc, {inst.n_vc} vc"
    )
    for limit in args.limits:
        scip, bnb = (int(x) for x in limit.split(":"))
        for split in args.split_nodes:
            cfg = {**schedule, "node_limit": scip, "bnb_node_limit": bnb, "time_limit_s": 3000.0}
            cfg.update(cache=False, split_nodes=split)
            with Scheduler(Options.from_config(cfg, "ilp")) as sch:
                t0 = time.perf_counter()
                r = sch.solve(inst)
                wall = time.perf_counter() - t0
            print(
                f"SCIP {scip:>6} nodes, B&B {bnb:>8} nodes, split {split:>3} nodes: makespan "
                f"{r.makespan_s * 1e3:.4f} ms, bound {r.lower_bound_s * 1e3:.4f} ms, "
                f"gap {r.mip_gap:.2%}, {r.status}, {wall:.1f} s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
