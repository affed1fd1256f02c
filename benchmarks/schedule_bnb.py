"""The branch and bound (phaze/schedule/bnb.py) and the large-neighbourhood search (lns.py) alone,
on instances written by ``benchmarks/schedule.py --dump DIR``.

For each instance: the best list schedule (``best_list_schedule``), then

* ``bnb``: the branch and bound from it at the instance's gap (1 %), within ``--time-limit-s``:
  proven or not, the bound, nodes, seconds;
* ``lns`` (``--lns``): the mode kicks, then the large-neighbourhood search within
  ``--time-limit-s``: the makespans after each, nodes, seconds.

    .venv/bin/python benchmarks/schedule_bnb.py DIR [--match SUBSTR ...] [--time-limit-s 30] [--lns]

Figures are wall-clock on a shared machine; node counts do not depend on load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phaze.schedule.bnb import branch_and_bound
from phaze.schedule.budget import Deadline
from phaze.schedule.listsched import best_list_schedule, kick_modes
from phaze.schedule.lns import large_neighbourhood_search
from phaze.schedule.solve import Options
from phaze.schedule.tables import instance_from_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--match", nargs="*", default=[], help="only files whose name has one of these")
    ap.add_argument("--time-limit-s", type=float, default=30.0)
    ap.add_argument("--lns", action="store_true", help="the search for schedules instead")
    args = ap.parse_args()
    files = sorted(args.dir.glob("*.json"))
    if args.match:
        files = [f for f in files if any(m in f.name for m in args.match)]
    proven = 0
    for f in files:
        inst, overrides = instance_from_json(json.loads(f.read_text()))
        gap = overrides.get("mip_gap", Options().mip_gap)
        start = best_list_schedule(inst)
        ms = start.makespan(inst)
        t0 = time.perf_counter()
        if args.lns:
            kicked = kick_modes(inst, start)
            t1 = time.perf_counter()
            best, nodes = large_neighbourhood_search(inst, kicked, Deadline(args.time_limit_s))
            print(
                f"{f.stem:40s} n={inst.n:3d} list {ms * 1e6:10.2f} kicks "
                f"{kicked.makespan(inst) * 1e6:10.2f} ({t1 - t0:5.1f} s) lns "
                f"{best.makespan(inst) * 1e6:10.2f} us ({nodes} nodes, "
                f"{time.perf_counter() - t1:5.1f} s)",
                flush=True,
            )
            continue
        out = branch_and_bound(inst, start, gap, Deadline(args.time_limit_s))
        el = time.perf_counter() - t0
        best = out.schedule.makespan(inst) if out.schedule is not None else ms
        proven += out.complete
        print(
            f"{f.stem:40s} n={inst.n:3d} {'proven' if out.complete else 'open  '} list "
            f"{ms * 1e6:10.2f} best {best * 1e6:10.2f} bound {out.lower_bound_s * 1e6:10.2f} us "
            f"{out.nodes:9d} nodes {el:6.2f} s",
            flush=True,
        )
    if not args.lns:
        print(f"proven within the gap: {proven} of {len(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
