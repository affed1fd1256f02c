"""The table-to-table stage: every selected architecture × layer graph (signature, pass)."""

from __future__ import annotations

import argparse

import pandas as pd

from phaze.errors import PhazeError
from phaze.io.select import select_archs
from phaze.io.tables import read_table, write_table
from phaze.schedule.reuse import (
    context_of,
    load_solutions,
    solution_files,
    write_solutions,
)
from phaze.schedule.solve import Options, Scheduler, peak_cores
from phaze.schedule.tables import build_instance, load_op_graphs, op_latencies


def schedule_tables(args: argparse.Namespace, opts: Options, reuse: list[str] = ()) -> dict:
    """Schedule every selected architecture's layers into ``args.out``; with ``args.solutions``
    also the job's solutions (phaze.schedule.reuse); ``reuse``: earlier runs' results
    directories whose solutions of this trace are taken where an instance equals one of them."""
    context = context_of(opts)
    prior = {}
    if reuse and opts.cache:
        prior = load_solutions(solution_files(list(reuse), args.trace, args.out), context)
    graphs = load_op_graphs(args.trace)
    space = select_archs(args)
    lat = read_table(args.latency, "latency")
    lat = lat[lat["arch"].isin(set(space["arch"]))]
    lookup = op_latencies(lat)
    rows = []
    instances = 0  # layer instances solved (layers with ops that take time)
    with Scheduler(opts, prior) as sch:
        for a in space.itertuples(index=False):
            for g in graphs:
                where = f"arch {a.arch}, layer {g.signature} {g.pass_}"
                if not g.ids:
                    rows.append(_row(a.arch, g, 0.0, 0.0, 0.0, "chain", "chain", 0.0, 0, 0, False))
                    continue
                part = lookup.get((a.arch, g.signature, g.pass_))
                if part is None:
                    raise PhazeError(f"{where}: no rows in {args.latency}")
                inst = build_instance(g, part, a.n_tc, a.n_vc, where)
                instances += 1
                r = sch.solve(inst)
                ptc, pvc = peak_cores(inst, r.schedule)
                rows.append(
                    _row(
                        a.arch,
                        g,
                        r.makespan_s,
                        r.lower_bound_s,
                        r.upper_bound_s,
                        r.status,
                        r.method,
                        r.solve_s,
                        ptc,
                        pvc,
                        r.cache_hit,
                        inst.n,
                    )
                )
        stats = {
            "rows": len(rows),
            "instances": instances,
            "hits": sch.hits,
            "lookups": sch.lookups,  # whole-instance cache lookups (0 with schedule.cache off)
            "segment_hits": sch.segment_hits,
            "ilp_solves": sch.ilp_solves,
            "prior": len(prior),  # solutions loaded from schedule.reuse
            "prior_hits": sch.prior_hits,
            "prior_segment_hits": sch.prior_segment_hits,
        }
        solved = dict(sch.cache)
    if getattr(args, "solutions", None):
        write_solutions(args.solutions, solved, context)
    df = pd.DataFrame(rows, columns=list(_COLUMNS))
    write_table(df, args.out, "schedule")
    return stats


_COLUMNS = (
    "arch",
    "signature",
    "pass",
    "makespan_s",
    "lower_bound_s",
    "mip_gap",
    "status",
    "solve_s",
    "peak_tc",
    "peak_vc",
    "upper_bound_s",
    "method",
    "cache_hit",
    "n_ops",
)


def _row(arch, g, ms, lb, ub, status, method, solve_s, ptc, pvc, hit, n_ops=0):
    gap = 0.0 if ms <= 0 else max(0.0, (ms - lb) / ms)
    return (
        arch,
        g.signature,
        g.pass_,
        ms,
        lb,
        gap,
        status,
        solve_s,
        ptc,
        pvc,
        ub,
        method,
        hit,
        n_ops,
    )
